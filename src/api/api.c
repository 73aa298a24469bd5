/* The C API for other languages (include/dfl/dfl_api.h): options arrive as JSON and are parsed
 * into the library's own option structs; the work is the library's (model_inspect, eval_run,
 * spec_generate), the same code the CLI runs. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "dfl/any_drafter.h"
#include "dfl/common.h"
#include "dfl/ddtree.h"
#include "dfl/dfl_api.h"
#include "dfl/drafter.h"
#include "dfl/eval.h"
#include "dfl/inspect.h"
#include "dfl/model.h"
#include "dfl/prompt.h"
#include "dfl/replay.h"
#include "dfl/spec.h"
#include "dfl/tokenizer.h"

const char *dfl_api_version(void) { return DFL_API_VERSION; }
const char *dfl_api_last_error(void) { return dfl_errmsg(); }
void dfl_api_free(void *p) { free(p); }

/* An output string: out is a text stream the caller's char ** receives. */
typedef struct memout {
    FILE *f;
    char *buf;
    size_t len;
} memout;

static int memout_open(memout *m) {
    m->buf = NULL, m->len = 0;
    m->f = open_memstream(&m->buf, &m->len);
    return m->f ? DFL_OK : dfl_seterr("out of memory (open_memstream)");
}

/* Close the stream; on ok hand the text to *out, else drop it. */
static int memout_close(memout *m, int ok, char **out) {
    fclose(m->f);
    if (ok != DFL_OK) {
        free(m->buf);
        return DFL_ERR;
    }
    *out = m->buf;
    return DFL_OK;
}

int dfl_api_inspect(const char *path, const char *target, int check_weights, char **json) {
    if (!path || !json) return dfl_seterr("inspect: path and the result pointer are required (found NULL)");
    dfl_clearerr();
    memout m;
    if (memout_open(&m) != DFL_OK) return DFL_ERR;
    int compatible;
    return memout_close(&m, model_inspect(m.f, NULL, path, target, 1, check_weights, &compatible), json);
}

/* ---- JSON options --------------------------------------------------------------------------- */

static int opt_string(const cJSON *v, const char **out) {
    char b[128];
    if (!cJSON_IsString(v))
        return dfl_seterr("%s: expected a string, found %s", v->string, dfl_json_brief(v, b, sizeof b));
    *out = v->valuestring;
    return DFL_OK;
}

static int opt_bool(const cJSON *v, int *out) {
    char b[128];
    if (!cJSON_IsBool(v))
        return dfl_seterr("%s: expected true or false, found %s", v->string, dfl_json_brief(v, b, sizeof b));
    *out = cJSON_IsTrue(v);
    return DFL_OK;
}

static int opt_long(const cJSON *v, long lo, long hi, long *out) {
    char b[128];
    /* a double holds integers exactly up to 2^53: checked before the cast */
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)(long long)v->valuedouble || v->valuedouble < (double)lo ||
        v->valuedouble > (double)hi)
        return dfl_seterr("%s: expected an integer in [%ld, %ld], found %s", v->string, lo, hi,
                          dfl_json_brief(v, b, sizeof b));
    *out = (long)v->valuedouble;
    return DFL_OK;
}

static int opt_int(const cJSON *v, long lo, long hi, int *out) {
    long x;
    if (opt_long(v, lo, hi, &x) != DFL_OK) return DFL_ERR;
    *out = (int)x;
    return DFL_OK;
}

static int opt_double(const cJSON *v, double lo, double *out) {
    char b[128];
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo))
        return dfl_seterr("%s: expected a number >= %g, found %s", v->string, lo, dfl_json_brief(v, b, sizeof b));
    *out = v->valuedouble;
    return DFL_OK;
}

/* An integer or an array of them, each in [lo, hi], at most max. */
static int opt_int_list(const cJSON *v, long lo, long hi, int *out, int max, int *n) {
    char b[128];
    if (cJSON_IsNumber(v)) {
        *n = 1;
        return opt_int(v, lo, hi, out);
    }
    const int len = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (len < 1 || len > max)
        return dfl_seterr("%s: expected an integer or an array of 1 to %d integers, found %s", v->string, max,
                          dfl_json_brief(v, b, sizeof b));
    int k = 0;
    for (const cJSON *e = v->child; e; e = e->next, k++) {
        long x;
        if (!cJSON_IsNumber(e) || e->valuedouble != (double)(long long)e->valuedouble || e->valuedouble < (double)lo ||
            e->valuedouble > (double)hi)
            return dfl_seterr("%s[%d]: expected an integer in [%ld, %ld], found %s", v->string, k, lo, hi,
                              dfl_json_brief(e, b, sizeof b));
        x = (long)e->valuedouble;
        out[k] = (int)x;
    }
    *n = len;
    return DFL_OK;
}

