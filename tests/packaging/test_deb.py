"""The .deb layout, install and clean uninstall, built fast from a stand-in bundle (the slow test uses the real one)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from app import __version__
from tests.packaging.conftest import PACKAGING, REPO_ROOT, dpkg_in_root, files_of_hearth, needs_dpkg

BUILD_DEB = PACKAGING / "linux" / "build-deb.sh"
BUILD_APPIMAGE = PACKAGING / "linux" / "build-appimage.sh"
HICOLOR_SIZES = sorted(p.name for p in (REPO_ROOT / "resources" / "icons" / "hicolor").iterdir())

pytestmark = needs_dpkg


@pytest.fixture
def fake_bundle(tmp_path: Path) -> Path:
    """A one-folder bundle whose `hearth` is a shell script: enough to check the package around it."""
    bundle = tmp_path / "dist" / "hearth"
    (bundle / "_internal" / "resources").mkdir(parents=True)
    (bundle / "_internal" / "resources" / "note.txt").write_text("bundled\n", encoding="utf-8")
    launcher = bundle / "hearth"
    launcher.write_text('#!/bin/sh\necho "stand-in hearth $*"\n', encoding="utf-8")
    launcher.chmod(0o755)
    return bundle


def build_deb(bundle: Path, out: Path) -> Path:
    result = subprocess.run(
        ["bash", str(BUILD_DEB), str(bundle), str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "DEB_COMPRESSION": "gzip"},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    deb = Path(result.stdout.strip().splitlines()[-1])
    assert deb.is_file()
    return deb


def test_build_deb_without_a_bundle_says_how_to_make_one(tmp_path: Path) -> None:
    result = subprocess.run(
        ["bash", str(BUILD_DEB), str(tmp_path / "nothing"), str(tmp_path)], capture_output=True, text=True
    )
    assert result.returncode == 1
    assert f"build-deb: no bundle at {tmp_path / 'nothing'} (run: pyinstaller packaging/hearth.spec" in result.stderr
    assert list(tmp_path.glob("*.deb")) == []


def test_deb_control_and_layout(fake_bundle: Path, tmp_path: Path) -> None:
    deb = build_deb(fake_bundle, tmp_path / "out")
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True).stdout.strip()
    assert deb.name == f"hearth_{__version__}_{arch}.deb"
    fields = subprocess.run(
        ["dpkg-deb", "-f", str(deb), "Package", "Version", "Architecture", "Depends"], capture_output=True, text=True
    ).stdout
    assert f"Package: hearth\nVersion: {__version__}\nArchitecture: {arch}\n" in fields
    assert "libxcb-cursor0" in fields  # Qt 6's xcb platform plugin needs it
    description = subprocess.run(["dpkg-deb", "-f", str(deb), "Description"], capture_output=True, text=True).stdout
    assert "This build carries the CPU-only PyTorch" in description  # no libtorch_cuda in the bundle
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True).stdout
    assert "./usr/bin/hearth -> ../../opt/hearth/hearth" in listing
    assert "root/root" in listing  # owned by root whoever builds it
    for path in (
        "./opt/hearth/hearth",
        "./opt/hearth/_internal/resources/note.txt",
        "./usr/share/applications/hearth.desktop",
        "./usr/share/mime/packages/hearth.xml",
        "./usr/share/doc/hearth/copyright",
    ):
        assert path in listing, path
    for size in HICOLOR_SIZES:
        suffix = "svg" if size == "scalable" else "png"
        assert f"./usr/share/icons/hicolor/{size}/apps/hearth.{suffix}" in listing, size


def test_deb_installs_into_a_scratch_root_and_uninstalls_cleanly(fake_bundle: Path, tmp_path: Path) -> None:
    deb = build_deb(fake_bundle, tmp_path / "out")
    root = tmp_path / "root"
    installed = dpkg_in_root(root, "--install", str(deb))
    assert installed.returncode == 0, installed.stderr
    command = root / "usr" / "bin" / "hearth"
    ran = subprocess.run([str(command), "--self-test"], capture_output=True, text=True, timeout=60)
    assert ran.stdout.strip() == "stand-in hearth --self-test"
    assert (root / "usr/share/icons/hicolor/48x48/apps/hearth.png").is_file()
    (root / "opt" / "hearth" / "written-at-run-time.log").write_text("x", encoding="utf-8")

    purged = dpkg_in_root(root, "--purge", "hearth")
    assert purged.returncode == 0, purged.stderr
    assert files_of_hearth(root) == []


def test_appimage_script_lays_out_the_appdir_and_names_what_is_missing(fake_bundle: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "APPIMAGETOOL"}
    env["PATH"] = "/usr/bin:/bin"  # no appimagetool anywhere
    env["APPDIR"] = str(tmp_path / "Hearth.AppDir")
    result = subprocess.run(
        ["bash", str(BUILD_APPIMAGE), str(fake_bundle), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 3, result.stderr
    assert "appimagetool is not installed and is not in any package" in result.stderr
    appdir = tmp_path / "Hearth.AppDir"
    ran = subprocess.run([str(appdir / "AppRun"), "chat"], capture_output=True, text=True, timeout=60)
    assert ran.stdout.strip() == "stand-in hearth chat"
    assert (appdir / "hearth.desktop").is_file() and (appdir / "hearth.png").is_file()
