"""The model bar: which model, quantization, device and context length; load/unload with progress and cancel."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QFontMetrics, QResizeEvent
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.core.backend import LoadRequest, ModelInfo
from app.core.model_source import DEFAULT_MODEL_NAME
from app.core.settings import DEVICES, QUANTIZATIONS, Settings

DEFAULT_LABEL = f"{DEFAULT_MODEL_NAME} (built in)"


class ElidedLabel(QLabel):
    """A one-line label that shrinks to fit: long text ends in "…" and the whole text is in the tooltip.

    A plain QLabel's minimum width is its whole text, so one long status ("Converting <file> once…") widened
    the window past a laptop screen and kept it from shrinking back.
    """

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._full = ""
        self._notes = ""
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.setMinimumWidth(80)
        self.set_full_text(text)

    def full_text(self) -> str:
        return self._full

    def set_full_text(self, text: str, notes: str = "") -> None:
        self._full = text
        self._notes = notes
        self.setToolTip("\n".join(part for part in (text, notes) if part))
        self._elide()
        self.updateGeometry()

    def sizeHint(self) -> QSize:
        hint = super().sizeHint()
        hint.setWidth(min(QFontMetrics(self.font()).horizontalAdvance(self._full) + 4, 420))
        return hint

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        shown = QFontMetrics(self.font()).elidedText(self._full, Qt.TextElideMode.ElideRight, max(self.width(), 0))
        super().setText(shown)


class ModelBar(QWidget):
    load_requested = Signal(object)  # LoadRequest
    unload_requested = Signal()
    cancel_requested = Signal()
    selection_changed = Signal(object)  # LoadRequest: ask the planner

    def __init__(self, settings: Settings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("ModelBar")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(16, 8, 16, 8)
        outer.setSpacing(4)
        row = QHBoxLayout()
        row.setSpacing(8)
        outer.addLayout(row)

        self.model_combo = QComboBox()
        self.model_combo.setEditable(True)
        self.model_combo.setMinimumWidth(160)  # narrow enough for a 1366-px laptop screen with every panel shown
        self.model_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.model_combo.setMinimumContentsLength(12)
        self.model_combo.setToolTip("The built-in model, a folder, a .gguf file or a Hugging Face repo id")
        self.model_combo.addItem(DEFAULT_LABEL)
        if settings.model:
            self.model_combo.addItem(settings.model)
            self.model_combo.setCurrentText(settings.model)
        self.quant_combo = QComboBox()
        self.quant_combo.addItems(list(QUANTIZATIONS))
        self.quant_combo.setCurrentText(settings.quantization)
        self.quant_combo.setToolTip("Quantization (auto: q4 on the CPU, nf4 on a GPU)")
        self.device_combo = QComboBox()
        self.device_combo.addItems(list(DEVICES))
        self.device_combo.setCurrentText(settings.device)
        self.device_combo.setToolTip("Device")
        self.context_spin = QSpinBox()
        self.context_spin.setRange(0, 1_048_576)
        self.context_spin.setSingleStep(1024)
        self.context_spin.setMinimumWidth(110)
        self.context_spin.setSpecialValueText("max context")
        self.context_spin.setValue(settings.context_length or 0)
        self.context_spin.setToolTip("Context length in tokens (max context = the model's own maximum)")
        self.load_button = QPushButton("Load")
        self.load_button.setObjectName("Primary")
        self.load_button.clicked.connect(self._load_clicked)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.cancel_requested)
        self.cancel_button.setVisible(False)

        for label, widget in (
            ("Model", self.model_combo),
            ("Quant", self.quant_combo),
            ("Device", self.device_combo),
            ("Context", self.context_spin),
        ):
            caption = QLabel(label)
            caption.setObjectName("Muted")
            row.addWidget(caption)
            row.addWidget(widget, 3 if widget is self.model_combo else 0)
        row.addWidget(self.cancel_button)
        row.addWidget(self.load_button)

        self.progress = QProgressBar()
        self.progress.setTextVisible(False)
        self.progress.setVisible(False)
        # The status has a line of its own, beside the progress bar: a long file name never crowds the controls.
        self.status = ElidedLabel("No model loaded")
        self.status.setObjectName("Muted")
        status_row = QHBoxLayout()
        status_row.setSpacing(8)
        status_row.addWidget(self.status, 3)
        status_row.addWidget(self.progress, 2)
        outer.addLayout(status_row)
        self.loaded: ModelInfo | None = None
        self.loading = False
        for combo in (self.model_combo, self.quant_combo, self.device_combo):
            combo.currentTextChanged.connect(self._selection_changed)
        self.context_spin.valueChanged.connect(self._selection_changed)

    def request(self) -> LoadRequest:
        text = self.model_combo.currentText().strip()
        model = None if text in ("", DEFAULT_LABEL) else text
        context = self.context_spin.value() or None
        return LoadRequest(model, self.quant_combo.currentText(), self.device_combo.currentText(), context)

    def set_model(self, spec: str) -> None:
        if self.model_combo.findText(spec) < 0:
            self.model_combo.addItem(spec)
        self.model_combo.setCurrentText(spec)

    def _selection_changed(self, *args: object) -> None:
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
        self.load_button.setEnabled(False)

    def set_loaded(self, info: ModelInfo) -> None:
        self.loading = False
        self.loaded = info
        self.progress.setVisible(False)
        self.cancel_button.setVisible(False)
        self.load_button.setEnabled(True)
        self.load_button.setText("Unload")
        self.load_button.setObjectName("")
        self.load_button.style().polish(self.load_button)
        self.status.set_full_text(
            f"{info.name} · {info.quantization} · {info.device} · {info.context_window:,} ctx", "\n".join(info.notices)
        )

    def set_unloaded(self, message: str = "No model loaded") -> None:
        self.loading = False
        self.loaded = None
        self.progress.setVisible(False)
        self.cancel_button.setVisible(False)
        self.load_button.setEnabled(True)
        self.load_button.setText("Load")
        self.load_button.setObjectName("Primary")
        self.load_button.style().polish(self.load_button)
        self.status.set_full_text(message)
