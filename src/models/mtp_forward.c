/* MTP head forward (include/dfl/mtp.h): context K/V from committed (hidden, next token) pairs,
 * autoregressive draft steps over them. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/mtp.h"

#define ALLOC(p, nfloats)                                    \
    do {                                                     \
        (p) = dfl_zalloc((size_t)(nfloats) * sizeof(float)); \
        if (!(p)) goto oom;                                  \
        s->bytes += (uint64_t)(nfloats) * sizeof(float);     \
    } while (0)

int mtp_state_init(dfl_mtp_state *s, const dfl_mtp *h, const dfl_model *t, int max_ctx, int max_block) {
    memset(s, 0, sizeof *s);
    const dfl_config *g = &t->cfg;
    if (max_block < 2 || max_block > DFL_MAX_BLOCK)
        return dfl_seterr("block size %d: must be in [2, %d] (B-1 MTP steps)", max_block, DFL_MAX_BLOCK);
    if (max_ctx < 1) return dfl_seterr("MTP context must be >= 1");
    s->h = h, s->t = t, s->max_ctx = max_ctx, s->max_block = max_block;
    s->feature_layer = g->n_layers - 1;
    const size_t kv = (size_t)g->n_kv_heads * g->head_dim, B = (size_t)max_block, H = (size_t)g->hidden;
    const size_t inner = h->layer.moe ? moe_inner_per_token(&h->cfg) : (size_t)h->cfg.intermediate;
    /* the caches take physical pages only as positions are written */
    s->k_cache = calloc((size_t)max_ctx * kv + 1, sizeof(float));
    s->v_cache = calloc((size_t)max_ctx * kv + 1, sizeof(float));
    if (!s->k_cache || !s->v_cache) goto oom;
    s->bytes += 2 * (uint64_t)max_ctx * kv * sizeof(float);
    ALLOC(s->pending, H);
    ALLOC(s->hid, B * H);
    ALLOC(s->cat, B * 2 * H);
    ALLOC(s->x, B * H);
    ALLOC(s->xn, B * H);
    ALLOC(s->q, B * g->n_heads * g->head_dim * 2);
    ALLOC(s->k, B * kv);
    ALLOC(s->v, B * kv);
    ALLOC(s->att, B * g->n_heads * g->head_dim);
    ALLOC(s->mlp1, B * inner);
    ALLOC(s->mlp2, B * inner);
    if (h->layer.moe && moe_buf_init(&s->moe, &h->cfg, 1, &s->bytes) != DFL_OK) goto oom;
    ALLOC(s->scores, (size_t)omp_get_max_threads() * (g->n_heads / g->n_kv_heads) * (max_ctx + B)); /* kn_attention */
    ALLOC(s->inv_freq, g->rot_dim / 2);
    for (int i = 0; i < g->rot_dim / 2; i++) /* as the target's attention computes it */
        s->inv_freq[i] = 1.0f / powf((float)g->rope_theta, (float)(2 * i) / (float)g->rot_dim);
    return DFL_OK;
oom:
    mtp_state_free(s);
    return dfl_seterr("out of memory allocating the MTP state");
}

void mtp_state_free(dfl_mtp_state *s) {
    free(s->k_cache), free(s->v_cache), free(s->pending), free(s->hid), free(s->cat), free(s->x), free(s->xn);
    free(s->q), free(s->k), free(s->v), free(s->att), free(s->mlp1), free(s->mlp2), free(s->scores);
    free(s->inv_freq), free(s->feat_in);
    moe_buf_free(&s->moe);
    memset(s, 0, sizeof *s);
}

void mtp_state_reset(dfl_mtp_state *s) { s->n_ctx = 0; }

/* Per-head norm, then partial RoPE at pos, over nh heads of hd spaced `stride` apart. */
static void norm_rope(const dfl_mtp_state *s, float *x, int nh, size_t stride, const float *w, int pos) {
    const dfl_config *g = &s->t->cfg;
    float cs[256], sn[256]; /* [rot/2] */
    kn_rope_table(cs, sn, s->inv_freq, g->rot_dim / 2, (float)pos);
    kn_head_norm_rope(x, nh, stride, w, g->head_dim, g->rms_eps, cs, sn, g->rot_dim);
}

/* Rows 0..n-1 of s->x = fc([norm_emb(embed(tok)) ; norm_hidden(hid)]), hid final-normed; then
 * each row's K/V at positions pos0.. into the cache (and its query into s->q). */
