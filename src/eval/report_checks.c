/* What a reader must know before the tables (docs/eval.md, "Settings, warnings, statistics"): the
 * run's settings, the warnings (unreliable modeled speedups, drafters that accept nothing,
 * responses cut at --max-new or looping, the caller's own), the paired comparisons of the drafters. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/backend.h"
#include "dfl/common.h"
#include "report.h"

int report_dead(const eval_agg *a) { return a->rounds > 0 && eval_agg_tau(a) <= EVAL_TAU_DEAD; }

static const char *jstr(const cJSON *o, const char *k) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(x) ? x->valuestring : NULL;
}

static double jnum(const cJSON *o, const char *k, double dflt) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(x) ? x->valuedouble : dflt;
}

/* Whether the run measures what z-lab's model cards quote (their benchmark: --protocol zlab). */
static void zlab_comparable(FILE *f, const cJSON *run) {
    const char *proto = jstr(run, "protocol"), *chat = jstr(run, "chat");
    if (!proto || strcmp(proto, "zlab") != 0) {
        fprintf(f, "no: τ depends on the prompts, the template and --max-new; the z-lab model cards' τ comes from "
                   "their benchmark's prompts (`--protocol zlab`) |\n");
        return;
    }
    const double mx = jnum(run, "max_new", 0), temp = jnum(run, "temperature", 0);
    const int ok_new = mx == EVAL_ZLAB_MAX_NEW, ok_t = temp == 0, ok_chat = chat && !strcmp(chat, "chatml-nothink");
    if (ok_new && ok_t && ok_chat) {
        fprintf(f, "yes: `--protocol zlab` (%s): z-lab's prompts, selection, template and %d new tokens, greedy |\n",
                jstr(run, "protocol_dataset") ? jstr(run, "protocol_dataset") : "?", EVAL_ZLAB_MAX_NEW);
        return;
    }
    fprintf(f, "partly: `--protocol zlab`, but");
    if (!ok_new) fprintf(f, " --max-new %.0f (the cards: %d)%s", mx, EVAL_ZLAB_MAX_NEW, ok_t && ok_chat ? "" : ";");
    if (!ok_t) fprintf(f, " temperature %g (the cards: greedy)%s", temp, ok_chat ? "" : ";");
    if (!ok_chat) fprintf(f, " template %s (the cards: Qwen3's, thinking off)", chat ? chat : "?");
    fprintf(f, " |\n");
}

/* A settings row: a string of the run, "–" when it does not say. */
static void row_str(FILE *f, const char *name, const cJSON *run, const char *k) {
    fprintf(f, "| %s | %s |\n", name, jstr(run, k) ? jstr(run, k) : "–");
}

void report_settings_md(FILE *f, const eval_summary *s) {
    const cJSON *run = s->run, *dr = cJSON_GetObjectItemCaseSensitive(run, "drafters");
    fprintf(f, "## Settings\n\n| setting | value |\n|---|---|\n");
    row_str(f, "method", run, "method");
    row_str(f, "target", run, "target");
    fprintf(f, "| drafters |");
    const cJSON *d;
    int i = 0;
    cJSON_ArrayForEach(d, dr) if (cJSON_IsString(d)) fprintf(f, "%s %s", i++ ? "," : "", d->valuestring);
    for (int k = 1; !i && k < s->n_agg; k++) /* the run does not say: the rows' */
        if (k == 1 || strcmp(s->agg[k].drafter, s->agg[k - 1].drafter))
            fprintf(f, "%s %s", k > 1 ? "," : "", s->agg[k].drafter);
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(run, "prompts");
    fprintf(f, " |\n| prompts | %s: %d prompts, %d responses |\n",
            jstr(run, "prompts_file") ? jstr(run, "prompts_file") : "–",
            cJSON_IsObject(ps) ? cJSON_GetArraySize(ps) : s->n_prompts,
            s->agg[0].responses ? s->agg[0].responses
            : s->n_agg > 1      ? s->agg[1].responses
                                : 0);
    row_str(f, "format", run, "prompt_format");
    row_str(f, "chat template", run, "chat");
    fprintf(f, "| protocol | %s |\n| comparable to the z-lab model cards | ",
            jstr(run, "protocol") ? jstr(run, "protocol") : "–");
    zlab_comparable(f, run);
    fprintf(f, "| max-new | %.0f |\n| temperature | %g |\n", jnum(run, "max_new", s->max_new),
            jnum(run, "temperature", 0));
    if (jnum(run, "top_k", 0) > 0) fprintf(f, "| top-k | %.0f |\n", jnum(run, "top_k", 0));
    if (jnum(run, "top_p", 0) > 0) fprintf(f, "| top-p | %g |\n", jnum(run, "top_p", 0));
    row_str(f, "accept rule", run, "accept_rule");
    fprintf(f, "| threads | %.0f |\n", jnum(run, "threads", 0));
    row_str(f, "ISA (dfl --version)", run, "isa");
    fprintf(f, "| activations | %s |\n| device | %s (the target's forwards; the drafters run on the CPU) |\n\n",
            s->act_bf16 ? "bf16" : "f32", dfl_device_name((dfl_device)s->device));
}

