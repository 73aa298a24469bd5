/* Kernels: every SIMD path this CPU runs against the generic C path, on random inputs.
 *
 * kn_matmul, each weight dtype (F32, F16, BF16, F8_E4M3 with several block sizes), odd shapes,
 * n = 1..33 tokens. Tolerance, per
 * output: |y - y_generic| <= (2 * cols * 2^-24 + e) * sum_c |w_c x_c| + 1e-30, the worst-case
 * float32 summation bound of both results, with e = 2^-26 on the AVX-512 BF16 and AMX paths
 * for BF16 weights (activations as three bf16 parts: |x - hi - mid - lo| <= 2^-27 |x|), else 0.
 * AMX column chunks (17440 columns): each token's row equals its single-token product bit for bit;
 * so do outputs over 4 MB (streaming stores), both activation modes, and passes of up to six B
 * tiles (17 to 65 tokens, 49 to 128 with bf16 activations).
 * Shapes include rows >= 16 with cols % 32 == 0 (AMX tiles, with tail rows), n past 16
 * (several token tiles) and, with 4096 and 8192 columns, past one AMX token block (32 and 16
 * tokens). Within a path, each (row, token) result must not depend on n: rows of an
 * n-token product equal single-token products bit for bit, also for one token over a matrix
 * of 2 MiB or more (read row by row, unlike the tiles of several tokens).
 * F8_E4M3: all 256 codes against their definition (subnormals, both NaN codes, signed zero);
 * the generic kernel and kn_mat_row against a double-precision product with the dequantized
 * matrix (2 * cols * 2^-24 + 2^-23 relative: the dequantization rounds once); block sizes
 * 128 x 128 (the released one), 16 x 32 (SIMD tiles) and 5 x 24 (straddled tiles: generic);
 * a NaN code makes its row's outputs NaN on every path and leaves the other rows finite.
 * KN_ACT_BF16 (where the CPU has AVX-512 BF16): within the float32 bound of the product on the
 * activations rounded to bf16, batch independence, F32 weights unchanged.
 * kn_matmul_multi and kn_matmul_jobs equal kn_matmul bit for bit. kn_argmax equals a plain loop's index (ties,
 * NaNs, signed zeros, infinities). kn_dot / kn_axpy: the same bound; kn_dot_rows /
 * kn_axpy_rows equal them bit for bit. SiLU kernels (vectorized exp): 4e-6 relative.
 * Gated DeltaNet: SIMD recurrence vs generic, chunked form vs recurrence (relative tolerance
 * 1e-4 of the output / state scale; observed <= 2e-6), state-only runs and split runs of the
 * recurrence equal the full run bit for bit.
 * kn_attention (causal block after the context with and without a tree mask; blocks with their
 * own keys, causal or not, with a sliding window; GQA groups 1..8, gated or not) within 1e-5 of
 * a double-precision reference, each row bit for bit as when computed alone. The forwards'
 * elementwise ops equal their plain loops bit for bit (threaded or not), the norms within
 * float32 rounding of double. kn_causal_conv_silu against a double convolution, trees against
 * chains; kn_gdn_heads against per-head kn_gdn_recurrent calls bit for bit; kn_moe_route
 * against a double softmax and a plain top-k. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/kernels.h"
#include "kernels/kn_internal.h" /* the generic softmax and the vector expf, as references */
#include "testutil.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 40) * 0x1.0p-23) - 1.0f;
}

static uint16_t to_f16(float f) { /* round to nearest even, normal range only (|f| < 2) */
    union {
        float f;
        uint32_t u;
    } v = {.f = f};
    const uint32_t sign = (v.u >> 16) & 0x8000, a = v.u & 0x7fffffff;
    if (a < 0x38800000) return (uint16_t)sign; /* below the f16 normal range: zero */
    uint32_t m = a - 0x38000000, r = m + 0xfff + ((m >> 13) & 1);
    return (uint16_t)(sign | (r >> 13));
}

/* Block size of the F8_E4M3 matrices make_mat makes. */
static int f8_brow = 128, f8_bcol = 128;

/* float8_e4m3fn from its definition: (-1)^s 2^(e-7) (1 + m/8), subnormal 2^-6 m/8, NaN at
 * e = 15, m = 7. */
static double f8_ref(uint8_t b) {
    const int e = (b >> 3) & 15, m = b & 7;
    const double a = e == 15 && m == 7 ? NAN : e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return b & 0x80 ? -a : a;
}

/* A random rows x cols matrix of the dtype; *store keeps the data (F8_E4M3: random codes but
 * the NaN ones, then the block scales, 2^-10..2^-4). */
static dfl_mat make_mat(st_dtype dt, int rows, int cols, void **store) {
    const size_t ne = (size_t)rows * cols;
    dfl_mat w = {.dtype = dt, .rows = rows, .cols = cols};
    if (dt == ST_F8_E4M3) {
        const size_t nb = (size_t)((rows + f8_brow - 1) / f8_brow) * ((cols + f8_bcol - 1) / f8_bcol);
        const size_t off = (ne + 63) / 64 * 64;
        uint8_t *p = malloc(off + nb * sizeof(float));
        for (size_t i = 0; i < ne; i++) {
            uint8_t b = (uint8_t)((frand() + 1.0f) * 128.0f);
            p[i] = (b & 0x7f) == 0x7f ? b ^ 1 : b;
        }
        float *sc = (float *)(p + off);
        for (size_t i = 0; i < nb; i++) sc[i] = ldexpf(1.0f + 0.5f * frand(), -4 - (int)(i % 7));
        w.scale = sc, w.brow = f8_brow, w.bcol = f8_bcol;
        *store = p;
    } else if (dt == ST_F32) {
        float *p = malloc(ne * sizeof(float) + 1);
        for (size_t i = 0; i < ne; i++) p[i] = frand();
        *store = p;
    } else {
        uint16_t *p = malloc(ne * sizeof(uint16_t) + 1);
        for (size_t i = 0; i < ne; i++) p[i] = dt == ST_BF16 ? st_f32_to_bf16(frand()) : to_f16(frand());
        *store = p;
    }
    w.data = *store;
    return w;
}

static void check_matmul(kn_isa isa, st_dtype dt, int rows, int cols) {
    const int NMAX = 33;
    void *store;
    const dfl_mat w = make_mat(dt, rows, cols, &store);
    float *x = malloc((size_t)NMAX * cols * sizeof(float));
    float *ref = malloc((size_t)NMAX * rows * sizeof(float)), *y = malloc((size_t)NMAX * rows * sizeof(float));
    float *one = malloc((size_t)rows * sizeof(float)), *wr = malloc((size_t)cols * sizeof(float));
    for (size_t i = 0; i < (size_t)NMAX * cols; i++) x[i] = frand() * (i % 7 == 0 ? 8.0f : 1.0f);
    kn_isa_set(KN_ISA_GENERIC);
    kn_matmul(ref, x, &w, NMAX);
    const double e = (isa == KN_ISA_AVX512BF16 || isa == KN_ISA_AMX) && dt == ST_BF16 ? 0x1.0p-26 : 0.0;
    const double rel = 2.0 * cols * 0x1.0p-24 + e;
    int bad = 0, dep = 0;
    double worst = 0;
    kn_isa_set(isa);
    for (int n = 1; n <= NMAX; n++) {
        kn_matmul(y, x, &w, n);
        for (int t = 0; t < n; t++)
            for (int r = 0; r < rows; r++) {
                kn_mat_row(&w, r, wr);
                double mag = 0;
                for (int c = 0; c < cols; c++) mag += fabs((double)wr[c] * x[(size_t)t * cols + c]);
                const double d = fabs((double)y[(size_t)t * rows + r] - ref[(size_t)t * rows + r]);
                if (d > rel * mag + 1e-30) bad++;
                if (mag > 0 && d / mag > worst) worst = d / mag;
            }
        /* batch independence: each row of the n-token product is the single-token product
         * (every token: the last token tile or block is laid out unlike the others) */
        for (int t = 0; t < n; t++) {
            kn_matmul(one, x + (size_t)t * cols, &w, 1);
            if (memcmp(one, y + (size_t)t * rows, (size_t)rows * sizeof(float)) != 0) dep++;
        }
    }
    CHECK(bad == 0, "%s %s %dx%d: %d outputs beyond tolerance (worst relative %.3g, bound %.3g)", kn_isa_name(isa),
          st_dtype_name(dt), rows, cols, bad, worst, rel);
    CHECK(dep == 0, "%s %s %dx%d: %d token rows depend on the batch size", kn_isa_name(isa), st_dtype_name(dt), rows,
          cols, dep);
    free(store), free(x), free(ref), free(y), free(one), free(wr);
}

/* One token over a matrix of 2 MiB or more streams row by row (one row per tile): the same
 * tolerance against generic for that token, and each row of a 2..6-token product (4-row tiles)
 * equal to it bit for bit. */
static void check_matmul_stream(kn_isa isa, st_dtype dt) {
    const int rows = 521, cols = 4127, NMAX = 6; /* F8: 2.15 MB, BF16/F16: 4.3 MB, F32: 8.6 MB */
    void *store;
    const dfl_mat w = make_mat(dt, rows, cols, &store);
    float *x = malloc((size_t)NMAX * cols * sizeof(float)), *ref = malloc((size_t)rows * sizeof(float));
    float *y = malloc((size_t)NMAX * rows * sizeof(float)), *one = malloc((size_t)NMAX * rows * sizeof(float));
    float *wr = malloc((size_t)cols * sizeof(float));
    for (size_t i = 0; i < (size_t)NMAX * cols; i++) x[i] = frand() * (i % 7 == 0 ? 8.0f : 1.0f);
    kn_isa_set(KN_ISA_GENERIC);
    kn_matmul(ref, x, &w, 1);
    kn_isa_set(isa);
    for (int t = 0; t < NMAX; t++) kn_matmul(one + (size_t)t * rows, x + (size_t)t * cols, &w, 1);
    const double e = (isa == KN_ISA_AVX512BF16 || isa == KN_ISA_AMX) && dt == ST_BF16 ? 0x1.0p-26 : 0.0;
    const double rel = 2.0 * cols * 0x1.0p-24 + e;
    int bad = 0, dep = 0;
    for (int r = 0; r < rows; r++) {
        kn_mat_row(&w, r, wr);
        double mag = 0;
        for (int c = 0; c < cols; c++) mag += fabs((double)wr[c] * x[c]);
        if (fabs((double)one[r] - ref[r]) > rel * mag + 1e-30) bad++;
    }
    for (int n = 2; n <= NMAX; n++) {
        kn_matmul(y, x, &w, n);
        if (memcmp(one, y, (size_t)n * rows * sizeof(float)) != 0) dep++;
    }
    CHECK(bad == 0, "%s %s %dx%d, one token: %d outputs beyond tolerance", kn_isa_name(isa), st_dtype_name(dt), rows,
          cols, bad);
    CHECK(dep == 0, "%s %s %dx%d: %d batch sizes differ from single tokens", kn_isa_name(isa), st_dtype_name(dt), rows,
          cols, dep);
    free(store), free(x), free(ref), free(y), free(one), free(wr);
}

/* kn_matmul_multi: each output equals kn_matmul's bit for bit (rows past a multiple of 16, a
 * matrix of another dtype in the group, one matrix large enough that a single token streams it
 * row by row, batches of one and several token tiles and blocks), with float32 activations and,
 * where the CPU has AVX-512 BF16, bf16 ones. */
