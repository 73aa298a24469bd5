/* Feature handles (dfl_feat, dfl/backend.h) on the CPU: a forward capturing into a handle writes
 * the same bits as into host rows (chain and tree); an accepted path's rows gather to the front
 * as a host copy would; a drafter fed from a handle drafts what it drafts from the rows; bad
 * gathers, reads, sizes and captures are refused by name. The GPU's handles are checked by
 * tests/gpu/test_cuda_forward.c against these rows. */
#include <stdlib.h>
#include <string.h>

#include "dfl/backend.h"
#include "dfl/common.h"
#include "dfl/drafter.h"
#include "dfl/model.h"
#include "testutil.h"

enum { T = 12, W = 6 };

static int refused(int rc, const char *what) { return rc == DFL_ERR && strstr(dfl_errmsg(), what) != NULL; }

/* gather and read against the same moves on a plain copy; the errors */
static void rows_api(void) {
    dfl_feat f;
    float want[T * W], got[T * W];
    CHECK(dfl_feat_alloc(&f, DFL_DEVICE_CPU, T, W) == DFL_OK && f.host && f.owned, "alloc: %s", dfl_errmsg());
    int zero = 1;
    for (int i = 0; i < T * W; i++) zero &= f.host[i] == 0.0f;
    CHECK(zero, "host rows start zeroed");
    for (int i = 0; i < T * W; i++) f.host[i] = want[i] = (float)i;
    const int path[5] = {0, 3, 4, 9, 11};
    for (int k = 0; k < 5; k++) memcpy(want + k * W, want + path[k] * W, W * sizeof(float));
    CHECK(dfl_feat_gather(&f, path, 5) == DFL_OK && dfl_feat_read(&f, 0, T, got) == DFL_OK &&
              memcmp(got, want, sizeof want) == 0,
          "gather: %s", dfl_errmsg());
    CHECK(dfl_feat_host_rows(&f, 2, 3, NULL) == f.host + 2 * W, "host rows are read in place");
    CHECK(refused(dfl_feat_gather(&f, (const int[]){0, 2, 2}, 3), "must ascend"), "a repeated row: %s", dfl_errmsg());
    CHECK(refused(dfl_feat_gather(&f, (const int[]){1, 0}, 2), "must ascend"), "a row before its place");
    CHECK(refused(dfl_feat_gather(&f, (const int[]){0, T}, 2), "below 12"), "a row past the end: %s", dfl_errmsg());
    CHECK(refused(dfl_feat_read(&f, T - 2, 3, got), "rows 10..12: the handle holds 12"), "read past the end: %s",
          dfl_errmsg());
    CHECK(dfl_feat_host_rows(&f, T, 1, got) == NULL, "host rows past the end");
    dfl_feat_free(&f);
    CHECK(f.host == NULL && f.rows == 0, "freed");
    CHECK(refused(dfl_feat_alloc(&f, DFL_DEVICE_CPU, 0, W), "0 x 6"), "no rows: %s", dfl_errmsg());
    if (!dfl_device_built(DFL_DEVICE_CUDA))
        CHECK(refused(dfl_feat_alloc(&f, DFL_DEVICE_CUDA, T, W), "cuda: not built"), "cuda rows: %s", dfl_errmsg());
    dfl_feat v = dfl_feat_view(want, T, W);
    dfl_feat_free(&v); /* a view leaves the rows alone: freeing them would be a bad free under ASan */
    CHECK(v.host == NULL && want[T * W - 1] == (float)(T * W - 1), "a view is emptied, its rows stay");
}

