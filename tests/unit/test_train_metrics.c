/* Training metrics (dfl/train_metrics.h) with a stand-in drafter whose drafts are known: slot k of
 * an anchor at p proposes the label at p + k except where (p + k) % 4 == 0 (but the last). Every count (valid,
 * correct, leading runs, the serving walk, the random subset, the expected acceptance against a
 * given target distribution) is checked against a direct computation; the subset is a function
 * of the seed and the key; train.jsonl lines parse back to the same counts. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/train_metrics.h"
#include "testutil.h"

enum { H = 2, V = 8, B = 5, NP = 3, N = 14 };

static int32_t labels[N];
/* position q is mispredicted (the last label is not: the walk's last round then reaches the eos) */
static int miss(int q) { return q % 4 == 0 && q < NP + N - 1; }

typedef struct stand_in {
    int n_ctx;
} stand_in;

static int sd_add(void *ctx, const dfl_feat *feat, const int32_t *tokens, int n) {
    (void)feat, (void)tokens;
    ((stand_in *)ctx)->n_ctx += n;
    return DFL_OK;
}

/* Slot k predicts position p + k: the label, or (label + 1) % V where it misses; the proposed
 * token's logit is ln 9 and the others 0, so its probability is 9/16 and the others' 1/16. */
static int sd_draft(void *ctx, int32_t anchor, int bs, float *logits) {
    (void)anchor;
    const int p = ((stand_in *)ctx)->n_ctx;
    for (int k = 1; k < bs; k++) {
        float *row = logits + (size_t)(k - 1) * V;
        memset(row, 0, V * sizeof *row);
        const int q = p + k - NP;
        const int tok = q < N ? (miss(p + k) ? (labels[q] + 1) % V : labels[q]) : 0;
        row[tok] = logf(9.0f);
    }
    return DFL_OK;
}
static int sd_len(void *ctx) { return ((stand_in *)ctx)->n_ctx; }
static void sd_reset(void *ctx) { ((stand_in *)ctx)->n_ctx = 0; }

static const int layers[1] = {0};

/* The leading run of the anchor at p and the number of supervised slots. */
static int lead(int p, int *n_valid) {
    const int T = NP + N;
    *n_valid = T - 1 - p < B - 1 ? T - 1 - p : B - 1;
    int a = 0;
    while (a < *n_valid && !miss(p + a + 1)) a++;
    return a;
}

/* walk: a round whose drafts reach the last label ends the output (no bonus token). */
static void check_counts(const char *what, const tm_counts *c, const int *anchors, int n, int with_alpha, int walk) {
    tm_counts e = {0};
    for (int i = 0; i < n; i++) {
        int nv;
        const int p = anchors[i], a = lead(p, &nv);
        e.anchors++, e.len_sum += (walk && p + a >= NP + N - 1 ? 0 : 1) + a;
        double prod = 1, ex = 1;
        for (int k = 1; k <= nv; k++) {
            e.valid[k]++, e.correct[k] += !miss(p + k), e.cont[k] += k - 1 <= a, e.reach[k] += k <= a;
            /* target top 2 there: the label 0.6, (label + 1) % V 0.2; min with the draft: 9/16 + 1/16 or 1/16 + 0.2 */
            const double al = miss(p + k) ? 1.0 / 16 + 0.2 : 9.0 / 16 + 1.0 / 16;
            e.alpha[k] += al, e.left[k] += 0.2;
            prod *= al, ex += prod;
        }
        e.exp_anchors++, e.exp_len_sum += ex;
    }
    CHECK(c->anchors == e.anchors, "%s: %ld anchors, expected %ld", what, c->anchors, e.anchors);
    CHECK(fabs(c->len_sum - e.len_sum) < 1e-9, "%s: len_sum %g, expected %g", what, c->len_sum, e.len_sum);
    for (int k = 1; k < B; k++) {
        CHECK(c->valid[k] == e.valid[k] && c->correct[k] == e.correct[k],
              "%s k=%d: valid/correct %ld/%ld, expected "
              "%ld/%ld",
              what, k, c->valid[k], c->correct[k], e.valid[k], e.correct[k]);
        CHECK(c->cont[k] == e.cont[k] && c->reach[k] == e.reach[k], "%s k=%d: cont/reach %ld/%ld, expected %ld/%ld",
              what, k, c->cont[k], c->reach[k], e.cont[k], e.reach[k]);
        if (with_alpha) {
            CHECK(fabs(c->alpha[k] - e.alpha[k]) < 1e-6, "%s k=%d: alpha %g, expected %g", what, k, c->alpha[k],
                  e.alpha[k]);
            CHECK(fabs(c->left[k] - e.left[k]) < 1e-6, "%s k=%d: left %g, expected %g", what, k, c->left[k], e.left[k]);
        }
    }
    if (with_alpha)
        CHECK(fabs(c->exp_len_sum - e.exp_len_sum) < 1e-5 * e.exp_len_sum,
              /* float probabilities */ "%s: exp_len_sum %g, expected %g", what, c->exp_len_sum, e.exp_len_sum);
}

