"""The torch-free engine: app.core.engines.generation's replies over a torch-free model (a GGUF file or a packed
copy), with numpy sampling and the model's own tokenizer class (transformers' tokenizers import no torch; its auto
classes do)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import psutil

from app.core.chat.response_cache import ResponseCache
from app.core.chat.sampling import SamplingParams
from app.core.engines.batching import BatchStep, DecodeStep, PrefillStep
from app.core.engines.generation import ReplyEngine, token_ids
from app.core.engines.lite.prefix_store import PrefixCache
from app.core.engines.lite.runtime import DecoderRuntime, LiteCache, LiteUnavailable
from app.core.engines.lookup import LookupPlanner
from app.core.fastpath.kernel import ABI as KERNEL_ABI

log = logging.getLogger(__name__)

Floats = npt.NDArray[np.float32]


def load_tokenizer(folder: Path) -> Any:
    """The folder's tokenizer through the class its tokenizer_config.json names (what AutoTokenizer loads for these
    models), imported by name: AutoTokenizer's lookup tables import torch."""
    import transformers

    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LiteUnavailable(f"its tokenizer_config.json could not be read ({exc})") from exc
    name = str(config.get("tokenizer_class") or "") if isinstance(config, dict) else ""
    if not name:
        raise LiteUnavailable("its tokenizer_config.json names no tokenizer class")
    try:
        tokenizer_class = getattr(transformers, name)
        base = transformers.TokenizersBackend
    except AttributeError as exc:
        raise LiteUnavailable(f"tokenizer class {name} is not in this transformers") from exc
    if not (isinstance(tokenizer_class, type) and issubclass(tokenizer_class, base)):
        raise LiteUnavailable(f"tokenizer class {name} is not a tokenizers-backed one")
    loader: Any = tokenizer_class  # a transformers class (Any to mypy: pyproject.toml)
    try:
        return loader.from_pretrained(folder)
    except (OSError, ValueError) as exc:
        raise LiteUnavailable(f"its tokenizer could not be loaded ({exc})") from exc