static void check_matmul_multi(kn_isa isa) {
    enum { COLS = 4096, NMAX = 40, NW = 5 };                          /* 4096 columns: AMX token blocks of 32 tokens */
    static const int rows[NW] = {35, 16, 50, 21, 300};                /* 300 x 4096 BF16: 2.4 MB */
    static const int groups[][3] = {{0, 1, 2}, {1, 2, 3}, {4, 0, 2}}; /* 3: F32 */
    void *store[NW];
    dfl_mat w[NW];
    float *y[NW];
    for (int i = 0; i < NW; i++) {
        w[i] = make_mat(i == 3 ? ST_F32 : ST_BF16, rows[i], COLS, &store[i]);
        y[i] = malloc((size_t)NMAX * rows[i] * sizeof(float));
    }
    float *x = malloc((size_t)NMAX * COLS * sizeof(float)), *ref = malloc((size_t)NMAX * 300 * sizeof(float));
    for (size_t i = 0; i < (size_t)NMAX * COLS; i++) x[i] = frand();
    kn_isa_set(isa);
    static const int ns[] = {1, 3, 6, 17, 40};
    int bad = 0;
    for (int act = 0; act < (kn_isa_supported(KN_ISA_AVX512BF16) ? 2 : 1); act++) {
        kn_act_set(act ? KN_ACT_BF16 : KN_ACT_F32);
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            const int n = ns[k];
            for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
                const int *gi = groups[g];
                const dfl_mat *ws[3] = {&w[gi[0]], &w[gi[1]], &w[gi[2]]};
                kn_matmul_multi(3, (float *[]){y[gi[0]], y[gi[1]], y[gi[2]]}, x, ws, n);
                for (int i = 0; i < 3; i++) {
                    kn_matmul(ref, x, ws[i], n);
                    if (memcmp(ref, y[gi[i]], (size_t)n * ws[i]->rows * sizeof(float)) != 0) bad++;
                }
            }
        }
    }
    kn_act_set(KN_ACT_F32);
    /* F8_E4M3 matrices, one with blocks the tiles take (128 x 128) and one without (5 x 24) */
    void *f8store[2];
    dfl_mat f8w[2];
    for (int i = 0; i < 2; i++) {
        f8_brow = i ? 5 : 128, f8_bcol = i ? 24 : 128;
        f8w[i] = make_mat(ST_F8_E4M3, rows[i], COLS, &f8store[i]);
    }
    f8_brow = f8_bcol = 128;
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        const dfl_mat *ws[2] = {&f8w[0], &f8w[1]};
        kn_matmul_multi(2, (float *[]){y[0], y[1]}, x, ws, ns[k]);
        for (int i = 0; i < 2; i++) {
            kn_matmul(ref, x, ws[i], ns[k]);
            if (memcmp(ref, y[i], (size_t)ns[k] * ws[i]->rows * sizeof(float)) != 0) bad++;
        }
    }
    for (int i = 0; i < 2; i++) free(f8store[i]);
    CHECK(bad == 0, "%s: %d kn_matmul_multi outputs differ from kn_matmul", kn_isa_name(isa), bad);
    for (int i = 0; i < NW; i++) free(store[i]), free(y[i]);
    free(x), free(ref);
}

/* kn_matmul_jobs: each output equals kn_matmul's bit for bit, for a list like a mixture of
 * experts' (pairs of products sharing an input, inputs at different rows of one buffer, batches
 * of 0, 1 and several token tiles, more products than one stack list holds), with a matrix of
 * another dtype inside the list, one that a single token streams row by row, F8_E4M3 products
 * with and without tile blocks, float32 and (where the CPU has AVX-512 BF16) bf16 activations,
 * and 1 to 3 threads. */
static void check_matmul_jobs(kn_isa isa) {
    enum { COLS = 320, NJ = 44, XR = 64 };
    static const int ns[] = {1, 1, 0, 3, 1, 7, 2, 17, 1, 5, 6, 13};
    void *store[NJ];
    dfl_mat w[NJ];
    kn_mm_job j[NJ];
    float *x = malloc((size_t)XR * COLS * sizeof(float)), *ref = malloc((size_t)17 * 3300 * sizeof(float));
    for (size_t i = 0; i < (size_t)XR * COLS; i++) x[i] = frand();
    for (int i = 0; i < NJ; i++) {
        const int f8 = i >= NJ - 4, rows = i == 9 ? 3300 : 16 + 5 * (i % 13); /* 3300 x 320 BF16: 2.1 MB */
        if (f8) f8_brow = i % 2 ? 5 : 16, f8_bcol = i % 2 ? 24 : 32;
        w[i] = make_mat(f8 ? ST_F8_E4M3 : i == 20 ? ST_F32 : ST_BF16, rows, COLS, &store[i]);
        const int n = i == 9 ? 1 : ns[(i / 2) % 12], r0 = (i / 2 * 7) % (XR - 17); /* pairs share x and n */
        j[i] = (kn_mm_job){malloc((size_t)(n ? n : 1) * rows * sizeof(float)), x + (size_t)r0 * COLS, &w[i], n};
    }
    f8_brow = f8_bcol = 128;
    kn_isa_set(isa);
    int bad = 0;
    const int threads = omp_get_max_threads();
    for (int act = 0; act < (kn_isa_supported(KN_ISA_AVX512BF16) ? 2 : 1); act++) {
        kn_act_set(act ? KN_ACT_BF16 : KN_ACT_F32);
        for (int th = 1; th <= 3; th++) {
            omp_set_num_threads(th);
            for (int part = 0; part < 2; part++) { /* the whole list, and its F8 tail alone */
                const int first = part ? NJ - 4 : 0;
                kn_matmul_jobs(NJ - first, j + first);
                for (int i = first; i < NJ; i++) {
                    kn_matmul(ref, j[i].x, j[i].w, j[i].n);
                    if (memcmp(ref, j[i].y, (size_t)j[i].n * w[i].rows * sizeof(float)) != 0) bad++;
                }
            }
        }
    }
    omp_set_num_threads(threads);
    kn_act_set(KN_ACT_F32);
    CHECK(bad == 0, "%s: %d kn_matmul_jobs outputs differ from kn_matmul", kn_isa_name(isa), bad);
    for (int i = 0; i < NJ; i++) free(store[i]), free(j[i].y);
    free(x), free(ref);
}

/* AMX column chunks: blocks whose packed activations outgrow L2 run in chunks of the columns,
 * continuing each C tile's chain: 16-token groups of 17440 columns (single row tiles), four and
 * five B tiles in one pass (17 and 24 tokens in one block, as weights of 32 MiB or more take),
 * longer blocks (33 and more tokens: row-tile pairs; 140 tokens: a block of 128 and one of 12);
 * every token's row equals its single-token product (one unchunked tile) bit for bit, and stays
 * within the float32 bound of the generic kernel's. */
static void check_amx_chunks_of(int cols, const int *ns, int nn) {
    enum { ROWS = 300 }; /* 18 row tiles in groups, 12 tail rows */
    const int N = ns[nn - 1];
    void *store;
    const dfl_mat w = make_mat(ST_BF16, ROWS, cols, &store);
    float *x = malloc((size_t)N * cols * sizeof(float)), *wr = malloc((size_t)cols * sizeof(float));
    float *ref = malloc((size_t)N * ROWS * sizeof(float)), *y = malloc((size_t)N * ROWS * sizeof(float));
    float *one = malloc((size_t)ROWS * sizeof(float));
    for (size_t i = 0; i < (size_t)N * cols; i++) x[i] = frand();
    kn_isa_set(KN_ISA_GENERIC);
    kn_matmul(ref, x, &w, N);
    kn_isa_set(KN_ISA_AMX);
    int dep = 0, bad = 0;
    for (int k = 0; k < nn; k++) {
        kn_matmul(y, x, &w, ns[k]);
        for (int t = 0; t < ns[k]; t++) {
            kn_matmul(one, x + (size_t)t * cols, &w, 1);
            if (memcmp(one, y + (size_t)t * ROWS, ROWS * sizeof(float)) != 0) dep++;
        }
    }
    const double rel = 2.0 * cols * 0x1.0p-24 + 0x1.0p-26;
    for (int r = 0; r < ROWS; r++) { /* y holds the N-token product */
        kn_mat_row(&w, r, wr);
        for (int t = 0; t < N; t++) {
            double mag = 0;
            for (int c = 0; c < cols; c++) mag += fabs((double)wr[c] * x[(size_t)t * cols + c]);
            if (fabs((double)y[(size_t)t * ROWS + r] - ref[(size_t)t * ROWS + r]) > rel * mag + 1e-30) bad++;
        }
    }
    CHECK(dep == 0, "amx column chunks (%d columns): %d token rows differ from the single-token product", cols, dep);
    CHECK(bad == 0, "amx column chunks (%d columns): %d outputs beyond the float32 bound", cols, bad);
    free(store), free(x), free(wr), free(ref), free(y), free(one);
}

/* dfl_alloc, which the logits' buffers come from: whole cache lines from the first byte (a
 * malloc'd block of megabytes starts 16 bytes into a page, so its rows were stored line by line
 * with a read of each line first, not streamed), any size, 0 included. */
static void check_alloc(void) {
    static const size_t sizes[] = {0, 1, 63, 65, 4096 + 16, (size_t)120 * 248320 * sizeof(float) + 4};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        unsigned char *p = dfl_alloc(sizes[i]);
        CHECK(p && (uintptr_t)p % 64 == 0, "dfl_alloc(%zu): %p, expected a cache-line-aligned block", sizes[i],
              (void *)p);
        if (p && sizes[i]) p[0] = 1, p[sizes[i] - 1] = 2; /* the whole size is there */
        free(p);
    }
}

/* The C tiles of 16-token groups combine transposed in registers (with bf16 activations, one part
 * per activation, token t is virtual column t in either layout, so every block does), with
 * streaming stores once the output passes 4 MB (a verification's lm_head). Every token row equals
 * its single-token product bit for bit: 16, 20, 32 and 40 tokens (float32: planar with and
 * without an interleaved tail; bf16: one B tile, two, planar) of a matrix of 65552 rows (aligned
 * rows: streamed) and of 65550 (12 tail rows: stored). */
static void check_amx_combine(void) {
    enum { COLS = 64 };
    static const int ns[] = {16, 20, 32, 40}, rows_of[] = {65552, 65550};
    float *x = malloc((size_t)40 * COLS * sizeof(float));
    for (size_t i = 0; i < (size_t)40 * COLS; i++) x[i] = frand();
    for (int act = 0; act < (kn_isa_supported(KN_ISA_AVX512BF16) ? 2 : 1); act++) {
        kn_act_set(act ? KN_ACT_BF16 : KN_ACT_F32);
        for (int v = 0; v < 2; v++) {
            const int rows = rows_of[v];
            void *store;
            const dfl_mat w = make_mat(ST_BF16, rows, COLS, &store);
            float *y = dfl_alloc((size_t)40 * rows * sizeof(float)), /* as the logits' buffers */
                *one = malloc((size_t)rows * sizeof(float));
            int dep = 0;
            for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
                kn_matmul(y, x, &w, ns[k]);
                for (int t = 0; t < ns[k]; t++) {
                    kn_matmul(one, x + (size_t)t * COLS, &w, 1);
                    if (memcmp(one, y + (size_t)t * rows, (size_t)rows * sizeof(float)) != 0) dep++;
                }
            }
            CHECK(dep == 0, "amx combine (%s activations, %d rows): %d token rows differ from the single-token product",
                  act ? "bf16" : "f32", rows, dep);
            free(store), free(y), free(one);
        }
    }
    kn_act_set(KN_ACT_F32);
    free(x);
}

/* The op profile: each outermost kernel call counts once under its kind (kn_matmul_multi, which
 * calls kn_matmul_jobs or the AMX kernel inside, once), products add their weight bytes,
 * kn_prof_matmul_as moves products to lm_head, calls from inside a parallel region and calls
 * while stopped are not counted, and kn_prof_start zeroes the counts; on the generic path and
 * the default one. */
static void check_prof(kn_isa isa) {
    kn_isa_set(isa); /* generic: kn_matmul_multi runs kn_matmul_jobs inside */
    void *s1, *s2;
    const dfl_mat a = make_mat(ST_BF16, 48, 64, &s1), b = make_mat(ST_F32, 20, 64, &s2);
    float x[2 * 64], y1[2 * 48], y2[2 * 20];
    for (int i = 0; i < 2 * 64; i++) x[i] = frand();
    kn_prof_start();
    kn_matmul(y1, x, &a, 2);
    kn_matmul_multi(2, (float *[]){y1, y2}, x, (const dfl_mat *[]){&a, &b}, 2);
    const kn_op old = kn_prof_matmul_as(KN_OP_LM_HEAD);
    kn_matmul(y2, x, &b, 1);
    kn_prof_matmul_as(old);
    kn_add(y1, y1, 48);
    kn_rmsnorm_rows(y1, y1, x, 2, 48, 1e-6f);
    (void)kn_argmax(y1, 48);
#pragma omp parallel num_threads(2)
    kn_add(y2, y2, 20); /* inside a region: not counted */
    kn_prof q;
    kn_prof_stop(&q);
    kn_matmul(y1, x, &a, 1); /* stopped: not counted */
    kn_prof q2;
    kn_prof_stop(&q2);
    const uint64_t ab = 48 * 64 * 2, bb = 20 * 64 * 4;
    CHECK(q.calls[KN_OP_MATMUL] == 2 && q.calls[KN_OP_LM_HEAD] == 1 && q.calls[KN_OP_ELEMENT] == 2 &&
              q.calls[KN_OP_LOGITS] == 1 && q.calls[KN_OP_ATTENTION] == 0 && q.calls[KN_OP_RECURRENCE] == 0,
          "profile calls: matmul %ld lm_head %ld element %ld logits %ld", q.calls[KN_OP_MATMUL], q.calls[KN_OP_LM_HEAD],
          q.calls[KN_OP_ELEMENT], q.calls[KN_OP_LOGITS]);
    CHECK(q.matmul_bytes == 2 * ab + 2 * bb, "profile bytes %llu, expected %llu", (unsigned long long)q.matmul_bytes,
          (unsigned long long)(2 * ab + 2 * bb));
    CHECK(q.seconds[KN_OP_MATMUL] > 0 && q.seconds[KN_OP_LM_HEAD] > 0 && q.seconds[KN_OP_CONV] == 0,
          "profile seconds: matmul %g lm_head %g conv %g", q.seconds[KN_OP_MATMUL], q.seconds[KN_OP_LM_HEAD],
          q.seconds[KN_OP_CONV]);
    CHECK(q2.calls[KN_OP_MATMUL] == 2, "calls after stop counted: %ld", q2.calls[KN_OP_MATMUL]);
    kn_prof_start();
    kn_prof_stop(&q);
    CHECK(q.calls[KN_OP_MATMUL] == 0 && q.matmul_bytes == 0, "kn_prof_start zeroes the counts");
    CHECK(strcmp(kn_op_key(KN_OP_RECURRENCE), "recurrence") == 0 && strcmp(kn_op_name(KN_OP_COUNT), "?") == 0,
          "kn_op names");
    free(s1), free(s2);
    kn_isa_set(kn_isa_default());
}

