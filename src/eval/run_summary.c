/* The reports of a run: summary.json's run section and extras, summary.md's notes, stderr's rows. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <cjson/cJSON.h>

#include "dfl/common.h"
#include "dfl/kernels.h"
#include "eval/features.h"
#include "eval/run.h"

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
        if (strcmp(sm->agg[i].method, "replay") == 0 && strcmp(sm->agg[i].mode, "chain") == 0)
            replay_s += sm->agg[i].draft_s;
    if (replay_s > 0)
        snprintf(ti->cost_note, sizeof ti->cost_note,
                 "Cost: the training metrics drafted a block at every anchor, "
                 "%.2f s of drafter time, %.1fx the chain replay's %.2f s (one block per round).",
                 train_s, train_s / replay_s, replay_s);
    if (o->train_chat >= 0) snprintf(ti->alt_chat, sizeof ti->alt_chat, "%s", er_chat_name(o->train_chat));
    if (r->last_col < 0)
        snprintf(ti->exp_note, sizeof ti->exp_note,
                 "No expected acceptance at T = 1: the saved truths lack the "
                 "target's last layer (record them with --train-metrics, or --save-layers %d).",
                 r->m.cfg.n_layers - 1);
    return DFL_OK;
}

/* The summary's checks: the settings, flagged responses, the costs of the modeled speedups (why:
 * the reason they fail, n bytes), the mask-token warnings. */
/* Where other processes took cores, the adaptive team's threads waited for them and it ran trials
 * of other team sizes (docs/threads.md): the run's times are those of a shared machine. Appended
 * to the warnings of summary.md and the log. */
static void team_warning(run *r) {
    kn_team_stats t;
    kn_team_stats_get(&t);
    if (!t.trials) return;
    char line[640];
    const int len =
        snprintf(line, sizeof line,
                 "- **Other processes took cores during this run**: the kernels' threads waited for a core, "
                 "and %ld trials of another thread count ran (%ld kept fewer threads; the fewest %d of "
                 "%d, %.2f on average). Measured times, tokens/s and the verification costs behind the "
                 "modeled speedups are those of a shared machine; τ and every other acceptance figure "
                 "are not affected.\n",
                 t.trials, t.shrinks, t.lowest, t.max, t.mean);
    const size_t had = r->warn_md ? strlen(r->warn_md) : 0;
    char *w = realloc(r->warn_md, had + (size_t)len + 1);
    if (!w) return;
    memcpy(w + had, line, (size_t)len + 1);
    r->warn_md = w;
    er_log(r,
           "dfl eval: warning: other processes took cores: %ld trials of another thread count, %ld kept fewer "
           "(the fewest %d of %d); times are a shared machine's\n",
           t.trials, t.shrinks, t.lowest, t.max);
}

static void summary_checks(run *r, eval_summary *sm, char *why, size_t n) {
    team_warning(r);
    sm->run = r->desc;
    sm->warnings_md = r->warn_md;
    eval_summary_outputs(sm, r->done.r, r->done.ids, r->done.n_ids, r->done.n, r->max_new);
    if (!r->replay || !r->costs.ok) return;
    const eval_agg *ar = &sm->agg[0]; /* with --check-ar: the autoregressive step this run measured */
    const double step = ar->time_s > 0 && ar->tokens > ar->responses ? ar->time_s / (ar->tokens - ar->responses) : 0;
    sm->modeled_checked = 1;
    if (eval_costs_check(&r->costs, step, why, n)) return;
    sm->modeled_warning = why;
    er_log(r, "dfl eval: warning: the modeled speedups are unreliable: %s (summary.md says so too)\n", why);
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
        er_log(r, "[dfl eval] %s %s: tau %.3f (token-weighted %.3f)", g->label, g->mode, eval_agg_tau(g),
               eval_agg_tau_tokens(g));
        if (sp > 0) er_log(r, ", speedup %.2fx", sp);
        if (spm > 0) er_log(r, ", modeled speedup %.2fx%s", spm, sm->modeled_warning ? " (unreliable)" : "");
        er_log(r, "\n");
        if (g->mismatches) er_log(r, "[dfl eval]   %d mismatches\n", g->mismatches);
        if (g->rounds && eval_agg_tau(g) <= EVAL_TAU_DEAD && !dead[drafter_index(r, g->drafter)]++)
            er_log(r, "dfl eval: warning: drafter %s accepts (almost) nothing (tau %.3f, %s %s): %s\n", g->drafter,
                   eval_agg_tau(g), g->label, g->mode, EVAL_DEAD_HINT);
    }
}

