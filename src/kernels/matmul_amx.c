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

#define PREFETCH_STEPS 32              /* 32-column steps the weight prefetch runs ahead */
#define TILE_ELEMS 512                 /* bf16 elements of one A or B tile (16 x 64 bytes) */
#define SPLIT 3                        /* bf16 parts of each activation: hi, mid, lo */
#define G_MAX 3                        /* C tiles per row group */
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

/* One group of g 16-row C tiles (rows of W at w, row stride ldw bytes) against one token tile
 * (xb: ks_n steps of [hi | mid | lo] B tiles); results to cbuf [g][16 rows][16 tokens].
 * prefetch: bring each row's weights PREFETCH_STEPS steps ahead into L2 (first token tile). */
TGT_AMX INLINE void amx_group(const uint16_t *w, size_t ldw, const uint16_t *xb, int ks_n, float *cbuf,
                              int prefetch, const int g) {
    const size_t row16 = 16 * ldw / sizeof(uint16_t); /* elements between C tiles' rows */
    _tile_zero(0);
    if (g > 1) _tile_zero(1);
    if (g > 2) _tile_zero(2);
    for (int ks = 0; ks < ks_n; ks++) {
        const uint16_t *b = xb + (size_t)ks * SPLIT * TILE_ELEMS, *a = w + (size_t)ks * 32;
        if (prefetch)
            for (int r = 0; r < 16 * g; r++)
                _mm_prefetch((const char *)(a + r * (ldw / sizeof(uint16_t)) + PREFETCH_STEPS * 32), _MM_HINT_T2);
        _tile_loadd(5, b, 64);
        _tile_loadd(6, b + TILE_ELEMS, 64);
        _tile_loadd(7, b + 2 * TILE_ELEMS, 64);
        _tile_loadd(3, a, (long)ldw);
        _tile_dpbf16ps(0, 3, 5);
        _tile_dpbf16ps(0, 3, 6);
        _tile_dpbf16ps(0, 3, 7);
        if (g > 1) {
            _tile_loadd(4, a + row16, (long)ldw);
            _tile_dpbf16ps(1, 4, 5);
            _tile_dpbf16ps(1, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
        }
        if (g > 2) {
            _tile_loadd(3, a + 2 * row16, (long)ldw);
            _tile_dpbf16ps(2, 3, 5);
            _tile_dpbf16ps(2, 3, 6);
            _tile_dpbf16ps(2, 3, 7);
        }
    }
    _tile_stored(0, cbuf, 64);
    if (g > 1) _tile_stored(1, cbuf + 256, 64);
    if (g > 2) _tile_stored(2, cbuf + 512, 64);
}

/* bf16 (round to nearest even) of v[0..31] in order, and the float32 values of the result. */
TGT_AMX INLINE __m512i to_bf16(__m512 v0, __m512 v1, __m512 *f0, __m512 *f1) {
    const __m512i h = (__m512i)_mm512_cvtne2ps_pbh(v1, v0);
    *f0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(h)), 16));
    *f1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(h, 1)), 16));
    return h;
}

/* Pack x [n][cols] into xb [token tile][32-column step][hi | mid | lo][16 pairs][16 tokens][2]
 * (pad tokens zero): each column pair lands as one 32-bit word, 64 bytes from the next pair. */
TGT_AMX static void amx_pack(uint16_t *xb, const float *x, int n, int cols, int n_tt) {
    const int ks_n = cols / 32;
    const size_t step = (size_t)SPLIT * TILE_ELEMS;
    if (n % 16) memset(xb + (size_t)(n_tt - 1) * ks_n * step, 0, (size_t)ks_n * step * sizeof(uint16_t));
#pragma omp parallel for schedule(static) if ((size_t)n * cols >= KN_PAR_MIN_WORK)
    for (int t = 0; t < n; t++) {
        const int tt = t / 16, tn = t % 16;
        uint32_t pairs[SPLIT][16] __attribute__((aligned(64)));
        for (int ks = 0; ks < ks_n; ks++) {
            const float *xs = x + (size_t)t * cols + (size_t)ks * 32;
            __m512 r0 = _mm512_loadu_ps(xs), r1 = _mm512_loadu_ps(xs + 16), f0, f1;
            for (int p = 0; p < SPLIT; p++) { /* each part: bf16 of what the previous ones left */
                _mm512_store_si512(pairs[p], to_bf16(r0, r1, &f0, &f1));
                r0 = _mm512_sub_ps(r0, f0), r1 = _mm512_sub_ps(r1, f1);
            }
            uint32_t *dst = (uint32_t *)(xb + ((size_t)tt * ks_n + ks) * step) + tn;
            for (int p = 0; p < SPLIT; p++)
                for (int q = 0; q < 16; q++) dst[(size_t)p * TILE_ELEMS / 2 + q * 16] = pairs[p][q];
        }
    }
}

