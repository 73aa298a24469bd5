/* Per-response results (results.jsonl lines) and their aggregation: the scalar columns through the
 * columns table (columns.c), the arrays here. */
#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/backend.h"
#include "dfl/common.h"
#include "dfl/eval.h"
#include "dfl/jsonl.h"
#include "columns.h"

void eval_result_init(eval_result *r) {
    memset(r, 0, sizeof *r);
    snprintf(r->method, sizeof r->method, "online");
    snprintf(r->features, sizeof r->features, "dfl");
    r->match = -1;
    r->first_mismatch = -1;
    r->modeled_s = r->modeled_ar_s = -1;
}

int eval_result_act_check(const eval_result *r, int here, const char *where) {
    if (r->act_bf16 == here) return DFL_OK;
    return dfl_seterr("%s: computed with %s activations, this run uses %s (DFL_ACT): results of both modes must not "
                      "mix in one evaluation",
                      where, r->act_bf16 ? "bf16" : "f32", here ? "bf16" : "f32");
}

int eval_result_device_check(const eval_result *r, int device, const char *where) {
    if (r->device == device) return DFL_OK;
    return dfl_seterr("%s: the target ran on %s, this run puts it on %s (--device): results of both devices must "
                      "not mix in one evaluation",
                      where, dfl_device_name((dfl_device)r->device), dfl_device_name((dfl_device)device));
}

void eval_result_from_stats(eval_result *r, const dfl_gen_stats *st) {
    r->tokens = st->generated;
    r->rounds = st->rounds;
    r->drafted = st->drafted;
    r->accepted = st->accepted;
    r->max_block = st->max_block;
    memcpy(r->accept_hist, st->accept_hist, sizeof r->accept_hist);
    memcpy(r->pos_drafted, st->pos_drafted, sizeof r->pos_drafted);
    memcpy(r->pos_accepted, st->pos_accepted, sizeof r->pos_accepted);
    r->tree_depth_sum = st->tree_depth_sum;
    r->tree_nodes = st->tree_nodes;
    r->time_s = st->t_decode;
    r->prefill_s = st->t_prefill;
    r->draft_s = st->t_draft;
    r->verify_s = st->t_verify;
    r->rollback_s = st->t_rollback;
}

static void long_array(FILE *f, const char *name, const long *v, int from, int to) {
    fprintf(f, ", \"%s\": [", name);
    for (int i = from; i < to; i++) fprintf(f, "%s%ld", i > from ? ", " : "", v[i]);
    fputc(']', f);
}

void eval_result_write(FILE *f, const eval_result *r, const int32_t *ids, int n_ids) {
    fputc('{', f);
    eval_columns_write(f, r);
    const int B = r->max_block > 0 ? r->max_block : 1;
    long_array(f, "accept_hist", r->accept_hist, 0, B);
    long_array(f, "pos_drafted", r->pos_drafted, 1, B);
    long_array(f, "pos_accepted", r->pos_accepted, 1, B);
    if (r->round_acc) {
        fputs(", \"round_lengths\": [", f);
        for (int i = 0; i < r->n_round_acc; i++) fprintf(f, "%s%d", i ? ", " : "", r->round_acc[i]);
        fputc(']', f);
    }
    if (ids) {
        fputs(", \"output_ids\": [", f);
        for (int i = 0; i < n_ids; i++) fprintf(f, "%s%d", i ? ", " : "", ids[i]);
        fputc(']', f);
    }
    fputc('}', f);
}

static int get_longs(const cJSON *o, const char *k, long *v, int from, int max) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsArray(x) || cJSON_GetArraySize(x) > max - from)
        return dfl_seterr("field '%s' missing or not an array of at most %d integers", k, max - from);
    int i = from;
    const cJSON *e;
    cJSON_ArrayForEach(e, x) {
        double d;
        if (col_int_of(e, 0, RES_MAX_INT, &d))
            return dfl_seterr("field '%s': entry %d is not an integer in [0, %.0f]", k, i - from, RES_MAX_INT);
        v[i++] = (long)d;
    }
    return DFL_OK;
}

