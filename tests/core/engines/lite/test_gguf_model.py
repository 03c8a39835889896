"""The torch-free runtime on a GGUF file's own blocks (app.core.engines.lite.gguf_model): real GGUF files written in
the test run (llama.cpp's layout, by the `gguf` package) in every format the kernel takes, checked against a float64
forward of the same file's dequantized tensors and against transformers on the model the file was written from.

Bound: activations are quantized per 32 values (by default 15 bits into attention and the head and 8 into the MLP;
all 15 or all 8 where asked) and the cache is bf16, so logits differ from the exact forward by some tenths of a
percent of their largest value at 15 bits (measured 0.2-1.4 % on the default model's files), a few percent at 8
(1-7 %) and in between for the default: 2 %, 6 % and 4 % bound them, and the greedy token must agree where the
reference's top two are not a near tie.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.core.engines.backend import LoadRequest
from app.core.engines.kv_pool import MAX_POOLED
from app.core.engines.lite import gguf_model
from app.core.engines.lite.backend import LiteBackend, lite_candidate, lite_plan
from app.core.engines.lite.gguf_model import PRECISE_ALL, PRECISE_INPUTS, GGUFModel, open_gguf_model
from app.core.engines.lite.gguf_plan import file_type_label, gguf_support, resident_weight_bytes
from app.core.engines.lite.runtime import LiteUnavailable
from app.core.fastpath import blocks, kernel, prefetch
from app.core.fastpath.huge_pages import arena_bytes, arena_on_huge_pages
from app.core.models.gguf_meta import read_gguf_header
from app.core.models.model_source import default_model_gguf
from app.core.storage.paths import cache_dir
from tests.helpers.fresh_process import run_fresh
from tests.helpers.gguf_files import LLAMA_SHAPE, byte_level_bpe, llama_permute, random_blocks, write_gguf
from tests.helpers.gguf_reference import ReferenceModel

BOUND = 0.02
BOUND_MIXED = 0.04
BOUND_INT8 = 0.06
SHAPE = {**LLAMA_SHAPE, "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4}
IDS = [5, 17, 99, 3, 250, 8, 41, 77, 12, 300, 6, 2, 150, 33]


def run_python(script: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`script` in a fresh Python process from the repository's root; it must succeed."""
    result = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300, check=False,
        cwd=Path(__file__).resolve().parents[4], env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def tiny_tensors(
    matrix: int,
    *,
    embedding: int | None = None,
    head: int | None = None,
    v_down: int | None = None,
    seed: int = 0,
    vocab_size: int = 400,
) -> tuple[dict[str, tuple[np.ndarray, int]], int]:
    """A 2-layer llama's tensors in GGUF names: matrices of type `matrix` (attn_v/ffn_down `v_down`, as Q4_K_M
    mixes them), norms F32, the embedding `embedding` (tied unless `head` is given), byte_level_bpe(vocab_size)'s
    vocabulary (400: 404 tokens)."""
    spec = byte_level_bpe(vocab_size)
    vocab, hidden, inter = len(spec.tokens), SHAPE["hidden_size"], SHAPE["intermediate_size"]
    hd = hidden // SHAPE["num_attention_heads"]
    kv = SHAPE["num_key_value_heads"] * hd
    rng = np.random.default_rng(seed)
    counter = iter(range(seed * 100, seed * 100 + 100))

    def matrix_of(kind: int, rows: int, cols: int) -> tuple[np.ndarray, int]:
        if kind in (blocks.F32, blocks.F16):
            return (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32), kind
        return random_blocks(kind, rows, cols, seed=next(counter), scale=0.05), kind

    tensors = {
        "token_embd.weight": matrix_of(embedding if embedding is not None else matrix, vocab, hidden),
        "output_norm.weight": ((1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32), blocks.F32),
    }
    if head is not None:
        tensors["output.weight"] = matrix_of(head, vocab, hidden)
    for index in range(SHAPE["num_hidden_layers"]):
        p = f"blk.{index}."
        tensors[p + "attn_norm.weight"] = ((1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32), blocks.F32)
        tensors[p + "ffn_norm.weight"] = ((1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32), blocks.F32)
        tensors[p + "attn_q.weight"] = matrix_of(matrix, hidden, hidden)
        tensors[p + "attn_k.weight"] = matrix_of(matrix, kv, hidden)
        tensors[p + "attn_v.weight"] = matrix_of(v_down or matrix, kv, hidden)
        tensors[p + "attn_output.weight"] = matrix_of(matrix, hidden, hidden)
        tensors[p + "ffn_gate.weight"] = matrix_of(matrix, inter, hidden)
        tensors[p + "ffn_up.weight"] = matrix_of(matrix, inter, hidden)
        tensors[p + "ffn_down.weight"] = matrix_of(v_down or matrix, hidden, inter)
    return tensors, vocab


def tiny_gguf(path: Path, matrix: int, vocab_size: int = 400, **kinds: Any) -> Path:
    tensors, _ = tiny_tensors(matrix, vocab_size=vocab_size, **kinds)
    return write_gguf(path, byte_level_bpe(vocab_size), tensors, shape=SHAPE)


def runtime_logits(model: GGUFModel, ids: list[int], prefilled: int) -> list[np.ndarray]:
    """The logits after ids[:prefilled] (one prefill), then after each following token (decode steps)."""
    cache = model.new_cache()
    logits = [model.prefill(ids[:prefilled], cache)]
    logits += [model.step(token, cache) for token in ids[prefilled:-1]]
    return logits


