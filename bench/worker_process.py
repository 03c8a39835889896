"""One measurement in a fresh process (`python SCRIPT --worker KIND`, its spec as JSON on stdin, its result as the last
line of stdout), and what to say when one dies: which signal, what it printed, and which llama.cpp build ran."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from bench.llama_build import PEER_VERSION, llama_commit

_BUILD_INFO = """
import json, pathlib, sys
import llama_cpp
stamp = pathlib.Path(sys.prefix) / "hearth-cmake-args"  # the CMAKE_ARGS `make bench-peer` built it with
print(json.dumps({
    "version": llama_cpp.__version__,
    "system": llama_cpp.llama_print_system_info().decode(errors="replace"),
    "cmake_args": stamp.read_text().strip() if stamp.exists() else "",
}))
"""


def llama_build(peer_python: str) -> dict[str, str]:
    """The llama-cpp-python in `peer_python`: its version, ggml's CPU features as compiled, the CMAKE_ARGS that
    `make bench-peer` built it with ("" when something else built it); {"error": ...} where it can't be imported."""
    found = subprocess.run([peer_python, "-c", _BUILD_INFO], capture_output=True, text=True, check=False)
    if found.returncode != 0:
        return {"error": _death(found.returncode) + ": " + (found.stderr.strip()[-500:] or "it printed nothing")}
    return dict(json.loads(found.stdout.strip().splitlines()[-1]))


def ggml_features(system_info: str) -> list[str]:
    """The features ggml was compiled with, from llama_print_system_info ("CPU : AVX2 = 1 | AMX_INT8 = 1 | ...")."""
    found = []
    for part in system_info.replace("CPU :", "|").split("|"):
        name, _, value = part.partition("=")
        if value.strip() == "1":
            found.append(name.strip())
    return found


def describe_build(build: dict[str, str]) -> str:
    if "error" in build:
        return f"unknown (importing llama_cpp failed: {build['error']})"
    version = build["version"]
    commit = f" (llama.cpp {llama_commit()})" if version == PEER_VERSION else ""
    args = build["cmake_args"] or "not recorded (not built by `make bench-peer`)"
    features = " ".join(ggml_features(build["system"]))
    return f"llama-cpp-python {version}{commit}; CMAKE_ARGS {args}; ggml CPU: {features}"


def llama_build_line(peer_python: str) -> str:
    return describe_build(llama_build(peer_python))


def _death(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


def failure_message(kind: str, returncode: int, stderr: str, build: dict[str, str] | None = None) -> str:
    """What went wrong in a worker, never an empty reason: how it ended, the tail of what it printed, and for a
    llama.cpp worker the build that ran and, for a crash in an AMX build, the known cause and the fix."""
    lines = [f"the {kind} worker {_death(returncode)}"]
    tail = stderr.strip()[-3000:]
    lines.append(tail if tail else "(it printed nothing on stderr)")
    if build is not None:
        lines.append(f"llama.cpp build: {describe_build(build)}")
        crashed = returncode in (-signal.SIGSEGV, -signal.SIGILL, -signal.SIGBUS, -signal.SIGABRT)
        if crashed and any(f.startswith("AMX") for f in ggml_features(build.get("system", ""))):
            lines.append(
                "This llama.cpp was built with AMX: on Intel Xeons with AMX (KVM guests) such a build segfaults in "
                "ggml_backend_amx_mul_mat on its first multi-token batch. Rebuild it without AMX: `make bench-peer` "
                "does (CMAKE_ARGS from `python bench/llama_build.py --cmake-args`)."
            )
        elif returncode == -signal.SIGILL:
            lines.append(
                "An illegal instruction: the build uses a CPU extension this CPU lacks; `make bench-peer` rebuilds "
                "it with this CPU's flags."
            )
    return "\n".join(lines)


def run_worker(
    python: str, script: Path, kind: str, spec: dict[str, Any], peer_python: str | None = None
) -> dict[str, Any]:
    """Run `script --worker kind` in `python`; its result. A failure exits with failure_message (with the llama.cpp
    build when `peer_python` is the Python that ran it). faulthandler is on, so a crash prints the Python stack."""
    proc = subprocess.run(
        [python, "-X", "faulthandler", str(script), "--worker", kind],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "TQDM_DISABLE": "1", "TRANSFORMERS_VERBOSITY": "error"},
    )
    if proc.returncode != 0:
        build = llama_build(python) if peer_python is not None and python == peer_python else None
        raise SystemExit(failure_message(kind, proc.returncode, proc.stderr, build))
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))
