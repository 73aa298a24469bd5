/* Speculative decoding is lossless: token-identical to autoregressive greedy decoding on dense,
 * hybrid and mixture-of-experts fixtures, with (a) random DFlash drafters (rejections everywhere) and (b) an
 * oracle drafter that proposes the true continuation corrupted at a chosen position each
 * round, so that every acceptance length 0..B-1 — rollback at every position — and the
 * full-accept path occur. The drafter's context length is checked against the committed
 * length every round (the anchor never enters it). Sampling: the distribution of the first
 * sampled tokens with a drafter (DFlash, and DFlash2 whose q is zero outside its candidates)
 * matches the target's own sampling (chi-square homogeneity test, false-alarm rate 1e-3 per
 * comparison, fixed seeds). Sampling as served (top-k, top-p, both): spec_sampling_filter against
 * a naive sort on random vectors with ties; every committed token lies in its row's filtered
 * support; for both accept rules, with the random drafter and with an oracle (acceptances), the
 * distribution of the first sampled tokens matches autoregressive sampling of the filtered target
 * (the same chi-square test, which tells the filtered distribution from the unfiltered one). A
 * drafter that summarizes its drafts itself (draft_top) is read through its top lists alone; a
 * draft's summary (argmax, top K, log-probabilities) is checked against a direct computation; the
 * target rows' summaries (opts.on_top) against the full rows. */
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
    int full_every; /* when > 0 and round % full_every == 0: no corruption */
    int soft;       /* a spread q: logit 5 on the proposal, 2.5 on the 30 ids after it, 0 elsewhere
                     * (top-k / top-p change it a lot: a q filtered unlike p would show) */
} oracle;

static int o_add(void *ctx, const dfl_feat *feat, const int32_t *tokens, int n) {
    (void)tokens;
    /* the loop hands over n rows on the host (the CPU backend's memory) */
    if (!feat->host || feat->rows < n || !dfl_feat_host_rows(feat, 0, n, NULL)) ((oracle *)ctx)->checks_failed++;
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
        for (int j = 1; o->soft && j <= 30; j++) logits[(size_t)(k - 1) * o->V + (t + j) % o->V] = 2.5f;
        logits[(size_t)(k - 1) * o->V + t] = o->soft ? 5.0f : 10.0f;
    }
    return DFL_OK;
}

/* The oracle's block as a drafter that summarizes it itself (draft_top): its proposal first, then
 * the K-1 ids after it, log-probabilities falling. */
static int o_draft_top(void *ctx, int32_t anchor, int B, const dfl_draft_top *out, float *logits) {
    oracle *o = ctx;
    if (logits) o->checks_failed++; /* greedy chains and trees never ask for the logits */
    const int n_out = o->n_ctx - o->n_prompt + 1;
    if (o->truth[n_out - 1] != anchor) o->checks_failed++;
    const int bad = o->round % B;
    o->round++;
    for (int k = 1; k < B; k++) {
        int32_t t = n_out - 1 + k < N_GEN ? o->truth[n_out - 1 + k] : 0;
        if (k == bad) t = (t + 1) % o->V;
        out->argmax[k - 1] = t;
        for (int j = 0; j < out->K; j++) {
            out->top[(size_t)(k - 1) * out->K + j] = (t + j) % o->V;
            out->toplp[(size_t)(k - 1) * out->K + j] = -0.1 - j;
        }
    }
    return DFL_OK;
}

/* draft() of a drafter whose loop must go through draft_top. */
static int o_no_draft(void *ctx, int32_t anchor, int B, float *logits) {
    (void)anchor, (void)B, (void)logits;
    ((oracle *)ctx)->checks_failed++;
    return dfl_seterr("draft() called although the drafter has draft_top");
}

/* The oracle's drafter interface: its draft(), or (top) draft_top with a draft() that must not
 * be called; feature layer 0. */
static dfl_draft_if oracle_if(oracle *orc, int top) {
    static const int layer0 = 0;
    return (dfl_draft_if){.ctx = orc,
                          .add_context = o_add,
                          .draft = top ? o_no_draft : o_draft,
                          .draft_top = top ? o_draft_top : NULL,
                          .context_len = o_len,
                          .feature_layers = &layer0,
                          .n_feature_layers = 1};
}

/* A drafter that takes one feature too many (the `<=` bug: the anchor's position enters its
 * context): the loop must refuse it on the first round. */
static int leaky_add(void *ctx, const dfl_feat *feat, const int32_t *tokens, int n) {
    ((oracle *)ctx)->n_ctx++;
    return o_add(ctx, feat, tokens, n);
}

static int32_t prompt[] = {11, 200, 37, 512, 99, 3, 641, 77, 12};
#define NP ((int)(sizeof prompt / sizeof prompt[0]))

