/* dfl eval's orchestration (eval_run, include/dfl/eval.h): the prompt loop, resume, the online
 * runs, the recording and replay of truths (include/dfl/replay.h), saved features, reports. */
#include <errno.h>
#include <fcntl.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "dfl/any_drafter.h"
#include "dfl/common.h"
#include "dfl/jsonl.h"
#include "dfl/ddtree.h"
#include "dfl/eval.h"
#include "dfl/kernels.h"
#include "dfl/prompt.h"
#include "dfl/reference.h"
#include "dfl/replay.h"
#include "eval/features.h"
#include "eval/train_run.h"

void eval_opts_default(eval_opts *o) {
    memset(o, 0, sizeof *o);
    o->max_new = 256;
    o->chat = DFL_CHAT_CHATML;
    o->n_modes = 1;
    o->shard_n = 1;
    o->record_budget = -1;
    o->cost_reps = 3;
    o->repeat = 1;
    o->zlab_dataset = -1;
    o->train_anchors = 512;
    o->train_topk = 64;
    o->train_attn = EVAL_TRAIN_ATTN_NONE;
    o->train_chat = -1;
    o->block_attn = DFL_BLOCK_ATTN_AUTO;
}

void eval_opts_protocol_defaults(eval_opts *o, int chat_set) {
    if (!o->protocol) return;
    if (!chat_set) o->chat = DFL_CHAT_CHATML_NOTHINK;
    if (!o->max_new_set) o->max_new = EVAL_ZLAB_MAX_NEW;
}

int eval_record_mode_parse(const char *s, int *budget) {
    if (strcmp(s, "auto") == 0) return *budget = EVAL_RECORD_AUTO, DFL_OK;
    if (strcmp(s, "chain") == 0) return *budget = 0, DFL_OK;
    const char *num = strncmp(s, "ddtree-", 7) == 0 ? s + 7 : s;
    char *end;
    errno = 0;
    const long v = strtol(num, &end, 10);
    if (errno || *end || end == num || v < 0 || v > DDTREE_MAX_BUDGET)
        return dfl_seterr("expected chain, ddtree-N with N <= %d or auto, found '%s'", DDTREE_MAX_BUDGET, s);
    *budget = (int)v;
    return DFL_OK;
}

/* ---- results already written (resume) -------------------------------------------------- */

/* results.jsonl's complete lines; good_end: where an interrupted write left a partial line */
typedef eval_results done_set;

