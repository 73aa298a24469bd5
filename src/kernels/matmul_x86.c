/* x86-64 SIMD variants of kn_matmul, kn_dot and kn_axpy: AVX2 + FMA, AVX-512 (float32 FMAs)
 * and AVX-512 BF16 (VDPBF16PS), compiled with target attributes so that the rest of the
 * binary stays baseline x86-64. Weights F32, F16, BF16 and block-quantized F8_E4M3.
 *
 * kn_matmul: y[n][rows] = x[n][cols] . W^T. The activations are first laid out for the path
 * (xp [n][ldx]: permuted or split as the weight loads need, zero-padded to whole vectors),
 * then each thread takes blocks of RB rows (one row for one token over a large matrix) and
 * computes RB x TB (row, token) dot products per register tile, reading every weight vector
 * once per tile (BF16 converted in registers: a shift gives the even columns, a mask the odd
 * ones) while prefetching the same columns of the next rows (the hardware prefetchers alone
 * leave much of the bandwidth unused on rows of a few KB; BF16 tiles prefetch into L2 only,
 * which leaves L1 to the activations: 10-20% off a 16-token verification on Zen 4). Tokens are
 * processed in blocks whose activations stay in cache (one pass over a thread's rows per
 * block). Each dot product is one vector accumulator over the columns in order, reduced the
 * same way, so the result for a (row, token) does not depend on n or on the tile it falls in. */
#include "kn_internal.h"

#if KN_X86
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define TGT_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TGT_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")))
#define TGT_BF16 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define INLINE static inline __attribute__((always_inline))

#define RB 4 /* rows per full register tile (AVX2: RB2) */
#define RB2 2
#define TB 6                                  /* tokens per register tile */
#define XBLOCK_BYTES (256 * 1024)             /* activations of one token block */
#define KN_STREAM_MIN_BYTES ((size_t)2 << 20) /* matrices a single token streams row by row */

/* One register tile: rows r0.. of W (w points at row r0), tokens t0.. (xp at token t0),
 * results at y[t][r] = y + t*ldy + r; m is the whole matrix (F8_E4M3 tiles read its block
 * scales). */
typedef void (*tile_fn)(float *y, int ldy, const void *w, int cols, const void *xp, size_t ldx, const dfl_mat *m,
                        int r0);

typedef struct tiles {
    tile_fn full[TB + 1]; /* rb rows, T = 1..tb tokens */
    tile_fn one[TB + 1];  /* 1 row */
    int rb, tb;
} tiles;

/* Weights per dynamic claim of row blocks: a quarter of a thread's share of the region (so that
 * a thread the OS preempts leaves work that the others take over, and a region of a few small
 * matrices, such as a mixture of experts' selected experts, still splits over all threads),
 * within these bounds (each claim starts a new stream for the prefetchers: on 2 threads, claims
 * of a sixteenth of a share made the dense bench target's decode 2-3% slower). */
#define MM_CHUNK_BYTES ((size_t)512 << 10)
#define MM_CHUNK_MIN_BYTES ((size_t)64 << 10)

static size_t round_up(size_t a, size_t b) { return (a + b - 1) / b * b; }

/* One product as mm_run runs it: its activations laid out for the path (xp: n tokens of ldx
 * elements), its full row blocks (nfull of rb rows, then single rows) and the index of its
 * first block in the region's list (b0). */
typedef struct mm_item {
    float *y;
    const dfl_mat *w;
    const char *xp;
    int n, nfull, b0;
} mm_item;

/* Run the tiles over all rows and tokens of count products of one dtype and width (it[i].y
 * [n][w->rows]); each token of xp holds ldx elements of xsize bytes. The products' row blocks
 * form one list that the threads claim dynamically in one parallel region: one fork and join
 * for a layer's projections, or for the gate and up products of all of a mixture of experts'
 * selected experts, instead of one per matrix, and no thread waits for another before the
 * region's end. Token blocks (whose activations stay in cache) run one after the other, each
 * over the list (products with fewer tokens drop out). */
static void mm_run(int count, mm_item *it, size_t ldx, size_t xsize, const tiles *k) {
    const int cols = it[0].w->cols, rb = k->rb, tb = k->tb;
    const size_t wrow = (size_t)cols * st_dtype_size(it[0].w->dtype), xrow = ldx * xsize;
    size_t work = 0, bytes = 0;
    int nblocks = 0, nmax = 0;
    for (int i = 0; i < count; i++) {
        const int rows = it[i].w->rows, n = it[i].n;
        /* One token (decode) over a matrix larger than a core's L2 reads memory-bound: one row
         * at a time keeps a single sequential stream per thread, which the hardware prefetchers
         * follow best (rb interleaved row streams read 20-40% slower). Cache-resident matrices
         * and two or more tokens are bound by the FMAs instead, where rb rows give rb times the
         * independent accumulators and reuse each activation load. */
        const int stream = n == 1 && (size_t)rows * wrow >= KN_STREAM_MIN_BYTES;
        it[i].nfull = stream ? 0 : rows / rb;
        it[i].b0 = nblocks;
        if (n < 1) continue;
        nblocks += it[i].nfull + (rows - it[i].nfull * rb);
        work += (size_t)rows * cols * n, bytes += (size_t)rows * wrow;
        nmax = n > nmax ? n : nmax;
    }
    int nb = (int)(XBLOCK_BYTES / xrow) / tb * tb;
    if (nb < tb) nb = tb;
    size_t claim = bytes / (4 * (size_t)kn_team_now());
    claim = claim > MM_CHUNK_BYTES ? MM_CHUNK_BYTES : claim < MM_CHUNK_MIN_BYTES ? MM_CHUNK_MIN_BYTES : claim;
    const int chunk = (int)(claim / ((size_t)rb * wrow) > 0 ? claim / ((size_t)rb * wrow) : 1); /* blocks */
#pragma omp parallel num_threads(kn_team(work)) if (work >= KN_PAR_MIN_WORK)
    for (int t0 = 0; t0 < nmax; t0 += nb) {
#pragma omp for schedule(dynamic, chunk) nowait
        for (int b = 0; b < nblocks; b++) {
            int lo = 0, hi = count - 1; /* the last product whose blocks start at or before b */
            while (lo < hi) {
                const int mid = (lo + hi + 1) / 2;
                if (it[mid].b0 <= b) lo = mid;
                else hi = mid - 1;
            }
            const mm_item *m = &it[lo];
            if (t0 >= m->n) continue;
            const int t1 = t0 + nb < m->n ? t0 + nb : m->n, rows = m->w->rows, bi = b - m->b0;
            const int r0 = bi < m->nfull ? bi * rb : m->nfull * rb + (bi - m->nfull);
            const tile_fn *fn = bi < m->nfull ? k->full : k->one;
            const char *wd = (const char *)m->w->data + (size_t)r0 * wrow;
            for (int t = t0; t < t1; t += tb) {
                const int T = t1 - t < tb ? t1 - t : tb;
                fn[T](m->y + (size_t)t * rows + r0, rows, wd, cols, m->xp + (size_t)t * xrow, ldx, m->w, r0);
            }
        }
    }
}

