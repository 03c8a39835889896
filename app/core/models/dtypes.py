"""The safetensors header's names for float dtypes, as torch dtypes (app.core.models.safetensors_header stays
torch-free for the torch-free runtime)."""

from __future__ import annotations

import torch

FLOAT_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
