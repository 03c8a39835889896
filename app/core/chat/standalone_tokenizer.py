"""A model's tokenizer as Hearth uses it, served by the `tokenizers` library alone (no transformers import).

transformers' TokenizersBackend wraps a `tokenizers.Tokenizer` and, when it is built, adjusts it: special tokens
added, the BOS/EOS post-processor set, truncation and padding off (and a regex fix for some large vocabularies). A
GGUF's first load builds that object once (app.core.models.gguf_tokenizer) and keeps the adjusted tokenizer's JSON
and the settings it resolved (`settings_of`); later loads rebuild this class from those two, skipping transformers'
import (~0.45 s). It answers what the engines ask of a tokenizer (encoding with and without special tokens, with
special tokens split as text, decoding, the chat template, special and added tokens, the vocabulary) as
TokenizersBackend does; the tests hold the two equal on the default model and on tiny GGUFs of each tokenizer kind.
"""

from __future__ import annotations

import threading
from typing import Any

from app.core.chat.chat_template import render_chat

SETTINGS_FORMAT = 1
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


def settings_of(tokenizer: Any) -> dict[str, Any]:
    """What a transformers TokenizersBackend resolved when it was built, beyond its backend's JSON."""
    return {
        "format": SETTINGS_FORMAT,
        "special_tokens": {name: getattr(tokenizer, name) for name in SPECIAL_TOKEN_NAMES},
        "all_special_tokens": list(tokenizer.all_special_tokens),
        "add_bos_token": bool(tokenizer.add_bos_token),
        "add_eos_token": bool(tokenizer.add_eos_token),
        "chat_template": tokenizer.chat_template,
        "clean_up_tokenization_spaces": bool(tokenizer.clean_up_tokenization_spaces),
    }


def settings_problem(settings: Any) -> str:
    """Why `settings` (read from a file) cannot make a tokenizer, or "" when it can."""
    if not isinstance(settings, dict) or settings.get("format") != SETTINGS_FORMAT:
        return f"not tokenizer settings of format {SETTINGS_FORMAT}"
    special = settings.get("special_tokens")
    if not isinstance(special, dict) or set(special) != set(SPECIAL_TOKEN_NAMES):
        return "its special tokens are not the four named ones"
    if not all(value is None or isinstance(value, str) for value in special.values()):
        return "a special token is not a string"
    tokens = settings.get("all_special_tokens")
    if not isinstance(tokens, list) or not all(isinstance(token, str) for token in tokens):
        return "its list of special tokens is not a list of strings"
    for flag in ("add_bos_token", "add_eos_token", "clean_up_tokenization_spaces"):
        if not isinstance(settings.get(flag), bool):
            return f"{flag} is not true or false"
    template = settings.get("chat_template")
    named = isinstance(template, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in template.items())
    if not (template is None or isinstance(template, str) or named):
        return "its chat template is not text"
    return ""


