"""Hearth vs llama.cpp on the same model, prompts and token ids: decode, short and long prefill, roofline fractions.

    make bench-peer                       # builds llama-cpp-python into .cache/peer-venv once (~6 min), then runs this
    python bench/peer.py [--trials 8] [--threads 2] [--tokens 128] [--peer-python .cache/peer-venv/bin/python]
    python bench/peer.py --model .cache/gguf-models/llama-3.2-1b.Q4_K_M.gguf   # a GGUF (bench/build_gguf_models.py)
    python bench/peer.py --model .cache/models/random-tinyllama-1b             # a folder (bench/build_1b_model.py)

Each measurement is one fresh process (`--worker ...`), engines interleaved per trial, with a read-bandwidth probe (1
GiB summed with the same threads) in the same rotation. A GGUF (the default model's shipped Q4_1, or `--model
FILE.gguf` in any format) is run by llama.cpp as it is, with flash attention on; Hearth runs the same file through
its own load path (on the CPU: the torch-free runtime on the file's own blocks, or `--quant` through torch). A
`--model` folder (Hugging Face layout) is what Hearth loads; for llama.cpp it is converted once with
llama.cpp's own convert_hf_to_gguf.py (from the llama-cpp-python sdist, bench/llama_build.py) and quantized to Q4_1
with `llama_model_quantize`, cached under .cache/peer-models/. Both get the same token ids (Hearth's tokenizer and chat
template) and greedy decoding; decode is plain on both sides (Hearth's prompt lookup off: bench/lookup.py measures
it), timed after the short prompt and again after the long one (decode at a long context, where attention reads
the whole KV cache each token). Printed: the machine (CPU model, SIMD flags), the file's format and block types, the
llama.cpp build that ran (version, CMAKE_ARGS, ggml's compiled CPU features); medians, per-trial paired ratios (Hearth
/ llama.cpp) with the file's format beside each, each engine's fraction of the bandwidth roofline (tok/s x bytes it
reads per token / bandwidth) and of the file's roofline (tok/s x the file's own bytes per token: its matrices' blocks
and the head), and each process's peak RSS (VmHWM: what the process held at its most, mapped model files included, as
`ru_maxrss` counts them), RSS after the run, its runtime floor (RSS before any model: Hearth's worker after importing
torch, transformers and the code a load imports; llama.cpp's after `import llama_cpp`) and the peak above that floor
(the model's own memory). Rates are wall-clock; the CPU-time rates beside them are steadier on a shared machine. A
worker that dies is named with its signal and, for llama.cpp, the build that ran (an AMX build's known segfault
included)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import gguf_files, llama_build, worker_process  # noqa: E402

DEFAULT_PEER_PYTHON = ROOT / ".cache" / "peer-venv" / "bin" / "python"
PEER_MODELS = ROOT / ".cache" / "peer-models"
LLAMA_FTYPE_MOSTLY_Q4_1 = 3  # llama.h's enum llama_ftype
SHORT_QUESTION = "Write a long story about a dragon who learns to bake bread. Give every character a name."
LONG_PARAGRAPH = (
    "The river town kept its records in a stone house by the bridge, and every spring the clerks copied the old "
    "ledgers onto fresh paper so that the floods would not take the only copy. "
)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _memory() -> dict[str, int]:
    """This process's peak RSS (VmHWM) and RSS now, in bytes: mapped model files count where touched."""
    found = {"peak_rss": 0, "rss": 0}
    names = {"VmHWM": "peak_rss", "VmRSS": "rss"}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in names:
            found[names[key]] = int(value.split()[0]) * 1024
    if not found["peak_rss"]:  # no /proc: ru_maxrss is KiB on Linux, bytes on macOS
        scale = 1 if sys.platform == "darwin" else 1024
        found["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
    return found


# -- workers (each runs in its own fresh process) ---------------------------------------------------------------
def worker_hearth(spec: dict[str, object]) -> dict[str, object]:
    sys.path.insert(0, str(ROOT))
    runtime = str(spec.get("runtime") or "auto")
    from app.core.fastpath.openmp import prefer_short_spin

    prefer_short_spin()  # as the app's entry points do, before torch
    if runtime == "torch":
        import torch

        # The runtime floor: torch, transformers and the code any model load imports (its weight-loading machinery
        # pulls in torch.distributed.tensor and sympy), before a weight or a tokenizer is read.
        import transformers.core_model_loading  # noqa: F401

        torch.set_num_threads(int(spec["threads"]))  # type: ignore[call-overload]
    from app.core.chat.events import StatsEvent, TokenEvent
    from app.core.chat.sampling import SamplingParams
    from app.core.engines.backend import LoadRequest
    from app.core.engines.opening import open_backend

    floor = _memory()["rss"]  # the torch-free runtime's floor: the app's load path imported, no model yet
    # No prompt cache on disk: a prefill restored from an earlier run's blocks would be timed as computed
    request = LoadRequest(spec.get("model") or None, quantization=str(spec["quant"]), device="cpu", prompt_cache_gib=0)  # type: ignore[arg-type]
    backend = open_backend(request, runtime=runtime)
    engine = backend.engine  # type: ignore[attr-defined]
    fix_threads = getattr(engine, "fix_threads", None) or getattr(getattr(engine, "model", None), "fix_threads", None)
    if fix_threads is not None and not spec.get("adaptive"):  # llama.cpp's thread count, not the adaptive team
        fix_threads(int(spec["threads"]))  # type: ignore[call-overload]
    set_lookup = getattr(engine, "set_lookup", None)
    if set_lookup is not None:  # plain decode against plain decode: llama.cpp's has no lookup
        set_lookup(False)
    result: dict[str, object] = {
        "decode_path": engine.decode_path,
        "note": engine.decode_path_note,
        "lookup": getattr(engine, "lookup_state", "none"),
    }
    # Warm-up (first-call initialisation of the kernels), not measured; llama.cpp gets the same.
    warm = SamplingParams(temperature=0.0, max_new_tokens=2)
    list(engine.generate_from_ids([1, 2, 3], warm, kv=engine.new_kv()))
    runs = (("short", spec["short_ids"], spec["tokens"]), ("long", spec["long_ids"], spec["long_decode"]))
    for name, ids, tokens in runs:
        params = SamplingParams(temperature=0.0, max_new_tokens=int(tokens))  # type: ignore[call-overload]
        cpu_first = 0.0
        events = engine.generate_from_ids(list(ids), params, kv=engine.new_kv(), use_response_cache=False)  # type: ignore[call-overload]
        for event in events:
            if isinstance(event, TokenEvent) and not cpu_first:
                cpu_first = _cpu_seconds()
            if isinstance(event, StatsEvent):
                stats = event.stats
                cpu_decode = _cpu_seconds() - cpu_first
        result[f"{name}_prefill_s"] = stats.prefill_s
        if name == "long":
            result["long_decode_tok_s"], result["long_generated"] = stats.decode_tokens_per_s, stats.generated_tokens
        else:
            result["decode_tok_s"] = stats.decode_tokens_per_s
            result["generated"] = stats.generated_tokens
            result["decode_cpu_tok_s"] = (stats.generated_tokens - 1) / max(cpu_decode, 1e-9)
    # On a GGUF's own blocks it reads what llama.cpp reads: the file's matrices and head
    on_file = engine.decode_path == "lite-gguf"
    result["bytes_per_token"] = spec["gguf_bytes_per_token"] if on_file else _hearth_bytes_per_token(engine)
    result.update(_memory())
    result["floor_rss"] = floor
    result["torch_imported"] = "torch" in sys.modules
    return result


def worker_prepare(spec: dict[str, object]) -> dict[str, object]:
    """A first load through torch where the torch-free runtime can't open the model yet (it packs and caches the
    Q4_1 copy the runtime maps), so every measured run is a warm load."""
    sys.path.insert(0, str(ROOT))
    from app.core.engines.backend import LoadRequest
    from app.core.engines.lite.backend import open_lite_backend
    from app.core.engines.opening import open_backend

    request = LoadRequest(spec.get("model") or None, quantization=str(spec["quant"]), device="cpu")  # type: ignore[arg-type]
    opened = open_lite_backend(request)
    if isinstance(opened, str):
        open_backend(request, runtime="torch").close()
        return {"packed": opened}
    opened.close()
    return {"packed": ""}


def _hearth_bytes_per_token(engine: object) -> int:
    """Weights a decode step reads: int8 copies where the fast path packed them, the rest at their own size."""
    if engine.decode_path == "lite-q4":  # type: ignore[attr-defined]
        return int(engine.model.weight_bytes)  # type: ignore[attr-defined]
    from app.core.fastpath import int8, packed

    fused = engine.path.fused  # type: ignore[attr-defined]
    if fused is not None:  # every matrix and the lm_head as packed; norms and one embedding row are noise
        # q4 holds the matrices in the model itself (the step adds only what the model lacks)
        return int(fused.added_bytes) + packed.held_tensor_bytes(engine.model)  # type: ignore[attr-defined]
    model = engine.model  # type: ignore[attr-defined]
    embedding = model.get_input_embeddings()
    head = model.get_output_embeddings()
    total = 0
    counted: set[int] = set()
    for module in model.modules():
        packed = getattr(module, int8.PATCH_ATTR, None)
        if packed is not None and engine.decode_path == "int8-decode":  # type: ignore[attr-defined]
            total += packed.nbytes
            counted.add(id(module.weight))
    for param in model.parameters():
        if id(param) in counted or (param is embedding.weight and head is not None and head.weight is not param):
            continue
        total += param.numel() * param.element_size()
    return total


def worker_llama(spec: dict[str, object]) -> dict[str, object]:
    from llama_cpp import Llama

    floor = _memory()["rss"]  # the runtime floor: llama_cpp imported (its library loaded), no model yet
    llm = Llama(
        model_path=str(spec["gguf"]),
        n_ctx=int(spec.get("context") or 4096),  # type: ignore[call-overload]
        n_threads=int(spec["threads"]),  # type: ignore[call-overload]
        n_threads_batch=int(spec["threads"]),  # type: ignore[call-overload]
        n_batch=512,
        flash_attn=True,
        verbose=False,
    )
    result: dict[str, object] = {"decode_path": "llama.cpp", "note": "flash attention on"}
    llm.eval([1, 2, 3])  # warm-up, as Hearth gets one
    for name, ids in (("short", spec["short_ids"]), ("long", spec["long_ids"])):
        llm.reset()
        started = time.perf_counter()
        llm.eval(list(ids))  # type: ignore[call-overload]
        result[f"{name}_prefill_s"] = time.perf_counter() - started
    llm.reset()
    rate, cpu_rate, count = _llama_decode(llm, list(spec["short_ids"]), int(spec["tokens"]), stop_at_end=False)  # type: ignore[call-overload]
    result["decode_tok_s"], result["decode_cpu_tok_s"], result["generated"] = rate, cpu_rate, count
    llm.reset()
    # After the long prompt: as many tokens as Hearth's reply had at most (it ends at the end-of-turn token)
    rate, _, count = _llama_decode(llm, list(spec["long_ids"]), int(spec["long_decode"]), stop_at_end=True)  # type: ignore[call-overload]
    result["long_decode_tok_s"], result["long_generated"] = rate, count
    result["bytes_per_token"] = int(spec["gguf_bytes_per_token"])  # type: ignore[call-overload]
    result.update(_memory())
    result["floor_rss"] = floor
    return result


def _llama_decode(llm: Any, ids: list[int], tokens: int, stop_at_end: bool) -> tuple[float, float, int]:
    """Greedy decode after `ids` (prefilled by the call, untimed): tok/s over the tokens after the first, by the wall
    clock and by CPU time, and how many came."""
    count = 0
    first_at = cpu_first = 0.0
    for token in llm.generate(ids, temp=0.0, top_k=1, reset=True):
        count += 1
        if count == 1:
            first_at, cpu_first = time.perf_counter(), _cpu_seconds()
        if count >= tokens or (stop_at_end and token == llm.token_eos()):
            break
    elapsed = time.perf_counter() - first_at
    return (count - 1) / max(elapsed, 1e-9), (count - 1) / max(_cpu_seconds() - cpu_first, 1e-9), count


def worker_bandwidth(spec: dict[str, object]) -> dict[str, object]:
    """Read bandwidth as decode uses it: 1 GiB summed (read once, nothing written) with the bench's threads, best of
    8. A copy probe (read + write) reads ~10 % lower on this machine and would flatter the roofline fractions."""
    import torch

    torch.set_num_threads(int(spec["threads"]))  # type: ignore[call-overload]
    data = torch.ones(1 << 27, dtype=torch.int64)
    best = float("inf")
    for _ in range(8):
        started = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - started)
    return {"bandwidth_bytes_s": data.numel() * data.element_size() / best}