/* on_round: rounds seen, and chain rounds whose draft was (not) handed over. */
typedef struct round_log {
    int rounds, with_draft;
} round_log;
static void log_round(void *ud, int start, const int32_t *block, int bs, const float *draft, int V, int accepted) {
    (void)start, (void)block, (void)V, (void)accepted;
    round_log *l = ud;
    l->rounds++;
    l->with_draft += bs > 1 && draft != NULL;
}

static void lossless(const char *target, const char *drafter) {
    dfl_model m;
    if (model_open(&m, test_fixture(target), 0) != DFL_OK) {
        CHECK(0, "%s", dfl_errmsg());
        return;
    }
    dfl_target_state s;
    CHECK(target_state_init(&s, &m, NP + N_GEN + 1, 16, 1) == DFL_OK, "state: %s", dfl_errmsg());
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
        dfl_drafter_state ds;
        CHECK(drafter_state_init(&ds, &d, &m, NP + N_GEN + 1, blocks[bi]) == DFL_OK, "dstate: %s", dfl_errmsg());
        dfl_draft_if dif = spec_dflash_drafter(&ds);
        dfl_gen_opts o = {.max_new = N_GEN, .block = blocks[bi], .ignore_eos = 1};
        target_state_reset(&s);
        CHECK(spec_generate(&s, &dif, prompt, NP, &o, out, &st, NULL, NULL) == DFL_OK, "spec: %s", dfl_errmsg());
        CHECK(st.generated == N_GEN && memcmp(out, truth, sizeof truth) == 0,
              "%s + %s, B=%d: speculative output differs from greedy", target, drafter, blocks[bi]);
        CHECK(ds.n_ctx == s.n_past, "%s: drafter context %d != committed %d", target, ds.n_ctx, s.n_past);
        /* on_round with and without the draft's logits (without: the drafter's argmaxes alone) */
        for (int no_draft = 0; no_draft < 2; no_draft++) {
            round_log rl = {0};
            o.on_round = log_round, o.on_round_ud = &rl, o.on_round_no_draft = no_draft;
            target_state_reset(&s);
            drafter_state_reset(&ds);
            CHECK(spec_generate(&s, &dif, prompt, NP, &o, out, &st, NULL, NULL) == DFL_OK, "%s", dfl_errmsg());
            CHECK(memcmp(out, truth, sizeof truth) == 0 && rl.rounds == st.rounds &&
                      rl.with_draft == (no_draft ? 0 : st.rounds - 1),
                  "%s + %s, B=%d, on_round_no_draft %d: output %s, %d of %d rounds with a draft", target, drafter,
                  blocks[bi], no_draft, memcmp(out, truth, sizeof truth) ? "differs" : "same", rl.with_draft,
                  rl.rounds);
        }
        drafter_state_free(&ds);
    }
    /* (b) the oracle: every acceptance length, and whole blocks accepted */
    for (int B = 2; B <= 16; B += (B < 4 ? 1 : 4)) {
        oracle orc = {.truth = truth, .n_prompt = NP, .V = m.cfg.vocab};
        dfl_draft_if dif = oracle_if(&orc, 0);
        dfl_gen_opts o = {.max_new = N_GEN, .block = B, .ignore_eos = 1};
        target_state_reset(&s);
        CHECK(spec_generate(&s, &dif, prompt, NP, &o, out, &st, NULL, NULL) == DFL_OK, "oracle: %s", dfl_errmsg());
        CHECK(memcmp(out, truth, sizeof truth) == 0, "%s oracle B=%d: output differs from greedy", target, B);
        CHECK(orc.checks_failed == 0,
              "%s oracle B=%d: anchor was not the committed token, or the feature rows were missing", target, B);
        int all = 1;
        for (int a = 0; a < B && st.rounds >= B + 1; a++) all &= st.accept_hist[a] > 0;
        CHECK(all, "%s oracle B=%d: not every acceptance length 0..B-1 occurred (%d rounds)", target, B, st.rounds);
        CHECK(st.accepted > 0 && spec_tau(&st) >= 1.5, "%s oracle B=%d: tau %.2f", target, B, spec_tau(&st));
    }
    /* (c) an oracle that summarizes its drafts itself (draft_top, as a device drafter would): a
     * chain and a tree of budget 6 read only its top lists, never its logits */
    CHECK(target_state_enable_tree(&s, 7) == DFL_OK, "tree: %s", dfl_errmsg());
    for (int budget = 0; budget <= 6; budget += 6) {
        oracle orc = {.truth = truth, .n_prompt = NP, .V = m.cfg.vocab};
        dfl_draft_if dif = oracle_if(&orc, 1);
        dfl_gen_opts o = {.max_new = N_GEN - budget, .block = 8, .tree_budget = budget, .ignore_eos = 1};
        target_state_reset(&s); /* a tree's nodes take slots past the output */
        CHECK(spec_generate(&s, &dif, prompt, NP, &o, out, &st, NULL, NULL) == DFL_OK, "draft_top: %s", dfl_errmsg());
        CHECK(memcmp(out, truth, (size_t)o.max_new * sizeof *out) == 0 && orc.checks_failed == 0 && st.accepted > 0,
              "%s draft_top oracle, budget %d: output differs from greedy or the loop asked for logits", target,
              budget);
    }
    if (have_d) drafter_close(&d);
    target_state_free(&s);
    model_close(&m);
}

