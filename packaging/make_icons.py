"""Render Hearth's icons from their SVG sources into what each platform needs; the outputs are committed.

    python packaging/make_icons.py          # (re)write the PNGs, hearth.ico and hearth.icns under resources/icons/

- resources/icons/hicolor/<N>x<N>/apps/hearth.png for the freedesktop hicolor sizes, plus scalable/apps/hearth.svg
  (Linux .desktop entries and the .deb); 16–32 px come from hearth-small.svg, drawn to read at that size.
- resources/icons/hearth.ico (Windows: 16–256 px) and hearth.icns (macOS: 16–1024 px), written by Pillow.
- resources/icons/ui/png/<name>.png and <name>@2x.png (24 and 48 px) for each UI icon SVG in resources/icons/ui/.

QtSvg renders (PySide6-Essentials); QT_QPA_PLATFORM=offscreen is enough, no display is needed.
"""

from __future__ import annotations

import io
import os
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ICONS = REPO / "resources" / "icons"
APP_SVG = ICONS / "hearth.svg"
APP_SMALL_SVG = ICONS / "hearth-small.svg"
UI_DIR = ICONS / "ui"
HICOLOR = ICONS / "hicolor"

HICOLOR_SIZES = (16, 22, 24, 32, 48, 64, 128, 256, 512)
SMALL_ICON_MAX = 32  # at or below this size the simplified drawing reads better
ICO_SIZES = (16, 24, 32, 48, 64, 128, 256)
ICNS_SIZES = (16, 32, 64, 128, 256, 512, 1024)
UI_SIZES = {"": 24, "@2x": 48}


def render_png(svg: Path, size: int) -> bytes:
    """The SVG drawn at size×size on a transparent background, as PNG bytes."""
    from PySide6.QtCore import QBuffer, QByteArray, QIODevice, Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    if QGuiApplication.instance() is None:
        render_png.app = QGuiApplication([])  # type: ignore[attr-defined]  # kept alive for later calls
    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise ValueError(f"{svg} is not a valid SVG")
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform)
    renderer.render(painter)
    painter.end()
    data = QByteArray()
    buffer = QBuffer(data)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buffer, "PNG")  # type: ignore[call-overload]  # the stubs say bytes; PySide6 takes str
    buffer.close()
    return bytes(data.data())


def app_svg_for(size: int) -> Path:
    return APP_SMALL_SVG if size <= SMALL_ICON_MAX else APP_SVG


def hicolor_png(size: int) -> Path:
    return HICOLOR / f"{size}x{size}" / "apps" / "hearth.png"


def write_hicolor() -> list[Path]:
    written = []
    for size in HICOLOR_SIZES:
        target = hicolor_png(size)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(render_png(app_svg_for(size), size))
        written.append(target)
    scalable = HICOLOR / "scalable" / "apps" / "hearth.svg"
    scalable.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(APP_SVG, scalable)
    written.append(scalable)
    return written


def write_ico_and_icns() -> list[Path]:
    from PIL import Image

    def image(size: int) -> Image.Image:
        return Image.open(io.BytesIO(render_png(app_svg_for(size), size))).convert("RGBA")

    ico = ICONS / "hearth.ico"
    largest = image(max(ICO_SIZES))
    largest.save(ico, format="ICO", sizes=[(s, s) for s in ICO_SIZES], append_images=[image(s) for s in ICO_SIZES])
    icns = ICONS / "hearth.icns"
    biggest = image(max(ICNS_SIZES))
    biggest.save(icns, format="ICNS", append_images=[image(s) for s in ICNS_SIZES if s != max(ICNS_SIZES)])
    return [ico, icns]


def write_ui_pngs() -> list[Path]:
    written = []
    out = UI_DIR / "png"
    out.mkdir(parents=True, exist_ok=True)
    for svg in sorted(UI_DIR.glob("*.svg")):
        for suffix, size in UI_SIZES.items():
            target = out / f"{svg.stem}{suffix}.png"
            target.write_bytes(render_png(svg, size))
            written.append(target)
    return written


def main() -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    written = write_hicolor() + write_ico_and_icns() + write_ui_pngs()
    for path in written:
        print(path.relative_to(REPO))
    return 0


if __name__ == "__main__":
    sys.exit(main())