/* output_ids into *ids (malloc'd) and *n_ids; nothing when absent or null. */
static int parse_ids(const cJSON *o, int32_t **ids, int *n_ids) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, "output_ids");
    if (!x || cJSON_IsNull(x)) return DFL_OK;
    if (!cJSON_IsArray(x)) return dfl_seterr("field 'output_ids' must be an array of token ids");
    const int n = cJSON_GetArraySize(x);
    int32_t *out = malloc(((size_t)n + 1) * sizeof(int32_t));
    if (!out) return dfl_seterr("out of memory");
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, x) {
        double v;
        if (col_int_of(e, 0, INT_MAX, &v)) {
            free(out);
            return dfl_seterr("output_ids[%d] is not a token id (an integer in [0, %d])", i, INT_MAX);
        }
        out[i++] = (int32_t)v;
    }
    *ids = out;
    *n_ids = n;
    return DFL_OK;
}

/* The arrays as written: block_size acceptance lengths 0..B-1 and draft positions 1..B-1 (B at
 * least 1); output_ids when ids. */
static int parse_arrays(const cJSON *o, eval_result *r, int32_t **ids, int *n_ids) {
    const int B = r->max_block > 0 ? r->max_block : 1;
    if (get_longs(o, "accept_hist", r->accept_hist, 0, B) || get_longs(o, "pos_drafted", r->pos_drafted, 1, B) ||
        get_longs(o, "pos_accepted", r->pos_accepted, 1, B))
        return DFL_ERR;
    return ids ? parse_ids(o, ids, n_ids) : DFL_OK;
}

int eval_result_parse(const char *line, eval_result *r, int32_t **ids, int *n_ids) {
    eval_result_init(r);
    if (ids) {
        *ids = NULL;
        *n_ids = 0;
    }
    cJSON *o = cJSON_ParseWithOpts(line, NULL, 1); /* strictly one object: "{...}{..." is no line */
    if (!o || !cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return dfl_seterr("not a JSON object");
    }
    const int rc = eval_columns_parse(o, r) == DFL_OK && parse_arrays(o, r, ids, n_ids) == DFL_OK ? DFL_OK : DFL_ERR;
    cJSON_Delete(o);
    return rc;
}

int eval_results_read(eval_results *d, FILE *f, const char *path, int want_ids, int act) {
    memset(d, 0, sizeof *d);
    dfl_jsonl in;
    dfl_jsonl_attach(&in, f, path, 0); /* a partial last line, whatever its length: redone */
    int rc = DFL_OK, more;
    while ((more = dfl_jsonl_next(&in)) == 1) {
        const int lineno = in.lineno;
        eval_result *r = realloc(d->r, (size_t)(d->n + 1) * sizeof *d->r);
        if (r) d->r = r;
        int32_t **ids = realloc(d->ids, (size_t)(d->n + 1) * sizeof *d->ids);
        if (ids) d->ids = ids;
        int *n_ids = realloc(d->n_ids, (size_t)(d->n + 1) * sizeof *d->n_ids);
        if (n_ids) d->n_ids = n_ids;
        int *ln = realloc(d->line, (size_t)(d->n + 1) * sizeof *d->line);
        if (ln) d->line = ln;
        if (!r || !ids || !n_ids || !ln) {
            rc = dfl_seterr("%s: out of memory at line %d", path, lineno);
            break;
        }
        d->ids[d->n] = NULL, d->n_ids[d->n] = 0, d->line[d->n] = lineno;
        if (memchr(in.line, 0, in.len)) {
            rc = dfl_seterr("%s:%d: holds a NUL byte (not a results line)", path, lineno);
            break;
        }
        if (eval_result_parse(in.line, &d->r[d->n], want_ids ? &d->ids[d->n] : NULL,
                              want_ids ? &d->n_ids[d->n] : NULL) != DFL_OK) {
            rc = dfl_preperr("%s:%d", path, lineno);
            break;
        }
        char where[4200];
        snprintf(where, sizeof where, "%s:%d", path, lineno);
        if (act >= 0 && (rc = eval_result_act_check(&d->r[d->n], act, where)) != DFL_OK) {
            free(d->ids[d->n]);
            d->ids[d->n] = NULL;
            break;
        }
        d->n++;
    }
    if (more != 1) rc = more == 0 ? DFL_OK : DFL_ERR;
    /* every line kept ends at good_end; a bad line stops the reading before it is counted */
    d->good_end = more == 1 ? in.start : in.good_end;
    dfl_jsonl_close(&in);
    return rc;
}

void eval_results_free(eval_results *d) {
    for (int i = 0; d->ids && i < d->n; i++) free(d->ids[i]);
    free(d->r), free(d->ids), free(d->n_ids), free(d->line);
    memset(d, 0, sizeof *d);
}

