/* drafter_draft_many: several blocks in one drafter forward give, bit for bit, the logits that
 * drafter_draft gives for each block on a context that ends at its start (training metrics and
 * replays rely on it), on a Qwen3-target and a Qwen3.5-target DFlash fixture, for blocks of 2 and
 * of the drafter's size; starts beyond the context and DFlash2 batches are refused. Likewise
 * drafter_draft_across over the contexts of several states (batched replay). The ids-only drafts
 * equal the logits' argmax. */
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/draft.h"
#include "dfl/drafter.h"
#include "dfl/kernels.h"
#include "dfl/model.h"
#include "testutil.h"

static float frand(unsigned *s) {
    *s = *s * 1103515245u + 12345u;
    return ((*s >> 8) & 0xffff) / 65536.0f - 0.5f;
}

/* drafter_draft_across: blocks on three states holding different contexts, in one forward,
 * equal drafter_draft on each context cut at the block's start; states of unequal sizes are
 * refused. */
static void across(const dfl_drafter *d, const dfl_model *m) {
    enum { NS = 3, NB = 5, CTX = 24 };
    const int V = m->cfg.vocab, nf = d->cfg.n_target_ids * m->cfg.hidden, B = d->cfg.block_size;
    float *feat = malloc((size_t)NS * CTX * nf * sizeof *feat);
    float *one_l = malloc((size_t)NB * (B - 1) * V * sizeof(float));
    float *many = malloc((size_t)NB * (B - 1) * V * sizeof(float));
    unsigned seed = 11;
    for (size_t i = 0; i < (size_t)NS * CTX * nf; i++) feat[i] = frand(&seed);
    dfl_drafter_state st[NS], *ctx[NB];
    const int which[NB] = {2, 0, 1, 0, 2}, starts[NB] = {24, 5, 13, 24, 1};
    const int32_t anchors[NB] = {9, 3, 40, 2, 17};
    for (int k = 0; k < NS; k++) CHECK(drafter_state_init(&st[k], d, m, CTX + 8, B) == DFL_OK, "%s", dfl_errmsg());
    for (int b = 0; b < NB; b++) {
        dfl_drafter_state *s = &st[which[b]];
        drafter_state_reset(s);
        CHECK(drafter_add_context(s, feat + (size_t)which[b] * CTX * nf, starts[b]) == DFL_OK, "%s", dfl_errmsg());
        CHECK(drafter_draft(s, anchors[b], B, one_l + (size_t)b * (B - 1) * V) == DFL_OK, "%s", dfl_errmsg());
    }
    for (int k = 0; k < NS; k++) {
        drafter_state_reset(&st[k]);
        CHECK(drafter_add_context(&st[k], feat + (size_t)k * CTX * nf, CTX) == DFL_OK, "%s", dfl_errmsg());
    }
    for (int b = 0; b < NB; b++) ctx[b] = &st[which[b]];
    CHECK(drafter_draft_across(ctx, anchors, starts, NB, B, many) == DFL_OK, "%s", dfl_errmsg());
    CHECK(memcmp(one_l, many, (size_t)NB * (B - 1) * V * sizeof(float)) == 0,
          "%d blocks on %d contexts in one forward differ from drafting each alone", NB, NS);
    dfl_drafter_state other;
    CHECK(drafter_state_init(&other, d, m, CTX + 9, B) == DFL_OK, "%s", dfl_errmsg());
    ctx[1] = &other;
    CHECK(drafter_draft_across(ctx, anchors, (const int[]){0, 0, 0, 0, 0}, NB, B, many) != DFL_OK,
          "a context of another size in the batch is refused");
    drafter_state_free(&other);
    for (int k = 0; k < NS; k++) drafter_state_free(&st[k]);
    free(feat), free(one_l), free(many);
}

/* drafter_draft_ids and drafter_draft_across_ids: the argmax of drafter_draft's rows, bit for bit;
 * run on the target's own lm_head and on a BF16 copy of it (where the CPU estimates a BF16 head,
 * kn_matmul_argmax, the ids come without every row in float32). */