/* AMX passes of up to six B tiles per row tile (float32: 17, 26, 27 tokens in one pass of 4, 5,
 * 6 tiles, 33, 46 and 65 in several; bf16 activations: 49, 65, 96 in one, 113 and 128 in two),
 * with the next row tile prefetched
 * (2 KB rows) and not (4 KB rows of weights counted as streaming, kn_amx_wide_min): every token's
 * row equals its single-token product bit for bit and stays within the float32 bound of the
 * generic kernel's on the same (for bf16: rounded) activations. */
static void check_amx_passes(void) {
    enum { ROWS = 300, N = 128, NN = 6 }; /* 18 row tiles, 12 tail rows */
    static const int ns[2][NN] = {{17, 26, 27, 33, 46, 65}, {49, 65, 80, 96, 113, 128}};
    float *x = malloc((size_t)N * 2048 * sizeof(float)), *xr = malloc((size_t)N * 2048 * sizeof(float));
    float *ref = malloc((size_t)N * ROWS * sizeof(float)), *y = malloc((size_t)N * ROWS * sizeof(float));
    float *one = malloc((size_t)ROWS * sizeof(float)), *wr = malloc((size_t)2048 * sizeof(float));
    for (int v = 0; v < 2; v++) {
        const int cols = v ? 2048 : 1024;
        const size_t old = kn_amx_wide_min(1); /* as streaming weights: 4 KB rows prefetch nothing */
        if (!v) kn_amx_wide_min(old);
        void *store;
        const dfl_mat w = make_mat(ST_BF16, ROWS, cols, &store);
        for (int act = 0; act < (kn_isa_supported(KN_ISA_AVX512BF16) ? 2 : 1); act++) {
            for (size_t i = 0; i < (size_t)N * cols; i++) {
                x[i] = frand();
                xr[i] = act ? st_bf16_to_f32(st_f32_to_bf16(x[i])) : x[i];
            }
            kn_act_set(KN_ACT_F32);
            kn_isa_set(KN_ISA_GENERIC);
            kn_matmul(ref, xr, &w, N);
            kn_isa_set(KN_ISA_AMX);
            kn_act_set(act ? KN_ACT_BF16 : KN_ACT_F32);
            const double rel = 2.0 * cols * 0x1.0p-24 + (act ? 0 : 0x1.0p-26);
            int dep = 0, bad = 0;
            for (int k = 0; k < NN; k++) {
                const int n = ns[act][k];
                kn_matmul(y, x, &w, n);
                for (int t = 0; t < n; t++) {
                    kn_matmul(one, x + (size_t)t * cols, &w, 1);
                    if (memcmp(one, y + (size_t)t * ROWS, ROWS * sizeof(float)) != 0) dep++;
                    for (int r = 0; r < ROWS; r++) {
                        kn_mat_row(&w, r, wr);
                        double mag = 0;
                        for (int c = 0; c < cols; c++) mag += fabs((double)wr[c] * xr[(size_t)t * cols + c]);
                        if (fabs((double)y[(size_t)t * ROWS + r] - ref[(size_t)t * ROWS + r]) > rel * mag + 1e-30)
                            bad++;
                    }
                }
            }
            CHECK(dep == 0, "amx passes (%d columns, act %d): %d token rows differ from the single-token product", cols,
                  act, dep);
            CHECK(bad == 0, "amx passes (%d columns, act %d): %d outputs beyond the float32 bound", cols, act, bad);
        }
        kn_act_set(KN_ACT_F32);
        kn_amx_wide_min(old);
        free(store);
    }
    kn_isa_set(kn_isa_default());
    free(x), free(xr), free(ref), free(y), free(one), free(wr);
}

static void check_amx_chunks(void) {
    static const int wide[] = {11, 16, 17, 24, 33, 40}, lm[] = {33, 100, 140};
    check_amx_chunks_of(17440, wide, 6);   /* 10 MB of weights: blocks of 16 tokens */
    const size_t old = kn_amx_wide_min(1); /* these small matrices as a 27B's: 128-token blocks */
    check_amx_chunks_of(17440, wide, 6);   /* 17 and 24 tokens: four and five B tiles in chunks */
    check_amx_chunks_of(5120, lm, 3);
    kn_amx_wide_min(old);
}

static void check_f8_codes(void) {
    int bad = 0;
    for (int b = 0; b < 256; b++) {
        const float got = st_f8e4m3_to_f32((uint8_t)b);
        const double want = f8_ref((uint8_t)b);
        if (isnan(want) ? !isnan(got) : (got != want || !signbit(got) != !signbit(want))) bad++;
    }
    CHECK(bad == 0, "F8_E4M3: %d of 256 codes convert wrongly", bad);
    CHECK(st_f8e4m3_to_f32(0x01) == 0x1p-9f && st_f8e4m3_to_f32(0x7e) == 448.0f && st_f8e4m3_to_f32(0x08) == 0x1p-6f,
          "F8_E4M3: smallest subnormal, largest finite, smallest normal");
}

/* The generic F8_E4M3 kernel and kn_mat_row against a double product with the dequantized
 * matrix. */
static void check_f8_generic(int rows, int cols) {
    const int n = 3;
    void *store;
    const dfl_mat w = make_mat(ST_F8_E4M3, rows, cols, &store);
    float *x = malloc((size_t)n * cols * sizeof(float)), *y = malloc((size_t)n * rows * sizeof(float));
    float *wr = malloc((size_t)cols * sizeof(float));
    for (size_t i = 0; i < (size_t)n * cols; i++) x[i] = frand();
    kn_isa_set(KN_ISA_GENERIC);
    kn_matmul(y, x, &w, n);
    int bad = 0, bad_row = 0;
    const double rel = 2.0 * cols * 0x1.0p-24 + 0x1.0p-23;
    for (int r = 0; r < rows; r++) {
        kn_mat_row(&w, r, wr);
        for (int c = 0; c < cols; c++) {
            const double deq = f8_ref(((const uint8_t *)w.data)[(size_t)r * cols + c]) *
                               w.scale[(size_t)(r / w.brow) * ((cols + w.bcol - 1) / w.bcol) + c / w.bcol];
            if (fabs(wr[c] - deq) > 0x1.0p-24 * fabs(deq)) bad_row++;
        }
        for (int t = 0; t < n; t++) {
            double ref = 0, mag = 0;
            for (int c = 0; c < cols; c++) {
                const double p = (double)wr[c] * x[(size_t)t * cols + c];
                ref += p, mag += fabs(p);
            }
            if (fabs(y[(size_t)t * rows + r] - ref) > rel * mag + 1e-30) bad++;
        }
    }
    CHECK(bad_row == 0 && bad == 0, "F8_E4M3 generic %dx%d block %dx%d: %d row values, %d outputs off the reference",
          rows, cols, w.brow, w.bcol, bad_row, bad);
    free(store), free(x), free(y), free(wr);
}

/* NaN codes: the rows holding one give NaN, the other rows stay finite. */
static void check_f8_nan(kn_isa isa) {
    enum { ROWS = 9, COLS = 300, N = 2 };
    void *store;
    dfl_mat w = make_mat(ST_F8_E4M3, ROWS, COLS, &store);
    uint8_t *codes = store;
    codes[2 * COLS + 7] = 0x7f, codes[5 * COLS + 299] = 0xff, codes[8 * COLS + 130] = 0x7f;
    float x[N * COLS], y[N * ROWS];
    for (int i = 0; i < N * COLS; i++) x[i] = frand();
    kn_isa_set(isa);
    kn_matmul(y, x, &w, N);
    int bad = 0;
    for (int t = 0; t < N; t++)
        for (int r = 0; r < ROWS; r++) bad += !!isnan(y[t * ROWS + r]) != (r == 2 || r == 5 || r == 8);
    CHECK(bad == 0, "%s: F8_E4M3 NaN codes: %d outputs wrong (NaN expected exactly in rows 2, 5, 8)", kn_isa_name(isa),
          bad);
    free(store);
}

static void check_dot_axpy(kn_isa isa) {
    float a[80], b[80], y0[80], y1[80];
    int bad = 0;
    for (int n = 0; n <= 80; n++) {
        double mag = 0;
        for (int i = 0; i < n; i++) {
            a[i] = frand(), b[i] = frand(), y0[i] = y1[i] = frand();
            mag += fabs((double)a[i] * b[i]);
        }
        const float c = frand();
        kn_isa_set(KN_ISA_GENERIC);
        const float d0 = kn_dot(a, b, n);
        kn_axpy(y0, c, a, n);
        kn_isa_set(isa);
        const float d1 = kn_dot(a, b, n);
        kn_axpy(y1, c, a, n);
        if (fabs((double)d1 - d0) > 2.0 * (n + 1) * 0x1.0p-24 * mag + 1e-30) bad++;
        for (int i = 0; i < n; i++)
            if (fabs((double)y1[i] - y0[i]) > 0x1.0p-22 * (fabs((double)c * a[i]) + fabs((double)y0[i]))) bad++;
    }
    CHECK(bad == 0, "%s: %d kn_dot / kn_axpy results beyond tolerance", kn_isa_name(isa), bad);
    /* the row forms equal the single calls bit for bit, for groups of 1..7 query rows (zero
     * weights skipped, for one row or all of them; any width) */
    enum { M = 37, LD = 300, GM = 7 };
    static float rows[M * LD], w[GM][M], out[GM][M], yr[GM][LD], ys[GM][LD];
    for (int i = 0; i < M * LD; i++) rows[i] = frand();
    int diff = 0;
    kn_isa_set(isa);
    for (int G = 1; G <= GM; G++)
        for (int n = 1; n <= 290; n += n < 40 ? 1 : 23) {
            for (int g = 0; g < G; g++)
                for (int j = 0; j < M; j++) w[g][j] = j % 5 == 2 || (j + g) % 7 == 3 ? 0.0f : frand();
            for (int g = 0; g < G; g++)
                for (int i = 0; i < n; i++) yr[g][i] = ys[g][i] = frand();
            kn_dot_rows(out[0], M, rows + 3, 41, G, rows + 7, LD, M, n);
            kn_axpy_rows(yr[0], LD, w[0], M, G, rows + 1, LD, M, n);
            for (int g = 0; g < G; g++) {
                for (int j = 0; j < M; j++) {
                    diff += out[g][j] != kn_dot(rows + 3 + 41 * g, rows + 7 + (size_t)j * LD, n);
                    if (w[g][j] != 0.0f) kn_axpy(ys[g], w[g][j], rows + 1 + (size_t)j * LD, n);
                }
                diff += memcmp(yr[g], ys[g], (size_t)n * sizeof(float)) != 0;
            }
        }
    CHECK(diff == 0, "%s: %d kn_dot_rows / kn_axpy_rows results differ from kn_dot / kn_axpy", kn_isa_name(isa), diff);
}

/* SiLU kernels: within 4e-6 relative of the generic (libm expf) result, and each element's
 * value independent of the array around it (lengths and offsets vary, tails included). */
static void check_silu(kn_isa isa) {
    enum { N = 203 };
    float x[N], b[N], ref[N], ref2[N], y[N], y2[N];
    for (int i = 0; i < N; i++) x[i] = (i % 11 == 0 ? 120.0f : 12.0f) * frand(), b[i] = frand();
    kn_isa_set(KN_ISA_GENERIC);
    memcpy(ref, x, sizeof x);
    kn_silu_inplace(ref, N);
    memcpy(ref2, x, sizeof x);
    kn_swiglu(ref2, b, N);
    kn_isa_set(isa);
    memcpy(y, x, sizeof x);
    kn_silu_inplace(y, N);
    memcpy(y2, x, sizeof x);
    kn_swiglu(y2, b, N);
    int bad = 0, moved = 0;
    for (int i = 0; i < N; i++) {
        bad += fabs((double)y[i] - ref[i]) > 4e-6 * fabs(ref[i]) + 1e-30;
        bad += fabs((double)y2[i] - ref2[i]) > 4e-6 * fabs(ref2[i]) + 1e-30;
    }
    for (int off = 1; off < 40; off += 7) {
        float z[N];
        memcpy(z, x, sizeof x);
        kn_silu_inplace(z + off, N - 2 * off);
        for (int i = off; i < N - off; i++) moved += memcmp(&z[i], &y[i], sizeof(float)) != 0;
    }
    CHECK(bad == 0, "%s: %d SiLU results beyond tolerance", kn_isa_name(isa), bad);
    CHECK(moved == 0, "%s: %d SiLU results depend on the array around them", kn_isa_name(isa), moved);
}

