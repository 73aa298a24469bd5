/* Gated DeltaNet core for one value head, written once over a vector type and included by
 * gdn.c for each instruction-set path. The includer defines:
 *   GDN_SUF (name suffix), GDN_TGT (target attribute or nothing), VT (vector of VW floats),
 *   VLOAD(p), VSTORE(p, v), VSET1(x), VZERO(), VADD(a, b), VSUB(a, b), VMUL(a, b),
 *   VFMA(a, b, c) = a*b + c.
 * dk and dv must be multiples of VW. Columns of S are independent in both forms, so the work
 * goes by groups of NJ*VW columns (NJ independent vector chains) with the group's slice of S
 * staying in L1 across tokens. */

#define GDN_CAT2(a, b) a##b
#define GDN_CAT(a, b) GDN_CAT2(a, b)
#define GDN_NAME(base) GDN_CAT(base, GDN_SUF)
#define GDN_INLINE static inline __attribute__((always_inline))

/* One pass over the rows for token t's update and, when there is a next token, its decay:
 *   s = S + k d^T (o = S^T q with an output); then S = s * decay1 and u1 = S^T k1.
 * Each element takes the operations of the update pass and of the next token's decay pass in
 * the same order as two passes would, with one load and one store. */
GDN_TGT GDN_INLINE void GDN_NAME(rec_pass_)(float *S, const kn_gdn_io *io, int j0, const int nj, const float *k,
                                            const float *q, const VT *d, VT *o, const float *k1, VT decay1, VT *u1,
                                            const int has_out, const int has_next) {
    for (int i = 0; i < io->dk; i++) {
        float *Si = S + (size_t)i * io->dv + j0;
        const VT ki = VSET1(k[i]), qi = VSET1(has_out ? q[i] : 0.0f), k1i = VSET1(has_next ? k1[i] : 0.0f);
#pragma GCC unroll 8
        for (int jj = 0; jj < nj; jj++) {
            VT s = VFMA(ki, d[jj], VLOAD(Si + jj * VW));
            if (has_out) o[jj] = VFMA(s, qi, o[jj]);
            if (has_next) {
                s = VMUL(s, decay1);
                u1[jj] = VFMA(s, k1i, u1[jj]);
            }
            VSTORE(Si + jj * VW, s);
        }
    }
}

/* Recurrence over all tokens for the nj vectors of columns starting at j0: the first token's
 * decay (from S0 when given) and u = S^T k, then per token one pass (rec_pass_) that updates S
 * and decays it for the next token. */
/* One token's output without its state (io->no_state: a tree's leaf): the decayed state is
 * recomputed from S0 in the second pass instead of stored and loaded, so out takes the same
 * operations as rec_cols_ gives it, with no store to the state. */
GDN_TGT GDN_INLINE void GDN_NAME(rec_out_only_)(const float *S, const kn_gdn_io *io, int j0, const int nj) {
    const int dk = io->dk, dv = io->dv;
    const float *Src = io->S0 ? io->S0 : S;
    const VT decay = VSET1(expf(io->g[0])), beta = VSET1(io->beta[0]);
    VT u[GDN_NJ], d[GDN_NJ], o[GDN_NJ];
#pragma GCC unroll 8
    for (int jj = 0; jj < nj; jj++) u[jj] = VZERO(), o[jj] = VZERO();
    for (int i = 0; i < dk; i++) { /* u = (S decay)^T k */
        const float *Ri = Src + (size_t)i * dv + j0;
        const VT ki = VSET1(io->k[i]);
#pragma GCC unroll 8
        for (int jj = 0; jj < nj; jj++) u[jj] = VFMA(VMUL(VLOAD(Ri + jj * VW), decay), ki, u[jj]);
    }
#pragma GCC unroll 8
    for (int jj = 0; jj < nj; jj++) d[jj] = VMUL(VSUB(VLOAD(io->v + j0 + jj * VW), u[jj]), beta);
    for (int i = 0; i < dk; i++) { /* o = (S decay + k d^T)^T q */
        const float *Ri = Src + (size_t)i * dv + j0;
        const VT ki = VSET1(io->k[i]), qi = VSET1(io->q[i]);
#pragma GCC unroll 8
        for (int jj = 0; jj < nj; jj++) o[jj] = VFMA(VFMA(ki, d[jj], VMUL(VLOAD(Ri + jj * VW), decay)), qi, o[jj]);
    }
#pragma GCC unroll 8
    for (int jj = 0; jj < nj; jj++) VSTORE(io->out + j0 + jj * VW, o[jj]);
}

