/* AMX-BF16 variant of kn_matmul (x86-64 Linux): BF16 weights through TDPBF16PS tiles.
 *
 * y[n][rows] = x[n][cols] . W^T with W BF16 [rows, cols], cols % 32 == 0. A tiles (16 rows x
 * 32 columns) load straight from W. Each activation is split into three bf16 parts (x = hi +
 * mid + lo to 2^-27 relative: the products are exact, the sums float32, so the result keeps
 * float32 accuracy), and each part of each token is a virtual column of the B tiles (VNNI
 * layout, 16 column pairs x 16 columns x 2): a C element is one part's dot product, and y =
 * (hi + mid) + lo. With up to 5 tokens the parts share one B tile, so that decoding costs one
 * TDPBF16PS per weight tile and the weights stream at memory speed; 6 to 10 tokens share two;
 * from 11 tokens on, B tile 3b + p holds part p of tokens 16b..16b+15, and up to 10 tokens after
 * the last full group share one or two tiles as above. Every C element is the same TDPBF16PS
 * chain over the columns whatever the layout, the block shape or n, so a forward over n tokens
 * equals n single-token forwards bit for bit. With bf16 activations (KN_ACT_BF16) each
 * activation is one part, rounded once: a token is one virtual column, 16 tokens share a B
 * tile. Rows past the last multiple of 16, and weights that are not BF16 or have cols % 32 != 0,
 * go to the AVX-512 kernel (with bf16 activations, BF16 weights to the VDPBF16PS one). */
#include "kn_internal.h"

#if KN_X86 && defined(__linux__)
#include <immintrin.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define TGT_AMX __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")))
#define INLINE static inline __attribute__((always_inline))

#define TILE_ELEMS 512             /* bf16 elements of one A or B tile (16 x 64 bytes) */
#define SPLIT 3                    /* bf16 parts of each activation: hi, mid, lo */
#define XBLOCK_BYTES (1024 * 1024) /* packed activations of one token block */
#define PF_ROW_BYTES 2048          /* blocks over large weights prefetch the next row tile for rows up to this */
#define PF_AHEAD_STEPS 4           /* steps ahead that a row tile's own weights are prefetched into L1 */
#define PACK_GROUPS_MIN 8          /* one-part activations of this many tokens pack by 16-token groups */
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
 * ks_n steps), results to cb [rows][ldc]. Several shapes, each C element always accumulated
 * step by step over the columns, so that the shape never changes a result:
 *   amx_block1: 1 row tile x 1 B tile (decode: a few tokens, the weights streaming from
 *               memory); weight and B tiles alternate between two registers each, so that a
 *               load need not wait for the product that reads the previous one;
 *   amx_block2: 1 row tile x 2 B tiles (6-10 tokens), likewise;
 *   amx_block3: 1 row tile x 3 B tiles (16 tokens), weight tiles alternating;
 *   amx_blockk: 1 row tile x 4-6 B tiles (amx_passes: any number, six a pass);
 *   amx_block22: RG (1-2) row tiles x CT (1-2) B tiles (column chunks of wide matrices).
 * block2 and block3 running a row tile's whole rows prefetch that tile's weights PF_AHEAD_STEPS
 * steps ahead into L1 (amx_prefetch_ahead); block3 in column chunks, blockk and block22 (pf)
 * prefetch the rows after theirs at the same step into L2:
 * measured 11% off a 16-token verification and 3% off a 512-token prefill. Over weights of 32 MiB
 * or more, block3 and blockk do so only where a row is short (PF_ROW_BYTES): the prefetchers learn
 * each row's stream anew at every row tile, and 2 KB rows end before they have. Longer rows
 * stream faster without it (16 tokens, weights from memory, 2 threads, 2026-12-05):
 * [4096, 4096] 1.58 -> 1.31 ms, the 27B shape's [17408, 5120] 7.6 -> 6.5 ms, its [5120, 17408]
 * in column chunks 11.7 -> 7.4 ms; with 1024 columns it stays (a [3584, 1024] 0.36 ms, 0.42
 * without). The bench target's smaller matrices with longer rows ([1024, 3584]) measured the
 * same alone, but its verify(16) 82 -> 89-102 ms without it, so they keep it. */
/* The tile unit waits for a weight tile that is not in cache, so the more products a step has
 * (two or three B tiles), the less of the memory's bandwidth the hardware prefetchers alone
 * keep. Prefetching the row tile's own rows a few steps ahead into L1, then the next row tile's
 * first steps, keeps it (weights from memory, 2 threads, AMX, 2026-12-06, four alternating
 * runs): 6 float32 tokens of a [3584, 1024] 0.38-0.39 -> 0.34-0.36 ms, of a [17408, 5120]
 * 6.8-7.2 -> 6.3-6.8 ms; 16 tokens of the latter 7.1-7.5 -> 6.5-6.9 ms, of the 27B's lm_head
 * 103-106 -> 97-103 ms. In column chunks (16 tokens of a [5120, 17408]) it was 8% slower. */
TGT_AMX INLINE void amx_prefetch_ahead(const uint16_t *w, size_t ldw, int ks, int ks_n) {
    const int k = ks + PF_AHEAD_STEPS;
    const size_t row = ldw / sizeof(uint16_t);
    const uint16_t *p = k < ks_n ? w + (size_t)k * 32 : w + 16 * row + (size_t)(k - ks_n) * 32;
    for (int r = 0; r < 16; r++) { /* steps k and k + 1 of each row (past a row's end: prefetch only) */
        _mm_prefetch((const char *)(p + r * row), _MM_HINT_T0);
        _mm_prefetch((const char *)(p + r * row + 32), _MM_HINT_T0);
    }
}

/* The tile intrinsics take their register numbers as literals, hence macros. */
#define AMX_STEP1(a, ldw, bk, TA, TB)    \
    do {                                 \
        _tile_loadd(TB, bk, 64);         \
        _tile_loadd(TA, a, (long)(ldw)); \
        _tile_dpbf16ps(0, TA, TB);       \
    } while (0)