static int load_done(done_set *d, const char *path, int device) {
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
static int done_add_text(done_set *d, const char *text, int device) {
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
static char *done_text(const done_set *d, const char *pid) {
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

static void done_free(done_set *d) { eval_results_free(d); }

/* The row of a response of repetition rep (--repeat; 0 is the first run), -1 if not there. */
static int done_find_rep(const done_set *d, const char *pid, int turn, const char *drafter, const char *mode,
                         const char *method, const char *features, int rep) {
    for (int i = 0; i < d->n; i++)
        if (d->r[i].turn == turn && d->r[i].rep == rep && strcmp(d->r[i].prompt_id, pid) == 0 &&
            strcmp(d->r[i].drafter, drafter) == 0 &&
            strcmp(d->r[i].mode, mode) == 0 && strcmp(d->r[i].method, method) == 0 &&
            strcmp(d->r[i].features, features) == 0)
            return i;
    return -1;
}

static int done_find(const done_set *d, const char *pid, int turn, const char *drafter, const char *mode,
                     const char *method, const char *features) {
    return done_find_rep(d, pid, turn, drafter, mode, method, features, 0);
}

static void mode_name(int budget, char *buf, size_t n) {
    if (budget) snprintf(buf, n, "ddtree-%d", budget);
    else snprintf(buf, n, "chain");
}

static int mkdir_p(const char *dir) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", dir);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(tmp, 0755);
            *p = '/';
        }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return dfl_seterr("%s: cannot create directory", dir);
    return DFL_OK;
}

/* ChatML: the templated first turn, the assistant's content and its end, the templated second turn. */
static char *chatml_two_turns(char *first, const char *content, char *second) {
    const size_t n = strlen(first) + strlen(content) + strlen(second) + 32;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s%s<|im_end|>\n%s", first, content, second);
    free(first);
    free(second);
    return s;
}

/* The conversation text for a turn: turn 1 alone, or turn 1 + the model's answer + turn 2. */
static char *turn_text(const eval_prompt *p, int turn, const char *answer1, dfl_chat chat) {
    if (turn == 1 && chat == DFL_CHAT_CHATML_NOTHINK) {
        /* Qwen3's chat template (enable_thinking false) renders an assistant message before the last
         * user message as '<|im_start|>assistant\n' + content + '<|im_end|>\n' with no think block,
         * content being what follows its last '</think>' with leading newlines stripped (when it has
         * one); only the generation prompt gets the empty '<think>\n\n</think>\n\n'. */
        const char *content = answer1, *e;
        while ((e = strstr(content, "</think>"))) content = e + strlen("</think>");
        if (content != answer1)
            while (*content == '\n') content++;
        return chatml_two_turns(prompt_format(p->turns[0], DFL_CHAT_CHATML), content,
                                prompt_format(p->turns[1], chat));
    }
    char *first = prompt_format(p->turns[0], chat);
    if (turn == 0 || chat == DFL_CHAT_NONE) {
        if (turn == 0) return first;
        /* no template: the raw texts one after another */
        size_t n = strlen(first) + strlen(answer1) + strlen(p->turns[1]) + 4;
        char *s = malloc(n);
        snprintf(s, n, "%s%s\n%s", first, answer1, p->turns[1]);
        free(first);
        return s;
    }
    return chatml_two_turns(first, answer1, prompt_format(p->turns[1], chat));
}

/* The prompt set: a prompt file (its --format, or sniffed), or z-lab's selection with --protocol zlab. */
static int load_prompts(eval_prompts *ps, const eval_opts *o, int *zlab_dataset) {
    if (o->protocol == EVAL_PROTOCOL_ZLAB) return eval_zlab_load(ps, o, zlab_dataset);
    const eval_format fmt = o->have_fmt ? o->fmt : eval_format_sniff(o->prompts);
    return eval_prompts_load(ps, o->prompts, fmt, o->field, o->limit, o->keep_going);
}

/* One --dump-prompts line: the prompt of a turn as dfl tokenizes it. */
static int dump_prompt(FILE *f, const char *path, int index, const eval_prompt *p, int turn, const char *answer1,
                       const char *text, const int32_t *ids, size_t n) {
    fprintf(f, "{\"index\": %d, \"prompt_id\": ", index);
    dfl_json_write_string(f, p->id);
    fprintf(f, ", \"line\": %d, \"turn\": %d", p->line, turn);
    fprintf(f, ", \"user\": "); /* the user message(s), formatted */
    dfl_json_write_string(f, p->turns[0]);
    if (turn) {
        fprintf(f, ", \"answer\": "); /* the assistant message the second turn is built on */
        dfl_json_write_string(f, answer1);
        fprintf(f, ", \"user_2\": ");
        dfl_json_write_string(f, p->turns[1]);
    }
    fprintf(f, ", \"text\": ");
    dfl_json_write_string(f, text);
    fprintf(f, ", \"ids\": [");
    for (size_t i = 0; i < n; i++) fprintf(f, "%s%d", i ? ", " : "", ids[i]);
    fprintf(f, "]}\n");
    return fflush(f) == 0 ? DFL_OK : dfl_seterr("%s: write error: %s", path, strerror(errno));
}

/* ---- saved features: the manifest -------------------------------------------------------- */

typedef struct unit {
    int index, turn, prompt_tokens, tokens;
    char prompt_id[128];
    char file[64];
    char prompt_hash[24]; /* of the prompt's user turns (eval_prompt_hash); "" in older manifests */
} unit;

typedef struct unit_list {
    unit *u;
    int n;
} unit_list;

/* DIR/manifest.jsonl: a line per saved truth, appended as each is written. */
static int manifest_load(unit_list *l, const char *dir, int must_exist) {
    memset(l, 0, sizeof *l);
    char *path = dfl_path_join(dir, "manifest.jsonl");
    dfl_jsonl in;
    if (dfl_jsonl_open(&in, path, DFL_JSONL_MISSING_OK)) { /* a partial last line: its file is redone */
        free(path);
        return DFL_ERR;
    }
    if (!in.f) {
        int rc = must_exist ? dfl_seterr("%s: cannot open (not a directory of saved features?)", path) : DFL_OK;
        free(path);
        return rc;
    }
    int rc = DFL_OK, more;
    while (rc == DFL_OK && (more = dfl_jsonl_next(&in)) == 1) {
        const int lineno = in.lineno;
        cJSON *o = dfl_jsonl_object(&in); /* strictly one object: "{...}{..." is no line */
        const cJSON *fi = cJSON_GetObjectItemCaseSensitive(o, "file"), *pid = cJSON_GetObjectItemCaseSensitive(o, "prompt_id");
        const cJSON *ix = cJSON_GetObjectItemCaseSensitive(o, "index"), *tu = cJSON_GetObjectItemCaseSensitive(o, "turn");
        const cJSON *np = cJSON_GetObjectItemCaseSensitive(o, "prompt_tokens"), *nt = cJSON_GetObjectItemCaseSensitive(o, "tokens");
        if (!cJSON_IsString(fi) || !cJSON_IsString(pid) || !cJSON_IsNumber(ix) || !cJSON_IsNumber(tu) ||
            !cJSON_IsNumber(np) || !cJSON_IsNumber(nt) || ix->valuedouble < 0 || ix->valuedouble > 1e9 ||
            (tu->valuedouble != 0 && tu->valuedouble != 1) || np->valuedouble < 1 || np->valuedouble > 1 << 24 ||
            nt->valuedouble < 1 || nt->valuedouble > 1 << 24 || strlen(fi->valuestring) >= sizeof l->u[0].file ||
            strchr(fi->valuestring, '/')) {
            rc = dfl_seterr("%s:%d: expected {\"index\", \"prompt_id\", \"turn\", \"file\", \"prompt_tokens\", "
                            "\"tokens\"}", path, lineno);
        } else {
            l->u = realloc(l->u, (size_t)(l->n + 1) * sizeof *l->u);
            unit *u = &l->u[l->n++];
            u->index = (int)ix->valuedouble, u->turn = (int)tu->valuedouble;
            u->prompt_tokens = (int)np->valuedouble, u->tokens = (int)nt->valuedouble;
            snprintf(u->prompt_id, sizeof u->prompt_id, "%s", pid->valuestring);
            snprintf(u->file, sizeof u->file, "%s", fi->valuestring);
            const cJSON *ph = cJSON_GetObjectItemCaseSensitive(o, "prompt_hash");
            u->prompt_hash[0] = 0;
            if (cJSON_IsString(ph) && strlen(ph->valuestring) < sizeof u->prompt_hash)
                snprintf(u->prompt_hash, sizeof u->prompt_hash, "%s", ph->valuestring);
            else if (ph)
                rc = dfl_seterr("%s:%d: prompt_hash: expected a string of at most %zu characters", path, lineno,
                                sizeof u->prompt_hash - 1);
        }
        cJSON_Delete(o);
    }
    if (rc == DFL_OK && more < 0) rc = DFL_ERR;
    dfl_jsonl_close(&in);
    free(path);
    return rc;
}

static const unit *unit_find(const unit_list *l, int index, int turn) {
    for (int i = 0; i < l->n; i++)
        if (l->u[i].index == index && l->u[i].turn == turn) return &l->u[i];
    return NULL;
}

/* ---- the run ------------------------------------------------------------------------------ */

typedef struct run {
    const eval_opts *o;
    eval_prompts ps;
    dfl_model m;
    int have_model;
    dfl_any_drafter ad[EVAL_MAX_DRAFTERS]; /* DFlash, DFlash2 or an MTP head, and its run state */
    dfl_draft_if dif[EVAL_MAX_DRAFTERS]; /* each drafter as the loops drive it (alloc_states) */
    char *label[EVAL_MAX_DRAFTERS];      /* its name in results and summaries: the --drafter argument, or
                                          * "mtp (DIR)" for the MTP head of checkpoint DIR */
    eval_draft_cache cache[EVAL_MAX_DRAFTERS];
    int n_open, n_dstate, n_cache;
    int block[EVAL_MAX_DRAFTERS];
    int col[EVAL_MAX_DRAFTERS][EVAL_MAX_FEAT_LAYERS]; /* drafter's layer i -> truth column */
    int layers[EVAL_MAX_FEAT_LAYERS], n_layers;      /* the truth's feature layers */
    dfl_tokenizer *tok;
    ref_set refs;
    done_set done;
    FILE *resf, *reff, *manf, *dumpf;
    int zlab_dataset;    /* with --protocol zlab: the dataset (EVAL_ZLAB_*) */
    char *res_path, *ref_path;
    int lock_fd, feat_lock_fd; /* flocks of --out and of --save-features */
    char *feat_incomplete;     /* --features: the recording that saved them did not finish (message) */
    char recorder[256];        /* what produced the truths: "dfl", or --features' target.json "recorder"
                                * (the Python package's transformers recorder) */
    cJSON *desc;               /* DIR/run.json as this run wrote it (writer only) */
    dfl_state st;
    int have_state;
    eval_costs costs;
    eval_target_id id;
    unit_list saved;     /* the save_features manifest (resume) or the features_dir one */
    int max_new, max_block, max_budget, rec_budget;
    int rec_auto;                /* --record-mode auto */
    int replay;          /* replay (1) or online (0) */
    int from_features;
    int device;          /* where the target ran (o->device, or the saved truths' device with features_dir) */
    eval_outcome res;
    int ref_compared, ref_agree;
    /* per-round accepted lengths of an online run (on_round) */
    int *acc, n_acc, cap_acc;
    tm_run tm;           /* --train-metrics: train.jsonl */
    FILE *fcf;           /* --features-from: features_check.jsonl */
    int last_optional;   /* the target's last layer when held only for --train-metrics (a pipeline may lack it), -1 */
    int last_col;        /* truth column of the target's last layer (the target's distribution), -1 */
    int batch;           /* tokens per target forward */
    char *warn_md;       /* warnings for the top of summary.md (mask tokens), NULL when none */
} run;

static void logf_(const run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(const run *r, const char *fmt, ...) {
    if (!r->o->log) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(r->o->log, fmt, ap);
    va_end(ap);
}

static void on_round(void *ud, int start, const int32_t *block, int bs, const float *draft, int V, int accepted) {
    (void)start, (void)block, (void)bs, (void)draft, (void)V;
    run *r = ud;
    if (r->n_acc == r->cap_acc) {
        r->cap_acc = r->cap_acc ? 2 * r->cap_acc : 256;
        r->acc = realloc(r->acc, (size_t)r->cap_acc * sizeof *r->acc);
    }
    r->acc[r->n_acc++] = accepted;
}

static int write_result(run *r, eval_result *e, const int32_t *ids, int n_ids) {
    const eval_dist *dd = r->o->dist;
    e->device = r->device;
    if (dd) { /* the writer's file, or a message to it */
        char *line = NULL;
        size_t len = 0;
        FILE *m = open_memstream(&line, &len);
        if (!m) return dfl_seterr("out of memory");
        eval_result_write(m, e, ids, n_ids);
        fclose(m);
        const int rc = dd->emit(dd->ud, line);
        free(line);
        if (rc) return rc;
    } else {
        eval_result_write(r->resf, e, ids, n_ids);
        fputc('\n', r->resf);
        if (fflush(r->resf) != 0 || ferror(r->resf))
            return dfl_seterr("%s: write error: %s", r->res_path, strerror(errno));
    }
    r->res.responses++;
    return DFL_OK;
}

static void result_head(eval_result *e, const char *pid, int turn, const char *drafter, const char *mode,
                        const char *method, const char *features) {
    eval_result_init(e);
    e->act_bf16 = kn_act_get() == KN_ACT_BF16;
    e->turn = turn;
    snprintf(e->prompt_id, sizeof e->prompt_id, "%s", pid);
    snprintf(e->drafter, sizeof e->drafter, "%s", drafter);
    snprintf(e->mode, sizeof e->mode, "%s", mode);
    snprintf(e->method, sizeof e->method, "%s", method);
    snprintf(e->features, sizeof e->features, "%s", features);
}

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

/* The reference agreement of a truth. */
static int check_reference(run *r, const char *pid, int turn, const int32_t *prompt, int np, const int32_t *truth,
                           int n) {
    const eval_opts *o = r->o;
    if (!o->reference && !o->reference_url) return DFL_OK;
    const ref_entry *re = o->reference ? ref_find(&r->refs, pid, turn) : NULL;
    int32_t *rids = NULL;
    int nr = 0, have = 0;
    if (re) rids = re->ids, nr = re->n, have = 1;
    else if (o->reference_url) {
        if (ref_url_generate(o->reference_url, prompt, np, r->max_new, &rids, &nr) != DFL_OK)
            return dfl_preperr("prompt %s: reference", pid);
        have = 1;
    }
    if (have) {
        const int div = ref_first_divergence(truth, n, rids, nr);
        fprintf(r->reff, "{\"prompt_id\": ");
        dfl_json_write_string(r->reff, pid);
        fprintf(r->reff, ", \"turn\": %d, \"dfl_tokens\": %d, \"reference_tokens\": %d, \"first_divergence\": %d}\n", turn,
                n, nr, div);
        fflush(r->reff);
        r->ref_compared++;
        r->ref_agree += div < 0;
        if (div >= 0)
            logf_(r, "[dfl eval] prompt %s turn %d: target output diverges from the reference at token %d\n", pid,
                  turn + 1, div);
    } else {
        logf_(r, "dfl eval: prompt %s turn %d: no reference entry\n", pid, turn + 1);
    }
    if (!re) free(rids);
    return DFL_OK;
}

/* ---- online: an autoregressive run, then every drafter x mode on the target ------------------ */

static int unit_online(run *r, const char *pid, int turn, const int32_t *pids, int np, int32_t *truth, int *n_truth,
                       int32_t *out, double *last_tau) {
    const eval_opts *o = r->o;
    dfl_gen_opts go = {.max_new = r->max_new, .temperature = (float)o->temperature, .seed = (uint64_t)o->seed,
                       .accept_rule = (dfl_accept_rule)o->accept_rule, .top_k = o->top_k, .top_p = (float)o->top_p};
    dfl_gen_stats gs;
    /* --repeat: every run of the prompt again, in the same order (the autoregressive one, then each
     * drafter x mode), so that each repetition's speedup compares runs made close in time */
    for (int rep = 0; rep < o->repeat; rep++) {
        int k = done_find_rep(&r->done, pid, turn, "", "ar", "online", "dfl", rep);
        if (rep == 0 && k >= 0 && r->done.ids[k]) {
            *n_truth = r->done.n_ids[k] < r->max_new ? r->done.n_ids[k] : r->max_new;
            memcpy(truth, r->done.ids[k], (size_t)*n_truth * sizeof(int32_t));
        } else if (k < 0) {
            int32_t *ids = rep == 0 ? truth : out;
            state_reset(&r->st);
            if (spec_generate(&r->st, NULL, pids, np, &go, ids, &gs, NULL, NULL) != DFL_OK)
                return dfl_preperr("prompt %s", pid);
            eval_result e;
            result_head(&e, pid, turn, "", "ar", "online", "dfl");
            eval_result_from_stats(&e, &gs);
            e.rep = rep;
            if (rep == 0) *n_truth = gs.generated;
            else if ((e.first_mismatch = ref_first_divergence(ids, gs.generated, truth, *n_truth)) >= 0) {
                e.match = 0; /* the same seeded run twice: anything else is a fault */
                r->res.mismatches++;
                logf_(r, "\ndfl eval: MISMATCH prompt %s turn %d: autoregressive repetition %d differs from the first "
                         "run at token %d\n", pid, turn + 1, rep + 1, e.first_mismatch);
            }
            if (write_result(r, &e, ids, gs.generated)) return DFL_ERR;
        }
        if (rep == 0 && check_reference(r, pid, turn, pids, np, truth, *n_truth)) return DFL_ERR;
        for (int d = 0; d < o->n_drafters; d++)
            for (int mi = 0; mi < o->n_modes; mi++) {
                char mode[32];
                mode_name(o->budgets[mi], mode, sizeof mode);
                if (done_find_rep(&r->done, pid, turn, r->label[d], mode, "online", "dfl", rep) >= 0) continue;
                state_reset(&r->st);
                dfl_draft_if dif = r->dif[d];
                dif.reset(dif.ctx);
                dfl_gen_opts so = go;
                so.block = r->block[d];
                so.tree_budget = o->budgets[mi];
                so.on_round = on_round, so.on_round_ud = r;
                r->n_acc = 0;
                if (spec_generate(&r->st, &dif, pids, np, &so, out, &gs, NULL, NULL) != DFL_OK)
                    return dfl_preperr("prompt %s, drafter %s, %s", pid, r->label[d], mode);
                eval_result e;
                result_head(&e, pid, turn, r->label[d], mode, "online", "dfl");
                eval_result_from_stats(&e, &gs);
                e.rep = rep;
                e.round_acc = r->acc, e.n_round_acc = r->n_acc;
                if (o->temperature <= 0) {
                    e.first_mismatch = ref_first_divergence(out, gs.generated, truth, *n_truth);
                    e.match = e.first_mismatch < 0;
                    if (!e.match) {
                        r->res.mismatches++;
                        logf_(r, "\ndfl eval: MISMATCH prompt %s turn %d, drafter %s, %s: the speculative output "
                                 "differs from the autoregressive one at token %d\n", pid, turn + 1, r->label[d],
                              mode, e.first_mismatch);
                    }
                }
                if (write_result(r, &e, out, gs.generated)) return DFL_ERR;
                if (rep == 0) *last_tau = gs.rounds ? (double)(gs.generated - 1) / gs.rounds : 0;
            }
    }
    return DFL_OK;
}

/* ---- replay ------------------------------------------------------------------------------- */

/* The line of a unit's recording run: drafter 1's online run in the recording mode; with
 * --record-mode auto (decode steps mixed in: no online run of any mode) mode "auto", method
 * "record", which summaries leave out. */
static const char *rec_row(const run *r, char *mode, size_t n) {
    if (r->rec_auto) return snprintf(mode, n, "auto"), "record";
    mode_name(r->rec_budget, mode, n);
    return "online";
}

/* Every line a replay unit writes is there already. */
static int unit_complete(const run *r, const char *pid, int turn) {
    const eval_opts *o = r->o;
    char mode[32];
    if (!r->from_features) {
        if (o->check_ar && done_find(&r->done, pid, turn, "", "ar", "online", "dfl") < 0) return 0;
        const char *method = rec_row(r, mode, sizeof mode);
        if (done_find(&r->done, pid, turn, r->label[0], mode, method, "dfl") < 0) return 0;
    }
    for (int d = 0; d < o->n_drafters; d++)
        for (int mi = 0; mi < o->n_modes; mi++) {
            mode_name(o->budgets[mi], mode, sizeof mode);
            if (done_find(&r->done, pid, turn, r->label[d], mode, "replay", "dfl") < 0) return 0;
            if (o->features_from && done_find(&r->done, pid, turn, r->label[d], mode, "replay", "pipeline") < 0)
                return 0;
        }
    for (int d = 0; d < o->n_drafters && o->train_metrics; d++)
        if (!tm_run_has(&r->tm, pid, turn, r->label[d], "target", "dfl", "config")) return 0;
    return 1;
}

/* The truth ids a complete unit recorded (for an MT-Bench second turn). */
static int unit_truth_ids(const run *r, const char *pid, int turn, int32_t *truth, int *n) {
    char mode[32];
    const char *method = rec_row(r, mode, sizeof mode);
    int k = done_find(&r->done, pid, turn, r->label[0], mode, method, "dfl");
    if (k < 0 || !r->done.ids[k]) k = done_find(&r->done, pid, turn, "", "ar", "online", "dfl");
    if (k < 0 || !r->done.ids[k]) return dfl_seterr("prompt %s turn %d: no output ids in %s", pid, turn + 1, r->res_path);
    *n = r->done.n_ids[k] < r->max_new ? r->done.n_ids[k] : r->max_new;
    memcpy(truth, r->done.ids[k], (size_t)*n * sizeof(int32_t));
    return DFL_OK;
}

/* Replay every drafter x mode on t; features: "dfl" or "pipeline". keep_cache0: drafter 0's
 * cache holds the recording run's drafts on these features. */
static int replay_all(run *r, const char *pid, int turn, const eval_truth *t, const char *features, int keep_cache0,
                      double *last_tau) {
    const eval_opts *o = r->o;
    eval_replay_out outs[EVAL_MAX_MODES];
    for (int d = 0; d < o->n_drafters; d++) {
        int todo = 0;
        char mode[32];
        for (int mi = 0; mi < o->n_modes; mi++) {
            mode_name(o->budgets[mi], mode, sizeof mode);
            todo += done_find(&r->done, pid, turn, r->label[d], mode, "replay", features) < 0;
        }
        if (!todo) continue;
        if (!(d == 0 && keep_cache0)) eval_draft_cache_clear(&r->cache[d]);
        r->dif[d].reset(r->dif[d].ctx);
        if (eval_replay(t, &r->dif[d], r->m.cfg.vocab, r->col[d], r->block[d], r->max_new, o->budgets, o->n_modes,
                        &r->cache[d], &r->costs, outs) != DFL_OK)
            return dfl_preperr("prompt %s turn %d, drafter %s, replay", pid, turn + 1, r->label[d]);
        int rc = DFL_OK;
        for (int mi = 0; mi < o->n_modes; mi++) {
            mode_name(o->budgets[mi], mode, sizeof mode);
            if (rc == DFL_OK && done_find(&r->done, pid, turn, r->label[d], mode, "replay", features) < 0) {
                eval_result e;
                result_head(&e, pid, turn, r->label[d], mode, "replay", features);
                eval_result_from_stats(&e, &outs[mi].st);
                e.time_s = e.verify_s = e.rollback_s = e.prefill_s = 0; /* nothing of it ran on the target */
                e.draft_s = outs[mi].draft_s;
                e.modeled_s = outs[mi].modeled_s;
                e.modeled_ar_s = outs[mi].modeled_s >= 0 ? eval_cost_chain(&r->costs, 1) * (t->n - 1) : -1;
                e.round_acc = outs[mi].round_acc, e.n_round_acc = outs[mi].st.rounds;
                rc = write_result(r, &e, NULL, 0);
                *last_tau = e.rounds ? (double)(e.tokens - 1) / e.rounds : 0;
            }
            eval_replay_out_free(&outs[mi]);
        }
        if (rc) return rc;
    }
    return DFL_OK;
}

/* --train-metrics on one truth: every drafter on these labels and features (tt: the target's
 * distribution along the truth, or NULL). */
static int train_truth(run *r, const char *pid, int turn, const eval_truth *t, const char *labels,
                       const char *features, const tm_target *tt) {
    for (int d = 0; d < r->o->n_drafters; d++) {
        const tm_job j = {.pid = pid, .turn = turn, .drafter = r->label[d], .labels = labels, .features = features,
                          .attn = "config", .t = t, .tt = tt, .dif = &r->dif[d], .col = r->col[d],
                          .V = r->m.cfg.vocab, .B = r->block[d]};
        if (tm_run_unit(&r->tm, &j)) return DFL_ERR;
    }
    return DFL_OK;
}

/* --train-attn: the truth's own labels scored again by each drafter with sliding layers under the
 * other block attention (the setting restored after). */
static int train_attn(run *r, const char *pid, int turn, const eval_truth *t, const tm_target *tt) {
    const eval_opts *o = r->o;
    for (int d = 0; d < o->n_drafters && o->train_attn != EVAL_TRAIN_ATTN_NONE; d++) {
        dfl_any_drafter *a = &r->ad[d];
        if (a->kind == DFL_DRAFTER_MTP || !drafter_has_sliding(&a->d)) continue;
        const tm_job j = {.pid = pid, .turn = turn, .drafter = r->label[d], .labels = "target", .features = "dfl",
                          .attn = drafter_causal_name(o->train_attn), .t = t, .tt = tt, .dif = &r->dif[d],
                          .col = r->col[d], .V = r->m.cfg.vocab, .B = r->block[d]};
        if (tm_run_has(&r->tm, pid, turn, j.drafter, j.labels, j.features, j.attn)) continue;
        int rc = anydrafter_set_causal(a, o->train_attn);
        if (rc == DFL_OK) rc = tm_run_unit(&r->tm, &j);
        const int back = anydrafter_set_causal(a, o->block_attn);
        if (rc || back) return DFL_ERR;
    }
    return DFL_OK;
}

/* A pipeline's features for this unit (--features-from), replayed against the same truth (and
 * scored by the training metrics, with the target's distribution tt, when asked). */
static int replay_pipeline(run *r, const char *pid, int turn, int index, const eval_truth *t, const tm_target *tt,
                           double *last_tau) {
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
    if (rc == DFL_OK && (rc = replay_all(r, pid, turn, &pt, "pipeline", 0, last_tau)) != DFL_OK)
        dfl_preperr("on the pipeline's features %s", path);
    if (rc == DFL_OK && o->train_metrics && (rc = train_truth(r, pid, turn, &pt, "target", "pipeline", tt)) != DFL_OK)
        dfl_preperr("on the pipeline's features %s", path);
    eval_truth_free(&pt);
    free(path);
    return rc;
}

/* prompt ids + labels teacher-forced through the target: a truth with the features of every
 * position (the last label needs none). */
static int teacher_truth(run *r, const int32_t *pids, int np, const int32_t *lab, int n, eval_truth *dt) {
    const int H = r->m.cfg.hidden;
    int32_t *seq = malloc((size_t)(np + n) * sizeof *seq);
    float *rows = malloc((size_t)r->batch * r->n_layers * H * sizeof *rows);
    int rc = seq && rows ? DFL_OK : dfl_seterr("out of memory");
    if (rc == DFL_OK && np + n > r->st.max_ctx)
        rc = dfl_seterr("%d prompt and %d label tokens exceed the context %d", np, n, r->st.max_ctx);
    if (rc == DFL_OK) {
        memcpy(seq, pids, (size_t)np * sizeof *seq);
        memcpy(seq + np, lab, (size_t)n * sizeof *seq);
        const dfl_capture cap = {.n_layers = r->n_layers, .layers = r->layers, .out = rows};
        state_reset(&r->st);
        for (int c0 = 0; c0 < np + n - 1 && rc == DFL_OK; c0 += r->batch) {
            const int c = np + n - 1 - c0 < r->batch ? np + n - 1 - c0 : r->batch;
            rc = model_forward(&r->st, seq + c0, c, NULL, 0, &cap);
            if (rc == DFL_OK) rc = eval_truth_add_rows(dt, rows, c);
        }
        state_reset(&r->st);
    }
    if (rc == DFL_OK) rc = eval_truth_set(dt, pids, np, lab, n, 0, 1);
    free(seq), free(rows);
    return rc;
}

/* The prompt's reference response as labels: the response, then <|im_end|> in a chat template
 * (the target's first eos without one), cut at --max-new. */
static int dataset_truth(run *r, const eval_prompt *p, const int32_t *pids, int np, eval_truth *dt) {
    const int chat = r->o->chat != DFL_CHAT_NONE;
    const size_t la = strlen(p->answer);
    char *txt = malloc(la + 16);
    if (!txt) return dfl_seterr("out of memory");
    int32_t *a = NULL;
    size_t na = 0;
    snprintf(txt, la + 16, "%s%s", p->answer, chat ? "<|im_end|>" : "");
    int rc = tok_encode(r->tok, txt, strlen(txt), &a, &na);
    if (rc == DFL_OK && !chat && r->m.n_eos > 0) {
        int32_t *b = realloc(a, (na + 1) * sizeof *a);
        if (!b) rc = dfl_seterr("out of memory");
        else a = b, a[na++] = r->m.eos_ids[0];
    }
    const int n = (int)na < r->max_new ? (int)na : r->max_new;
    if (rc == DFL_OK && n < 2) rc = dfl_seterr("its reference response has %d tokens: too short to score", n);
    if (rc == DFL_OK) rc = teacher_truth(r, pids, np, a, n, dt);
    free(txt), free(a);
    return rc;
}

/* Teacher-forced labels (labels: "dataset" or "template") scored by every drafter. */
static int train_teacher(run *r, const eval_prompt *p, const char *pid, int turn, const eval_truth *t,
                         const char *labels) {
    const eval_opts *o = r->o;
    eval_truth dt;
    tm_target dtt = {0};
    int32_t *ids = NULL;
    size_t ni = 0;
    int rc = eval_truth_init(&dt, r->m.cfg.hidden, r->layers, r->n_layers);
    if (rc == DFL_OK && labels[0] == 'd') {
        rc = dataset_truth(r, p, t->prompt, t->n_prompt, &dt);
    } else if (rc == DFL_OK) { /* the same response after the prompt in the other template */
        char *txt = turn_text(p, turn, "", (dfl_chat)o->train_chat);
        rc = txt ? tok_encode(r->tok, txt, strlen(txt), &ids, &ni) : dfl_seterr("out of memory");
        free(txt);
        if (rc == DFL_OK) rc = teacher_truth(r, ids, (int)ni, t->ids, t->n, &dt);
    }
    if (rc == DFL_OK && r->last_col >= 0) rc = tm_target_from_truth(&dtt, &dt, r->last_col, &r->m, o->train_topk);
    if (rc == DFL_OK) rc = train_truth(r, pid, turn, &dt, labels, "dfl", r->last_col >= 0 ? &dtt : NULL);
    tm_target_free(&dtt);
    eval_truth_free(&dt);
    free(ids);
    if (rc)
        return dfl_preperr("prompt %s, training metrics on %s", pid, labels[0] == 'd' ? "the dataset's reference response"
                                                                                   : "the response in --train-chat's template");
    return DFL_OK;
}

/* --train-metrics for a truth: the teacher-forced label sets first (the dataset's reference
 * response, the response under --train-chat's template; turn 1 of a prompt, with a target), then
 * the truth's own, whose rows mark the unit complete. */
static int train_unit(run *r, const eval_prompt *p, const char *pid, int turn, const eval_truth *t,
                      const tm_target *tt) {
    const eval_opts *o = r->o;
    const int teach = p && turn == 0 && r->have_state;
    for (int s = 0; s < 2 && teach; s++) {
        const char *labels = s == 0 ? "dataset" : "template";
        if ((s == 0 && !p->answer) || (s == 1 && o->train_chat < 0)) continue;
        int todo = 0;
        for (int d = 0; d < o->n_drafters; d++) todo += !tm_run_has(&r->tm, pid, turn, r->label[d], labels, "dfl", "config");
        if (todo && train_teacher(r, p, pid, turn, t, labels)) return DFL_ERR;
    }
    if (train_attn(r, pid, turn, t, tt)) return DFL_ERR;
    return train_truth(r, pid, turn, t, "target", "dfl", tt);
}

/* After a truth's own replay: the pipeline's features and the training metrics (p: the prompt,
 * NULL for a saved truth). */
static int replay_more(run *r, const eval_prompt *p, const char *pid, int turn, int index, const eval_truth *t,
                       double *last_tau) {
    const eval_opts *o = r->o;
    tm_target tt = {0};
    int rc = DFL_OK;
    if (o->train_metrics && r->last_col >= 0) rc = tm_target_from_truth(&tt, t, r->last_col, &r->m, o->train_topk);
    const tm_target *ttp = tt.n ? &tt : NULL;
    if (rc == DFL_OK && o->features_from) rc = replay_pipeline(r, pid, turn, index, t, ttp, last_tau);
    if (rc == DFL_OK && o->train_metrics) rc = train_unit(r, p, pid, turn, t, ttp);
    tm_target_free(&tt);
    return rc;
}

/* Record a truth: drafter 0 in the recording mode, capturing every layer the drafters read
 * (and --save-layers); its online stats are written too. */
static int record(run *r, const char *pid, int turn, const int32_t *pids, int np, eval_truth *t, int32_t *out,
                  double *last_tau) {
    const eval_opts *o = r->o;
    eval_recorder rec;
    char mode[32];
    const char *method = rec_row(r, mode, sizeof mode);
    eval_truth_free(t);
    eval_draft_cache_clear(&r->cache[0]);
    state_reset(&r->st);
    r->dif[0].reset(r->dif[0].ctx);
    if (eval_recorder_init(&rec, r->dif[0], t, &r->cache[0], r->m.cfg.vocab)) return DFL_ERR;
    if (r->rec_auto) eval_recorder_adapt(&rec, &r->costs, r->block[0]);
    dfl_draft_if dif = eval_recorder_if(&rec);
    dfl_gen_opts so = {.max_new = r->max_new, .block = r->block[0], .tree_budget = r->rec_budget,
                       .extend = r->max_block - 1, .on_round = on_round, .on_round_ud = r};
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
    result_head(&e, pid, turn, r->label[0], mode, method, "dfl");
    eval_result_from_stats(&e, &gs);
    e.round_acc = r->acc, e.n_round_acc = r->n_acc;
    if (!r->rec_auto) model_online(r, &e, &gs, r->block[0], r->rec_budget);
    *last_tau = gs.rounds ? (double)(gs.generated - 1) / gs.rounds : 0;
    if (o->check_ar) { /* the autoregressive run, the truth checked token for token (continuation too) */
        int32_t *ar = malloc((size_t)r->max_new * sizeof *ar);
        dfl_gen_opts go = {.max_new = r->max_new, .extend = r->max_block - 1};
        dfl_gen_stats as;
        state_reset(&r->st);
        if (!ar || spec_generate(&r->st, NULL, pids, np, &go, ar, &as, NULL, NULL) != DFL_OK) {
            free(ar);
            return dfl_preperr("prompt %s turn %d, autoregressive run", pid, turn + 1);
        }
        const int na = as.generated + as.extended, nt = t->n + t->n_ext;
        e.first_mismatch = ref_first_divergence(t->ids, nt < na ? nt : na, ar, nt < na ? nt : na);
        if (e.first_mismatch < 0 && as.generated != t->n) e.first_mismatch = as.generated < t->n ? as.generated : t->n;
        e.match = e.first_mismatch < 0;
        if (!e.match) {
            r->res.mismatches++;
            logf_(r, "\ndfl eval: MISMATCH prompt %s turn %d: the recording run (drafter %s, %s) differs from the "
                     "autoregressive one at token %d\n", pid, turn + 1, r->label[0], mode, e.first_mismatch);
        }
        if (done_find(&r->done, pid, turn, "", "ar", "online", "dfl") < 0) {
            eval_result a;
            result_head(&a, pid, turn, "", "ar", "online", "dfl");
            eval_result_from_stats(&a, &as);
            rc = write_result(r, &a, ar, as.generated);
        }
        free(ar);
        if (rc) return rc;
    }
    if (done_find(&r->done, pid, turn, r->label[0], mode, method, "dfl") < 0 &&
        write_result(r, &e, t->ids, t->n))
        return DFL_ERR;
    return DFL_OK;
}

static int save_truth(run *r, const char *pid, int turn, int index, const eval_truth *t) {
    char name[64];
    eval_features_name(index, turn, name, sizeof name);
    char *path = dfl_path_join(r->o->save_features, name);
    eval_features_meta meta = {.turn = turn, .max_new = r->max_new, .id = r->id,
                               .act_bf16 = kn_act_get() == KN_ACT_BF16, .device = r->device};
    snprintf(meta.prompt_id, sizeof meta.prompt_id, "%s", pid);
    snprintf(meta.target, sizeof meta.target, "%s", r->o->target);
    int rc = eval_features_save(path, t, &meta);
    free(path);
    if (rc) return rc;
    fprintf(r->manf, "{\"index\": %d, \"prompt_id\": ", index);
    dfl_json_write_string(r->manf, pid);
    char ph[24];
    eval_prompt_hash(&r->ps.p[index], r->o->first_turn, ph);
    fprintf(r->manf, ", \"turn\": %d, \"file\": \"%s\", \"prompt_tokens\": %d, \"tokens\": %d, \"prompt_hash\": \"%s\"}\n",
            turn, name, t->n_prompt, t->n, ph);
    if (fflush(r->manf) != 0) return dfl_seterr("%s/manifest.jsonl: write error: %s", r->o->save_features, strerror(errno));
    return DFL_OK;
}

/* A saved truth for this unit, checked against this target (features_dir or a resumed save). */
static int load_truth(run *r, const char *dir, const unit *u, eval_truth *t) {
    char *path = dfl_path_join(dir, u->file);
    eval_features_meta meta;
    eval_truth_free(t);
    int rc = eval_features_load(path, t, &meta, r->m.cfg.vocab);
    if (rc == DFL_OK && (strcmp(meta.prompt_id, u->prompt_id) != 0 || meta.turn != u->turn))
        rc = dfl_seterr("%s: holds prompt %s turn %d, the manifest says prompt %s turn %d", path, meta.prompt_id,
                        meta.turn + 1, u->prompt_id, u->turn + 1);
    if (rc == DFL_OK && (t->n_prompt != u->prompt_tokens || t->n != u->tokens))
        rc = dfl_seterr("%s: holds %d prompt tokens and %d output tokens, %s/manifest.jsonl says prompt_tokens %d, "
                        "tokens %d", path, t->n_prompt, t->n, dir, u->prompt_tokens, u->tokens);
    if (rc == DFL_OK) rc = eval_target_id_check(&meta.id, &r->id, path);
    if (rc == DFL_OK && meta.max_new != r->max_new)
        rc = dfl_seterr("%s: recorded with --max-new %d, this run has %d", path, meta.max_new, r->max_new);
    if (rc == DFL_OK && meta.act_bf16 != (kn_act_get() == KN_ACT_BF16))
        rc = dfl_seterr("%s: recorded with %s activations, this run uses %s (DFL_ACT): a replay is exact only in the "
                        "same mode", path, meta.act_bf16 ? "bf16" : "f32", meta.act_bf16 ? "f32" : "bf16");
    if (rc == DFL_OK && meta.device != r->device)
        rc = dfl_seterr("%s: recorded with the target on %s, %s on %s: truths of both devices must not mix in one "
                        "evaluation", path, dfl_device_name((dfl_device)meta.device),
                        r->from_features ? "the first saved truth's" : "this run's (--device)",
                        dfl_device_name((dfl_device)r->device));
    free(path);
    return rc;
}

static int unit_replay(run *r, const eval_prompt *p, int index, int turn, const int32_t *pids, int np, eval_truth *t,
                       int32_t *out, int32_t *truth, int *n_truth, double *last_tau) {
    const eval_opts *o = r->o;
    if (unit_complete(r, p->id, turn)) return unit_truth_ids(r, p->id, turn, truth, n_truth);
    const unit *saved = o->save_features ? unit_find(&r->saved, index, turn) : NULL;
    int recorded = 0;
    if (saved) {
        if (load_truth(r, o->save_features, saved, t)) return DFL_ERR;
        if (t->n_prompt != np || memcmp(t->prompt, pids, (size_t)np * sizeof *pids) != 0)
            return dfl_seterr("%s/%s: recorded from other prompt ids than prompt %s turn %d has now (another prompt "
                              "file, --chat or tokenizer?)", o->save_features, saved->file, p->id, turn + 1);
        /* resumed: the saved truth; its online line is there unless a crash fell in between */
        char mode[32];
        const char *method = rec_row(r, mode, sizeof mode);
        if (done_find(&r->done, p->id, turn, r->label[0], mode, method, "dfl") < 0 ||
            (o->check_ar && done_find(&r->done, p->id, turn, "", "ar", "online", "dfl") < 0)) {
            if (record(r, p->id, turn, pids, np, t, out, last_tau)) return DFL_ERR;
            recorded = 1;
        }
    } else {
        if (record(r, p->id, turn, pids, np, t, out, last_tau)) return DFL_ERR;
        recorded = 1;
        if (o->save_features && save_truth(r, p->id, turn, index, t)) return DFL_ERR;
    }
    if (recorded && check_reference(r, p->id, turn, pids, np, t->ids, t->n)) return DFL_ERR;
    *n_truth = t->n;
    memcpy(truth, t->ids, (size_t)t->n * sizeof *truth);
    if (replay_all(r, p->id, turn, t, "dfl", recorded, last_tau)) return DFL_ERR;
    return replay_more(r, p, p->id, turn, index, t, last_tau);
}

/* ---- setup -------------------------------------------------------------------------------- */

int eval_opts_check(const eval_opts *o) {
    if (!o->n_drafters || !o->out) return dfl_seterr("needs at least one --drafter and --out");
    if (!o->features_dir && (!o->target || !o->prompts)) return dfl_seterr("needs --target and --prompts");
    if (o->protocol == EVAL_PROTOCOL_ZLAB && o->chat != DFL_CHAT_CHATML_NOTHINK)
        return dfl_seterr("--protocol zlab uses Qwen3's template with thinking off (--chat chatml-nothink)");
    if (o->protocol == EVAL_PROTOCOL_ZLAB && o->features_dir)
        return dfl_seterr("--protocol zlab builds prompts: not with --features (the saved truths hold theirs)");
    if (o->dump_prompts && o->features_dir) return dfl_seterr("--dump-prompts: not with --features (no prompts are built)");
    if (o->dist && (o->save_features || o->dump_prompts || o->reference || o->reference_url))
        return dfl_seterr("a run spread over processes (MPI) writes results.jsonl and the reports only: "
                          "--save-features, --dump-prompts, --reference and --reference-url need one process "
                          "(or --shard i/n per process and dfl eval-merge)");
    if (o->features_dir && o->prompts) return dfl_seterr("--features replays the saved prompts: give no --prompts");
    if (o->train_metrics && (o->online || o->dist))
        return dfl_seterr("--train-metrics scores recorded truths: it needs replay (not --online) in one process "
                          "(not MPI; --shard i/n per process works)");
    if ((o->top_k > 0 || (o->top_p > 0 && o->top_p < 1)) && !(o->temperature > 0))
        return dfl_seterr("--top-k / --top-p filter sampling: they need --temperature > 0 (and --online)");
    if (o->top_k < 0 || o->top_p < 0 || o->top_p > 1)
        return dfl_seterr("--top-k must be >= 0 and --top-p in [0, 1]");
    if (o->train_chat >= 0 && (!o->train_metrics || o->train_chat == o->chat || o->features_dir))
        return dfl_seterr("--train-chat scores the responses after prompts in another template: it needs "
                          "--train-metrics, a template other than --chat's, and a target (not --features)");
    if (o->train_metrics && (o->train_anchors < 1 || o->train_topk < 1 || o->train_gamma < 0))
        return dfl_seterr("--train-anchors and --train-top-k must be >= 1, --train-gamma >= 0");
    if (o->reference && o->reference_url) return dfl_seterr("give --reference or --reference-url, not both");
    if (o->repeat < 1 || o->repeat > EVAL_MAX_REPEAT) return dfl_seterr("--repeat: 1 to %d runs", EVAL_MAX_REPEAT);
    if (o->n_modes < 1 || o->n_modes > EVAL_MAX_MODES) return dfl_seterr("1 to %d modes", EVAL_MAX_MODES);
    for (int k = 0; k < o->n_modes; k++) {
        const int lim = o->online ? DDTREE_MAX_BUDGET : DDTREE_MAX_NODES;
        if (o->budgets[k] < 0 || o->budgets[k] > lim)
            return dfl_seterr("--tree-budget %d: must be in [0, %d]%s", o->budgets[k], lim,
                              o->online ? " online (the target verifies the tree; replay goes further)" : "");
        if (o->budgets[k] && (o->temperature > 0 || o->top_k > 0 || (o->top_p > 0 && o->top_p < 1)))
            return dfl_seterr("DDTree (--tree-budget > 0) is greedy: it cannot be combined with --temperature");
    }
    if (o->online) {
        if (o->features_dir || o->features_from || o->save_features || o->check_ar || o->record_budget != -1)
            return dfl_seterr("--online runs every drafter x mode on the target: --features, --features-from, "
                              "--save-features, --check-ar and --record-mode belong to replay");
    } else {
        if (o->repeat > 1)
            return dfl_seterr("--repeat %d repeats the timed runs of --online; replay's speedups are modeled from "
                              "target costs measured at the start (their repetitions: --cost-reps)", o->repeat);
        if (o->temperature > 0)
            return dfl_seterr("replay is exact at temperature 0 only (at T > 0 the target's sampled continuation "
                              "depends on the drafter's proposals): use --online for sampled evaluation");
        if (o->features_dir && (o->save_features || o->check_ar || o->record_budget != -1))
            return dfl_seterr("--features runs no target forward: --save-features, --check-ar and --record-mode "
                              "need a recording run");
        if (o->features_dir && o->device != DFL_DEVICE_CPU)
            return dfl_seterr("--features runs no target forward: --device does not apply (the results are marked "
                              "with the device the truths were recorded on)");
        if (o->record_budget >= 0) {
            if (o->record_budget > DDTREE_MAX_BUDGET)
                return dfl_seterr("--record-mode ddtree-%d: the target verifies at most %d nodes", o->record_budget,
                                  DDTREE_MAX_BUDGET);
        } else if (o->record_budget == -1 && o->budgets[0] > DDTREE_MAX_BUDGET) {
            return dfl_seterr("the first mode (ddtree-%d) is the recording mode, but the target verifies at most %d "
                              "nodes: give --record-mode", o->budgets[0], DDTREE_MAX_BUDGET);
        }
    }
    return DFL_OK;
}

/* Exclusive use of a directory (--out, --save-features) while the run writes it. */
static int lock_dir(const char *dir, const char *what, int *fd) {
    char *path = dfl_path_join(dir, ".lock");
    *fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    int rc = DFL_OK;
    if (*fd < 0) rc = dfl_seterr("%s: cannot open: %s", path, strerror(errno));
    else if (flock(*fd, LOCK_EX | LOCK_NB) != 0)
        rc = dfl_seterr("%s: another dfl eval is writing this directory (%s is locked); wait for it or use another "
                        "%s", dir, path, what);
    free(path);
    return rc;
}

static int take_lock(run *r) { return lock_dir(r->o->out, "--out", &r->lock_fd); }

/* The saved truths of features directory dir hold decoder layer k (its target.json says so). */
static int saved_layer(const char *dir, int k) {
    char *path = dfl_path_join(dir, "target.json");
    char *txt = path ? dfl_read_file(path, NULL) : NULL;
    cJSON *o = txt ? cJSON_Parse(txt) : NULL;
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(o, "layers");
    int found = 0;
    for (const cJSON *x = cJSON_IsArray(l) ? l->child : NULL; x && !found; x = x->next)
        found = cJSON_IsNumber(x) && x->valuedouble == k;
    cJSON_Delete(o);
    free(txt), free(path);
    dfl_clearerr();
    return found;
}

/* A DFlash drafter fills its blocks with the mask token its training added: a mask_token_id that
 * is an ordinary token of the tokenizer (an id past the tokenizer, in the padded embedding, is
 * fine: z-lab's drafters use one) is most likely wrong and costs τ silently. Said on stderr now
 * and at the top of summary.md. */
static int check_mask_tokens(run *r) {
    char *buf = NULL;
    size_t len = 0;
    FILE *m = r->tok ? open_memstream(&buf, &len) : NULL;
    if (!m) return r->tok ? dfl_seterr("out of memory") : DFL_OK;
    for (int d = 0; d < r->n_open; d++) {
        const int32_t id = r->ad[d].d.cfg.mask_token_id;
        if (r->ad[d].kind == DFL_DRAFTER_MTP || !tok_has_id(r->tok, id) || tok_is_added(r->tok, id)) continue;
        char *txt = tok_decode(r->tok, &id, 1, 0);
        fprintf(m, "- **%s: mask_token_id %d is an ordinary token** (", r->label[d], id);
        dfl_json_write_string(m, txt ? txt : "?");
        fprintf(m, "), not a special or added token of the tokenizer: the drafter reads a real word where its training "
                   "put the mask, which costs τ silently. Check dflash_config.mask_token_id against the tokenizer it "
                   "was trained with.\n");
        logf_(r, "dfl eval: warning: drafter %s: mask_token_id %d is an ordinary token of the tokenizer (%s), not a "
                 "special or added one: check dflash_config.mask_token_id against the tokenizer it was trained with\n",
              r->label[d], id, txt ? txt : "?");
        free(txt);
    }
    fclose(m);
    if (len) r->warn_md = buf;
    else free(buf);
    return DFL_OK;
}

static int open_drafters(run *r) {
    const eval_opts *o = r->o;
    for (; r->n_open < o->n_drafters; r->n_open++) {
        dfl_any_drafter *a = &r->ad[r->n_open];
        char warn[512];
        if (anydrafter_open(a, o->drafters[r->n_open], &r->m, r->m.dir, o->block, 0, warn, sizeof warn) != DFL_OK)
            return DFL_ERR;
        if (warn[0]) logf_(r, "dfl eval: warning: %s\n", warn);
        if (o->block_attn != DFL_BLOCK_ATTN_AUTO && anydrafter_set_causal(a, o->block_attn) != DFL_OK) {
            anydrafter_close(a);
            return dfl_preperr("--block-attn");
        }
        if (a->kind == DFL_DRAFTER_MTP) { /* labelled by the checkpoint its head comes from */
            const size_t len = strlen(a->mtp.dir) + 8;
            if ((r->label[r->n_open] = malloc(len))) snprintf(r->label[r->n_open], len, "mtp (%s)", a->mtp.dir);
        } else {
            r->label[r->n_open] = strdup(o->drafters[r->n_open]);
        }
        if (!r->label[r->n_open]) {
            anydrafter_close(a);
            return dfl_seterr("out of memory");
        }
        r->block[r->n_open] = a->block;
        r->max_block = a->block > r->max_block ? a->block : r->max_block;
    }
    /* the truth's layers: every drafter's, and --save-layers */
    int all[EVAL_MAX_FEAT_LAYERS * 2], n = 0;
    for (int d = 0; d < o->n_drafters; d++) {
        const int *ids;
        const int nd = anydrafter_feature_layers(&r->ad[d], &ids);
        for (int i = 0; i < nd && n < EVAL_MAX_FEAT_LAYERS; i++) all[n++] = ids[i];
    }
    if (o->n_save_layers < 0)
        for (int k = 0; k < r->m.cfg.n_layers && n < 2 * EVAL_MAX_FEAT_LAYERS; k++) all[n++] = k;
    for (int i = 0; i < o->n_save_layers && n < 2 * EVAL_MAX_FEAT_LAYERS; i++) {
        if (o->save_layers[i] < 0 || o->save_layers[i] >= r->m.cfg.n_layers)
            return dfl_seterr("--save-layers: layer %d does not exist; the target has decoder layers 0..%d",
                              o->save_layers[i], r->m.cfg.n_layers - 1);
        all[n++] = o->save_layers[i];
    }
    /* --train-metrics: the target's last layer gives its distribution (unless saved truths lack it) */
    const int last = r->m.cfg.n_layers - 1;
    if (o->train_metrics && n < 2 * EVAL_MAX_FEAT_LAYERS && (!r->from_features || saved_layer(o->features_dir, last)))
        all[n++] = last;
    eval_truth t;
    if (eval_truth_init(&t, r->m.cfg.hidden, all, n)) return DFL_ERR;
    r->n_layers = t.n_layers;
    memcpy(r->layers, t.layers, sizeof r->layers);
    r->last_col = o->train_metrics ? eval_truth_column(&t, last) : -1;
    int read = o->n_save_layers < 0;
    for (int i = 0; i < n - (r->last_col >= 0); i++) read |= all[i] == last;
    r->last_optional = r->last_col >= 0 && !read ? last : -1;
    for (int d = 0; d < o->n_drafters; d++) {
        const int *ids;
        const int nd = anydrafter_feature_layers(&r->ad[d], &ids);
        for (int i = 0; i < nd; i++) r->col[d][i] = eval_truth_column(&t, ids[i]);
    }
    return DFL_OK;
}

/* The states, sized for the longest unit: ctx positions, batch tokens per forward. */
static int alloc_states(run *r, int max_ctx, int batch) {
    const eval_opts *o = r->o;
    if (!r->from_features) {
        if (state_init(&r->st, &r->m, max_ctx, batch, 1) != DFL_OK) return DFL_ERR;
        r->have_state = 1;
        int online_trees = 0;
        if (o->online) online_trees = r->max_budget;
        else online_trees = r->rec_budget;
        if (online_trees && state_enable_tree(&r->st, online_trees + 1) != DFL_OK) return DFL_ERR;
    }
    for (; r->n_dstate < o->n_drafters; r->n_dstate++) {
        const int d = r->n_dstate;
        if (anydrafter_state_init(&r->ad[d], &r->m, max_ctx, &r->dif[d]) != DFL_OK) return DFL_ERR;
    }
    if (!o->online)
        for (; r->n_cache < o->n_drafters; r->n_cache++)
            if (eval_draft_cache_init(&r->cache[r->n_cache], r->max_budget, r->m.cfg.vocab, r->block[r->n_cache]))
                return DFL_ERR;
    return DFL_OK;
}

static void write_costs_json(FILE *x, const eval_costs *c) {
    fprintf(x, "{\"measured\": %s, \"context\": %d, \"reps\": %d, \"chain\": {", c->ok ? "true" : "false", c->context,
            c->reps);
    for (int i = 0; i < c->n_chain; i++) fprintf(x, "%s\"%d\": %.6f", i ? ", " : "", c->chain_n[i], c->chain_s[i]);
    fprintf(x, "}, \"chain_median\": {");
    for (int i = 0; i < c->n_chain; i++) fprintf(x, "%s\"%d\": %.6f", i ? ", " : "", c->chain_n[i], c->chain_med[i]);
    for (int med = 0; med < 2; med++) {
        fprintf(x, "}, \"%s\": {", med ? "tree_median" : "tree");
        for (int i = 0; i < c->n_tree; i++) {
            fprintf(x, "%s\"%d\": ", i ? ", " : "", c->tree_budget[i]);
            if (c->tree_s[i] >= 0) fprintf(x, "%.6f", med ? c->tree_med[i] : c->tree_s[i]);
            else fprintf(x, "null");
        }
    }
    fprintf(x, "}, \"note\": ");
    dfl_json_write_string(x, c->note);
    fprintf(x, "}");
}

/* The number under key "k" of o, 0 when there is none. */
static double number_at(const cJSON *o, int k) {
    char key[16];
    snprintf(key, sizeof key, "%d", k);
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(x) ? x->valuedouble : 0;
}

/* target.json of a features directory: the costs measured when recording (for the modeled
 * speedup of later runs that have no target forward). */
static int costs_load(eval_costs *c, const char *dir) {
    memset(c, 0, sizeof *c);
    char *path = dfl_path_join(dir, "target.json");
    char *txt = dfl_read_file(path, NULL);
    free(path);
    if (!txt) {
        dfl_clearerr();
        return DFL_OK;
    }
    cJSON *o = cJSON_Parse(txt);
    free(txt);
    const cJSON *co = cJSON_GetObjectItemCaseSensitive(o, "costs");
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(co, "measured"))) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(co, "chain")) {
            if (c->n_chain < EVAL_MAX_COSTS && cJSON_IsNumber(e) && atoi(e->string) >= 1) {
                c->chain_n[c->n_chain] = atoi(e->string);
                c->chain_s[c->n_chain++] = e->valuedouble;
            }
        }
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(co, "tree")) {
            if (c->n_tree < EVAL_MAX_COSTS && atoi(e->string) >= 1) {
                c->tree_budget[c->n_tree] = atoi(e->string);
                c->tree_s[c->n_tree++] = cJSON_IsNumber(e) ? e->valuedouble : -1;
            }
        }
        const cJSON *cm = cJSON_GetObjectItemCaseSensitive(co, "chain_median"); /* absent in older recordings */
        const cJSON *tm = cJSON_GetObjectItemCaseSensitive(co, "tree_median");
        for (int i = 0; i < c->n_chain; i++) c->chain_med[i] = number_at(cm, c->chain_n[i]);
        for (int i = 0; i < c->n_tree; i++) c->tree_med[i] = number_at(tm, c->tree_budget[i]);
        const cJSON *ctx = cJSON_GetObjectItemCaseSensitive(co, "context"), *reps = cJSON_GetObjectItemCaseSensitive(co, "reps");
        c->context = cJSON_IsNumber(ctx) ? (int)ctx->valuedouble : 0;
        c->reps = cJSON_IsNumber(reps) ? (int)reps->valuedouble : 0;
        c->ok = c->n_chain > 0;
        snprintf(c->note, sizeof c->note, "measured when the features were recorded (target.json)");
    }
    cJSON_Delete(o);
    return DFL_OK;
}

