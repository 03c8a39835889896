"""The CPU kernel's first compile (a minute on a 2-core machine) is said before it starts, once, to whoever asked."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.cli import main
from app.core.engines.backend import LoadRequest
from app.core.engines.opening import open_backend
from app.core.fastpath import kernel
from app.core.fastpath.compile_notice import COMPILE_NOTICE, announcing_compile
from tests.helpers.kernel_cache import compile_by_copy


@pytest.fixture
def compiles_by_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[list[str]]]:
    """A process's first use of the kernel on a machine with nothing cached and nothing prebuilt, each compile a copy
    of this run's library (these tests are about what is said around it). Yields the flags of each compile; the
    run's own library is held again afterwards."""
    library = kernel.load_library()
    if isinstance(library, str) or kernel._compiler() is None:
        pytest.skip(f"no kernel to copy here: {library if isinstance(library, str) else 'no C compiler'}")
    held = kernel.held_library_for_tests()
    monkeypatch.setenv("HEARTH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(kernel.KERNEL_ENV, "compile")
    asked = compile_by_copy(monkeypatch, library.path)
    kernel.reset_library_for_tests()
    yield asked
    kernel.reset_library_for_tests(held)


def test_a_compile_is_said_before_it_starts_once_and_never_for_a_cached_library(
    compiles_by_copy: list[list[str]],
) -> None:
    heard: list[tuple[str, int]] = []
    with announcing_compile(lambda message: heard.append((message, len(compiles_by_copy)))):
        assert isinstance(kernel.load_library(), kernel.NativeLibrary)
        kernel.load_library()
        assert heard == [(COMPILE_NOTICE, 0)]  # before the compile began, and once
        kernel.reset_library_for_tests()  # the next process: the library is in its cache
        assert isinstance(kernel.load_library(), kernel.NativeLibrary)
    assert heard == [(COMPILE_NOTICE, 0)] and len(compiles_by_copy) == 1


def test_failed_attempts_are_one_compile_to_the_user_and_other_threads_hear_nothing(
    compiles_by_copy: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kernel, "_compile", lambda compiler, flags, target: compiles_by_copy.append(flags) or "no")
    heard: list[str] = []
    elsewhere: list[str] = []
    listening = threading.Event()
    done = threading.Event()

    def other_thread() -> None:
        with announcing_compile(elsewhere.append):
            listening.set()
            done.wait(10)

    thread = threading.Thread(target=other_thread)
    thread.start()
    listening.wait(10)
    with announcing_compile(heard.append):
        assert isinstance(kernel.load_library(), str)  # every attempt failed: no kernel, said as a reason
    done.set()
    thread.join()
    assert len(compiles_by_copy) >= 2 and heard == [COMPILE_NOTICE] and elsewhere == []


def test_the_load_path_says_the_compile_as_a_stage_of_its_own(compiles_by_copy: list[list[str]]) -> None:
    stages: list[tuple[str, float | None]] = []
    backend = open_backend(LoadRequest(None), lambda message, fraction: stages.append((message, fraction)))
    backend.close()
    messages = [message for message, _ in stages]
    assert (COMPILE_NOTICE, None) in stages  # no fraction: the window shows a busy bar, not a stuck one
    assert messages.index(COMPILE_NOTICE) < messages.index("Ready") and len(compiles_by_copy) == 1


def test_hearth_plan_says_the_compile_on_stderr_and_still_plans(
    compiles_by_copy: list[list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan"]) == 0
    out, err = capsys.readouterr()
    assert f"· {COMPILE_NOTICE}" in err.splitlines() and "weights" in out and len(compiles_by_copy) == 1