TGT_AMX INLINE void amx_block1(const uint16_t *w, size_t ldw, const uint16_t *b, int ks_n, float *cb, int ldc) {
    _tile_zero(0);
    int ks = 0;
    for (; ks + 1 < ks_n; ks += 2) {
        AMX_STEP1(w + (size_t)ks * 32, ldw, b + (size_t)ks * TILE_ELEMS, 4, 6);
        AMX_STEP1(w + (size_t)(ks + 1) * 32, ldw, b + (size_t)(ks + 1) * TILE_ELEMS, 5, 7);
    }
    if (ks < ks_n) AMX_STEP1(w + (size_t)ks * 32, ldw, b + (size_t)ks * TILE_ELEMS, 4, 6);
    _tile_stored(0, cb, (long)(ldc * sizeof(float)));
}

/* 1 row tile x 2 B tiles (6-10 tokens): weight tiles and B tile pairs alternate between two
 * sets of registers, as in amx_block1, so that the next step's loads need not wait for the
 * products that read this step's tiles (tile registers are not renamed). pf: prefetch ahead
 * (amx_prefetch_ahead). */
#define AMX_STEP2(a, ldw, bk, bstride, TA, TB0, TB1) \
    do {                                             \
        _tile_loadd(TB0, bk, 64);                    \
        _tile_loadd(TB1, (bk) + (bstride), 64);      \
        _tile_loadd(TA, a, (long)(ldw));             \
        _tile_dpbf16ps(0, TA, TB0);                  \
        _tile_dpbf16ps(1, TA, TB1);                  \
    } while (0)

TGT_AMX INLINE void amx_block2(const uint16_t *w, size_t ldw, const uint16_t *b, size_t bstride, int ks_n, float *cb,
                               int ldc, int pf) {
    const size_t ldcb = (size_t)ldc * sizeof(float);
    _tile_zero(0);
    _tile_zero(1);
    int ks = 0;
    for (; ks + 1 < ks_n; ks += 2) {
        if (pf) amx_prefetch_ahead(w, ldw, ks, ks_n);
        AMX_STEP2(w + (size_t)ks * 32, ldw, b + (size_t)ks * TILE_ELEMS, bstride, 4, 2, 3);
        AMX_STEP2(w + (size_t)(ks + 1) * 32, ldw, b + (size_t)(ks + 1) * TILE_ELEMS, bstride, 5, 6, 7);
    }
    if (ks < ks_n) AMX_STEP2(w + (size_t)ks * 32, ldw, b + (size_t)ks * TILE_ELEMS, bstride, 4, 2, 3);
    _tile_stored(0, cb, (long)ldcb);
    _tile_stored(1, cb + 16, (long)ldcb);
}

#define AMX_STEP3(a, ldw, bk, bstride, TA)        \
    do {                                          \
        _tile_loadd(5, bk, 64);                   \
        _tile_loadd(6, (bk) + (bstride), 64);     \
        _tile_loadd(7, (bk) + 2 * (bstride), 64); \
        _tile_loadd(TA, a, (long)(ldw));          \
        _tile_dpbf16ps(0, TA, 5);                 \
        _tile_dpbf16ps(1, TA, 6);                 \
        _tile_dpbf16ps(2, TA, 7);                 \
    } while (0)

/* acc: continue the sums in cb (a previous chunk of the columns) instead of starting from zero;
 * a C tile stored and loaded again is exact, so a chunked chain equals the unchunked one.
 * pf: PF_NEXT the next row tile into L2, PF_AHEAD this one's rows ahead into L1. */