/* complete: written false before the first truth is saved, true once the run has saved every
 * truth of its prompts (a --features run over a directory that says false says so). */
static int write_target_json(run *r, int complete) {
    char *path = dfl_path_join(r->o->save_features, "target.json");
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        int rc = dfl_seterr("%s: cannot create: %s", tmp, strerror(errno));
        free(path);
        return rc;
    }
    fprintf(f, "{\"format\": \"dfl-features-1\", \"target\": ");
    dfl_json_write_string(f, r->o->target);
    fprintf(f, ", \"config_hash\": \"%s\", \"weights_hash\": \"%s\", \"layout\": \"%s\", \"dtype\": \"%s\", "
               "\"layers\": [", r->id.config_hash, r->id.weights_hash, r->id.layout, r->id.dtype);
    for (int i = 0; i < r->n_layers; i++) fprintf(f, "%s%d", i ? ", " : "", r->layers[i]);
    fprintf(f, "], \"max_new\": %d, \"prompts_file\": ", r->max_new);
    dfl_json_write_string(f, r->o->prompts);
    fprintf(f, ", \"recorder\": \"dfl\", \"complete\": %s, \"costs\": ", complete ? "true" : "false");
    write_costs_json(f, &r->costs);
    fprintf(f, "}\n");
    const int bad = ferror(f);
    int rc = fclose(f) == 0 && !bad ? DFL_OK : dfl_seterr("%s: write error: %s", tmp, strerror(errno));
    if (rc == DFL_OK && rename(tmp, path) != 0) rc = dfl_seterr("%s: cannot rename into place: %s", path, strerror(errno));
    if (rc != DFL_OK) unlink(tmp);
    free(path);
    return rc;
}

