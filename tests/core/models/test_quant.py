"""The quantization names, what `auto` resolves to per device, and every place that states them agreeing."""

from __future__ import annotations

import argparse
import typing

import pytest

from app.cli import build_parser
from app.core.errors import QuantizationError
from app.core.models.quant import (
    PRECISIONS,
    QUANTIZATIONS,
    auto_summary,
    parse_quantization,
    quantization_kwargs,
    resolve_quantization,
)
from app.core.settings import Settings


def test_auto_resolves_per_device_and_the_summary_says_the_same() -> None:
    assert resolve_quantization("auto", "cpu") == "q4"
    assert resolve_quantization("auto", "cuda:0") == "nf4"
    assert resolve_quantization("auto", "mps") == "fp16"
    assert auto_summary() == "q4 on the CPU, nf4 on a CUDA GPU, fp16 on Apple MPS"


def test_every_precision_resolves_to_itself_and_has_load_kwargs() -> None:
    for name in PRECISIONS:
        assert resolve_quantization(name, "cpu") == name
        assert "dtype" in quantization_kwargs(name, "cpu")
    with pytest.raises(QuantizationError, match="q4 holds the weights for the CPU's fused decode step; on cuda:0"):
        resolve_quantization("q4", "cuda:0")
    assert set(QUANTIZATIONS) == {"auto", *PRECISIONS}


def test_unknown_names_and_bitsandbytes_on_mps_are_refused_with_the_choices() -> None:
    with pytest.raises(QuantizationError, match=r"Unknown quantization 'q5': use auto, nf4, .* or fp32"):
        parse_quantization("q5")
    with pytest.raises(QuantizationError, match="Unknown quantization"):
        resolve_quantization("q5", "cpu")
    with pytest.raises(QuantizationError, match="not supported on Apple MPS"):
        resolve_quantization("nf4", "mps")


def test_settings_and_the_command_line_offer_exactly_these_names() -> None:
    settings_type = typing.get_type_hints(Settings, include_extras=True)["quantization"]
    assert typing.get_args(typing.get_args(settings_type)[0]) == QUANTIZATIONS
    parser = build_parser()
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name in ("chat", "plan", "models"):
        quant = next(a for a in subcommands.choices[name]._actions if "--quant" in a.option_strings)
        assert tuple(quant.choices or ()) == QUANTIZATIONS
        assert f"auto = {auto_summary()}" in (quant.help or "")
