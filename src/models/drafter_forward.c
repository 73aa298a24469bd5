/* DFlash drafter forward (docs/design.md §4): context K/V from target features, one block per draft. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/drafter.h"
#include "models/dflash2.h"

/* ALLOC: zeroed and cache-line aligned (activations); ALLOC_LAZY: calloc, whose large blocks
 * take physical pages only when first written (the context caches sized by max_ctx). */
#define ALLOC(p, nfloats)                                    \
    do {                                                     \
        (p) = dfl_zalloc((size_t)(nfloats) * sizeof(float)); \
        if (!(p)) goto oom;                                  \
        s->bytes += (uint64_t)(nfloats) * sizeof(float);     \
    } while (0)
#define ALLOC_LAZY(p, nfloats)                                                      \
    do {                                                                            \
        (p) = calloc((size_t)(nfloats) > 0 ? (size_t)(nfloats) : 1, sizeof(float)); \
        if (!(p)) goto oom;                                                         \
        s->bytes += (uint64_t)(nfloats) * sizeof(float);                            \
    } while (0)

int drafter_state_init(dfl_drafter_state *s, const dfl_drafter *d, const dfl_model *t, int max_ctx, int max_block) {
    memset(s, 0, sizeof *s);
    const dfl_config *g = &d->cfg;
    if (max_block < 2 || max_block > g->block_size)
        return dfl_seterr("block size %d: must be in [2, %d] (the drafter's block_size)", max_block, g->block_size);
    if (max_ctx < 1) return dfl_seterr("drafter context must be >= 1");
    s->d = d;
    s->t = t;
    s->max_ctx = max_ctx;
    s->max_block = max_block;
    const int L = g->n_layers, kv = g->n_kv_heads * g->head_dim, B = max_block;
    s->k_ctx = calloc((size_t)L, sizeof(float *));
    s->v_ctx = calloc((size_t)L, sizeof(float *));
    if (!s->k_ctx || !s->v_ctx) goto oom;
    for (int i = 0; i < L; i++) {
        ALLOC_LAZY(s->k_ctx[i], (size_t)max_ctx * kv);
        ALLOC_LAZY(s->v_ctx[i], (size_t)max_ctx * kv);
    }
    ALLOC(s->ctx, (size_t)B * g->hidden);
    ALLOC(s->x, (size_t)B * g->hidden);
    ALLOC(s->xn, (size_t)B * g->hidden);
    ALLOC(s->q, (size_t)B * g->n_heads * g->head_dim);
    ALLOC(s->kb, (size_t)B * kv);
    ALLOC(s->vb, (size_t)B * kv);
    ALLOC(s->att, (size_t)B * g->n_heads * g->head_dim);
    ALLOC(s->mlp1, (size_t)B * g->intermediate);
    ALLOC(s->mlp2, (size_t)B * g->intermediate);
    ALLOC(s->scores, (size_t)omp_get_max_threads() * (g->n_heads / g->n_kv_heads) * (max_ctx + B));
    ALLOC(s->inv_freq, g->rot_dim / 2);
    for (int i = 0; i < g->rot_dim / 2; i++)
        s->inv_freq[i] = 1.0f / powf((float)g->rope_theta, (float)(2 * i) / (float)g->rot_dim);
    if (dflash2_state_init(s) != DFL_OK) goto oom;
    return DFL_OK;
oom:
    drafter_state_free(s);
    return dfl_seterr("out of memory allocating the drafter state");
}

void drafter_state_free(dfl_drafter_state *s) {
    if (s->d)
        for (int i = 0; i < s->d->cfg.n_layers; i++) {
            if (s->k_ctx) free(s->k_ctx[i]);
            if (s->v_ctx) free(s->v_ctx[i]);
        }
    free(s->k_ctx), free(s->v_ctx), free(s->ctx), free(s->x), free(s->xn), free(s->q), free(s->kb), free(s->vb);
    free(s->att), free(s->mlp1), free(s->mlp2), free(s->scores), free(s->inv_freq), free(s->batch);
    free(s->feat_in);
    dflash2_state_free(s);
    memset(s, 0, sizeof *s);
}

void drafter_state_reset(dfl_drafter_state *s) { s->n_ctx = 0; }