/* --features FDIR: FDIR/target.json says "complete": false when the recording run that saved the
 * features did not finish (absent in directories saved before the field existed: complete). */
static int features_complete(run *r, const char *dir) {
    char *path = dfl_path_join(dir, "target.json");
    char *txt = dfl_read_file(path, NULL);
    int rc = DFL_OK;
    if (!txt) {
        dfl_clearerr();
    } else {
        cJSON *o = cJSON_Parse(txt);
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, "complete");
        const cJSON *rec = cJSON_GetObjectItemCaseSensitive(o, "recorder");
        if (!o) rc = dfl_seterr("%s: not valid JSON", path);
        else if (c && !cJSON_IsBool(c)) rc = dfl_seterr("%s: field 'complete': expected true or false", path);
        else if (rec && !cJSON_IsString(rec)) rc = dfl_seterr("%s: field 'recorder': expected a string", path);
        else if (cJSON_IsFalse(c)) {
            char msg[8600];
            snprintf(msg, sizeof msg, "%s: the recording run that saved these features did not finish (target.json "
                     "\"complete\": false): %s/manifest.jsonl lists %d saved truths, the others are missing; complete "
                     "it with dfl eval --resume --save-features %s (and the recording's options)", dir, dir,
                     r->saved.n, dir);
            if (!(r->feat_incomplete = strdup(msg))) rc = dfl_seterr("out of memory");
        }
        if (rc == DFL_OK && cJSON_IsString(rec)) snprintf(r->recorder, sizeof r->recorder, "%s", rec->valuestring);
        cJSON_Delete(o);
        free(txt);
    }
    free(path);
    return rc;
}