enum { PF_NONE, PF_NEXT, PF_AHEAD };
TGT_AMX static void amx_block3(const uint16_t *w, size_t ldw, const uint16_t *b, size_t bstride, int ks_n, float *cb,
                               int ldc, int pf, int acc) {
    const size_t ldcb = (size_t)ldc * sizeof(float);
    if (acc) {
        _tile_loadd(0, cb, (long)ldcb);
        _tile_loadd(1, cb + 16, (long)ldcb);
        _tile_loadd(2, cb + 32, (long)ldcb);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
    }
    int ks = 0;
    for (; ks + 1 < ks_n; ks += 2) {
        if (pf == PF_AHEAD) amx_prefetch_ahead(w, ldw, ks, ks_n);
        else if (pf == PF_NEXT) /* the next row tile's two steps, into L2 */
            for (int r = 0; r < 16; r++)
                _mm_prefetch((const char *)(w + (size_t)(16 + r) * (ldw / 2) + (size_t)ks * 32), _MM_HINT_T1);
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
                                int ldc, int pf, int acc, const int RG, const int CT) {
    const size_t row16 = 16 * ldw / sizeof(uint16_t), ldcb = (size_t)ldc * sizeof(float);
    if (acc) { /* continue the sums of a previous chunk of the columns (as amx_block3) */
        _tile_loadd(0, cb, (long)ldcb);
        if (CT > 1) _tile_loadd(1, cb + 16, (long)ldcb);
        if (RG > 1) _tile_loadd(2, cb + (size_t)16 * ldc, (long)ldcb);
        if (RG > 1 && CT > 1) _tile_loadd(3, cb + (size_t)16 * ldc + 16, (long)ldcb);
    } else {
        _tile_zero(0);
        if (CT > 1) _tile_zero(1);
        if (RG > 1) _tile_zero(2);
        if (RG > 1 && CT > 1) _tile_zero(3);
    }
    for (int ks = 0; ks < ks_n; ks++) {
        const uint16_t *a = w + (size_t)ks * 32, *bk = b + (size_t)ks * TILE_ELEMS;
        if (pf) /* the next group's rows at this step, into L2 */
            for (int r = 16 * RG; r < 32 * RG; r++)
                _mm_prefetch((const char *)(a + (size_t)r * (ldw / 2)), _MM_HINT_T1);
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

/* 1 row tile x K (4 to 6) B tiles in one pass: C tiles 0 .. K-1, the weight tile in 6 (K = 6)
 * or 5, B tiles alternating between 6 and 7 where K leaves two registers. The weights stream
 * once where 16-token groups then a pair of B tiles read them twice (a 65-token tree with bf16
 * activations, 17 to 32 tokens with float32 ones): a [17408, 5120] product of 5 B tiles 8.1-9.1
 * -> 6.5 ms, a [3584, 1024] one 0.40 -> 0.37 ms (weights from memory, 2 threads, AMX,
 * 2026-12-05). pf: prefetch the next row tile as amx_block3 does. */
#define AMX_KSTEP(TA, C, TB, k)                            \
    do {                                                   \
        if ((k) < K) {                                     \
            _tile_loadd(TB, bk + (size_t)(k)*bstride, 64); \
            _tile_dpbf16ps(C, TA, TB);                     \
        }                                                  \
    } while (0)
/* One step: the weight tile into TA, B tiles alternating between TB0 and TB1. */
#define AMX_KROW(TA, TB0, TB1)         \
    do {                               \
        _tile_loadd(TA, a, (long)ldw); \
        AMX_KSTEP(TA, 0, TB0, 0);      \
        AMX_KSTEP(TA, 1, TB1, 1);      \
        AMX_KSTEP(TA, 2, TB0, 2);      \
        AMX_KSTEP(TA, 3, TB1, 3);      \
        AMX_KSTEP(TA, 4, TB0, 4);      \
        AMX_KSTEP(TA, 5, TB1, 5);      \
    } while (0)

/* OP(tile, its place in cb) for each of blockk's K C tiles. */
#define AMX_KC(OP)                 \
    do {                           \
        OP(0, cb);                 \
        OP(1, cb + 16);            \
        OP(2, cb + 32);            \
        OP(3, cb + 48);            \
        if (K > 4) OP(4, cb + 64); \
        if (K > 5) OP(5, cb + 80); \
    } while (0)
#define AMX_C_LOAD(t, p) _tile_loadd(t, p, (long)ldcb)
#define AMX_C_ZERO(t, p) _tile_zero(t)
#define AMX_C_STORE(t, p) _tile_stored(t, p, (long)ldcb)

/* acc: continue the sums in cb (a previous chunk of the columns), as amx_block3. */
TGT_AMX INLINE void amx_blockk(const uint16_t *w, size_t ldw, const uint16_t *b, size_t bstride, int ks_n, float *cb,
                               int ldc, int pf, int acc, const int K) {
    const size_t ldcb = (size_t)ldc * sizeof(float);
    if (acc) AMX_KC(AMX_C_LOAD);
    else AMX_KC(AMX_C_ZERO);
    for (int ks = 0; ks < ks_n; ks++) {
        const uint16_t *a = w + (size_t)ks * 32, *bk = b + (size_t)ks * TILE_ELEMS;
        if (pf && ks % 2 == 0) /* the next row tile's two steps, into L2 */
            for (int r = 16; r < 32; r++) _mm_prefetch((const char *)(a + (size_t)r * (ldw / 2)), _MM_HINT_T1);
        if (K == 6) AMX_KROW(6, 7, 7); /* no register left to alternate */
        else AMX_KROW(5, 6, 7);
    }
    AMX_KC(AMX_C_STORE);
}

/* amx_blockk with K from a variable (4 to 6). */
TGT_AMX static void amx_blockn(const uint16_t *w, size_t ldw, const uint16_t *b, size_t bstride, int ks_n, float *cb,
                               int ldc, int pf, int acc, int k) {
    if (k == 4) amx_blockk(w, ldw, b, bstride, ks_n, cb, ldc, pf, acc, 4);
    else if (k == 5) amx_blockk(w, ldw, b, bstride, ks_n, cb, ldc, pf, acc, 5);
    else amx_blockk(w, ldw, b, bstride, ks_n, cb, ldc, pf, acc, 6);
}

/* One row tile against cn (3 or more) B tiles: passes of up to six, the first streaming the
 * weights (three B tiles prefetching ahead; four to six, pf: the next row tile), the others
 * reading them again from L2. Against row-tile pairs of two B tiles a pass (amx_block22,
 * which read the weights from L2 once per pair of B tiles), weights from memory, 2 threads,
 * AMX, 2026-12-05: 33 tokens (7 B tiles) of
 * a [17408, 5120] 15.2 -> 9.3 ms, of the bench lm_head 35.3 -> 30.4 ms; 97 tokens with bf16
 * activations (7 B tiles) of a [10240, 5120] 9.4 -> 5.7 ms; 65 float32 tokens (13 B tiles)
 * 0-9% faster. */
TGT_AMX static void amx_passes(const uint16_t *w, size_t ldw, const uint16_t *b, size_t bstride, int ks_n, float *cb,
                               int ldc, int cn, int pf) {
    for (int c = 0; c < cn; c += 6) {
        const int k = cn - c < 6 ? cn - c : 6, p = c == 0 && pf;
        const uint16_t *bc = b + (size_t)c * bstride;
        if (k >= 4) amx_blockn(w, ldw, bc, bstride, ks_n, cb + c * 16, ldc, p, 0, k);
        else if (k == 3) amx_block3(w, ldw, bc, bstride, ks_n, cb + c * 16, ldc, c == 0 ? PF_AHEAD : PF_NONE, 0);
        else if (k == 2) amx_block2(w, ldw, bc, bstride, ks_n, cb + c * 16, ldc, c == 0);
        else amx_block1(w, ldw, bc, ks_n, cb + c * 16, ldc);
    }
}

/* amx_block22 with its shape from variables (rg, ct in 1..2): each call site a constant shape. */
TGT_AMX INLINE void amx_pair(const uint16_t *w, size_t ldw, const uint16_t *b, size_t bstride, int ks_n, float *cb,
                             int ldc, int pf, int acc, int rg, int ct) {
    if (rg == 2 && ct == 2) amx_block22(w, ldw, b, bstride, ks_n, cb, ldc, pf, acc, 2, 2);
    else if (rg == 2) amx_block22(w, ldw, b, bstride, ks_n, cb, ldc, pf, acc, 2, 1);
    else if (ct == 2) amx_block22(w, ldw, b, bstride, ks_n, cb, ldc, pf, acc, 1, 2);
    else amx_block22(w, ldw, b, bstride, ks_n, cb, ldc, pf, acc, 1, 1);
}

/* bf16 (round to nearest even) of v[0..31] in order, and the float32 values of the result. */
TGT_AMX INLINE __m512i to_bf16(__m512 v0, __m512 v1, __m512 *f0, __m512 *f1) {
    const __m512i h = (__m512i)_mm512_cvtne2ps_pbh(v1, v0);
    *f0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(h)), 16));
    *f1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(h, 1)), 16));
    return h;
}