def assert_agrees(model: GGUFModel, reference: np.ndarray, ids: list[int], prefilled: int = 6) -> None:
    bound = {PRECISE_ALL: BOUND, PRECISE_INPUTS: BOUND_MIXED}.get(model.precise, BOUND_INT8)
    for offset, logits in enumerate(runtime_logits(model, ids, prefilled)):
        position = prefilled - 1 + offset
        expected = reference[position]
        assert relative_error(logits, expected) < bound, f"position {position}"
        top_two = np.sort(expected)[-2:]
        if top_two[1] - top_two[0] > 0.02 * np.abs(expected).max():
            assert logits.argmax() == expected.argmax(), f"position {position}"


MIXES = {
    "Q4_0": {"matrix": blocks.Q4_0},
    "Q5_0 (llama.cpp's Q4_K_M at widths K-quants can't take)": {"matrix": blocks.Q5_0, "v_down": blocks.Q8_0},
    "Q5_1": {"matrix": blocks.Q5_1, "embedding": blocks.Q8_0},
    "Q4_1": {"matrix": blocks.Q4_1, "embedding": blocks.Q8_0},
    "Q8_0": {"matrix": blocks.Q8_0},
    "Q4_K_M": {"matrix": blocks.Q4_K, "v_down": blocks.Q6_K, "embedding": blocks.Q6_K},
    "Q5_K_M": {"matrix": blocks.Q5_K, "v_down": blocks.Q6_K, "embedding": blocks.Q6_K},
    "Q6_K": {"matrix": blocks.Q6_K},
    "F16 untied": {"matrix": blocks.F16, "embedding": blocks.F32, "head": blocks.F16},
    "Q4_K untied Q6_K head": {"matrix": blocks.Q4_K, "embedding": blocks.Q4_K, "head": blocks.Q6_K},
    # tied K-quant embeddings: where the kernel lays the head out 16 rows at a time, the embedding reads from it
    "Q4_K tied": {"matrix": blocks.Q4_K, "embedding": blocks.Q4_K},
    "Q5_K tied": {"matrix": blocks.Q5_K, "embedding": blocks.Q5_K},
}


@pytest.mark.parametrize("mix", list(MIXES))
def test_each_format_runs_on_its_own_blocks_as_the_exact_forward(mix: str, tmp_path: Path) -> None:
    path = tiny_gguf(tmp_path / "tiny.gguf", **MIXES[mix])
    reference = ReferenceModel(path).logits(IDS)
    for precise in (PRECISE_ALL, PRECISE_INPUTS, 0):
        model = open_gguf_model(path, precise=precise)
        try:
            assert_agrees(model, reference, IDS)
        finally:
            model.close()


def hf_tiny(architecture: str, seed: int = 0) -> tuple[Any, dict[str, Any]]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    shape = {
        "vocab_size": len(byte_level_bpe(400).tokens),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": architecture == "llama",
    }
    config = AutoConfig.for_model(architecture, **shape)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # norms away from 1, biases away from 0, so getting them wrong shows
        for name, parameter in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                parameter.add_(0.2 * torch.randn_like(parameter))
    return model, shape