GDN_TGT GDN_INLINE void GDN_NAME(rec_cols_)(float *S, const kn_gdn_io *io, int j0, const int nj) {
    const int dk = io->dk, dv = io->dv, n = io->n, has_out = io->out != NULL;
    if (n < 1) return;
    if (io->no_state && n == 1 && has_out) {
        GDN_NAME(rec_out_only_)(S, io, j0, nj);
        return;
    }
    VT u[GDN_NJ], d[GDN_NJ], o[GDN_NJ];
    const float *Src = io->S0 ? io->S0 : S; /* the first token reads S0 */
    const VT decay = VSET1(expf(io->g[0]));
#pragma GCC unroll 8
    for (int jj = 0; jj < nj; jj++) u[jj] = VZERO();
    for (int i = 0; i < dk; i++) { /* S *= decay; u = S^T k */
        float *Si = S + (size_t)i * dv + j0;
        const float *Ri = Src + (size_t)i * dv + j0;
        const VT ki = VSET1(io->k[i]);
#pragma GCC unroll 8
        for (int jj = 0; jj < nj; jj++) {
            const VT s = VMUL(VLOAD(Ri + jj * VW), decay);
            VSTORE(Si + jj * VW, s);
            u[jj] = VFMA(s, ki, u[jj]);
        }
    }
    for (int t = 0; t < n; t++) {
        const float *q = io->q + (size_t)t * io->ld, *k = io->k + (size_t)t * io->ld, *v = io->v + (size_t)t * io->ld;
        const VT beta = VSET1(io->beta[t]);
#pragma GCC unroll 8
        for (int jj = 0; jj < nj; jj++) {
            d[jj] = VMUL(VSUB(VLOAD(v + j0 + jj * VW), u[jj]), beta); /* delta */
            o[jj] = VZERO(), u[jj] = VZERO();                         /* u: the next token's */
        }
        if (t + 1 < n) {
            const float *k1 = io->k + (size_t)(t + 1) * io->ld;
            const VT decay1 = VSET1(expf(io->g[t + 1]));
            if (has_out) GDN_NAME(rec_pass_)(S, io, j0, nj, k, q, d, o, k1, decay1, u, 1, 1);
            else GDN_NAME(rec_pass_)(S, io, j0, nj, k, q, d, o, k1, decay1, u, 0, 1);
        } else if (has_out) GDN_NAME(rec_pass_)(S, io, j0, nj, k, q, d, o, k, decay, u, 1, 0);
        else GDN_NAME(rec_pass_)(S, io, j0, nj, k, q, d, o, k, decay, u, 0, 0);
        if (has_out) {
            float *out = io->out + (size_t)t * io->ldo + j0;
#pragma GCC unroll 8
            for (int jj = 0; jj < nj; jj++) VSTORE(out + jj * VW, o[jj]);
        }
    }
}

GDN_TGT void GDN_NAME(kn_gdn_recurrent_)(float *S, const kn_gdn_io *io) {
    int j0 = 0;
    for (; j0 + GDN_NJ * VW <= io->dv; j0 += GDN_NJ * VW) GDN_NAME(rec_cols_)(S, io, j0, GDN_NJ);
    for (; j0 < io->dv; j0 += VW) GDN_NAME(rec_cols_)(S, io, j0, 1);
}

/* Scratch of one chunk: gam[C] cumulative log-decay, eg[C] = exp(gam), M[C][C] and P[C][C]
 * (see below), KCT[dk][C] = (exp(gam_L - gam_s) k_s)^T, per column group D[C][64], O[C][64],
 * and KT[dk][C] = K^T. */
#define GDN_C KN_GDN_CHUNK
#define GDN_GROUP 64
#define GDN_RI (VW >= 16 ? 4 : 2) /* state rows updated together (accumulators fit the registers) */

/* Rows i0 .. i0+R-1 of the chunk's state update S = eg_L S0 + sum_s KC_s D_s^T for the nj
 * vectors of columns at j0: each D_s row is loaded once for the R rows, and each element
 * still takes its products in the order of s. */