/* Causal conv + SiLU: within 1e-5 of the generic result (FMAs vs separate products, the
 * vectorized exp), the window carried out exactly (the last inputs), and n tokens in one call
 * bit-identical to n calls of one token (a tree node runs alone what a chain runs in a row). */
static void check_conv_silu(kn_isa isa, int n, int nc, int K) {
    enum { LD = 21, NMAX = 40 };
    float x[NMAX * LD], ref[NMAX * LD], one[NMAX * LD], wt[16][16], w0[15][16];
    float win_ref[15][16], win[15][16], win_one[15][16];
    for (int i = 0; i < n * LD; i++) x[i] = 4.0f * frand();
    for (int j = 0; j < 16; j++)
        for (int i = 0; i < 16; i++) wt[j][i] = frand();
    for (int j = 0; j < 15; j++)
        for (int i = 0; i < 16; i++) w0[j][i] = 4.0f * frand();
    kn_isa_set(KN_ISA_GENERIC);
    memcpy(ref, x, sizeof x), memcpy(win_ref, w0, sizeof w0);
    kn_conv_silu(ref + 2, LD, n, nc, K, wt[0], win_ref[0]);
    kn_isa_set(isa);
    memcpy(one, x, sizeof x), memcpy(win_one, w0, sizeof w0), memcpy(win, w0, sizeof w0);
    kn_conv_silu(x + 2, LD, n, nc, K, wt[0], win[0]);
    for (int t = 0; t < n; t++) kn_conv_silu(one + 2 + t * LD, LD, 1, nc, K, wt[0], win_one[0]);
    int bad = 0, moved = 0, wbad = 0, outside = 0;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < LD; i++) {
            const float r = ref[t * LD + i], y = x[t * LD + i];
            if (i < 2 || i >= 2 + nc) outside += memcmp(&y, &one[t * LD + i], sizeof y) != 0 || y != ref[t * LD + i];
            else bad += fabs((double)y - r) > 1e-5 * (fabs(r) + 1.0);
            moved += memcmp(&y, &one[t * LD + i], sizeof y) != 0;
        }
    for (int j = 0; j < K - 1; j++)
        for (int i = 0; i < nc; i++) wbad += win[j][i] != win_ref[j][i] || win_one[j][i] != win[j][i];
    CHECK(bad == 0, "%s conv n=%d nc=%d K=%d: %d results beyond tolerance", kn_isa_name(isa), n, nc, K, bad);
    CHECK(moved == 0, "%s conv n=%d nc=%d K=%d: %d results differ between one call and token by token",
          kn_isa_name(isa), n, nc, K, moved);
    CHECK(outside == 0, "%s conv nc=%d: %d values outside the channels changed", kn_isa_name(isa), nc, outside);
    CHECK(wbad == 0, "%s conv n=%d nc=%d K=%d: %d window values wrong", kn_isa_name(isa), n, nc, K, wbad);
}

/* Gated DeltaNet inputs for n tokens of one head, rows of ld floats [q | k | v]. */
typedef struct gdn_case {
    int dk, dv, n;
    size_t ld;
    float *rows, *g, *beta, *S0;
} gdn_case;

static gdn_case gdn_make(int dk, int dv, int n) {
    gdn_case c = {.dk = dk, .dv = dv, .n = n, .ld = (size_t)2 * dk + dv + 3};
    c.rows = malloc((size_t)n * c.ld * sizeof(float));
    c.g = malloc((size_t)n * sizeof(float));
    c.beta = malloc((size_t)n * sizeof(float));
    c.S0 = malloc((size_t)dk * dv * sizeof(float));
    for (int t = 0; t < n; t++) {
        float *q = c.rows + (size_t)t * c.ld, *k = q + dk, *v = k + dk;
        double sq = 0, sk = 0;
        for (int i = 0; i < dk; i++) q[i] = frand(), k[i] = frand(), sq += q[i] * q[i], sk += k[i] * k[i];
        for (int i = 0; i < dk; i++) q[i] = (float)(q[i] / sqrt(sq) / sqrt(dk)), k[i] = (float)(k[i] / sqrt(sk));
        for (int j = 0; j < dv; j++) v[j] = 2.0f * frand();
        c.g[t] = t % 17 == 5 ? -6.0f : 0.5f * (frand() - 1.0f); /* log-decays in [-1, 0), some strong */
        c.beta[t] = 0.5f + 0.5f * frand();
    }
    for (size_t i = 0; i < (size_t)dk * dv; i++) c.S0[i] = 0.3f * frand();
    return c;
}

static void gdn_free(gdn_case *c) { free(c->rows), free(c->g), free(c->beta), free(c->S0); }

/* Run tokens t0..t0+n-1 of the case on S; out [n, dv] or NULL. */
static void gdn_run(const gdn_case *c, float *S, int t0, int n, float *out, int chunked) {
    const float *r = c->rows + (size_t)t0 * c->ld;
    const kn_gdn_io io = {.dk = c->dk,
                          .dv = c->dv,
                          .n = n,
                          .q = r,
                          .k = r + c->dk,
                          .v = r + 2 * c->dk,
                          .ld = c->ld,
                          .g = c->g + t0,
                          .beta = c->beta + t0,
                          .out = out,
                          .ldo = (size_t)c->dv};
    if (chunked) kn_gdn_chunked(S, &io);
    else kn_gdn_recurrent(S, &io);
}

static double max_abs(const float *a, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fabs(a[i]) > m ? fabs(a[i]) : m;
    return m;
}

static double max_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fabs((double)a[i] - b[i]) > m ? fabs((double)a[i] - b[i]) : m;
    return m;
}

static void check_gdn(kn_isa isa, int dk, int dv, int n) {
    gdn_case c = gdn_make(dk, dv, n);
    const size_t ns = (size_t)dk * dv, no = (size_t)n * dv;
    float *Sg = malloc(ns * sizeof(float)), *Ss = malloc(ns * sizeof(float)), *Sc = malloc(ns * sizeof(float));
    float *og = malloc(no * sizeof(float)), *os = malloc(no * sizeof(float)), *oc = malloc(no * sizeof(float));
    kn_isa_set(KN_ISA_GENERIC);
    memcpy(Sg, c.S0, ns * sizeof(float));
    gdn_run(&c, Sg, 0, n, og, 0);
    kn_isa_set(isa);
    /* recurrence: this path vs generic */
    memcpy(Ss, c.S0, ns * sizeof(float));
    gdn_run(&c, Ss, 0, n, os, 0);
    const double so = max_abs(og, no) + 1e-3, ss = max_abs(Sg, ns) + 1e-3;
    CHECK(max_diff(os, og, no) <= 1e-4 * so && max_diff(Ss, Sg, ns) <= 1e-4 * ss,
          "%s gdn recurrence dk %d dv %d n %d: output diff %.3g, state diff %.3g (scales %.3g, %.3g)", kn_isa_name(isa),
          dk, dv, n, max_diff(os, og, no), max_diff(Ss, Sg, ns), so, ss);
    /* chunked form vs the recurrence of the same path */
    memcpy(Sc, c.S0, ns * sizeof(float));
    gdn_run(&c, Sc, 0, n, oc, 1);
    CHECK(max_diff(oc, os, no) <= 1e-4 * so && max_diff(Sc, Ss, ns) <= 1e-4 * ss,
          "%s gdn chunked vs recurrence dk %d dv %d n %d: output diff %.3g, state diff %.3g (scales %.3g, %.3g)",
          kn_isa_name(isa), dk, dv, n, max_diff(oc, os, no), max_diff(Sc, Ss, ns), so, ss);
    /* the recurrence in two pieces, and without output, gives the same state bit for bit */
    memcpy(Sc, c.S0, ns * sizeof(float));
    gdn_run(&c, Sc, 0, n / 2, oc, 0);
    gdn_run(&c, Sc, n / 2, n - n / 2, oc + (size_t)(n / 2) * dv, 0);
    CHECK(memcmp(Sc, Ss, ns * sizeof(float)) == 0 && memcmp(oc, os, no * sizeof(float)) == 0,
          "%s gdn recurrence dk %d dv %d n %d: split run differs", kn_isa_name(isa), dk, dv, n);
    memcpy(Sc, c.S0, ns * sizeof(float));
    gdn_run(&c, Sc, 0, n, NULL, 0);
    CHECK(memcmp(Sc, Ss, ns * sizeof(float)) == 0, "%s gdn recurrence dk %d dv %d n %d: state-only run differs",
          kn_isa_name(isa), dk, dv, n);
    free(Sg), free(Ss), free(Sc), free(og), free(os), free(oc);
    gdn_free(&c);
}

static void check_isa_api(void) {
    kn_isa isa;
    CHECK(kn_isa_parse("avx2", &isa) == DFL_OK && isa == KN_ISA_AVX2, "parse avx2");
    CHECK(kn_isa_parse("avx512bf16", &isa) == DFL_OK && isa == KN_ISA_AVX512BF16, "parse avx512bf16");
    CHECK(kn_isa_parse("amx", &isa) == DFL_OK && isa == KN_ISA_AMX, "parse amx");
    CHECK(kn_isa_parse("sse9", &isa) == DFL_ERR && strstr(dfl_errmsg(), "sse9"), "parse unknown: %s", dfl_errmsg());
    CHECK(kn_isa_supported(KN_ISA_GENERIC), "generic always supported");
    CHECK(kn_isa_supported(kn_isa_default()), "default path %s is supported", kn_isa_name(kn_isa_default()));
    CHECK(kn_isa_set(KN_ISA_COUNT) == DFL_ERR, "setting an invalid path must fail");
    for (int i = 0; i < KN_ISA_COUNT; i++)
        CHECK((kn_isa_set((kn_isa)i) == DFL_OK) == kn_isa_supported((kn_isa)i) &&
                  (!kn_isa_supported((kn_isa)i) || kn_isa_get() == (kn_isa)i),
              "set %s", kn_isa_name((kn_isa)i));
}

/* KN_ACT_BF16 on BF16 weights (every path): the product of W with x rounded to bf16 once (round
 * to nearest even), products exact and sums float32, so within the float32 summation bound of
 * the generic float32 product on the rounded activations; rows of an n-token product equal
 * single-token products bit for bit (tiles, AMX tiles in every layout and the one-token
 * streaming path alike); other
 * dtypes are unchanged. Then back to KN_ACT_F32. */
static void check_act_bf16(kn_isa isa, int rows, int cols) {
    const int NMAX = isa == KN_ISA_AMX ? 40 : 9; /* AMX: one and two interleaved B tiles, then planar */
    void *store;
    const dfl_mat w = make_mat(ST_BF16, rows, cols, &store);
    float *x = malloc((size_t)NMAX * cols * sizeof(float)), *xr = malloc((size_t)NMAX * cols * sizeof(float));
    float *ref = malloc((size_t)NMAX * rows * sizeof(float)), *y = malloc((size_t)NMAX * rows * sizeof(float));
    float *one = malloc((size_t)rows * sizeof(float)), *wr = malloc((size_t)cols * sizeof(float));
    for (size_t i = 0; i < (size_t)NMAX * cols; i++) {
        x[i] = frand() * (i % 7 == 0 ? 8.0f : 1.0f);
        xr[i] = st_bf16_to_f32(st_f32_to_bf16(x[i]));
    }
    kn_isa_set(KN_ISA_GENERIC);
    kn_matmul(ref, xr, &w, NMAX);
    kn_isa_set(isa);
    CHECK(kn_act_set(KN_ACT_BF16) == DFL_OK, "act bf16: %s", dfl_errmsg());
    const double rel = 2.0 * cols * 0x1.0p-24;
    int bad = 0, dep = 0, same = 0;
    for (int n = 1; n <= NMAX; n++) {
        kn_matmul(y, x, &w, n);
        for (int t = 0; t < n; t++) {
            for (int r = 0; r < rows; r++) {
                kn_mat_row(&w, r, wr);
                double mag = 0;
                for (int c = 0; c < cols; c++) mag += fabs((double)wr[c] * xr[(size_t)t * cols + c]);
                if (fabs((double)y[(size_t)t * rows + r] - ref[(size_t)t * rows + r]) > rel * mag + 1e-30) bad++;
            }
            kn_matmul(one, x + (size_t)t * cols, &w, 1);
            if (memcmp(one, y + (size_t)t * rows, (size_t)rows * sizeof(float)) != 0) dep++;
        }
    }
    /* F32 weights ignore the mode */
    void *s32;
    const dfl_mat w32 = make_mat(ST_F32, rows, cols, &s32);
    kn_matmul(y, x, &w32, 1);
    CHECK(kn_act_set(KN_ACT_F32) == DFL_OK, "act f32");
    kn_matmul(one, x, &w32, 1);
    same = memcmp(one, y, (size_t)rows * sizeof(float)) == 0;
    CHECK(bad == 0, "%s act bf16 %dx%d: %d outputs beyond the bound of the product on rounded activations",
          kn_isa_name(isa), rows, cols, bad);
    CHECK(dep == 0, "%s act bf16 %dx%d: %d token rows depend on the batch size", kn_isa_name(isa), rows, cols, dep);
    CHECK(same, "%s act bf16 %dx%d: F32 weights changed by the activation mode", kn_isa_name(isa), rows, cols);
    free(store), free(s32), free(x), free(xr), free(ref), free(y), free(one), free(wr);
}

