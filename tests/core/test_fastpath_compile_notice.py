"""The CPU kernel's first compile (a minute on a 2-core machine) is said before it starts, once, to whoever asked."""

from __future__ import annotations

import threading

import pytest

from app.cli import main
from app.core.engines.backend import LoadRequest
from app.core.engines.opening import open_backend
from app.core.fastpath import kernel
from app.core.fastpath.compile_notice import COMPILE_NOTICE, announcing_compile


def test_a_compile_is_said_before_it_starts_once_and_never_for_a_cached_library(
    first_compile_by_copy: list[list[str]],
) -> None:
    heard: list[tuple[str, int]] = []
    with announcing_compile(lambda message: heard.append((message, len(first_compile_by_copy)))):
        assert isinstance(kernel.load_library(), kernel.NativeLibrary)
        kernel.load_library()
        assert heard == [(COMPILE_NOTICE, 0)]  # before the compile began, and once
        kernel.reset_library_for_tests()  # the next process: the library is in its cache
        assert isinstance(kernel.load_library(), kernel.NativeLibrary)
    assert heard == [(COMPILE_NOTICE, 0)] and len(first_compile_by_copy) == 1


def test_failed_attempts_are_one_compile_to_the_user_and_other_threads_hear_nothing(
    first_compile_by_copy: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kernel, "_compile", lambda compiler, flags, target: first_compile_by_copy.append(flags) or "no")
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
    assert len(first_compile_by_copy) >= 2 and heard == [COMPILE_NOTICE] and elsewhere == []


def test_the_load_path_says_the_compile_as_a_stage_of_its_own(first_compile_by_copy: list[list[str]]) -> None:
    stages: list[tuple[str, float | None]] = []
    backend = open_backend(LoadRequest(None), lambda message, fraction: stages.append((message, fraction)))
    backend.close()
    messages = [message for message, _ in stages]
    assert (COMPILE_NOTICE, None) in stages  # no fraction: the window shows a busy bar, not a stuck one
    assert messages.index(COMPILE_NOTICE) < messages.index("Ready") and len(first_compile_by_copy) == 1


def test_hearth_plan_says_the_compile_on_stderr_and_still_plans(
    first_compile_by_copy: list[list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan"]) == 0
    out, err = capsys.readouterr()
    assert f"· {COMPILE_NOTICE}" in err.splitlines() and "weights" in out and len(first_compile_by_copy) == 1
