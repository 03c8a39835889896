"""The command line and the window's worker load through one LoadRequest: every saved load option reaches it."""

from __future__ import annotations

import dataclasses

from app.cli import build_parser
from app.cli.chat import load_request
from app.cli.common import settings_from_args
from app.core.engines.backend import LoadRequest
from app.core.settings import Settings, save_settings


def test_every_load_option_but_the_per_load_choices_is_a_setting() -> None:
    options = {item.name for item in dataclasses.fields(LoadRequest)}
    saved = {item.name for item in dataclasses.fields(Settings)}
    # per load: the planner override, and a remote engine's model (the model bar's pick; `chat --engine` on the CLI)
    assert options - saved == {"ignore_fit", "remote"}
    settings = Settings(
        model="/models/x",
        quantization="int8",
        device="cpu",
        context_length=64,
        allow_pickle=True,
        trust_remote_code=True,
        response_cache=False,
    )
    request = LoadRequest.from_settings(settings, ignore_fit=True)
    assert request == LoadRequest("/models/x", "int8", "cpu", 64, True, True, ignore_fit=True, response_cache=False)


def test_chat_flags_and_saved_settings_make_the_request() -> None:
    save_settings(Settings(trust_remote_code=True, quantization="int8"))
    args = build_parser().parse_args(
        ["chat", "hi", "--quant", "fp32", "--device", "cpu", "--allow-pickle", "--ignore-fit", "--no-response-cache"]
    )
    request = load_request(settings_from_args(args), args)
    assert request == LoadRequest(
        None, "fp32", "cpu", None, allow_pickle=True, trust_remote_code=True, ignore_fit=True, response_cache=False
    )
    plain = build_parser().parse_args(["chat", "hi"])
    assert load_request(settings_from_args(plain), plain) == LoadRequest(None, "int8", trust_remote_code=True)
    no_lookup = build_parser().parse_args(["chat", "hi", "--no-lookup"])
    assert not load_request(settings_from_args(no_lookup), no_lookup).prompt_lookup
    save_settings(Settings(prompt_lookup=False))
    assert not load_request(settings_from_args(plain), plain).prompt_lookup  # the flag never switches it back on