/* 16 x 16 32-bit transpose in registers: r[i] lane j <-> r[j] lane i. */
TGT_AMX INLINE void tr16x16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 16; i += 8)
        for (int j = 0; j < 4; j++) {
            t[i + j] = _mm512_shuffle_i32x4(r[i + j], r[i + j + 4], 0x88);
            t[i + j + 4] = _mm512_shuffle_i32x4(r[i + j], r[i + j + 4], 0xdd);
        }
    for (int j = 0; j < 8; j++) {
        r[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
        r[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xdd);
    }
}

/* The S (1 or 3) bf16 parts of x[0..31] (each: bf16 of what the previous ones left), as 16
 * column pairs (32-bit words) per part. */
TGT_AMX INLINE void split_parts(const float *x, __m512i part[SPLIT], int S) {
    __m512 r0 = _mm512_loadu_ps(x), r1 = _mm512_loadu_ps(x + 16), f0, f1;
    for (int p = 0; p < S; p++) {
        part[p] = to_bf16(r0, r1, &f0, &f1);
        r0 = _mm512_sub_ps(r0, f0), r1 = _mm512_sub_ps(r1, f1);
    }
}

/* B tile layouts for S parts per activation (3 with float32 activations, 1 with bf16 ones;
 * virtual column v of B tile v / 16, column v % 16):
 *   interleaved (S n <= 32, one or two B tiles): v = S * t + p, part p of token t;
 *   planar (S n > 32): B tile S * b + p holds part p of tokens 16 b .. 16 b + 15,
 *                   so that the parts of a token meet at the same place of S C tiles; the
 *                   last n % 16 tokens, where their parts fit two tiles (S r <= 32), follow
 *                   interleaved (v = 16 S (n / 16) + S t' + p for the t'-th of them): a
 *                   65-token tree's last node takes one tile, not three.
 * Either way each C element is one TDPBF16PS chain over the columns, so the layout (chosen
 * by n) never changes a result. xb [tile][32-column step][16 pairs][16 columns][2], unused
 * columns zero: each column pair lands as one 32-bit word, 64 bytes from the next pair. */
static int amx_planar(int n, int S) { return S * n > 32; }
/* Tokens after the last full group of a planar block of n that are interleaved (0: none). */
static int amx_tail(int n, int S) { return n % 16 && S * (n % 16) <= 32 ? n % 16 : 0; }
static int amx_planar_tiles(int n, int S) {
    const int r = amx_tail(n, S);
    return r ? S * (n / 16) + (S * r + 15) / 16 : S * ((n + 15) / 16);
}
static int amx_tiles(int n, int S) { return amx_planar(n, S) ? amx_planar_tiles(n, S) : (S * n + 15) / 16; }

/* The S parts of token x (32 columns at step ks of ks_n) into virtual columns v0 .. v0 + S - 1
 * of the B tiles at xb. */
TGT_AMX INLINE void amx_put_token(uint16_t *xb, const float *x, int ks, int ks_n, int v0, int S) {
    uint32_t pairs[SPLIT][16] __attribute__((aligned(64)));
    __m512i part[SPLIT];
    split_parts(x + (size_t)ks * 32, part, S);
    for (int p = 0; p < S; p++) _mm512_store_si512(pairs[p], part[p]);
    for (int p = 0; p < S; p++) {
        const int v = v0 + p; /* B tile v / 16, column v % 16 */
        uint32_t *dst = (uint32_t *)(xb + ((size_t)(v / 16) * ks_n + ks) * TILE_ELEMS);
        for (int q = 0; q < 16; q++) dst[q * 16 + v % 16] = pairs[p][q];
    }
}

/* With one part (S = 1) both layouts put token t at column t % 16 of B tile t / 16, so that from
 * PACK_GROUPS_MIN tokens on they pack by transposed 16-token groups, as planar blocks do, instead
 * of token by token: 16 tokens of 3584 columns 45 -> 13 us, of 1024 columns 12.5 -> 7 us (AMX,
 * 2026-12-05; a bf16 verification packs about 100 times). */