/* q/k norm then RoPE at absolute position pos, for each of nh heads of x [nh*hd]. */
static void norm_rope(const dfl_drafter_state *s, float *x, int nh, const float *w, int pos) {
    const dfl_config *g = &s->d->cfg;
    float cs[256], sn[256]; /* [rot/2] */
    kn_rope_table(cs, sn, s->inv_freq, g->rot_dim / 2, (float)pos);
    kn_head_norm_rope(x, nh, (size_t)g->head_dim, w, g->head_dim, g->rms_eps, cs, sn, g->rot_dim);
}

int drafter_add_features(dfl_drafter_state *s, const dfl_feat *f, int n) {
    const int nf = s->d->cfg.n_target_ids * s->d->cfg.hidden;
    if (f->width != nf) return dfl_seterr("drafter features: rows of %d floats, the drafter reads %d", f->width, nf);
    if (f->host) {
        const float *rows = dfl_feat_host_rows(f, 0, n, NULL);
        return rows ? drafter_add_context(s, rows, n) : DFL_ERR;
    }
    /* read a block at a time: what drafter_add_context checks, checked for all n first */
    if (n < 0 || n > f->rows) return dfl_seterr("drafter features: %d rows asked, the handle holds %d", n, f->rows);
    if (s->n_ctx + n > s->max_ctx)
        return dfl_seterr("drafter context full: %d + %d positions exceed %d", s->n_ctx, n, s->max_ctx);
    if (!s->feat_in && !(s->feat_in = malloc((size_t)s->max_block * nf * sizeof(float))))
        return dfl_seterr("out of memory for the drafter's feature rows");
    for (int c0 = 0; c0 < n; c0 += s->max_block) {
        const int m = n - c0 < s->max_block ? n - c0 : s->max_block;
        const float *rows = dfl_feat_host_rows(f, c0, m, s->feat_in);
        if (!rows || drafter_add_context(s, rows, m)) return DFL_ERR;
    }
    return DFL_OK;
}

int drafter_add_context(dfl_drafter_state *s, const float *feat, int n) {
    const dfl_drafter *d = s->d;
    const dfl_config *g = &d->cfg;
    const int H = g->hidden, kv = g->n_kv_heads * g->head_dim, nf = g->n_target_ids * H;
    if (s->n_ctx + n > s->max_ctx)
        return dfl_seterr("drafter context full: %d + %d positions exceed %d", s->n_ctx, n, s->max_ctx);
    for (int c0 = 0; c0 < n; c0 += s->max_block) {
        const int m = n - c0 < s->max_block ? n - c0 : s->max_block;
        kn_matmul(s->x, feat + (size_t)c0 * nf, &d->fc, m);
        kn_rmsnorm_rows(s->ctx, s->x, d->hidden_norm, m, H, g->rms_eps);
        for (int li = 0; li < g->n_layers; li++) {
            const dfl_dlayer_w *l = &d->layers[li];
            float *kc = s->k_ctx[li] + (size_t)(s->n_ctx + c0) * kv, *vc = s->v_ctx[li] + (size_t)(s->n_ctx + c0) * kv;
            /* the context enters every layer as is (no input norm), through that layer's k/v */
            kn_matmul_multi(2, (float *[]){kc, vc}, s->ctx, (const dfl_mat *[]){&l->k_proj, &l->v_proj}, m);
            for (int t = 0; t < m; t++) norm_rope(s, kc + (size_t)t * kv, g->n_kv_heads, l->k_norm, s->n_ctx + c0 + t);
        }
    }
    s->n_ctx += n;
    return DFL_OK;
}

/* Activations of a forward over nb blocks of B rows: the state's own for one block, the batch
 * scratch for more. */
typedef struct dscratch {
    float *x, *xn, *q, *kb, *vb, *att, *mlp1, *mlp2;
} dscratch;

/* The DFlash layers over nb independent blocks [anchors[b], MASK x (B-1)] at positions
 * starts[b].. (block b attends to context positions < starts[b] and to itself), then the final
 * norm and lm_head of rows 1..B-1 of each: logits [nb * (B-1), V]. The contexts are s's, or
 * with ctx [nb] block b's is ctx[b]'s (the same drafter's states). With ids [nb * (B-1)] each
 * row's argmax too; logits are then scratch, which a plain DFlash head (no output multiplier or
 * softcap) may not fill: its lm_head finds the argmax itself (kn_matmul_argmax). */
