"""Memory planning (before a load) and live accounting (after it).

Only the torch-free types are re-exported here, so the GUI can import this package before torch is loaded;
import app.core.memory.planner / .accounting (which import torch) where the numbers are computed.
"""

from app.core.memory.types import DeviceMemory, Fit, MemoryPlan, MemorySnapshot, format_bytes, parse_size

__all__ = ["DeviceMemory", "Fit", "MemoryPlan", "MemorySnapshot", "format_bytes", "parse_size"]
