"""What a conversation costs, in the window (the line under a reply words its cost with app.core.stats_text).

Prices come from app.core.engines.remote.pricing (genai-prices' bundled list, never fetched) and are estimates; every
text here says so. The conversation's total is summed from the history (every reply on every branch), so it is
the same after a restart or a model switch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QWidget

from app.core.engines.remote.pricing import conversation_costs


def conversation_cost_text(replies: Iterable[Mapping[str, Any]]) -> str:
    """One line for the conversation header: what its hosted replies cost, the part spent re-sending the history,
    what prompt caching saved, and what its local replies would have cost on the compared model."""
    spent, compared = conversation_costs(replies)
    parts: list[str] = []
    if spent.replies:
        line = f"This conversation cost ~${spent.total_usd:.4f} (estimate, {spent.replies} priced repl"
        line += "y)" if spent.replies == 1 else "ies)"
        extras = [f"re-sent history ${spent.history_usd:.4f}"]
        if spent.cache_saved_usd:
            extras.append(f"prompt caching saved ${spent.cache_saved_usd:.4f}")
        parts.append(f"{line}: {', '.join(extras)}")
    if compared.replies:
        plural = "y" if compared.replies == 1 else "ies"
        parts.append(
            f"its {compared.replies} local repl{plural} would have cost ~${compared.total_usd:.4f} hosted (estimate)"
        )
    return " · ".join(parts)


class ConversationCostLabel(QLabel):
    """The conversation's cost above the chat; hidden while nothing in it was priced."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Muted")
        self.setWordWrap(True)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.setToolTip("Estimated from the genai-prices price list bundled with Hearth; prices change.")
        self.hide()

    def show_replies(self, replies: Iterable[Mapping[str, Any]]) -> None:
        text = conversation_cost_text(replies)
        self.setText(text)
        self.setVisible(bool(text))
