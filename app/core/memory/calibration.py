"""Overhead constants of the memory planner, each with where it came from. Torch-free.

Re-measure with `python bench/memory.py --calibrate` (it prints every number below, measured side by side).
"""

from __future__ import annotations

MiB = 1024**2

# --- CPU (measured) -------------------------------------------------------------------------------------------
# Measured on the 2-core CI box (torch 2.13 CPU, transformers 5.24, bitsandbytes 0.50.2), 2026-12-02, with
# bench/memory.py --calibrate: anonymous RSS (RssAnon) growth of a process across load_model() beyond the weights'
# own bytes. The first load in a process pays for lazily imported code (modeling module, bitsandbytes) and glibc
# arena slack: 44.3 MiB (SmolLM2-135M bf16), 47.4 MiB (tiny Llama bf16), 67.3 MiB (tiny Llama nf4, bitsandbytes
# imported then); later loads in the same process 1-21 MiB. 96 MiB covers the worst case with a margin.
CPU_RUNTIME_BYTES = 96 * MiB

# Quantizing on the CPU (nf4, int8) builds a 16-bit copy of each weight before bnb packs it, and glibc may keep
# the freed copies in its arenas. SmolLM2-135M nf4 loaded after another model in the same process: 203.5 MiB
# beyond the weights = its 106.2 M quantized parameters at 2 bytes (202.5 MiB); after a malloc_trim: 39.1 MiB.
# The worst case is counted (held memory is reusable by the KV cache, so only what it exceeds that by is extra).
CPU_QUANTIZE_STAGING_FRACTION = 1.0

# Prefill activations per token of a prefill chunk, as multiples of the layer widths at the compute dtype: the
# residual stream, q/k/v/o and MLP intermediates alive at once (SDPA keeps no seq x seq scores here: the growth
# did not depend on the cached length). Fitted to peak-RSS (VmHWM) growth over one 512-token forward on top of
# 512 cached tokens, after malloc_trim, minus the KV it added (bench/memory.py): SmolLM2-135M 24.5 MiB (bf16) and
# 23.1 MiB (nf4); with the other overhead parts the formula gives 24.8 and 26.5 MiB. 1-token forwards: 4.7-5.8 MiB.
ACTIVATION_HIDDEN_COPIES = 12.0  # x hidden_size
ACTIVATION_INTERMEDIATE_COPIES = 6.0  # x intermediate_size (gate, up, act(gate) * up, and their bf16/fp32 copies)
# bnb's CPU 4-bit matmul dequantizes the whole weight per call; nf4 prefill peaks measured 23.1 and 33.6 MiB in two
# runs vs 24.5-25.3 MiB for bf16: counted as a bf16 copy plus an fp32 one of the largest quantized weight.
CPU_DEQUANT_BYTES_PER_WEIGHT = 6
ACTIVATION_FLOOR_BYTES = 8 * MiB  # small tensors, rotary tables, masks: the 1-token measurements rounded up

# --- CUDA (not measured here: no GPU was lent to this task) -----------------------------------------------------
# CUDA context + cuBLAS workspace with CUDA 12 lazy module loading: ~300-600 MiB on Hopper/Ampere in PyTorch's own
# docs and issue reports (pytorch#20532 et al.). Counted only when the free memory is stated (--free): a measured
# free (torch.cuda.mem_get_info) is taken after this process created its context, so it already excludes it.
CUDA_CONTEXT_BYTES = 512 * MiB
# The caching allocator rounds blocks up (2 MiB small / 20 MiB large segments) and keeps freed blocks reserved:
# budget 3 % of what lives on the GPU plus one large segment. An estimate until bench/memory.py runs on a GPU.
CUDA_ALLOCATOR_SLACK_FRACTION = 0.03
CUDA_ALLOCATOR_SLACK_MIN_BYTES = 20 * MiB
