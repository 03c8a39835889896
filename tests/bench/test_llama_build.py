"""The ggml flags bench/llama_build.py picks from a CPU's feature flags (never this machine's: each case names its own
flags)."""

from __future__ import annotations

from bench.llama_build import ggml_cpu_args

ZEN4 = {"sse4_2", "avx", "avx2", "bmi2", "fma", "f16c", "avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"}
ZEN4 |= {"avx512vbmi", "avx512_vnni", "avx512_bf16"}
SAPPHIRE_RAPIDS = ZEN4 | {"avx_vnni", "amx_tile", "amx_int8", "amx_bf16"}
HASWELL = {"sse4_2", "avx", "avx2", "bmi2", "fma", "f16c"}


def _options(flags: set[str], machine: str = "x86_64") -> dict[str, str]:
    args = ggml_cpu_args(machine, flags)
    return dict(arg.removeprefix("-D").split("=") for arg in args)


def test_avx512_cpu_gets_avx512_and_never_amx() -> None:
    options = _options(ZEN4)
    assert options["GGML_NATIVE"] == "OFF"
    for name in ("GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_AVX512", "GGML_AVX512_VNNI", "GGML_AVX512_BF16"):
        assert options[name] == "ON", name
    assert options["GGML_AVX_VNNI"] == "OFF"
    assert [options[f"GGML_AMX_{n}"] for n in ("TILE", "INT8", "BF16")] == ["OFF"] * 3


def test_amx_cpu_still_gets_no_amx() -> None:
    options = _options(SAPPHIRE_RAPIDS)
    assert options["GGML_AVX512_VNNI"] == options["GGML_AVX_VNNI"] == "ON"
    assert [options[f"GGML_AMX_{n}"] for n in ("TILE", "INT8", "BF16")] == ["OFF"] * 3


def test_avx2_cpu_gets_no_avx512() -> None:
    options = _options(HASWELL)
    assert options["GGML_AVX2"] == options["GGML_FMA"] == "ON"
    assert options["GGML_AVX512"] == options["GGML_AVX512_VNNI"] == options["GGML_AVX512_BF16"] == "OFF"


def test_avx512_without_bw_is_off() -> None:
    """ggml's GGML_AVX512 compiles with -mavx512bw (and cd, vl, dq): a CPU with avx512f alone must not get it."""
    options = _options(HASWELL | {"avx512f", "avx512_vnni"})
    assert options["GGML_AVX512"] == options["GGML_AVX512_VNNI"] == "OFF"


def test_old_x86_turns_off_what_ggml_would_default_on() -> None:
    """With GGML_NATIVE off ggml defaults AVX/AVX2/FMA/F16C/BMI2 on: an SSE-only CPU needs each written off."""
    options = _options({"sse4_2"})
    assert options["GGML_SSE42"] == "ON"
    for name in ("GGML_AVX", "GGML_AVX2", "GGML_BMI2", "GGML_FMA", "GGML_F16C"):
        assert options[name] == "OFF", name


def test_arm_keeps_the_native_build() -> None:
    assert ggml_cpu_args("aarch64", {"asimd", "asimddp"}) == ["-DGGML_NATIVE=ON"]


def test_a_cap_builds_the_peer_as_for_a_lesser_cpu_on_this_one() -> None:
    """bench-peer PEER_CAP=avx2 / avxvnni: llama.cpp beside Hearth's AVX2 and AVX-VNNI kernels, on an AMX machine."""
    avx2 = dict(arg.removeprefix("-D").split("=") for arg in ggml_cpu_args("x86_64", SAPPHIRE_RAPIDS, cap="avx2"))
    assert avx2["GGML_AVX2"] == avx2["GGML_FMA"] == "ON"
    assert avx2["GGML_AVX_VNNI"] == avx2["GGML_AVX512"] == avx2["GGML_AVX512_VNNI"] == "OFF"
    vnni = dict(arg.removeprefix("-D").split("=") for arg in ggml_cpu_args("x86_64", SAPPHIRE_RAPIDS, cap="avxvnni"))
    assert vnni["GGML_AVX_VNNI"] == "ON" and vnni["GGML_AVX512"] == "OFF"
    # a cap never adds what the CPU lacks
    assert (
        dict(a.removeprefix("-D").split("=") for a in ggml_cpu_args("x86_64", HASWELL, cap="avxvnni"))["GGML_AVX_VNNI"]
        == "OFF"
    )
