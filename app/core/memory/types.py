"""What the memory planner and the live accounting report: plain dataclasses, torch-free, for the GUI and the CLI."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Fit = Literal["yes", "offload", "no"]


@dataclass(frozen=True)
class MemoryPlan:
    """The planner's estimate for one model, quantization, context length and device, before any weight is loaded.

    All sizes are bytes. `total_bytes` = weights on the device + KV cache at `context` + overhead; `free_bytes` is
    the device's free memory the plan was made against, `free_after_bytes` what is left (negative: missing).
    """

    model: str
    model_type: str
    quantization: str
    device: str
    context: int  # tokens the plan is for
    model_max_context: int  # the model's own maximum (max_position_embeddings)
    parameters: int  # unique parameters (tied weights counted once)
    quantized_parameters: int  # of those, the ones bitsandbytes stores in 4/8 bits
    weights_bytes: int  # all weights, wherever they go (offloaded layers at their 16-bit size)
    weights_by_device: dict[str, int]
    kv_bytes_per_token: int  # while every layer still grows (below any sliding window)
    kv_bytes_per_token_long: int  # past every sliding window: full-attention layers only
    kv_bytes: int  # at `context`
    kv_dtype: str
    kv_layers: int  # layers holding a KV cache
    kv_sliding_layers: int  # of those, capped at their window
    overhead_bytes: int
    overhead: dict[str, int]  # the parts of overhead_bytes, by name
    total_bytes: int  # needed on `device`
    free_bytes: int
    free_source: str  # "measured" (the device's real free memory) or "stated" (--free)
    free_after_bytes: int
    fits: Fit
    max_context: int  # largest context that fits (capped at model_max_context); 0: not even one token
    cpu_free_bytes: int | None = None  # the host's available memory, when offloading to it was considered
    notes: tuple[str, ...] = ()
    replies: int = 1  # replies planned at once, each with its own KV cache of `context` tokens (kv_bytes counts all)
    # Served (`hearth serve`, the window's server): the most replies the runtime decodes together (1: one at a time)
    # and the KV memory they may reserve between them (0 where one at a time: a reply's cache is the plan's own).
    served_together: int = 1
    served_kv_budget_bytes: int = 0

    def to_json_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["notes"] = list(self.notes)
        return data


@dataclass(frozen=True)
class DeviceMemory:
    """One device's memory as measured now, in bytes: the one type the accounting, every backend and the memory
    panel share. `free_bytes` is what is left for the KV cache to grow into. The details are filled where known:
    the device's whole memory, CUDA's allocated/reserved, the CPU process's RSS."""

    device: str
    weights_bytes: int
    kv_bytes: int
    overhead_bytes: int  # what the process holds beyond weights and KV (activations, allocator slack, libraries)
    free_bytes: int
    total_bytes: int | None = None  # the device's whole memory (GPU memory, system RAM)
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    process_rss_bytes: int | None = None

    @property
    def used_bytes(self) -> int:
        """What this model's process holds on the device."""
        return self.weights_bytes + self.kv_bytes + self.overhead_bytes


@dataclass(frozen=True)
class MemorySnapshot:
    """Live memory of a loaded model, cheap to take often (see app.core.memory.accounting.MemoryMonitor)."""

    devices: tuple[DeviceMemory, ...]
    kv_bytes: int
    kv_tokens: int
    # At the current free memory, the KV cache fills it at this many tokens (None: it never does, e.g. every
    # layer is capped by a sliding window, or the context window ends first is not considered here).
    forecast_kv_full_at_tokens: int | None
    kv_bytes_per_token: int
    taken_at: float  # time.time()
    details_age_s: float = 0.0  # how old the slow-changing parts (free memory, RSS) are
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def weights_bytes(self) -> int:
        return sum(d.weights_bytes for d in self.devices)

    def to_json_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["weights_bytes"] = self.weights_bytes
        return data


def format_bytes(value: int | float) -> str:
    """Human-readable binary size: 1.5 GiB, 640 MiB, 12 KiB, 512 B."""
    size = float(value)
    sign = "-" if size < 0 else ""
    size = abs(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            if unit == "B":
                return f"{sign}{size:.0f} B"
            return f"{sign}{size:.2f} {unit}" if size < 10 else f"{sign}{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1000,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tb": 1000**4,
    "tib": 1024**4,
}


def parse_size(text: str) -> int:
    """`24GiB`, `8G` (binary), `8GB` (decimal), `512MiB`, `1.5g`, `1048576` -> bytes; ValueError for anything else."""
    cleaned = text.strip().replace(" ", "").replace("_", "")
    number_end = 0
    while number_end < len(cleaned) and (cleaned[number_end].isdigit() or cleaned[number_end] == "."):
        number_end += 1
    number, unit = cleaned[:number_end], cleaned[number_end:].lower()
    if not number or unit not in _UNITS or number.count(".") > 1:
        raise ValueError(f"{text!r} is not a memory size: use a number with a unit such as 24GiB, 8G, 8GB or 512MiB.")
    value = float(number) * _UNITS[unit]
    if value <= 0:
        raise ValueError(f"{text!r} is not a memory size: it must be more than zero.")
    return int(value)
