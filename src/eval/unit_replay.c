/* A replay unit: the truth recorded (or read back), then every drafter x mode replayed on it, the
 * pipeline's features and the training metrics: the rows its plan lacks. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/kernels.h"
#include "eval/features.h"
#include "eval/run.h"

/* Modeled decode time of an online run's rounds: its measured drafting plus the verification
 * cost of each round's size (round_acc tells nothing about sizes, so the mode's block or tree). */
static void model_online(const run *r, eval_result *e, const dfl_gen_stats *gs, int block, int budget) {
    if (!r->costs.ok) return;
    const double c1 = eval_cost_chain(&r->costs, 1);
    e->modeled_ar_s = c1 * (gs->generated - 1);
    const double cv = budget ? eval_cost_tree(&r->costs, budget) : eval_cost_chain(&r->costs, block);
    if (cv < 0) return;
    const long drafted_rounds = gs->pos_drafted[1]; /* the others are plain decode steps */
    e->modeled_s = gs->t_draft + drafted_rounds * cv + (gs->rounds - drafted_rounds) * c1;
}

/* The replay rows of drafter d on truth t that todo asks for (a bit per mode), from outs
 * [n_modes] (freed here). */
static int write_rows(run *r, const char *pid, int turn, int d, const eval_truth *t, const char *features,
                      uint16_t todo, eval_replay_out *outs, double *last_tau) {
    const eval_opts *o = r->o;
    int rc = DFL_OK;
    for (int mi = 0; mi < o->n_modes; mi++) {
        char mode[32];
        er_mode_name(o->budgets[mi], mode, sizeof mode);
        if (rc == DFL_OK && todo >> mi & 1) {
            eval_result e;
            er_result_head(&e, pid, turn, r->label[d], mode, "replay", features);
            eval_result_from_stats(&e, &outs[mi].st);
            e.time_s = e.verify_s = e.rollback_s = e.prefill_s = 0; /* nothing of it ran on the target */
            e.draft_s = outs[mi].draft_s;
            e.modeled_s = outs[mi].modeled_s;
            e.modeled_ar_s = outs[mi].modeled_s >= 0 ? eval_cost_chain(&r->costs, 1) * (t->n - 1) : -1;
            e.round_acc = outs[mi].round_acc, e.n_round_acc = outs[mi].st.rounds;
            rc = er_write_result(r, &e, NULL, 0);
            *last_tau = e.rounds ? (double)(e.tokens - 1) / e.rounds : 0;
        }
        eval_replay_out_free(&outs[mi]);
    }
    return rc;
}

/* Replay every drafter x mode the plan lacks (todo: a bit per mode, per drafter) on t at once;
 * features: "dfl" or "pipeline". */
static int replay_all(run *r, const char *pid, int turn, const eval_truth *t, const char *features,
                      const uint16_t *todo, double *last_tau) {
    const eval_opts *o = r->o;
    eval_replay_out outs[EVAL_MAX_MODES];
    for (int d = 0; d < o->n_drafters; d++) {
        if (!todo[d]) continue;
        eval_draft_cache_clear(&r->cache[d]);
        r->dif[d].reset(r->dif[d].ctx);
        if (eval_replay(t, &r->dif[d], r->m.cfg.vocab, r->col[d], r->block[d], r->max_new, o->budgets, o->n_modes,
                        &r->cache[d], &r->costs, outs) != DFL_OK)
            return dfl_preperr("prompt %s turn %d, drafter %s, replay", pid, turn + 1, r->label[d]);
        if (write_rows(r, pid, turn, d, t, features, todo[d], outs, last_tau)) return DFL_ERR;
    }
    return DFL_OK;
}

/* ---- batched replay (--replay-batch) ------------------------------------------------------ */

static void pend_free(pend_replay *p) {
    free(p->pid);
    eval_truth_free(&p->t);
    if (p->own_cache0) eval_draft_cache_free(&p->cache0);
    memset(p, 0, sizeof *p);
}

