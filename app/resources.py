"""The one place that finds bundled files (icons, curated model lists, styles), in a checkout or a frozen build.

A checkout keeps them in the top-level `resources/`; a PyInstaller bundle puts that folder under
`sys._MEIPASS`; an installed wheel has neither, so HEARTH_RESOURCES may point at a copy.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def resources_dir() -> Path:
    candidates: list[Path] = []
    if override := os.environ.get("HEARTH_RESOURCES"):
        candidates.append(Path(override))
    frozen_root = getattr(sys, "_MEIPASS", None)
    if frozen_root:
        candidates.append(Path(frozen_root) / "resources")
    candidates.append(Path(__file__).resolve().parent.parent / "resources")
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"Hearth's resources folder was not found (looked in {', '.join(map(str, candidates))}).")


def resource_path(*parts: str) -> Path:
    """Path of a bundled file; raises FileNotFoundError naming it if it is missing."""
    path = resources_dir().joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(f"Bundled resource missing: {path}")
    return path


def is_frozen() -> bool:
    return bool(getattr(sys, "frozen", False))
