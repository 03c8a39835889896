"""The main window's menus and their shortcuts, the same keys as LM Studio and Jan where they have one
(docs/ui.md lists them): Ctrl+N new chat, Ctrl+, settings, Ctrl+L choose a model, Ctrl+E eject it, Esc stop.
View ▸ Conversations (Ctrl+B), Memory panel (Ctrl+Shift+B) and Server come from app/ui/window_panels.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QMenu, QMenuBar, QWidget

Slot = Callable[[], object]


@dataclass(frozen=True)
class MenuSlots:
    new_chat: Slot
    import_conversation: Slot
    export_markdown: Slot
    export_json: Slot
    quit: Slot
    settings: Slot
    stop: Slot
    choose_model: Slot
    eject_model: Slot
    library: Slot


@dataclass(frozen=True)
class Menus:
    file: QMenu
    edit: QMenu
    models: QMenu
    view: QMenu
    stop: QAction
    choose_model: QAction
    eject_model: QAction
    library: QAction


def _action(parent: QWidget, menu: QMenu, text: str, slot: Slot, keys: str = "") -> QAction:
    action = QAction(text, parent)
    if keys:
        action.setShortcut(QKeySequence(keys))
    action.triggered.connect(lambda _checked=False: slot())
    menu.addAction(action)
    return action


def build_menus(bar: QMenuBar, parent: QWidget, slots: MenuSlots) -> Menus:
    file_menu = bar.addMenu("&File")
    _action(parent, file_menu, "&New chat", slots.new_chat, "Ctrl+N")
    file_menu.addSeparator()
    _action(parent, file_menu, "&Import conversation…", slots.import_conversation)
    _action(parent, file_menu, "Export as &Markdown…", slots.export_markdown)
    _action(parent, file_menu, "Export as &JSON…", slots.export_json)
    file_menu.addSeparator()
    _action(parent, file_menu, "&Quit", slots.quit, "Ctrl+Q")
    edit_menu = bar.addMenu("&Edit")
    stop = _action(parent, edit_menu, "S&top generating", slots.stop, "Esc")
    stop.setEnabled(False)  # while a reply streams (MainWindow follows the controller)
    edit_menu.addSeparator()
    _action(parent, edit_menu, "&Settings…", slots.settings, "Ctrl+,")
    models_menu = bar.addMenu("&Models")
    choose = _action(parent, models_menu, "&Choose model…", slots.choose_model, "Ctrl+L")
    eject = _action(parent, models_menu, "&Eject model", slots.eject_model, "Ctrl+E")
    eject.setEnabled(False)  # while a model is loaded
    models_menu.addSeparator()
    library = _action(parent, models_menu, "Model &library…", slots.library, "Ctrl+Shift+M")
    view_menu = bar.addMenu("&View")
    return Menus(file_menu, edit_menu, models_menu, view_menu, stop, choose, eject, library)