void er_replay_free(run *r) {
    for (int k = 0; k < r->n_pend; k++) pend_free(&r->pend[k]);
    free(r->pend);
    for (int d = 0; d < EVAL_MAX_DRAFTERS; d++) {
        for (int k = 0; k < r->n_xst[d]; k++) drafter_state_free(&r->xst[d][k]);
        free(r->xst[d]), free(r->xdif[d]);
    }
    for (int k = 0; k < r->n_bcache; k++) eval_draft_cache_free(&r->bcache[k]);
    free(r->bcache);
}

/* Put truth t of (pid, turn) into the batch, its rows todo; t is left empty (its layers kept)
 * and *held is where it went (t itself when nothing waits for a replay). keep_cache0: r->cache[0]
 * holds the recording's drafts of drafter 0 on t, which go along. */
static int replay_defer(run *r, const char *pid, int turn, eval_truth *t, const uint16_t *todo, int keep_cache0,
                        const eval_truth **held) {
    int any = 0;
    *held = t;
    for (int d = 0; d < r->o->n_drafters; d++) any |= todo[d] != 0;
    if (!any) return DFL_OK;
    pend_replay *p = &r->pend[r->n_pend];
    memset(p, 0, sizeof *p);
    if (!(p->pid = strdup(pid))) return dfl_seterr("out of memory");
    p->turn = turn;
    memcpy(p->todo, todo, sizeof p->todo);
    p->t = *t;
    *held = &p->t;
    r->n_pend++;
    if (eval_truth_init(t, r->m.cfg.hidden, r->layers, r->n_layers)) return DFL_ERR;
    if (keep_cache0 && todo[0]) { /* the recording's cache goes with its truth, drafter 0 gets a new one */
        p->cache0 = r->cache[0], p->own_cache0 = 1;
        if (eval_draft_cache_init(&r->cache[0], r->max_budget, r->m.cfg.vocab, r->block[0])) return DFL_ERR;
    }
    return DFL_OK;
}

/* Drafter d over the waiting truths that need it, outs [n_pend][n_modes]: in one lockstep batch
 * where the drafter has a context per slot, else one truth after the other. */
static int replay_drafter(run *r, int d, eval_replay_out *outs) {
    const eval_opts *o = r->o;
    eval_replay_job jobs[EVAL_MAX_REPLAY_BATCH];
    int who[EVAL_MAX_REPLAY_BATCH], nj = 0;
    for (int k = 0; k < r->n_pend; k++) {
        pend_replay *p = &r->pend[k];
        if (!p->todo[d]) continue;
        const int slot = r->xst[d] ? nj : 0;
        eval_draft_cache *c = d == 0 && p->own_cache0 ? &p->cache0 : &r->bcache[nj];
        if (c != &p->cache0) eval_draft_cache_clear(c);
        jobs[nj] = (eval_replay_job){.t = &p->t,
                                     .dft = slot ? &r->xdif[d][slot - 1] : &r->dif[d],
                                     .cache = c,
                                     .out = outs + (size_t)k * o->n_modes};
        who[nj++] = k;
    }
    for (int j0 = 0, j1; j0 < nj; j0 = j1) {
        j1 = r->xst[d] ? nj : j0 + 1;
        for (int j = j0; j < j1; j++) jobs[j].dft->reset(jobs[j].dft->ctx);
        if (eval_replay_many(jobs + j0, j1 - j0, r->m.cfg.vocab, r->col[d], r->block[d], r->max_new, o->budgets,
                             o->n_modes, &r->costs) != DFL_OK) {
            const pend_replay *p = &r->pend[who[j0]];
            if (j1 - j0 == 1)
                return dfl_preperr("prompt %s turn %d, drafter %s, replay", p->pid, p->turn + 1, r->label[d]);
            return dfl_preperr("prompts %s turn %d and %d others, drafter %s, replay", p->pid, p->turn + 1, j1 - j0 - 1,
                               r->label[d]);
        }
    }
    return DFL_OK;
}

