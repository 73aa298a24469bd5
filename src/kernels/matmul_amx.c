/* AMX-BF16 variant of kn_matmul (x86-64 Linux): BF16 weights through TDPBF16PS tiles.
 *
 * y[n][rows] = x[n][cols] . W^T with W BF16 [rows, cols], cols % 32 == 0. A tile (16 rows x 32
 * columns) loads straight from W; the activations are packed once per call into B tiles in
 * the VNNI layout (16 column pairs x 16 tokens x 2), split into three bf16 parts (x = hi + mid
 * + lo to 2^-27 relative, so that C += A.hi, A.mid, A.lo in turn keeps float32 accuracy: the
 * products are exact, the sums float32); C tiles are 16 rows x 16 tokens of float32 sums. A
 * thread takes groups of up to 48 rows (three C tiles, two A tiles in turn, three B tiles: the
 * eight tile registers) and runs every 16-token tile over them, prefetching each row's weights
 * a few steps ahead into L2. Token tiles are always 16 wide (zero tokens pad the last one), so
 * each (row, token) result comes from the same instructions whatever n is. Rows past the last
 * multiple of 16, and weights that are not BF16 or have cols % 32 != 0, go to the AVX-512
 * kernel. */
#include "kn_internal.h"

#if KN_X86 && defined(__linux__)
#include <immintrin.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define TGT_AMX \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")))
#define INLINE static inline __attribute__((always_inline))

#define TILE_ELEMS 512                 /* bf16 elements of one A or B tile (16 x 64 bytes) */
#define SPLIT 3                        /* bf16 parts of each activation: hi, mid, lo */
#define XBLOCK_BYTES (1024 * 1024)     /* packed activations of one token block */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

int kn_amx_request(void) { return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0; }

/* LDTILECFG memory layout (palette 1). */
typedef struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* Row tiles against B tiles of virtual columns: w = the first weight row (row stride ldw
 * bytes), b = the first B tile (bstride elements to the next, TILE_ELEMS per 32-column step,
 * ks_n steps), results to cb [rows][ldc]. Three shapes, each C element always accumulated
 * step by step over the columns, so that the shape never changes a result:
 *   amx_block1: 1 row tile x 1 B tile (decode: a few tokens, the weights streaming from
 *               memory); weight and B tiles alternate between two registers each, so that a
 *               load need not wait for the product that reads the previous one;
 *   amx_block3: 1 row tile x 3 B tiles (16 tokens), weight tiles alternating;
 *   amx_block22: RG (1-2) row tiles x CT (1-2) B tiles (long batches). */
/* The tile intrinsics take their register numbers as literals, hence macros. */
#define AMX_STEP1(a, ldw, bk, TA, TB)      \
    do {                                   \
        _tile_loadd(TB, bk, 64);           \
        _tile_loadd(TA, a, (long)(ldw));   \
        _tile_dpbf16ps(0, TA, TB);         \
    } while (0)

TGT_AMX static void amx_block1(const uint16_t *w, size_t ldw, const uint16_t *b, int ks_n, float *cb, int ldc) {
    _tile_zero(0);
    int ks = 0;
    for (; ks + 1 < ks_n; ks += 2) {
        AMX_STEP1(w + (size_t)ks * 32, ldw, b + (size_t)ks * TILE_ELEMS, 4, 6);
        AMX_STEP1(w + (size_t)(ks + 1) * 32, ldw, b + (size_t)(ks + 1) * TILE_ELEMS, 5, 7);
    }
    if (ks < ks_n) AMX_STEP1(w + (size_t)ks * 32, ldw, b + (size_t)ks * TILE_ELEMS, 4, 6);
    _tile_stored(0, cb, (long)(ldc * sizeof(float)));
}

#define AMX_STEP3(a, ldw, bk, bstride, TA)  \
    do {                                    \
        _tile_loadd(5, bk, 64);             \
        _tile_loadd(6, (bk) + (bstride), 64);     \
        _tile_loadd(7, (bk) + 2 * (bstride), 64); \
        _tile_loadd(TA, a, (long)(ldw));    \
        _tile_dpbf16ps(0, TA, 5);           \
        _tile_dpbf16ps(1, TA, 6);           \
        _tile_dpbf16ps(2, TA, 7);           \
    } while (0)

TGT_AMX static void amx_block3(const uint16_t *w, size_t ldw, const uint16_t *b, size_t bstride, int ks_n, float *cb,
                               int ldc) {
    const size_t ldcb = (size_t)ldc * sizeof(float);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    int ks = 0;
    for (; ks + 1 < ks_n; ks += 2) {
        AMX_STEP3(w + (size_t)ks * 32, ldw, b + (size_t)ks * TILE_ELEMS, bstride, 3);
        AMX_STEP3(w + (size_t)(ks + 1) * 32, ldw, b + (size_t)(ks + 1) * TILE_ELEMS, bstride, 4);
    }
    if (ks < ks_n) AMX_STEP3(w + (size_t)ks * 32, ldw, b + (size_t)ks * TILE_ELEMS, bstride, 3);
    _tile_stored(0, cb, (long)ldcb);
    _tile_stored(1, cb + 16, (long)ldcb);
    _tile_stored(2, cb + 32, (long)ldcb);
}

