/* The CUDA backend against the CPU backend on the fixtures (dense Qwen3 and Qwen3.5 hybrids,
 * F32 and BF16, both checkpoint layouts), and the exactness it promises on its own:
 *  - every captured layer and the logits within 1e-4 (max |gpu - cpu| / max |cpu|) of the CPU;
 *  - 64 greedy tokens identical to the CPU's;
 *  - batch invariance bit for bit: prefill(T) = prefill(T-k) + k decodes = prefill(T-k) + one
 *    k-token forward; a forward rolled back to any position and continued = the straight run;
 *  - a DDTree tree forward: each node's logits = the same tokens as a chain, bit for bit, and the
 *    committed path continues exactly as the chain;
 *  - captured rows kept on the GPU (dfl_feat) bit for bit those sent to the host, and a DFlash
 *    drafter fed from them drafting the same bits; chain and DDTree with it lossless;
 *  - speculative decoding lossless on the GPU: with an oracle drafter (every acceptance length
 *    0..B-1 and full blocks) chain and DDTree give the greedy tokens.
 * Label "gpu": exits 77 (skipped) where no GPU answers. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/backend.h"
#include "dfl/common.h"
#include "dfl/ddtree.h"
#include "dfl/drafter.h"
#include "dfl/spec.h"
#include "testutil.h"

#define T 40
#define K 10
#define N_GEN 64

static double relerr(const float *a, const float *b, size_t n) {
    double e = 0, m = 1e-30;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - b[i]);
        if (!(d <= e)) e = d;
        if (fabs(b[i]) > m) m = fabs(b[i]);
    }
    return e / m;
}

static int same(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

static void tokens(int32_t *t, int n, int V, int seed) {
    for (int i = 0; i < n; i++) t[i] = (int32_t)(((i + seed) * 7919 + 13 * seed) % (V < 900 ? V : 900));
}

/* CPU vs GPU: every layer's output and the logits of a T-token forward; greedy tokens. */
static void against_cpu(const char *name, dfl_model *mc, dfl_model *mg) {
    const int V = mc->cfg.vocab, H = mc->cfg.hidden, L = mc->cfg.n_layers;
    int layers[64];
    for (int i = 0; i < L; i++) layers[i] = i;
    float *hc = malloc((size_t)T * L * H * 4), *hg = malloc((size_t)T * L * H * 4);
    float *lc = malloc((size_t)T * V * 4), *lg = malloc((size_t)T * V * 4);
    int32_t tok[T];
    tokens(tok, T, V, 1);
    dfl_target_state sc, sg;
    CHECK(target_state_init(&sc, mc, T + N_GEN + 8, T, 0) == DFL_OK, "%s: cpu state: %s", name, dfl_errmsg());
    CHECK(target_state_init(&sg, mg, T + N_GEN + 8, T, 0) == DFL_OK, "%s: gpu state: %s", name, dfl_errmsg());
    const dfl_capture capc = {.n_layers = L, .layers = layers, .out = hc},
                      capg = {.n_layers = L, .layers = layers, .out = hg};
    CHECK(model_forward(&sc, tok, T, lc, 0, &capc) == DFL_OK, "%s: cpu forward", name);
    CHECK(model_forward(&sg, tok, T, lg, 0, &capg) == DFL_OK, "%s: gpu forward: %s", name, dfl_errmsg());
    double worst = 0;
    for (int l = 0; l < L; l++) {
        float *a = malloc((size_t)T * H * 4), *b = malloc((size_t)T * H * 4);
        for (int t = 0; t < T; t++) {
            memcpy(a + (size_t)t * H, hg + ((size_t)t * L + l) * H, (size_t)H * 4);
            memcpy(b + (size_t)t * H, hc + ((size_t)t * L + l) * H, (size_t)H * 4);
        }
        const double e = relerr(a, b, (size_t)T * H);
        worst = e > worst ? e : worst;
        CHECK(e < 1e-4, "%s: layer %d hidden states: gpu vs cpu %.3g", name, l, e);
        free(a), free(b);
    }
    const double el = relerr(lg, lc, (size_t)T * V);
    CHECK(el < 1e-4, "%s: logits: gpu vs cpu %.3g", name, el);
    printf("%s: gpu vs cpu: hidden states %.3g, logits %.3g (max |diff| / max |cpu|)\n", name, worst, el);
    /* greedy generation */
    int32_t oc[N_GEN], og[N_GEN];
    dfl_gen_opts go = {.max_new = N_GEN, .block = 2, .ignore_eos = 1};
    dfl_gen_stats st;
    target_state_reset(&sc), target_state_reset(&sg);
    CHECK(spec_generate(&sc, NULL, tok, 8, &go, oc, &st, NULL, NULL) == DFL_OK, "%s: cpu generate", name);
    CHECK(spec_generate(&sg, NULL, tok, 8, &go, og, &st, NULL, NULL) == DFL_OK, "%s: gpu generate: %s", name,
          dfl_errmsg());
    int first = -1;
    for (int i = 0; i < N_GEN && first < 0; i++)
        if (oc[i] != og[i]) first = i;
    CHECK(first < 0, "%s: greedy tokens differ from the cpu's at %d (%d vs %d)", name, first,
          first >= 0 ? og[first] : 0, first >= 0 ? oc[first] : 0);
    target_state_free(&sc), target_state_free(&sg);
    free(hc), free(hg), free(lc), free(lg);
}