WORKERS = {
    "hearth": worker_hearth,
    "prepare": worker_prepare,
    "llama": worker_llama,
    "bandwidth": worker_bandwidth,
}


# -- the orchestrator ---------------------------------------------------------------------------------------------
def prompts(tokens_long: int, model: str | None) -> tuple[list[int], list[int], Path, Path]:
    """(short ids, long ids, the model Hearth loads, its Hugging Face folder)."""
    sys.path.insert(0, str(ROOT))
    from app.core.chat.chat_format import format_prompt
    from app.core.chat.events import ChatMessage
    from app.core.models.gguf_tokenizer import load_gguf_tokenizer
    from app.core.models.model_source import resolve_model

    source = resolve_model(model)
    folder = source.path
    if source.kind == "gguf":
        tokenizer = load_gguf_tokenizer(source.path)
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder)
    short = format_prompt(tokenizer, [ChatMessage("user", SHORT_QUESTION)], "").ids
    text = LONG_PARAGRAPH
    while len(tokenizer(text)["input_ids"]) < tokens_long:
        text += LONG_PARAGRAPH
    long = format_prompt(tokenizer, [ChatMessage("user", text + "\nSummarize this.")], "").ids
    return short, long, source.path, folder


# -- a GGUF for llama.cpp ----------------------------------------------------------------------------------------
_QUANTIZE = """
import sys, llama_cpp
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = int(sys.argv[3])
params.nthread = int(sys.argv[4])
code = llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), params)
raise SystemExit(code)
"""


