"""A GGUF file run as it lies on disk: its quantized blocks are mapped and multiplied where they are by the kernel
library (app.core.fastpath.blocks), in the file's own formats (a Q4_K_M file mixes Q4_K and Q6_K tensors); nothing
is dequantized to a copy, converted or packed. Torch-free.

What it reads: the header (app.core.models.gguf_meta, the one reader), the norms (small fp32 copies), and the rest
through one read-only map of the file. Every size the header claims is checked against the tensors' own shapes and
the file's length before any pointer reaches the kernel.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

from app.core.engines.lite.gguf_plan import gguf_config, tensor_bytes
from app.core.engines.lite.runtime import (
    PREFILL_CHUNK,
    DecoderRuntime,
    Floats,
    LiteCache,
    LiteUnavailable,
)
from app.core.errors import HearthError
from app.core.fastpath import blocks
from app.core.fastpath.cpu import machine_identity
from app.core.fastpath.huge_pages import PageArena, huge_pages_setting
from app.core.fastpath.kernel import (
    NativeLibrary,
    library_origin,
    load_library,
    on_a_passing_thread,
    q4_kernel_name,
)
from app.core.fastpath.prefetch import (
    PREFETCH_FILE,
    PrefetchChoice,
    choice_key,
    save_choice,
    saved_choice,
    timed_choice,
    untimed_choice,
)
from app.core.fastpath.team import TeamChooser
from app.core.models.gguf_meta import TensorExtent, check_gguf_complete, read_gguf_header
from app.core.storage.paths import cache_dir

# Which matrix inputs are quantized to 15 bits instead of 8 (blocks.PRECISE_*), in prefill and decode alike: the
# attention's (q/k/v and o) and the head's; the MLP's, most of the products, at 8 (each 15-bit input costs twice the
# integer work). KL divergence from the exact forward of the same file (bench/quality.py's text, 512 positions, the
# default model's Q4_1 / Q4_K_M / Q8_0 files): every input at 15 bits 0.00009 / 0.00008 / 0.00008; this split
# 0.0018 / 0.0020 / 0.0016; every input at 8 bits 0.0045 / 0.0043 / 0.0040; llama.cpp on the same files (8-bit
# inputs, 1,024 positions) 0.0036 / 0.0054 / 0.0036.
PRECISE_ALL = blocks.PRECISE_QKV | blocks.PRECISE_O | blocks.PRECISE_GATE_UP | blocks.PRECISE_DOWN | blocks.PRECISE_HEAD
PRECISE_INPUTS = blocks.PRECISE_QKV | blocks.PRECISE_O | blocks.PRECISE_HEAD
LAYOUT_SLICE_BYTES = 8 << 20  # file bytes laid out (and released) at a time: what a load stages beside the model


@dataclass(frozen=True)
class Matrix:
    """One weight matrix in the map: `rows` rows of `cols` values of ggml type `kind`."""

    name: str
    kind: int
    rows: int
    cols: int
    data: npt.NDArray[np.uint8]

    @property
    def pointer(self) -> int:
        return int(self.data.ctypes.data)


class GGUFModel(DecoderRuntime):
    """One GGUF model on the torch-free runtime: prefill and decode on the file's own blocks."""

    path_name = "lite-gguf"
    exact_forward = True  # prefill runs the decode step's own C forward
    batched_step = True  # several sequences' steps in one forward, each row as its own step computes it

    def __init__(
        self, path: Path, library: NativeLibrary, threads: int | None = None, precise: int = PRECISE_INPUTS
    ) -> None:
        self.path = path
        self.precise = precise  # blocks.PRECISE_* bits: the matrix inputs taken at 15 bits
        try:
            check_gguf_complete(path)
            header = read_gguf_header(path)
        except HearthError as exc:
            raise LiteUnavailable(str(exc)) from exc
        config, self.rope_pairs = gguf_config(header)
        self._start(library, config, threads)
        self.header = header
        self.tensors = {tensor.name: tensor for tensor in header.tensors}
        self.map = np.memmap(path, dtype=np.uint8, mode="r")
        stat = path.stat()
        self.file_identity = f"{stat.st_size}:{stat.st_mtime_ns}"
        hd, heads, kv = config.head_dim, config.heads, config.kv_heads
        self.embedding = self._matrix("token_embd.weight", config.vocab, config.hidden)
        self.head = (
            self._matrix("output.weight", config.vocab, config.hidden)
            if "output.weight" in self.tensors
            else self.embedding
        )
        self.final_norm = self._vector("output_norm.weight", config.hidden)
        self.attn_norms, self.mlp_norms = [], []
        self.layers: list[dict[str, Matrix]] = []
        self.biases: list[dict[str, Floats | None]] = []
        for index in range(config.layers):
            prefix = f"blk.{index}."
            self.attn_norms.append(self._vector(prefix + "attn_norm.weight", config.hidden))
            self.mlp_norms.append(self._vector(prefix + "ffn_norm.weight", config.hidden))
            self.layers.append(
                {
                    "q": self._matrix(prefix + "attn_q.weight", heads * hd, config.hidden),
                    "k": self._matrix(prefix + "attn_k.weight", kv * hd, config.hidden),
                    "v": self._matrix(prefix + "attn_v.weight", kv * hd, config.hidden),
                    "o": self._matrix(prefix + "attn_output.weight", config.hidden, heads * hd),
                    "gate": self._matrix(prefix + "ffn_gate.weight", config.inter, config.hidden),
                    "up": self._matrix(prefix + "ffn_up.weight", config.inter, config.hidden),
                    "down": self._matrix(prefix + "ffn_down.weight", config.hidden, config.inter),
                }
            )
            self.biases.append(
                {
                    name: self._vector(f"{prefix}attn_{name}.bias", width)
                    if f"{prefix}attn_{name}.bias" in self.tensors
                    else None
                    for name, width in (("q", heads * hd), ("k", kv * hd), ("v", kv * hd))
                }
            )
        if "rope_freqs.weight" in self.tensors:  # Llama 3.1's scaling, as llama.cpp writes it: inv_freq / factor
            factors = self._vector("rope_freqs.weight", hd // 2)
            if not np.all(np.isfinite(factors)) or np.any(factors <= 0):
                raise LiteUnavailable("its rope_freqs.weight holds factors that are not positive numbers")
            self.config = config = replace(config, inv_freq=(config.inv_freq / factors).astype(np.float32))
        self.weight_file_bytes = sum(tensor_bytes(tensor) for tensor in header.tensors)
        self.layout_bytes = self._lay_out_matrices()
        self._bind_step()
        self.prefetch = self._choose_prefetch() if self.layout_bytes else None

    # -- the file's tensors, checked before any pointer into the map is made
    def _extent(self, name: str) -> tuple[TensorExtent, int]:
        tensor = self.tensors.get(name)
        if tensor is None:
            raise LiteUnavailable(f"the file has no tensor {name}")
        size = tensor_bytes(tensor)
        start = self.header.data_start + tensor.offset
        if start + size > self.map.size:
            raise LiteUnavailable(f"tensor {name} lies beyond the end of the file")
        return tensor, start

    def _matrix(self, name: str, rows: int, cols: int) -> Matrix:
        tensor, start = self._extent(name)
        if tensor.dims != (cols, rows):
            raise LiteUnavailable(f"tensor {name} has shape {list(tensor.dims)}, not [{cols}, {rows}]")
        try:
            size = rows * blocks.row_bytes(tensor.kind, cols)
        except ValueError as exc:
            raise LiteUnavailable(f"tensor {name}: {exc}") from exc
        return Matrix(name, tensor.kind, rows, cols, self.map[start : start + size])

    def _lay_out_matrices(self) -> int:
        """Each quantized matrix in the kernel's 16-row layout where this build has one (AVX-512, AVX2):
        the file's blocks, bit for bit, with 16 rows interleaved so that one vector instruction steps 16 rows' dot
        products. A tied embedding then reads its rows from the head's layout. Done in slices, each slice's file pages
        released once copied, so memory holds the model once (plus a slice) while it happens. The layouts share one
        arena on 2 MiB pages where the system gives them (app.core.fastpath.huge_pages). Returns the layouts'
        bytes."""
        matrices = [*(matrix for layer in self.layers for matrix in layer.values()), self.head]
        sizes = [blocks.x16_bytes(self.lib, matrix.kind, matrix.rows, matrix.cols) for matrix in matrices]
        self.arena = PageArena([size for size in sizes if size is not None]) if any(sizes) else None
        laid_out = 0

        def lay_out(matrix: Matrix, size: int | None) -> Matrix:
            nonlocal laid_out
            if size is None or self.arena is None:
                return matrix
            layout = blocks.repack_x16(
                self.lib, matrix.kind, matrix.data, matrix.rows, matrix.cols, self.threads,
                slice_bytes=LAYOUT_SLICE_BYTES, copied=self._release, out=self.arena.take(size),
            )  # fmt: skip
            if layout is None:
                return matrix
            kind, data = layout
            laid_out += data.nbytes
            return Matrix(matrix.name, kind, matrix.rows, matrix.cols, data)

        def lay_out_all() -> None:
            given = iter(sizes)
            for layer in self.layers:
                for name, matrix in layer.items():
                    layer[name] = lay_out(matrix, next(given))
            tied = self.head is self.embedding
            self.head = lay_out(self.head, next(given))
            if tied:
                self.embedding = self.head

        on_a_passing_thread(lay_out_all)  # its threads must not outlive the load (see there)
        self.huge_page_bytes = (self.arena.huge_bytes() or 0) if self.arena is not None and self.arena.huge else 0
        return laid_out

    def _release(self, part: npt.NDArray[np.uint8]) -> None:
        """Drop the mapped file pages wholly inside `part` from this process's memory (they stay in the page cache; a
        later read maps them again). Where the system has no madvise, the pages stay until the map is closed."""
        handle = getattr(self.map, "_mmap", None)
        if handle is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        start = part.ctypes.data - self.map.ctypes.data
        first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
        last = (start + part.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
        if last > first:
            handle.madvise(mmap.MADV_DONTNEED, first, last - first)

    def _vector(self, name: str, size: int) -> Floats:
        tensor, start = self._extent(name)
        if tensor.elements != size or len(tensor.dims) != 1:
            raise LiteUnavailable(f"tensor {name} has shape {list(tensor.dims)}, not [{size}]")
        data = np.array(self.map[start : start + tensor_bytes(tensor)])
        return np.ascontiguousarray(blocks.dequantize(self.lib, tensor.kind, data, size))

    # -- what it reads per token
    @property
    def weight_bytes(self) -> int:
        """The tensors' bytes in the file (what a first pass over the model maps in)."""
        return self.weight_file_bytes

    @property
    def digest(self) -> str:
        return f"gguf:{self.file_identity}"

    def describe(self) -> str:
        kinds: dict[str, int] = {}
        for layer in self.layers:
            for matrix in layer.values():
                name = blocks.type_name(blocks.file_type(matrix.kind))
                kinds[name] = kinds.get(name, 0) + 1
        mix = ", ".join(f"{name} x{count}" for name, count in sorted(kinds.items(), key=lambda item: -item[1]))
        kernel = q4_kernel_name(self.lib)
        if self.layout_bytes and self.lib.hearth_amx(-1):
            kernel += ", prefill on AMX tiles"
        threads = self.decode_team.description()
        layout = f", rows 16 at a time{self._pages_note()}" if self.layout_bytes else ""
        head = blocks.type_name(blocks.file_type(self.head.kind))
        activations = {
            PRECISE_INPUTS: "activations per 32 values at 15 bits into attention and the head, 8 into the MLP",
            PRECISE_ALL: "activations at 15 bits per 32 values",
            0: "activations at 8 bits per 32 values",
        }.get(self.precise, f"activations at 15 bits (inputs {self.precise:#x}) or 8 bits per 32 values")
        prefetch = f", {self.prefetch.describe()}" if self.prefetch is not None else ""
        return (
            f"torch-free runtime on the GGUF file's own blocks ({mix}; head {head}{layout}), "
            f"{kernel} ({library_origin(self.library)}{prefetch}), {activations}; decode in one C step, prefill in "
            f"chunks of up to {PREFILL_CHUNK} tokens; {threads}"
        )

    def _pages_note(self) -> str:
        """Which pages the layouts lie on, as measured after the load (huge_pages)."""
        if self.arena is None:
            return ""
        if not self.arena.huge:  # a model too small to fill a 2 MiB page, or a system without them, says nothing
            return (
                " on 4 KiB pages (the system's transparent huge pages are off)"
                if huge_pages_setting() == "never"
                else ""
            )
        share = self.huge_page_bytes / self.arena.nbytes if self.arena.nbytes else 0.0
        if share >= 0.99:
            return " on 2 MiB pages"
        return f" on 2 MiB pages for {share:.0%} of them (the system had no more)"

    def _bind_step(self) -> None:
        config = self.config
        sizes = {
            **config.step_sizes(self.threads),
            "rope_pairs": int(self.rope_pairs),
            "embed_type": self.embedding.kind,
            "head_type": self.head.kind,
            "precise": self.precise,
        }
        glob = {
            "embed": self.embedding.pointer,
            "final_norm": self.final_norm.ctypes.data,
            "head": self.head.pointer,
            "inv_freq": config.inv_freq.ctypes.data,
        }
        types = [{name: matrix.kind for name, matrix in layer.items()} for layer in self.layers]
        layers = []
        for index, layer in enumerate(self.layers):
            fields: dict[str, int | None] = {name: matrix.pointer for name, matrix in layer.items()}
            fields["attn_norm"] = self.attn_norms[index].ctypes.data
            fields["ffn_norm"] = self.mlp_norms[index].ctypes.data
            for name, bias in self.biases[index].items():
                fields[f"{name}_bias"] = bias.ctypes.data if bias is not None else None
            layers.append(fields)
        self.arguments = blocks.GGForward(self.lib, sizes, config.eps, glob, types, layers)

    def _choose_prefetch(self) -> PrefetchChoice:
        """The kernel's software prefetch on or off (app/core/fastpath/prefetch.py): as HEARTH_PREFETCH says, as it is
        for a small model, else whichever this machine's decode steps measure faster: steps of one token at position 0
        of a scratch cache, on every thread, outside the team chooser's account; or
        the choice saved for this CPU, kernel library, file and team (app/core/fastpath/prefetch.py)."""
        try:
            untimed = untimed_choice(self.lib.hearth_x16_prefetch, self.layout_bytes)
        except ValueError as exc:  # HEARTH_PREFETCH set to something else than on or off
            raise LiteUnavailable(str(exc)) from exc
        if untimed is not None:
            return untimed
        store = cache_dir() / PREFETCH_FILE
        library = self.library.sha256 or str(self.library.path)
        key = choice_key(machine_identity(), library, self.file_identity, self.threads)
        saved = saved_choice(store, key)
        if saved is not None:
            self.lib.hearth_x16_prefetch(int(saved.on))
            return saved
        cache = self.new_cache()
        cache.reserve(1)
        self._bind(cache)
        self.arguments.set_threads(self.threads)
        token, logits = np.zeros(1, dtype=np.int64), np.empty((1, self.config.vocab), dtype=np.float32)

        def step() -> None:
            code = self.arguments.run(token, 0, logits)
            if code != 0:
                raise RuntimeError(f"a decode step to time the prefetch failed (code {code})")

        try:  # on a thread that ends with it, as the layout's (a thread that ran the kernel keeps an OpenMP pool)
            choice = on_a_passing_thread(lambda: timed_choice(self.lib.hearth_x16_prefetch, step))
        finally:
            self._bound = None  # the scratch cache goes; the next call binds its own
        save_choice(store, key, choice)
        return choice

    def _bind_kv(self, keys: list[int], values: list[int], capacity: int) -> None:
        self.arguments.bind_kv(keys, values, capacity)

    def _run_step(self, token: int, position: int, logits: Floats) -> int:
        with self.decode_team.timed(1) as threads:
            self.arguments.set_threads(threads)
            return self.arguments.run(np.array([token], dtype=np.int64), position, logits[None, :])

    def _token_ids(self, tokens: Sequence[int]) -> npt.NDArray[np.int64]:
        """`tokens` as the kernel's int64 ids, each checked to be in the vocabulary."""
        ids = np.asarray(tokens, dtype=np.int64)
        bad = ids[(ids < 0) | (ids >= self.config.vocab)]
        if bad.size:
            raise ValueError(f"token id {int(bad[0])} is outside the model's {self.config.vocab}-token vocabulary")
        return ids

    def run_sequences(self, parts: Sequence[tuple[Sequence[int], LiteCache, bool]]) -> list[Floats]:
        """Several sequences' next tokens in one forward (a server's batched step: one reply's decode token, another's
        prompt chunk): part (tokens, cache, wants_logits) runs `tokens` at its cache's next positions, every weight
        block read once for all rows. Each row is computed bit for bit as that sequence's own step or prefill
        computes it. The logits after each wanting part's last token [vocab], in the parts' order."""
        if not parts:
            raise ValueError("a batched step needs at least one sequence")
        if len({id(cache) for _, cache, _ in parts}) != len(parts):
            raise ValueError("a batched step's rows need distinct caches")
        layers = self.config.layers
        ordered: list[tuple[int, int, LiteCache]] = []  # (token, position, cache): rows without logits first
        last_rows: list[tuple[int, int, LiteCache]] = []
        for tokens, cache, wants in parts:
            if not tokens:
                raise ValueError("every sequence of a batched step needs a token")
            ids = self._token_ids(tokens)
            rows = [(int(token), cache.length + offset, cache) for offset, token in enumerate(ids)]
            if wants:
                ordered.extend(rows[:-1])
                last_rows.append(rows[-1])
            else:
                ordered.extend(rows)
        for tokens, cache, _ in parts:
            cache.reserve(cache.length + len(tokens))
        ordered.extend(last_rows)
        slabs = np.empty((len(ordered), layers, 2), dtype=np.uint64)
        addresses = {id(cache): cache.slab_addresses() for _, cache, _ in parts}
        for row, (_, _, cache) in enumerate(ordered):
            slabs[row, :, 0], slabs[row, :, 1] = addresses[id(cache)]
        ids = np.array([token for token, _, _ in ordered], dtype=np.int64)
        positions = np.array([position for _, position, _ in ordered], dtype=np.int64)
        capacities = np.array([cache.capacity for _, _, cache in ordered], dtype=np.int64)
        logits = np.empty((len(last_rows), self.config.vocab), dtype=np.float32)
        # a prompt's chunk makes it a prefill call (its time per token a prefill's): timed as one, apart from steps
        team = self.prefill_team if len(ordered) > len(parts) else self.batch_team
        with team.timed(len(ordered)) as threads:
            self.arguments.set_threads(threads)
            code = self.arguments.run_rows(ids, slabs, positions, capacities, logits)
        if code != 0:
            raise RuntimeError(f"the GGUF forward refused a batched step of {len(ordered)} rows (code {code})")
        for tokens, cache, _ in parts:
            cache.length += len(tokens)
            cache.ids.extend(int(token) for token in tokens)
        return list(logits)

    # -- prefill: the decode step's own C forward, PREFILL_CHUNK tokens a call (each token computed as one step is)
    def prefill(self, ids: Sequence[int], cache: LiteCache) -> Floats:
        """Run `ids` after the cache's positions; the logits after the last [vocab]."""
        return self.forward(ids, cache, 1)[0]

    def forward(self, ids: Sequence[int], cache: LiteCache, logit_rows: int) -> Floats:
        """Run `ids` after the cache's positions; the logits after each of the last `logit_rows` of them
        [logit_rows, vocab] (the quality bench and a speculative check read every position's)."""
        return self._forward(ids, cache, logit_rows, self.prefill_team)

    def check(self, ids: Sequence[int], cache: LiteCache) -> Floats:
        """A prompt-lookup check on the team size the decode steps measure fastest, untimed: a check of a few rows is
        a step's kind of work, and the steps keep that choice current. (Timed with prefill's chunks, whose time per
        token is a long prompt's, a check looked slow and set off a trial of another team size: the process's first
        check ran on one thread, at twice its cost. On the steps' size while they try another, it did the same.)"""
        return self._forward(ids, cache, len(ids), None)

    def _forward(self, ids: Sequence[int], cache: LiteCache, logit_rows: int, team: TeamChooser | None) -> Floats:
        if not ids:
            raise ValueError("prefill needs at least one token")
        tokens = self._token_ids(ids)
        logits = np.empty((logit_rows, self.config.vocab), dtype=np.float32)
        cache.reserve(cache.length + len(ids))
        self._bind(cache)
        first_wanted = len(ids) - logit_rows  # the logits asked for are those of a suffix of ids
        for start in range(0, len(ids), PREFILL_CHUNK):
            chunk = tokens[start : start + PREFILL_CHUNK]
            end = start + len(chunk)
            rows = max(0, end - max(start, first_wanted))  # a suffix of this chunk
            out = logits[end - rows - first_wanted : end - first_wanted]
            with team.timed(len(chunk)) if team is not None else nullcontext(self.decode_team.best) as threads:
                self.arguments.set_threads(threads)
                code = self.arguments.run(chunk, cache.length, out)
            if code != 0:
                raise RuntimeError(
                    f"the GGUF forward refused {len(chunk)} tokens at position {cache.length} (code {code})"
                )
            cache.length += len(chunk)
            cache.ids.extend(int(token) for token in chunk)
        return logits


def open_gguf_model(path: Path, threads: int | None = None, precise: int = PRECISE_INPUTS) -> GGUFModel:
    """The GGUF file at `path` on the torch-free runtime; LiteUnavailable says why not (no kernel for this CPU, an
    architecture, tensor type or size the runtime does not take, a damaged file)."""
    library = load_library()
    if isinstance(library, str):
        raise LiteUnavailable(library)
    return GGUFModel(path, library, threads, precise)
