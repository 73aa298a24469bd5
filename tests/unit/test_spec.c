/* Speculative decoding is lossless: token-identical to autoregressive greedy decoding on dense,
 * hybrid and mixture-of-experts fixtures, with (a) random DFlash drafters (rejections everywhere) and (b) an
 * oracle drafter that proposes the true continuation corrupted at a chosen position each
 * round, so that every acceptance length 0..B-1 — rollback at every position — and the
 * full-accept path occur. The drafter's context length is checked against the committed
 * length every round (the anchor never enters it). Sampling: the distribution of the first
 * sampled tokens with a drafter (DFlash, and DFlash2 whose q is zero outside its candidates)
 * matches the target's own sampling (chi-square homogeneity test, false-alarm rate 1e-3 per
 * comparison, fixed seeds). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/spec.h"
#include "testutil.h"

#define N_GEN 160

typedef struct oracle {
    const int32_t *truth; /* the autoregressive continuation */
    int n_prompt, n_ctx, round, V;
    int checks_failed;
    int full_every;       /* when > 0 and round % full_every == 0: no corruption */
} oracle;

static int o_add(void *ctx, const float *feat, const int32_t *tokens, int n) {
    (void)feat, (void)tokens;
    ((oracle *)ctx)->n_ctx += n;
    return DFL_OK;
}

static int o_len(void *ctx) { return ((oracle *)ctx)->n_ctx; }

static int o_draft(void *ctx, int32_t anchor, int B, float *logits) {
    oracle *o = ctx;
    const int n_out = o->n_ctx - o->n_prompt + 1; /* generated tokens so far, anchor included */
    if (o->truth[n_out - 1] != anchor) o->checks_failed++;
    const int bad = o->round % B; /* corrupt draft `bad` (0 = none): acceptance length bad-1 */
    o->round++;
    memset(logits, 0, (size_t)(B - 1) * o->V * sizeof(float));
    for (int k = 1; k < B; k++) {
        int32_t t = n_out - 1 + k < N_GEN ? o->truth[n_out - 1 + k] : 0;
        if (k == bad) t = (t + 1) % o->V;
        logits[(size_t)(k - 1) * o->V + t] = 10.0f;
    }
    return DFL_OK;
}

/* A drafter that takes one feature too many (the `<=` bug: the anchor's position enters its
 * context): the loop must refuse it on the first round. */
static int leaky_add(void *ctx, const float *feat, const int32_t *tokens, int n) {
    return o_add(ctx, feat, tokens, n + 1);
}

static int32_t prompt[] = {11, 200, 37, 512, 99, 3, 641, 77, 12};
#define NP ((int)(sizeof prompt / sizeof prompt[0]))

