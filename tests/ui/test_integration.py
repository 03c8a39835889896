"""Where the features meet in the main window: document token counts, the model library, the Hub token box."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from app.core.engines.backend import ModelInfo
from app.core.settings import Settings
from app.ui.settings_dialog import SettingsDialog


def test_attachment_chips_count_tokens_with_the_loaded_models_tokenizer(
    make_window, qtbot, tmp_path: Path, default_tokenizer_folder: Path
) -> None:
    window = make_window()
    qtbot.waitUntil(lambda: window.attachments is not None, timeout=5000)
    tokenizer_file = default_tokenizer_folder / "tokenizer.json"
    window._on_model_loaded(ModelInfo("SmolLM2", "bf16", "cpu", 2048, tokenizer_file=str(tokenizer_file)))
    text = "The launch code is 4321. " * 20
    notes = tmp_path / "notes.txt"
    notes.write_text(text, encoding="utf-8")
    window.attachments.add_paths([notes])
    qtbot.waitUntil(lambda: not window.attachments.busy and window.attachments.token_counts() != [None], timeout=10_000)
    # The chip counts what the document adds to the prompt, by the model's own tokenizer (transformers', not the
    # counter under test): the user message with the document block ahead of a question, less the question alone.
    tokenizer = AutoTokenizer.from_pretrained(default_tokenizer_folder)

    def tokens(message: str) -> int:
        return len(tokenizer.encode(message, add_special_tokens=False))

    question = "What is the launch code?"
    block = f'<document name="notes.txt" type="text/plain">\n{text}\n</document>'
    expected = tokens(f"{block}\n\n{question}") - tokens(question)
    assert window.attachments.token_counts() == [expected] and expected > tokens(text) > 100
    assert window.attachments._remaining == 2048


def test_attachment_size_limit_comes_from_settings(make_window, qtbot) -> None:
    window = make_window(settings=Settings(attachment_limit_mb=3))
    qtbot.waitUntil(lambda: window.attachments is not None, timeout=5000)
    assert window.attachments.max_bytes == 3 * 2**20
    window.settings_store.update(attachment_limit_mb=5)  # the bar follows the settings store's change signal
    assert window.attachments.max_bytes == 5 * 2**20


def test_settings_dialog_edits_the_attachment_limit_and_holds_the_hub_token_box(qtbot) -> None:
    dialog = SettingsDialog(Settings())
    qtbot.addWidget(dialog)
    dialog.attachment_limit.setValue(7)
    assert dialog.build().attachment_limit_mb == 7
    assert dialog.prompt_lookup.isChecked()
    dialog.prompt_lookup.setChecked(False)
    assert dialog.build().prompt_lookup is False
    assert dialog.hub_token.title() == "Hugging Face token"
    assert "token" not in Settings().to_dict()  # secrets never live in the settings file


def test_models_menu_opens_the_library_and_a_chosen_model_becomes_the_default(
    make_window, qtbot, tmp_path: Path
) -> None:
    window = make_window()
    window.menus.library.trigger()
    library = window.library_window
    assert library is not None and library.isVisible()
    qtbot.addWidget(library)
    window.menus.library.trigger()
    assert window.library_window is library  # one window, raised again
    library.model_chosen.emit(str(tmp_path))
    assert window.settings.model == str(tmp_path)
    assert window.model_bar.request().model == str(tmp_path)
    library.wait_for_workers()  # its listing and verdicts run on a task runner: let them report
    library.close()
