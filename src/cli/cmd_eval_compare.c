/* dfl eval-compare: tau of the same drafters in several eval runs side by side — one run per
 * target on the same prompts (a BF16 target and its FP8 release, a base and a fine-tuned target):
 * how much acceptance each target costs the drafters. Reads each run's summary.json. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "dfl/common.h"
#include "dfl/eval.h"

#define MAX_RUNS 16

static const char *usage_text =
    "usage: dfl eval-compare DIR1 DIR2 [DIR3 ...] [--json]\n"
    "\n"
    "tau of the same drafters in several `dfl eval` runs side by side (docs/eval.md, \"Several\n"
    "targets\"): e.g. one run on a BF16 target and one on its FP8 release, or one with float32 and\n"
    "one with bf16 activations (DFL_ACT), with the same prompts and options. A row per drafter x\n"
    "mode x method (online, replay) present in every run: tau (z-lab's per-response mean) and\n"
    "token-weighted tau per run, the change of tau from the first run in percent, mismatches. The\n"
    "runs must hold the same prompts (the prompt ids and the hashes of their texts: run.prompt_set)\n"
    "and --max-new and chat: anything else is refused, naming the field.\n"
    "\n"
    "\n"
    "Each later run is also compared with the first on each row, paired over the prompts both hold\n"
    "(DIR/results.jsonl): the mean per-prompt difference of τ with its 95% bootstrap interval over\n"
    "prompts and a one-line verdict (docs/eval.md, \"Statistics\").\n"
    "\n"
    "  --json   one JSON object: {\"runs\": [{\"dir\", \"target\", \"activations\"}], \"rows\":\n"
    "           [{\"drafter\", \"mode\", \"method\", \"tau\": [...], \"tau_token_weighted\": [...],\n"
    "           \"change_percent\": [...], \"mismatches\": [...], \"paired\": [{\"run\", \"prompts\",\n"
    "           \"tau_a\", \"tau_b\", \"diff\", \"ci95\", \"verdict\"}, ...]}]}\n";

typedef struct run_sum {
    const char *dir;
    cJSON *root;    /* summary.json */
    cJSON *results; /* its "results" array */
    const char *target;
    const char *act;  /* "f32" or "bf16" (summaries written before the mode existed: f32) */
    eval_results res; /* DIR/results.jsonl, for the per-prompt τ (n = 0 when absent) */
} run_sum;

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0, n;
    char tmp[65536];
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0) {
        if (len + n + 1 > cap) {
            cap = (len + n + 1) * 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf), fclose(f);
                return NULL;
            }
            buf = nb;
        }
        memcpy(buf + len, tmp, n), len += n;
    }
    fclose(f);
    if (!buf) buf = calloc(1, 1);
    else buf[len] = 0;
    return buf;
}

static int load_run(run_sum *r, const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/summary.json", dir);
    char *text = read_all(path);
    if (!text) return dfl_seterr("%s: cannot read (not a dfl eval output directory?)", path);
    r->dir = dir;
    r->root = cJSON_Parse(text);
    free(text);
    if (!r->root) return dfl_seterr("%s: not valid JSON", path);
    r->results = cJSON_GetObjectItemCaseSensitive(r->root, "results");
    if (!cJSON_IsArray(r->results)) return dfl_seterr("%s: no \"results\" array", path);
    const cJSON *run = cJSON_GetObjectItemCaseSensitive(r->root, "run");
    const cJSON *t = run ? cJSON_GetObjectItemCaseSensitive(run, "target") : NULL;
    r->target = cJSON_IsString(t) ? t->valuestring : "?";
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(r->root, "activations");
    r->act = cJSON_IsString(a) ? a->valuestring : "f32";
    snprintf(path, sizeof path, "%s/results.jsonl", dir);
    FILE *f = fopen(path, "r");
    const int rc = f ? eval_results_read(&r->res, f, path, 0, -1) : DFL_OK;
    if (f) fclose(f);
    return rc;
}

static const char *str_of(const cJSON *o, const char *k) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(x) ? x->valuestring : "";
}

static double num_of(const cJSON *o, const char *k) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(x) ? x->valuedouble : NAN;
}

