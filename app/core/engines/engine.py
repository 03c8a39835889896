"""The torch engine: a transformers model's steps (and the fused C decode step where it runs) under the shared reply
loop (app.core.engines.generation), with KV-cache reuse across turns.

One thread drives an Engine at a time (the GUI's worker, or the command line); cancel is a
threading.Event checked before every forward pass, so it takes effect within one token.
"""

from __future__ import annotations

import inspect
import logging
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import psutil
import torch
from transformers import DynamicCache
from transformers.generation.logits_process import (
    LogitsProcessor,
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from app.core.chat.chat_format import FALLBACK_NOTICE
from app.core.chat.response_cache import ResponseCache
from app.core.chat.sampling import SamplingParams
from app.core.engines.constrained import GrammarSpec, LogitsMask
from app.core.engines.generation import PreparedPrompt, ReplyEngine, token_ids
from app.core.engines.kv_pool import shared_prefix
from app.core.engines.loader import LoadedModel
from app.core.fastpath.kernel import ABI as KERNEL_ABI
from app.core.fastpath.native import is_slab_cache, new_slab_cache
from app.core.fastpath.select import DecodePathChoice, apply_decode_path

log = logging.getLogger(__name__)


@dataclass
class KVState:
    """A conversation's KV cache, the exact token ids it holds (cache length == len(ids)), and the spans [start, end)
    that prefill calls wrote (positions outside every span came from decode steps)."""

    cache: DynamicCache | None = None
    ids: list[int] = field(default_factory=list)
    prefill_calls: list[tuple[int, int]] = field(default_factory=list)

    def reset(self) -> None:
        self.cache = None
        self.ids = []
        self.prefill_calls = []

    def nbytes(self) -> int:
        return kv_cache_bytes(self.cache)

    def reuse_for(self, prompt_ids: list[int]) -> int:
        """Crop to the longest common prefix with the new prompt and return how many tokens are reused.

        At least one prompt token is always prefilled again: the next token's logits come from it. A cache
        as long as the new prompt would silently give wrong output (transformers would feed nothing new).

        A prefix that ends inside a prefill call is cut back to that call's start: the call runs again whole, with
        the same rows as before, so every row is computed by the same call (same shapes, same kernels) as in a run
        without the cache. CPU kernels pick their blocking, split-K reduction and instruction set (AVX-512, AMX) by
        a call's row count, so a row computed among 40 others and the same row computed among 12 can differ in
        the last bits, which can flip a greedy near-tie (issue 28: an edited turn on an AMX Xeon).
        """
        if self.cache is None:
            return 0
        common = call_start(self.prefill_calls, shared_prefix(self.ids, prompt_ids[:-1]))
        remove = len(self.ids) - common
        if remove and not _croppable(self.cache, remove):
            self.reset()
            return 0
        if remove:
            self.cache.crop(-remove)
        self.ids = self.ids[:common]
        self.prefill_calls = [(start, end) for start, end in self.prefill_calls if end <= common]
        if common == 0:
            self.reset()
        return common


PREFILL_GRID = 128  # positions per prefill call at most, calls starting at its multiples (see Engine._prefill)


def call_start(calls: list[tuple[int, int]], position: int) -> int:
    """The start of the prefill call that wrote `position` and the rows after it, else `position` itself (a call
    boundary, or a position a decode step wrote)."""
    for start, end in calls:
        if start < position < end:
            return start
    return position


def _croppable(cache: DynamicCache, remove: int) -> bool:
    """Sliding-window layers past their window have dropped the states a crop would need."""
    for layer in cache.layers:
        window = getattr(layer, "sliding_window", None)
        keys = getattr(layer, "keys", None)
        if window and isinstance(keys, torch.Tensor) and int(getattr(layer, "cumulative_length", 0)) >= window - 1:
            return False
    return True


def kv_cache_bytes(cache: DynamicCache | None) -> int:
    """Bytes held by the cache's actual key and value tensors."""
    if cache is None:
        return 0
    total = 0
    for layer in cache.layers:
        for tensor in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(tensor, torch.Tensor):
                total += tensor.numel() * tensor.element_size()
    return total


class Engine(ReplyEngine):
    """Owns a loaded model; `generate` yields TokenEvent…, StatsEvent, DoneEvent.

    `decode_path` picks how single-token steps run (app.core.fastpath): "auto" (the fastest measured for the
    device and weights), "eager" (the plain model), or a named fast path; the stats say which ran and why.
    """

    def __init__(
        self, loaded: LoadedModel, response_cache: ResponseCache | None = None, *, decode_path: str = "auto"
    ) -> None:
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.response_cache = response_cache
        self.context_window = loaded.context_window
        self.device = torch.device(loaded.device)
        self.eos_ids = _eos_ids(self.model, self.tokenizer)
        self.vocab_size = int(getattr(self.model.config, "vocab_size", 0) or len(self.tokenizer))
        self.path: DecodePathChoice = apply_decode_path(
            self.model, loaded.device, loaded.quantization, decode_path, folder=loaded.folder
        )
        self.decode_path = self.path.name
        self.decode_path_note = self.path.note
        self.lookup_state = "off (the torch runtime has no exact multi-token check)"
        self.model_id = loaded.model_id
        self.quantization = loaded.quantization
        self.display_name = loaded.display_name
        self.device_name = loaded.device
        self.polls_memory = self.device.type != "cuda"
        self._process = psutil.Process()
        # transformers 5.2x renamed forward's `past_key_values` to `cache` (the old name warns, then goes in 5.40).
        forward_params = inspect.signature(self.model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in forward_params else "past_key_values"

    def fix_threads(self, threads: int) -> None:
        """Run every fused step on `threads` threads (at most the team it started with), never trying another size:
        benchmarks that hold two engines to the same thread count. Torch's own calls (prefill, the plain path's
        steps) always run on torch's thread count: their results depend on it (a 500-token bf16 prefill's logits
        moved by 0.02-0.15 between 1 and 2 threads), and a reused prefix must match a fresh run bit for bit."""
        if self.path.fused is not None:
            self.path.fused.fix_threads(threads)

    # -- the model's steps (app.core.engines.generation runs the reply) ---------------------------------------
    def new_kv(self) -> KVState:
        return KVState()

    def _prefill(self, ids: list[int], kv: KVState) -> torch.Tensor:
        """Run `ids` in calls cut at multiples of PREFILL_GRID positions: a run with a reused prefix then computes
        every row in the same call as a fresh run (reuse_for cuts back to a call's start), and an edit or a
        re-tokenized last token costs at most one grid cell of the prefix, not the whole prompt's call."""
        logits = None
        position, done = len(kv.ids), 0
        while done < len(ids):
            take = min(len(ids) - done, PREFILL_GRID - position % PREFILL_GRID)
            logits = self._forward(ids[done : done + take], kv)
            kv.prefill_calls.append((position, position + take))
            position, done = position + take, done + take
        assert logits is not None, "a prefill of no tokens"
        return logits

    def _decode_step(self, token: int, kv: KVState) -> torch.Tensor:
        with self.path.step():
            return self._forward([token], kv, decode_step=True)

    def _sampler(self, params: SamplingParams, prompt_ids: list[int]) -> TorchSampler:
        return TorchSampler(params, prompt_ids, self.device)

    def _constraint(self, spec: GrammarSpec) -> TensorMask:
        return TensorMask(self._grammars().mask(spec))

    def _cache_identity(self, budget: int) -> dict[str, Any]:
        return {
            "max_new_tokens": budget,
            # The decode path is part of the key: the fused int8 step's greedy text can differ from eager's.
            # So are the weights the reply comes from: files on disk and the decode path's packed copy.
            "decode_path": self.decode_path,
            "weights": self.loaded.weights_fingerprint,
            "decode_weights": getattr(self.path, "weights_digest", ""),
            # The kernel's numerics change with its ABI (e.g. ABI 5: prefill's lm_head on int8 activations).
            "kernel_abi": KERNEL_ABI if self.path.fused is not None or self.loaded.quantization == "q4" else 0,
        }

    def _begin_reply(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _inference(self) -> AbstractContextManager[Any]:
        return torch.inference_mode()

    def recovery_notices(self) -> tuple[str, ...]:
        """Derived files found damaged and rebuilt while the engine started (response cache, packed copies)."""
        return tuple(getattr(self.path, "recovery_notices", ())) + self._take_notices()

    def _memory_now(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        return int(self._process.memory_info().rss)

    def _forward(
        self, ids: list[int], kv: KVState, logits_to_keep: int = 1, *, decode_step: bool = False
    ) -> torch.Tensor:
        """Run `ids` through the model on top of the cache; return the last position's logits (fp32).

        Only a `decode_step` (a generated token) may take the fused path: prefill, even of one token (regenerate
        reuses all but the prompt's last token), runs the model as loaded, so a reused prefix matches a fresh run."""
        fused = self.path.fused
        if kv.cache is None:
            kv.cache = (
                new_slab_cache(self.model, self.context_window) if fused else DynamicCache(config=self.model.config)
            )
        if fused is not None and decode_step and len(ids) == 1 and is_slab_cache(kv.cache):
            logits = fused.step(ids[0], kv.cache)
            kv.ids.append(ids[0])
            return logits
        input_ids = torch.tensor([ids], dtype=torch.long, device=self.device)
        kwargs = {self._cache_kwarg: kv.cache}
        out = self.model(input_ids=input_ids, use_cache=True, logits_to_keep=logits_to_keep, **kwargs)
        kv.ids.extend(ids)
        return out.logits[:, -1, :].float()


class TensorMask:
    """A reply's grammar (app.core.engines.constrained, numpy) masking this engine's logits tensors."""

    def __init__(self, mask: LogitsMask) -> None:
        self.mask = mask

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        allowed = torch.from_numpy(self.mask.allowed())
        if allowed.shape[0] < logits.shape[-1]:  # logits past the tokenizer's vocabulary: never allowed
            allowed = torch.nn.functional.pad(allowed, (0, logits.shape[-1] - allowed.shape[0]))
        allowed = allowed[: logits.shape[-1]].to(logits.device, non_blocking=True)
        return logits.float().masked_fill(~allowed, float("-inf"))

    def accept(self, token: int) -> None:
        self.mask.accept(token)

    @property
    def finished(self) -> bool:
        return self.mask.finished


class TorchSampler:
    """transformers' warpers (repetition penalty, temperature, top-k, top-p, min-p), then argmax or a seeded draw."""

    def __init__(self, params: SamplingParams, prompt_ids: list[int], device: torch.device) -> None:
        self.params = params
        self.processors = _processors(params)
        self.generator: torch.Generator | None = None
        if not params.greedy:
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(params.generator_seed())
        self.device = device
        self.seen = torch.tensor([prompt_ids], dtype=torch.long, device=device)

    def pick(self, logits: torch.Tensor) -> int:
        if self.processors:
            # In float64: a repetition penalty or temperature near 0 (1e-300) must not make float32 infinities.
            logits = self.processors(self.seen, logits.double())
        if self.generator is None:
            return greedy_pick(logits)
        probs = torch.softmax(logits, dim=-1)
        return int(torch.multinomial(probs, 1, generator=self.generator).item())

    def accept(self, token: int) -> None:
        if self.params.repetition_penalty != 1.0:
            self.seen = torch.cat([self.seen, torch.tensor([[token]], device=self.device)], dim=1)


def greedy_pick(logits: torch.Tensor) -> int:
    """The highest logit's index (the first of equals, as torch.argmax). On the CPU through numpy: torch's argmax
    wakes its thread pool for a 49k-entry row (0.11 ms a token measured on SmolLM2, 2 threads; numpy's ~0.02 ms)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return int(logits.numpy().argmax())
    return int(torch.argmax(logits, dim=-1).item())


def _processors(params: SamplingParams) -> LogitsProcessorList | None:
    processors = LogitsProcessorList()
    if params.repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
    if not params.greedy:
        processors.append(ShiftedTemperature(params.temperature))
        if params.top_k > 0:
            processors.append(TopKLogitsWarper(params.top_k))
        if params.top_p < 1.0:
            processors.append(TopPLogitsWarper(params.top_p))
        if params.min_p > 0:
            processors.append(MinPLogitsWarper(params.min_p))
    return processors or None


class ShiftedTemperature(LogitsProcessor):
    """transformers' TemperatureLogitsWarper, on scores shifted so their maximum is 0: dividing by any temperature
    above 0 (1e-300 too) then gives 0 for the best tokens and at most -inf for the rest, never inf - inf = nan."""

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        finite = torch.nan_to_num(scores, nan=-torch.inf, posinf=torch.finfo(scores.dtype).max, neginf=-torch.inf)
        return (finite - finite.max(dim=-1, keepdim=True).values) / self.temperature  # type: ignore[return-value]


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    sources = (getattr(model, "generation_config", None), model.config, tokenizer)
    return token_ids(getattr(source, "eos_token_id", None) for source in sources)


__all__ = ["FALLBACK_NOTICE", "Engine", "KVState", "PreparedPrompt", "kv_cache_bytes"]