static void lossless(const char *target, const char *drafter) {
    dfl_model m;
    if (model_open(&m, test_fixture(target), 0) != DFL_OK) {
        CHECK(0, "%s", dfl_errmsg());
        return;
    }
    dfl_state s;
    CHECK(state_init(&s, &m, NP + N_GEN + 1, 16, 1) == DFL_OK, "state: %s", dfl_errmsg());
    int32_t truth[N_GEN], out[N_GEN];
    dfl_gen_stats st;
    dfl_gen_opts ar = {.max_new = N_GEN, .ignore_eos = 1};
    CHECK(spec_generate(&s, NULL, prompt, NP, &ar, truth, &st, NULL, NULL) == DFL_OK, "ar: %s", dfl_errmsg());
    CHECK(st.generated == N_GEN && st.rounds == N_GEN - 1, "%s: autoregressive ran %d steps", target, st.rounds);

    /* (a) the random DFlash drafter, several block sizes */
    dfl_drafter d;
    const int have_d = drafter != NULL;
    if (have_d) {
        CHECK(drafter_open(&d, test_fixture(drafter), m.cfg.n_layers) == DFL_OK, "drafter: %s", dfl_errmsg());
        CHECK(drafter_check_target(&d, &m) == DFL_OK, "fit: %s", dfl_errmsg());
    }
    const int blocks[] = {2, 3, have_d ? d.cfg.block_size : 0};
    for (int bi = 0; have_d && bi < 3; bi++) {
        dfl_dstate ds;
        CHECK(dstate_init(&ds, &d, &m, NP + N_GEN + 1, blocks[bi]) == DFL_OK, "dstate: %s", dfl_errmsg());
        dfl_draft_if dif = spec_dflash_drafter(&ds);
        dfl_gen_opts o = {.max_new = N_GEN, .block = blocks[bi], .ignore_eos = 1};
        state_reset(&s);
        CHECK(spec_generate(&s, &dif, prompt, NP, &o, out, &st, NULL, NULL) == DFL_OK, "spec: %s", dfl_errmsg());
        CHECK(st.generated == N_GEN && memcmp(out, truth, sizeof truth) == 0,
              "%s + %s, B=%d: speculative output differs from greedy", target, drafter, blocks[bi]);
        CHECK(ds.n_ctx == s.n_past, "%s: drafter context %d != committed %d", target, ds.n_ctx, s.n_past);
        dstate_free(&ds);
    }
    /* (b) the oracle: every acceptance length, and whole blocks accepted */
    for (int B = 2; B <= 16; B += (B < 4 ? 1 : 4)) {
        oracle orc = {.truth = truth, .n_prompt = NP, .V = m.cfg.vocab};
        int layer0 = 0;
        dfl_draft_if dif = {.ctx = &orc, .add_context = o_add, .draft = o_draft, .context_len = o_len,
                            .feature_layers = &layer0, .n_feature_layers = 1};
        dfl_gen_opts o = {.max_new = N_GEN, .block = B, .ignore_eos = 1};
        state_reset(&s);
        CHECK(spec_generate(&s, &dif, prompt, NP, &o, out, &st, NULL, NULL) == DFL_OK, "oracle: %s", dfl_errmsg());
        CHECK(memcmp(out, truth, sizeof truth) == 0, "%s oracle B=%d: output differs from greedy", target, B);
        CHECK(orc.checks_failed == 0, "%s oracle B=%d: anchor was not the committed token", target, B);
        int all = 1;
        for (int a = 0; a < B && st.rounds >= B + 1; a++) all &= st.accept_hist[a] > 0;
        CHECK(all, "%s oracle B=%d: not every acceptance length 0..B-1 occurred (%d rounds)", target, B, st.rounds);
        CHECK(st.accepted > 0 && spec_tau(&st) >= 1.5, "%s oracle B=%d: tau %.2f", target, B, spec_tau(&st));
    }
    if (have_d) drafter_close(&d);
    state_free(&s);
    model_close(&m);
}

/* Upper-tail chi-square critical value (Wilson–Hilferty), alpha = 1e-3: z = 3.0902. */
static double chi2_crit(int df) {
    const double z = 3.0902, h = 2.0 / (9.0 * df);
    return df * pow(1 - h + z * sqrt(h), 3);
}

/* Two-sample homogeneity test on token counts a[], b[] (same totals), pooling rare tokens. */
static int homogeneous(const int *a, const int *b, int V, int n, double *stat_out, int *df_out) {
    double stat = 0;
    int df = -1, ra = 0, rb = 0;
    for (int i = 0; i < V; i++) {
        if (a[i] + b[i] < 10) { /* pooled bin */
            ra += a[i], rb += b[i];
            continue;
        }
        double e = (a[i] + b[i]) / 2.0;
        stat += (a[i] - e) * (a[i] - e) / e + (b[i] - e) * (b[i] - e) / e;
        df++;
    }
    if (ra + rb >= 10) {
        double e = (ra + rb) / 2.0;
        stat += (ra - e) * (ra - e) / e + (rb - e) * (rb - e) / e;
        df++;
    }
    (void)n;
    *stat_out = stat;
    *df_out = df;
    return df < 1 || stat < chi2_crit(df);
}