/* Captured rows kept on the GPU (dfl_feat): the same bits as the rows sent to the host by the same
 * forward; an accepted path gathered there reads back as the host's gather; a handle on another
 * device than the model's is refused by name. */
static void features(const char *name, dfl_model *mc, dfl_model *mg) {
    const int H = mg->cfg.hidden, L = mg->cfg.n_layers, W = 2 * H;
    const int layers[2] = {0, L - 1}, path[4] = {0, 2, 3, 7};
    int32_t tok[T];
    tokens(tok, T, mg->cfg.vocab, 3);
    float *host = malloc((size_t)T * W * 4), *back = malloc((size_t)T * W * 4);
    dfl_feat f, fc;
    dfl_target_state s, sc;
    CHECK(dfl_feat_alloc(&f, DFL_DEVICE_CUDA, T, W) == DFL_OK, "%s: feature rows: %s", name, dfl_errmsg());
    CHECK(target_state_init(&s, mg, T + 4, T, 0) == DFL_OK, "%s: state: %s", name, dfl_errmsg());
    const dfl_capture to_host = {.n_layers = 2, .layers = layers, .out = host},
                      to_dev = {.n_layers = 2, .layers = layers, .to = &f};
    CHECK(model_forward(&s, tok, T, NULL, 0, &to_host) == DFL_OK, "%s: forward: %s", name, dfl_errmsg());
    target_state_reset(&s);
    CHECK(model_forward(&s, tok, T, NULL, 0, &to_dev) == DFL_OK, "%s: forward: %s", name, dfl_errmsg());
    CHECK(dfl_feat_read(&f, 0, T, back) == DFL_OK && same(back, host, (size_t)T * W),
          "%s: rows captured on the gpu differ from those sent to the host", name);
    CHECK(dfl_feat_gather(&f, path, 4) == DFL_OK && dfl_feat_read(&f, 0, 4, back) == DFL_OK, "%s: gather: %s", name,
          dfl_errmsg());
    int ok = 1;
    for (int k = 0; k < 4; k++) ok &= same(back + (size_t)k * W, host + (size_t)path[k] * W, (size_t)W);
    CHECK(ok, "%s: the gathered path's rows are not the path's", name);
    CHECK(target_state_init(&sc, mc, T + 4, T, 0) == DFL_OK, "%s: cpu state", name);
    CHECK(model_forward(&sc, tok, T, NULL, 0, &to_dev) == DFL_ERR && strstr(dfl_errmsg(), "are on cuda"),
          "%s: gpu rows for a cpu model: %s", name, dfl_errmsg());
    CHECK(dfl_feat_alloc(&fc, DFL_DEVICE_CPU, T, W) == DFL_OK, "%s: host rows", name);
    target_state_reset(&sc);
    const dfl_capture to_cpu = {.n_layers = 2, .layers = layers, .to = &fc};
    CHECK(model_forward(&s, tok, 1, NULL, 0, &to_cpu) == DFL_ERR && strstr(dfl_errmsg(), "the model runs on cuda"),
          "%s: host rows for a gpu model: %s", name, dfl_errmsg());
    dfl_feat_free(&f), dfl_feat_free(&fc);
    target_state_free(&s), target_state_free(&sc);
    free(host), free(back);
}

/* A DFlash drafter on the host fed from rows kept on the GPU (read a block at a time) drafts the
 * same bits as from the rows sent to the host; with it, chain and DDTree on the GPU give the GPU's
 * greedy tokens (every round's path gathered on the device). */