/* C tile 2r + c = row tile r x B tile c; weight tiles 4-5, B tiles 6-7. */
TGT_AMX INLINE void amx_block22(const uint16_t *w, size_t ldw, const uint16_t *b, size_t bstride, int ks_n, float *cb,
                                int ldc, const int RG, const int CT) {
    const size_t row16 = 16 * ldw / sizeof(uint16_t), ldcb = (size_t)ldc * sizeof(float);
    _tile_zero(0);
    if (CT > 1) _tile_zero(1);
    if (RG > 1) _tile_zero(2);
    if (RG > 1 && CT > 1) _tile_zero(3);
    for (int ks = 0; ks < ks_n; ks++) {
        const uint16_t *a = w + (size_t)ks * 32, *bk = b + (size_t)ks * TILE_ELEMS;
        _tile_loadd(6, bk, 64);
        if (CT > 1) _tile_loadd(7, bk + bstride, 64);
        _tile_loadd(4, a, (long)ldw);
        _tile_dpbf16ps(0, 4, 6);
        if (CT > 1) _tile_dpbf16ps(1, 4, 7);
        if (RG > 1) {
            _tile_loadd(5, a + row16, (long)ldw);
            _tile_dpbf16ps(2, 5, 6);
            if (CT > 1) _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, cb, (long)ldcb);
    if (CT > 1) _tile_stored(1, cb + 16, (long)ldcb);
    if (RG > 1) _tile_stored(2, cb + (size_t)16 * ldc, (long)ldcb);
    if (RG > 1 && CT > 1) _tile_stored(3, cb + (size_t)16 * ldc + 16, (long)ldcb);
}

/* bf16 (round to nearest even) of v[0..31] in order, and the float32 values of the result. */
TGT_AMX INLINE __m512i to_bf16(__m512 v0, __m512 v1, __m512 *f0, __m512 *f1) {
    const __m512i h = (__m512i)_mm512_cvtne2ps_pbh(v1, v0);
    *f0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(h)), 16));
    *f1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(h, 1)), 16));
    return h;
}

/* Pack x [n][cols] into B tiles: virtual column v = SPLIT * t + p holds part p of token t;
 * xb [v / 16][32-column step][16 pairs][16 columns][2] (unused columns zero), so that each
 * column pair lands as one 32-bit word, 64 bytes from the next pair. */
TGT_AMX static void amx_pack(uint16_t *xb, const float *x, int n, int cols, int ct) {
    const int ks_n = cols / 32;
    if (SPLIT * n % 16)
        memset(xb + (size_t)(ct - 1) * ks_n * TILE_ELEMS, 0, (size_t)ks_n * TILE_ELEMS * sizeof(uint16_t));
#pragma omp parallel for schedule(static) if ((size_t)n * cols >= KN_PAR_MIN_WORK)
    for (int t = 0; t < n; t++) {
        uint32_t pairs[SPLIT][16] __attribute__((aligned(64)));
        for (int ks = 0; ks < ks_n; ks++) {
            const float *xs = x + (size_t)t * cols + (size_t)ks * 32;
            __m512 r0 = _mm512_loadu_ps(xs), r1 = _mm512_loadu_ps(xs + 16), f0, f1;
            for (int p = 0; p < SPLIT; p++) { /* each part: bf16 of what the previous ones left */
                _mm512_store_si512(pairs[p], to_bf16(r0, r1, &f0, &f1));
                r0 = _mm512_sub_ps(r0, f0), r1 = _mm512_sub_ps(r1, f1);
            }
            for (int p = 0; p < SPLIT; p++) {
                const int v = SPLIT * t + p;
                uint32_t *dst = (uint32_t *)(xb + ((size_t)(v / 16) * ks_n + ks) * TILE_ELEMS) + v % 16;
                for (int q = 0; q < 16; q++) dst[q * 16] = pairs[p][q];
            }
        }
    }
}

#define C_ROWS 32 /* rows of C results a thread holds: up to 2 row tiles */

/* Tokens per block: whole multiples of 16 (3 B tiles) whose packed activations fit
 * XBLOCK_BYTES, or all n. */
static int amx_tok_block(int cols, int n) {
    int tb = (int)(XBLOCK_BYTES / ((size_t)cols * SPLIT * sizeof(uint16_t))) / 16 * 16;
    if (tb < 16) tb = 16;
    return tb < n ? tb : n;
}
/* C columns of one token block: SPLIT per token, whole tiles. */
static int amx_ldc(int tok_block) { return (SPLIT * tok_block + 15) / 16 * 16; }

/* Token blocks (whole B tiles) whose packed activations stay in L2; each thread runs its row
 * groups over one block, then the next. One B tile (up to 5 tokens) or three (16 tokens):
 * single row tiles, the weights streaming once with the hardware prefetchers; otherwise
 * groups of 2 row tiles x pairs of B tiles. Then y = (hi + mid) + lo per (row, token). */