/* Lays one token's activations out for the tiles: dst [ldx] from src [cols]. */
typedef void (*row_layout)(void *dst, size_t ldx, const float *src, int cols, int arg);

/* The products' inputs laid out with f into one buffer (returned; NULL when out of memory), one
 * copy for a run of consecutive jobs with the same x and n; it[i].xp point into it. */
static void *mm_layout(int count, const kn_mm_job *j, mm_item *it, size_t ldx, size_t xsize, row_layout f, int arg) {
    size_t rows = 0;
    for (int i = 0; i < count; i++)
        if (j[i].n > 0 && (i == 0 || j[i].x != j[i - 1].x || j[i].n != j[i - 1].n)) rows += (size_t)j[i].n;
    const size_t xrow = ldx * xsize;
    char *buf = malloc(rows * xrow + 1);
    const float **src = malloc((rows + 1) * sizeof *src);
    if (!buf || !src) {
        free(buf), free(src);
        return NULL;
    }
    size_t r = 0;
    for (int i = 0; i < count; i++) {
        if (j[i].n < 1) continue;
        if (i > 0 && j[i].x == j[i - 1].x && j[i].n == j[i - 1].n) {
            it[i].xp = it[i - 1].xp;
            continue;
        }
        it[i].xp = buf + r * xrow;
        for (int t = 0; t < j[i].n; t++) src[r++] = j[i].x + (size_t)t * j[i].w->cols;
    }
    const int cols = j[0].w->cols;
    const size_t work = rows * ldx;
#pragma omp parallel for num_threads(kn_team(work)) schedule(dynamic, kn_chunk((long)rows)) if (work >= KN_PAR_MIN_WORK)
    for (size_t q = 0; q < rows; q++) f(buf + q * xrow, ldx, src[q], cols, arg);
    free(src);
    return buf;
}

/* Each job through the generic kernel (no memory for a laid-out input). */
static void mm_generic(int count, const kn_mm_job *j) {
    for (int i = 0; i < count; i++) kn_matmul_generic(j[i].y, j[i].x, j[i].w, j[i].n);
}

/* Instantiate the tile functions of one kernel body IMPL(y, ldy, w, cols, xp, ldx, R, T) for
 * R = R_FULL and R = 1, T = 1..TB (constant R and T let the compiler keep the tile in
 * registers); the driver uses T <= T_FULL. An IMPL that needs the matrix or the first row
 * (F8_E4M3's scales) names m and r0, the tile function's parameters. */
#define TILE_ARGS float *y, int ldy, const void *w, int cols, const void *xp, size_t ldx, const dfl_mat *m, int r0
#define TILE_FN(TGT, NAME, IMPL, R, T)        \
    TGT static void NAME(TILE_ARGS) {         \
        (void)m, (void)r0;                    \
        IMPL(y, ldy, w, cols, xp, ldx, R, T); \
    }
#define DEF_TILES(TGT, KIND, IMPL, R_FULL, T_FULL)                                                       \
    TILE_FN(TGT, KIND##_f1, IMPL, R_FULL, 1)                                                             \
    TILE_FN(TGT, KIND##_f2, IMPL, R_FULL, 2)                                                             \
    TILE_FN(TGT, KIND##_f3, IMPL, R_FULL, 3)                                                             \
    TILE_FN(TGT, KIND##_f4, IMPL, R_FULL, 4)                                                             \
    TILE_FN(TGT, KIND##_f5, IMPL, R_FULL, 5)                                                             \
    TILE_FN(TGT, KIND##_f6, IMPL, R_FULL, 6)                                                             \
    TILE_FN(TGT, KIND##_o1, IMPL, 1, 1)                                                                  \
    TILE_FN(TGT, KIND##_o2, IMPL, 1, 2)                                                                  \
    TILE_FN(TGT, KIND##_o3, IMPL, 1, 3)                                                                  \
    TILE_FN(TGT, KIND##_o4, IMPL, 1, 4)                                                                  \
    TILE_FN(TGT, KIND##_o5, IMPL, 1, 5)                                                                  \
    TILE_FN(TGT, KIND##_o6, IMPL, 1, 6)                                                                  \
    static const tiles KIND = {{NULL, KIND##_f1, KIND##_f2, KIND##_f3, KIND##_f4, KIND##_f5, KIND##_f6}, \
                               {NULL, KIND##_o1, KIND##_o2, KIND##_o3, KIND##_o4, KIND##_o5, KIND##_o6}, \
                               R_FULL,                                                                   \
                               T_FULL};

/* ---- AVX-512 (float32 FMAs) --------------------------------------------------------------- */

/* The sum of a's 16 lanes in one fixed order: 128-bit quarters (0 + 2) + (1 + 3), then their
 * lanes (0 + 2) + (1 + 3). sum4_512 adds four vectors in that same order, so a 4-row tile and
 * 1-row tiles give the same results bit for bit (batch independence). */
TGT_AVX512 INLINE float sum1_512(__m512 a) {
    const __m512 q = _mm512_add_ps(a, _mm512_shuffle_f32x4(a, a, 0x4e));
    const __m512 u = _mm512_add_ps(q, _mm512_shuffle_f32x4(q, q, 0xb1));
    const __m512 v = _mm512_add_ps(u, _mm512_permute_ps(u, 0x4e));
    return _mm512_cvtss_f32(_mm512_add_ps(v, _mm512_permute_ps(v, 0xb1)));
}

/* The sums of a, b, c and d in sum1_512's order, reduced side by side: 14 instructions where
 * four separate reductions take ~40, which shows when a tile's rows are short. */
TGT_AVX512 INLINE __m128 sum4_512(__m512 a, __m512 b, __m512 c, __m512 d) {
    const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
    const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xee));
    const __m512 u = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xdd));
    const __m512 v = _mm512_add_ps(u, _mm512_permute_ps(u, 0x4e));
    const __m512 s = _mm512_add_ps(v, _mm512_permute_ps(v, 0xb1));
    const __m512i first = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(first, s));
}

/* y[t][r] = the sum of acc[r][t]: a tile's results; rows whose bit is set in nan give NaN. */
_Static_assert(RB == 4, "full tiles reduce their rows with sum4_512");
TGT_AVX512 INLINE void tile_store_512(float *y, int ldy, __m512 (*acc)[TB], const int R, const int T, unsigned nan) {
    if (R == RB) {
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            __m128 s = sum4_512(acc[0][t], acc[1][t], acc[2][t], acc[3][t]);
            if (nan) s = _mm_mask_blend_ps((__mmask8)nan, s, _mm_set1_ps(__builtin_nanf("")));
            _mm_storeu_ps(y + (size_t)t * ldy, s);
        }
        return;
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) y[(size_t)t * ldy + r] = nan >> r & 1 ? __builtin_nanf("") : sum1_512(acc[r][t]);
}

TGT_AVX512 INLINE __m512 bf16_even_512(__m512i v) { return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)); }
TGT_AVX512 INLINE __m512 bf16_odd_512(__m512i v) {
    return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u)));
}

/* BF16 weights, 32 columns per step: lane i of the even (odd) vector holds column 2i (2i+1),
 * so xp holds each 32-column block as [16 even | 16 odd] (bf16_perm). The raw weight vectors
 * stay live for the odd half, hence 5 tokens per tile (20 accumulators). */
#define TB_BF16_512 5
TGT_AVX512 INLINE void step_bf16_512(__m512 (*acc)[TB], const uint16_t *w, int cols, const float *xp, size_t ldx, int c,
                                     __mmask32 m, const int R, const int T) {
    __m512i raw[RB];
    __m512 wr[RB];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        raw[r] = _mm512_maskz_loadu_epi16(m, w + (size_t)r * cols + c);
        wr[r] = bf16_even_512(raw[r]);
        _mm_prefetch((const char *)(w + (size_t)(r + R) * cols + c), _MM_HINT_T1); /* next rows */
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        const __m512 xe = _mm512_loadu_ps(xp + (size_t)t * ldx + c);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) acc[r][t] = _mm512_fmadd_ps(wr[r], xe, acc[r][t]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) wr[r] = bf16_odd_512(raw[r]);
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        const __m512 xo = _mm512_loadu_ps(xp + (size_t)t * ldx + c + 16);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) acc[r][t] = _mm512_fmadd_ps(wr[r], xo, acc[r][t]);
    }
}

