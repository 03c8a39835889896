"""The torch-free CPU runtime: a q4 model run from its packed Q4_1 copy with numpy and the kernel library alone.

torch, transformers and what a model load imports hold ~0.3 GiB of a process before any weight (see the README's
"Memory" sections); this runtime never imports them (an import-linter contract holds it to that), so a process
that runs a model through it holds the weights, the KV cache and little else.
"""
