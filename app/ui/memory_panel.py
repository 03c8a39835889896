"""The memory panel: a stacked bar per device, the context gauge, the KV forecast and the planner's verdict.

Drawn with QPainter; hovering a segment shows its numbers. Takes plain data (MemoryReading, ContextUsage,
the planner's MemoryPlan) and never asks the worker for anything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QEvent, QPoint, QRectF, QSize, Qt, Signal
from PySide6.QtGui import QColor, QFontMetrics, QHelpEvent, QPainter, QPainterPath
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QSizePolicy, QToolTip, QVBoxLayout, QWidget

from app.core.engines.backend import ContextUsage, MemoryReading
from app.core.engines.kv_pool import served_split
from app.core.fastpath.compile_notice import COMPILE_NOTICE
from app.core.settings import DEFAULT_PARALLEL
from app.ui.theme import Palette


def format_bytes(value: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= size:
            return f"{value / size:.1f} {unit}" if value / size < 100 else f"{value / size:.0f} {unit}"
    return f"{int(value)} B"


def format_tokens(value: float) -> str:
    return f"{int(value):,} tok"


@dataclass(frozen=True)
class Segment:
    label: str
    value: float
    colour: str


class StackedBar(QWidget):
    """A horizontal bar split into segments, with a legend; tooltips give each segment's numbers."""

    BAR_HEIGHT = 14

    def __init__(self, title: str, formatter: Callable[[float], str], palette: Palette) -> None:
        super().__init__()
        self.title = title
        self.formatter = formatter
        self.palette_ = palette
        self.segments: list[Segment] = []
        self.total: float = 0.0
        self.caption = ""
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setMouseTracking(True)

    def sizeHint(self) -> QSize:
        line = QFontMetrics(self.font()).height()
        return QSize(240, line * 3 + self.BAR_HEIGHT + 16)

    def minimumSizeHint(self) -> QSize:
        return QSize(160, self.sizeHint().height())

    def set_segments(self, segments: list[Segment], total: float | None = None, caption: str = "") -> None:
        self.segments = segments
        self.total = total if total is not None else sum(s.value for s in segments)
        self.caption = caption
        self._fit_height()
        self.update()

    def _legend_lines(self, width: int) -> int:
        metrics = QFontMetrics(self.font())
        lines, x = 1, 0.0
        for segment in self.segments:
            item = 24 + metrics.horizontalAdvance(f"{segment.label} {self.formatter(segment.value)}")
            if x + item > width and x > 0:
                lines, x = lines + 1, 0.0
            x += item
        return lines

    def _fit_height(self) -> None:
        """Title line, bar, and as many legend lines as the width needs (never changed while painting)."""
        line = QFontMetrics(self.font()).height()
        needed = line + 4 + self.BAR_HEIGHT + 6 + self._legend_lines(self.width()) * line + 4
        if needed != self.height():
            self.setFixedHeight(needed)

    def resizeEvent(self, event: Any) -> None:
        super().resizeEvent(event)
        self._fit_height()

    def _bar_rect(self) -> QRectF:
        line = QFontMetrics(self.font()).height()
        return QRectF(0.5, line + 4.5, self.width() - 1.0, self.BAR_HEIGHT)

    def _segment_rects(self) -> list[tuple[Segment, QRectF]]:
        bar = self._bar_rect()
        if self.total <= 0:
            return []
        rects: list[tuple[Segment, QRectF]] = []
        x = bar.left()
        for segment in self.segments:
            width = bar.width() * max(segment.value, 0.0) / self.total
            rects.append((segment, QRectF(x, bar.top(), width, bar.height())))
            x += width
        return rects

    def paintEvent(self, event: Any) -> None:
        p = self.palette_
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        metrics = QFontMetrics(self.font())
        line = metrics.height()
        painter.setPen(QColor(p.text))
        painter.drawText(QRectF(0, 0, self.width(), line), Qt.AlignmentFlag.AlignLeft, self.title)
        painter.setPen(QColor(p.muted))
        painter.drawText(QRectF(0, 0, self.width(), line), Qt.AlignmentFlag.AlignRight, self.caption)

        bar = self._bar_rect()
        clip = QPainterPath()
        clip.addRoundedRect(bar, 5, 5)
        painter.setClipPath(clip)
        painter.fillRect(bar, QColor(p.free))
        for segment, rect in self._segment_rects():
            painter.fillRect(rect, QColor(segment.colour))
        painter.setClipping(False)

        # Legend: coloured dot + label, wrapping to a second line if needed.
        x, y = 0.0, bar.bottom() + 6
        for segment in self.segments:
            text = f"{segment.label} {self.formatter(segment.value)}"
            width = 12 + metrics.horizontalAdvance(text) + 12
            if x + width > self.width() and x > 0:
                x, y = 0.0, y + line
            painter.setPen(QColor(p.muted) if segment.colour == p.free else Qt.PenStyle.NoPen)
            painter.setBrush(QColor(segment.colour))
            painter.drawEllipse(QRectF(x + 0.5, y + line / 2 - 4, 8, 8))
            painter.setPen(QColor(p.muted))
            painter.drawText(QRectF(x + 12, y, width, line), Qt.AlignmentFlag.AlignLeft, text)
            x += width
        painter.end()

    def segment_at(self, point: QPoint) -> Segment | None:
        for segment, rect in self._segment_rects():
            if rect.adjusted(0, -4, 0, 4).contains(point.toPointF()):
                return segment
        return None

    def tooltip_for(self, segment: Segment) -> str:
        share = 100.0 * segment.value / self.total if self.total else 0.0
        return f"{segment.label}: {self.formatter(segment.value)} ({share:.1f}% of {self.formatter(self.total)})"

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ToolTip and isinstance(event, QHelpEvent):
            segment = self.segment_at(event.pos())
            if segment is not None:
                QToolTip.showText(event.globalPos(), self.tooltip_for(segment), self)
            else:
                QToolTip.hideText()
                event.ignore()
            return True
        return super().event(event)


