"""Both kinds of CPU for bitsandbytes' 4-bit layout, whichever this machine is (see app.core.models.bnb_cpu).

`bnb_cpu_kind` runs a test three ways:
- "this-cpu": as this machine is; bnb repacks at the first forward iff it has AVX512-BF16.
- "avx2-only": bnb's own switch off (layers built while it is patched never repack), and the planner told the same:
  an AVX2-only CPU's path, run for real on any CPU.
- "avx512bf16": bnb's switch and the planner say the CPU repacks, and `first_use` repacks every layer through bnb's
  own conversion (what its forward calls there), so the repacked layout is measured on any CPU; no forward runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from app.core.models import bnb_cpu


@dataclass(frozen=True)
class CpuKind:
    name: str
    repacks: bool  # whether the planner and the loaded layers should end up in bnb's repacked layout

    def first_use(self, model: torch.nn.Module) -> None:
        """What the first reply does to the weights' layout on this kind of CPU."""
        if self.name == "avx512bf16":
            from bitsandbytes.functional import _convert_weight_packed_for_cpu

            for module in model.modules():
                state = getattr(getattr(module, "weight", None), "quant_state", None)
                if state is not None and not bnb_cpu.is_repacked(state):
                    module.weight.data, module.weight.quant_state = _convert_weight_packed_for_cpu(
                        module.weight.data, state
                    )
            return
        with torch.inference_mode():
            model(input_ids=torch.tensor([[1, 504, 3458, 282]]))


@pytest.fixture(params=["this-cpu", "avx2-only", "avx512bf16"])
def bnb_cpu_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> CpuKind:
    import bitsandbytes.nn.modules as bnb_modules

    if request.param == "avx2-only":
        monkeypatch.setattr(bnb_modules, "has_avx512bf16", lambda: False)  # read by each Linear4bit when built
        monkeypatch.setattr(bnb_cpu, "cpu_repacks_4bit", lambda: False)
    elif request.param == "avx512bf16":  # tests of this kind never run a forward: the kernel may not run here
        monkeypatch.setattr(bnb_modules, "has_avx512bf16", lambda: True)
        monkeypatch.setattr(bnb_cpu, "cpu_repacks_4bit", lambda: True)
    return CpuKind(request.param, bnb_cpu.cpu_repacks_4bit())