static int same_response(const eval_result *a, const eval_result *b) {
    return strcmp(a->prompt_id, b->prompt_id) == 0 && a->turn == b->turn && a->rep == b->rep &&
           strcmp(a->drafter, b->drafter) == 0 && strcmp(a->mode, b->mode) == 0 && strcmp(a->method, b->method) == 0 &&
           strcmp(a->features, b->features) == 0;
}

static int same_row(const eval_agg *a, const eval_result *r) {
    return strcmp(a->drafter, r->drafter) == 0 && strcmp(a->mode, r->mode) == 0 && strcmp(a->method, r->method) == 0 &&
           strcmp(a->features, r->features) == 0;
}

/* With repeated online runs (--repeat): each repetition's speedup over all of its responses
 * (decode time per token of its autoregressive runs / of this row's runs, the same prompts on
 * both sides), index = rep; nothing when the run was not repeated. */
static void run_speedups(eval_agg *a, const eval_result *res, const char *dups, int n) {
    int reps = 0;
    for (int i = 0; i < n; i++)
        if (!dups[i] && same_row(a, &res[i]) && res[i].rep + 1 > reps) reps = res[i].rep + 1;
    if (reps < 2) return;
    a->run_speedups = calloc((size_t)reps, sizeof(double));
    a->n_run_speedups = reps;
    for (int rep = 0; rep < reps; rep++) {
        double t = 0, t_ar = 0;
        long dec = 0, dec_ar = 0;
        for (int i = 0; i < n; i++) {
            const eval_result *r = &res[i];
            if (dups[i] || r->rep != rep || !same_row(a, r)) continue;
            for (int j = 0; j < n; j++) {
                const eval_result *q = &res[j];
                if (dups[j] || q->rep != rep || strcmp(q->mode, "ar") != 0 || q->turn != r->turn ||
                    strcmp(q->prompt_id, r->prompt_id) != 0)
                    continue;
                t += r->time_s, dec += r->tokens - 1;
                t_ar += q->time_s, dec_ar += q->tokens - 1;
                break;
            }
        }
        a->run_speedups[rep] = dec > 0 && dec_ar > 0 && t > 0 && t_ar > 0 ? (t_ar / dec_ar) / (t / dec) : 0;
    }
}

/* Every drafter against the first one of the same mode, method and features, paired over prompts. */
static void compare_drafters(eval_summary *s, const eval_result *res, int n) {
    for (int b = 2; b < s->n_agg; b++) {
        const eval_agg *B = &s->agg[b];
        int a = 1;
        while (a < b && (strcmp(s->agg[a].mode, B->mode) || strcmp(s->agg[a].method, B->method) ||
                         strcmp(s->agg[a].features, B->features)))
            a++;
        if (a == b) continue; /* b is the first of its mode */
        eval_ptau *ta = NULL, *tb = NULL;
        const int na = eval_prompt_taus(res, n, s->agg[a].drafter, B->mode, B->method, B->features, &ta);
        const int nb = eval_prompt_taus(res, n, B->drafter, B->mode, B->method, B->features, &tb);
        eval_cmp *c = na >= 0 && nb >= 0 ? realloc(s->cmp, (size_t)(s->n_cmp + 1) * sizeof *c) : NULL;
        if (c) {
            s->cmp = c;
            c[s->n_cmp].a = a, c[s->n_cmp].b = b;
            eval_paired_compare(ta, na, tb, nb, EVAL_BOOT_RESAMPLES, EVAL_BOOT_SEED, &c[s->n_cmp++].p);
        }
        free(ta), free(tb);
    }
}

