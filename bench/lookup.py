"""Prompt-lookup decoding against plain decode, side by side: the same requests, greedy, on the default model, with
the guesses proposed and accepted; then the cost of a checking forward at a larger model's shape and the speed-up the
default model's measured acceptance would give there.

    python bench/lookup.py [--trials 3] [--tokens 160] [--shape FILE.gguf] [--fresh 6] [--more]

Part 1 runs each prompt (a document question, two rewrites, a code edit, and a free-writing prompt where little is
copied; with --more six others: questions about and rewrites of a recipe, an email, a function and a short history)
with lookup off and on, alternating which goes first per trial, in one process on the torch-free runtime as users
run it. Printed per prompt: median decode tok/s of each, the paired ratio, guesses proposed/accepted, and
whether the two replies are the same tokens (they must be).

Part 2: a model with random weights has no meaningful acceptance, so at a larger shape (--shape, default the 1B
Q4_K_M file from `make bench-gguf-models` when present) the speed-up is worked out, not run: a forward's cost per
number of rows is measured against a decode step (interleaved), and each part-1 reply's steps and checks are priced
with those costs (with the default model's own costs too, a check of the method against part 1's measured ratio).
The planner adapts to the costs it measures, so where checking costs more it proposes fewer guesses; the worked-out
figure is what the default model's guesses would give at that shape without that adaptation.

Part 3 (--fresh N pairs, 0 skips it): a fresh process's first reply to a prompt that copies nothing (bench/peer.py's
story prompt, 64 tokens), lookup on and off alternating: what a user pays for lookup before the planner has measured
anything on this machine. Lookup must not cost there.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.core.chat.events import ChatMessage, DoneEvent, StatsEvent  # noqa: E402
from app.core.chat.sampling import SamplingParams  # noqa: E402
from app.core.engines.backend import LoadRequest, ReplyRequest  # noqa: E402
from app.core.engines.lite.backend import LiteBackend, open_lite_backend  # noqa: E402
from app.core.engines.lite.engine import LiteEngine  # noqa: E402
from app.core.engines.lite.gguf_model import open_gguf_model  # noqa: E402
from app.core.engines.lookup import MAX_DRAFT  # noqa: E402
from app.core.models.model_source import default_model_gguf  # noqa: E402
from bench import gguf_files, llama_build  # noqa: E402

DOCUMENT = """The Larkspur 3 is a portable weather station for gardens and small farms. It measures air temperature,
humidity, wind speed, rainfall and soil moisture every five minutes and sends the readings to the Larkspur app over
Wi-Fi. The station runs on four AA batteries, which last about nine months, or on the optional solar panel. To set it
up, mount the station on a pole at least one metre above the ground, away from walls and trees, and press the pairing
button until the light blinks blue. The rain gauge must be emptied of leaves once a month. Readings are kept on the
station for thirty days when the Wi-Fi connection is lost and are uploaded once it comes back."""

TYPOS = """Our comunity garden will be open every saturday from nine untill noon. Please bring your own gloves and
tools, and remember to sign the vistor book at the gate. Childern are welcome but must stay with an adult at all
times. We will have free seeds for anyone who wants to start there own vegetable patch this spring."""

CODE = """def load(path):
    with open(path) as handle:
        lines = handle.readlines()
    return [line.strip() for line in lines if line.strip()]


def count_words(path):
    total = 0
    for line in load(path):
        total += len(line.split())
    return total
"""

PROMPTS: dict[str, str] = {
    "document question": f"{DOCUMENT}\n\nAccording to the text above, how do you set up the station? Quote it.",
    "rewrite (spelling)": f"Rewrite this text with the spelling mistakes fixed:\n\n{TYPOS}",
    "rewrite (summary)": f"Summarise this text in three sentences:\n\n{DOCUMENT}",
    "code edit": f"Rename the function `load` to `read_lines` in this code and show the whole code:\n\n{CODE}",
    "free writing": "Write a short story about a lighthouse keeper and a storm.",
}

# Six more (`--more`; bench/lookup_oracle.py replays them too): questions about and rewrites of other short texts.
RECIPE = (
    "Lemon barley water. Put 100 grams of pearl barley in a sieve and rinse it under cold water until the water runs "
    "clear. Tip the barley into a large pan with two litres of water and the thinly pared zest of three lemons. Bring "
    "it to the boil, then turn the heat down and simmer for twenty minutes. Strain the liquid into a jug, stir in the "
    "juice of the lemons and four tablespoons of honey, and leave it to cool. Keep it in the fridge for up to three "
    "days and serve it over ice."
)
EMAIL = (
    "hey team, the meeting tomorrow is moved to 3pm because the projector in room 4 is broken again. bring your "
    "laptops and the quarterly numbers. if you cant come tell me before noon. also someone ate my yoghurt from the "
    "fridge, not cool."
)
FUNCTION = """def parse_line(line):
    parts = line.strip().split(",")
    name = parts[0]
    age = int(parts[1])
    city = parts[2]
    return {"name": name, "age": age, "city": city}
