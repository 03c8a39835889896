/* Hearth's fused decode step: one token through a Llama-family decoder in a single C call.
 *
 * Why: at batch 1 the plain PyTorch path spends most of a token in per-op dispatch and in matrix-vector kernels that
 * move 3-10 GB/s on a small CPU. Here the whole step (RMSNorm, fused QKV + RoPE + KV write, attention, O, gate/up +
 * SiLU, down, final norm, lm_head) runs in one OpenMP parallel region over packed weights (decoder matrices as int8
 * rows or Q4_1 blocks, the lm_head as int8 rows) and int8 activations, reading each weight byte once.
 *
 * Layouts (all row-major, contiguous; built by app/core/fastpath/native.py):
 *   int8 matrix [rows, cols] + fp32 scale [rows] (+ optional fp32 bias [rows]); y[r] = scale[r] * dot(q[r], x) + b[r]
 *   Q4_1 matrix [rows, cols]: groups of 16 rows, each [cols / 32] records of 320 bytes (see GROUP, RECORD)
 *   qkv rows: q heads, then k heads, then v heads (head_dim rows each)
 *   gate_up rows: int8 interleaved (2i = gate row i, 2i+1 = up row i); Q4_1 gate rows, then up rows
 *   lm_head: int8 rows + fp32 scale [vocab], in groups of 16 rows (see LM_RECORD; the last group zero-padded)
 *   KV cache per layer: [kv_heads][capacity][head_dim] in fp32 or bf16 (the same memory torch's cache views)
 *
 * Compiled at run time with -march=native (app/core/fastpath/native.py caches the library per source, compiler and
 * CPU); without AVX2+FMA it still computes correctly with scalar loops, and the Python side declines to use it.
 *
 * Architectures: x86-64 with AVX2+FMA (the Q4_1 matrices with AVX-512 VNNI where the build targets it), and AArch64
 * with NEON (always present there); anything else, scalar loops.
 * The NEON code mirrors the AVX2 code lane for lane (the same 8 float lanes per 32-value block as two 4-lane
 * registers, the same horizontal-sum order, FMA exactly where AVX2 uses one), so both give the same floats: the int8
 * dot products are exact on both, and with no implicit FMA contraction (gcc's default under -std=c11; clang needs
 * -ffp-contract=off) the float steps round alike.
 * tests/core/test_native_arm.py checks an AArch64 build under qemu against the x86 build on fixed inputs.
 */
#if defined(__linux__) && !defined(_DEFAULT_SOURCE)
#define _DEFAULT_SOURCE /* syscall(), for AMX's permission (hearth_amx) */
#endif
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if (defined(__x86_64__) || defined(__i386__)) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define HEARTH_AVX2 1
#else
#define HEARTH_AVX2 0
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define HEARTH_NEON 1
/* sdot (Armv8.2 DotProd: Apple M1+, Cortex-A55/A76+): 16 int8 MACs into 4 int32 lanes in one instruction. */
#if defined(__ARM_FEATURE_DOTPROD)
#define HEARTH_DOTPROD 1
#else
#define HEARTH_DOTPROD 0
#endif
#else
#define HEARTH_NEON 0
#define HEARTH_DOTPROD 0
#endif
#define HEARTH_SIMD (HEARTH_AVX2 || HEARTH_NEON)
/* AVX-512 with VNNI (Ice Lake, Zen 4 and later): the Q4_1 matrices run 16 rows per vpdpbusd. Elsewhere on x86 the
 * same layout runs on AVX2 (maddubs + madd, or AVX-VNNI's 256-bit vpdpbusd); which one is decided by the build's
 * target (-march=native here, or the prebuilt library native.py picks from the CPU's flags). */
#if HEARTH_AVX2 && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__F16C__)
#define HEARTH_AVX512 1
#else
#define HEARTH_AVX512 0
#endif
/* AVX-VNNI without AVX-512 (Intel's Alder Lake and later desktop and laptop cores): vpdpbusd on 256-bit vectors, so
 * the GGUF blocks' integer dot products take one instruction per 32 byte products where AVX2 takes maddubs and an
 * add (and a widening madd): the same exact integer sums, so the same bits as the AVX2 and AVX-512 builds.
 * -DHEARTH_NO_AVXVNNI keeps a -march=native build on AVX2 (HEARTH_KERNEL_TARGET=avx2). */
#if HEARTH_AVX2 && !HEARTH_AVX512 && defined(__AVXVNNI__) && !defined(HEARTH_NO_AVXVNNI)
#define HEARTH_AVXVNNI 1
#else
#define HEARTH_AVXVNNI 0
#endif

/* AMX tiles for prefill: an AVX-512 build for Linux on x86-64 with a compiler that knows them (not with
 * -DHEARTH_NO_AMX: an assembler that does not); used only where the CPU has them and the kernel grants them
 * (hearth_amx). */
#if !defined(HEARTH_NO_AMX) && HEARTH_AVX512 && defined(__linux__) && defined(__x86_64__) && (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11)
#define HEARTH_AMX_BUILT 1
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#define HEARTH_AMX_BUILT 0
#endif

#define HEARTH_ABI 15 /* also the numerics' version, which the prompt and response caches key on (9: exp256;
                          * 10: hearth_gg_forward_rows takes several tokens of a sequence and its logit rows;
                          * 11: every quantized type's matrices in 16-row layouts, their sums chunk after chunk;
                          * 12: a chunk's softmax weights summed in 8 lanes; hearth_amx;
                          * 13: hearth_step's attention chunks the same on any team size;
                          * 14: the GGUF matrices in 16-row layouts on Armv8.2 DotProd; hearth_tiled_calls;
                          * 15: the GGUF forward's SiLU through exp256's polynomial, not libm's expf) */

/* One library from several objects compiled side by side (app/core/fastpath/compile_parts.py, -DHEARTH_PART=k):
 * the three matrix drivers (gg_rows, x16_rows, amx_rows: four fifths of the code, every block type and tile size
 * inlined into each) are each compiled in a part of their own, everything else in part 0, so a first compile takes
 * the time of its biggest part where there are cores for them. The same code either way: the drivers are calls in one
 * object too (never inlined, too big), and the float order is fixed by the source. Without HEARTH_PART (the packaged
 * libraries, the test harnesses): one translation unit, every file-scope name static. (A DLL that marks none of its
 * exports, as mingw-w64 builds this one, exports every global: the drivers and shared state too, harmlessly, on
 * Windows.) */
#ifdef HEARTH_PART
#define HEARTH_DEFINES(part) (HEARTH_PART == (part)) /* this object holds that part's definitions */
#define HEARTH_DRIVER __attribute__((visibility("hidden")))
#else
#define HEARTH_DEFINES(part) 1
#define HEARTH_DRIVER static
#endif
#if defined(HEARTH_PART) && HEARTH_PART != 0
/* the exported calls: part 0's (static and unused here, so never emitted twice) */
#define HEARTH_API static __attribute__((unused))
/* state the parts share: part 0 defines it */
#define HEARTH_STATE(type, name, value) extern __attribute__((visibility("hidden"))) type name
#else
#define HEARTH_API
#define HEARTH_STATE(type, name, value) HEARTH_DRIVER type name = value
#endif

#ifdef HEARTH_PROFILE /* development builds only: time per phase on thread 0 */
static double profile_seconds[8];
static double profile_mark;
#define PHASE(i)                                                                                                       \
    do {                                                                                                               \
        if (tid == 0) {                                                                                                \
            double now_ = omp_get_wtime();                                                                             \
            profile_seconds[i] += now_ - profile_mark;                                                                 \
            profile_mark = now_;                                                                                       \
        }                                                                                                              \
    } while (0)
HEARTH_API void hearth_profile(double *out) {
    for (int i = 0; i < 8; i++) out[i] = profile_seconds[i], profile_seconds[i] = 0;
}
#else
#define PHASE(i) ((void)0)
#endif

enum { C_LAYERS, C_HIDDEN, C_HEADS, C_KV_HEADS, C_HEAD_DIM, C_INTER, C_VOCAB, C_EMBED_BF16, C_KV_BF16, C_THREADS,
       C_Q4, C_COUNT };
enum { F_EPS, F_ATTN_SCALE, F_ROPE_SCALE, F_COUNT };
enum { G_EMBED, G_FINAL_NORM, G_LM_Q, G_LM_S, G_INV_FREQ, G_COUNT };
enum { L_ATTN_NORM, L_MLP_NORM, L_QKV_Q, L_QKV_S, L_QKV_B, L_O_Q, L_O_S, L_O_B, L_GU_Q, L_GU_S, L_GU_B, L_DOWN_Q,
       L_DOWN_S, L_DOWN_B, L_K, L_V, L_COUNT };

HEARTH_API int hearth_abi(void) { return HEARTH_ABI; }
HEARTH_API int hearth_simd(void) { return HEARTH_SIMD; }
/* Which Q4_1 kernel this build runs: 0 scalar, 1 NEON, 2 NEON with DotProd, 3 AVX2, 4 AVX-512 VNNI. */
HEARTH_API int hearth_q4_kernel(void) {
    return HEARTH_AVX512 ? 4 : HEARTH_AVX2 ? 3 : HEARTH_DOTPROD ? 2 : HEARTH_NEON ? 1 : 0;
}
/* Whether the GGUF blocks' AVX2 loops run their integer dot products on AVX-VNNI (vpdpbusd ymm). */
HEARTH_API int hearth_avx_vnni(void) { return HEARTH_AVXVNNI; }
HEARTH_API int hearth_layout(int which) {
    switch (which) {
    case 0: return C_COUNT;
    case 1: return F_COUNT;
    case 2: return G_COUNT;
    case 3: return L_COUNT;
    default: return -1;
    }
}
/* Whether prefill runs on AMX tiles: want 1 turns it on where the CPU has AMX-INT8 and the kernel grants this process
 * the tile state, 0 turns it off, -1 only asks. Off until asked (app/core/fastpath/kernel.py asks at load). */
HEARTH_STATE(int, amx_on, 0);
HEARTH_STATE(int64_t, amx_calls, 0);
HEARTH_API int64_t hearth_amx_calls(void) { return __atomic_load_n(&amx_calls, __ATOMIC_RELAXED); }
HEARTH_STATE(int64_t, tiled_calls, 0); /* runs of 16-row groups that read their inputs from tiles (gtile_put) */
HEARTH_API int64_t hearth_tiled_calls(void) { return __atomic_load_n(&tiled_calls, __ATOMIC_RELAXED); }
HEARTH_STATE(int64_t, unpacked_calls, 0); /* runs of K-quant 16-row groups on values unpacked ahead (x16_unpack_group) */
HEARTH_API int64_t hearth_unpacked_calls(void) { return __atomic_load_n(&unpacked_calls, __ATOMIC_RELAXED); }
HEARTH_API int hearth_amx(int want) {
#if HEARTH_AMX_BUILT
    if (want >= 0) {
        unsigned a, b, c, d;
        amx_on = want > 0 && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 24 & 1) && (d >> 25 & 1) &&
                 syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
    }
#else
    (void)want;
#endif
    return amx_on;
}
HEARTH_API int hearth_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

static inline float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even, as torch does */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

#if HEARTH_AVX2
/* acc plus int32 lanes of 4 products each, w's bytes (unsigned) times x's (signed): AVX-VNNI's vpdpbusd, else
 * maddubs and madd (exact where a pair's sum fits int16, as at every call). */
static inline __m256i dp4_add(__m256i acc, __m256i w, __m256i x) {
#if HEARTH_AVXVNNI
    return _mm256_dpbusd_avx_epi32(acc, w, x);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
#endif
}

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 h = _mm_movehdup_ps(s);
    s = _mm_add_ps(s, h);
    h = _mm_movehl_ps(h, s);
    s = _mm_add_ss(s, h);
    return _mm_cvtss_f32(s);
}

static inline int32_t hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1)));
}

/* 8 bf16 values as floats (exact: bf16 is a float's upper half) */
static inline __m256 bf16x8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
#endif

#if HEARTH_NEON
/* An AVX2 register's 8 float lanes as two NEON registers (lo = lanes 0-3, hi = 4-7); summed in hsum256's order,
 * ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)), so the result rounds exactly as on x86. */
typedef struct {
    float32x4_t lo, hi;
} f32x8;

static inline f32x8 f32x8_zero(void) {
    f32x8 v = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    return v;
}

static inline float hsum8(f32x8 v) {
    const float32x4_t s = vaddq_f32(v.lo, v.hi);
    const float32x2_t p = vpadd_f32(vget_low_f32(s), vget_high_f32(s)); /* (s0 + s1, s2 + s3) */
    return vget_lane_f32(p, 0) + vget_lane_f32(p, 1);
}

/* One 16-byte half of a block: int32 lane i = sum of the 4 products of bytes 4i..4i+3 (what AVX2's maddubs + madd
 * with ones gives per 32-bit lane). Exact either way: products fit int16 (|w| <= 128, |x| <= 127), pairs too. */
static inline int32x4_t dot16(int8x16_t w, int8x16_t x) {
#if HEARTH_DOTPROD
    return vdotq_s32(vdupq_n_s32(0), w, x);
#else
    const int16x8_t lo = vmull_s8(vget_low_s8(w), vget_low_s8(x)), hi = vmull_high_s8(w, x);
    return vpaddlq_s16(vpaddq_s16(lo, hi));
#endif
}

/* acc += float(int8 . int8 per lane) * d for a 32-value block (AVX2 block_dot + add: multiply, then add, unfused). */
static inline f32x8 block_dot_add(f32x8 acc, const int8_t *w, int8x16_t x0, int8x16_t x1, float32x4_t d) {
    acc.lo = vaddq_f32(acc.lo, vmulq_f32(vcvtq_f32_s32(dot16(vld1q_s8(w), x0)), d));
    acc.hi = vaddq_f32(acc.hi, vmulq_f32(vcvtq_f32_s32(dot16(vld1q_s8(w + 16), x1)), d));
    return acc;
}

#endif

/* Activations are quantized like llama.cpp's Q8_0 before each matrix: int8 in blocks of 32 with one fp32 scale per
 * block, so a row's dot product is sum_b d[b] * (int8 . int8)_b, done with maddubs (32 MACs in 2 instructions) instead
 * of converting every weight to float (measured: the float path ran at ~10 GB/s, below this CPU's ~25 GB/s). */
#define QBLOCK 32
/* How far ahead attention prefetches a bf16 K or V row: 16 positions of a 64-value head (a chunk's rows stream from
 * memory once a context outgrows the caches). */
#define KV_PREFETCH_BYTES 2048
/* Software prefetch in the 16-row kernels, X16_PREFETCH_BLOCKS blocks ahead: a hint, never a different bit. Whether
 * it pays depends on the CPU and the format: on a 2-core Zen 4 guest a 1B Q6_K decode ran faster without it (each
 * prefetch to L1 holds one of the core's few miss buffers until its line arrives, while the hardware's own stream
 * prefetch into L2 keeps more lines in flight), a Q5_K_M one far slower; it was tuned with it elsewhere. So a large
 * model measures both when it loads (app/core/fastpath/prefetch.py) and sets it here, for the process. */
#define X16_PREFETCH_BLOCKS 4
HEARTH_STATE(int, x16_prefetch, 1);
HEARTH_API int hearth_x16_prefetch(int want) { /* want: 0 off, 1 on, -1 only asks; the setting now */
    if (want >= 0) __atomic_store_n(&x16_prefetch, want != 0, __ATOMIC_RELAXED);
    return __atomic_load_n(&x16_prefetch, __ATOMIC_RELAXED);
}

#define X16_PREFETCH_FEW_ROWS 8 /* up to this many inputs (a batch's step, a lookup check) always prefetch */
/* Whether a 16-row product of `count` inputs prefetches. One input (a decode step) and a prompt's many take the
 * setting a load measured on steps; 2 to X16_PREFETCH_FEW_ROWS always do: on the Zen 4 guest's 1B files, whose steps
 * measured faster without it, forwards of 2 rows ran 1.04-1.14x and of 4 to 8 rows 1.23-1.40x faster with it (each
 * input's products take longer per block than one's, so the hardware's stream alone falls behind), prompts the same. */
static inline int x16_prefetch_for(int count) {
    return (count > 1 && count <= X16_PREFETCH_FEW_ROWS) || __atomic_load_n(&x16_prefetch, __ATOMIC_RELAXED);
}
HEARTH_API int hearth_x16_prefetch_for(int count) { return x16_prefetch_for(count); } /* (tests) */

#ifndef PREFETCH_BYTES
#define PREFETCH_BYTES 8192 /* 2048-12288 measured; 8192 best on the 2-core Zen 3 (bench/engine_speed.py) */
#endif

/* The cache lines of [start, start + bytes) on their way to L1: a hint (never a fault, never a different result).
 * ARM takes the x86 distances; not yet tuned on ARM hardware. Always inlined: a call from the big unrolled loops
 * would spill every vector register around it (a 135M decode measured 325 -> 220 tok/s). */
static inline __attribute__((always_inline)) void prefetch_lines(const void *start, int64_t bytes) {
    const char *p = (const char *)start;
#if HEARTH_AVX2
    for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
#else
    for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, 0, 3);
#endif
}

/* The cache lines of one record or block (`bytes` long), PREFETCH_BYTES ahead of `p`. */
static inline __attribute__((always_inline)) void prefetch_record(const void *p, int64_t bytes) {
    prefetch_lines((const char *)p + PREFETCH_BYTES, bytes);
}

/* Step `index` of the `steps` of a K-quant block: its share of the block X16_PREFETCH_BLOCKS ahead, so that the steps
 * together cover all of it: the scales, and Q5_K's fifth bits, as well as the quants. Prefetching only the quants'
 * line each step reads (as before 2026-12-06, night) left 29 % of a Q5_K block and 14 % of a Q4_K one to demand
 * misses: covering the whole block, 1B decode ran 1.40x faster on Q5_K_M, 1.07x on Q4_K_M and 1.04x on Q6_K (Zen 4
 * guest, alternating processes, the prefetch on in both). */
static inline __attribute__((always_inline)) void x16_prefetch_step(const uint8_t *blk, int64_t block_bytes, int index,
                                                                    int steps) {
    const int64_t share = (block_bytes + steps - 1) / steps;
    prefetch_lines(blk + X16_PREFETCH_BLOCKS * block_bytes + index * share, share);
}

#if HEARTH_AVX2
/* max |v| over a block of 32 floats held as four vectors */
static inline float absmax32(const __m256 v[4]) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                             _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}
#endif

static void quantize_q8(const float *x, int n, int8_t *q, float *d, float *sums, int32_t *totals) {
    for (int b = 0; b < n / QBLOCK; b++) {
        const float *xb = x + b * QBLOCK;
        int8_t *qb = q + b * QBLOCK;
#if HEARTH_AVX2
        const __m256 v[4] = {_mm256_loadu_ps(xb), _mm256_loadu_ps(xb + 8), _mm256_loadu_ps(xb + 16),
                             _mm256_loadu_ps(xb + 24)};
        const float amax = absmax32(v);
        const float scale = amax / 127.0f;
        d[b] = scale;
        const __m256 mul = _mm256_set1_ps(scale > 0.0f ? 1.0f / scale : 0.0f);
        __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[0], mul), _MM_FROUND_TO_NEAREST_INT));
        __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[1], mul), _MM_FROUND_TO_NEAREST_INT));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[2], mul), _MM_FROUND_TO_NEAREST_INT));
        __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[3], mul), _MM_FROUND_TO_NEAREST_INT));
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)); /* undo the lane interleave */
        _mm256_storeu_si256((__m256i *)qb, p);
        const __m256i ones = _mm256_set1_epi16(1);
        const __m256i pair = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), p), ones);
        totals[b] = hsum_epi32(pair);
        sums[b] = scale * (float)totals[b];
#elif HEARTH_NEON
        float32x4_t v[8];
        for (int i = 0; i < 8; i++) v[i] = vld1q_f32(xb + 4 * i);
        float32x4_t m = vabsq_f32(v[0]);
        for (int i = 1; i < 8; i++) m = vmaxq_f32(m, vabsq_f32(v[i]));
        const float amax = vmaxvq_f32(m);
        const float scale = amax / 127.0f;
        d[b] = scale;
        const float32x4_t mul = vdupq_n_f32(scale > 0.0f ? 1.0f / scale : 0.0f);
        int16x8_t h[4];
        for (int i = 0; i < 4; i++) /* round half to even (as _mm256_round_ps), saturate (as packs) */
            h[i] = vcombine_s16(vqmovn_s32(vcvtnq_s32_f32(vmulq_f32(v[2 * i], mul))),
                                vqmovn_s32(vcvtnq_s32_f32(vmulq_f32(v[2 * i + 1], mul))));
        const int8x16_t q0 = vcombine_s8(vqmovn_s16(h[0]), vqmovn_s16(h[1]));
        const int8x16_t q1 = vcombine_s8(vqmovn_s16(h[2]), vqmovn_s16(h[3]));
        vst1q_s8(qb, q0);
        vst1q_s8(qb + 16, q1);
        totals[b] = vaddlvq_s8(q0) + vaddlvq_s8(q1);
        sums[b] = scale * (float)totals[b];
#else
        float amax = 0.0f;
        for (int i = 0; i < QBLOCK; i++) amax = fmaxf(amax, fabsf(xb[i]));
        const float scale = amax / 127.0f;
        d[b] = scale;
        const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
        int32_t total = 0;
        for (int i = 0; i < QBLOCK; i++) {
            qb[i] = (int8_t)nearbyintf(xb[i] * inv);
            total += qb[i];
        }
        totals[b] = total;
        sums[b] = scale * (float)total;
#endif
    }
}

#if HEARTH_AVX2
static inline __m256 block_dot(__m256i w, __m256i x, __m256 d) {
    const __m256i products = dp4_add(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(products), d);
}
#endif

/* Quantized activations for one matrix input (`cols` a multiple of QBLOCK): int8 values, a scale per block, per
 * block scale * sum(values) (what a Q4_1 weight block's offset multiplies) and the integer sum itself. */
typedef struct {
    const int8_t *q;
    const float *d;
    const float *s;
    int cols;
    const int32_t *n;
} qvec;

/* Dot products of 4 consecutive int8 rows (`stride` bytes apart) with the quantized activations. */
static void dot4_q8(const int8_t *w, int64_t stride, const int8_t *xq, const float *dx, int blocks, float out[4]) {
#if HEARTH_AVX2
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    for (int b = 0; b < blocks; b++) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)(xq + b * QBLOCK));
        const __m256 d = _mm256_set1_ps(dx[b]);
        const int8_t *wb = w + b * QBLOCK;
        a0 = _mm256_add_ps(a0, block_dot(_mm256_loadu_si256((const __m256i *)wb), x, d));
        a1 = _mm256_add_ps(a1, block_dot(_mm256_loadu_si256((const __m256i *)(wb + stride)), x, d));
        a2 = _mm256_add_ps(a2, block_dot(_mm256_loadu_si256((const __m256i *)(wb + 2 * stride)), x, d));
        a3 = _mm256_add_ps(a3, block_dot(_mm256_loadu_si256((const __m256i *)(wb + 3 * stride)), x, d));
    }
    out[0] = hsum256(a0);
    out[1] = hsum256(a1);
    out[2] = hsum256(a2);
    out[3] = hsum256(a3);
#elif HEARTH_NEON
    f32x8 a[4] = {f32x8_zero(), f32x8_zero(), f32x8_zero(), f32x8_zero()};
    for (int b = 0; b < blocks; b++) {
        const int8x16_t x0 = vld1q_s8(xq + b * QBLOCK), x1 = vld1q_s8(xq + b * QBLOCK + 16);
        const float32x4_t d = vdupq_n_f32(dx[b]);
        const int8_t *wb = w + b * QBLOCK;
        for (int k = 0; k < 4; k++) a[k] = block_dot_add(a[k], wb + k * stride, x0, x1, d);
    }
    for (int k = 0; k < 4; k++) out[k] = hsum8(a[k]);
#else
    for (int k = 0; k < 4; k++) {
        float total = 0.0f;
        for (int b = 0; b < blocks; b++) {
            int32_t sum = 0;
            for (int i = 0; i < QBLOCK; i++) sum += (int32_t)w[k * stride + b * QBLOCK + i] * xq[b * QBLOCK + i];
            total += (float)sum * dx[b];
        }
        out[k] = total;
    }
#endif
}

static float dot_q8(const int8_t *w, const int8_t *xq, const float *dx, int blocks) {
    float total = 0.0f;
#if HEARTH_AVX2
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < blocks; b++)
        acc = _mm256_add_ps(acc, block_dot(_mm256_loadu_si256((const __m256i *)(w + b * QBLOCK)),
                                           _mm256_loadu_si256((const __m256i *)(xq + b * QBLOCK)),
                                           _mm256_set1_ps(dx[b])));
    total = hsum256(acc);
#elif HEARTH_NEON
    f32x8 acc = f32x8_zero();
    for (int b = 0; b < blocks; b++)
        acc = block_dot_add(acc, w + b * QBLOCK, vld1q_s8(xq + b * QBLOCK), vld1q_s8(xq + b * QBLOCK + 16),
                            vdupq_n_f32(dx[b]));
    total = hsum8(acc);
#else
    for (int b = 0; b < blocks; b++) {
        int32_t sum = 0;
        for (int i = 0; i < QBLOCK; i++) sum += (int32_t)w[b * QBLOCK + i] * xq[b * QBLOCK + i];
        total += (float)sum * dx[b];
    }
#endif
    return total;
}


/* y[r] (op)= scale[r] * dot(w[r], x) + bias[r] for rows [r0, r1); `accumulate` adds into y (residual). */
static void gemv_rows(const int8_t *w, const float *scale, const float *bias, qvec x, int r0, int r1, float *y,
                      int accumulate) {
    const int cols = x.cols, blocks = cols / QBLOCK;
    int r = r0;
    float d[4];
    for (; r + 4 <= r1; r += 4) {
#if HEARTH_AVX2 || HEARTH_NEON
        /* Software prefetch a few KB ahead: measured 10.7 -> ~20 GB/s on a 2-core Zen 3 (the hardware prefetcher
         * alone does not keep four row streams fed at this compute rate). */
        prefetch_record(w + (int64_t)r * cols, 4 * (int64_t)cols);
#endif
        dot4_q8(w + (int64_t)r * cols, cols, x.q, x.d, blocks, d);
        for (int k = 0; k < 4; k++) {
            float v = d[k] * scale[r + k] + (bias ? bias[r + k] : 0.0f);
            y[r + k] = accumulate ? y[r + k] + v : v;
        }
    }
    for (; r < r1; r++) {
        float v = dot_q8(w + (int64_t)r * cols, x.q, x.d, blocks) * scale[r] + (bias ? bias[r] : 0.0f);
        y[r] = accumulate ? y[r] + v : v;
    }
}

/* Q4_1 weights (llama.cpp's quantization): per block of 32 values, 16 bytes of nibbles (byte j = value j | value j+16
 * << 4) and an fp16 pair (d, m); weight = d * q + m with q in 0..15. Against Q8 activations a block's dot product is
 * d * dx * (q . xq) + m * (dx * sum xq).
 *
 * Stored interleaved by groups of 16 rows (the "x16" layout, packed by native.py): for each group and each block of
 * 32 columns, one 320-byte record: 256 bytes of nibbles, then the 16 rows' d (fp16), then their m (fp16). Within the
 * nibbles, 64-byte chunk k holds bytes 4k..4k+3 of row i's block at bytes 4i..4i+3. So one 64-byte load feeds one
 * vpdpbusd (AVX-512 VNNI) with 16 rows x 4 weights against 4 activation bytes broadcast to every lane, and each SIMD
 * lane accumulates one row: no horizontal sums, and every ISA computes each row with the same float operations in
 * the same order (acc = fma(float(isum), d * dx, acc); macc = fma(m, sx, macc); y = acc + macc), so AVX-512, AVX2,
 * NEON and the scalar loops give the same bits. Measured on a 2-core Zen 4 at the 1B size (bench/decode_profile.py):
 * see README; the row-major Q4_1 kernel it replaced spent 2 scalar fp16 conversions and a horizontal sum per block
 * per row, and ran the matrices at 9-11 GB/s of this CPU's ~25. */
#define GROUP 16
#define RECORD 320 /* bytes per group per block */
#define RECORD_D 256
#define RECORD_M 288

static inline float half_to_float(uint16_t h) {

#if HEARTH_AVX2 && defined(__F16C__)
    return _cvtsh_ss(h);
#elif HEARTH_NEON /* fcvt; exact, as every fp16 -> fp32 conversion */
    __fp16 v;
    memcpy(&v, &h, 2);
    return (float)v;
#else
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    uint32_t bits;
    if (exponent == 0) {
        if (mantissa == 0) {
            bits = sign;
        } else { /* subnormal: normalize */
            int e = -1;
            uint32_t m = mantissa;
            do {
                e++;
                m <<= 1;
            } while (!(m & 0x400u));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((m & 0x3ffu) << 13);
        }
    } else if (exponent == 31) {
        bits = sign | 0x7f800000u | (mantissa << 13);
    } else {
        bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

/* One group's running sums while its blocks stream past: lane i is row i of the group. */
#if HEARTH_AVX512
typedef struct {
    __m512 acc, macc;
} group_acc;

static inline void group_zero(group_acc *a) { a->acc = a->macc = _mm512_setzero_ps(); }

static inline void group_block(group_acc *a, const uint8_t *rec, const int8_t *xb, float dx, float sx) {
    const __m512i mask = _mm512_set1_epi8(0x0f);
    __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512(); /* two chains: vpdpbusd's latency */
    for (int k = 0; k < 4; k++) {
        const __m512i v = _mm512_loadu_si512((const void *)(rec + 64 * k));
        int32_t xl, xh;
        memcpy(&xl, xb + 4 * k, 4);
        memcpy(&xh, xb + 16 + 4 * k, 4);
        lo = _mm512_dpbusd_epi32(lo, _mm512_and_si512(v, mask), _mm512_set1_epi32(xl));
        hi = _mm512_dpbusd_epi32(hi, _mm512_and_si512(_mm512_srli_epi16(v, 4), mask), _mm512_set1_epi32(xh));
    }
    const __m512 d = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + RECORD_D))),
                                   _mm512_set1_ps(dx));
    const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + RECORD_M)));
    a->acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi)), d, a->acc);
    a->macc = _mm512_fmadd_ps(m, _mm512_set1_ps(sx), a->macc);
}

static inline void group_store(const group_acc *a, float *out) { _mm512_storeu_ps(out, _mm512_add_ps(a->acc, a->macc)); }
#elif HEARTH_AVX2
typedef struct {
    __m256 acc[2], macc[2];
} group_acc;

static inline void group_zero(group_acc *a) {
    for (int h = 0; h < 2; h++) a->acc[h] = a->macc[h] = _mm256_setzero_ps();
}

static inline __m256 halves8(const uint8_t *p) { /* 8 fp16 values as floats (exact) */
#ifdef __F16C__
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#else
    uint16_t h[8];
    float f[8];
    memcpy(h, p, sizeof h);
    for (int i = 0; i < 8; i++) f[i] = half_to_float(h[i]);
    return _mm256_loadu_ps(f);
#endif
}

static inline void group_block(group_acc *a, const uint8_t *rec, const int8_t *xb, float dx, float sx) {
    const __m256i mask = _mm256_set1_epi8(0x0f);
    for (int h = 0; h < 2; h++) { /* rows 0-7, then 8-15: bytes 0-31 and 32-63 of each chunk */
        __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
        for (int k = 0; k < 4; k++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(rec + 64 * k + 32 * h));
            int32_t xl, xh;
            memcpy(&xl, xb + 4 * k, 4);
            memcpy(&xh, xb + 16 + 4 * k, 4);
            /* unsigned nibble x signed byte; on AVX2 pairs summed in int16 (|15 * 128 * 2| fits), then into int32 */
            lo = dp4_add(lo, _mm256_and_si256(v, mask), _mm256_set1_epi32(xl));
            hi = dp4_add(hi, _mm256_and_si256(_mm256_srli_epi16(v, 4), mask), _mm256_set1_epi32(xh));
        }
        const __m256 d = _mm256_mul_ps(halves8(rec + RECORD_D + 16 * h), _mm256_set1_ps(dx));
        a->acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(lo, hi)), d, a->acc[h]);
        a->macc[h] = _mm256_fmadd_ps(halves8(rec + RECORD_M + 16 * h), _mm256_set1_ps(sx), a->macc[h]);
    }
}

static inline void group_store(const group_acc *a, float *out) {
    for (int h = 0; h < 2; h++) _mm256_storeu_ps(out + 8 * h, _mm256_add_ps(a->acc[h], a->macc[h]));
}
#elif HEARTH_NEON
typedef struct {
    float32x4_t acc[4], macc[4];
} group_acc;

static inline void group_zero(group_acc *a) {
    for (int h = 0; h < 4; h++) a->acc[h] = a->macc[h] = vdupq_n_f32(0.0f);
}

static inline float32x4_t halves4(const uint8_t *p) {
    uint16_t h[4];
    memcpy(h, p, sizeof h);
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h)));
}

/* acc lane i += the 4 products of w's bytes 4i..4i+3 with the 4 bytes of x4 (every lane gets the same x bytes). */
static inline int32x4_t dot_broadcast(int32x4_t acc, uint8x16_t w, int32_t x4) {
    const int8x16_t ws = vreinterpretq_s8_u8(w), xs = vreinterpretq_s8_s32(vdupq_n_s32(x4));
#if HEARTH_DOTPROD
    return vdotq_s32(acc, ws, xs);
#else
    const int16x8_t lo = vmull_s8(vget_low_s8(ws), vget_low_s8(xs)), hi = vmull_high_s8(ws, xs);
    return vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)));
#endif
}

static inline void group_block(group_acc *a, const uint8_t *rec, const int8_t *xb, float dx, float sx) {
    const uint8x16_t mask = vdupq_n_u8(0x0f);
    int32_t xl[4], xh[4];
    memcpy(xl, xb, sizeof xl);
    memcpy(xh, xb + 16, sizeof xh);
    for (int h = 0; h < 4; h++) { /* rows 4h..4h+3: bytes 16h..16h+15 of each chunk */
        int32x4_t lo = vdupq_n_s32(0), hi = vdupq_n_s32(0);
        for (int k = 0; k < 4; k++) {
            const uint8x16_t v = vld1q_u8(rec + 64 * k + 16 * h);
            lo = dot_broadcast(lo, vandq_u8(v, mask), xl[k]);
            hi = dot_broadcast(hi, vshrq_n_u8(v, 4), xh[k]);
        }
        const float32x4_t d = vmulq_f32(halves4(rec + RECORD_D + 8 * h), vdupq_n_f32(dx));
        a->acc[h] = vfmaq_f32(a->acc[h], vcvtq_f32_s32(vaddq_s32(lo, hi)), d);
        a->macc[h] = vfmaq_f32(a->macc[h], halves4(rec + RECORD_M + 8 * h), vdupq_n_f32(sx));
    }
}

static inline void group_store(const group_acc *a, float *out) {
    for (int h = 0; h < 4; h++) vst1q_f32(out + 4 * h, vaddq_f32(a->acc[h], a->macc[h]));
}
#else
typedef struct {
    float acc[GROUP], macc[GROUP];
} group_acc;

static inline void group_zero(group_acc *a) {
    for (int i = 0; i < GROUP; i++) a->acc[i] = a->macc[i] = 0.0f;
}

