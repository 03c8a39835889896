/* Drives hearth_step on tiny random Llama models built in memory from fixed seeds, and prints every step's logits
 * as hex floats (exact), so builds for different architectures can be compared bit for bit
 * (tests/core/test_native_arm.py: x86-64 natively, AArch64 with and without DotProd under qemu).
 *
 * Built as one translation unit with the kernel (cc -I app/core/fastpath/native ... harness.c), so it reads the
 * kernel's own enums for the argument slots. Weights are packed as app/core/fastpath/native.py's pack_model packs
 * them: int8 rows with an fp32 scale per row (int8.quantize_rows) or Q4_1 blocks with fp16 (d, m) pairs
 * (native.quantize_q4_blocks). Every input is made with exact float arithmetic (no libm), so all builds see the same
 * bits; only the kernel itself can make outputs differ.
 *
 * Output: "simd S openmp O dotprod D", then per variant and step: "V POS TOKEN" and `vocab` logits in %a, then
 * hearth_gg_matmul on every GGUF block type (print_gguf: "gg ..." lines), then the forward's activation (print_silu).
 * `harness pack` prints one matrix and its two packings instead (the test checks them against native.py's);
 * `harness prefill` one matrix, a few input rows and hearth_q4_prefill's output.
 */
#include "hearth_decode.c"

#include <stdio.h>
#include <stdlib.h>

#ifdef HARNESS_LIBRARY
/* The kernel from the shared library named by HEARTH_HARNESS_LIBRARY (dlopen): the library a run loaded, or a build
 * the tests made, is run as it is, not compiled again into every harness. The kernel source above is then read for
 * its constants; its own functions, compiled for a plain x86-64, go unused. */
#include <dlfcn.h>
#define KERNEL_FUNCTIONS(X)                                                                                            \
    X(hearth_scratch_floats) X(hearth_step) X(hearth_q4_prefill) X(hearth_gg_geometry) X(hearth_gg_x16_bytes)           \
    X(hearth_gg_repack_x16) X(hearth_gg_matmul) X(hearth_simd) X(hearth_openmp) X(hearth_q4_kernel)             \
    X(hearth_silu_times)
#define KERNEL_POINTER(f) static __typeof__(f) *kernel_##f;
KERNEL_FUNCTIONS(KERNEL_POINTER)
#define K(f) kernel_##f
static void load_kernel(void) {
    const char *path = getenv("HEARTH_HARNESS_LIBRARY");
    void *library = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!library) {
        fprintf(stderr, "no kernel library: %s\n", path ? dlerror() : "HEARTH_HARNESS_LIBRARY is not set");
        exit(2);
    }
