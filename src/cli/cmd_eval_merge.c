/* dfl eval-merge: combine the results of sharded (or interrupted) eval runs into one summary. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "dfl/common.h"
#include "dfl/eval.h"

static const char *usage_text =
    "usage: dfl eval-merge --out DIR DIR1 [DIR2 ...]\n"
    "\n"
    "Concatenate the results.jsonl (and reference.jsonl) of several `dfl eval` output directories —\n"
    "e.g. the shards of a --shard i/n run — into DIR and write the same summary.json, summary.md and\n"
    "plots as one run over all prompts would. A response present in several inputs is kept once.\n";

/* Append every line of src to dst; returns the number of lines, -1 on error. With parse, every
 * line must parse and have the activation mode *act and the device *dev (set by the first line
 * when -1). */
static int append_file(FILE *dst, const char *src, int parse, int *act, int *dev) {
    FILE *f = fopen(src, "r");
    if (!f) return parse ? (dfl_seterr("%s: cannot open", src), -1) : 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int n = 0, lineno = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if (len <= 1) continue;
        if (parse) {
            eval_result r;
            if (eval_result_parse(line, &r, NULL, NULL) != DFL_OK) {
                if (line[len - 1] != '\n') break; /* a partial last line of an interrupted run */
                dfl_preperr("%s:%d", src, lineno);
                n = -1;
                break;
            }
            if (*act < 0) *act = r.act_bf16;
            if (r.act_bf16 != *act) {
                dfl_seterr("%s:%d: computed with %s activations, earlier inputs with %s: results of both modes must "
                           "not mix in one summary", src, lineno, r.act_bf16 ? "bf16" : "f32", *act ? "bf16" : "f32");
                n = -1;
                break;
            }
            if (*dev < 0) *dev = r.device;
            if (r.device != *dev) {
                dfl_seterr("%s:%d: the target ran on %s, in earlier inputs on %s: results of both devices must not "
                           "mix in one summary", src, lineno, dfl_device_name((dfl_device)r.device),
                           dfl_device_name((dfl_device)*dev));
                n = -1;
                break;
            }
        }
        fputs(line, dst);
        if (line[len - 1] != '\n') fputc('\n', dst);
        n++;
    }
    free(line);
    fclose(f);
    return n;
}

int cmd_eval_merge(int argc, char **argv) {
    const char *out = NULL, *in[256];
    int n_in = 0;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            fputs(usage_text, stdout);
            return 0;
        } else if (strcmp(argv[i], "--out") == 0) {
            out = cli_value(argc, argv, &i);
        } else if (argv[i][0] == '-') {
            return cli_usage_error("eval-merge", "unknown option '%s'", argv[i]);
        } else if (n_in < 256) {
            in[n_in++] = argv[i];
        }
    }
    if (!out || !n_in) return cli_usage_error("eval-merge", "needs --out DIR and at least one input directory");
    mkdir(out, 0755);
    char *res = dfl_path_join(out, "results.jsonl"), *ref = dfl_path_join(out, "reference.jsonl");
    FILE *fr = fopen(res, "w"), *ff = NULL;
    int rc = 0, have_ref = 0, act = -1, dev = -1;
    if (!fr) {
        rc = cli_fail("eval-merge", "%s: cannot create", res);
        goto done;
    }
    for (int i = 0; i < n_in && rc == 0; i++) {
        if (strcmp(in[i], out) == 0) {
            rc = cli_usage_error("eval-merge", "--out must differ from the inputs");
            break;
        }
        char *p = dfl_path_join(in[i], "results.jsonl");
        if (append_file(fr, p, 1, &act, &dev) < 0) rc = cli_fail("eval-merge", "%s", dfl_errmsg());
        free(p);
        p = dfl_path_join(in[i], "reference.jsonl");
        if (rc == 0 && dfl_is_file(p)) {
            if (!ff) ff = fopen(ref, "w");
            have_ref = 1;
            append_file(ff, p, 0, &act, &dev);
        }
        free(p);
    }
    fclose(fr);
    if (ff) fclose(ff);
    if (rc) goto done;
    /* summarize the merged file */
    FILE *f = fopen(res, "r");
    eval_result *r = NULL;
    int n = 0;
    char *line = NULL;
    size_t cap = 0;
    while (f && getline(&line, &cap, f) >= 0) {
        r = realloc(r, (size_t)(n + 1) * sizeof *r);
        if (eval_result_parse(line, &r[n], NULL, NULL) == DFL_OK) n++;
    }
    free(line);
    if (f) fclose(f);
    eval_summary s;
    eval_summarize(&s, r, n);
    char extra[512];
    snprintf(extra, sizeof extra, "\"merged_from\": %d%s", n_in, have_ref ? ", \"reference_details\": \"reference.jsonl\"" : "");
    if (eval_write_reports(&s, out, extra) != DFL_OK) rc = cli_fail("eval-merge", "%s", dfl_errmsg());
    else fprintf(stderr, "[dfl eval-merge] %d responses from %d directories -> %s/summary.md\n", n, n_in, out);
    eval_summary_free(&s);
    free(r);
done:
    free(res);
    free(ref);
    return rc;
}
