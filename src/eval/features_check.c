/* A training pipeline's hidden states against dfl's for the same sequence (src/eval/features.h):
 * which layers match, and which classic extraction mistake a mismatch looks like. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/jsonl.h"

#include "dfl/kernels.h"
#include "eval/features.h"

/* Below these relative errors two feature sets are the same computation (float32 kernels that
 * differ in summation order land near 1e-6), or the same values through a lossy step. */
#define MATCH_REL 1e-4
#define SAME_REL 2e-2

/* sqrt(sum (a - b)^2 / sum b^2) over every row of column ca of a and cb of b; b_norm: apply the
 * target's final norm to b's rows first. */
static double rel_err(const eval_truth *a, int ca, const eval_truth *b, int cb, const dfl_model *m, int b_norm) {
    const int H = a->H;
    float *xn = b_norm ? malloc((size_t)H * sizeof *xn) : NULL;
    if (b_norm && !xn) return INFINITY; /* out of memory: no match claimed */
    double num = 0, den = 0;
    for (int p = 0; p < a->n_rows && p < b->n_rows; p++) {
        const float *x = a->feat + ((size_t)p * a->n_layers + ca) * H;
        const float *y = b->feat + ((size_t)p * b->n_layers + cb) * H;
        if (b_norm) {
            kn_rmsnorm(xn, y, m->final_norm, H, m->cfg.rms_eps);
            y = xn;
        }
        for (int j = 0; j < H; j++) num += ((double)x[j] - y[j]) * ((double)x[j] - y[j]), den += (double)y[j] * y[j];
    }
    free(xn);
    return den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0);
}

/* Every value of the column is a bf16 number (its low 16 bits are zero). */
static int all_bf16(const eval_truth *a, int ca) {
    const int H = a->H;
    for (int p = 0; p < a->n_rows; p++) {
        const float *x = a->feat + ((size_t)p * a->n_layers + ca) * H;
        for (int j = 0; j < H; j++) {
            uint32_t u;
            memcpy(&u, &x[j], sizeof u);
            if (u & 0xffffu) return 0;
        }
    }
    return 1;
}

void eval_features_check(const eval_truth *dfl, const eval_truth *pipe, const unsigned char *absent, const dfl_model *m,
                         eval_feat_check *out) {
    const int last = m->cfg.n_layers - 1;
    for (int k = 0; k < pipe->n_layers; k++) {
        eval_feat_check *c = &out[k];
        memset(c, 0, sizeof *c);
        c->layer = pipe->layers[k], c->other = -1;
        const int dk = eval_truth_column(dfl, c->layer);
        if ((absent && absent[k]) || dk < 0) {
            c->kind = EVAL_FEAT_ABSENT, c->rel = -1;
            continue;
        }
        c->rel = rel_err(pipe, k, dfl, dk, m, 0);
        if (c->rel < MATCH_REL) continue;
        c->kind = c->rel < SAME_REL && all_bf16(pipe, k) ? EVAL_FEAT_BF16 : EVAL_FEAT_DIFFERS;
        if (c->kind == EVAL_FEAT_BF16) continue;
        /* another of dfl's layers, or dfl's last layer after the final norm */
        double best = SAME_REL;
        for (int j = 0; j < dfl->n_layers; j++) {
            if (j == dk) continue;
            const double e = rel_err(pipe, k, dfl, j, m, 0);
            if (e < best) best = e, c->kind = EVAL_FEAT_SHIFTED, c->other = dfl->layers[j], c->other_rel = e;
        }
        const int dl = eval_truth_column(dfl, last);
        if (dl >= 0) {
            const double e = rel_err(pipe, k, dfl, dl, m, 1);
            if (e < best) c->kind = EVAL_FEAT_POSTNORM, c->other = last, c->other_rel = e;
        }
    }
}

const char *eval_feat_check_text(const eval_feat_check *c, char *buf, size_t n) {
    switch (c->kind) {
    case EVAL_FEAT_MATCH: snprintf(buf, n, "matches dfl's (rel. error %.1e)", c->rel); break;
    case EVAL_FEAT_ABSENT: snprintf(buf, n, "not in the pipeline's files"); break;
    case EVAL_FEAT_BF16:
        snprintf(buf, n, "dfl's values rounded to bf16 (rel. error %.1e): features stored or computed in bf16", c->rel);
        break;
    case EVAL_FEAT_SHIFTED:
        snprintf(buf, n,
                 "is dfl's layer %d (rel. error %.1e), not layer %d: hooked %d layer%s %s (transformers' "
                 "hidden_states[k] is the output of layer k-1)",
                 c->other, c->other_rel, c->layer, c->layer > c->other ? c->layer - c->other : c->other - c->layer,
                 c->layer - c->other == 1 || c->other - c->layer == 1 ? "" : "s",
                 c->layer > c->other ? "early" : "late");
        break;
    case EVAL_FEAT_POSTNORM:
        snprintf(buf, n,
                 "is dfl's layer %d after the final norm (rel. error %.1e): transformers' last hidden_states "
                 "entry, which comes after the norm",
                 c->other, c->other_rel);
        break;
    default: snprintf(buf, n, "differs from dfl's (rel. error %.2g) and matches no known mistake", c->rel); break;
    }
    return buf;
}