TGT_AMX static void amx_pack(uint16_t *xb, const float *x, int n, int cols, int S) {
    const int ks_n = cols / 32;
    if (!amx_planar(n, S) && !(S == 1 && n >= PACK_GROUPS_MIN)) {
        memset(xb, 0, (size_t)amx_tiles(n, S) * ks_n * TILE_ELEMS * sizeof(uint16_t));
        for (int t = 0; t < n; t++)
            for (int ks = 0; ks < ks_n; ks++) amx_put_token(xb, x + (size_t)t * cols, ks, ks_n, S * t, S);
        return;
    }
    const int nb = (n + 15) / 16, full = n / 16, tail = S > 1 ? amx_tail(n, S) : 0;
    const size_t work = (size_t)n * cols;
#pragma omp parallel for num_threads(kn_team(work)) \
    schedule(dynamic, kn_chunk((long)nb *ks_n)) if (work >= KN_PAR_MIN_WORK)
    for (int bk = 0; bk < nb * ks_n; bk++) { /* (token group, column step) */
        const int b = bk / ks_n, ks = bk % ks_n, nt = n - 16 * b < 16 ? n - 16 * b : 16;
        if (b == full && tail) { /* the interleaved tail: its tiles at this step zeroed, then filled */
            for (int i = 0; i < (S * tail + 15) / 16; i++)
                memset(xb + ((size_t)(S * full + i) * ks_n + ks) * TILE_ELEMS, 0, TILE_ELEMS * sizeof(uint16_t));
            for (int j = 0; j < tail; j++)
                amx_put_token(xb, x + (size_t)(16 * full + j) * cols, ks, ks_n, 16 * S * full + S * j, S);
            continue;
        }
        __m512i rows[SPLIT][16];
        for (int j = 0; j < 16; j++) {
            __m512i part[SPLIT] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
            if (j < nt) split_parts(x + (size_t)(16 * b + j) * cols + (size_t)ks * 32, part, S);
            for (int p = 0; p < S; p++) rows[p][j] = part[p];
        }
        for (int p = 0; p < S; p++) { /* [token][pair] -> [pair][token] */
            tr16x16(rows[p]);
            uint16_t *dst = xb + ((size_t)(S * b + p) * ks_n + ks) * TILE_ELEMS;
            for (int q = 0; q < 16; q++) _mm512_store_si512(dst + q * 32, rows[p][q]);
        }
    }
}

#define C_ROWS 32                          /* rows of C results a thread holds: up to 2 row tiles */
#define CHUNK_TILES 16                     /* row tiles a thread runs together over column chunks */
#define B_L2_MAX ((size_t)1280 << 10)      /* packed activations of a token block beyond this: chunks */
#define B_CHUNK ((size_t)512 << 10)        /* packed activations of one chunk of the columns */
#define BLOCK3_MAX_TILES 6                 /* up to this many B tiles (32 tokens) a row tile runs 16-token groups */
#define AMX_MULTI_MAX KN_AMX_JOBS_MAX      /* matrices of one kn_matmul_amx_multi call */
#define STREAM_MIN_BYTES ((size_t)4 << 20) /* outputs at least this large bypass the caches */
#define WIDE_TOK 128                       /* tokens per block of wide matrices' long batches */
#define PAIR_CHUNK_STEPS 12                /* column steps of a row-tile pair's chunk (24 KB: in L1) */

static size_t wide_min_bytes = (size_t)32 << 20; /* smaller weights stay in L3 across blocks */

size_t kn_amx_wide_min(size_t bytes) {
    const size_t old = wide_min_bytes;
    wide_min_bytes = bytes;
    return old;
}

/* Tokens per block: whole multiples of 16 whose packed activations fit XBLOCK_BYTES, or all n.
 * Batches of wide matrices whose weights (wbytes, all of the call's) pass 32 MiB
 * (kn_amx_wide_min) and that would take more than one such block take WIDE_TOK tokens a block
 * instead, run in chunks of the columns where their B tiles outgrow L2 (amx_run): each block
 * streams the weights from memory once, so fewer, larger blocks read them fewer times. 128
 * tokens x a 27B's [17408, 5120] gate: 45-55 -> 37 ms, its [5120, 17408] down: 60 -> 37-40 ms.
 * This held only past 32 tokens at first, so that 17-32 tokens of rows over 10 KB (float32) or
 * 32 KB (bf16) ran as a block of 16 and the rest, streaming the weights twice: the 27B's
 * [5120, 17408] with 17-32 bf16 tokens 11.4-11.7 -> 6.2-6.4 ms, its [5120, 6144] with 17-32
 * float32 ones 4.4-4.7 -> 2.4-2.8 ms (weights from memory, 2 threads, 2026-12-05). Smaller
 * weights stay in L3 across blocks, so they keep the blocks above. */
static int amx_tok_block(int cols, int n, int S, size_t wbytes) {
    int tb = (int)(XBLOCK_BYTES / ((size_t)cols * S * sizeof(uint16_t))) / 16 * 16;
    if (tb < 16) tb = 16;
    if (n > tb && tb < WIDE_TOK && wbytes >= wide_min_bytes) tb = WIDE_TOK;
    return tb < n ? tb : n;
}

/* Bytes of the weights of one call's matrices. */
static size_t amx_wbytes(int count, const dfl_mat *const *ws) {
    size_t b = 0;
    for (int i = 0; i < count; i++) b += (size_t)ws[i]->rows * ws[i]->cols * sizeof(uint16_t);
    return b;
}

/* C columns of one token block (whole B tiles). */
static int amx_ldc(int tok_block, int S) { return 16 * amx_tiles(tok_block, S); }
/* C floats a thread holds for blocks of ldc columns over cols: C_ROWS rows, or CHUNK_TILES row
 * tiles of up to BLOCK3_MAX_TILES B tiles (16-token groups in column chunks), or of all the B
 * tiles where a longer block runs in column chunks (amx_run's wide blocks). */
static size_t amx_cb_floats(int ldc, int cols) {
    const int tiles = ldc / 16;
    const int pairs = tiles > BLOCK3_MAX_TILES && (size_t)tiles * (cols / 32) * TILE_ELEMS * 2 > B_L2_MAX;
    const size_t a = (size_t)C_ROWS * ldc, b = (size_t)CHUNK_TILES * 16 * 16 * (pairs ? tiles : BLOCK3_MAX_TILES);
    return a > b ? a : b;
}