static inline void group_block(group_acc *a, const uint8_t *rec, const int8_t *xb, float dx, float sx) {
    for (int i = 0; i < GROUP; i++) {
        int32_t sum = 0;
        for (int k = 0; k < 4; k++)
            for (int t = 0; t < 4; t++) {
                const uint8_t byte = rec[64 * k + 4 * i + t];
                sum += (int32_t)(byte & 0x0f) * xb[4 * k + t] + (int32_t)(byte >> 4) * xb[16 + 4 * k + t];
            }
        uint16_t dh, mh;
        memcpy(&dh, rec + RECORD_D + 2 * i, 2);
        memcpy(&mh, rec + RECORD_M + 2 * i, 2);
        const float d = half_to_float(dh) * dx; /* the product rounds first, as in the vector code */
        a->acc[i] = fmaf((float)sum, d, a->acc[i]);
        a->macc[i] = fmaf(half_to_float(mh), sx, a->macc[i]);
    }
}

static inline void group_store(const group_acc *a, float *out) {
    for (int i = 0; i < GROUP; i++) out[i] = a->acc[i] + a->macc[i];
}
#endif


/* out_a[i] = row i of group a . x (and out_b for group b when b is not NULL: two independent streams in one loop keep
 * more loads in flight). Each group is its blocks' records back to back. */
static void q4_groups(const uint8_t *a, const uint8_t *b, qvec x, float *out_a, float *out_b) {
    const int blocks = x.cols / QBLOCK;
    group_acc ga, gb;
    group_zero(&ga);
    if (b) {
        group_zero(&gb);
        for (int k = 0; k < blocks; k++) {
            prefetch_record(a + (int64_t)k * RECORD, RECORD);
            prefetch_record(b + (int64_t)k * RECORD, RECORD);
            group_block(&ga, a + (int64_t)k * RECORD, x.q + k * QBLOCK, x.d[k], x.s[k]);
            group_block(&gb, b + (int64_t)k * RECORD, x.q + k * QBLOCK, x.d[k], x.s[k]);
        }
        group_store(&gb, out_b);
    } else {
        for (int k = 0; k < blocks; k++) {
            prefetch_record(a + (int64_t)k * RECORD, RECORD);
            group_block(&ga, a + (int64_t)k * RECORD, x.q + k * QBLOCK, x.d[k], x.s[k]);
        }
    }
    group_store(&ga, out_a);
}

/* y[r] (op)= row r . x + bias[r] for rows [r0, r1) (multiples of GROUP) of an x16 matrix; y indexed like the rows. */
static void gemv_rows_q4(const uint8_t *w, const float *bias, qvec x, int r0, int r1, float *y, int accumulate) {
    const int64_t stride = (int64_t)(x.cols / QBLOCK) * RECORD; /* bytes per group */
    float out[2 * GROUP];
    for (int g = r0 / GROUP, g1 = r1 / GROUP; g < g1; g += 2) {
        const int pair = g + 1 < g1;
        q4_groups(w + g * stride, pair ? w + (g + 1) * stride : NULL, x, out, out + GROUP);
        for (int i = 0; i < (pair ? 2 : 1) * GROUP; i++) {
            const int r = g * GROUP + i;
            const float v = out[i] + (bias ? bias[r] : 0.0f);
            y[r] = accumulate ? y[r] + v : v;
        }
    }
}

/* The lm_head: int8 rows (an fp32 scale per row, from int8.quantize_rows) interleaved by groups of 16 rows like the
 * Q4_1 matrices: per group and block of 32 columns a 512-byte record whose 64-byte chunk k holds bytes 4k..4k+3 of
 * row i's block at 4i..4i+3. The last group is padded with zero rows (vocabularies need not be multiples of 16).
 * Each lane accumulates acc = fma(float(isum), dx, acc) per block and ends as acc * scale: the same floats on every
 * ISA. AVX-512 VNNI takes the signed weights as unsigned (w ^ 0x80 = w + 128) and subtracts 128 * sum(x) per block
 * (exact in int32); AVX2 multiplies |w| by x with w's sign (maddubs can't saturate: |w|, |x| <= 127). */
#define LM_RECORD 512

#if HEARTH_AVX512
typedef __m512 lm_acc;
static inline void lm_zero(lm_acc *a) { *a = _mm512_setzero_ps(); }
static inline void lm_block(lm_acc *a, const int8_t *rec, const int8_t *xb, int32_t xsum, float dx) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
    for (int k = 0; k < 8; k += 2) {
        int32_t x0, x1;
        memcpy(&x0, xb + 4 * k, 4);
        memcpy(&x1, xb + 4 * k + 4, 4);
        s0 = _mm512_dpbusd_epi32(s0, _mm512_xor_si512(_mm512_loadu_si512((const void *)(rec + 64 * k)), flip),
                                 _mm512_set1_epi32(x0));
        s1 = _mm512_dpbusd_epi32(s1, _mm512_xor_si512(_mm512_loadu_si512((const void *)(rec + 64 * k + 64)), flip),
                                 _mm512_set1_epi32(x1));
    }
    const __m512i isum = _mm512_sub_epi32(_mm512_add_epi32(s0, s1), _mm512_set1_epi32(128 * xsum));
    *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(dx), *a);
}
static inline void lm_store(const lm_acc *a, float *out) { _mm512_storeu_ps(out, *a); }
#elif HEARTH_AVX2
typedef struct {
    __m256 h[2];
} lm_acc;
static inline void lm_zero(lm_acc *a) { a->h[0] = a->h[1] = _mm256_setzero_ps(); }
static inline void lm_block(lm_acc *a, const int8_t *rec, const int8_t *xb, int32_t xsum, float dx) {
    (void)xsum;
    for (int h = 0; h < 2; h++) {
        __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
        for (int k = 0; k < 8; k += 2) {
            int32_t x0, x1;
            memcpy(&x0, xb + 4 * k, 4);
            memcpy(&x1, xb + 4 * k + 4, 4);
            const __m256i w0 = _mm256_loadu_si256((const __m256i *)(rec + 64 * k + 32 * h));
            const __m256i w1 = _mm256_loadu_si256((const __m256i *)(rec + 64 * k + 64 + 32 * h));
            s0 = dp4_add(s0, _mm256_sign_epi8(w0, w0), _mm256_sign_epi8(_mm256_set1_epi32(x0), w0));
            s1 = dp4_add(s1, _mm256_sign_epi8(w1, w1), _mm256_sign_epi8(_mm256_set1_epi32(x1), w1));
        }
        a->h[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)), _mm256_set1_ps(dx), a->h[h]);
    }
}
static inline void lm_store(const lm_acc *a, float *out) {
    _mm256_storeu_ps(out, a->h[0]);
    _mm256_storeu_ps(out + 8, a->h[1]);
}
#elif HEARTH_NEON
typedef struct {
    float32x4_t h[4];
} lm_acc;
static inline void lm_zero(lm_acc *a) {
    for (int h = 0; h < 4; h++) a->h[h] = vdupq_n_f32(0.0f);
}
static inline void lm_block(lm_acc *a, const int8_t *rec, const int8_t *xb, int32_t xsum, float dx) {
    (void)xsum;
    int32_t x4[8];
    memcpy(x4, xb, sizeof x4);
    for (int h = 0; h < 4; h++) {
        int32x4_t s0 = vdupq_n_s32(0), s1 = vdupq_n_s32(0);
        for (int k = 0; k < 8; k += 2) {
            s0 = dot_broadcast(s0, vld1q_u8((const uint8_t *)rec + 64 * k + 16 * h), x4[k]);
            s1 = dot_broadcast(s1, vld1q_u8((const uint8_t *)rec + 64 * k + 64 + 16 * h), x4[k + 1]);
        }
        a->h[h] = vfmaq_f32(a->h[h], vcvtq_f32_s32(vaddq_s32(s0, s1)), vdupq_n_f32(dx));
    }
}
static inline void lm_store(const lm_acc *a, float *out) {
    for (int h = 0; h < 4; h++) vst1q_f32(out + 4 * h, a->h[h]);
}
#else
typedef struct {
    float v[GROUP];
} lm_acc;
static inline void lm_zero(lm_acc *a) {
    for (int i = 0; i < GROUP; i++) a->v[i] = 0.0f;
}
static inline void lm_block(lm_acc *a, const int8_t *rec, const int8_t *xb, int32_t xsum, float dx) {
    (void)xsum;
    for (int i = 0; i < GROUP; i++) {
        int32_t sum = 0;
        for (int k = 0; k < 8; k++)
            for (int t = 0; t < 4; t++) sum += (int32_t)rec[64 * k + 4 * i + t] * xb[4 * k + t];
        a->v[i] = fmaf((float)sum, dx, a->v[i]);
    }
}
static inline void lm_store(const lm_acc *a, float *out) { memcpy(out, a->v, sizeof a->v); }
#endif

/* logits[r] = scale[r] * row r . x for rows [r0, r1) (r0 a multiple of GROUP; rows past r1 in the last group are
 * computed, not stored: padding or another thread's). Two groups per pass: independent streams. */
static void gemv_lm(const int8_t *w, const float *scale, qvec x, int r0, int r1, float *logits) {
    const int blocks = x.cols / QBLOCK;
    const int64_t stride = (int64_t)blocks * LM_RECORD;
    for (int g = r0 / GROUP; g * GROUP < r1; g += 2) {
        const int pair = (g + 1) * GROUP < r1;
        const int8_t *a = w + g * stride, *b = a + stride;
        lm_acc la, lb;
        float out[2 * GROUP];
        lm_zero(&la);
        lm_zero(&lb);
        for (int k = 0; k < blocks; k++) {
            prefetch_record(a + (int64_t)k * LM_RECORD, LM_RECORD);
            if (pair) prefetch_record(b + (int64_t)k * LM_RECORD, LM_RECORD);
            lm_block(&la, a + (int64_t)k * LM_RECORD, x.q + k * QBLOCK, x.n[k], x.d[k]);
            if (pair) lm_block(&lb, b + (int64_t)k * LM_RECORD, x.q + k * QBLOCK, x.n[k], x.d[k]);
        }
        lm_store(&la, out);
        lm_store(&lb, out + GROUP);
        for (int i = 0; i < (pair ? 2 : 1) * GROUP; i++) {
            const int r = g * GROUP + i;
            if (r < r1) logits[r] = out[i] * scale[r];
        }
    }
}

/* One decoder matrix: int8 rows with an fp32 scale each, or Q4_1 records in groups of 16 rows (s unused). */
typedef struct {
    const void *q;
    const void *s;
    const float *b;
    int q4;
    int cols;
} mat;

static mat matrix(void *const *p, int q_slot, int q4, int cols) {
    mat m = {p[q_slot], p[q_slot + 1], (const float *)p[q_slot + 2], q4, cols};
    return m;
}

/* The same matrix from row `r` on (for Q4_1 a multiple of GROUP). */
static mat from_row(mat m, int r) {
    if (m.q4) {
        m.q = (const char *)m.q + (int64_t)(r / GROUP) * (m.cols / QBLOCK) * RECORD;
    } else {
        m.q = (const char *)m.q + (int64_t)r * m.cols;
        m.s = (const char *)m.s + (int64_t)r * 4;
    }
    if (m.b) m.b += r;
    return m;
}

/* y[r] (op)= row r of m . x for rows [r0, r1) (bias included); y indexed like the rows. */
static void gemv(mat m, qvec x, int r0, int r1, float *y, int accumulate) {
    if (m.q4)
        gemv_rows_q4((const uint8_t *)m.q, m.b, x, r0, r1, y, accumulate);
    else
        gemv_rows((const int8_t *)m.q, (const float *)m.s, m.b, x, r0, r1, y, accumulate);
}

/* This thread's index and its team's size inside a parallel region (0 and 1 without OpenMP). */
static inline void team_position(int *tid, int *team) {
#ifdef _OPENMP
    *tid = omp_get_thread_num();
    *team = omp_get_num_threads();
#else
    *tid = 0;
    *team = 1;
#endif
}

/* Split [0, n) into `parts` contiguous chunks aligned to `align` rows (4 for int8 rows, GROUP for Q4_1); chunk
 * `part` is [*lo, *hi).
 * Static halves, not dynamic chunks: each thread then streams one long range with its own prefetches. Measured per
 * token on SmolLM2 (2 threads, quiet machine): static 7.35 ms, dynamic 32-row chunks 9.4, 8 dynamic chunks 8.9,
 * guided 8.6. The GGUF forward keeps these parts and lets a thread that is done take the rest of another's from its
 * back (claim_rows). */
static void split_rows(int n, int parts, int part, int align, int *lo, int *hi) {
    int blocks = (n + align - 1) / align;
    int per = blocks / parts, extra = blocks % parts;
    int b0 = part * per + (part < extra ? part : extra);
    int b1 = b0 + per + (part < extra ? 1 : 0);
    *lo = b0 * align < n ? b0 * align : n;
    *hi = b1 * align < n ? b1 * align : n;
}

static float dot_kv(const void *k, int bf16, const float *q, int n) {
    int i = 0;
    float s = 0.0f;
    if (bf16) {
        const uint16_t *kb = (const uint16_t *)k;
#if HEARTH_AVX2
        __m256 acc = _mm256_setzero_ps();
        for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(bf16x8(kb + i), _mm256_loadu_ps(q + i), acc);
        s = hsum256(acc);
#elif HEARTH_NEON /* 8 at a time like AVX2, so the scalar tail and the sum order match */
        f32x8 acc = f32x8_zero();
        for (; i + 8 <= n; i += 8) {
            const uint16x8_t v = vld1q_u16(kb + i);
            acc.lo = vfmaq_f32(acc.lo, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(v), 16)), vld1q_f32(q + i));
            acc.hi = vfmaq_f32(acc.hi, vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(v), 16)), vld1q_f32(q + i + 4));
        }
        s = hsum8(acc);
#endif
        for (; i < n; i++) s += bf16_to_f32(kb[i]) * q[i];
    } else {
        const float *kf = (const float *)k;
#if HEARTH_AVX2
        __m256 acc = _mm256_setzero_ps();
        for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(kf + i), _mm256_loadu_ps(q + i), acc);
        s = hsum256(acc);
#elif HEARTH_NEON
        f32x8 acc = f32x8_zero();
        for (; i + 8 <= n; i += 8) {
            acc.lo = vfmaq_f32(acc.lo, vld1q_f32(kf + i), vld1q_f32(q + i));
            acc.hi = vfmaq_f32(acc.hi, vld1q_f32(kf + i + 4), vld1q_f32(q + i + 4));
        }
        s = hsum8(acc);
#endif
        for (; i < n; i++) s += kf[i] * q[i];
    }
    return s;
}

static void axpy_kv(float *out, float p, const void *v, int bf16, int n) {
    int i = 0;
    if (bf16) {
        const uint16_t *vb = (const uint16_t *)v;
#if HEARTH_AVX2
        __m256 pp = _mm256_set1_ps(p);
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(out + i, _mm256_fmadd_ps(bf16x8(vb + i), pp, _mm256_loadu_ps(out + i)));
#elif HEARTH_NEON /* fused like AVX2's fmadd; 8 at a time so the unfused scalar tail covers the same elements */
        const float32x4_t pp = vdupq_n_f32(p);
        for (; i + 8 <= n; i += 8) {
            const uint16x8_t w = vld1q_u16(vb + i);
            const float32x4_t lo = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(w), 16));
            const float32x4_t hi = vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(w), 16));
            vst1q_f32(out + i, vfmaq_f32(vld1q_f32(out + i), lo, pp));
            vst1q_f32(out + i + 4, vfmaq_f32(vld1q_f32(out + i + 4), hi, pp));
        }
#endif
        for (; i < n; i++) out[i] += p * bf16_to_f32(vb[i]);
    } else {
        const float *vf = (const float *)v;
        for (; i < n; i++) out[i] += p * vf[i];
    }
}

static void rmsnorm(const float *x, const float *weight, float *out, int n, float eps) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float inv = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * inv * weight[i];
}

static void rope(float *v, const float *cosv, const float *sinv, int half) {
    for (int i = 0; i < half; i++) {
        float a = v[i], b = v[i + half];
        v[i] = a * cosv[i] - b * sinv[i];
        v[i + half] = b * cosv[i] + a * sinv[i];
    }
}

static void store_kv(void *cache, int bf16, int64_t offset, const float *src, int n) {
    if (bf16) {
        uint16_t *dst = (uint16_t *)cache + offset;
        for (int i = 0; i < n; i++) dst[i] = f32_to_bf16(src[i]);
    } else {
        memcpy((float *)cache + offset, src, (size_t)n * sizeof(float));
    }
}

static int max3(int a, int b, int c) { return a > b ? (a > c ? a : c) : (b > c ? b : c); }

/* Per-thread scratch: a normalized copy of the residual and the quantized input of the current matrix. */
static int64_t thread_floats(int64_t hidden, int64_t widest) { return hidden + widest / 4 + 3 * (widest / QBLOCK); }

/* Attention runs as (kv head, chunk of positions) units, flash-decoding style: each unit reads its K/V rows once
 * for all the query heads that share them, keeps an unnormalized partial output with its own max and sum, and a
 * second pass merges the chunks. Both threads stay busy however few kv heads there are, and a long context is read
 * once per token instead of once per query head. */
#define ATT_CHUNK 16 /* the shortest chunk; chunks grow with the context so there are ~ATT_UNITS units */
/* Units (KV head, chunk of positions) a long context is cut into, whatever the team's size: ~4 per thread up to 8
 * threads. The chunks, and so the sums, are the same on any team, and the team chooser (app/core/fastpath/team.py)
 * may switch sizes between any two steps without changing a reply. */
#define ATT_UNITS 32
/* Up to this many positions one pass per query head is faster (no merge pass and its barrier): measured per token
 * at 200 positions 7.4 vs 7.7 ms; at 1,500 positions the chunked pass wins, 11.8 vs 13.1 ms. */
#define SHORT_CONTEXT 512

/* Attention of one token's query heads (the first heads * hd floats of qkv) over positions [0, pos] of one layer's
 * K/V slabs ([kv_heads][capacity][hd]), into att [heads][hd]. Called by every thread of a parallel region: the work
 * is shared out with `omp for` inside (each ends in a barrier). */
static void attend(const float *qkv, const void *k_cache, const void *v_cache, int kv_bf16, int heads, int kv_heads,
                   int hd, int64_t pos, int64_t capacity, float attn_scale, float *scores, float *partial,
                   float *part_max, float *part_sum, int max_chunks, float *att) {
    const int group = kv_heads > 0 ? heads / kv_heads : 1;
    if (pos + 1 <= SHORT_CONTEXT) {
#pragma omp for schedule(static)
        for (int h = 0; h < heads; h++) {
            const int g = h / group;
            const float *q = qkv + (int64_t)h * hd;
            float *sc = scores + (int64_t)h * capacity;
            const size_t elem = kv_bf16 ? 2 : 4;
            const char *kbase = (const char *)k_cache + (size_t)g * capacity * hd * elem;
            const char *vbase = (const char *)v_cache + (size_t)g * capacity * hd * elem;
            float top = -INFINITY;
            for (int64_t t = 0; t <= pos; t++) {
                sc[t] = dot_kv(kbase + (size_t)t * hd * elem, kv_bf16, q, hd) * attn_scale;
                if (sc[t] > top) top = sc[t];
            }
            float total = 0.0f;
            for (int64_t t = 0; t <= pos; t++) {
                sc[t] = expf(sc[t] - top);
                total += sc[t];
            }
            float *o = att + (int64_t)h * hd;
            memset(o, 0, (size_t)hd * sizeof(float));
            const float inv_total = 1.0f / total;
            for (int64_t t = 0; t <= pos; t++)
                axpy_kv(o, sc[t] * inv_total, vbase + (size_t)t * hd * elem, kv_bf16, hd);
        }
    } else {
        const int64_t positions = pos + 1;
        int64_t chunk_len = (positions * kv_heads + ATT_UNITS - 1) / ATT_UNITS;
        chunk_len = chunk_len < ATT_CHUNK ? ATT_CHUNK : (chunk_len + ATT_CHUNK - 1) / ATT_CHUNK * ATT_CHUNK;
        const int chunks = (int)((positions + chunk_len - 1) / chunk_len);
        const size_t elem = kv_bf16 ? 2 : 4;
#pragma omp for schedule(static)
        for (int u = 0; u < kv_heads * chunks; u++) {
            const int g = u / chunks, c = u % chunks;
            const int64_t t0 = c * chunk_len, t1 = t0 + chunk_len <= positions ? t0 + chunk_len : positions;
            const char *kbase = (const char *)k_cache + (size_t)g * capacity * hd * elem;
            const char *vbase = (const char *)v_cache + (size_t)g * capacity * hd * elem;
            for (int j = 0; j < group; j++) {
                const int h = g * group + j;
                const float *q = qkv + (int64_t)h * hd;
                float *sc = scores + (int64_t)h * capacity;
                float top = -INFINITY;
                for (int64_t t = t0; t < t1; t++) {
                    sc[t] = dot_kv(kbase + (size_t)t * hd * elem, kv_bf16, q, hd) * attn_scale;
                    if (sc[t] > top) top = sc[t];
                }
                float total = 0.0f;
                for (int64_t t = t0; t < t1; t++) {
                    sc[t] = expf(sc[t] - top);
                    total += sc[t];
                }
                part_max[(int64_t)h * max_chunks + c] = top;
                part_sum[(int64_t)h * max_chunks + c] = total;
                memset(partial + ((int64_t)h * max_chunks + c) * hd, 0, (size_t)hd * sizeof(float));
            }
            for (int64_t t = t0; t < t1; t++) { /* each V row once, into every head of the group */
                const char *vrow = vbase + (size_t)t * hd * elem;
                for (int j = 0; j < group; j++) {
                    const int h = g * group + j;
                    axpy_kv(partial + ((int64_t)h * max_chunks + c) * hd, scores[(int64_t)h * capacity + t],
                            vrow, kv_bf16, hd);
                }
            }
        }
#pragma omp for schedule(static)
        for (int h = 0; h < heads; h++) { /* merge the chunks: rescale each to the overall max */
            float top = -INFINITY, total = 0.0f;
            for (int c = 0; c < chunks; c++) top = fmaxf(top, part_max[(int64_t)h * max_chunks + c]);
            float *o = att + (int64_t)h * hd;
            memset(o, 0, (size_t)hd * sizeof(float));
            for (int c = 0; c < chunks; c++) {
                const float weight = expf(part_max[(int64_t)h * max_chunks + c] - top);
                total += weight * part_sum[(int64_t)h * max_chunks + c];
                const float *part = partial + ((int64_t)h * max_chunks + c) * hd;
                for (int i = 0; i < hd; i++) o[i] += weight * part[i];
            }
            const float inv_total = 1.0f / total;
            for (int i = 0; i < hd; i++) o[i] *= inv_total;
        }
    }
}

/* Scratch floats hearth_step needs for a cache of `capacity` positions. */
HEARTH_API int64_t hearth_scratch_floats(const int64_t *cfg, int64_t capacity) {
    int64_t hidden = cfg[C_HIDDEN], heads = cfg[C_HEADS], kv = cfg[C_KV_HEADS], hd = cfg[C_HEAD_DIM];
    int64_t threads = cfg[C_THREADS] > 0 ? cfg[C_THREADS] : 1;
    int64_t widest = max3((int)hidden, (int)(heads * hd), (int)cfg[C_INTER]);
    int64_t chunks = (capacity + ATT_CHUNK - 1) / ATT_CHUNK;
    return hidden + (heads + 2 * kv) * hd + heads * hd + cfg[C_INTER] + hd + heads * capacity +
           heads * chunks * (hd + 2) + threads * thread_floats(hidden, widest);
}

/* One decode step: embeds `token` at position `pos`, writes its K/V at `pos` of every layer's cache and the next
 * token's logits [vocab] into `logits`. Returns 0, or a negative code for arguments it refuses. */
HEARTH_API int hearth_step(const int64_t *cfg, const float *cfgf, void *const *glob, void *const *layers, int64_t token,
                int64_t pos, int64_t capacity, float *logits, float *scratch) {
    const int n_layers = (int)cfg[C_LAYERS], hidden = (int)cfg[C_HIDDEN], heads = (int)cfg[C_HEADS];
    const int kv_heads = (int)cfg[C_KV_HEADS], hd = (int)cfg[C_HEAD_DIM], inter = (int)cfg[C_INTER];
    const int vocab = (int)cfg[C_VOCAB], embed_bf16 = (int)cfg[C_EMBED_BF16], kv_bf16 = (int)cfg[C_KV_BF16];
    const int q4 = (int)cfg[C_Q4]; /* decoder matrices in Q4_1; the lm_head is always int8 rows */
    const int threads = cfg[C_THREADS] > 0 ? (int)cfg[C_THREADS] : 1;
    const float eps = cfgf[F_EPS], attn_scale = cfgf[F_ATTN_SCALE], rope_scale = cfgf[F_ROPE_SCALE];
    const int half = hd / 2, qdim = heads * hd;
    const int units = heads + 2 * kv_heads, widest = max3(hidden, qdim, inter);
    if (token < 0 || token >= vocab || pos < 0 || pos >= capacity) return -1;
    if (kv_heads <= 0 || heads % kv_heads || hidden % QBLOCK || qdim % QBLOCK || inter % QBLOCK) return -2;
    if (q4 && hd % GROUP) return -2; /* each head's rows are whole groups */
    const int align = q4 ? GROUP : 4;

    float *x = scratch;
    float *qkv = x + hidden;
    float *att = qkv + (int64_t)units * hd;
    float *act = att + qdim;
    float *cosv = act + inter, *sinv = cosv + half;
    float *scores = sinv + half;
    const int max_chunks = (int)((capacity + ATT_CHUNK - 1) / ATT_CHUNK);
    float *partial = scores + (int64_t)heads * capacity; /* [heads][chunk][head_dim] unnormalized outputs */
    float *part_max = partial + (int64_t)heads * max_chunks * hd, *part_sum = part_max + (int64_t)heads * max_chunks;
    float *per_thread = part_sum + (int64_t)heads * max_chunks;

    if (embed_bf16) {
        const uint16_t *row = (const uint16_t *)glob[G_EMBED] + token * hidden;
        for (int i = 0; i < hidden; i++) x[i] = bf16_to_f32(row[i]);
    } else {
        memcpy(x, (const float *)glob[G_EMBED] + token * hidden, (size_t)hidden * sizeof(float));
    }
    const float *inv_freq = (const float *)glob[G_INV_FREQ];
    for (int i = 0; i < half; i++) {
        float angle = (float)pos * inv_freq[i];
        cosv[i] = cosf(angle) * rope_scale;
        sinv[i] = sinf(angle) * rope_scale;
    }

#pragma omp parallel num_threads(threads)
    {
        int tid, team;
        team_position(&tid, &team);
        /* Each thread normalizes and quantizes its matrix inputs privately: no barrier or shared write for them. */
        float *xn = per_thread + (int64_t)tid * thread_floats(hidden, widest);
        int8_t *xq = (int8_t *)(xn + hidden);
        float *xd = xn + hidden + widest / 4, *xs = xd + widest / QBLOCK;
        int32_t *xt = (int32_t *)(xs + widest / QBLOCK);
        const qvec normed = {xq, xd, xs, hidden, xt}, attended = {xq, xd, xs, qdim, xt};
        const qvec activated = {xq, xd, xs, inter, xt};
        int lo, hi;
#ifdef HEARTH_PROFILE
        if (tid == 0) profile_mark = omp_get_wtime();
#endif
        for (int l = 0; l < n_layers; l++) {
            void *const *p = layers + (int64_t)l * L_COUNT;
            const mat qkv_m = matrix(p, L_QKV_Q, q4, hidden), o_m = matrix(p, L_O_Q, q4, qdim);
            const mat gu_m = matrix(p, L_GU_Q, q4, hidden), down_m = matrix(p, L_DOWN_Q, q4, inter);
            rmsnorm(x, (const float *)p[L_ATTN_NORM], xn, hidden, eps);
            quantize_q8(xn, hidden, xq, xd, xs, xt);
#pragma omp for schedule(static)
            for (int u = 0; u < units; u++) {
                float *out = qkv + (int64_t)u * hd;
                gemv(from_row(qkv_m, u * hd), normed, 0, hd, out, 0);
                if (u < heads + kv_heads) rope(out, cosv, sinv, half);
                if (u >= heads) {
                    int is_v = u >= heads + kv_heads, head = (u - heads) % kv_heads;
                    store_kv(p[is_v ? L_V : L_K], kv_bf16, ((int64_t)head * capacity + pos) * hd, out, hd);
                }
            }
            PHASE(0);
            attend(qkv, p[L_K], p[L_V], kv_bf16, heads, kv_heads, hd, pos, capacity, attn_scale, scores, partial,
                   part_max, part_sum, max_chunks, att);
            PHASE(1);
            quantize_q8(att, qdim, xq, xd, xs, xt);
            split_rows(hidden, team, tid, align, &lo, &hi);
            gemv(o_m, attended, lo, hi, x, 1);
            PHASE(2);
#pragma omp barrier
            PHASE(3);
            rmsnorm(x, (const float *)p[L_MLP_NORM], xn, hidden, eps);
            quantize_q8(xn, hidden, xq, xd, xs, xt);
            if (q4) { /* gate rows [0, inter), then up rows: a group of each per pass, SiLU on the spot */
                const int64_t stride = (int64_t)(hidden / QBLOCK) * RECORD;
                const uint8_t *gate_w = (const uint8_t *)gu_m.q, *up_w = gate_w + (int64_t)(inter / GROUP) * stride;
                split_rows(inter, team, tid, GROUP, &lo, &hi);
                for (int r = lo; r < hi; r += GROUP) {
                    float gate[GROUP], up[GROUP];
                    q4_groups(gate_w + (r / GROUP) * stride, up_w + (r / GROUP) * stride, normed, gate, up);
                    for (int i = 0; i < GROUP; i++) {
                        const float g = gate[i] + (gu_m.b ? gu_m.b[r + i] : 0.0f);
                        const float u = up[i] + (gu_m.b ? gu_m.b[inter + r + i] : 0.0f);
                        act[r + i] = g / (1.0f + expf(-g)) * u;
                    }
                }
            } else {
                split_rows(2 * inter, team, tid, 4, &lo, &hi); /* 4-row chunks: whole gate/up pairs */
                for (int r = lo; r < hi; r += 4) {
                    const int rows = hi - r < 4 ? hi - r : 4;
                    float gu[4];
                    gemv(from_row(gu_m, r), normed, 0, rows, gu, 0);
                    for (int k = 0; k + 1 < rows; k += 2) {
                        const float gate = gu[k], up = gu[k + 1];
                        act[(r + k) / 2] = gate / (1.0f + expf(-gate)) * up;
                    }
                }
            }
            PHASE(4);
#pragma omp barrier
            PHASE(3);
            quantize_q8(act, inter, xq, xd, xs, xt);
            split_rows(hidden, team, tid, align, &lo, &hi);
            gemv(down_m, activated, lo, hi, x, 1);
            PHASE(5);
#pragma omp barrier
            PHASE(3);
        }
        rmsnorm(x, (const float *)glob[G_FINAL_NORM], xn, hidden, eps);
        quantize_q8(xn, hidden, xq, xd, xs, xt);
        split_rows(vocab, team, tid, GROUP, &lo, &hi);
        gemv_lm((const int8_t *)glob[G_LM_Q], (const float *)glob[G_LM_S], normed, lo, hi, logits);
        PHASE(6);
    }
    return 0;
}

#if HEARTH_AVX2
/* fp32 -> bf16 rounded to nearest even (finite values: a block's weights), left in the upper 16 bits of each lane. */
static inline __m256i bf16_rounded(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    return _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd));
}
#endif

/* Prefill's lm_head: logits [n][vocab] for n rows of x [n][cols] (fp32, cols a multiple of QBLOCK), through the
 * decode step's own path: each row quantized to int8 per block of 32, then the int8 x16 rows (gemv_lm) split across
 * the threads. Reads the head once per row instead of dequantizing it (a 1B model's: 100 ms a prefill in torch, ~4 ms
 * here). Returns 0, or -3 when the activation buffers can't be allocated. */
HEARTH_API int hearth_lm_head(const int8_t *w, const float *scale, int64_t vocab, int64_t cols, const float *x, int64_t n,
                   float *logits, int threads) {
    (void)threads; /* read only by OpenMP's pragma */
    const int64_t blocks = cols / QBLOCK;
    int8_t *xq = malloc((size_t)cols);
    float *xd = malloc((size_t)blocks * sizeof(float)), *xs = malloc((size_t)blocks * sizeof(float));
    int32_t *xt = malloc((size_t)blocks * sizeof(int32_t));
    int code = xq && xd && xs && xt ? 0 : -3;
    for (int64_t r = 0; r < n && code == 0; r++) {
        quantize_q8(x + r * cols, (int)cols, xq, xd, xs, xt);
        const qvec q = {xq, xd, xs, (int)cols, xt};
        float *out = logits + r * vocab;
#pragma omp parallel num_threads(threads)
        {
            int tid, team, lo, hi;
            team_position(&tid, &team);
            split_rows((int)vocab, team, tid, GROUP, &lo, &hi);
            gemv_lm(w, scale, q, lo, hi, out);
        }
    }
    free(xq);
    free(xd);
    free(xs);
    free(xt);
    return code;
}

/* Prefill from the one packed copy: `rows` rows (a multiple of GROUP) of an x16 Q4_1 matrix starting at `w` (its
 * first group's first record) written as d * q + m into `out` [rows, cols], fp32 or (out_bf16) bf16 rounded to
 * nearest even: the dense weight a GEMM then multiplies. Same two roundings as torch's q * d + m, so the torch
 * reference (app.core.fastpath.packed.dequantize_q4) is exact. */
HEARTH_API void hearth_dequant_q4(const uint8_t *w, int64_t rows, int64_t cols, void *out, int out_bf16, int threads) {
    (void)threads; /* read only by OpenMP's pragma */
    const int64_t blocks = cols / QBLOCK, stride = blocks * RECORD;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *group = w + (r / GROUP) * stride;
        const int i = (int)(r % GROUP);
        float values[QBLOCK];
        for (int64_t b = 0; b < blocks; b++) {
            const uint8_t *rec = group + b * RECORD;
            uint16_t dh, mh;
            memcpy(&dh, rec + RECORD_D + 2 * i, 2);
            memcpy(&mh, rec + RECORD_M + 2 * i, 2);
            const float d = half_to_float(dh), m = half_to_float(mh);
            uint8_t nibbles[QBLOCK / 2]; /* the row's 16 bytes in llama.cpp's order: byte j = value j | value j+16 << 4 */
            for (int k = 0; k < 4; k++) memcpy(nibbles + 4 * k, rec + 64 * k + 4 * i, 4);
#if HEARTH_AVX2 /* the same two roundings, 8 lanes at a time; a block's values are finite, so no NaN case */
            const __m128i bytes = _mm_loadu_si128((const __m128i *)nibbles), low_mask = _mm_set1_epi8(15);
            const __m128i parts[2] = {_mm_and_si128(bytes, low_mask),
                                      _mm_and_si128(_mm_srli_epi16(bytes, 4), low_mask)};
            const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
            __m256 v[4];
            for (int k = 0; k < 4; k++) {
                const __m128i eight = (k & 1) ? _mm_srli_si128(parts[k >> 1], 8) : parts[k >> 1];
                v[k] = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(eight)), vd), vm);
            }
            if (out_bf16) {
                uint16_t *target = (uint16_t *)out + r * cols + b * QBLOCK;
                __m256i rounded[4];
                for (int k = 0; k < 4; k++) rounded[k] = _mm256_srli_epi32(bf16_rounded(v[k]), 16);
                for (int k = 0; k < 4; k += 2) { /* packus interleaves 128-bit lanes: permute them back */
                    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(rounded[k], rounded[k + 1]), 0xD8);
                    _mm256_storeu_si256((__m256i *)(target + 8 * k), packed);
                }
            } else {
                float *target = (float *)out + r * cols + b * QBLOCK;
                for (int k = 0; k < 4; k++) _mm256_storeu_ps(target + 8 * k, v[k]);
            }
            continue;
