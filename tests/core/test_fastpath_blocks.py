"""The GGUF block kernels (hearth_gg_*): every format against gguf.quants (ggml's reference in numpy) on every x86
build this CPU runs.

- Dequantization is bit for bit gguf.quants' (every product in it is exact in fp32).
- Products agree with the exact product of the dequantized weights and the input within the activation bound: inputs
  are quantized per 32 values to int8 (a step of max|x| / 127) or, precise, to 15 bits (max|x| / 32512), so each
  chunk's error is at most half a step times the chunk's sum of |w|; 2 % (int8) and 0.02 % (15 bits) of the largest
  output bound it on these inputs with room.
- A row's result is the same bits whether its input is one of many (prefill) or alone (a decode step), in any tile
  and with any thread count: what makes a reused prefix, a batch and a lone request agree.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from app.core.fastpath import blocks, cpu, kernel, prefetch
from tests.helpers.gguf_files import random_blocks
from tests.helpers.x86_builds import KERNEL_DIR

TYPES = [blocks.Q4_0, blocks.Q4_1, blocks.Q5_0, blocks.Q5_1, blocks.Q8_0, blocks.Q4_K, blocks.Q5_K, blocks.Q6_K]
FLOAT_TYPES = [blocks.F32, blocks.F16, blocks.BF16]
PRODUCT_BOUND = 0.02  # int8 inputs
PRECISE_BOUND = 2e-4  # 15-bit inputs: a step 256 times finer


def float_blocks(kind: int, rows: int, cols: int, seed: int = 1) -> np.ndarray:
    values = (np.random.default_rng(seed).standard_normal((rows, cols)) * 0.05).astype(np.float32)
    if kind == blocks.F32:
        return values.view(np.uint8).reshape(rows, -1)
    return np.ascontiguousarray(quants.quantize(values, GGMLQuantizationType(kind))).view(np.uint8).reshape(rows, -1)


def weights_of(kind: int, rows: int, cols: int) -> np.ndarray:
    return float_blocks(kind, rows, cols) if kind in FLOAT_TYPES else random_blocks(kind, rows, cols, seed=kind)


def reference(kind: int, data: np.ndarray, rows: int, cols: int) -> np.ndarray:
    return quants.dequantize(data, GGMLQuantizationType(kind)).reshape(rows, cols).astype(np.float32)


@pytest.fixture(scope="module")
def lib(run_library: kernel.NativeLibrary) -> Any:
    return run_library.lib


@pytest.fixture(scope="module")
def builds(x86_kernel_builds: dict[str, Path]) -> dict[str, Any]:
    """The kernel built as each shipped x86 target this CPU can run (the AVX-512 VNNI, AVX-VNNI, AVX2 and scalar
    code), loaded."""
    found: dict[str, Any] = {}
    for name, target in x86_kernel_builds.items():
        library = ctypes.CDLL(str(target))
        assert blocks.declare(library) == ""
        # the AVX-VNNI build's loops really are on vpdpbusd: else its bits would match AVX2's trivially
        assert library.hearth_avx_vnni() == (name == "avx-vnni"), name
        found[name] = library
    return found


@pytest.mark.parametrize("kind", TYPES + FLOAT_TYPES, ids=blocks.type_name)
def test_dequantization_is_ggml_s_bit_for_bit(kind: int, builds: dict[str, Any]) -> None:
    rows, cols = 5, 512
    data = weights_of(kind, rows, cols)
    expected = reference(kind, data, rows, cols)
    for name, library in builds.items():
        out = blocks.dequantize(library, kind, data.reshape(-1), rows * cols).reshape(rows, cols)
        assert np.array_equal(out.view(np.uint32), expected.view(np.uint32)), name


@pytest.mark.parametrize("precise", [False, True], ids=["int8", "15-bit"])
@pytest.mark.parametrize("kind", TYPES + FLOAT_TYPES, ids=blocks.type_name)
def test_products_agree_with_the_exact_product_in_every_build(kind: int, precise: bool, builds: dict[str, Any]) -> None:
    rows, cols, n = 37, 768, 6
    data = weights_of(kind, rows, cols)
    x = np.random.default_rng(2).standard_normal((n, cols)).astype(np.float32)
    x[:, 5] *= 40  # an outlier channel, as real activations have: what 8 bits per 32 values lose precision to
    bias = np.linspace(-1, 1, rows, dtype=np.float32)
    exact = x.astype(np.float64) @ reference(kind, data, rows, cols).astype(np.float64).T + bias
    bound = 1e-5 if kind in FLOAT_TYPES else PRECISE_BOUND if precise else PRODUCT_BOUND
    for name, library in builds.items():
        y = blocks.matmul(library, kind, data.reshape(-1), rows, x, threads=2, bias=bias, precise=precise)
        error = np.abs(y - exact).max() / np.abs(exact).max()
        assert error < bound, f"{name}: {error}"


@pytest.mark.parametrize("precise", [False, True], ids=["int8", "15-bit"])
@pytest.mark.parametrize("kind", TYPES + FLOAT_TYPES, ids=blocks.type_name)
def test_a_rows_result_does_not_depend_on_its_batch_tile_or_threads(
    kind: int, precise: bool, builds: dict[str, Any]
) -> None:
    # 7 inputs (tiles of 4 and 3) against each alone, the last 4 (one tile) and the first 2; 130 rows of 1024 values:
    # several row blocks (GG_BLOCK_BYTES) for the float and 8-bit types, each tile meeting a block's rows in turn
    rows, cols, n = 130, 1024, 7
    data = weights_of(kind, rows, cols).reshape(-1)
    x = np.random.default_rng(3).standard_normal((n, cols)).astype(np.float32)
    for name, library in builds.items():
        together = blocks.matmul(library, kind, data, rows, x, threads=2, precise=precise)
        for k in range(n):
            alone = blocks.matmul(library, kind, data, rows, x[k : k + 1], threads=1, precise=precise)[0]
            assert np.array_equal(alone, together[k]), f"{name}, input {k}"
        shifted = blocks.matmul(library, kind, data, rows, x[3:], threads=2, precise=precise)
        assert np.array_equal(shifted, together[3:]), name
        pair = blocks.matmul(library, kind, data, rows, x[:2], threads=2, precise=precise)
        assert np.array_equal(pair, together[:2]), name


def test_the_simd_builds_agree_with_the_scalar_loops(builds: dict[str, Any]) -> None:
    """Integer dot products are exact everywhere; the float sums run in another order per build: close, not equal."""
    if "scalar" not in builds or len(builds) < 2:
        pytest.skip("needs the scalar build and a SIMD one")
    rows, cols = 16, 1024
    x = np.random.default_rng(4).standard_normal((3, cols)).astype(np.float32)
    for kind in TYPES:
        data = weights_of(kind, rows, cols).reshape(-1)
        for precise in (False, True):
            scalar = blocks.matmul(builds["scalar"], kind, data, rows, x, threads=1, precise=precise)
            for name, library in builds.items():
                y = blocks.matmul(library, kind, data, rows, x, threads=1, precise=precise)
                assert np.abs(y - scalar).max() <= 1e-5 * np.abs(scalar).max(), (name, blocks.type_name(kind))


def test_an_odd_number_of_blocks_is_handled(lib: Any) -> None:
    """576 values = 18 blocks of 32 (SmolLM2's width): the AVX-512 path's pairs end with a lone block."""
    rows, cols = 9, 32 * 9
    for kind in (blocks.Q4_0, blocks.Q4_1, blocks.Q5_0, blocks.Q5_1, blocks.Q8_0):
        data = weights_of(kind, rows, cols)
        x = np.random.default_rng(5).standard_normal((2, cols)).astype(np.float32)
        exact = x.astype(np.float64) @ reference(kind, data, rows, cols).astype(np.float64).T
        y = blocks.matmul(lib, kind, data.reshape(-1), rows, x, threads=2)
        assert np.abs(y - exact).max() / np.abs(exact).max() < PRODUCT_BOUND


def test_types_and_shapes_it_does_not_take_are_refused_by_name(lib: Any) -> None:
    with pytest.raises(ValueError, match="IQ4_XS is not a type the kernel computes on"):
        blocks.row_bytes(int(GGMLQuantizationType.IQ4_XS), 256)
    with pytest.raises(ValueError, match="rows of 96 values do not divide into Q4_K blocks of 256"):
        blocks.row_bytes(blocks.Q4_K, 96)
    data = weights_of(blocks.Q4_0, 4, 64).reshape(-1)
    with pytest.raises(ValueError, match="holds 144 bytes, not 8 rows of 64"):
        blocks.matmul(lib, blocks.Q4_0, data, 8, np.zeros((1, 64), np.float32), threads=1)
    with pytest.raises(ValueError, match="are not whole Q4_K blocks"):
        blocks.dequantize(lib, blocks.Q4_K, np.zeros(144, np.uint8), 100)
    assert blocks.type_name(int(GGMLQuantizationType.IQ4_XS)) == "IQ4_XS"


def test_the_library_reports_the_block_geometry_python_assumes(lib: Any) -> None:
    assert blocks.declare(lib) == ""
    for kind, (values, size) in blocks.GEOMETRY.items():
        assert (values, size) == quants.GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
    assert Path(KERNEL_DIR / "hearth_decode.c").is_file()


def test_a_library_whose_16_row_layout_differs_is_refused(lib: Any) -> None:
    """The layouts' sizes are Python's to allocate: a library that lays a Q4_K block out in other bytes is refused."""

    class OtherLayout:
        def __getattr__(self, name: str) -> Any:
            return getattr(lib, name)

        @staticmethod
        def hearth_gg_x16_bytes(kind: int, rows: int, cols: int) -> int:
            return rows * cols // 256 * 144 if kind == blocks.Q4_K else -1  # the file's packed scales, not bytes

    assert blocks.declare(OtherLayout()) == "its Q4_K 16-row layout does not match this Hearth"


@pytest.mark.parametrize("precise", [False, True], ids=["int8", "15-bit"])
@pytest.mark.parametrize("kind", sorted(blocks.X16_GEOMETRY), ids=blocks.type_name)
def test_the_16_row_layout_computes_what_the_file_s_rows_do(kind: int, precise: bool, builds: dict[str, Any]) -> None:
    """Every quantized type's matrices laid out 16 rows at a time (AVX-512, AVX-VNNI and AVX2 builds): the exact
    product within the activation bound, the row layout's result to float rounding, every row's result the same bits
    alone, in any tile and on any threads, and the same bits in every build (their integer sums are exact and their
    float operations the same); the scalar build has no layout (None) and the load keeps the file's rows. 11 inputs:
    AVX-512 takes K-quants 8 at a time, then 3; 8 of them (x[3:]) make one such tile. Tiles of 8 (AVX2: 4) inputs
    are read from the copy that lays them side by side (gtile_put), the rest from each input's own buffers: the
    same bits either way."""
    rows, cols, n = 96, 768, 11
    data = weights_of(kind, rows, cols).reshape(-1)
    x = np.random.default_rng(6).standard_normal((n, cols)).astype(np.float32)
    x[:, 5] *= 40
    bias = np.linspace(-1, 1, rows, dtype=np.float32)
    exact = x.astype(np.float64) @ reference(kind, data.reshape(rows, -1), rows, cols).astype(np.float64).T + bias
    results: dict[str, np.ndarray] = {}
    for name, library in builds.items():
        layout = blocks.repack_x16(library, kind, data, rows, cols, threads=2)
        if name == "scalar":
            assert layout is None
            continue
        assert layout is not None, name
        code, packed = layout
        assert code == blocks.X16 + kind and packed.nbytes == rows * blocks.row_bytes(code, cols)
        before = library.hearth_tiled_calls()
        together = blocks.matmul(library, code, packed, rows, x, threads=2, bias=bias, precise=precise)
        assert library.hearth_tiled_calls() > before, name  # the inputs' tiles were read
        assert np.abs(together - exact).max() / np.abs(exact).max() < (PRECISE_BOUND if precise else PRODUCT_BOUND)
        by_rows = blocks.matmul(library, kind, data, rows, x, threads=2, bias=bias, precise=precise)
        assert np.abs(together - by_rows).max() <= 1e-5 * np.abs(by_rows).max()
        before = library.hearth_tiled_calls()
        for k in range(n):
            alone = blocks.matmul(library, code, packed, rows, x[k : k + 1], threads=1, bias=bias, precise=precise)
            assert np.array_equal(alone[0], together[k]), f"input {k}"
        assert library.hearth_tiled_calls() == before, name  # one input: no tile
        assert np.array_equal(blocks.matmul(library, code, packed, rows, x[3:], 2, bias, precise), together[3:])
        results[name] = together
    if len(results) < 1:
        pytest.skip("no build with the 16-row layout runs on this CPU")
    first = next(iter(results.values()))
    assert all(np.array_equal(first, other) for other in results.values()), list(results)


@pytest.mark.parametrize("precise", [False, True], ids=["int8", "15-bit"])
@pytest.mark.parametrize("kind", [blocks.Q4_K, blocks.Q5_K, blocks.Q6_K], ids=blocks.type_name)
def test_a_long_prompt_s_values_unpacked_ahead_give_each_row_the_bits_it_has_alone(
    kind: int, precise: bool, builds: dict[str, Any]
) -> None:
    """A prompt of four tiles of inputs or more: the K-quants' values are unpacked into bytes once per block of rows and
    every tile reads them from there (x16_unpack_group): on the AVX-512 build Q5_K's, and Q6_K's under 15-bit inputs
    (Q4_K and Q6_K's 8-bit products unpack as they go), on the AVX2 build all three (AVX-VNNI: none). Either way each
    input's row is the bits it has alone, in a shorter prompt and in every build. 43 inputs: five tiles of 8 (AVX2:
    ten of 4) on the unpacked values, then 3 on the file's blocks; 4,096 rows of 512 values: several blocks of groups,
    one buffer reused for each."""
    rows, cols, n = 4096, 512, 43
    data = weights_of(kind, rows, cols).reshape(-1)
    x = np.random.default_rng(12).standard_normal((n, cols)).astype(np.float32)
    x[:, 7] *= 30
    # by (hearth_q4_kernel, hearth_avx_vnni): AVX-512, AVX2; AVX-VNNI and the rest unpack as they go
    unpacks_on = {(4, 0): kind == blocks.Q5_K or (kind == blocks.Q6_K and precise), (3, 0): True}
    results: dict[str, np.ndarray] = {}
    for name, library in builds.items():
        layout = blocks.repack_x16(library, kind, data, rows, cols, threads=2)
        if layout is None:
            continue
        code, packed = layout
        before = library.hearth_unpacked_calls()
        together = blocks.matmul(library, code, packed, rows, x, threads=2, precise=precise)
        unpacked = library.hearth_unpacked_calls() - before
        on_tiles = library.hearth_amx(-1) == 1  # AMX takes whole tiles of 16 inputs, unpacking in its own way
        build = (library.hearth_q4_kernel(), library.hearth_avx_vnni())
        assert (unpacked > 0) == (unpacks_on.get(build, False) and not on_tiles), (name, unpacked)
        for k in (0, 9, 31, 40, 42):
            alone = blocks.matmul(library, code, packed, rows, x[k : k + 1], threads=1, precise=precise)
            assert np.array_equal(alone[0], together[k]), f"{name}, input {k}"
        fewer = blocks.matmul(library, code, packed, rows, x[8:24], threads=1, precise=precise)  # AVX-512: as it goes
        assert np.array_equal(fewer, together[8:24]), name
        results[name] = together
    if not results:
        pytest.skip("no build with the 16-row layout runs on this CPU")
    first = next(iter(results.values()))
    assert all(np.array_equal(first, other) for other in results.values()), list(results)


def test_the_run_s_library_gives_the_bits_of_the_o1_build_of_its_kernel(lib: Any, builds: dict[str, Any]) -> None:
    """The builds these tests and tests/core/test_native_arm.py compare take -O1 for their compile time; the library
    a user runs is -O3 (compiled here at -march=native, or prebuilt). The optimiser never changes a bit (the float
    order is fixed by -ffp-contract=off and the intrinsics): the run's library and the -O1 build of the same kernel
    give the same products, every type, both layouts, 1, 4, 8 and 16 inputs at 8 and 15 bits."""
    same = [
        name
        for name, build in builds.items()
        if (build.hearth_q4_kernel(), build.hearth_avx_vnni()) == (lib.hearth_q4_kernel(), lib.hearth_avx_vnni())
    ]
    if not same:
        pytest.skip("no -O1 build here runs the kernel the run's library does")
    build = builds[same[0]]
    rows, cols = 48, 512
    x = np.random.default_rng(9).standard_normal((16, cols)).astype(np.float32)
    x[:, 3] *= 40
    for kind in TYPES:
        data = weights_of(kind, rows, cols).reshape(-1)
        layouts = [(kind, data, data)]
        ours, theirs = (
            blocks.repack_x16(lib, kind, data, rows, cols, 2),
            blocks.repack_x16(build, kind, data, rows, cols, 2),
        )
        if ours is not None and theirs is not None:
            assert ours[0] == theirs[0] and np.array_equal(ours[1], theirs[1]), blocks.type_name(kind)
            layouts.append((ours[0], ours[1], theirs[1]))
        for code, mine, other in layouts:
            for n in (1, 4, 8, 16):
                for precise in (False, True):
                    run = blocks.matmul(lib, code, mine, rows, x[:n], 2, precise=precise)
                    o1 = blocks.matmul(build, code, other, rows, x[:n], 2, precise=precise)
                    assert np.array_equal(run.view(np.uint32), o1.view(np.uint32)), (blocks.type_name(kind), code, n)


AMX = {"amx_tile", "amx_int8"} <= cpu.cpu_flags()


@pytest.mark.skipif(not AMX, reason="this CPU has no AMX tiles")
@pytest.mark.parametrize("precise", [False, True], ids=["int8", "15-bit"])
@pytest.mark.parametrize("kind", sorted(blocks.X16_GEOMETRY), ids=blocks.type_name)
def test_amx_tiles_give_the_vnni_loop_s_bits(kind: int, precise: bool, builds: dict[str, Any]) -> None:
    """The AVX-512 build's prefill on AMX tiles (whole tiles of 16 inputs; the rest and decode stay on VNNI): the
    same bits as its VNNI loop for every type, in both halves of a call that mixes them, on any threads."""
    library = builds["avx512-vnni"]
    rows, cols = 64, 1024
    data = weights_of(kind, rows, cols).reshape(-1)
    code, packed = blocks.repack_x16(library, kind, data, rows, cols, threads=2) or (0, data)
    x = np.random.default_rng(8).standard_normal((45, cols)).astype(np.float32)
    x[:, 7] *= 40
    bias = np.linspace(-1, 1, rows, dtype=np.float32)
    try:
        assert library.hearth_amx(1) == 1, "the CPU lists AMX but the kernel did not grant the tiles"
        before = library.hearth_amx_calls()
        for count, threads in ((16, 1), (45, 2), (32, 2)):  # 45: two tiles on AMX, 13 inputs on VNNI
            on_tiles = blocks.matmul(library, code, packed, rows, x[:count], threads, bias, precise)
            library.hearth_amx(0)
            on_vnni = blocks.matmul(library, code, packed, rows, x[:count], threads, bias, precise)
            library.hearth_amx(1)
            assert np.array_equal(on_tiles.view(np.uint32), on_vnni.view(np.uint32)), count
        assert library.hearth_amx_calls() > before  # the tiles ran
        library.hearth_amx(0)
        before = library.hearth_amx_calls()
        blocks.matmul(library, code, packed, rows, x, 2, bias, precise)
        assert library.hearth_amx_calls() == before  # off means off
    finally:
        library.hearth_amx(0)


def test_the_16_row_layout_takes_only_whole_groups_of_its_types(lib: Any) -> None:
    data = weights_of(blocks.Q4_K, 24, 256).reshape(-1)
    assert blocks.repack_x16(lib, blocks.Q4_K, data, 24, 256, threads=1) is None  # 24 rows: not whole groups of 16
    f16 = weights_of(blocks.F16, 16, 256).reshape(-1)
    assert blocks.repack_x16(lib, blocks.F16, f16, 16, 256, threads=1) is None  # float weights keep their rows
    assert blocks.type_name(blocks.X16 + blocks.Q6_K) == "Q6_K (16-row layout)"
    assert blocks.file_type(blocks.X16 + blocks.Q4_K) == blocks.Q4_K and blocks.file_type(blocks.F16) == blocks.F16


def silu_times(library: Any, g: np.ndarray, u: np.ndarray) -> np.ndarray:
    out = np.ascontiguousarray(g, dtype=np.float32).copy()
    up = np.ascontiguousarray(u, dtype=np.float32)
    library.hearth_silu_times(out.ctypes.data, up.ctypes.data, out.size)
    return out


def test_the_forward_s_activation_is_silu_with_the_same_bits_in_every_build_and_lane(builds: dict[str, Any]) -> None:
    """The GGUF forward's gated activation (silu(g) u through exp256's polynomial, not libm's expf): within a few
    float steps of the exact value over the whole range (e^-|g| never overflows; below float's range it is 0), the
    same bits whether a value runs in a vector's lanes or alone in the tail, and in every build (AVX-512, AVX2,
    scalar: what makes a reused prefix, a batch and a lone request agree, and ARM's NEON, checked under qemu)."""
    rng = np.random.default_rng(11)
    edges = np.array([-1e4, -100, -88, -87.3, -87.0, -20, -1e-3, -0.0, 0.0, 1e-8, 1e-3, 20, 88, 100, 1e4])
    g = np.concatenate([edges, rng.standard_normal(200) * 4, rng.uniform(-90, 90, 200)]).astype(np.float32)
    u = (rng.standard_normal(g.size) + 0.5).astype(np.float32)
    wide = g.astype(np.float64)
    e = np.exp(-np.abs(wide))
    exact = np.where(wide >= 0, wide, wide * e) / (1 + e) * u.astype(np.float64)
    results = {}
    for name, library in builds.items():
        together = silu_times(library, g, u)
        error = np.abs(together - exact) / np.maximum(np.abs(exact), 1e-30)
        assert error.max() < 1e-6, (name, g[error.argmax()], together[error.argmax()], exact[error.argmax()])
        alone = np.concatenate([silu_times(library, g[k : k + 1], u[k : k + 1]) for k in range(g.size)])
        assert together.tobytes() == alone.tobytes(), name  # the vector lanes give the one-at-a-time loop's bits
        results[name] = together
    assert "scalar" in results  # every x86-64 CPU runs it; the SIMD builds where this CPU has their instructions
    first = next(iter(results.values()))
    assert all(first.tobytes() == other.tobytes() for other in results.values()), list(results)


def test_forwards_of_a_few_rows_always_prefetch_and_one_row_or_a_prompt_take_the_setting(lib: Any) -> None:
    """Which 16-row products prefetch (a hint: the same bits either way, tested with the layouts and the forward):
    one input (a decode step) and a prompt's many follow the setting a load measured on steps; 2 to
    prefetch.FEW_ROWS inputs (a batch's step, a lookup check) always do, whatever it is."""
    try:
        for setting in (0, 1):
            lib.hearth_x16_prefetch(setting)
            counts = (1, 2, prefetch.FEW_ROWS, prefetch.FEW_ROWS + 1, 256)
            assert [lib.hearth_x16_prefetch_for(n) for n in counts] == [setting, 1, 1, setting, setting]
    finally:
        lib.hearth_x16_prefetch(1)  # the library's setting outlives the test: back to its default