/* y rows r0 .. r0 + 16 rg - 1 of tokens t0 .. t0 + nb - 1 from their C results cb [16 rg][ldc]:
 * y = (hi + mid) + lo, or the one part's sum with bf16 activations (S = 1). A planar block's
 * interleaved tail (amx_tail) combines as the interleaved layout does, after its full groups.
 * With one part, both layouts put token t at virtual column t: blocks of 8 tokens or more go by
 * 16-token groups, transposed in registers (a 16-token verification's lm_head wrote its 4M
 * results one float at a time), fewer one float at a time (a decode step's transpose cost more
 * than it saved). */
TGT_AMX static void amx_combine(float *y, int rows, int r0, int rg, int t0, int nb, const float *cb, int ldc,
                                int planar, int stream, int S) {
    const int groups1 = S == 1 && nb >= 8; /* transposing pays from 8 tokens (decode: 55 -> 64 ms) */
    if (groups1) planar = 1;
    const int tail = groups1 ? 0 : planar ? amx_tail(nb, S) : nb, full = planar ? nb / 16 : 0; /* interleaved: all */
    for (int t = 0; t < tail; t++)
        for (int r = 0; r < 16 * rg; r++) {
            const float *cr = cb + (size_t)r * ldc + (size_t)16 * S * full + S * t;
            y[(size_t)(t0 + 16 * full + t) * rows + r0 + r] = S == 1 ? cr[0] : (cr[0] + cr[1]) + cr[2];
        }
    if (!planar) return;
    for (int b = 0; b < (tail ? full : (nb + 15) / 16); b++) {
        const int nt = nb - 16 * b < 16 ? nb - 16 * b : 16;
        for (int rt = 0; rt < rg; rt++) {
            __m512i v[16]; /* [row][token] sums, then [token][row] */
            for (int r = 0; r < 16; r++) {
                const float *cr = cb + (size_t)(16 * rt + r) * ldc + (size_t)S * 16 * b;
                if (S == 1) {
                    v[r] = _mm512_castps_si512(_mm512_load_ps(cr));
                    continue;
                }
                const __m512 hm = _mm512_add_ps(_mm512_load_ps(cr), _mm512_load_ps(cr + 16));
                v[r] = _mm512_castps_si512(_mm512_add_ps(hm, _mm512_load_ps(cr + 32)));
            }
            tr16x16(v);
            for (int j = 0; j < nt; j++)
                if (stream) _mm512_stream_si512((void *)(y + (size_t)(t0 + 16 * b + j) * rows + r0 + 16 * rt), v[j]);
                else _mm512_storeu_si512(y + (size_t)(t0 + 16 * b + j) * rows + r0 + 16 * rt, v[j]);
        }
    }
}

/* Token blocks (whole B tiles) whose packed activations stay in L2; each thread runs its row
 * groups over one block, then the next. One B tile (up to 5 tokens) or two (6 to 10): single
 * row tiles. One B tile streams the weights with the hardware prefetchers alone (software
 * prefetch measured slower there); two prefetch their own rows ahead into L1
 * (amx_prefetch_ahead), which replaced prefetching the next row tile into L2 over an lm_head's
 * weights (the bench target's 248K x 1024 over 6-10 tokens: 23.4-26.3 ms with neither,
 * 21.6-22.0 with that; its verify(6..10) 79-89 -> 74-82 ms). Two B tiles instead of 16-token
 * groups' three cut a 6-10 token product of a 4096 x 4096 matrix from 0.90 to 0.69 ms on 2
 * threads (AMX, 2026-12-05).
 * More tokens: each row tile against all the B tiles in passes of up to six (amx_passes), the
 * first prefetching (amx_passes says how). Outputs larger than L2 are written with
 * streaming stores, so that they do not evict the packed activations. 16-token groups of wide
 * matrices, whose packed activations pass B_L2_MAX (3 x 544 KB for 17408 columns), run up to
 * CHUNK_TILES row tiles over one chunk of the columns after the other: each row tile had read
 * all of them from L3; a [5120, 17408] product of 12-16 tokens took 12.5-13.4 ms, 3.3x one
 * token's, and now 6.1 ms (2 threads, 2026-12-05). Longer blocks of wide matrices
 * (amx_tok_block's 128 tokens) do the same in 2 x 2 tile blocks over 12-step chunks, a row-tile
 * pair's chunk of the weights in L1. */