def hf_to_gguf(model: Any, shape: dict[str, Any], architecture: str) -> dict[str, tuple[np.ndarray, int]]:
    """What llama.cpp's converter writes for the model: its names, llama's Q/K rows interleaved (qwen2's kept)."""
    names = {
        "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    }  # fmt: skip
    tensors: dict[str, tuple[np.ndarray, int]] = {}
    for name, value in model.state_dict().items():
        array = value.float().numpy()
        if name == "model.embed_tokens.weight":
            tensors["token_embd.weight"] = (array, blocks.F32)
        elif name == "model.norm.weight":
            tensors["output_norm.weight"] = (array, blocks.F32)
        elif name == "lm_head.weight":
            if not shape["tie_word_embeddings"]:
                tensors["output.weight"] = (array, blocks.F32)
        else:
            layer, rest = name[len("model.layers.") :].split(".", 1)
            module, kind = rest.rsplit(".", 1)
            if architecture == "llama" and module in ("self_attn.q_proj", "self_attn.k_proj"):
                heads = shape["num_attention_heads"] if "q_proj" in module else shape["num_key_value_heads"]
                array = llama_permute(array, heads)
            tensors[f"blk.{layer}.{names[module]}.{kind}"] = (array, blocks.F32)
    return tensors


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
def test_a_file_converted_from_transformers_gives_transformers_logits(architecture: str, tmp_path: Path) -> None:
    """llama's Q/K rows as llama.cpp interleaves them run with RoPE on pairs, qwen2's (kept, with biases) on halves:
    the same logits as transformers on the model the file came from."""
    import torch

    model, shape = hf_tiny(architecture)
    path = write_gguf(
        tmp_path / f"{architecture}.gguf", byte_level_bpe(400), hf_to_gguf(model, shape, architecture),
        arch=architecture, shape=shape,
    )  # fmt: skip
    with torch.no_grad():
        expected = model(torch.tensor([IDS])).logits[0].numpy()
    runtime = open_gguf_model(path)
    try:
        assert runtime.rope_pairs == (architecture == "llama")
        assert_agrees(runtime, expected, IDS)
    finally:
        runtime.close()


def test_llama3_rope_factors_are_read_from_the_file(tmp_path: Path) -> None:
    tensors, _ = tiny_tensors(blocks.Q8_0)
    half = SHAPE["hidden_size"] // SHAPE["num_attention_heads"] // 2
    factors = np.linspace(1, 8, half, dtype=np.float32)
    tensors["rope_freqs.weight"] = (factors, blocks.F32)
    path = write_gguf(tmp_path / "llama3.gguf", byte_level_bpe(400), tensors, shape=SHAPE)
    model = open_gguf_model(path)
    try:
        plain = np.float32(1.0) / np.float32(SHAPE["rope_theta"]) ** (np.arange(0, 2 * half, 2) / (2 * half))
        assert np.allclose(model.config.inv_freq, plain / factors, rtol=1e-6)
        assert_agrees(model, ReferenceModel(path).logits(IDS), IDS)
    finally:
        model.close()


@pytest.mark.parametrize("mix", ["Q4_K_M", "Q5_0 (llama.cpp's Q4_K_M at widths K-quants can't take)", "F16 untied"])
def test_a_prompt_gives_the_same_bits_in_one_prefill_in_pieces_or_token_by_token(mix: str, tmp_path: Path) -> None:
    """Every token is computed as a decode step computes it (row-invariant products, attention in fixed chunks of
    positions, the same C code): a reused prefix, a chunked prefill and plain decoding give the same logits."""
    model = open_gguf_model(tiny_gguf(tmp_path / "tiny.gguf", **MIXES[mix]))
    try:
        whole = model.prefill(IDS, model.new_cache())  # its cache freed at once: a new one may get its id()
        in_pieces = []
        for cuts in ((5, 9), (2, 5, 11)):  # pieces run in tiles of 4 inputs, then one tile of 1, 2 or 3
            pieces = model.new_cache()
            for start, end in zip((0, *cuts), (*cuts, len(IDS)), strict=True):
                last = model.prefill(IDS[start:end], pieces)
            in_pieces.append(last)
        stepped = model.new_cache()
        model.prefill(IDS[:1], stepped)
        for token in IDS[1:]:
            by_steps = model.step(token, stepped)
        every = model.forward(IDS, model.new_cache(), len(IDS))
        assert all(np.array_equal(whole, last) for last in in_pieces)
        assert np.array_equal(whole, by_steps) and np.array_equal(whole, every[-1])
        for position in (0, 6):  # every position's logits are what a prefill up to it gives
            assert np.array_equal(every[position], model.prefill(IDS[: position + 1], model.new_cache()))
    finally:
        model.close()


def test_tokens_outside_the_vocabulary_are_refused_with_their_id(tmp_path: Path) -> None:
    model = open_gguf_model(tiny_gguf(tmp_path / "tiny.gguf", blocks.Q8_0))
    try:
        cache = model.new_cache()
        with pytest.raises(ValueError, match="token id 5000 is outside the model's 404-token vocabulary"):
            model.step(5000, cache)
        with pytest.raises(ValueError, match="token id -1 is outside"):
            model.prefill([3, -1], cache)
        assert cache.length == 0  # nothing ran
    finally:
        model.close()


def test_the_default_model_runs_from_its_shipped_file() -> None:
    path = default_model_gguf()
    model = open_gguf_model(path)
    try:
        ids = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 2, 198, 1, 4093, 198]
        assert_agrees(model, ReferenceModel(path).logits(ids), ids, prefilled=10)
        assert "Q4_1 x210; head Q8_0" in model.describe()
        assert model.weight_bytes == resident_weight_bytes(model.header)  # tied: the whole file's tensors
        if model.arena is not None and model.arena.huge:  # 92 MiB of layouts: on 2 MiB pages, measured
            assert model.huge_page_bytes > 0 and "rows 16 at a time on 2 MiB pages" in model.describe()
    finally:
        model.close()


def test_a_model_s_layouts_on_4_kib_pages_say_so_where_the_system_turned_huge_pages_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.core.fastpath import huge_pages

    setting = tmp_path / "enabled"
    setting.write_text("always madvise [never]\n", encoding="ascii")
    monkeypatch.setattr(huge_pages, "THP_SETTING", setting)
    model = open_gguf_model(tiny_gguf(tmp_path / "tiny.gguf", blocks.Q4_K))
    try:
        if model.arena is None:
            pytest.skip("this kernel build lays out no matrices (no AVX2)")
        assert not model.arena.huge and model.huge_page_bytes == 0
        assert "rows 16 at a time on 4 KiB pages (the system's transparent huge pages are off)" in model.describe()
        setting.write_text("always [madvise] never\n", encoding="ascii")  # on, but the tiny model fills no 2 MiB
        assert "rows 16 at a time), " in model.describe()
    finally:
        model.close()


def write_with(tmp_path: Path, name: str, **changes: Any) -> Path:
    tensors, _ = tiny_tensors(blocks.Q8_0)
    shape = {**SHAPE, **changes.pop("shape", {})}
    for tensor, value in changes.pop("tensors", {}).items():
        if value is None:
            tensors.pop(tensor)
        else:
            tensors[tensor] = value
    return write_gguf(tmp_path / name, byte_level_bpe(400), tensors, shape=shape, **changes)