TGT_AVX512 INLINE void tile_bf16_512(float *y, int ldy, const void *wv, int cols, const void *xv, size_t ldx,
                                     const int R, const int T) {
    const uint16_t *w = wv;
    const float *xp = xv;
    __m512 acc[RB][TB];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    int c = 0;
    for (; c + 32 <= cols; c += 32) step_bf16_512(acc, w, cols, xp, ldx, c, 0xffffffffu, R, T);
    if (c < cols) step_bf16_512(acc, w, cols, xp, ldx, c, (1u << (cols - c)) - 1, R, T);
    tile_store_512(y, ldy, acc, R, T, 0);
}

/* F16 / F32 weights, 16 columns per step, activations in natural order (masked tails). */
TGT_AVX512 INLINE __m512 load16_512(const void *w, st_dtype dt, size_t off, __mmask16 m) {
    if (dt == ST_F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)w + off));
    return _mm512_maskz_loadu_ps(m, (const float *)w + off);
}

TGT_AVX512 INLINE void step_w16_512(__m512 (*acc)[TB], const void *w, int cols, const float *x, size_t ldx, int c,
                                    __mmask16 m, const int R, const int T, const st_dtype dt) {
    __m512 wr[RB];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        wr[r] = load16_512(w, dt, (size_t)r * cols + c, m);
        _mm_prefetch((const char *)w + ((size_t)(r + R) * cols + c) * (dt == ST_F16 ? 2 : 4), _MM_HINT_T0);
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        const __m512 xt = _mm512_maskz_loadu_ps(m, x + (size_t)t * ldx + c);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) acc[r][t] = _mm512_fmadd_ps(wr[r], xt, acc[r][t]);
    }
}

TGT_AVX512 INLINE void tile_w16_512(float *y, int ldy, const void *w, int cols, const void *xv, size_t ldx, const int R,
                                    const int T, const st_dtype dt) {
    const float *x = xv;
    __m512 acc[RB][TB];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    int c = 0;
    for (; c + 16 <= cols; c += 16) step_w16_512(acc, w, cols, x, ldx, c, 0xffff, R, T, dt);
    if (c < cols) step_w16_512(acc, w, cols, x, ldx, c, (__mmask16)((1u << (cols - c)) - 1), R, T, dt);
    tile_store_512(y, ldy, acc, R, T, 0);
}

/* The multiplier of a block's F8_E4M3 codes widened as below: scale * 2^120, or the scale itself
 * with *big set when that product could overflow. */
static inline float step_scale(float scale, int *big) {
    *big = !(fabsf(scale) < 0x1p8f);
    return *big ? scale : scale * 0x1p120f;
}

/* F8_E4M3 weights, 16 columns per step, activations in natural order (masked tails): each code
 * sign-extended to 32 bits and shifted left by 20 puts its magnitude bits into a float32's
 * exponent and mantissa fields (the value times 2^-120, exactly) and its sign into bits 27-31,
 * of which the mask keeps bit 31; one product by scale * 2^120 then rounds the exact value
 * once: each weight equals st_f8e4m3_to_f32(code) * scale bit for bit, but for the NaN codes,
 * which are only noted (*nan), their row's outputs then set to NaN as a NaN weight makes them.
 * A scale of magnitude 2^8 or more (or not finite), where scale * 2^120 would overflow, takes a
 * separate exact product by 2^120 first (step_scale). The driver gives this tile rows of one
 * block row (brow % RB == 0) and steps inside one column block (bcol % 16 == 0); sc holds the
 * block row's scales. */
TGT_AVX512 INLINE __m512 f8_dequant_512(const uint8_t *p, __mmask16 m, __m512 s, int big, __mmask16 *nan) {
    const __m128i raw = _mm_maskz_loadu_epi8(m, p);
    *nan |= _mm_cmpeq_epi8_mask(_mm_or_si128(raw, _mm_set1_epi8((char)0x80)), _mm_set1_epi8((char)0xff));
    __m512 v = _mm512_castsi512_ps(
        _mm512_and_si512(_mm512_slli_epi32(_mm512_cvtepi8_epi32(raw), 20), _mm512_set1_epi32((int)0x87f00000u)));
    if (big) v = _mm512_mul_ps(v, _mm512_set1_ps(0x1p120f));
    return _mm512_mul_ps(v, s);
}