/* opts.on_top: each committed token's row summarized by the forward (its top 3 and their
 * log-probabilities) equals kn_logsoftmax_top of the full row that on_logits sees, bit for bit,
 * in a chain and a tree run, and the output is the same. */
typedef struct tops_log {
    int n;
    int32_t ids[N_GEN][3], tok[N_GEN];
    float lp[N_GEN][3];
} tops_log;
static void tops_on_top(void *ud, int i, int32_t token, const int32_t *ids, const float *lp) {
    tops_log *t = ud;
    t->tok[i] = token, t->n = i + 1;
    memcpy(t->ids[i], ids, sizeof t->ids[i]), memcpy(t->lp[i], lp, sizeof t->lp[i]);
}
static void tops_on_logits(void *ud, int prompt, int i, int32_t token, const float *row, int V) {
    tops_log *t = ud;
    if (prompt) return;
    t->tok[i] = token, t->n = i + 1;
    kn_logsoftmax_top(row, V, 3, t->ids[i], t->lp[i]);
}
static void tops(const char *target, const char *drafter) {
    dfl_model m;
    dfl_drafter d;
    if (model_open(&m, test_fixture(target), 0) != DFL_OK || drafter_open(&d, test_fixture(drafter), m.cfg.n_layers)) {
        CHECK(0, "%s", dfl_errmsg());
        return;
    }
    dfl_target_state s;
    dfl_drafter_state ds;
    CHECK(target_state_init(&s, &m, NP + 48 + 8, 16, 1) == DFL_OK && target_state_enable_tree(&s, 7) == DFL_OK &&
              drafter_state_init(&ds, &d, &m, NP + 48 + 8, 4) == DFL_OK,
          "%s", dfl_errmsg());
    dfl_draft_if dif = spec_dflash_drafter(&ds);
    for (int budget = 0; budget <= 6; budget += 6) {
        static tops_log a, b;
        int32_t oa[48], ob[48];
        dfl_gen_stats st;
        dfl_gen_opts o = {.max_new = 48, .block = 4, .tree_budget = budget, .ignore_eos = 1};
        o.on_top = tops_on_top, o.on_top_ud = &a, o.on_top_k = 3;
        target_state_reset(&s), dif.reset(dif.ctx);
        CHECK(spec_generate(&s, &dif, prompt, NP, &o, oa, &st, NULL, NULL) == DFL_OK, "on_top: %s", dfl_errmsg());
        o.on_top = NULL, o.on_logits = tops_on_logits, o.on_logits_ud = &b;
        target_state_reset(&s), dif.reset(dif.ctx);
        CHECK(spec_generate(&s, &dif, prompt, NP, &o, ob, &st, NULL, NULL) == DFL_OK, "on_logits: %s", dfl_errmsg());
        int same = a.n == 48 && b.n == 48 && memcmp(oa, ob, sizeof oa) == 0;
        for (int i = 0; same && i < 48; i++)
            same = a.tok[i] == oa[i] && a.ids[i][0] == oa[i] && !memcmp(a.ids[i], b.ids[i], sizeof a.ids[i]) &&
                   !memcmp(a.lp[i], b.lp[i], sizeof a.lp[i]);
        CHECK(same, "%s budget %d: on_top's summaries differ from the rows' (or the output does)", target, budget);
    }
    drafter_state_free(&ds), target_state_free(&s), drafter_close(&d), model_close(&m);
}

/* dfl_draft_topk without a draft_top: draft()'s logits summarized, the argmax kn_argmax's and the
 * top K of the softmax most probable first, ties by the lower id, a shorter list the start of a
 * longer one (the recorder gives the loop and the draft cache each their part of one list). */