int eval_summarize(eval_summary *s, const eval_result *res, int n) {
    memset(s, 0, sizeof *s);
    s->agg = calloc(1, sizeof *s->agg);
    s->n_agg = 1;
    snprintf(s->agg[0].mode, sizeof s->agg[0].mode, "ar");
    int any_replay = 0;
    for (int i = 0; i < n; i++) any_replay |= strcmp(res[i].method, "replay") == 0;
    char(*seen)[300] = calloc((size_t)n + 1, sizeof *seen); /* distinct prompt/turn pairs */
    char *dups = calloc((size_t)n + 1, 1);                  /* a later copy of an earlier response */
    int n_seen = 0;
    for (int i = 0; i < n; i++) {
        const eval_result *r = &res[i];
        int dup = 0;
        for (int j = 0; j < i && !dup; j++) dup = same_response(r, &res[j]);
        dups[i] = (char)dup;
        if (dup || r->rep > 0) continue; /* repetitions only add speedups over runs (below) */
        char key[300];
        snprintf(key, sizeof key, "%d\t%s", r->turn, r->prompt_id);
        int known = 0;
        for (int j = 0; j < n_seen && !known; j++) known = strcmp(seen[j], key) == 0;
        if (!known) memcpy(seen[n_seen++], key, sizeof key);
        if (strcmp(r->method, "record") == 0) continue; /* a recording run that mixed modes: no result of its own */
        int k = 0;
        if (strcmp(r->mode, "ar") != 0) {
            for (k = 1; k < s->n_agg; k++)
                if (same_row(&s->agg[k], r)) break;
            if (k == s->n_agg) {
                s->agg = realloc(s->agg, (size_t)(s->n_agg + 1) * sizeof *s->agg);
                eval_agg *a = &s->agg[k];
                memset(a, 0, sizeof *a);
                snprintf(a->drafter, sizeof a->drafter, "%s", r->drafter);
                snprintf(a->mode, sizeof a->mode, "%s", r->mode);
                snprintf(a->method, sizeof a->method, "%s", r->method);
                snprintf(a->features, sizeof a->features, "%s", r->features);
                snprintf(a->label, sizeof a->label, "%s%s%s", r->drafter,
                         any_replay && strcmp(r->method, "online") == 0 ? " (online)" : "",
                         strcmp(r->features, "pipeline") == 0 ? " (pipeline features)" : "");
                s->n_agg++;
            }
        }
        eval_agg *a = &s->agg[k];
        if (r->modeled_s >= 0 && r->modeled_ar_s >= 0) {
            a->modeled++;
            a->modeled_s += r->modeled_s;
            a->modeled_ar_s += r->modeled_ar_s;
            if (k > 0 && r->modeled_s > 0 && r->modeled_ar_s > 0) {
                a->speedups_modeled =
                    realloc(a->speedups_modeled, (size_t)(a->n_speedups_modeled + 1) * sizeof(double));
                a->speedups_modeled[a->n_speedups_modeled++] = r->modeled_ar_s / r->modeled_s;
            }
        }
        a->resp = realloc(a->resp, (size_t)(a->responses + 1) * sizeof *a->resp);
        const double tau = r->rounds ? (double)(r->tokens - 1) / r->rounds : 1.0;
        eval_resp *e = &a->resp[a->responses++];
        *e = (eval_resp){.line = i, .turn = r->turn, .tokens = r->tokens, .tau = tau};
        snprintf(e->prompt_id, sizeof e->prompt_id, "%s", r->prompt_id);
        a->tau_sum += tau;
        eval_columns_add(a, r);
        /* the arrays are not columns (columns.h) */
        for (int b = 0; b <= DFL_MAX_BLOCK; b++) a->accept_hist[b] += r->accept_hist[b];
        for (int b = 0; b < DFL_MAX_BLOCK; b++)
            a->pos_drafted[b] += r->pos_drafted[b], a->pos_accepted[b] += r->pos_accepted[b];
    }
    s->n_prompts = n_seen;
    for (int i = 0; i < n; i++) s->act_bf16 |= res[i].act_bf16; /* one mode per run: resume and merge check it */
    for (int i = 0; i < n; i++)
        if (res[i].device) s->device = res[i].device; /* one device per run, as well */
    free(seen);
    /* the autoregressive time over the same responses each drafter x mode produced (measured), and
     * per response: AR time per decoded token / this row's time per decoded token (the first token
     * of a response comes from the prefill on both sides, as in eval_agg_speedup) */
    for (int k = 1; k < s->n_agg; k++) {
        eval_agg *a = &s->agg[k];
        if (strcmp(a->method, "online") != 0) continue;
        for (int i = 0; i < n; i++) {
            const eval_result *r = &res[i];
            if (dups[i] || r->rep > 0 || !same_row(a, r)) continue;
            for (int j = 0; j < n; j++)
                if (strcmp(res[j].mode, "ar") == 0 && res[j].rep == 0 && res[j].turn == r->turn &&
                    strcmp(res[j].prompt_id, r->prompt_id) == 0) {
                    const eval_result *q = &res[j];
                    a->ar_time_s += q->time_s;
                    a->ar_tokens += q->tokens;
                    if (r->tokens > 1 && q->tokens > 1 && r->time_s > 0 && q->time_s > 0) {
                        a->speedups = realloc(a->speedups, (size_t)(a->n_speedups + 1) * sizeof(double));
                        a->speedups[a->n_speedups++] = (q->time_s / (q->tokens - 1)) / (r->time_s / (r->tokens - 1));
                    }
                    break;
                }
        }
        run_speedups(a, res, dups, n);
    }
    free(dups);
    compare_drafters(s, res, n);
    return DFL_OK;
}

