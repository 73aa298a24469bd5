/* drafter_draft_many: several blocks in one drafter forward give, bit for bit, the logits that
 * drafter_draft gives for each block on a context that ends at its start (training metrics and
 * replays rely on it), on a Qwen3-target and a Qwen3.5-target DFlash fixture, for blocks of 2 and
 * of the drafter's size; starts beyond the context and DFlash2 batches are refused. */
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/drafter.h"
#include "dfl/model.h"
#include "testutil.h"

static float frand(unsigned *s) {
    *s = *s * 1103515245u + 12345u;
    return ((*s >> 8) & 0xffff) / 65536.0f - 0.5f;
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
    drafter_close(&d);
    model_close(&m);
}

int main(void) {
    one("qwen3_tiny", "dflash_qwen3");
    one("qwen35_vlm", "dflash_qwen35");
    return test_done("test_draft_many");
}