/* The row of run r with this drafter, mode and method; NULL when absent. */
static const cJSON *find_row(const run_sum *r, const char *drafter, const char *mode, const char *method) {
    const cJSON *x;
    cJSON_ArrayForEach(x, r->results) {
        if (strcmp(str_of(x, "drafter"), drafter) == 0 && strcmp(str_of(x, "mode"), mode) == 0 &&
            strcmp(str_of(x, "method"), method) == 0)
            return x;
    }
    return NULL;
}

/* Run i against the first on one row, paired over the prompts both hold: the comparison and its
 * verdict into json (an object of the row's "paired" array) or onto stdout. */
static void paired(const run_sum *runs, int i, const char *dr, const char *mode, const char *method, const char *feat,
                   cJSON *json) {
    eval_ptau *a = NULL, *b = NULL;
    const int na = eval_prompt_taus(runs[0].res.r, runs[0].res.n, dr, mode, method, feat, &a);
    const int nb = eval_prompt_taus(runs[i].res.r, runs[i].res.n, dr, mode, method, feat, &b);
    eval_paired p;
    eval_paired_compare(a, na, b, nb, EVAL_BOOT_RESAMPLES, EVAL_BOOT_SEED, &p);
    char v[4096];
    eval_paired_verdict(&p, runs[0].dir, runs[i].dir, v, sizeof v);
    if (json) {
        cJSON *o = cJSON_CreateObject(), *ci = cJSON_CreateArray();
        cJSON_AddStringToObject(o, "run", runs[i].dir);
        cJSON_AddNumberToObject(o, "prompts", p.n);
        cJSON_AddNumberToObject(o, "tau_a", p.tau_a);
        cJSON_AddNumberToObject(o, "tau_b", p.tau_b);
        cJSON_AddNumberToObject(o, "diff", p.diff);
        cJSON_AddItemToArray(ci, cJSON_CreateNumber(p.lo));
        cJSON_AddItemToArray(ci, cJSON_CreateNumber(p.hi));
        cJSON_AddItemToObject(o, "ci95", ci);
        cJSON_AddStringToObject(o, "verdict", v);
        cJSON_AddItemToArray(json, o);
    } else {
        printf("- %s %s%s: %s.\n", dr, mode, strcmp(method, "online") == 0 ? " (online)" : "", v);
    }
    free(a), free(b);
}

/* The paired verdicts of every row common to all runs (Markdown, after the table). */
static void print_paired(const run_sum *runs, int n) {
    printf("\nPaired over prompts (DIR/results.jsonl; each later run against the first, %d bootstrap resamples):\n\n",
           EVAL_BOOT_RESAMPLES);
    const cJSON *x;
    cJSON_ArrayForEach(x, runs[0].results) {
        const char *dr = str_of(x, "drafter"), *mode = str_of(x, "mode"), *method = str_of(x, "method");
        int all = 1;
        for (int i = 0; i < n && all; i++) all = find_row(&runs[i], dr, mode, method) != NULL;
        for (int i = 1; all && i < n; i++)
            if (!runs[0].res.n || !runs[i].res.n)
                printf("- %s %s: no results.jsonl in %s: no paired comparison.\n", dr, mode,
                       runs[0].res.n ? runs[i].dir : runs[0].dir);
            else paired(runs, i, dr, mode, method, *str_of(x, "features") ? str_of(x, "features") : "dfl", NULL);
    }
}

/* A run.* field of summary.json as JSON text (malloc'd), NULL when absent. */
static char *run_field(const run_sum *r, const char *k) {
    const cJSON *run = cJSON_GetObjectItemCaseSensitive(r->root, "run");
    const cJSON *x = run ? cJSON_GetObjectItemCaseSensitive(run, k) : NULL;
    return x ? cJSON_PrintUnformatted(x) : NULL;
}

/* The same prompts file: the same file (device and inode), else the same path string. */
static int same_prompts_file(const char *a, const char *b) {
    struct stat sa, sb;
    if (stat(a, &sa) == 0 && stat(b, &sb) == 0) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    return strcmp(a, b) == 0;
}

/* The runs must have been made on the same prompts with the same options. By what they ran:
 * run.prompt_set (the prompt ids and the hashes of their texts), --max-new and --chat; summaries
 * written before prompt_set existed: the prompt count and the prompts file (the same file under
 * any path). */