TGT_AVX512 INLINE void tile_f8_512(float *y, int ldy, const void *wv, int cols, const void *xv, size_t ldx, const int R,
                                   const int T, const float *sc, int bcol) {
    const uint8_t *w = wv;
    const float *x = xv;
    __m512 acc[RB][TB], s = _mm512_setzero_ps();
    int big = 0, left = 0; /* columns of the current block left */
    __mmask16 nan[RB];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        nan[r] = 0;
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    }
    for (int c = 0; c < cols; c += 16) {
        const __mmask16 m = cols - c >= 16 ? 0xffff : (__mmask16)((1u << (cols - c)) - 1);
        if (left == 0) s = _mm512_set1_ps(step_scale(*sc++, &big)), left = bcol; /* a new block */
        left -= 16;
        __m512 wr[RB];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            wr[r] = f8_dequant_512(w + (size_t)r * cols + c, m, s, big, &nan[r]);
            _mm_prefetch((const char *)(w + (size_t)(r + R) * cols + c), _MM_HINT_T0);
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const __m512 xt = _mm512_maskz_loadu_ps(m, x + (size_t)t * ldx + c);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) acc[r][t] = _mm512_fmadd_ps(wr[r], xt, acc[r][t]);
        }
    }
    unsigned nanrows = 0;
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) nanrows |= (unsigned)(nan[r] != 0) << r;
    tile_store_512(y, ldy, acc, R, T, nanrows);
}

#define TILE_F16_512(y, ldy, w, cols, xp, ldx, R, T) tile_w16_512(y, ldy, w, cols, xp, ldx, R, T, ST_F16)
#define TILE_F32_512(y, ldy, w, cols, xp, ldx, R, T) tile_w16_512(y, ldy, w, cols, xp, ldx, R, T, ST_F32)
#define TILE_F8_512(y, ldy, w, cols, xp, ldx, R, T) \
    tile_f8_512(y, ldy, w, cols, xp, ldx, R, T, kn_f8_scale_row(m, r0), m->bcol)
DEF_TILES(TGT_AVX512, tiles_bf16_512, tile_bf16_512, RB, TB_BF16_512)
DEF_TILES(TGT_AVX512, tiles_f16_512, TILE_F16_512, RB, TB)
DEF_TILES(TGT_AVX512, tiles_f32_512, TILE_F32_512, RB, TB)
DEF_TILES(TGT_AVX512, tiles_f8_512, TILE_F8_512, RB, TB)

/* One token's 32-column blocks as [16 even | 16 odd] (AVX-512: two permutes per block). */
TGT_AVX512 static void bf16_perm32_512(float *d, size_t ldx, const float *xs, int cols) {
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
    for (size_t b = 0; b < ldx; b += 32) {
        const int left = b < (size_t)cols ? cols - (int)b : 0;
        const __mmask16 m0 = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
        const __mmask16 m1 = left >= 32 ? 0xffff : left > 16 ? (__mmask16)((1u << (left - 16)) - 1) : 0;
        const __m512 a = _mm512_maskz_loadu_ps(m0, xs + b), c = _mm512_maskz_loadu_ps(m1, xs + b + 16);
        _mm512_storeu_ps(d + b, _mm512_permutex2var_ps(a, ev, c));
        _mm512_storeu_ps(d + b + 16, _mm512_permutex2var_ps(a, od, c));
    }
}

/* One token's x [cols] with each block of `blk` columns reordered [even | odd], zero-padded to
 * ldx. */
static void bf16_perm_row(void *dst, size_t ldx, const float *xs, int cols, int blk) {
    float *d = dst;
    if (blk == 32) { /* only the AVX-512 path lays its activations out in 32-column blocks */
        bf16_perm32_512(d, ldx, xs, cols);
        return;
    }
    for (size_t b = 0; b < ldx; b += (size_t)blk)
        for (int i = 0; i < blk / 2; i++) {
            const size_t e = b + 2 * (size_t)i, o = e + 1;
            d[b + (size_t)i] = e < (size_t)cols ? xs[e] : 0.0f;
            d[b + (size_t)(blk / 2 + i)] = o < (size_t)cols ? xs[o] : 0.0f;
        }
}

#define MM_ITEMS_STACK 16

/* y = x . W^T for count jobs of one dtype and width with one width's tile tables; BF16 weights
 * take activations laid out to match the interleaved pairs the tiles read (blk floats per
 * group). F8_E4M3 tiles step f8_step columns: blocks that a tile's rows or a step would
 * straddle (released checkpoints use 128 x 128) go to the generic kernel. */
static void mm_dispatch(int count, const kn_mm_job *j, int blk, const tiles *bf16, const tiles *f16, const tiles *f32,
                        const tiles *f8, int f8_step) {
    const dfl_mat *w0 = j[0].w;
    int f8_ok = w0->dtype == ST_F8_E4M3, any = 0;
    for (int i = 0; i < count; i++) {
        f8_ok = f8_ok && j[i].w->brow % f8->rb == 0 && j[i].w->bcol % f8_step == 0;
        any |= j[i].n > 0;
    }
    if (!any) return;
    if (w0->dtype == ST_F8_E4M3 && !f8_ok && count > 1) { /* each as it would go alone */
        for (int i = 0; i < count; i++) mm_dispatch(1, &j[i], blk, bf16, f16, f32, f8, f8_step);
        return;
    }
    mm_item stack[MM_ITEMS_STACK], *it = count <= MM_ITEMS_STACK ? stack : malloc((size_t)count * sizeof *it);
    if (!it) { /* no memory for the list: the generic kernel needs none */
        mm_generic(count, j);
        return;
    }
    for (int i = 0; i < count; i++)
        it[i] = (mm_item){.y = j[i].y, .w = j[i].w, .xp = (const char *)j[i].x, .n = j[i].n};
    const size_t cols = (size_t)w0->cols;
    if (w0->dtype == ST_BF16) {
        const size_t ldx = round_up(cols, (size_t)blk);
        void *xp = mm_layout(count, j, it, ldx, sizeof(float), bf16_perm_row, blk);
        if (xp) mm_run(count, it, ldx, sizeof(float), bf16);
        else mm_generic(count, j); /* no memory for the laid-out activations */
        free(xp);
    } else if (w0->dtype == ST_F16) {
        mm_run(count, it, cols, sizeof(float), f16);
    } else if (w0->dtype == ST_F32) {
        mm_run(count, it, cols, sizeof(float), f32);
    } else if (f8_ok) {
        mm_run(count, it, cols, sizeof(float), f8);
    } else { /* F8_E4M3 with other blocks; aborts on dtypes the loader refuses */
        mm_generic(count, j);
    }
    if (it != stack) free(it);
}