TGT_AMX static void amx_run(int count, float *const *ys, const dfl_mat *const *ws, int n, const uint16_t *const *xbs,
                            float *cball, int S) {
    const int cols = ws[0]->cols, ks_n = cols / 32, planar = amx_planar(n, S);
    const size_t ldw = (size_t)cols * sizeof(uint16_t), tile_step = (size_t)ks_n * TILE_ELEMS;
    const int tok_block = amx_tok_block(cols, n, S, amx_wbytes(count, ws)), ldc = amx_ldc(tok_block, S);
    size_t rows16_all = 0, rows_all = 0;
    int aligned = 1; /* every output row starts on a cache line */
    for (int i = 0; i < count; i++) {
        rows16_all += (size_t)(ws[i]->rows / 16 * 16), rows_all += (size_t)ws[i]->rows;
        aligned &= (uintptr_t)ys[i] % 64 == 0 && ws[i]->rows % 16 == 0;
    }
    const int stream = (planar || S == 1) && aligned && rows_all * n * sizeof(float) > STREAM_MIN_BYTES;
    const int pf3 = amx_wbytes(count, ws) < wide_min_bytes || ldw <= PF_ROW_BYTES; /* in column chunks */
    const size_t work = rows16_all * cols * n;
#pragma omp parallel num_threads(kn_team(work)) if (work >= KN_PAR_MIN_WORK)
    {
        tile_config cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.palette = 1;
        for (int i = 0; i < 8; i++) cfg.colsb[i] = 64, cfg.rows[i] = 16;
        _tile_loadconfig(&cfg);
        float *cb = cball + (size_t)omp_get_thread_num() * amx_cb_floats(ldc, cols);
        for (int t0 = 0; t0 < n; t0 += tok_block) {
            const int nb = n - t0 < tok_block ? n - t0 : tok_block;
            /* this block's B tiles, and the row tiles per group for them */
            const int c0 = planar ? S * t0 / 16 : 0, cn = planar ? amx_planar_tiles(nb, S) : amx_tiles(nb, S);
            const int rg_max = cn <= BLOCK3_MAX_TILES ? 1 : 2;
            /* blocks whose B tiles outgrow L2 (wide matrices: a 27B's down projection, its
             * lm_head over a replay's wave) run CHUNK_TILES row tiles over one chunk of the
             * columns, then the next chunk, so that each chunk's B tiles are read from L2 by all
             * of them: up to six B tiles in single row tiles (16-token groups, or one pass over
             * four or five: 17 float32 tokens of a [5120, 17408] 11.4 -> 8.0 ms, 65 bf16 ones
             * 15.5 -> 11.4 ms, weights from memory, 2 threads, 2026-12-05), and longer blocks in
             * row-tile pairs whose chunk of the weights stays in L1 across the B tiles */
            const int wide = planar && (size_t)cn * ks_n * TILE_ELEMS * 2 > B_L2_MAX;
            int kc = wide ? (int)(B_CHUNK / ((size_t)cn * TILE_ELEMS * 2)) : ks_n;
            if (wide && rg_max == 2 && kc > PAIR_CHUNK_STEPS) kc = PAIR_CHUNK_STEPS;
            if (kc < 1) kc = 1;
            /* row tiles per claimed group; chunked: up to CHUNK_TILES, at least 4 groups a thread */
            int per = rg_max;
            if (kc < ks_n) {
                const long share = (long)(rows16_all / 16) / (4L * omp_get_num_threads());
                per = share > CHUNK_TILES ? CHUNK_TILES : share < 2 ? 2 : (int)share;
            }
            int g_end[AMX_MULTI_MAX]; /* row groups of matrices 0..i, in one index space */
            for (int i = 0; i < count; i++) g_end[i] = (i ? g_end[i - 1] : 0) + (ws[i]->rows / 16 + per - 1) / per;
#pragma omp for schedule(dynamic, kn_chunk(g_end[count - 1])) nowait
            for (int gi = 0; gi < g_end[count - 1]; gi++) {
                int i = 0;
                while (gi >= g_end[i]) i++;
                const int rows = ws[i]->rows, rows16 = rows / 16 * 16, r0 = (gi - (i ? g_end[i - 1] : 0)) * per * 16;
                const int rg = (rows16 - r0) / 16 < rg_max ? (rows16 - r0) / 16 : rg_max;
                const uint16_t *wg = (const uint16_t *)ws[i]->data + (size_t)r0 * cols,
                               *bt = xbs[i] + (size_t)c0 * tile_step;
                if (kc < ks_n) {
                    const int nt = (rows16 - r0) / 16 < per ? (rows16 - r0) / 16 : per;
                    for (int k0 = 0; k0 < ks_n; k0 += kc) {
                        const int kn = ks_n - k0 < kc ? ks_n - k0 : kc;
                        for (int j = 0; j < nt && rg_max == 1; j++) { /* 16-token groups, or 4-5 B tiles in one pass */
                            const uint16_t *wj = wg + (size_t)16 * j * cols + (size_t)k0 * 32,
                                           *bk = bt + (size_t)k0 * TILE_ELEMS;
                            float *cj = cb + (size_t)16 * j * ldc;
                            if (cn % 3) amx_blockn(wj, ldw, bk, tile_step, kn, cj, ldc, pf3, k0 > 0, cn);
                            else
                                for (int c = 0; c < cn; c += 3)
                                    amx_block3(wj, ldw, bk + (size_t)c * tile_step, tile_step, kn, cj + c * 16, ldc,
                                               pf3, k0 > 0);
                        }
                        for (int j = 0; j < nt && rg_max == 2; j += 2)
                            for (int c = 0; c < cn; c += 2)
                                amx_pair(wg + (size_t)16 * j * cols + (size_t)k0 * 32, ldw,
                                         bt + (size_t)c * tile_step + (size_t)k0 * TILE_ELEMS, tile_step, kn,
                                         cb + (size_t)16 * j * ldc + c * 16, ldc, c == 0, k0 > 0, nt - j < 2 ? 1 : 2,
                                         cn - c < 2 ? 1 : 2);
                    }
                    for (int j = 0; j < nt; j++)
                        amx_combine(ys[i], rows, r0 + 16 * j, 1, t0, nb, cb + (size_t)16 * j * ldc, ldc, planar, stream,
                                    S);
                    continue;
                }
                if (cn == 1) amx_block1(wg, ldw, bt, ks_n, cb, ldc);
                else if (!planar) amx_block2(wg, ldw, bt, tile_step, ks_n, cb, ldc, 1);
                else
                    for (int j = 0; j < rg; j++)
                        amx_passes(wg + (size_t)16 * j * cols, ldw, bt, tile_step, ks_n, cb + (size_t)16 * j * ldc, ldc,
                                   cn, pf3);
                amx_combine(ys[i], rows, r0, rg, t0, nb, cb, ldc, planar, stream, S);
            }
        }
        if (stream) _mm_sfence(); /* the streamed rows before the region's closing barrier */
        _tile_release();
    }
}

TGT_AMX float kn_peak_amx(long iters) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) cfg.colsb[i] = 64, cfg.rows[i] = 16;
    _tile_loadconfig(&cfg);
    uint16_t ab[TILE_ELEMS] __attribute__((aligned(64)));
    for (int i = 0; i < TILE_ELEMS; i++) ab[i] = 0x3a83; /* bf16 1e-3: the sums stay finite */
    _tile_loadd(4, ab, 64);
    _tile_loadd(5, ab, 64);
    _tile_loadd(6, ab, 64);
    _tile_loadd(7, ab, 64);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (long k = 0; k < iters; k++)
        for (int r = 0; r < 3; r++) { /* four chains, each waiting only on itself */
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    float c[256] __attribute__((aligned(64)));
    _tile_stored(0, c, 64);
    _tile_release();
    return c[0];
}