int er_replay_flush(run *r) {
    const eval_opts *o = r->o;
    if (r->n_pend == 0) return DFL_OK;
    eval_replay_out *outs = calloc((size_t)r->n_pend * o->n_drafters * o->n_modes, sizeof *outs);
    if (!outs) return dfl_seterr("out of memory");
    int rc = DFL_OK, done = 0;
    for (int d = 0; d < o->n_drafters && rc == DFL_OK; d++, done = d)
        rc = replay_drafter(r, d, outs + (size_t)d * r->n_pend * o->n_modes);
    /* the rows in the order of the truths, then of the drafters, as one at a time writes them */
    for (int k = 0; k < r->n_pend; k++)
        for (int d = 0; d < o->n_drafters; d++) {
            eval_replay_out *ko = outs + ((size_t)d * r->n_pend + k) * o->n_modes;
            const pend_replay *p = &r->pend[k];
            double tau;
            if (rc == DFL_OK && d < done && p->todo[d])
                rc = write_rows(r, p->pid, p->turn, d, &p->t, "dfl", p->todo[d], ko, &tau);
            for (int mi = 0; mi < o->n_modes; mi++) eval_replay_out_free(&ko[mi]);
        }
    free(outs);
    for (int k = 0; k < r->n_pend; k++) pend_free(&r->pend[k]);
    r->n_pend = 0;
    return rc;
}

/* A pipeline's features for this unit (--features-from), replayed against the same truth (and
 * scored by the training metrics, with the target's distribution tt, when asked). */
static int replay_pipeline(run *r, const char *pid, int turn, int index, const turn_plan *tp, const eval_truth *t,
                           const tm_target *tt, double *last_tau) {
    const eval_opts *o = r->o;
    char name[64];
    eval_features_name(index, turn, name, sizeof name);
    char *path = dfl_is_dir(o->features_from) ? dfl_path_join(o->features_from, name) : strdup(o->features_from);
    eval_truth pt;
    unsigned char absent[EVAL_MAX_FEAT_LAYERS] = {0};
    int rc = eval_truth_init(&pt, t->H, r->layers, r->n_layers);
    /* the target's last layer, held for its distribution, is the pipeline's to give only if a drafter reads it */
    if (rc == DFL_OK) rc = eval_features_load_pipeline(path, t, &pt, r->last_optional, absent);
    if (rc == DFL_OK && r->fcf) {
        eval_feat_check c[EVAL_MAX_FEAT_LAYERS];
        eval_features_check(t, &pt, absent, &r->m, c);
        eval_feat_check_write(r->fcf, pid, turn, c, pt.n_layers);
        if (fflush(r->fcf) != 0) rc = dfl_seterr("%s/features_check.jsonl: write error: %s", o->out, strerror(errno));
    }
    if (rc == DFL_OK && (rc = replay_all(r, pid, turn, &pt, "pipeline", tp->replay[1], last_tau)) != DFL_OK)
        dfl_preperr("on the pipeline's features %s", path);
    if (rc == DFL_OK && o->train_metrics &&
        (rc = er_train_truth(r, pid, turn, &pt, "target", "pipeline", tt, tp->train[TR_PIPELINE])) != DFL_OK)
        dfl_preperr("on the pipeline's features %s", path);
    eval_truth_free(&pt);
    free(path);
    return rc;
}

/* After a truth's own replay: the pipeline's features and the training metrics (p: the prompt,
 * NULL for a saved truth). */
static int replay_more(run *r, const eval_prompt *p, const char *pid, int turn, int index, const turn_plan *tp,
                       const eval_truth *t, double *last_tau) {
    const eval_opts *o = r->o;
    tm_target tt = {0};
    int rc = DFL_OK;
    if (o->train_metrics && r->last_col >= 0) rc = tm_target_from_truth(&tt, t, r->last_col, &r->m, o->train_topk);
    const tm_target *ttp = tt.n ? &tt : NULL;
    if (rc == DFL_OK && o->features_from) rc = replay_pipeline(r, pid, turn, index, tp, t, ttp, last_tau);
    if (rc == DFL_OK && o->train_metrics) rc = er_train_unit(r, p, pid, turn, tp, t, ttp);
    tm_target_free(&tt);
    return rc;
}