static void drafter_from_gpu(const char *name, const char *ddir, dfl_model *mg) {
    dfl_drafter d;
    if (drafter_open(&d, test_fixture(ddir), mg->cfg.n_layers) != DFL_OK) {
        CHECK(0, "%s: %s", ddir, dfl_errmsg());
        return;
    }
    const int V = mg->cfg.vocab, B = d.cfg.block_size, W = d.cfg.n_target_ids * mg->cfg.hidden;
    int32_t tok[T], ar[N_GEN], sp[N_GEN];
    tokens(tok, T, V, 4);
    float *host = malloc((size_t)T * W * 4), *la = malloc((size_t)B * V * 4), *lb = malloc((size_t)B * V * 4);
    dfl_feat f;
    dfl_target_state s;
    dfl_drafter_state da, db;
    CHECK(dfl_feat_alloc(&f, DFL_DEVICE_CUDA, T, W) == DFL_OK &&
              target_state_init(&s, mg, T + N_GEN + 8, T, 1) == DFL_OK && target_state_enable_tree(&s, 9) == DFL_OK &&
              drafter_state_init(&da, &d, mg, T + N_GEN + 8, B) == DFL_OK &&
              drafter_state_init(&db, &d, mg, T + N_GEN + 8, B) == DFL_OK,
          "%s: states: %s", name, dfl_errmsg());
    const dfl_capture to_host = {.n_layers = d.cfg.n_target_ids, .layers = d.cfg.target_layer_ids, .out = host},
                      to_dev = {.n_layers = d.cfg.n_target_ids, .layers = d.cfg.target_layer_ids, .to = &f};
    CHECK(model_forward(&s, tok, T, NULL, 0, &to_host) == DFL_OK, "%s: forward", name);
    target_state_reset(&s);
    CHECK(model_forward(&s, tok, T, NULL, 0, &to_dev) == DFL_OK, "%s: forward", name);
    CHECK(drafter_add_features(&da, &f, T) == DFL_OK && drafter_add_context(&db, host, T) == DFL_OK &&
              drafter_draft(&da, tok[0], B, la) == DFL_OK && drafter_draft(&db, tok[0], B, lb) == DFL_OK,
          "%s: drafts: %s", name, dfl_errmsg());
    CHECK(same(la, lb, (size_t)(B - 1) * V), "%s: drafts from gpu rows differ from drafts from host rows", name);
    dfl_gen_opts o = {.max_new = N_GEN, .block = B, .ignore_eos = 1};
    dfl_gen_stats st;
    dfl_draft_if dif = spec_dflash_drafter(&da);
    target_state_reset(&s);
    CHECK(spec_generate(&s, NULL, tok, 8, &o, ar, &st, NULL, NULL) == DFL_OK, "%s: greedy", name);
    for (int budget = 0; budget <= 8; budget += 8) {
        o.tree_budget = budget;
        target_state_reset(&s), drafter_state_reset(&da);
        CHECK(spec_generate(&s, &dif, tok, 8, &o, sp, &st, NULL, NULL) == DFL_OK, "%s: %s: %s", name,
              budget ? "ddtree" : "chain", dfl_errmsg());
        CHECK(memcmp(sp, ar, sizeof ar) == 0, "%s: %s with the drafter on gpu rows differs from greedy", name,
              budget ? "ddtree" : "chain");
    }
    dfl_feat_free(&f);
    target_state_free(&s), drafter_state_free(&da), drafter_state_free(&db);
    drafter_close(&d);
    free(host), free(la), free(lb);
}

/* Batch layout and rollback, bit for bit on the GPU (as test_forward_consistency on the CPU). */
static void invariance(const char *name, dfl_model *mg) {
    const int V = mg->cfg.vocab;
    int32_t tok[T];
    tokens(tok, T, V, 2);
    float *full = malloc((size_t)T * V * 4), *part = malloc((size_t)T * V * 4);
    dfl_target_state s;
    CHECK(target_state_init(&s, mg, T + 4, T, 1) == DFL_OK, "%s: state: %s", name, dfl_errmsg());
    CHECK(model_forward(&s, tok, T, full, 0, NULL) == DFL_OK, "%s: prefill: %s", name, dfl_errmsg());
    target_state_reset(&s);
    model_forward(&s, tok, T - K, part, 0, NULL);
    int ok = same(part, full, (size_t)(T - K) * V);
    for (int i = T - K; i < T; i++) {
        model_forward(&s, &tok[i], 1, part + (size_t)i * V, 0, NULL);
        ok &= same(part + (size_t)i * V, full + (size_t)i * V, (size_t)V);
    }
    CHECK(ok, "%s: gpu prefill(T) != prefill(T-k) + k decodes", name);
    target_state_reset(&s);
    model_forward(&s, tok, T - K, part, 1, NULL);
    model_forward(&s, tok + T - K, K, part, 1, NULL);
    CHECK(same(part, full + (size_t)(T - 1) * V, (size_t)V), "%s: gpu prefill(T) != prefill(T-k) + k-token forward",
          name);
    for (int keep = T - K; keep <= T; keep++) {
        target_state_reset(&s);
        model_forward(&s, tok, T - K, NULL, 0, NULL);
        int32_t junk[K];
        memcpy(junk, tok + T - K, sizeof junk);
        for (int j = keep - (T - K); j < K; j++) junk[j] = (junk[j] + 101) % (V < 900 ? V : 900);
        model_forward(&s, junk, K, NULL, 0, NULL);
        CHECK(target_state_rollback(&s, keep) == DFL_OK, "%s: rollback to %d: %s", name, keep, dfl_errmsg());
        if (keep < T) {
            model_forward(&s, tok + keep, T - keep, part, 0, NULL);
            CHECK(same(part, full + (size_t)keep * V, (size_t)(T - keep) * V),
                  "%s: gpu rollback to %d then continue != straight run", name, keep);
        }
    }
    target_state_free(&s);
    free(full), free(part);
}

