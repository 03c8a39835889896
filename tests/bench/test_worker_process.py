"""What bench/worker_process.py says when a worker dies: how, what it printed, and which llama.cpp build ran."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from bench.worker_process import failure_message, ggml_features, run_worker

AMX_BUILD = {
    "version": "0.3.36",
    "system": "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | AMX_INT8 = 1 | LLAMAFILE = 1 | REPACK = 0 |",
    "cmake_args": "",
}


def test_segfault_with_empty_stderr_is_named_with_the_amx_cause() -> None:
    message = failure_message("llama", -signal.SIGSEGV, "", AMX_BUILD)
    assert "the llama worker was killed by SIGSEGV" in message
    assert "(it printed nothing on stderr)" in message
    assert "llama-cpp-python 0.3.36" in message and "AMX_INT8" in message
    assert "not recorded (not built by `make bench-peer`)" in message
    assert "ggml_backend_amx_mul_mat" in message and "make bench-peer" in message


def test_segfault_without_amx_gives_no_amx_advice() -> None:
    build = {**AMX_BUILD, "system": "CPU : AVX2 = 1 | AVX512 = 1 |", "cmake_args": "-DGGML_NATIVE=OFF"}
    message = failure_message("llama", -signal.SIGSEGV, "Fatal Python error: Segmentation fault", build)
    assert "Fatal Python error: Segmentation fault" in message
    assert "CMAKE_ARGS -DGGML_NATIVE=OFF" in message
    assert "ggml_backend_amx_mul_mat" not in message


def test_illegal_instruction_says_the_build_does_not_fit_this_cpu() -> None:
    message = failure_message("llama", -signal.SIGILL, "", {**AMX_BUILD, "system": "CPU : AVX512 = 1 |"})
    assert "killed by SIGILL" in message and "CPU extension this CPU lacks" in message


def test_hearth_worker_exit_code() -> None:
    message = failure_message("hearth", 1, "Traceback ...\nValueError: bad")
    assert message.startswith("the hearth worker exited with code 1")
    assert "ValueError: bad" in message and "llama.cpp build" not in message


def test_ggml_features() -> None:
    assert ggml_features(AMX_BUILD["system"]) == ["SSE3", "AVX2", "AVX512", "AVX512_VNNI", "AMX_INT8", "LLAMAFILE"]


def test_a_real_crashed_worker_is_named(tmp_path: Path) -> None:
    """A worker process that segfaults (ctypes reads address 0) ends the run with the signal and its Python stack;
    the Python that ran it has no llama_cpp, so the build is reported as unknown with the import error."""
    script = tmp_path / "crashes.py"
    script.write_text("import ctypes\nctypes.string_at(0)\n")
    with pytest.raises(SystemExit) as ended:
        run_worker(sys.executable, script, "llama", {}, peer_python=sys.executable)
    message = str(ended.value)
    assert message.startswith("the llama worker was killed by SIGSEGV")
    assert "Fatal Python error: Segmentation fault" in message  # faulthandler's stack
    assert "llama.cpp build: unknown (importing llama_cpp failed" in message


def test_a_worker_result_is_its_last_stdout_line(tmp_path: Path) -> None:
    script = tmp_path / "answers.py"
    script.write_text(
        "import json, sys\nspec = json.load(sys.stdin)\nprint('noise')\nprint(json.dumps({'x': spec['x']}))\n"
    )
    assert run_worker(sys.executable, script, "hearth", {"x": 3}) == {"x": 3}