def test_what_the_runtime_does_not_take_is_named(tmp_path: Path) -> None:
    import gguf

    assert gguf_support(write_with(tmp_path, "ok.gguf")) == ""
    gemma = write_with(tmp_path, "gemma.gguf", arch="gemma3")
    assert "not 'gemma3'" in gguf_support(gemma)
    q2_k = int(gguf.GGMLQuantizationType.Q2_K)  # 84 bytes per 256 values
    odd = write_with(tmp_path, "q2.gguf", tensors={"blk.1.ffn_up.weight": (np.zeros((512, 84), np.uint8), q2_k)})
    assert gguf_support(odd).startswith("tensor blk.1.ffn_up.weight is Q2_K, a type the kernel does not compute on")
    missing = write_with(tmp_path, "missing.gguf", tensors={"blk.0.ffn_gate.weight": None})
    with pytest.raises(LiteUnavailable, match=r"the file has no tensor blk\.0\.ffn_gate\.weight"):
        open_gguf_model(missing)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("block_count", 1_000_000_000, r"block_count is 1000000000, outside 1\.\.1024"),
        ("embedding_length", 10**7, r"embedding_length is 10000000, outside 32\.\.262144"),
        ("attention.head_count_kv", 3, r"4 query heads do not divide into 3 key/value heads"),
        ("rope.freq_base", float("nan"), r"rope\.freq_base is nan, not a positive number"),
    ],
)
def test_a_hostile_header_is_refused_before_anything_is_sized_from_it(
    key: str, value: Any, message: str, tmp_path: Path
) -> None:
    path = write_with(tmp_path, "hostile.gguf")
    header = read_gguf_header(path)
    forged = type(header)({**header.metadata, f"llama.{key}": value}, header.tensor_names, header.tensors, 0)
    from app.core.engines.lite.gguf_plan import gguf_config

    with pytest.raises(LiteUnavailable, match=message):
        gguf_config(forged)


def test_a_cut_short_file_is_named_before_its_tensors_are_read(tmp_path: Path) -> None:
    path = write_with(tmp_path, "cut.gguf")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    with pytest.raises(LiteUnavailable, match=r"cut\.gguf is an incomplete GGUF file"):
        open_gguf_model(path)
    assert "incomplete GGUF file" in gguf_support(path)


def test_the_plan_says_what_serving_the_file_would_take(tmp_path: Path) -> None:
    """Before loading: served replies decode together, up to the backend's own batch, within a quarter of the memory
    stated free (what LiteBackend reserves from the memory free at load)."""
    path = tiny_gguf(tmp_path / "plain.gguf", blocks.Q4_K)
    plan = lite_plan(LoadRequest(model=str(path), quantization="auto", device="cpu"), free_bytes=8 << 30)
    assert not isinstance(plan, str)
    assert plan.served_together == MAX_POOLED and plan.served_kv_budget_bytes == 2 << 30
    from app.core.engines.opening import open_backend

    backend = open_backend(LoadRequest(model=str(path), quantization="auto", device="cpu", response_cache=False))
    try:
        assert isinstance(backend, LiteBackend) and backend.max_batch == plan.served_together
        assert backend.info.served_together == plan.served_together
    finally:
        backend.close()


