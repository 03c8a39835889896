"""Helpers for the packaging tests: the launcher and the PyInstaller spec live outside the `app` package."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
PACKAGING = REPO_ROOT / "packaging"


def load_module(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def launcher() -> ModuleType:
    return load_module(PACKAGING / "launcher.py", "hearth_launcher")


@pytest.fixture(scope="session")
def make_icons() -> ModuleType:
    return load_module(PACKAGING / "make_icons.py", "hearth_make_icons")


# -- installing a .deb into a scratch root (never the machine itself) ----------------------------
# dpkg --root keeps its database inside the root; --force-script-chrootless runs the maintainer scripts on the host
# with DPKG_ROOT set (the root has no shell to chroot into); --force-depends: the root has no libc packages.
DPKG_SCRATCH_FLAGS = ("--force-script-chrootless", "--force-depends", "--log=/dev/null")


def dpkg_in_root(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    for folder in ("var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    for name in ("status", "available"):
        (root / "var/lib/dpkg" / name).touch()
    return subprocess.run(
        ["dpkg", f"--root={root}", *DPKG_SCRATCH_FLAGS, *args], capture_output=True, text=True, timeout=900
    )


def files_of_hearth(root: Path) -> list[Path]:
    """Everything under the root that belongs to Hearth, outside dpkg's own database."""
    found = []
    for path in root.rglob("*"):
        relative = path.relative_to(root)
        if relative.parts[:3] == ("var", "lib", "dpkg"):
            continue
        if "hearth" in str(relative).lower() or (relative.parts[:1] == ("opt",) and len(relative.parts) > 1):
            found.append(relative)
    return sorted(found)


needs_dpkg = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs Debian's dpkg-deb")
