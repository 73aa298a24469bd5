/* Resume as one plan (src/eval/run.h): before any computing, what results.jsonl (and train.jsonl)
 * lacks of each unit; the units and what they hold handed to the processes of a spread run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/kernels.h"
#include "eval/run.h"

/* results.jsonl's complete lines, each on this run's device (good_end: where an interrupted
 * write left a partial line). */
int er_done_load(eval_results *d, const char *path, int device) {
    memset(d, 0, sizeof *d);
    FILE *f = fopen(path, "r");
    if (!f) return DFL_OK;
    int rc = eval_results_read(d, f, path, 1, kn_act_get() == KN_ACT_BF16);
    for (int i = 0; rc == DFL_OK && i < d->n; i++) { /* and on one device */
        char where[4200];
        snprintf(where, sizeof where, "%s:%d", path, d->line[i]);
        rc = eval_result_device_check(&d->r[i], device, where);
    }
    fclose(f);
    return rc;
}

/* Results lines handed over with a unit (a run spread over processes): added as if read back. */
int er_done_add_text(eval_results *d, const char *text, int device) {
    while (*text) {
        const char *nl = strchr(text, '\n');
        const size_t n = nl ? (size_t)(nl - text) : strlen(text);
        if (n) {
            char *line = strndup(text, n);
            d->r = realloc(d->r, (size_t)(d->n + 1) * sizeof *d->r);
            d->ids = realloc(d->ids, (size_t)(d->n + 1) * sizeof *d->ids);
            d->n_ids = realloc(d->n_ids, (size_t)(d->n + 1) * sizeof *d->n_ids);
            d->line = realloc(d->line, (size_t)(d->n + 1) * sizeof *d->line);
            d->line[d->n] = 0;
            int rc = line ? eval_result_parse(line, &d->r[d->n], &d->ids[d->n], &d->n_ids[d->n]) : DFL_ERR;
            free(line);
            if (rc != DFL_OK) return dfl_preperr("a results line handed over with a unit");
            rc = eval_result_act_check(&d->r[d->n], kn_act_get() == KN_ACT_BF16,
                                       "a results line handed over with a unit");
            if (rc == DFL_OK)
                rc = eval_result_device_check(&d->r[d->n], device, "a results line handed over with a unit");
            if (rc != DFL_OK) {
                free(d->ids[d->n]);
                return rc;
            }
            d->n++;
        }
        text += n + (nl != NULL);
    }
    return DFL_OK;
}

/* The lines held for a prompt (every turn), as results.jsonl has them: for another process. */
static char *done_text(const eval_results *d, const char *pid) {
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    if (!m) return NULL;
    for (int i = 0; i < d->n; i++)
        if (strcmp(d->r[i].prompt_id, pid) == 0) {
            eval_result_write(m, &d->r[i], d->ids[i], d->n_ids[i]);
            fputc('\n', m);
        }
    return fclose(m) == 0 ? buf : NULL;
}

/* The row of a response of repetition rep (--repeat; 0 is the first run), -1 if not there. */
static int done_find_rep(const eval_results *d, const char *pid, int turn, const char *drafter, const char *mode,
                         const char *method, const char *features, int rep) {
    for (int i = 0; i < d->n; i++)
        if (d->r[i].turn == turn && d->r[i].rep == rep && strcmp(d->r[i].prompt_id, pid) == 0 &&
            strcmp(d->r[i].drafter, drafter) == 0 && strcmp(d->r[i].mode, mode) == 0 &&
            strcmp(d->r[i].method, method) == 0 && strcmp(d->r[i].features, features) == 0)
            return i;
    return -1;
}

static int done_find(const eval_results *d, const char *pid, int turn, const char *drafter, const char *mode,
                     const char *method, const char *features) {
    return done_find_rep(d, pid, turn, drafter, mode, method, features, 0);
}