/* Row groups: 16 rows (one C tile) for a single token tile, where the weights stream from
 * memory and narrow groups keep the reads local; 48 rows (three C tiles sharing each B tile)
 * when there are more tokens to reuse the weights over. Either way each C element is the same
 * sequence of instructions. */
TGT_AMX static void amx_run(float *y, const dfl_mat *w, int rows16, int n, const uint16_t *xb, int n_tt) {
    const int rows = w->rows, cols = w->cols, ks_n = cols / 32;
    const int g_max = n_tt == 1 ? 1 : G_MAX, n_groups = (rows16 / 16 + g_max - 1) / g_max;
    const size_t ldw = (size_t)cols * sizeof(uint16_t);
    int tb = (int)(XBLOCK_BYTES / ((size_t)ks_n * SPLIT * TILE_ELEMS * sizeof(uint16_t)));
    if (tb < 1) tb = 1;
    const uint16_t *wd = w->data;
#pragma omp parallel if ((size_t)rows16 * cols * n >= KN_PAR_MIN_WORK)
    {
        tile_config cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.palette = 1;
        for (int i = 0; i < 8; i++) cfg.colsb[i] = 64, cfg.rows[i] = 16;
        _tile_loadconfig(&cfg);
        float cbuf[G_MAX * 256] __attribute__((aligned(64)));
        for (int tt0 = 0; tt0 < n_tt; tt0 += tb) {
            const int tt1 = tt0 + tb < n_tt ? tt0 + tb : n_tt;
#pragma omp for schedule(static) nowait
            for (int gi = 0; gi < n_groups; gi++) {
                const int r0 = gi * g_max * 16, g = (rows16 - r0) / 16 < g_max ? (rows16 - r0) / 16 : g_max;
                const uint16_t *wg = wd + (size_t)r0 * cols;
                for (int tt = tt0; tt < tt1; tt++) {
                    const uint16_t *xt = xb + (size_t)tt * ks_n * SPLIT * TILE_ELEMS;
                    const int pf = tt == tt0;
                    switch (g) {
                    case 3: amx_group(wg, ldw, xt, ks_n, cbuf, pf, 3); break;
                    case 2: amx_group(wg, ldw, xt, ks_n, cbuf, pf, 2); break;
                    default: amx_group(wg, ldw, xt, ks_n, cbuf, pf, 1); break;
                    }
                    const int nt = n - tt * 16 < 16 ? n - tt * 16 : 16;
                    for (int tn = 0; tn < nt; tn++) {
                        float *yt = y + (size_t)(tt * 16 + tn) * rows + r0;
                        for (int r = 0; r < 16 * g; r++) yt[r] = cbuf[(r / 16) * 256 + (r % 16) * 16 + tn];
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
    const int n_tt = (n + 15) / 16;
    uint16_t *xb = aligned_alloc(64, (size_t)n_tt * (cols / 32) * SPLIT * TILE_ELEMS * sizeof(uint16_t));
    float *ytail = tail ? malloc((size_t)n * tail * sizeof(float)) : NULL;
    if (!xb || (tail && !ytail)) { /* no memory for the packed activations: the generic kernel needs none */
        free(xb), free(ytail);
        kn_matmul_generic(y, x, w, n);
        return;
    }
    amx_pack(xb, x, n, cols, n_tt);
    amx_run(y, w, rows16, n, xb, n_tt);
    if (tail) { /* the last rows % 16 rows */
        dfl_mat sub = *w;
        sub.data = (const uint16_t *)w->data + (size_t)rows16 * cols;
        sub.rows = tail;
        kn_matmul_avx512(ytail, x, &sub, n);
        for (int t = 0; t < n; t++)
            memcpy(y + (size_t)t * rows + rows16, ytail + (size_t)t * tail, (size_t)tail * sizeof(float));
    }
    free(xb), free(ytail);
}
#endif