void kn_matmul_avx512(int count, const kn_mm_job *j) {
    mm_dispatch(count, j, 32, &tiles_bf16_512, &tiles_f16_512, &tiles_f32_512, &tiles_f8_512, 16);
}

TGT_AVX512 INLINE float dot_512(const float *a, const float *b, int n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    }
    for (; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

TGT_AVX512 float kn_dot_avx512(const float *a, const float *b, int n) { return dot_512(a, b, n); }

/* Values whose exponent bits are all ones (NaN, +-Inf), four vectors a step. */
TGT_AVX512 size_t kn_count_nonfinite_avx512(const float *x, size_t n) {
    const __m512i e = _mm512_set1_epi32(0x7f800000);
    size_t bad = 0, i = 0;
    for (; i + 64 <= n; i += 64) {
        __mmask16 k[4];
        for (int j = 0; j < 4; j++)
            k[j] = _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_loadu_si512(x + i + 16 * j), e), e);
        bad += (size_t)__builtin_popcount(k[0]) + __builtin_popcount(k[1]) + __builtin_popcount(k[2]) +
               __builtin_popcount(k[3]);
    }
    for (; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        bad += __builtin_popcount(
            _mm512_mask_cmpeq_epi32_mask(m, _mm512_and_si512(_mm512_maskz_loadu_epi32(m, x + i), e), e));
    }
    return bad;
}

/* Two passes: the largest value (ordered comparisons, so NaNs are skipped as the generic loop's
 * x[i] > x[best] skips them), then the first index holding it (-0 == +0, as there). */
TGT_AVX512 int kn_argmax_avx512(const float *x, int n) {
    if (n < 1 || x[0] != x[0]) return 0; /* nothing compares greater than a NaN in x[0] */
    __m512 m = _mm512_set1_ps(x[0]);
    for (int i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512 v = _mm512_maskz_loadu_ps(k, x + i);
        m = _mm512_mask_mov_ps(m, _mm512_mask_cmp_ps_mask(k, v, m, _CMP_GT_OQ), v);
    }
    const float best = _mm512_reduce_max_ps(m); /* lanes hold x[0] or values above it: no NaN */
    const __m512 b = _mm512_set1_ps(best);
    for (int i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __mmask16 eq = _mm512_mask_cmp_ps_mask(k, _mm512_maskz_loadu_ps(k, x + i), b, _CMP_EQ_OQ);
        if (eq) return i + __builtin_ctz(eq);
    }
    return 0; /* not reached: best is one of the values */
}

/* Up to 4 query rows against one key row at a time: each dot product takes dot_512's loads,
 * FMAs and reduction in the same order, so grouping never changes a result. */
TGT_AVX512 INLINE void dot_rows_512(float *out, size_t ldo, const float *a, size_t lda, const float *b, size_t ldb,
                                    int m, int n, const int NG) {
    for (int j = 0; j < m; j++) {
        const float *bj = b + (size_t)j * ldb;
        __m512 s0[4], s1[4];
#pragma GCC unroll 8
        for (int g = 0; g < NG; g++) s0[g] = s1[g] = _mm512_setzero_ps();
        int i = 0;
        for (; i + 32 <= n; i += 32) {
            const __m512 b0 = _mm512_loadu_ps(bj + i), b1 = _mm512_loadu_ps(bj + i + 16);
#pragma GCC unroll 8
            for (int g = 0; g < NG; g++) {
                s0[g] = _mm512_fmadd_ps(_mm512_loadu_ps(a + (size_t)g * lda + i), b0, s0[g]);
                s1[g] = _mm512_fmadd_ps(_mm512_loadu_ps(a + (size_t)g * lda + i + 16), b1, s1[g]);
            }
        }
        for (; i < n; i += 16) {
            const __mmask16 mk = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
            const __m512 b0 = _mm512_maskz_loadu_ps(mk, bj + i);
#pragma GCC unroll 8
            for (int g = 0; g < NG; g++)
                s0[g] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, a + (size_t)g * lda + i), b0, s0[g]);
        }
#pragma GCC unroll 8
        for (int g = 0; g < NG; g++) out[(size_t)g * ldo + j] = _mm512_reduce_add_ps(_mm512_add_ps(s0[g], s1[g]));
    }
}

TGT_AVX512 void kn_dot_rows_avx512(float *out, size_t ldo, const float *a, size_t lda, int G, const float *b,
                                   size_t ldb, int m, int n) {
    int g = 0;
    for (; g + 4 <= G; g += 4) dot_rows_512(out + (size_t)g * ldo, ldo, a + (size_t)g * lda, lda, b, ldb, m, n, 4);
    for (; g + 2 <= G; g += 2) dot_rows_512(out + (size_t)g * ldo, ldo, a + (size_t)g * lda, lda, b, ldb, m, n, 2);
    if (g < G) dot_rows_512(out + (size_t)g * ldo, ldo, a + (size_t)g * lda, lda, b, ldb, m, n, 1);
}

/* y_g += w_g[j] x_j over the rows in order for NG query rows, 16 * NV columns of each y_g held
 * in registers (NG * NV <= 16) while each x_j is loaded once: every element gets the same FMAs
 * in the same order as repeated kn_axpy_avx512 calls. */
TGT_AVX512 INLINE void axpy_rows_512(float *y, size_t ldy, const float *w, size_t ldw, const float *x, size_t ldx,
                                     int m, int n, const int NG, const int NV) {
    for (int c0 = 0; c0 < n; c0 += 16 * NV) {
        const int nv = (n - c0 + 15) / 16 < NV ? (n - c0 + 15) / 16 : NV;
        __m512 acc[4][8];
        __mmask16 mk[8];
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) {
            const int i = c0 + 16 * v;
            mk[v] = v >= nv ? 0 : n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
#pragma GCC unroll 8
            for (int g = 0; g < NG; g++) acc[g][v] = _mm512_maskz_loadu_ps(mk[v], y + (size_t)g * ldy + i);
        }
        for (int j = 0; j < m; j++) {
            const float *xj = x + (size_t)j * ldx + c0;
            __m512 xv[8];
#pragma GCC unroll 8
            for (int v = 0; v < NV; v++) xv[v] = _mm512_maskz_loadu_ps(mk[v], xj + 16 * v);
#pragma GCC unroll 8
            for (int g = 0; g < NG; g++) {
                const float wj = w[(size_t)g * ldw + j];
                if (wj == 0.0f) continue;
                const __m512 va = _mm512_set1_ps(wj);
#pragma GCC unroll 8
                for (int v = 0; v < NV; v++) acc[g][v] = _mm512_fmadd_ps(va, xv[v], acc[g][v]);
            }
        }
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) /* (mask 0 past nv: stores nothing) */
#pragma GCC unroll 8
            for (int g = 0; g < NG; g++) _mm512_mask_storeu_ps(y + (size_t)g * ldy + c0 + 16 * v, mk[v], acc[g][v]);
    }
}