#endif
            for (int j = 0; j < QBLOCK / 2; j++) {
                float low = (float)(nibbles[j] & 15) * d, high = (float)(nibbles[j] >> 4) * d;
                values[j] = low + m;
                values[j + QBLOCK / 2] = high + m;
            }
            if (out_bf16) {
                uint16_t *target = (uint16_t *)out + r * cols + b * QBLOCK;
                for (int j = 0; j < QBLOCK; j++) target[j] = f32_to_bf16(values[j]);
            } else {
                memcpy((float *)out + r * cols + b * QBLOCK, values, sizeof values);
            }
        }
    }
}

/* Prefill's activations: each block of 32 values as int16 steps of amax / 32512 (15 bits, finer than bf16's 8),
 * split into two int8 halves x16 = 256 * h + l (h in [-127, 127], l in [-128, 127]) so the decode step's int8 dot
 * products multiply them. Per block: the step dx, and sh = dx * 256 * sum(h), sl = dx * sum(l) for the Q4_1 offset. */
#define Q16_STEPS 32512.0f /* 127 * 256: h stays within int8 */
static void quantize_q16(const float *x, int n, int8_t *h, int8_t *l, float *dx, float *sh, float *sl) {
    for (int b = 0; b < n / QBLOCK; b++) {
        const float *xb = x + b * QBLOCK;
#if HEARTH_AVX2 /* the scalar loop's operations, 8 lanes at a time */
        const __m256 top = _mm256_set1_ps(Q16_STEPS);
        __m256 v[4];
        for (int k = 0; k < 4; k++) v[k] = _mm256_loadu_ps(xb + 8 * k);
        const float step = absmax32(v) / Q16_STEPS;
        const __m256 mul = _mm256_set1_ps(step > 0.0f ? 1.0f / step : 0.0f);
        __m256i hi[4], lo[4], hsum = _mm256_setzero_si256(), lsum = _mm256_setzero_si256();
        for (int k = 0; k < 4; k++) {
            __m256 r = _mm256_round_ps(_mm256_mul_ps(v[k], mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            r = _mm256_min_ps(_mm256_max_ps(r, _mm256_sub_ps(_mm256_setzero_ps(), top)), top);
            const __m256i x16 = _mm256_cvtps_epi32(r);
            hi[k] = _mm256_srai_epi32(_mm256_add_epi32(x16, _mm256_set1_epi32(128)), 8);
            lo[k] = _mm256_sub_epi32(x16, _mm256_slli_epi32(hi[k], 8));
            hsum = _mm256_add_epi32(hsum, hi[k]);
            lsum = _mm256_add_epi32(lsum, lo[k]);
        }
        const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* undo packs' lane interleave */
        const __m256i hp = _mm256_packs_epi16(_mm256_packs_epi32(hi[0], hi[1]), _mm256_packs_epi32(hi[2], hi[3]));
        const __m256i lp = _mm256_packs_epi16(_mm256_packs_epi32(lo[0], lo[1]), _mm256_packs_epi32(lo[2], lo[3]));
        _mm256_storeu_si256((__m256i *)(h + b * QBLOCK), _mm256_permutevar8x32_epi32(hp, order));
        _mm256_storeu_si256((__m256i *)(l + b * QBLOCK), _mm256_permutevar8x32_epi32(lp, order));
        int32_t hs[8], ls[8], high = 0, low = 0;
        _mm256_storeu_si256((__m256i *)hs, hsum);
        _mm256_storeu_si256((__m256i *)ls, lsum);
        for (int i = 0; i < 8; i++) high += hs[i], low += ls[i];
#else
        float amax = 0.0f;
        for (int i = 0; i < QBLOCK; i++) amax = fmaxf(amax, fabsf(xb[i]));
        const float step = amax / Q16_STEPS, inv = step > 0.0f ? 1.0f / step : 0.0f;
        int32_t high = 0, low = 0;
        for (int i = 0; i < QBLOCK; i++) {
            float v = nearbyintf(xb[i] * inv);
            v = fminf(fmaxf(v, -Q16_STEPS), Q16_STEPS);
            const int32_t x16 = (int32_t)v, hi = (x16 + 128) >> 8;
            h[b * QBLOCK + i] = (int8_t)hi;
            l[b * QBLOCK + i] = (int8_t)(x16 - 256 * hi);
            high += hi;
            low += x16 - 256 * hi;
        }
#endif
        dx[b] = step;
        sh[b] = step * 256.0f * (float)high;
        sl[b] = step * (float)low;
    }
}

/* A prompt's rows through an x16 Q4_1 matrix: y [n][rows] = x [n][cols] . W^T with x in quantize_q16's int16
 * halves, each multiplied by the records as the decode step multiplies its int8 input. The groups split across the
 * threads; a group's records (6-56 KiB) come from memory once and stay in cache while every row of x passes over
 * them, so the matrix is read once per call and never dequantized. On x86 a block's two halves combine exactly in
 * int32, and rows share each record's unpacked nibbles (four with AVX-512, two with AVX2: the same floats on both);
 * elsewhere each half goes through group_block. A row's outputs do not depend on the other rows. x and y are fp32, or bf16 where x_bf16 / y_bf16 is set (y rounded to
 * nearest even). Returns 0, -1 for shapes it refuses, -3 when its buffers (n * cols * 2.4 bytes, a row of floats
 * per thread) can't be allocated. */
#if HEARTH_AVX512
#define Q16_TILE 4
static inline void group_block_q16(group_acc *a, const uint8_t *rec, const int8_t *xh, const int8_t *xl, int64_t cols,
                                   const float *dx, const float *sx, int64_t blocks, int n) {
    const __m512i mask = _mm512_set1_epi8(0x0f);
    __m512i low[4], high[4];
    for (int k = 0; k < 4; k++) {
        const __m512i v = _mm512_loadu_si512((const void *)(rec + 64 * k));
        low[k] = _mm512_and_si512(v, mask);
        high[k] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + RECORD_D)));
    const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + RECORD_M)));
    for (int r = 0; r < n; r++) {
        const int8_t *hb = xh + r * cols, *lb = xl + r * cols;
        __m512i hs = _mm512_setzero_si512(), ls = _mm512_setzero_si512();
        for (int k = 0; k < 4; k++) {
            int32_t h0, h1, l0, l1;
            memcpy(&h0, hb + 4 * k, 4);
            memcpy(&h1, hb + 16 + 4 * k, 4);
            memcpy(&l0, lb + 4 * k, 4);
            memcpy(&l1, lb + 16 + 4 * k, 4);
            hs = _mm512_dpbusd_epi32(hs, low[k], _mm512_set1_epi32(h0));
            hs = _mm512_dpbusd_epi32(hs, high[k], _mm512_set1_epi32(h1));
            ls = _mm512_dpbusd_epi32(ls, low[k], _mm512_set1_epi32(l0));
            ls = _mm512_dpbusd_epi32(ls, high[k], _mm512_set1_epi32(l1));
        }
        /* |sum| <= 32 * 15 * 32512 < 2^24: exact in int32 and in the float conversion */
        const __m512i total = _mm512_add_epi32(_mm512_slli_epi32(hs, 8), ls);
        const __m512 dd = _mm512_mul_ps(d, _mm512_set1_ps(dx[r * blocks]));
        a[r].acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), dd, a[r].acc);
        a[r].macc = _mm512_fmadd_ps(m, _mm512_set1_ps(sx[r * blocks]), a[r].macc);
    }
}
#elif HEARTH_AVX2
#define Q16_TILE 2
/* group_block_q16's operations per lane on 8 rows at a time (the same floats as the AVX-512 tile): two input rows
 * share each chunk's unpacked nibbles; the 16 ymm registers hold no more. */
static inline void group_block_q16(group_acc *a, const uint8_t *rec, const int8_t *xh, const int8_t *xl, int64_t cols,
                                   const float *dx, const float *sx, int64_t blocks, int n) {
    const __m256i mask = _mm256_set1_epi8(0x0f);
#if !HEARTH_AVXVNNI
    const __m256i ones = _mm256_set1_epi16(1);
#endif
    for (int h = 0; h < 2; h++) { /* rows 0-7, then 8-15: bytes 0-31 and 32-63 of each chunk */
        __m256i hs[Q16_TILE], ls[Q16_TILE];
        for (int r = 0; r < n; r++) hs[r] = ls[r] = _mm256_setzero_si256();
        for (int k = 0; k < 4; k++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(rec + 64 * k + 32 * h));
            const __m256i low = _mm256_and_si256(v, mask), high = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
            for (int r = 0; r < n; r++) {
                int32_t h0, h1, l0, l1;
                memcpy(&h0, xh + r * cols + 4 * k, 4);
                memcpy(&h1, xh + r * cols + 16 + 4 * k, 4);
                memcpy(&l0, xl + r * cols + 4 * k, 4);
                memcpy(&l1, xl + r * cols + 16 + 4 * k, 4);
#if HEARTH_AVXVNNI
                hs[r] = dp4_add(dp4_add(hs[r], low, _mm256_set1_epi32(h0)), high, _mm256_set1_epi32(h1));
                ls[r] = dp4_add(dp4_add(ls[r], low, _mm256_set1_epi32(l0)), high, _mm256_set1_epi32(l1));
#else
                const __m256i hp = _mm256_add_epi16(_mm256_maddubs_epi16(low, _mm256_set1_epi32(h0)),
                                                    _mm256_maddubs_epi16(high, _mm256_set1_epi32(h1)));
                const __m256i lp = _mm256_add_epi16(_mm256_maddubs_epi16(low, _mm256_set1_epi32(l0)),
                                                    _mm256_maddubs_epi16(high, _mm256_set1_epi32(l1)));
                /* each int16 sum: four nibble products, |4 * 15 * 128| fits */
                hs[r] = _mm256_add_epi32(hs[r], _mm256_madd_epi16(hp, ones));
                ls[r] = _mm256_add_epi32(ls[r], _mm256_madd_epi16(lp, ones));
#endif
            }
        }
        const __m256 d = halves8(rec + RECORD_D + 16 * h), m = halves8(rec + RECORD_M + 16 * h);
        for (int r = 0; r < n; r++) {
            const __m256i total = _mm256_add_epi32(_mm256_slli_epi32(hs[r], 8), ls[r]);
            const __m256 dd = _mm256_mul_ps(d, _mm256_set1_ps(dx[r * blocks]));
            a[r].acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), dd, a[r].acc[h]);
            a[r].macc[h] = _mm256_fmadd_ps(m, _mm256_set1_ps(sx[r * blocks]), a[r].macc[h]);
        }
    }
}
#else
#define Q16_TILE 1
#endif

HEARTH_API int hearth_q4_prefill(const uint8_t *w, int64_t rows, int64_t cols, const void *x, int x_bf16, int64_t n, void *y,
                      int y_bf16, int threads) {
    if (n < 1 || rows < GROUP || rows % GROUP || cols < QBLOCK || cols % QBLOCK || cols > INT32_MAX) return -1;
    if (threads < 1) threads = 1;
    const int64_t blocks = cols / QBLOCK, stride = blocks * RECORD, groups = rows / GROUP;
    int8_t *xh = malloc((size_t)(n * cols)), *xl = malloc((size_t)(n * cols));
    float *xd = malloc((size_t)(n * blocks) * 3 * sizeof(float));
    float *row_buffers = x_bf16 ? malloc((size_t)(threads * cols) * sizeof(float)) : NULL;
    if (!xh || !xl || !xd || (x_bf16 && !row_buffers)) {
        free(xh), free(xl), free(xd), free(row_buffers);
        return -3;
    }
    float *xsh = xd + n * blocks, *xsl = xsh + n * blocks;
#pragma omp parallel num_threads(threads)
    {
        int tid, team;
        team_position(&tid, &team);
        (void)team;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < n; r++) {
            const float *row = (const float *)x + r * cols;
            if (x_bf16) {
                float *into = row_buffers + (int64_t)tid * cols;
                const uint16_t *from = (const uint16_t *)x + r * cols;
                for (int64_t i = 0; i < cols; i++) into[i] = bf16_to_f32(from[i]);
                row = into;
            }
            quantize_q16(row, (int)cols, xh + r * cols, xl + r * cols, xd + r * blocks, xsh + r * blocks,
                         xsl + r * blocks);
#if HEARTH_AVX2 /* the SIMD tiles take one offset term per block, sh + sl, in xsh */
            for (int64_t b = 0; b < blocks; b++) xsh[r * blocks + b] += xsl[r * blocks + b];
#endif
        }
#pragma omp for schedule(static)
        for (int64_t g = 0; g < groups; g++) {
            const uint8_t *group = w + g * stride;
            for (int64_t r0 = 0; r0 < n; r0 += Q16_TILE) {
                const int tile = n - r0 < Q16_TILE ? (int)(n - r0) : Q16_TILE;
                group_acc acc[Q16_TILE];
                for (int r = 0; r < tile; r++) group_zero(&acc[r]);
                for (int64_t b = 0; b < blocks; b++) {
                    const int64_t at = r0 * cols + b * QBLOCK, s = r0 * blocks + b;
#if HEARTH_AVX2
                    group_block_q16(acc, group + b * RECORD, xh + at, xl + at, cols, xd + s, xsh + s, blocks, tile);
#else
                    group_block(&acc[0], group + b * RECORD, xh + at, 256.0f * xd[s], xsh[s]);
                    group_block(&acc[0], group + b * RECORD, xl + at, xd[s], xsl[s]);
#endif
                }
                for (int r = 0; r < tile; r++) {
                    const int64_t at = (r0 + r) * rows + g * GROUP;
                    if (y_bf16) {
                        float out[GROUP];
                        group_store(&acc[r], out);
                        for (int i = 0; i < GROUP; i++) ((uint16_t *)y)[at + i] = f32_to_bf16(out[i]);
                    } else {
                        group_store(&acc[r], (float *)y + at);
                    }
                }
            }
        }
    }
    free(xh), free(xl), free(xd), free(row_buffers);
    return 0;
}

/* ================================================================================================================
 * GGUF blocks: matrices multiplied on the quantized blocks of a GGUF file as it lies on disk (mapped, never
 * converted), each row in the file's own layout: cols / V blocks of B bytes (ggml's types and numbers below).
 *
 * Every weight format is read as 32-value chunks of small unsigned integers (Q8_0: signed) with a float factor A and
 * an offset factor B per chunk. Inputs are quantized per 32 values (one scale dx per chunk): to int8 (step
 * max|x| / 127, llama.cpp's Q8_0 activations, finer than the Q8_K its K-quant kernels use), or "precise" to 15 bits
 * (step max|x| / 32512, held as two int8 halves x = 256 h + l, each half through the same integer dot products). A
 * row's dot product with x is
 *     sum over chunks j of  dx_j * A_j * (w_j . xq_j)  +  B_j * (dx_j * sum xq_j)        (+ Q6_K's integer scales)
 * where the integer dot (w_j . xq_j) is exact in every ISA, kept as int32 lanes of 4 products each (lane i = bytes
 * 4i..4i+3), converted to float and accumulated per lane with one fused multiply-add, and the offsets are summed
 * apart. A row's result depends only on that row and that input: not on how many inputs share the call, the tile they
 * land in, or the threads (decode's one-row step and prefill's many-row product agree bit for bit). AVX-512 VNNI takes
 * 64 values per instruction and so sums its lanes in another order than AVX2/NEON: the builds agree to rounding.
 *
 *   type    values/bytes  chunk j's weights          A_j            B_j
 *   Q4_0    32 / 18       nibbles q                  d              -8 d
 *   Q4_1    32 / 20       nibbles q                  d              m
 *   Q5_0    32 / 22       5-bit q                    d              -16 d
 *   Q5_1    32 / 24       5-bit q                    d              m
 *   Q8_0    32 / 34       int8 q                     d              0 (AVX-512: q + 128 unsigned, B = -128 d)
 *   Q4_K    256 / 144     nibbles, 8 chunks          d * sc_j       -dmin * m_j
 *   Q5_K    256 / 176     5-bit, 8 chunks            d * sc_j       -dmin * m_j
 *   Q6_K    256 / 210     6-bit, two 16-value scales per chunk folded into the integer lanes; -32 offset exact
 *   F32, F16, BF16        float weights against the fp32 input (not quantized)
 */
#define GG_F32 0
#define GG_F16 1
#define GG_Q4_0 2
#define GG_Q4_1 3
#define GG_Q5_0 6
#define GG_Q5_1 7
#define GG_Q8_0 8
#define GG_Q4_K 12
#define GG_Q5_K 13
#define GG_Q6_K 14
#define GG_BF16 30
#define QK 256
#define Q15_STEPS 32512.0f /* 127 * 256: the high half stays within int8 */

/* Block geometry of a type this kernel computes on: values[0] weights per block, values[1] bytes. -1: not here. */
HEARTH_API int hearth_gg_geometry(int type, int64_t *values) {
    int64_t v, b;
    switch (type) {
    case GG_F32: v = 1, b = 4; break;
    case GG_F16: v = 1, b = 2; break;
    case GG_BF16: v = 1, b = 2; break;
    case GG_Q4_0: v = 32, b = 18; break;
    case GG_Q4_1: v = 32, b = 20; break;
    case GG_Q5_0: v = 32, b = 22; break;
    case GG_Q5_1: v = 32, b = 24; break;
    case GG_Q8_0: v = 32, b = 34; break;
    case GG_Q4_K: v = QK, b = 144; break;
    case GG_Q5_K: v = QK, b = 176; break;
    case GG_Q6_K: v = QK, b = 210; break;
    default: return -1;
    }
    values[0] = v, values[1] = b;
    return 0;
}

static inline int gg_is_float(int type) { return type == GG_F32 || type == GG_F16 || type == GG_BF16; }

static inline float gg_half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return half_to_float(h);
}

/* Q4_K / Q5_K: the 6-bit scale and min of chunk j from the 12 packed bytes (ggml's get_scale_min_k4). */
static inline void k4_scale_min(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63, *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* The 256 (or 32) weights of one block as small integers in value order, with each 32-value chunk's A and B (and
 * Q6_K's 16 int scales): the reference every SIMD path reads the same way, and what dequantization uses. */
typedef struct {
    uint8_t q[QK]; /* Q8_0: the int8 bits */
    float a[8], b[8];
    int8_t sc16[16]; /* Q6_K */
} gg_block;

static int gg_unpack(int type, const uint8_t *p, gg_block *out) {
    switch (type) {
    case GG_Q4_0:
    case GG_Q4_1:
    case GG_Q5_0:
    case GG_Q5_1: {
        const int five = type == GG_Q5_0 || type == GG_Q5_1, with_min = type == GG_Q4_1 || type == GG_Q5_1;
        const float d = gg_half(p);
        const uint8_t *qs = p + 2 + 2 * with_min + 4 * five;
        uint32_t qh = 0;
        if (five) memcpy(&qh, p + 2 + 2 * with_min, 4);
        for (int i = 0; i < 16; i++) {
            out->q[i] = (uint8_t)((qs[i] & 15) | (((qh >> i) & 1) << 4));
            out->q[i + 16] = (uint8_t)((qs[i] >> 4) | (((qh >> (i + 16)) & 1) << 4));
        }
        out->a[0] = d;
        out->b[0] = with_min ? gg_half(p + 2) : (five ? -16.0f : -8.0f) * d;
        return 1;
    }
    case GG_Q8_0:
        memcpy(out->q, p + 2, 32);
        out->a[0] = gg_half(p), out->b[0] = 0.0f;
        return 1;
    case GG_Q4_K:
    case GG_Q5_K: {
        const float d = gg_half(p), dmin = gg_half(p + 2);
        const uint8_t *scales = p + 4, *qh = p + 16, *qs = p + (type == GG_Q4_K ? 16 : 48);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                out->q[64 * c + l] = qs[32 * c + l] & 15;
                out->q[64 * c + 32 + l] = qs[32 * c + l] >> 4;
            }
        if (type == GG_Q5_K)
            for (int j = 0; j < 8; j++)
                for (int l = 0; l < 32; l++) out->q[32 * j + l] |= (uint8_t)(((qh[l] >> j) & 1) << 4);
        for (int j = 0; j < 8; j++) {
            int sc, m;
            k4_scale_min(j, scales, &sc, &m);
            out->a[j] = d * (float)sc, out->b[j] = -(dmin * (float)m);
        }
        return 8;
    }
    case GG_Q6_K: {
        const uint8_t *ql = p, *qh = p + 128;
        const float d = gg_half(p + 208);
        for (int g = 0; g < 8; g++) {
            const int h = g / 4, part = g % 2, nib = (g / 2) % 2, shift = 2 * (g % 4);
            for (int l = 0; l < 32; l++) {
                const uint8_t low = (uint8_t)((ql[64 * h + 32 * part + l] >> (4 * nib)) & 15);
                out->q[32 * g + l] = (uint8_t)(low | (((qh[32 * h + l] >> shift) & 3) << 4));
            }
        }
        memcpy(out->sc16, p + 192, 16);
        for (int j = 0; j < 8; j++) out->a[j] = d, out->b[j] = 0.0f;
        return 8;
    }
    default:
        return 0;
    }
}

/* An unpacked block's values as fp32 (`chunks` chunks of 32). */
static void gg_block_floats(int type, int chunks, const gg_block *block, float *out) {
    for (int j = 0; j < chunks; j++)
        for (int l = 0; l < 32; l++) {
            const int v = 32 * j + l;
            float *o = out + v;
            if (type == GG_Q4_0 || type == GG_Q5_0)
                *o = block->a[0] * (float)((int)block->q[v] - (type == GG_Q4_0 ? 8 : 16));
            else if (type == GG_Q4_1 || type == GG_Q5_1)
                *o = block->a[0] * (float)block->q[v] + block->b[0];
            else if (type == GG_Q8_0)
                *o = block->a[0] * (float)(int8_t)block->q[v];
            else if (type == GG_Q6_K)
                *o = (block->a[0] * (float)block->sc16[v / 16]) * (float)((int)block->q[v] - 32);
            else
                *o = block->a[j] * (float)block->q[v] + block->b[j]; /* b = -(dmin * m) */
        }
}

/* n values (whole blocks) of `src` as fp32, exactly as gguf.quants (numpy) and ggml's dequantize_row_* compute them:
 * every product below is exact in fp32 (at most 24 significant bits), so one rounding at most (the + m, K's - dm). */
HEARTH_API int hearth_gg_dequant(int type, const void *src, int64_t n, float *out) {
    int64_t geometry[2];
    if (hearth_gg_geometry(type, geometry) != 0 || n % geometry[0]) return -1;
    const uint8_t *p = (const uint8_t *)src;
    if (type == GG_F32) {
        memcpy(out, p, (size_t)n * 4);
        return 0;
    }
    if (type == GG_F16 || type == GG_BF16) {
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = type == GG_F16 ? half_to_float(h) : bf16_to_f32(h);
        }
        return 0;
    }
    gg_block block;
    for (int64_t at = 0; at < n; at += geometry[0], p += geometry[1]) gg_block_floats(type, gg_unpack(type, p, &block), &block, out + at);
    return 0;
}

/* One matrix input: the fp32 values (float weights read them) and their quantization per 32 values: int8 values q
 * (or, precise, the high halves h) and `l` the low halves (NULL for int8), the scale per 32, d * sum per 32, and the
 * integer sum per 16 (Q6_K's -32 offset). */
#define TILE_SLOTS 8 /* inputs side by side in a tile (gtile_put): AVX-512's wide tile; AVX2 reads a tile 4 at a time */
typedef struct {
    int8_t *q, *l; /* [chunk][step (8 of 4 values)][slot][4 bytes] */
    float *d, *s;  /* [chunk][slot] */
    int32_t *n16;  /* [half chunk][slot] */
} gtile;

typedef struct {
    const float *f;
    const int8_t *q;
    const int8_t *l;
    const float *d;
    const float *s;
    const int32_t *n16;
    gtile tile; /* a copy of the above in slot `slot` of a tile (tile.q NULL: none) */
    int slot;
} gvec;

#if HEARTH_AVX2
/* 8 int32 lanes (each within int8) stored as 8 bytes. */
static inline void store_bytes8(int8_t *out, __m256i v) {
    const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64((__m128i *)out, _mm_packs_epi16(words, words));
}

#endif

static void gg_quantize(const float *x, int cols, int precise, int8_t *q, int8_t *l, float *d, float *s,
                        int32_t *n16) {
    for (int b = 0; b < cols / QBLOCK; b++) {
        const float *xb = x + b * QBLOCK;
        float amax = 0.0f;
#if HEARTH_AVX2 /* the scalar loop's values, 8 lanes at a time: max is exact, the rounding is nearbyintf's */
        const __m256 block[4] = {_mm256_loadu_ps(xb), _mm256_loadu_ps(xb + 8), _mm256_loadu_ps(xb + 16),
                                 _mm256_loadu_ps(xb + 24)};
        amax = absmax32(block);
        const float step = amax / (precise ? Q15_STEPS : 127.0f), inverse = step > 0.0f ? 1.0f / step : 0.0f;
        int32_t sums[2] = {0, 0};
        for (int i = 0; i < QBLOCK; i += 8) {
            __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(block[i / 8], _mm256_set1_ps(inverse)));
            if (precise) {
                v = _mm256_min_epi32(_mm256_max_epi32(v, _mm256_set1_epi32(-32512)), _mm256_set1_epi32(32512));
                const __m256i high = _mm256_srai_epi32(_mm256_add_epi32(v, _mm256_set1_epi32(128)), 8);
                const __m256i low =
                    _mm256_max_epi32(_mm256_sub_epi32(v, _mm256_slli_epi32(high, 8)), _mm256_set1_epi32(-127));
                store_bytes8(q + b * QBLOCK + i, high), store_bytes8(l + b * QBLOCK + i, low);
                v = _mm256_add_epi32(_mm256_slli_epi32(high, 8), low);
            } else {
                v = _mm256_min_epi32(_mm256_max_epi32(v, _mm256_set1_epi32(-127)), _mm256_set1_epi32(127));
                store_bytes8(q + b * QBLOCK + i, v);
            }
            sums[i / 16] += hsum_epi32(v);
        }
        d[b] = step;
        s[b] = step * (float)(sums[0] + sums[1]);
        n16[2 * b] = sums[0], n16[2 * b + 1] = sums[1];
#else
        for (int i = 0; i < QBLOCK; i++) amax = fmaxf(amax, fabsf(xb[i]));
        const float scale = amax / (precise ? Q15_STEPS : 127.0f);
        const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
        int32_t half[2] = {0, 0};
        for (int i = 0; i < QBLOCK; i++) {
            int v = (int)nearbyintf(xb[i] * inv);
            if (precise) {
                v = v > 32512 ? 32512 : v < -32512 ? -32512 : v;
                int high = (v + 128) >> 8, low = v - 256 * high;
                if (low < -127) low = -127; /* -128 would overflow AVX2's sign trick; one step in 32512 */
                q[b * QBLOCK + i] = (int8_t)high, l[b * QBLOCK + i] = (int8_t)low;
                v = 256 * high + low;
            } else {
                v = v > 127 ? 127 : v < -127 ? -127 : v;
                q[b * QBLOCK + i] = (int8_t)v;
            }
            half[i / 16] += v;
        }
        d[b] = scale;
        s[b] = scale * (float)(half[0] + half[1]);
        n16[2 * b] = half[0], n16[2 * b + 1] = half[1];
#endif
    }
}

#define GG_TILE 4 /* inputs per pass over a weight row */
/* inputs per pass over a 16-row group: AVX-512's 32 registers hold the sums of 8 (AVX2's 16, of 4) */
#if HEARTH_AVX512
#define X16_TILE 8
#else
#define X16_TILE GG_TILE
#endif

#if HEARTH_AVX2
static inline __m256i nibbles_32(const uint8_t *p16) { /* 16 bytes -> 32 values in Q4_0/Q4_1 order */
    const __m128i raw = _mm_loadu_si128((const __m128i *)p16), mask = _mm_set1_epi8(15);
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(raw, mask)),
                                   _mm_and_si128(_mm_srli_epi16(raw, 4), mask), 1);
}

/* byte i = 0x10 where bit i of the 32 bits at p is set (Q5_0/Q5_1's fifth bits; ggml's bytes_from_bits_32) */
static inline __m256i fifth_bits_32(const uint8_t *p) {
    uint32_t bits;
    memcpy(&bits, p, 4);
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)bits),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
    const __m256i set = _mm256_cmpeq_epi8(_mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)),
                                          _mm256_set1_epi64x(-1));
    return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

/* The 32 values of a Q4_0/Q4_1/Q5_0/Q5_1 block as unsigned bytes. */
static inline __m256i small_block_32(int type, const uint8_t *p) {
    if (type == GG_Q4_0) return nibbles_32(p + 2);
    if (type == GG_Q4_1) return nibbles_32(p + 4);
    const int at = type == GG_Q5_0 ? 2 : 4;
    return _mm256_or_si256(nibbles_32(p + at + 4), fifth_bits_32(p + at));
}

/* Chunks 2c and 2c+1 (64 values) of a Q4_K or Q5_K block as unsigned bytes; qh = the Q5_K block's 32 high-bit bytes. */
static inline void k45_pair(int type, const uint8_t *p, int c, __m256i qh, __m256i *w0, __m256i *w1) {
    const __m256i raw = _mm256_loadu_si256((const __m256i *)(p + (type == GG_Q4_K ? 16 : 48) + 32 * c));
    const __m256i mask = _mm256_set1_epi8(15);
    *w0 = _mm256_and_si256(raw, mask);
    *w1 = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
    if (type == GG_Q5_K) {
        const __m256i one = _mm256_set1_epi8(1);
        *w0 = _mm256_or_si256(*w0, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c)), one), 4));
        *w1 = _mm256_or_si256(*w1,
                              _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c + 1)), one), 4));
    }
}

/* Chunks 2c and 2c+1 of a Q6_K block as unsigned 6-bit bytes (q + 32). */
static inline void q6_pair(const uint8_t *p, int c, __m256i *w0, __m256i *w1) {
    const int h = c >> 1, nib = c & 1;
    const __m256i mask = _mm256_set1_epi8(15), two = _mm256_set1_epi8(3);
    const __m128i low_shift = _mm_cvtsi32_si128(4 * nib);
    const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(p + 64 * h));
    const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(p + 64 * h + 32));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * h));
    const __m256i hi0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, low_shift), two), 4);
    const __m256i hi1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(4 * nib + 2)), two), 4);
    *w0 = _mm256_or_si256(_mm256_and_si256(_mm256_srl_epi16(ql0, low_shift), mask), hi0);
    *w1 = _mm256_or_si256(_mm256_and_si256(_mm256_srl_epi16(ql1, low_shift), mask), hi1);
}

/* Q6_K's offsets of the block's 8 chunks: sc_2j n16_2j + sc_2j+1 n16_2j+1 (int32, exact), as floats. */
static inline __m256 q6_offsets(__m128i scales16, const int32_t *n16) {
    const __m256i lo = _mm256_mullo_epi32(_mm256_cvtepi8_epi32(scales16), _mm256_loadu_si256((const __m256i *)n16));
    const __m256i hi = _mm256_mullo_epi32(_mm256_cvtepi8_epi32(_mm_srli_si128(scales16, 8)),
                                          _mm256_loadu_si256((const __m256i *)(n16 + 8)));
    return _mm256_cvtepi32_ps(_mm256_permute4x64_epi64(_mm256_hadd_epi32(lo, hi), 0xD8));
}
#endif

#if HEARTH_AVX2 && !HEARTH_AVX512
/* int32 lane i = bytes 4i..4i+3 of w (unsigned, <= 63) times x (int8) */
static inline __m256i dot_u8(__m256i w, __m256i x) {
    return dp4_add(_mm256_setzero_si256(), w, x);
}
/* The same for a precise input: 256 (w . h) + (w . l), exact in int32 (|lane| <= 4 * 63 * 127 * 257) */
static inline __m256i dot_u8_15(__m256i w, __m256i h, __m256i l) {
#if HEARTH_AVXVNNI
    return dp4_add(_mm256_slli_epi32(dot_u8(w, h), 8), w, l);
#else
    return _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(w, h), _mm256_set1_epi16(256)),
                            _mm256_madd_epi16(_mm256_maddubs_epi16(w, l), _mm256_set1_epi16(1)));
#endif
}
#endif

/* Dot products of one weight row (`row`, `cols` values of `type`) with `count` <= GG_TILE inputs: out[k]. Always
 * inlined with constant `type`, `count` and `precise` (gg_rows), so each variant's loops are its own and its
 * accumulators live in registers. */
static inline __attribute__((always_inline)) void gg_row_dot(int type, const uint8_t *row, int cols, const gvec *x,
                                                             int count, int precise, float *out) {
    if (gg_is_float(type)) {
        for (int k = 0; k < count; k++) {
            float total = 0.0f;
            int i = 0;
#if HEARTH_AVX2
            __m256 acc = _mm256_setzero_ps();
            for (; i + 8 <= cols; i += 8) {
                __m256 w;
                if (type == GG_F32)
                    w = _mm256_loadu_ps((const float *)row + i);
                else if (type == GG_F16)
                    w = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i)));
                else
                    w = bf16x8((const uint16_t *)row + i);
                acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(x[k].f + i), acc);
            }
            total = hsum256(acc);
#endif
            for (; i < cols; i++) {
                float w;
                if (type == GG_F32)
                    memcpy(&w, row + 4 * i, 4);
                else {
                    uint16_t h;
                    memcpy(&h, row + 2 * i, 2);
                    w = type == GG_F16 ? half_to_float(h) : bf16_to_f32(h);
                }
                total += w * x[k].f[i];
            }
            out[k] = total;
        }
        return;
    }
    int64_t geometry[2];
    hearth_gg_geometry(type, geometry);
    const int bvalues = (int)geometry[0], bbytes = (int)geometry[1], blocks = cols / bvalues;
#if HEARTH_AVX2
    /* Per block (or 8 small blocks), the chunks' factors as vectors, lane = chunk: A_j * dx_j (each lane broadcast to
     * the chunk's multiply-adds) and the offsets B_j * (dx_j sum xq_j), summed lane-wise in voff. */
    __m256 voff[GG_TILE], scaled[GG_TILE];
#if HEARTH_AVX512
    __m512 acc[GG_TILE];
    for (int k = 0; k < count; k++) acc[k] = _mm512_setzero_ps(), voff[k] = _mm256_setzero_ps();
    const __m512i zero = _mm512_setzero_si512();
/* int32 lanes of w (64 unsigned bytes) . input k's 64 values at chunk j (mask: which bytes to load) */
#define DOT512(w, k, j, mask)                                                                                          \
    (precise ? _mm512_dpbusd_epi32(                                                                                    \
                   _mm512_slli_epi32(_mm512_dpbusd_epi32(zero, w, _mm512_maskz_loadu_epi8(mask, x[k].q + (int64_t)(j)*32)), 8), \
                   w, _mm512_maskz_loadu_epi8(mask, x[k].l + (int64_t)(j)*32))                                        \
             : _mm512_dpbusd_epi32(zero, w, _mm512_maskz_loadu_epi8(mask, x[k].q + (int64_t)(j)*32)))
#else
    __m256 acc[GG_TILE];
    for (int k = 0; k < count; k++) acc[k] = _mm256_setzero_ps(), voff[k] = _mm256_setzero_ps();