def peer_gguf(model_path: Path, folder: Path, peer_python: str, threads: int) -> Path:
    """The GGUF llama.cpp runs: the file itself, or a folder converted and quantized to Q4_1 once (cached)."""
    if model_path.suffix == ".gguf":
        return model_path
    weights = sorted(folder.glob("*.safetensors"))
    stamp = json.dumps([str(folder.resolve()), [(w.name, w.stat().st_size, w.stat().st_mtime_ns) for w in weights]])
    target = PEER_MODELS / f"{folder.name}-{hashlib.sha256(stamp.encode()).hexdigest()[:12]}-q4_1.gguf"
    if target.exists():
        return target
    PEER_MODELS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=PEER_MODELS) as scratch:
        full = Path(scratch) / "bf16.gguf"
        print(f"peer: converting {folder} for llama.cpp (convert_hf_to_gguf.py, bf16)", flush=True)
        llama_build.convert_to_gguf(folder, full, "bf16")
        print("peer: quantizing to Q4_1 (llama_model_quantize)", flush=True)
        partial = Path(scratch) / "q4_1.gguf"
        quantize = [peer_python, "-c", _QUANTIZE, str(full), str(partial), str(LLAMA_FTYPE_MOSTLY_Q4_1), str(threads)]
        subprocess.run(quantize, check=True)
        partial.replace(target)
    return target


