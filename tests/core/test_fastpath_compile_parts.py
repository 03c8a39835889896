"""The kernel's source compiled in parts side by side and linked (app/core/fastpath/compile_parts.py, reached as the
kernel module compiles: kernel._compile): as many parts at once as there are cores, a failure or a timeout stopping the
rest with their own processes, nothing left behind, and a library that offers what one object does."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.core.fastpath import kernel
from app.core.storage import staging

FAKE_COMPILER = """#!{python}
import os, sys, time
args = sys.argv[1:]
out = args[args.index("-o") + 1]
part = next((a.split("=", 1)[1] for a in args if a.startswith("-DHEARTH_PART=")), "link")
log = os.environ["FAKE_CC_LOG"]
with open(os.path.join(os.environ["TMPDIR"], f"cc-{{part}}.s"), "w") as f:
    f.write("a compiler's temporary file")
with open(log, "a") as f:
    f.write(f"start {{part}} {{time.monotonic()}}\\n")
    f.write(f"tmpdir {{part}} {{os.environ['TMPDIR']}}\\n")
seconds = float(os.environ.get("FAKE_CC_SECONDS", "0.4"))
if part == os.environ.get("FAKE_CC_FAIL"):
    time.sleep(0.3)
    sys.stderr.write("warning: something minor\\nhearth_decode.c:1:1: error: part " + part + " broke\\n")
    sys.exit(1)
if os.environ.get("FAKE_CC_CHILD"):  # as gcc's driver runs cc1: a process of its own, waited for
    import subprocess
    child = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({{seconds}})"])
    with open(log, "a") as f:
        f.write(f"child {{part}} {{child.pid}}\\n")
    child.wait()
else:
    time.sleep(seconds)
open(out, "w").close()
with open(log, "a") as f:
    f.write(f"end {{part}} {{time.monotonic()}}\\n")