def _clean_up_spaces(text: str) -> str:
    """transformers' clean_up_tokenization (WordPiece-era: " ." -> "." and the like)."""
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't")):
        text = text.replace(before, after)
    for before, after in ((" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(before, after)
    return text


class StandaloneTokenizer:
    """A `tokenizers.Tokenizer` already adjusted by transformers, with the settings it resolved (settings_of)."""

    def __init__(self, backend: Any, settings: dict[str, Any], name_or_path: str = "") -> None:
        problem = settings_problem(settings)
        if problem:
            raise ValueError(f"tokenizer settings: {problem}")
        backend.no_truncation()  # as transformers encodes: never cut a prompt, never pad it
        backend.no_padding()
        self._tokenizer = backend
        self._encoding = threading.Lock()
        self.name_or_path = name_or_path
        self.chat_template: str | dict[str, str] | None = settings["chat_template"]
        special: dict[str, str | None] = settings["special_tokens"]
        self.bos_token, self.eos_token = special["bos_token"], special["eos_token"]
        self.unk_token, self.pad_token = special["unk_token"], special["pad_token"]
        self.special_tokens_map = {name: value for name, value in special.items() if value is not None}
        self.all_special_tokens: list[str] = list(settings["all_special_tokens"])
        self.add_bos_token: bool = settings["add_bos_token"]
        self.add_eos_token: bool = settings["add_eos_token"]
        self.clean_up_tokenization_spaces: bool = settings["clean_up_tokenization_spaces"]

    # -- the backend and its vocabulary
    @property
    def backend_tokenizer(self) -> Any:
        return self._tokenizer

    def __len__(self) -> int:
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    def get_vocab(self) -> dict[str, int]:
        return dict(self._tokenizer.get_vocab(with_added_tokens=True))

    @property
    def added_tokens_decoder(self) -> dict[int, Any]:
        return dict(sorted(self._tokenizer.get_added_tokens_decoder().items()))

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> int | list[int | None] | None:
        if isinstance(tokens, str):
            return self._token_id(tokens)
        return [self._token_id(token) for token in tokens]

    def convert_ids_to_tokens(self, ids: int | list[int]) -> str | list[str | None] | None:
        if isinstance(ids, int):
            return self._tokenizer.id_to_token(ids)
        return [self._tokenizer.id_to_token(int(index)) for index in ids]

    def _token_id(self, token: str | None) -> int | None:
        if token is None:
            return None
        found = self._tokenizer.token_to_id(token)
        if found is not None:
            return int(found)
        return self._token_id(self.unk_token) if token != self.unk_token else None  # as transformers: unk's id

    @property
    def bos_token_id(self) -> int | None:
        return self._token_id(self.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        return self._token_id(self.eos_token)

    @property
    def unk_token_id(self) -> int | None:
        return self._token_id(self.unk_token)

    @property
    def pad_token_id(self) -> int | None:
        return self._token_id(self.pad_token)

    # -- text to ids and back
    def encode(self, text: str, add_special_tokens: bool = True, split_special_tokens: bool = False) -> list[int]:
        """`text`'s ids; `split_special_tokens`: a special token's text is encoded as text, not as the token."""
        with self._encoding:  # the switch is the backend's: another thread's encode must not see this one's
            if self._tokenizer.encode_special_tokens != split_special_tokens:
                self._tokenizer.encode_special_tokens = split_special_tokens
            return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def __call__(
        self, text: str, add_special_tokens: bool = True, split_special_tokens: bool = False
    ) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text, add_special_tokens, split_special_tokens)}

    def decode(
        self, ids: int | list[int], skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool | None = None
    ) -> str:
        text = str(self._tokenizer.decode([ids] if isinstance(ids, int) else list(ids), skip_special_tokens))
        clean = (
            self.clean_up_tokenization_spaces if clean_up_tokenization_spaces is None else clean_up_tokenization_spaces
        )
        # as transformers: the clean-up is WordPiece's, and would take real spaces out of a BPE tokenizer's text
        if clean and type(self._tokenizer.model).__name__ != "BPE":
            text = _clean_up_spaces(text)
        return text

    # -- the chat template
    def apply_chat_template(
        self,
        conversation: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        tokenize: bool = True,
        **variables: Any,
    ) -> str | list[int]:
        """transformers' apply_chat_template for one conversation of message dicts (ids unless tokenize=False)."""
        text = render_chat(
            self._template(tools),
            conversation,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            **{**self.special_tokens_map, **variables},
        )
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def _template(self, tools: list[dict[str, Any]] | None) -> str:
        template = self.chat_template
        if isinstance(template, dict):  # several templates by name: as transformers picks one
            if tools is not None and "tool_use" in template:
                return template["tool_use"]
            if "default" in template:
                return template["default"]
            raise ValueError(
                "This model has multiple chat templates with no default specified! Available template names are "
                f"{sorted(template)}."
            )
        if template is None:
            raise ValueError("Cannot use chat template functions because tokenizer.chat_template is not set.")
        return template
