/* A features directory's bookkeeping: manifest.jsonl (a line per saved truth) and target.json
 * (the layers, the target's costs, whether the recording finished). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "dfl/common.h"
#include "dfl/jsonl.h"
#include "eval/run.h"

/* DIR/manifest.jsonl: a line per saved truth, appended as each is written. */
int er_manifest_load(mf_list *l, const char *dir, int must_exist) {
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
        const cJSON *fi = cJSON_GetObjectItemCaseSensitive(o, "file"),
                    *pid = cJSON_GetObjectItemCaseSensitive(o, "prompt_id");
        const cJSON *ix = cJSON_GetObjectItemCaseSensitive(o, "index"),
                    *tu = cJSON_GetObjectItemCaseSensitive(o, "turn");
        const cJSON *np = cJSON_GetObjectItemCaseSensitive(o, "prompt_tokens"),
                    *nt = cJSON_GetObjectItemCaseSensitive(o, "tokens");
        if (!cJSON_IsString(fi) || !cJSON_IsString(pid) || !cJSON_IsNumber(ix) || !cJSON_IsNumber(tu) ||
            !cJSON_IsNumber(np) || !cJSON_IsNumber(nt) || ix->valuedouble < 0 || ix->valuedouble > 1e9 ||
            (tu->valuedouble != 0 && tu->valuedouble != 1) || np->valuedouble < 1 || np->valuedouble > 1 << 24 ||
            nt->valuedouble < 1 || nt->valuedouble > 1 << 24 || strlen(fi->valuestring) >= sizeof l->u[0].file ||
            strchr(fi->valuestring, '/')) {
            rc = dfl_seterr("%s:%d: expected {\"index\", \"prompt_id\", \"turn\", \"file\", \"prompt_tokens\", "
                            "\"tokens\"}",
                            path, lineno);
        } else {
            l->u = realloc(l->u, (size_t)(l->n + 1) * sizeof *l->u);
            mf_entry *u = &l->u[l->n++];
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

/* The line of prompt index's turn, -1 when there is none. */
int er_manifest_find(const mf_list *l, int index, int turn) {
    for (int i = 0; i < l->n; i++)
        if (l->u[i].index == index && l->u[i].turn == turn) return i;
    return -1;
}

/* A saved truth's line (file name: the truth of prompt index's turn), appended as it is written. */
int er_manifest_append(run *r, int index, int turn, const char *name, const eval_truth *t) {
    const eval_opts *o = r->o;
    fprintf(r->manf, "{\"index\": %d, \"prompt_id\": ", index);
    dfl_json_write_string(r->manf, r->ps.p[index].id);
    char ph[24];
    eval_prompt_hash(&r->ps.p[index], o->first_turn, ph);
    fprintf(r->manf,
            ", \"turn\": %d, \"file\": \"%s\", \"prompt_tokens\": %d, \"tokens\": %d, \"prompt_hash\": \"%s\"}\n", turn,
            name, t->n_prompt, t->n, ph);
    if (fflush(r->manf) != 0)
        return dfl_seterr("%s/manifest.jsonl: write error: %s", o->save_features, strerror(errno));
    return DFL_OK;
}

/* The saved truths of features directory dir hold decoder layer k (its target.json says so). */
int er_saved_layer(const char *dir, int k) {
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

void er_costs_json(FILE *x, const eval_costs *c) {
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
int er_costs_load(eval_costs *c, const char *dir) {
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
        const cJSON *ctx = cJSON_GetObjectItemCaseSensitive(co, "context"),
                    *reps = cJSON_GetObjectItemCaseSensitive(co, "reps");
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
int er_target_json(run *r, int complete) {
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
    fprintf(f,
            ", \"config_hash\": \"%s\", \"weights_hash\": \"%s\", \"layout\": \"%s\", \"dtype\": \"%s\", "
            "\"layers\": [",
            r->id.config_hash, r->id.weights_hash, r->id.layout, r->id.dtype);
    for (int i = 0; i < r->n_layers; i++) fprintf(f, "%s%d", i ? ", " : "", r->layers[i]);
    fprintf(f, "], \"max_new\": %d, \"prompts_file\": ", r->max_new);
    dfl_json_write_string(f, r->o->prompts);
    fprintf(f, ", \"recorder\": \"dfl\", \"complete\": %s, \"costs\": ", complete ? "true" : "false");
    er_costs_json(f, &r->costs);
    fprintf(f, "}\n");
    const int bad = ferror(f);
    int rc = fclose(f) == 0 && !bad ? DFL_OK : dfl_seterr("%s: write error: %s", tmp, strerror(errno));
    if (rc == DFL_OK && rename(tmp, path) != 0)
        rc = dfl_seterr("%s: cannot rename into place: %s", path, strerror(errno));
    if (rc != DFL_OK) unlink(tmp);
    free(path);
    return rc;
}

/* --features FDIR: FDIR/target.json says "complete": false when the recording run that saved the
 * features did not finish (absent in directories saved before the field existed: complete). */
int er_features_complete(run *r, const char *dir) {
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
            snprintf(msg, sizeof msg,
                     "%s: the recording run that saved these features did not finish (target.json "
                     "\"complete\": false): %s/manifest.jsonl lists %d saved truths, the others are missing; complete "
                     "it with dfl eval --resume --save-features %s (and the recording's options)",
                     dir, dir, r->saved.n, dir);
            if (!(r->feat_incomplete = strdup(msg))) rc = dfl_seterr("out of memory");
        }
        if (rc == DFL_OK && cJSON_IsString(rec)) snprintf(r->recorder, sizeof r->recorder, "%s", rec->valuestring);
        cJSON_Delete(o);
        free(txt);
    }
    free(path);
    return rc;
}
