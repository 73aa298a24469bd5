/* DIR/run.json: the run's options and prompts, checked against the run a --resume continues. */
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "dfl/common.h"
#include "dfl/kernels.h"
#include "eval/run.h"

const char *er_chat_name(int chat) {
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
    else if (o->protocol)
        snprintf(fmt, sizeof fmt, "%s, as z-lab's benchmark formats it", eval_zlab_dataset_name(r->zlab_dataset));
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
    cJSON_AddStringToObject(j, "weights", r->m.st.placed_bytes ? "copy" : "map"); /* the target's (speed only) */
}

/* This run's description (run.json): its options and the prompts of its units. */
static cJSON *run_object(const run *r) {
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
    cJSON_AddStringToObject(j, "chat", er_chat_name(o->chat));
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
    for (int k = 0; k < r->n_plan; k++) {
        char h[24] = "";
        const char *id;
        if (r->from_features) {
            const mf_entry *u = &r->saved.u[r->plan[k].item];
            id = u->prompt_id;
            snprintf(h, sizeof h, "%s", u->prompt_hash);
        } else {
            id = r->ps.p[r->plan[k].item].id;
            eval_prompt_hash(&r->ps.p[r->plan[k].item], o->first_turn, h);
        }
        if (cJSON_GetObjectItemCaseSensitive(ps, id)) continue; /* a second turn's unit */
        cJSON_AddItemToObject(ps, id, h[0] ? cJSON_CreateString(h) : cJSON_CreateNull());
    }
    return j;
}

/* Write DIR/run.json before any result. Resumed: the run it continues (its run.json) must have
 * had the same options and, under every prompt id both have, the same prompt; its other prompts
 * are kept (their lines are in results.jsonl). */
int er_write_run_json(run *r) {
    const eval_opts *o = r->o;
    char *path = dfl_path_join(o->out, "run.json");
    cJSON *j = run_object(r), *old = NULL;
    int rc = j ? DFL_OK : dfl_seterr("out of memory");
    char *txt = rc == DFL_OK && o->resume ? dfl_read_file(path, NULL) : NULL;
    if (!txt) dfl_clearerr();
    if (txt && !(old = cJSON_Parse(txt))) rc = dfl_seterr("%s: not valid JSON", path);
    free(txt);
    char msg[300];
    if (rc == DFL_OK && old && eval_run_differs(old, j, msg, sizeof msg))
        rc = dfl_seterr("%s: the run being resumed had other options (%s): resume it with the same options, or "
                        "use another --out",
                        path, msg);
    const cJSON *e, *ps = cJSON_GetObjectItemCaseSensitive(j, "prompts");
    if (rc == DFL_OK && old) cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(old, "prompts")) {
            const cJSON *now = e->string ? cJSON_GetObjectItemCaseSensitive(ps, e->string) : NULL;
            if (!now && e->string) {
                cJSON_AddItemToObject((cJSON *)ps, e->string, cJSON_Duplicate(e, 1));
            } else if (now && cJSON_IsString(now) && cJSON_IsString(e) &&
                       strcmp(now->valuestring, e->valuestring) != 0) {
                rc = dfl_seterr("%s: prompt %s is not the prompt of that id in the run being resumed (another prompt "
                                "file, or an edited prompt): use another --out",
                                path, e->string);
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
