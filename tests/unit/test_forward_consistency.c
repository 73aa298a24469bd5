/* The target forward is batch-layout independent and its rollback is exact: prefill(T) equals
 * prefill(T-k) followed by k single-token decodes, and by one k-token forward, and a forward
 * rolled back to any position then continued equals the straight run — bit for bit, on the
 * dense, hybrid and mixture-of-experts fixtures, BF16 and fine-grained FP8 among them (every
 * kernel computes each token's row with the same operations whatever the batch). A greedy
 * verification's ids (chain and tree) are the argmax of the full logits' rows. */
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/model.h"
#include "testutil.h"

#define T 40
#define K 10

static int same(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

/* A greedy verification (each row's argmax, the logits scratch) gives the argmax of the full
 * rows, also where the lm_head finds it without them (kn_matmul_argmax: BF16 heads on AVX-512
 * BF16 and AMX), for a chain and a branching tree of G nodes after T - G tokens. */
#define G 16
static void greedy_ids(dfl_target_state *s, const char *name, const int32_t *tok, const float *full, float *scratch) {
    const int V = s->m->cfg.vocab;
    int32_t ids[G];
    const dfl_fwd_out fo = {.logits = scratch, .argmax = ids, .logits_scratch = 1};
    target_state_reset(s);
    model_forward(s, tok, T - G, NULL, 0, NULL);
    CHECK(model_forward_ex(s, tok + T - G, NULL, G, &fo) == DFL_OK, "%s: greedy chain: %s", name, dfl_errmsg());
    int bad = 0;
    for (int i = 0; i < G; i++) bad += ids[i] != kn_argmax(full + (size_t)(T - G + i) * V, V);
    CHECK(bad == 0, "%s: greedy chain of %d: %d ids differ from the logits' argmax (estimated: %d)", name, G, bad,
          kn_argmax_estimates(&s->m->lm_head, G));
    int parent[G];
    for (int i = 0; i < G; i++) parent[i] = i == 0 ? -1 : i < 4 ? 0 : i - 3; /* three branches from the root */
    float *tree = malloc((size_t)G * V * sizeof(float));
    CHECK(target_state_enable_tree(s, G) == DFL_OK, "%s: trees: %s", name, dfl_errmsg());
    target_state_reset(s);
    model_forward(s, tok, T - G, NULL, 0, NULL);
    CHECK(model_forward_tree(s, tok + T - G, parent, G, tree, NULL) == DFL_OK, "%s: tree: %s", name, dfl_errmsg());
    target_state_reset(s);
    model_forward(s, tok, T - G, NULL, 0, NULL);
    CHECK(model_forward_ex(s, tok + T - G, parent, G, &fo) == DFL_OK, "%s: greedy tree: %s", name, dfl_errmsg());
    bad = 0;
    for (int i = 0; i < G; i++) bad += ids[i] != kn_argmax(tree + (size_t)i * V, V);
    CHECK(bad == 0, "%s: greedy tree of %d: %d ids differ from the logits' argmax", name, G, bad);
    free(tree);
}

static void run(const char *name) {
    dfl_model m;
    if (model_open(&m, test_fixture(name), 0) != DFL_OK) {
        CHECK(0, "%s: %s", name, dfl_errmsg());
        return;
    }
    const int V = m.cfg.vocab;
    int32_t tok[T];
    for (int i = 0; i < T; i++) tok[i] = (int32_t)((i * 7919 + 13) % 900);
    float *full = malloc((size_t)T * V * sizeof(float)), *part = malloc((size_t)T * V * sizeof(float));
    dfl_target_state s;
    CHECK(target_state_init(&s, &m, T + 4, T, 1) == DFL_OK, "%s: state: %s", name, dfl_errmsg());
    CHECK(model_forward(&s, tok, T, full, 0, NULL) == DFL_OK, "%s: prefill", name);

    /* prefill(T-K) + K single decodes */
    target_state_reset(&s);
    model_forward(&s, tok, T - K, part, 0, NULL);
    int ok = same(part, full, (size_t)(T - K) * V);
    for (int i = T - K; i < T; i++) {
        model_forward(&s, &tok[i], 1, part + (size_t)i * V, 0, NULL);
        ok &= same(part + (size_t)i * V, full + (size_t)i * V, (size_t)V);
    }
    CHECK(ok, "%s: prefill(T) != prefill(T-k) + k decodes", name);

    /* prefill(T-K) + one K-token forward, logits of the last row only */
    target_state_reset(&s);
    model_forward(&s, tok, T - K, part, 1, NULL);
    model_forward(&s, tok + T - K, K, part, 1, NULL);
    CHECK(same(part, full + (size_t)(T - 1) * V, (size_t)V), "%s: prefill(T) != prefill(T-k) + k-token forward", name);

    /* rollback to every position of a K-token forward, then continue to T */
    for (int keep = T - K; keep <= T; keep++) {
        target_state_reset(&s);
        model_forward(&s, tok, T - K, NULL, 0, NULL);
        int32_t junk[K];
        memcpy(junk, tok + T - K, sizeof junk);
        for (int j = keep - (T - K); j < K; j++) junk[j] = (junk[j] + 101) % 900; /* rejected drafts differ */
        model_forward(&s, junk, K, NULL, 0, NULL);
        CHECK(target_state_rollback(&s, keep) == DFL_OK, "%s: rollback to %d: %s", name, keep, dfl_errmsg());
        CHECK(s.n_past == keep, "%s: n_past %d after rollback to %d", name, s.n_past, keep);
        if (keep < T) {
            model_forward(&s, tok + keep, T - keep, part, 0, NULL);
            CHECK(same(part, full + (size_t)keep * V, (size_t)(T - keep) * V),
                  "%s: rollback to %d then continuing differs from the straight run", name, keep);
        }
    }
    CHECK(target_state_rollback(&s, 3) == DFL_ERR, "%s: rollback before the recorded forward must fail", name);

    /* a forward run with no_record keeps no record: same logits, and rollback into it is refused */
    target_state_reset(&s);
    model_forward(&s, tok, T - K, NULL, 0, NULL);
    s.no_record = 1;
    CHECK(model_forward(&s, tok + T - K, K, part, 0, NULL) == DFL_OK, "%s: unrecorded forward", name);
    s.no_record = 0;
    CHECK(same(part, full + (size_t)(T - K) * V, (size_t)K * V), "%s: an unrecorded forward changes the logits", name);
    CHECK(target_state_rollback(&s, T - 1) == DFL_ERR && strstr(dfl_errmsg(), "no rollback record"),
          "%s: rollback into an unrecorded forward: %s", name, dfl_errmsg());
    CHECK(target_state_rollback(&s, T) == DFL_OK, "%s: rollback to n_past is a no-op", name);

    greedy_ids(&s, name, tok, full, part);

    /* bad input: context overflow, token outside the vocabulary */
    target_state_reset(&s);
    CHECK(model_forward(&s, tok, T, NULL, 0, NULL) == DFL_OK, "refill");
    int32_t big[5] = {1, 2, 3, 4, 5};
    CHECK(model_forward(&s, big, 5, NULL, 0, NULL) == DFL_ERR && strstr(dfl_errmsg(), "context full"),
          "%s: overflow: %s", name, dfl_errmsg());
    int32_t bad = V + 3;
    target_state_reset(&s);
    CHECK(model_forward(&s, &bad, 1, NULL, 0, NULL) == DFL_ERR && strstr(dfl_errmsg(), "outside the vocabulary"),
          "%s: bad token: %s", name, dfl_errmsg());
    target_state_free(&s);
    free(full);
    free(part);
    model_close(&m);
}

int main(void) {
    run("qwen3_tiny");
    run("qwen35_vlm");
    run("qwen35_bf16");
    run("qwen35_r1");
    run("qwen3_moe"); /* a token's experts and their order do not depend on the batch */
    run("qwen35_moe_vlm");
    run("qwen3_fp8");
    run("qwen35_fp8");
    run("qwen3_bf16");
    return test_done("test_forward_consistency");
}