static int draft_rows(dfl_drafter_state *s, dfl_drafter_state *const *ctx, const dscratch *w, const int32_t *anchors,
                      const int *starts, int nb, int B, float *logits, int32_t *ids) {
    const dfl_drafter *d = s->d;
    const dfl_config *g = &d->cfg;
    const dfl_model *t = s->t;
    const int H = g->hidden, hd = g->head_dim, Hq = g->n_heads, Hkv = g->n_kv_heads, kv = Hkv * hd;
    const int dflash2 = g->dflash2, R = nb * B;
    const float **kc = NULL, **vc = NULL; /* [nb] block b's context cache of the layer being run */
    if (ctx && (!(kc = malloc((size_t)nb * sizeof *kc)) || !(vc = malloc((size_t)nb * sizeof *vc)))) {
        free(kc);
        return dfl_seterr("out of memory for a drafter batch over %d contexts", nb);
    }
    /* block = [anchor, MASK x (B-1)], embedded with the target's embedding */
    for (int i = 0; i < R; i++) model_embed(t, i % B == 0 ? anchors[i / B] : g->mask_token_id, w->x + (size_t)i * H);
    if (g->input_embedding_scale != 1.0f) kn_scale(w->x, g->input_embedding_scale, (size_t)R * H);
    for (int li = 0; li < g->n_layers; li++) {
        const dfl_dlayer_w *l = &d->layers[li];
        const int sliding = l->type == DFL_LAYER_SLIDING;
        /* cfg.causal (is_causal, dflash_config.causal or drafter_set_causal) overrides the
         * default, -1: sliding layers causal, full ones not (docs/design.md §4) */
        const int causal = g->causal >= 0 ? g->causal : sliding;
        kn_rmsnorm_rows(w->xn, w->x, l->input_norm, R, H, g->rms_eps);
        const float *ain = w->xn; /* the attention's input: DFlash2 convolves the normed rows first */
        if (dflash2) {
            dflash2_conv_deltas(s, &l->attn_conv_proj, s->xn, B);
            dflash2_conv(s, l->attn_conv_base, 0, s->xn, s->conv, B);
            ain = s->conv;
        }
        for (int b = 0; ctx && b < nb; b++) kc[b] = ctx[b]->k_ctx[li], vc[b] = ctx[b]->v_ctx[li];
        kn_matmul_multi(3, (float *[]){w->q, w->kb, w->vb}, ain,
                        (const dfl_mat *[]){&l->q_proj, &l->k_proj, &l->v_proj}, R);
        for (int i = 0; i < R; i++) {
            norm_rope(s, w->q + (size_t)i * Hq * hd, Hq, l->q_norm, starts[i / B] + i % B);
            norm_rope(s, w->kb + (size_t)i * kv, Hkv, l->k_norm, starts[i / B] + i % B);
        }
        /* each block sees the context before its start and itself (a window in sliding layers,
         * up to the row in causal ones) */
        const kn_attn_io a = {.n = R,
                              .n_heads = Hq,
                              .n_kv_heads = Hkv,
                              .head_dim = hd,
                              .q = w->q,
                              .ldq = (size_t)Hq * hd,
                              .ldqh = (size_t)hd,
                              .out = w->att,
                              .k = s->k_ctx[li],
                              .v = s->v_ctx[li],
                              .kc = kc,
                              .vc = vc,
                              .kb = w->kb,
                              .vb = w->vb,
                              .ldkv = (size_t)kv,
                              .block = B,
                              .starts = starts,
                              .causal = causal,
                              .window = sliding ? g->sliding_window : 0,
                              .scores = s->scores,
                              .ldsc = (size_t)s->max_ctx + s->max_block};
        kn_attention(&a);
        kn_matmul(w->xn, w->att, &l->o_proj, R);
        const float *aout = w->xn;
        if (dflash2) { /* the output side, with the deltas taken from the attention's normed input */
            dflash2_conv(s, l->attn_conv_base, 1, s->xn, s->conv, B);
            aout = s->conv;
        }
        kn_add(w->x, aout, (size_t)R * H);
        kn_rmsnorm_rows(w->xn, w->x, l->post_norm, R, H, g->rms_eps);
        const float *mlp_in = w->xn;
        if (dflash2) {
            dflash2_conv_deltas(s, &l->mlp_conv_proj, s->xn, B);
            dflash2_conv(s, l->mlp_conv_base, 0, s->xn, s->conv, B);
            mlp_in = s->conv;
        }
        kn_matmul_multi(2, (float *[]){w->mlp1, w->mlp2}, mlp_in, (const dfl_mat *[]){&l->gate, &l->up}, R);
        kn_swiglu_par(w->mlp1, w->mlp2, (size_t)R * g->intermediate);
        kn_matmul(w->xn, w->mlp1, &l->down, R);
        const float *mout = w->xn;
        if (dflash2) {
            dflash2_conv(s, l->mlp_conv_base, 1, s->xn, s->conv, B);
            mout = s->conv;
        }
        kn_add(w->x, mout, (size_t)R * H);
    }
    free(kc), free(vc);
    /* rows 1..B-1 of each block predict the tokens at start+1..start+B-1 */
    for (int b = 0; b < nb; b++)
        kn_rmsnorm_rows(w->xn + (size_t)b * (B - 1) * H, w->x + ((size_t)b * B + 1) * H, d->norm, B - 1, H, g->rms_eps);
    const int rows = nb * (B - 1), V = t->cfg.vocab;
    const int plain = !dflash2 && g->output_multiplier == 1.0f && !(g->final_logit_softcap > 0);
    if (!(ids && plain)) model_lm_head(t, w->xn, logits, rows);
    else if (!model_lm_head_argmax(t, w->xn, logits, ids, rows)) return DFL_OK; /* the bound vouched: finite */
    const size_t nl = (size_t)rows * V;
    if (g->output_multiplier != 1.0f) kn_scale(logits, g->output_multiplier, nl);
    if (g->final_logit_softcap > 0) kn_softcap(logits, g->final_logit_softcap, nl);
    /* as for the target: NaN/Inf weights are not scanned at load, they are caught here */
    const int any_bad = kn_count_nonfinite(logits, nl) > 0; /* fast path: none */
    for (size_t i = 0; i < nl && any_bad; i++)
        if (!isfinite(logits[i])) {
            const int row = (int)(i / (size_t)t->cfg.vocab), b = row / (B - 1), k = row % (B - 1);
            int bad = 0;
            for (size_t j = (size_t)row * t->cfg.vocab; j < (size_t)(row + 1) * t->cfg.vocab; j++)
                bad += !isfinite(logits[j]);
            return dfl_seterr("drafter logits are not finite at block position %d (context position %d; %d of %d "
                              "values): the drafter holds NaN/Inf weights or its input features do; run dfl inspect "
                              "--check-weights %s",
                              k + 1, starts[b] + k + 1, bad, t->cfg.vocab, d->dir ? d->dir : "DRAFTER");
        }
    if (dflash2) dflash2_select(s, s->xn, anchors[0], B - 1, logits);
    if (ids && !plain)
        for (int r = 0; r < rows; r++) ids[r] = kn_argmax(logits + (size_t)r * V, V);
    return DFL_OK;
}