#define DOT256(w, k, j)                                                                                                \
    (precise ? dot_u8_15(w, _mm256_loadu_si256((const __m256i *)(x[k].q + (int64_t)(j)*32)),                           \
                         _mm256_loadu_si256((const __m256i *)(x[k].l + (int64_t)(j)*32)))                              \
             : dot_u8(w, _mm256_loadu_si256((const __m256i *)(x[k].q + (int64_t)(j)*32))))
#endif
    if (bvalues == 32) { /* Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: eight blocks' factors at a time */
        const int with_min = type == GG_Q4_1 || type == GG_Q5_1;
        for (int b0 = 0; b0 < blocks; b0 += 8) {
            const int group = blocks - b0 < 8 ? blocks - b0 : 8;
            const __m256i valid = _mm256_cmpgt_epi32(_mm256_set1_epi32(group), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            uint16_t dh[8] = {0}, mh[8] = {0};
            for (int i = 0; i < group; i++) {
                const uint8_t *p = row + (int64_t)(b0 + i) * bbytes;
                memcpy(&dh[i], p, 2);
                if (with_min) memcpy(&mh[i], p + 2, 2);
            }
            const __m256 vd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dh));
            __m256 vb = _mm256_setzero_ps();
            if (with_min)
                vb = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)mh));
            else if (type == GG_Q4_0 || type == GG_Q5_0)
                vb = _mm256_mul_ps(vd, _mm256_set1_ps(type == GG_Q4_0 ? -8.0f : -16.0f));
#if HEARTH_AVX512
            else /* Q8_0 runs as unsigned q + 128 */
                vb = _mm256_mul_ps(vd, _mm256_set1_ps(-128.0f));
#endif
            for (int k = 0; k < count; k++) {
                scaled[k] = _mm256_mul_ps(vd, _mm256_maskload_ps(x[k].d + b0, valid));
                voff[k] = _mm256_fmadd_ps(vb, _mm256_maskload_ps(x[k].s + b0, valid), voff[k]);
            }
#if HEARTH_AVX512
            for (int i = 0; i < group; i += 2) {
                const int pair = i + 1 < group;
                const uint8_t *p0 = row + (int64_t)(b0 + i) * bbytes, *p1 = p0 + bbytes;
                __m256i w0, w1 = _mm256_setzero_si256();
                if (type == GG_Q8_0) {
                    const __m256i flip = _mm256_set1_epi8((char)0x80);
                    w0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p0 + 2)), flip);
                    if (pair) w1 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p1 + 2)), flip);
                } else {
                    w0 = small_block_32(type, p0);
                    if (pair) w1 = small_block_32(type, p1);
                }
                const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(w0), w1, 1);
                const __mmask64 lanes = pair ? ~(__mmask64)0 : (__mmask64)0xffffffffu;
                const __m512i index = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(i)),
                                                         _mm256_set1_epi32(pair ? i + 1 : 0), 1);
                for (int k = 0; k < count; k++) {
                    __m512 scale = _mm512_permutexvar_ps(index, _mm512_castps256_ps512(scaled[k]));
                    if (!pair) scale = _mm512_mask_mov_ps(scale, 0xff00, _mm512_setzero_ps());
                    acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(DOT512(w, k, b0 + i, lanes)), scale, acc[k]);
                }
            }
#else
            for (int i = 0; i < group; i++) {
                const uint8_t *p = row + (int64_t)(b0 + i) * bbytes;
                const __m256i lane = _mm256_set1_epi32(i);
                const int64_t at = (int64_t)(b0 + i) * 32;
                if (type == GG_Q8_0) { /* signed weights: |w| times x with w's sign */
                    const __m256i w = _mm256_loadu_si256((const __m256i *)(p + 2)), abs_w = _mm256_sign_epi8(w, w);
                    for (int k = 0; k < count; k++) {
                        const __m256i h = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(x[k].q + at)), w);
                        const __m256i dot = precise ? dot_u8_15(abs_w, h, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(x[k].l + at)), w))
                                                    : dot_u8(abs_w, h);
                        acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_permutevar8x32_ps(scaled[k], lane), acc[k]);
                    }
                } else {
                    const __m256i w = small_block_32(type, p);
                    for (int k = 0; k < count; k++)
                        acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DOT256(w, k, b0 + i)),
                                                 _mm256_permutevar8x32_ps(scaled[k], lane), acc[k]);
                }
            }
#endif
        }
    } else { /* K-quants: one block of 256 = 8 chunks; its factors in one vector each */
        for (int sb = 0; sb < blocks; sb++) {
            const uint8_t *p = row + (int64_t)sb * bbytes;
            prefetch_record(p, 192);
            const int j0 = sb * 8;
            __m128i scales16 = _mm_setzero_si128(); /* Q6_K's 16 int8 scales */
            __m256i qh = _mm256_setzero_si256();
            if (type == GG_Q6_K) {
                const float d = gg_half(p + 208);
                scales16 = _mm_loadu_si128((const __m128i *)(p + 192));
                for (int k = 0; k < count; k++) {
                    scaled[k] = _mm256_mul_ps(_mm256_set1_ps(d), _mm256_loadu_ps(x[k].d + j0));
                    /* chunk j's offset: -32 (sc_2j n16_2j + sc_2j+1 n16_2j+1) times d dx_j */
                    voff[k] = _mm256_fmadd_ps(_mm256_mul_ps(q6_offsets(scales16, x[k].n16 + 2 * j0), _mm256_set1_ps(-32.0f)),
                                              scaled[k], voff[k]);
                }
            } else {
                uint32_t dd, u0, u1, u2; /* d and dmin; ggml's unpacking of the 12 bytes, in registers (no store) */
                memcpy(&dd, p, 4), memcpy(&u0, p + 4, 4), memcpy(&u1, p + 8, 4), memcpy(&u2, p + 12, 4);
                const __m128 both = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dd)); /* lane 0 d, lane 1 dmin: exact */
                const uint32_t scales_low = u0 & 0x3f3f3f3fu, mins_low = u1 & 0x3f3f3f3fu;
                const uint32_t scales_high = (u2 & 0x0f0f0f0fu) | (((u0 >> 6) & 0x03030303u) << 4);
                const uint32_t mins_high = ((u2 >> 4) & 0x0f0f0f0fu) | (((u1 >> 6) & 0x03030303u) << 4);
                const __m128i unpacked = _mm_set_epi32((int)mins_high, (int)mins_low, (int)scales_high, (int)scales_low);
                const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(unpacked));
                const __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(unpacked, 8)));
                const __m256 a = _mm256_mul_ps(sc, _mm256_broadcastss_ps(both));
                const __m256 bb = _mm256_sub_ps(_mm256_setzero_ps(),
                                                _mm256_mul_ps(mn, _mm256_broadcastss_ps(_mm_movehdup_ps(both))));
                for (int k = 0; k < count; k++) {
                    scaled[k] = _mm256_mul_ps(a, _mm256_loadu_ps(x[k].d + j0));
                    voff[k] = _mm256_fmadd_ps(bb, _mm256_loadu_ps(x[k].s + j0), voff[k]);
                }
                if (type == GG_Q5_K) qh = _mm256_loadu_si256((const __m256i *)(p + 16));
            }
            for (int c = 0; c < 4; c++) {
                __m256i w0, w1;
                if (type == GG_Q6_K)
                    q6_pair(p, c, &w0, &w1);
                else
                    k45_pair(type, p, c, qh, &w0, &w1);
#if HEARTH_AVX512
                const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(w0), w1, 1);
                const __m512i index = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(2 * c)),
                                                         _mm256_set1_epi32(2 * c + 1), 1);
                __m512i lane_scales = _mm512_setzero_si512();
                if (type == GG_Q6_K)
                    lane_scales = _mm512_cvtepi8_epi32(_mm_shuffle_epi8(
                        scales16, _mm_add_epi8(_mm_set1_epi8((char)(4 * c)),
                                               _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3))));
                for (int k = 0; k < count; k++) {
                    __m512i dot = DOT512(w, k, j0 + 2 * c, ~(__mmask64)0);
                    if (type == GG_Q6_K) dot = _mm512_mullo_epi32(dot, lane_scales);
                    acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot),
                                             _mm512_permutexvar_ps(index, _mm512_castps256_ps512(scaled[k])), acc[k]);
                }
#else
                const __m256i halves[2] = {w0, w1};
                for (int half = 0; half < 2; half++) {
                    const int chunk = 2 * c + half;
                    const __m256i w = halves[half], lane = _mm256_set1_epi32(chunk);
                    __m256i lane_scales = _mm256_setzero_si256();
                    if (type == GG_Q6_K)
                        lane_scales = _mm256_cvtepi8_epi32(_mm_shuffle_epi8(
                            scales16, _mm_add_epi8(_mm_set1_epi8((char)(2 * chunk)),
                                                   _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0))));
                    for (int k = 0; k < count; k++) {
                        __m256i dot = DOT256(w, k, j0 + chunk);
                        if (type == GG_Q6_K) dot = _mm256_mullo_epi32(dot, lane_scales);
                        acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_permutevar8x32_ps(scaled[k], lane),
                                                 acc[k]);
                    }
                }
#endif
            }
        }
    }
    for (int k = 0; k < count; k++) {
#if HEARTH_AVX512
        out[k] = _mm512_reduce_add_ps(acc[k]) + hsum256(voff[k]);
#else
        out[k] = hsum256(acc[k]) + hsum256(voff[k]);
#endif
    }
#undef DOT512
#undef DOT256
#else /* NEON and the scalar loops: each block unpacked to bytes once for every input of the tile */
    float off[GG_TILE] = {0};
#if HEARTH_NEON
    f32x8 acc[GG_TILE];
    for (int k = 0; k < count; k++) acc[k] = f32x8_zero();
#else
    float acc[GG_TILE] = {0};
#endif
    gg_block block;
    for (int b = 0; b < blocks; b++) {
        const int chunks = gg_unpack(type, row + (int64_t)b * bbytes, &block);
        const int j0 = b * bvalues / 32;
        for (int c = 0; c < chunks; c++) {
            const int j = j0 + c;
            for (int k = 0; k < count; k++) {
                const float dd = block.a[c] * x[k].d[j];
#if HEARTH_NEON
                const int8_t *w = (const int8_t *)block.q + 32 * c, *h = x[k].q + (int64_t)j * 32;
                int32x4_t lo = dot16(vld1q_s8(w), vld1q_s8(h)), hi = dot16(vld1q_s8(w + 16), vld1q_s8(h + 16));
                if (precise) {
                    const int8_t *l = x[k].l + (int64_t)j * 32;
                    lo = vaddq_s32(vshlq_n_s32(lo, 8), dot16(vld1q_s8(w), vld1q_s8(l)));
                    hi = vaddq_s32(vshlq_n_s32(hi, 8), dot16(vld1q_s8(w + 16), vld1q_s8(l + 16)));
                }
                if (type == GG_Q6_K) {
                    lo = vmulq_n_s32(lo, block.sc16[2 * c]);
                    hi = vmulq_n_s32(hi, block.sc16[2 * c + 1]);
                }
                const float32x4_t scale = vdupq_n_f32(dd);
                acc[k].lo = vfmaq_f32(acc[k].lo, vcvtq_f32_s32(lo), scale);
                acc[k].hi = vfmaq_f32(acc[k].hi, vcvtq_f32_s32(hi), scale);
#else
                int32_t dot = 0;
                for (int v = 0; v < 32; v++) {
                    const int w = type == GG_Q8_0 ? (int)(int8_t)block.q[32 * c + v] : (int)block.q[32 * c + v];
                    const int xv = precise ? 256 * x[k].q[j * 32 + v] + x[k].l[j * 32 + v] : x[k].q[j * 32 + v];
                    dot += (type == GG_Q6_K ? block.sc16[(32 * c + v) / 16] : 1) * w * xv;
                }
                acc[k] += (float)dot * dd;
#endif
                if (type == GG_Q6_K) {
                    const int32_t *n16 = x[k].n16 + 2 * j;
                    const int32_t t = block.sc16[2 * c] * n16[0] + block.sc16[2 * c + 1] * n16[1];
                    off[k] += ((float)t * -32.0f) * dd;
                } else if (type != GG_Q8_0) {
                    off[k] += block.b[c] * x[k].s[j];
                }
            }
        }
    }
    for (int k = 0; k < count; k++) {
#if HEARTH_NEON
        out[k] = hsum8(acc[k]) + off[k];
#else
        out[k] = acc[k] + off[k];
#endif
    }
#endif
}

/* Rows go in blocks of about this many weight bytes, and each tile of inputs meets every row of a block in turn: the
 * tile's activations (15-bit inputs take 2 bytes a value) stay in L1 and the block's rows in L2. Row by row, a
 * prefill's inputs (megabytes) would stream from L3 once per weight row. */
#define GG_BLOCK_BYTES (96 * 1024) /* 24 KiB to 384 KiB measured alike on Zen 4; one row a block was 1.3x slower */

/* y[k * ystride + r] (op)= row r . x[k] (+ bias[r]) for rows [r0, r1) and inputs [0, count); `accumulate` adds.
 * Inputs go GG_TILE at a time, then the 3, 2 or 1 left (a prompt-lookup check runs 2 to 9 rows, a batched step
 * one per reply: each weight block is unpacked once per tile): each input's arithmetic is the same whatever its
 * tile. */
static inline __attribute__((always_inline)) void gg_rows_of(int type, int precise, const uint8_t *w,
                                                             int64_t row_bytes, int cols, int r0, int r1,
                                                             const gvec *x, int count, float *y, int64_t ystride,
                                                             const float *bias, int accumulate) {
    float out[GG_TILE];
    int block_rows = (int)(GG_BLOCK_BYTES / row_bytes);
    if (block_rows < 1) block_rows = 1;
    for (int rb = r0; rb < r1; rb += block_rows) {
        const int re = r1 - rb < block_rows ? r1 : rb + block_rows;
        for (int k0 = 0; k0 < count;) {
            const int tile = count - k0 >= GG_TILE ? GG_TILE : count - k0;
            for (int r = rb; r < re; r++) {
                const uint8_t *row = w + (int64_t)r * row_bytes;
                if (tile == GG_TILE)
                    gg_row_dot(type, row, cols, x + k0, GG_TILE, precise, out);
                else if (tile == 3)
                    gg_row_dot(type, row, cols, x + k0, 3, precise, out);
                else if (tile == 2)
                    gg_row_dot(type, row, cols, x + k0, 2, precise, out);
                else
                    gg_row_dot(type, row, cols, x + k0, 1, precise, out);
                for (int k = 0; k < tile; k++) {
                    float *target = y + (int64_t)(k0 + k) * ystride + r;
                    const float v = out[k] + (bias ? bias[r] : 0.0f);
                    *target = accumulate ? *target + v : v;
                }
            }
            k0 += tile;
        }
    }
}

/* ---- Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K rows 16 at a time (AVX-512, AVX2 and DotProd builds) ----
 * A matrix whose rows are a multiple of 16 is repacked at load from the file's blocks (the same bits: values, scales
 * and d are copied, nothing is rounded) so that a group of 16 rows keeps, per 256-value block, its rows' scales side
 * by side and its quantized values 4 bytes per row in turn: one 64-byte vector holds 4 consecutive values of each of
 * the 16 rows, one vpdpbusd against 4 broadcast input bytes is a step of 16 rows' dot products (lane = row), and a
 * chunk's scale multiplies 16 rows' integer sums at once. Row by row, each 64 values cost an input load, a lane
 * permute, a conversion and a multiply-add per row; here they are shared by 16 rows.
 *   Q4_K x16, per group and block (2,368 bytes = 16 x 148): d[16], dmin[16] (fp16), sc[8][16], m[8][16] (the 6-bit
 *     scales and mins as bytes), then for chunk pair c (0..3) and step i (0..7) 64 bytes: lane r = row r's qs bytes
 *     32c + 4i .. 32c + 4i + 3 (low nibbles: chunk 2c, high: chunk 2c + 1).
 *   Q4_0 / Q4_1 / Q5_0 / Q5_1 x16, per group and 32-value block (16 x 18 / 20 / 22 / 24 bytes): d[16] (and m[16]),
 *     fp16, (Q5: each row's 4 qh bytes, 64 bytes), then for step i (0..3) 64 bytes: lane r = row r's qs bytes
 *     4i .. 4i + 3 (low nibbles: values 4i.., high: 16 + 4i..).
 *   Q8_0 x16, per group and 32-value block (544 bytes = 16 x 34): d[16] (fp16), then for step i (0..7) 64 bytes:
 *     lane r = row r's values 4i .. 4i + 3.
 *   Q5_K x16 (2,880 bytes = 16 x 180): Q4_K's, then for step i 64 bytes: lane r = row r's qh bytes 4i .. 4i + 3 (bit j:
 *     the fifth bit of chunk j's value).
 *   Q6_K x16 (3,360 bytes = 16 x 210): d[16] (fp16), sc[16][16] (int8), then for half h (0, 1) and step i (0..7)
 *     three 64-byte vectors: lane r = row r's ql bytes 64h + 4i.., ql 64h + 32 + 4i.. and qh 32h + 4i...
 * Per row the sums run chunk after chunk (a chunk's exact integer dot, converted, times its scale), so a row's
 * result still depends only on the row and its input. */
#define GG_X16 100 /* a type code plus this: its 16-row layout */
#define GG_Q4_K_X16 (GG_X16 + GG_Q4_K)
#define GG_Q4_0_X16 (GG_X16 + GG_Q4_0)
#define GG_Q4_1_X16 (GG_X16 + GG_Q4_1)
#define GG_Q5_0_X16 (GG_X16 + GG_Q5_0)
#define GG_Q5_1_X16 (GG_X16 + GG_Q5_1)
#define GG_Q8_0_X16 (GG_X16 + GG_Q8_0)
#define GG_Q5_K_X16 (GG_X16 + GG_Q5_K)
#define GG_Q6_K_X16 (GG_X16 + GG_Q6_K)
#define X16_ROWS 16

static inline int gg_is_x16(int type) {
    return type == GG_Q4_0_X16 || type == GG_Q4_1_X16 || type == GG_Q5_0_X16 || type == GG_Q5_1_X16 ||
           type == GG_Q8_0_X16 || type == GG_Q4_K_X16 || type == GG_Q5_K_X16 || type == GG_Q6_K_X16;
}

/* 32-value blocks of nibbles (and a fifth bit): Q4_0, Q4_1, Q5_0, Q5_1 */
static inline int x16_small(int type) {
    return type == GG_Q4_0_X16 || type == GG_Q4_1_X16 || type == GG_Q5_0_X16 || type == GG_Q5_1_X16;
}
static inline int x16_wide_tile(int type) { /* takes X16_TILE inputs at a time (the 4- and 5-bit blocks measured no faster) */
    return type == GG_Q4_K_X16 || type == GG_Q5_K_X16 || type == GG_Q6_K_X16 || type == GG_Q8_0_X16;
}
static inline int x16_with_min(int type) { return type == GG_Q4_1_X16 || type == GG_Q5_1_X16; }
static inline int x16_five(int type) { return type == GG_Q5_0_X16 || type == GG_Q5_1_X16; }
static inline int x16_qs(int type) { return 32 * (1 + x16_with_min(type)) + 64 * x16_five(type); } /* its offset */
static inline int x16_values(int type) { return type == GG_Q8_0_X16 || x16_small(type) ? 32 : QK; } /* per block */

/* A long prompt's K-quant values unpacked once (x16_unpack_group) for every tile of its inputs, where x16_unpacks
 * says so: unpacking 4-6 bits into bytes takes 2-5 vector operations per 64 values, which a tile of 8 inputs (AVX2:
 * 4) then spends only 8 (15-bit: 16) vpdpbusd on, and a prompt meets each weight block once per tile. The same bytes
 * in the same order, and so the same bits. Measured one library against the other (1B files' matrices, 256 inputs, Zen 4, 2026-12-07): AVX-512
 * Q5_K 8-bit 1.10-1.25x, 15-bit 1.09-1.11x; Q6_K 15-bit 1.04-1.10x, but 8-bit 0.98-1.00x and Q4_K 1.00-1.05x
 * (nibbles take one or two operations): those two stay as they were. AVX2 (4 inputs a tile): Q5_K 1.17-1.56x, Q6_K
 * 1.18-1.52x, Q4_K 1.06-1.16x. */
#define X16_UNPACK_INPUTS (4 * X16_TILE) /* four tiles and more (two measured 0.84-1.08x) */
#define X16_UNPACKED_BLOCK 4096 /* a 256-value block's 16 rows as bytes: its 64 steps' vectors in the loops' order */
static inline int x16_unpacks(int type, int precise) {
#if HEARTH_AVX512
    return type == GG_Q5_K_X16 || (type == GG_Q6_K_X16 && precise);
#elif HEARTH_AVXVNNI /* an earlier try measured Q6_K slower there (80 against 92 GMAC/s); this CPU can't run it */
    return (void)type, (void)precise, 0;
#else
    return (void)precise, type == GG_Q4_K_X16 || type == GG_Q5_K_X16 || type == GG_Q6_K_X16;
#endif
}

/* OF(t, p) with a 16-row layout's type and `precise` as constants (any type not listed runs as Q6_K's): the drivers'
 * code is compiled once per pair. */
#define X16_EACH(OF)                                                                                                   \
    switch (type) {                                                                                                    \
    case GG_Q4_0_X16: X16_BOTH(OF, GG_Q4_0_X16); break;                                                                \
    case GG_Q4_1_X16: X16_BOTH(OF, GG_Q4_1_X16); break;                                                                \
    case GG_Q5_0_X16: X16_BOTH(OF, GG_Q5_0_X16); break;                                                                \
    case GG_Q5_1_X16: X16_BOTH(OF, GG_Q5_1_X16); break;                                                                \
    case GG_Q8_0_X16: X16_BOTH(OF, GG_Q8_0_X16); break;                                                                \
    case GG_Q4_K_X16: X16_BOTH(OF, GG_Q4_K_X16); break;                                                                \
    case GG_Q5_K_X16: X16_BOTH(OF, GG_Q5_K_X16); break;                                                                \
    default: X16_BOTH(OF, GG_Q6_K_X16); break;                                                                         \
    }
#define X16_BOTH(OF, t)                                                                                                \
    if (precise)                                                                                                       \
        OF(t, 1);                                                                                                      \
    else                                                                                                               \
        OF(t, 0)

/* Bytes per row of a 16-row layout (a group is 16 of them): the file type's block bytes, but for Q4_K's and Q5_K's 12
 * bytes of packed scales and mins, kept as 16. -1 for a row that is not whole blocks. */
static int64_t x16_row_bytes(int type, int64_t cols) {
    int64_t geometry[2];
    if (!gg_is_x16(type) || hearth_gg_geometry(type - GG_X16, geometry) != 0 || cols % geometry[0]) return -1;
    return cols / geometry[0] * (geometry[1] + (type == GG_Q4_K_X16 || type == GG_Q5_K_X16 ? 4 : 0));
}

/* Row r's block b of a 16-row layout as a gg_block (gg_unpack's values for the file's block). */
static int x16_unpack(int type, const uint8_t *w, int64_t cols, int64_t r, int64_t b, gg_block *out) {
    const int64_t group_bytes = X16_ROWS * x16_row_bytes(type, cols), blocks = cols / x16_values(type);
    const int lane = (int)(r % X16_ROWS);
    const uint8_t *blk = w + (r / X16_ROWS) * group_bytes + b * (group_bytes / blocks);
    if (x16_small(type)) {
        const uint8_t *qs = blk + x16_qs(type);
        uint32_t qh = 0;
        if (x16_five(type)) memcpy(&qh, blk + 32 * (1 + x16_with_min(type)) + 4 * lane, 4);
        for (int i = 0; i < 4; i++)
            for (int t = 0; t < 4; t++) {
                const uint8_t byte = qs[64 * i + 4 * lane + t];
                out->q[4 * i + t] = (uint8_t)((byte & 15) | (((qh >> (4 * i + t)) & 1) << 4));
                out->q[16 + 4 * i + t] = (uint8_t)((byte >> 4) | (((qh >> (16 + 4 * i + t)) & 1) << 4));
            }
        out->a[0] = gg_half(blk + 2 * lane);
        out->b[0] = x16_with_min(type) ? gg_half(blk + 32 + 2 * lane) : (x16_five(type) ? -16.0f : -8.0f) * out->a[0];
        return 1;
    }
    if (type == GG_Q8_0_X16) {
        for (int i = 0; i < 8; i++) memcpy(out->q + 4 * i, blk + 32 + 64 * i + 4 * lane, 4);
        out->a[0] = gg_half(blk + 2 * lane), out->b[0] = 0.0f;
        return 1;
    }
    if (type != GG_Q6_K_X16) {
        const float d = gg_half(blk + 2 * lane), dmin = gg_half(blk + 32 + 2 * lane);
        for (int c = 0; c < 4; c++)
            for (int i = 0; i < 8; i++)
                for (int t = 0; t < 4; t++) {
                    const uint8_t byte = blk[320 + 64 * (8 * c + i) + 4 * lane + t];
                    out->q[64 * c + 4 * i + t] = byte & 15, out->q[64 * c + 32 + 4 * i + t] = byte >> 4;
                }
        if (type == GG_Q5_K_X16)
            for (int j = 0; j < 8; j++)
                for (int l = 0; l < 32; l++)
                    out->q[32 * j + l] |= (uint8_t)(((blk[2368 + 64 * (l / 4) + 4 * lane + l % 4] >> j) & 1) << 4);
        for (int j = 0; j < 8; j++)
            out->a[j] = d * (float)blk[64 + 16 * j + lane], out->b[j] = -(dmin * (float)blk[192 + 16 * j + lane]);
        return 8;
    }
    const float d = gg_half(blk + 2 * lane);
    for (int s = 0; s < 16; s++) out->sc16[s] = (int8_t)blk[32 + 16 * s + lane];
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 8; i++) {
            const uint8_t *v = blk + 288 + 192 * (8 * h + i) + 4 * lane;
            for (int t = 0; t < 4; t++) {
                const uint8_t l1 = v[t], l2 = v[64 + t], qh = v[128 + t];
                out->q[128 * h + 4 * i + t] = (uint8_t)((l1 & 15) | ((qh & 3) << 4));
                out->q[128 * h + 32 + 4 * i + t] = (uint8_t)((l2 & 15) | (((qh >> 2) & 3) << 4));
                out->q[128 * h + 64 + 4 * i + t] = (uint8_t)((l1 >> 4) | (((qh >> 4) & 3) << 4));
                out->q[128 * h + 96 + 4 * i + t] = (uint8_t)((l2 >> 4) | (((qh >> 6) & 3) << 4));
            }
        }
    for (int j = 0; j < 8; j++) out->a[j] = d, out->b[j] = 0.0f;
    return 8;
}

/* Bytes of `type`'s 16-row layout for a rows x cols matrix; -1 where this build does not compute on it (not an
 * AVX2, AVX-512 or Armv8.2 DotProd build, a type without one, rows not a multiple of 16). */
HEARTH_API int64_t hearth_gg_x16_bytes(int type, int64_t rows, int64_t cols) {
    if (!(HEARTH_AVX2 || HEARTH_DOTPROD) || !gg_is_x16(GG_X16 + type) || rows < 1 ||
        rows % X16_ROWS || x16_row_bytes(GG_X16 + type, cols) < 0)
        return -1;
    return rows * x16_row_bytes(GG_X16 + type, cols);
}

/* The file's rows x cols matrix of `type` (src, rows contiguous) into its 16-row layout at dst
 * (hearth_gg_x16_bytes of it). Returns the layout's type code; -1 where there is none. */
HEARTH_API int hearth_gg_repack_x16(int type, const void *src, int64_t rows, int64_t cols, void *dst, int threads) {
    if (hearth_gg_x16_bytes(type, rows, cols) < 0) return -1;
    int64_t geometry[2];
    hearth_gg_geometry(type, geometry);
    const int x16 = GG_X16 + type, blocks = (int)(cols / geometry[0]), in_bytes = (int)geometry[1];
    const int64_t out_block = X16_ROWS * x16_row_bytes(x16, cols) / blocks;
    if (threads < 1) threads = 1;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t g = 0; g < rows / X16_ROWS; g++)
        for (int b = 0; b < blocks; b++) {
            uint8_t *blk = (uint8_t *)dst + (g * blocks + b) * out_block;
            for (int r = 0; r < X16_ROWS; r++) {
                const uint8_t *p = (const uint8_t *)src + ((g * X16_ROWS + r) * blocks + b) * in_bytes;
                if (x16_small(x16)) { /* d (m) (qh) qs in the file's block */
                    const int with_min = x16_with_min(x16), five = x16_five(x16), qs = 2 + 2 * with_min + 4 * five;
                    memcpy(blk + 2 * r, p, 2);
                    if (with_min) memcpy(blk + 32 + 2 * r, p + 2, 2);
                    if (five) memcpy(blk + 32 * (1 + with_min) + 4 * r, p + 2 + 2 * with_min, 4);
                    for (int i = 0; i < 4; i++) memcpy(blk + x16_qs(x16) + 64 * i + 4 * r, p + qs + 4 * i, 4);
                } else if (type == GG_Q8_0) {
                    memcpy(blk + 2 * r, p, 2);
                    for (int i = 0; i < 8; i++) memcpy(blk + 32 + 64 * i + 4 * r, p + 2 + 4 * i, 4);
                } else if (type != GG_Q6_K) {
                    const int qs = type == GG_Q4_K ? 16 : 48;
                    memcpy(blk + 2 * r, p, 2), memcpy(blk + 32 + 2 * r, p + 2, 2);
                    for (int j = 0; j < 8; j++) {
                        int sc, m;
                        k4_scale_min(j, p + 4, &sc, &m);
                        blk[64 + 16 * j + r] = (uint8_t)sc, blk[192 + 16 * j + r] = (uint8_t)m;
                    }
                    for (int c = 0; c < 4; c++)
                        for (int i = 0; i < 8; i++) memcpy(blk + 320 + 64 * (8 * c + i) + 4 * r, p + qs + 32 * c + 4 * i, 4);
                    if (type == GG_Q5_K)
                        for (int i = 0; i < 8; i++) memcpy(blk + 2368 + 64 * i + 4 * r, p + 16 + 4 * i, 4);
                } else {
                    memcpy(blk + 2 * r, p + 208, 2);
                    for (int s = 0; s < 16; s++) blk[32 + 16 * s + r] = p[192 + s];
                    for (int h = 0; h < 2; h++)
                        for (int i = 0; i < 8; i++) {
                            uint8_t *v = blk + 288 + 192 * (8 * h + i) + 4 * r;
                            memcpy(v, p + 64 * h + 4 * i, 4);
                            memcpy(v + 64, p + 64 * h + 32 + 4 * i, 4);
                            memcpy(v + 128, p + 128 + 32 * h + 4 * i, 4);
                        }
                }
            }
        }
    return x16;
}

/* Row r of a 16-row layout as fp32, the same values hearth_gg_dequant gives for the file's row. */
static void x16_dequant_row(int type, const uint8_t *w, int64_t cols, int64_t r, float *out) {
    gg_block block;
    const int values = x16_values(type);
    for (int64_t b = 0; b < cols / values; b++)
        gg_block_floats(type - GG_X16, x16_unpack(type, w, cols, r, b, &block), &block, out + b * values);
}

/* One token's results for a group's 16 rows into its output row: plus the bias (the group's 16, or NULL), and added to
 * what is there when accumulating. */
static inline void x16_store(const float *out, float *target, const float *bias, int accumulate) {
    for (int r = 0; r < X16_ROWS; r++) {
        const float v = bias ? out[r] + bias[r] : out[r];
        target[r] = accumulate ? target[r] + v : v;
    }
}

/* Input k's step i (4 values) of chunk j (f: q or l), its d or s of chunk j (f), its n16 of half chunk h, for the
 * 16-row kernels' inputs x[0..count): from their tile when `tiled` (slots x[0].slot + k of x[0]'s tile), else from
 * each input's own buffers. The same numbers either way. */
#define XQL(f, k, j, i)                                                                                                \
    (tiled ? x[0].tile.f + (((int64_t)(j) * 8 + (i)) * TILE_SLOTS + x[0].slot + (k)) * 4 : x[k].f + 32 * (int64_t)(j) + 4 * (i))
#define XDS(f, k, j) (tiled ? x[0].tile.f[(int64_t)(j) * TILE_SLOTS + x[0].slot + (k)] : x[k].f[j])
#define XN16(k, h) (tiled ? x[0].tile.n16[(int64_t)(h) * TILE_SLOTS + x[0].slot + (k)] : x[k].n16[h])

#if HEARTH_AVX512
/* acc + the dot products of w's bytes with the 4 bytes at p in every lane: vpdpbusd with p's broadcast folded in
 * (its {1to16} form) and acc updated in place; as intrinsics gcc loads the broadcast apart and copies acc around
 * each product. */
static inline __attribute__((always_inline)) __m512i dpbusd_bcast(__m512i acc, __m512i w, const int8_t *p) {
    typedef struct { int8_t b[4]; } four_bytes; /* char-typed: aliases the inputs' bytes */
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const four_bytes *)p));
    return acc;
}

static inline __m512 scales16(const uint8_t *p, int is_signed) { /* 16 bytes as 16 float lanes */
    const __m128i raw = _mm_loadu_si128((const __m128i *)p);
    return _mm512_cvtepi32_ps(is_signed ? _mm512_cvtepi8_epi32(raw) : _mm512_cvtepu8_epi32(raw));
}

/* A 16-row layout's values, 16 rows to a 64-byte vector (4 consecutive values of each row), as x16_group computes
 * on them and amx_unpack_block stores them. Step i (of 4) of a Q4_0/Q4_1/Q5_0/Q5_1 block: values 4i.. (lo) and
 * 16 + 4i.. (hi), Q5's fifth bit from qh (the rows' 32-bit masks side by side). */
static inline __attribute__((always_inline)) void x16_small_step(int type, const uint8_t *qs, __m512i qh, int i,
                                                                 __m512i *lo, __m512i *hi) {
    const __m512i low4 = _mm512_set1_epi8(15), raw = _mm512_loadu_si512((const void *)(qs + 64 * i));
    *lo = _mm512_and_si512(raw, low4), *hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
    if (x16_five(type)) { /* byte t of a lane: bit 4i + t (16 + 4i + t) of the row's qh, as 16 */
        const __m512i lanes = _mm512_set4_epi32(0x0c0c0c0c, 0x08080808, 0x04040404, 0);
        const __m512i bits = _mm512_set1_epi32((int)(0x08040201u << (4 * (i & 1))));
        const __m512i sixteen = _mm512_set1_epi8(16);
        *lo = _mm512_mask_add_epi8(*lo, _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, _mm512_add_epi8(lanes, _mm512_set1_epi8((char)(i / 2)))), bits), *lo, sixteen);
        *hi = _mm512_mask_add_epi8(*hi, _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, _mm512_add_epi8(lanes, _mm512_set1_epi8((char)(2 + i / 2)))), bits), *hi, sixteen);
    }
}

/* Step i (of 8) of sub-block j8 of a Q4_K/Q5_K block: its low (j8 even) or high nibbles, Q5_K's fifth bit moved from
 * bit j8 of its qh bytes to bit 4. */
static inline __attribute__((always_inline)) __m512i x16_k_values(int type, const uint8_t *blk, int j8, int i) {
    const int c = j8 / 2;
    const __m512i low4 = _mm512_set1_epi8(15), raw = _mm512_loadu_si512((const void *)(blk + 320 + 64 * (8 * c + i)));
    __m512i w = _mm512_and_si512(j8 % 2 ? _mm512_srli_epi16(raw, 4) : raw, low4);
    if (type == GG_Q5_K_X16) {
        const __m512i qh = _mm512_loadu_si512((const void *)(blk + 2368 + 64 * i));
        w = _mm512_or_si512(w, _mm512_and_si512(j8 <= 4 ? _mm512_slli_epi16(qh, 4 - j8) : _mm512_srli_epi16(qh, j8 - 4),
                                                _mm512_set1_epi8(16)));
    }
    return w;
}