def test_a_load_writes_nothing_but_a_small_tokenizer_file_and_plans_the_files_bytes(
    isolated_cache: Path, tmp_path: Path
) -> None:
    path = tiny_gguf(tmp_path / "plain.gguf", blocks.Q4_K, v_down=blocks.Q6_K, embedding=blocks.Q6_K)
    request = LoadRequest(model=str(path), quantization="auto", device="cpu")
    candidate = lite_candidate(request)
    assert not isinstance(candidate, str) and candidate.gguf == path
    plan = lite_plan(request)
    assert not isinstance(plan, str)
    header = read_gguf_header(path)
    model = open_gguf_model(path)
    try:  # tied: every tensor, to the byte; a matrix in a 16-row layout counts that layout, as the load holds it
        laid_out = [m for layer in model.layers for m in layer.values() if m.kind >= blocks.X16] + [model.head]
        files_bytes = {m.name: m.data.nbytes for m in laid_out if m.kind >= blocks.X16}
        in_file = {t.name: blocks.row_bytes(t.kind, t.dims[0]) * (t.elements // t.dims[0]) for t in header.tensors}
        sizes = list(files_bytes.values())
        expected = sum(size for name, size in in_file.items() if name not in files_bytes)
        expected += arena_bytes(sizes, arena_on_huge_pages(sizes))  # the layouts' arena, as the load holds it
        assert model.layout_bytes == sum(sizes)
        assert model.arena is not None and model.arena.nbytes == arena_bytes(sizes, model.arena.huge)
    finally:
        model.close()
    assert plan.weights_bytes == expected
    assert plan.quantization == file_type_label(header)
    from app.core.engines.opening import open_backend

    backend = open_backend(request)
    try:
        assert backend.info.quantization == plan.quantization
        # the prompt cache's digest of the file is written by a thread of its own: listed once it is there (listed
        # while it was written, its temporary file showed or not by timing)
        assert isinstance(backend, LiteBackend)
        deadline = time.monotonic() + 60
        while backend.engine.prefixes is None and time.monotonic() < deadline:
            time.sleep(0.02)
        # besides the compiled kernel and the response cache's database: the tokenizer's JSON and settings and the
        # prompt cache's record of the file's sha256, nothing else
        written = [
            p for p in isolated_cache.rglob("*") if p.is_file() and "native" not in p.parts and "sqlite" not in p.name
        ]
        assert sorted((p.parent.name, p.name if p.parent.name == "prompt-cache" else p.suffix) for p in written) == [
            ("gguf-tokenizers", ".json"),
            ("gguf-tokenizers", ".settings"),
            ("prompt-cache", "weights.json"),
        ], written
        assert sum(p.stat().st_size for p in written) < 0.05 * path.stat().st_size
    finally:
        backend.close()


def test_a_reply_from_the_default_gguf_never_imports_torch(tmp_path: Path) -> None:
    """The whole load path of the window and the command line, in a fresh process, on the shipped file: the runtime
    on its blocks answers, and torch was never imported. (What it answers is checked against the exact forward
    above: the default model's first token here is a near tie, 0.4 % of the logits apart.)"""
    script = (
        "import json, sys, threading\n"
        "from app.core.engines.backend import LoadRequest, ReplyRequest\n"
        "from app.core.engines.opening import open_backend\n"
        "from app.core.chat.events import ChatMessage, DoneEvent, StatsEvent\n"
        "from app.core.chat.sampling import SamplingParams\n"
        "backend = open_backend(LoadRequest(None, device='cpu', response_cache=False))\n"
        "request = ReplyRequest([ChatMessage('user', 'What is 2 + 2?')],\n"
        "                       SamplingParams(temperature=0, max_new_tokens=12))\n"
        "events = list(backend.generate(request, threading.Event()))\n"
        "stats = next(e for e in events if isinstance(e, StatsEvent)).stats\n"
        "print(json.dumps([type(backend).__name__, stats.decode_path, backend.info.quantization, events[-1].text,\n"
        "                  events[-1].finish_reason, 'torch' in sys.modules]))\n"
    )
    result = run_python(script)
    name, path, quantization, text, finish, imported = json.loads(result.stdout.strip().splitlines()[-1])
    assert (name, path, quantization) == ("LiteBackend", "lite-gguf", "Q4_1")
    assert text.strip() and finish in ("stop", "length")
    assert imported is False


def test_long_prompts_give_the_same_bits_across_attention_chunks(tmp_path: Path) -> None:
    """Past 256 positions attention runs in chunks of positions: a prefill's tokens (up to 32 at a time on one thread,
    their whole chunks together; a last block of 27 here) and a decode step's (chunks spread over the threads) still
    give each head the same sums, merged in the same order. The prefill's products read their inputs side by side
    from tiles on the x86 builds (AVX2 and AVX-512; DotProd's `sdot` takes 4 steps of one input from its own
    buffer); the steps, one input each, from their buffers."""
    model = open_gguf_model(tiny_gguf(tmp_path / "tiny.gguf", blocks.Q4_K, v_down=blocks.Q6_K))
    try:
        ids = [int(i) for i in np.random.default_rng(7).integers(3, 400, size=500)]  # the context is 512
        tiles = model.lib.hearth_amx_calls()
        tiled = model.lib.hearth_tiled_calls()
        whole = model.prefill(ids, model.new_cache())
        cache = model.new_cache()
        model.prefill(ids[:250], cache)
        model.prefill(ids[250:469], cache)
        for token in ids[469:]:
            stepped = model.step(token, cache)
        assert np.array_equal(whole, stepped)
        assert (model.lib.hearth_amx_calls() > tiles) == bool(model.lib.hearth_amx(-1))  # prefill on AMX where it is
        x86_layout = model.lib.hearth_q4_kernel() >= 3 and model.lib.hearth_gg_x16_bytes(blocks.Q4_K, 16, 256) > 0
        assert (model.lib.hearth_tiled_calls() > tiled) == x86_layout
    finally:
        model.close()


def test_each_x86_build_this_cpu_runs_gives_the_forward_the_run_s_bits(
    tmp_path: Path, x86_kernel_builds: dict[str, Path], run_library: kernel.NativeLibrary
) -> None:
    """The AVX-512 build scores attention two K rows to a register and takes its softmax weights 16 at a time, AVX2
    one row and 8, each value's operations in the same order; the products' integer sums are exact in both. A prompt
    past an attention chunk, decode steps, a lookup check and a batched step give every SIMD build (at -O1) the bits
    of the run's own library, where every matrix has a multiple of 16 rows (as real models' do: a 384-token
    vocabulary here) and so takes the 16-row layout; the row layout's float sums run per build."""
    path = tiny_gguf(tmp_path / "tiny.gguf", blocks.Q4_K, vocab_size=380, v_down=blocks.Q6_K)
    ids = [int(i) for i in np.random.default_rng(5).integers(3, 380, size=300)]

    def logits_of(library: kernel.NativeLibrary) -> list[np.ndarray]:
        model = GGUFModel(path, library, None, PRECISE_INPUTS)
        try:
            cache, other = model.new_cache(), model.new_cache()
            found = [model.prefill(ids, cache), model.prefill(ids[:40], other)]
            found += [model.step(token, cache) for token in (5, 6)]
            found += list(model.check([7, 8, 9, 10], cache))
            return found + list(model.step_rows([11, 12], [cache, other]))
        finally:
            model.close()

    expected = logits_of(run_library)
    builds = {name: built for name, built in x86_kernel_builds.items() if name != "scalar"}  # no SIMD: not run
    assert "avx2" in builds
    for name, built in builds.items():
        library = kernel.library_from_file_for_tests(built)
        assert not isinstance(library, str), library
        assert [logits.tobytes() for logits in logits_of(library)] == [logits.tobytes() for logits in expected], name


def test_a_lookup_check_runs_on_the_steps_fastest_team_and_gives_each_row_a_step_s_bits(tmp_path: Path) -> None:
    """A prompt-lookup check (the current token and its guesses) runs on the team size the decode steps measure
    fastest and is timed by neither chooser: timed with prefill's chunks it once set off a one-thread trial, and the
    process's first check ran at twice its cost. Each row is a decode step's bits, past an attention chunk too."""
    model = open_gguf_model(tiny_gguf(tmp_path / "tiny.gguf", blocks.Q4_K, v_down=blocks.Q6_K))
    try:
        ids = [int(i) for i in np.random.default_rng(11).integers(3, 400, size=300)]
        checked, stepped = model.new_cache(), model.new_cache()
        model.prefill(ids, checked)
        model.prefill(ids, stepped)
        tokens = [5, 6, 7, 8]
        expected = np.stack([model.step(token, stepped) for token in tokens])
        teams: list[int] = []
        set_threads = model.arguments.set_threads
        model.arguments.set_threads = lambda threads: (teams.append(threads), set_threads(threads))[1]  # type: ignore[method-assign]
        timed = (dict(model.prefill_team.average), dict(model.decode_team.average))
        assert np.array_equal(model.check(tokens, checked), expected)
        assert teams == [model.decode_team.best] and checked.ids == stepped.ids
        assert (dict(model.prefill_team.average), dict(model.decode_team.average)) == timed
    finally:
        model.close()


@pytest.mark.parametrize(("prefix", "rows"), [(250, 8), (254, 2), (256, 5), (300, 8), (509, 3)])
def test_a_few_rows_across_an_attention_chunk_s_end_get_each_a_step_s_bits(
    prefix: int, rows: int, tmp_path: Path
) -> None:
    """A lookup check or a short turn: a few rows of one sequence before, across and after a chunk's end (256, 512;
    rows that see a chunk whole are scored together, one that ends inside it alone) get a decode step's bits, as a
    check and as a prefill of the same tokens."""
    model = open_gguf_model(tiny_gguf(tmp_path / "tiny.gguf", blocks.Q4_K, v_down=blocks.Q6_K))
    try:
        rng = np.random.default_rng(prefix)
        ids = [int(i) for i in rng.integers(3, 400, size=prefix)]
        tokens = [int(i) for i in rng.integers(3, 400, size=rows)]
        checked, prefilled, stepped = model.new_cache(), model.new_cache(), model.new_cache()
        for cache in (checked, prefilled, stepped):
            model.prefill(ids, cache)
        expected = np.stack([model.step(token, stepped) for token in tokens])
        assert np.array_equal(model.check(tokens, checked), expected)
        assert np.array_equal(model.prefill(tokens, prefilled), expected[-1])
        assert checked.ids == prefilled.ids == stepped.ids
    finally:
        model.close()


@pytest.mark.parametrize("rows", [2, 3, 5])
def test_a_batched_step_gives_each_sequence_the_bits_of_its_own_step(rows: int, tmp_path: Path) -> None:
    """Sequences at different positions (one past an attention chunk) and with caches of different capacities, run
    in one batched step (tiles of 4, 2 and 1 rows): each row is its own decode step, and each cache gets its token."""
    model = open_gguf_model(tiny_gguf(tmp_path / "tiny.gguf", blocks.Q4_K, v_down=blocks.Q6_K))
    try:
        rng = np.random.default_rng(rows)
        prompts = [[int(i) for i in rng.integers(3, 400, size=length)] for length in (3, 300, 1, 40, 17)[:rows]]
        alone, batched = [model.new_cache() for _ in prompts], [model.new_cache() for _ in prompts]
        for prompt, one, many in zip(prompts, alone, batched, strict=True):
            model.prefill(prompt, one)
            model.prefill(prompt, many)
        tokens = [int(i) for i in rng.integers(3, 400, size=rows)]
        for _ in range(3):
            expected = np.stack([model.step(token, cache) for token, cache in zip(tokens, alone, strict=True)])
            got = model.step_rows(tokens, batched)
            assert np.array_equal(got, expected)
            tokens = [int(row.argmax()) for row in expected]
        assert [cache.ids for cache in batched] == [cache.ids for cache in alone]
        with pytest.raises(ValueError, match="distinct caches"):
            model.step_rows([5, 6], [batched[0], batched[0]])
        with pytest.raises(ValueError, match="token id 999 is outside"):
            model.step_rows([5, 999], batched[:2])
    finally:
        model.close()


def test_prompt_chunks_and_decode_tokens_in_one_forward_give_each_sequence_its_own_bits(tmp_path: Path) -> None:
    """A server step: one reply's decode token, the middle chunk of a second's prompt (no logits wanted) and the last
    chunk of a third's, in one forward. Each sequence's logits and K/V bits are those of its own step and prefill."""
    model = open_gguf_model(tiny_gguf(tmp_path / "tiny.gguf", blocks.Q4_K, v_down=blocks.Q6_K))
    try:
        rng = np.random.default_rng(3)
        prompts = [[int(i) for i in rng.integers(3, 400, size=length)] for length in (40, 90, 300)]
        alone, together = [model.new_cache() for _ in prompts], [model.new_cache() for _ in prompts]
        model.prefill(prompts[0], alone[0])
        expected_step = model.step(7, alone[0])
        model.prefill(prompts[1], alone[1])
        expected_last = model.prefill(prompts[2], alone[2])
        model.prefill(prompts[0], together[0])
        model.prefill(prompts[1][:30], together[1])
        model.prefill(prompts[2][:280], together[2])
        logits = model.run_sequences(
            [([7], together[0], True), (prompts[1][30:], together[1], False), (prompts[2][280:], together[2], True)]
        )
        assert len(logits) == 2
        assert np.array_equal(logits[0], expected_step) and np.array_equal(logits[1], expected_last)
        for one, many in zip(alone, together, strict=True):
            assert many.ids == one.ids and many.length == one.length
            for a, b in zip(one.keys + one.values, many.keys + many.values, strict=True):
                assert np.array_equal(a[:, : one.length], b[:, : one.length])
        with pytest.raises(ValueError, match="needs a token"):
            model.run_sequences([([], together[0], True)])
    finally:
        model.close()


@pytest.mark.parametrize(("tokens", "capacity"), [(1, 512), (7, 512), (8, 512), (9, 512), (256, 8192), (64, 1 << 20)])
def test_the_plan_counts_the_forward_s_scratch_exactly(tokens: int, capacity: int, tmp_path: Path) -> None:
    from app.core.engines.lite.gguf_plan import forward_scratch_bytes

    model = open_gguf_model(tiny_gguf(tmp_path / "tiny.gguf", blocks.Q8_0))
    try:
        model.arguments.bind_kv([0] * model.config.layers, [0] * model.config.layers, capacity)
        expected = 4 * model.arguments.scratch_floats(tokens)
        assert forward_scratch_bytes(model.config, model.threads, tokens, capacity) == expected
    finally:
        model.close()


def test_the_planned_memory_is_what_a_load_and_a_long_prompt_take(tmp_path: Path) -> None:
    """The default model's file in a fresh process, a prompt past a full prefill chunk: its peak resident memory
    (mapped weights included) within 5 % of the plan's weights, overhead and the cache it holds; for the file's first
    load (which imports transformers to build the tokenizer) and for a warm one (which reads the tokenizer's copies)."""
    script = (
        "import json, sys, threading\n"
        "from app.core.engines.backend import LoadRequest, ReplyRequest\n"
        "from app.core.engines.opening import open_backend, plan_load\n"
        "from app.core.chat.events import ChatMessage\n"
        "from app.core.chat.sampling import SamplingParams\n"
        "request = LoadRequest(None, device='cpu', response_cache=False, context_length=1024)\n"
        "plan = plan_load(request)\n"
        "backend = open_backend(request)\n"
        "text = 'The river town kept its records in a stone house by the bridge. ' * 40\n"
        "list(backend.generate(ReplyRequest([ChatMessage('user', text)], SamplingParams(temperature=0,"
        " max_new_tokens=4)), threading.Event()))\n"
        "peak = next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmHWM'))\n"
        "kv = backend.memory().devices[0].kv_bytes\n"
        "print(json.dumps([peak, plan.weights_bytes + plan.overhead_bytes, kv, 'transformers' in sys.modules]))\n"
    )
    cache = tmp_path / "cache"  # the file's first load here; the kernel compiled for this run, not again
    if (cache_dir() / "native").is_dir():
        shutil.copytree(cache_dir() / "native", cache / "native")
    env = {**os.environ, "HEARTH_CACHE_DIR": str(cache)}
    for load, imports_transformers in (("first", True), ("warm", False)):
        result = run_python(script, env=env)
        peak, planned, kv, imported = json.loads(result.stdout.strip().splitlines()[-1])
        assert imported == imports_transformers, load
        assert abs((planned + kv) / peak - 1) < 0.05, (load, peak, planned, kv)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads through Linux's /proc")
def test_a_load_leaves_no_kernel_threads_behind(tmp_path: Path) -> None:
    """The layout is made on a thread that ends with the load: OpenMP keeps a pool of threads for every thread that
    ran a parallel region, and with more of them than cores every later step's barriers sleep (a model loaded on one
    thread and decoded on another, as the server does, ran 4.7x slower). So are the decode steps that measure the
    prefetch. A fresh process, so no pool exists yet."""
    path = tiny_gguf(tmp_path / "tiny.gguf", blocks.Q4_K, v_down=blocks.Q6_K)
    probe = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from app.core.engines.lite.gguf_model import open_gguf_model\n"
        "from app.core.fastpath.kernel import load_library\n"
        "from app.core.fastpath import prefetch\n"
        "prefetch.MEASURED_BYTES = 0\n"  # the prefetch's decode steps run at load too, however small the model
        "load_library()\n"
        "import time\n"
        "before = len(os.listdir('/proc/self/task'))\n"
        "model = open_gguf_model(Path(sys.argv[1]), threads=2)\n"
        "deadline = time.monotonic() + 10\n"  # the pool's threads end just after the thread that owned them
        "while len(os.listdir('/proc/self/task')) > before and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        "measured = model.prefetch is not None and model.prefetch.on_s is not None\n"
        "print(model.layout_bytes > 0, measured, before, len(os.listdir('/proc/self/task')))\n"
    )
    result = run_python(probe, str(path))
    laid_out, measured, before, after = result.stdout.split()
    if laid_out != "True":
        pytest.skip("this build has no 16-row layout: nothing multi-threaded runs at load")
    assert measured == "True"
    assert after == before


def test_rows_a_thread_never_reaches_are_taken_by_the_others_with_the_same_bits(tmp_path: Path) -> None:
    """Each thread owns a part of every matrix's rows and takes the parts of a thread that falls behind from their
    backs (claim_rows). OMP_THREAD_LIMIT=1 makes every parallel region one thread however many are asked for: a model
    fixed at 3 threads then splits its rows in 3 parts that only thread 0 ever reaches, so it must take the other two
    whole, and every logit must be the bits of a one-thread run (a row's result depends only on the row and its
    input). Rows left untaken would leave the scratch's stale values in the logits."""
    path = tiny_gguf(tmp_path / "tiny.gguf", blocks.Q4_K, v_down=blocks.Q6_K)
    probe = (
        "import sys\n"
        "from pathlib import Path\n"
        "import numpy as np\n"
        "from app.core.engines.lite.gguf_model import open_gguf_model\n"
        "model = open_gguf_model(Path(sys.argv[1]), threads=3)\n"
        "model.fix_threads(3)\n"
        "cache = model.new_cache()\n"
        f"rows = [model.prefill({IDS[:9]}, cache)] + [model.step(t, cache) for t in {IDS[9:]}]\n"
        "np.save(sys.argv[2], np.stack(rows))\n"
        "print(model.threads)\n"
    )
    saved = tmp_path / "alone.npy"
    result = run_python(probe, str(path), str(saved), env={**os.environ, "OMP_THREAD_LIMIT": "1"})
    assert result.stdout.split()[-1] == "3"  # three parts were made, for a team of one
    model = open_gguf_model(path, threads=1)
    try:
        cache = model.new_cache()
        expected = [model.prefill(IDS[:9], cache)] + [model.step(token, cache) for token in IDS[9:]]
    finally:
        model.close()
    assert np.array_equal(np.load(saved), np.stack(expected))


def test_a_second_load_of_the_file_takes_the_saved_prefetch_choice_without_timing_a_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_cache: Path
) -> None:
    """The measurement is ~0.3 s of a 1B model's warm start: the next load of the same file on the same CPU and kernel
    library sets what the first measured, and its description says when that was."""
    path = tiny_gguf(tmp_path / "tiny.gguf", **MIXES["Q4_K_M"])
    monkeypatch.setattr(prefetch, "MEASURED_BYTES", 0)
    model = open_gguf_model(path, threads=2)
    try:
        first = model.prefetch
        if first is None:
            pytest.skip("this build has no 16-row layout (NEON): nothing prefetches 16 rows")
        assert first.on_s is not None and first.measured_at is None  # measured at this load
    finally:
        model.close()
    assert (isolated_cache / prefetch.PREFETCH_FILE).is_file()

    def no_timing(*_: object) -> None:
        raise AssertionError("a saved choice was timed again")

    monkeypatch.setattr(gguf_model, "timed_choice", no_timing)
    model = open_gguf_model(path, threads=2)
    try:
        again = model.prefetch
        assert again is not None and again.measured_at is not None
        assert (again.on, again.on_s, again.off_s) == (first.on, first.on_s, first.off_s)
        assert model.lib.hearth_x16_prefetch(-1) == int(first.on)  # the kernel runs with the saved setting
        assert f"software prefetch {'on' if first.on else 'off'} (decode steps" in model.describe()
        assert ", measured 20" in model.describe()
    finally:
        model.lib.hearth_x16_prefetch(1)  # the library's setting outlives the model: back to its default
        model.close()


