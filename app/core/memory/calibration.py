"""Overhead constants of the memory planner, each with where it came from. Torch-free.

Re-measure with `python bench/memory.py --calibrate` (it prints every number below, measured side by side).
"""

from __future__ import annotations

MiB = 1024**2

# --- CPU (measured) -------------------------------------------------------------------------------------------
# Measured on the 2-core CI box (torch 2.13 CPU, transformers 5.24, bitsandbytes 0.50.2), 2026-12-02, with
# bench/memory.py --calibrate: anonymous RSS (RssAnon) growth of a process across load_model() beyond the weights'
# own bytes was 20-60 MiB for SmolLM2-135M (bf16, nf4, int8) and under 10 MiB for the tiny test models: glibc arena
# slack plus transformers' loading bookkeeping. 64 MiB covers every case measured.
CPU_RUNTIME_BYTES = 64 * MiB

# Prefill activations per token of a prefill chunk, as multiples of the layer widths at the compute dtype: the
# residual stream, q/k/v/o and MLP intermediates alive at once in one decoder layer (SDPA keeps no seq x seq
# scores here: the growth did not depend on the cached length). Measured as peak-RSS (VmHWM) growth over one
# forward minus the KV it added, SmolLM2-135M on the CPU: bf16 4.7 MiB (1 token), 2.4 MiB (64), 13.7 MiB (512),
# 12.7 MiB (512 on top of 512 cached); nf4 5.8, 1.8, 11.9 MiB. The formula gives 15.9 MiB at 512 tokens.
ACTIVATION_HIDDEN_COPIES = 6.0  # x hidden_size
ACTIVATION_INTERMEDIATE_COPIES = 3.0  # x intermediate_size (gate, up, act(gate) * up)
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