/* NG query rows, NV vectors per pass: no wider than the rows (short heads), at most 16
 * accumulators. */
TGT_AVX512 INLINE void axpy_rows_ng(float *y, size_t ldy, const float *w, size_t ldw, const float *x, size_t ldx, int m,
                                    int n, const int NG) {
    const int nvec = (n + 15) / 16;
    if (nvec <= 1) axpy_rows_512(y, ldy, w, ldw, x, ldx, m, n, NG, 1);
    else if (nvec <= 2) axpy_rows_512(y, ldy, w, ldw, x, ldx, m, n, NG, 2);
    else if (nvec <= 4 || NG == 4) axpy_rows_512(y, ldy, w, ldw, x, ldx, m, n, NG, 4);
    else axpy_rows_512(y, ldy, w, ldw, x, ldx, m, n, NG, 8);
}

TGT_AVX512 void kn_axpy_rows_avx512(float *y, size_t ldy, const float *w, size_t ldw, int G, const float *x, size_t ldx,
                                    int m, int n) {
    int g = 0;
    for (; g + 4 <= G; g += 4) axpy_rows_ng(y + (size_t)g * ldy, ldy, w + (size_t)g * ldw, ldw, x, ldx, m, n, 4);
    for (; g + 2 <= G; g += 2) axpy_rows_ng(y + (size_t)g * ldy, ldy, w + (size_t)g * ldw, ldw, x, ldx, m, n, 2);
    if (g < G) axpy_rows_ng(y + (size_t)g * ldy, ldy, w + (size_t)g * ldw, ldw, x, ldx, m, n, 1);
}

TGT_AVX512 void kn_axpy_avx512(float *y, float a, const float *x, int n) {
    const __m512 va = _mm512_set1_ps(a);
    for (int i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512 r = _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i));
        _mm512_mask_storeu_ps(y + i, m, r);
    }
}

/* ---- AVX-512 BF16 (VDPBF16PS) -------------------------------------------------------------- */

/* BF16 weights, 32 columns per step used as they are stored; xp[t] holds the activations as
 * bf16 pairs in natural order in S parts of ldx/S each: with S = 3, hi, mid, lo with
 * x = hi + mid + lo to 2^-27 relative (float32 accuracy); with S = 1 (KN_ACT_BF16) x rounded
 * to bf16 once. acc += w.part for each part in turn (products exact, sums float32). */
TGT_BF16 INLINE void step_bf16_dp(__m512 (*acc)[TB], const uint16_t *w, int cols, const uint16_t *xp, size_t ldx, int c,
                                  __mmask32 m, const int R, const int T, const int S) {
    const size_t part = ldx / S;
    __m512bh wr[RB];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        wr[r] = (__m512bh)_mm512_maskz_loadu_epi16(m, w + (size_t)r * cols + c);
        _mm_prefetch((const char *)(w + (size_t)(r + R) * cols + c), _MM_HINT_T1);
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++)
#pragma GCC unroll 4
        for (int p = 0; p < S; p++) {
            const __m512bh xv = (__m512bh)_mm512_loadu_si512(xp + (size_t)t * ldx + p * part + c);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], wr[r], xv);
        }
}

TGT_BF16 INLINE void tile_bf16_dp(float *y, int ldy, const void *wv, int cols, const void *xv, size_t ldx, const int R,
                                  const int T, const int S) {
    const uint16_t *w = wv, *xp = xv;
    __m512 acc[RB][TB];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    int c = 0;
    for (; c + 32 <= cols; c += 32) step_bf16_dp(acc, w, cols, xp, ldx, c, 0xffffffffu, R, T, S);
    if (c < cols) step_bf16_dp(acc, w, cols, xp, ldx, c, (1u << (cols - c)) - 1, R, T, S);
    tile_store_512(y, ldy, acc, R, T, 0);
}

#define TILE_BF16_DP3(y, ldy, w, cols, xp, ldx, R, T) tile_bf16_dp(y, ldy, w, cols, xp, ldx, R, T, 3)
#define TILE_BF16_DP1(y, ldy, w, cols, xp, ldx, R, T) tile_bf16_dp(y, ldy, w, cols, xp, ldx, R, T, 1)
DEF_TILES(TGT_BF16, tiles_bf16_dp3, TILE_BF16_DP3, RB, TB)
DEF_TILES(TGT_BF16, tiles_bf16_dp1, TILE_BF16_DP1, RB, TB)

/* 16 floats to bf16, rounded to nearest even with NaNs kept quiet: st_f32_to_bf16 bit for bit
 * (integer rounding, so subnormals are not flushed as VCVTNEPS2BF16 would). */
TGT_AVX512 INLINE __m256i f32_to_bf16_512(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan =
        _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
}

/* One token's activations x[cols] as S bf16 parts of `part` (>= cols, a multiple of 16) each:
 * part p rounds what the parts before it leave (x - hi - ...), zero past cols. */
TGT_AVX512 static void bf16_parts_512(uint16_t *d, size_t part, const float *x, int cols, const int S) {
    for (size_t c = 0; c < part; c += 16) {
        const size_t left = c < (size_t)cols ? (size_t)cols - c : 0;
        const __mmask16 m = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
        __m512 v = _mm512_maskz_loadu_ps(m, x + c);
        for (int p = 0; p < S; p++) {
            const __m256i h = f32_to_bf16_512(v);
            _mm256_storeu_si256((__m256i *)(d + p * part + c), h);
            if (p + 1 < S) /* what this part leaves: exact (x and the part are close) */
                v = _mm512_sub_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
        }
    }
}

/* One token's activations as S bf16 parts of ldx / S each. */
static void bf16_parts_row(void *dst, size_t ldx, const float *xs, int cols, int S) {
    bf16_parts_512(dst, ldx / (size_t)S, xs, cols, S);
}

/* The activations as S bf16 parts per token (what the parts so far leave, rounded), then the
 * tiles. */
