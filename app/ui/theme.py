"""Light and dark palettes and the one application stylesheet built from them."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication


@dataclass(frozen=True)
class Palette:
    name: str
    window: str
    sidebar: str
    surface: str  # cards, input box
    surface_alt: str  # user bubbles, hover
    border: str
    text: str
    muted: str
    accent: str
    accent_text: str
    danger: str
    code_bg: str
    code_border: str
    pygments_style: str
    weights: str
    kv: str
    overhead: str
    free: str
    system: str
    history: str
    current: str
    reply: str


LIGHT = Palette(
    name="light",
    window="#f7f7f8",
    sidebar="#eeeef1",
    surface="#ffffff",
    surface_alt="#e8eefc",
    border="#d9dbe1",
    text="#1d1f24",
    muted="#6b7080",
    accent="#d9622b",
    accent_text="#ffffff",
    danger="#c0392b",
    code_bg="#f4f5f7",
    code_border="#e1e3e8",
    pygments_style="friendly",
    weights="#4c6ef5",
    kv="#f08c00",
    overhead="#868e96",
    free="#e9ecef",
    system="#7950f2",
    history="#4c6ef5",
    current="#12b886",
    reply="#f08c00",
)

DARK = Palette(
    name="dark",
    window="#1b1c20",
    sidebar="#141518",
    surface="#24262b",
    surface_alt="#2f3541",
    border="#363941",
    text="#e6e7ea",
    muted="#9096a3",
    accent="#f07a3e",
    accent_text="#ffffff",
    danger="#ff6b6b",
    code_bg="#1a1b1f",
    code_border="#33363d",
    pygments_style="monokai",
    weights="#5c7cfa",
    kv="#fab005",
    overhead="#adb5bd",
    free="#33363d",
    system="#9775fa",
    history="#5c7cfa",
    current="#20c997",
    reply="#fab005",
)


def resolve(theme: str) -> Palette:
    if theme == "dark":
        return DARK
    if theme == "light":
        return LIGHT
    hints = QGuiApplication.styleHints()
    return DARK if hints is not None and hints.colorScheme() == Qt.ColorScheme.Dark else LIGHT


def _style_icon(name: str) -> str:
    """A QSS url() for a bundled style image (forward slashes: QSS wants them on Windows too)."""
    try:
        from app.resources import resource_path

        return resource_path("styles", name).as_posix()
    except FileNotFoundError:
        return ""


def stylesheet(p: Palette) -> str:
    down = _style_icon(f"chevron-down-{p.name}.svg")
    up = _style_icon(f"chevron-up-{p.name}.svg")
    return f"""
QMainWindow, QDialog {{ background: {p.window}; color: {p.text}; }}
QWidget {{ color: {p.text}; font-size: 10pt; }}
QToolTip {{ background: {p.surface}; color: {p.text}; border: 1px solid {p.border}; padding: 4px; }}
#Sidebar {{ background: {p.sidebar}; border-right: 1px solid {p.border}; }}
#SidePanel {{ background: {p.sidebar}; border-left: 1px solid {p.border}; }}
#ModelBar {{ background: {p.surface}; border-bottom: 1px solid {p.border}; }}
#Brand {{ font-size: 14pt; font-weight: 600; color: {p.text}; }}
#SectionTitle {{ color: {p.muted}; font-size: 8.5pt; font-weight: 600; letter-spacing: 1px; }}
#Muted, #Stats {{ color: {p.muted}; }}
#Stats {{ font-size: 8.5pt; }}
#ChatArea, #ChatArea > QWidget > QWidget {{ background: {p.window}; border: none; }}
#Bubble {{ background: transparent; }}
#UserCard {{ background: {p.surface_alt}; border-radius: 12px; }}
#AssistantCard {{ background: {p.surface}; border: 1px solid {p.border}; border-radius: 12px; }}
#ErrorCard {{ background: transparent; border: 1px solid {p.danger}; border-radius: 12px; }}
#ErrorText {{ color: {p.danger}; }}
#Role {{ font-weight: 600; }}
QTextBrowser#Body {{ background: transparent; border: none; }}
#InputCard {{ background: {p.surface}; border: 1px solid {p.border}; border-radius: 14px; }}
QPlainTextEdit#Input {{ background: transparent; border: none; font-size: 10.5pt; }}
QLineEdit, QComboBox, QSpinBox, QDoubleSpinBox, QPlainTextEdit {{
    background: {p.surface}; border: 1px solid {p.border}; border-radius: 6px; padding: 4px 6px;
    selection-background-color: {p.accent}; selection-color: {p.accent_text};
}}
QComboBox::drop-down {{ border: none; width: 20px; }}
QComboBox::down-arrow {{ image: url({down}); width: 10px; height: 10px; }}
QSpinBox::up-button, QDoubleSpinBox::up-button, QSpinBox::down-button, QDoubleSpinBox::down-button {{
    border: none; width: 16px; }}
