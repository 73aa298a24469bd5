/* Gated DeltaNet core (docs/design.md §3) for one value head: the token-by-token recurrence (decode,
 * verification, rollback replay) and the chunked WY/UT form (prefill), each in a generic
 * variant and SIMD variants instantiated from gdn_body.h. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kn_internal.h"

/* ---- generic: scalar "vectors" ---- */
#define GDN_SUF generic
#define GDN_TGT
#define GDN_NJ 4
#define VT float
#define VW 1
#define VLOAD(p) (*(p))
#define VSTORE(p, v) (*(p) = (v))
#define VSET1(x) (x)
#define VZERO() 0.0f
#define VADD(a, b) ((a) + (b))
#define VSUB(a, b) ((a) - (b))
#define VMUL(a, b) ((a) * (b))
#define VFMA(a, b, c) ((a) * (b) + (c))
#include "gdn_body.h"
#undef GDN_SUF
#undef GDN_TGT
#undef VT
#undef VW
#undef VLOAD
#undef VSTORE
#undef VSET1
#undef VZERO
#undef VADD
#undef VSUB
#undef VMUL
#undef VFMA

#if KN_X86
#include <immintrin.h>

/* ---- AVX2 + FMA ---- */
#define GDN_SUF avx2
#define GDN_TGT __attribute__((target("avx2,fma")))
#define VT __m256
#define VW 8
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSTORE(p, v) _mm256_storeu_ps(p, v)
#define VSET1(x) _mm256_set1_ps(x)
#define VZERO() _mm256_setzero_ps()
#define VADD(a, b) _mm256_add_ps(a, b)
#define VSUB(a, b) _mm256_sub_ps(a, b)
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#include "gdn_body.h"
#undef GDN_SUF
#undef GDN_TGT
#undef VT
#undef VW
#undef VLOAD
#undef VSTORE
#undef VSET1
#undef VZERO
#undef VADD
#undef VSUB
#undef VMUL
#undef VFMA

/* ---- AVX-512 ---- */
#define GDN_SUF avx512
#define GDN_TGT __attribute__((target("avx2,fma,avx512f")))
#define VT __m512
#define VW 16
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_storeu_ps(p, v)
#define VSET1(x) _mm512_set1_ps(x)
#define VZERO() _mm512_setzero_ps()
#define VADD(a, b) _mm512_add_ps(a, b)
#define VSUB(a, b) _mm512_sub_ps(a, b)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#include "gdn_body.h"
#endif

size_t kn_gdn_chunk_work(int dk, int dv) {
    (void)dv; /* column groups reuse fixed-width buffers */
    return 2 * (size_t)KN_GDN_CHUNK + 2 * (size_t)KN_GDN_CHUNK * KN_GDN_CHUNK + 2 * (size_t)KN_GDN_CHUNK * dk +
           2 * (size_t)KN_GDN_CHUNK * 64;
}

/* The widest variant the active path allows for these head sizes. */
static kn_isa gdn_path(const kn_gdn_io *io) {
    kn_isa isa = kn_isa_get();
    if (isa >= KN_ISA_AVX512 && io->dk % 16 == 0 && io->dv % 16 == 0) return KN_ISA_AVX512;
    if (isa >= KN_ISA_AVX2 && io->dk % 8 == 0 && io->dv % 8 == 0) return KN_ISA_AVX2;
    return KN_ISA_GENERIC;
}

void kn_gdn_recurrent(float *S, const kn_gdn_io *io) {
    switch (gdn_path(io)) {
#if KN_X86
    case KN_ISA_AVX512: kn_gdn_recurrent_avx512(S, io); return;
    case KN_ISA_AVX2: kn_gdn_recurrent_avx2(S, io); return;
#endif
    default: kn_gdn_recurrent_generic(S, io);
    }
}