static int draft_one(dfl_drafter_state *s, int32_t anchor, int B, float *logits, int32_t *ids) {
    if (B < 2 || B > s->max_block) return dfl_seterr("draft block of %d: must be in [2, %d]", B, s->max_block);
    if (anchor < 0 || anchor >= s->t->cfg.vocab) return dfl_seterr("anchor token %d outside the vocabulary", anchor);
    const dscratch w = {s->x, s->xn, s->q, s->kb, s->vb, s->att, s->mlp1, s->mlp2};
    const int start = s->n_ctx;
    return draft_rows(s, NULL, &w, &anchor, &start, 1, B, logits, ids);
}

int drafter_draft(dfl_drafter_state *s, int32_t anchor, int B, float *logits) {
    return draft_one(s, anchor, B, logits, NULL);
}

int drafter_draft_ids(dfl_drafter_state *s, int32_t anchor, int B, int32_t *ids, float *scratch) {
    return draft_one(s, anchor, B, scratch, ids);
}

/* The batch scratch for rows rows (grown on demand). */
static int batch_reserve(dfl_drafter_state *s, int rows) {
    if (rows <= s->batch_rows) return DFL_OK;
    const dfl_config *g = &s->d->cfg;
    const size_t H = g->hidden, qd = (size_t)g->n_heads * g->head_dim, kv = (size_t)g->n_kv_heads * g->head_dim;
    const size_t per = 2 * H + 2 * qd + 2 * kv + 2 * (size_t)g->intermediate;
    float *p = realloc(s->batch, (size_t)rows * per * sizeof(float));
    if (!p)
        return dfl_seterr("out of memory for a batch of %d drafter rows (%.1f MiB)", rows,
                          (double)rows * per * sizeof(float) / 1048576.0);
    s->bytes += (uint64_t)(rows - s->batch_rows) * per * sizeof(float);
    s->batch = p, s->batch_rows = rows;
    return DFL_OK;
}