static void sampling(const char *target, const char *drafter) {
    dfl_model m;
    if (model_open(&m, test_fixture(target), 0) != DFL_OK) {
        CHECK(0, "%s", dfl_errmsg());
        return;
    }
    dfl_drafter d;
    CHECK(drafter_open(&d, test_fixture(drafter), m.cfg.n_layers) == DFL_OK, "drafter: %s", dfl_errmsg());
    const int V = m.cfg.vocab, K = 3, RUNS = 1000;
    int *cnt_ar = calloc((size_t)K * V, sizeof(int)), *cnt_sp = calloc((size_t)K * V, sizeof(int));
    int *cnt_or = calloc((size_t)K * V, sizeof(int));
    /* the match rule (greedy drafts kept while they equal the target's sample): the random drafter
     * (its greedy drafts are rejected: every token is the target's sample), and at a low
     * temperature, where the target's samples follow its greedy tokens, the oracle proposing those
     * (drafts accepted: the acceptance path), each against autoregressive sampling at that T */
    int *cnt_md = calloc((size_t)K * V, sizeof(int)), *cnt_mo = calloc((size_t)K * V, sizeof(int));
    int *cnt_cool = calloc((size_t)K * V, sizeof(int));
    long acc_match = 0;
    dfl_state s;
    CHECK(state_init(&s, &m, NP + K + 16, 16, 1) == DFL_OK, "state: %s", dfl_errmsg());
    dfl_dstate ds;
    CHECK(dstate_init(&ds, &d, &m, NP + K + 1, 4) == DFL_OK, "dstate");
    int32_t out[K], truth[N_GEN] = {0};
    dfl_gen_stats st;
    dfl_gen_opts greedy = {.max_new = K, .ignore_eos = 1};
    spec_generate(&s, NULL, prompt, NP, &greedy, truth, &st, NULL, NULL); /* the oracle proposes these */
    for (int r = 0; r < RUNS; r++) {
        dfl_gen_opts o = {.max_new = K, .block = 4, .temperature = 1.5f, .seed = 1000 + (uint64_t)r, .ignore_eos = 1};
        state_reset(&s);
        spec_generate(&s, NULL, prompt, NP, &o, out, &st, NULL, NULL);
        for (int k = 0; k < K; k++) cnt_ar[k * V + out[k]]++;
        o.seed = 900000 + (uint64_t)r;
        state_reset(&s);
        dstate_reset(&ds);
        dfl_draft_if dif = spec_dflash_drafter(&ds);
        CHECK(spec_generate(&s, &dif, prompt, NP, &o, out, &st, NULL, NULL) == DFL_OK, "spec sample: %s", dfl_errmsg());
        for (int k = 0; k < K; k++) cnt_sp[k * V + out[k]]++;
        /* an oracle proposing the greedy tokens (one-hot q) exercises the acceptance branch */
        oracle orc = {.truth = truth, .n_prompt = NP, .V = V, .round = 1};
        int layer0 = 0;
        dfl_draft_if odif = {.ctx = &orc, .add_context = o_add, .draft = o_draft, .context_len = o_len,
                             .feature_layers = &layer0, .n_feature_layers = 1};
        o.seed = 5000000 + (uint64_t)r;
        state_reset(&s);
        spec_generate(&s, &odif, prompt, NP, &o, out, &st, NULL, NULL);
        for (int k = 0; k < K; k++) cnt_or[k * V + out[k]]++;
        dfl_gen_opts om = o;
        om.accept_rule = DFL_ACCEPT_MATCH;
        om.seed = 7000000 + (uint64_t)r;
        state_reset(&s);
        dstate_reset(&ds);
        dif = spec_dflash_drafter(&ds);
        CHECK(spec_generate(&s, &dif, prompt, NP, &om, out, &st, NULL, NULL) == DFL_OK && !strcmp(st.accept_rule, "match"),
              "match sample: %s", dfl_errmsg());
        for (int k = 0; k < K; k++) cnt_md[k * V + out[k]]++;
        om.temperature = 0.3f;
        om.seed = 8000000 + (uint64_t)r;
        orc = (oracle){.truth = truth, .n_prompt = NP, .V = V, .round = 0}; /* round 0: no draft corrupted */
        state_reset(&s);
        spec_generate(&s, &odif, prompt, NP, &om, out, &st, NULL, NULL);
        for (int k = 0; k < K; k++) cnt_mo[k * V + out[k]]++;
        acc_match += st.accepted;
        om.seed = 9000000 + (uint64_t)r;
        state_reset(&s);
        spec_generate(&s, NULL, prompt, NP, &om, out, &st, NULL, NULL);
        for (int k = 0; k < K; k++) cnt_cool[k * V + out[k]]++;
    }
    for (int k = 0; k < K; k++) {
        double stat;
        int df;
        CHECK(homogeneous(cnt_ar + k * V, cnt_sp + k * V, V, RUNS, &stat, &df),
              "%s: sampled token %d: drafter distribution differs from the target's (chi2 %.1f, df %d, crit %.1f)",
              target, k, stat, df, chi2_crit(df));
        CHECK(homogeneous(cnt_ar + k * V, cnt_or + k * V, V, RUNS, &stat, &df),
              "%s: sampled token %d: oracle-drafted distribution differs (chi2 %.1f, df %d, crit %.1f)", target, k,
              stat, df, chi2_crit(df));
        CHECK(homogeneous(cnt_ar + k * V, cnt_md + k * V, V, RUNS, &stat, &df),
              "%s: sampled token %d: match rule, drafter: distribution differs (chi2 %.1f, df %d, crit %.1f)", target,
              k, stat, df, chi2_crit(df));
        CHECK(homogeneous(cnt_cool + k * V, cnt_mo + k * V, V, RUNS, &stat, &df),
              "%s: sampled token %d: match rule, oracle, T 0.3: distribution differs (chi2 %.1f, df %d, crit %.1f)",
              target, k, stat, df, chi2_crit(df));
    }
    CHECK(acc_match > RUNS / 10, "%s: match rule: the oracle's drafts were accepted in %ld of %d runs: the acceptance "
          "path is not exercised", target, acc_match, RUNS);
    /* a wrong distribution must be caught: the same counts against temperature 0.5 */
    int *cnt_cold = calloc((size_t)V, sizeof(int));
    for (int r = 0; r < RUNS; r++) {
        dfl_gen_opts o = {.max_new = 1, .temperature = 0.5f, .seed = 77 + (uint64_t)r, .ignore_eos = 1};
        state_reset(&s);
        spec_generate(&s, NULL, prompt, NP, &o, out, &st, NULL, NULL);
        cnt_cold[out[0]]++;
    }
    double stat;
    int df;
    CHECK(!homogeneous(cnt_ar, cnt_cold, V, RUNS, &stat, &df), "%s: the test cannot tell T=1.5 from T=0.5", target);
    /* reproducible: same seed, same tokens */
    int32_t o1[K], o2[K];
    dfl_gen_opts o = {.max_new = K, .block = 4, .temperature = 1.0f, .seed = 42, .ignore_eos = 1};
    for (int rep = 0; rep < 2; rep++) {
        state_reset(&s);
        dstate_reset(&ds);
        dfl_draft_if dif = spec_dflash_drafter(&ds);
        spec_generate(&s, &dif, prompt, NP, &o, rep ? o2 : o1, &st, NULL, NULL);
    }
    CHECK(memcmp(o1, o2, sizeof o1) == 0, "%s: same seed gave different samples", target);
    free(cnt_ar), free(cnt_sp), free(cnt_or), free(cnt_cold), free(cnt_md), free(cnt_mo), free(cnt_cool);
    dstate_free(&ds);
    state_free(&s);
    drafter_close(&d);
    model_close(&m);
}