/* ---- features_check.jsonl and its report ----------------------------------------------------- */

static const char *const kind_names[] = {"match", "absent", "bf16", "shifted", "postnorm", "differs"};

void eval_feat_check_write(FILE *f, const char *pid, int turn, const eval_feat_check *c, int n) {
    fputs("{\"prompt_id\": ", f);
    dfl_json_write_string(f, pid);
    fprintf(f, ", \"turn\": %d, \"layers\": [", turn);
    for (int k = 0; k < n; k++)
        fprintf(f, "%s{\"layer\": %d, \"kind\": \"%s\", \"rel\": %.6g, \"other\": %d, \"other_rel\": %.6g}",
                k ? ", " : "", c[k].layer, kind_names[c[k].kind], isfinite(c[k].rel) ? c[k].rel : 1e300, c[k].other,
                isfinite(c[k].other_rel) ? c[k].other_rel : 1e300);
    fputs("]}\n", f);
}

/* Per layer the response that differs most (a mistake named there), over every line of path. */
static int check_read(const char *path, eval_feat_check *worst, int *n_worst, int *responses) {
    *n_worst = 0, *responses = 0;
    dfl_jsonl in;
    if (dfl_jsonl_open(&in, path, DFL_JSONL_MISSING_OK)) return DFL_ERR;
    int more;
    while ((more = dfl_jsonl_next(&in)) == 1) {
        cJSON *o = cJSON_Parse(in.line);
        const cJSON *ls = cJSON_GetObjectItemCaseSensitive(o, "layers");
        if (cJSON_IsArray(ls)) ++*responses;
        for (const cJSON *x = cJSON_IsArray(ls) ? ls->child : NULL; x; x = x->next) {
            eval_feat_check c = {.other = -1};
            const cJSON *l = cJSON_GetObjectItemCaseSensitive(x, "layer"),
                        *k = cJSON_GetObjectItemCaseSensitive(x, "kind");
            const cJSON *r = cJSON_GetObjectItemCaseSensitive(x, "rel"),
                        *ot = cJSON_GetObjectItemCaseSensitive(x, "other");
            const cJSON *orl = cJSON_GetObjectItemCaseSensitive(x, "other_rel");
            if (!cJSON_IsNumber(l) || !cJSON_IsString(k) || !cJSON_IsNumber(r)) continue;
            c.layer = l->valueint, c.rel = r->valuedouble;
            c.other = cJSON_IsNumber(ot) ? ot->valueint : -1, c.other_rel = cJSON_IsNumber(orl) ? orl->valuedouble : 0;
            for (int i = 0; i < 6; i++)
                if (strcmp(k->valuestring, kind_names[i]) == 0) c.kind = i;
            int j = 0;
            while (j < *n_worst && worst[j].layer != c.layer) j++;
            if (j == *n_worst && j < EVAL_MAX_FEAT_LAYERS) worst[(*n_worst)++] = c;
            else if (j < *n_worst && c.rel > worst[j].rel) worst[j] = c;
        }
        cJSON_Delete(o);
    }
    dfl_jsonl_close(&in);
    return more < 0 ? DFL_ERR : DFL_OK;
}

int eval_feat_check_report(const char *path, FILE *md, FILE *json) {
    eval_feat_check w[EVAL_MAX_FEAT_LAYERS];
    int n, responses;
    if (check_read(path, w, &n, &responses)) return DFL_ERR;
    if (!n) return DFL_OK;
    char txt[400];
    fprintf(md,
            "\n## Features check (--features-from)\n\nThe pipeline's hidden states against dfl's for the same "
            "sequences (%d responses), per target layer, the response that differs most:\n\n"
            "| layer | pipeline's features |\n|---|---|\n",
            responses);
    fprintf(json, ",\n  \"features_check\": {\"responses\": %d, \"layers\": [", responses);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        fprintf(md, "| %d | %s |\n", w[i].layer, eval_feat_check_text(&w[i], txt, sizeof txt));
        fprintf(json, "%s{\"layer\": %d, \"kind\": \"%s\", \"rel\": %.6g, \"other\": %d, \"verdict\": ", i ? ", " : "",
                w[i].layer, kind_names[w[i].kind], w[i].rel, w[i].other);
        dfl_json_write_string(json, txt);
        fputc('}', json);
        bad += w[i].kind != EVAL_FEAT_MATCH && w[i].kind != EVAL_FEAT_ABSENT;
    }
    fputs("]}", json);
    if (bad)
        fprintf(md,
                "\n**%d layer%s of the pipeline's features differ from the target's own.** A drafter trained on "
                "them learned from other inputs than it gets when served: its training metrics can look fine while "
                "the serving tau collapses (docs/train-vs-serve.md).\n",
                bad, bad == 1 ? "" : "s");
    return DFL_OK;
}
