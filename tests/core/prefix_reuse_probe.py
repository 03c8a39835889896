"""Run as a script in a fresh process (the CPU kernel switches are read once, at import): an edited turn that reuses
the KV prefix of the turn before it against a fresh run of the same prompt, on one model at one precision.

    python -m tests.core.prefix_reuse_probe MODEL_FOLDER QUANTIZATION[,QUANTIZATION...] [--before]

(an empty MODEL_FOLDER: the embedded default model). Prints one JSON line per precision, each engine on its default
decode path: whether the KV caches (every layer's keys and values, prompt and reply) and the greedy replies of the
two runs are identical bit for bit and how many tokens the edited turn reused; with --before, also the same
comparison under the reuse rule before issue 28 (the whole common prefix kept, the rest prefilled in a call of its
own), which shows whether this kernel variant rounds a row differently when fewer rows share its call.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch

from app.core.chat.sampling import SamplingParams
from app.core.engines.engine import Engine, KVState
from app.core.engines.generation import PREFILL_CHUNK
from app.core.engines.loader import load_model

GREEDY = SamplingParams(temperature=0, max_new_tokens=8)
# A system prompt longer than PREFILL_CHUNK tokens (about 650 with SmolLM2's tokenizer), for chat tests whose edits
# and regenerations should reuse a prefix: a first turn's prompt is prefilled in calls of PREFILL_CHUNK tokens, and
# only whole calls are reused.
LONG_SYSTEM_PROMPT = " ".join(f"Rule {i}: answer in one short sentence." for i in range(1, 60))


def prompt_ids(shared: int, question: int, length: int) -> list[int]:
    """A synthetic prompt of `length` ids: `shared` ids every question has, then ids that depend on `question`."""
    common = [(7 * i) % 4000 + 100 for i in range(shared)]
    return common + [(question * 31 + 13 * i) % 4000 + 100 for i in range(length - shared)]


# (first turn, edited turn) per case: a short prompt (its first prefill call is causal attention over itself alone)
# and one past PREFILL_CHUNK (the edit reuses the whole first call; both runs prefill the rest with the same call).
CASES = {
    "short": (prompt_ids(40, 2, 45), prompt_ids(40, 3, 80)),
    "long": (
        prompt_ids(PREFILL_CHUNK + 40, 2, PREFILL_CHUNK + 45),
        prompt_ids(PREFILL_CHUNK + 40, 3, PREFILL_CHUNK + 80),
    ),
}


def reply(engine: Engine, ids: list[int], kv: KVState) -> tuple[list[Any], int]:
    events = list(engine.generate_from_ids(ids, GREEDY, kv=kv, use_response_cache=False))
    stats = next(e.stats for e in events if type(e).__name__ == "StatsEvent")
    return [e.text for e in events if type(e).__name__ == "TokenEvent"], int(stats.cached_tokens)


def same_cache(a: KVState, b: KVState) -> bool:
    layers_a, layers_b = a.cache.layers, b.cache.layers  # type: ignore[union-attr]
    return a.ids == b.ids and all(
        torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values) for x, y in zip(layers_a, layers_b, strict=True)
    )


def main(folder: str, quantizations: str, before: bool) -> None:
    for quantization in quantizations.split(","):
        engine = Engine(load_model(folder or None, quantization=quantization, device="cpu"))
        print(json.dumps(compare(engine, ("calls", "before") if before else ("calls",))), flush=True)


def compare(engine: Engine, rules: tuple[str, ...]) -> dict[str, Any]:
    results: dict[str, Any] = {
        "quantization": engine.quantization,
        "decode_path": engine.decode_path,
        "note": engine.decode_path_note,
        "threads": torch.get_num_threads(),
    }
    for case, (first, edited) in CASES.items():
        fresh_kv = KVState()
        fresh_text, _ = reply(engine, edited, fresh_kv)
        for rule in rules:
            kv = KVState()
            reply(engine, first, kv)
            if rule == "before":
                kv.prefill_calls = []  # every position reusable, as before issue 28
            text, cached = reply(engine, edited, kv)
            results[f"{case}-{rule}"] = {
                "cached": cached,
                "kv_equal": same_cache(kv, fresh_kv),
                "text_equal": text == fresh_text,
            }
    return results


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], "--before" in sys.argv[3:])