static int same_prompts(const run_sum *runs, int n) {
    static const char *const run_fields[] = {"max_new", "chat"};
    const double p0 = num_of(runs[0].root, "prompts");
    const cJSON *r0 = cJSON_GetObjectItemCaseSensitive(runs[0].root, "run");
    const cJSON *set0 = r0 ? cJSON_GetObjectItemCaseSensitive(r0, "prompt_set") : NULL;
    for (int i = 1; i < n; i++) {
        const double p = num_of(runs[i].root, "prompts");
        if (p != p0)
            return dfl_seterr("%s holds %.0f prompts, %s %.0f: compare runs on the same prompts", runs[0].dir, p0,
                              runs[i].dir, p);
        const cJSON *ri = cJSON_GetObjectItemCaseSensitive(runs[i].root, "run");
        const cJSON *seti = ri ? cJSON_GetObjectItemCaseSensitive(ri, "prompt_set") : NULL;
        if (set0 && seti) {
            const char *key = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(set0, "hash")) &&
                                      cJSON_IsString(cJSON_GetObjectItemCaseSensitive(seti, "hash"))
                                  ? "hash"
                                  : "ids_hash"; /* a prompt's text unknown (older saved features): its id */
            const char *ha = str_of(set0, key), *hb = str_of(seti, key);
            if (strcmp(ha, hb) != 0)
                return dfl_seterr("%s and %s ran other prompts (run.prompt_set.%s %s vs %s: other prompt ids, or other "
                                  "texts under them): compare runs on the same prompts",
                                  runs[0].dir, runs[i].dir, key, ha, hb);
        } else {
            char *va = run_field(&runs[0], "prompts_file"), *vb = run_field(&runs[i], "prompts_file");
            const cJSON *a = r0 ? cJSON_GetObjectItemCaseSensitive(r0, "prompts_file") : NULL;
            const cJSON *b = ri ? cJSON_GetObjectItemCaseSensitive(ri, "prompts_file") : NULL;
            const int differ = (a == NULL) != (b == NULL) || (cJSON_IsString(a) && cJSON_IsString(b) &&
                                                              !same_prompts_file(a->valuestring, b->valuestring));
            if (differ)
                dfl_seterr("run.prompts_file differs: %s in %s, %s in %s: compare runs on the same prompts and options",
                           va ? va : "absent", runs[0].dir, vb ? vb : "absent", runs[i].dir);
            free(va), free(vb);
            if (differ) return DFL_ERR;
        }
        for (size_t f = 0; r0 && ri && f < sizeof run_fields / sizeof *run_fields; f++) {
            char *va = run_field(&runs[0], run_fields[f]), *vb = run_field(&runs[i], run_fields[f]);
            const int differ = (va == NULL) != (vb == NULL) || (va && strcmp(va, vb) != 0);
            if (differ)
                dfl_seterr("run.%s differs: %s in %s, %s in %s: compare runs on the same prompts and options",
                           run_fields[f], va ? va : "absent", runs[0].dir, vb ? vb : "absent", runs[i].dir);
            free(va), free(vb);
            if (differ) return DFL_ERR;
        }
    }
    return DFL_OK;
}