PLAN_PENDING = "Checking whether the chosen model fits…"
TEMPLATE_TOOLTIP = "The chat template's own tokens (role markers, separators): there are no earlier turns yet."
HISTORY_TOOLTIP = "Earlier turns of this conversation, with the chat template's own tokens."


class MemoryPanel(QWidget):
    summary_changed = Signal(str)  # the one line the collapsed panel shows (app/ui/window_panels.py)

    def __init__(self, palette: Palette, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.palette_ = palette
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(16, 14, 16, 14)
        self._layout.setSpacing(8)

        self.header_row = QHBoxLayout()  # the title, and the window's collapse button (app/ui/window_panels.py)
        self.header_row.addWidget(self._title("MEMORY"))
        self.header_row.addStretch(1)
        self._layout.addLayout(self.header_row)
        self._bars_box = QVBoxLayout()
        self._bars_box.setSpacing(10)
        self._layout.addLayout(self._bars_box)
        self.device_bars: dict[str, StackedBar] = {}
        self.no_model = QLabel("No model loaded.")
        self.no_model.setObjectName("Muted")
        self._bars_box.addWidget(self.no_model)
        # A remote engine's memory is the server's: its own words (e.g. vLLM's KV-cache use), no local bars.
        self.remote_label = QLabel()
        self.remote_label.setObjectName("Muted")
        self.remote_label.setWordWrap(True)
        self.remote_label.hide()
        self._bars_box.addWidget(self.remote_label)
        self.forecast_label = QLabel()
        self.forecast_label.setObjectName("Muted")
        self.forecast_label.setWordWrap(True)
        self._layout.addWidget(self.forecast_label)

        self._layout.addSpacing(8)
        self._layout.addWidget(self._title("CONTEXT"))
        self.context_bar = StackedBar("Tokens", format_tokens, palette)
        self._layout.addWidget(self.context_bar)

        # The prompt cache on disk (prompts' KV blocks: a document is prefilled once), with a way to clear it.
        self.prompt_cache_row = QWidget()
        row = QHBoxLayout(self.prompt_cache_row)
        row.setContentsMargins(0, 0, 0, 0)
        self.prompt_cache_label = QLabel()
        self.prompt_cache_label.setObjectName("Muted")
        self.prompt_cache_label.setToolTip(
            "Prompts' KV cache kept on disk, so a document or a long chat is not prefilled again after a restart "
            "(Settings: prompt cache size; `hearth cache`)."
        )
        self.clear_prompt_cache = QPushButton("Clear")
        self.clear_prompt_cache.setToolTip("Remove the saved prompt blocks (they are rebuilt as you chat)")
        self.clear_prompt_cache.clicked.connect(self._clear_prompt_cache)
        row.addWidget(self.prompt_cache_label, 1)
        row.addWidget(self.clear_prompt_cache)
        self.prompt_cache_row.hide()
        self._layout.addWidget(self.prompt_cache_row)

        self._layout.addSpacing(8)
        self._layout.addWidget(self._title("BEFORE LOADING"))
        self.plan_label = QLabel(PLAN_PENDING)  # a model is always chosen (the built-in one at least)
        self.plan_label.setObjectName("Muted")
        self.plan_label.setWordWrap(True)
        self._layout.addWidget(self.plan_label)
        self._layout.addStretch(1)
        self.reading: MemoryReading | None = None
        self.usage: ContextUsage | None = None
        self.earlier_turns: int | None = None
        self.estimate = False
        self.plan_summary = ""
        self.plan: Any = None  # the last plan shown, redrawn when the served replies asked for change
        self.plan_pending = True  # the plan label says "Checking…": no verdict or message since the last request
        self.pending_stage = ""  # what the pending plan waits on, when that is slow (the kernel's first compile)
        self.served_replies = DEFAULT_PARALLEL  # the Server tab's "Replies at once" (app/ui/window_panels.py)
        self.set_context(None)

    def _clear_prompt_cache(self) -> None:
        from app.core.engines.lite.backend import clear_prompt_cache  # files only: quick, and no model library

        blocks, size = clear_prompt_cache()
        self.prompt_cache_label.setText(f"Prompt cache cleared ({blocks:,} blocks, {format_bytes(size)})")
        self.clear_prompt_cache.setEnabled(False)

    def _title(self, text: str) -> QLabel:
        label = QLabel(text)
        label.setObjectName("SectionTitle")
        return label

    def set_palette(self, palette: Palette) -> None:
        self.palette_ = palette
        for bar in [*self.device_bars.values(), self.context_bar]:
            bar.palette_ = palette
        if self.reading is not None:
            self.set_memory(self.reading)
        self.set_context(self.usage, earlier_turns=self.earlier_turns, estimate=self.estimate)

    def set_memory(self, reading: MemoryReading | None) -> None:
        self.reading = reading
        p = self.palette_
        remote = reading.remote if reading is not None else ""
        self.remote_label.setText(remote)
        self.remote_label.setVisible(bool(remote))
        devices = reading.devices if reading is not None and not remote else ()
        wanted = [d.device for d in devices]
        if list(self.device_bars) != wanted:
            for bar in self.device_bars.values():
                self._bars_box.removeWidget(bar)
                bar.deleteLater()
            self.device_bars = {}
            for name in wanted:
                bar = StackedBar(name.upper() if name == "cpu" else name, format_bytes, p)
                self.device_bars[name] = bar
                self._bars_box.addWidget(bar)
        self.no_model.setVisible(not devices and not remote)
        for device in devices:
            self.device_bars[device.device].set_segments(
                [
                    Segment("Weights", device.weights_bytes, p.weights),
                    Segment("KV cache", device.kv_bytes, p.kv),
                    Segment("Overhead", device.overhead_bytes, p.overhead),
                    Segment("Free", device.free_bytes, p.free),
                ],
                caption=f"{format_bytes(device.used_bytes)} used",
            )
        cached = reading.prompt_cache_bytes if reading is not None else None
        self.prompt_cache_row.setVisible(cached is not None)
        if cached is not None:
            self.prompt_cache_label.setText(f"Prompt cache on disk: {format_bytes(cached)}")
            self.clear_prompt_cache.setEnabled(cached > 0)
        if reading is not None and reading.forecast_kv_full_at_tokens:
            per_token = f" ({format_bytes(reading.kv_bytes_per_token)} per token)" if reading.kv_bytes_per_token else ""
            self.forecast_label.setText(
                f"KV cache fills memory at {reading.forecast_kv_full_at_tokens:,} tokens{per_token}."
            )
        else:
            self.forecast_label.setText("")
        self.forecast_label.setVisible(bool(self.forecast_label.text()))
        self._summary_changed()

    def set_context(
        self, usage: ContextUsage | None, *, earlier_turns: int | None = None, estimate: bool = False
    ) -> None:
        """`earlier_turns`: turns before the newest message (None: not known). With none, what the engine counts as
        history is the chat template's own tokens, and is labelled so. `estimate`: counted by the window (a
        conversation reopened before its next reply), not by the engine: the caption says "about"."""
        self.usage, self.earlier_turns, self.estimate = usage, earlier_turns, estimate
        p = self.palette_
        if usage is None:
            self.context_bar.set_segments([], total=1, caption="")
            self.context_bar.setToolTip("")
            self._summary_changed()
            return
        template_only = earlier_turns == 0
        self.context_bar.set_segments(
            [
                Segment("System", usage.system, p.system),
                Segment("Chat template" if template_only else "History", usage.history, p.history),
                Segment("Prompt", usage.current, p.current),
                Segment("Reply", usage.reply, p.reply),
            ],
            total=max(usage.window, usage.used, 1),
            caption=("about " if estimate else "") + context_caption(usage),
        )
        self.context_bar.setToolTip(TEMPLATE_TOOLTIP if template_only else HISTORY_TOOLTIP)
        self._summary_changed()

    def set_plan(self, plan: Any) -> None:
        """The planner's MemoryPlan (fits yes/offload/no, total bytes, free bytes, largest context)."""
        fits = str(getattr(plan, "fits", "?"))
        verdict = {"yes": "Fits in memory", "offload": "Fits with part offloaded to the CPU", "no": "Does not fit"}
        lines = [f"<b>{verdict.get(fits, fits)}</b>"]
        total = getattr(plan, "total_bytes", None)
        free = getattr(plan, "free_bytes", None)
        if total is not None and free is not None:
            lines.append(f"needs {format_bytes(total)} of {format_bytes(free)} free")
        weights = getattr(plan, "weights_bytes", None)
        if weights is not None:
            lines.append(f"weights {format_bytes(weights)}")
        max_context = getattr(plan, "max_context", None)
        if max_context:
            lines.append(f"largest context that fits: {int(max_context):,} tokens")
        lines.append(served_line(plan, self.served_replies))
        self.plan, self.plan_pending = plan, False
        self.plan_label.setText("<br>".join(lines))
        self.plan_summary = verdict.get(fits, "")
        self._summary_changed()

    def set_served_replies(self, replies: int) -> None:
        """How many replies at once the server is asked for: the plan's served line follows it."""
        self.served_replies = replies
        if self.plan is not None:
            self.set_plan(self.plan)

    def set_plan_message(self, text: str) -> None:
        self.plan, self.plan_pending = None, False
        self.plan_label.setText(text)
        self.plan_summary = ""
        self._summary_changed()

    def set_plan_pending(self, stage: str = "") -> None:
        """Planning has started; `stage` says what it waits on when that is slow. A stage said while the last
        request was pending stays: a new request waits on the same compile."""
        self._show_pending(stage or (self.pending_stage if self.plan_pending else ""))

    def load_stage(self, stage: str) -> None:
        """A stage of a model load. A pending plan is queued behind that load on the worker, so the kernel's first
        compile, which the load runs, is what the plan waits on too: said here until the load's next stage."""
        if self.plan_pending:
            self._show_pending(stage if stage == COMPILE_NOTICE else "")

    def _show_pending(self, stage: str) -> None:
        self.plan, self.plan_pending, self.pending_stage = None, True, stage
        self.plan_label.setText(f"{PLAN_PENDING} {stage}" if stage else PLAN_PENDING)
        self.plan_summary = "Memory: checking the fit…"
        self._summary_changed()

    # -- the one-line summary -------------------------------------------------------------------------------
    def summary(self) -> str:
        """What the panel says, in one line: memory in use (or the verdict before loading), and the context."""
        reading = self.reading
        parts: list[str] = []
        if reading is not None and reading.remote:
            parts.append("Memory: on the server")
        elif reading is not None and reading.devices:
            used = ", ".join(
                f"{d.device.upper() if d.device == 'cpu' else d.device} {format_bytes(d.used_bytes)}"
                for d in reading.devices
            )
            parts.append(f"Memory {used}")
        elif self.plan_summary:
            parts.append(self.plan_summary)
        else:
            parts.append("Memory")
        if self.usage is not None:
            parts.append(f"context {context_caption(self.usage)}")
        return " · ".join(parts)

    def _summary_changed(self) -> None:
        self.summary_changed.emit(self.summary())


def served_line(plan: Any, asked: int) -> str:
    """What serving this model would take, before it loads: one request at a time where its runtime has no batched
    step, else how many of the `asked` replies run together and how long each may be within the KV memory they may
    reserve (the Server tab says the same after loading)."""
    most = int(getattr(plan, "served_together", 1) or 1)
    if most <= 1:
        return "served: one request at a time"
    budget = int(getattr(plan, "served_kv_budget_bytes", 0))
    per_token, window = int(getattr(plan, "kv_bytes_per_token", 0)), int(getattr(plan, "context", 0)) or 1
    together, each = served_split(most, asked, budget, per_token, window)
    replies = "one reply at a time" if together == 1 else f"{together} replies at once"
    if each is None:
        return f"served: {replies}"
    length = "up to" if together == 1 else "each up to"
    return f"served: {replies}, {length} {each:,} tokens (KV at most {format_bytes(budget)})"


def context_caption(usage: ContextUsage) -> str:
    # a remote server does not say its window (unless the model bar's context length names one)
    return f"{usage.used:,} / {usage.window:,}" if usage.window else f"{usage.used:,} (window unknown)"