static const char *chat_name(int chat) {
    return chat == DFL_CHAT_NONE ? "none" : chat == DFL_CHAT_CHATML ? "chatml" : "chatml-nothink";
}

/* What summary.md's settings name besides the options runs must share (eval_run_differs compares
 * none of these): the drafters, the prompt format, the protocol, where and how it ran. */
static void run_settings(const run *r, cJSON *j) {
    const eval_opts *o = r->o;
    cJSON *d = cJSON_AddArrayToObject(j, "drafters");
    for (int i = 0; i < r->n_open; i++) cJSON_AddItemToArray(d, cJSON_CreateString(r->label[i]));
    char fmt[160];
    if (r->from_features) snprintf(fmt, sizeof fmt, "saved truths (--features)");
    else if (o->protocol) snprintf(fmt, sizeof fmt, "%s, as z-lab's benchmark formats it", eval_zlab_dataset_name(r->zlab_dataset));
    else {
        eval_format_name(o->have_fmt ? o->fmt : eval_format_sniff(o->prompts), o->field, fmt, sizeof fmt - 16);
        if (!o->have_fmt) strcat(fmt, " (detected)");
    }
    cJSON_AddStringToObject(j, "prompt_format", fmt);
    cJSON_AddStringToObject(j, "protocol", o->protocol ? "zlab" : "none");
    if (o->protocol) cJSON_AddStringToObject(j, "protocol_dataset", eval_zlab_dataset_name(r->zlab_dataset));
    cJSON_AddNumberToObject(j, "limit", o->limit);
    cJSON_AddNumberToObject(j, "threads", omp_get_max_threads());
    cJSON_AddStringToObject(j, "isa", kn_isa_name(kn_isa_get()));
    cJSON_AddStringToObject(j, "device", dfl_device_name((dfl_device)r->device));
}

/* This run's description (run.json): its options and the prompts of its units. */
static cJSON *run_object(const run *r, const int *list, int n) {
    const eval_opts *o = r->o;
    cJSON *j = cJSON_CreateObject();
    char shard[32];
    snprintf(shard, sizeof shard, "%d/%d", o->shard_i, o->shard_n);
    cJSON_AddStringToObject(j, "format", EVAL_RUN_FORMAT);
    cJSON_AddStringToObject(j, "method", r->from_features ? "replay-from-features" : r->replay ? "replay" : "online");
    cJSON_AddStringToObject(j, "target", r->m.dir);
    cJSON_AddStringToObject(j, "target_config_hash", r->id.config_hash);
    cJSON_AddStringToObject(j, "target_weights_hash", r->id.weights_hash);
    cJSON_AddStringToObject(j, "activations", kn_act_get() == KN_ACT_BF16 ? "bf16" : "f32");
    cJSON_AddNumberToObject(j, "max_new", r->max_new);
    cJSON_AddStringToObject(j, "chat", chat_name(o->chat));
    cJSON_AddBoolToObject(j, "first_turn", o->first_turn);
    cJSON_AddNumberToObject(j, "temperature", o->temperature);
    if (o->top_k > 0) cJSON_AddNumberToObject(j, "top_k", o->top_k); /* absent: off (runs before them compare) */
    if (o->top_p > 0 && o->top_p < 1) cJSON_AddNumberToObject(j, "top_p", o->top_p);
    cJSON_AddNumberToObject(j, "seed", (double)o->seed);
    cJSON_AddStringToObject(j, "accept_rule",
                            o->temperature > 0 ? spec_accept_rule_name((dfl_accept_rule)o->accept_rule) : "greedy");
    cJSON_AddStringToObject(j, "prompts_file", o->prompts ? o->prompts : o->features_dir ? o->features_dir : "");
    cJSON_AddStringToObject(j, "shard", shard);
    cJSON_AddStringToObject(j, "block_attn", drafter_causal_name(o->block_attn));
    run_settings(r, j);
    /* every prompt of the file (or saved truths), whichever shard runs it: shards of one run share it */
    cJSON *all = cJSON_CreateObject();
    const int n_all = r->from_features ? r->saved.n : r->ps.n;
    for (int i = 0; i < n_all; i++) {
        char h[24] = "";
        const char *id = r->from_features ? r->saved.u[i].prompt_id : r->ps.p[i].id;
        if (r->from_features) snprintf(h, sizeof h, "%s", r->saved.u[i].prompt_hash);
        else eval_prompt_hash(&r->ps.p[i], o->first_turn, h);
        if (!cJSON_GetObjectItemCaseSensitive(all, id))
            cJSON_AddItemToObject(all, id, h[0] ? cJSON_CreateString(h) : cJSON_CreateNull());
    }
    char ah[24], ai[24];
    const int na = eval_prompt_set(all, ah, ai);
    cJSON_Delete(all);
    cJSON *as = cJSON_AddObjectToObject(j, "all_prompts");
    cJSON_AddNumberToObject(as, "prompts", na);
    cJSON_AddItemToObject(as, "hash", ah[0] ? cJSON_CreateString(ah) : cJSON_CreateNull());
    cJSON_AddStringToObject(as, "ids_hash", ai);
    cJSON *ps = cJSON_AddObjectToObject(j, "prompts");
    for (int k = 0; k < n; k++) {
        char h[24] = "";
        const char *id;
        if (r->from_features) {
            const unit *u = &r->saved.u[list[k]];
            id = u->prompt_id;
            snprintf(h, sizeof h, "%s", u->prompt_hash);
        } else {
            id = r->ps.p[list[k]].id;
            eval_prompt_hash(&r->ps.p[list[k]], o->first_turn, h);
        }
        if (cJSON_GetObjectItemCaseSensitive(ps, id)) continue; /* a second turn's unit */
        cJSON_AddItemToObject(ps, id, h[0] ? cJSON_CreateString(h) : cJSON_CreateNull());
    }
    return j;
}

