/* The checks of the evaluation reports (docs/eval.md, "Settings, warnings, statistics"): the
 * consistency check of the costs behind a modeled speedup (the inconsistent costs of issue 37's
 * busy machine fail it, sane ones pass), the bootstrap interval against numbers numpy and
 * Python's random produced, paired comparisons over the prompts two rows share, per-prompt τ, the
 * verdict, the loop test of an output. No timing. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/eval.h"
#include "dfl/replay.h"
#include "testutil.h"

/* Costs as eval_costs_measure leaves them: a decode step, chain sizes, tree budgets (seconds). */
static eval_costs costs(double dec, double v16, double tree16, double spread) {
    eval_costs c = {.ok = 1, .reps = 3, .n_chain = 2, .n_tree = 1};
    c.chain_n[0] = 1, c.chain_s[0] = dec, c.chain_med[0] = dec * spread;
    c.chain_n[1] = 16, c.chain_s[1] = v16, c.chain_med[1] = v16 * spread;
    c.tree_budget[0] = 16, c.tree_s[0] = tree16, c.tree_med[0] = tree16 * spread;
    return c;
}

static void costs_check(void) {
    char why[1024];
    /* issue 37's run: one decode step 56.7 ms, a 16-token verification 0.94 ms */
    eval_costs bad = costs(0.0567, 0.00094, 0.0009, 1.1);
    CHECK(eval_costs_check(&bad, -1, why, sizeof why) == 0, "inconsistent costs pass");
    CHECK(strstr(why, "verification of 16 tokens (0.940 ms) costs less than a decode step (56.700 ms)") &&
              strstr(why, "tree of budget 16"),
          "why: %s", why);
    eval_costs sane = costs(0.001, 0.0015, 0.002, 1.1);
    CHECK(eval_costs_check(&sane, 0.0012, why, sizeof why) == 1 && why[0] == 0, "sane costs fail: %s", why);
    CHECK(eval_costs_check(&sane, -1, why, sizeof why) == 1, "sane costs without a measured step fail: %s", why);
    /* within noise: a verification a little under a decode step passes */
    eval_costs close = costs(0.001, 0.00095, 0.002, 1.0);
    CHECK(eval_costs_check(&close, -1, why, sizeof why) == 1, "verify 0.95 decode fails: %s", why);
    eval_costs spread = costs(0.001, 0.0015, 0.002, 3.0);
    CHECK(eval_costs_check(&spread, -1, why, sizeof why) == 0 &&
              strstr(why, "spread: median 3.000 ms, fastest 1.000 ms"),
          "repetitions spread 3x: %s", why);
    CHECK(eval_costs_check(&sane, 0.0001, why, sizeof why) == 0 && strstr(why, "far from"),
          "step 10x under the cost: %s", why);
    CHECK(eval_costs_check(&sane, 0.01, why, sizeof why) == 0 && strstr(why, "(10.000 ms per token)"),
          "step 10x over the cost: %s", why);
    eval_costs none = {0};
    CHECK(eval_costs_check(&none, 0.001, why, sizeof why) == 1, "no costs: nothing to check");
    /* older recordings have no medians (0): the spread is not checked */
    eval_costs old = costs(0.001, 0.0015, 0.002, 0.0);
    CHECK(eval_costs_check(&old, -1, why, sizeof why) == 1, "no medians: %s", why);
}

static void bootstrap(void) {
    /* numbers from numpy.percentile over 2000 means of random.Random(1).randrange(10) resamples */
    const double d[] = {0.5, -0.25, 1.0, 0.75, 0.0, 1.5, -0.5, 0.25, 2.0, 0.125};
    double ci[2];
    eval_bootstrap_mean(d, 10, 2000, 1, ci);
    CHECK(fabs(ci[0] - 0.1125) < 1e-12 && fabs(ci[1] - 1.025) < 1e-12, "interval [%.17g, %.17g], numpy [0.1125, 1.025]",
          ci[0], ci[1]);
    double again[2];
    eval_bootstrap_mean(d, 10, 2000, 1, again);
    CHECK(again[0] == ci[0] && again[1] == ci[1], "seeded: the same interval twice");
    const double c[] = {0.3, 0.3, 0.3, 0.3};
    eval_bootstrap_mean(c, 4, 2000, 1, ci);
    CHECK(fabs(ci[0] - 0.3) < 1e-12 && fabs(ci[1] - 0.3) < 1e-12, "constant differences: [%g, %g]", ci[0], ci[1]);
    eval_bootstrap_mean(d, 1, 2000, 1, ci);
    CHECK(ci[0] == 0.5 && ci[1] == 0.5, "one value: no interval");
}

