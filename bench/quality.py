"""Quantization quality of Hearth and llama.cpp on one GGUF: perplexity and KL divergence against an fp32 reference.

    python bench/quality.py [FILE.gguf] [--tokens 1024] [--text /usr/share/common-licenses/GPL-3]
    make bench-quality MODEL=FILE.gguf     # builds llama-cpp-python once (as `make bench-peer`), then runs this

A fixed real text (default: the first 1,024 tokens of the GPL-3 licence text that Debian ships; any --text file) is
run through three engines, each in its own fresh process, every position's next-token logits kept:
- reference: an fp32 forward of the Llama architecture in torch from the file's own blocks, each tensor dequantized
  exactly by `gguf.quants.dequantize` (so the reference has the file's quantization error and nothing else: what an
  engine adds on top is its own activation rounding and arithmetic);
- llama.cpp: the file through llama-cpp-python (logits_all; the text in one batched evaluation, as llama-perplexity
  runs it), flash attention on as bench/peer.py runs it;
- Hearth: the torch-free runtime, the first token prefilled, then the text teacher-forced token by token through
  `step` (the decode path's numerics). `open_hearth` is the one place that opens the file.
Printed per engine: perplexity of the text, mean KL divergence KL(reference || engine) per position (as
llama-perplexity --kl-divergence reports it), its 99th percentile and maximum, and top-1 agreement with the
reference; with the file's format and type histogram and the machine (CPU model and SIMD flags).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import gguf_files, llama_build, worker_process  # noqa: E402

DEFAULT_TEXT = Path("/usr/share/common-licenses/GPL-3")
DEFAULT_PEER_PYTHON = ROOT / ".cache" / "peer-venv" / "bin" / "python"
ROWS_PER_CHUNK = 128  # logits rows compared at once (float64 softmax of [rows, vocab])

Floats = npt.NDArray[np.float32]


# -- the fp32 reference from the file's own blocks ------------------------------------------------------------------
class GGUFLlama:
    """A Llama-architecture GGUF dequantized to fp32 torch tensors (gguf.quants.dequantize, the exact values of the
    file's blocks), and its forward over a whole sequence. Q and K are kept as the file stores them (rows permuted by
    convert_hf_to_gguf.py for ggml's rope on adjacent pairs), so the rope here rotates adjacent pairs too; a
    rope_freqs tensor (llama3 scaling) divides the frequencies as ggml does."""

    def __init__(self, path: Path) -> None:
        import gguf
        import torch

        reader = gguf.GGUFReader(str(path))
        arch = str(reader.get_field("general.architecture").contents())  # type: ignore[union-attr]
        if arch != "llama":
            raise SystemExit(f"quality: the reference forward runs the llama architecture; {path} is {arch!r}")

        def meta(key: str, default: Any = None) -> Any:
            field = reader.get_field(f"{arch}.{key}")
            return field.contents() if field is not None else default

        self.layers = int(meta("block_count"))
        self.hidden = int(meta("embedding_length"))
        self.heads = int(meta("attention.head_count"))
        self.kv_heads = int(meta("attention.head_count_kv", self.heads))
        self.head_dim = int(meta("attention.key_length", self.hidden // self.heads))
        self.eps = float(meta("attention.layer_norm_rms_epsilon"))
        self.rope_base = float(meta("rope.freq_base", 10000.0))
        self.rope_dims = int(meta("rope.dimension_count", self.head_dim))
        self.weights: dict[str, torch.Tensor] = {}
        for tensor in reader.tensors:
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
            shape = tuple(int(n) for n in reversed(tensor.shape))  # ggml's ne is innermost first
            values = np.require(values, np.float32, ["C", "W"])  # F32 tensors come back as read-only file views
            self.weights[str(tensor.name)] = torch.from_numpy(values).reshape(shape)
        self.head = self.weights.get("output.weight", self.weights["token_embd.weight"])

    def _norm(self, x: Any, weight: Any) -> Any:
        import torch

        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * weight

    def _rope(self, x: Any, positions: Any) -> Any:
        """x [tokens, heads, head_dim] rotated on adjacent pairs (ggml's rope for llama) over rope_dims."""
        import torch

        dims = self.rope_dims
        inv = self.rope_base ** (-torch.arange(0, dims, 2, dtype=torch.float64) / dims)
        factors = self.weights.get("rope_freqs.weight")
        if factors is not None:
            inv = inv / factors.double()
        angles = positions.double()[:, None] * inv[None, :]
        cos, sin = angles.cos().float()[:, None, :], angles.sin().float()[:, None, :]
        rotated, rest = x[..., :dims], x[..., dims:]
        even, odd = rotated[..., 0::2], rotated[..., 1::2]
        turned = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)
        return torch.cat((turned, rest), dim=-1)

    def logits(self, ids: list[int]) -> Floats:
        """Every position's next-token logits [len(ids), vocab], fp32, causal attention over the whole sequence."""
        import torch

        w = self.weights
        count = len(ids)
        positions = torch.arange(count)
        mask = torch.full((count, count), float("-inf")).triu(1)
        group = self.heads // self.kv_heads
        with torch.no_grad():
            x = w["token_embd.weight"][torch.tensor(ids)]
            for index in range(self.layers):
                p = f"blk.{index}."
                h = self._norm(x, w[p + "attn_norm.weight"])
                q = (h @ w[p + "attn_q.weight"].T).view(count, self.heads, self.head_dim)
                k = (h @ w[p + "attn_k.weight"].T).view(count, self.kv_heads, self.head_dim)
                v = (h @ w[p + "attn_v.weight"].T).view(count, self.kv_heads, self.head_dim)
                q, k = self._rope(q, positions), self._rope(k, positions)
                k = k.repeat_interleave(group, dim=1)
                v = v.repeat_interleave(group, dim=1)
                scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(self.head_dim) + mask
                attended = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(count, -1)
                x = x + attended @ w[p + "attn_output.weight"].T
                h = self._norm(x, w[p + "ffn_norm.weight"])
                gate = torch.nn.functional.silu(h @ w[p + "ffn_gate.weight"].T)
                x = x + (gate * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
            x = self._norm(x, w["output_norm.weight"])
            return (x @ self.head.T).numpy()


# -- Hearth ------------------------------------------------------------------------------------------------------
def open_hearth(path: Path, threads: int) -> tuple[Any, str]:
    """Hearth's torch-free runtime on the GGUF file, computing on the file's own blocks (app.core.engines.lite.
    gguf_model): a model with new_cache(), prefill(ids, cache), step(token, cache) and forward(ids, cache, rows), and
    a line saying how it runs."""
    from app.core.engines.lite.gguf_model import open_gguf_model

    model = open_gguf_model(path, threads=threads)
    return model, f"{model.path_name}: {model.describe()}"


def teacher_forced_logits(model: Any, ids: list[int]) -> Floats:
    """Every position's logits as the decode step computes them: in one forward over the text where the runtime has
    one (it computes each token as a decode step does, bit for bit), else the first token prefilled and each next
    token one step."""
    cache = model.new_cache()
    if hasattr(model, "forward"):
        return np.asarray(model.forward(ids, cache, len(ids)), dtype=np.float32)
    rows = [np.asarray(model.prefill(ids[:1], cache), dtype=np.float32)]
    for token in ids[1:]:
        rows.append(np.asarray(model.step(token, cache), dtype=np.float32))
    return np.stack(rows)


# -- workers (each in its own fresh process; logits go to an .npy file) ------------------------------------------
def worker_reference(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(int(spec["threads"]))
    started = time.perf_counter()
    logits = GGUFLlama(Path(spec["gguf"])).logits(list(spec["ids"]))
    np.save(spec["out"], logits)
    return {"seconds": time.perf_counter() - started, "note": "fp32 torch forward of the dequantized blocks"}


def worker_hearth(spec: dict[str, Any]) -> dict[str, Any]:
    model, note = open_hearth(Path(spec["gguf"]), int(spec["threads"]))
    started = time.perf_counter()
    np.save(spec["out"], teacher_forced_logits(model, list(spec["ids"])))
    how = "every position in one forward, as decode steps compute them"
    if not hasattr(model, "forward"):
        how = "teacher-forced through step"
    return {"seconds": time.perf_counter() - started, "note": f"{note}; {how}"}


def worker_llama(spec: dict[str, Any]) -> dict[str, Any]:
    from llama_cpp import Llama

    ids = list(spec["ids"])
    llm = Llama(
        model_path=str(spec["gguf"]),
        n_ctx=-(-len(ids) // 256) * 256,
        n_batch=512,
        n_threads=int(spec["threads"]),
        n_threads_batch=int(spec["threads"]),
        logits_all=True,
        flash_attn=True,
        verbose=False,
    )
    started = time.perf_counter()
    llm.eval(ids)
    np.save(spec["out"], np.asarray(llm.scores[: len(ids)], dtype=np.float32))
    return {"seconds": time.perf_counter() - started, "note": "one batched evaluation, flash attention on"}


WORKERS = {"reference": worker_reference, "hearth": worker_hearth, "llama": worker_llama}


# -- comparison --------------------------------------------------------------------------------------------------
def _log_softmax(rows: npt.NDArray[Any]) -> npt.NDArray[np.float64]:
    rows = rows.astype(np.float64)
    rows -= rows.max(axis=1, keepdims=True)
    return rows - np.log(np.exp(rows).sum(axis=1, keepdims=True))


def compare(reference: npt.NDArray[Any], engine: npt.NDArray[Any], ids: list[int]) -> dict[str, float]:
    """Perplexity of the text under `engine` (positions 0..n-2 predicting ids 1..n-1), KL(reference || engine) per
    position (mean, 99th percentile, max) and top-1 agreement with the reference."""
    targets = np.asarray(ids[1:])
    count = len(targets)
    nll = np.empty(count)
    kl = np.empty(count)
    same = np.empty(count, dtype=bool)
    for start in range(0, count, ROWS_PER_CHUNK):
        stop = min(count, start + ROWS_PER_CHUNK)
        ref = _log_softmax(np.asarray(reference[start:stop]))
        got = _log_softmax(np.asarray(engine[start:stop]))
        nll[start:stop] = -got[np.arange(stop - start), targets[start:stop]]
        kl[start:stop] = (np.exp(ref) * (ref - got)).sum(axis=1)
        same[start:stop] = ref.argmax(axis=1) == got.argmax(axis=1)
    return {
        "perplexity": float(np.exp(nll.mean())),
        "kl_mean": float(kl.mean()),
        "kl_p99": float(np.percentile(kl, 99)),
        "kl_max": float(kl.max()),
        "top1": float(same.mean()),
    }


def text_ids(path: Path, text: Path, tokens: int) -> list[int]:
    """The first `tokens` token ids of the text, by the GGUF's own tokenizer (transformers reads it from the file),
    with BOS first where the file says its tokenizer adds one."""
    import gguf
    from transformers import AutoTokenizer

    if not text.is_file():
        raise SystemExit(f"quality: no text at {text}; give one with --text FILE")
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    field = gguf.GGUFReader(str(path)).get_field("tokenizer.ggml.add_bos_token")
    bos = [int(tokenizer.bos_token_id)] if field is not None and field.contents() and tokenizer.bos_token_id else []
    ids = bos + list(tokenizer(text.read_text(errors="replace"), add_special_tokens=False)["input_ids"])
    if len(ids) < tokens:
        raise SystemExit(f"quality: {text} has {len(ids)} tokens, fewer than --tokens {tokens}")
    return ids[:tokens]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", help="a GGUF file (default: the embedded default model's)")
    parser.add_argument("--worker", choices=sorted(WORKERS))
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--text", type=Path, default=DEFAULT_TEXT)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--engines", nargs="+", choices=("hearth", "llama"), default=["hearth", "llama"])
    parser.add_argument("--peer-python", default=str(DEFAULT_PEER_PYTHON), help="a Python with llama_cpp")
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(WORKERS[args.worker](json.loads(sys.stdin.read()))))
        return 0
    if "llama" in args.engines and not Path(args.peer_python).exists():
        print(
            f"quality: {args.peer_python} not found; run `make bench-peer` to build llama-cpp-python once "
            "(or --engines hearth)",
            file=sys.stderr,
        )
        return 2
    from app.core.models.model_source import default_model_gguf

    path = Path(args.model) if args.model else default_model_gguf()
    if path.suffix.lower() != ".gguf" or not path.is_file():
        print(f"quality: {path} is not a GGUF file", file=sys.stderr)
        return 2
    info = gguf_files.describe(path)
    ids = text_ids(path, args.text, args.tokens)
    print(f"machine: {llama_build.machine_line()}")
    print("\n".join(gguf_files.histogram_lines(info)))
    print(f"text: {args.text}, first {len(ids)} tokens; {args.threads} threads")
    pythons = {"reference": sys.executable, "hearth": sys.executable, "llama": args.peer_python}
    if "llama" in args.engines:
        print(f"llama.cpp: {worker_process.llama_build_line(args.peer_python)}")
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="hearth-quality-") as scratch:
        logits: dict[str, Path] = {}
        for kind in ["reference", *sorted(args.engines, key=["llama", "hearth"].index)]:
            out = Path(scratch) / f"{kind}.npy"
            spec = {"gguf": str(path), "ids": ids, "threads": args.threads, "out": str(out)}
            print(f"running {kind} ...", flush=True)
            results[kind] = worker_process.run_worker(pythons[kind], Path(__file__), kind, spec, args.peer_python)
            logits[kind] = out
            print(f"  {results[kind]['note']} ({results[kind]['seconds']:.1f} s)", flush=True)
        reference = np.load(logits["reference"], mmap_mode="r")
        scores = {"reference": compare(reference, reference, ids)}
        for kind in args.engines:
            scores[kind] = compare(reference, np.load(logits[kind], mmap_mode="r"), ids)
    names = {"reference": "fp32 reference", "hearth": "Hearth", "llama": "llama.cpp"}
    print(f"\n{info['format']} ({path.name}), {len(ids)} tokens of {args.text.name}")
    print(f"{'engine':<16}{'perplexity':>12}{'mean KL':>12}{'KL p99':>10}{'KL max':>10}{'top-1 same':>12}")
    for kind, row in scores.items():
        print(
            f"{names[kind]:<16}{row['perplexity']:>12.4f}{row['kl_mean']:>12.6f}{row['kl_p99']:>10.4f}"
            f"{row['kl_max']:>10.4f}{row['top1']:>12.2%}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