/* summary.json's "run": what ran, where, on what, with which settings. */
static void summary_run(const run *r, FILE *x) {
    const eval_opts *o = r->o;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    kn_team_stats team; /* the adaptive threads (docs/threads.md) */
    kn_team_stats_get(&team);
    char mode[32];
    er_rec_row(r, mode, sizeof mode);
    fprintf(x, "\"run\": {\"method\": \"%s\", \"target\": ",
            r->from_features ? "replay-from-features"
            : r->replay      ? "replay"
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
    fprintf(x,
            ", \"max_new\": %d, \"chat\": \"%s\", \"temperature\": %g, \"seed\": %ld, \"shard\": \"%d/%d\", "
            "\"threads\": %d, \"threads_adaptive\": %s, \"threads_trials\": %ld, \"threads_lowest\": %d, "
            "\"threads_mean\": %.3f, "
            "\"weight_bytes\": %llu, \"state_bytes\": %llu, \"peak_rss_bytes\": %ld, "
            "\"bad_prompt_lines\": [",
            r->max_new,
            o->chat == DFL_CHAT_NONE     ? "none"
            : o->chat == DFL_CHAT_CHATML ? "chatml"
                                         : "chatml-nothink",
            o->temperature, o->seed, o->shard_i, o->shard_n, omp_get_max_threads(), team.adaptive ? "true" : "false",
            team.trials, team.lowest, team.mean, (unsigned long long)r->m.weight_bytes,
            (unsigned long long)(r->have_state ? r->st.bytes : 0), ru.ru_maxrss * 1024L);
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
}

/* summary.json's sections besides the tables: what is missing, the protocol, the costs, the
 * reference agreement. */
static void summary_extras(const run *r, FILE *x, const char *missing) {
    const eval_opts *o = r->o;
    if (missing) { /* the run is incomplete: what is missing, for scripts (mpirun may exit 0) */
        fprintf(x, ",\n  \"incomplete\": ");
        dfl_json_write_string(x, missing);
    }
    if (o->protocol == EVAL_PROTOCOL_ZLAB) {
        fprintf(x,
                ",\n  \"protocol\": {\"name\": \"zlab\", \"dataset\": \"%s\", \"shuffle_seed\": %d, \"max_samples\": ",
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
        er_costs_json(x, &r->costs);
    }
    if (o->reference || o->reference_url) {
        fprintf(x, ",\n  \"reference\": {\"source\": ");
        dfl_json_write_string(x, o->reference ? o->reference : o->reference_url);
        fprintf(x, ", \"compared\": %d, \"identical\": %d, \"diverged\": %d, \"details\": \"reference.jsonl\"}",
                r->ref_compared, r->ref_agree, r->ref_compared - r->ref_agree);
    }
}

/* The notes after summary.md's tables (block attention, whose truths), the training metrics'
 * report and the pipeline features' check (in summary.json too: x). */
static int summary_notes(const run *r, const eval_summary *sm, FILE *x, FILE *mdx) {
    const eval_opts *o = r->o;
    int rc = DFL_OK;
    for (int d = 0; d < r->n_open; d++) /* which block attention ran: it changes tau silently */
        if (anydrafter_attn_semantics(&r->ad[d]))
            fprintf(mdx, "%s%s: %s", d ? "; " : "\nBlock attention (--block-attn): ", r->label[d],
                    anydrafter_attn_semantics(&r->ad[d]));
    if (r->n_open) fputs(".\n", mdx);
    if (r->from_features) /* whose truths were replayed: dfl's recording or another recorder's */
        fprintf(mdx, "\nTruths recorded by %s (%s/target.json)%s.\n", r->recorder, o->features_dir,
                r->costs.ok ? "" : "; no target costs were measured when recording, so no modeled speedup");
    if (o->train_metrics) {
        tm_agg *tag = NULL;
        int n_tag = 0;
        tm_report_in ti;
        rc = train_report_in(r, sm, &tag, &n_tag, &ti);
        if (rc == DFL_OK && n_tag) {
            fprintf(x, ",\n  ");
            tm_report_json(&ti, x);
            tm_report_md(&ti, mdx);
            char *svg = dfl_path_join(o->out, "train_vs_serve.svg");
            rc = tm_report_svg(&ti, svg);
            free(svg);
        }
        free(tag);
    }
    if (rc == DFL_OK && o->features_from) {
        char *fp = dfl_path_join(o->out, "features_check.jsonl");
        rc = eval_feat_check_report(fp, mdx, x);
        free(fp);
    }
    return rc;
}

/* summary.json, summary.md and the plots of results.jsonl as it now is; missing: what a spread
 * run's processes did not finish (the dist's message), or NULL. */
int er_write_summary(run *r, const char *missing) {
    const eval_opts *o = r->o;
    eval_results_free(&r->done);
    if (er_done_load(&r->done, r->res_path, r->device) != DFL_OK) return DFL_ERR;
    eval_summary sm;
    eval_summarize(&sm, r->done.r, r->done.n);
    char why[1024];
    summary_checks(r, &sm, why, sizeof why);
    char *extra = NULL;
    size_t extra_len = 0;
    FILE *x = open_memstream(&extra, &extra_len);
    if (!x) return eval_summary_free(&sm), dfl_seterr("out of memory");
    summary_run(r, x);
    summary_extras(r, x, missing);
    char *md = NULL; /* sections after the tables */
    size_t md_len = 0;
    FILE *mdx = open_memstream(&md, &md_len);
    int rc = mdx ? summary_notes(r, &sm, x, mdx) : dfl_seterr("out of memory");
    if (mdx) fclose(mdx);
    fclose(x);
    if (rc == DFL_OK) rc = eval_write_reports(&sm, o->out, extra, md);
    free(md);
    if (rc == DFL_OK) log_rows(r, &sm);
    if (o->reference || o->reference_url)
        er_log(r, "[dfl eval] reference: %d of %d outputs identical\n", r->ref_agree, r->ref_compared);
    eval_summary_free(&sm);
    free(extra);
    return rc;
}
