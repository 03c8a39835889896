"""Documents benchmark: extraction throughput, and what the documents-first layout buys on a second question.

1. Extraction: a 200-page PDF (written with fpdf2) and a 5 MB text file (UTF-8, and Latin-1 through the
   charset path), median of --trials runs: MB/s and pages/s.
2. TTFT of a second question about the same document ÷ TTFT of the first (target ≤ 0.2), on the default
   model with the real engine and KV reuse, measured side by side in one run. Two ways to re-ask:
   a follow-up question in the same conversation, and the first message edited to a new question.

Run: .venv/bin/python bench/documents.py [--trials 3] [--doc-paragraphs 24]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TQDM_DISABLE", "1")

from app.core.documents import compose_user_message, extract_document
from tests.helpers.document_files import SECRET, filler_paragraphs, write_pdf


def timed_extract(path: Path, trials: int) -> tuple[float, object]:
    times = []
    document = None
    for _ in range(trials):
        started = time.perf_counter()
        document = extract_document(path)
        times.append(time.perf_counter() - started)
    return statistics.median(times), document


def extraction(trials: int, folder: Path) -> list[tuple[str, str, str, str]]:
    rows = []
    page_text = "\n".join(filler_paragraphs(12, topic="harvest"))  # ~2 KB of text per page
    pdf = write_pdf(folder / "book.pdf", [f"Page {n + 1}.\n{page_text}" for n in range(200)])
    seconds, document = timed_extract(pdf, trials)
    size = pdf.stat().st_size
    rows.append(
        ("200-page PDF", f"{size / 2**20:.2f} MB", f"{seconds:.2f} s", f"{200 / seconds:.0f} pages/s, "
         f"{len(document.text) / 2**20 / seconds:.2f} MB text/s")  # type: ignore[attr-defined]
    )  # fmt: skip
    block = "\n\n".join(filler_paragraphs(200, topic="rivers")) + "\n\n"
    text = (block * (5 * 2**20 // len(block) + 1))[: 5 * 2**20]
    utf8 = folder / "big-utf8.txt"
    utf8.write_text(text, encoding="utf-8")
    seconds, _ = timed_extract(utf8, trials)
    rows.append(("5 MB text, UTF-8", "5.00 MB", f"{seconds:.2f} s", f"{5 / seconds:.1f} MB/s"))
    latin = folder / "big-latin1.txt"
    latin.write_bytes(text.replace("rivers", "rivières").encode("latin-1")[: 5 * 2**20])
    seconds, _ = timed_extract(latin, trials)
    rows.append(("5 MB text, Latin-1", "5.00 MB", f"{seconds:.2f} s", f"{5 / seconds:.1f} MB/s"))
    return rows


def ttft_ratio(trials: int, paragraphs: int, folder: Path) -> list[tuple[str, str]]:
    from app.core.chat.events import StatsEvent
    from app.core.chat.sampling import SamplingParams
    from app.core.engines.engine import Engine
    from app.core.engines.loader import load_model
    from app.core.engines.local import EngineBackend
    from app.core.engines.session import ChatSession

    lines = filler_paragraphs(paragraphs)
    lines.insert(paragraphs // 2, SECRET)
    path = folder / "notes.txt"
    path.write_text("\n\n".join(lines), encoding="utf-8")
    document = extract_document(path)
    engine = Engine(load_model(None, quantization="bf16", device="cpu"))
    params = SamplingParams(temperature=0.0, max_new_tokens=4)

    def stats_of(events: object) -> StatsEvent:
        return next(e for e in events if isinstance(e, StatsEvent))  # type: ignore[attr-defined]

    first, follow, edited = [], [], []
    prompt_tokens = cached_follow = cached_edit = 0
    for _ in range(trials):
        session = ChatSession(EngineBackend.wrap(engine), system_prompt="You are a helpful assistant.", params=params)
        session.use_response_cache = False
        one = stats_of(list(session.ask(compose_user_message("What is the secret code word?", [document]))))
        two = stats_of(list(session.ask("Which station recorded the rain?")))
        three = stats_of(list(session.edit(0, compose_user_message("Summarise the notes.", [document]))))
        first.append(one.stats.ttft_s)
        follow.append(two.stats.ttft_s)
        edited.append(three.stats.ttft_s)
        prompt_tokens, cached_follow, cached_edit = (
            one.stats.prompt_tokens,
            two.stats.cached_tokens,
            three.stats.cached_tokens,
        )
    t1, t2, t3 = (statistics.median(x) for x in (first, follow, edited))
    return [
        ("first question (document + question)", f"{t1 * 1000:.0f} ms, {prompt_tokens} prompt tokens, 0 cached"),
        ("follow-up question, same conversation", f"{t2 * 1000:.0f} ms, {cached_follow} cached → **{t2 / t1:.3f}×**"),
        ("first message edited: new question", f"{t3 * 1000:.0f} ms, {cached_edit} cached → **{t3 / t1:.3f}×**"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--doc-paragraphs", type=int, default=24, help="size of the document for the TTFT ratio")
    parser.add_argument("--skip-model", action="store_true", help="extraction only")
    args = parser.parse_args()
    print(f"# documents bench · {platform.machine()} · {os.cpu_count()} CPUs · {platform.python_version()}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print("\n| file | size | extraction (median) | throughput |\n|---|---|---|---|")
        for row in extraction(args.trials, folder):
            print("| " + " | ".join(row) + " |", flush=True)
        if not args.skip_model:
            print("\n| default model, bf16, CPU | TTFT (median) |\n|---|---|")
            for row in ttft_ratio(args.trials, args.doc_paragraphs, folder):
                print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
