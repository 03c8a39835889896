"""Settings: sampling, system prompt, default model, theme. Edits the one typed Settings object.

Three tabs (Chat, Sampling, Hugging Face), each scrolling on a short screen, with Save and Cancel always in view: the
dialog is ~450 px tall, not the 762 px of one long form that a laptop screen squeezed until rows overlapped."""

from __future__ import annotations

from PySide6.QtCore import QSize
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QSpinBox,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.core.chat.sampling import SamplingParams
from app.core.engines.remote.pricing import COMPARE_CHOICES
from app.core.errors import InvalidSettingError
from app.core.settings import CONTEXT_POLICIES, THEMES, Settings
from app.ui.dialogs import fit_to_screen, scrolling

COMPARE_OFF = "Off"


class SettingsDialog(QDialog):
    def __init__(self, settings: Settings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.original = settings
        self.result_settings: Settings | None = None
        layout = QVBoxLayout(self)
        self.tabs = QTabWidget()
        layout.addWidget(self.tabs, 1)
        form = self._page("Chat")

        self.system_prompt = QPlainTextEdit(settings.system_prompt)
        self.system_prompt.setFixedHeight(5 * self.system_prompt.fontMetrics().lineSpacing() + 14)  # five lines
        form.addRow("System prompt", self.system_prompt)
        self.model = QLineEdit(settings.model or "")
        self.model.setPlaceholderText("empty: the built-in model")
        self.model.setToolTip(
            "A folder, a .gguf file or a Hugging Face repo id; empty: the built-in SmolLM2-135M-Instruct"
        )
        form.addRow("Default model", self.model)
        self.theme = QComboBox()
        self.theme.addItems(list(THEMES))
        self.theme.setCurrentText(settings.theme)
        form.addRow("Theme", self.theme)
        self.context_policy = QComboBox()
        self.context_policy.addItems(list(CONTEXT_POLICIES))
        self.context_policy.setCurrentText(settings.context_policy)
        form.addRow("When the context is full", self.context_policy)
        self.attachment_limit = QSpinBox()
        self.attachment_limit.setRange(1, 4096)
        self.attachment_limit.setSuffix(" MB")
        self.attachment_limit.setValue(settings.attachment_limit_mb)
        form.addRow("Largest attached file", self.attachment_limit)
        self.compare_cost = QComboBox()
        self.compare_cost.setEditable(True)  # any "provider/model" genai-prices knows
        self.compare_cost.addItems([COMPARE_OFF, *COMPARE_CHOICES])
        self.compare_cost.setCurrentText(settings.compare_cost_with or COMPARE_OFF)
        self.compare_cost.setToolTip(
            "Under each local reply, what the same tokens would have cost on this hosted model (an estimate from "
            "the price list bundled with Hearth)"
        )
        form.addRow("Compare local replies' cost with", self.compare_cost)

        s = settings.sampling
        form = self._page("Sampling")
        self.temperature = self._double(s.temperature, 0.0, 5.0, 0.05)
        form.addRow("Temperature (0 = greedy)", self.temperature)
        self.top_p = self._double(s.top_p, 0.01, 1.0, 0.01)
        form.addRow("Top-p", self.top_p)
        self.top_k = QSpinBox()
        self.top_k.setRange(0, 1000)
        self.top_k.setValue(s.top_k)
        form.addRow("Top-k (0 = off)", self.top_k)
        self.min_p = self._double(s.min_p, 0.0, 0.99, 0.01)
        form.addRow("Min-p (0 = off)", self.min_p)
        self.repetition_penalty = self._double(s.repetition_penalty, 0.5, 3.0, 0.05)
        form.addRow("Repetition penalty", self.repetition_penalty)
        self.max_new_tokens = QSpinBox()
        self.max_new_tokens.setRange(1, 131_072)
        self.max_new_tokens.setValue(s.max_new_tokens)
        form.addRow("Max new tokens", self.max_new_tokens)
        self.seed = QSpinBox()
        self.seed.setRange(-1, 2**31 - 1)
        self.seed.setSpecialValueText("random")
        self.seed.setValue(-1 if s.seed is None else s.seed)
        form.addRow("Seed", self.seed)
        self.prompt_lookup = QCheckBox("Faster replies that copy text")
        self.prompt_lookup.setChecked(settings.prompt_lookup)
        self.prompt_lookup.setToolTip(
            "Where a reply repeats text from the conversation (quotes, rewrites, code edits), check several tokens "
            "at once: the same reply, sooner. Used only as far as it measures faster. From the next model load."
        )
        form.addRow("Prompt lookup", self.prompt_lookup)

        # The Hub token goes straight to the OS keyring from this box, never into Settings.
        from app.ui.hub_token import HubTokenBox

        self.hub_token = HubTokenBox()
        hub_page = QWidget()
        hub_layout = QVBoxLayout(hub_page)
        hub_layout.addWidget(self.hub_token)
        hub_layout.addStretch(1)
        self.tabs.addTab(scrolling(hub_page), "Hugging Face")

        self.error = QLabel()
        self.error.setObjectName("ErrorText")
        self.error.setWordWrap(True)
        self.error.setVisible(False)
        layout.addWidget(self.error)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        fit_to_screen(self, QSize(540, 470))

    def _page(self, title: str) -> QFormLayout:
        page = QWidget()
        column = QVBoxLayout(page)
        form = QFormLayout()
        form.setVerticalSpacing(8)
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        column.addLayout(form)
        column.addStretch(1)  # the rows stay together at the top of a tall page
        self.tabs.addTab(scrolling(page), title)
        return form

    @staticmethod
    def _double(value: float, low: float, high: float, step: float) -> QDoubleSpinBox:
        box = QDoubleSpinBox()
        box.setDecimals(2)
        box.setRange(low, high)
        box.setSingleStep(step)
        box.setValue(value)
        return box

    def build(self) -> Settings:
        """The edited settings; raises InvalidSettingError with the setting's own message."""
        sampling = SamplingParams(
            temperature=self.temperature.value(),
            top_p=self.top_p.value(),
            top_k=self.top_k.value(),
            min_p=self.min_p.value(),
            repetition_penalty=self.repetition_penalty.value(),
            max_new_tokens=self.max_new_tokens.value(),
            seed=None if self.seed.value() < 0 else self.seed.value(),
        )
        return self.original.with_changes(
            system_prompt=self.system_prompt.toPlainText(),
            model=self.model.text().strip() or None,
            theme=self.theme.currentText(),
            context_policy=self.context_policy.currentText(),
            attachment_limit_mb=self.attachment_limit.value(),
            compare_cost_with=None
            if self.compare_cost.currentText().strip() in ("", COMPARE_OFF)
            else self.compare_cost.currentText().strip(),
            sampling=sampling,
            prompt_lookup=self.prompt_lookup.isChecked(),
        )

    def accept(self) -> None:
        try:
            self.result_settings = self.build()
        except InvalidSettingError as exc:
            self.error.setText(str(exc))
            self.error.setVisible(True)
            return
        super().accept()