def eos_ids(folder: Path, tokenizer: Any) -> set[int]:
    """End-of-reply ids: generation_config.json's, config.json's and the tokenizer's (as the torch engine reads
    them from the model's generation config, its config and the tokenizer)."""
    values: list[Any] = [getattr(tokenizer, "eos_token_id", None)]
    for name in ("generation_config.json", "config.json"):
        try:
            data = json.loads((folder / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            values.append(data.get("eos_token_id"))
            text = data.get("text_config")
            if isinstance(text, dict):
                values.append(text.get("eos_token_id"))
    return token_ids(values)


class LiteKV:
    """A conversation's cache for the torch-free engine (app.core.engines.generation.KVCache)."""

    def __init__(self, model: DecoderRuntime) -> None:
        self.model = model
        self.cache: LiteCache | None = None

    @property
    def ids(self) -> list[int]:
        return self.cache.ids if self.cache is not None else []

    def reset(self) -> None:
        self.cache = None  # its slabs go back to the allocator

    def nbytes(self) -> int:
        return self.cache.nbytes if self.cache is not None else 0

    def reuse_for(self, prompt_ids: list[int]) -> int:
        if self.cache is None:
            return 0
        common = self.cache.reuse_for(prompt_ids)
        if common == 0:
            self.reset()
        return common

    def current(self) -> LiteCache:
        if self.cache is None:
            self.cache = self.model.new_cache()
        return self.cache


class NumpySampler:
    """The torch engine's warpers in numpy, in its order (repetition penalty, temperature, top-k, top-p, min-p),
    then argmax or a draw from a seeded generator. Greedy replies are the same tokens; a seed gives the same
    reply every time here (not the torch engine's draw)."""

    def __init__(self, params: SamplingParams, prompt_ids: list[int]) -> None:
        self.params = params
        self.rng = np.random.default_rng(params.generator_seed()) if not params.greedy else None
        self.seen = np.array(prompt_ids, dtype=np.int64)

    def pick(self, logits: Floats) -> int:
        params = self.params
        if params.repetition_penalty != 1.0:
            logits = logits.astype(np.float64)  # a copy, wide enough that a penalty near 0 (1e-300) stays finite
            seen = np.unique(self.seen[(self.seen >= 0) & (self.seen < logits.shape[0])])
            scores = logits[seen]
            with np.errstate(over="ignore"):  # a penalty near 0 may overflow: inf is dealt with below
                logits[seen] = np.where(
                    scores < 0, scores * params.repetition_penalty, scores / params.repetition_penalty
                )
        if self.rng is None:
            return int(logits.argmax())
        # Shifted to a maximum of 0 first (as the torch engine's ShiftedTemperature): any temperature above 0, 1e-300
        # too, then leaves the best tokens at 0 and the rest at most -inf, never inf - inf = nan.
        finite = np.nan_to_num(logits.astype(np.float64), nan=-np.inf, posinf=np.finfo(np.float64).max, neginf=-np.inf)
        with np.errstate(over="ignore"):  # overflowing to -inf is the intended result
            warped = (finite - finite.max()) / params.temperature
        if 0 < params.top_k < warped.shape[0]:
            kth = np.partition(warped, -params.top_k)[-params.top_k]
            warped[warped < kth] = -np.inf
        if params.top_p < 1.0:
            order = np.argsort(warped, kind="stable")  # ascending, as transformers' TopPLogitsWarper
            drop = np.cumsum(_softmax(warped[order])) <= 1 - params.top_p
            drop[-1] = False  # the most likely token always stays
            warped[order[drop]] = -np.inf
        if params.min_p > 0:
            probs = _softmax(warped)
            warped[probs < params.min_p * probs.max()] = -np.inf
        probs = _softmax(warped)
        return int(self.rng.choice(probs.shape[0], p=probs))

    def accept(self, token: int) -> None:
        if self.params.repetition_penalty != 1.0:
            self.seen = np.append(self.seen, token)


def _softmax(logits: npt.NDArray[np.floating[Any]]) -> npt.NDArray[np.float64]:
    shifted = np.exp(logits.astype(np.float64) - logits.max())
    return shifted / shifted.sum()


class LiteEngine(ReplyEngine):
    """A torch-free model's replies: prefill and decode in the kernel library, nothing from torch."""

    def __init__(
        self,
        model: DecoderRuntime,
        tokenizer: Any,
        eos: set[int],
        *,
        model_id: str,
        display_name: str,
        context_window: int,
        weights_fingerprint: str,
        quantization: str = "q4",
        response_cache: ResponseCache | None = None,
        prompt_lookup: bool = True,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.response_cache = response_cache
        self.context_window = context_window
        self.eos_ids = eos
        self.vocab_size = model.config.vocab
        self.model_id = model_id
        self.display_name = display_name
        self.quantization = quantization
        self.device_name = "cpu"
        self.polls_memory = True
        self.weights_fingerprint = weights_fingerprint
        self.decode_path = model.path_name
        self.decode_path_note = model.describe()
        self._process = psutil.Process(os.getpid())
        self.set_lookup(prompt_lookup)

    def set_lookup(self, wanted: bool) -> None:
        """Prompt-lookup decoding on (where the model's forward computes each row as its step does) or off."""
        if not wanted:
            self.lookup, self.lookup_state = None, "off (the prompt_lookup setting)"
        elif not self.model.exact_forward:
            self.lookup = None
            self.lookup_state = "off (this model's prefill is not computed as its decode steps)"
        else:
            self.lookup = self.lookup or LookupPlanner()
            self.lookup_state = "on"

    def new_kv(self) -> LiteKV:
        return LiteKV(self.model)

    # -- the prompt cache on disk (GGUF models: their prefill computes each token as a decode step does)
    prefixes: PrefixCache | None = None  # set once the weights' digest is known (a background thread at load)

    def _restore(self, prompt_ids: list[int], kv: LiteKV, reused: int) -> int:
        prefixes = self.prefixes
        return prefixes.restore(prompt_ids, kv.current(), reused) if prefixes is not None else reused

    def _after_reply(self, prompt_ids: list[int], kv: LiteKV) -> None:
        prefixes = self.prefixes
        if prefixes is not None and kv.cache is not None:
            prefixes.save_later(prompt_ids, kv.cache)

    def _inference(self) -> AbstractContextManager[Any]:
        prefixes = self.prefixes
        return prefixes.lock if prefixes is not None else nullcontext()

    def _take_notices(self) -> tuple[str, ...]:
        prefixes = self.prefixes
        return (*super()._take_notices(), *(prefixes.store.take_notices() if prefixes is not None else ()))

    def _prefill(self, ids: list[int], kv: LiteKV) -> Floats:
        return self.model.prefill(ids, kv.current())

    def _decode_step(self, token: int, kv: LiteKV) -> Floats:
        return self.model.step(token, kv.current())

    def _forward_rows(self, tokens: list[int], kv: LiteKV) -> Floats:
        return self.model.check(tokens, kv.current())

    def _decode_rows(self, steps: Sequence[BatchStep], takes: Sequence[int]) -> None:
        """Several replies' steps in one forward where the model has one (each row bit for bit its own step or
        prefill computes it): decode tokens and prompt chunks together. One step alone runs as a chat's would."""
        if not self.model.batched_step or len(steps) < 2:
            super()._decode_rows(steps, takes)
            return
        parts: list[tuple[Sequence[int], LiteCache, bool]] = []
        ran: list[BatchStep] = []
        for step, take in zip(steps, takes, strict=True):
            if isinstance(step, DecodeStep):
                parts.append(([step.token], step.kv.current(), True))
                ran.append(step)
            elif take:
                parts.append((step.tokens[:take], step.kv.current(), take == len(step.tokens)))
                ran.append(step)
        logits = iter(self.model.run_sequences(parts))
        for step, (tokens, _, wants) in zip(ran, parts, strict=True):
            if isinstance(step, PrefillStep):
                step.ran = len(tokens)
            step.logits = next(logits) if wants else None

    def _truncate(self, kv: LiteKV, length: int) -> None:
        kv.current().truncate(length)

    def _sampler(self, params: SamplingParams, prompt_ids: list[int]) -> NumpySampler:
        return NumpySampler(params, prompt_ids)

    def _memory_now(self) -> int:
        return int(self._process.memory_info().rss)

    def _cache_identity(self, budget: int) -> dict[str, Any]:
        return {
            "max_new_tokens": budget,
            "decode_path": self.decode_path,
            "weights": self.weights_fingerprint,
            "decode_weights": self.model.digest,
            "kernel_abi": KERNEL_ABI,
        }

    def close(self) -> None:
        if self.prefixes is not None:
            self.prefixes.close()
        self.model.close()