static void rows_in(dfl_mtp_state *s, const float *hid, const int32_t *tok, int n, int pos0) {
    const dfl_mtp *h = s->h;
    const dfl_config *g = &s->t->cfg;
    const int H = g->hidden, hd = g->head_dim, kvw = g->n_kv_heads * hd;
    for (int t = 0; t < n; t++) {
        float *c = s->cat + (size_t)t * 2 * H;
        model_embed(s->t, tok[t], s->xn);
        kn_rmsnorm(c, s->xn, h->norm_emb, H, g->rms_eps);
        kn_rmsnorm(c + H, hid + (size_t)t * H, h->norm_hidden, H, g->rms_eps);
    }
    kn_matmul(s->x, s->cat, &h->fc, n);
    const dfl_layer_w *l = &h->layer;
    kn_rmsnorm_rows(s->xn, s->x, l->input_norm, n, H, g->rms_eps);
    kn_matmul_multi(3, (float *[]){s->q, s->k, s->v}, s->xn, (const dfl_mat *[]){&l->q_proj, &l->k_proj, &l->v_proj},
                    n);
    for (int t = 0; t < n; t++) {
        float *k = s->k + (size_t)t * kvw;
        norm_rope(s, k, g->n_kv_heads, (size_t)hd, l->k_norm, pos0 + t);
        memcpy(s->k_cache + (size_t)(pos0 + t) * kvw, k, (size_t)kvw * sizeof(float));
        memcpy(s->v_cache + (size_t)(pos0 + t) * kvw, s->v + (size_t)t * kvw, (size_t)kvw * sizeof(float));
    }
}

/* The rest of the layer for row 0 at position pos (K/V of 0..pos in the cache): gated attention,
 * MLP, final mtp norm into out [H]. */
static void step_out(dfl_mtp_state *s, int pos, float *out) {
    const dfl_mtp *h = s->h;
    const dfl_config *g = &s->t->cfg;
    const dfl_layer_w *l = &h->layer;
    const int H = g->hidden, hd = g->head_dim, Hq = g->n_heads, kvw = g->n_kv_heads * hd;
    norm_rope(s, s->q, Hq, (size_t)2 * hd, l->q_norm, pos);
    /* one causal row at pos; each head's q_proj rows are [query | output gate] */
    const kn_attn_io a = {.n = 1,
                          .n_heads = Hq,
                          .n_kv_heads = g->n_kv_heads,
                          .head_dim = hd,
                          .q = s->q,
                          .ldqh = (size_t)2 * hd,
                          .gate = s->q + hd,
                          .out = s->att,
                          .k = s->k_cache,
                          .v = s->v_cache,
                          .ldkv = (size_t)kvw,
                          .block = 1,
                          .starts = &pos,
                          .causal = 1,
                          .scores = s->scores,
                          .ldsc = (size_t)s->max_ctx + s->max_block};
    kn_attention(&a);
    kn_matmul(s->xn, s->att, &l->o_proj, 1);
    kn_add(s->x, s->xn, (size_t)H);
    kn_rmsnorm(s->xn, s->x, l->post_norm, H, g->rms_eps);
    if (l->moe) {
        moe_forward(&h->cfg, l, &s->moe, s->xn, s->x, s->mlp1, s->mlp2, 1);
    } else {
        kn_matmul_multi(2, (float *[]){s->mlp1, s->mlp2}, s->xn, (const dfl_mat *[]){&l->gate, &l->up}, 1);
        kn_swiglu_par(s->mlp1, s->mlp2, (size_t)h->cfg.intermediate);
        kn_matmul(s->xn, s->mlp1, &l->down, 1);
        kn_add(s->x, s->xn, (size_t)H);
    }
    kn_rmsnorm(out, s->x, h->norm, H, g->rms_eps);
}

/* n more positions fit and their tokens are in the vocabulary. */
static int context_check(const dfl_mtp_state *s, const int32_t *tokens, int n) {
    if (n < 0 || s->n_ctx + n > s->max_ctx)
        return dfl_seterr("MTP context full: %d + %d positions exceed %d", s->n_ctx, n, s->max_ctx);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= s->t->cfg.vocab)
            return dfl_seterr("MTP context: token id %d outside the vocabulary [0, %d)", tokens[i], s->t->cfg.vocab);
    return DFL_OK;
}

