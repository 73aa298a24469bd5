/* An online unit: an autoregressive run, then every drafter x mode on the target (--repeat times),
 * the rows its plan lacks. */
#include <string.h>

#include "dfl/common.h"
#include "eval/run.h"

/* The autoregressive run of repetition rep: the truth (rep 0), or checked against it. */
static int run_ar(run *r, const char *pid, int turn, int rep, const int32_t *pids, int np, const dfl_gen_opts *go,
                  int32_t *truth, int *n_truth, int32_t *out) {
    dfl_gen_stats gs;
    int32_t *ids = rep == 0 ? truth : out;
    target_state_reset(&r->st);
    if (spec_generate(&r->st, NULL, pids, np, go, ids, &gs, NULL, NULL) != DFL_OK) return dfl_preperr("prompt %s", pid);
    eval_result e;
    er_result_head(&e, pid, turn, "", "ar", "online", "dfl");
    eval_result_from_stats(&e, &gs);
    e.rep = rep;
    if (rep == 0) *n_truth = gs.generated;
    else if ((e.first_mismatch = ref_first_divergence(ids, gs.generated, truth, *n_truth)) >= 0) {
        e.match = 0; /* the same seeded run twice: anything else is a fault */
        r->res.mismatches++;
        er_log(r,
               "\ndfl eval: MISMATCH prompt %s turn %d: autoregressive repetition %d differs from the first "
               "run at token %d\n",
               pid, turn + 1, rep + 1, e.first_mismatch);
    }
    return er_write_result(r, &e, ids, gs.generated);
}

/* Drafter d in mode mi on the target, its output checked against the truth (greedy). */
static int run_spec(run *r, const char *pid, int turn, int rep, int d, int mi, const int32_t *pids, int np,
                    const dfl_gen_opts *go, const int32_t *truth, int n_truth, int32_t *out, double *last_tau) {
    const eval_opts *o = r->o;
    char mode[32];
    er_mode_name(o->budgets[mi], mode, sizeof mode);
    target_state_reset(&r->st);
    dfl_draft_if dif = r->dif[d];
    dif.reset(dif.ctx);
    dfl_gen_opts so = *go;
    so.block = r->block[d];
    so.tree_budget = o->budgets[mi];
    so.on_round = er_on_round, so.on_round_ud = r, so.on_round_no_draft = 1;
    r->n_acc = 0;
    dfl_gen_stats gs;
    if (spec_generate(&r->st, &dif, pids, np, &so, out, &gs, NULL, NULL) != DFL_OK)
        return dfl_preperr("prompt %s, drafter %s, %s", pid, r->label[d], mode);
    eval_result e;
    er_result_head(&e, pid, turn, r->label[d], mode, "online", "dfl");
    eval_result_from_stats(&e, &gs);
    e.rep = rep;
    e.round_acc = r->acc, e.n_round_acc = r->n_acc;
    if (o->temperature <= 0) {
        e.first_mismatch = ref_first_divergence(out, gs.generated, truth, n_truth);
        e.match = e.first_mismatch < 0;
        if (!e.match) {
            r->res.mismatches++;
            er_log(r,
                   "\ndfl eval: MISMATCH prompt %s turn %d, drafter %s, %s: the speculative output differs from "
                   "the autoregressive one at token %d\n",
                   pid, turn + 1, r->label[d], mode, e.first_mismatch);
        }
    }
    if (er_write_result(r, &e, out, gs.generated)) return DFL_ERR;
    if (rep == 0) *last_tau = gs.rounds ? (double)(gs.generated - 1) / gs.rounds : 0;
    return DFL_OK;
}

/* An online turn: the runs its plan lacks; truth: the autoregressive output (run, or read back). */
int er_unit_online(run *r, const char *pid, int turn, const turn_plan *tp, const int32_t *pids, int np, int32_t *truth,
                   int *n_truth, int32_t *out, double *last_tau) {
    const eval_opts *o = r->o;
    const dfl_gen_opts go = {.max_new = r->max_new,
                             .temperature = (float)o->temperature,
                             .seed = (uint64_t)o->seed,
                             .accept_rule = (dfl_accept_rule)o->accept_rule,
                             .top_k = o->top_k,
                             .top_p = (float)o->top_p};
    /* --repeat: every run of the prompt again, in the same order (the autoregressive one, then each
     * drafter x mode), so that each repetition's speedup compares runs made close in time */
    for (int rep = 0; rep < o->repeat; rep++) {
        if (rep == 0 && tp->truth_row >= 0) er_truth_ids(r, tp, pid, turn, truth, n_truth);
        else if (tp->ar_rep[rep] && run_ar(r, pid, turn, rep, pids, np, &go, truth, n_truth, out)) return DFL_ERR;
        /* the reference is compared on every run, so that its counts cover every prompt */
        if (rep == 0 && er_check_reference(r, pid, turn, pids, np, truth, *n_truth)) return DFL_ERR;
        for (int d = 0; d < o->n_drafters; d++)
            for (int mi = 0; mi < o->n_modes; mi++)
                if (tp->spec[rep * EVAL_MAX_DRAFTERS + d] >> mi & 1 &&
                    run_spec(r, pid, turn, rep, d, mi, pids, np, &go, truth, *n_truth, out, last_tau))
                    return DFL_ERR;
    }
    return DFL_OK;
}