/* A row's responses flagged (capped or looping): their count and mean τ, and the rest's. */
static int row_flags(const eval_agg *a, int loops, double *tau_in, double *tau_out) {
    int m = 0;
    double in = 0, out = 0;
    for (int i = 0; i < a->responses; i++) {
        const int hit = loops ? a->resp[i].loop > 0 : a->resp[i].capped;
        m += hit;
        hit ? (in += a->resp[i].tau) : (out += a->resp[i].tau);
    }
    *tau_in = m ? in / m : NAN;
    *tau_out = m < a->responses ? out / (a->responses - m) : NAN;
    return m;
}

/* The row that flags most responses (capped, or looping), with its counts; NULL when none flags any. */
static const eval_agg *flagged_row(const eval_summary *s, int loops, int *n, double *tau_in, double *tau_out) {
    const eval_agg *best = NULL;
    *n = 0;
    for (int k = 1; k < s->n_agg; k++) {
        double in, out;
        const int m = row_flags(&s->agg[k], loops, &in, &out);
        if (m > *n) *n = m, best = &s->agg[k], *tau_in = in, *tau_out = out;
    }
    return best;
}

/* The mean τ of the rest, or a dash when every response is flagged. */
static const char *rest(double v, char *buf, size_t n) {
    if (isnan(v)) snprintf(buf, n, "– (none left)");
    else snprintf(buf, n, "%.3f", v);
    return buf;
}

static void warn_outputs(FILE *f, const eval_summary *s) {
    int n;
    double ti, to;
    char r[32];
    const eval_agg *a = flagged_row(s, 0, &n, &ti, &to);
    if (a)
        fprintf(f,
                "- **%d of %d responses reached --max-new %d** (cut short, not ended by eos): τ %.3f on them vs %s "
                "on the rest (%s %s). A cut response's τ is its rate before the cut, and long answers weigh on the "
                "mean differently: raise --max-new to score whole responses. Per row: \"Responses that reached "
                "--max-new or loop\", below.\n",
                n, a->responses, s->max_new, ti, rest(to, r, sizeof r), a->label, a->mode);
    if (!(a = flagged_row(s, 1, &n, &ti, &to))) return;
    fprintf(f, "- **%d of %d responses loop** (end in at least 3 copies of one span of tokens; prompts", n,
            a->responses);
    for (int i = 0, shown = 0; i < a->responses && shown < 8; i++)
        if (a->resp[i].loop)
            fprintf(f, "%s %s%s", shown++ ? "," : "", a->resp[i].prompt_id, a->resp[i].turn ? " turn 2" : "");
    fprintf(f,
            "%s): τ %.3f on them vs %s on the rest (%s %s). A drafter predicts a repetition easily, so looping "
            "responses raise τ without saying much about the drafter.\n",
            n > 8 ? ", …" : "", ti, rest(to, r, sizeof r), a->label, a->mode);
}