/* Step i of chunk pair c: sub-block 2c's values (wa) and 2c + 1's (wb), from the same loads. */
static inline __attribute__((always_inline)) void x16_k_step(int type, const uint8_t *blk, int c, int i, __m512i *wa,
                                                             __m512i *wb) {
    *wa = x16_k_values(type, blk, 2 * c, i), *wb = x16_k_values(type, blk, 2 * c + 1, i);
}

/* Chunk t (of 4) of a Q6_K step from its two vectors of low bits and one of high bits. */
static inline __attribute__((always_inline)) __m512i x16_q6_values(__m512i ql0, __m512i ql1, __m512i qh, int t) {
    const __m512i ql = t & 1 ? ql1 : ql0;
    const __m512i low = _mm512_and_si512(t >= 2 ? _mm512_srli_epi16(ql, 4) : ql, _mm512_set1_epi8(15));
    const __m512i high = _mm512_and_si512(t == 0 ? _mm512_slli_epi16(qh, 4)
                                          : t == 1 ? _mm512_slli_epi16(qh, 2)
                                          : t == 2 ? qh
                                                   : _mm512_srli_epi16(qh, 2),
                                          _mm512_set1_epi8(0x30));
    return _mm512_or_si512(low, high);
}

/* Step vector `index` of an unpacked block: Q4_K/Q5_K 8 * j8 + i (sub-block j8, step i), Q6_K 4 * (8 * h + i) + t. */
static inline __m512i x16_unpacked(const uint8_t *vals, int b, int index) {
    return _mm512_load_si512((const void *)(vals + (int64_t)b * X16_UNPACKED_BLOCK + 64 * index));
}
static inline __attribute__((always_inline)) void x16_unpack_group(int type, const uint8_t *grp, int blocks,
                                                                   int64_t block_bytes, uint8_t *vals) {
    for (int b = 0; b < blocks; b++) {
        const uint8_t *blk = grp + (int64_t)b * block_bytes;
        uint8_t *out = vals + (int64_t)b * X16_UNPACKED_BLOCK;
        if (type == GG_Q6_K_X16)
            for (int step = 0; step < 16; step++) {
                const uint8_t *v = blk + 288 + 192 * step;
                const __m512i ql0 = _mm512_loadu_si512((const void *)v), ql1 = _mm512_loadu_si512((const void *)(v + 64));
                const __m512i qh = _mm512_loadu_si512((const void *)(v + 128));
                for (int t = 0; t < 4; t++) _mm512_store_si512((void *)(out + 64 * (4 * step + t)), x16_q6_values(ql0, ql1, qh, t));
            }
        else
            for (int j8 = 0; j8 < 8; j8++)
                for (int i = 0; i < 8; i++) _mm512_store_si512((void *)(out + 64 * (8 * j8 + i)), x16_k_values(type, blk, j8, i));
    }
}

/* The 16 rows of one group of a 16-row layout (`blocks` blocks of its type) against `count` inputs:
 * result[k] lane r = row r . input k; a K-quant's values from `vals` where x16_unpack_group unpacked them (else NULL).
 * Always inlined with constant type, count and precise. */
static inline __attribute__((always_inline)) void x16_group(int type, const uint8_t *grp, int blocks, int64_t block_bytes,
                                                            const gvec *x, int count, int precise, int tiled, int prefetch,
                                                            const uint8_t *vals, __m512 *result) {
    __m512 acc[X16_TILE], off[X16_TILE];
    for (int k = 0; k < count; k++) acc[k] = off[k] = _mm512_setzero_ps();
    for (int b = 0; b < blocks; b++) {
        const uint8_t *blk = grp + (int64_t)b * block_bytes;
        /* the whole block, PREFETCH_BYTES ahead (K-quants: step by step, x16_prefetch_step) */
        if ((x16_small(type) || type == GG_Q8_0_X16) && prefetch) prefetch_record(blk, block_bytes);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
        if (x16_small(type)) { /* low nibbles: values 4i.., high: 16 + 4i..; Q4_0's -8 (Q5_0's -16) off the sum (exact) */
            const uint8_t *qs = blk + x16_qs(type);
            const __m512i qh = x16_five(type) ? _mm512_loadu_si512((const void *)(blk + 32 * (1 + x16_with_min(type))))
                                              : _mm512_setzero_si512();
            __m512i ia[X16_TILE], la[X16_TILE];
            for (int k = 0; k < count; k++) ia[k] = la[k] = _mm512_setzero_si512();
            for (int i = 0; i < 4; i++) {
                __m512i lo, hi;
                x16_small_step(type, qs, qh, i, &lo, &hi);
                for (int k = 0; k < count; k++) {
                    ia[k] = dpbusd_bcast(ia[k], lo, XQL(q, k, b, i));
                    ia[k] = dpbusd_bcast(ia[k], hi, XQL(q, k, b, 4 + i));
                    if (precise) {
                        la[k] = dpbusd_bcast(la[k], lo, XQL(l, k, b, i));
                        la[k] = dpbusd_bcast(la[k], hi, XQL(l, k, b, 4 + i));
                    }
                }
            }
            const __m512 m = x16_with_min(type) ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32))) : d;
            const int zero_point = x16_with_min(type) ? 0 : x16_five(type) ? 16 : 8;
            for (int k = 0; k < count; k++) {
                __m512i dot = precise ? _mm512_add_epi32(_mm512_slli_epi32(ia[k], 8), la[k]) : ia[k];
                if (zero_point) dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(zero_point * (XN16(k, 2 * b) + XN16(k, 2 * b + 1))));
                acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, _mm512_set1_ps(XDS(d, k, b))), acc[k]);
                if (x16_with_min(type)) off[k] = _mm512_fmadd_ps(m, _mm512_set1_ps(XDS(s, k, b)), off[k]);
            }
        } else if (type == GG_Q8_0_X16) { /* signed bytes as q + 128, and 128 times the input's sum taken off (exact) */
            __m512i ia[X16_TILE], la[X16_TILE];
            for (int k = 0; k < count; k++) ia[k] = la[k] = _mm512_setzero_si512();
            for (int i = 0; i < 8; i++) {
                const __m512i w = _mm512_xor_si512(_mm512_loadu_si512((const void *)(blk + 32 + 64 * i)), _mm512_set1_epi8((char)0x80));
                for (int k = 0; k < count; k++) {
                    ia[k] = dpbusd_bcast(ia[k], w, XQL(q, k, b, i));
                    if (precise) la[k] = dpbusd_bcast(la[k], w, XQL(l, k, b, i));
                }
            }
            for (int k = 0; k < count; k++) {
                __m512i dot = precise ? _mm512_add_epi32(_mm512_slli_epi32(ia[k], 8), la[k]) : ia[k];
                dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(128 * (XN16(k, 2 * b) + XN16(k, 2 * b + 1))));
                acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, _mm512_set1_ps(XDS(d, k, b))), acc[k]);
            }
        } else if (type != GG_Q6_K_X16 && count > GG_TILE) {
            /* A wide tile: one sub-block at a time, and the mins' terms in a pass of their own after the blocks, so
             * that the sums fit the registers; each input's float steps come in the same order as below (sub-block
             * 2c, then 2c + 1), and so the same bits. */
            for (int j8 = 0; j8 < 8; j8++) {
                const int j = b * 8 + j8;
                __m512i ia[X16_TILE], la[X16_TILE];
                for (int k = 0; k < count; k++) ia[k] = la[k] = _mm512_setzero_si512();
                for (int i = 0; i < 8; i++) {
                    if (prefetch && j8 % 2 == 0) x16_prefetch_step(blk, block_bytes, 4 * j8 + i, 32);
                    const __m512i w = vals ? x16_unpacked(vals, b, 8 * j8 + i) : x16_k_values(type, blk, j8, i);
                    for (int k = 0; k < count; k++) {
                        ia[k] = dpbusd_bcast(ia[k], w, XQL(q, k, j, i));
                        if (precise) la[k] = dpbusd_bcast(la[k], w, XQL(l, k, j, i));
                    }
                }
                const __m512 a = _mm512_mul_ps(d, scales16(blk + 64 + 16 * j8, 0));
                for (int k = 0; k < count; k++) {
                    if (precise) ia[k] = _mm512_add_epi32(_mm512_slli_epi32(ia[k], 8), la[k]);
                    acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[k]), _mm512_mul_ps(a, _mm512_set1_ps(XDS(d, k, j))), acc[k]);
                }
            }
        } else if (type != GG_Q6_K_X16) {
            const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32)));
            for (int c = 0; c < 4; c++) {
                const int ja = b * 8 + 2 * c, jb = ja + 1;
                __m512i ia[GG_TILE], ib[GG_TILE], la[GG_TILE], lb[GG_TILE];
                for (int k = 0; k < count; k++) ia[k] = ib[k] = la[k] = lb[k] = _mm512_setzero_si512();
                for (int i = 0; i < 8; i++) {
                    if (prefetch) x16_prefetch_step(blk, block_bytes, 8 * c + i, 32);
                    __m512i wa, wb;
                    x16_k_step(type, blk, c, i, &wa, &wb);
                    for (int k = 0; k < count; k++) {
                        ia[k] = dpbusd_bcast(ia[k], wa, XQL(q, k, ja, i));
                        ib[k] = dpbusd_bcast(ib[k], wb, XQL(q, k, jb, i));
                        if (precise) {
                            la[k] = dpbusd_bcast(la[k], wa, XQL(l, k, ja, i));
                            lb[k] = dpbusd_bcast(lb[k], wb, XQL(l, k, jb, i));
                        }
                    }
                }
                const __m512 a0 = _mm512_mul_ps(d, scales16(blk + 64 + 16 * (2 * c), 0));
                const __m512 a1 = _mm512_mul_ps(d, scales16(blk + 64 + 16 * (2 * c + 1), 0));
                const __m512 m0 = _mm512_mul_ps(dmin, scales16(blk + 192 + 16 * (2 * c), 0));
                const __m512 m1 = _mm512_mul_ps(dmin, scales16(blk + 192 + 16 * (2 * c + 1), 0));
                for (int k = 0; k < count; k++) {
                    if (precise) {
                        ia[k] = _mm512_add_epi32(_mm512_slli_epi32(ia[k], 8), la[k]);
                        ib[k] = _mm512_add_epi32(_mm512_slli_epi32(ib[k], 8), lb[k]);
                    }
                    acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[k]), _mm512_mul_ps(a0, _mm512_set1_ps(XDS(d, k, ja))), acc[k]);
                    acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ib[k]), _mm512_mul_ps(a1, _mm512_set1_ps(XDS(d, k, jb))), acc[k]);
                    off[k] = _mm512_fnmadd_ps(m0, _mm512_set1_ps(XDS(s, k, ja)), off[k]);
                    off[k] = _mm512_fnmadd_ps(m1, _mm512_set1_ps(XDS(s, k, jb)), off[k]);
                }
            }
        } else { /* Q6_K: a scale per 16 values; the -32 offset folded into the integer sum (exact). A step's four
                  * chunks come from the same three vectors: one input takes all four at once (decode), a tile of
                  * several one chunk at a time (registers; all four at once measured no faster for 8-bit tiles);
                  * the chunks' sums are added in the same order either way. */
            const uint8_t *qv = blk + 288;
            const int together = count == 1 ? 4 : 1;
            for (int h = 0; h < 2; h++)
                for (int s = 0; s < 2; s++)
                    _Pragma("GCC unroll 4") for (int t0 = 0; t0 < 4; t0 += together) {
                        __m512i ia[X16_TILE][4], la[X16_TILE][4];
                        for (int k = 0; k < count; k++) /* the -32 offset's sum first (the same integer sum) */
                            for (int tt = 0; tt < together; tt++) {
                                const __m512i offset = _mm512_set1_epi32(-32 * XN16(k, 2 * (b * 8 + 4 * h + t0 + tt) + s));
                                ia[k][tt] = precise ? _mm512_setzero_si512() : offset;
                                la[k][tt] = precise ? offset : _mm512_setzero_si512();
                            }
                        _Pragma("GCC unroll 4") for (int i = 4 * s; i < 4 * s + 4; i++) {
                            const uint8_t *v = qv + 192 * (8 * h + i);
                            if (t0 == 0 && prefetch) /* once per step */
                                x16_prefetch_step(blk, block_bytes, 8 * h + i, 16);
                            const __m512i ql0 = _mm512_loadu_si512((const void *)v);
                            const __m512i ql1 = _mm512_loadu_si512((const void *)(v + 64));
                            const __m512i qh = _mm512_loadu_si512((const void *)(v + 128));
                            for (int tt = 0; tt < together; tt++) {
                                const int t = t0 + tt, j = b * 8 + 4 * h + t;
                                const __m512i w = vals ? x16_unpacked(vals, b, 4 * (8 * h + i) + t) : x16_q6_values(ql0, ql1, qh, t);
                                for (int k = 0; k < count; k++) {
                                    ia[k][tt] = dpbusd_bcast(ia[k][tt], w, XQL(q, k, j, i));
                                    if (precise)
                                        la[k][tt] = dpbusd_bcast(la[k][tt], w, XQL(l, k, j, i));
                                }
                            }
                        }
                        for (int tt = 0; tt < together; tt++) {
                            const int t = t0 + tt, j = b * 8 + 4 * h + t;
                            const __m512 a = _mm512_mul_ps(d, scales16(blk + 32 + 16 * (8 * h + 2 * t + s), 1));
                            for (int k = 0; k < count; k++) {
                                const __m512i dot = precise ? _mm512_add_epi32(_mm512_slli_epi32(ia[k][tt], 8), la[k][tt]) : ia[k][tt];
                                acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(a, _mm512_set1_ps(XDS(d, k, j))), acc[k]);
                            }
                        }
                    }
        }
    }
    if ((type == GG_Q4_K_X16 || type == GG_Q5_K_X16) && count > GG_TILE)
        for (int b = 0; b < blocks; b++) {
            const uint8_t *blk = grp + (int64_t)b * block_bytes;
            const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32)));
            for (int j8 = 0; j8 < 8; j8++) {
                const __m512 m = _mm512_mul_ps(dmin, scales16(blk + 192 + 16 * j8, 0));
                for (int k = 0; k < count; k++) off[k] = _mm512_fnmadd_ps(m, _mm512_set1_ps(XDS(s, k, b * 8 + j8)), off[k]);
            }
        }
    for (int k = 0; k < count; k++) result[k] = _mm512_add_ps(acc[k], off[k]);
}

/* One group's 16 rows against `count` inputs, into out[k][row]. */
static inline __attribute__((always_inline)) void x16_group_out(int type, const uint8_t *grp, int blocks, int64_t block_bytes,
                                                                const gvec *x, int count, int precise, int tiled, int prefetch,
                                                                float out[X16_TILE][X16_ROWS], const uint8_t *vals) {
    __m512 res[X16_TILE];
    x16_group(type, grp, blocks, block_bytes, x, count, precise, tiled, prefetch, vals, res);
    for (int k = 0; k < count; k++) _mm512_storeu_ps(out[k], res[k]);
}
#elif HEARTH_AVX2
/* The same layouts 8 rows at a time (each 64-byte vector's two halves in turn). maddubs pairs stay within int16
 * (15 * 127 * 2 for Q4_K, 63 * 127 * 2 for Q6_K), so a chunk's steps are summed in int16 (8 for Q4_K, 2 for Q6_K)
 * before one widening: the same exact integer sums, and so the same bits as the AVX-512 build. */
static inline __m256i bcast4_256(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

static inline __m256 scales8(const uint8_t *p, int is_signed) { /* 8 bytes as 8 float lanes */
    const __m128i raw = _mm_loadl_epi64((const __m128i *)p);
    return _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(raw) : _mm256_cvtepu8_epi32(raw));
}

static inline __m256i widen16(__m256i v) { return _mm256_madd_epi16(v, _mm256_set1_epi16(1)); }

/* A run of steps' sums: x16_add(run, w, x) adds w's bytes (unsigned) times x's (signed) to a run that x16_open(total)
 * starts and x16_close(total, run) adds to an int32 total (x16_wide: a run from zero as int32 lanes of 4 products
 * each). AVX2: a run in int16 pairs (maddubs) from zero, widened once (madd) and added; AVX-VNNI: int32 all along
 * (vpdpbusd), the run is the total itself and closing it costs nothing. The same integers either way. */
#if HEARTH_AVXVNNI
static inline __m256i x16_add(__m256i run, __m256i w, __m256i x) { return dp4_add(run, w, x); }
static inline __m256i x16_wide(__m256i run) { return run; }
static inline __m256i x16_open(__m256i total) { return total; }
static inline __m256i x16_close(__m256i total, __m256i run) { return (void)total, run; }
#else
static inline __m256i x16_add(__m256i run, __m256i w, __m256i x) { return _mm256_add_epi16(run, _mm256_maddubs_epi16(w, x)); }
static inline __m256i x16_wide(__m256i run) { return widen16(run); }
static inline __m256i x16_open(__m256i total) { return (void)total, _mm256_setzero_si256(); }
static inline __m256i x16_close(__m256i total, __m256i run) { return _mm256_add_epi32(total, widen16(run)); }
#endif

/* Half `half` of step i of a Q4_K/Q5_K block's sub-block j8 (the AVX-512 loop's x16_k_values, 32 bytes at a time). */
static inline __attribute__((always_inline)) __m256i x16_k_values256(int type, const uint8_t *blk, int j8, int i, int half) {
    const __m256i raw = _mm256_loadu_si256((const __m256i *)(blk + 320 + 32 * half + 64 * (8 * (j8 >> 1) + i)));
    __m256i w = _mm256_and_si256(j8 & 1 ? _mm256_srli_epi16(raw, 4) : raw, _mm256_set1_epi8(15));
    if (type == GG_Q5_K_X16) { /* bit j8 of the step's qh bytes, moved to bit 4 */
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 2368 + 64 * i + 32 * half));
        w = _mm256_or_si256(w, _mm256_and_si256(j8 <= 4 ? _mm256_slli_epi16(qh, 4 - j8) : _mm256_srli_epi16(qh, j8 - 4),
                                                _mm256_set1_epi8(16)));
    }
    return w;
}

/* Chunk t (of 4) of a Q6_K step's half from its two vectors of low bits and one of high bits. */
static inline __attribute__((always_inline)) __m256i x16_q6_values256(__m256i ql0, __m256i ql1, __m256i qh, int t) {
    const __m256i ql = t & 1 ? ql1 : ql0;
    const __m256i low = _mm256_and_si256(t >= 2 ? _mm256_srli_epi16(ql, 4) : ql, _mm256_set1_epi8(15));
    const __m256i high = _mm256_and_si256(t == 0 ? _mm256_slli_epi16(qh, 4)
                                          : t == 1 ? _mm256_slli_epi16(qh, 2)
                                          : t == 2 ? qh
                                                   : _mm256_srli_epi16(qh, 2),
                                          _mm256_set1_epi8(0x30));
    return _mm256_or_si256(low, high);
}

/* As the AVX-512 build's x16_unpack_group: the same bytes in the same places, each 64-byte vector as two halves. */
static inline __attribute__((always_inline)) void x16_unpack_group(int type, const uint8_t *grp, int blocks,
                                                                   int64_t block_bytes, uint8_t *vals) {
    for (int b = 0; b < blocks; b++) {
        const uint8_t *blk = grp + (int64_t)b * block_bytes;
        uint8_t *out = vals + (int64_t)b * X16_UNPACKED_BLOCK;
        for (int half = 0; half < 2; half++)
            if (type == GG_Q6_K_X16)
                for (int step = 0; step < 16; step++) {
                    const uint8_t *v = blk + 288 + 32 * half + 192 * step;
                    const __m256i ql0 = _mm256_loadu_si256((const __m256i *)v), ql1 = _mm256_loadu_si256((const __m256i *)(v + 64));
                    const __m256i qh = _mm256_loadu_si256((const __m256i *)(v + 128));
                    for (int t = 0; t < 4; t++)
                        _mm256_store_si256((__m256i *)(out + 64 * (4 * step + t) + 32 * half), x16_q6_values256(ql0, ql1, qh, t));
                }
            else
                for (int j8 = 0; j8 < 8; j8++)
                    for (int i = 0; i < 8; i++)
                        _mm256_store_si256((__m256i *)(out + 64 * (8 * j8 + i) + 32 * half), x16_k_values256(type, blk, j8, i, half));
    }
}

/* Half `half` of step vector `index` of an unpacked block (x16_unpacked's places). */
static inline __m256i x16_unpacked256(const uint8_t *vals, int b, int index, int half) {
    return _mm256_load_si256((const __m256i *)(vals + (int64_t)b * X16_UNPACKED_BLOCK + 64 * index + 32 * half));
}

static inline __attribute__((always_inline)) void x16_half(int type, const uint8_t *grp, int blocks, int64_t block_bytes,
                                                           int half, const gvec *x, int count, int precise, int tiled,
                                                           int prefetch, const uint8_t *vals, __m256 *result) {
    __m256 acc[GG_TILE], off[GG_TILE];
    for (int k = 0; k < count; k++) acc[k] = off[k] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(15);
    for (int b = 0; b < blocks; b++) {
        const uint8_t *blk = grp + (int64_t)b * block_bytes;
        /* as the AVX-512 loop; half 1 finds it cached */
        if (half == 0 && prefetch && (x16_small(type) || type == GG_Q8_0_X16)) prefetch_record(blk, block_bytes);
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16 * half)));
        if (x16_small(type)) { /* the AVX-512 loop's sums, in int16 while they fit (a step's two maddubs are at most
                                * 2 * 2 * 15 * 127 for nibbles, four steps in all; 2 * 2 * 31 * 127 for 5 bits, two) */
            const uint8_t *qs = blk + x16_qs(type) + 32 * half;
            const __m256i qh = x16_five(type) ? _mm256_loadu_si256((const __m256i *)(blk + 32 * (1 + x16_with_min(type)) + 32 * half))
                                              : _mm256_setzero_si256();
            __m256i s16[GG_TILE], l16[GG_TILE], s32[GG_TILE], l32[GG_TILE];
            for (int k = 0; k < count; k++) s16[k] = l16[k] = s32[k] = l32[k] = _mm256_setzero_si256();
            for (int i = 0; i < 4; i++) {
                const __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 64 * i));
                __m256i lo = _mm256_and_si256(raw, low4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
                if (x16_five(type)) {
                    const __m256i lanes = _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0c0c0c0c, 0, 0x04040404, 0x08080808, 0x0c0c0c0c);
                    const __m256i bits = _mm256_set1_epi32((int)(0x08040201u << (4 * (i & 1))));
                    const __m256i sixteen = _mm256_set1_epi8(16);
                    const __m256i low_bits = _mm256_and_si256(_mm256_shuffle_epi8(qh, _mm256_add_epi8(lanes, _mm256_set1_epi8((char)(i / 2)))), bits);
                    const __m256i high_bits = _mm256_and_si256(_mm256_shuffle_epi8(qh, _mm256_add_epi8(lanes, _mm256_set1_epi8((char)(2 + i / 2)))), bits);
                    lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(low_bits, bits), sixteen));
                    hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(high_bits, bits), sixteen));
                }
                for (int k = 0; k < count; k++) {
                    s16[k] = x16_add(s16[k], lo, bcast4_256(XQL(q, k, b, i)));
                    s16[k] = x16_add(s16[k], hi, bcast4_256(XQL(q, k, b, 4 + i)));
                    if (precise) {
                        l16[k] = x16_add(l16[k], lo, bcast4_256(XQL(l, k, b, i)));
                        l16[k] = x16_add(l16[k], hi, bcast4_256(XQL(l, k, b, 4 + i)));
                    }
                    if (x16_five(type) && (i & 1)) { /* 5-bit values: widened every two steps */
                        s32[k] = x16_close(s32[k], s16[k]), s16[k] = x16_open(s32[k]);
                        if (precise) l32[k] = x16_close(l32[k], l16[k]), l16[k] = x16_open(l32[k]);
                    }
                }
            }
            const __m256 m = x16_with_min(type) ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 32 + 16 * half))) : d;
            const int zero_point = x16_with_min(type) ? 0 : x16_five(type) ? 16 : 8;
            for (int k = 0; k < count; k++) {
                __m256i dot = x16_close(s32[k], s16[k]);
                if (precise) dot = _mm256_add_epi32(_mm256_slli_epi32(dot, 8), x16_close(l32[k], l16[k]));
                if (zero_point) dot = _mm256_sub_epi32(dot, _mm256_set1_epi32(zero_point * (XN16(k, 2 * b) + XN16(k, 2 * b + 1))));
                acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d, _mm256_set1_ps(XDS(d, k, b))), acc[k]);
                if (x16_with_min(type)) off[k] = _mm256_fmadd_ps(m, _mm256_set1_ps(XDS(s, k, b)), off[k]);
            }
        } else if (type == GG_Q8_0_X16) { /* signed bytes: |w| times x with w's sign, widened every step (exact) */
            __m256i ia[GG_TILE], la[GG_TILE];
            for (int k = 0; k < count; k++) ia[k] = la[k] = _mm256_setzero_si256();
            for (int i = 0; i < 8; i++) {
                const __m256i w = _mm256_loadu_si256((const __m256i *)(blk + 32 + 64 * i + 32 * half));
                const __m256i abs_w = _mm256_sign_epi8(w, w);
                for (int k = 0; k < count; k++) {
                    ia[k] = dp4_add(ia[k], abs_w, _mm256_sign_epi8(bcast4_256(XQL(q, k, b, i)), w));
                    if (precise)
                        la[k] = dp4_add(la[k], abs_w, _mm256_sign_epi8(bcast4_256(XQL(l, k, b, i)), w));
                }
            }
            for (int k = 0; k < count; k++) {
                const __m256i dot = precise ? _mm256_add_epi32(_mm256_slli_epi32(ia[k], 8), la[k]) : ia[k];
                acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d, _mm256_set1_ps(XDS(d, k, b))), acc[k]);
            }
        } else if (type != GG_Q6_K_X16) {
            const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 32 + 16 * half)));
            /* chunk j8 of the block: pair j8 / 2, its low or high nibbles. One input (a decode step) has its 64 steps
             * unrolled: rolled, each step's branches, prefetch loop and address arithmetic outnumbered its 3 vector
             * operations (1B Q4_K_M decode 1.12-1.16x faster on 2 threads, 1.22x on one; Q5_K_M 1.04-1.10x; the same
             * bits). A tile's loops stay rolled: all unrolled, the compile took 4x as long, and prompts ran no faster
             * with a tile's steps unrolled. The AVX-512 build's decode, bound by memory, ran no faster unrolled. */
#define X16_K_CHUNK256(j8)                                                                                             \
    do {                                                                                                               \
        const int c_ = (j8) >> 1, high_ = (j8) & 1, j_ = b * 8 + (j8);                                                 \
        __m256i s16[GG_TILE], l16[GG_TILE];                                                                            \
        for (int k = 0; k < count; k++) s16[k] = l16[k] = _mm256_setzero_si256();                                     \
        _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {                                                         \
            if (!high_ && prefetch) x16_prefetch_step(blk, block_bytes, 8 * c_ + i, 32);                               \
            const __m256i w = vals ? x16_unpacked256(vals, b, 8 * (j8) + i, half) : x16_k_values256(type, blk, (j8), i, half); \
            for (int k = 0; k < count; k++) {                                                                          \
                s16[k] = x16_add(s16[k], w, bcast4_256(XQL(q, k, j_, i)));                                             \
                if (precise) l16[k] = x16_add(l16[k], w, bcast4_256(XQL(l, k, j_, i)));                                \
            }                                                                                                          \
        }                                                                                                              \
        const __m256 a = _mm256_mul_ps(d, scales8(blk + 64 + 16 * (j8) + 8 * half, 0));                               \
        const __m256 m = _mm256_mul_ps(dmin, scales8(blk + 192 + 16 * (j8) + 8 * half, 0));                           \
        for (int k = 0; k < count; k++) {                                                                              \
            __m256i dot = x16_wide(s16[k]);                                                                            \
            if (precise) dot = _mm256_add_epi32(_mm256_slli_epi32(dot, 8), x16_wide(l16[k]));                          \
            acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(a, _mm256_set1_ps(XDS(d, k, j_))), acc[k]); \
            off[k] = _mm256_fnmadd_ps(m, _mm256_set1_ps(XDS(s, k, j_)), off[k]);                                       \
        }                                                                                                              \
    } while (0)
            if (count == 1)
                _Pragma("GCC unroll 8") for (int j8 = 0; j8 < 8; j8++) X16_K_CHUNK256(j8);
            else
                for (int j8 = 0; j8 < 8; j8++) X16_K_CHUNK256(j8);
#undef X16_K_CHUNK256
        } else { /* as the AVX-512 loop: four chunks at once for one input, one at a time for a tile */
            const uint8_t *qv = blk + 288 + 32 * half;
            const int together = count == 1 ? 4 : 1;
            /* one input's steps all unrolled, as Q4_K's above (the 1B Q6_K file's decode 1.09-1.12x faster on 2
             * threads, 1.22x on one; the same bits); a tile's (h, s) loops stay rolled (all unrolled: a 63 s compile) */
#define X16_Q6_PART256(h, s)                                                                                           \
    do {                                                                                                               \
    _Pragma("GCC unroll 4") for (int t0 = 0; t0 < 4; t0 += together) {                                                 \
        __m256i ia[GG_TILE][4], la[GG_TILE][4];                                                                        \
        for (int k = 0; k < count; k++) /* the -32 offset's sum first (the same integer sum) */                        \
            for (int tt = 0; tt < together; tt++) {                                                                    \
                const __m256i offset = _mm256_set1_epi32(-32 * XN16(k, 2 * (b * 8 + 4 * (h) + t0 + tt) + (s)));        \
                ia[k][tt] = precise ? _mm256_setzero_si256() : offset;                                                 \
                la[k][tt] = precise ? offset : _mm256_setzero_si256();                                                 \
            }                                                                                                          \
        _Pragma("GCC unroll 2") for (int i = 4 * (s); i < 4 * (s) + 4; i += 2) { /* runs of two steps (int16 on AVX2) */\
            __m256i s16[GG_TILE][4], l16[GG_TILE][4];                                                                  \
            for (int k = 0; k < count; k++)                                                                            \
                for (int tt = 0; tt < together; tt++)                                                                  \
                    s16[k][tt] = x16_open(ia[k][tt]), l16[k][tt] = x16_open(la[k][tt]);                                \
            _Pragma("GCC unroll 2") for (int step = i; step < i + 2; step++) {                                         \
                const uint8_t *v = qv + 192 * (8 * (h) + step);                                                        \
                if (t0 == 0 && half == 0 && prefetch) /* once per step */                                              \
                    x16_prefetch_step(blk, block_bytes, 8 * (h) + step, 16);                                           \
                const __m256i ql0 = _mm256_loadu_si256((const __m256i *)v);                                            \
                const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(v + 64));                                     \
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(v + 128));                                     \
                for (int tt = 0; tt < together; tt++) {                                                                \
                    const int t = t0 + tt, j = b * 8 + 4 * (h) + t;                                                    \
                    const __m256i w = vals ? x16_unpacked256(vals, b, 4 * (8 * (h) + step) + t, half)                  \
                                           : x16_q6_values256(ql0, ql1, qh, t);                                        \
                    for (int k = 0; k < count; k++) {                                                                  \
                        s16[k][tt] = x16_add(s16[k][tt], w, bcast4_256(XQL(q, k, j, step)));                           \
                        if (precise)                                                                                   \
                            l16[k][tt] = x16_add(l16[k][tt], w, bcast4_256(XQL(l, k, j, step)));                       \
                    }                                                                                                  \
                }                                                                                                      \
            }                                                                                                          \
            for (int k = 0; k < count; k++)                                                                            \
                for (int tt = 0; tt < together; tt++) {                                                                \
                    ia[k][tt] = x16_close(ia[k][tt], s16[k][tt]);                                                      \
                    if (precise) la[k][tt] = x16_close(la[k][tt], l16[k][tt]);                                         \
                }                                                                                                      \
        }                                                                                                              \
        for (int tt = 0; tt < together; tt++) {                                                                        \
            const int t = t0 + tt, j = b * 8 + 4 * (h) + t;                                                            \
            const __m256 a = _mm256_mul_ps(d, scales8(blk + 32 + 16 * (8 * (h) + 2 * t + (s)) + 8 * half, 1));         \
            for (int k = 0; k < count; k++) {                                                                          \
                const __m256i dot = precise ? _mm256_add_epi32(_mm256_slli_epi32(ia[k][tt], 8), la[k][tt]) : ia[k][tt];\
                acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(a, _mm256_set1_ps(XDS(d, k, j))), acc[k]);\
            }                                                                                                          \
        }                                                                                                              \
    }                                                                                                                  \
    } while (0)
            if (count == 1)
                _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) _Pragma("GCC unroll 2") for (int s = 0; s < 2; s++) X16_Q6_PART256(h, s);
            else
                for (int h = 0; h < 2; h++)
                    for (int s = 0; s < 2; s++) X16_Q6_PART256(h, s);
#undef X16_Q6_PART256
        }
    }
    for (int k = 0; k < count; k++) result[k] = _mm256_add_ps(acc[k], off[k]);
}

typedef __m256 x16_eight; /* x16_half's result per input: its 8 rows */
static inline void x16_eight_store(float *out, __m256 v) { _mm256_storeu_ps(out, v); }
#elif HEARTH_DOTPROD
/* The same layouts on Armv8.2 DotProd, 8 rows at a time (each 64-byte vector's two halves in turn, as AVX2): sdot by
 * lane multiplies 4 rows' 4 values by 4 input bytes (one lane of 16 loaded at once: 4 steps) into the rows' int32
 * lanes. Signed bytes both sides: the values (at most 63) are non-negative, Q8_0's keep their sign. The integer sums
 * are the x86 loops' exact ones, and the float steps are theirs in their order (a chunk's sum converted, times its
 * scale times the input's, fused into the row's total; the mins' terms apart and added last), so the bits are the
 * AVX-512 build's. */
typedef struct {
    float32x4_t lo, hi; /* rows 8 half + 0..3 and 4..7 */
} f32x8h;
typedef struct {
    int32x4_t lo, hi;
} i32x8h;