@pytest.mark.parametrize("mix", ["Q4_K_M", "Q4_1"])
def test_the_prefetch_is_measured_named_and_never_changes_a_bit(
    mix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 16-row products' software prefetch (app/core/fastpath/prefetch.py): a load measures it on and off and the
    runtime's description says which it kept; either way every logit is the same bits (K-quant and small-block
    layouts, which prefetch differently); HEARTH_PREFETCH fixes it, and a value that is neither on nor off is refused
    by name. A model under prefetch.MEASURED_BYTES leaves it as it is and says so."""
    path = tiny_gguf(tmp_path / "tiny.gguf", **MIXES[mix])
    monkeypatch.setattr(prefetch, "MEASURED_BYTES", 0)  # measured however small (a tiny model is not, by default)
    model = open_gguf_model(path, threads=2)
    try:
        if model.prefetch is None:
            pytest.skip("this build has no 16-row layout (NEON): nothing prefetches 16 rows")
        assert model.prefetch.on_s is not None and model.prefetch.off_s is not None  # measured
        assert f"software prefetch {'on' if model.prefetch.on else 'off'} (decode steps" in model.describe()
        logits = {}
        for setting in (1, 0):
            model.lib.hearth_x16_prefetch(setting)
            logits[setting] = np.stack(runtime_logits(model, IDS, prefilled=9))
        assert np.array_equal(logits[0], logits[1])
    finally:
        model.close()
    monkeypatch.setattr(prefetch, "MEASURED_BYTES", 256 << 20)
    model = open_gguf_model(path, threads=2)
    try:
        assert model.prefetch is not None and model.prefetch.on_s is None  # not measured: left as it was
        few = "" if model.prefetch.on else "; on for forwards of 2 to 8 rows"
        assert f"software prefetch {'on' if model.prefetch.on else 'off'} (not measured under 256 MiB{few})" in (
            model.describe()
        )
    finally:
        model.close()
    monkeypatch.setenv("HEARTH_PREFETCH", "off")
    model = open_gguf_model(path, threads=2)
    try:
        assert model.lib.hearth_x16_prefetch(-1) == 0
        assert "software prefetch off (HEARTH_PREFETCH; on for forwards of 2 to 8 rows)" in model.describe()
    finally:
        model.lib.hearth_x16_prefetch(1)  # the library's setting outlives the model: back to its default
        model.close()
    monkeypatch.setenv("HEARTH_PREFETCH", "sometimes")
    with pytest.raises(LiteUnavailable, match="HEARTH_PREFETCH='sometimes' is not one of on, off"):
        open_gguf_model(path)


def test_the_file_type_names_are_gguf_s_own() -> None:
    """The table that spares every load importing the gguf package, against that package's enum."""
    from gguf.constants import LlamaFileType

    from app.core.engines.lite.gguf_plan import FILE_TYPES

    names = {member.value: member.name.removeprefix("MOSTLY_").removeprefix("ALL_") for member in LlamaFileType}
    assert names == FILE_TYPES
    assert file_type_label(read_gguf_header(default_model_gguf())) == "Q4_1"
    done = run_fresh(
        "import sys\n"
        "from app.core.engines.lite.gguf_plan import file_type_label\n"
        "from app.core.models.gguf_meta import read_gguf_header\n"
        "from app.core.models.model_source import default_model_gguf\n"
        "print(file_type_label(read_gguf_header(default_model_gguf())), 'gguf' in sys.modules)\n"
    )
    assert done.out == "Q4_1 False"
