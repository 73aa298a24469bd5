/* kn_attention: the one attention op of the target, drafter and MTP forwards (dfl/kernels.h).
 * Built on the dispatched kn_dot_rows / kn_softmax / kn_axpy_rows, so every path computes each
 * (row, head) output by the same operations as the per-forward loops it replaces. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "kn_internal.h"

/* Keys visible to row r: the context (start of its block) then its block, all of it or, when
 * causal, up to the row itself (a masked key adds nothing to the softmax or the output, so
 * leaving it out changes no bit). */
static int attn_keys(const kn_attn_io *a, int r) {
    return a->starts[r / a->block] + (a->causal ? r % a->block + 1 : a->block);
}

/* The cache block b reads: its own (kc/vc) or the shared one. */
static const float *attn_kcache(const kn_attn_io *a, int b) { return a->kc ? a->kc[b] : a->k; }
static const float *attn_vcache(const kn_attn_io *a, int b) { return a->vc ? a->vc[b] : a->v; }

/* Scores of G query heads of row r (from head h0) over its n_keys keys into sc [G][ldsc]. */
static void attn_scores(const kn_attn_io *a, int r, int h0, int G, int n_keys, float *sc, size_t ldsc) {
    const int hd = a->head_dim, group = a->n_heads / a->n_kv_heads, kvh = h0 / group;
    const int b = r / a->block, start = a->starts[b];
    const float *q = a->q + (size_t)r * a->ldq + (size_t)h0 * a->ldqh, *k = attn_kcache(a, b) + (size_t)kvh * hd;
    if (!a->kb) { /* the block follows the context in the cache: one pass */
        kn_dot_rows(sc, ldsc, q, a->ldqh, G, k, a->ldkv, n_keys, hd);
        return;
    }
    const float *kb = a->kb + (size_t)b * a->block * a->ldkv + (size_t)kvh * hd;
    kn_dot_rows(sc, ldsc, q, a->ldqh, G, k, a->ldkv, start, hd);
    kn_dot_rows(sc + start, ldsc, q, a->ldqh, G, kb, a->ldkv, n_keys - start, hd);
}

/* Scale, mask (sliding window; tree: block keys that are not the row's ancestors) and softmax
 * of one score row sg [n_keys] of row r. */
static void attn_softmax(const kn_attn_io *a, int r, int n_keys, float *sg) {
    const float scale = 1.0f / sqrtf((float)a->head_dim);
    const int start = a->starts[r / a->block], qpos = start + r % a->block;
    const unsigned char *anc = a->tree ? a->tree + (size_t)r * a->ldtree : NULL;
    for (int j = 0; j < n_keys; j++)
        sg[j] =
            (a->window && qpos - j >= a->window) || (anc && j >= start && !anc[j - start]) ? -INFINITY : sg[j] * scale;
    kn_softmax(sg, n_keys);
}

/* out [G][hd] of row r (from head h0) = the weights sc [G][ldsc] over the values, gated. */
static void attn_values(const kn_attn_io *a, int r, int h0, int G, int n_keys, const float *sc, size_t ldsc) {
    const int hd = a->head_dim, group = a->n_heads / a->n_kv_heads, kvh = h0 / group;
    const int b = r / a->block, start = a->starts[b];
    float *o = a->out + (size_t)r * a->n_heads * hd + (size_t)h0 * hd; /* [G][hd] */
    const float *v = attn_vcache(a, b) + (size_t)kvh * hd;
    memset(o, 0, (size_t)G * hd * sizeof(float));
    if (!a->vb) {
        kn_axpy_rows(o, (size_t)hd, sc, ldsc, G, v, a->ldkv, n_keys, hd);
    } else {
        const float *vb = a->vb + (size_t)b * a->block * a->ldkv + (size_t)kvh * hd;
        kn_axpy_rows(o, (size_t)hd, sc, ldsc, G, v, a->ldkv, start, hd);
        kn_axpy_rows(o, (size_t)hd, sc + start, ldsc, G, vb, a->ldkv, n_keys - start, hd);
    }
}