/* A tree whose path 0 -> 1 -> 3 -> 6 carries the chain's tokens; the other nodes differ. */
static void tree_vs_chain(const char *name, dfl_model *mg) {
    const int V = mg->cfg.vocab, P = 20, n = 8;
    const int parent[8] = {-1, 0, 0, 1, 1, 2, 3, 6};
    const int path[5] = {0, 1, 3, 6, 7};
    int32_t ctx[P + 8], tt[8];
    tokens(ctx, P + 8, V, 3);
    for (int i = 0; i < n; i++) tt[i] = (ctx[P + i] + 37) % (V < 900 ? V : 900);
    for (int d = 0; d < 5; d++) tt[path[d]] = ctx[P + d];
    float *chain = malloc((size_t)8 * V * 4), *tree = malloc((size_t)8 * V * 4), *next = malloc((size_t)2 * V * 4);
    float *cnext = malloc((size_t)2 * V * 4);
    dfl_target_state s;
    CHECK(target_state_init(&s, mg, P + 32, P, 1) == DFL_OK && target_state_enable_tree(&s, 16) == DFL_OK,
          "%s: tree state: %s", name, dfl_errmsg());
    CHECK(model_forward(&s, ctx, P, NULL, 0, NULL) == DFL_OK, "%s: context: %s", name, dfl_errmsg());
    CHECK(model_forward(&s, ctx + P, 7, chain, 0, NULL) == DFL_OK, "%s: chain", name);
    CHECK(model_forward(&s, ctx + P + 7, 1, cnext, 0, NULL) == DFL_OK, "%s: chain next", name);
    target_state_reset(&s);
    CHECK(model_forward(&s, ctx, P, NULL, 0, NULL) == DFL_OK, "%s: context: %s", name, dfl_errmsg());
    CHECK(model_forward_tree(&s, tt, parent, n, tree, NULL) == DFL_OK, "%s: tree forward: %s", name, dfl_errmsg());
    int ok = 1;
    for (int d = 0; d < 5; d++) ok &= same(tree + (size_t)path[d] * V, chain + (size_t)d * V, (size_t)V);
    CHECK(ok, "%s: gpu tree nodes != the same tokens as a chain", name);
    /* commit the path and continue: the chain's next logits, bit for bit */
    CHECK(target_state_tree_commit(&s, path, 5) == DFL_OK, "%s: commit: %s", name, dfl_errmsg());
    CHECK(s.n_past == P + 5, "%s: n_past %d after commit, want %d", name, s.n_past, P + 5);
    CHECK(model_forward(&s, ctx + P + 5, 2, next, 0, NULL) == DFL_OK, "%s: continuation: %s", name, dfl_errmsg());
    CHECK(same(next, chain + (size_t)5 * V, (size_t)V) && same(next + V, chain + (size_t)6 * V, (size_t)V),
          "%s: after a tree commit the continuation differs from the chain", name);
    (void)cnext;
    target_state_free(&s);
    free(chain), free(tree), free(next), free(cnext);
}

/* The oracle drafter of test_spec: proposes the greedy continuation, corrupted at position
 * round % B, so that every acceptance length occurs. */
