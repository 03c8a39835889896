"""Fault round 2.3: what a killed process was writing is found by its owner's pid and start time and removed by the
next start (and by `hearth models --cache`), while what a live process writes is left alone."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from app.cli import main
from app.core.storage import paths, staging
from tests.helpers.killed_process import REPO, killed_mid_write

WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from app.core.storage import staging
    cache = Path(sys.argv[1])
    with staging.staging_folder(cache / "converted", "convert-model") as folder:
        (folder / "model.safetensors").write_bytes(bytes(2_000_000))
        with staging.writing(cache / "decode-fused-q4" / "model.safetensors") as partial:
            partial.parent.mkdir(parents=True, exist_ok=True)
            with partial.open("wb") as handle:
                handle.write(bytes(1_000_000))
                handle.flush()
                print(folder, partial, flush=True)
                time.sleep(600)
    """
)


def killed_writer(cache: Path) -> tuple[Path, Path]:
    """A real process that stages a folder and a partial file, killed with SIGKILL mid-write."""
    folder, partial = killed_mid_write(WRITER, str(cache))
    return folder, partial


def next_hearth_start() -> subprocess.CompletedProcess[str]:
    """The next `hearth` command (here `hearth models`), in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "app", "models", "--no-verdict"], cwd=REPO, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300,
    )  # fmt: skip


def test_what_a_killed_process_was_writing_is_swept(isolated_cache: Path) -> None:
    folder, partial = killed_writer(isolated_cache)
    assert folder.is_dir() and partial.is_file()  # kill -9: nothing of its own cleaned up
    assert folder.name.startswith(".staging-convert-model-") and partial.name.endswith(".partial")
    live = staging.partial_path(isolated_cache / "decode-int8" / "other.safetensors")  # this (live) process's
    live.parent.mkdir(parents=True)
    live.write_bytes(b"in progress")
    found = {leftover.path: leftover for leftover in staging.find_leftovers()}
    assert set(found) == {folder, partial}
    assert found[folder].size_bytes == 2_000_000 and "has ended" in found[folder].why
    removed = staging.sweep()
    assert {leftover.path for leftover in removed} == {folder, partial}
    assert not folder.exists() and not partial.exists() and live.exists()


def test_older_names_are_understood(isolated_cache: Path) -> None:
    """`NAME.<pid>.partial` (no start time) and the conversion's `.convert-XXXX` (no owner at all)."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    (isolated_cache / "native").mkdir(parents=True)
    dead = isolated_cache / "native" / f"hearth_decode.so.{dead_pid}.partial"
    dead.write_bytes(b"x")
    mine = isolated_cache / "native" / f"hearth_decode.so.{os.getpid()}.partial"
    mine.write_bytes(b"x")
    (isolated_cache / "converted").mkdir()
    old = isolated_cache / "converted" / ".convert-a1b2c3"
    old.mkdir()
    (old / "model.safetensors").write_bytes(b"weights")
    fresh = isolated_cache / "converted" / ".convert-d4e5f6"
    fresh.mkdir()
    hours_ago = time.time() - 2 * 3600
    for path in (old / "model.safetensors", old):
        os.utime(path, (hours_ago, hours_ago))
    assert {leftover.path for leftover in staging.sweep()} == {dead, old}
    assert mine.exists() and fresh.exists()


def test_models_cache_shows_and_reclaims(isolated_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder, partial = killed_writer(isolated_cache)
    (isolated_cache / "responses.sqlite").write_bytes(bytes(4096))
    assert main(["models", "--cache"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Cache: {isolated_cache} (")
    assert "responses.sqlite" in out
    assert "Removed 2 leftover(s) of interrupted runs, 3.0 MB:" in out
    assert f"{folder} (its process (pid " in out and str(partial) in out
    assert not folder.exists() and not partial.exists()
    assert main(["models", "--cache"]) == 0
    assert "No leftovers of interrupted runs." in capsys.readouterr().out


def test_the_command_line_sweeps_at_start(isolated_cache: Path) -> None:
    """The next `hearth` command (here `hearth models`) removes them, and says so in one note."""
    folder, partial = killed_writer(isolated_cache)
    result = next_hearth_start()
    assert result.returncode == 0, result.stderr
    assert "hearth: note: removed 2 leftover(s) of interrupted runs from the cache (3.0 MB)." in result.stderr
    assert not folder.exists() and not partial.exists()


SETTINGS_WRITER = textwrap.dedent(
    """
    import os, time
    from app.core.storage import paths
    from app.core.storage.schema import write_json_file
    def stall(descriptor):  # the new settings written, not yet synced or renamed: where kill -9 finds them
        print(*sorted(paths.config_dir().glob("*.partial")), flush=True)
        time.sleep(600)
    os.fsync = stall
    write_json_file(paths.config_dir() / "settings.json", {"system_prompt": "new"})
    """
)


def test_a_settings_file_a_killed_process_was_writing_is_swept_and_the_old_one_kept(
    hearth_home: Path, isolated_cache: Path
) -> None:
    """Settings and engines files are written as cache files are (staging.write_atomically): what a process killed
    mid-write left in the settings folder goes at the next start, the settings it was replacing stay whole, and the
    note names the folders, not the cache."""
    settings = paths.config_dir() / "settings.json"
    settings.write_text('{"system_prompt": "old"}')
    (partial,) = killed_mid_write(SETTINGS_WRITER)
    assert partial.is_file()
    result = next_hearth_start()
    assert result.returncode == 0, result.stderr
    assert "hearth: note: removed 1 leftover(s) of interrupted runs from Hearth's folders (" in result.stderr
    assert not partial.exists()
    assert settings.read_text() == '{"system_prompt": "old"}'


def test_a_failed_block_removes_its_partial_and_folder(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), staging.writing(tmp_path / "file.bin") as partial:
        partial.write_bytes(b"half")
        raise RuntimeError("interrupted")
    with pytest.raises(RuntimeError), staging.staging_folder(tmp_path, "job") as folder:
        (folder / "part").write_bytes(b"half")
        raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []


def test_the_window_sweeps_at_start(isolated_cache: Path) -> None:
    """`hearth-gui` removes them too, before its first paint (logged, no banner)."""
    folder, partial = killed_writer(isolated_cache)
    result = subprocess.run(
        [sys.executable, "-m", "app.gui", "--first-paint-report"], cwd=REPO, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "QT_QPA_PLATFORM": "offscreen"}, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "first_paint_s=" in result.stdout
    assert not folder.exists() and not partial.exists()