void report_warnings_md(FILE *f, const eval_summary *s) {
    char *buf = NULL;
    size_t len = 0;
    FILE *w = open_memstream(&buf, &len);
    if (!w) return;
    if (s->modeled_warning)
        fprintf(w,
                "- **The modeled speedups are unreliable**: the costs they come from fail their checks: %s. The "
                "machine was probably busy while they were measured; rerun on a quiet machine with fewer threads "
                "(`OMP_NUM_THREADS`), or measure with `--online --repeat N`.\n",
                s->modeled_warning);
    for (int k = 1; k < s->n_agg; k++) /* once per drafter: its first row that accepts nothing */
        if (report_dead(&s->agg[k])) {
            int first = 1;
            for (int j = 1; j < k && first; j++)
                first = strcmp(s->agg[j].drafter, s->agg[k].drafter) || !report_dead(&s->agg[j]);
            if (first)
                fprintf(w, "- **%s accepts (almost) nothing**: τ %.3f (%s %s). Something does not fit: %s.\n",
                        s->agg[k].drafter, eval_agg_tau(&s->agg[k]), s->agg[k].label, s->agg[k].mode, EVAL_DEAD_HINT);
        }
    warn_outputs(w, s);
    if (s->warnings_md) fputs(s->warnings_md, w);
    fclose(w);
    if (len) fprintf(f, "## Warnings\n\n%s\n", buf);
    free(buf);
}

void report_compare_md(FILE *f, const eval_summary *s) {
    if (!s->n_cmp) return;
    fprintf(f,
            "## Drafters compared, paired over prompts\n\nEach drafter against the first of its mode, on the "
            "prompts both have: per prompt the mean over its turns of per-response τ; B − A is the mean of the "
            "per-prompt differences, with its 95%% bootstrap interval over prompts (%d resamples, seed %d).\n\n"
            "| mode | A | B | prompts | τ A | τ B | B − A | 95%% interval |\n|---|---|---|---:|---:|---:|---:|---|\n",
            EVAL_BOOT_RESAMPLES, EVAL_BOOT_SEED);
    for (int i = 0; i < s->n_cmp; i++) {
        const eval_cmp *c = &s->cmp[i];
        fprintf(f, "| %s | %s | %s | %d | %.3f | %.3f | %+.3f | [%+.3f, %+.3f] |\n", s->agg[c->b].mode,
                s->agg[c->a].label, s->agg[c->b].label, c->p.n, c->p.tau_a, c->p.tau_b, c->p.diff, c->p.lo, c->p.hi);
    }
    fprintf(f, "\n");
    for (int i = 0; i < s->n_cmp; i++) {
        char v[2048];
        eval_paired_verdict(&s->cmp[i].p, s->agg[s->cmp[i].a].label, s->agg[s->cmp[i].b].label, v, sizeof v);
        fprintf(f, "- %s: %s.\n", s->agg[s->cmp[i].b].mode, v);
    }
    fprintf(f, "\n");
}

/* " %.3f |" or " – |" */
static void cell(FILE *f, double v) {
    if (isnan(v)) fprintf(f, " – |");
    else fprintf(f, " %.3f |", v);
}

void report_outputs_md(FILE *f, const eval_summary *s) {
    int any = 0;
    double x, y;
    for (int k = 1; k < s->n_agg; k++) any |= row_flags(&s->agg[k], 0, &x, &y) || row_flags(&s->agg[k], 1, &x, &y);
    if (!any) return;
    fprintf(f,
            "## Responses that reached --max-new or loop\n\n| drafter | mode | responses | at --max-new %d | τ of "
            "those | τ of the rest | looping | τ of those | τ of the rest "
            "|\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n",
            s->max_new);
    for (int k = 1; k < s->n_agg; k++) {
        const eval_agg *a = &s->agg[k];
        fprintf(f, "| %s | %s | %d | %d |", a->label, a->mode, a->responses, row_flags(a, 0, &x, &y));
        cell(f, x), cell(f, y);
        fprintf(f, " %d |", row_flags(a, 1, &x, &y));
        cell(f, x), cell(f, y);
        fprintf(f, "\n");
    }
    fprintf(f, "\n");
}