/* A string or an array of strings, at most max. */
static int opt_string_list(const cJSON *v, const char **out, int max, int *n) {
    char b[128];
    if (cJSON_IsString(v)) {
        *n = 1;
        out[0] = v->valuestring;
        return DFL_OK;
    }
    const int len = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (len < 1 || len > max)
        return dfl_seterr("%s: expected a string or an array of 1 to %d strings, found %s", v->string, max,
                          dfl_json_brief(v, b, sizeof b));
    int k = 0;
    for (const cJSON *e = v->child; e; e = e->next, k++) {
        if (!cJSON_IsString(e))
            return dfl_seterr("%s[%d]: expected a string, found %s", v->string, k, dfl_json_brief(e, b, sizeof b));
        out[k] = e->valuestring;
    }
    *n = len;
    return DFL_OK;
}

static cJSON *parse_object(const char *what, const char *text) {
    if (!text) {
        dfl_seterr("%s: expected a JSON object of options, found NULL", what);
        return NULL;
    }
    cJSON *j = cJSON_Parse(text);
    if (!cJSON_IsObject(j)) {
        char b[128];
        if (j) dfl_seterr("%s: expected a JSON object of options, found %s", what, dfl_json_brief(j, b, sizeof b));
        else
            dfl_seterr("%s: the options are not valid JSON (near byte %ld)", what,
                       (long)(cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - text : 0));
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

/* ---- eval and replay ------------------------------------------------------------------------- */

/* dfl eval's options from JSON: the CLI's names without the dashes, '-' as '_'. Strings point
 * into j, which must outlive o. save_layers: storage for "save_layers". */
static int eval_opts_from_json(eval_opts *o, int *save_layers, const cJSON *j) {
    eval_opts_default(o);
    o->log = stderr;
    int chat_set = 0;
    for (const cJSON *v = j->child; v; v = v->next) {
        const char *k = v->string, *s = NULL;
        int rc = DFL_OK;
        if (!strcmp(k, "target")) rc = opt_string(v, &o->target);
        else if (!strcmp(k, "drafter") || !strcmp(k, "drafters"))
            rc = opt_string_list(v, o->drafters, EVAL_MAX_DRAFTERS, &o->n_drafters);
        else if (!strcmp(k, "prompts")) rc = opt_string(v, &o->prompts);
        else if (!strcmp(k, "out")) rc = opt_string(v, &o->out);
        else if (!strcmp(k, "tokenizer")) rc = opt_string(v, &o->tokenizer);
        else if (!strcmp(k, "format")) {
            if ((rc = opt_string(v, &s)) == DFL_OK &&
                (rc = eval_format_parse(s, &o->fmt, o->field, sizeof o->field)) != DFL_OK)
                dfl_preperr("format");
            o->have_fmt = 1;
        } else if (!strcmp(k, "limit")) rc = opt_int(v, 1, 1 << 30, &o->limit);
        else if (!strcmp(k, "max_new")) rc = opt_int(v, 1, 1 << 20, &o->max_new), o->max_new_set = 1;
        else if (!strcmp(k, "max_context")) rc = opt_int(v, 1, 1 << 24, &o->max_ctx);
        else if (!strcmp(k, "protocol")) {
            if ((rc = opt_string(v, &s)) == DFL_OK && strcmp(s, "zlab"))
                rc = dfl_seterr("protocol: expected \"zlab\", found \"%s\"", s);
            o->protocol = EVAL_PROTOCOL_ZLAB;
        } else if (!strcmp(k, "protocol_dataset")) {
            if ((rc = opt_string(v, &s)) == DFL_OK && (o->zlab_dataset = eval_zlab_dataset_parse(s)) < 0)
                rc = dfl_seterr("protocol_dataset: expected gsm8k, math500, humaneval, mbpp or mt-bench, found \"%s\"",
                                s);
        } else if (!strcmp(k, "chat")) {
            if ((rc = opt_string(v, &s)) == DFL_OK && (o->chat = prompt_chat_parse(s)) < 0)
                rc = dfl_seterr("chat: expected chatml, chatml-nothink or none, found \"%s\"", s);
            chat_set = 1;
        } else if (!strcmp(k, "block_size")) rc = opt_int(v, 2, DFL_MAX_BLOCK, &o->block);
        else if (!strcmp(k, "tree_budget"))
            rc = opt_int_list(v, 0, DDTREE_MAX_NODES, o->budgets, EVAL_MAX_MODES, &o->n_modes);
        else if (!strcmp(k, "record_mode")) {
            if ((rc = opt_string(v, &s)) == DFL_OK && (rc = eval_record_mode_parse(s, &o->record_budget)) != DFL_OK)
                dfl_preperr("record_mode");
        } else if (!strcmp(k, "save_layers")) {
            if (cJSON_IsString(v) && !strcmp(v->valuestring, "all")) o->n_save_layers = -1;
            else
                rc = opt_int_list(v, 0, EVAL_MAX_FEAT_LAYERS - 1, save_layers, EVAL_MAX_FEAT_LAYERS, &o->n_save_layers);
            o->save_layers = save_layers;
        } else if (!strcmp(k, "accept_rule")) {
            if ((rc = opt_string(v, &s)) == DFL_OK && (o->accept_rule = spec_accept_rule_parse(s)) < 0)
                rc = dfl_seterr("accept_rule: expected pq or match, found \"%s\"", s);
        } else if (!strcmp(k, "temperature")) rc = opt_double(v, 0, &o->temperature);
        else if (!strcmp(k, "seed")) rc = opt_long(v, 0, LONG_MAX, &o->seed);
        else if (!strcmp(k, "top_k")) rc = opt_int(v, 0, 1 << 30, &o->top_k);
        else if (!strcmp(k, "top_p")) rc = opt_double(v, 0, &o->top_p);
        else if (!strcmp(k, "repeat")) rc = opt_int(v, 1, EVAL_MAX_REPEAT, &o->repeat);
        else if (!strcmp(k, "cost_reps")) rc = opt_int(v, 0, 100, &o->cost_reps);
        else if (!strcmp(k, "first_turn")) rc = opt_bool(v, &o->first_turn);
        else if (!strcmp(k, "resume")) rc = opt_bool(v, &o->resume);
        else if (!strcmp(k, "keep_going")) rc = opt_bool(v, &o->keep_going);
        else if (!strcmp(k, "online")) rc = opt_bool(v, &o->online);
        else if (!strcmp(k, "check_ar")) rc = opt_bool(v, &o->check_ar);
        else if (!strcmp(k, "save_features")) rc = opt_string(v, &o->save_features);
        else if (!strcmp(k, "features")) rc = opt_string(v, &o->features_dir);
        else if (!strcmp(k, "features_from")) rc = opt_string(v, &o->features_from);
        else if (!strcmp(k, "train_metrics")) rc = opt_bool(v, &o->train_metrics);
        else if (!strcmp(k, "train_anchors")) rc = opt_int(v, 1, 1 << 20, &o->train_anchors);
        else if (!strcmp(k, "train_top_k")) rc = opt_int(v, 1, 1 << 20, &o->train_topk);
        else if (!strcmp(k, "train_batch")) rc = opt_int(v, 1, 32, &o->train_batch);
        else if (!strcmp(k, "train_gamma")) rc = opt_double(v, 1e-9, &o->train_gamma);
        else if (!strcmp(k, "train_chat")) {
            if ((rc = opt_string(v, &s)) == DFL_OK && (o->train_chat = prompt_chat_parse(s)) < 0)
                rc = dfl_seterr("train_chat: expected chatml, chatml-nothink or none, found \"%s\"", s);
        } else if (!strcmp(k, "block_attn") || !strcmp(k, "train_attn")) {
            int c = 0;
            if ((rc = opt_string(v, &s)) == DFL_OK && (rc = drafter_causal_parse(s, &c)) != DFL_OK)
                dfl_preperr("%s", k);
            if (rc == DFL_OK && k[0] == 't' && c == DFL_BLOCK_ATTN_AUTO)
                rc = dfl_seterr("train_attn: expected sliding-causal, bidirectional or causal, found \"auto\"");
            *(k[0] == 'b' ? &o->block_attn : &o->train_attn) = c;
        } else if (!strcmp(k, "reference")) rc = opt_string(v, &o->reference);
        else if (!strcmp(k, "reference_url")) rc = opt_string(v, &o->reference_url);
        else if (!strcmp(k, "dump_prompts")) rc = opt_string(v, &o->dump_prompts);
        else if (!strcmp(k, "shard")) {
            int sh[2] = {0, 1}, n = 0;
            if ((rc = opt_int_list(v, 0, 1 << 20, sh, 2, &n)) == DFL_OK && (n != 2 || sh[1] < 1 || sh[0] >= sh[1]))
                rc = dfl_seterr("shard: expected [i, n] with 0 <= i < n <= %d", 1 << 20);
            o->shard_i = sh[0], o->shard_n = sh[1];
        } else if (!strcmp(k, "device")) {
            dfl_device d = DFL_DEVICE_CPU;
            if ((rc = opt_string(v, &s)) == DFL_OK && (rc = dfl_device_parse(s, &d)) != DFL_OK) dfl_preperr("device");
            o->device = (int)d;
        } else if (!strcmp(k, "quiet")) {
            int q = 0;
            rc = opt_bool(v, &q);
            if (q) o->log = NULL;
        } else
            rc = dfl_seterr("unknown option \"%s\" (the options are dfl eval's without the leading dashes, '-' "
                            "written '_': docs/python.md)",
                            k);
        if (rc != DFL_OK) return DFL_ERR;
    }
    if (o->n_save_layers && !o->save_features) return dfl_seterr("save_layers needs save_features");
    eval_opts_protocol_defaults(o, chat_set);
    return eval_opts_check(o);
}

typedef struct progress_bridge {
    dfl_api_progress_fn fn;
    void *ud;
} progress_bridge;

static void progress_call(void *ud, const eval_progress *p) {
    const progress_bridge *b = ud;
    b->fn(b->ud, p->done, p->total, p->what, p->last_tau);
}

/* eval_run, then summary.json's text. */
static int run_eval(eval_opts *o, dfl_api_progress_fn progress, void *ud, char **summary) {
    progress_bridge b = {progress, ud};
    if (progress) o->on_progress = progress_call, o->progress_ud = &b;
    eval_outcome res;
    if (eval_run(o, &res) != DFL_OK) return DFL_ERR;
    char *path = dfl_path_join(o->out, "summary.json");
    *summary = dfl_read_file(path, NULL);
    free(path);
    return *summary ? DFL_OK : DFL_ERR;
}

int dfl_api_eval(const char *options, dfl_api_progress_fn progress, void *ud, char **summary) {
    dfl_clearerr();
    if (!summary) return dfl_seterr("eval: the result pointer is required (found NULL)");
    cJSON *j = parse_object("eval", options);
    if (!j) return DFL_ERR;
    eval_opts o;
    int save_layers[EVAL_MAX_FEAT_LAYERS];
    int rc = eval_opts_from_json(&o, save_layers, j);
    if (rc == DFL_OK) rc = run_eval(&o, progress, ud, summary);
    else dfl_preperr("eval");
    cJSON_Delete(j);
    return rc;
}

int dfl_api_replay(const char *features_dir, const char *drafter, const int *budgets, int n_budgets,
                   const char *options, dfl_api_progress_fn progress, void *ud, char **summary) {
    dfl_clearerr();
    if (!features_dir || !drafter || !summary)
        return dfl_seterr(
            "replay: the features directory, the drafter and the result pointer are required (found NULL)");
    if (n_budgets < 1 || n_budgets > EVAL_MAX_MODES || !budgets)
        return dfl_seterr("replay: budgets: expected 1 to %d modes, found %d", EVAL_MAX_MODES, n_budgets);
    cJSON *j = parse_object("replay", options ? options : "{}");
    if (!j) return DFL_ERR;
    int rc = DFL_OK;
    for (const char *const *k = (const char *const[]){"features", "drafter", "drafters", "tree_budget", NULL}; *k; k++)
        if (cJSON_GetObjectItemCaseSensitive(j, *k))
            rc = dfl_seterr("replay: option \"%s\" is replay's own argument, not an option", *k);
    eval_opts o;
    int save_layers[EVAL_MAX_FEAT_LAYERS];
    if (rc == DFL_OK) {
        /* the same parse as eval's, with the arguments in place of their options */
        cJSON_AddStringToObject(j, "features", features_dir);
        cJSON_AddStringToObject(j, "drafter", drafter);
        cJSON_AddItemToObject(j, "tree_budget", cJSON_CreateIntArray(budgets, n_budgets));
        if ((rc = eval_opts_from_json(&o, save_layers, j)) != DFL_OK) dfl_preperr("replay");
    }
    if (rc == DFL_OK) rc = run_eval(&o, progress, ud, summary);
    cJSON_Delete(j);
    return rc;
}

/* ---- a loaded target ------------------------------------------------------------------------ */

struct dfl_api_target {
    dfl_model m;
    char *dir;
    dfl_tokenizer *tok; /* opened on the first dfl_api_tokenize */
};

int dfl_api_target_open(const char *dir, dfl_api_target **out) {
    dfl_clearerr();
    if (!dir || !out) return dfl_seterr("target_open: the directory and the handle pointer are required (found NULL)");
    dfl_api_target *t = calloc(1, sizeof *t);
    if (!t) return dfl_seterr("out of memory");
    if (model_open(&t->m, dir, 0) != DFL_OK) {
        free(t);
        return DFL_ERR;
    }
    t->dir = strdup(dir);
    *out = t;
    return DFL_OK;
}

void dfl_api_target_close(dfl_api_target *t) {
    if (!t) return;
    if (t->tok) tok_close(t->tok);
    model_close(&t->m);
    free(t->dir);
    free(t);
}

int dfl_api_target_dims(const dfl_api_target *t, int *n_layers, int *hidden, int *vocab) {
    if (!t) return dfl_seterr("target_dims: no target (found NULL)");
    *n_layers = t->m.cfg.n_layers, *hidden = t->m.cfg.hidden, *vocab = t->m.cfg.vocab;
    return DFL_OK;
}

int dfl_api_tokenize(dfl_api_target *t, const char *text, const char *chat, int32_t **ids, int *n) {
    dfl_clearerr();
    if (!t || !text || !ids || !n) return dfl_seterr("tokenize: target, text and results are required (found NULL)");
    const int mode = prompt_chat_parse(chat ? chat : "none");
    if (mode < 0) return dfl_seterr("chat: expected chatml, chatml-nothink or none, found \"%s\"", chat);
    if (!t->tok && !(t->tok = tok_open(t->dir))) return DFL_ERR;
    char *full = prompt_format(text, (dfl_chat)mode);
    size_t len = 0;
    const int rc = tok_encode(t->tok, full, strlen(full), ids, &len);
    free(full);
    if (rc != DFL_OK) return DFL_ERR;
    *n = (int)len;
    return DFL_OK;
}

int dfl_api_hidden(dfl_api_target *t, const int32_t *ids, int n, const int *layers, int n_layers, float *out) {
    dfl_clearerr();
    if (!t || !ids || !layers || !out)
        return dfl_seterr("hidden: target, ids, layers and out are required (found NULL)");
    const dfl_config *c = &t->m.cfg;
    if (n < 1) return dfl_seterr("hidden: ids: expected at least 1 token, found %d", n);
    if (n_layers < 1 || n_layers > DFL_MAX_LAYERS)
        return dfl_seterr("hidden: layers: expected 1 to %d layers, found %d", DFL_MAX_LAYERS, n_layers);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab)
            return dfl_seterr("hidden: ids[%d]: expected a token id in [0, %d), found %d", i, c->vocab, (int)ids[i]);
    for (int k = 0; k < n_layers; k++)
        if (layers[k] < 0 || layers[k] >= c->n_layers)
            return dfl_seterr("hidden: layers[%d]: expected a decoder layer in [0, %d), found %d", k, c->n_layers,
                              layers[k]);
    if (c->max_position && n > c->max_position)
        return dfl_seterr("hidden: %d tokens exceed the model's max_position_embeddings %d", n, c->max_position);
    dfl_target_state s;
    if (target_state_init(&s, &t->m, n, n, 0) != DFL_OK) return DFL_ERR;
    const size_t H = (size_t)c->hidden;
    float *cap_out = malloc((size_t)n * n_layers * H * sizeof(float));
    dfl_capture cap = {.n_layers = n_layers, .layers = layers, .out = cap_out};
    int rc = cap_out ? model_forward(&s, ids, n, NULL, 0, &cap) : dfl_seterr("out of memory");
    /* the capture is [n][n_layers][H]; the caller wants [n_layers][n][H] */
    for (int k = 0; rc == DFL_OK && k < n_layers; k++)
        for (int p = 0; p < n; p++)
            memcpy(out + ((size_t)k * n + p) * H, cap_out + ((size_t)p * n_layers + k) * H, H * sizeof(float));
    free(cap_out);
    target_state_free(&s);
    return rc;
}

/* ---- generate ------------------------------------------------------------------------------- */

typedef struct gen_args {
    const char *target, *drafter, *prompt, *tokenizer;
    int32_t *ids;
    int n_ids, chat, ignore_eos, accept_rule;
    int max_new, max_ctx, block, budget, top_k, filter_given;
    int block_attn; /* DFL_BLOCK_ATTN_AUTO or the drafter_set_causal value */
    double temperature, top_p;
    long seed;
} gen_args;

static int gen_args_from_json(gen_args *a, const cJSON *j) {
    memset(a, 0, sizeof *a);
    a->max_new = 128;
    a->block_attn = DFL_BLOCK_ATTN_AUTO;
    for (const cJSON *v = j->child; v; v = v->next) {
        const char *k = v->string, *s = NULL;
        int rc = DFL_OK;
        if (!strcmp(k, "target")) rc = opt_string(v, &a->target);
        else if (!strcmp(k, "drafter")) rc = opt_string(v, &a->drafter);
        else if (!strcmp(k, "prompt")) rc = opt_string(v, &a->prompt);
        else if (!strcmp(k, "tokenizer")) rc = opt_string(v, &a->tokenizer);
        else if (!strcmp(k, "prompt_ids")) {
            const int len = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 0;
            if (len < 1) {
                char b[128];
                return dfl_seterr("prompt_ids: expected a non-empty array of token ids, found %s",
                                  dfl_json_brief(v, b, sizeof b));
            }
            int *tmp = malloc((size_t)len * sizeof *tmp);
            rc = opt_int_list(v, 0, INT32_MAX, tmp, len, &a->n_ids);
            a->ids = malloc((size_t)len * sizeof *a->ids);
            for (int i = 0; i < a->n_ids; i++) a->ids[i] = tmp[i];
            free(tmp);
        } else if (!strcmp(k, "chat")) {
            if ((rc = opt_string(v, &s)) == DFL_OK && (a->chat = prompt_chat_parse(s)) < 0)
                rc = dfl_seterr("chat: expected chatml, chatml-nothink or none, found \"%s\"", s);
        } else if (!strcmp(k, "max_new")) rc = opt_int(v, 1, 1 << 24, &a->max_new);
        else if (!strcmp(k, "max_context")) rc = opt_int(v, 1, 1 << 24, &a->max_ctx);
        else if (!strcmp(k, "block_size")) rc = opt_int(v, 1, DFL_MAX_BLOCK, &a->block);
        else if (!strcmp(k, "tree_budget")) rc = opt_int(v, 0, DDTREE_MAX_BUDGET, &a->budget);
        else if (!strcmp(k, "temperature")) rc = opt_double(v, 0, &a->temperature);
        else if (!strcmp(k, "seed")) rc = opt_long(v, 0, LONG_MAX, &a->seed);
        else if (!strcmp(k, "top_p")) {
            char b[128];
            if (!cJSON_IsNumber(v) || !(v->valuedouble > 0 && v->valuedouble <= 1))
                rc = dfl_seterr("top_p: expected a number in (0, 1], found %s", dfl_json_brief(v, b, sizeof b));
            else a->top_p = v->valuedouble, a->filter_given = 1;
        } else if (!strcmp(k, "top_k")) {
            if ((rc = opt_int(v, 0, INT32_MAX, &a->top_k)) == DFL_OK) a->filter_given = 1;
        } else if (!strcmp(k, "ignore_eos")) rc = opt_bool(v, &a->ignore_eos);
        else if (!strcmp(k, "block_attn")) {
            if ((rc = opt_string(v, &s)) == DFL_OK && drafter_causal_parse(s, &a->block_attn) != DFL_OK)
                rc = dfl_seterr("block_attn: expected auto, sliding-causal, bidirectional or causal, found \"%s\"", s);
        } else if (!strcmp(k, "accept_rule")) {
            if ((rc = opt_string(v, &s)) == DFL_OK && (a->accept_rule = spec_accept_rule_parse(s)) < 0)
                rc = dfl_seterr("accept_rule: expected pq or match, found \"%s\"", s);
        } else
            rc = dfl_seterr("unknown option \"%s\" (the options are dfl generate's without the leading dashes, "
                            "'-' written '_': docs/python.md)",
                            k);
        if (rc != DFL_OK) return DFL_ERR;
    }
    if (!a->target) return dfl_seterr("target: required (found nothing)");
    if (!!a->prompt + !!a->ids != 1) return dfl_seterr("give exactly one of prompt and prompt_ids");
    if (a->ids && a->chat) return dfl_seterr("chat applies to a text prompt, not prompt_ids");
    if ((a->block || a->budget) && !a->drafter) return dfl_seterr("block_size and tree_budget need a drafter");
    if (a->block_attn != DFL_BLOCK_ATTN_AUTO && !a->drafter) return dfl_seterr("block_attn needs a drafter");
    if (a->budget && a->temperature > 0)
        return dfl_seterr("tree_budget (DDTree) is greedy: it cannot be combined with temperature > 0");
    if (a->filter_given && !(a->temperature > 0))
        return dfl_seterr("top_p and top_k filter sampling: they need temperature > 0");
    return DFL_OK;
}

/* Tokens each round committed (accepted + 1): the acceptance lengths of dfl generate --json. */
typedef struct rounds {
    int *committed;
    int n, cap;
} rounds;

static void on_round(void *ud, int start, const int32_t *block, int bs, const float *draft, int V, int accepted) {
    (void)start, (void)block, (void)bs, (void)draft, (void)V;
    rounds *r = ud;
    if (r->n < r->cap) r->committed[r->n++] = accepted + 1;
}

/* One generation as dfl generate --json runs it, its JSON to f. */
static int generate(FILE *f, gen_args *a) {
    const double t0 = dfl_now();
    dfl_model m;
    if (model_open(&m, a->target, 0) != DFL_OK) return DFL_ERR;
    dfl_any_drafter ad;
    int have_ad = 0, rc = DFL_OK;
    if (a->drafter) {
        char warning[1024];
        if (anydrafter_open(&ad, a->drafter, &m, a->target, a->block, 0, warning, sizeof warning) != DFL_OK) {
            model_close(&m);
            return DFL_ERR;
        }
        have_ad = 1;
        a->block = ad.block;
        if (anydrafter_set_causal(&ad, a->block_attn) != DFL_OK) {
            anydrafter_close(&ad);
            model_close(&m);
            return dfl_preperr("block_attn");
        }
    }
    const double t_load = dfl_now() - t0;
    /* a tokenizer when there is one: text prompts need it, ids get their text from it */
    const char *tok_path = a->tokenizer ? a->tokenizer : a->target;
    char *tok_file = dfl_path_join(a->target, "tokenizer.json");
    dfl_tokenizer *tok = a->tokenizer || dfl_is_file(tok_file) ? tok_open(tok_path) : NULL;
    free(tok_file);
    int32_t *prompt = NULL;
    size_t n_prompt = 0;
    if (a->ids) {
        prompt = a->ids, n_prompt = (size_t)a->n_ids, a->ids = NULL;
        for (size_t i = 0; i < n_prompt && rc == DFL_OK; i++)
            if (prompt[i] >= m.cfg.vocab)
                rc = dfl_seterr("prompt_ids[%zu]: expected a token id below the vocabulary size %d, found %d", i,
                                m.cfg.vocab, (int)prompt[i]);
    } else if (!tok) {
        rc = dfl_seterr("a text prompt needs a tokenizer: %s (give tokenizer, or the prompt as prompt_ids)",
                        (a->tokenizer || dfl_errmsg()[0]) ? dfl_errmsg() : "no tokenizer.json in the target");
    } else {
        char *full = prompt_format(a->prompt, (dfl_chat)a->chat);
        rc = tok_encode(tok, full, strlen(full), &prompt, &n_prompt);
        free(full);
        if (rc == DFL_OK && !n_prompt) rc = dfl_seterr("prompt: empty (0 tokens)");
    }
    long max_ctx = a->max_ctx ? a->max_ctx : (long)n_prompt + a->max_new + a->budget;
    if (rc == DFL_OK && (long)n_prompt + a->max_new + a->budget > max_ctx)
        rc = dfl_seterr("prompt (%zu tokens) + max_new %d%s exceeds max_context %ld", n_prompt, a->max_new,
                        a->budget ? " + tree_budget" : "", max_ctx);
    if (rc == DFL_OK && m.cfg.max_position && (long)n_prompt + a->max_new > m.cfg.max_position)
        rc = dfl_seterr("%ld positions exceed the model's max_position_embeddings %d", (long)n_prompt + a->max_new,
                        m.cfg.max_position);
    dfl_target_state s;
    int have_s = 0, have_ds = 0;
    dfl_draft_if dif;
    if (rc == DFL_OK) {
        /* the state sizes of dfl generate: prefill chunks of 512, a block, a tree of budget + 1 */
        const int chunk = n_prompt < 512 ? (int)n_prompt : 512;
        int max_batch = chunk > a->block ? chunk : a->block;
        if (a->budget + 1 > max_batch) max_batch = a->budget + 1;
        if (max_batch > max_ctx) max_batch = (int)max_ctx;
        have_s = (rc = target_state_init(&s, &m, (int)max_ctx, max_batch, have_ad)) == DFL_OK;
    }
    if (rc == DFL_OK && a->budget) rc = target_state_enable_tree(&s, a->budget + 1);
    if (rc == DFL_OK && have_ad) have_ds = (rc = anydrafter_state_init(&ad, &m, (int)max_ctx, &dif)) == DFL_OK;
    int32_t *out = rc == DFL_OK ? malloc((size_t)a->max_new * sizeof *out) : NULL;
    /* every round commits at least one token: at most max_new rounds */
    rounds rl = {.committed = rc == DFL_OK ? malloc((size_t)a->max_new * sizeof(int)) : NULL, .cap = a->max_new};
    if (rc == DFL_OK) {
        dfl_gen_opts go = {.max_new = a->max_new,
                           .block = a->block,
                           .temperature = (float)a->temperature,
                           .seed = (uint64_t)a->seed,
                           .ignore_eos = a->ignore_eos,
                           .tree_budget = a->budget,
                           .accept_rule = (dfl_accept_rule)a->accept_rule,
                           .top_p = (float)a->top_p,
                           .top_k = a->top_k};
        if (have_ds) go.on_round = on_round, go.on_round_ud = &rl, go.on_round_no_draft = 1;
        dfl_gen_stats st;
        rc = spec_generate(&s, have_ds ? &dif : NULL, prompt, (int)n_prompt, &go, out, &st, NULL, NULL);
        if (rc == DFL_OK) {
            int unknown = 0;
            char *text = tok ? prompt_decode(tok, out, (size_t)st.generated, &unknown) : NULL;
            fprintf(f, "{\"tokens\": [");
            for (int i = 0; i < st.generated; i++) fprintf(f, "%s%d", i ? ", " : "", out[i]);
            fprintf(f, "], \"text\": ");
            if (tok) dfl_json_write_string(f, text ? text : "");
            else fprintf(f, "null");
            fprintf(f, ", \"unknown_ids\": %d, \"stats\": {", unknown);
            spec_stats_json(f, &st, have_ds, a->budget, rl.committed, rl.n, t_load, m.weight_bytes,
                            s.bytes + (have_ad ? anydrafter_state_bytes(&ad) : 0), max_ctx);
            if (have_ad) anydrafter_attn_json(f, &ad);
            fprintf(f, "}}");
            free(text);
        }
    }
    free(out), free(rl.committed);
    if (have_s) target_state_free(&s);
    free(prompt);
    if (tok) tok_close(tok);
    if (have_ad) anydrafter_close(&ad);
    model_close(&m);
    return rc;
}

int dfl_api_generate(const char *options, char **result) {
    dfl_clearerr();
    if (!result) return dfl_seterr("generate: the result pointer is required (found NULL)");
    cJSON *j = parse_object("generate", options);
    if (!j) return DFL_ERR;
    gen_args a;
    int rc = gen_args_from_json(&a, j);
    memout m;
    if (rc == DFL_OK && (rc = memout_open(&m)) == DFL_OK) rc = memout_close(&m, generate(m.f, &a), result);
    if (rc != DFL_OK) dfl_preperr("generate");
    free(a.ids);
    cJSON_Delete(j);
    return rc;
}
