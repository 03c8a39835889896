"""Faster single-token (decode) steps on the CPU, chosen per loaded model, with an honest fallback.

A decode path changes how the model's linear layers run one token at a time; prefill (many tokens per call) always
runs the plain weights, so prefill speed and the KV cache are untouched. Every path is probed on a small matrix
before use; any failure leaves the plain (eager) path in place and says why in `DecodePathChoice.note`, which the
engine reports in ReplyStats.decode_path_note.

Measured on the 2-core AVX2 CI machine (bench/engine_speed.py, SmolLM2-135M-Instruct, see docs/speed.md):
- bf16 weights, plain torch F.linear at batch 1: ~7–10 GB/s effective; weight-only int8 (torch's
  `_weight_int8pack_mm`, bf16 activations) runs the decoder's matrices 1.3–1.8× faster per call.
- The tied 49k×576 lm_head is no faster in int8 (same time as bf16), so it stays in the model's dtype: the logits
  keep their precision.
- bitsandbytes 0.50's packed CPU 4-bit path needs AVX512-BF16 (`has_avx512bf16`); without it every NF4 matmul
  dequantizes the whole weight first. NF4 on such CPUs is routed through int4 repacking (`int4` below).
"""