def run_worker(python: str, kind: str, spec: dict[str, object], peer_python: str) -> dict[str, object]:
    try:
        return worker_process.run_worker(python, Path(__file__).resolve(), kind, spec, peer_python)
    except SystemExit as failed:
        raise SystemExit(f"peer: {failed}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=sorted(WORKERS))
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--long-tokens", type=int, default=1471)
    parser.add_argument(
        "--long-decode", type=int, default=64, help="tokens decoded after the long prompt (decode at a long context)"
    )
    parser.add_argument("--quant", default="auto", help="Hearth's weights (default auto: q4 on the CPU)")
    parser.add_argument(
        "--model", help="a GGUF file, or a Hugging Face folder (converted for llama.cpp); default: the embedded model"
    )
    parser.add_argument(
        "--runtime",
        choices=("auto", "torch", "lite"),
        default="auto",
        help="Hearth's runtime (default auto, as the app: torch-free where it can run)",
    )
    parser.add_argument("--peer-python", default=str(DEFAULT_PEER_PYTHON))
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(WORKERS[args.worker](json.loads(sys.stdin.read()))))
        return 0
    if not Path(args.peer_python).exists():
        print(
            f"peer: {args.peer_python} not found; run `make bench-peer` to build llama-cpp-python once", file=sys.stderr
        )
        return 2
    short, long, model_path, folder = prompts(args.long_tokens, args.model)
    gguf = peer_gguf(model_path, folder, args.peer_python, args.threads)
    file_info = gguf_files.describe(gguf)
    context = -(-max(len(long) + args.long_decode, len(short) + args.tokens) // 256) * 256
    spec: dict[str, object] = {
        "model": args.model,
        "context": context,
        "short_ids": short,
        "long_ids": long,
        "tokens": args.tokens,
        "long_decode": args.long_decode,
        "threads": args.threads,
        "quant": args.quant,
        "runtime": args.runtime,
        "gguf": str(gguf),
        "gguf_bytes_per_token": file_info["decode_bytes_per_token"],
    }
    label = file_label(model_path, file_info)
    print(f"machine: {llama_build.machine_line()}")
    print(f"model: Hearth {model_path}; llama.cpp {gguf}")
    print("\n".join(gguf_files.histogram_lines(file_info)))
    print(f"llama.cpp build: {worker_process.llama_build_line(args.peer_python)}")
    print(
        f"prompts: {len(short)} and {len(long)} tokens; {args.tokens} new tokens after the short one, up to "
        f"{args.long_decode} after the long one; {args.threads} threads; plain decode (Hearth's prompt lookup off)"
    )
    if args.runtime != "torch":
        prepared = run_worker(sys.executable, "prepare", spec, args.peer_python)
        if prepared["packed"]:
            print(f"packed the weights through torch first ({prepared['packed']})")
    runs: dict[str, list[dict[str, object]]] = {"hearth": [], "llama": [], "bandwidth": []}
    pythons = {"hearth": sys.executable, "llama": args.peer_python, "bandwidth": sys.executable}
    for trial in range(args.trials):
        order = ["hearth", "llama", "bandwidth"] if trial % 2 == 0 else ["llama", "hearth", "bandwidth"]
        for kind in order:
            runs[kind].append(run_worker(pythons[kind], kind, spec, args.peer_python))
        h, p = runs["hearth"][-1], runs["llama"][-1]
        print(
            f"trial {trial + 1}: decode hearth {h['decode_tok_s']:.1f} / llama.cpp {p['decode_tok_s']:.1f} tok/s, "
            f"long prefill {h['long_prefill_s']:.2f} / {p['long_prefill_s']:.2f} s, "
            f"decode after it {h['long_decode_tok_s']:.1f} / {p['long_decode_tok_s']:.1f} tok/s "
            f"({h['long_generated']} / {p['long_generated']} tokens), "
            f"peak RSS {_gib(h['peak_rss'])} / {_gib(p['peak_rss'])}",
            flush=True,
        )
    report(runs, len(short), len(long), label, int(file_info["decode_bytes_per_token"]))
    return 0


def file_label(model_path: Path, file_info: dict[str, object]) -> str:
    """What the ratios compare, printed beside each: the file's format, or a folder against llama.cpp's GGUF of it."""
    if model_path.suffix.lower() == ".gguf":
        return f"{file_info['format']} file"
    return f"folder; llama.cpp on its {file_info['format']} GGUF"


def _value(run: dict[str, object], key: str) -> float:
    if key == "above_floor":
        return float(run["peak_rss"]) - float(run["floor_rss"])  # type: ignore[arg-type]
    return float(run[key])  # type: ignore[arg-type]


def _gib(value: object) -> str:
    return f"{float(value) / 2**30:.2f} GiB"  # type: ignore[arg-type]


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def report(
    runs: dict[str, list[dict[str, object]]], short_len: int, long_len: int, label: str, file_bytes: int
) -> None:
    """The table and the paired ratios. Two roofline fractions per engine: tok/s x the bytes it reads per token
    (Hearth: its own copy of the weights where it made one) / bandwidth, and tok/s x the file's own bytes per token
    (its matrices' blocks and the head) / bandwidth: the goal's measure, the same for both when both read the file."""
    bandwidth = _median([float(r["bandwidth_bytes_s"]) for r in runs["bandwidth"]])  # type: ignore[arg-type]
    hearth, peer = runs["hearth"], runs["llama"]
    print(f"\nread bandwidth (1 GiB summed, median of the trials' best): {bandwidth / 1e9:.1f} GB/s")
    print(hearth[0]["decode_path"], "-", hearth[0]["note"], f"- prompt lookup {hearth[0].get('lookup', '?')}")
    print("torch imported in Hearth's process:", "yes" if hearth[0].get("torch_imported", True) else "no")
    print(
        f"bytes read per decode token: the file's blocks {file_bytes / 2**20:.1f} MiB; Hearth "
        f"{float(hearth[0]['bytes_per_token']) / 2**20:.1f} MiB; llama.cpp "  # type: ignore[arg-type]
        f"{float(peer[0]['bytes_per_token']) / 2**20:.1f} MiB"  # type: ignore[arg-type]
    )
    header = f"{'engine':<12}{'decode tok/s':>14}{'(cpu-time)':>12}{'prefill ' + str(short_len):>14}"
    print(
        header + f"{'prefill ' + str(long_len):>16}{'decode after':>14}{'roofline':>10}{'of file':>9}{'peak RSS':>12}"
        f"{'RSS after':>12}{'floor':>10}{'peak - floor':>14}"
    )
    for name, rows in (("hearth", hearth), ("llama.cpp", peer)):
        decode = _median([float(r["decode_tok_s"]) for r in rows])  # type: ignore[arg-type]
        cpu = _median([float(r["decode_cpu_tok_s"]) for r in rows])  # type: ignore[arg-type]
        short = _median([float(r["short_prefill_s"]) for r in rows])  # type: ignore[arg-type]
        long = _median([float(r["long_prefill_s"]) for r in rows])  # type: ignore[arg-type]
        after_long = _median([float(r["long_decode_tok_s"]) for r in rows])  # type: ignore[arg-type]
        roof = decode * float(rows[0]["bytes_per_token"]) / bandwidth  # type: ignore[arg-type]
        peak = _median([float(r["peak_rss"]) for r in rows])  # type: ignore[arg-type]
        after = _median([float(r["rss"]) for r in rows])  # type: ignore[arg-type]
        floor = _median([float(r["floor_rss"]) for r in rows])  # type: ignore[arg-type]
        line = f"{name:<12}{decode:>14.1f}{cpu:>12.1f}{short:>13.2f}s{long:>15.2f}s{after_long:>14.1f}{roof:>10.0%}"
        line += f"{decode * file_bytes / bandwidth:>9.0%}"
        print(f"{line}{_gib(peak):>12}{_gib(after):>12}{_gib(floor):>10}{_gib(peak - floor):>14}")
    for key, name, higher_is_better in (
        ("decode_tok_s", "decode", True),
        ("decode_cpu_tok_s", "decode (cpu-time)", True),
        ("short_prefill_s", "short prefill speed", False),
        ("long_prefill_s", "long prefill speed", False),
        ("long_decode_tok_s", f"decode after the {long_len}-token prompt", True),
        ("peak_rss", "peak RSS (memory; below 1 is less)", True),
        ("above_floor", "peak RSS above the runtime floor (the model's memory; below 1 is less)", True),
    ):
        ratios = []
        for h, p in zip(hearth, peer, strict=True):
            a, b = _value(h, key), _value(p, key)
            ratios.append(a / b if higher_is_better else b / a)
        shown = " ".join(f"{r:.2f}" for r in ratios)
        print(f"hearth / llama.cpp [{label}], {name}: median {_median(ratios):.2f}x  [{shown}]")


if __name__ == "__main__":
    raise SystemExit(main())