/* The tile products as amx_passes runs them over weights in cache: amx_blockk's passes of a row
 * tile (1024 columns, 32 steps) against six B tiles, each step loading the weight tile and every
 * B tile (192 KB of them: from L2), calls x 192 TDPBF16PS. */
#define PEAK_LOADED_STEPS 32
TGT_AMX float kn_peak_amx_loaded(long calls) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) cfg.colsb[i] = 64, cfg.rows[i] = 16;
    const size_t w_elems = (size_t)16 * PEAK_LOADED_STEPS * 32, b_elems = (size_t)6 * PEAK_LOADED_STEPS * TILE_ELEMS;
    uint16_t *w = aligned_alloc(64, (w_elems + b_elems) * sizeof(uint16_t)), *b = w + w_elems;
    float *cb = aligned_alloc(64, (size_t)16 * 96 * sizeof(float));
    if (!w || !cb) {
        free(w), free(cb);
        return 0;
    }
    for (size_t i = 0; i < w_elems + b_elems; i++) w[i] = 0x3a83; /* bf16 1e-3: the sums stay finite */
    _tile_loadconfig(&cfg);
    for (long c = 0; c < calls; c++)
        amx_blockk(w, (size_t)PEAK_LOADED_STEPS * 32 * sizeof(uint16_t), b, (size_t)PEAK_LOADED_STEPS * TILE_ELEMS,
                   PEAK_LOADED_STEPS, cb, 96, 0, 0, 6);
    _tile_release();
    const float r = cb[0];
    free(w), free(cb);
    return r;
}

/* One product outside the tiles, as the activation mode computes it there: BF16 weights with bf16
 * activations through VDPBF16PS, the rest through the AVX-512 kernel. */
static void amx_other(float *y, const float *x, const dfl_mat *w, int n, int S) {
    const kn_mm_job j = {y, x, w, n};
    if (S == 1 && w->dtype == ST_BF16) kn_matmul_bf16act(1, &j);
    else kn_matmul_avx512(1, &j);
}

/* kn_matmul_amx_multi with S parts an activation (1: rounded to bf16 once; SPLIT: float32). */
static void amx_multi(int count, float *const *y, const float *const *x, const dfl_mat *const *w, int n, int S) {
    if (n < 1 || count < 1) return;
    const int cols = w[0]->cols;
    int ok = count <= AMX_MULTI_MAX && cols % 32 == 0, distinct = 0, slot[AMX_MULTI_MAX];
    size_t tails = 0; /* floats of the rows past each matrix's last multiple of 16 */
    for (int i = 0; i < count && ok; i++) {
        ok = w[i]->dtype == ST_BF16 && w[i]->cols == cols && w[i]->rows >= 16;
        tails += (size_t)n * (w[i]->rows % 16);
        slot[i] = i && x[i] == x[i - 1] ? slot[i - 1] : distinct++; /* one packing per run of one input */
    }
    if (!ok) { /* one matrix at a time (other dtypes and shapes: amx_other) */
        for (int i = 0; i < count; i++)
            if (count == 1) amx_other(y[i], x[i], w[i], n, S);
            else amx_multi(1, &y[i], &x[i], &w[i], n, S);
        return;
    }
    const size_t xb_elems = (size_t)amx_tiles(n, S) * (cols / 32) * TILE_ELEMS;
    uint16_t *xb = aligned_alloc(64, (size_t)distinct * xb_elems * sizeof(uint16_t));
    float *cball = aligned_alloc(
        64, (size_t)omp_get_max_threads() *
                amx_cb_floats(amx_ldc(amx_tok_block(cols, n, S, amx_wbytes(count, w)), S), cols) * sizeof(float));
    float *ytail = tails ? malloc(tails * sizeof(float)) : NULL;
    if (!xb || !cball || (tails && !ytail)) { /* no memory for the packed activations: the generic kernel needs none */
        free(xb), free(cball), free(ytail);
        for (int i = 0; i < count; i++) kn_matmul_generic(y[i], x[i], w[i], n);
        return;
    }
    const uint16_t *xbs[AMX_MULTI_MAX];
    for (int i = 0; i < count; i++) {
        xbs[i] = xb + (size_t)slot[i] * xb_elems;
        if (!i || slot[i] != slot[i - 1]) amx_pack(xb + (size_t)slot[i] * xb_elems, x[i], n, cols, S);
    }
    amx_run(count, y, w, n, xbs, cball, S);
    for (int i = 0; i < count; i++) { /* the last rows % 16 rows: amx_other, then into place */
        const int rows = w[i]->rows, rows16 = rows / 16 * 16, tail = rows - rows16;
        if (!tail) continue;
        dfl_mat sub = *w[i];
        sub.data = (const uint16_t *)w[i]->data + (size_t)rows16 * cols;
        sub.rows = tail;
        amx_other(ytail, x[i], &sub, n, S);
        for (int t = 0; t < n; t++)
            memcpy(y[i] + (size_t)t * rows + rows16, ytail + (size_t)t * tail, (size_t)tail * sizeof(float));
    }
    free(xb), free(cball), free(ytail);
}

void kn_matmul_amx_multi(int count, float *const *y, const float *const *x, const dfl_mat *const *w, int n) {
    amx_multi(count, y, x, w, n, kn_act_get() == KN_ACT_BF16 ? 1 : SPLIT);
}

void kn_matmul_amx_bf16(float *y, const float *x, const dfl_mat *w, int n) { amx_multi(1, &y, &x, &w, n, 1); }

#endif
