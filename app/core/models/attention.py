"""What a decoder config says about its attention (query heads, KV heads, head size) and what one layer's KV cache
holds per token: read here once for the fused decode kernel, the memory planner, the loader's shape checks and the
self-test. Torch-free."""

from __future__ import annotations

from typing import Any, NamedTuple


class AttentionShape(NamedTuple):
    heads: int
    kv_heads: int  # fewer than heads with grouped-query attention
    head_dim: int

    def kv_bytes_per_token(self, element_size: int) -> int:
        """One layer's keys and values for one token."""
        return 2 * self.kv_heads * self.head_dim * element_size


def attention_shape(config: Any) -> AttentionShape:
    """The attention shape of a decoder config (or one layer's config); AttributeError when it has no attention."""
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    return AttentionShape(heads, kv_heads, int(getattr(config, "head_dim", None) or config.hidden_size // heads))