static void bad_input(void) {
    dfl_model m;
    dfl_drafter d;
    if (model_open(&m, test_fixture("qwen3_tiny"), 0) != DFL_OK) return;
    {
        dfl_state s;
        state_init(&s, &m, NP + 20, 16, 1);
        int32_t truth[N_GEN] = {0}, out[N_GEN];
        oracle orc = {.truth = truth, .n_prompt = NP, .V = m.cfg.vocab};
        int layer0 = 0;
        dfl_draft_if dif = {.ctx = &orc, .add_context = o_add, .draft = o_draft, .context_len = o_len,
                            .feature_layers = &layer0, .n_feature_layers = 1};
        dfl_gen_opts o = {.max_new = 8, .block = 4, .ignore_eos = 1};
        dfl_gen_stats st;
        dif.add_context = leaky_add;
        CHECK(spec_generate(&s, &dif, prompt, NP, &o, out, &st, NULL, NULL) == DFL_ERR &&
                  strstr(dfl_errmsg(), "the anchor must not be in it") && st.ctx_check_failures == 1,
              "a drafter context holding the anchor's position must be refused: %s", dfl_errmsg());
        state_free(&s);
    }
    /* a drafter for another target: hidden size and layer ids do not fit */
    CHECK(drafter_open(&d, test_fixture("dflash_qwen35"), m.cfg.n_layers) == DFL_OK, "open: %s", dfl_errmsg());
    CHECK(drafter_check_target(&d, &m) == DFL_ERR && strstr(dfl_errmsg(), "hidden_size 128 != target hidden_size 64"),
          "misfit: %s", dfl_errmsg());
    dfl_dstate ds;
    CHECK(dstate_init(&ds, &d, &m, 10, d.cfg.block_size + 1) == DFL_ERR && strstr(dfl_errmsg(), "block size"),
          "block too large: %s", dfl_errmsg());
    CHECK(dstate_init(&ds, &d, &m, 10, 0) == DFL_ERR, "block 0");
    drafter_close(&d);
    CHECK(drafter_open(&d, test_fixture("qwen3_tiny"), 4) == DFL_ERR && strstr(dfl_errmsg(), "not a DFlash drafter"),
          "target as drafter: %s", dfl_errmsg());
    model_close(&m);
}

int main(void) {
    lossless("qwen3_tiny", "dflash_qwen3");
    lossless("qwen35_vlm", "dflash_qwen35");
    lossless("qwen35_bf16", NULL); /* no drafter fits this target: the oracle alone */
    lossless("qwen3_moe", "dflash_qwen3");
    lossless("qwen35_moe_vlm", "dflash_qwen35_moe");
    sampling("qwen3_tiny", "dflash_qwen3");
    sampling("qwen35_vlm", "dflash_qwen35");
    sampling("qwen3_tiny", "dflash2_qwen3"); /* q is zero outside each position's candidates */
    bad_input();
    return test_done("test_spec");
}