/* capture into a handle = into host rows, chain and tree; the capture's errors */
static void capture(const dfl_model *m) {
    const int H = m->cfg.hidden, L = m->cfg.n_layers, V = m->cfg.vocab;
    const int layers[2] = {L - 1, 0}, parent[5] = {-1, 0, 0, 1, 2};
    int32_t tok[T];
    for (int i = 0; i < T; i++) tok[i] = (int32_t)((i * 37 + 5) % V);
    float *rows = malloc((size_t)T * 2 * H * sizeof(float)), *logits = malloc((size_t)T * V * sizeof(float));
    dfl_feat f;
    dfl_target_state s;
    CHECK(dfl_feat_alloc(&f, DFL_DEVICE_CPU, T, 2 * H) == DFL_OK, "alloc: %s", dfl_errmsg());
    CHECK(target_state_init(&s, m, 2 * T + 8, T, 1) == DFL_OK && target_state_enable_tree(&s, 5) == DFL_OK, "state: %s",
          dfl_errmsg());
    const dfl_capture out = {.n_layers = 2, .layers = layers, .out = rows},
                      to = {.n_layers = 2, .layers = layers, .to = &f};
    CHECK(model_forward(&s, tok, T, logits, 1, &out) == DFL_OK, "forward: %s", dfl_errmsg());
    target_state_reset(&s);
    CHECK(model_forward(&s, tok, T, logits, 1, &to) == DFL_OK, "forward: %s", dfl_errmsg());
    CHECK(memcmp(f.host, rows, (size_t)T * 2 * H * sizeof(float)) == 0, "chain: a handle's rows differ from host rows");
    CHECK(model_forward_tree(&s, tok, parent, 5, logits, &out) == DFL_OK, "tree: %s", dfl_errmsg());
    target_state_reset(&s); /* the same prefix again, then the same tree into the handle */
    CHECK(model_forward(&s, tok, T, logits, 1, NULL) == DFL_OK, "forward: %s", dfl_errmsg());
    CHECK(model_forward_tree(&s, tok, parent, 5, logits, &to) == DFL_OK, "tree: %s", dfl_errmsg());
    CHECK(memcmp(f.host, rows, (size_t)5 * 2 * H * sizeof(float)) == 0, "tree: a handle's rows differ from host rows");
    target_state_reset(&s);
    const dfl_capture both = {.n_layers = 2, .layers = layers, .out = rows, .to = &f},
                      wide = {.n_layers = 1, .layers = layers, .to = &f};
    CHECK(refused(model_forward(&s, tok, 1, logits, 1, &both), "either host rows"), "out and to: %s", dfl_errmsg());
    CHECK(refused(model_forward(&s, tok, 1, logits, 1, &wide), "holds 12 rows of 128"), "width: %s", dfl_errmsg());
    dfl_feat small;
    CHECK(dfl_feat_alloc(&small, DFL_DEVICE_CPU, 4, 2 * H) == DFL_OK, "alloc");
    const dfl_capture few = {.n_layers = 2, .layers = layers, .to = &small};
    CHECK(refused(model_forward(&s, tok, 5, logits, 1, &few), "capture of 5 tokens"), "rows: %s", dfl_errmsg());
    CHECK(s.n_past == 0, "a refused capture leaves the state alone");
    dfl_feat_free(&small), dfl_feat_free(&f);
    target_state_free(&s);
    free(rows), free(logits);
}

/* a drafter fed from a handle = fed the same rows; a handle of another width or too few rows */
static void drafter_rows(const dfl_model *m) {
    dfl_drafter d;
    if (drafter_open(&d, test_fixture("dflash_qwen3"), m->cfg.n_layers) != DFL_OK) {
        CHECK(0, "%s", dfl_errmsg());
        return;
    }
    const int V = m->cfg.vocab, B = d.cfg.block_size, nf = d.cfg.n_target_ids * m->cfg.hidden;
    float *feat = malloc((size_t)T * nf * sizeof(float)), *la = malloc((size_t)B * V * 4),
          *lb = malloc((size_t)B * V * 4);
    for (int i = 0; i < T * nf; i++) feat[i] = (float)((i * 7919) % 1000) / 500.0f - 1.0f;
    dfl_drafter_state a, b;
    CHECK(drafter_state_init(&a, &d, m, T + B, B) == DFL_OK && drafter_state_init(&b, &d, m, T + B, B) == DFL_OK,
          "states: %s", dfl_errmsg());
    const dfl_feat f = dfl_feat_view(feat, T, nf), narrow = dfl_feat_view(feat, T, nf - 1);
    CHECK(drafter_add_features(&a, &f, T) == DFL_OK && drafter_add_context(&b, feat, T) == DFL_OK &&
              drafter_draft(&a, 3, B, la) == DFL_OK && drafter_draft(&b, 3, B, lb) == DFL_OK &&
              memcmp(la, lb, (size_t)(B - 1) * V * sizeof(float)) == 0,
          "drafts from a handle differ: %s", dfl_errmsg());
    CHECK(refused(drafter_add_features(&a, &narrow, 1), "the drafter reads"), "width: %s", dfl_errmsg());
    CHECK(refused(drafter_add_features(&a, &f, T + 1), "the handle holds 12"), "rows: %s", dfl_errmsg());
    drafter_state_free(&a), drafter_state_free(&b);
    drafter_close(&d);
    free(feat), free(la), free(lb);
}

int main(void) {
    rows_api();
    dfl_model m;
    if (model_open(&m, test_fixture("qwen3_tiny"), 0) != DFL_OK) {
        CHECK(0, "%s", dfl_errmsg());
        return test_done("test_feat");
    }
    capture(&m);
    drafter_rows(&m);
    model_close(&m);
    return test_done("test_feat");
}