/* --check-ar: the autoregressive run, the truth checked token for token (continuation too) and
 * the verdict put on the recording's row e; the run's own row written when the plan lacks it. */
static int check_ar(run *r, const char *pid, int turn, const turn_plan *tp, const int32_t *pids, int np,
                    const eval_truth *t, eval_result *e) {
    int32_t *ar = malloc((size_t)r->max_new * sizeof *ar);
    dfl_gen_opts go = {.max_new = r->max_new, .extend = r->max_block - 1};
    dfl_gen_stats as;
    target_state_reset(&r->st);
    if (!ar || spec_generate(&r->st, NULL, pids, np, &go, ar, &as, NULL, NULL) != DFL_OK) {
        free(ar);
        return dfl_preperr("prompt %s turn %d, autoregressive run", pid, turn + 1);
    }
    const int na = as.generated + as.extended, nt = t->n + t->n_ext;
    e->first_mismatch = ref_first_divergence(t->ids, nt < na ? nt : na, ar, nt < na ? nt : na);
    if (e->first_mismatch < 0 && as.generated != t->n) e->first_mismatch = as.generated < t->n ? as.generated : t->n;
    e->match = e->first_mismatch < 0;
    if (!e->match) {
        r->res.mismatches++;
        er_log(r,
               "\ndfl eval: MISMATCH prompt %s turn %d: the recording run (drafter %s, %s) differs from the "
               "autoregressive one at token %d\n",
               pid, turn + 1, r->label[0], e->mode, e->first_mismatch);
    }
    int rc = DFL_OK;
    if (tp->ar) {
        eval_result a;
        er_result_head(&a, pid, turn, "", "ar", "online", "dfl");
        eval_result_from_stats(&a, &as);
        rc = er_write_result(r, &a, ar, as.generated);
    }
    free(ar);
    return rc;
}

/* Record a truth: drafter 0 in the recording mode, capturing every layer the drafters read
 * (and --save-layers); its online row is written when the plan lacks it. */
static int record(run *r, const char *pid, int turn, const turn_plan *tp, const int32_t *pids, int np, eval_truth *t,
                  int32_t *out, double *last_tau) {
    eval_recorder rec;
    char mode[32];
    const char *method = er_rec_row(r, mode, sizeof mode);
    eval_truth_free(t);
    eval_draft_cache_clear(&r->cache[0]);
    target_state_reset(&r->st);
    r->dif[0].reset(r->dif[0].ctx);
    if (eval_recorder_init(&rec, r->dif[0], t, &r->cache[0], r->m.cfg.vocab)) return DFL_ERR;
    if (r->rec_auto) eval_recorder_adapt(&rec, &r->costs, r->block[0]);
    dfl_draft_if dif = eval_recorder_if(&rec);
    dfl_gen_opts so = {.max_new = r->max_new,
                       .block = r->block[0],
                       .tree_budget = r->rec_budget,
                       .extend = r->max_block - 1,
                       .on_round = er_on_round,
                       .on_round_ud = r,
                       .on_round_no_draft = 1};
    dfl_gen_stats gs;
    r->n_acc = 0;
    rec.n_prompt = np;
    int rc = spec_generate(&r->st, &dif, pids, np, &so, out, &gs, NULL, NULL);
    /* the online figures without the recording's own copies and summaries */
    gs.t_draft -= rec.overhead_s, gs.t_decode -= rec.overhead_s, gs.t_prefill -= rec.overhead_prefill_s;
    eval_recorder_free(&rec);
    if (rc) return dfl_preperr("prompt %s turn %d, recording with drafter %s, %s", pid, turn + 1, r->label[0], mode);
    if (eval_truth_set(t, pids, np, out, gs.generated, gs.extended, strcmp(gs.stop, "eos") == 0))
        return dfl_preperr("prompt %s turn %d", pid, turn + 1);
    eval_result e;
    er_result_head(&e, pid, turn, r->label[0], mode, method, "dfl");
    eval_result_from_stats(&e, &gs);
    e.round_acc = r->acc, e.n_round_acc = r->n_acc;
    if (!r->rec_auto) model_online(r, &e, &gs, r->block[0], r->rec_budget);
    *last_tau = gs.rounds ? (double)(gs.generated - 1) / gs.rounds : 0;
    if (r->o->check_ar && check_ar(r, pid, turn, tp, pids, np, t, &e)) return DFL_ERR;
    return tp->rec ? er_write_result(r, &e, t->ids, t->n) : DFL_OK;
}