/* A replay turn: the recording run's rows (not from saved truths), each drafter x mode replayed
 * on dfl's features and the pipeline's, the train.jsonl rows; complete when the rows that end a
 * unit are there (the training metrics on the truth's own labels come last). */
static void plan_replay(const run *r, const char *pid, int turn, int index, turn_plan *tp) {
    const eval_opts *o = r->o;
    char mode[32];
    const char *method = er_rec_row(r, mode, sizeof mode);
    const int rec = r->from_features ? -1 : done_find(&r->done, pid, turn, r->label[0], mode, method, "dfl");
    const int ar = r->from_features ? -1 : done_find(&r->done, pid, turn, "", "ar", "online", "dfl");
    tp->rec = !r->from_features && rec < 0;
    tp->ar = !r->from_features && o->check_ar && ar < 0;
    tp->truth_row = rec >= 0 && r->done.ids[rec] ? rec : ar >= 0 && r->done.ids[ar] ? ar : -1;
    tp->saved = o->save_features ? er_manifest_find(&r->saved, index, turn) : -1;
    int missing = tp->rec || tp->ar;
    for (int d = 0; d < o->n_drafters; d++) {
        const char *lab = r->label[d];
        for (int mi = 0; mi < o->n_modes; mi++) {
            er_mode_name(o->budgets[mi], mode, sizeof mode);
            tp->replay[0][d] |= (done_find(&r->done, pid, turn, lab, mode, "replay", "dfl") < 0) << mi;
            if (o->features_from)
                tp->replay[1][d] |= (done_find(&r->done, pid, turn, lab, mode, "replay", "pipeline") < 0) << mi;
        }
        missing |= tp->replay[0][d] || tp->replay[1][d];
        if (!o->train_metrics) continue;
        tp->train[TR_TARGET][d] = !tm_run_has(&r->tm, pid, turn, lab, "target", "dfl", "config");
        tp->train[TR_DATASET][d] = !tm_run_has(&r->tm, pid, turn, lab, "dataset", "dfl", "config");
        tp->train[TR_TEMPLATE][d] = !tm_run_has(&r->tm, pid, turn, lab, "template", "dfl", "config");
        tp->train[TR_PIPELINE][d] = !tm_run_has(&r->tm, pid, turn, lab, "target", "pipeline", "config");
        tp->train[TR_ATTN][d] =
            o->train_attn != EVAL_TRAIN_ATTN_NONE &&
            !tm_run_has(&r->tm, pid, turn, lab, "target", "dfl", drafter_causal_name(o->train_attn));
        missing |= tp->train[TR_TARGET][d];
    }
    tp->complete = !missing;
}

/* An online turn, every repetition: the autoregressive run (whose output is the turn's truth)
 * and each drafter x mode. */
static int plan_online(const run *r, const char *pid, int turn, turn_plan *tp) {
    const eval_opts *o = r->o;
    tp->ar_rep = calloc((size_t)o->repeat, sizeof *tp->ar_rep);
    tp->spec = calloc((size_t)o->repeat * EVAL_MAX_DRAFTERS, sizeof *tp->spec);
    if (!tp->ar_rep || !tp->spec) return dfl_seterr("out of memory");
    int missing = 0;
    for (int rep = 0; rep < o->repeat; rep++) {
        const int k = done_find_rep(&r->done, pid, turn, "", "ar", "online", "dfl", rep);
        if (rep == 0) tp->truth_row = k >= 0 && r->done.ids[k] ? k : -1;
        missing |= tp->ar_rep[rep] = k < 0;
        for (int d = 0; d < o->n_drafters; d++) {
            uint16_t *bits = &tp->spec[rep * EVAL_MAX_DRAFTERS + d];
            for (int mi = 0; mi < o->n_modes; mi++) {
                char mode[32];
                er_mode_name(o->budgets[mi], mode, sizeof mode);
                *bits |= (done_find_rep(&r->done, pid, turn, r->label[d], mode, "online", "dfl", rep) < 0) << mi;
            }
            missing |= *bits != 0;
        }
    }
    tp->complete = !missing;
    return DFL_OK;
}