/* KN_ACT_BF16 rounds each activation exactly as st_f32_to_bf16 does (ties to even, the largest
 * finite values that stay finite, negative zero): through an identity matrix (whose zeros would
 * turn an infinity into NaNs everywhere), y[i] is the rounded x[i]. */
static void check_act_rounding(kn_isa isa) {
    enum { N = 100 };
    uint16_t *eye = calloc((size_t)N * N, sizeof(uint16_t));
    float x[N], y[N];
    static const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0xbf808000u, 0x3f80ffffu, 0x7f7effffu,
                                       0xff7effffu, 0x80000000u, 0x00800000u, 0x3f7fffffu, 0x41b8c000u};
    for (int i = 0; i < N; i++) {
        eye[(size_t)i * N + i] = 0x3f80; /* 1.0 */
        union {
            uint32_t u;
            float f;
        } v = {.u = i < 10 ? special[i] : 0};
        x[i] = i < 10 ? v.f : frand() * 100.0f;
    }
    const dfl_mat w = {.dtype = ST_BF16, .data = eye, .rows = N, .cols = N};
    kn_isa_set(isa);
    CHECK(kn_act_set(KN_ACT_BF16) == DFL_OK, "act bf16");
    kn_matmul(y, x, &w, 1);
    kn_act_set(KN_ACT_F32);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        const float want = st_bf16_to_f32(st_f32_to_bf16(x[i]));
        if (memcmp(&want, &y[i], sizeof want) != 0 && !(want == 0.0f && y[i] == 0.0f)) bad++;
    }
    CHECK(bad == 0, "%s act bf16: %d activations rounded unlike st_f32_to_bf16", kn_isa_name(isa), bad);
    free(eye);
}

/* kn_argmax on this path: the index of the first x[i] > every earlier maximum, as a plain loop
 * finds it (ties to the first, NaNs never chosen, a NaN in x[0] gives 0, -0 equal to +0). */
static int argmax_ref(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static void check_argmax(kn_isa isa) {
    enum { N = 4099 };
    float *x = malloc(N * sizeof(float));
    int bad = 0, cases = 0;
    kn_isa_set(isa);
    for (int trial = 0; trial < 400; trial++) {
        const int n = trial < 100 ? 1 + trial : 1 + (int)((frand() + 1.0f) * 0.5f * (N - 1));
        for (int i = 0; i < n; i++) x[i] = trial % 3 ? frand() : (float)(int)(frand() * 4.0f); /* ties */
        switch (trial % 7) {
        case 1: x[(trial * 7919) % n] = NAN; break;
        case 2: x[0] = NAN; break;
        case 3:
            for (int i = 0; i < n; i++) x[i] = (i % 2) ? 0.0f : -0.0f;
            break;
        case 4:
            x[(trial * 31) % n] = INFINITY;
            x[n - 1] = INFINITY;
            break;
        case 5:
            for (int i = 0; i < n; i++) x[i] = -INFINITY;
            break;
        case 6:
            for (int i = 0; i < n; i++) x[i] = i % 5 ? NAN : -1.0f;
            break;
        default: break;
        }
        bad += kn_argmax(x, n) != argmax_ref(x, n);
        cases++;
    }
    CHECK(bad == 0, "%s argmax: %d of %d cases differ from the plain loop", kn_isa_name(isa), bad, cases);
    free(x);
}

/* One case of check_matmul_argmax: ids of kn_matmul_argmax against kn_argmax of kn_matmul's
 * rows; *estimated counts the calls that took the estimate route. */
static int argmax_case(const dfl_mat *w, const float *x, int n, kn_row_norms *rn, int *estimated) {
    const int V = w->rows;
    float *y = malloc((size_t)n * V * sizeof(float)), *full = malloc((size_t)n * V * sizeof(float));
    int32_t ids[65];
    kn_matmul(full, x, w, n);
    const int got_full = kn_matmul_argmax(ids, y, x, w, n, rn);
    int bad = 0;
    for (int t = 0; t < n; t++) bad += ids[t] != kn_argmax(full + (size_t)t * V, V);
    if (got_full) bad += memcmp(y, full, (size_t)n * V * sizeof(float)) != 0;
    *estimated += !got_full;
    free(y), free(full);
    return bad;
}

/* Rows whose order the bf16 estimate gets wrong: A (every weight 1.25) and B (A one bf16 step
 * up at 400 columns, one down at 399). Every activation rounds to one bf16 value b, so B's
 * estimate is A's + one step x b exactly; with the float32 remainders pulling the other way,
 * A is the larger. The estimate must only narrow the rows, never decide. */
static void check_argmax_inversion(kn_isa isa) {
    enum { V = 64, K = 2048, N = 16, A = 10, B = 20 };
    void *store;
    dfl_mat w = make_mat(ST_BF16, V, K, &store);
    uint16_t *wd = store;
    for (int i = 0; i < V * K; i++) wd[i] = st_f32_to_bf16(0.1f * st_bf16_to_f32(wd[i]));
    for (int c = 0, up = 0, down = 0; c < K; c++) {
        wd[A * K + c] = wd[B * K + c] = 0x3fa0; /* 1.25 */
        if (c % 3 == 0 && up < 400) wd[B * K + c]++, up++;
        if (c % 3 == 1 && down < 399) wd[B * K + c]--, down++;
    }
    float *x = malloc((size_t)N * K * sizeof(float)), *est = malloc((size_t)N * V * sizeof(float));
    float *full = malloc((size_t)N * V * sizeof(float)), *y = malloc((size_t)N * V * sizeof(float));
    for (int t = 0; t < N; t++) { /* b (1 + d): d = -+0.0024 by column, its sign by token; all round to b */
        const float b = t % 4 < 2 ? 0.75f : 0.703125f, s = t % 2 ? -0.0024f : 0.0024f;
        for (int c = 0; c < K; c++) x[(size_t)t * K + c] = b * (1.0f + (c % 3 == 0 ? -s : c % 3 == 1 ? s : 0.0f));
    }
    kn_isa_set(isa);
    kn_matmul(full, x, &w, N);
    kn_isa_set(KN_ISA_AVX512BF16);
    kn_matmul_bf16act(1, &(kn_mm_job){est, x, &w, N});
    kn_isa_set(isa);
    kn_row_norms *rn = kn_row_norms_new();
    int32_t ids[N];
    const int got_full = kn_matmul_argmax(ids, y, x, &w, N, rn);
    int inverted = 0, bad = 0;
    for (int t = 0; t < N; t++) {
        const int exact = kn_argmax(full + (size_t)t * V, V);
        inverted += exact == A && kn_argmax(est + (size_t)t * V, V) == B;
        bad += ids[t] != exact;
    }
    CHECK(inverted == N / 2, "argmax inversion case: the estimate misorders %d of %d tokens, expected %d", inverted, N,
          N / 2);
    CHECK(bad == 0 && !got_full, "%s kn_matmul_argmax on misordered estimates: %d of %d ids wrong (full product: %d)",
          kn_isa_name(isa), bad, N, got_full);
    kn_row_norms_free(rn);
    free(store), free(x), free(est), free(full), free(y);
}

/* kn_matmul_argmax: the same ids as the full product's rows, on random shapes (tail rows past the
 * last multiple of 16, 1..65 tokens) and on rows built to be close: exact ties (copies of a row:
 * the first wins), rows one bf16 step apart in one weight, and activations whose float32 parts
 * decide between rows the bf16 estimate cannot tell apart. On the AMX path with float32
 * activations the estimate route must run from KN_ARGMAX_MIN_TOKENS tokens (else the test would
 * pass without it); NaN weights send it to the full product. */
static void check_matmul_argmax(kn_isa isa) {
    static const int shapes[][2] = {{16, 32}, {300, 64}, {1000, 1024}, {4099, 256}};
    static const int ns[] = {1, 5, 6, 7, 16, 17, 33, 65};
    enum { NN = sizeof ns / sizeof ns[0] };
    kn_isa_set(isa);
    const int route = (isa == KN_ISA_AMX ||
                       ((isa == KN_ISA_AVX512BF16 || isa == KN_ISA_AVX512) && kn_isa_supported(KN_ISA_AVX512BF16))) &&
                      kn_act_get() == KN_ACT_F32;
    int bad = 0, estimated = 0, want = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int V = shapes[s][0], K = shapes[s][1];
        void *store;
        dfl_mat w = make_mat(ST_BF16, V, K, &store);
        uint16_t *wd = store;
        float *x = malloc((size_t)65 * K * sizeof(float));
        for (int i = 0; i < 65 * K; i++) x[i] = frand();
        kn_row_norms *rn = kn_row_norms_new();
        for (int k = 0; k < NN; k++) {
            bad += argmax_case(&w, x, ns[k], rn, &estimated);
            want += route && ns[k] >= KN_ARGMAX_MIN_TOKENS;
        }
        kn_row_norms_free(rn);
        /* close rows: random rows shrunk, then 40 rearrangements of one row on top. Every token's
         * activations round to one bf16 value, so the estimates of the family tie (up to their
         * sums' rounding) and only the float32 remainders order it; every fourth is an exact
         * copy of the first (a tie the lowest row wins). */
        for (int r = 0; r < V; r++)
            for (int c = 0; c < K; c++)
                wd[(size_t)r * K + c] = st_f32_to_bf16(0.25f * st_bf16_to_f32(wd[(size_t)r * K + c]));
        const int fam = V < 40 ? V : 40;
        for (int r = 0; r < fam; r++) {
            uint16_t *row = wd + (size_t)r * 7919 % V * K;
            const int shift = r % 4 == 3 ? 0 : r;
            for (int c = 0; c < K; c++) row[c] = (uint16_t)(0x3f80 + ((c + shift) * 37 % 64)); /* 1.0 .. 1.5 */
        }
        for (int t = 0; t < 65; t++) { /* x = b (1 + d), d in {-1, 0, 1} 1.5 2^-10: all round to b */
            const float b = 0.75f + 0.0625f * (float)(t % 3);
            for (int c = 0; c < K; c++) x[(size_t)t * K + c] = b * (1.0f + 0x1.8p-10f * (float)(int)(1.5f * frand()));
        }
        rn = kn_row_norms_new();
        for (int k = 0; k < NN; k++) {
            bad += argmax_case(&w, x, ns[k], rn, &estimated);
            want += route && ns[k] >= KN_ARGMAX_MIN_TOKENS;
        }
        kn_row_norms_free(rn);
        /* a NaN weight: the full product (its values, NaN included), the same ids */
        rn = kn_row_norms_new();
        wd[(size_t)(V / 2) * K + K / 3] = 0x7fc0;
        int est_nan = 0;
        bad += argmax_case(&w, x, 16, rn, &est_nan);
        CHECK(est_nan == 0, "%s argmax over a matrix with a NaN weight took the estimate route", kn_isa_name(isa));
        kn_row_norms_free(rn);
        bad += argmax_case(&w, x, 16, NULL, &est_nan); /* no cache: the full product */
        CHECK(est_nan == 0, "%s argmax without a norms cache took the estimate route", kn_isa_name(isa));
        free(store), free(x);
    }
    CHECK(bad == 0, "%s kn_matmul_argmax: %d cases differ from the full product's argmax", kn_isa_name(isa), bad);
    CHECK(estimated == want, "%s kn_matmul_argmax: the estimate route ran %d times, expected %d", kn_isa_name(isa),
          estimated, want);
}

/* kn_softmax on every path equals the generic loop bit for bit (rows of logits of every spread,
 * values past glibc's fast range, -Inf, ties, NaN in the first place), and on AVX-512 its expf
 * equals libm's over a sweep of (-88, 88); kn_first_above against a plain scan. */