/* Write DIR/run.json before any result. Resumed: the run it continues (its run.json) must have
 * had the same options and, under every prompt id both have, the same prompt; its other prompts
 * are kept (their lines are in results.jsonl). */
static int write_run_json(run *r, const int *list, int n) {
    const eval_opts *o = r->o;
    char *path = dfl_path_join(o->out, "run.json");
    cJSON *j = run_object(r, list, n), *old = NULL;
    int rc = j ? DFL_OK : dfl_seterr("out of memory");
    char *txt = rc == DFL_OK && o->resume ? dfl_read_file(path, NULL) : NULL;
    if (!txt) dfl_clearerr();
    if (txt && !(old = cJSON_Parse(txt))) rc = dfl_seterr("%s: not valid JSON", path);
    free(txt);
    char msg[300];
    if (rc == DFL_OK && old && eval_run_differs(old, j, msg, sizeof msg))
        rc = dfl_seterr("%s: the run being resumed had other options (%s): resume it with the same options, or "
                        "use another --out", path, msg);
    const cJSON *e, *ps = cJSON_GetObjectItemCaseSensitive(j, "prompts");
    if (rc == DFL_OK && old) cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(old, "prompts")) {
        const cJSON *now = e->string ? cJSON_GetObjectItemCaseSensitive(ps, e->string) : NULL;
        if (!now && e->string) {
            cJSON_AddItemToObject((cJSON *)ps, e->string, cJSON_Duplicate(e, 1));
        } else if (now && cJSON_IsString(now) && cJSON_IsString(e) && strcmp(now->valuestring, e->valuestring) != 0) {
            rc = dfl_seterr("%s: prompt %s is not the prompt of that id in the run being resumed (another prompt "
                            "file, or an edited prompt): use another --out", path, e->string);
            break;
        }
    }
    cJSON_Delete(old);
    char *out = rc == DFL_OK ? cJSON_Print(j) : NULL;
    if (rc == DFL_OK && !out) rc = dfl_seterr("out of memory");
    if (rc == DFL_OK) {
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        FILE *f = fopen(tmp, "w");
        if (!f) rc = dfl_seterr("%s: cannot create: %s", tmp, strerror(errno));
        else {
            fputs(out, f);
            fputc('\n', f);
            const int bad = ferror(f);
            if (fclose(f) != 0 || bad) rc = dfl_seterr("%s: write error: %s", tmp, strerror(errno));
            if (rc == DFL_OK && rename(tmp, path) != 0)
                rc = dfl_seterr("%s: cannot rename into place: %s", path, strerror(errno));
            if (rc != DFL_OK) unlink(tmp);
        }
    }
    free(out);
    free(path);
    if (rc == DFL_OK) r->desc = j;
    else cJSON_Delete(j);
    return rc;
}

/* summary.json's run.prompt_set: the prompts results.jsonl holds, with their hashes from run.json. */
static void write_prompt_set(FILE *x, const run *r) {
    cJSON *ps = cJSON_CreateObject();
    const cJSON *known = cJSON_GetObjectItemCaseSensitive(r->desc, "prompts");
    for (int i = 0; ps && i < r->done.n; i++) {
        const char *id = r->done.r[i].prompt_id;
        if (cJSON_GetObjectItemCaseSensitive(ps, id)) continue;
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(known, id);
        cJSON_AddItemToObject(ps, id, cJSON_IsString(h) ? cJSON_CreateString(h->valuestring) : cJSON_CreateNull());
    }
    char hash[24], ids[24];
    const int n = eval_prompt_set(ps, hash, ids);
    fprintf(x, ", \"prompt_set\": {\"prompts\": %d, \"hash\": ", n);
    if (hash[0]) fprintf(x, "\"%s\"", hash);
    else fprintf(x, "null");
    fprintf(x, ", \"ids_hash\": \"%s\"}", ids);
    cJSON_Delete(ps);
}

/* missing: a spread run's units that no process finished (the dist's message), or NULL */
/* The training-metrics report's inputs: train.jsonl summed, the run's settings, the cost. */
static int train_report_in(const run *r, const eval_summary *sm, tm_agg **ag, int *n, tm_report_in *ti) {
    const eval_opts *o = r->o;
    memset(ti, 0, sizeof *ti);
    if (tm_run_aggregate(r->tm.path, ag, n)) return DFL_ERR;
    ti->ag = *ag, ti->n = *n, ti->s = sm;
    ti->gamma = o->train_gamma > 0 ? o->train_gamma : tm_default_gamma(r->block[0]);
    ti->num_anchors = o->train_anchors, ti->top_k = o->train_topk, ti->seed = (uint64_t)o->seed;
    double train_s = 0, replay_s = 0;
    for (int i = 0; i < *n; i++) train_s += (*ag)[i].draft_s;
    for (int i = 1; i < sm->n_agg; i++)
        if (strcmp(sm->agg[i].method, "replay") == 0 && strcmp(sm->agg[i].mode, "chain") == 0) replay_s += sm->agg[i].draft_s;
    if (replay_s > 0)
        snprintf(ti->cost_note, sizeof ti->cost_note, "Cost: the training metrics drafted a block at every anchor, "
                 "%.2f s of drafter time, %.1fx the chain replay's %.2f s (one block per round).", train_s,
                 train_s / replay_s, replay_s);
    if (o->train_chat >= 0) snprintf(ti->alt_chat, sizeof ti->alt_chat, "%s", chat_name(o->train_chat));
    if (r->last_col < 0)
        snprintf(ti->exp_note, sizeof ti->exp_note, "No expected acceptance at T = 1: the saved truths lack the "
                 "target's last layer (record them with --train-metrics, or --save-layers %d).", r->m.cfg.n_layers - 1);
    return DFL_OK;
}

/* The summary's checks: the settings, flagged responses, the costs of the modeled speedups (why:
 * the reason they fail, n bytes), the mask-token warnings. */
static void summary_checks(run *r, eval_summary *sm, char *why, size_t n) {
    sm->run = r->desc;
    sm->warnings_md = r->warn_md;
    eval_summary_outputs(sm, r->done.r, r->done.ids, r->done.n_ids, r->done.n, r->max_new);
    if (!r->replay || !r->costs.ok) return;
    const eval_agg *ar = &sm->agg[0]; /* with --check-ar: the autoregressive step this run measured */
    const double step = ar->time_s > 0 && ar->tokens > ar->responses ? ar->time_s / (ar->tokens - ar->responses) : 0;
    sm->modeled_checked = 1;
    if (eval_costs_check(&r->costs, step, why, n)) return;
    sm->modeled_warning = why;
    logf_(r, "dfl eval: warning: the modeled speedups are unreliable: %s (summary.md says so too)\n", why);
}

/* The index of drafter label d in this run (EVAL_MAX_DRAFTERS when it is not one of them). */
static int drafter_index(const run *r, const char *d) {
    for (int i = 0; i < r->n_open; i++)
        if (strcmp(r->label[i], d) == 0) return i;
    return EVAL_MAX_DRAFTERS;
}

/* Each row's τ and speedups on stderr; an alarm, once per drafter, for one that accepts nothing. */
static void log_rows(const run *r, const eval_summary *sm) {
    int dead[EVAL_MAX_DRAFTERS + 1] = {0};
    for (int a = 1; a < sm->n_agg; a++) {
        const eval_agg *g = &sm->agg[a];
        const double sp = eval_agg_speedup(g), spm = eval_agg_speedup_modeled(g);
        logf_(r, "[dfl eval] %s %s: tau %.3f (token-weighted %.3f)", g->label, g->mode, eval_agg_tau(g),
              eval_agg_tau_tokens(g));
        if (sp > 0) logf_(r, ", speedup %.2fx", sp);
        if (spm > 0) logf_(r, ", modeled speedup %.2fx%s", spm, sm->modeled_warning ? " (unreliable)" : "");
        logf_(r, "\n");
        if (g->mismatches) logf_(r, "[dfl eval]   %d mismatches\n", g->mismatches);
        if (g->rounds && eval_agg_tau(g) <= EVAL_TAU_DEAD && !dead[drafter_index(r, g->drafter)]++)
            logf_(r, "dfl eval: warning: drafter %s accepts (almost) nothing (tau %.3f, %s %s): %s\n", g->drafter,
                  eval_agg_tau(g), g->label, g->mode, EVAL_DEAD_HINT);
    }
}

static int write_summary(run *r, const char *missing) {
    const eval_opts *o = r->o;
    done_free(&r->done);
    if (load_done(&r->done, r->res_path, r->device) != DFL_OK) return DFL_ERR;
    eval_summary sm;
    eval_summarize(&sm, r->done.r, r->done.n);
    char why[1024];
    summary_checks(r, &sm, why, sizeof why);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    char *extra = NULL;
    size_t extra_len = 0;
    FILE *x = open_memstream(&extra, &extra_len);
    char mode[32];
    rec_row(r, mode, sizeof mode);
    fprintf(x, "\"run\": {\"method\": \"%s\", \"target\": ", r->from_features ? "replay-from-features"
                                                            : r->replay        ? "replay"
                                                                               : "online");
    dfl_json_write_string(x, r->m.dir);
    fprintf(x, ", \"prompts_file\": ");
    dfl_json_write_string(x, o->prompts ? o->prompts : "");
    if (r->replay && !r->from_features) {
        fprintf(x, ", \"recording\": {\"drafter\": ");
        dfl_json_write_string(x, r->label[0]);
        fprintf(x, ", \"mode\": \"%s\", \"checked_against_autoregressive\": %s}", mode, o->check_ar ? "true" : "false");
    }
    if (o->features_dir || o->save_features) {
        fprintf(x, ", \"features_dir\": ");
        dfl_json_write_string(x, o->features_dir ? o->features_dir : o->save_features);
    }
    if (o->features_from) {
        fprintf(x, ", \"features_from\": ");
        dfl_json_write_string(x, o->features_from);
    }
    fprintf(x, ", \"feature_layers\": [");
    for (int i = 0; i < r->n_layers; i++) fprintf(x, "%s%d", i ? ", " : "", r->layers[i]);
    fprintf(x, "], \"accept_rule\": \"%s\"",
            o->temperature > 0 ? spec_accept_rule_name((dfl_accept_rule)o->accept_rule) : "greedy");
    fprintf(x, ", \"max_new\": %d, \"chat\": \"%s\", \"temperature\": %g, \"seed\": %ld, \"shard\": \"%d/%d\", "
               "\"threads\": %d, \"weight_bytes\": %llu, \"state_bytes\": %llu, \"peak_rss_bytes\": %ld, "
               "\"bad_prompt_lines\": [",
            r->max_new, o->chat == DFL_CHAT_NONE ? "none" : o->chat == DFL_CHAT_CHATML ? "chatml" : "chatml-nothink",
            o->temperature, o->seed, o->shard_i, o->shard_n, omp_get_max_threads(),
            (unsigned long long)r->m.weight_bytes, (unsigned long long)(r->have_state ? r->st.bytes : 0),
            ru.ru_maxrss * 1024L);
    for (int i = 0; i < r->ps.n_bad; i++) fprintf(x, "%s%d", i ? ", " : "", r->ps.bad_lines[i]);
    fprintf(x, "], \"block_attention\": [");
    for (int d = 0; d < r->n_open; d++) {
        fprintf(x, "%s{\"drafter\": ", d ? ", " : "");
        dfl_json_write_string(x, r->label[d]);
        anydrafter_attn_json(x, &r->ad[d]);
        fputc('}', x);
    }
    fprintf(x, "]");
    write_prompt_set(x, r);
    fprintf(x, ", \"truth_recorder\": "); /* what produced the truths (target.json "recorder"; absent: dfl) */
    dfl_json_write_string(x, r->recorder);
    fprintf(x, "}");
    if (missing) { /* the run is incomplete: what is missing, for scripts (mpirun may exit 0) */
        fprintf(x, ",\n  \"incomplete\": ");
        dfl_json_write_string(x, missing);
    }
    if (o->protocol == EVAL_PROTOCOL_ZLAB) {
        fprintf(x, ",\n  \"protocol\": {\"name\": \"zlab\", \"dataset\": \"%s\", \"shuffle_seed\": %d, \"max_samples\": ",
                eval_zlab_dataset_name(r->zlab_dataset), EVAL_ZLAB_SEED);
        if (o->limit > 0) fprintf(x, "%d", o->limit);
        else fprintf(x, "null");
        fprintf(x, ", \"selected\": %d, ", r->ps.n);
        eval_zlab_format_json(x, r->zlab_dataset);
        fprintf(x, ", \"chat\": \"qwen3, thinking off\", \"max_new\": %d, \"max_new_default\": %d, \"tau\": \"tau\"}",
                r->max_new, EVAL_ZLAB_MAX_NEW);
    }
    if (r->replay) {
        fprintf(x, ",\n  \"costs\": ");
        write_costs_json(x, &r->costs);
    }
    if (o->reference || o->reference_url) {
        fprintf(x, ",\n  \"reference\": {\"source\": ");
        dfl_json_write_string(x, o->reference ? o->reference : o->reference_url);
        fprintf(x, ", \"compared\": %d, \"identical\": %d, \"diverged\": %d, \"details\": \"reference.jsonl\"}",
                r->ref_compared, r->ref_agree, r->ref_compared - r->ref_agree);
    }
    tm_agg *tag = NULL;
    int n_tag = 0, rc = DFL_OK;
    char *md = NULL; /* sections after the tables */
    size_t md_len = 0;
    FILE *mdx = open_memstream(&md, &md_len);
    if (!mdx) rc = dfl_seterr("out of memory");
    for (int d = 0; mdx && d < r->n_open; d++) /* which block attention ran: it changes tau silently */
        if (anydrafter_attn_semantics(&r->ad[d]))
            fprintf(mdx, "%s%s: %s", d ? "; " : "\nBlock attention (--block-attn): ", r->label[d],
                    anydrafter_attn_semantics(&r->ad[d]));
    if (mdx && r->n_open) fputs(".\n", mdx);
    if (mdx && r->from_features) /* whose truths were replayed: dfl's recording or another recorder's */
        fprintf(mdx, "\nTruths recorded by %s (%s/target.json)%s.\n", r->recorder, o->features_dir,
                r->costs.ok ? "" : "; no target costs were measured when recording, so no modeled speedup");
    if (rc == DFL_OK && o->train_metrics) {
        tm_report_in ti;
        rc = train_report_in(r, &sm, &tag, &n_tag, &ti);
        if (rc == DFL_OK && n_tag) {
            fprintf(x, ",\n  ");
            tm_report_json(&ti, x);
            tm_report_md(&ti, mdx);
            char *svg = dfl_path_join(o->out, "train_vs_serve.svg");
            rc = tm_report_svg(&ti, svg);
            free(svg);
        }
    }
    if (rc == DFL_OK && o->features_from) {
        char *fp = dfl_path_join(o->out, "features_check.jsonl");
        rc = eval_feat_check_report(fp, mdx, x);
        free(fp);
    }
    if (mdx) fclose(mdx);
    fclose(x);
    if (rc == DFL_OK) rc = eval_write_reports(&sm, o->out, extra, md);
    free(md), free(tag);
    if (rc == DFL_OK) log_rows(r, &sm);
    if (o->reference || o->reference_url)
        logf_(r, "[dfl eval] reference: %d of %d outputs identical\n", r->ref_agree, r->ref_compared);
    eval_summary_free(&sm);
    free(extra);
    return rc;
}

