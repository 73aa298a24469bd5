/* --protocol zlab: z-lab's dflash benchmark prompts (dflash/benchmark.py: DATASETS, _select_dataset),
 * rebuilt token for token from local JSON lines (docs/eval.md, "Reproducing published numbers"). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/jsonl.h"
#include "dfl/eval.h"
#include "eval/pyrandom.h"

#define ZLAB_BOXED "\nPlease reason step by step, and put your final answer within \\boxed{}."
#define ZLAB_HUMANEVAL_PRE \
    "Write a solution to the following problem and make sure that it passes the tests:\n```python\n"
#define ZLAB_HUMANEVAL_POST "\n```"

static const char *const names[EVAL_ZLAB_N] = {"gsm8k", "math500", "humaneval", "mbpp", "mt-bench"};

const char *eval_zlab_dataset_name(int d) { return d >= 0 && d < EVAL_ZLAB_N ? names[d] : "?"; }

int eval_zlab_dataset_parse(const char *s) {
    for (int d = 0; d < EVAL_ZLAB_N; d++)
        if (strcmp(s, names[d]) == 0) return d;
    if (strcmp(s, "mtbench") == 0) return EVAL_ZLAB_MTBENCH;
    return -1;
}

void eval_zlab_format_json(FILE *f, int d) {
    switch (d) {
    case EVAL_ZLAB_GSM8K:
        fprintf(f, "\"field\": \"question\", \"suffix\": ");
        dfl_json_write_string(f, ZLAB_BOXED);
        break;
    case EVAL_ZLAB_MATH500:
        fprintf(f, "\"field\": \"problem\", \"suffix\": ");
        dfl_json_write_string(f, ZLAB_BOXED);
        break;
    case EVAL_ZLAB_HUMANEVAL:
        fprintf(f, "\"field\": \"prompt\", \"template\": ");
        dfl_json_write_string(f, ZLAB_HUMANEVAL_PRE "{prompt}" ZLAB_HUMANEVAL_POST);
        break;
    case EVAL_ZLAB_MBPP: fprintf(f, "\"field\": \"prompt\", \"template\": \"{prompt}\""); break;
    default: fprintf(f, "\"field\": \"turns\", \"template\": \"the turns as they are, multi-turn\""); break;
    }
}

/* The dataset from the fields of the file's first object. */
static int sniff(const char *path, int *d) {
    dfl_jsonl in;
    if (dfl_jsonl_open(&in, path, DFL_JSONL_LAST_LINE_OK)) return dfl_preperr("prompt file");
    cJSON *o = dfl_jsonl_next(&in) == 1 ? cJSON_Parse(in.line) : NULL;
    const int lineno = in.lineno;
    dfl_jsonl_close(&in);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return dfl_seterr("%s:%d: --protocol zlab needs JSON lines (one object per line)", path, lineno);
    }
#define HAS(k) (cJSON_GetObjectItemCaseSensitive(o, k) != NULL)
    *d = -1;
    if (HAS("turns")) *d = EVAL_ZLAB_MTBENCH;
    else if (HAS("question")) *d = EVAL_ZLAB_GSM8K;
    else if (HAS("problem")) *d = EVAL_ZLAB_MATH500;
    else if (HAS("prompt") && (HAS("entry_point") || HAS("canonical_solution"))) *d = EVAL_ZLAB_HUMANEVAL;
    else if (HAS("prompt") && HAS("test_list")) *d = EVAL_ZLAB_MBPP;
#undef HAS
    cJSON_Delete(o);
    if (*d < 0)
        return dfl_seterr("%s:%d: cannot tell the z-lab dataset from the fields (\"turns\": mt-bench, \"question\": "
                          "gsm8k, \"problem\": math500, \"prompt\" with \"entry_point\": humaneval, \"prompt\" with "
                          "\"test_list\": mbpp); give --protocol-dataset gsm8k|math500|humaneval|mbpp|mt-bench",
                          path, lineno);
    return DFL_OK;
}

static char *concat3(const char *a, const char *b, const char *c) {
    size_t n = strlen(a) + strlen(b) + strlen(c) + 1;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s%s%s", a, b, c);
    return s;
}

int eval_zlab_load(eval_prompts *ps, const eval_opts *o, int *dataset) {
    int d = o->zlab_dataset;
    if (d < 0 && o->have_fmt) {
        if (o->fmt == EVAL_FMT_GSM8K) d = EVAL_ZLAB_GSM8K;
        else if (o->fmt == EVAL_FMT_MTBENCH) d = EVAL_ZLAB_MTBENCH;
        else if (o->fmt == EVAL_FMT_JSONL && strcmp(o->field, "problem") == 0) d = EVAL_ZLAB_MATH500;
        else if (o->fmt == EVAL_FMT_TEXT)
            return dfl_seterr("--protocol zlab reads JSON lines (the dataset's rows), not --format text");
    }
    if (d < 0 && sniff(o->prompts, &d)) return DFL_ERR;
    eval_format fmt = d == EVAL_ZLAB_MTBENCH ? EVAL_FMT_MTBENCH
                      : d == EVAL_ZLAB_GSM8K ? EVAL_FMT_GSM8K
                                             : EVAL_FMT_JSONL;
    const char *field = d == EVAL_ZLAB_MATH500 ? "problem" : "prompt";
    /* every row: the selection shuffles the whole dataset, then keeps the first --limit */
    if (eval_prompts_load(ps, o->prompts, fmt, field, 0, o->keep_going))
        return dfl_preperr("--protocol zlab %s", names[d]);
    for (int i = 0; i < ps->n; i++) {
        eval_prompt *p = &ps->p[i];
        char *s = NULL;
        if (d == EVAL_ZLAB_GSM8K || d == EVAL_ZLAB_MATH500) s = concat3(p->turns[0], ZLAB_BOXED, "");
        else if (d == EVAL_ZLAB_HUMANEVAL) s = concat3(ZLAB_HUMANEVAL_PRE, p->turns[0], ZLAB_HUMANEVAL_POST);
        else continue;
        if (!s) {
            eval_prompts_free(ps);
            return dfl_seterr("out of memory");
        }
        free(p->turns[0]);
        p->turns[0] = s;
    }
    /* _select_dataset: order = list(range(n)); random.Random(42).shuffle(order); the first count */
    const size_t nn = ps->n > 0 ? (size_t)ps->n : 1;
    int *order = malloc(nn * sizeof *order);
    eval_prompt *sel = malloc(nn * sizeof *sel);
    char *used = calloc(nn, 1);
    if (!order || !sel || !used) {
        free(order), free(sel), free(used);
        eval_prompts_free(ps);
        return dfl_seterr("out of memory");
    }
    for (int i = 0; i < ps->n; i++) order[i] = i;
    dfl_pyrandom rnd;
    pyrandom_seed(&rnd, EVAL_ZLAB_SEED);
    pyrandom_shuffle(&rnd, order, ps->n);
    const int count = o->limit > 0 && o->limit < ps->n ? o->limit : ps->n;
    for (int i = 0; i < count; i++) sel[i] = ps->p[order[i]], used[order[i]] = 1;
    for (int i = 0; i < ps->n; i++)
        if (!used[i]) {
            free(ps->p[i].id), free(ps->p[i].answer);
            for (int k = 0; k < ps->p[i].n_turns; k++) free(ps->p[i].turns[k]);
        }
    free(ps->p);
    ps->p = sel;
    ps->n = count;
    free(order), free(used);
    *dataset = d;
    return DFL_OK;
}
