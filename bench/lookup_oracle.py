"""The most prompt lookup could gain with its guesses, knowing in advance which are taken: a bound for the planner.

    python bench/lookup_oracle.py [--tokens 160]

Each of bench/lookup.py's prompts (and bench/peer.py's story prompt) gets its greedy reply from the default model's
GGUF. The reply is then replayed token by token: at each token the n-gram index proposes its guesses (as in a real
reply), and an oracle that knows the reply checks exactly the guesses that will be taken, when a check of that size
costs less than the steps it saves. Costs come from a check of each size timed in the same run (bench/lookup.py's
`forward_costs`). Printed per prompt: the oracle's speed-up over plain decode, and the share of proposals whose first
guess the reply took. bench/lookup.py's measured ratios over these bounds say how much of the reachable gain the
planner gets.
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
from app.core.engines.lookup import MAX_DRAFT, NgramIndex  # noqa: E402
from app.core.models.gguf_tokenizer import gguf_eos_ids, load_gguf_tokenizer  # noqa: E402
from app.core.models.model_source import default_model_gguf  # noqa: E402
from bench import llama_build  # noqa: E402
from bench.lookup import PROMPTS, forward_costs  # noqa: E402
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
    print("\n| prompt | reply tokens | oracle / plain decode | first guesses taken |")
    print("|---|---|---|---|")
    for name, text in {**PROMPTS, "story (bench/peer.py)": SHORT_QUESTION}.items():
        prompt_ids = list(format_prompt(tokenizer, [ChatMessage("user", text)], "").ids)
        reply = greedy_reply(path, prompt_ids, args.tokens, eos)
        ratio, proposals, first_taken = oracle(prompt_ids, reply, costs)
        print(f"| {name} | {len(reply)} | {ratio:.2f}× | {first_taken}/{proposals} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