static void run_free(run *r) {
    const eval_opts *o = r->o;
    tm_run_close(&r->tm);
    if (r->fcf) fclose(r->fcf);
    if (r->resf) fclose(r->resf);
    if (r->reff) fclose(r->reff);
    if (r->manf) fclose(r->manf);
    if (r->dumpf) fclose(r->dumpf);
    free(r->res_path), free(r->ref_path), free(r->acc), free(r->saved.u);
    done_free(&r->done);
    ref_set_free(&r->refs);
    if (r->tok) tok_close(r->tok);
    for (int d = 0; d < r->n_cache; d++) eval_draft_cache_free(&r->cache[d]);
    if (r->have_state) state_free(&r->st);
    for (int d = 0; d < EVAL_MAX_DRAFTERS; d++) free(r->label[d]);
    for (int d = 0; d < r->n_open; d++) anydrafter_close(&r->ad[d]);
    if (r->have_model) model_close(&r->m);
    if (r->lock_fd > 0) close(r->lock_fd);
    if (r->feat_lock_fd > 0) close(r->feat_lock_fd);
    free(r->feat_incomplete), free(r->warn_md);
    cJSON_Delete(r->desc);
    eval_prompts_free(&r->ps);
    (void)o;
}

/* The buffers a unit runs in: the truth, an output, and the sizes they were made for. */
typedef struct unit_bufs {
    eval_truth t;
    int32_t *truth, *out; /* [max_new + max_block] */
    int max_ctx, tree_slots;
} unit_bufs;

/* A saved truth (--features): replayed unless every line is there. */
static int run_saved(run *r, int i, unit_bufs *b, double *last_tau) {
    const eval_opts *o = r->o;
    const unit *u = &r->saved.u[i];
    if (unit_complete(r, u->prompt_id, u->turn)) return DFL_OK;
    int rc = load_truth(r, o->features_dir, u, &b->t);
    if (rc == DFL_OK) rc = check_reference(r, u->prompt_id, u->turn, b->t.prompt, b->t.n_prompt, b->t.ids, b->t.n);
    if (rc == DFL_OK) rc = replay_all(r, u->prompt_id, u->turn, &b->t, "dfl", 0, last_tau);
    if (rc == DFL_OK) rc = replay_more(r, NULL, u->prompt_id, u->turn, u->index, &b->t, last_tau);
    return rc;
}

/* Prompt i, every turn: replay or online. */
static int run_prompt(run *r, int i, unit_bufs *b, double *last_tau) {
    const eval_opts *o = r->o;
    const eval_prompt *p = &r->ps.p[i];
    char *answer1 = NULL;
    int rc = DFL_OK;
    for (int turn = 0; turn < (o->first_turn ? 1 : p->n_turns) && rc == DFL_OK; turn++) {
        char *txt = turn_text(p, turn, answer1 ? answer1 : "", (dfl_chat)o->chat);
        int32_t *pids = NULL;
        size_t np = 0;
        rc = tok_encode(r->tok, txt, strlen(txt), &pids, &np);
        if (rc == DFL_OK && r->dumpf)
            rc = dump_prompt(r->dumpf, o->dump_prompts, i, p, turn, answer1 ? answer1 : "", txt, pids, np);
        free(txt);
        const int maxpos = r->m.cfg.max_position;
        if (rc == DFL_OK && maxpos > 0 && (long)np + r->max_new > maxpos)
            rc = dfl_seterr("prompt %s turn %d: %zu prompt tokens + --max-new %d = %ld positions exceed the target's "
                            "max_position_embeddings %d", p->id, turn + 1, np, r->max_new, (long)np + r->max_new,
                            maxpos);
        if (rc == DFL_OK && (int)np + r->max_new + b->tree_slots > b->max_ctx)
            rc = dfl_seterr("prompt %s turn %d: %zu tokens + --max-new %d exceed the context %d", p->id, turn + 1, np,
                            r->max_new, b->max_ctx);
        int n_truth = 0;
        if (rc == DFL_OK)
            rc = r->replay ? unit_replay(r, p, i, turn, pids, (int)np, &b->t, b->out, b->truth, &n_truth, last_tau)
                           : unit_online(r, p->id, turn, pids, (int)np, b->truth, &n_truth, b->out, last_tau);
        if (rc == DFL_OK && turn == 0 && !o->first_turn && p->n_turns > 1)
            answer1 = prompt_decode(r->tok, b->truth, (size_t)n_truth, NULL);
        free(pids);
    }
    free(answer1);
    return rc;
}

/* Every line of an online turn is there: the autoregressive run and each drafter x mode. */
static int online_complete(const run *r, const char *pid, int turn) {
    const eval_opts *o = r->o;
    if (done_find(&r->done, pid, turn, "", "ar", "online", "dfl") < 0) return 0;
    char mode[32];
    for (int d = 0; d < o->n_drafters; d++)
        for (int mi = 0; mi < o->n_modes; mi++) {
            mode_name(o->budgets[mi], mode, sizeof mode);
            if (done_find(&r->done, pid, turn, o->drafters[d], mode, "online", "dfl") < 0) return 0;
        }
    return 1;
}

/* Every line of every unit in list[0..n) is in results.jsonl already. */
static int all_complete(const run *r, const int *list, int n) {
    const eval_opts *o = r->o;
    for (int k = 0; k < n; k++) {
        if (r->from_features) {
            const unit *u = &r->saved.u[list[k]];
            if (!unit_complete(r, u->prompt_id, u->turn)) return 0;
            continue;
        }
        const eval_prompt *p = &r->ps.p[list[k]];
        for (int turn = 0; turn < (o->first_turn ? 1 : p->n_turns); turn++)
            if (!(r->replay ? unit_complete(r, p->id, turn) : online_complete(r, p->id, turn))) return 0;
    }
    return 1;
}

/* Hand the units to the dist: names, weights, what results.jsonl holds of each. */
static int plan_units(run *r, const int *list, const long *weight, int n) {
    const eval_opts *o = r->o;
    char **names = calloc((size_t)n + 1, sizeof *names), **held = calloc((size_t)n + 1, sizeof *held);
    int *complete = calloc((size_t)n + 1, sizeof *complete);
    int rc = names && held && complete ? DFL_OK : dfl_seterr("out of memory");
    for (int k = 0; k < n && rc == DFL_OK; k++) {
        const char *pid;
        if (r->from_features) {
            const unit *u = &r->saved.u[list[k]];
            pid = u->prompt_id;
            complete[k] = unit_complete(r, pid, u->turn);
            names[k] = malloc(strlen(pid) + 16);
            if (names[k]) sprintf(names[k], u->turn ? "%s turn 2" : "%s", pid);
        } else {
            const eval_prompt *p = &r->ps.p[list[k]];
            pid = p->id;
            complete[k] = 1;
            for (int turn = 0; turn < (o->first_turn ? 1 : p->n_turns); turn++)
                complete[k] &= r->replay ? unit_complete(r, pid, turn) : online_complete(r, pid, turn);
            names[k] = strdup(pid);
        }
        held[k] = done_text(&r->done, pid);
        if (!names[k] || !held[k]) rc = dfl_seterr("out of memory");
    }
    if (rc == DFL_OK) rc = o->dist->plan(o->dist->ud, n, names, weight, complete, held);
    for (int k = 0; names && held && k < n; k++) free(names[k]), free(held[k]);
    free(names), free(held), free(complete);
    return rc;
}