#define KERNEL_LOOKUP(f)                                                                                              \
    if (!(*(void **)&kernel_##f = dlsym(library, #f))) {                                                               \
        fprintf(stderr, "the kernel library lacks %s\n", #f);                                                          \
        exit(2);                                                                                                       \
    }
    KERNEL_FUNCTIONS(KERNEL_LOOKUP)
}
#else
#define K(f) f
static void load_kernel(void) {}
#endif

static uint64_t rng; /* splitmix64: the same sequence on every architecture */

static uint64_t next_u64(void) {
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1): a 24-bit integer times a power of two, exact in float. */
static float uniform(void) { return (float)(next_u64() >> 40) * (1.0f / 8388608.0f) - 1.0f; }

static void *alloc(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

static float *random_floats(int64_t n, float scale, float offset) {
    float *v = alloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) v[i] = offset + scale * uniform();
    return v;
}

static uint16_t f32_to_f16(float f) { /* round to nearest even, as torch's .to(float16) */
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;  /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00u; /* rounds past 65504: inf */
    if (a < 0x38800000u) {                       /* below 2^-14: a multiple of 2^-24 (exact scaling, RNE) */
        float v;
        memcpy(&v, &a, 4);
        return sign | (uint16_t)nearbyintf(v * 16777216.0f);
    }
    uint32_t h = ((a >> 23) - 112u) << 10 | ((a & 0x7fffffu) >> 13);
    const uint32_t rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++; /* a carry into the exponent is still right */
    return sign | (uint16_t)h;
}

/* int8.quantize_rows: scale = max(max|row|, 1e-8) / 127, q = round(w / scale) clamped to +-127. */
static void pack_int8(const float *w, int rows, int cols, int8_t *q, float *scale) {
    for (int r = 0; r < rows; r++) {
        const float *row = w + (int64_t)r * cols;
        float amax = 0.0f;
        for (int c = 0; c < cols; c++) amax = fmaxf(amax, fabsf(row[c]));
        const float s = fmaxf(amax, 1e-8f) / 127.0f;
        scale[r] = s;
        for (int c = 0; c < cols; c++)
            q[(int64_t)r * cols + c] = (int8_t)fmaxf(-127.0f, fminf(127.0f, nearbyintf(row[c] / s)));
    }
}

/* native.quantize_q4_blocks: per 32 values d = fp16((max - min) / 15), m = fp16(min), q = round((w - m) / d) in
 * 0..15; byte j of a block = q[j] | q[j + 16] << 4; pairs (d, m) per block. */
static void pack_q4(const float *w, int rows, int cols, uint8_t *nibbles, uint16_t *pairs) {
    const int blocks = cols / QBLOCK;
    for (int r = 0; r < rows; r++) {
        for (int b = 0; b < blocks; b++) {
            const float *v = w + (int64_t)r * cols + b * QBLOCK;
            float low = v[0], high = v[0];
            for (int i = 1; i < QBLOCK; i++) low = fminf(low, v[i]), high = fmaxf(high, v[i]);
            const uint16_t d = f32_to_f16((high - low) / 15.0f), m = f32_to_f16(low);
            const float step = half_to_float(d), inverse = step > 0.0f ? 1.0f / step : 0.0f;
            uint8_t q[QBLOCK];
            for (int i = 0; i < QBLOCK; i++)
                q[i] = (uint8_t)fmaxf(0.0f, fminf(15.0f, nearbyintf((v[i] - half_to_float(m)) * inverse)));
            for (int j = 0; j < 16; j++)
                nibbles[(int64_t)r * (cols / 2) + b * 16 + j] = (uint8_t)(q[j] | q[j + 16] << 4);
            pairs[((int64_t)r * blocks + b) * 2] = d;
            pairs[((int64_t)r * blocks + b) * 2 + 1] = m;
        }
    }
}

/* packed.interleave_q4: rows in groups of 16, per group and block one 320-byte record (chunk k = bytes 4k..4k+3 of
 * each of the 16 rows' nibbles, then the 16 d, then the 16 m). */
static void interleave_q4(const uint8_t *nibbles, const uint16_t *pairs, int rows, int cols, uint8_t *records) {
    const int blocks = cols / QBLOCK;
    for (int g = 0; g < rows / GROUP; g++)
        for (int b = 0; b < blocks; b++) {
            uint8_t *rec = records + ((int64_t)g * blocks + b) * RECORD;
            for (int i = 0; i < GROUP; i++) {
                const int64_t r = (int64_t)g * GROUP + i;
                for (int k = 0; k < 4; k++) memcpy(rec + 64 * k + 4 * i, nibbles + r * (cols / 2) + b * 16 + 4 * k, 4);
                memcpy(rec + RECORD_D + 2 * i, pairs + (r * blocks + b) * 2, 2);
                memcpy(rec + RECORD_M + 2 * i, pairs + (r * blocks + b) * 2 + 1, 2);
            }
        }
}

/* packed.interleave_rows: int8 rows in groups of 16 (the last zero-padded), per group and block one 512-byte record
 * (chunk k = bytes 4k..4k+3 of each of the 16 rows). */
static void interleave_rows(const int8_t *q, int rows, int cols, int8_t *records) {
    const int blocks = cols / QBLOCK, groups = (rows + GROUP - 1) / GROUP;
    for (int g = 0; g < groups; g++)
        for (int b = 0; b < blocks; b++) {
            int8_t *rec = records + ((int64_t)g * blocks + b) * LM_RECORD;
            for (int i = 0; i < GROUP; i++) {
                const int64_t r = (int64_t)g * GROUP + i;
                for (int k = 0; k < 8; k++) {
                    if (r < rows) memcpy(rec + 64 * k + 4 * i, q + r * cols + b * QBLOCK + 4 * k, 4);
                    else memset(rec + 64 * k + 4 * i, 0, 4);
                }
            }
        }
}

/* A decoder matrix [rows, cols] in the variant's format, written into the layer's three slots (q, s, b). For Q4_1
 * the gate/up matrix is gate rows then up rows (int8: interleaved); random rows either way. */
static void add_matrix(void **slots, int rows, int cols, int q4, int bias) {
    float *w = random_floats((int64_t)rows * cols, 1.0f / (float)(cols / 16), 0.0f);
    if (q4) {
        uint8_t *nibbles = alloc((size_t)rows * cols / 2);
        uint16_t *pairs = alloc((size_t)rows * (cols / QBLOCK) * 2 * sizeof(uint16_t));
        pack_q4(w, rows, cols, nibbles, pairs);
        slots[0] = alloc((size_t)(rows / GROUP) * (cols / QBLOCK) * RECORD);
        interleave_q4(nibbles, pairs, rows, cols, slots[0]);
        slots[1] = NULL;
        free(nibbles);
        free(pairs);
    } else {
        slots[0] = alloc((size_t)rows * cols);
        slots[1] = alloc((size_t)rows * sizeof(float));
        pack_int8(w, rows, cols, slots[0], slots[1]);
    }
    slots[2] = bias ? random_floats(rows, 0.25f, 0.0f) : NULL;
    free(w);
}

typedef struct {
    int layers, hidden, heads, kv_heads, head_dim, inter, vocab;
    int q4, embed_bf16, kv_bf16, bias, threads;
} variant;

/* Both weight formats, both KV/embedding dtypes, biases (Qwen2-style) or none, 1 and 2 threads, GQA groups of 2 and
 * 4, an odd number of Q4_1 groups per matrix (the single-group tails: hidden 160 is 5 groups per
 * thread, head_dim 48 three per head), and a head_dim (40)
 * that leaves a scalar tail after the 8-wide attention loops (int8: Q4_1 needs whole groups of 16 per head). */
static const variant VARIANTS[] = {
    {2, 128, 4, 2, 32, 256, 258, 1, 0, 0, 0, 2},
    {2, 128, 4, 2, 32, 256, 258, 0, 1, 1, 1, 2},
    {2, 96, 8, 2, 48, 160, 101, 1, 1, 1, 1, 1},
    {2, 160, 5, 1, 32, 96, 77, 1, 0, 1, 0, 2},
    {2, 96, 8, 2, 40, 160, 101, 0, 0, 0, 0, 1},
};
#define CAPACITY 640
static const int64_t POSITIONS[] = {0, 1, 2, 3, 4, 5, 6, 600, 601, 602, 603}; /* both attention paths (> 512) */

static void run(int index, const variant *v) {
    rng = 0x4845415254480000ull + (uint64_t)index; /* "HEARTH" + variant */
    const int hd = v->head_dim, qdim = v->heads * hd, units = v->heads + 2 * v->kv_heads;
    int64_t cfg[C_COUNT] = {0};
    cfg[C_LAYERS] = v->layers, cfg[C_HIDDEN] = v->hidden, cfg[C_HEADS] = v->heads, cfg[C_KV_HEADS] = v->kv_heads;
    cfg[C_HEAD_DIM] = hd, cfg[C_INTER] = v->inter, cfg[C_VOCAB] = v->vocab, cfg[C_EMBED_BF16] = v->embed_bf16;
    cfg[C_KV_BF16] = v->kv_bf16, cfg[C_THREADS] = v->threads, cfg[C_Q4] = v->q4;
    float cfgf[F_COUNT];
    cfgf[F_EPS] = 1e-5f, cfgf[F_ATTN_SCALE] = 1.0f / 8.0f, cfgf[F_ROPE_SCALE] = 1.0f;

    void *glob[G_COUNT];
    float *embed = random_floats((int64_t)v->vocab * v->hidden, 1.0f, 0.0f);
    if (v->embed_bf16) {
        uint16_t *e = alloc((size_t)v->vocab * v->hidden * sizeof(uint16_t));
        for (int64_t i = 0; i < (int64_t)v->vocab * v->hidden; i++) e[i] = f32_to_bf16(embed[i]);
        glob[G_EMBED] = e;
        free(embed);
    } else {
        glob[G_EMBED] = embed;
    }
    glob[G_FINAL_NORM] = random_floats(v->hidden, 0.5f, 1.0f);
    float *head = random_floats((int64_t)v->vocab * v->hidden, 1.0f, 0.0f);
    int8_t *head_rows = alloc((size_t)v->vocab * v->hidden);
    glob[G_LM_S] = alloc((size_t)v->vocab * sizeof(float));
    pack_int8(head, v->vocab, v->hidden, head_rows, glob[G_LM_S]);
    glob[G_LM_Q] = alloc((size_t)(v->vocab + GROUP - 1) / GROUP * (v->hidden / QBLOCK) * LM_RECORD);
    interleave_rows(head_rows, v->vocab, v->hidden, glob[G_LM_Q]);
    free(head_rows);
    free(head);
    float *inv_freq = alloc((size_t)(hd / 2) * sizeof(float));
    for (int i = 0; i < hd / 2; i++) inv_freq[i] = i == 0 ? 1.0f : inv_freq[i - 1] * 0.75f; /* geometric, like RoPE's */
    glob[G_INV_FREQ] = inv_freq;

    void **layers = alloc((size_t)v->layers * L_COUNT * sizeof(void *));
    const size_t elem = v->kv_bf16 ? 2 : 4, cache = (size_t)v->kv_heads * CAPACITY * hd;
    for (int l = 0; l < v->layers; l++) {
        void **p = layers + (int64_t)l * L_COUNT;
        p[L_ATTN_NORM] = random_floats(v->hidden, 0.5f, 1.0f);
        p[L_MLP_NORM] = random_floats(v->hidden, 0.5f, 1.0f);
        add_matrix(p + L_QKV_Q, units * hd, v->hidden, v->q4, v->bias);
        add_matrix(p + L_O_Q, v->hidden, qdim, v->q4, v->bias);
        add_matrix(p + L_GU_Q, 2 * v->inter, v->hidden, v->q4, v->bias);
        add_matrix(p + L_DOWN_Q, v->hidden, v->inter, v->q4, v->bias);
        /* The cache past the first steps holds random K/V, so the long-context steps attend over 600 positions
         * without running 600 steps under an emulator. */
        for (int kv = 0; kv < 2; kv++) {
            float *values = random_floats((int64_t)cache, 1.0f, 0.0f);
            if (v->kv_bf16) {
                uint16_t *c = alloc(cache * elem);
                for (size_t i = 0; i < cache; i++) c[i] = f32_to_bf16(values[i]);
                free(values);
                p[kv ? L_V : L_K] = c;
            } else {
                p[kv ? L_V : L_K] = values;
            }
        }
    }

    float *scratch = alloc((size_t)K(hearth_scratch_floats)(cfg, CAPACITY) * sizeof(float));
    float *logits = alloc((size_t)v->vocab * sizeof(float));
    for (size_t s = 0; s < sizeof POSITIONS / sizeof POSITIONS[0]; s++) {
        const int64_t token = (int64_t)(next_u64() % (uint64_t)v->vocab);
        const int code = K(hearth_step)(cfg, cfgf, glob, (void *const *)layers, token, POSITIONS[s], CAPACITY, logits,
                                     scratch);
        if (code != 0) {
            fprintf(stderr, "variant %d: hearth_step refused position %lld (code %d)\n", index,
                    (long long)POSITIONS[s], code);
            exit(1);
        }
        printf("%d %lld %lld", index, (long long)POSITIONS[s], (long long)token);
        for (int i = 0; i < v->vocab; i++) printf(" %a", logits[i]);
        printf("\n");
    }

    for (int l = 0; l < v->layers; l++)
        for (int f = 0; f < L_COUNT; f++) free(layers[(int64_t)l * L_COUNT + f]);
    free(layers);
    for (int g = 0; g < G_COUNT; g++) free(glob[g]);
    free(scratch);
    free(logits);
}

/* `harness pack`: one matrix's floats and both packings of it, for the test to check against native.py's packers.
 * Row 0 is all zeros (int8's 1e-8 floor), row 1's first block constant (a Q4_1 step of 0). */
static void print_packings(void) {
    enum { ROWS = 32, COLS = 96 };
    rng = 0x5041434b00000000ull; /* "PACK" */
    float *w = random_floats((int64_t)ROWS * COLS, 1.0f / (float)(COLS / 16), 0.0f);
    for (int c = 0; c < COLS; c++) w[c] = 0.0f;
    for (int c = 0; c < QBLOCK; c++) w[COLS + c] = 0.125f;
    int8_t q[ROWS * COLS];
    float scale[ROWS];
    uint8_t nibbles[ROWS * COLS / 2];
    uint16_t pairs[ROWS * (COLS / QBLOCK) * 2];
    uint8_t records[ROWS / GROUP * (COLS / QBLOCK) * RECORD];
    pack_int8(w, ROWS, COLS, q, scale);
    pack_q4(w, ROWS, COLS, nibbles, pairs);
    interleave_q4(nibbles, pairs, ROWS, COLS, records);
    int8_t head_records[ROWS / GROUP * (COLS / QBLOCK) * LM_RECORD];
    interleave_rows(q, ROWS, COLS, head_records);
    printf("shape %d %d\nweights", ROWS, COLS);
    for (int i = 0; i < ROWS * COLS; i++) printf(" %a", w[i]);
    printf("\nint8_q");
    for (int i = 0; i < ROWS * COLS; i++) printf(" %d", q[i]);
    printf("\nint8_s");
    for (int i = 0; i < ROWS; i++) printf(" %a", scale[i]);
    printf("\nq4_nibbles");
    for (int i = 0; i < ROWS * COLS / 2; i++) printf(" %d", nibbles[i]);
    printf("\nq4_pairs");
    for (int i = 0; i < ROWS * (COLS / QBLOCK) * 2; i++) printf(" %d", pairs[i]);
    printf("\nq4_records");
    for (int i = 0; i < (int)sizeof records; i++) printf(" %d", records[i]);
    printf("\nhead_records");
    for (int i = 0; i < (int)sizeof head_records; i++) printf(" %d", head_records[i]);
    printf("\n");
    free(w);
}

/* `harness prefill`: hearth_q4_prefill on one Q4_1 matrix and a few rows of fp32 input (one of them with an outlier
 * that int8 steps would flatten its block around), printing the matrix, the input and the output. */
static void print_prefill(void) {
    enum { ROWS = 48, COLS = 96, N = 7 };
    rng = 0x50524546494c4cull; /* "PREFILL" */
    float *w = random_floats((int64_t)ROWS * COLS, 1.0f / (float)(COLS / 16), 0.0f);
    float *x = random_floats((int64_t)N * COLS, 1.0f, 0.0f);
    x[2 * COLS + 5] = 40.0f;
    uint8_t nibbles[ROWS * COLS / 2];
    uint16_t pairs[ROWS * (COLS / QBLOCK) * 2];
    uint8_t records[ROWS / GROUP * (COLS / QBLOCK) * RECORD];
    pack_q4(w, ROWS, COLS, nibbles, pairs);
    interleave_q4(nibbles, pairs, ROWS, COLS, records);
    float y[N * ROWS];
    const int code = K(hearth_q4_prefill)(records, ROWS, COLS, x, 0, N, y, 0, 2);
    printf("shape %d %d %d\ncode %d\nweights", ROWS, COLS, N, code);
    for (int i = 0; i < ROWS * COLS; i++) printf(" %a", w[i]);
    printf("\nx");
    for (int i = 0; i < N * COLS; i++) printf(" %a", x[i]);
    printf("\ny");
    for (int i = 0; i < N * ROWS; i++) printf(" %a", y[i]);
    printf("\n");
    free(w);
    free(x);
}

/* hearth_gg_matmul on each GGUF block type, in the file's row layout and (where the build has one)
 * the 16-row layout repacked from it, with 8-bit and 15-bit inputs: "gg TYPE PRECISE LAYOUT" and the outputs in %a,
 * or "gg TYPE PRECISE x16 none" where the build has no 16-row layout (Armv8.0 NEON, scalar). Random block bytes with a
 * small finite fp16 d (and m/dmin) per block; inputs exact floats with one outlier channel. */
static void print_gguf(void) {
    enum { ROWS = 32, COLS = 512, N = 5 };
    static const int types[] = {GG_Q4_0, GG_Q4_1, GG_Q5_0, GG_Q5_1, GG_Q8_0, GG_Q4_K, GG_Q5_K, GG_Q6_K};
    rng = 0x4747554600000000ull; /* "GGUF" */
    float *x = random_floats((int64_t)N * COLS, 1.0f, 0.0f);
    for (int k = 0; k < N; k++) x[k * COLS + 5] *= 40.0f;
    for (int t = 0; t < (int)(sizeof types / sizeof types[0]); t++) {
        const int type = types[t];
        int64_t geometry[2];
        K(hearth_gg_geometry)(type, geometry);
        const int64_t blocks = (int64_t)ROWS * (COLS / geometry[0]), bytes = blocks * geometry[1];
        uint8_t *w = alloc((size_t)bytes);
        for (int64_t i = 0; i < bytes; i++) w[i] = (uint8_t)(next_u64() >> 56);
        for (int64_t b = 0; b < blocks; b++) { /* the block's float factors: small and finite */
            uint8_t *blk = w + b * geometry[1];
            const uint16_t d = f32_to_f16(0.002f + 0.001f * uniform()), m = f32_to_f16(0.01f * uniform());
            if (type == GG_Q6_K) {
                memcpy(blk + 208, &d, 2);
            } else {
                memcpy(blk, &d, 2);
                if (type == GG_Q4_1 || type == GG_Q5_1 || type == GG_Q4_K || type == GG_Q5_K) memcpy(blk + 2, &m, 2);
            }
        }
        const int64_t x16_bytes = K(hearth_gg_x16_bytes)(type, ROWS, COLS);
        uint8_t *x16 = x16_bytes > 0 ? alloc((size_t)x16_bytes) : NULL;
        const int x16_type = x16 ? K(hearth_gg_repack_x16)(type, w, ROWS, COLS, x16, 2) : -1;
        float y[N * ROWS];
        for (int precise = 0; precise < 2; precise++)
            for (int layout = 0; layout < 2; layout++) {
                printf("gg %d %d %s", type, precise, layout ? "x16" : "row");
                if (layout && x16_type < 0) {
                    printf(" none\n");
                    continue;
                }
                const int code = K(hearth_gg_matmul)(layout ? x16_type : type, layout ? (const void *)x16 : w, ROWS,
                                                     COLS, x, N, y, NULL, 2, precise);
                if (code != 0) {
                    printf(" error %d\n", code);
                    continue;
                }
                for (int i = 0; i < N * ROWS; i++) printf(" %a", y[i]);
                printf("\n");
            }
        free(w);
        free(x16);
    }
    free(x);
}

/* The GGUF forward's gated activation (hearth_silu_times) on values across its range, the extremes included, a count
 * that leaves a tail after the vector lanes: "silu" and the results. */
static void print_silu(void) {
    enum { COUNT = 61 };
    static const float edges[] = {-100.0f, -88.0f, -87.3f, -20.0f, -0.0f, 0.0f, 1e-8f, 20.0f, 88.0f, 100.0f};
    float g[COUNT], u[COUNT];
    for (int k = 0; k < COUNT; k++) {
        g[k] = k < 10 ? edges[k] : (float)(k - 35) * 0.37f;
        u[k] = 1.0f + (float)k / 128.0f;
    }
    K(hearth_silu_times)(g, u, COUNT);
    printf("silu");
    for (int k = 0; k < COUNT; k++) printf(" %a", g[k]);
    printf("\n");
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "pack") == 0) {
        print_packings();
        return 0;
    }
    load_kernel(); /* "pack" needs none: it prints the harness's own packings */
    if (argc > 1 && strcmp(argv[1], "prefill") == 0) {
        print_prefill();
        return 0;
    }
    printf("simd %d openmp %d dotprod %d q4 %d\n", K(hearth_simd)(), K(hearth_openmp)(), HEARTH_DOTPROD, K(hearth_q4_kernel)());
    for (int i = 0; i < (int)(sizeof VARIANTS / sizeof VARIANTS[0]); i++) run(i, &VARIANTS[i]);
    print_gguf(); /* in the same run: one start of an emulator (qemu, Wine) for all */
    print_silu();
    return 0;
}
