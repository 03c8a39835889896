"""The most prompt lookup could gain with its guesses, knowing in advance which are taken (a bound for the planner),
and what the planner itself gets, both replayed on the same replies and the same measured costs.

    python bench/lookup_oracle.py [--tokens 160]

Each of bench/lookup.py's prompts, bench/peer.py's story prompt and its six more (MORE_PROMPTS: a recipe, an email,
a function, a local history; questions and rewrites) gets its greedy reply from the default model's GGUF. The reply is
then replayed token by token: at each token the n-gram index proposes its guesses (as in a real reply), and
- an oracle that knows the reply checks exactly the guesses that will be taken, when a check of that size costs less
  than the steps it saves;
- the planner (`LookupDecoder`, as the engine runs it) decides from what it knows, its clock advanced by the price of
  each step and check instead of their time: its choices without the machine's noise.
Costs come from a check of each size timed in the same run (bench/lookup.py's `forward_costs`); the planner starts
with them measured, as after a process's first replies. Printed per prompt: both speed-ups over plain decode, and
the share of proposals whose first guess the reply took. bench/lookup.py's measured ratios over these say how much
of the replayed gain a real reply keeps.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from app.core.chat.chat_format import format_prompt  # noqa: E402
from app.core.chat.events import ChatMessage  # noqa: E402
from app.core.engines.lite.gguf_model import open_gguf_model  # noqa: E402
from app.core.engines.lookup import MAX_DRAFT, STEPS_KEPT, LookupDecoder, LookupPlanner, NgramIndex  # noqa: E402
from app.core.models.gguf_tokenizer import gguf_eos_ids, load_gguf_tokenizer  # noqa: E402
from app.core.models.model_source import default_model_gguf  # noqa: E402
from bench import llama_build  # noqa: E402
from bench.lookup import MORE_PROMPTS, PROMPTS, forward_costs  # noqa: E402
from bench.peer import SHORT_QUESTION  # noqa: E402


def greedy_reply(path: Path, prompt_ids: list[int], tokens: int, eos: set[int]) -> list[int]:
    model = open_gguf_model(path)
    cache = model.new_cache()
    logits = np.asarray(model.forward(prompt_ids, cache, 1))
    reply: list[int] = []
    for _ in range(tokens):
        token = int(np.argmax(logits.reshape(-1, logits.shape[-1])[-1]))
        reply.append(token)
        if token in eos:
            break
        logits = np.asarray(model.step(token, cache))
    model.close()
    return reply


def oracle(prompt_ids: list[int], reply: list[int], costs: dict[int, float]) -> tuple[float, int, int]:
    """(plain decode time over the oracle's, proposals made, proposals whose first guess was taken)."""
    index = NgramIndex(prompt_ids)
    index.append(reply[0])
    position, spent, proposals, first_taken = 0, 0.0, 0, 0
    while position < len(reply) - 1:
        guesses = index.propose(min(MAX_DRAFT, len(reply) - 2 - position))
        taken = 0
        while taken < len(guesses) and reply[position + 1 + taken] == guesses[taken]:
            taken += 1
        proposals += bool(guesses)
        first_taken += taken > 0
        if taken and costs[taken + 1] < 1 + taken:
            spent += costs[taken + 1]
            advance = 1 + taken
        else:
            spent += 1.0
            advance = 1
        for token in reply[position + 1 : position + 1 + advance]:
            index.append(token)
        position += advance
    return (len(reply) - 1) / spent if spent else 1.0, proposals, first_taken


def replayed_planner(prompt_ids: list[int], reply: list[int], costs: dict[int, float]) -> float:
    """Plain decode time over the planner's, the reply replayed through `LookupDecoder` on a clock that each step and
    check advances by its price in steps."""
    planner = LookupPlanner()
    for _ in range(STEPS_KEPT):
        planner.record_step(1.0)
    for rows, cost in costs.items():
        if rows > 1:
            planner.record_forward(rows, cost)
    clock = [0.0]
    cache = [len(prompt_ids)]
    position = [0]

    def step(token: int) -> int:
        clock[0] += 1.0
        cache[0] += 1
        return 0

    def forward(tokens: list[int]) -> list[int]:
        clock[0] += costs[len(tokens)]
        cache[0] += len(tokens)
        return [0] * len(tokens)

    def truncate(length: int) -> None:
        cache[0] = length

    decoder = LookupDecoder(
        planner,
        NgramIndex(prompt_ids),
        step=step,
        forward=forward,
        truncate=truncate,
        length=lambda: cache[0],
        room=lambda: len(reply) - 2 - position[0],
        clock=lambda: clock[0],
    )
    for position[0], token in enumerate(reply[:-1]):
        decoder.next_logits(token)  # the logits are not read: the reply's next token is known
    decoder.finish()
    return (len(reply) - 1) / clock[0] if clock[0] else 1.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=160)
    args = parser.parse_args(argv)
    path = default_model_gguf()
    tokenizer, eos = load_gguf_tokenizer(path), gguf_eos_ids(path)
    costs = forward_costs(path, MAX_DRAFT + 1, 8)
    print(f"machine: {llama_build.machine_line()}")
    print(f"model: {path.name}; greedy, {args.tokens} new tokens at most")
    print("a check of N rows costs, in decode steps: " + " · ".join(f"{n}: {c:.2f}" for n, c in costs.items() if n > 1))
    print("\n| prompt | reply tokens | oracle / plain decode | planner (replayed) / plain | first guesses taken |")
    print("|---|---|---|---|---|")
    for name, text in {**PROMPTS, "story (bench/peer.py)": SHORT_QUESTION, **MORE_PROMPTS}.items():
        prompt_ids = list(format_prompt(tokenizer, [ChatMessage("user", text)], "").ids)
        reply = greedy_reply(path, prompt_ids, args.tokens, eos)
        ratio, proposals, first_taken = oracle(prompt_ids, reply, costs)
        planned = replayed_planner(prompt_ids, reply, costs)
        print(f"| {name} | {len(reply)} | {ratio:.2f}× | {planned:.2f}× | {first_taken}/{proposals} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