/* The output gate of row r's heads h0 .. h0 + G - 1: o *= sigmoid(gate) per head. */
static void attn_gate(const kn_attn_io *a, int r, int h0, int G) {
    const int hd = a->head_dim;
    float *o = a->out + (size_t)r * a->n_heads * hd + (size_t)h0 * hd;
    for (int g = 0; g < G && a->gate; g++) {
        const float *gate = a->gate + (size_t)r * a->ldq + (size_t)(h0 + g) * a->ldqh;
        for (int i = 0; i < hd; i++) o[(size_t)g * hd + i] *= kn_sigmoid(gate[i]);
    }
}

/* A tree row over the shared cache (the nodes' keys after the context): the context's keys, then
 * only the row's ancestors (and itself), scored, softmaxed and summed in key order. The keys left
 * out are the ones the mask sets to -inf: their weights are exact zeros, which add nothing to the
 * softmax's sum or to the output (kn_axpy_rows skips them), so the result is the same bits as the
 * masked row's, without scoring them or taking them through expf's slow path for -inf. */
static void attn_tree_row(const kn_attn_io *a, int r, int h0, int G, float *sc, size_t ldsc) {
    const int hd = a->head_dim, kvh = h0 / (a->n_heads / a->n_kv_heads), start = a->starts[0];
    const unsigned char *anc = a->tree + (size_t)r * a->ldtree;
    const float *q = a->q + (size_t)r * a->ldq + (size_t)h0 * a->ldqh, *k = a->k + (size_t)kvh * hd;
    const float *v = a->v + (size_t)kvh * hd;
    kn_dot_rows(sc, ldsc, q, a->ldqh, G, k, a->ldkv, start, hd);
    int m = start;
    for (int j = 0; j <= r; j++)
        if (anc[j]) kn_dot_rows(sc + m++, ldsc, q, a->ldqh, G, k + (size_t)(start + j) * a->ldkv, a->ldkv, 1, hd);
    const float scale = 1.0f / sqrtf((float)hd);
    for (int g = 0; g < G; g++) {
        float *sg = sc + (size_t)g * ldsc;
        for (int j = 0; j < m; j++) sg[j] *= scale;
        kn_softmax(sg, m);
    }
    float *o = a->out + (size_t)r * a->n_heads * hd + (size_t)h0 * hd; /* [G][hd] */
    memset(o, 0, (size_t)G * hd * sizeof(float));
    kn_axpy_rows(o, (size_t)hd, sc, ldsc, G, v, a->ldkv, start, hd);
    m = start;
    for (int j = 0; j <= r; j++)
        if (anc[j]) kn_axpy_rows(o, (size_t)hd, sc + m++, ldsc, G, v + (size_t)(start + j) * a->ldkv, a->ldkv, 1, hd);
}

void kn_attention(const kn_attn_io *a) {
    const double prof_t0 = KN_PROF_BEGIN();
    const int n = a->n, Hq = a->n_heads, group = Hq / a->n_kv_heads;
    /* the query heads sharing a key/value head go together (each key row read once for them)
     * unless that leaves threads idle; results are the same either way */
    const int G = a->block * a->n_kv_heads >= kn_team_now() ? group : 1;
    const size_t ldsc = a->ldsc, work = (size_t)n * Hq * (a->starts[0] + a->block) * a->head_dim;
    /* a tree over the shared cache, one block (the target's tree forward): ancestors only */
    const int tree_rows = a->tree && !a->kb && !a->kc && !a->window && a->block == n;
#pragma omp parallel for num_threads(kn_team(work)) collapse(2) schedule(dynamic, 1) if (work >= KN_PAR_MIN_WORK)
    for (int r = 0; r < n; r++) {
        for (int h0 = 0; h0 < Hq; h0 += G) {
            float *sc = a->scores + (size_t)omp_get_thread_num() * group * ldsc; /* [G][ldsc] */
            if (tree_rows) {
                attn_tree_row(a, r, h0, G, sc, ldsc);
                attn_gate(a, r, h0, G);
                continue;
            }
            const int n_keys = attn_keys(a, r);
            attn_scores(a, r, h0, G, n_keys, sc, ldsc);
            for (int g = 0; g < G; g++) attn_softmax(a, r, n_keys, sc + (size_t)g * ldsc);
            attn_values(a, r, h0, G, n_keys, sc, ldsc);
            attn_gate(a, r, h0, G);
        }
    }
    KN_PROF_END(KN_OP_ATTENTION, prof_t0, 0);
}