static void check_softmax(kn_isa isa) {
    enum { N = 4133 };
    float *x = malloc(N * sizeof(float)), *a = malloc(N * sizeof(float)), *b = malloc(N * sizeof(float));
    int bad = 0, cases = 0, above = 0;
    kn_isa_set(isa);
    for (int trial = 0; trial < 300; trial++) {
        const int n = trial < 40 ? 1 + trial : 1 + (int)((frand() + 1.0f) * 0.5f * (N - 1));
        const float scale = trial % 5 == 0 ? 300.0f : trial % 5 == 1 ? 40.0f : 8.0f; /* some past |88| */
        for (int i = 0; i < n; i++) x[i] = frand() * scale;
        if (trial % 7 == 1) x[(trial * 7919) % n] = -INFINITY;
        if (trial % 7 == 2) x[n / 2] = x[n - 1] = 1e-3f; /* a tie at the top, zero spread there */
        if (trial % 11 == 3) x[0] = NAN;
        memcpy(a, x, (size_t)n * sizeof(float)), memcpy(b, x, (size_t)n * sizeof(float));
        kn_softmax(a, n);
        kn_softmax_generic(b, n);
        bad += memcmp(a, b, (size_t)n * sizeof(float)) != 0;
        const float t = x[(trial * 31) % n] - (trial % 3 ? 0.0f : 1e-7f);
        int want = n;
        for (int i = 0; i < n && want == n; i++)
            if (x[i] > t) want = i;
        above += kn_first_above(x, n, t) != want;
        cases++;
    }
    CHECK(bad == 0, "%s softmax: %d of %d rows differ from the generic loop", kn_isa_name(isa), bad, cases);
    CHECK(above == 0, "%s first_above: %d of %d scans differ", kn_isa_name(isa), above, cases);
#if KN_X86
    if (isa >= KN_ISA_AVX512 && kn_softmax_avx512_exact()) { /* every 97th float of (-88, 88), both signs */
        int diff = 0;
        for (uint32_t u0 = 0; u0 < 0x42b00000u; u0 += 97u * N) {
            int n = 0;
            for (uint32_t u = u0; n < N && u < 0x42b00000u; u += 97u, n++) {
                const uint32_t w = n % 2 ? u | 0x80000000u : u;
                memcpy(&x[n], &w, sizeof w);
            }
            kn_expf_avx512(a, x, n);
            for (int i = 0; i < n; i++) diff += memcmp(&a[i], &(float){expf(x[i])}, sizeof(float)) != 0;
        }
        CHECK(diff == 0, "expf on AVX-512: %d values differ from libm's", diff);
    } else if (isa >= KN_ISA_AVX512) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 27)
        CHECK(0, "glibc %d.%d's expf: the AVX-512 expf should equal it (the self-check failed)", __GLIBC__,
              __GLIBC_MINOR__);
#else
        printf("test_kernels: this libm's expf is not glibc's: softmax runs the generic loop\n");
#endif
    }
#endif
    free(x), free(a), free(b);
}

static void check_act_api(void) {
    kn_act a;
    CHECK(kn_act_get() == KN_ACT_F32, "the default activation mode is f32 (DFL_ACT unset in tests)");
    CHECK(kn_act_parse("bf16", &a) == DFL_OK && a == KN_ACT_BF16 && strcmp(kn_act_name(a), "bf16") == 0, "parse bf16");
    CHECK(kn_act_parse("f32", &a) == DFL_OK && a == KN_ACT_F32, "parse f32");
    CHECK(kn_act_parse("fp8", &a) == DFL_ERR && strstr(dfl_errmsg(), "fp8"), "parse unknown: %s", dfl_errmsg());
    CHECK(kn_act_set(KN_ACT_COUNT) == DFL_ERR, "setting an invalid mode must fail");
    const int ok = kn_act_set(KN_ACT_BF16) == DFL_OK;
    CHECK(ok == kn_isa_supported(KN_ISA_AVX512BF16), "act bf16 allowed exactly when AVX-512 BF16 is: %s",
          ok ? "allowed" : dfl_errmsg());
    CHECK(ok || strstr(dfl_errmsg(), "AVX-512 BF16"), "the refusal names AVX-512 BF16: %s", dfl_errmsg());
    kn_act_set(KN_ACT_F32);
}

/* kn_count_nonfinite: NaN and both infinities, not the largest finite or subnormal values; over a
 * range, and over 200003 values (threaded chunks, the vector loop's tails) with non-finite values
 * at the ends and at chunk edges. */
static void check_nonfinite(kn_isa isa) {
    kn_isa_set(isa);
    float x[1000];
    for (int i = 0; i < 1000; i++) x[i] = (float)i - 500.0f;
    CHECK(kn_count_nonfinite(x, 1000) == 0, "finite values counted as non-finite");
    x[3] = 3.4028235e38f, x[4] = -3.4028235e38f, x[5] = 1e-45f;
    CHECK(kn_count_nonfinite(x, 1000) == 0, "extreme finite values counted as non-finite");
    x[0] = NAN, x[499] = INFINITY, x[999] = -INFINITY, x[7] = -NAN;
    CHECK(kn_count_nonfinite(x, 1000) == 4, "%s: NaN, -NaN, +Inf, -Inf: %zu counted", kn_isa_name(isa),
          kn_count_nonfinite(x, 1000));
    CHECK(kn_count_nonfinite(x, 999) == 3 && kn_count_nonfinite(x + 1, 6) == 0, "counts over a range");
    enum { N = 200003 };
    static const size_t at[] = {0, 63, 64, 32767, 32768, 65535, 131072, N - 17, N - 1};
    float *y = malloc(N * sizeof(float));
    for (size_t i = 0; i < N; i++) y[i] = (float)(i % 1000) - 500.0f;
    for (size_t k = 0; k < sizeof at / sizeof at[0]; k++) y[at[k]] = k % 2 ? NAN : -INFINITY;
    CHECK(kn_count_nonfinite(y, N) == sizeof at / sizeof at[0] && kn_count_nonfinite(y, N - 1) == 8 &&
              kn_count_nonfinite(y + 1, N - 2) == 7,
          "%s: %zu of 9 non-finite values counted in %d", kn_isa_name(isa), kn_count_nonfinite(y, N), N);
    free(y);
}

/* ---- kn_attention against a plain double-precision reference ------------------------------ */

/* One attention case: keys and values [ctx + n][ldkv] (the cache, the blocks' own rows after
 * it), queries with their gates [n][ldq]. */
typedef struct attn_case {
    kn_attn_io a;
    float *buf, *out1;
    int starts[8];
    unsigned char *tree;
} attn_case;

static void attn_ref_row(const kn_attn_io *a, int r, double *o) {
    const int hd = a->head_dim, group = a->n_heads / a->n_kv_heads, b = r / a->block, start = a->starts[b];
    const int qpos = start + r % a->block, n_keys = start + (a->causal ? r % a->block + 1 : a->block);
    double p[512];
    for (int h = 0; h < a->n_heads; h++) {
        const float *q = a->q + (size_t)r * a->ldq + (size_t)h * a->ldqh;
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < n_keys; j++) {
            const int blk = j >= start && a->kb;
            const float *k = (blk ? a->kb + ((size_t)b * a->block + j - start) * a->ldkv : a->k + (size_t)j * a->ldkv) +
                             (size_t)(h / group) * hd;
            const int masked = (a->window && qpos - j >= a->window) ||
                               (a->tree && j >= start && !a->tree[(size_t)r * a->ldtree + j - start]);
            double s = 0;
            for (int i = 0; i < hd; i++) s += (double)q[i] * k[i];
            p[j] = masked ? -INFINITY : s / sqrt((double)hd);
            mx = p[j] > mx ? p[j] : mx;
        }
        for (int j = 0; j < n_keys; j++) sum += p[j] = exp(p[j] - mx);
        for (int i = 0; i < hd; i++) o[h * hd + i] = 0;
        for (int j = 0; j < n_keys; j++) {
            const int blk = j >= start && a->vb;
            const float *v = (blk ? a->vb + ((size_t)b * a->block + j - start) * a->ldkv : a->v + (size_t)j * a->ldkv) +
                             (size_t)(h / group) * hd;
            for (int i = 0; i < hd; i++) o[h * hd + i] += p[j] / sum * v[i];
        }
        if (a->gate)
            for (int i = 0; i < hd; i++)
                o[h * hd + i] /= 1 + exp(-(double)a->gate[(size_t)r * a->ldq + (size_t)h * a->ldqh + i]);
    }
}

/* mode 0: one causal block after the context in the cache (the target), tree mask when tree;
 * 1: blocks with their own keys (the drafter), causal or not, sliding window when window. */
static void attn_make(attn_case *c, int mode, int n, int block, int Hkv, int group, int hd, int gated, int causal,
                      int window, int tree) {
    memset(c, 0, sizeof *c);
    kn_attn_io *a = &c->a;
    const int Hq = Hkv * group, ctx = 40, ldkv = Hkv * hd + 3, ldq = Hq * hd * (gated ? 2 : 1) + 1;
    const int nb = n / block, kvrows = ctx + n + 1;
    const size_t ldsc = (size_t)ctx + n + 1, nsc = (size_t)omp_get_max_threads() * group * ldsc;
    const size_t total = 2 * (size_t)kvrows * ldkv + (size_t)n * ldq + 2 * (size_t)n * Hq * hd + nsc;
    c->buf = malloc(total * sizeof(float));
    for (size_t i = 0; i < total; i++) c->buf[i] = frand();
    float *p = c->buf;
    a->k = p, p += (size_t)kvrows * ldkv;
    a->v = p, p += (size_t)kvrows * ldkv;
    a->q = p, p += (size_t)n * ldq;
    a->out = p, p += (size_t)n * Hq * hd;
    c->out1 = p, p += (size_t)n * Hq * hd;
    a->scores = p;
    a->n = n, a->n_heads = Hq, a->n_kv_heads = Hkv, a->head_dim = hd;
    a->ldq = (size_t)ldq, a->ldqh = (size_t)hd * (gated ? 2 : 1), a->gate = gated ? a->q + hd : NULL;
    a->ldkv = (size_t)ldkv, a->block = block, a->starts = c->starts, a->causal = causal, a->window = window;
    a->ldsc = ldsc;
    for (int b = 0; b < nb; b++) c->starts[b] = mode == 0 ? ctx - 7 : (int)((frand() + 1) * 0.5f * ctx);
    if (mode == 1) a->kb = a->k + (size_t)ctx * ldkv, a->vb = a->v + (size_t)ctx * ldkv;
    if (tree) { /* a random tree: row r sees itself and the ancestors of its parent */
        c->tree = calloc((size_t)n * n, 1);
        for (int r = 0; r < n; r++) {
            const int par = r ? (int)((frand() + 1) * 0.5f * r) : -1;
            if (par >= 0) memcpy(c->tree + (size_t)r * n, c->tree + (size_t)par * n, (size_t)n);
            c->tree[(size_t)r * n + r] = 1;
        }
        a->tree = c->tree, a->ldtree = (size_t)n;
    }
}

static void check_attention(kn_isa isa) {
    static const int shapes[][4] = {{1, 1, 16, 1}, {2, 4, 16, 0}, {3, 2, 5, 1}, {1, 8, 64, 0}, {2, 1, 33, 1}};
    int bad = 0, dep = 0, cases = 0;
    double worst = 0;
    kn_isa_set(isa);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int mode = 0; mode < 2; mode++)
            for (int v = 0; v < 4; v++) {
                const int Hkv = shapes[s][0], group = shapes[s][1], hd = shapes[s][2], gated = shapes[s][3];
                const int n = mode == 0 ? 1 + 5 * v : 3 * (v + 1), block = mode == 0 ? n : 3;
                const int causal = mode == 0 || v % 2, window = mode == 1 && v >= 2 ? 4 + v : 0;
                attn_case c;
                attn_make(&c, mode, n, block, Hkv, group, hd, gated, causal, window, mode == 0 && v % 2);
                kn_attn_io *a = &c.a;
                kn_attention(a);
                cases++;
                double ref[8 * 64];
                for (int r = 0; r < n; r++) {
                    attn_ref_row(a, r, ref);
                    for (int i = 0; i < a->n_heads * hd; i++) {
                        const double d = fabs(a->out[(size_t)r * a->n_heads * hd + i] - ref[i]);
                        worst = d > worst ? d : worst;
                        bad += d > 1e-5;
                    }
                }
                /* a row alone (its own block) gives the same bits as in the batch */
                for (int r = 0; r < n && !a->tree; r++) {
                    kn_attn_io one = *a;
                    const int b = r / block;
                    int st = c.starts[b] + (mode == 0 ? r : 0);
                    one.n = 1, one.starts = &st, one.q = a->q + (size_t)r * a->ldq, one.out = c.out1;
                    one.gate = a->gate ? one.q + hd : NULL;
                    if (mode == 1) { /* a block of its own: its rows at the block's keys */
                        one.n = block, one.q = a->q + (size_t)b * block * a->ldq,
                        one.gate = a->gate ? one.q + hd : NULL;
                        one.kb = a->kb + (size_t)b * block * a->ldkv, one.vb = a->vb + (size_t)b * block * a->ldkv;
                    } else {
                        one.block = 1;
                    }
                    kn_attention(&one);
                    const size_t w = (size_t)a->n_heads * hd, off = mode == 0 ? 0 : (size_t)(r % block) * w;
                    dep += memcmp(c.out1 + off, a->out + (size_t)r * w, w * sizeof(float)) != 0;
                }
                free(c.buf), free(c.tree);
            }
    CHECK(bad == 0, "%s: %d kn_attention outputs beyond 1e-5 of the reference (worst %.3g)", kn_isa_name(isa), bad,
          worst);
    CHECK(dep == 0, "%s: %d kn_attention rows depend on the batch around them", kn_isa_name(isa), dep);
    CHECK(cases == 40, "attention cases run: %d", cases);
}

