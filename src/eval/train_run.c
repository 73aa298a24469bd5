/* --train-metrics in an evaluation run: DIR/train.jsonl (a line per response x drafter x label
 * source x features x block attention, appended and flushed as each finishes, resumable) and the
 * "Training vs serving" report built from it (include/dfl/train_metrics.h, src/eval/train_run.h). */
#include "train_run.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dfl/common.h"
#include "dfl/jsonl.h"

static char *row_key(const char *pid, int turn, const char *drafter, const char *labels, const char *features,
                     const char *attn) {
    const size_t n = strlen(pid) + strlen(drafter) + strlen(labels) + strlen(features) + strlen(attn) + 32;
    char *k = malloc(n);
    if (k) snprintf(k, n, "%s\t%d\t%s\t%s\t%s\t%s", pid, turn, drafter, labels, features, attn);
    return k;
}

static int keys_add(tm_run *tr, char *k) {
    if (!k) return dfl_seterr("out of memory");
    if (tr->n_keys == tr->cap_keys) {
        const int cap = tr->cap_keys ? 2 * tr->cap_keys : 64;
        char **p = realloc(tr->keys, (size_t)cap * sizeof *p);
        if (!p) {
            free(k);
            return dfl_seterr("out of memory");
        }
        tr->keys = p, tr->cap_keys = cap;
    }
    tr->keys[tr->n_keys++] = k;
    return DFL_OK;
}

/* The complete lines of an existing train.jsonl (resume); a partial last line is cut off. */
static int load_rows(tm_run *tr) {
    dfl_jsonl in;
    if (dfl_jsonl_open(&in, tr->path, DFL_JSONL_MISSING_OK)) return DFL_ERR;
    int rc = DFL_OK, more;
    while (rc == DFL_OK && (more = dfl_jsonl_next(&in)) == 1) {
        tm_row r;
        if (tm_row_parse(in.line, &r) != DFL_OK) {
            rc = dfl_preperr("%s:%d", tr->path, in.lineno);
            break;
        }
        rc = keys_add(tr, row_key(r.prompt_id, r.turn, r.drafter, r.labels, r.features, r.attn));
    }
    if (rc == DFL_OK && more < 0) rc = DFL_ERR;
    const long good = in.good_end; /* an interrupted write's partial line is cut */
    const int exists = in.f != NULL;
    dfl_jsonl_close(&in);
    if (rc == DFL_OK && exists && truncate(tr->path, good) != 0)
        rc = dfl_seterr("%s: cannot drop the partial last line: %s", tr->path, strerror(errno));
    return rc;
}

int tm_run_open(tm_run *tr, const char *dir, int resume) {
    tr->path = dfl_path_join(dir, "train.jsonl");
    if (!tr->path) return dfl_seterr("out of memory");
    if (resume && load_rows(tr)) return DFL_ERR;
    if (!(tr->f = fopen(tr->path, resume ? "a" : "w")))
        return dfl_seterr("%s: cannot write: %s", tr->path, strerror(errno));
    return DFL_OK;
}

void tm_run_close(tm_run *tr) {
    if (tr->f) fclose(tr->f);
    for (int i = 0; i < tr->n_keys; i++) free(tr->keys[i]);
    free(tr->keys), free(tr->path);
    memset(tr, 0, sizeof *tr);
}

int tm_run_has(const tm_run *tr, const char *pid, int turn, const char *drafter, const char *labels,
               const char *features, const char *attn) {
    char *k = row_key(pid, turn, drafter, labels, features, attn);
    int found = 0;
    for (int i = tr->n_keys - 1; k && i >= 0 && !found; i--) found = strcmp(tr->keys[i], k) == 0;
    free(k);
    return found;
}

