"""A screenshot of the main window mid-conversation (scripted backend, so it is deterministic).

Written to resources/screenshots/main-window.png when HEARTH_UPDATE_SCREENSHOT=1, else to a temp folder.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from app.core.engines.backend import ScriptedBackend
from app.core.settings import Settings
from app.ui import theme

REPO = Path(__file__).resolve().parents[2]

ANSWER_1 = """A **KV cache** stores the attention keys and values of tokens the model has already seen, so each new \
token only needs one forward pass over itself instead of the whole conversation.

Its size grows linearly with the context:

```python
def kv_cache_bytes(layers: int, kv_heads: int, head_dim: int, tokens: int, dtype_bytes: int = 2) -> int:
    # keys and values, for every layer and every token
    return 2 * layers * kv_heads * head_dim * tokens * dtype_bytes
```

For SmolLM2-135M that is about **23 KB per token** in bf16."""

ANSWER_2 = """Three things help, in order of effect:

1. Keep the conversation short: start a new chat for a new topic.
2. Use a model with *grouped-query attention* (fewer KV heads).
3. Lower the context length in the model bar, so the planner reserves less."""


@pytest.mark.parametrize(("theme_name", "file_name"), [("light", "main-window.png"), ("dark", "main-window-dark.png")])
def test_main_window_screenshot(make_window, qtbot, tmp_path: Path, theme_name: str, file_name: str) -> None:
    app = QApplication.instance()
    assert isinstance(app, QApplication)
    theme.apply(app, theme_name)
    backend = ScriptedBackend(
        replies=["Sure.", "Sure.", "Sure.", ANSWER_1, ANSWER_2],
        name="SmolLM2-135M-Instruct",
        tokens_per_s=600,
    )
    window = make_window(backend, settings=Settings(theme=theme_name))
    window.resize(1366, 736)  # a 1366x768 laptop screen less a title bar
    for title in ("Packing list for a week in Lisbon", "Regex for ISO dates", "Explain Rust lifetimes"):
        window.new_conversation()
        with qtbot.waitSignal(window.reply_finished, timeout=10_000):
            window.chat.send(title)
    window.new_conversation()
    for question in ("What is a KV cache, and how big does it get?", "How do I keep it small on a laptop?"):
        with qtbot.waitSignal(window.reply_finished, timeout=10_000):
            window.chat.send(question)
    window.sidebar.set_conversations(window.store.list_conversations(), window.conversation_id)
    window.input_box.editor.setPlainText("And what does quantization do to it?")
    window.input_box.editor.setFocus(Qt.FocusReason.OtherFocusReason)
    qtbot.wait(50)
    widgets = window.chat_view.widgets()
    assert len(widgets) == 4 and "first token" in widgets[-1].stats_label.text()
    assert window.memory_panel.reading is not None

    image = window.grab()
    target = (
        REPO / "resources" / "screenshots" / file_name
        if os.environ.get("HEARTH_UPDATE_SCREENSHOT") == "1"
        else tmp_path / file_name
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    assert image.save(str(target))
    assert target.stat().st_size > 20_000
    theme.apply(app, "light")