static void paired(void) {
    const eval_ptau a[] = {{"p1", 2.0}, {"p2", 3.0}, {"p3", 4.0}}, b[] = {{"p2", 3.5}, {"p3", 4.5}, {"p4", 9.0}};
    eval_paired p;
    eval_paired_compare(a, 3, b, 3, 2000, 1, &p);
    CHECK(p.n == 2 && p.tau_a == 3.5 && p.tau_b == 4.0 && p.diff == 0.5 && p.lo == 0.5 && p.hi == 0.5,
          "only p2 and p3 pair: n %d τ %g %g diff %g [%g, %g]", p.n, p.tau_a, p.tau_b, p.diff, p.lo, p.hi);
    char v[1024];
    eval_paired_verdict(&p, "A", "B", v, sizeof v);
    CHECK(strstr(v, "B accepts 0.50 ± 0.00 more tokens per round than A on these 2 prompts"), "verdict: %s", v);
    p = (eval_paired){.n = 80, .diff = -0.42, .lo = -0.53, .hi = -0.31};
    eval_paired_verdict(&p, "A", "B", v, sizeof v);
    CHECK(strstr(v, "B accepts 0.42 ± 0.11 fewer tokens per round than A on these 80 prompts"), "verdict: %s", v);
    p = (eval_paired){.n = 80, .diff = 0.02, .lo = -0.05, .hi = 0.09};
    eval_paired_verdict(&p, "A", "B", v, sizeof v);
    CHECK(strstr(v, "no more than the noise") && strstr(v, "[-0.05, +0.09] holds 0"), "verdict: %s", v);
    p = (eval_paired){.n = 1};
    eval_paired_verdict(&p, "A", "B", v, sizeof v);
    CHECK(strstr(v, "too few for an interval"), "verdict: %s", v);
}

/* A results row of drafter d: prompt pid, turn, tokens over rounds. */
static eval_result row(const char *pid, int turn, const char *d, int tokens, int rounds, int rep) {
    eval_result r;
    eval_result_init(&r);
    snprintf(r.prompt_id, sizeof r.prompt_id, "%s", pid);
    snprintf(r.drafter, sizeof r.drafter, "%s", d);
    snprintf(r.mode, sizeof r.mode, "chain");
    snprintf(r.method, sizeof r.method, "replay");
    r.turn = turn, r.tokens = tokens, r.rounds = rounds, r.rep = rep;
    return r;
}

static void prompt_taus(void) {
    const eval_result res[] = {row("b", 0, "x", 11, 5, 0),
                               row("a", 0, "x", 9, 2, 0),
                               row("a", 1, "x", 7, 3, 0),
                               row("a", 0, "x", 3, 2, 0) /* a later copy: ignored */,
                               row("b", 0, "x", 2, 1, 1) /* a repetition: ignored */,
                               row("b", 0, "y", 5, 1, 0)};
    eval_ptau *t = NULL;
    const int n = eval_prompt_taus(res, 6, "x", "chain", "replay", "dfl", &t);
    CHECK(n == 2 && strcmp(t[0].id, "a") == 0 && strcmp(t[1].id, "b") == 0, "two prompts, sorted by id");
    CHECK(n == 2 && fabs(t[0].tau - 3.0) < 1e-12 && fabs(t[1].tau - 2.0) < 1e-12,
          "a: mean of turns (4 + 2) / 2 = 3, b: 2; got %g %g", n == 2 ? t[0].tau : 0, n == 2 ? t[1].tau : 0);
    free(t);
    eval_summary s;
    eval_summarize(&s, res, 6);
    CHECK(s.n_cmp == 1 && s.cmp[0].p.n == 1 && fabs(s.cmp[0].p.diff - 2.0) < 1e-12,
          "summary: y against x on prompt b: %d comparisons", s.n_cmp);
    eval_summary_free(&s);
}

static void loops(void) {
    int32_t v[200];
    for (int i = 0; i < 200; i++) v[i] = i; /* no repetition */
    CHECK(eval_output_loops(v, 200) == 0, "distinct tokens loop");
    for (int i = 100; i < 200; i++) v[i] = 1000 + (i - 100) % 7; /* a span of 7 repeated at the end */
    CHECK(eval_output_loops(v, 200) == 7, "period 7: %d", eval_output_loops(v, 200));
    for (int i = 170; i < 200; i++) v[i] = 5; /* 30 copies of one token: under 32 tokens */
    CHECK(eval_output_loops(v, 200) == 0, "30 equal tokens: %d", eval_output_loops(v, 200));
    v[169] = 5, v[168] = 5;
    CHECK(eval_output_loops(v, 200) == 1, "32 equal tokens: %d", eval_output_loops(v, 200));
    for (int i = 0; i < 200; i++) v[i] = i < 80 ? i : 500 + (i - 80) % 60; /* 2 copies of 60: not 3 */
    CHECK(eval_output_loops(v, 200) == 0, "two copies: %d", eval_output_loops(v, 200));
    for (int i = 0; i < 200; i++) v[i] = i < 20 ? i : 500 + (i - 20) % 60; /* 3 copies of 60 */
    CHECK(eval_output_loops(v, 200) == 60, "three copies of 60: %d", eval_output_loops(v, 200));
    v[199] = 1; /* the loop broken at the end (an eos): it ends in no loop */
    CHECK(eval_output_loops(v, 200) == 0, "broken at the end: %d", eval_output_loops(v, 200));
}

int main(void) {
    costs_check();
    bootstrap();
    paired();
    prompt_taus();
    loops();
    return test_done("test_eval_checks");
}