/* w's rows as not yet planned. */
static void work_clear(work *w) {
    for (int t = 0; t < 2; t++) free(w->turn[t].ar_rep), free(w->turn[t].spec);
    memset(w->turn, 0, sizeof w->turn);
}

/* What results.jsonl (and train.jsonl) lacks of unit w: its plan, made again from scratch. */
int er_plan_unit(const run *r, work *w) {
    work_clear(w);
    if (r->from_features) {
        const mf_entry *u = &r->saved.u[w->item];
        w->n_turns = 1;
        plan_replay(r, u->prompt_id, u->turn, u->index, &w->turn[0]);
        return DFL_OK;
    }
    const eval_prompt *p = &r->ps.p[w->item];
    w->n_turns = r->o->first_turn ? 1 : p->n_turns;
    for (int t = 0; t < w->n_turns; t++) {
        if (!r->replay) {
            if (plan_online(r, p->id, t, &w->turn[t])) return DFL_ERR;
        } else {
            plan_replay(r, p->id, t, w->item, &w->turn[t]);
        }
    }
    return DFL_OK;
}

void er_plan_free(run *r) {
    for (int k = 0; k < r->n_plan; k++) work_clear(&r->plan[k]);
    free(r->plan);
    r->plan = NULL, r->n_plan = 0;
}

static int work_complete(const work *w) {
    for (int t = 0; t < w->n_turns; t++)
        if (!w->turn[t].complete) return 0;
    return 1;
}

/* Every row of every unit is in results.jsonl already. */
int er_plan_complete(const run *r) {
    for (int k = 0; k < r->n_plan; k++)
        if (!work_complete(&r->plan[k])) return 0;
    return 1;
}

/* The truth ids of a turn that does not run (for an MT-Bench second turn). */
int er_truth_ids(const run *r, const turn_plan *tp, const char *pid, int turn, int32_t *truth, int *n) {
    const int k = tp->truth_row;
    if (k < 0) return dfl_seterr("prompt %s turn %d: no output ids in %s", pid, turn + 1, r->res_path);
    *n = r->done.n_ids[k] < r->max_new ? r->done.n_ids[k] : r->max_new;
    memcpy(truth, r->done.ids[k], (size_t)*n * sizeof(int32_t));
    return DFL_OK;
}

/* Hand the units to the dist: names, weights, whether complete, what results.jsonl holds of each. */
int er_plan_dist(run *r) {
    const eval_opts *o = r->o;
    const int n = r->n_plan;
    char **names = calloc((size_t)n + 1, sizeof *names), **held = calloc((size_t)n + 1, sizeof *held);
    int *complete = calloc((size_t)n + 1, sizeof *complete);
    long *weight = calloc((size_t)n + 1, sizeof *weight);
    int rc = names && held && complete && weight ? DFL_OK : dfl_seterr("out of memory");
    for (int k = 0; k < n && rc == DFL_OK; k++) {
        const work *w = &r->plan[k];
        const char *pid;
        if (r->from_features) {
            const mf_entry *u = &r->saved.u[w->item];
            pid = u->prompt_id;
            names[k] = malloc(strlen(pid) + 16);
            if (names[k]) sprintf(names[k], u->turn ? "%s turn 2" : "%s", pid);
        } else {
            pid = r->ps.p[w->item].id;
            names[k] = strdup(pid);
        }
        complete[k] = work_complete(w), weight[k] = w->weight;
        held[k] = done_text(&r->done, pid);
        if (!names[k] || !held[k]) rc = dfl_seterr("out of memory");
    }
    if (rc == DFL_OK) rc = o->dist->plan(o->dist->ud, n, names, weight, complete, held);
    for (int k = 0; names && held && k < n; k++) free(names[k]), free(held[k]);
    free(names), free(held), free(complete), free(weight);
    return rc;
}