static void mm_bf16_dp(int count, const kn_mm_job *j, const int S, const tiles *k) {
    int any = 0;
    for (int i = 0; i < count; i++) any |= j[i].n > 0;
    if (!any) return;
    mm_item stack[MM_ITEMS_STACK], *it = count <= MM_ITEMS_STACK ? stack : malloc((size_t)count * sizeof *it);
    if (!it) { /* no memory for the list: the generic kernel needs none */
        mm_generic(count, j);
        return;
    }
    for (int i = 0; i < count; i++) it[i] = (mm_item){.y = j[i].y, .w = j[i].w, .n = j[i].n};
    const size_t ldx = (size_t)S * round_up((size_t)j[0].w->cols, 32);
    void *xp = mm_layout(count, j, it, ldx, sizeof(uint16_t), bf16_parts_row, S);
    if (xp) mm_run(count, it, ldx, sizeof(uint16_t), k);
    else mm_generic(count, j); /* no memory for the split activations */
    free(xp);
    if (it != stack) free(it);
}

void kn_matmul_avx512bf16(int count, const kn_mm_job *j) { mm_bf16_dp(count, j, 3, &tiles_bf16_dp3); }

void kn_matmul_bf16act(int count, const kn_mm_job *j) { mm_bf16_dp(count, j, 1, &tiles_bf16_dp1); }

/* ---- AVX2 + FMA --------------------------------------------------------------------------- */

TGT_AVX2 INLINE float hsum_256(__m256 v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 h = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

/* Lanes < k set: a maskload mask. */
TGT_AVX2 INLINE __m256i mask8(int k) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* BF16 weights, 16 columns per step ([8 even | 8 odd] per 16-column block of xp); wp[r] points
 * at row r's 16 weights of this step. */
TGT_AVX2 INLINE void step_bf16_256(__m256 (*acc)[TB], const uint16_t *const *wp, const float *xp, size_t ldx,
                                   const int R, const int T) {
    __m256 wr[RB2];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        wr[r] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)wp[r]), 16));
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        const __m256 xe = _mm256_loadu_ps(xp + (size_t)t * ldx);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) acc[r][t] = _mm256_fmadd_ps(wr[r], xe, acc[r][t]);
    }
    const __m256i hi_mask = _mm256_set1_epi32((int)0xffff0000u);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        wr[r] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)wp[r]), hi_mask));
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        const __m256 xo = _mm256_loadu_ps(xp + (size_t)t * ldx + 8);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) acc[r][t] = _mm256_fmadd_ps(wr[r], xo, acc[r][t]);
    }
}

/* The tail of each row (< 16 columns) goes through a zero-padded copy. */
TGT_AVX2 INLINE void tile_bf16_256(float *y, int ldy, const void *wv, int cols, const void *xv, size_t ldx, const int R,
                                   const int T) {
    const uint16_t *w = wv;
    const float *xp = xv;
    __m256 acc[RB2][TB];
    const uint16_t *wp[RB2];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    int c = 0;
    for (; c + 16 <= cols; c += 16) {
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            wp[r] = w + (size_t)r * cols + c;
            _mm_prefetch((const char *)(wp[r] + (size_t)R * cols), _MM_HINT_T0);
        }
        step_bf16_256(acc, wp, xp + c, ldx, R, T);
    }
    if (c < cols) {
        uint16_t pad[RB2][16] = {{0}};
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            memcpy(pad[r], w + (size_t)r * cols + c, (size_t)(cols - c) * sizeof(uint16_t));
            wp[r] = pad[r];
        }
        step_bf16_256(acc, wp, xp + c, ldx, R, T);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) y[(size_t)t * ldy + r] = hsum_256(acc[r][t]);
}

/* Floats p[0..min(k,8)), zeros after. */
TGT_AVX2 INLINE __m256 loadf8_256(const float *p, int k) {
    return k >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mask8(k));
}

/* F16 / F32 weights, 8 columns per step, activations in natural order. */
TGT_AVX2 INLINE __m256 load8_256(const void *w, st_dtype dt, size_t off, int k) {
    if (dt == ST_F32) return loadf8_256((const float *)w + off, k);
    const uint16_t *p = (const uint16_t *)w + off;
    if (k >= 8) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    uint16_t pad[8] = {0};
    memcpy(pad, p, (size_t)k * sizeof(uint16_t));
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)pad));
}

TGT_AVX2 INLINE void tile_w8_256(float *y, int ldy, const void *w, int cols, const void *xv, size_t ldx, const int R,
                                 const int T, const st_dtype dt) {
    const float *x = xv;
    __m256 acc[RB2][TB];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (int c = 0; c < cols; c += 8) {
        const int k = cols - c;
        __m256 wr[RB2];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            wr[r] = load8_256(w, dt, (size_t)r * cols + c, k);
            _mm_prefetch((const char *)w + ((size_t)(r + R) * cols + c) * (dt == ST_F16 ? 2 : 4), _MM_HINT_T0);
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const __m256 xt = loadf8_256(x + (size_t)t * ldx + c, k);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) acc[r][t] = _mm256_fmadd_ps(wr[r], xt, acc[r][t]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) y[(size_t)t * ldy + r] = hsum_256(acc[r][t]);
}

/* F8_E4M3 weights, 8 columns per step (bcol % 8 == 0), as tile_f8_512; the tail of a row
 * (< 8 columns) goes through a zero-padded copy. */
TGT_AVX2 INLINE __m256 f8_dequant_256(const uint8_t *p, int k, __m256 s, int big) {
    uint8_t pad[8] = {0};
    if (k < 8) memcpy(pad, p, (size_t)k), p = pad;
    const __m256i bits =
        _mm256_and_si256(_mm256_slli_epi32(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)), 20),
                         _mm256_set1_epi32((int)0x87f00000u));
    __m256 v = _mm256_castsi256_ps(bits);
    if (big) v = _mm256_mul_ps(v, _mm256_set1_ps(0x1p120f));
    const __m256 w = _mm256_mul_ps(v, s);
    const __m256i nan =
        _mm256_cmpeq_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7ff00000)), _mm256_set1_epi32(0x07f00000));
    return _mm256_blendv_ps(w, _mm256_set1_ps(__builtin_nanf("")), _mm256_castsi256_ps(nan));
}

TGT_AVX2 INLINE void tile_f8_256(float *y, int ldy, const void *wv, int cols, const void *xv, size_t ldx, const int R,
                                 const int T, const float *sc, int bcol) {
    const uint8_t *w = wv;
    const float *x = xv;
    __m256 acc[RB2][TB], s = _mm256_setzero_ps();
    int big = 0, left = 0; /* columns of the current block left */
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (int c = 0; c < cols; c += 8) {
        const int k = cols - c;
        if (left == 0) s = _mm256_set1_ps(step_scale(*sc++, &big)), left = bcol; /* a new block */
        left -= 8;
        __m256 wr[RB2];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            wr[r] = f8_dequant_256(w + (size_t)r * cols + c, k, s, big);
            _mm_prefetch((const char *)(w + (size_t)(r + R) * cols + c), _MM_HINT_T0);
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const __m256 xt = loadf8_256(x + (size_t)t * ldx + c, k);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) acc[r][t] = _mm256_fmadd_ps(wr[r], xt, acc[r][t]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) y[(size_t)t * ldy + r] = hsum_256(acc[r][t]);
}

