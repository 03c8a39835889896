"""The model bar: which model, quantization, device and context length; load/unload with progress and cancel.

The model list holds local models and the registered remote engines' models together, the latter as
"MODEL @ ENGINE" (app.core.engines.backend.RemoteModel); choosing one loads a RemoteBackend through the same worker."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFocusEvent
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.core.engines.backend import LoadRequest, ModelInfo, RemoteModel
from app.core.models.model_source import DEFAULT_MODEL_NAME
from app.core.models.quant import QUANTIZATIONS, auto_summary, parse_quantization
from app.core.settings import DEVICES, Settings
from app.ui.elided_label import ElidedLabel

DEFAULT_LABEL = f"{DEFAULT_MODEL_NAME} (built in)"
LIBRARY_ITEM = "library"  # item data of the library's local models (remote ones carry their RemoteModel)


class ModelCombo(QComboBox):
    """The model list; says when its list is about to open, so the library's models can be listed then (listing
    them reads every model's config: not worth doing at each start).

    A model's name is read from its start: the box shows the start of a long name (not its end, as a line edit
    does after setText), and the list opens as wide as its longest name (up to the screen's width), not cut."""

    popup_opening = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setEditable(True)
        self.view().setTextElideMode(Qt.TextElideMode.ElideRight)
        self.currentTextChanged.connect(self._show_start)  # typed text keeps its cursor while the box has focus
        self.currentIndexChanged.connect(lambda _index: self._show_start(self.currentText(), chosen=True))

    def showPopup(self) -> None:
        self.popup_opening.emit()
        metrics = self.view().fontMetrics()
        widest = max((metrics.horizontalAdvance(self.itemText(i)) for i in range(self.count())), default=0)
        screen = self.screen().availableGeometry().width() if self.screen() is not None else 1024
        self.view().setMinimumWidth(min(widest + 48, screen - 32))
        super().showPopup()

    def _show_start(self, text: str, chosen: bool = False) -> None:
        edit = self.lineEdit()
        if edit is not None and (chosen or not edit.hasFocus()):
            edit.setCursorPosition(0)
        self.setToolTip(self._about if not text else f"{text}\n\n{self._about}")

    _about = "The built-in model, a folder, a .gguf file or a Hugging Face repo id"

    def set_about(self, about: str) -> None:
        """The tooltip's explanation under the chosen model's whole name."""
        self._about = about
        self._show_start(self.currentText())

    def focusOutEvent(self, event: QFocusEvent) -> None:
        super().focusOutEvent(event)
        self._show_start(self.currentText())


class ModelBar(QWidget):
    load_requested = Signal(object)  # LoadRequest
    unload_requested = Signal()
    cancel_requested = Signal()
    selection_changed = Signal(object)  # LoadRequest: ask the planner

    def __init__(self, settings: Settings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("ModelBar")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        # Two rows: the model (its long name has the whole width) and the load button; then how to load it and
        # what is loaded. Neither row's minimum width depends on the state (loading, loaded, a long status).
        outer = QVBoxLayout(self)
        outer.setContentsMargins(16, 8, 16, 8)
        outer.setSpacing(6)
        row = QHBoxLayout()
        row.setSpacing(8)
        outer.addLayout(row)

        self.model_combo = ModelCombo()
        self.model_combo.setMinimumWidth(160)
        self.model_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.model_combo.setMinimumContentsLength(12)
        self.model_combo.addItem(DEFAULT_LABEL)
        if settings.model:
            self.model_combo.addItem(settings.model)
            self.model_combo.setCurrentText(settings.model)
        self.quant_combo = QComboBox()
        self.quant_combo.addItems(list(QUANTIZATIONS))
        self.quant_combo.setCurrentText(settings.quantization)
        self.quant_combo.setToolTip(f"Quantization (auto: {auto_summary()})")
        self.device_combo = QComboBox()
        self.device_combo.addItems(list(DEVICES))
        self.device_combo.setCurrentText(settings.device)
        self.device_combo.setToolTip("Device")
        self.context_spin = QSpinBox()
        self.context_spin.setRange(0, 1_048_576)
        self.context_spin.setSingleStep(1024)
        self.context_spin.setMinimumWidth(104)
        self.context_spin.setSpecialValueText("max context")
        self.context_spin.setValue(settings.context_length or 0)
        self.context_spin.setToolTip("Context length in tokens (max context = the model's own maximum)")
        self.load_button = QPushButton("Load")
        self.load_button.setObjectName("Primary")
        self.load_button.clicked.connect(self._load_clicked)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.cancel_requested)
        self.cancel_button.setVisible(False)
        # Cancel takes Load's place while loading: one width for both, so nothing beside them moves.
        width = max(self.load_button.sizeHint().width(), self.cancel_button.sizeHint().width(), 84)
        for button in (self.load_button, self.cancel_button):
            button.setFixedWidth(width)

        caption = QLabel("Model")
        caption.setObjectName("Muted")
        row.addWidget(caption)
        row.addWidget(self.model_combo, 1)
        self.status_slot = QHBoxLayout()  # the window's memory summary goes here (app/ui/window_panels.py)
        self.status_slot.setContentsMargins(0, 0, 0, 0)
        row.addLayout(self.status_slot)
        row.addWidget(self.cancel_button)
        row.addWidget(self.load_button)

        settings_row = QHBoxLayout()
        settings_row.setSpacing(8)
        for label, widget in (
            ("Quant", self.quant_combo),
            ("Device", self.device_combo),
            ("Context", self.context_spin),
        ):
            caption = QLabel(label)
            caption.setObjectName("Muted")
            settings_row.addWidget(caption)
            settings_row.addWidget(widget)
        settings_row.addSpacing(8)
        self.progress = QProgressBar()
        self.progress.setTextVisible(False)
        self.progress.setVisible(False)
        self.progress.setMinimumWidth(1)  # its own minimum would widen the window while a model loads
        # The status (what is loaded, or the loading step) elides: a long file name never crowds the controls.
        self.status = ElidedLabel("No model loaded")
        self.status.setObjectName("Muted")
        settings_row.addWidget(self.status, 3)
        settings_row.addWidget(self.progress, 1)  # the step's words before its bar
        outer.addLayout(settings_row)
        self.loaded: ModelInfo | None = None
        self.loading = False
        for combo in (self.model_combo, self.quant_combo, self.device_combo):
            combo.currentTextChanged.connect(self._selection_changed)
        self.context_spin.valueChanged.connect(self._selection_changed)

    def choose_model(self) -> None:
        """Models ▸ Choose model (Ctrl+L): the model list, open, with the keyboard in its box."""
        self.model_combo.setFocus(Qt.FocusReason.ShortcutFocusReason)
        self.model_combo.showPopup()

    def request(self) -> LoadRequest:
        text = self.model_combo.currentText().strip()
        context = self.context_spin.value() or None
        remote = RemoteModel.parse(text)
        if remote is not None:  # quantization and device are the server's business
            return LoadRequest(None, context_length=context, remote=remote)
        model = None if text in ("", DEFAULT_LABEL) else text
        quantization = parse_quantization(self.quant_combo.currentText())  # the combo only lists QUANTIZATIONS
        return LoadRequest(model, quantization, self.device_combo.currentText(), context)

    def set_model(self, spec: str) -> None:
        if self.model_combo.findText(spec) < 0:
            self.model_combo.addItem(spec)
        self.model_combo.setCurrentText(spec)

    def set_remote_models(self, models: Sequence[RemoteModel]) -> None:
        """The registered engines' models (app/ui/remote_window.py lists them), after the local ones; the text the
        user chose or typed stays."""
        chosen = self.model_combo.currentText()
        blocked = self.model_combo.blockSignals(True)
        labels = {model.label for model in models}
        for index in range(self.model_combo.count() - 1, -1, -1):
            # the old list, and a default model saved as "MODEL @ ENGINE" (listed again, once, with the others)
            if isinstance(self.model_combo.itemData(index), RemoteModel) or self.model_combo.itemText(index) in labels:
                self.model_combo.removeItem(index)
        for model in models:
            self.model_combo.addItem(model.label, model)
        self.model_combo.setCurrentText(chosen)
        self.model_combo.blockSignals(blocked)
        self._show_remote_choice()

    def set_local_models(self, specs: Sequence[str]) -> None:
        """The library's models (app.core.models.library specs: a folder, a .gguf file, a Hugging Face repo id), after
        the built-in one; the text the user chose or typed stays."""
        chosen = self.model_combo.currentText()
        blocked = self.model_combo.blockSignals(True)
        for index in range(self.model_combo.count() - 1, -1, -1):
            if self.model_combo.itemData(index) == LIBRARY_ITEM:
                self.model_combo.removeItem(index)
        position = 1  # after the built-in model
        for spec in specs:
            if self.model_combo.findText(spec) < 0:
                self.model_combo.insertItem(position, spec, LIBRARY_ITEM)
                position += 1
        self.model_combo.setCurrentText(chosen)
        self.model_combo.blockSignals(blocked)

    def local_models(self) -> list[str]:
        return [
            self.model_combo.itemText(i)
            for i in range(self.model_combo.count())
            if self.model_combo.itemData(i) == LIBRARY_ITEM
        ]

    def remote_models(self) -> list[RemoteModel]:
        data = (self.model_combo.itemData(i) for i in range(self.model_combo.count()))
        return [item for item in data if isinstance(item, RemoteModel)]

    def _show_remote_choice(self) -> None:
        remote = self.request().remote is not None
        for combo in (self.quant_combo, self.device_combo):
            combo.setEnabled(not remote)
        self.context_spin.setToolTip(
            "The model's context window on the server, for the context gauge (max context = unknown)"
            if remote
            else "Context length in tokens (max context = the model's own maximum)"
        )

    def _selection_changed(self, *args: object) -> None:
        self._show_remote_choice()
        self.selection_changed.emit(self.request())

    def _load_clicked(self) -> None:
        if self.loaded is not None and not self.loading:
            self.unload_requested.emit()
        else:
            self.load_requested.emit(self.request())

    # -- state from the worker ----------------------------------------------------------------
    def set_loading(self, message: str, fraction: float) -> None:
        self.loading = True
        self.progress.setVisible(True)
        if fraction < 0:
            self.progress.setRange(0, 0)  # busy indicator
        else:
            self.progress.setRange(0, 1000)
            self.progress.setValue(int(fraction * 1000))
        self.status.set_full_text(message)
        self.cancel_button.setVisible(True)
        self.load_button.setVisible(False)

    def set_loaded(self, info: ModelInfo) -> None:
        self.loading = False
        self.loaded = info
        self.progress.setVisible(False)
        self.cancel_button.setVisible(False)
        self.load_button.setVisible(True)
        self.load_button.setText("Unload")
        self.load_button.setObjectName("")
        self.load_button.style().polish(self.load_button)
        # The figures first (the model's name is in the box above; a narrow bar cuts the end of this line)
        window = f" · {info.context_window:,} ctx" if info.context_window else ""
        where = "remote engine" if info.device == "remote" else f"{info.quantization} · {info.device}"
        self.status.set_full_text(f"Loaded: {where}{window}", "\n".join([info.name, *info.notices]))

    def set_unloaded(self, message: str = "No model loaded") -> None:
        self.loading = False
        self.loaded = None
        self.progress.setVisible(False)
        self.cancel_button.setVisible(False)
        self.load_button.setVisible(True)
        self.load_button.setText("Load")
        self.load_button.setObjectName("Primary")
        self.load_button.style().polish(self.load_button)
        self.status.set_full_text(message)