/* A number, or null when it is not one. */
static void json_num(FILE *f, double v) {
    if (isnan(v)) fprintf(f, "null");
    else fprintf(f, "%.6f", v);
}

void report_checks_json(FILE *f, const eval_summary *s) {
    fprintf(f, "\"max_new\": %d,\n  \"speedup_modeled_reliable\": %s,\n  \"speedup_modeled_warning\": ", s->max_new,
            !s->modeled_checked  ? "null"
            : s->modeled_warning ? "false"
                                 : "true");
    if (s->modeled_warning) dfl_json_write_string(f, s->modeled_warning);
    else fprintf(f, "null");
    fprintf(f, ",\n  \"accepts_nothing\": [");
    for (int k = 1, n = 0; k < s->n_agg; k++)
        if (report_dead(&s->agg[k])) {
            fprintf(f, "%s{\"label\": ", n++ ? ", " : "");
            dfl_json_write_string(f, s->agg[k].label);
            fprintf(f, ", \"mode\": \"%s\", \"tau\": %.6f, \"check\": \"%s\"}", s->agg[k].mode,
                    eval_agg_tau(&s->agg[k]), EVAL_DEAD_HINT);
        }
    fprintf(f, "],\n  \"comparisons\": [");
    for (int i = 0; i < s->n_cmp; i++) {
        const eval_cmp *c = &s->cmp[i];
        char v[2048];
        eval_paired_verdict(&c->p, s->agg[c->a].label, s->agg[c->b].label, v, sizeof v);
        fprintf(f, "%s\n    {\"a\": ", i ? "," : "");
        dfl_json_write_string(f, s->agg[c->a].label);
        fprintf(f, ", \"b\": ");
        dfl_json_write_string(f, s->agg[c->b].label);
        fprintf(
            f,
            ", \"mode\": \"%s\", \"method\": \"%s\", \"features\": \"%s\", \"prompts\": %d, \"tau_a\": %.6f, "
            "\"tau_b\": %.6f, \"diff\": %.6f, \"ci95\": [%.6f, %.6f], \"resamples\": %d, \"seed\": %d, \"verdict\": ",
            s->agg[c->b].mode, s->agg[c->b].method, s->agg[c->b].features, c->p.n, c->p.tau_a, c->p.tau_b, c->p.diff,
            c->p.lo, c->p.hi, EVAL_BOOT_RESAMPLES, EVAL_BOOT_SEED);
        dfl_json_write_string(f, v);
        fprintf(f, "}");
    }
    fprintf(f, "%s],\n  ", s->n_cmp ? "\n  " : "");
}

void report_row_checks_json(FILE *f, const eval_agg *a) {
    double x, y;
    fprintf(f, ", \"accepts_nothing\": %s, \"responses_at_max_new\": %d, \"tau_at_max_new\": ",
            report_dead(a) ? "true" : "false", row_flags(a, 0, &x, &y));
    json_num(f, x);
    fprintf(f, ", \"tau_not_at_max_new\": ");
    json_num(f, y);
    fprintf(f, ", \"responses_looping\": %d, \"looping\": [", row_flags(a, 1, &x, &y));
    for (int i = 0, n = 0; i < a->responses; i++)
        if (a->resp[i].loop) {
            fprintf(f, "%s{\"prompt_id\": ", n++ ? ", " : "");
            dfl_json_write_string(f, a->resp[i].prompt_id);
            fprintf(f, ", \"turn\": %d, \"period\": %d}", a->resp[i].turn, a->resp[i].loop);
        }
    fprintf(f, "]");
}