/* ---- the forwards' row-wise and elementwise ops, against plain loops ------------------------ */

static int same(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

/* Ops defined by one float expression per element must equal the plain loop bit for bit,
 * threaded or not (n past KN_PAR_MIN_WORK); norms within float32 rounding of double. */
static void check_ops(kn_isa isa) {
    enum { N = 70001, D = 77 };
    static float x[N], y[N], w[N], r0[N], r1[N];
    int bad = 0, diff = 0;
    kn_isa_set(isa);
    for (int i = 0; i < N; i++) x[i] = frand() * 4, y[i] = frand(), w[i] = frand();
    for (size_t n = 1; n <= N; n = n * 7 + 3) {
        memcpy(r0, x, n * sizeof(float)), memcpy(r1, x, n * sizeof(float));
        kn_add(r0, y, n);
        for (size_t i = 0; i < n; i++) r1[i] += y[i];
        diff += !same(r0, r1, n);
        kn_add_scaled(r0, 0.3f, y, (int)n);
        for (size_t i = 0; i < n; i++) r1[i] += 0.3f * y[i];
        kn_scale(r0, 1.7f, n);
        for (size_t i = 0; i < n; i++) r1[i] *= 1.7f;
        kn_softcap(r0, 2.5f, n);
        for (size_t i = 0; i < n; i++) r1[i] = tanhf(r1[i] / 2.5f) * 2.5f;
        diff += !same(r0, r1, n);
        memcpy(r0, x, n * sizeof(float)), memcpy(r1, x, n * sizeof(float));
        kn_swiglu_par(r0, y, n);
        kn_swiglu(r1, y, (int)n);
        diff += !same(r0, r1, n);
    }
    for (int rows = 1; rows * D <= N; rows = rows * 5 + 1) { /* threaded from 426 rows */
        kn_rmsnorm_rows(r0, x, w, rows, D, 1e-6f);
        for (int r = 0; r < rows; r++) kn_rmsnorm(r1 + (size_t)r * D, x + (size_t)r * D, w, D, 1e-6f);
        diff += !same(r0, r1, (size_t)rows * D);
    }
    /* rotary tables and per-head norm + rotation (3 heads of 12, 8 rotated dims, stride 13) */
    float cs[4], sn[4], h[3 * 13], hr[3 * 13];
    kn_rope_table(cs, sn, w, 4, 37.0f);
    for (int i = 0; i < 4; i++) diff += cs[i] != cosf(37.0f * w[i]) || sn[i] != sinf(37.0f * w[i]);
    for (int i = 0; i < 3 * 13; i++) h[i] = hr[i] = x[i];
    kn_head_norm_rope(h, 3, 13, w, 12, 1e-6f, cs, sn, 8);
    for (int k = 0; k < 3; k++) {
        double ss = 0;
        float *v = hr + 13 * k;
        for (int i = 0; i < 12; i++) ss += (double)v[i] * v[i];
        for (int i = 0; i < 12; i++) v[i] = (float)(w[i] * v[i] / sqrt(ss / 12 + 1e-6));
        for (int i = 0; i < 4; i++) {
            const float a = v[i], b = v[i + 4];
            v[i] = a * cs[i] - b * sn[i], v[i + 4] = b * cs[i] + a * sn[i];
        }
        for (int i = 0; i < 13; i++) bad += fabsf(h[13 * k + i] - v[i]) > 1e-5f * (1 + fabsf(v[i]));
    }
    /* L2 norms of (row, head) slices; the gap between rows and the 13th value stay untouched */
    for (int n = 1; n <= 600; n = n * 4 + 1) {
        memcpy(r0, x, (size_t)n * 40 * sizeof(float));
        kn_l2norm_heads(r0, 40, n, 3, 13, 0.5f);
        for (int t = 0; t < n; t++)
            for (int k = 0; k < 4; k++) {
                const float *a = x + (size_t)t * 40 + 13 * k, *b = r0 + (size_t)t * 40 + 13 * k;
                double ss = 0;
                for (int i = 0; i < 13 && k < 3; i++) ss += (double)a[i] * a[i];
                for (int i = 0; i < (k < 3 ? 13 : 1); i++)
                    bad += fabs(b[i] - (k < 3 ? a[i] * 0.5 / sqrt(ss + 1e-6) : a[i])) > 1e-6;
            }
    }
    /* weighted gather of k = 3 rows of 50 per token */
    int rows[3 * 500];
    for (int i = 0; i < 3 * 500; i++) rows[i] = (int)((frand() + 1) * 0.5f * 1000);
    for (int n = 1; n <= 500; n = n * 6 + 1) {
        kn_gather_sum(r0, x, rows, y, n, 3, 50);
        for (int t = 0; t < n; t++)
            for (int i = 0; i < 50; i++) {
                float o = 0;
                for (int j = 0; j < 3; j++) o += y[t * 3 + j] * x[(size_t)rows[t * 3 + j] * 50 + i];
                diff += o != r0[t * 50 + i];
            }
    }
    /* Gated DeltaNet gates of head 2 of 5, tokens 3..9 */
    float gb[2 * KN_GDN_CHUNK];
    kn_gdn_gates(gb, x, 5, 2, 3, 7, w, y);
    for (int t = 0; t < 7; t++)
        diff += gb[t] != w[2] * kn_softplus(x[(3 + t) * 10 + 2] + y[2]) ||
                gb[KN_GDN_CHUNK + t] != kn_sigmoid(x[(3 + t) * 10 + 5 + 2]);
    CHECK(diff == 0, "%s: %d op results differ from the plain loops", kn_isa_name(isa), diff);
    CHECK(bad == 0, "%s: %d norm results beyond tolerance", kn_isa_name(isa), bad);
}

/* The DFlash2 pieces: kn_conv_grouped against a double-precision convolution (taps that would
 * reach before the first row left out, a group sharing each delta), kn_topk_values against a full
 * sort with ties (value descending, then id), kn_mul and kn_fill exactly. */
static int topk_ref_cmp(const void *a, const void *b) {
    const float *x = a, *y = b; /* {value, id} pairs */
    if (x[0] != y[0]) return x[0] > y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : 1;
}

static void check_dflash2_ops(void) {
    enum { B = 9, H = 24, T = 4, GS = 3, G = H / GS, V = 500, K = 7 };
    static float x[B * H], y[B * H], base[T * H], delta[B * 2 * T * G], row[V], pairs[V][2], vals[K];
    int32_t ids[K];
    for (int i = 0; i < B * H; i++) x[i] = frand();
    for (int i = 0; i < T * H; i++) base[i] = frand();
    for (int i = 0; i < B * 2 * T * G; i++) delta[i] = frand();
    kn_conv_grouped(y, x, base, delta + T * G, (size_t)2 * T * G, B, H, T, GS); /* the second side */
    double worst = 0;
    for (int i = 0; i < B; i++)
        for (int c = 0; c < H; c++) {
            double ref = 0;
            for (int t = 0; t <= i && t < T; t++)
                ref += ((double)base[t * H + c] + delta[(size_t)i * 2 * T * G + T * G + t * G + c / GS]) *
                       x[(size_t)(i - t) * H + c];
            const double e = fabs(ref - y[i * H + c]);
            worst = e > worst ? e : worst;
        }
    CHECK(worst < 1e-5, "kn_conv_grouped: worst error %g against double", worst);
    for (int v = 0; v < V; v++) row[v] = (float)(int)(frand() * 20) / 4, pairs[v][0] = row[v], pairs[v][1] = (float)v;
    qsort(pairs, V, sizeof pairs[0], topk_ref_cmp);
    kn_topk_values(row, V, K, ids, vals);
    int bad = 0;
    for (int k = 0; k < K; k++) bad += ids[k] != (int32_t)pairs[k][1] || vals[k] != pairs[k][0];
    CHECK(bad == 0, "kn_topk_values: %d of %d differ from a sort (value descending, then id)", bad, K);
    float a[5] = {1, -2, 3, 0.5f, 4}, m[5] = {2, 2, -1, 4, 0.25f};
    kn_mul(a, m, 5);
    CHECK(a[0] == 2 && a[1] == -4 && a[2] == -3 && a[3] == 2 && a[4] == 1, "kn_mul");
    kn_fill(a, -INFINITY, 5);
    CHECK(isinf(a[0]) && a[0] < 0 && isinf(a[4]), "kn_fill");
}

/* kn_causal_conv_silu: a chain against a double-precision convolution of [state ; x]; a tree
 * whose nodes form a chain equals the chain bit for bit, keeps its inputs, leaves the state
 * alone, and kn_conv_window over its path (into the state itself) is the chain's window; a
 * branch (node 2 on node 0) equals the chain over its own path, and so does its window. */
static void check_causal_conv(kn_isa isa, int C, int K, int n) {
    enum { MAXC = 80, MAXN = 12 };
    float w[MAXC * 16], st0[15 * MAXC], st[15 * MAXC], x0[MAXN * MAXC], x[MAXN * MAXC], xt[MAXN * MAXC];
    float xin[MAXN * MAXC], xb[2 * MAXC], stb[15 * MAXC], win[15 * MAXC];
    kn_isa_set(isa);
    for (int i = 0; i < C * K; i++) w[i] = frand();
    for (int i = 0; i < (K - 1) * C; i++) st0[i] = st[i] = frand();
    for (int i = 0; i < n * C; i++) x0[i] = x[i] = xt[i] = frand();
    kn_causal_conv_silu(x, n, C, K, w, st, NULL, NULL);
    int bad = 0, diff = 0;
    for (int t = 0; t < n; t++)
        for (int c = 0; c < C; c++) {
            double acc = 0; /* tap j reads position t - (K-1) + j of [state ; x] */
            for (int j = 0; j < K; j++) {
                const int p = t - (K - 1) + j;
                acc += (double)w[c * K + j] * (p < 0 ? st0[(p + K - 1) * C + c] : x0[p * C + c]);
            }
            bad += fabs(x[t * C + c] - acc / (1 + exp(-acc))) > 1e-5 * (1 + fabs(acc));
        }
    for (int j = 0; j < K - 1; j++) /* the window leaves with the last K-1 inputs */
        for (int c = 0; c < C; c++) {
            const int p = n - (K - 1) + j;
            diff += st[j * C + c] != (p < 0 ? st0[(p + K - 1) * C + c] : x0[p * C + c]);
        }
    int parent[MAXN], path[MAXN];
    for (int t = 0; t < n; t++) parent[t] = t - 1, path[t] = t;
    memcpy(stb, st0, sizeof stb);
    kn_causal_conv_silu(xt, n, C, K, w, stb, parent, xin);
    diff += !same(xt, x, (size_t)n * C) || !same(xin, x0, (size_t)n * C);
    diff += !same(stb, st0, (size_t)(K - 1) * C); /* a tree leaves the committed window alone */
    kn_conv_window(stb, stb, xin, path, n, C, K);
    diff += !same(stb, st, (size_t)(K - 1) * C);
    if (n >= 3) {
        parent[2] = 0, path[1] = 2;
        memcpy(xt, x0, (size_t)n * C * sizeof(float)), memcpy(stb, st0, sizeof stb);
        kn_causal_conv_silu(xt, 3, C, K, w, stb, parent, xin);
        kn_conv_window(win, stb, xin, path, 2, C, K);
        memcpy(xb, x0, (size_t)C * sizeof(float)), memcpy(xb + C, x0 + 2 * C, (size_t)C * sizeof(float));
        kn_causal_conv_silu(xb, 2, C, K, w, stb, NULL, NULL);
        diff += !same(xt + 2 * C, xb + C, (size_t)C) || !same(win, stb, (size_t)(K - 1) * C);
    }
    CHECK(bad == 0, "%s causal conv C=%d K=%d n=%d: %d outputs beyond tolerance", kn_isa_name(isa), C, K, n, bad);
    CHECK(diff == 0, "%s causal conv C=%d K=%d n=%d: %d chain / tree results differ", kn_isa_name(isa), C, K, n, diff);
}

/* Depth-first preorder of the subtree at u (children in index order), from order + *k. */
static void preorder(const int *parent, int n, int u, int *order, int *k) {
    order[(*k)++] = u;
    for (int c = u + 1; c < n; c++)
        if (parent[c] == u) preorder(parent, n, c, order, k);
}

/* kn_gdn_heads: a chain equals per-head kn_gdn_recurrent calls on kn_gdn_gates bit for bit
 * (GQA: value head h reads key head h / 2); a tree whose nodes form a chain gives the same
 * outputs and leaves the layer's state alone; in a random tree (depth-first order, several
 * threads' stacks) each node's output equals the last of a chain over its root path; the
 * chunked form stays within 1e-4 of the recurrence. */
static void check_gdn_heads(kn_isa isa, int n) {
    enum { HK = 2, HV = 4, DK = 16, DV = 16, C = 2 * HK * DK + HV * DV, MAXN = 70, TH = 4 };
    static float qkv[MAXN * C], ab[MAXN * 2 * HV], A[HV], dt[HV], S0[HV * DK * DV], S[HV * DK * DV], Sr[HV * DK * DV],
        out[MAXN * HV * DV], outr[MAXN * HV * DV], stack[TH * MAXN * DK * DV], pqkv[MAXN * C], pab[MAXN * 2 * HV],
        pout[MAXN * HV * DV];
    kn_isa_set(isa);
    for (int i = 0; i < n * C; i++) qkv[i] = frand() * 0.25f;
    for (int i = 0; i < n * 2 * HV; i++) ab[i] = frand();
    for (int h = 0; h < HV; h++) A[h] = -0.5f * (1 + frand()), dt[h] = frand();
    for (int i = 0; i < HV * DK * DV; i++) S0[i] = frand();
    kn_gdn_heads_io io = {.n = n,
                          .Hk = HK,
                          .Hv = HV,
                          .dk = DK,
                          .dv = DV,
                          .qkv = qkv,
                          .ld = C,
                          .ab = ab,
                          .neg_exp_A = A,
                          .dt_bias = dt,
                          .S = S,
                          .S0 = S0,
                          .out = out};
    kn_gdn_heads(&io);
    memcpy(Sr, S0, sizeof Sr);
    int diff = 0;
    for (int h = 0; h < HV; h++)
        for (int t0 = 0; t0 < n; t0 += KN_GDN_CHUNK) {
            const int nt = n - t0 < KN_GDN_CHUNK ? n - t0 : KN_GDN_CHUNK;
            float gb[2 * KN_GDN_CHUNK];
            kn_gdn_gates(gb, ab, HV, h, t0, nt, A, dt);
            const float *row = qkv + (size_t)t0 * C;
            const kn_gdn_io g = {.dk = DK,
                                 .dv = DV,
                                 .n = nt,
                                 .q = row + (h / 2) * DK,
                                 .k = row + (HK + h / 2) * DK,
                                 .v = row + 2 * HK * DK + h * DV,
                                 .ld = C,
                                 .g = gb,
                                 .beta = gb + KN_GDN_CHUNK,
                                 .out = outr + (size_t)t0 * HV * DV + h * DV,
                                 .ldo = HV * DV};
            kn_gdn_recurrent(Sr + h * DK * DV, &g);
        }
    diff += !same(S, Sr, HV * DK * DV) || !same(out, outr, (size_t)n * HV * DV);
    int parent[MAXN], order[MAXN], depth[MAXN];
    for (int t = 0; t < n; t++) order[t] = t, depth[t] = t;
    const kn_gdn_tree tree = {.order = order, .depth = depth, .stack = stack, .levels = MAXN, .threads = TH};
    memcpy(S, S0, sizeof S);
    io.S0 = NULL, io.tree = &tree;
    kn_gdn_heads(&io);
    diff += !same(out, outr, (size_t)n * HV * DV) || !same(S, S0, HV * DK * DV);
    int k = 0, tdiff = 0;
    for (int t = 0; t < n; t++) parent[t] = t ? (int)((frand() + 1.0f) * 0.5f * (float)t) % t : -1;
    for (int t = 0; t < n; t++) depth[t] = t ? depth[parent[t]] + 1 : 0;
    preorder(parent, n, 0, order, &k);
    kn_gdn_heads(&io);
    for (int t = 0; t < n; t++) { /* the chain over the root path of t */
        const int len = depth[t] + 1;
        for (int j = len - 1, x = t; j >= 0; j--, x = parent[x]) {
            memcpy(pqkv + (size_t)j * C, qkv + (size_t)x * C, C * sizeof(float));
            memcpy(pab + (size_t)j * 2 * HV, ab + (size_t)x * 2 * HV, 2 * HV * sizeof(float));
        }
        kn_gdn_heads_io pio = io;
        pio.n = len, pio.qkv = pqkv, pio.ab = pab, pio.S = Sr, pio.S0 = S0, pio.out = pout, pio.tree = NULL;
        kn_gdn_heads(&pio);
        tdiff += !same(out + (size_t)t * HV * DV, pout + (size_t)(len - 1) * HV * DV, HV * DV);
    }
    CHECK(tdiff == 0, "%s gdn heads n=%d: %d tree nodes differ from the chain over their path", kn_isa_name(isa), n,
          tdiff);
    diff += !same(S, S0, HV * DK * DV);
    memcpy(S, S0, sizeof S);
    io.S0 = NULL, io.tree = NULL, io.chunked = 1;
    kn_gdn_heads(&io);
    CHECK(max_diff(out, outr, (size_t)n * HV * DV) <= 1e-4 * max_abs(outr, (size_t)n * HV * DV),
          "%s gdn heads n=%d: chunked form off the recurrence", kn_isa_name(isa), n);
    CHECK(diff == 0, "%s gdn heads n=%d: %d results differ from per-head calls", kn_isa_name(isa), n, diff);
}

/* kn_moe_route against a double-precision softmax and a plain top-k (ties: lower id); the
 * experts come out by ascending id, the weights normalised when asked. */
static void check_moe_route(void) {
    enum { E = 37 };
    int bad = 0;
    for (int trial = 0; trial < 40; trial++) {
        const int k = 1 + trial % 8, norm = trial % 2;
        float p[E], lg[E], w[8];
        int idx[8];
        for (int e = 0; e < E; e++) lg[e] = p[e] = frand() * 4;
        if (trial % 3 == 0) lg[30] = p[30] = lg[5] = p[5] = 9; /* a tie: both taken, 5 first */
        kn_moe_route(p, E, k, norm, idx, w);
        double ref[E], mx = -INFINITY, sum = 0, top = 0;
        for (int e = 0; e < E; e++) mx = lg[e] > mx ? lg[e] : mx;
        for (int e = 0; e < E; e++) sum += ref[e] = exp(lg[e] - mx);
        int taken[E] = {0}, want[8];
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if (!taken[e] && (best < 0 || lg[e] > lg[best])) best = e;
            taken[best] = 1, want[j] = best, top += ref[best] / sum;
        }
        for (int j = 0, e = 0; e < E; e++) /* by ascending id */
            if (taken[e]) want[j++] = e;
        for (int j = 0; j < k; j++) {
            const double r = ref[want[j]] / sum / (norm ? top : 1);
            bad += idx[j] != want[j] || fabs(w[j] - r) > 1e-6 * r;
        }
    }
    CHECK(bad == 0, "kn_moe_route: %d experts or weights off the reference", bad);
}