int tm_run_unit(tm_run *tr, const tm_job *j) {
    if (tm_run_has(tr, j->pid, j->turn, j->drafter, j->labels, j->features, j->attn)) return DFL_OK;
    tm_row row = {.turn = j->turn, .B = j->B, .prompt_tokens = j->t->n_prompt, .tokens = j->t->n};
    snprintf(row.prompt_id, sizeof row.prompt_id, "%s", j->pid);
    snprintf(row.drafter, sizeof row.drafter, "%s", j->drafter);
    snprintf(row.labels, sizeof row.labels, "%s", j->labels);
    snprintf(row.features, sizeof row.features, "%s", j->features);
    snprintf(row.attn, sizeof row.attn, "%s", j->attn);
    const tm_opts o = {.B = j->B, .num_anchors = tr->num_anchors, .seed = tr->seed, .blocks = tr->blocks};
    char turn[16];
    snprintf(turn, sizeof turn, "\t%d", j->turn);
    const uint64_t key = tm_hash(tm_hash(TM_FNV_BASIS, j->pid), turn);
    j->dif->reset(j->dif->ctx);
    int rc = tm_score(j->t, j->dif, j->col, j->V, j->tt, &o, key, &row.u);
    j->dif->reset(j->dif->ctx);
    if (rc)
        return dfl_preperr("prompt %s turn %d, drafter %s, training metrics on %s labels and %s features", j->pid,
                           j->turn + 1, j->drafter, j->labels, j->features);
    tm_row_write(tr->f, &row);
    fputc('\n', tr->f);
    tm_unit_free(&row.u);
    if (fflush(tr->f) != 0) return dfl_seterr("%s: write error: %s", tr->path, strerror(errno));
    return keys_add(tr, row_key(j->pid, j->turn, j->drafter, j->labels, j->features, j->attn));
}

/* ---- the report ------------------------------------------------------------------------- */

static tm_agg *agg_find(tm_agg **ag, int *n, int *cap, const tm_row *r) {
    for (int i = 0; i < *n; i++) {
        tm_agg *a = &(*ag)[i];
        if (!strcmp(a->drafter, r->drafter) && !strcmp(a->labels, r->labels) && !strcmp(a->features, r->features) &&
            !strcmp(a->attn, r->attn))
            return a->B == r->B ? a : NULL;
    }
    if (*n == *cap) {
        const int c = *cap ? 2 * *cap : 8;
        tm_agg *p = realloc(*ag, (size_t)c * sizeof *p);
        if (!p) return NULL;
        *ag = p, *cap = c;
    }
    tm_agg *a = &(*ag)[(*n)++];
    memset(a, 0, sizeof *a);
    snprintf(a->drafter, sizeof a->drafter, "%s", r->drafter);
    snprintf(a->labels, sizeof a->labels, "%s", r->labels);
    snprintf(a->features, sizeof a->features, "%s", r->features);
    snprintf(a->attn, sizeof a->attn, "%s", r->attn);
    a->B = r->B;
    return a;
}

int tm_run_aggregate(const char *path, tm_agg **out, int *n_out) {
    *out = NULL, *n_out = 0;
    dfl_jsonl in;
    if (dfl_jsonl_open(&in, path, DFL_JSONL_MISSING_OK)) return DFL_ERR;
    int n = 0, capa = 0, rc = DFL_OK, more;
    tm_agg *ag = NULL;
    while (rc == DFL_OK && (more = dfl_jsonl_next(&in)) == 1) {
        const int lineno = in.lineno;
        tm_row r;
        if (tm_row_parse(in.line, &r) != DFL_OK) {
            rc = dfl_preperr("%s:%d", path, lineno);
            break;
        }
        tm_agg *a = agg_find(&ag, &n, &capa, &r);
        if (!a) {
            rc = dfl_seterr("%s:%d: drafter %s has block size %d here and another on an earlier line", path, lineno,
                            r.drafter, r.B);
            break;
        }
        a->responses++, a->draft_s += r.u.draft_s, a->drafts += r.u.drafts;
        tm_counts_add(&a->rnd, &r.u.rnd), tm_counts_add(&a->all, &r.u.all), tm_counts_add(&a->walk, &r.u.walk);
    }
    if (rc == DFL_OK && more < 0) rc = DFL_ERR;
    dfl_jsonl_close(&in);
    if (rc) free(ag);
    else *out = ag, *n_out = n;
    return rc;
}