typedef struct oracle {
    const int32_t *truth;
    int n_prompt, n_ctx, round, V;
} oracle;
static int o_add(void *ctx, const dfl_feat *feat, const int32_t *tok, int n) {
    (void)feat, (void)tok;
    ((oracle *)ctx)->n_ctx += n;
    return DFL_OK;
}
static int o_len(void *ctx) { return ((oracle *)ctx)->n_ctx; }
static int o_draft(void *ctx, int32_t anchor, int B, float *logits) {
    oracle *o = ctx;
    (void)anchor;
    const int n_out = o->n_ctx - o->n_prompt + 1, bad = o->round++ % B;
    memset(logits, 0, (size_t)(B - 1) * o->V * sizeof(float));
    for (int k = 1; k < B; k++) {
        int32_t t = n_out - 1 + k < N_GEN ? o->truth[n_out - 1 + k] : 0;
        if (k == bad) t = (t + 1) % o->V;
        logits[(size_t)(k - 1) * o->V + t] = 10.0f;
    }
    return DFL_OK;
}
static void o_reset(void *ctx) { ((oracle *)ctx)->n_ctx = 0, ((oracle *)ctx)->round = 0; }

static void lossless(const char *name, dfl_model *mg) {
    const int V = mg->cfg.vocab, B = 6, NP = 12;
    int32_t prompt[NP], greedy[N_GEN], out[N_GEN];
    tokens(prompt, NP, V, 4);
    dfl_target_state s;
    CHECK(target_state_init(&s, mg, NP + N_GEN + 16, 16, 1) == DFL_OK && target_state_enable_tree(&s, 9) == DFL_OK,
          "%s: state: %s", name, dfl_errmsg());
    dfl_gen_opts go = {.max_new = N_GEN, .block = B, .ignore_eos = 1};
    dfl_gen_stats st;
    CHECK(spec_generate(&s, NULL, prompt, NP, &go, greedy, &st, NULL, NULL) == DFL_OK, "%s: greedy", name);
    static const int feat_layer[1] = {0};
    oracle o = {.truth = greedy, .n_prompt = NP, .V = V};
    dfl_draft_if dif = {.ctx = &o,
                        .add_context = o_add,
                        .draft = o_draft,
                        .context_len = o_len,
                        .reset = o_reset,
                        .feature_layers = feat_layer,
                        .n_feature_layers = 1};
    for (int budget = 0; budget <= 8; budget += 8) {
        target_state_reset(&s), o_reset(&o);
        go.tree_budget = budget;
        CHECK(spec_generate(&s, &dif, prompt, NP, &go, out, &st, NULL, NULL) == DFL_OK,
              "%s: speculative (budget %d): %s", name, budget, dfl_errmsg());
        CHECK(memcmp(out, greedy, sizeof out) == 0, "%s: gpu speculative output (tree budget %d) != greedy", name,
              budget);
        CHECK(st.accepted > 0, "%s: the oracle's drafts were never accepted (budget %d)", name, budget);
        printf("%s: gpu speculative, tree budget %d: %d rounds, tau %.2f, identical to greedy\n", name, budget,
               st.rounds, spec_tau(&st));
    }
    target_state_free(&s);
}

int main(void) {
    if (dfl_device_check(DFL_DEVICE_CUDA) != DFL_OK) {
        printf("test_cuda_forward: skipped: %s\n", dfl_errmsg());
        return 77;
    }
    const char *names[] = {"qwen3_tiny", "qwen3_bf16", "qwen35_text", "qwen35_vlm", "qwen35_bf16", "qwen35_r1"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        dfl_model mc, mg;
        if (model_open(&mc, test_fixture(names[i]), 0) != DFL_OK ||
            model_open(&mg, test_fixture(names[i]), 0) != DFL_OK) {
            CHECK(0, "%s: %s", names[i], dfl_errmsg());
            continue;
        }
        if (model_use_device(&mg, DFL_DEVICE_CUDA) != DFL_OK) {
            CHECK(0, "%s: to cuda: %s", names[i], dfl_errmsg());
        } else {
            against_cpu(names[i], &mc, &mg);
            features(names[i], &mc, &mg);
            if (strcmp(names[i], "qwen3_tiny") == 0) drafter_from_gpu(names[i], "dflash_qwen3", &mg);
            if (strcmp(names[i], "qwen35_vlm") == 0) drafter_from_gpu(names[i], "dflash_qwen35", &mg);
            invariance(names[i], &mg);
            tree_vs_chain(names[i], &mg);
            lossless(names[i], &mg);
        }
        model_close(&mc), model_close(&mg);
    }
    /* what the backend does not run yet is refused by name */
    dfl_model mm;
    if (model_open(&mm, test_fixture("qwen3_moe"), 0) == DFL_OK) {
        CHECK(model_use_device(&mm, DFL_DEVICE_CUDA) != DFL_OK && strstr(dfl_errmsg(), "mixture-of-experts"),
              "an MoE target on cuda: %s", dfl_errmsg());
        CHECK(mm.device == DFL_DEVICE_CPU, "a refused model stays on the cpu");
        model_close(&mm);
    }
    return test_done("test_cuda_forward");
}