int cmd_eval_compare(int argc, char **argv) {
    const char *dirs[MAX_RUNS];
    int n = 0, json = 0;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) return fputs(usage_text, stdout), 0;
        if (strcmp(argv[i], "--json") == 0) json = 1;
        else if (argv[i][0] == '-') return cli_usage_error("eval-compare", "unknown option %s", argv[i]);
        else if (n == MAX_RUNS) return cli_usage_error("eval-compare", "at most %d runs", MAX_RUNS);
        else dirs[n++] = argv[i];
    }
    if (n < 2) return cli_usage_error("eval-compare", "give at least two eval output directories (see --help)");
    run_sum runs[MAX_RUNS] = {0};
    int rc = 0;
    for (int i = 0; i < n && !rc; i++)
        if (load_run(&runs[i], dirs[i]) != DFL_OK) rc = cli_fail("eval-compare", "%s", dfl_errmsg());
    if (!rc && same_prompts(runs, n) != DFL_OK) rc = cli_fail("eval-compare", "%s", dfl_errmsg());
    cJSON *out = NULL, *rows = NULL;
    if (!rc && json) {
        out = cJSON_CreateObject();
        cJSON *rs = cJSON_AddArrayToObject(out, "runs");
        for (int i = 0; i < n; i++) {
            cJSON *r = cJSON_CreateObject();
            cJSON_AddStringToObject(r, "dir", runs[i].dir);
            cJSON_AddStringToObject(r, "target", runs[i].target);
            cJSON_AddStringToObject(r, "activations", runs[i].act);
            cJSON_AddItemToArray(rs, r);
        }
        rows = cJSON_AddArrayToObject(out, "rows");
    } else if (!rc) {
        printf("| drafter | mode |");
        for (int i = 0; i < n; i++) printf(" τ (token-weighted) %s |", runs[i].dir);
        for (int i = 1; i < n; i++) printf(" τ change %s |", runs[i].dir);
        printf(" mismatches |\n|---|---|");
        for (int i = 0; i < 2 * n - 1; i++) printf("---:|");
        printf("---:|\n");
    }
    int common = 0;
    const cJSON *x;
    if (!rc) cJSON_ArrayForEach(x, runs[0].results) {
            const char *dr = str_of(x, "drafter"), *mode = str_of(x, "mode"), *method = str_of(x, "method");
            const cJSON *row[MAX_RUNS];
            int all = 1;
            for (int i = 0; i < n && all; i++) all = (row[i] = find_row(&runs[i], dr, mode, method)) != NULL;
            if (!all) continue;
            common++;
            const double base = num_of(row[0], "tau");
            if (json) {
                cJSON *o = cJSON_CreateObject();
                cJSON_AddStringToObject(o, "drafter", dr);
                cJSON_AddStringToObject(o, "mode", mode);
                cJSON_AddStringToObject(o, "method", method);
                cJSON *tau = cJSON_AddArrayToObject(o, "tau"), *tw = cJSON_AddArrayToObject(o, "tau_token_weighted");
                cJSON *ch = cJSON_AddArrayToObject(o, "change_percent"), *mm = cJSON_AddArrayToObject(o, "mismatches");
                for (int i = 0; i < n; i++) {
                    cJSON_AddItemToArray(tau, cJSON_CreateNumber(num_of(row[i], "tau")));
                    cJSON_AddItemToArray(tw, cJSON_CreateNumber(num_of(row[i], "tau_token_weighted")));
                    cJSON_AddItemToArray(mm, cJSON_CreateNumber(num_of(row[i], "mismatches")));
                    if (i)
                        cJSON_AddItemToArray(
                            ch, cJSON_CreateNumber(base > 0 ? 100.0 * (num_of(row[i], "tau") / base - 1) : 0));
                }
                cJSON *pa = cJSON_AddArrayToObject(o, "paired");
                for (int i = 1; i < n && runs[0].res.n && runs[i].res.n; i++)
                    paired(runs, i, dr, mode, method, *str_of(x, "features") ? str_of(x, "features") : "dfl", pa);
                cJSON_AddItemToArray(rows, o);
            } else {
                printf("| %s | %s%s |", dr, mode, strcmp(method, "online") == 0 ? " (online)" : "");
                for (int i = 0; i < n; i++)
                    printf(" %.3f (%.3f) |", num_of(row[i], "tau"), num_of(row[i], "tau_token_weighted"));
                for (int i = 1; i < n; i++)
                    printf(" %+.1f%% |", base > 0 ? 100.0 * (num_of(row[i], "tau") / base - 1) : 0);
                printf(" ");
                for (int i = 0; i < n; i++) printf("%s%.0f", i ? " / " : "", num_of(row[i], "mismatches"));
                printf(" |\n");
            }
        }
    if (!rc && !common) rc = cli_fail("eval-compare", "no drafter x mode x method row is common to every run");
    if (!rc && json) {
        char *s = cJSON_Print(out);
        puts(s);
        free(s);
    } else if (!rc) {
        printf("\nRuns: ");
        for (int i = 0; i < n; i++)
            printf("%s%s = target %s, %s activations", i ? "; " : "", runs[i].dir, runs[i].target, runs[i].act);
        printf(". τ change: relative to the first run.\n");
        print_paired(runs, n);
    }
    cJSON_Delete(out);
    for (int i = 0; i < n; i++) cJSON_Delete(runs[i].root), eval_results_free(&runs[i].res);
    return rc;
}