GDN_TGT GDN_INLINE void GDN_NAME(state_rows_)(float *S, const float *KCT, const float *D, int i0, int j0, int dv, int L,
                                              VT eL, const int nj, const int R) {
    VT acc[GDN_RI][GDN_NJ];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int jj = 0; jj < nj; jj++) acc[r][jj] = VMUL(eL, VLOAD(S + (size_t)(i0 + r) * dv + j0 + jj * VW));
    for (int s = 0; s < L; s++) {
        VT d[GDN_NJ];
#pragma GCC unroll 8
        for (int jj = 0; jj < nj; jj++) d[jj] = VLOAD(D + (size_t)s * GDN_GROUP + jj * VW);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const VT c = VSET1(KCT[(size_t)(i0 + r) * GDN_C + s]);
#pragma GCC unroll 8
            for (int jj = 0; jj < nj; jj++) acc[r][jj] = VFMA(c, d[jj], acc[r][jj]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int jj = 0; jj < nj; jj++) VSTORE(S + (size_t)(i0 + r) * dv + j0 + jj * VW, acc[r][jj]);
}

/* Chunk steps for the nj vectors of columns at j0 (S0 = the state before the chunk):
 *   KS = K S0, QS = Q S0;
 *   D_t = beta_t (v_t - eg_t KS_t) - sum_{s<t} M[t][s] D_s   (forward substitution);
 *   o_t = eg_t QS_t + sum_{s<=t} P[t][s] D_s;
 *   S = eg_L S0 + sum_s KC_s D_s^T. */
GDN_TGT GDN_INLINE void GDN_NAME(chunk_cols_)(float *S, const kn_gdn_io *io, const float *work, float *D, float *O,
                                              int j0, const int nj) {
    const int dk = io->dk, dv = io->dv, L = io->n;
    const float *eg = work + GDN_C, *M = eg + GDN_C, *P = M + GDN_C * GDN_C, *KCT = P + GDN_C * GDN_C;
    for (int t = 0; t < L; t++) {
        const float *q = io->q + (size_t)t * io->ld, *k = io->k + (size_t)t * io->ld;
        VT a[GDN_NJ], b[GDN_NJ];
#pragma GCC unroll 8
        for (int jj = 0; jj < nj; jj++) a[jj] = VZERO(), b[jj] = VZERO();
        for (int i = 0; i < dk; i++) {
            const float *Si = S + (size_t)i * dv + j0;
            const VT ki = VSET1(k[i]), qi = VSET1(q[i]);
#pragma GCC unroll 8
            for (int jj = 0; jj < nj; jj++) {
                const VT s = VLOAD(Si + jj * VW);
                a[jj] = VFMA(ki, s, a[jj]);
                b[jj] = VFMA(qi, s, b[jj]);
            }
        }
        const float *v = io->v + (size_t)t * io->ld + j0;
        const VT e = VSET1(eg[t]), beta = VSET1(io->beta[t]);
#pragma GCC unroll 8
        for (int jj = 0; jj < nj; jj++) {
            a[jj] = VMUL(VSUB(VLOAD(v + jj * VW), VMUL(e, a[jj])), beta);
            VSTORE(O + (size_t)t * GDN_GROUP + jj * VW, VMUL(e, b[jj]));
        }
        for (int s = 0; s < t; s++) {
            const VT m = VSET1(-M[t * GDN_C + s]);
#pragma GCC unroll 8
            for (int jj = 0; jj < nj; jj++) a[jj] = VFMA(m, VLOAD(D + (size_t)s * GDN_GROUP + jj * VW), a[jj]);
        }
#pragma GCC unroll 8
        for (int jj = 0; jj < nj; jj++) VSTORE(D + (size_t)t * GDN_GROUP + jj * VW, a[jj]);
    }
    if (io->out)
        for (int t = 0; t < L; t++) {
            VT o[GDN_NJ];
#pragma GCC unroll 8
            for (int jj = 0; jj < nj; jj++) o[jj] = VLOAD(O + (size_t)t * GDN_GROUP + jj * VW);
            for (int s = 0; s <= t; s++) {
                const VT p = VSET1(P[t * GDN_C + s]);
#pragma GCC unroll 8
                for (int jj = 0; jj < nj; jj++) o[jj] = VFMA(p, VLOAD(D + (size_t)s * GDN_GROUP + jj * VW), o[jj]);
            }
            float *out = io->out + (size_t)t * io->ldo + j0;
#pragma GCC unroll 8
            for (int jj = 0; jj < nj; jj++) VSTORE(out + jj * VW, o[jj]);
        }
    const VT eL = VSET1(eg[L - 1]);
    int i = 0;
    for (; i + GDN_RI <= dk; i += GDN_RI) GDN_NAME(state_rows_)(S, KCT, D, i, j0, dv, L, eL, nj, GDN_RI);
    for (; i < dk; i++) GDN_NAME(state_rows_)(S, KCT, D, i, j0, dv, L, eL, nj, 1);
}