int main(void) {
    for (int i = 0; i < N; i++) labels[i] = (3 * i + 1) % V;
    eval_truth t;
    eval_truth_init(&t, H, layers, 1);
    float rows[(NP + N) * H] = {0};
    eval_truth_add_rows(&t, rows, NP + N - 1);
    const int32_t prompt[NP] = {1, 2, 3};
    CHECK(eval_truth_set(&t, prompt, NP, labels, N, 0, 1) == DFL_OK, "truth: %s", dfl_errmsg());
    /* the target's distribution: at position q (predicting q + 1), top 2 = the label 0.6, the miss token 0.2 */
    tm_target tt = {.K = 2, .first = NP - 1, .n = N};
    tt.ids = malloc(N * 2 * sizeof *tt.ids), tt.p = malloc(N * 2 * sizeof *tt.p), tt.left = malloc(N * sizeof *tt.left);
    for (int i = 0; i < N; i++) {
        tt.ids[2 * i] = labels[i], tt.ids[2 * i + 1] = (labels[i] + 1) % V;
        tt.p[2 * i] = 0.6f, tt.p[2 * i + 1] = 0.2f, tt.left[i] = 0.2;
    }
    stand_in sd = {0};
    dfl_draft_if d = {.ctx = &sd,
                      .add_context = sd_add,
                      .draft = sd_draft,
                      .context_len = sd_len,
                      .reset = sd_reset,
                      .feature_layers = layers,
                      .n_feature_layers = 1};
    const int col[1] = {0};
    tm_opts o = {.B = B, .num_anchors = 5, .seed = 7};
    tm_unit u;
    CHECK(tm_score(&t, &d, col, V, &tt, &o, 11, &u) == DFL_OK, "score: %s", dfl_errmsg());
    int all[N], walk[N], nw = 0;
    for (int i = 0; i < N - 1; i++) all[i] = NP + i;
    check_counts("every anchor", &u.all, all, N - 1, 1, 0);
    for (int p = NP, nv; p <= NP + N - 2; p += lead(p, &nv) + 1) walk[nw++] = p;
    check_counts("walk", &u.walk, walk, nw, 1, 1);
    CHECK(u.walk.len_sum == N - 1, "the walk commits every label after the first: %g, expected %d", u.walk.len_sum,
          N - 1);
    CHECK(u.n_anchors == 5 && u.n_valid == N - 1, "%d random of %d valid anchors, expected 5 of %d", u.n_anchors,
          u.n_valid, N - 1);
    for (int i = 0; i < u.n_anchors; i++)
        CHECK(u.anchors[i] >= NP && u.anchors[i] <= NP + N - 2 && (i == 0 || u.anchors[i] > u.anchors[i - 1]),
              "random anchor %d = %d: must be a valid anchor, ascending", i, u.anchors[i]);
    check_counts("random anchors", &u.rnd, u.anchors, u.n_anchors, 1, 0);
    /* the subset: the same for the same seed and key, another for another seed */
    tm_unit u2, u3;
    sd_reset(&sd);
    CHECK(tm_score(&t, &d, col, V, NULL, &o, 11, &u2) == DFL_OK, "score again: %s", dfl_errmsg());
    CHECK(u2.n_anchors == u.n_anchors && !memcmp(u2.anchors, u.anchors, u.n_anchors * sizeof *u.anchors),
          "the same seed and key draw the same anchors");
    CHECK(u2.all.exp_anchors == 0, "no target distribution: no expected acceptance");
    o.seed = 8;
    int differs = 0;
    for (int s = 0; s < 4 && !differs; s++, o.seed++) {
        sd_reset(&sd);
        CHECK(tm_score(&t, &d, col, V, NULL, &o, 11, &u3) == DFL_OK, "score with seed: %s", dfl_errmsg());
        differs = memcmp(u3.anchors, u.anchors, u.n_anchors * sizeof *u.anchors) != 0;
        tm_unit_free(&u3);
    }
    CHECK(differs, "other seeds draw other anchors");
    /* a context that is not empty is refused */
    CHECK(tm_score(&t, &d, col, V, NULL, &o, 11, &u3) != DFL_OK, "a used drafter context is refused");
    /* the derived figures */
    CHECK(fabs(tm_sim_len(&u.all) - u.all.len_sum / u.all.anchors) < 1e-12, "simulated length = mean of 1 + a");
    long v = 0, ok = 0;
    for (int k = 1; k < B; k++) v += u.all.valid[k], ok += u.all.correct[k];
    CHECK(fabs(tm_accuracy(&u.all, B) - (double)ok / v) < 1e-12, "accuracy pools every slot");
    CHECK(tm_default_gamma(16) == 7 && tm_default_gamma(10) == 5 && tm_default_gamma(8) == 4, "default gamma");
    /* a train.jsonl line parses back to the same counts */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    tm_row r = {.turn = 0, .B = B, .prompt_tokens = NP, .tokens = N, .u = u};
    strcpy(r.prompt_id, "p\"1"), strcpy(r.drafter, "d"), strcpy(r.labels, "target"), strcpy(r.features, "dfl");
    strcpy(r.attn, "config");
    tm_row_write(f, &r);
    fclose(f);
    tm_row back;
    CHECK(tm_row_parse(buf, &back) == DFL_OK, "parse: %s", dfl_errmsg());
    CHECK(!strcmp(back.prompt_id, "p\"1") && back.B == B && back.u.all.anchors == u.all.anchors &&
              !memcmp(back.u.all.reach, u.all.reach, sizeof u.all.reach) &&
              fabs(back.u.all.exp_len_sum - u.all.exp_len_sum) < 1e-9 &&
              fabs(back.u.rnd.alpha[2] - u.rnd.alpha[2]) < 1e-9,
          "the line round-trips");
    CHECK(tm_row_parse("{\"prompt_id\": \"x\"}", &back) != DFL_OK, "a line without counts is refused");
    free(buf);
    tm_unit_free(&u), tm_unit_free(&u2);
    free(tt.ids), free(tt.p), free(tt.left);
    eval_truth_free(&t);
    return test_done("test_train_metrics");
}