QSpinBox::up-arrow, QDoubleSpinBox::up-arrow {{ image: url({up}); width: 9px; height: 9px; }}
QSpinBox::down-arrow, QDoubleSpinBox::down-arrow {{ image: url({down}); width: 9px; height: 9px; }}
QComboBox QAbstractItemView {{ background: {p.surface}; border: 1px solid {p.border};
    selection-background-color: {p.surface_alt}; selection-color: {p.text}; }}
QPushButton {{ background: {p.surface}; border: 1px solid {p.border}; border-radius: 6px; padding: 5px 12px; }}
QPushButton:hover {{ background: {p.surface_alt}; }}
QPushButton:disabled {{ color: {p.muted}; }}
QPushButton#Primary {{ background: {p.accent}; color: {p.accent_text}; border: none; font-weight: 600; }}
QPushButton#Primary:disabled {{ background: {p.border}; color: {p.muted}; }}
QPushButton#Stop {{ background: {p.danger}; color: {p.accent_text}; border: none; font-weight: 600; }}
QToolButton {{ background: transparent; border: none; border-radius: 5px; padding: 2px 6px; color: {p.muted}; }}
QToolButton:hover {{ background: {p.surface_alt}; color: {p.text}; }}
QListWidget {{ background: transparent; border: none; outline: none; }}
QListWidget::item {{ padding: 7px 8px; border-radius: 6px; margin: 1px 0; }}
QListWidget::item:selected {{ background: {p.surface_alt}; color: {p.text}; }}
QListWidget::item:hover:!selected {{ background: {p.surface}; }}
QDialog QListWidget {{ background: {p.surface}; border: 1px solid {p.border}; border-radius: 6px; }}
QDialog QListWidget::item {{ padding: 4px 6px; }}
#Hint {{ color: {p.muted}; }}
#MemorySummary {{ color: {p.muted}; }}
QProgressBar {{ background: {p.free}; border: none; border-radius: 3px; max-height: 6px; }}
QProgressBar::chunk {{ background: {p.accent}; border-radius: 3px; }}
QScrollBar:vertical {{ background: transparent; width: 10px; margin: 2px; }}
QScrollBar::handle:vertical {{ background: {p.border}; border-radius: 4px; min-height: 30px; }}
QScrollBar::add-line, QScrollBar::sub-line {{ height: 0; }}
QScrollBar::add-page, QScrollBar::sub-page {{ background: transparent; }}
"""


def apply(app: QApplication, theme: str) -> Palette:
    p = resolve(theme)
    qpalette = QPalette()
    for role, colour in (
        (QPalette.ColorRole.Window, p.window),
        (QPalette.ColorRole.WindowText, p.text),
        (QPalette.ColorRole.Base, p.surface),
        (QPalette.ColorRole.AlternateBase, p.surface_alt),
        (QPalette.ColorRole.Text, p.text),
        (QPalette.ColorRole.Button, p.surface),
        (QPalette.ColorRole.ButtonText, p.text),
        (QPalette.ColorRole.Highlight, p.accent),
        (QPalette.ColorRole.HighlightedText, p.accent_text),
        (QPalette.ColorRole.PlaceholderText, p.muted),
        (QPalette.ColorRole.Link, p.accent),
        (QPalette.ColorRole.ToolTipBase, p.surface),
        (QPalette.ColorRole.ToolTipText, p.text),
    ):
        qpalette.setColor(role, QColor(colour))
    app.setPalette(qpalette)
    app.setStyleSheet(stylesheet(p))
    return p