static float *sum_logits;
static int sum_draft(void *ctx, int32_t anchor, int B, float *logits) {
    (void)ctx, (void)anchor;
    memcpy(logits, sum_logits, (size_t)(B - 1) * 300 * sizeof(float));
    return DFL_OK;
}
static void summaries(void) {
    enum { V = 300, B = 5 };
    float l[(B - 1) * V], probs[(B - 1) * V], lg[(B - 1) * V];
    unsigned seed = 5;
    for (int i = 0; i < (B - 1) * V; i++) seed = seed * 1103515245u + 12345u, l[i] = (float)((seed >> 16) % 40) / 8;
    sum_logits = l;
    dfl_draft_if d = {.draft = sum_draft};
    int32_t am[B], top8[(B - 1) * 8], top3[(B - 1) * 3];
    double lp8[(B - 1) * 8], lp3[(B - 1) * 3];
    CHECK(dfl_draft_topk(&d, 1, B, V, &(dfl_draft_top){8, am, top8, lp8}, lg, 1, probs) == DFL_OK, "%s", dfl_errmsg());
    CHECK(memcmp(lg, l, sizeof l) == 0, "the logits asked for are kept");
    CHECK(dfl_draft_topk(&d, 1, B, V, &(dfl_draft_top){3, am, top3, lp3}, lg, 0, lg) == DFL_OK, "%s", dfl_errmsg());
    for (int k = 0; k < B - 1; k++) {
        const float *row = l + (size_t)k * V;
        double z = 0;
        float mx = row[0];
        for (int i = 0; i < V; i++) mx = row[i] > mx ? row[i] : mx;
        for (int i = 0; i < V; i++) z += exp((double)row[i] - mx);
        CHECK(am[k] == kn_argmax(row, V), "row %d: argmax %d, kn_argmax %d", k, am[k], kn_argmax(row, V));
        for (int j = 0; j < 8; j++) {
            const int32_t a = top8[k * 8 + j], b = j ? top8[k * 8 + j - 1] : -1;
            CHECK(j == 0 || row[b] > row[a] || (row[b] == row[a] && b < a), "row %d: top %d out of order", k, j);
            CHECK(fabs(lp8[k * 8 + j] - ((double)row[a] - mx - log(z))) < 1e-5, "row %d: log-probability %d", k, j);
            CHECK(j >= 3 || (top3[k * 3 + j] == a && lp3[k * 3 + j] == lp8[k * 8 + j]),
                  "row %d: the top 3 are not the first 3 of the top 8", k);
        }
    }
    CHECK(dfl_draft_topk(&d, 1, B, V, &(dfl_draft_top){V + 1, am, top8, lp8}, lg, 0, lg) != DFL_OK,
          "more candidates than the vocabulary refused");
}

/* Upper-tail chi-square critical value (Wilson–Hilferty), alpha = 1e-3: z = 3.0902. */
static double chi2_crit(int df) {
    const double z = 3.0902, h = 2.0 / (9.0 * df);
    return df * pow(1 - h + z * sqrt(h), 3);
}

/* The same at another level: z is the standard normal's upper quantile (1e-4: 3.7190). */
#define Z_1E4 3.7190
static double chi2_crit_z(int df, double z) {
    const double h = 2.0 / (9.0 * df);
    return df * pow(1 - h + z * sqrt(h), 3);
}

/* Two-sample homogeneity test on token counts a[], b[] (same totals), pooling rare tokens. */
static int homogeneous_z(const int *a, const int *b, int V, double z, double *stat_out, int *df_out);
static int homogeneous(const int *a, const int *b, int V, int n, double *stat_out, int *df_out) {
    (void)n;
    return homogeneous_z(a, b, V, 3.0902, stat_out, df_out);
}