int main(void) {
    check_nonfinite(KN_ISA_GENERIC);
    check_nonfinite(kn_isa_default());
    static const int shapes[][2] = {{1, 1},   {3, 7},    {5, 16},    {17, 31},   {4, 32},
                                    {9, 33},  {67, 100}, {6, 257},   {13, 512},  {16, 32},
                                    {37, 64}, {70, 96},  {130, 256}, {20, 4096}, {40, 8192}};
    static const st_dtype dts[] = {ST_F32, ST_F16, ST_BF16};
    static const int f8_blocks[][2] = {{128, 128}, {16, 32}, {5, 24}};
    const int n_shapes = (int)(sizeof shapes / sizeof shapes[0]);
    check_isa_api();
    check_act_api();
    check_prof(KN_ISA_GENERIC);
    check_prof(kn_isa_default());
    check_f8_codes();
    for (size_t b = 0; b < sizeof f8_blocks / sizeof f8_blocks[0]; b++) {
        f8_brow = f8_blocks[b][0], f8_bcol = f8_blocks[b][1];
        for (int s = 0; s < n_shapes - 2; s++) check_f8_generic(shapes[s][0], shapes[s][1]);
    }
    check_f8_nan(KN_ISA_GENERIC);
    int paths = 0;
    check_alloc();
    for (int i = 1; i < KN_ISA_COUNT; i++) {
        const kn_isa isa = (kn_isa)i;
        if (!kn_isa_supported(isa)) {
            printf("test_kernels: %s not supported by this CPU, skipped\n", kn_isa_name(isa));
            continue;
        }
        paths++;
        for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                check_matmul(isa, dts[d], shapes[s][0], shapes[s][1]);
        for (size_t b = 0; b < sizeof f8_blocks / sizeof f8_blocks[0]; b++) {
            f8_brow = f8_blocks[b][0], f8_bcol = f8_blocks[b][1];
            for (int s = 0; s < (b ? n_shapes - 2 : n_shapes); s++)
                check_matmul(isa, ST_F8_E4M3, shapes[s][0], shapes[s][1]);
        }
        f8_brow = f8_bcol = 128;
        for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) check_matmul_stream(isa, dts[d]);
        check_matmul_stream(isa, ST_F8_E4M3);
        check_f8_nan(isa);
        check_matmul_multi(isa);
        check_matmul_jobs(isa);
        if (isa == KN_ISA_AMX) check_amx_chunks();
        if (isa == KN_ISA_AMX) check_amx_combine();
        if (isa == KN_ISA_AMX) check_amx_passes();
        check_argmax(isa);
        check_matmul_argmax(isa);
        if (isa >= KN_ISA_AVX512 && kn_isa_supported(KN_ISA_AVX512BF16) && kn_act_get() == KN_ACT_F32)
            check_argmax_inversion(isa);
        check_softmax(isa);
        if (kn_isa_supported(KN_ISA_AVX512BF16)) {
            static const int act_shapes[][2] = {{1, 1}, {17, 31}, {67, 100}, {130, 256}, {40, 8192}, {521, 4127}};
            for (size_t s = 0; s < sizeof act_shapes / sizeof act_shapes[0]; s++)
                check_act_bf16(isa, act_shapes[s][0], act_shapes[s][1]);
            check_act_rounding(isa);
        }
        check_dot_axpy(isa);
        check_silu(isa);
        check_attention(isa);
        check_ops(isa);
        check_causal_conv(isa, 37, 4, 9);
        check_causal_conv(isa, 80, 3, 2);
        check_causal_conv(isa, 24, 5, 2); /* a path shorter than the window: part of it from the state */
        check_causal_conv(isa, 16, 1, 5);
        check_gdn_heads(isa, 5);
        check_gdn_heads(isa, 70);
        static const int conv_shapes[][3] = {{37, 16, 4}, {5, 9, 4}, {1, 16, 4}, {12, 3, 3}, {2, 16, 1}, {20, 11, 16}};
        for (size_t s = 0; s < sizeof conv_shapes / sizeof conv_shapes[0]; s++)
            check_conv_silu(isa, conv_shapes[s][0], conv_shapes[s][1], conv_shapes[s][2]);
        static const int gdn_shapes[][3] = {{32, 32, 1},  {32, 32, 70}, {128, 128, 5}, {128, 128, 130},
                                            {24, 40, 65}, {12, 20, 9},  {16, 48, 64}};
        for (size_t s = 0; s < sizeof gdn_shapes / sizeof gdn_shapes[0]; s++)
            check_gdn(isa, gdn_shapes[s][0], gdn_shapes[s][1], gdn_shapes[s][2]);
    }
    check_attention(KN_ISA_GENERIC);
    check_ops(KN_ISA_GENERIC);
    check_matmul_jobs(KN_ISA_GENERIC);
    check_causal_conv(KN_ISA_GENERIC, 37, 4, 9);
    check_gdn_heads(KN_ISA_GENERIC, 70);
    check_moe_route();
    check_dflash2_ops();
    /* the generic path's own chunked form */
    check_gdn(KN_ISA_GENERIC, 32, 32, 150);
    check_gdn(KN_ISA_GENERIC, 7, 5, 66);
    printf("test_kernels: %d SIMD paths checked against generic\n", paths);
    kn_isa_set(kn_isa_default());
    return test_done("test_kernels");
}