int eval_run(const eval_opts *o, eval_outcome *res) {
    run rr, *r = &rr;
    memset(r, 0, sizeof *r);
    r->o = o;
    r->lock_fd = r->feat_lock_fd = -1;
    r->max_new = o->max_new;
    r->replay = !o->online;
    r->from_features = o->features_dir != NULL;
    r->device = o->device;
    r->rec_auto = o->record_budget == EVAL_RECORD_AUTO;
    snprintf(r->recorder, sizeof r->recorder, "dfl");
    r->rec_budget = o->record_budget >= 0 ? o->record_budget : r->rec_auto ? 0 : o->budgets[0];
    for (int k = 0; k < o->n_modes; k++) r->max_budget = o->budgets[k] > r->max_budget ? o->budgets[k] : r->max_budget;
    memset(res, 0, sizeof *res);
    int rc = eval_opts_check(o);
    if (rc) return rc;

    /* every input is checked before any work */
    const char *target = o->target;
    char rec_target[4096] = "";
    if (r->from_features) {
        if ((rc = manifest_load(&r->saved, o->features_dir, 1))) goto out;
        if (r->saved.n == 0) {
            rc = dfl_seterr("%s/manifest.jsonl lists no saved truths", o->features_dir);
            goto out;
        }
        if ((rc = features_complete(r, o->features_dir))) goto out;
        if (r->feat_incomplete) logf_(r, "dfl eval: warning: %s\n", r->feat_incomplete);
        char *p0 = dfl_path_join(o->features_dir, r->saved.u[0].file);
        st_model st = {0};
        if ((rc = st_open_file(&st, p0)) == DFL_OK) {
            rc = st_meta_get(&st, 0, "target", rec_target, sizeof rec_target);
            char mx[32];
            if (rc == DFL_OK && st_meta_get(&st, 0, "max_new", mx, sizeof mx) == DFL_OK) {
                char *end;
                const long v = strtol(mx, &end, 10);
                if (end == mx || *end || v < 1 || v > 1 << 24)
                    rc = dfl_seterr("%s: __metadata__ max_new: expected an integer in [1, %d], found '%s'", p0, 1 << 24,
                                    mx);
                r->max_new = (int)v;
            }
            /* the device the truths were recorded on (absent: the CPU): the results are marked with it */
            if (rc == DFL_OK && st_meta_get(&st, 0, "device", mx, sizeof mx) == DFL_OK &&
                (r->device = eval_device_lookup(mx)) < 0)
                rc = dfl_seterr("%s: __metadata__ device: expected cpu or cuda, found '%s'", p0, mx);
            if (rc == DFL_OK && o->max_new_set && o->max_new != r->max_new)
                rc = dfl_seterr("%s: recorded with --max-new %d; a replay cannot give another --max-new (%d)", p0,
                                r->max_new, o->max_new);
            st_close(&st);
        }
        free(p0);
        if (rc) goto out;
        if (!target) target = rec_target;
    } else {
        if ((rc = load_prompts(&r->ps, o, &r->zlab_dataset))) goto out;
        for (int i = 0; i < r->ps.n_bad; i++)
            logf_(r, "dfl eval: %s:%d: malformed prompt line skipped\n", o->prompts, r->ps.bad_lines[i]);
    }
    if ((rc = model_open(&r->m, target, 0))) {
        if (r->from_features && !o->target)
            dfl_preperr("the target the features were recorded on (give --target for its embedding and lm_head)");
        goto out;
    }
    r->have_model = 1;
    /* --device: can it run here (no usable GPU: said now); the weights go there after the checks */
    if (!r->from_features && (rc = dfl_device_check((dfl_device)o->device))) goto out;
    if ((rc = eval_target_identity(&r->m, &r->id))) goto out;
    if ((rc = open_drafters(r))) goto out;
    if (!r->from_features || o->reference) {
        if (tok_locate(o->tokenizer, target, r->from_features ? "--reference needs" : "the prompts need") ||
            !(r->tok = tok_open(o->tokenizer ? o->tokenizer : target))) {
            rc = DFL_ERR;
            goto out;
        }
    }
    if ((rc = check_mask_tokens(r))) goto out;
    if (o->reference && (rc = ref_file_load(&r->refs, o->reference, r->tok))) goto out;
    /* a worker of a spread run writes nothing: its lines go to the writer */
    const int writes = !o->dist || o->dist->writer;
    if (writes && ((rc = mkdir_p(o->out)) || (rc = take_lock(r)))) goto out;
    if (o->save_features) {
        if ((rc = mkdir_p(o->save_features)) || (rc = lock_dir(o->save_features, "--save-features", &r->feat_lock_fd)))
            goto out;
        if ((rc = manifest_load(&r->saved, o->save_features, 0))) goto out;
        if (!o->resume && r->saved.n > 0) {
            rc = dfl_seterr("%s/manifest.jsonl already lists %d saved truths: use --resume to continue that "
                            "recording, or another --save-features", o->save_features, r->saved.n);
            goto out;
        }
        char *mp = dfl_path_join(o->save_features, "manifest.jsonl");
        r->manf = fopen(mp, o->resume ? "a" : "w");
        free(mp);
        if (!r->manf) {
            rc = dfl_seterr("%s/manifest.jsonl: cannot write", o->save_features);
            goto out;
        }
    }
    if (o->dump_prompts && !(r->dumpf = fopen(o->dump_prompts, "w"))) {
        rc = dfl_seterr("%s: cannot create: %s", o->dump_prompts, strerror(errno));
        goto out;
    }
    r->res_path = dfl_path_join(o->out, "results.jsonl");
    r->ref_path = dfl_path_join(o->out, "reference.jsonl");
    if (writes) {
        struct stat stt;
        if (!o->resume && stat(r->res_path, &stt) == 0 && stt.st_size > 0) {
            rc = dfl_seterr("%s already holds results: use --resume to continue it, or another --out", r->res_path);
            goto out;
        }
        if ((rc = load_done(&r->done, r->res_path, r->device))) goto out;
        if (o->resume && stat(r->res_path, &stt) == 0 && r->done.good_end < stt.st_size &&
            truncate(r->res_path, r->done.good_end) != 0) {
            rc = dfl_seterr("%s: cannot drop the partial last line", r->res_path);
            goto out;
        }
        /* spread: the writer's dist appends the lines (its own and the others') */
        r->resf = o->dist ? NULL : fopen(r->res_path, o->resume ? "a" : "w");
        r->reff = (o->reference || o->reference_url) ? fopen(r->ref_path, o->resume ? "a" : "w") : NULL;
        if ((!o->dist && !r->resf) || ((o->reference || o->reference_url) && !r->reff)) {
            rc = dfl_seterr("%s: cannot write", o->out);
            goto out;
        }
        r->tm.num_anchors = o->train_anchors, r->tm.seed = (uint64_t)o->seed, r->tm.blocks = o->train_batch;
        if (o->train_metrics && (rc = tm_run_open(&r->tm, o->out, o->resume))) goto out;
        if (o->features_from) {
            char *fp = dfl_path_join(o->out, "features_check.jsonl");
            r->fcf = fp ? fopen(fp, o->resume ? "a" : "w") : NULL;
            free(fp);
            if (!r->fcf) {
                rc = dfl_seterr("%s/features_check.jsonl: cannot write: %s", o->out, strerror(errno));
                goto out;
            }
        }
    }

    /* sizes: the longest unit; second turns add an answer and a question. The units this process
     * may run: the prompts (or saved truths) of its shard, weighed by their tokens. */
    int max_prompt = 0, n_all = r->from_features ? r->saved.n : r->ps.n;
    int *list = malloc((size_t)(n_all + 1) * sizeof *list), n_units = 0;
    long *weight = malloc((size_t)(n_all + 1) * sizeof *weight);
    if (!list || !weight) {
        free(list), free(weight);
        rc = dfl_seterr("out of memory");
        goto out;
    }
    if (r->from_features) {
        for (int i = 0; i < r->saved.n; i++) {
            const unit *u = &r->saved.u[i];
            if (u->index % o->shard_n != o->shard_i) continue;
            weight[n_units] = u->prompt_tokens + u->tokens;
            list[n_units++] = i;
            max_prompt = u->prompt_tokens > max_prompt ? u->prompt_tokens : max_prompt;
        }
    } else {
        for (int i = 0; i < r->ps.n; i++) {
            int need = 0;
            long w = 0;
            for (int t = 0; t < (o->first_turn ? 1 : r->ps.p[i].n_turns); t++) {
                char *txt = prompt_format(r->ps.p[i].turns[t], (dfl_chat)o->chat);
                int32_t *ids;
                size_t n;
                if (tok_encode(r->tok, txt, strlen(txt), &ids, &n) != DFL_OK) {
                    free(txt);
                    free(list), free(weight);
                    rc = dfl_preperr("prompt %s", r->ps.p[i].id);
                    goto out;
                }
                need += (int)n + (t ? r->max_new + 8 : 0);
                w += (long)n + r->max_new;
                free(ids);
                free(txt);
                /* a first turn past the positions the target was trained for: refused before any work
                 * (a second turn's length is known once the first is answered: checked then) */
                const int maxpos = r->m.cfg.max_position;
                if (t == 0 && maxpos > 0 && (long)n + r->max_new > maxpos) {
                    free(list), free(weight);
                    rc = dfl_seterr("%s:%d: prompt %s: %zu prompt tokens + --max-new %d = %ld positions exceed the "
                                    "target's max_position_embeddings %d (drop the prompt, shorten it or lower "
                                    "--max-new)", o->prompts, r->ps.p[i].line, r->ps.p[i].id, n, r->max_new,
                                    (long)n + r->max_new, maxpos);
                    goto out;
                }
            }
            max_prompt = need > max_prompt ? need : max_prompt;
            if (i % o->shard_n == o->shard_i) weight[n_units] = w, list[n_units++] = i;
        }
    }
    rc = writes ? write_run_json(r, list, n_units) : DFL_OK;
    if (rc == DFL_OK && o->dist) rc = plan_units(r, list, weight, n_units);
    free(weight);
    /* lines will be added: the reports of what results.jsonl held no longer describe it (a run that
     * ends early, or a spread run whose writer dies, must not leave them as if they did) */
    if (rc == DFL_OK && writes && !all_complete(r, list, n_units)) rc = eval_remove_reports(o->out);
    if (rc) {
        free(list);
        goto out;
    }
    const int tree_slots = o->online ? r->max_budget : r->rec_budget;
    const int max_ctx = o->max_ctx ? o->max_ctx : max_prompt + r->max_new + tree_slots + r->max_block;
    const int chunk = max_prompt < 512 ? max_prompt : 512;
    int batch = chunk > r->max_block ? chunk : r->max_block;
    if (tree_slots + 1 > batch) batch = tree_slots + 1;
    if (!r->from_features && o->device != DFL_DEVICE_CPU) { /* the target's forwards run there, the drafters here */
        const double t0 = dfl_now();
        if ((rc = model_use_device(&r->m, (dfl_device)o->device))) {
            free(list);
            goto out;
        }
        logf_(r, "dfl eval: target on %s (%.2f GB of weights uploaded in %.1f s)\n",
              dfl_device_name((dfl_device)o->device), r->m.weight_bytes / 1e9, dfl_now() - t0);
    }
    r->batch = batch;
    if ((rc = alloc_states(r, max_ctx, batch))) {
        free(list);
        goto out;
    }

    /* the target's costs for the modeled speedup, on the first prompt */
    if (r->replay && !r->from_features && o->cost_reps > 0 && r->ps.n > 0) {
        char *txt = prompt_format(r->ps.p[0].turns[0], (dfl_chat)o->chat);
        int32_t *ids = NULL;
        size_t n = 0;
        rc = tok_encode(r->tok, txt, strlen(txt), &ids, &n);
        free(txt);
        if (rc == DFL_OK)
            rc = eval_costs_measure(&r->costs, &r->m, &r->dif[0], ids, (int)n, r->block, o->n_drafters, o->budgets,
                                    o->n_modes, o->cost_reps);
        free(ids);
    } else if (r->from_features) {
        costs_load(&r->costs, o->features_dir);
    }
    if (rc == DFL_OK && o->save_features) rc = write_target_json(r, 0);
    if (rc) {
        free(list);
        goto out;
    }

    unit_bufs ub = {.truth = malloc((size_t)(r->max_new + r->max_block) * sizeof(int32_t)),
                    .out = malloc((size_t)(r->max_new + r->max_block) * sizeof(int32_t)),
                    .max_ctx = max_ctx, .tree_slots = tree_slots};
    eval_truth_init(&ub.t, r->m.cfg.hidden, r->layers, r->n_layers);
    eval_progress pg = {.total = n_units};
    for (int j = 0; rc == DFL_OK; j++) {
        int k;
        if (o->dist) { /* the unit the dist hands out, with the lines held for it */
            char *held = NULL;
            rc = o->dist->next(o->dist->ud, &k, &held);
            if (rc == DFL_OK && k >= 0 && held) rc = done_add_text(&r->done, held, r->device);
            free(held);
            if (rc || k < 0) break;
        } else if (j == n_units) {
            break;
        } else {
            k = j;
        }
        double last_tau = 0;
        rc = r->from_features ? run_saved(r, list[k], &ub, &last_tau) : run_prompt(r, list[k], &ub, &last_tau);
        pg.done++, pg.last_tau = last_tau;
        pg.what = r->from_features ? r->saved.u[list[k]].prompt_id : r->ps.p[list[k]].id;
        if (rc == DFL_OK && o->on_progress) o->on_progress(o->progress_ud, &pg);
    }
    free(list);
    eval_truth_free(&ub.t);
    free(ub.truth);
    free(ub.out);
    char *missing = NULL; /* a spread run: the writer waits for the others and names what is missing */
    if (rc == DFL_OK && o->dist && o->dist->writer && o->dist->finish(o->dist->ud) != DFL_OK)
        missing = strdup(dfl_errmsg());
    if (rc == DFL_OK && writes && r->feat_incomplete) { /* the features hold only part of the prompts */
        const size_t n = strlen(r->feat_incomplete) + (missing ? strlen(missing) + 2 : 0) + 1;
        char *m = malloc(n);
        if (m) snprintf(m, n, "%s%s%s", missing ? missing : "", missing ? "; " : "", r->feat_incomplete);
        free(missing);
        missing = m;
    }
    if (rc == DFL_OK && o->save_features) rc = write_target_json(r, 1); /* every truth is saved */
    if (rc == DFL_OK && writes) {
        if (r->resf) fclose(r->resf);
        r->resf = NULL;
        rc = write_summary(r, missing);
    }
    if (rc == DFL_OK && missing) rc = dfl_seterr("%s", missing);
    free(missing);
out:
    *res = r->res;
    run_free(r);
    return rc;
}

int eval_dump_prompts(const eval_opts *o) {
    if (!o->prompts || !o->dump_prompts) return dfl_seterr("--dump-prompts needs --prompts");
    if (!o->tokenizer && !o->target) return dfl_seterr("--dump-prompts needs --tokenizer (or --target)");
    if (o->protocol == EVAL_PROTOCOL_ZLAB && o->chat != DFL_CHAT_CHATML_NOTHINK)
        return dfl_seterr("--protocol zlab uses Qwen3's template with thinking off (--chat chatml-nothink)");
    eval_prompts ps;
    int d = -1;
    if (tok_locate(o->tokenizer, o->target, "the prompts need")) return DFL_ERR;
    if (load_prompts(&ps, o, &d)) return DFL_ERR;
    dfl_tokenizer *tok = tok_open(o->tokenizer ? o->tokenizer : o->target);
    FILE *f = tok ? fopen(o->dump_prompts, "w") : NULL;
    int rc = tok ? DFL_OK : DFL_ERR;
    if (tok && !f) rc = dfl_seterr("%s: cannot create: %s", o->dump_prompts, strerror(errno));
    for (int i = 0; i < ps.n && rc == DFL_OK; i++) {
        if (i % o->shard_n != o->shard_i) continue;
        const eval_prompt *p = &ps.p[i];
        const int turns = o->first_turn || !o->dump_answer ? 1 : p->n_turns;
        for (int turn = 0; turn < turns && rc == DFL_OK; turn++) {
            char *txt = turn_text(p, turn, o->dump_answer ? o->dump_answer : "", (dfl_chat)o->chat);
            int32_t *ids = NULL;
            size_t n = 0;
            rc = txt ? tok_encode(tok, txt, strlen(txt), &ids, &n) : dfl_seterr("out of memory");
            if (rc == DFL_OK) rc = dump_prompt(f, o->dump_prompts, i, p, turn, o->dump_answer, txt, ids, n);
            else dfl_preperr("prompt %s", p->id);
            free(ids);
            free(txt);
        }
    }
    if (f && fclose(f) != 0 && rc == DFL_OK) rc = dfl_seterr("%s: write error: %s", o->dump_prompts, strerror(errno));
    if (tok) tok_close(tok);
    eval_prompts_free(&ps);
    return rc;
}