void eval_summary_free(eval_summary *s) {
    for (int k = 0; k < s->n_agg; k++) {
        free(s->agg[k].resp);
        free(s->agg[k].speedups);
        free(s->agg[k].speedups_modeled);
        free(s->agg[k].run_speedups);
    }
    free(s->agg);
    free(s->cmp);
    memset(s, 0, sizeof *s);
}

static int cmp_key(const void *x, const void *y, void *ctx) {
    const eval_result *res = ctx;
    const eval_result *a = &res[*(const int *)x], *b = &res[*(const int *)y];
    return a->turn != b->turn ? a->turn - b->turn : strcmp(a->prompt_id, b->prompt_id);
}

/* The output ids of response i: its own, else those of a first-run row of its prompt and turn
 * (withids: the indices of the rows with ids, sorted by turn and prompt). */
static const int32_t *output_of(const eval_result *res, int32_t *const *ids, const int *n_ids, const int *withids,
                                int nw, int i, int *len) {
    if (ids[i]) return *len = n_ids[i], ids[i];
    int lo = 0, hi = nw;
    while (lo < hi) { /* the first row of this turn and prompt */
        const int mid = (lo + hi) / 2, c = cmp_key(&withids[mid], &i, (void *)res);
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    for (; lo < nw && cmp_key(&withids[lo], &i, (void *)res) == 0; lo++)
        if (res[withids[lo]].rep == 0) return *len = n_ids[withids[lo]], ids[withids[lo]];
    return *len = 0, NULL;
}

void eval_summary_outputs(eval_summary *s, const eval_result *res, int32_t *const *ids, const int *n_ids, int n,
                          int max_new) {
    s->max_new = max_new;
    int *withids = malloc(((size_t)n + 1) * sizeof *withids), nw = 0;
    for (int i = 0; withids && ids && i < n; i++)
        if (ids[i]) withids[nw++] = i;
    if (withids) qsort_r(withids, (size_t)nw, sizeof *withids, cmp_key, (void *)res);
    for (int k = 1; k < s->n_agg; k++)
        for (int i = 0; i < s->agg[k].responses; i++) {
            eval_resp *e = &s->agg[k].resp[i];
            int len = 0;
            const int32_t *out = withids && ids ? output_of(res, ids, n_ids, withids, nw, e->line, &len) : NULL;
            e->capped = max_new > 0 && e->tokens >= max_new;
            e->loop = out ? eval_output_loops(out, len) : 0;
        }
    free(withids);
}

double eval_agg_tau(const eval_agg *a) { return a->responses ? a->tau_sum / a->responses : 0; }

double eval_agg_tau_tokens(const eval_agg *a) { return a->rounds ? (double)(a->tokens - a->responses) / a->rounds : 0; }

double eval_agg_speedup_modeled(const eval_agg *a) {
    if (a->modeled == 0 || a->modeled != a->responses || a->modeled_s <= 0) return 0;
    return a->modeled_ar_s / a->modeled_s;
}

double eval_agg_speedup(const eval_agg *a) {
    /* time per decoded token: the first token of each response comes from the prefill */
    const int dec = a->tokens - a->responses, ar_dec = a->ar_tokens - a->responses;
    if (dec <= 0 || ar_dec <= 0 || a->time_s <= 0 || a->ar_time_s <= 0) return 0;
    return (a->ar_time_s / ar_dec) / (a->time_s / dec);
}

static int cmp_double(const void *x, const void *y) {
    const double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int eval_spread(const double *v, int n, double q[3]) {
    if (n < 2) return -1;
    double *c = malloc((size_t)n * sizeof *c);
    if (!c) return -1;
    memcpy(c, v, (size_t)n * sizeof *c);
    qsort(c, (size_t)n, sizeof *c, cmp_double);
    static const double at[3] = {0.1, 0.5, 0.9};
    for (int i = 0; i < 3; i++) {
        const double h = at[i] * (n - 1);
        const int lo = (int)floor(h), hi = lo + 1 < n ? lo + 1 : lo;
        q[i] = c[lo] + (h - lo) * (c[hi] - c[lo]);
    }
    free(c);
    return 0;
}
