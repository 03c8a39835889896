"""The GPU check's rehearsal (issue 28 §4): bench/gpu_check.sh --tiny, run to the end by a venv that holds only what
the lent GPU image holds (its packages at its versions) plus the wheels `make gpu-wheels` carries, so that the check's
imports, planner and loader path fail here, not in the 15 minutes of a GPU lease.

Where the image's exact build cannot be had: torch is the CPU wheel (2.13.0 from this machine's disk, where there is
one, for the image's CUDA 2.11.0), Python is this one (the image has 3.12), and numpy the newest for it (the image's
2.5.2 needs 3.12); the carried wheels are the same versions, downloaded for this Python (bench/gpu_wheels.py
--for-this-python). The venv is kept (keyed by this file's pins) under the user cache: building it takes minutes.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
TORCH_WHEELS = sorted(Path("/opt/wheels").glob("torch-2.13.0+cpu-*.whl"))
IMAGE_PACKAGES = [
    "transformers==5.17.0", "accelerate==1.15.0", "safetensors==0.8.0", "tokenizers==0.23.2",
    "huggingface_hub==1.33.0", "psutil", "threadpoolctl",
    "numpy==2.5.2" if sys.version_info >= (3, 12) else "numpy<2.5",
]  # fmt: skip
# Pulled in by the packages above here, but not in the image: removed, so the carried wheels must bring them.
NOT_IN_IMAGE = ["pydantic", "pydantic_core", "annotated-types", "typing-inspection", "platformdirs", "gguf"]
REHEARSAL_DIR = Path(os.environ.get("HEARTH_REHEARSAL_DIR", Path.home() / ".cache" / "hearth" / "gpu-rehearsal"))


def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]


def image_venv() -> Path:
    """The image's stand-in venv (built once per set of pins), or pytest.skip when no package index answers."""
    pins = "\n".join([*IMAGE_PACKAGES, *NOT_IN_IMAGE, *(p.name for p in TORCH_WHEELS), sys.version])
    folder = REHEARSAL_DIR / hashlib.sha256(pins.encode()).hexdigest()[:12]
    python = folder / "venv" / "bin" / "python"
    if (folder / "ready").exists():
        return python
    folder.mkdir(parents=True, exist_ok=True)
    assert run([sys.executable, "-m", "venv", "--clear", str(folder / "venv")]).returncode == 0
    torch = [str(TORCH_WHEELS[-1])] if TORCH_WHEELS else ["torch==2.11.0"]
    installed = run([str(python), "-m", "pip", "install", "-q", *torch, *IMAGE_PACKAGES], timeout=1500)
    if installed.returncode != 0:
        pytest.skip(f"the image's packages could not be installed here (no package index?): {installed.stderr[-500:]}")
    assert run([str(python), "-m", "pip", "uninstall", "-q", "-y", *NOT_IN_IMAGE]).returncode == 0
    (folder / "ready").write_text(pins)
    return python


@pytest.mark.rehearsal
def test_the_gpu_check_runs_to_the_end_on_the_images_packages_plus_the_carried_wheels(tmp_path: Path) -> None:
    python = image_venv()
    missing = run([str(python), "-c", "import pydantic"])
    assert missing.returncode != 0  # as in the image: the carried wheels must bring it
    wheels = REHEARSAL_DIR / "wheels"
    fetched = run(
        [str(python), str(REPO_ROOT / "bench" / "gpu_wheels.py"), "--out", str(wheels), "--for-this-python"],
        timeout=900,
    )
    if fetched.returncode != 0 and "No matching distribution" not in fetched.stderr:
        pytest.skip(f"the carried wheels could not be downloaded here (no package index?): {fetched.stderr[-500:]}")
    assert fetched.returncode == 0, fetched.stderr[-2000:]
    bnb = next(wheels.glob("bitsandbytes-*.whl"))
    assert bnb.stat().st_size < 8 << 20  # trimmed to the CUDA 13 and CPU libraries (the whole wheel: 43 MB)
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HEARTH_CACHE_DIR")},
        "PYTHON": str(python),
        "GPU_WHEELS": str(wheels),
        "HEARTH_HOME": str(tmp_path / "home"),
        "HEARTH_CACHE_DIR": str(tmp_path / "cache"),
    }
    result = run(
        ["bash", str(REPO_ROOT / "bench" / "gpu_check.sh"), "--tiny", "--prompt-tokens", "64", "--new-tokens", "4",
         "--agreement"],
        env=env, timeout=900, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    out = result.stdout
    assert f"installed {len(list(wheels.glob('*.whl')))} wheels" in out
    assert out.count("RESULT ") == 2 and "nf4: decode" in out and "bf16: decode" in out
    assert "NF4 vs bf16 on the default model: skipped: no default model here" in out  # as on the GPU machine
