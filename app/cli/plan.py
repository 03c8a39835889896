"""`hearth plan`: will a model fit? Weights, KV cache, overhead and the largest context, before any download or load."""

from __future__ import annotations

import argparse
import json

from app.cli import Subparsers
from app.cli.common import quant_help
from app.core.errors import InvalidSettingError
from app.core.memory.types import MemoryPlan, format_bytes, parse_size
from app.core.models.quant import QUANTIZATIONS
from app.core.settings import DEVICES, MAX_PARALLEL

VERDICTS = {"yes": "fits", "offload": "fits only with CPU offload", "no": "does not fit"}


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "plan", help="estimate a model's memory (weights, KV cache, overhead) and whether it fits"
    )
    parser.add_argument(
        "model",
        nargs="?",
        help="folder (even one with only config.json), .gguf file or cached Hub repo id (default: the embedded model)",
    )
    parser.add_argument("--quant", choices=QUANTIZATIONS, default="auto", help=quant_help("auto"))
    parser.add_argument("--context", type=int, metavar="TOKENS", help="context length (default: the model's maximum)")
    parser.add_argument("--device", choices=DEVICES, default="auto", help="device to plan for (default: auto)")
    parser.add_argument(
        "--free", metavar="SIZE", help="free memory on the device, e.g. 24GiB, 8G, 512MiB (default: measured now)"
    )
    parser.add_argument(
        "--cpu-free", metavar="SIZE", help="RAM available for CPU offload on CUDA (default: measured now)"
    )
    parser.add_argument(
        "--parallel", type=int, default=1, metavar="N",
        help=f"plan N served replies decoded together, each with its own KV cache (1-{MAX_PARALLEL}; default 1)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print one JSON object (fields in the README)")
    parser.set_defaults(handler=run)


def _size(flag: str, text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return parse_size(text)
    except ValueError as exc:
        raise InvalidSettingError(f"{flag}: {exc}") from exc


def run(args: argparse.Namespace) -> int:
    free = _size("--free", args.free)
    cpu_free = _size("--cpu-free", args.cpu_free)
    if args.context is not None and args.context < 1:
        raise InvalidSettingError(f"--context must be at least 1 token (got {args.context}).")
    if not 1 <= args.parallel <= MAX_PARALLEL:
        raise InvalidSettingError(f"--parallel must be between 1 and {MAX_PARALLEL} (got {args.parallel}).")
    from app.core.engines.backend import LoadRequest
    from app.core.engines.opening import plan_load

    request = LoadRequest(args.model, quantization=args.quant, device=args.device, context_length=args.context)
    plan = plan_load(request, free, cpu_free, args.parallel)
    if args.json:
        print(json.dumps(plan.to_json_dict()))
    else:
        print(format_plan(plan))
    return 0


def format_plan(plan: MemoryPlan) -> str:
    rows: list[tuple[str, str]] = [
        ("parameters", f"{plan.parameters / 1e6:,.1f} M ({plan.quantized_parameters / 1e6:,.1f} M quantized)"),
    ]
    for device, size in plan.weights_by_device.items():
        rows.append((f"weights on {device}", format_bytes(size)))
    sliding = f", {plan.kv_sliding_layers} capped by a sliding window" if plan.kv_sliding_layers else ""
    replies = f" for {plan.replies} replies" if plan.replies > 1 else ""
    each = " each" if plan.replies > 1 else ""
    rows.append(
        (
            "KV cache",
            f"{format_bytes(plan.kv_bytes)}{replies} at {plan.context:,} tokens{each} "
            f"({format_bytes(plan.kv_bytes_per_token)}/token, {plan.kv_dtype}, {plan.kv_layers} layers{sliding})",
        )
    )
    rows.append(("overhead", format_bytes(plan.overhead_bytes)))
    for name, size in plan.overhead.items():
        rows.append((f"  {name.replace('_', ' ')}", format_bytes(size)))
    rows.append((f"total on {plan.device}", format_bytes(plan.total_bytes)))
    rows.append((f"free on {plan.device}", f"{format_bytes(plan.free_bytes)} ({plan.free_source})"))
    rows.append(("free after", format_bytes(plan.free_after_bytes)))
    rows.append(("verdict", VERDICTS[plan.fits]))
    cap = " (the model's maximum)" if plan.max_context == plan.model_max_context else ""
    rows.append(("largest context", f"{plan.max_context:,} tokens{' per reply' if plan.replies > 1 else ''}{cap}"))
    width = max(len(label) for label, _ in rows)
    lines = [f"{plan.model} · {plan.quantization} · {plan.device} · {plan.context:,} tokens of context"]
    lines += [f"  {label:<{width}}  {value}" for label, value in rows]
    lines += [f"  note: {note}" for note in plan.notes]
    return "\n".join(lines)
