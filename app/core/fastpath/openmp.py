"""How long GCC's OpenMP runtime (libgomp) lets an idle thread spin, for the whole process: set by the app's entry
points before torch or the kernel loads the runtime, which reads it once, as it loads. Torch-free, import-light.

Why the whole process: torch and the kernel share one libgomp (the same soname: the first to load it wins). Where
torch loads it first, libgomp's default, 300,000 spins (on Intel a spin's PAUSE takes ~140 cycles: over 10 ms),
holds the core a descheduled partner needs whenever another program is busy. Measured on the default model, torch
runtime, beside one busy process of another application (2-core KVM guest): decode 26-48 tok/s and a 16-token
prefill 2.2-2.6 s with the default, 196-217 tok/s and 145-152 ms with 3,000; on a quiet machine 355-361 against
338-340 tok/s, prefill the same within noise (docs/gguf.md, "Busy cores").
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

SPIN_ENV = "GOMP_SPINCOUNT"
WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
OPENMP_SPIN_COUNT = "3000"


def user_chose_spin(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Whether the user set libgomp's spinning themselves (their choice stands)."""
    return SPIN_ENV in environ or WAIT_POLICY_ENV in environ


def prefer_short_spin(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Set GOMP_SPINCOUNT to OPENMP_SPIN_COUNT unless the user chose; True where it was set. Call before anything
    imports torch (a libgomp already loaded keeps what it read)."""
    if user_chose_spin(environ):
        return False
    environ[SPIN_ENV] = OPENMP_SPIN_COUNT
    return True