static inline f32x8h h8_half_floats(const uint8_t *p) { /* 8 fp16 as floats (exact) */
    const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16((const uint16_t *)p));
    return (f32x8h){vcvt_f32_f16(vget_low_f16(h)), vcvt_high_f32_f16(h)};
}
static inline f32x8h h8_byte_floats(const uint8_t *p, int is_signed) { /* 8 bytes as floats */
    if (is_signed) {
        const int16x8_t w = vmovl_s8(vld1_s8((const int8_t *)p));
        return (f32x8h){vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), vcvtq_f32_s32(vmovl_high_s16(w))};
    }
    const uint16x8_t w = vmovl_u8(vld1_u8(p));
    return (f32x8h){vcvtq_f32_u32(vmovl_u16(vget_low_u16(w))), vcvtq_f32_u32(vmovl_high_u16(w))};
}
static inline f32x8h h8_mul(f32x8h a, f32x8h b) { return (f32x8h){vmulq_f32(a.lo, b.lo), vmulq_f32(a.hi, b.hi)}; }
static inline f32x8h h8_scale(f32x8h a, float s) { return (f32x8h){vmulq_n_f32(a.lo, s), vmulq_n_f32(a.hi, s)}; }
/* acc + cvt(dot) * s, fused (_mm512_fmadd_ps's operands) */
static inline f32x8h h8_fma(f32x8h acc, i32x8h dot, f32x8h s) {
    return (f32x8h){vfmaq_f32(acc.lo, vcvtq_f32_s32(dot.lo), s.lo), vfmaq_f32(acc.hi, vcvtq_f32_s32(dot.hi), s.hi)};
}
static inline i32x8h i8h_zero(void) { return (i32x8h){vdupq_n_s32(0), vdupq_n_s32(0)}; }
static inline i32x8h i8h_dup(int32_t v) { return (i32x8h){vdupq_n_s32(v), vdupq_n_s32(v)}; }
static inline i32x8h i8h_wide(i32x8h hi, i32x8h lo) { /* 256 hi + lo: the 15-bit inputs' two halves (exact) */
    return (i32x8h){vaddq_s32(vshlq_n_s32(hi.lo, 8), lo.lo), vaddq_s32(vshlq_n_s32(hi.hi, 8), lo.hi)};
}
/* acc + rows (w.lo: rows 0..3, w.hi: 4..7, 4 values each) . lane `lane` (0..3) of the 16 input bytes at x */
#define H8_DOT(acc, w0, w1, xv, lane)                                                                                  \
    ((acc).lo = vdotq_laneq_s32((acc).lo, (w0), (xv), (lane)), (acc).hi = vdotq_laneq_s32((acc).hi, (w1), (xv), (lane)))

/* ia (and la, precise) of inputs 0..count + 4 steps' values (w0[i]: rows 0..3 of step i, w1[i]: rows 4..7) . each
 * input's 16 bytes at `at` (one lane of 4 a step) */
static inline __attribute__((always_inline)) void h8_four_steps(const int8x16_t w0[4], const int8x16_t w1[4],
                                                                const gvec *x, int count, int precise, int64_t at,
                                                                i32x8h *ia, i32x8h *la) {
    for (int k = 0; k < count; k++) {
        const int8x16_t xv = vld1q_s8(x[k].q + at);
        H8_DOT(ia[k], w0[0], w1[0], xv, 0), H8_DOT(ia[k], w0[1], w1[1], xv, 1);
        H8_DOT(ia[k], w0[2], w1[2], xv, 2), H8_DOT(ia[k], w0[3], w1[3], xv, 3);
        if (precise) {
            const int8x16_t yv = vld1q_s8(x[k].l + at);
            H8_DOT(la[k], w0[0], w1[0], yv, 0), H8_DOT(la[k], w0[1], w1[1], yv, 1);
            H8_DOT(la[k], w0[2], w1[2], yv, 2), H8_DOT(la[k], w0[3], w1[3], yv, 3);
        }
    }
}

/* The half's 32 bytes of a 64-byte step vector as two vectors of 4 rows' 4 values; Q5_0/Q5_1's fifth bits from the
 * rows' 32-bit masks (qh, 32 bytes for 8 rows) at value 4i + t (lo) or 16 + 4i + t (hi). */
static inline void h8_small_step(int type, const uint8_t *v, const uint8_t *qh, int i, int8x16_t *lo0, int8x16_t *lo1,
                                 int8x16_t *hi0, int8x16_t *hi1) {
    const uint8x16_t low4 = vdupq_n_u8(15), r0 = vld1q_u8(v), r1 = vld1q_u8(v + 16);
    uint8x16_t a0 = vandq_u8(r0, low4), a1 = vandq_u8(r1, low4), b0 = vshrq_n_u8(r0, 4), b1 = vshrq_n_u8(r1, 4);
    if (x16_five(type)) {
        static const uint8_t rows4[16] = {0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12};
        static const uint8_t bit_of[16] = {1, 2, 4, 8, 1, 2, 4, 8, 1, 2, 4, 8, 1, 2, 4, 8};
        const uint8x16_t rows = vld1q_u8(rows4), sixteen = vdupq_n_u8(16);
        const uint8x16_t bits = vshlq_u8(vld1q_u8(bit_of), vdupq_n_s8((int8_t)(4 * (i & 1))));
        const uint8x16_t q0 = vld1q_u8(qh), q1 = vld1q_u8(qh + 16);
        const uint8x16_t lo_at = vaddq_u8(rows, vdupq_n_u8((uint8_t)(i / 2))), hi_at = vaddq_u8(rows, vdupq_n_u8((uint8_t)(2 + i / 2)));
        a0 = vorrq_u8(a0, vandq_u8(vtstq_u8(vqtbl1q_u8(q0, lo_at), bits), sixteen));
        a1 = vorrq_u8(a1, vandq_u8(vtstq_u8(vqtbl1q_u8(q1, lo_at), bits), sixteen));
        b0 = vorrq_u8(b0, vandq_u8(vtstq_u8(vqtbl1q_u8(q0, hi_at), bits), sixteen));
        b1 = vorrq_u8(b1, vandq_u8(vtstq_u8(vqtbl1q_u8(q1, hi_at), bits), sixteen));
    }
    *lo0 = vreinterpretq_s8_u8(a0), *lo1 = vreinterpretq_s8_u8(a1), *hi0 = vreinterpretq_s8_u8(b0), *hi1 = vreinterpretq_s8_u8(b1);
}

static inline __attribute__((always_inline)) void x16_half(int type, const uint8_t *grp, int blocks, int64_t block_bytes,
                                                           int half, const gvec *x, int count, int precise, int tiled,
                                                           int prefetch_wanted, const uint8_t *vals, f32x8h *result) {
    (void)tiled, (void)vals; /* the inputs' own buffers: sdot takes 4 steps of one input from one load; nothing unpacked */
    f32x8h acc[GG_TILE], off[GG_TILE];
    const f32x8h zero = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    const int prefetch = half == 0 && prefetch_wanted; /* as AVX2's: half 1 finds it */
    for (int k = 0; k < count; k++) acc[k] = off[k] = zero;
    const uint8x16_t low4 = vdupq_n_u8(15);
    for (int b = 0; b < blocks; b++) {
        const uint8_t *blk = grp + (int64_t)b * block_bytes;
        const f32x8h d = h8_half_floats(blk + 16 * half);
        if (prefetch && (x16_small(type) || type == GG_Q8_0_X16)) prefetch_record(blk, block_bytes);
        if (x16_small(type)) {
            const uint8_t *qs = blk + x16_qs(type) + 32 * half;
            const uint8_t *qh = blk + 32 * (1 + x16_with_min(type)) + 32 * half;
            i32x8h ia[GG_TILE], la[GG_TILE];
            for (int k = 0; k < count; k++) ia[k] = la[k] = i8h_zero();
            int8x16_t lo0[4], lo1[4], hi0[4], hi1[4];
            for (int i = 0; i < 4; i++) h8_small_step(type, qs + 64 * i, qh, i, &lo0[i], &lo1[i], &hi0[i], &hi1[i]);
            for (int k = 0; k < count; k++) { /* values 4i.. (lo) and 16 + 4i.. (hi): input bytes 0..15 and 16..31 */
                const int8x16_t xa = vld1q_s8(x[k].q + 32 * b), xb = vld1q_s8(x[k].q + 32 * b + 16);
                H8_DOT(ia[k], lo0[0], lo1[0], xa, 0), H8_DOT(ia[k], hi0[0], hi1[0], xb, 0);
                H8_DOT(ia[k], lo0[1], lo1[1], xa, 1), H8_DOT(ia[k], hi0[1], hi1[1], xb, 1);
                H8_DOT(ia[k], lo0[2], lo1[2], xa, 2), H8_DOT(ia[k], hi0[2], hi1[2], xb, 2);
                H8_DOT(ia[k], lo0[3], lo1[3], xa, 3), H8_DOT(ia[k], hi0[3], hi1[3], xb, 3);
                if (precise) {
                    const int8x16_t ya = vld1q_s8(x[k].l + 32 * b), yb = vld1q_s8(x[k].l + 32 * b + 16);
                    H8_DOT(la[k], lo0[0], lo1[0], ya, 0), H8_DOT(la[k], hi0[0], hi1[0], yb, 0);
                    H8_DOT(la[k], lo0[1], lo1[1], ya, 1), H8_DOT(la[k], hi0[1], hi1[1], yb, 1);
                    H8_DOT(la[k], lo0[2], lo1[2], ya, 2), H8_DOT(la[k], hi0[2], hi1[2], yb, 2);
                    H8_DOT(la[k], lo0[3], lo1[3], ya, 3), H8_DOT(la[k], hi0[3], hi1[3], yb, 3);
                }
            }
            const f32x8h m = x16_with_min(type) ? h8_half_floats(blk + 32 + 16 * half) : d;
            const int zero_point = x16_with_min(type) ? 0 : x16_five(type) ? 16 : 8;
            for (int k = 0; k < count; k++) {
                i32x8h dot = precise ? i8h_wide(ia[k], la[k]) : ia[k];
                if (zero_point) {
                    const int32_t z = zero_point * (x[k].n16[2 * b] + x[k].n16[2 * b + 1]);
                    dot.lo = vsubq_s32(dot.lo, vdupq_n_s32(z)), dot.hi = vsubq_s32(dot.hi, vdupq_n_s32(z));
                }
                acc[k] = h8_fma(acc[k], dot, h8_scale(d, x[k].d[b]));
                if (x16_with_min(type)) /* _mm512_fmadd_ps(m, xs, off) */
                    off[k] = (f32x8h){vfmaq_n_f32(off[k].lo, m.lo, x[k].s[b]), vfmaq_n_f32(off[k].hi, m.hi, x[k].s[b])};
            }
        } else if (type == GG_Q8_0_X16) {
            i32x8h ia[GG_TILE], la[GG_TILE];
            for (int k = 0; k < count; k++) ia[k] = la[k] = i8h_zero();
            for (int i0 = 0; i0 < 8; i0 += 4) {
                int8x16_t w0[4], w1[4];
                for (int i = 0; i < 4; i++) {
                    w0[i] = vld1q_s8((const int8_t *)blk + 32 + 64 * (i0 + i) + 32 * half);
                    w1[i] = vld1q_s8((const int8_t *)blk + 32 + 64 * (i0 + i) + 32 * half + 16);
                }
                h8_four_steps(w0, w1, x, count, precise, 32 * b + 4 * i0, ia, la);
            }
            for (int k = 0; k < count; k++)
                acc[k] = h8_fma(acc[k], precise ? i8h_wide(ia[k], la[k]) : ia[k], h8_scale(d, x[k].d[b]));
        } else if (type != GG_Q6_K_X16) { /* Q4_K / Q5_K: chunk after chunk, the mins' terms after the blocks */
            for (int j8 = 0; j8 < 8; j8++) {
                const int c = j8 / 2, j = b * 8 + j8;
                i32x8h ia[GG_TILE], la[GG_TILE];
                for (int k = 0; k < count; k++) ia[k] = la[k] = i8h_zero();
                for (int i0 = 0; i0 < 8; i0 += 4) {
                    int8x16_t w0[4], w1[4];
                    for (int i = 0; i < 4; i++) {
                        if (prefetch && j8 % 2 == 0) x16_prefetch_step(blk, block_bytes, 8 * c + i0 + i, 32);
                        const uint8_t *raw = blk + 320 + 64 * (8 * c + i0 + i) + 32 * half;
                        uint8x16_t v0 = vld1q_u8(raw), v1 = vld1q_u8(raw + 16);
                        v0 = j8 % 2 ? vshrq_n_u8(v0, 4) : vandq_u8(v0, low4);
                        v1 = j8 % 2 ? vshrq_n_u8(v1, 4) : vandq_u8(v1, low4);
                        if (type == GG_Q5_K_X16) { /* bit j8 of the step's qh bytes, as 16 */
                            const uint8_t *qh = blk + 2368 + 64 * (i0 + i) + 32 * half;
                            const uint8x16_t bit = vdupq_n_u8((uint8_t)(1u << j8)), sixteen = vdupq_n_u8(16);
                            v0 = vorrq_u8(v0, vandq_u8(vtstq_u8(vld1q_u8(qh), bit), sixteen));
                            v1 = vorrq_u8(v1, vandq_u8(vtstq_u8(vld1q_u8(qh + 16), bit), sixteen));
                        }
                        w0[i] = vreinterpretq_s8_u8(v0), w1[i] = vreinterpretq_s8_u8(v1);
                    }
                    h8_four_steps(w0, w1, x, count, precise, 32 * j + 4 * i0, ia, la);
                }
                const f32x8h a = h8_mul(d, h8_byte_floats(blk + 64 + 16 * j8 + 8 * half, 0));
                for (int k = 0; k < count; k++)
                    acc[k] = h8_fma(acc[k], precise ? i8h_wide(ia[k], la[k]) : ia[k], h8_scale(a, x[k].d[j]));
            }
        } else { /* Q6_K: a scale per 16 values; the -32 offset starts the integer sum (exact) */
            const uint8_t *qv = blk + 288 + 32 * half;
            for (int h = 0; h < 2; h++)
                for (int s = 0; s < 2; s++)
                    for (int t = 0; t < 4; t++) {
                        const int j = b * 8 + 4 * h + t;
                        i32x8h ia[GG_TILE], la[GG_TILE];
                        for (int k = 0; k < count; k++) {
                            const i32x8h offset = i8h_dup(-32 * x[k].n16[2 * j + s]);
                            ia[k] = precise ? i8h_zero() : offset;
                            la[k] = precise ? offset : i8h_zero();
                        }
                        int8x16_t w0[4], w1[4];
                        for (int i = 0; i < 4; i++) {
                            if (prefetch && t == 0) x16_prefetch_step(blk, block_bytes, 8 * h + 4 * s + i, 16);
                            const uint8_t *v = qv + 192 * (8 * h + 4 * s + i);
                            const uint8_t *ql = v + 64 * (t & 1);
                            uint8x16_t l0 = vld1q_u8(ql), l1 = vld1q_u8(ql + 16);
                            uint8x16_t q0 = vld1q_u8(v + 128), q1 = vld1q_u8(v + 144);
                            l0 = t >= 2 ? vshrq_n_u8(l0, 4) : vandq_u8(l0, low4);
                            l1 = t >= 2 ? vshrq_n_u8(l1, 4) : vandq_u8(l1, low4);
                            /* bits 2t, 2t + 1 of qh as bits 4, 5 */
                            q0 = vandq_u8(t == 0 ? vshlq_n_u8(q0, 4) : t == 1 ? vshlq_n_u8(q0, 2) : t == 2 ? q0 : vshrq_n_u8(q0, 2), vdupq_n_u8(0x30));
                            q1 = vandq_u8(t == 0 ? vshlq_n_u8(q1, 4) : t == 1 ? vshlq_n_u8(q1, 2) : t == 2 ? q1 : vshrq_n_u8(q1, 2), vdupq_n_u8(0x30));
                            w0[i] = vreinterpretq_s8_u8(vorrq_u8(l0, q0)), w1[i] = vreinterpretq_s8_u8(vorrq_u8(l1, q1));
                        }
                        h8_four_steps(w0, w1, x, count, precise, 32 * j + 16 * s, ia, la); /* steps 4s..4s + 3 */
                        const f32x8h a = h8_mul(d, h8_byte_floats(blk + 32 + 16 * (8 * h + 2 * t + s) + 8 * half, 1));
                        for (int k = 0; k < count; k++)
                            acc[k] = h8_fma(acc[k], precise ? i8h_wide(ia[k], la[k]) : ia[k], h8_scale(a, x[k].d[j]));
                    }
        }
    }
    if (type == GG_Q4_K_X16 || type == GG_Q5_K_X16) /* the mins' terms: _mm512_fnmadd_ps(m, xs, off), in order */
        for (int b = 0; b < blocks; b++) {
            const uint8_t *blk = grp + (int64_t)b * block_bytes;
            const f32x8h dmin = h8_half_floats(blk + 32 + 16 * half);
            for (int j8 = 0; j8 < 8; j8++) {
                const f32x8h m = h8_mul(dmin, h8_byte_floats(blk + 192 + 16 * j8 + 8 * half, 0));
                for (int k = 0; k < count; k++) {
                    const float xs = x[k].s[b * 8 + j8];
                    off[k] = (f32x8h){vfmsq_n_f32(off[k].lo, m.lo, xs), vfmsq_n_f32(off[k].hi, m.hi, xs)};
                }
            }
        }
    for (int k = 0; k < count; k++) result[k] = (f32x8h){vaddq_f32(acc[k].lo, off[k].lo), vaddq_f32(acc[k].hi, off[k].hi)};
}
#undef H8_DOT

typedef f32x8h x16_eight;
static inline void x16_eight_store(float *out, f32x8h v) { vst1q_f32(out, v.lo), vst1q_f32(out + 4, v.hi); }
#endif

#if !HEARTH_AVX512 && (HEARTH_AVX2 || HEARTH_DOTPROD)
/* One group's 16 rows against `count` inputs, into out[k][row]: its two halves of 8 in turn (AVX-512 takes all 16
 * at once, above). */
static inline __attribute__((always_inline)) void x16_group_out(int type, const uint8_t *grp, int blocks, int64_t block_bytes,
                                                                const gvec *x, int count, int precise, int tiled, int prefetch,
                                                                float out[X16_TILE][X16_ROWS], const uint8_t *vals) {
    x16_eight res[GG_TILE];
    for (int half = 0; half < 2; half++) {
        x16_half(type, grp, blocks, block_bytes, half, x, count, precise, tiled, prefetch, vals, res);
        for (int k = 0; k < count; k++) x16_eight_store(out[k] + 8 * half, res[k]);
    }
}
#endif

#if HEARTH_AMX_BUILT
/* Prefill on Intel AMX (Sapphire Rapids and later). A 16-row layout's values are already in an AMX B tile's order (a
 * 64-byte vector = 4 consecutive values of 16 rows), so one tile product multiplies 16 tokens' int8 inputs by 16
 * rows' values over a chunk of 32 (Q6_K: 16) values: the exact integer sums the VNNI loop adds up 4 values at a time
 * (a type's zero point is taken off the values here, off the sum there: the same integer). Each chunk's 16 x 16 sums
 * then take the VNNI loop's float steps in its order, the same fma on the same operands, so a token's result is the
 * same bits whichever path computed it: decode and short calls stay on VNNI. A group's values are unpacked once into
 * tiles, then every tile of 16 tokens runs over them. */
/* The tile instructions as asm of their own, which says what memory each reads and writes (gcc 12's intrinsics tell
 * the compiler that ldtilecfg reads 8 bytes and tileloadd none, and it then drops or moves the stores before them);
 * no compiler flag is needed for them, only an assembler that knows them. */
#define AMX_LOAD(tile, base, stride)                                                                                   \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #tile ::"r"((const void *)(base)), "r"((long)(stride)) : "memory")
#define AMX_STORE(tile, base, stride)                                                                                  \
    __asm__ volatile("tilestored %%tmm" #tile ", (%0,%1,1)" ::"r"((void *)(base)), "r"((long)(stride)) : "memory")
#define AMX_ZERO(tile) __asm__ volatile("tilezero %%tmm" #tile::)
#define AMX_DOT(name, sums, inputs, values) __asm__ volatile(#name " %%tmm" #values ", %%tmm" #inputs ", %%tmm" #sums::)
#define AMX_TOKENS 16
#define AMX_RING 4 /* chunks' stored sums in flight */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

/* Chunks per block and values per chunk of a 16-row layout's type; whether its values are signed in the tiles. */
static inline int amx_chunks(int type) { return type == GG_Q6_K_X16 ? 16 : type == GG_Q4_K_X16 || type == GG_Q5_K_X16 ? 8 : 1; }
static inline int amx_chunk_values(int type) { return type == GG_Q6_K_X16 ? 16 : 32; }
static inline int amx_signed(int type) {
    return type == GG_Q4_0_X16 || type == GG_Q5_0_X16 || type == GG_Q8_0_X16 || type == GG_Q6_K_X16;
}
static inline int amx_has_offset(int type) { /* an off term per input block: Q4_1/Q5_1's m, Q4_K/Q5_K's mins */
    return x16_with_min(type) || type == GG_Q4_K_X16 || type == GG_Q5_K_X16;
}

/* Block b of a group into tiles (chunk after chunk, values / 4 rows of 64 bytes) and each chunk's 16 row scales (and
 * mins): x16_group's vectors less the zero point, and its products. */
static inline __attribute__((always_inline)) void amx_unpack_block(int type, const uint8_t *blk, uint8_t *tiles,
                                                                   float *scale, float *mins) {
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
    if (x16_small(type)) {
        const uint8_t *qs = blk + x16_qs(type);
        const __m512i qh = x16_five(type) ? _mm512_loadu_si512((const void *)(blk + 32 * (1 + x16_with_min(type))))
                                          : _mm512_setzero_si512();
        const __m512i zero_point = _mm512_set1_epi8((char)(x16_with_min(type) ? 0 : x16_five(type) ? 16 : 8));
        for (int i = 0; i < 4; i++) {
            __m512i lo, hi;
            x16_small_step(type, qs, qh, i, &lo, &hi);
            _mm512_storeu_si512((void *)(tiles + 64 * i), _mm512_sub_epi8(lo, zero_point));
            _mm512_storeu_si512((void *)(tiles + 64 * (4 + i)), _mm512_sub_epi8(hi, zero_point));
        }
        _mm512_storeu_ps(scale, d);
        if (x16_with_min(type)) _mm512_storeu_ps(mins, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32))));
    } else if (type == GG_Q8_0_X16) {
        memcpy(tiles, blk + 32, 512);
        _mm512_storeu_ps(scale, d);
    } else if (type != GG_Q6_K_X16) {
        const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32)));
        for (int c = 0; c < 4; c++) {
            for (int i = 0; i < 8; i++) {
                __m512i wa, wb;
                x16_k_step(type, blk, c, i, &wa, &wb);
                _mm512_storeu_si512((void *)(tiles + 512 * (2 * c) + 64 * i), wa);
                _mm512_storeu_si512((void *)(tiles + 512 * (2 * c + 1) + 64 * i), wb);
            }
            for (int j = 2 * c; j < 2 * c + 2; j++) {
                _mm512_storeu_ps(scale + 16 * j, _mm512_mul_ps(d, scales16(blk + 64 + 16 * j, 0)));
                _mm512_storeu_ps(mins + 16 * j, _mm512_mul_ps(dmin, scales16(blk + 192 + 16 * j, 0)));
            }
        }
    } else { /* chunk 8h + 4s + t: 16 values (steps 4s..4s+3) of sub-block 4h + t; x16_group's order h, s, t */
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < 8; i++) {
                const uint8_t *v = blk + 288 + 192 * (8 * h + i);
                const __m512i ql0 = _mm512_loadu_si512((const void *)v), ql1 = _mm512_loadu_si512((const void *)(v + 64));
                const __m512i qh = _mm512_loadu_si512((const void *)(v + 128));
                for (int t = 0; t < 4; t++)
                    _mm512_storeu_si512((void *)(tiles + 256 * (8 * h + 4 * (i / 4) + t) + 64 * (i % 4)),
                                        _mm512_sub_epi8(x16_q6_values(ql0, ql1, qh, t), _mm512_set1_epi8(32)));
            }
        for (int h = 0; h < 2; h++)
            for (int s = 0; s < 2; s++)
                for (int t = 0; t < 4; t++)
                    _mm512_storeu_ps(scale + 16 * (8 * h + 4 * s + t), _mm512_mul_ps(d, scales16(blk + 32 + 16 * (8 * h + 2 * t + s), 1)));
    }
}

/* Where chunk `chunk` of a row starts in an input, and which of the input's blocks of 32 (its d and s) it is in. */
static inline __attribute__((always_inline)) int amx_input_block(int type, int chunk) {
    return type == GG_Q6_K_X16 ? 8 * (chunk / 16) + 4 * (chunk % 16 / 8) + chunk % 4 : chunk;
}
static inline __attribute__((always_inline)) int amx_input_at(int type, int chunk) {
    return 32 * amx_input_block(type, chunk) + (type == GG_Q6_K_X16 ? 16 * (chunk / 4 % 2) : 0);
}

static void amx_configure(int chunk_values) { /* 16 tokens by 16 rows */
    amx_config config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int t = 0; t < 8; t++) { /* sums 0-3, inputs 4-5, values 6-7 */
        config.rows[t] = t < 6 ? AMX_TOKENS : (uint8_t)(chunk_values / 4);
        config.colsb[t] = t >= 4 && t < 6 ? (uint16_t)chunk_values : 64;
    }
    __asm__ volatile("ldtilecfg %0" ::"m"(config) : "memory");
}

static int64_t amx_work_bytes(int type, int cols, int count) {
    const int64_t chunks = (int64_t)cols / x16_values(type) * amx_chunks(type), inputs = cols / QBLOCK;
    const int64_t token_tiles = count / AMX_TOKENS;
    return chunks * 16 * amx_chunk_values(type) + 2 * chunks * X16_ROWS * (int64_t)sizeof(float) +
           2 * token_tiles * inputs * AMX_TOKENS * (int64_t)sizeof(float);
}

/* Rows [r0, r1) of a 16-row layout for `count` inputs (whole tiles of 16) whose quantized values lie `stride` bytes
 * apart, on AMX;
 * `work` (amx_work_bytes) holds a group's tiles and scales and the inputs' scales by tile of tokens. */
static inline __attribute__((always_inline)) void amx_rows_of(int type, int precise, const uint8_t *w, int64_t row_bytes,
                                                              int cols, int r0, int r1, const gvec *x, int count,
                                                              int64_t stride, float *y, int64_t ystride,
                                                              const float *bias, int accumulate, uint8_t *work) {
    const int blocks = cols / x16_values(type), per_block = amx_chunks(type), values = amx_chunk_values(type);
    const int chunks = blocks * per_block, tile_bytes = 16 * values, inputs = cols / QBLOCK;
    const int64_t group_bytes = X16_ROWS * row_bytes, block_bytes = group_bytes / blocks;
    uint8_t *tiles = work;
    float *scale = (float *)(work + (int64_t)chunks * tile_bytes), *mins = scale + (int64_t)chunks * X16_ROWS;
    float *dx = mins + (int64_t)chunks * X16_ROWS; /* [token tile][input block][16 tokens], then s likewise */
    float *sx = dx + (int64_t)count * inputs;
    for (int k = 0; k < count; k++)
        for (int j = 0; j < inputs; j++) {
            const int64_t at = ((int64_t)(k / AMX_TOKENS) * inputs + j) * AMX_TOKENS + k % AMX_TOKENS;
            dx[at] = x[k].d[j], sx[at] = x[k].s[j];
        }
    int32_t sums[AMX_RING][2][AMX_TOKENS][X16_ROWS] __attribute__((aligned(64))); /* [chunk][high, low] */
    /* Chunk `chunk`'s products into sums tile S (low halves: L) from inputs tile A (low halves: A2), values tile B. */
#define AMX_TYPED_DOT(S, A, B)                                                                                         \
    do {                                                                                                               \
        if (amx_signed(type))                                                                                          \
            AMX_DOT(tdpbssd, S, A, B);                                                                                 \
        else                                                                                                           \
            AMX_DOT(tdpbsud, S, A, B);                                                                                 \
    } while (0)
#define AMX_PRODUCTS(S, L, A, A2, B, chunk)                                                                            \
    do {                                                                                                               \
        const int at_ = amx_input_at(type, (chunk));                                                                   \
        AMX_LOAD(B, tiles + (int64_t)(chunk) * tile_bytes, 64);                                                        \
        AMX_LOAD(A, x[k0].q + at_, stride);                                                                            \
        AMX_ZERO(S);                                                                                                   \
        AMX_TYPED_DOT(S, A, B);                                                                                        \
        if (precise) {                                                                                                 \
            AMX_LOAD(A2, x[k0].l + at_, stride);                                                                       \
            AMX_ZERO(L);                                                                                               \
            AMX_TYPED_DOT(L, A2, B);                                                                                   \
        }                                                                                                              \
    } while (0)
    /* Chunk `chunk`'s sums (tiles S and L) into the ring; the tiles' other arguments are AMX_PRODUCTS' */
#define AMX_SAVE(S, L, A, A2, B, chunk)                                                                                \
    do {                                                                                                               \
        AMX_STORE(S, sums[(chunk) % AMX_RING][0], 64);                                                                 \
        if (precise) AMX_STORE(L, sums[(chunk) % AMX_RING][1], 64);                                                    \
    } while (0)
    /* OP (AMX_PRODUCTS or AMX_SAVE) on chunk `chunk`'s tiles. 8-bit inputs: sums in tiles 0-3 by chunk % 4, inputs
     * 4-5 and values 6-7 by chunk % 2; 15-bit: high sums 0-1, low sums 2-3, high and low inputs 4 and 5, values 6-7,
     * by chunk % 2 */
#define AMX_ON_TILES(OP, chunk)                                                                                        \
    do {                                                                                                               \
        if (precise) {                                                                                                 \
            if ((chunk) % 2 == 0) OP(0, 2, 4, 5, 6, chunk);                                                            \
            else OP(1, 3, 4, 5, 7, chunk);                                                                             \
        } else {                                                                                                       \
            switch ((chunk) % 4) {                                                                                     \
            case 0: OP(0, 0, 4, 4, 6, chunk); break;                                                                   \
            case 1: OP(1, 1, 5, 5, 7, chunk); break;                                                                   \
            case 2: OP(2, 2, 4, 4, 6, chunk); break;                                                                   \
            default: OP(3, 3, 5, 5, 7, chunk); break;                                                                  \
            }                                                                                                          \
        }                                                                                                              \
    } while (0)
#define AMX_ADD(chunk)                                                                                                 \
    do {                                                                                                               \
        const __m512 a_ = _mm512_loadu_ps(scale + (int64_t)(chunk) * X16_ROWS);                                        \
        const float *jdx_ = tdx + (int64_t)amx_input_block(type, (chunk)) * AMX_TOKENS;                               \
        _Pragma("GCC unroll 16") for (int k = 0; k < AMX_TOKENS; k++) {                                             \
            __m512i dot = _mm512_load_si512((const void *)sums[(chunk) % AMX_RING][0][k]);                             \
            if (precise)                                                                                               \
                dot = _mm512_add_epi32(_mm512_slli_epi32(dot, 8), _mm512_load_si512((const void *)sums[(chunk) % AMX_RING][1][k])); \
            acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(a_, _mm512_set1_ps(jdx_[k])), acc[k]);    \
        }                                                                                                              \
    } while (0)
    amx_configure(values);
    for (int g = r0 / X16_ROWS; g < r1 / X16_ROWS; g++) {
        const uint8_t *grp = w + (int64_t)g * group_bytes;
        for (int b = 0; b < blocks; b++)
            amx_unpack_block(type, grp + (int64_t)b * block_bytes, tiles + (int64_t)b * per_block * tile_bytes,
                             scale + (int64_t)b * per_block * X16_ROWS, mins + (int64_t)b * per_block * X16_ROWS);
        for (int k0 = 0; k0 < count; k0 += AMX_TOKENS) {
            const float *tdx = dx + (int64_t)(k0 / AMX_TOKENS) * inputs * AMX_TOKENS;
            const float *tsx = sx + (int64_t)(k0 / AMX_TOKENS) * inputs * AMX_TOKENS;
            __m512 acc[AMX_TOKENS];
            _Pragma("GCC unroll 16") for (int k = 0; k < AMX_TOKENS; k++) acc[k] = _mm512_setzero_ps();
            /* a chunk's sums are stored `lag` chunks after its products were issued (a store right behind its product
             * waits for it and holds up the tile instructions behind it) and added up one chunk later */
            const int lag = precise ? 1 : 2;
            for (int c = 0; c < chunks + lag + 1; c++) {
                if (c < chunks) AMX_ON_TILES(AMX_PRODUCTS, c);
                if (c >= lag && c - lag < chunks) AMX_ON_TILES(AMX_SAVE, c - lag);
                if (c >= lag + 1) AMX_ADD(c - lag - 1);
            }
            __m512 off[AMX_TOKENS]; /* x16_group's off terms, in its order; all 16 chains side by side */
            _Pragma("GCC unroll 16") for (int k = 0; k < AMX_TOKENS; k++) off[k] = _mm512_setzero_ps();
            if (amx_has_offset(type))
                for (int chunk = 0; chunk < chunks; chunk++) {
                    const __m512 mn = _mm512_loadu_ps(mins + (int64_t)chunk * X16_ROWS);
                    const float *jsx = tsx + (int64_t)amx_input_block(type, chunk) * AMX_TOKENS;
                    _Pragma("GCC unroll 16") for (int k = 0; k < AMX_TOKENS; k++)
                        off[k] = x16_with_min(type) ? _mm512_fmadd_ps(mn, _mm512_set1_ps(jsx[k]), off[k])
                                                    : _mm512_fnmadd_ps(mn, _mm512_set1_ps(jsx[k]), off[k]);
                }
            /* every use of acc and off at a constant index (the loops unrolled), so the compiler keeps them in
             * registers: an array it placed in memory cost a store and a load per token and chunk */
            float out[AMX_TOKENS][X16_ROWS] __attribute__((aligned(64)));
            _Pragma("GCC unroll 16") for (int k = 0; k < AMX_TOKENS; k++) _mm512_store_ps(out[k], _mm512_add_ps(acc[k], off[k]));
            for (int k = 0; k < AMX_TOKENS; k++)
                x16_store(out[k], y + (int64_t)(k0 + k) * ystride + (int64_t)g * X16_ROWS,
                          bias ? bias + (int64_t)g * X16_ROWS : NULL, accumulate);
        }
    }
    __asm__ volatile("tilerelease" ::: "memory");
#undef AMX_TYPED_DOT
#undef AMX_PRODUCTS
#undef AMX_SAVE
#undef AMX_ON_TILES
#undef AMX_ADD
}

HEARTH_DRIVER void amx_rows(int type, int precise, const uint8_t *w, int64_t row_bytes, int cols, int r0, int r1,
                            const gvec *x, int count, int64_t stride, float *y, int64_t ystride, const float *bias,
                            int accumulate, uint8_t *work);
#if HEARTH_DEFINES(3)
HEARTH_DRIVER void amx_rows(int type, int precise, const uint8_t *w, int64_t row_bytes, int cols, int r0, int r1,
                            const gvec *x, int count, int64_t stride, float *y, int64_t ystride, const float *bias,
                            int accumulate, uint8_t *work) {
#define AMX_OF(t, p) amx_rows_of(t, p, w, row_bytes, cols, r0, r1, x, count, stride, y, ystride, bias, accumulate, work)
    X16_EACH(AMX_OF)
#undef AMX_OF
}
#endif

/* The inputs' byte stride when all `count` lie evenly apart (a prefill's and a batch's do), else 0. */
static int64_t amx_stride(const gvec *x, int count, int precise) {
    const int64_t stride = count > 1 ? x[1].q - x[0].q : 0;
    if (stride <= 0) return 0;
    for (int k = 2; k < count; k++)
        if (x[k].q - x[0].q != k * stride) return 0;
    if (precise)
        for (int k = 0; k < count; k++)
            if (x[k].l - x[0].l != k * stride) return 0;
    return stride;
}
#endif

#if HEARTH_AVX2 || HEARTH_DOTPROD
/* Rows [r0, r1) of a 16-row layout in blocks of groups (as gg_rows_of's blocks of rows), each tile of inputs meeting
 * every group of a block in turn. */