void kn_gdn_chunked(float *S, const kn_gdn_io *io) {
    /* 64-byte aligned: its rows are read with full-width vector loads. From malloc, at the heap's
     * whim, dfl's default heap layout made the bench target's verify(16) 20% slower on AVX-512
     * than a 384-byte shift of the heap did */
    float *work = aligned_alloc(64, (kn_gdn_chunk_work(io->dk, io->dv) * sizeof(float) + 63) / 64 * 64);
    if (!work) {
        kn_gdn_recurrent(S, io);
        return;
    }
    if (io->S0) memcpy(S, io->S0, (size_t)io->dk * io->dv * sizeof(float));
    const kn_isa path = gdn_path(io);
    for (int c0 = 0; c0 < io->n; c0 += KN_GDN_CHUNK) {
        kn_gdn_io c = *io;
        c.S0 = NULL;
        c.n = io->n - c0 < KN_GDN_CHUNK ? io->n - c0 : KN_GDN_CHUNK;
        c.q += (size_t)c0 * io->ld, c.k += (size_t)c0 * io->ld, c.v += (size_t)c0 * io->ld;
        c.g += c0, c.beta += c0;
        if (c.out) c.out += (size_t)c0 * io->ldo;
        switch (path) {
#if KN_X86
        case KN_ISA_AVX512: kn_gdn_chunk_avx512(S, &c, work); break;
        case KN_ISA_AVX2: kn_gdn_chunk_avx2(S, &c, work); break;
#endif
        default: kn_gdn_chunk_generic(S, &c, work);
        }
    }
    free(work);
}

/* The state of value head h that token t's call starts from (*S0) and writes (return). A tree
 * node continues its parent's state, the thread's last at the depth above (the layer's state for
 * the root), into the thread's slot at its own depth. */
static float *gdn_head_state(const kn_gdn_heads_io *a, int h, int t, const float **S0) {
    const size_t hs = (size_t)a->dk * a->dv;
    float *Sh = a->S + (size_t)h * hs;
    const kn_gdn_tree *tr = a->tree;
    *S0 = a->S0 && t == 0 ? a->S0 + (size_t)h * hs : NULL;
    if (!tr) return Sh;
    const int d = tr->depth[t];
    float *stack = tr->stack + (size_t)omp_get_thread_num() * tr->levels * hs;
    *S0 = d == 0 ? Sh : stack + (size_t)(d - 1) * hs;
    return stack + (size_t)d * hs;
}

void kn_gdn_heads(const kn_gdn_heads_io *a) {
    const double prof_t0 = KN_PROF_BEGIN();
    const int n = a->n, Hk = a->Hk, Hv = a->Hv, dk = a->dk, dv = a->dv, ratio = Hv / Hk;
    const int step = a->tree ? 1 : KN_GDN_CHUNK;
    const size_t C = a->ld;
    const size_t work = (size_t)n * Hv * dk * dv * 4;
    const int team = kn_team(work), threads = a->tree && a->tree->threads < team ? a->tree->threads : team;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (work >= KN_PAR_MIN_WORK)
    for (int h = 0; h < Hv; h++) {
        float gb[2 * KN_GDN_CHUNK]; /* log-decays | betas of the tokens of one kernel call */
        const int kh = h / ratio;
        for (int i = 0; i < n; i += step) {
            const int nt = n - i < step ? n - i : step, t0 = a->tree ? a->tree->order[i] : i;
            /* a tree's leaf (the next node in depth-first order is no deeper): no node continues
             * its state, so only its output is computed */
            const int leaf = a->tree && (i + 1 == n || a->tree->depth[a->tree->order[i + 1]] <= a->tree->depth[t0]);
            const float *S0;
            float *Sh = gdn_head_state(a, h, t0, &S0);
            kn_gdn_gates(gb, a->ab, Hv, h, t0, nt, a->neg_exp_A, a->dt_bias);
            const float *row = a->qkv + (size_t)t0 * C;
            const kn_gdn_io io = {.dk = dk,
                                  .dv = dv,
                                  .n = nt,
                                  .q = row + (size_t)kh * dk,
                                  .k = row + (size_t)Hk * dk + (size_t)kh * dk,
                                  .v = row + 2 * (size_t)Hk * dk + (size_t)h * dv,
                                  .ld = C,
                                  .g = gb,
                                  .beta = gb + KN_GDN_CHUNK,
                                  .out = a->out ? a->out + (size_t)t0 * Hv * dv + (size_t)h * dv : NULL,
                                  .ldo = (size_t)Hv * dv,
                                  .S0 = S0,
                                  .no_state = leaf && a->out};
            if (a->chunked) kn_gdn_chunked(Sh, &io);
            else kn_gdn_recurrent(Sh, &io);
        }
    }
    KN_PROF_END(KN_OP_RECURRENCE, prof_t0, 0);
}