static int homogeneous_z(const int *a, const int *b, int V, double z, double *stat_out, int *df_out) {
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
    *stat_out = stat;
    *df_out = df;
    return df < 1 || stat < chi2_crit_z(df, z);
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
    dfl_target_state s;
    CHECK(target_state_init(&s, &m, NP + K + 16, 16, 1) == DFL_OK, "state: %s", dfl_errmsg());
    dfl_drafter_state ds;
    CHECK(drafter_state_init(&ds, &d, &m, NP + K + 1, 4) == DFL_OK, "dstate");
    int32_t out[K], truth[N_GEN] = {0};
    dfl_gen_stats st;
    dfl_gen_opts greedy = {.max_new = K, .ignore_eos = 1};
    spec_generate(&s, NULL, prompt, NP, &greedy, truth, &st, NULL, NULL); /* the oracle proposes these */
    for (int r = 0; r < RUNS; r++) {
        dfl_gen_opts o = {.max_new = K, .block = 4, .temperature = 1.5f, .seed = 1000 + (uint64_t)r, .ignore_eos = 1};
        target_state_reset(&s);
        spec_generate(&s, NULL, prompt, NP, &o, out, &st, NULL, NULL);
        for (int k = 0; k < K; k++) cnt_ar[k * V + out[k]]++;
        o.seed = 900000 + (uint64_t)r;
        target_state_reset(&s);
        drafter_state_reset(&ds);
        dfl_draft_if dif = spec_dflash_drafter(&ds);
        CHECK(spec_generate(&s, &dif, prompt, NP, &o, out, &st, NULL, NULL) == DFL_OK, "spec sample: %s", dfl_errmsg());
        for (int k = 0; k < K; k++) cnt_sp[k * V + out[k]]++;
        /* an oracle proposing the greedy tokens (one-hot q) exercises the acceptance branch */
        oracle orc = {.truth = truth, .n_prompt = NP, .V = V, .round = 1};
        dfl_draft_if odif = oracle_if(&orc, 0);
        o.seed = 5000000 + (uint64_t)r;
        target_state_reset(&s);
        spec_generate(&s, &odif, prompt, NP, &o, out, &st, NULL, NULL);
        for (int k = 0; k < K; k++) cnt_or[k * V + out[k]]++;
        dfl_gen_opts om = o;
        om.accept_rule = DFL_ACCEPT_MATCH;
        om.seed = 7000000 + (uint64_t)r;
        target_state_reset(&s);
        drafter_state_reset(&ds);
        dif = spec_dflash_drafter(&ds);
        CHECK(spec_generate(&s, &dif, prompt, NP, &om, out, &st, NULL, NULL) == DFL_OK &&
                  !strcmp(st.accept_rule, "match"),
              "match sample: %s", dfl_errmsg());
        for (int k = 0; k < K; k++) cnt_md[k * V + out[k]]++;
        om.temperature = 0.3f;
        om.seed = 8000000 + (uint64_t)r;
        orc = (oracle){.truth = truth, .n_prompt = NP, .V = V, .round = 0}; /* round 0: no draft corrupted */
        target_state_reset(&s);
        spec_generate(&s, &odif, prompt, NP, &om, out, &st, NULL, NULL);
        for (int k = 0; k < K; k++) cnt_mo[k * V + out[k]]++;
        acc_match += st.accepted;
        om.seed = 9000000 + (uint64_t)r;
        target_state_reset(&s);
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
    CHECK(acc_match > RUNS / 10,
          "%s: match rule: the oracle's drafts were accepted in %ld of %d runs: the acceptance "
          "path is not exercised",
          target, acc_match, RUNS);
    /* a wrong distribution must be caught: the same counts against temperature 0.5 */
    int *cnt_cold = calloc((size_t)V, sizeof(int));
    for (int r = 0; r < RUNS; r++) {
        dfl_gen_opts o = {.max_new = 1, .temperature = 0.5f, .seed = 77 + (uint64_t)r, .ignore_eos = 1};
        target_state_reset(&s);
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
        target_state_reset(&s);
        drafter_state_reset(&ds);
        dfl_draft_if dif = spec_dflash_drafter(&ds);
        spec_generate(&s, &dif, prompt, NP, &o, rep ? o2 : o1, &st, NULL, NULL);
    }
    CHECK(memcmp(o1, o2, sizeof o1) == 0, "%s: same seed gave different samples", target);
    free(cnt_ar), free(cnt_sp), free(cnt_or), free(cnt_cold), free(cnt_md), free(cnt_mo), free(cnt_cool);
    drafter_state_free(&ds);
    target_state_free(&s);
    drafter_close(&d);
    model_close(&m);
}

/* ---- sampling as served: top-k / top-p ---- */

/* The filter by the definition, naively: rank all tokens (p desc, id asc) in double, keep the
 * top k, then the shortest prefix whose mass reaches top_p of theirs; renormalised. */
static void naive_filter(const float *p, int V, int k, float top_p, double *out) {
    int *ord = malloc((size_t)V * sizeof *ord);
    for (int i = 0; i < V; i++) ord[i] = i;
    for (int i = 1; i < V; i++) { /* insertion sort: V is small here */
        int x = ord[i], j = i;
        while (j > 0 && (p[ord[j - 1]] < p[x] || (p[ord[j - 1]] == p[x] && ord[j - 1] > x))) ord[j] = ord[j - 1], j--;
        ord[j] = x;
    }
    int n = k > 0 && k < V ? k : V;
    double mass = 0;
    for (int i = 0; i < n; i++) mass += p[ord[i]];
    int keep = n;
    if (top_p > 0 && top_p < 1) {
        double cum = 0;
        keep = 0;
        while (keep < n && (keep == 0 || cum < top_p * mass)) cum += p[ord[keep++]];
    }
    double kept = 0;
    for (int i = 0; i < keep; i++) kept += p[ord[i]];
    for (int i = 0; i < V; i++) out[i] = 0;
    const int on = (k > 0 && k < V) || (top_p > 0 && top_p < 1); /* off: p unchanged */
    for (int i = 0; i < keep; i++) out[ord[i]] = on ? p[ord[i]] / kept : p[ord[i]];
    free(ord);
}

static void filter_vs_naive(void) {
    const int V = 300;
    float *p = malloc(V * sizeof *p), *f = malloc(V * sizeof *f);
    double *want = malloc(V * sizeof *want);
    dfl_ranked *scratch = malloc(V * sizeof *scratch);
    dfl_rng r;
    rng_seed(&r, 31337);
    const int ks[] = {0, 1, 2, 20, 299, 300, 1000};
    const float ps[] = {0, 1e-6f, 0.3f, 0.9f, 0.95f, 0.999f, 1};
    double worst = 0;
    for (int trial = 0; trial < 60; trial++) {
        /* shapes: peaked, flat, ties (values from a few levels), zeros outside a few candidates */
        const int shape = trial % 4;
        double sum = 0;
        for (int i = 0; i < V; i++) {
            double u = rng_uniform(&r);
            double x = shape == 0   ? exp(8 * u)
                       : shape == 1 ? 1 + 0.01 * u
                       : shape == 2 ? (double)(1 + (int)(u * 4))
                                    : (i % 37 == 0 ? u : 0);
            p[i] = (float)x;
            sum += x;
        }
        for (int i = 0; i < V; i++) p[i] = (float)(p[i] / sum);
        for (size_t a = 0; a < sizeof ks / sizeof ks[0]; a++)
            for (size_t b = 0; b < sizeof ps / sizeof ps[0]; b++) {
                memcpy(f, p, V * sizeof *p);
                const int kept = spec_sampling_filter(f, V, ks[a], ps[b], scratch);
                naive_filter(p, V, ks[a], ps[b], want);
                int same = 1, n_want = 0;
                for (int i = 0; i < V; i++) {
                    n_want += want[i] > 0;
                    same &= (want[i] > 0) == (f[i] > 0);
                    if (fabs(want[i] - f[i]) > worst) worst = fabs(want[i] - f[i]);
                }
                const int off = (ks[a] <= 0 || ks[a] >= V) && (ps[b] <= 0 || ps[b] >= 1);
                CHECK(same && (off ? kept == V : kept >= n_want),
                      "filter k=%d top_p=%g shape %d: kept set differs "
                      "from the naive sort (%d kept, %d expected)",
                      ks[a], ps[b], shape, kept, n_want);
            }
    }
    CHECK(worst < 1e-6, "filter: renormalised probabilities differ from the naive ones by %.3g", worst);
    /* top_p tiny keeps the single most probable token; ties keep the lower id */
    for (int i = 0; i < V; i++) p[i] = 1.0f / V;
    CHECK(spec_sampling_filter(p, V, 0, 1e-6f, scratch) == 1 && p[0] == 1.0f, "flat, top_p 1e-6: token 0 alone");
    for (int i = 0; i < V; i++) p[i] = 1.0f / V;
    CHECK(spec_sampling_filter(p, V, 3, 0, scratch) == 3 && fabsf(p[0] + p[1] + p[2] - 1) < 1e-6f && p[3] == 0,
          "flat, top_k 3: ids 0, 1, 2");
    free(p), free(f), free(want), free(scratch);
}

/* A sampling setting and the support check of every committed token (opts.on_logits): the token
 * must rank within top_k of its row, and the mass ranked before it (among the top k,
 * renormalised) must be below top_p (1e-5 of slack for float rounding). */
typedef struct support_chk {
    float T, top_p;
    int top_k, on;
    long tokens, outside;
} support_chk;

typedef struct pd {
    double p;
    int id;
} pd;

static int pd_cmp(const void *x, const void *y) {
    const pd *a = x, *b = y;
    return a->p > b->p ? -1 : a->p < b->p ? 1 : a->id - b->id;
}

static void support_on_logits(void *ud, int prompt, int i, int32_t token, const float *row, int V) {
    (void)i;
    support_chk *c = ud;
    if (prompt || !c->on) return;
    c->tokens++;
    double mx = row[0];
    for (int v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
    pd *r = malloc((size_t)V * sizeof *r);
    for (int v = 0; v < V; v++) r[v] = (pd){exp(((double)row[v] - mx) / c->T), v};
    qsort(r, (size_t)V, sizeof *r, pd_cmp);
    const int n = c->top_k > 0 && c->top_k < V ? c->top_k : V;
    double mass = 0, before = 0;
    int rank = -1;
    for (int v = 0; v < n; v++) mass += r[v].p;
    for (int v = 0; v < V && rank < 0; v++) {
        if (r[v].id == token) rank = v;
        else before += r[v].p;
    }
    free(r);
    const int in_p = c->top_p <= 0 || c->top_p >= 1 || before / mass < c->top_p + 1e-5;
    if (rank >= n || !in_p) c->outside++;
}

typedef struct filt_cfg {
    float T, top_p;
    int top_k;
    const char *what;
} filt_cfg;

static void sampling_filtered(const char *target, const char *drafter, const filt_cfg *cfg, int n_cfg) {
    dfl_model m;
    if (model_open(&m, test_fixture(target), 0) != DFL_OK) {
        CHECK(0, "%s", dfl_errmsg());
        return;
    }
    dfl_drafter d;
    CHECK(drafter_open(&d, test_fixture(drafter), m.cfg.n_layers) == DFL_OK, "drafter: %s", dfl_errmsg());
    const int V = m.cfg.vocab, K = 3, RUNS = 1000;
    dfl_target_state s;
    CHECK(target_state_init(&s, &m, NP + K + 16, 16, 1) == DFL_OK, "state: %s", dfl_errmsg());
    dfl_drafter_state ds;
    CHECK(drafter_state_init(&ds, &d, &m, NP + K + 1, 4) == DFL_OK, "dstate");
    int32_t out[K], truth[N_GEN] = {0}, greedy_out[K];
    dfl_gen_stats st;
    dfl_gen_opts greedy = {.max_new = K, .ignore_eos = 1};
    spec_generate(&s, NULL, prompt, NP, &greedy, truth, &st, NULL, NULL); /* the oracle proposes these */
    /* greedy ignores the filters: the argmax always survives them */
    dfl_gen_opts gf = {.max_new = K, .ignore_eos = 1, .top_k = 3, .top_p = 0.5f};
    target_state_reset(&s);
    CHECK(spec_generate(&s, NULL, prompt, NP, &gf, greedy_out, &st, NULL, NULL) == DFL_OK &&
              memcmp(greedy_out, truth, sizeof greedy_out) == 0,
          "%s: top_k/top_p changed greedy decoding", target);
    enum { AR, PQ_D, PQ_O, M_D, M_O, AR_FULL, N_ARM };
    static const char *const arm_name[N_ARM] = {"autoregressive",      "pq rule, drafter",   "pq rule, oracle",
                                                "match rule, drafter", "match rule, oracle", "unfiltered"};
    for (int c = 0; c < n_cfg; c++) {
        int *cnt[N_ARM];
        for (int a = 0; a < N_ARM; a++) cnt[a] = calloc((size_t)K * V, sizeof(int));
        support_chk chk = {.T = cfg[c].T, .top_p = cfg[c].top_p, .top_k = cfg[c].top_k};
        long acc[N_ARM] = {0};
        for (int r = 0; r < RUNS; r++) {
            chk.on = r < RUNS / 5; /* the support of the tokens of the first runs' (a naive sort per token) */
            for (int a = 0; a < N_ARM; a++) {
                dfl_gen_opts o = {.max_new = a == AR_FULL ? 1 : K,
                                  .block = 4,
                                  .temperature = cfg[c].T,
                                  .top_p = cfg[c].top_p,
                                  .top_k = cfg[c].top_k,
                                  .seed = 1000003u * (uint64_t)(a + 1) + (uint64_t)r + 77 * (uint64_t)c,
                                  .ignore_eos = 1,
                                  .on_logits = support_on_logits,
                                  .on_logits_ud = &chk,
                                  .accept_rule = a == M_D || a == M_O ? DFL_ACCEPT_MATCH : DFL_ACCEPT_PQ};
                if (a == AR_FULL) o.top_p = 0, o.top_k = 0, o.on_logits = NULL;
                /* round 0: no draft corrupted */
                oracle orc = {.truth = truth, .n_prompt = NP, .V = V, .round = 0, .soft = 1};
                dfl_draft_if odif = oracle_if(&orc, 0);
                target_state_reset(&s);
                drafter_state_reset(&ds);
                dfl_draft_if dif = spec_dflash_drafter(&ds);
                dfl_draft_if *use = a == PQ_D || a == M_D ? &dif : a == PQ_O || a == M_O ? &odif : NULL;
                CHECK(spec_generate(&s, use, prompt, NP, &o, out, &st, NULL, NULL) == DFL_OK, "%s: %s", arm_name[a],
                      dfl_errmsg());
                for (int k = 0; k < o.max_new; k++) cnt[a][k * V + out[k]]++;
                acc[a] += st.accepted;
            }
        }
        const char *what = cfg[c].what;
        CHECK(chk.tokens == (long)(RUNS / 5) * K * (N_ARM - 1) && chk.outside == 0,
              "%s %s: %ld of %ld committed tokens lie outside their row's filtered support", target, what, chk.outside,
              chk.tokens);
        /* token 0 comes from the prefill's logits in every arm; tokens 1.. from the rounds */
        for (int k = 1; k < K; k++)
            for (int a = PQ_D; a <= M_O; a++) {
                double stat;
                int df;
                CHECK(homogeneous_z(cnt[AR] + k * V, cnt[a] + k * V, V, Z_1E4, &stat, &df),
                      "%s %s: sampled token %d: %s: distribution differs from autoregressive sampling of the filtered "
                      "target (chi2 %.1f, df %d, crit %.1f)",
                      target, what, k, arm_name[a], stat, df, chi2_crit_z(df, Z_1E4));
            }
        /* the test tells the filtered distribution from the full one */
        double stat;
        int df;
        CHECK(!homogeneous_z(cnt[AR], cnt[AR_FULL], V, Z_1E4, &stat, &df),
              "%s %s: the test cannot tell the filtered distribution from the unfiltered one (chi2 %.1f, df %d)",
              target, what, stat, df);
        /* the acceptance paths run: the oracle's drafts (the greedy tokens) are accepted */
        CHECK(acc[PQ_O] > RUNS / 20 && acc[M_O] > RUNS / 20,
              "%s %s: oracle drafts accepted %ld (pq) and %ld (match) times in %d runs", target, what, acc[PQ_O],
              acc[M_O], RUNS);
        for (int a = 0; a < N_ARM; a++) free(cnt[a]);
    }
    /* bad settings name the field */
    dfl_gen_opts bad = {.max_new = K, .temperature = 1, .top_p = 1.5f, .ignore_eos = 1};
    target_state_reset(&s);
    CHECK(spec_generate(&s, NULL, prompt, NP, &bad, out, &st, NULL, NULL) == DFL_ERR && strstr(dfl_errmsg(), "top_p"),
          "top_p 1.5: %s", dfl_errmsg());
    bad.top_p = 0, bad.top_k = -1;
    target_state_reset(&s);
    CHECK(spec_generate(&s, NULL, prompt, NP, &bad, out, &st, NULL, NULL) == DFL_ERR && strstr(dfl_errmsg(), "top_k"),
          "top_k -1: %s", dfl_errmsg());
    drafter_state_free(&ds);
    target_state_free(&s);
    drafter_close(&d);
    model_close(&m);
}

static void bad_input(void) {
    dfl_model m;
    dfl_drafter d;
    if (model_open(&m, test_fixture("qwen3_tiny"), 0) != DFL_OK) return;
    {
        dfl_target_state s;
        target_state_init(&s, &m, NP + 20, 16, 1);
        int32_t truth[N_GEN] = {0}, out[N_GEN];
        oracle orc = {.truth = truth, .n_prompt = NP, .V = m.cfg.vocab};
        dfl_draft_if dif = oracle_if(&orc, 0);
        dfl_gen_opts o = {.max_new = 8, .block = 4, .ignore_eos = 1};
        dfl_gen_stats st;
        dif.add_context = leaky_add;
        CHECK(spec_generate(&s, &dif, prompt, NP, &o, out, &st, NULL, NULL) == DFL_ERR &&
                  strstr(dfl_errmsg(), "the anchor must not be in it") && st.ctx_check_failures == 1,
              "a drafter context holding the anchor's position must be refused: %s", dfl_errmsg());
        target_state_free(&s);
    }
    /* a drafter for another target: hidden size and layer ids do not fit */
    CHECK(drafter_open(&d, test_fixture("dflash_qwen35"), m.cfg.n_layers) == DFL_OK, "open: %s", dfl_errmsg());
    CHECK(drafter_check_target(&d, &m) == DFL_ERR && strstr(dfl_errmsg(), "hidden_size 128 != target hidden_size 64"),
          "misfit: %s", dfl_errmsg());
    dfl_drafter_state ds;
    CHECK(drafter_state_init(&ds, &d, &m, 10, d.cfg.block_size + 1) == DFL_ERR && strstr(dfl_errmsg(), "block size"),
          "block too large: %s", dfl_errmsg());
    CHECK(drafter_state_init(&ds, &d, &m, 10, 0) == DFL_ERR, "block 0");
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
    filter_vs_naive();
    /* Qwen's recommended setting (both filters); each filter alone at other temperatures */
    const filt_cfg served[] = {{1.0f, 0.95f, 20, "T 1, top_p 0.95, top_k 20"},
                               {0.7f, 0.8f, 0, "T 0.7, top_p 0.8"},
                               {0.8f, 0, 6, "T 0.8, top_k 6"}};
    sampling_filtered("qwen3_tiny", "dflash_qwen3", served, 3);
    sampling_filtered("qwen35_vlm", "dflash_qwen35", served, 1);
    sampling_filtered("qwen3_tiny", "dflash2_qwen3", served, 1); /* q is zero outside the candidates */
    bad_input();
    summaries();
    tops("qwen3_tiny", "dflash_qwen3");
    tops("qwen35_vlm", "dflash_qwen35");
    return test_done("test_spec");
}