#define TILE_F16_256(y, ldy, w, cols, xp, ldx, R, T) tile_w8_256(y, ldy, w, cols, xp, ldx, R, T, ST_F16)
#define TILE_F32_256(y, ldy, w, cols, xp, ldx, R, T) tile_w8_256(y, ldy, w, cols, xp, ldx, R, T, ST_F32)
#define TILE_F8_256(y, ldy, w, cols, xp, ldx, R, T) \
    tile_f8_256(y, ldy, w, cols, xp, ldx, R, T, kn_f8_scale_row(m, r0), m->bcol)
DEF_TILES(TGT_AVX2, tiles_bf16_256, tile_bf16_256, RB2, TB)
DEF_TILES(TGT_AVX2, tiles_f16_256, TILE_F16_256, RB2, TB)
DEF_TILES(TGT_AVX2, tiles_f32_256, TILE_F32_256, RB2, TB)
DEF_TILES(TGT_AVX2, tiles_f8_256, TILE_F8_256, RB2, TB)

void kn_matmul_avx2(int count, const kn_mm_job *j) {
    mm_dispatch(count, j, 16, &tiles_bf16_256, &tiles_f16_256, &tiles_f32_256, &tiles_f8_256, 8);
}

TGT_AVX2 INLINE float dot_256(const float *a, const float *b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i < n; i += 8) {
        const __m256i m = mask8(n - i);
        s0 = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m), s0);
    }
    return hsum_256(_mm256_add_ps(s0, s1));
}

TGT_AVX2 float kn_dot_avx2(const float *a, const float *b, int n) { return dot_256(a, b, n); }

TGT_AVX2 void kn_dot_rows_avx2(float *out, size_t ldo, const float *a, size_t lda, int G, const float *b, size_t ldb,
                               int m, int n) {
    for (int g = 0; g < G; g++)
        for (int j = 0; j < m; j++) out[(size_t)g * ldo + j] = dot_256(a + (size_t)g * lda, b + (size_t)j * ldb, n);
}

/* As kn_axpy_rows_avx512 with one query row at a time, 64 columns in registers. */
TGT_AVX2 void kn_axpy_rows_avx2(float *y, size_t ldy, const float *w, size_t ldw, int G, const float *x, size_t ldx,
                                int m, int n) {
    for (int g = 0; g < G; g++)
        for (int c0 = 0; c0 < n; c0 += 64) {
            float *yg = y + (size_t)g * ldy;
            const float *wg = w + (size_t)g * ldw;
            __m256 acc[8]; /* all 8 vectors (zero masks past n): constant indices keep them in registers */
            __m256i mk[8];
#pragma GCC unroll 8
            for (int v = 0; v < 8; v++) {
                mk[v] = mask8(n - c0 - 8 * v);
                acc[v] = _mm256_maskload_ps(yg + c0 + 8 * v, mk[v]);
            }
            for (int j = 0; j < m; j++) {
                if (wg[j] == 0.0f) continue;
                const __m256 va = _mm256_set1_ps(wg[j]);
                const float *xj = x + (size_t)j * ldx + c0;
#pragma GCC unroll 8
                for (int v = 0; v < 8; v++) acc[v] = _mm256_fmadd_ps(va, _mm256_maskload_ps(xj + 8 * v, mk[v]), acc[v]);
            }
#pragma GCC unroll 8
            for (int v = 0; v < 8; v++) _mm256_maskstore_ps(yg + c0 + 8 * v, mk[v], acc[v]);
        }
}

TGT_AVX2 void kn_axpy_avx2(float *y, float a, const float *x, int n) {
    const __m256 va = _mm256_set1_ps(a);
    for (int i = 0; i < n; i += 8) {
        const __m256i m = mask8(n - i);
        _mm256_maskstore_ps(y + i, m, _mm256_fmadd_ps(va, _mm256_maskload_ps(x + i, m), _mm256_maskload_ps(y + i, m)));
    }
}

/* ---- peak multiply-add rate (kn_peak_macs) ------------------------------------------------ */

/* 12 independent accumulator chains: enough to cover the FMA / VDPBF16PS latency (4-6 cycles)
 * at two issues per cycle; each body applies OP to every chain in turn. */
#define PEAK_LOOP(T, INIT, OP, REDUCE)                                                                                \
    T a0 = INIT(0), a1 = INIT(1), a2 = INIT(2), a3 = INIT(3), a4 = INIT(4), a5 = INIT(5), a6 = INIT(6), a7 = INIT(7), \
      a8 = INIT(8), a9 = INIT(9), a10 = INIT(10), a11 = INIT(11); /* distinct: no chain merges */                     \
    for (long k = 0; k < iters; k++) {                                                                                \
        a0 = OP(a0), a1 = OP(a1), a2 = OP(a2), a3 = OP(a3), a4 = OP(a4), a5 = OP(a5);                                 \
        a6 = OP(a6), a7 = OP(a7), a8 = OP(a8), a9 = OP(a9), a10 = OP(a10), a11 = OP(a11);                             \
    }                                                                                                                 \
    return REDUCE(a0) + REDUCE(a1) + REDUCE(a2) + REDUCE(a3) + REDUCE(a4) + REDUCE(a5) + REDUCE(a6) + REDUCE(a7) +    \
           REDUCE(a8) + REDUCE(a9) + REDUCE(a10) + REDUCE(a11);

#define INIT512(i) _mm512_set1_ps(0.01f * (i))
#define INIT256(i) _mm256_set1_ps(0.01f * (i))

TGT_AVX512 float kn_peak_fma512(long iters) {
    const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-3f);
#define OP_FMA512(a) _mm512_fmadd_ps(a, x, y)
    PEAK_LOOP(__m512, INIT512, OP_FMA512, _mm512_reduce_add_ps)
}

TGT_BF16 float kn_peak_dp512(long iters) {
    const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3a83); /* 1, 1e-3 */
#define OP_DP512(a) _mm512_dpbf16_ps(a, x, y)
    PEAK_LOOP(__m512, INIT512, OP_DP512, _mm512_reduce_add_ps)
}

TGT_AVX2 float kn_peak_fma256(long iters) {
    const __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(1e-3f);
#define OP_FMA256(a) _mm256_fmadd_ps(a, x, y)
    PEAK_LOOP(__m256, INIT256, OP_FMA256, hsum_256)
}

#endif
