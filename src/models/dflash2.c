/* DFlash2 drafter pieces (docs/dflash2.md): the grouped depthwise convolution that wraps every
 * attention and MLP sublayer, and the candidate selector that proposes one coherent block. */
#include "models/dflash2.h"

#include <math.h>
#include <stdlib.h>

#include "dfl/common.h"

int dflash2_state_init(dfl_drafter_state *s) {
    const dfl_config *g = &s->d->cfg;
    if (!g->dflash2) return DFL_OK;
    const size_t B = (size_t)s->max_block, K = (size_t)g->selector_top_k;
    const size_t nd = 2 * (size_t)g->conv_taps * (size_t)(g->hidden / g->conv_group);
    s->cdelta = dfl_zalloc(B * nd * sizeof(float));
    s->conv = dfl_zalloc(B * (size_t)g->hidden * sizeof(float));
    s->sel_h = dfl_zalloc((B + 2) * (size_t)g->selector_rank * sizeof(float));
    s->cand = malloc(B * K * sizeof *s->cand);
    s->cand_logit = malloc(B * K * sizeof *s->cand_logit);
    s->walk = malloc(B * sizeof *s->walk);
    s->bytes += (B * (nd + (size_t)g->hidden + 2 * K + 1) + (B + 2) * (size_t)g->selector_rank) * sizeof(float);
    return s->cdelta && s->conv && s->sel_h && s->cand && s->cand_logit && s->walk ? DFL_OK : DFL_ERR;
}

void dflash2_state_free(dfl_drafter_state *s) {
    free(s->cdelta), free(s->conv), free(s->sel_h), free(s->cand), free(s->cand_logit), free(s->walk);
}

void dflash2_conv_deltas(dfl_drafter_state *s, const dfl_mat *proj, const float *xn, int B) {
    kn_matmul(s->cdelta, xn, proj, B);
}

void dflash2_conv(const dfl_drafter_state *s, const float *base, int side, const float *x, float *y, int B) {
    const dfl_config *g = &s->d->cfg;
    const int H = g->hidden, T = g->conv_taps, G = H / g->conv_group;
    /* row i's deltas of this side: cdelta [B][2][T][G] */
    kn_conv_grouped(y, x, base + (size_t)side * T * H, s->cdelta + (size_t)side * T * G, (size_t)2 * T * G, B, H, T,
                    g->conv_group);
}

void dflash2_select(dfl_drafter_state *s, const float *hidden, int32_t anchor, int D, float *logits) {
    const dfl_drafter *d = s->d;
    const dfl_config *g = &d->cfg;
    const int V = s->t->cfg.vocab, K = g->selector_top_k, R = g->selector_rank;
    kn_matmul(s->sel_h, hidden, &d->sel_proj, D);
    float *pred = s->sel_h + (size_t)s->max_block * R, *succ = pred + R;
    int32_t prev = anchor;
    for (int k = 0; k < D; k++) {
        float *row = logits + (size_t)k * V;
        int32_t *ids = s->cand + (size_t)k * K;
        float *vals = s->cand_logit + (size_t)k * K;
        kn_topk_values(row, V, K, ids, vals); /* torch.topk leaves ties unordered; float logits rarely tie */
        /* edge(prev -> c) = logit[c] + <pred[prev] * hidden_projection(h_k), succ[c]> */
        kn_mat_row(&d->sel_pred, prev, pred);
        kn_mul(pred, s->sel_h + (size_t)k * R, R);
        kn_fill(row, -INFINITY, (size_t)V);
        for (int c = 0; c < K; c++) {
            kn_mat_row(&d->sel_succ, ids[c], succ);
            row[ids[c]] = vals[c] + kn_dot(pred, succ, R);
        }
        /* the chain takes each row's argmax: the walk follows the same choice */
        prev = s->walk[k] = kn_argmax(row, V);
    }
}