static inline __attribute__((always_inline)) void x16_rows_of(int type, int precise, const uint8_t *w, int64_t row_bytes,
                                                              int cols, int r0, int r1, const gvec *x, int count, float *y,
                                                              int64_t ystride, const float *bias, int accumulate) {
    const int blocks = cols / x16_values(type);
    const int64_t group_bytes = X16_ROWS * row_bytes, block_bytes = group_bytes / blocks;
    int block_groups = (int)(GG_BLOCK_BYTES / group_bytes);
    if (block_groups < 1) block_groups = 1;
    const int g0 = r0 / X16_ROWS, g1 = r1 / X16_ROWS;
    float out[X16_TILE][X16_ROWS];
    int any_tiled = 0;
    const int prefetch = x16_prefetch_for(count);
#if HEARTH_AVX2
    uint8_t *vals = NULL; /* a long prompt's K-quant values, unpacked once per block of groups */
    const int64_t unpacked_group = (int64_t)blocks * X16_UNPACKED_BLOCK;
    if (x16_unpacks(type, precise) && count >= X16_UNPACK_INPUTS) vals = _mm_malloc((size_t)(block_groups * unpacked_group), 64); /* Windows lacks aligned_alloc */
#endif
    for (int gb = g0; gb < g1; gb += block_groups) {
        const int ge = g1 - gb < block_groups ? g1 : gb + block_groups;
#if HEARTH_AVX2
        if (vals)
            for (int g = gb; g < ge; g++) x16_unpack_group(type, w + (int64_t)g * group_bytes, blocks, block_bytes, vals + (g - gb) * unpacked_group);
#endif
        for (int k0 = 0; k0 < count;) {
            const int tile = count - k0 >= X16_TILE && x16_wide_tile(type) ? X16_TILE : count - k0 >= GG_TILE ? GG_TILE : count - k0;
            /* the inputs' tile where they fill slots of one side by side (gtile_put) */
            const int tiled = (tile == X16_TILE || tile == GG_TILE) && x[k0].tile.q &&
                              x[k0 + tile - 1].tile.q == x[k0].tile.q && x[k0 + tile - 1].slot == x[k0].slot + tile - 1 &&
                              !(precise && !x[k0].tile.l);
            any_tiled |= tiled;
            for (int g = gb; g < ge; g++) {
                const uint8_t *grp = w + (int64_t)g * group_bytes;
#if HEARTH_AVX2
                if (x16_unpacks(type, precise) && vals && tile == X16_TILE) { /* unpacked: no weight read to prefetch */
                    const uint8_t *group_vals = vals + (g - gb) * unpacked_group;
                    if (!group_vals) __builtin_unreachable(); /* the inlined group's loops take the unpacked branch only */
                    if (tiled)
                        x16_group_out(type, grp, blocks, block_bytes, x + k0, X16_TILE, precise, 1, 0, out, group_vals);
                    else
                        x16_group_out(type, grp, blocks, block_bytes, x + k0, X16_TILE, precise, 0, 0, out, group_vals);
                } else
#endif
                if (X16_TILE > GG_TILE && x16_wide_tile(type) && tile == X16_TILE) {
                    if (tiled)
                        x16_group_out(type, grp, blocks, block_bytes, x + k0, X16_TILE, precise, 1, prefetch, out, NULL);
                    else
                        x16_group_out(type, grp, blocks, block_bytes, x + k0, X16_TILE, precise, 0, prefetch, out, NULL);
                } else if (tile == 4) {
                    if (tiled)
                        x16_group_out(type, grp, blocks, block_bytes, x + k0, 4, precise, 1, prefetch, out, NULL);
                    else
                        x16_group_out(type, grp, blocks, block_bytes, x + k0, 4, precise, 0, prefetch, out, NULL);
                } else if (tile == 3)
                    x16_group_out(type, grp, blocks, block_bytes, x + k0, 3, precise, 0, prefetch, out, NULL);
                else if (tile == 2)
                    x16_group_out(type, grp, blocks, block_bytes, x + k0, 2, precise, 0, prefetch, out, NULL);
                else
                    x16_group_out(type, grp, blocks, block_bytes, x + k0, 1, precise, 0, prefetch, out, NULL);
                for (int k = 0; k < tile; k++)
                    x16_store(out[k], y + (int64_t)(k0 + k) * ystride + (int64_t)g * X16_ROWS,
                              bias ? bias + (int64_t)g * X16_ROWS : NULL, accumulate);
            }
            k0 += tile;
        }
    }
    if (any_tiled) __atomic_fetch_add(&tiled_calls, 1, __ATOMIC_RELAXED);
#if HEARTH_AVX2
    if (vals) __atomic_fetch_add(&unpacked_calls, 1, __ATOMIC_RELAXED), _mm_free(vals);
#endif
}
#endif

#if (HEARTH_AVX2 || HEARTH_DOTPROD) && HEARTH_DEFINES(2)
/* Each type and input width in a function of its own: inlined side by side into one switch, a change to one type's
 * loops changed how the compiler laid out another's (Q6_K 8-bit 0.61-0.86x as fast after Q5_K's gained a path). */
#define X16_ROWS_FOR(tag, t, p)                                                                                        \
    static __attribute__((noinline)) void x16_rows_##tag##_##p(const uint8_t *w, int64_t row_bytes, int cols, int r0,  \
                                                               int r1, const gvec *x, int count, float *y,             \
                                                               int64_t ystride, const float *bias, int accumulate) {   \
        x16_rows_of(t, p, w, row_bytes, cols, r0, r1, x, count, y, ystride, bias, accumulate);                         \
    }
#define X16_ROWS_BOTH(tag, t) X16_ROWS_FOR(tag, t, 0) X16_ROWS_FOR(tag, t, 1)
X16_ROWS_BOTH(q4_0, GG_Q4_0_X16)
X16_ROWS_BOTH(q4_1, GG_Q4_1_X16)
X16_ROWS_BOTH(q5_0, GG_Q5_0_X16)
X16_ROWS_BOTH(q5_1, GG_Q5_1_X16)
X16_ROWS_BOTH(q8_0, GG_Q8_0_X16)
X16_ROWS_BOTH(q4_k, GG_Q4_K_X16)
X16_ROWS_BOTH(q5_k, GG_Q5_K_X16)
X16_ROWS_BOTH(q6_k, GG_Q6_K_X16)
#undef X16_ROWS_BOTH
#undef X16_ROWS_FOR
#endif

/* Rows [r0, r1) (multiples of 16) of a 16-row layout; nothing in a build without one (hearth_gg_x16_bytes says -1
 * there, so no such matrix is ever made). */
HEARTH_DRIVER void x16_rows(int type, int precise, const uint8_t *w, int64_t row_bytes, int cols, int r0, int r1,
                            const gvec *x, int count, float *y, int64_t ystride, const float *bias, int accumulate);
#if HEARTH_DEFINES(2)
HEARTH_DRIVER void x16_rows(int type, int precise, const uint8_t *w, int64_t row_bytes, int cols, int r0, int r1,
                            const gvec *x, int count, float *y, int64_t ystride, const float *bias, int accumulate) {
#if HEARTH_AMX_BUILT
    /* whole tiles of 16 tokens on AMX, the rest on VNNI (the same bits; fewer measured slower on AMX) */
    const int on_tiles = count - count % AMX_TOKENS;
    if (amx_on && on_tiles > 0 && r1 > r0) {
        const int64_t stride = amx_stride(x, on_tiles, precise);
        uint8_t *work = stride ? aligned_alloc(64, (size_t)((amx_work_bytes(type, cols, on_tiles) + 63) / 64 * 64)) : NULL;
        if (work) {
            amx_rows(type, precise, w, row_bytes, cols, r0, r1, x, on_tiles, stride, y, ystride, bias, accumulate, work);
            free(work);
            __atomic_fetch_add(&amx_calls, 1, __ATOMIC_RELAXED);
            if (on_tiles == count) return;
            x += on_tiles, y += (int64_t)on_tiles * ystride, count -= on_tiles;
        }
    }
#endif
#if HEARTH_AVX2 || HEARTH_DOTPROD
#define X16_OF(tag) (precise ? x16_rows_##tag##_1 : x16_rows_##tag##_0)(w, row_bytes, cols, r0, r1, x, count, y, ystride, bias, accumulate)
    switch (type) {
    case GG_Q4_0_X16: X16_OF(q4_0); break;
    case GG_Q4_1_X16: X16_OF(q4_1); break;
    case GG_Q5_0_X16: X16_OF(q5_0); break;
    case GG_Q5_1_X16: X16_OF(q5_1); break;
    case GG_Q8_0_X16: X16_OF(q8_0); break;
    case GG_Q4_K_X16: X16_OF(q4_k); break;
    case GG_Q5_K_X16: X16_OF(q5_k); break;
    default: X16_OF(q6_k); break;
    }
#undef X16_OF
#else
    (void)type, (void)precise, (void)w, (void)row_bytes, (void)cols, (void)r0, (void)r1, (void)x, (void)count, (void)y;
    (void)ystride, (void)bias, (void)accumulate;
#endif
}
#endif

HEARTH_DRIVER void gg_rows(int type, int precise, const uint8_t *w, int64_t row_bytes, int cols, int r0, int r1,
                           const gvec *x, int count, float *y, int64_t ystride, const float *bias, int accumulate);
#if HEARTH_DEFINES(1)
HEARTH_DRIVER void gg_rows(int type, int precise, const uint8_t *w, int64_t row_bytes, int cols, int r0, int r1,
                           const gvec *x, int count, float *y, int64_t ystride, const float *bias, int accumulate) {
    if (gg_is_x16(type)) {
        x16_rows(type, precise, w, row_bytes, cols, r0, r1, x, count, y, ystride, bias, accumulate);
        return;
    }
#define GG_ROWS_OF(t, p) gg_rows_of(t, p, w, row_bytes, cols, r0, r1, x, count, y, ystride, bias, accumulate)
#define GG_BOTH(t)                                                                                                     \
    if (precise)                                                                                                       \
        GG_ROWS_OF(t, 1);                                                                                              \
    else                                                                                                               \
        GG_ROWS_OF(t, 0);                                                                                              \
    break
    switch (type) {
    case GG_Q4_0: GG_BOTH(GG_Q4_0);
    case GG_Q4_1: GG_BOTH(GG_Q4_1);
    case GG_Q5_0: GG_BOTH(GG_Q5_0);
    case GG_Q5_1: GG_BOTH(GG_Q5_1);
    case GG_Q8_0: GG_BOTH(GG_Q8_0);
    case GG_Q4_K: GG_BOTH(GG_Q4_K);
    case GG_Q5_K: GG_BOTH(GG_Q5_K);
    case GG_Q6_K: GG_BOTH(GG_Q6_K);
    case GG_F16: GG_ROWS_OF(GG_F16, 0); break;
    case GG_BF16: GG_ROWS_OF(GG_BF16, 0); break;
    default: GG_ROWS_OF(GG_F32, 0); break;
    }
#undef GG_BOTH
#undef GG_ROWS_OF
}
#endif

static int64_t gg_row_bytes(int type, int64_t cols) {
    int64_t geometry[2];
    if (gg_is_x16(type)) return HEARTH_AVX2 || HEARTH_DOTPROD ? x16_row_bytes(type, cols) : -1;
    if (hearth_gg_geometry(type, geometry) != 0 || cols % geometry[0]) return -1;
    if (!gg_is_float(type) && cols % QBLOCK) return -1;
    return cols / geometry[0] * geometry[1];
}

/* One input's quantization buffers (within a caller's memory), and the gvec over them. */
typedef struct {
    int8_t *q, *l;
    float *d, *s;
    int32_t *n16;
} gbuf;

static int64_t gbuf_bytes(int64_t cols) { /* q, l, d, s, n16 */
    return 2 * cols + 2 * (cols / QBLOCK) * (int64_t)sizeof(float) + (cols / 16) * (int64_t)sizeof(int32_t);
}

/* Bytes from one input's buffers to the next: whole cache lines, an odd number of them, so that the inputs of a tile
 * (read side by side, block by block) fall in different L1 sets (an even number made every one of them 4 KiB apart
 * at 1B's widths: one set, and a wide tile's 15-bit inputs thrashed it). */
static int64_t gbuf_stride(int64_t cols) {
    const int64_t lines = (gbuf_bytes(cols) + 63) / 64;
    return 64 * (lines | 1);
}

static gbuf gbuf_at(void *memory, int64_t cols) {
    gbuf b;
    b.d = (float *)memory;
    b.s = b.d + cols / QBLOCK;
    b.n16 = (int32_t *)(b.s + cols / QBLOCK);
    b.q = (int8_t *)(b.n16 + cols / 16);
    b.l = b.q + cols;
    return b;
}

/* A tile: TILE_SLOTS inputs of the 16-row kernels side by side, so that one pointer and constant offsets reach every
 * input of a step. As separate buffers, a wide tile's q, l, d and n16 pointers outnumbered the registers, and the
 * compiler moved them in from vector registers and the stack around every product. A copy of the same numbers, so
 * the same bits. */
static int64_t gtile_bytes(int64_t cols) { return 64 * ((TILE_SLOTS * gbuf_bytes(cols) + 63) / 64); }
static int64_t gtile_count(int64_t n) { return n >= GG_TILE ? (n + TILE_SLOTS - 1) / TILE_SLOTS : 0; } /* for n inputs */

static gtile gtile_at(void *memory, int64_t cols) {
    gtile t;
    t.d = (float *)memory;
    t.s = t.d + TILE_SLOTS * (cols / QBLOCK);
    t.n16 = (int32_t *)(t.s + TILE_SLOTS * (cols / QBLOCK));
    t.q = (int8_t *)(t.n16 + TILE_SLOTS * (cols / 16));
    t.l = t.q + TILE_SLOTS * cols;
    return t;
}

/* Input v's quantization into slot `slot` of tile t, which v then names. */
static void gtile_put(gvec *v, gtile t, int slot, int64_t cols) {
    for (int64_t j = 0; j < cols / QBLOCK; j++) {
        for (int i = 0; i < 8; i++) {
            const int64_t at = ((j * 8 + i) * TILE_SLOTS + slot) * 4;
            memcpy(t.q + at, v->q + 32 * j + 4 * i, 4);
            if (v->l) memcpy(t.l + at, v->l + 32 * j + 4 * i, 4);
        }
        t.d[j * TILE_SLOTS + slot] = v->d[j], t.s[j * TILE_SLOTS + slot] = v->s[j];
        t.n16[2 * j * TILE_SLOTS + slot] = v->n16[2 * j], t.n16[(2 * j + 1) * TILE_SLOTS + slot] = v->n16[2 * j + 1];
    }
    if (!v->l) t.l = NULL;
    v->tile = t, v->slot = slot;
}

/* x quantized into `b` for a matrix of `type` (precise: 15 bits); the gvec that reads it. With `tile` (NULL: none),
 * also into its slot `slot` where a 16-row kernel reads it. */
static gvec gg_input(const float *x, int64_t cols, int type, int precise, gbuf b, void *tile, int slot) {
    gvec v = {x, b.q, precise ? b.l : NULL, b.d, b.s, b.n16, {NULL, NULL, NULL, NULL, NULL}, 0};
    if (!gg_is_float(type)) {
        gg_quantize(x, (int)cols, precise, b.q, b.l, b.d, b.s, b.n16);
        if (HEARTH_AVX2 && tile && gg_is_x16(type)) gtile_put(&v, gtile_at(tile, cols), slot, cols);
    }
    return v;
}

/* y [n, rows] = x [n, cols] . W^T (+ bias) for a GGUF matrix W of `type` ([rows, cols], rows contiguous), the rows
 * split across `threads`; `precise`: inputs at 15 bits instead of 8. Returns 0; -1 for a type or shape it does not
 * take; -3 when its buffers can't be had. */
HEARTH_API int hearth_gg_matmul(int type, const void *w, int64_t rows, int64_t cols, const float *x, int64_t n, float *y,
                     const float *bias, int threads, int precise) {
    const int64_t row_bytes = gg_row_bytes(type, cols);
    if (row_bytes < 0 || n < 1 || rows < 1 || cols > INT32_MAX || rows > INT32_MAX) return -1;
    if (threads < 1) threads = 1;
    precise = precise && !gg_is_float(type);
    const int64_t per_input = gbuf_stride(cols), per_tile = gtile_bytes(cols);
    const int64_t tiles = gtile_count(n);
    char *memory = malloc((size_t)(n * per_input + tiles * per_tile));
    gvec *inputs = malloc((size_t)n * sizeof(gvec));
    if (!memory || !inputs) {
        free(memory), free(inputs);
        return -3;
    }
    char *tile_memory = memory + n * per_input;
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int64_t k = 0; k < n; k++)
            inputs[k] = gg_input(x + k * cols, cols, type, precise, gbuf_at(memory + k * per_input, cols),
                                 tiles ? tile_memory + k / TILE_SLOTS * per_tile : NULL, (int)(k % TILE_SLOTS));
        int tid, team, lo, hi;
        team_position(&tid, &team);
        split_rows((int)rows, team, tid, X16_ROWS, &lo, &hi);
        gg_rows(type, precise, (const uint8_t *)w, row_bytes, (int)cols, lo, hi, inputs, (int)n, y, rows, bias, 0);
    }
    free(memory), free(inputs);
    return 0;
}

/* The forward pass on a GGUF model's own blocks: n tokens at positions pos..pos+n-1 through the decoder, each matrix
 * in its file type (a Q4_K_M file mixes Q4_K and Q6_K per tensor), their K/V written into the cache, and the logits of
 * the last `logit_rows` of them. A decode step is n = 1; a prefill chunk is n > 1 and computes each token exactly as
 * a decode step would (the products are row-invariant, the attention below is split into chunks of fixed length
 * whatever the threads, and every other operation is per token): a reply is the same bits whether its prompt came
 * from one prefill, a reused prefix or token-by-token decoding.
 * Argument tables (their order is app/core/fastpath/blocks.py's, checked against hearth_gg_layout):
 *   cfg:    layers, hidden, heads, kv_heads, head_dim, inter, vocab, kv_bf16, threads, rope_pairs, embed_type,
 *           head_type, precise
 *   cfgf:   eps, attention scale
 *   glob:   embedding rows, final norm, head rows, inv_freq [head_dim / 2]
 *   types:  per layer q, k, v, o, gate, up, down (GG_ types)
 *   layers: per layer attn_norm, ffn_norm, q, k, v, o, gate, up, down, q_bias, k_bias, v_bias, K slab, V slab
 * rope_pairs: RoPE on adjacent pairs (llama.cpp's layout of llama/mistral Q and K rows) instead of halves. precise: a
 * bit per matrix input taken at 15 bits (PRECISE_ bits below). Returns 0; -1 for a token or position out of range,
 * -2 for sizes or types it does not take, -3 when the scratch is too small. */
enum { GC_LAYERS, GC_HIDDEN, GC_HEADS, GC_KV_HEADS, GC_HEAD_DIM, GC_INTER, GC_VOCAB, GC_KV_BF16, GC_THREADS,
       GC_ROPE_PAIRS, GC_EMBED_TYPE, GC_HEAD_TYPE, GC_PRECISE, GC_COUNT };
enum { GG_EMBED, GG_FINAL_NORM, GG_HEAD, GG_INV_FREQ, GG_GLOBAL_COUNT };
enum { GT_Q, GT_K, GT_V, GT_O, GT_GATE, GT_UP, GT_DOWN, GT_COUNT };
enum { GL_ATTN_NORM, GL_FFN_NORM, GL_Q, GL_K, GL_V, GL_O, GL_GATE, GL_UP, GL_DOWN, GL_Q_BIAS, GL_K_BIAS, GL_V_BIAS,
       GL_K_CACHE, GL_V_CACHE, GL_COUNT };
enum { PRECISE_QKV = 1, PRECISE_O = 2, PRECISE_GATE_UP = 4, PRECISE_DOWN = 8, PRECISE_HEAD = 16 };
#define SPAN 256 /* positions per attention chunk: fixed, so a token's attention never depends on the thread count */
#define ATTEND_TOKENS 32 /* a prefill's consecutive tokens attended together (their whole chunks), at most */
#define OWN_INPUT_ROWS 8 /* up to this many rows (a decode step, a small batch), every thread normalizes and quantizes
                          * each input for itself: no barrier between the rows' update and the next product */
#define ATTEND_PARTIAL_FLOATS (1 << 20) /* a thread's partials for them, at most (4 MiB; fewer tokens past that) */
#define MAX_HEAD_DIM 256 /* widest head whose four K rows attend_chunk widens on the stack; wider ones take dot_kv */

HEARTH_API int hearth_gg_layout(int which) {
    switch (which) {
    case 0: return GC_COUNT;
    case 1: return GG_GLOBAL_COUNT;
    case 2: return GT_COUNT;
    case 3: return GL_COUNT;
    default: return -1;
    }
}

static void rope_pairs(float *v, const float *cosv, const float *sinv, int half) {
    for (int i = 0; i < half; i++) {
        const float a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * cosv[i] - b * sinv[i];
        v[2 * i + 1] = b * cosv[i] + a * sinv[i];
    }
}

/* One head's RoPE in the model's layout: adjacent pairs (`pairs`, GGUF's llama) or the two halves. */
static inline void rope_head(float *v, const float *cosv, const float *sinv, int half, int pairs) {
    if (pairs)
        rope_pairs(v, cosv, sinv, half);
    else
        rope(v, cosv, sinv, half);
}

/* exp256's constants, which exp_neon and exp_lane take too: one polynomial in three forms, the same bits in each */
#define EXP_LOW -87.33654f /* below it (under float's normal range): 0 */
#define EXP_LOG2E 1.44269504088896341f
#define EXP_LN2_HI 0.693359375f /* ln 2 in two parts, so that x - n ln 2 loses nothing */
#define EXP_LN2_LO -2.12194440e-4f
#define EXP_P0 1.9875691500e-4f /* Cephes' expf coefficients, highest power first */
#define EXP_P1 1.3981999507e-3f
#define EXP_P2 8.3334519073e-3f
#define EXP_P3 4.1665795894e-2f
#define EXP_P4 1.6666665459e-1f
#define EXP_P5 5.0000001201e-1f

#if HEARTH_AVX2
/* e^x for 8 lanes of x <= 0 (softmax weights: a score minus its chunk's max): x = n ln2 + r with |r| <= ln2 / 2,
 * e^r by a degree-6 polynomial (Cephes' expf coefficients: within 1 ulp of expf on every 64th float of [-100, 0]),
 * times 2^n through the exponent bits; below -87.3 (under float's normal range) 0. One sequence of operations for
 * every lane and every call, so a score's weight is the same bits wherever its chunk runs. */
static inline __m256 exp256(__m256 x) {
    const __m256 low = _mm256_set1_ps(EXP_LOW);
    const __m256 underflow = _mm256_cmp_ps(x, low, _CMP_LT_OQ);
    x = _mm256_max_ps(x, low);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_LO), r);
    __m256 y = _mm256_set1_ps(EXP_P0);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(EXP_P1));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(EXP_P2));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(EXP_P3));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(EXP_P4));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(EXP_P5));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(underflow, _mm256_mul_ps(y, _mm256_castsi256_ps(bits)));
}

/* dot_kv of four consecutive bf16 K rows, already widened to fp32 (`k`: 4 rows of n floats; the widening is exact),
 * with q: four independent chains, each row's operations exactly dot_kv's (one accumulator, 8 at a time, the same
 * horizontal sum and scalar tail), so the scores are its bits. */
static void dot_kv4(const float *k, const float *q, int n, float *out) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 qv = _mm256_loadu_ps(q + i);
        for (int r = 0; r < 4; r++) acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(k + (int64_t)r * n + i), qv, acc[r]);
    }
    /* hsum256 of the four at once: the same pairs added in the same order */
    const __m256 ab = _mm256_add_ps(_mm256_permute2f128_ps(acc[0], acc[1], 0x20), _mm256_permute2f128_ps(acc[0], acc[1], 0x31));
    const __m256 cd = _mm256_add_ps(_mm256_permute2f128_ps(acc[2], acc[3], 0x20), _mm256_permute2f128_ps(acc[2], acc[3], 0x31));
    const __m256 pairs = _mm256_add_ps(_mm256_shuffle_ps(ab, cd, 0x88), _mm256_shuffle_ps(ab, cd, 0xdd));
    const __m256 sums = _mm256_add_ps(_mm256_shuffle_ps(pairs, pairs, 0x88), _mm256_shuffle_ps(pairs, pairs, 0xdd));
    float lanes[8];
    _mm256_storeu_ps(lanes, sums);
    out[0] = lanes[0], out[1] = lanes[4], out[2] = lanes[1], out[3] = lanes[5];
    for (int r = 0; r < 4 && i < n; r++)
        for (int j = i; j < n; j++) out[r] += k[(int64_t)r * n + j] * q[j];
}

/* out (hd floats) += p[t - t0] v_t for bf16 V rows t in [t0, t1), 64 values of out at a time held in registers
 * across the positions: per value the same fused multiply-adds in the same order as axpy_kv's AVX2 loop position
 * after position, so the same bits. hd % 8 == 0. */
static void attend_values(float *out, const float *p, const char *vbase, int hd, int64_t t0, int64_t t1) {
    for (int seg = 0; seg < hd; seg += 64) {
        const int vectors = (hd - seg < 64 ? hd - seg : 64) / 8;
        __m256 acc[8];
        for (int b = 0; b < vectors; b++) acc[b] = _mm256_loadu_ps(out + seg + 8 * b);
        for (int64_t t = t0; t < t1; t++) {
            const __m256 pp = _mm256_set1_ps(p[t - t0]);
            const uint16_t *row = (const uint16_t *)vbase + (size_t)t * hd + seg;
            if (seg == 0) /* the whole row, a few positions ahead */
                prefetch_lines((const char *)row + KV_PREFETCH_BYTES, hd * 2);
            for (int b = 0; b < vectors; b++) acc[b] = _mm256_fmadd_ps(bf16x8(row + 8 * b), pp, acc[b]);
        }
        for (int b = 0; b < vectors; b++) _mm256_storeu_ps(out + seg + 8 * b, acc[b]);
    }
}

#if HEARTH_AVX512
/* attend_values for `heads` (1 to 4) query heads of a KV head at once, hd % 64 == 0: each V row's 64-value segment
 * widened once for all of them; per value the same fused multiply-adds in the same order, so the same bits. */
static inline __attribute__((always_inline)) void attend_values_heads(int heads, float *out, int64_t out_step,
                                                                      const float *p, const char *vbase, int hd,
                                                                      int64_t t0, int64_t t1) {
    for (int seg = 0; seg < hd; seg += 64) {
        __m512 acc[4][4];
        for (int j = 0; j < heads; j++)
            for (int b = 0; b < 4; b++) acc[j][b] = _mm512_loadu_ps(out + j * out_step + seg + 16 * b);
        for (int64_t t = t0; t < t1; t++) {
            const uint16_t *row = (const uint16_t *)vbase + (size_t)t * hd + seg;
            if (seg == 0) /* the whole row, a few positions ahead */
                prefetch_lines((const char *)row + KV_PREFETCH_BYTES, hd * 2);
            __m512 v[4];
            for (int b = 0; b < 4; b++)
                v[b] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(row + 16 * b))), 16));
            for (int j = 0; j < heads; j++) {
                const __m512 pp = _mm512_set1_ps(p[(int64_t)j * SPAN + t - t0]);
                for (int b = 0; b < 4; b++) acc[j][b] = _mm512_fmadd_ps(v[b], pp, acc[j][b]);
            }
        }
        for (int j = 0; j < heads; j++)
            for (int b = 0; b < 4; b++) _mm512_storeu_ps(out + j * out_step + seg + 16 * b, acc[j][b]);
    }
}
#endif
#endif

#if HEARTH_AVX512
/* exp256's operations on 16 lanes: each lane the same bits as exp256's. */
static inline __m512 exp512(__m512 x) {
    const __m512 low = _mm512_set1_ps(EXP_LOW);
    const __mmask16 normal = _mm512_cmp_ps_mask(x, low, _CMP_NLT_UQ);
    x = _mm512_max_ps(x, low);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(EXP_LOG2E)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_LO), r);
    __m512 y = _mm512_set1_ps(EXP_P0);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(EXP_P1));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(EXP_P2));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(EXP_P3));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(EXP_P4));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(EXP_P5));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps(normal, y, _mm512_castsi512_ps(bits));
}
#endif

#if HEARTH_AVX512 && defined(__AVX512DQ__)
/* dot_kv4's scores of four consecutive bf16 K rows for each of `group` heads (scores: SPAN floats a head), two rows
 * to a 512-bit register, one in each 256-bit half: each row's lanes take the same fused multiply-adds in the same
 * order and the same pairwise sum (IEEE addition commutes), so dot_kv's bits at twice its width. Returns the first
 * position it left (fewer than four remain). hd % 8 == 0, hd <= MAX_HEAD_DIM. */
static int64_t score_fours_wide(const float *q, int group, const uint16_t *kbase, int hd, int64_t t0, int64_t t1,
                                float scale, float *scores) {
    const __m512i corners = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m128 vscale = _mm_set1_ps(scale);
    const int slices = hd / 8;
    int64_t t = t0;
    for (; t + 4 <= t1; t += 4) {
        __m512 rows[2 * MAX_HEAD_DIM / 8]; /* slice s: rows[2s] = positions t, t+1; rows[2s+1] = t+2, t+3 */
        const uint16_t *k = kbase + (size_t)t * hd;
        prefetch_lines((const char *)k + KV_PREFETCH_BYTES, 4 * hd * 2);
        for (int s = 0; s < slices; s++)
            for (int pair = 0; pair < 2; pair++) {
                const uint16_t *first = k + (size_t)(2 * pair) * hd + 8 * s;
                const __m256i both = _mm256_inserti128_si256(
                    _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)first)),
                    _mm_loadu_si128((const __m128i *)(first + hd)), 1);
                rows[2 * s + pair] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(both), 16));
            }
        for (int j = 0; j < group; j++) {
            const float *qj = q + (int64_t)j * hd;
            __m512 near = _mm512_setzero_ps(), far = _mm512_setzero_ps();
            for (int s = 0; s < slices; s++) {
                const __m512 qq = _mm512_broadcast_f32x8(_mm256_loadu_ps(qj + 8 * s));
                near = _mm512_fmadd_ps(rows[2 * s], qq, near);
                far = _mm512_fmadd_ps(rows[2 * s + 1], qq, far);
            }
            /* hsum256 of each row's 8 lanes: (a_l + a_l+4), then adjacent pairs, then the two pairs' sums */
            __m512 x = _mm512_add_ps(_mm512_shuffle_f32x4(near, far, _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_f32x4(near, far, _MM_SHUFFLE(3, 1, 3, 1)));
            x = _mm512_add_ps(x, _mm512_permute_ps(x, _MM_SHUFFLE(2, 3, 0, 1)));
            x = _mm512_add_ps(x, _mm512_permute_ps(x, _MM_SHUFFLE(1, 0, 3, 2)));
            const __m128 four = _mm512_castps512_ps128(_mm512_permutexvar_ps(corners, x));
            _mm_storeu_ps(scores + (int64_t)j * SPAN + (t - t0), _mm_mul_ps(four, vscale));
        }
    }
    return t;
}
#endif

/* The gated MLP's activation in place: g[k] <- silu(g[k]) u[k], written as (g >= 0 ? g : g e) / (1 + e) with
 * e = e^-|g| (never overflows), then times u. 8 lanes at a time on AVX2 (exp256), 4 on NEON (exp_neon), one lane at a
 * time in exp_lane's mirror of them (fmaf is their fused step), so a value's bits do not depend on where in its row it
 * lies or which build ran it; libm's expf, which this replaced, differs between C libraries, and it and its scalar loop
 * took 5 % of a four-row forward. */
static inline float exp_lane(float x) {
    if (x < EXP_LOW) return 0.0f;
    const float n = nearbyintf(x * EXP_LOG2E);
    float r = fmaf(-n, EXP_LN2_HI, x);
    r = fmaf(-n, EXP_LN2_LO, r);
    float y = EXP_P0;
    y = fmaf(y, r, EXP_P1);
    y = fmaf(y, r, EXP_P2);
    y = fmaf(y, r, EXP_P3);
    y = fmaf(y, r, EXP_P4);
    y = fmaf(y, r, EXP_P5);
    y = fmaf(y, r * r, r + 1.0f);
    const union {
        int32_t i;
        float f;
    } power = {.i = ((int32_t)n + 127) * (1 << 23)};
    return y * power.f;
}

#if HEARTH_NEON
static inline float32x4_t exp_neon(float32x4_t x) { /* exp256's operations on 4 lanes */
    const float32x4_t low = vdupq_n_f32(EXP_LOW);
    const uint32x4_t underflow = vcltq_f32(x, low);
    x = vmaxq_f32(x, low);
    const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(EXP_LOG2E)));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(EXP_LN2_HI));
    r = vfmsq_f32(r, n, vdupq_n_f32(EXP_LN2_LO));
    float32x4_t y = vdupq_n_f32(EXP_P0);
    y = vfmaq_f32(vdupq_n_f32(EXP_P1), y, r);
    y = vfmaq_f32(vdupq_n_f32(EXP_P2), y, r);
    y = vfmaq_f32(vdupq_n_f32(EXP_P3), y, r);
    y = vfmaq_f32(vdupq_n_f32(EXP_P4), y, r);
    y = vfmaq_f32(vdupq_n_f32(EXP_P5), y, r);
    y = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), y, vmulq_f32(r, r));
    const int32x4_t bits = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(vmulq_f32(y, vreinterpretq_f32_s32(bits))), underflow));
}
#endif

