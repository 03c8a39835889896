"""User-facing errors: each carries one clear sentence the UI and the command line show as is."""

from __future__ import annotations


class HearthError(Exception):
    """An error the user can act on. `str(err)` is the whole message; no traceback is shown."""


class ModelNotFoundError(HearthError):
    pass


class LoadCancelled(HearthError):
    def __init__(self) -> None:
        super().__init__("Loading was cancelled.")


class UnsafeModelError(HearthError):
    """Pickle weights or remote code, refused unless the user opts in."""


class CorruptModelError(HearthError):
    pass


class UnsupportedModelError(HearthError):
    pass


class DeviceUnavailableError(HearthError):
    pass


class QuantizationError(HearthError):
    pass


class ContextOverflowError(HearthError):
    """The prompt does not fit the context window; nothing was truncated."""

    def __init__(self, prompt_tokens: int, context_window: int, reserved_for_reply: int = 1) -> None:
        self.prompt_tokens = prompt_tokens
        self.context_window = context_window
        self.reserved_for_reply = reserved_for_reply
        super().__init__(
            f"The prompt is {prompt_tokens:,} tokens but the model's context window is "
            f"{context_window:,} tokens (at least {reserved_for_reply} must be left for the reply). "
            "Nothing was truncated: shorten the prompt, start a new conversation, or allow dropping "
            "the oldest turns (--context-policy drop-oldest)."
        )


class InvalidSettingError(HearthError):
    pass


class ModelTooLargeError(HearthError):
    """The memory planner says the model will not fit; carries the numbers."""

    def __init__(self, message: str, needed_bytes: int, free_bytes: int) -> None:
        self.needed_bytes = needed_bytes
        self.free_bytes = free_bytes
        super().__init__(message)