TGT_AMX static void amx_run(float *y, const dfl_mat *w, int rows16, int n, const uint16_t *xb, int ct, float *cball) {
    const int rows = w->rows, cols = w->cols, ks_n = cols / 32;
    const size_t ldw = (size_t)cols * sizeof(uint16_t), tile_step = (size_t)ks_n * TILE_ELEMS;
    const int tok_block = amx_tok_block(cols, n), rg_max = ct == 1 || ct == 3 ? 1 : 2;
    const int n_groups = (rows16 / 16 + rg_max - 1) / rg_max, ldc = amx_ldc(tok_block);
    const uint16_t *wd = w->data;
#pragma omp parallel if ((size_t)rows16 * cols * n >= KN_PAR_MIN_WORK)
    {
        tile_config cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.palette = 1;
        for (int i = 0; i < 8; i++) cfg.colsb[i] = 64, cfg.rows[i] = 16;
        _tile_loadconfig(&cfg);
        float *cb = cball + (size_t)omp_get_thread_num() * C_ROWS * ldc;
        for (int t0 = 0; t0 < n; t0 += tok_block) {
            const int nb = n - t0 < tok_block ? n - t0 : tok_block;
            const int c0 = SPLIT * t0 / 16, cn = (SPLIT * nb + 15) / 16; /* this block's B tiles */
#pragma omp for schedule(static) nowait
            for (int gi = 0; gi < n_groups; gi++) {
                const int r0 = gi * rg_max * 16, rg = (rows16 - r0) / 16 < rg_max ? (rows16 - r0) / 16 : rg_max;
                const uint16_t *wg = wd + (size_t)r0 * cols, *bt = xb + (size_t)c0 * tile_step;
                if (cn == 1) amx_block1(wg, ldw, bt, ks_n, cb, ldc);
                else if (cn == 3) amx_block3(wg, ldw, bt, tile_step, ks_n, cb, ldc);
                else
                    for (int c = 0; c < cn; c += 2) {
                        const uint16_t *bc = bt + (size_t)c * tile_step;
                        float *cbc = cb + c * 16;
                        if (c + 1 < cn) {
                            if (rg == 2) amx_block22(wg, ldw, bc, tile_step, ks_n, cbc, ldc, 2, 2);
                            else amx_block22(wg, ldw, bc, tile_step, ks_n, cbc, ldc, 1, 2);
                        } else {
                            if (rg == 2) amx_block22(wg, ldw, bc, tile_step, ks_n, cbc, ldc, 2, 1);
                            else amx_block22(wg, ldw, bc, tile_step, ks_n, cbc, ldc, 1, 1);
                        }
                    }
                for (int t = 0; t < nb; t++) {
                    float *yt = y + (size_t)(t0 + t) * rows + r0;
                    const float *c3 = cb + SPLIT * t;
                    for (int r = 0; r < 16 * rg; r++) {
                        const float *cr = c3 + (size_t)r * ldc;
                        yt[r] = (cr[0] + cr[1]) + cr[2];
                    }
                }
            }
        }
        _tile_release();
    }
}

void kn_matmul_amx(float *y, const float *x, const dfl_mat *w, int n) {
    const int rows = w->rows, cols = w->cols, rows16 = rows / 16 * 16, tail = rows - rows16;
    if (n < 1) return;
    if (w->dtype != ST_BF16 || cols % 32 != 0 || rows16 == 0) {
        kn_matmul_avx512(y, x, w, n);
        return;
    }
    const int ct = (SPLIT * n + 15) / 16; /* B tiles of virtual columns */
    uint16_t *xb = aligned_alloc(64, (size_t)ct * (cols / 32) * TILE_ELEMS * sizeof(uint16_t));
    float *cball = aligned_alloc(64, (size_t)omp_get_max_threads() * C_ROWS * amx_ldc(amx_tok_block(cols, n)) * sizeof(float));
    float *ytail = tail ? malloc((size_t)n * tail * sizeof(float)) : NULL;
    if (!xb || !cball || (tail && !ytail)) { /* no memory for the packed activations: the generic kernel needs none */
        free(xb), free(cball), free(ytail);
        kn_matmul_generic(y, x, w, n);
        return;
    }
    amx_pack(xb, x, n, cols, ct);
    amx_run(y, w, rows16, n, xb, ct, cball);
    if (tail) { /* the last rows % 16 rows */
        dfl_mat sub = *w;
        sub.data = (const uint16_t *)w->data + (size_t)rows16 * cols;
        sub.rows = tail;
        kn_matmul_avx512(ytail, x, &sub, n);
        for (int t = 0; t < n; t++)
            memcpy(y + (size_t)t * rows + rows16, ytail + (size_t)t * tail, (size_t)tail * sizeof(float));
    }
    free(xb), free(cball), free(ytail);
}
#endif