static void silu_times(float *g, const float *u, int64_t count) {
    int64_t k = 0;
#if HEARTH_AVX2
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    for (; k + 8 <= count; k += 8) {
        const __m256 x = _mm256_loadu_ps(g + k);
        const __m256 e = exp256(_mm256_or_ps(x, sign));
        const __m256 num = _mm256_blendv_ps(x, _mm256_mul_ps(x, e), _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
        _mm256_storeu_ps(g + k, _mm256_mul_ps(_mm256_div_ps(num, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + k)));
    }
#elif HEARTH_NEON
    const float32x4_t one = vdupq_n_f32(1.0f);
    for (; k + 4 <= count; k += 4) {
        const float32x4_t x = vld1q_f32(g + k);
        const float32x4_t e = exp_neon(vnegq_f32(vabsq_f32(x)));
        const float32x4_t num = vbslq_f32(vcltzq_f32(x), vmulq_f32(x, e), x);
        vst1q_f32(g + k, vmulq_f32(vdivq_f32(num, vaddq_f32(one, e)), vld1q_f32(u + k)));
    }
#endif
    for (; k < count; k++) {
        const float x = g[k], e = exp_lane(-fabsf(x));
        g[k] = (x < 0.0f ? x * e : x) / (1.0f + e) * u[k];
    }
}

/* silu_times for the tests: every build's bits, and the vector lanes' against the one-at-a-time loop. */
HEARTH_API void hearth_silu_times(float *g, const float *u, int64_t count) { silu_times(g, u, count); }

/* One chunk [t0, t1) of a KV head's positions against its `group` query heads (q: group * hd floats): per head the
 * chunk's max score, its sum of exp(score - max) and the unnormalized output sum exp(score - max) v (pout: hd floats
 * per head, `stride` apart). With a bf16 cache the AVX2 builds score four positions at a time, their K rows widened
 * once for all the heads, and keep the heads' outputs in registers across the positions (AVX-512: four heads per pass
 * over the V rows), each value's arithmetic unchanged (dot_kv4, attend_values); their softmax weights come from
 * exp256, summed in 8 lanes. The max and the sums never run one long chain through the scores: at 1,500 positions
 * those chains took as long as the dot products. */
static void attend_chunk(const float *q, int group, const char *kbase, const char *vbase, int kv_bf16, int hd,
                         int64_t t0, int64_t t1, float scale, float *scores, float *pmax, float *psum, float *pout,
                         int64_t stride) {
    const size_t elem = kv_bf16 ? 2 : 4;
    int64_t t = t0;
#if HEARTH_AVX2
#if HEARTH_AVX512 && defined(__AVX512DQ__)
    if (kv_bf16 && hd <= MAX_HEAD_DIM && hd % 8 == 0)
        t = score_fours_wide(q, group, (const uint16_t *)kbase, hd, t0, t1, scale, scores);
#endif
    if (kv_bf16 && hd <= MAX_HEAD_DIM) /* four positions at a time, their K rows widened once for all the heads */
        for (; t + 4 <= t1; t += 4) {
            float rows[4 * MAX_HEAD_DIM];
            const uint16_t *k = (const uint16_t *)(kbase + (size_t)t * hd * elem);
            prefetch_lines((const char *)k + KV_PREFETCH_BYTES, 4 * hd * 2);
            int i = 0;
            for (; i + 8 <= 4 * hd; i += 8) _mm256_storeu_ps(rows + i, bf16x8(k + i));
            for (; i < 4 * hd; i++) rows[i] = bf16_to_f32(k[i]);
            for (int j = 0; j < group; j++) {
                float four[4], *sc = scores + (int64_t)j * SPAN + (t - t0);
                dot_kv4(rows, q + (int64_t)j * hd, hd, four);
                for (int r = 0; r < 4; r++) sc[r] = four[r] * scale;
            }
        }
#endif
    for (int j = 0; j < group; j++) {
        float *sc = scores + (int64_t)j * SPAN;
        float top = -INFINITY;
        int64_t u = t0;
#if HEARTH_AVX2 /* the max is exact in any order: 8 lanes, not one chain through every score */
        __m256 tops = _mm256_set1_ps(-INFINITY);
        for (; u + 8 <= t; u += 8) tops = _mm256_max_ps(_mm256_loadu_ps(sc + (u - t0)), tops);
        float lanes[8];
        _mm256_storeu_ps(lanes, tops);
        for (int l = 0; l < 8; l++) top = lanes[l] > top ? lanes[l] : top;
#endif
        for (; u < t; u++) top = sc[u - t0] > top ? sc[u - t0] : top;
        for (int64_t u = t; u < t1; u++) {
            sc[u - t0] = dot_kv(kbase + (size_t)u * hd * elem, kv_bf16, q + (int64_t)j * hd, hd) * scale;
            if (sc[u - t0] > top) top = sc[u - t0];
        }
        float total = 0.0f;
#if HEARTH_AVX2
        const __m256 vtop = _mm256_set1_ps(top);
        __m256 totals = _mm256_setzero_ps(); /* 8 partial sums (position % 8), then hsum256: no chain of 256 adds */
        u = t0;
#if HEARTH_AVX512 /* 16 weights at a time, added to the 8 sums in position order as below */
        const __m512 wide_top = _mm512_set1_ps(top);
        for (; u + 16 <= t1; u += 16) {
            const __m512 weights = exp512(_mm512_sub_ps(_mm512_loadu_ps(sc + (u - t0)), wide_top));
            _mm512_storeu_ps(sc + (u - t0), weights);
            totals = _mm256_add_ps(totals, _mm512_castps512_ps256(weights));
            totals = _mm256_add_ps(totals, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(weights), 1)));
        }
#endif
        for (; u < t1; u += 8) { /* the last 8 masked: every weight through exp256 */
            const int64_t left = t1 - u;
            const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(left > 8 ? 8 : (int)left),
                                                     _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            const __m256 weights = _mm256_and_ps(exp256(_mm256_sub_ps(_mm256_maskload_ps(sc + (u - t0), lanes), vtop)),
                                                 _mm256_castsi256_ps(lanes));
            _mm256_maskstore_ps(sc + (u - t0), lanes, weights);
            totals = _mm256_add_ps(totals, weights);
        }
        total = hsum256(totals);
#else
        for (int64_t u = t0; u < t1; u++) {
            sc[u - t0] = expf(sc[u - t0] - top);
            total += sc[u - t0];
        }
#endif
        pmax[j * stride] = top, psum[j * stride] = total;
        memset(pout + (int64_t)j * stride * hd, 0, (size_t)hd * sizeof(float));
    }
#if HEARTH_AVX512
    if (kv_bf16 && hd % 64 == 0) { /* up to four heads per pass over the chunk's V rows */
        for (int j = 0; j < group; j += 4) {
            float *out = pout + (int64_t)j * stride * hd;
            const float *p = scores + (int64_t)j * SPAN;
            const int64_t step = stride * hd;
            switch (group - j < 4 ? group - j : 4) {
            case 1: attend_values_heads(1, out, step, p, vbase, hd, t0, t1); break;
            case 2: attend_values_heads(2, out, step, p, vbase, hd, t0, t1); break;
            case 3: attend_values_heads(3, out, step, p, vbase, hd, t0, t1); break;
            default: attend_values_heads(4, out, step, p, vbase, hd, t0, t1); break;
            }
        }
        return;
    }
#endif
#if HEARTH_AVX2
    if (kv_bf16 && hd % 8 == 0) {
        for (int j = 0; j < group; j++)
            attend_values(pout + (int64_t)j * stride * hd, scores + (int64_t)j * SPAN, vbase, hd, t0, t1);
        return;
    }
#endif
    for (int64_t u = t0; u < t1; u++) {
        const char *vrow = vbase + (size_t)u * hd * elem;
        for (int j = 0; j < group; j++) axpy_kv(pout + (int64_t)j * stride * hd, scores[(int64_t)j * SPAN + u - t0], vrow, kv_bf16, hd);
    }
}

/* A head's output from its chunks' partials (`chunks` of them, consecutive), in chunk order. */
static void attend_merge(int chunks, const float *pmax, const float *psum, const float *pout, int hd, float *out) {
    float top = -INFINITY, total = 0.0f;
    for (int c = 0; c < chunks; c++) top = fmaxf(top, pmax[c]);
    memset(out, 0, (size_t)hd * sizeof(float));
    for (int c = 0; c < chunks; c++) {
        const float weight = expf(pmax[c] - top);
        total += weight * psum[c];
        for (int i = 0; i < hd; i++) out[i] += weight * pout[(int64_t)c * hd + i];
    }
    const float inv = 1.0f / total;
    for (int i = 0; i < hd; i++) out[i] *= inv;
}

/* How many of a prefill's consecutive tokens attend together: ATTEND_TOKENS, halved while their partials (every chunk
 * of the widest slab, for each of their query heads) would pass ATTEND_PARTIAL_FLOATS a thread. Measured at 1,500 to
 * 3,000 positions (2-core Intel Xeon, 2026-12-05): 4 tokens at a time 743-789 tok/s at 135M, 8 787-865, 16 813-854,
 * 32 862-868; 1B Q5_K_M 259-273, 268-284, 277-284, 283-298. */
static int64_t attend_tokens(int64_t group, int64_t chunks, int64_t hd) {
    int64_t tokens = ATTEND_TOKENS;
    while (tokens > 1 && tokens * group * chunks * (hd + 2) > ATTEND_PARTIAL_FLOATS) tokens /= 2;
    return tokens;
}

/* Scratch layout for n tokens: x, xn [n][hidden]; qkv [n][units hd]; att [n][heads hd]; gate, up [n][inter];
 * cos, sin [n][half]; attention partials per thread [threads][T group][chunks][hd + 2] (T = attend_tokens: a
 * prefill's (block of T tokens, kv head) units each run on one thread) or, for one token, shared [heads][chunks][hd + 2]
 * (its (kv head, chunk) units spread over the threads); the chunk scores per thread [threads][T group][SPAN] (one
 * token: [group]); a block's queries per thread [threads][T group][hd] (one token: its group's roped queries); the
 * inputs' quantization buffers [n] and their tiles [gtile_count(n)]. Up to OWN_INPUT_ROWS rows, xn, the quantization
 * buffers and the tiles are per thread ([threads][n]): each thread prepares every row's input for itself. */
typedef struct {
    float *x, *xn, *qkv, *att, *gate, *up, *cosv, *sinv, *pout, *pmax, *psum, *scores, *qblock;
    char *quant, *tiles;
    int64_t quant_stride, tile_stride, chunks;
} gg_scratch;

static int64_t gg_layout_scratch(const int64_t *cfg, int64_t n, int64_t capacity, float *base, gg_scratch *out) {
    const int64_t hidden = cfg[GC_HIDDEN], heads = cfg[GC_HEADS], kv = cfg[GC_KV_HEADS], hd = cfg[GC_HEAD_DIM];
    const int64_t inter = cfg[GC_INTER], threads = cfg[GC_THREADS] > 0 ? cfg[GC_THREADS] : 1;
    const int64_t widest = max3((int)hidden, (int)(heads * hd), (int)inter), units = heads + 2 * kv;
    const int64_t chunks = (capacity + SPAN - 1) / SPAN, group = kv > 0 ? heads / kv : 1;
    const int64_t quant_stride = gbuf_stride(widest) / 4; /* floats */
    int64_t at = 0;
    gg_scratch s;
#define TAKE(field, count) (s.field = base ? base + at : NULL, at += (count))
    const int64_t copies = n <= OWN_INPUT_ROWS ? threads : 1; /* of each row's normalized and quantized input */
    TAKE(x, n * hidden);
    TAKE(xn, copies * n * hidden);
    TAKE(qkv, n * units * hd);
    TAKE(att, n * heads * hd);
    TAKE(gate, n * inter);
    TAKE(up, n * inter);
    TAKE(cosv, n * (hd / 2));
    TAKE(sinv, n * (hd / 2));
    const int64_t block_heads = n == 1 ? group : attend_tokens(group, chunks, hd) * group; /* attended at once */
    const int64_t partial_heads = n == 1 ? heads : threads * block_heads; /* partials held at once */
    TAKE(pout, partial_heads * chunks * hd);
    TAKE(pmax, partial_heads * chunks);
    TAKE(psum, partial_heads * chunks);
    TAKE(scores, threads * block_heads * SPAN);
    TAKE(qblock, threads * block_heads * hd);
#undef TAKE
    at = (at + 15) / 16 * 16;
    s.quant = base ? (char *)(base + at) : NULL;
    at += copies * n * quant_stride;
    s.tiles = base ? (char *)(base + at) : NULL; /* the inputs' tiles (gtile_put), as many copies */
    at += copies * gtile_count(n) * (gtile_bytes(widest) / 4);
    s.quant_stride = quant_stride * 4, s.tile_stride = gtile_bytes(widest), s.chunks = chunks;
    if (out) *out = s;
    return at;
}

HEARTH_API int64_t hearth_gg_scratch_floats(const int64_t *cfg, int64_t n, int64_t capacity) {
    return gg_layout_scratch(cfg, n, capacity, NULL, NULL);
}

/* Where each input row's keys and values go: row i of one sequence sits at position pos + i of the layers' own slabs
 * (kv NULL); rows of a batch each have their sequence's slabs (kv[(i * layers + l) * 2 + 0/1]), position and
 * capacity. Every row is computed bit for bit as a one-token step of its sequence is. */
typedef struct {
    void *const *kv;
    const int64_t *positions, *capacities;
    int64_t pos, capacity;
} gg_rows_kv;

static inline int64_t row_pos(const gg_rows_kv *r, int64_t i) { return r->positions ? r->positions[i] : r->pos + i; }
static inline int64_t row_cap(const gg_rows_kv *r, int64_t i) { return r->capacities ? r->capacities[i] : r->capacity; }
static inline char *row_slab(const gg_rows_kv *r, void *const *p, int layers, int l, int64_t i, int is_v) {
    return (char *)(r->kv ? r->kv[(i * layers + l) * 2 + is_v] : p[is_v ? GL_V_CACHE : GL_K_CACHE]);
}

/* Rows shared out by owners and thieves (the GGUF forward's products). Part t of a phase's rows (split_rows' t-th
 * range: one long stream per thread, as static halves were) belongs to thread t, which takes it from the front a
 * chunk of CLAIM_ROWS at a time; a thread whose own part is done takes chunks from the back of another's. So a thread
 * that another program descheduled, or whose memory reads ran slower, leaves the rest of its part to the others
 * instead of keeping them at the barrier, where a thread that waits past its spin sleeps and waking it costs more than
 * the wait. Each part is one 64-bit word, next front chunk in the low half and the end of what is left in the high;
 * every claim is a compare-and-swap on it. A row is still computed whole by one thread, and a row's result depends
 * only on the row and its input, so who takes it never changes a bit. */
#ifndef CLAIM_ROWS
#define CLAIM_ROWS 64
#endif
enum { CLAIM_QKV, CLAIM_O, CLAIM_GATE_UP, CLAIM_DOWN, CLAIM_PHASES };

static inline uint64_t claims_of(int chunks) { return (uint64_t)chunks << 32; }

/* The next chunk of `part` (its front for the owner, its back for a thief), or -1 when none is left. */
static inline int claim_chunk(uint64_t *part, int from_back) {
    uint64_t old = __atomic_load_n(part, __ATOMIC_RELAXED);
    for (;;) {
        const uint32_t front = (uint32_t)old, back = (uint32_t)(old >> 32);
        if (front >= back) return -1;
        const uint64_t next = from_back ? ((uint64_t)(back - 1) << 32) | front : old + 1;
        if (__atomic_compare_exchange_n(part, &old, next, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            return (int)(from_back ? back - 1 : front);
    }
}

/* Rows [*lo, *hi) of a phase's next chunk for thread `tid` of `parts` (its own part first, then the others' from
 * their backs); 0 when every part is taken. `claims` holds the phase's `parts` words, set by claims_start. */
static inline int claim_rows(uint64_t *claims, int rows, int parts, int tid, int *lo, int *hi) {
    for (int k = 0; k < parts; k++) {
        const int part = (tid + k) % parts;
        const int chunk = claim_chunk(claims + part, k > 0);
        if (chunk < 0) continue;
        int p0, p1;
        split_rows(rows, parts, part, X16_ROWS, &p0, &p1);
        *lo = p0 + chunk * CLAIM_ROWS;
        *hi = *lo + CLAIM_ROWS < p1 ? *lo + CLAIM_ROWS : p1;
        return 1;
    }
    return 0;
}

/* A phase of `rows` rows over `parts` threads: each part's chunk count, nothing taken yet. */
static void claims_start(uint64_t *claims, int rows, int parts) {
    for (int part = 0; part < parts; part++) {
        int p0, p1;
        split_rows(rows, parts, part, X16_ROWS, &p0, &p1);
        claims[part] = claims_of((p1 - p0 + CLAIM_ROWS - 1) / CLAIM_ROWS);
    }
}

static int gg_forward(const int64_t *cfg, const float *cfgf, void *const *glob, const int64_t *types,
                      void *const *layers, const int64_t *tokens, int64_t n, const gg_rows_kv *rk, float *logits,
                      int64_t logit_rows, float *scratch, int64_t scratch_floats) {
    const int n_layers = (int)cfg[GC_LAYERS], hidden = (int)cfg[GC_HIDDEN], heads = (int)cfg[GC_HEADS];
    const int kv_heads = (int)cfg[GC_KV_HEADS], hd = (int)cfg[GC_HEAD_DIM], inter = (int)cfg[GC_INTER];
    const int vocab = (int)cfg[GC_VOCAB], kv_bf16 = (int)cfg[GC_KV_BF16], pairs = (int)cfg[GC_ROPE_PAIRS];
    const int embed_type = (int)cfg[GC_EMBED_TYPE], head_type = (int)cfg[GC_HEAD_TYPE], precise = (int)cfg[GC_PRECISE];
    const int threads = cfg[GC_THREADS] > 0 ? (int)cfg[GC_THREADS] : 1;
    const float eps = cfgf[0], attn_scale = cfgf[1];
    const int half = hd / 2, qdim = heads * hd, kvdim = kv_heads * hd, units = heads + 2 * kv_heads;
    const int64_t capacity = rk->capacity; /* the widest slab: the scratch's attention chunks */
    if (n < 1 || logit_rows < 0 || logit_rows > n) return -1;
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= vocab || row_pos(rk, i) < 0 || row_pos(rk, i) >= row_cap(rk, i) ||
            row_cap(rk, i) > capacity)
            return -1;
    if (kv_heads <= 0 || heads % kv_heads || hidden % QBLOCK || qdim % QBLOCK || inter % QBLOCK || hd % 2) return -2;
    const int64_t embed_row = gg_row_bytes(embed_type, hidden), head_row = gg_row_bytes(head_type, hidden);
    if (embed_row < 0 || head_row < 0) return -2;
    for (int64_t i = 0; i < (int64_t)n_layers * GT_COUNT; i++) {
        const int in = (i % GT_COUNT) == GT_O ? qdim : (i % GT_COUNT) == GT_DOWN ? inter : hidden;
        if (gg_row_bytes((int)types[i], in) < 0) return -2;
    }
    if (scratch_floats < hearth_gg_scratch_floats(cfg, n, capacity)) return -3;
    gg_scratch s;
    gg_layout_scratch(cfg, n, capacity, scratch, &s);
    const int group = heads / kv_heads;
    const int64_t chunks_max = s.chunks;
    const float *inv_freq = (const float *)glob[GG_INV_FREQ];
    const int own = n <= OWN_INPUT_ROWS; /* each thread its own copy of every row's input (see gg_layout_scratch) */
    const int64_t copies = own ? threads : 1;
    gvec *inputs = malloc((size_t)(copies * n) * sizeof(gvec));
    int *attended = n == 1 ? calloc((size_t)n_layers * kv_heads, sizeof(int)) : NULL; /* chunks done per kv head */
    /* the products' claims (claim_rows): per layer q/k/v, o, gate/up and down, then the head; a part per thread.
     * q, k and v are one run of rows, each matrix's rows from a multiple of 16 (a chunk of a 16-row layout is whole
     * groups) */
    const int q_span = (qdim + X16_ROWS - 1) / X16_ROWS * X16_ROWS, kv_span = (kvdim + X16_ROWS - 1) / X16_ROWS * X16_ROWS;
    const int qkv_span = q_span + 2 * kv_span;
    uint64_t *claims = malloc((size_t)(n_layers * CLAIM_PHASES + 1) * threads * sizeof(uint64_t));
    if (!inputs || (n == 1 && !attended) || !claims) {
        free(inputs);
        free(attended);
        free(claims);
        return -3;
    }
    for (int l = 0; l < n_layers; l++) {
        uint64_t *c = claims + (int64_t)l * CLAIM_PHASES * threads;
        claims_start(c + CLAIM_QKV * threads, qkv_span, threads);
        claims_start(c + CLAIM_O * threads, hidden, threads);
        claims_start(c + CLAIM_GATE_UP * threads, inter, threads);
        claims_start(c + CLAIM_DOWN * threads, hidden, threads);
    }
    claims_start(claims + (int64_t)n_layers * CLAIM_PHASES * threads, vocab, threads);
    for (int64_t i = 0; i < n; i++) {
        if (gg_is_x16(embed_type)) /* a tied embedding read from the head's 16-row layout */
            x16_dequant_row(embed_type, (const uint8_t *)glob[GG_EMBED], hidden, tokens[i], s.x + i * hidden);
        else
            hearth_gg_dequant(embed_type, (const uint8_t *)glob[GG_EMBED] + tokens[i] * embed_row, hidden,
                              s.x + i * hidden);
        for (int k = 0; k < half; k++) {
            const float angle = (float)row_pos(rk, i) * inv_freq[k];
            s.cosv[i * half + k] = cosf(angle);
            s.sinv[i * half + k] = sinf(angle);
        }
    }

/* A row's input for the next product: with own copies every thread prepares each row for itself (no barrier after),
 * else the rows are shared out and the threads meet before the product. The same operations either way. */
#define EACH_ROW(i, from, body)                                                                                        \
    if (own) {                                                                                                         \
        for (int64_t i = from; i < n; i++) { body }                                                                    \
    } else {                                                                                                           \
        _Pragma("omp for schedule(static)") for (int64_t i = from; i < n; i++) { body }                                \
    }
#pragma omp parallel num_threads(threads)
    {
        int tid, team, lo, hi;
        team_position(&tid, &team);
        float *my_scores = s.scores + (int64_t)tid * group * SPAN;
        float *xn = s.xn + (own ? (int64_t)tid * n * hidden : 0);
        char *quant = s.quant + (own ? (int64_t)tid * n * s.quant_stride : 0);
        char *tiles = gtile_count(n) ? s.tiles + (own ? (int64_t)tid * gtile_count(n) * s.tile_stride : 0) : NULL;
#define TILE_OF(i) (tiles ? tiles + (i) / TILE_SLOTS * s.tile_stride : NULL), (int)((i) % TILE_SLOTS)
        gvec *in = inputs + (own ? (int64_t)tid * n : 0);
        for (int l = 0; l < n_layers; l++) {
            void *const *p = layers + (int64_t)l * GL_COUNT;
            const int64_t *t = types + (int64_t)l * GT_COUNT;
            uint64_t *layer_claims = claims + (int64_t)l * CLAIM_PHASES * threads;
            /* q, k and v read one quantization of the normalized input (a float matrix among them reads xn itself) */
            const int qkv_precise = (precise & PRECISE_QKV) != 0;
            const int qkv_type = !gg_is_float((int)t[GT_Q]) ? (int)t[GT_Q] : !gg_is_float((int)t[GT_K]) ? (int)t[GT_K] : (int)t[GT_V];
            EACH_ROW(i, 0, {
                rmsnorm(s.x + i * hidden, (const float *)p[GL_ATTN_NORM], xn + i * hidden, hidden, eps);
                in[i] = gg_input(xn + i * hidden, hidden, qkv_type, qkv_precise, gbuf_at(quant + i * s.quant_stride, hidden), TILE_OF(i));
            })
            /* q, k and v as one run of rows (q's, then k's, then v's), claimed in chunks, for every token */
            while (claim_rows(layer_claims + CLAIM_QKV * threads, qkv_span, threads, tid, &lo, &hi))
                for (int which = 0; which < 3; which++) {
                    const int kind = (int)t[GT_Q + which], rows = which == 0 ? qdim : kvdim;
                    const int first = which == 0 ? 0 : q_span + (which - 1) * kv_span; /* in the run */
                    const int r0 = lo > first ? lo - first : 0, r1 = hi - first < rows ? hi - first : rows;
                    if (r0 < r1)
                        gg_rows(kind, qkv_precise && !gg_is_float(kind), (const uint8_t *)p[GL_Q + which],
                                gg_row_bytes(kind, hidden), hidden, r0, r1, in, (int)n,
                                s.qkv + (which == 0 ? 0 : which == 1 ? qdim : qdim + kvdim), (int64_t)units * hd,
                                (const float *)p[GL_Q_BIAS + which], 0);
                }
#pragma omp barrier
            /* attention: the same chunks of positions and the same merge in chunk order, however they are shared
             * out (so one token's result never depends on the threads or on the other tokens of the call) */
            const size_t elem = kv_bf16 ? 2 : 4;
            if (n == 1) { /* one token: its (kv head, chunk) units over the threads. Each unit ropes its heads' queries
                           * into a copy; the last chunk's unit ropes the head's key and stores the new K/V row (no
                           * other unit reads that position); whichever unit finishes a head's chunks last merges
                           * them. So a step's attention needs no barrier of its own. */
                const int64_t pos = row_pos(rk, 0), cap = row_cap(rk, 0);
                const int64_t chunks = (pos + 1 + SPAN - 1) / SPAN;
                char *kslab = row_slab(rk, p, n_layers, l, 0, 0), *vslab = row_slab(rk, p, n_layers, l, 0, 1);
                float *my_q = s.qblock + (int64_t)tid * group * hd;
#pragma omp for schedule(dynamic, 1)
                for (int64_t unit = 0; unit < kv_heads * chunks; unit++) {
                    const int64_t c = unit % chunks, g = unit / chunks, t0 = c * SPAN;
                    const int64_t t1 = t0 + SPAN < pos + 1 ? t0 + SPAN : pos + 1;
                    const int64_t slot = g * group * chunks_max + c;
                    memcpy(my_q, s.qkv + g * group * hd, (size_t)group * hd * sizeof(float));
                    for (int j = 0; j < group; j++) rope_head(my_q + (int64_t)j * hd, s.cosv, s.sinv, half, pairs);
                    if (c == chunks - 1) {
                        float *key = s.qkv + (int64_t)(heads + g) * hd, *value = s.qkv + (int64_t)(heads + kv_heads + g) * hd;
                        rope_head(key, s.cosv, s.sinv, half, pairs);
                        store_kv(kslab, kv_bf16, (g * cap + pos) * hd, key, hd);
                        store_kv(vslab, kv_bf16, (g * cap + pos) * hd, value, hd);
                    }
                    attend_chunk(my_q, group, kslab + (size_t)g * cap * hd * elem, vslab + (size_t)g * cap * hd * elem,
                                 kv_bf16, hd, t0, t1, attn_scale, my_scores, s.pmax + slot, s.psum + slot,
                                 s.pout + slot * hd, chunks_max);
                    /* acquire-release: the last one here sees every other unit's partials of this head */
                    if (__atomic_add_fetch(attended + (int64_t)l * kv_heads + g, 1, __ATOMIC_ACQ_REL) == chunks)
                        for (int j = 0; j < group; j++) {
                            const int64_t first = (g * group + j) * chunks_max;
                            attend_merge((int)chunks, s.pmax + first, s.psum + first, s.pout + first * hd, hd,
                                         s.att + (g * group + j) * hd);
                        }
                }
            } else { /* many tokens: RoPE on q and k and K/V into the cache, then each (block of tokens, kv head)
                      * unit on one thread, chunk after chunk, then its merges. A prefill's consecutive tokens go
                      * attend_tokens() at a time: the chunks every one of them sees whole are scored for all their
                      * heads at once (each K row read and widened once for them), the last ones token by token; a
                      * batch's rows (other sequences) go one at a time. Each query head's operations are the same
                      * either way (attend_chunk's are per head), so the same bits. */
#pragma omp for schedule(static)
                for (int64_t unit = 0; unit < n * (heads + 2 * kv_heads); unit++) {
                    const int64_t i = unit / units;
                    const int u = (int)(unit % units);
                    float *out = s.qkv + i * units * hd + (int64_t)u * hd;
                    if (u < heads + kv_heads) rope_head(out, s.cosv + i * half, s.sinv + i * half, half, pairs);
                    if (u >= heads) {
                        const int is_v = u >= heads + kv_heads, head = (u - heads) % kv_heads;
                        store_kv(row_slab(rk, p, n_layers, l, i, is_v), kv_bf16, ((int64_t)head * row_cap(rk, i) + row_pos(rk, i)) * hd,
                                 out, hd);
                    }
                }
                /* a block of tokens per unit, but never so few units that a thread idles: a check of a few rows
                 * over 3 kv heads was 3 units for 2 threads */
                int block = rk->kv ? 1 : (int)attend_tokens(group, chunks_max, hd);
                const int64_t spread = n * kv_heads / (2 * (int64_t)team);
                if (spread < block) block = spread > 1 ? (int)spread : 1;
                const int64_t blocks = (n + block - 1) / block, partials = (int64_t)block * group;
                float *my_max = s.pmax + (int64_t)tid * partials * chunks_max, *my_sum = s.psum + (int64_t)tid * partials * chunks_max;
                float *my_out = s.pout + (int64_t)tid * partials * chunks_max * hd, *my_q = s.qblock + (int64_t)tid * partials * hd;
                float *my_block_scores = s.scores + (int64_t)tid * partials * SPAN;
#pragma omp for schedule(dynamic, 1)
                for (int64_t unit = 0; unit < blocks * kv_heads; unit++) {
                    const int64_t i0 = unit / kv_heads * block, g = unit % kv_heads;
                    const int tokens = n - i0 < block ? (int)(n - i0) : block;
                    const int64_t cap = row_cap(rk, i0), whole = (row_pos(rk, i0) + 1) / SPAN;
                    const char *kslab = row_slab(rk, p, n_layers, l, i0, 0) + (size_t)g * cap * hd * elem;
                    const char *vslab = row_slab(rk, p, n_layers, l, i0, 1) + (size_t)g * cap * hd * elem;
                    for (int tt = 0; tt < tokens; tt++)
                        memcpy(my_q + (int64_t)tt * group * hd, s.qkv + (i0 + tt) * units * hd + g * group * hd,
                               (size_t)group * hd * sizeof(float));
                    for (int64_t c = 0; c < whole; c++) /* every token's chunk c is whole: all their heads at once */
                        attend_chunk(my_q, tokens * group, kslab, vslab, kv_bf16, hd, c * SPAN, c * SPAN + SPAN,
                                     attn_scale, my_block_scores, my_max + c, my_sum + c, my_out + c * hd, chunks_max);
                    for (int tt = 0; tt < tokens; tt++) {
                        const int64_t i = i0 + tt, positions = row_pos(rk, i) + 1, chunks = (positions + SPAN - 1) / SPAN;
                        const int64_t first = (int64_t)tt * group * chunks_max;
                        for (int64_t c = whole; c < chunks; c++) {
                            const int64_t t0 = c * SPAN, t1 = t0 + SPAN < positions ? t0 + SPAN : positions;
                            attend_chunk(my_q + (int64_t)tt * group * hd, group, kslab, vslab, kv_bf16, hd, t0, t1,
                                         attn_scale, my_block_scores, my_max + first + c, my_sum + first + c,
                                         my_out + (first + c) * hd, chunks_max);
                        }
                        for (int j = 0; j < group; j++)
                            attend_merge((int)chunks, my_max + first + (int64_t)j * chunks_max, my_sum + first + (int64_t)j * chunks_max,
                                         my_out + (first + (int64_t)j * chunks_max) * hd, hd, s.att + i * qdim + (g * group + j) * hd);
                    }
                }
            }
            const int o_precise = (precise & PRECISE_O) && !gg_is_float((int)t[GT_O]);
            EACH_ROW(i, 0, { in[i] = gg_input(s.att + i * qdim, qdim, (int)t[GT_O], o_precise, gbuf_at(quant + i * s.quant_stride, qdim), TILE_OF(i)); })
            while (claim_rows(layer_claims + CLAIM_O * threads, hidden, threads, tid, &lo, &hi))
                gg_rows((int)t[GT_O], o_precise, (const uint8_t *)p[GL_O], gg_row_bytes((int)t[GT_O], qdim), qdim, lo,
                        hi, in, (int)n, s.x, hidden, NULL, 1);
#pragma omp barrier
            const int gu_precise = (precise & PRECISE_GATE_UP) != 0;
            const int gu_type = !gg_is_float((int)t[GT_GATE]) ? (int)t[GT_GATE] : (int)t[GT_UP];
            EACH_ROW(i, 0, {
                rmsnorm(s.x + i * hidden, (const float *)p[GL_FFN_NORM], xn + i * hidden, hidden, eps);
                in[i] = gg_input(xn + i * hidden, hidden, gu_type, gu_precise, gbuf_at(quant + i * s.quant_stride, hidden), TILE_OF(i));
            })
            while (claim_rows(layer_claims + CLAIM_GATE_UP * threads, inter, threads, tid, &lo, &hi)) {
                gg_rows((int)t[GT_GATE], gu_precise && !gg_is_float((int)t[GT_GATE]), (const uint8_t *)p[GL_GATE],
                        gg_row_bytes((int)t[GT_GATE], hidden), hidden, lo, hi, in, (int)n, s.gate, inter, NULL, 0);
                gg_rows((int)t[GT_UP], gu_precise && !gg_is_float((int)t[GT_UP]), (const uint8_t *)p[GL_UP],
                        gg_row_bytes((int)t[GT_UP], hidden), hidden, lo, hi, in, (int)n, s.up, inter, NULL, 0);
                for (int64_t i = 0; i < n; i++) silu_times(s.gate + i * inter + lo, s.up + i * inter + lo, hi - lo);
            }
#pragma omp barrier
            const int down_precise = (precise & PRECISE_DOWN) && !gg_is_float((int)t[GT_DOWN]);
            EACH_ROW(i, 0, { in[i] = gg_input(s.gate + i * inter, inter, (int)t[GT_DOWN], down_precise, gbuf_at(quant + i * s.quant_stride, inter), TILE_OF(i)); })
            while (claim_rows(layer_claims + CLAIM_DOWN * threads, hidden, threads, tid, &lo, &hi))
                gg_rows((int)t[GT_DOWN], down_precise, (const uint8_t *)p[GL_DOWN], gg_row_bytes((int)t[GT_DOWN], inter),
                        inter, lo, hi, in, (int)n, s.x, hidden, NULL, 1);
#pragma omp barrier
        }
        if (logit_rows > 0) {
            const int head_precise = (precise & PRECISE_HEAD) && !gg_is_float(head_type);
            const int64_t first = n - logit_rows;
            EACH_ROW(i, first, {
                rmsnorm(s.x + i * hidden, (const float *)glob[GG_FINAL_NORM], xn + i * hidden, hidden, eps);
                in[i] = gg_input(xn + i * hidden, hidden, head_type, head_precise, gbuf_at(quant + i * s.quant_stride, hidden), TILE_OF(i));
            })
            while (claim_rows(claims + (int64_t)n_layers * CLAIM_PHASES * threads, vocab, threads, tid, &lo, &hi))
                gg_rows(head_type, head_precise, (const uint8_t *)glob[GG_HEAD], head_row, hidden, lo, hi, in + first,
                        (int)logit_rows, logits, vocab, NULL, 0);
        }
    }
#undef EACH_ROW
#undef TILE_OF
    free(inputs);
    free(attended);
    free(claims);
    return 0;
}

/* n tokens at positions pos.. of one sequence (the layers' own K/V slabs, `capacity` positions). */
HEARTH_API int hearth_gg_forward(const int64_t *cfg, const float *cfgf, void *const *glob, const int64_t *types,
                      void *const *layers, const int64_t *tokens, int64_t n, int64_t pos, int64_t capacity,
                      float *logits, int64_t logit_rows, float *scratch, int64_t scratch_floats) {
    if (pos < 0 || n < 1 || pos + n > capacity) return -1;
    const gg_rows_kv rk = {NULL, NULL, NULL, pos, capacity};
    return gg_forward(cfg, cfgf, glob, types, layers, tokens, n, &rk, logits, logit_rows, scratch, scratch_floats);
}

/* Rows of several sequences in one forward (a server's batched step: decode tokens and prompt chunks together): row i
 * at positions[i] of its sequence's slabs kv[i][layer][k, v] of capacities[i] positions, every weight block read once
 * for all rows; a sequence's rows may be several (a prompt chunk, its positions consecutive), in any order, as its
 * K/V are all stored before any row attends. The logits of the last logit_rows rows go to logits[0..]. The scratch is
 * sized for the widest slab (hearth_gg_scratch_floats(cfg, n, max capacity)). */
HEARTH_API int hearth_gg_forward_rows(const int64_t *cfg, const float *cfgf, void *const *glob, const int64_t *types,
                           void *const *layers, const int64_t *tokens, int64_t n, void *const *kv,
                           const int64_t *positions, const int64_t *capacities, float *logits, int64_t logit_rows,
                           float *scratch, int64_t scratch_floats) {
    if (n < 1 || !kv || !positions || !capacities) return -1;
    int64_t widest = 0;
    for (int64_t i = 0; i < n; i++) widest = capacities[i] > widest ? capacities[i] : widest;
    const gg_rows_kv rk = {kv, positions, capacities, 0, widest};
    return gg_forward(cfg, cfgf, glob, types, layers, tokens, n, &rk, logits, logit_rows, scratch, scratch_floats);
}
