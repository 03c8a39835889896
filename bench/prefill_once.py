"""Prefill once: time to first token of a document asked about cold and again in a new process (the prompt cache on
disk restores its prefix), with the disk's read rate measured in the same run.

    python bench/prefill_once.py [--model FILE.gguf] [--tokens 2000,10000] [--trials 2]

Per document size, per trial: a fresh cache folder; process 1 asks about the document (cold: everything prefilled,
blocks saved after the reply); process 2, a new process on the same cache, asks the same question (warm: the prefix
restored from disk, only the rest prefilled). Both greedy, 16 tokens, the response cache off. Printed: cold and warm
TTFT (medians), their ratio, tokens restored of the prompt, the restore time and rate, whether the warm reply is
token-identical to the cold one, and the rate at which this disk reads the cache's block files once evicted from the
page cache (posix_fadvise DONTNEED; where the kernel keeps them anyway the figure is the page cache's). The document
is this machine's GPL-3 text (/usr/share/common-licenses), repeated to length, else a generated one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import llama_build  # noqa: E402

LICENCE = Path("/usr/share/common-licenses/GPL-3")
QUESTION = "\n\nIn one sentence: what does this text say about distributing modified versions?"

WORKER = """
import json, sys, threading, time
from app.core.chat.events import ChatMessage, StatsEvent, TokenEvent
from app.core.chat.sampling import SamplingParams
from app.core.engines.backend import LoadRequest, ReplyRequest
from app.core.engines.opening import open_backend

model, document = sys.argv[1] or None, open(sys.argv[2], encoding="utf-8").read()
backend = open_backend(LoadRequest(model, device="cpu", response_cache=False))
engine = backend.engine
deadline = time.monotonic() + 600
while getattr(engine, "prefixes", None) is None and time.monotonic() < deadline:
    time.sleep(0.05)  # the weights' digest is hashed in the background at load
if getattr(engine, "prefixes", None) is None:
    raise SystemExit("this model has no prompt cache (not on the torch-free runtime?)")
request = ReplyRequest([ChatMessage("user", document)], SamplingParams(temperature=0, max_new_tokens=16))
events = list(backend.generate(request, threading.Event()))
stats = next(e for e in events if isinstance(e, StatsEvent)).stats
engine.prefixes.flush()
print(json.dumps({
    "text": "".join(e.text for e in events if isinstance(e, TokenEvent)),
    "ttft_s": stats.ttft_s, "prompt_tokens": stats.prompt_tokens, "restored_tokens": stats.restored_tokens,
    "restore_s": stats.restore_s, "path": engine.decode_path,
}))
backend.close()
"""


def document_text(tokens: int, count: Any) -> str:
    """A document of about `tokens` tokens (by the model's tokenizer) and the question after it."""
    base = LICENCE.read_text(encoding="utf-8") if LICENCE.is_file() else _generated()
    text = ""
    while count(text) < tokens:
        text += base
    # cut to length by characters, then settle on the token count
    while count(text) > tokens:
        text = text[: int(len(text) * tokens / count(text)) - 1]
    return text + QUESTION


def _generated() -> str:
    return "".join(
        f"Entry {i}: the clerk moved the ledger from shelf {i % 7} to shelf {(i * 3) % 11}.\n" for i in range(400)
    )


def run_worker(model: str, document: Path, cache: Path) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HEARTH_CACHE_DIR": str(cache), "TQDM_DISABLE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", WORKER, model, str(document)], capture_output=True, text=True, env=env, cwd=ROOT,
        timeout=3600, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise SystemExit(f"prefill_once: the worker failed:\n{result.stderr[-3000:]}")
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def disk_read_rate(folder: Path) -> tuple[float, int]:
    """Bytes per second reading every block file under `folder` once after asking the kernel to drop it from the
    page cache; and the bytes read."""
    files = [path for path in folder.rglob("*") if path.is_file()]
    for path in files:
        with path.open("rb") as handle:
            os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    started, total = time.perf_counter(), 0
    for path in files:
        total += len(path.read_bytes())
    return total / max(time.perf_counter() - started, 1e-9), total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="", help="a GGUF file (default: the embedded model)")
    parser.add_argument("--tokens", default="2000,10000", help="document sizes in tokens")
    parser.add_argument("--trials", type=int, default=2)
    args = parser.parse_args(argv)
    from app.core.models.gguf_tokenizer import load_gguf_tokenizer
    from app.core.models.model_source import resolve_model

    source = resolve_model(args.model or None)
    tokenizer = load_gguf_tokenizer(source.path)

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    print(f"machine: {llama_build.machine_line()}; load {os.getloadavg()[0]:.1f}")
    print(f"model: {source.display_name} ({source.path.name})")
    rows = []
    with tempfile.TemporaryDirectory(prefix="prefill-once-") as scratch:
        for tokens in (int(value) for value in args.tokens.split(",")):
            document = Path(scratch) / f"doc-{tokens}.txt"
            document.write_text(document_text(tokens, count), encoding="utf-8")
            cold, warm, rates, same = [], [], [], True
            for trial in range(args.trials):
                cache = Path(scratch) / f"cache-{tokens}-{trial}"
                first = run_worker(args.model, document, cache)
                rates.append(disk_read_rate(cache / "prompt-cache"))
                second = run_worker(args.model, document, cache)
                cold.append(first)
                warm.append(second)
                same = same and first["text"] == second["text"]
                print(f"  {tokens} tokens, trial {trial + 1}: cold {first['ttft_s']:.2f} s, warm "
                      f"{second['ttft_s']:.2f} s (restored {second['restored_tokens']} of {second['prompt_tokens']} "
                      f"in {second['restore_s']:.2f} s)", flush=True)  # fmt: skip
            cold_s = statistics.median(float(run["ttft_s"]) for run in cold)  # type: ignore[arg-type]
            warm_s = statistics.median(float(run["ttft_s"]) for run in warm)  # type: ignore[arg-type]
            restore_s = statistics.median(float(run["restore_s"]) for run in warm)  # type: ignore[arg-type]
            restored = int(warm[0]["restored_tokens"])  # type: ignore[call-overload]
            prompt = int(warm[0]["prompt_tokens"])  # type: ignore[call-overload]
            rate, size = statistics.median(r for r, _ in rates), rates[0][1]
            rows.append((tokens, prompt, cold_s, warm_s, restored, restore_s, size, rate, same, cold[0]["path"]))
    print()
    print("| document | prompt tokens | cold TTFT | restored TTFT | ratio | restored tokens | restore | cache on disk "
          "| disk read | same reply |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for tokens, prompt, cold_s, warm_s, restored, restore_s, size, rate, same, _ in rows:
        print(f"| {tokens:,} | {prompt:,} | {cold_s:.2f} s | {warm_s:.2f} s | {warm_s / cold_s:.3f}× | "
              f"{restored:,} ({restored / prompt:.0%}) | {restore_s:.2f} s | {size / 2**20:.0f} MiB | "
              f"{rate / 2**30:.2f} GiB/s | {'yes' if same else 'NO'} |")  # fmt: skip
    print(f"\nruntime: {rows[0][9] if rows else '?'}; medians of {args.trials} trial(s), each a fresh cache")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