"""
BRIDGE = (
    "The old bridge over the river was built in 1850 by the villagers themselves. They carried the stones from the "
    "quarry on the hill, one cart at a time, and it took them four summers to finish it. The bridge has three arches "
    "and a small shrine in the middle, where travellers used to leave flowers. In 1990 the council wanted to pull it "
    "down, but the village school collected ten thousand signatures and the bridge was saved."
)
MORE_PROMPTS = {
    "recipe question": f"{RECIPE}\n\nHow long does the barley simmer, and how long does the drink keep?",
    "recipe as steps": f"{RECIPE}\n\nRewrite this recipe as a numbered list of steps.",
    "email made polite": f"Rewrite this email so that it is polite and professional:\n\n{EMAIL}",
    "type hints": f"Add type hints to this Python function and return the whole function:\n\n{FUNCTION}",
    "present tense": f"Rewrite this text in the present tense:\n\n{BRIDGE}",
    "history question": f"{BRIDGE}\n\nWho saved the bridge, and how?",
}


def open_default() -> LiteBackend | None:
    """The default model on the torch-free runtime, as users run it (no response or prompt cache); None, said on
    stderr, where it does not open there."""
    opened = open_lite_backend(LoadRequest(None, device="cpu", response_cache=False, prompt_cache_gib=0))
    if not isinstance(opened, LiteBackend):
        print(f"lookup: the default model did not open on the torch-free runtime ({opened})", file=sys.stderr)
        return None
    return opened


def reply(engine: LiteEngine, prompt: str, tokens: int) -> tuple[str, dict[str, object]]:
    request = ReplyRequest(
        messages=[ChatMessage("user", prompt)],
        params=SamplingParams(temperature=0.0, max_new_tokens=tokens),
        use_response_cache=False,
    )
    text, stats = "", {}
    for event in engine.generate(request, kv=engine.new_kv()):
        if isinstance(event, StatsEvent):
            stats = event.stats.to_dict()
        elif isinstance(event, DoneEvent):
            text = event.text
    return text, stats


def forward_costs(path: Path, max_rows: int, trials: int) -> dict[int, float]:
    """A forward of each number of rows, in decode steps, as a reply runs them: each after a few steps (a forward
    straight after another, or a step straight after a forward, times differently), medians."""
    model = open_gguf_model(path)
    cache = model.new_cache()
    model.forward(list(range(100, 150)), cache, 1)
    base = cache.length
    steps: list[float] = []
    times: dict[int, list[float]] = {rows: [] for rows in range(2, max_rows + 1)}
    for _ in range(trials):
        for rows in times:
            for _ in range(3):
                started = time.perf_counter()
                model.step(7, cache)
                steps.append(time.perf_counter() - started)
            length = cache.length
            started = time.perf_counter()
            model.forward([7] * rows, cache, rows)
            times[rows].append(time.perf_counter() - started)
            cache.truncate(length + 1)  # the token stays, its guesses go: as a check whose guesses all missed
            if cache.length > base + 250:
                cache.truncate(base)
    model.close()
    step = statistics.median(steps)
    return {1: 1.0} | {rows: statistics.median(values) / step for rows, values in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=160)
    parser.add_argument("--shape", help="a GGUF file whose forward costs price part 2 (default: the 1B Q4_K_M)")
    parser.add_argument("--fresh", type=int, default=6, help="pairs of fresh processes for part 3 (0: skip it)")
    parser.add_argument("--more", action="store_true", help="part 1 on MORE_PROMPTS too")
    parser.add_argument("--fresh-worker", choices=("on", "off"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.fresh_worker:
        return fresh_worker(args.fresh_worker == "on")
    opened = open_default()
    if opened is None:
        return 2
    engine = opened.engine
    print(f"machine: {llama_build.machine_line()}")
    print(f"model: {opened.info.name} ({opened.info.quantization}); greedy, {args.tokens} new tokens at most")
    reply(engine, "Hello", 8)  # warm the map and the thread team
    traces: dict[str, list[tuple[int, int]]] = {}  # each prompt's last lookup reply: its checks' (proposed, taken)
    generated: dict[str, int] = {}
    measured: dict[str, float] = {}
    rows = []
    for name, prompt in {**PROMPTS, **(MORE_PROMPTS if args.more else {})}.items():
        speed: dict[bool, list[float]] = {False: [], True: []}
        same = True
        stats: dict[str, object] = {}
        for trial in range(args.trials):
            texts = {}
            for on in (False, True) if trial % 2 == 0 else (True, False):
                engine.set_lookup(on)
                texts[on], reply_stats = reply(engine, prompt, args.tokens)
                speed[on].append(float(reply_stats["decode_tokens_per_s"]))  # type: ignore[arg-type]
                if on:
                    stats, traces[name] = reply_stats, list(engine.last_lookup.runs if engine.last_lookup else [])
            same = same and texts[True] == texts[False]
        generated[name] = int(stats["generated_tokens"])  # type: ignore[call-overload]
        measured[name] = statistics.median(on / off for on, off in zip(speed[True], speed[False], strict=True))
        rows.append(
            f"| {name} | {statistics.median(speed[False]):.1f} | {statistics.median(speed[True]):.1f} | "
            f"{measured[name]:.2f}× | {stats['lookup_accepted']}/{stats['lookup_proposed']} | {generated[name]} | "
            f"{'yes' if same else '**no**'} |"
        )
        print(f"{name}: done", flush=True)
    opened.close()
    print("\n| prompt | plain tok/s | lookup tok/s | lookup / plain | guesses taken | tokens | same tokens |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print(f"\nmedians of {args.trials} trials, ratios paired per trial")

    shapes = [("default model", default_model_gguf())]
    larger = Path(args.shape) if args.shape else ROOT / ".cache" / "gguf-models" / "llama-3.2-1b.Q4_K_M.gguf"
    if larger.is_file():
        shapes.append((larger.stem, larger))
    else:
        print(f"\n(the larger shape is left out: {larger} not found; `make bench-gguf-models` builds it)")
    costs = {}
    for label, path in shapes:
        costs[label] = forward_costs(path, MAX_DRAFT + 1, max(args.trials * 4, 8))
        listed = " · ".join(f"{n}: {cost:.2f}" for n, cost in costs[label].items() if n > 1)
        file_format = gguf_files.describe(path)["format"]
        print(f"\n{label}, {path.name} ({file_format} file): a forward of N rows costs, in decode steps: {listed}")
    print("\nEach reply's steps and checks priced with those costs (lookup / plain decode time):\n")
    print("| prompt | measured | " + " | ".join(f"worked out, {label}" for label in costs) + " |")
    print("|---|---|" + "---|" * len(costs))
    for name, trace in traces.items():
        cells = " | ".join(f"{worked_out(trace, generated[name], cost):.2f}×" for cost in costs.values())
        print(f"| {name} | {measured[name]:.2f}× | {cells} |")
    if args.fresh > 0:
        fresh_first_replies(args.fresh)
    return 0


def fresh_first_replies(pairs: int) -> None:
    """Part 3: pairs of fresh processes, lookup on and off alternating first, each timing its first reply."""
    speed: dict[str, list[float]] = {"on": [], "off": []}
    for pair in range(pairs):
        for mode in ("on", "off") if pair % 2 == 0 else ("off", "on"):
            done = subprocess.run(
                [sys.executable, __file__, "--fresh-worker", mode], capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                print(f"\n(part 3 left out: a fresh process failed: {done.stderr.strip()[-300:]})")
                return
            speed[mode].append(float(done.stdout.split()[-1]))
    ratios = [on / off for on, off in zip(speed["on"], speed["off"], strict=True)]
    print(
        f"\nA fresh process's first reply to a prompt that copies nothing ({pairs} pairs, alternating): lookup on "
        f"{statistics.median(speed['on']):.1f} tok/s, off {statistics.median(speed['off']):.1f}; on / off "
        f"{statistics.median(ratios):.2f}× (medians; each pair's ratio {', '.join(f'{r:.2f}' for r in ratios)})"
    )


def fresh_worker(lookup: bool) -> int:
    """One fresh process: load the default model, a two-token warm-up, then the story prompt's reply; prints its
    decode tok/s."""
    from bench.peer import SHORT_QUESTION

    opened = open_default()
    if opened is None:
        return 2
    opened.engine.set_lookup(lookup)
    reply(opened.engine, "Hello", 2)
    _, stats = reply(opened.engine, SHORT_QUESTION, 64)
    opened.close()
    print(float(stats["decode_tokens_per_s"]))  # type: ignore[arg-type]
    return 0


def worked_out(trace: list[tuple[int, int]], generated: int, costs: dict[int, float]) -> float:
    """Plain decode's time over lookup's for a reply of `generated` tokens whose checks went as `trace` says: each
    check is one forward of its guesses plus one row and yields that token's successor and the guesses taken; every
    other token is one step."""
    checked = sum(1 + taken for _, taken in trace)
    steps = generated - 1 - checked
    lookup_time = steps + sum(costs[proposed + 1] for proposed, _ in trace)
    return (generated - 1) / lookup_time if lookup_time > 0 else 1.0


if __name__ == "__main__":
    raise SystemExit(main())