/* Blocks on the contexts of s (ctx NULL) or of ctx [nb]: drafted one by one as drafter_draft
 * where that is what they are, else in one forward on s's batch scratch. */
static int draft_blocks(dfl_drafter_state *s, dfl_drafter_state *const *ctx, const int32_t *anchors, const int *starts,
                        int nb, int B, float *logits, int32_t *ids) {
    const dfl_config *g = &s->d->cfg;
    if (g->dflash2 && nb > 1) return dfl_seterr("a DFlash2 drafter drafts one block at a time");
    if (B < 2 || B > s->max_block) return dfl_seterr("draft block of %d: must be in [2, %d]", B, s->max_block);
    if (nb < 1) return dfl_seterr("no blocks to draft");
    for (int b = 0; b < nb; b++) {
        const dfl_drafter_state *c = ctx ? ctx[b] : s;
        if (c->d != s->d || c->t != s->t || c->max_ctx != s->max_ctx || c->max_block != s->max_block)
            return dfl_seterr("block %d: a context of another drafter, target or size than block 0's", b);
        if (anchors[b] < 0 || anchors[b] >= s->t->cfg.vocab)
            return dfl_seterr("anchor token %d outside the vocabulary", anchors[b]);
        if (starts[b] < 0 || starts[b] > c->n_ctx)
            return dfl_seterr("block %d starts at position %d, but the context holds %d", b, starts[b], c->n_ctx);
    }
    if (nb == 1 && starts[0] == (ctx ? ctx[0] : s)->n_ctx)
        return draft_one(ctx ? ctx[0] : s, anchors[0], B, logits, ids);
    if (batch_reserve(s, nb * B)) return DFL_ERR;
    const size_t R = (size_t)nb * B, H = g->hidden, qd = (size_t)g->n_heads * g->head_dim;
    const size_t kv = (size_t)g->n_kv_heads * g->head_dim, I = g->intermediate;
    dscratch w;
    float *p = s->batch;
    w.x = p, p += R * H;
    w.xn = p, p += R * H;
    w.q = p, p += R * qd;
    w.att = p, p += R * qd;
    w.kb = p, p += R * kv;
    w.vb = p, p += R * kv;
    w.mlp1 = p, p += R * I;
    w.mlp2 = p;
    return draft_rows(s, ctx, &w, anchors, starts, nb, B, logits, ids);
}

int drafter_draft_many(dfl_drafter_state *s, const int32_t *anchors, const int *starts, int nb, int B, float *logits) {
    return draft_blocks(s, NULL, anchors, starts, nb, B, logits, NULL);
}

int drafter_draft_across(dfl_drafter_state *const *ctx, const int32_t *anchors, const int *starts, int nb, int B,
                         float *logits) {
    if (nb < 1) return dfl_seterr("no blocks to draft");
    return draft_blocks(ctx[0], ctx, anchors, starts, nb, B, logits, NULL);
}

int drafter_draft_across_ids(dfl_drafter_state *const *ctx, const int32_t *anchors, const int *starts, int nb, int B,
                             int32_t *ids, float *scratch) {
    if (nb < 1) return dfl_seterr("no blocks to draft");
    return draft_blocks(ctx[0], ctx, anchors, starts, nb, B, scratch, ids);
}