"""


@pytest.fixture
def fake_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """A compiler that takes 0.4 s a command and logs when each part (or the link) starts and ends."""
    script = tmp_path / "fake-cc"
    script.write_text(FAKE_COMPILER.format(python=sys.executable))
    script.chmod(0o755)
    log = tmp_path / "cc.log"
    monkeypatch.setenv("FAKE_CC_LOG", str(log))
    return str(script), log


def events(log: Path) -> list[tuple[str, str, float]]:
    lines = (line.split() for line in log.read_text().splitlines())  # start, end: when; child: a pid
    return [(kind, part, float(at)) for kind, part, at in lines if kind in ("start", "end")]


def test_the_parts_compile_side_by_side_as_many_as_there_are_cores_then_link(
    fake_compiler: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiler, log = fake_compiler
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(kernel.integrity, "publish", lambda partial, target: partial.rename(target))
    target = tmp_path / "native" / "hearth_decode-x.so"
    assert kernel._compile(compiler, ["-O3", "-shared"], target) == ""
    seen = events(log)
    parts = [part for kind, part, _ in seen if kind == "start"]
    assert set(parts[:2]) == {"2", "1"}  # the two biggest first, then the others as they finish
    assert sorted(parts[:-1]) == ["0", "1", "2", "3"] and parts[-1] == "link"
    running, most = 0, 0
    for kind, _, _ in sorted(seen, key=lambda event: event[2]):
        running += 1 if kind == "start" else -1
        most = max(most, running)
    assert most == 2  # side by side, never more than the cores
    link_start = next(at for kind, part, at in seen if part == "link")
    assert all(at <= link_start for kind, part, at in seen if kind == "end" and part != "link")
    assert sorted(path.name for path in target.parent.iterdir()) == [target.name]  # the objects are gone


def test_a_part_that_fails_stops_the_others_and_leaves_nothing_behind(
    fake_compiler: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiler, log = fake_compiler
    monkeypatch.setenv("FAKE_CC_FAIL", "2")
    target = tmp_path / "native" / "hearth_decode-x.so"
    error = kernel._compile(compiler, ["-O3"], target)
    assert error == "compiling the fused decode kernel failed: hearth_decode.c:1:1: error: part 2 broke"
    assert "link" not in log.read_text() and list(target.parent.iterdir()) == []


def test_a_compile_past_its_time_is_stopped_and_leaves_nothing_behind(
    fake_compiler: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiler, log = fake_compiler
    monkeypatch.setenv("FAKE_CC_SECONDS", "30")
    monkeypatch.setattr(kernel, "COMPILE_TIMEOUT_S", 1)
    target = tmp_path / "native" / "hearth_decode-x.so"
    started = time.monotonic()
    assert kernel._compile(compiler, ["-O3"], target) == "compiling the fused decode kernel took over 1 s"
    assert time.monotonic() - started < 10 and list(target.parent.iterdir()) == []
    assert "end" not in log.read_text()  # every part was stopped, none ran on


def test_the_library_from_parts_exports_what_one_object_does(tmp_path: Path) -> None:
    """The split changes how the library is built, not what it offers: the same calls, the drivers and the shared
    state hidden inside it (a part that defined them twice, or exported them, would not link or would leak)."""
    compiler = kernel._compiler()
    if compiler is None or sys.platform != "linux" or shutil.which("nm") is None:
        pytest.skip("needs a C compiler and nm on Linux")
    flags = ["-O0", "-shared", "-fPIC", "-std=c11", "-ffp-contract=off"]
    split = tmp_path / "split.so"
    assert kernel._compile(compiler, flags, split) == ""
    whole = tmp_path / "whole.so"
    subprocess.run([compiler, *flags, "-o", str(whole), str(kernel.SOURCE), "-lm"], check=True)

    def exported(library: Path) -> set[str]:
        table = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True).stdout
        return {line.split()[-1] for line in table.splitlines() if line.split()[-1].startswith("hearth_")}

    assert exported(split) == exported(whole) and "hearth_gg_forward" in exported(split)
    assert not exported(split) & {"gg_rows", "x16_rows", "amx_rows", "amx_on", "tiled_calls", "x16_prefetch"}


def test_the_compilers_files_go_in_a_folder_of_the_compile_s_own_removed_after_even_when_a_part_fails(
    fake_compiler: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compiler stopped mid-way (its part no longer needed) leaves its temporary files where TMPDIR says: that is a
    folder named for this process (swept as a leftover if the process is killed), removed when the compile ends."""
    compiler, log = fake_compiler
    monkeypatch.setenv("FAKE_CC_FAIL", "1")
    target = tmp_path / "native" / "hearth_decode-x.so"
    assert "part 1 broke" in kernel._compile(compiler, ["-O3"], target)
    folders = {line.split()[-1] for line in log.read_text().splitlines() if line.startswith("tmpdir")}
    (folder,) = folders  # every part's TMPDIR the same folder, beside the library
    assert Path(folder).parent == target.parent and not Path(folder).exists()
    assert Path(folder).name == f"{staging.STAGING_PREFIX}compile-{staging.owner_tag()}"
    assert list(target.parent.iterdir()) == []


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc (Linux)")
def test_a_stopped_part_s_own_processes_stop_with_it(
    fake_compiler: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gcc's driver runs cc1 and as as processes of their own: a part stopped because another failed takes them along
    (they had run on, a core each, for the rest of their compile)."""
    compiler, log = fake_compiler
    monkeypatch.setenv("FAKE_CC_FAIL", "1")
    monkeypatch.setenv("FAKE_CC_CHILD", "1")
    monkeypatch.setenv("FAKE_CC_SECONDS", "30")  # part 2 (its child) still runs when part 1 fails
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert "part 1 broke" in kernel._compile(compiler, ["-O3"], tmp_path / "native" / "hearth_decode-x.so")
    children = [int(line.split()[-1]) for line in log.read_text().splitlines() if line.startswith("child 2 ")]
    assert children

    def running(pid: int) -> bool:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        return state != "Z"

    deadline = time.monotonic() + 10
    while any(running(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(running(pid) for pid in children)