/* A replay turn of prompt p: the truth recorded (or the --save-features one resumed), then what
 * its plan lacks; complete, only its truth read back (an MT-Bench second turn is built on it). */
int er_unit_replay(run *r, const eval_prompt *p, int index, int turn, const turn_plan *tp, const int32_t *pids, int np,
                   unit_bufs *b, int *n_truth, double *last_tau) {
    const eval_opts *o = r->o;
    if (tp->complete) return er_truth_ids(r, tp, p->id, turn, b->truth, n_truth);
    eval_truth *t = &b->t;
    int recorded = 0;
    if (tp->saved >= 0) {
        const mf_entry *saved = &r->saved.u[tp->saved];
        if (er_truth_load(r, o->save_features, saved, t)) return DFL_ERR;
        if (t->n_prompt != np || memcmp(t->prompt, pids, (size_t)np * sizeof *pids) != 0)
            return dfl_seterr("%s/%s: recorded from other prompt ids than prompt %s turn %d has now (another prompt "
                              "file, --chat or tokenizer?)",
                              o->save_features, saved->file, p->id, turn + 1);
        /* resumed: the saved truth; its online rows are there unless a crash fell in between */
        if (tp->rec || tp->ar) {
            if (record(r, p->id, turn, tp, pids, np, t, b->out, last_tau)) return DFL_ERR;
            recorded = 1;
        }
    } else {
        if (record(r, p->id, turn, tp, pids, np, t, b->out, last_tau)) return DFL_ERR;
        recorded = 1;
        if (o->save_features && er_truth_save(r, p->id, turn, index, t)) return DFL_ERR;
    }
    if (recorded && er_check_reference(r, p->id, turn, pids, np, t->ids, t->n)) return DFL_ERR;
    *n_truth = t->n;
    memcpy(b->truth, t->ids, (size_t)t->n * sizeof *b->truth);
    const eval_truth *held;
    if (replay_defer(r, p->id, turn, t, tp->replay[0], recorded, &held)) return DFL_ERR;
    if (replay_more(r, p, p->id, turn, index, tp, held, last_tau)) return DFL_ERR;
    return r->n_pend >= r->replay_batch ? er_replay_flush(r) : DFL_OK;
}

/* A saved truth (--features): replayed unless every row is there. */
int er_unit_saved(run *r, const work *w, unit_bufs *b, double *last_tau) {
    const turn_plan *tp = &w->turn[0];
    const mf_entry *u = &r->saved.u[w->item];
    if (tp->complete) return DFL_OK;
    int rc = er_truth_load(r, r->o->features_dir, u, &b->t);
    if (rc == DFL_OK) rc = er_check_reference(r, u->prompt_id, u->turn, b->t.prompt, b->t.n_prompt, b->t.ids, b->t.n);
    const eval_truth *held = &b->t;
    if (rc == DFL_OK) rc = replay_defer(r, u->prompt_id, u->turn, &b->t, tp->replay[0], 0, &held);
    if (rc == DFL_OK) rc = replay_more(r, NULL, u->prompt_id, u->turn, u->index, tp, held, last_tau);
    if (rc == DFL_OK && r->n_pend >= r->replay_batch) rc = er_replay_flush(r);
    return rc;
}