int mtp_add_context(dfl_mtp_state *s, const float *feat, const int32_t *tokens, int n) {
    const dfl_model *t = s->t;
    const int H = t->cfg.hidden;
    if (context_check(s, tokens, n)) return DFL_ERR;
    for (int c0 = 0; c0 < n; c0 += s->max_block) {
        const int m = n - c0 < s->max_block ? n - c0 : s->max_block;
        /* token c0+j completes the pair of the position before it: the pending hidden state for
         * j = 0, else feature row c0+j-1; position 0 has no position before it */
        const int first = s->n_ctx == 0;
        for (int j = first; j < m; j++) {
            float *dst = s->hid + (size_t)(j - first) * H;
            if (j == 0) memcpy(dst, s->pending, (size_t)H * sizeof(float));
            else kn_rmsnorm(dst, feat + (size_t)(c0 + j - 1) * H, t->final_norm, H, t->cfg.rms_eps);
        }
        if (m > first) rows_in(s, s->hid, tokens + c0 + first, m - first, s->n_ctx - 1 + first);
        kn_rmsnorm(s->pending, feat + (size_t)(c0 + m - 1) * H, t->final_norm, H, t->cfg.rms_eps);
        s->n_ctx += m;
    }
    return DFL_OK;
}

int mtp_add_features(dfl_mtp_state *s, const dfl_feat *f, const int32_t *tokens, int n) {
    const int H = s->t->cfg.hidden;
    if (f->width != H) return dfl_seterr("MTP features: rows of %d floats, the head reads %d", f->width, H);
    if (f->host) {
        const float *rows = dfl_feat_host_rows(f, 0, n, NULL);
        return rows ? mtp_add_context(s, rows, tokens, n) : DFL_ERR;
    }
    /* read a block at a time: what mtp_add_context checks, checked for all n first */
    if (n < 0 || n > f->rows) return dfl_seterr("MTP features: %d rows asked, the handle holds %d", n, f->rows);
    if (context_check(s, tokens, n)) return DFL_ERR;
    if (!s->feat_in && !(s->feat_in = malloc((size_t)s->max_block * H * sizeof(float))))
        return dfl_seterr("out of memory for the MTP head's feature rows");
    for (int c0 = 0; c0 < n; c0 += s->max_block) {
        const int m = n - c0 < s->max_block ? n - c0 : s->max_block;
        const float *rows = dfl_feat_host_rows(f, c0, m, s->feat_in);
        if (!rows || mtp_add_context(s, rows, tokens + c0, m)) return DFL_ERR;
    }
    return DFL_OK;
}

int mtp_draft(dfl_mtp_state *s, int32_t anchor, int B, float *logits) {
    const dfl_model *t = s->t;
    const int H = t->cfg.hidden, V = t->cfg.vocab;
    if (B < 2 || B > s->max_block) return dfl_seterr("draft block of %d: must be in [2, %d]", B, s->max_block);
    if (anchor < 0 || anchor >= V) return dfl_seterr("anchor token %d outside the vocabulary", anchor);
    if (s->n_ctx < 1)
        return dfl_seterr("MTP draft: no committed position (the anchor needs the hidden state before it)");
    if (s->n_ctx - 1 + B - 1 > s->max_ctx)
        return dfl_seterr("MTP draft: %d steps from position %d exceed the context of %d", B - 1, s->n_ctx - 1,
                          s->max_ctx);
    /* step k (1-based) runs at position n_ctx-2+k from (y_{k-1}, token_{k-1}); y_0 = the pending
     * target hidden state, token_0 = the anchor */
    float *y = s->hid + H; /* the step's output, the next step's hidden input */
    memcpy(s->hid, s->pending, (size_t)H * sizeof(float));
    int32_t tok = anchor;
    for (int k = 1; k < B; k++) {
        const int pos = s->n_ctx - 2 + k;
        rows_in(s, s->hid, &tok, 1, pos);
        step_out(s, pos, y);
        float *row = logits + (size_t)(k - 1) * V;
        model_lm_head(t, y, row, 1);
        if (kn_count_nonfinite(row, (size_t)V))
            return dfl_seterr("MTP logits are not finite at step %d (position %d): the mtp.* weights or the target's "
                              "hidden states hold NaN/Inf; run dfl inspect --check-weights %s",
                              k, pos + 1, s->h->dir);
        tok = kn_argmax(row, V);
        memcpy(s->hid, y, (size_t)H * sizeof(float));
    }
    return DFL_OK;
}

static int if_add(void *ctx, const dfl_feat *feat, const int32_t *tokens, int n) {
    return mtp_add_features(ctx, feat, tokens, n);
}
static int if_draft(void *ctx, int32_t anchor, int B, float *logits) { return mtp_draft(ctx, anchor, B, logits); }
static int if_len(void *ctx) { return ((dfl_mtp_state *)ctx)->n_ctx; }
static void if_reset(void *ctx) { mtp_state_reset(ctx); }

dfl_draft_if mtp_drafter_if(dfl_mtp_state *s) {
    return (dfl_draft_if){.ctx = s,
                          .add_context = if_add,
                          .draft = if_draft,
                          .context_len = if_len,
                          .reset = if_reset,
                          .feature_layers = &s->feature_layer,
                          .n_feature_layers = 1};
}