static void ids(const dfl_drafter *d, dfl_model *m) {
    enum { NB = 3, CTX = 20 };
    const int V = m->cfg.vocab, H = m->cfg.hidden, nf = d->cfg.n_target_ids * H, B = d->cfg.block_size;
    float *feat = malloc((size_t)CTX * nf * sizeof *feat), *lg = malloc((size_t)NB * (B - 1) * V * sizeof(float));
    uint16_t *head = malloc((size_t)V * H * sizeof *head);
    unsigned seed = 5;
    for (size_t i = 0; i < (size_t)CTX * nf; i++) feat[i] = frand(&seed);
    float *row = malloc((size_t)H * sizeof *row);
    for (int r = 0; r < V; r++) {
        kn_mat_row(&m->lm_head, r, row);
        for (int c = 0; c < H; c++) head[(size_t)r * H + c] = st_f32_to_bf16(row[c]);
    }
    free(row);
    const dfl_mat own = m->lm_head;
    kn_row_norms *own_norms = m->head_norms;
    dfl_drafter_state st;
    CHECK(drafter_state_init(&st, d, m, CTX + 8, B) == DFL_OK, "%s", dfl_errmsg());
    CHECK(drafter_add_context(&st, feat, CTX) == DFL_OK, "%s", dfl_errmsg());
    dfl_drafter_state *ctx[NB] = {&st, &st, &st};
    const int starts[NB] = {CTX, 7, 15};
    const int32_t anchors[NB] = {4, 11, 30};
    for (int bf16 = 0; bf16 < 2; bf16++) {
        if (bf16)
            m->lm_head = (dfl_mat){.dtype = ST_BF16, .data = head, .rows = V, .cols = H},
            m->head_norms = kn_row_norms_new();
        CHECK(kn_argmax_estimates(&m->lm_head, B - 1) == (bf16 && kn_argmax_estimate_kind() != KN_EST_NONE),
              "the BF16 head, and it alone, is estimated where the path estimates");
        int32_t got[NB * DFL_MAX_BLOCK];
        int bad = 0;
        CHECK(drafter_draft(&st, anchors[0], B, lg) == DFL_OK, "%s", dfl_errmsg());
        CHECK(drafter_draft_ids(&st, anchors[0], B, got, lg + (size_t)(B - 1) * V) == DFL_OK, "%s", dfl_errmsg());
        for (int k = 0; k < B - 1; k++) bad += got[k] != kn_argmax(lg + (size_t)k * V, V);
        CHECK(drafter_draft_across(ctx, anchors, starts, NB, B, lg) == DFL_OK, "%s", dfl_errmsg());
        float *scratch = malloc((size_t)NB * (B - 1) * V * sizeof(float));
        CHECK(drafter_draft_across_ids(ctx, anchors, starts, NB, B, got, scratch) == DFL_OK, "%s", dfl_errmsg());
        for (int k = 0; k < NB * (B - 1); k++) bad += got[k] != kn_argmax(lg + (size_t)k * V, V);
        CHECK(bad == 0, "%s lm_head (estimated: %d): %d draft ids differ from the logits' argmax",
              bf16 ? "a BF16" : "the target's", kn_argmax_estimates(&m->lm_head, B - 1), bad);
        free(scratch);
        if (bf16) kn_row_norms_free(m->head_norms);
    }
    m->lm_head = own, m->head_norms = own_norms;
    drafter_state_free(&st);
    free(feat), free(lg), free(head);
}

static void one(const char *target, const char *drafter_dir) {
    char tdir[4096], ddir[4096];
    snprintf(tdir, sizeof tdir, "%s", test_fixture(target));
    snprintf(ddir, sizeof ddir, "%s", test_fixture(drafter_dir));
    dfl_model m;
    dfl_drafter d;
    if (model_open(&m, tdir, 0) != DFL_OK) {
        CHECK(0, "%s", dfl_errmsg());
        return;
    }
    if (drafter_open(&d, ddir, m.cfg.n_layers) != DFL_OK) {
        CHECK(0, "%s", dfl_errmsg());
        model_close(&m);
        return;
    }
    const int CTX = 40, V = m.cfg.vocab, nf = d.cfg.n_target_ids * m.cfg.hidden;
    float *feat = malloc((size_t)CTX * nf * sizeof *feat);
    unsigned seed = 7;
    for (size_t i = 0; i < (size_t)CTX * nf; i++) feat[i] = frand(&seed);
    dfl_drafter_state s;
    CHECK(drafter_state_init(&s, &d, &m, CTX + 32, d.cfg.block_size) == DFL_OK, "%s", dfl_errmsg());
    const int blocks[2] = {2, d.cfg.block_size};
    for (int bi = 0; bi < 2; bi++) {
        const int B = blocks[bi], nb = 5;
        const int starts[5] = {3, 17, 18, 30, 40};
        const int32_t anchors[5] = {5, 17, 1, 60, 33};
        float *one_l = malloc((size_t)nb * (B - 1) * V * sizeof(float));
        float *many = malloc((size_t)nb * (B - 1) * V * sizeof(float));
        for (int b = 0; b < nb; b++) {
            drafter_state_reset(&s);
            CHECK(drafter_add_context(&s, feat, starts[b]) == DFL_OK, "%s", dfl_errmsg());
            CHECK(drafter_draft(&s, anchors[b], B, one_l + (size_t)b * (B - 1) * V) == DFL_OK, "%s", dfl_errmsg());
        }
        drafter_state_reset(&s);
        CHECK(drafter_add_context(&s, feat, CTX) == DFL_OK, "%s", dfl_errmsg());
        CHECK(drafter_draft_many(&s, anchors, starts, nb, B, many) == DFL_OK, "%s", dfl_errmsg());
        CHECK(memcmp(one_l, many, (size_t)nb * (B - 1) * V * sizeof(float)) == 0,
              "%s block %d: a batch of %d blocks differs from drafting each alone", drafter_dir, B, nb);
        const int late[1] = {CTX + 1};
        CHECK(drafter_draft_many(&s, anchors, late, 1, B, many) != DFL_OK, "a start beyond the context is refused");
        free(one_l), free(many);
    }
    free(feat);
    drafter_state_free(&s);
    across(&d, &m);
    ids(&d, &m);
    drafter_close(&d);
    model_close(&m);
}

int main(void) {
    one("qwen3_tiny", "dflash_qwen3");
    one("qwen35_vlm", "dflash_qwen35");
    return test_done("test_draft_many");
}