/* One chunk of io->n <= KN_GDN_CHUNK tokens. */
GDN_TGT void GDN_NAME(kn_gdn_chunk_)(float *S, const kn_gdn_io *io, float *work) {
    const int dk = io->dk, L = io->n;
    float *gam = work, *eg = gam + GDN_C, *M = eg + GDN_C, *P = M + GDN_C * GDN_C, *KCT = P + GDN_C * GDN_C;
    float *D = KCT + (size_t)GDN_C * dk, *O = D + GDN_C * GDN_GROUP, *KT = O + GDN_C * GDN_GROUP;
    float acc = 0;
    for (int t = 0; t < L; t++) {
        acc += io->g[t];
        gam[t] = acc;
        eg[t] = expf(acc);
    }
    /* KT [dk][GDN_C] = K^T (zero past L), so that k_t.k_s and q_t.k_s for a vector of s are dk
     * FMAs with no horizontal sums */
    for (int s = 0; s < GDN_C; s++) { /* reading each key row once */
        const float *k = io->k + (size_t)s * io->ld;
        for (int i = 0; i < dk; i++) KT[(size_t)i * GDN_C + s] = s < L ? k[i] : 0.0f;
    }
    /* M[t][s] = beta_t exp(gam_t - gam_s) k_t.k_s (s < t); P[t][s] = exp(gam_t - gam_s) q_t.k_s (s <= t) */
    for (int t = 0; t < L; t++) {
        const float *q = io->q + (size_t)t * io->ld, *k = io->k + (size_t)t * io->ld;
        for (int s0 = 0; s0 <= t; s0 += VW) {
            /* two chains each (even and odd i), named so that they stay in registers */
            VT kk0 = VZERO(), kk1 = VZERO(), qk0 = VZERO(), qk1 = VZERO();
            int i = 0;
            for (; i + 1 < dk; i += 2) {
                const VT kt0 = VLOAD(KT + (size_t)i * GDN_C + s0), kt1 = VLOAD(KT + (size_t)(i + 1) * GDN_C + s0);
                kk0 = VFMA(VSET1(k[i]), kt0, kk0);
                qk0 = VFMA(VSET1(q[i]), kt0, qk0);
                kk1 = VFMA(VSET1(k[i + 1]), kt1, kk1);
                qk1 = VFMA(VSET1(q[i + 1]), kt1, qk1);
            }
            if (i < dk) {
                const VT kt0 = VLOAD(KT + (size_t)i * GDN_C + s0);
                kk0 = VFMA(VSET1(k[i]), kt0, kk0);
                qk0 = VFMA(VSET1(q[i]), kt0, qk0);
            }
            float dkk[VW], dqk[VW];
            VSTORE(dkk, VADD(kk0, kk1));
            VSTORE(dqk, VADD(qk0, qk1));
            for (int s = s0; s < s0 + VW && s <= t; s++) {
                const float e = expf(gam[t] - gam[s]);
                if (s < t) M[t * GDN_C + s] = io->beta[t] * e * dkk[s - s0];
                if (io->out) P[t * GDN_C + s] = e * dqk[s - s0];
            }
        }
    }
    float ec[GDN_C];
    for (int s = 0; s < L; s++) ec[s] = expf(gam[L - 1] - gam[s]);
    for (int i = 0; i < dk; i++)
        for (int s = 0; s < L; s++) KCT[(size_t)i * GDN_C + s] = ec[s] * KT[(size_t)i * GDN_C + s];
    int j0 = 0;
    for (; j0 + GDN_NJ * VW <= io->dv; j0 += GDN_NJ * VW) GDN_NAME(chunk_cols_)(S, io, work, D, O, j0, GDN_NJ);
    for (; j0 < io->dv; j0 += VW) GDN_NAME(chunk_cols_)(S, io, work, D, O, j0, 1);
}

#undef GDN_CAT2
#undef GDN_CAT
#undef GDN_NAME
#undef GDN_INLINE
#undef GDN_C
#undef GDN_GROUP
#undef GDN_RI
