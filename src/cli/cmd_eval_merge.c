/* dfl eval-merge: combine the results of sharded (or interrupted) eval runs into one summary.
 * Runs are judged by what they ran (run.json: options and prompt hashes), inputs by what they are
 * (device and inode, not path strings); every check passes before any output is opened, and the
 * outputs are written whole and renamed into place. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "dfl/backend.h"
#include "dfl/common.h"
#include "dfl/eval.h"
#include "dfl/jsonl.h"

static const char *usage_text =
    "usage: dfl eval-merge --out DIR DIR1 [DIR2 ...]\n"
    "\n"
    "Concatenate the results.jsonl (and reference.jsonl) of several `dfl eval` output directories —\n"
    "e.g. the shards of a --shard i/n run — into DIR and write the same summary.json, summary.md and\n"
    "plots as one run over all prompts would. The inputs must have run with the same options (their\n"
    "run.json: target, --max-new, --chat, temperature, seed, activations, method) and the same prompt\n"
    "under every id they share; a response present in several inputs must have the same results\n"
    "there (it is kept once). DIR must be none of the inputs; nothing is written until every check\n"
    "has passed.\n";

#define MAX_IN 256

typedef struct input {
    const char *dir;
    struct stat st;
    cJSON *run;       /* run.json, or summary.json's "run" of a run made before run.json existed */
    cJSON *root;      /* what run points into */
    eval_results res; /* results.jsonl */
    char *ref;        /* reference.jsonl's complete lines (NULL: none) */
} input;

static int same_file(const struct stat *a, const struct stat *b) {
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

/* What input in ran: run.json, else (older runs) summary.json's "run". */
static int load_run(input *in) {
    char *p = dfl_path_join(in->dir, "run.json");
    char *txt = dfl_read_file(p, NULL);
    int rc = DFL_OK;
    if (txt) {
        in->root = cJSON_Parse(txt);
        if (!cJSON_IsObject(in->root)) rc = dfl_seterr("%s: not a JSON object", p);
        in->run = in->root;
    } else {
        free(p);
        p = dfl_path_join(in->dir, "summary.json");
        txt = dfl_read_file(p, NULL);
        in->root = txt ? cJSON_Parse(txt) : NULL;
        in->run = cJSON_GetObjectItemCaseSensitive(in->root, "run");
        if (!cJSON_IsObject(in->run))
            rc = dfl_seterr("%s: neither run.json nor a summary.json with its \"run\": cannot tell what this run ran "
                            "(options, prompts), so it cannot be merged",
                            in->dir);
    }
    if (rc == DFL_OK) dfl_clearerr();
    free(txt);
    free(p);
    return rc;
}

static int load_results(input *in) {
    char *p = dfl_path_join(in->dir, "results.jsonl");
    FILE *f = fopen(p, "r");
    int rc = f ? eval_results_read(&in->res, f, p, 1, -1) : dfl_seterr("%s: cannot open: %s", p, strerror(errno));
    if (f) fclose(f);
    free(p);
    if (rc != DFL_OK) return rc;
    p = dfl_path_join(in->dir, "reference.jsonl");
    if (dfl_is_file(p)) { /* its complete lines (a partial last one is left out) */
        size_t len = 0;
        char *txt = dfl_read_file(p, &len);
        if (!txt) rc = DFL_ERR;
        else {
            while (len > 0 && txt[len - 1] != '\n') len--;
            txt[len] = 0;
            in->ref = txt;
        }
    }
    free(p);
    return rc;
}

/* One response's key and its results without the timings (two runs of one response agree on these). */
static int same_key(const eval_result *a, const eval_result *b) {
    return strcmp(a->prompt_id, b->prompt_id) == 0 && a->turn == b->turn && a->rep == b->rep &&
           strcmp(a->drafter, b->drafter) == 0 && strcmp(a->mode, b->mode) == 0 && strcmp(a->method, b->method) == 0 &&
           strcmp(a->features, b->features) == 0;
}

static int same_outcome(const eval_result *a, const int32_t *ia, int na, const eval_result *b, const int32_t *ib,
                        int nb) {
    return a->tokens == b->tokens && a->rounds == b->rounds && a->drafted == b->drafted && a->accepted == b->accepted &&
           a->max_block == b->max_block && a->tree_depth_sum == b->tree_depth_sum && a->tree_nodes == b->tree_nodes &&
           a->match == b->match && a->first_mismatch == b->first_mismatch &&
           memcmp(a->accept_hist, b->accept_hist, sizeof a->accept_hist) == 0 &&
           memcmp(a->pos_drafted, b->pos_drafted, sizeof a->pos_drafted) == 0 &&
           memcmp(a->pos_accepted, b->pos_accepted, sizeof a->pos_accepted) == 0 && na == nb &&
           (na == 0 || memcmp(ia, ib, (size_t)na * sizeof *ia) == 0);
}

typedef struct ref {
    int in, i;
} ref;

static const input *g_in; /* for the sort below */

static int cmp_ref(const void *x, const void *y) {
    const ref *a = x, *b = y;
    const eval_result *p = &g_in[a->in].res.r[a->i], *q = &g_in[b->in].res.r[b->i];
    int c = strcmp(p->prompt_id, q->prompt_id);
    if (!c) c = p->turn - q->turn;
    if (!c) c = p->rep - q->rep;
    if (!c) c = strcmp(p->drafter, q->drafter);
    if (!c) c = strcmp(p->mode, q->mode);
    if (!c) c = strcmp(p->method, q->method);
    if (!c) c = strcmp(p->features, q->features);
    if (!c) c = a->in != b->in ? a->in - b->in : a->i - b->i;
    return c;
}

/* The kept lines of input in's results.jsonl, as they are there (round_lengths and all). */
static int copy_lines(FILE *dst, const input *in, const char *keep) {
    char *p = dfl_path_join(in->dir, "results.jsonl");
    dfl_jsonl r;
    int rc = dfl_jsonl_open(&r, p, 0), more = 0;
    for (int i = 0; rc == DFL_OK && i < in->res.n && (more = dfl_jsonl_next(&r)) == 1;) {
        if (r.lineno != in->res.line[i]) continue;
        if (keep[i]) fwrite(r.line, 1, r.len, dst), fputc('\n', dst);
        i++;
    }
    if (more < 0) rc = DFL_ERR;
    dfl_jsonl_close(&r);
    free(p);
    return rc;
}

/* Write text to path whole: a temporary file renamed into place. */
static int write_whole(const char *path, const char *text, size_t len) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return dfl_seterr("%s: cannot create: %s", tmp, strerror(errno));
    fwrite(text, 1, len, f);
    const int bad = ferror(f);
    int rc = fclose(f) == 0 && !bad ? DFL_OK : dfl_seterr("%s: write error: %s", tmp, strerror(errno));
    if (rc == DFL_OK && rename(tmp, path) != 0)
        rc = dfl_seterr("%s: cannot rename into place: %s", path, strerror(errno));
    if (rc != DFL_OK) unlink(tmp);
    return rc;
}

/* Every check: inputs distinct and not the output, the same options, the same prompt under each
 * shared id, one activation mode, overlapping responses with the same results. keep[k][i]: line i
 * of input k goes to the output. prompts: the union of the inputs' prompt hashes. */
static int check_inputs(input *in, int n, const char *out, char **keep, cJSON *prompts, int *dropped) {
    struct stat so;
    const int have_out = stat(out, &so) == 0;
    for (int k = 0; k < n; k++) {
        if (stat(in[k].dir, &in[k].st) != 0 || !S_ISDIR(in[k].st.st_mode))
            return dfl_seterr("%s: not a directory (a dfl eval --out)", in[k].dir);
        if (have_out && same_file(&so, &in[k].st))
            return dfl_seterr("--out %s is the input %s: eval-merge never writes into an input; give another --out",
                              out, in[k].dir);
        for (int j = 0; j < k; j++)
            if (same_file(&in[j].st, &in[k].st))
                return dfl_seterr("%s and %s are the same directory: give each input once", in[j].dir, in[k].dir);
    }
    char *res_out = dfl_path_join(out, "results.jsonl");
    struct stat sr;
    const int have_res_out = stat(res_out, &sr) == 0;
    free(res_out);
    for (int k = 0; k < n; k++) { /* an output file that is an input's (a link): writing it would change the input */
        char *p = dfl_path_join(in[k].dir, "results.jsonl");
        struct stat si;
        const int same = have_res_out && stat(p, &si) == 0 && same_file(&si, &sr);
        free(p);
        if (same)
            return dfl_seterr("%s/results.jsonl is %s/results.jsonl: eval-merge never writes into an input", out,
                              in[k].dir);
    }
    for (int k = 0; k < n; k++)
        if (load_run(&in[k]) != DFL_OK || load_results(&in[k]) != DFL_OK) return DFL_ERR;
    /* one activation mode */
    int act = -1;
    const char *act_dir = NULL;
    for (int k = 0; k < n; k++)
        for (int i = 0; i < in[k].res.n; i++) {
            const eval_result *r = &in[k].res.r[i];
            if (act < 0) act = r->act_bf16, act_dir = in[k].dir;
            if (r->act_bf16 != act)
                return dfl_seterr(
                    "%s/results.jsonl:%d: computed with %s activations, %s with %s: results of both modes "
                    "must not mix in one summary",
                    in[k].dir, in[k].res.line[i], r->act_bf16 ? "bf16" : "f32", act_dir, act ? "bf16" : "f32");
        }
    /* one device for the target */
    int dev = -1;
    const char *dev_dir = NULL;
    for (int k = 0; k < n; k++)
        for (int i = 0; i < in[k].res.n; i++) {
            const eval_result *r = &in[k].res.r[i];
            if (dev < 0) dev = r->device, dev_dir = in[k].dir;
            if (r->device != dev)
                return dfl_seterr(
                    "%s/results.jsonl:%d: the target ran on %s, in %s on %s: results of both devices must "
                    "not mix in one summary",
                    in[k].dir, in[k].res.line[i], dfl_device_name((dfl_device)r->device), dev_dir,
                    dfl_device_name((dfl_device)dev));
        }
    /* the same options */
    for (int k = 1; k < n; k++) {
        char msg[300];
        if (eval_run_differs(in[0].run, in[k].run, msg, sizeof msg))
            return dfl_seterr("%s and %s ran with other options (%s): a summary over both would mix them", in[0].dir,
                              in[k].dir, msg);
    }
    /* shards of one run: the same prompt file (every prompt of it, whichever shard ran it) */
    for (int k = 1; k < n; k++) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(in[0].run, "all_prompts"),
                    *b = cJSON_GetObjectItemCaseSensitive(in[k].run, "all_prompts");
        if (a && b && !cJSON_Compare(a, b, 1)) {
            char ba[160], bb[160];
            return dfl_seterr("%s and %s ran on other prompt files (all_prompts %s vs %s: other prompts, another "
                              "--limit, or edited prompts)",
                              in[0].dir, in[k].dir, dfl_json_brief(a, ba, sizeof ba), dfl_json_brief(b, bb, sizeof bb));
        }
    }
    /* the same prompt under every id the inputs share */
    int rc = DFL_OK;
    for (int k = 0; k < n && rc == DFL_OK; k++) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(in[k].run, "prompts")) {
            if (!e->string) continue;
            const cJSON *have = cJSON_GetObjectItemCaseSensitive(prompts, e->string);
            if (!have) {
                cJSON_AddItemToObject(prompts, e->string, cJSON_Duplicate(e, 1));
                continue;
            }
            if (cJSON_IsString(have) && cJSON_IsString(e) && strcmp(have->valuestring, e->valuestring) != 0) {
                const char *first = "an earlier input";
                for (int j = 0; j < k; j++)
                    if (cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(in[j].run, "prompts"),
                                                         e->string))
                        first = in[j].dir, j = k;
                rc = dfl_seterr("prompt %s is another prompt in %s than in %s (another prompt file, or an edited "
                                "prompt): runs of other prompts cannot be merged",
                                e->string, in[k].dir, first);
                break;
            }
        }
    }
    if (rc) return rc;
    /* a response in several inputs: the same results (kept from the first), or refused */
    int total = 0;
    for (int k = 0; k < n; k++) total += in[k].res.n;
    ref *v = malloc(((size_t)total + 1) * sizeof *v);
    if (!v) return dfl_seterr("out of memory");
    int m = 0;
    for (int k = 0; k < n; k++) {
        keep[k] = malloc((size_t)in[k].res.n + 1);
        if (!keep[k]) {
            free(v);
            return dfl_seterr("out of memory");
        }
        memset(keep[k], 1, (size_t)in[k].res.n + 1);
        for (int i = 0; i < in[k].res.n; i++) v[m++] = (ref){k, i};
    }
    g_in = in;
    qsort(v, (size_t)m, sizeof *v, cmp_ref);
    for (int a = 0, b; a < m && rc == DFL_OK; a = b) {
        for (b = a + 1; b < m && same_key(&in[v[a].in].res.r[v[a].i], &in[v[b].in].res.r[v[b].i]); b++) {
            if (v[b].in == v[a].in) continue; /* repeated within one input: as that run left it */
            const input *A = &in[v[a].in], *B = &in[v[b].in];
            const eval_result *x = &A->res.r[v[a].i], *y = &B->res.r[v[b].i];
            if (!same_outcome(x, A->res.ids[v[a].i], A->res.n_ids[v[a].i], y, B->res.ids[v[b].i],
                              B->res.n_ids[v[b].i])) {
                rc = dfl_seterr("%s/results.jsonl:%d and %s/results.jsonl:%d: prompt %s turn %d, %s %s (%s) has other "
                                "results in each: overlapping runs that disagree cannot be merged",
                                A->dir, A->res.line[v[a].i], B->dir, B->res.line[v[b].i], x->prompt_id, x->turn + 1,
                                x->drafter[0] ? x->drafter : "autoregressive", x->mode, x->method);
                break;
            }
            keep[v[b].in][v[b].i] = 0;
            (*dropped)++;
        }
    }
    free(v);
    return rc;
}

/* Every check passed: write results.jsonl, reference.jsonl, run.json and the reports to out.
 * Returns the exit code. */
static int write_merged(const input *in, int n_in, const char *out, char **keep, const cJSON *prompts, int dropped) {
    int rc = 0;
    char *res_text = NULL, *ref_text = NULL;
    size_t res_len = 0, ref_len = 0;
    FILE *fr = open_memstream(&res_text, &res_len), *ff = open_memstream(&ref_text, &ref_len);
    eval_result *all = NULL;
    int n = 0, have_ref = 0, total = 0;
    for (int k = 0; k < n_in; k++) total += in[k].res.n;
    all = malloc(((size_t)total + 1) * sizeof *all);
    int32_t **all_ids = malloc(((size_t)total + 1) * sizeof *all_ids); /* the output ids of each (loops) */
    int *all_n = malloc(((size_t)total + 1) * sizeof *all_n);
    if (!all_ids || !all_n) free(all), all = NULL;
    for (int k = 0; fr && ff && all && k < n_in; k++) {
        if (copy_lines(fr, &in[k], keep[k]) != DFL_OK) rc = cli_fail("eval-merge", "%s", dfl_errmsg());
        for (int i = 0; i < in[k].res.n; i++)
            if (keep[k][i]) all_ids[n] = in[k].res.ids[i], all_n[n] = in[k].res.n_ids[i], all[n++] = in[k].res.r[i];
        if (in[k].ref) fputs(in[k].ref, ff), have_ref = 1;
    }
    if (fr) fclose(fr);
    if (ff) fclose(ff);
    char *res = dfl_path_join(out, "results.jsonl"), *ref = dfl_path_join(out, "reference.jsonl");
    char *runp = dfl_path_join(out, "run.json");
    if (rc == 0 && (!res_text || !ref_text || !all)) rc = cli_fail("eval-merge", "out of memory");
    if (rc == 0 && mkdir(out, 0755) != 0 && errno != EEXIST)
        rc = cli_fail("eval-merge", "%s: cannot create: %s", out, strerror(errno));
    /* the merged run.json: the inputs' options, every prompt */
    cJSON *run = rc == 0 ? cJSON_Duplicate(in[0].run, 1) : NULL;
    if (run) {
        cJSON_DeleteItemFromObjectCaseSensitive(run, "prompts");
        cJSON_DeleteItemFromObjectCaseSensitive(run, "shard");
        if (!cJSON_GetObjectItemCaseSensitive(run, "format")) cJSON_AddStringToObject(run, "format", EVAL_RUN_FORMAT);
        cJSON *from = cJSON_AddArrayToObject(run, "merged_from");
        for (int k = 0; k < n_in; k++) cJSON_AddItemToArray(from, cJSON_CreateString(in[k].dir));
        cJSON_AddItemToObject(run, "prompts", cJSON_Duplicate(prompts, 1));
    }
    char *run_text = run ? cJSON_Print(run) : NULL;
    if (rc == 0 && write_whole(res, res_text, res_len) != DFL_OK) rc = cli_fail("eval-merge", "%s", dfl_errmsg());
    if (rc == 0 && have_ref && write_whole(ref, ref_text, ref_len) != DFL_OK)
        rc = cli_fail("eval-merge", "%s", dfl_errmsg());
    if (rc == 0 && !have_ref && unlink(ref) != 0 && errno != ENOENT)
        rc = cli_fail("eval-merge", "%s: cannot remove: %s", ref, strerror(errno));
    if (rc == 0 && run_text) {
        const size_t len = strlen(run_text);
        char *t = malloc(len + 2);
        if (t) {
            memcpy(t, run_text, len), t[len] = '\n', t[len + 1] = 0;
            if (write_whole(runp, t, len + 1) != DFL_OK) rc = cli_fail("eval-merge", "%s", dfl_errmsg());
            free(t);
        }
    }
    if (rc == 0 && !run) rc = cli_fail("eval-merge", "out of memory");
    if (rc == 0) {
        /* summary.json: "run" (options and the merged prompt set) for eval-compare */
        cJSON *ps = cJSON_CreateObject();
        for (int i = 0; i < n; i++)
            if (!cJSON_GetObjectItemCaseSensitive(ps, all[i].prompt_id)) {
                const cJSON *h = cJSON_GetObjectItemCaseSensitive(prompts, all[i].prompt_id);
                cJSON_AddItemToObject(ps, all[i].prompt_id,
                                      cJSON_IsString(h) ? cJSON_CreateString(h->valuestring) : cJSON_CreateNull());
            }
        char hash[24], ids[24];
        const int np = eval_prompt_set(ps, hash, ids);
        cJSON_Delete(ps);
        cJSON *sr = cJSON_Duplicate(run, 1);
        cJSON_DeleteItemFromObjectCaseSensitive(sr, "prompts");
        cJSON_DeleteItemFromObjectCaseSensitive(sr, "format");
        cJSON *set = cJSON_AddObjectToObject(sr, "prompt_set");
        cJSON_AddNumberToObject(set, "prompts", np);
        if (hash[0]) cJSON_AddStringToObject(set, "hash", hash);
        else cJSON_AddNullToObject(set, "hash");
        cJSON_AddStringToObject(set, "ids_hash", ids);
        char *srt = cJSON_PrintUnformatted(sr);
        cJSON_Delete(sr);
        const size_t en = (srt ? strlen(srt) : 0) + 128;
        char *extra = malloc(en);
        if (extra)
            snprintf(extra, en, "\"merged_from\": %d%s, \"run\": %s", n_in,
                     have_ref ? ", \"reference_details\": \"reference.jsonl\"" : "", srt ? srt : "{}");
        eval_summary s;
        eval_summarize(&s, all, n);
        s.run = run; /* the settings: the first input's options, the merged prompts */
        const cJSON *mx = cJSON_GetObjectItemCaseSensitive(run, "max_new");
        eval_summary_outputs(&s, all, all_ids, all_n, n, cJSON_IsNumber(mx) ? (int)mx->valuedouble : 0);
        if (!extra || eval_write_reports(&s, out, extra, NULL) != DFL_OK)
            rc = cli_fail("eval-merge", "%s", dfl_errmsg());
        else {
            fprintf(stderr, "[dfl eval-merge] %d responses from %d directories -> %s/summary.md", n, n_in, out);
            if (dropped) fprintf(stderr, " (%d present in several inputs with the same results, kept once)", dropped);
            fprintf(stderr, "\n");
        }
        eval_summary_free(&s);
        free(extra);
        free(srt);
    }
    cJSON_Delete(run);
    free(run_text), free(runp), free(res), free(ref), free(res_text), free(ref_text), free(all);
    free(all_ids), free(all_n);
    return rc;
}

int cmd_eval_merge(int argc, char **argv) {
    const char *out = NULL;
    input in[MAX_IN];
    memset(in, 0, sizeof in);
    int n_in = 0;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            fputs(usage_text, stdout);
            return 0;
        } else if (strcmp(argv[i], "--out") == 0) {
            out = cli_value(argc, argv, &i);
        } else if (argv[i][0] == '-') {
            return cli_usage_error("eval-merge", "unknown option '%s'", argv[i]);
        } else if (n_in == MAX_IN) {
            return cli_usage_error("eval-merge", "at most %d input directories", MAX_IN);
        } else {
            in[n_in++].dir = argv[i];
        }
    }
    if (!out || !n_in) return cli_usage_error("eval-merge", "needs --out DIR and at least one input directory");
    char *keep[MAX_IN] = {0};
    cJSON *prompts = cJSON_CreateObject();
    int dropped = 0, rc = 0;
    if (check_inputs(in, n_in, out, keep, prompts, &dropped) != DFL_OK) {
        /* an input given twice, or as --out, is a usage error; the rest are the inputs' */
        const char *m = dfl_errmsg();
        rc = strstr(m, "give each input once") || strstr(m, "never writes into an input")
                 ? cli_usage_error("eval-merge", "%s", m)
                 : cli_fail("eval-merge", "%s", m);
    } else {
        rc = write_merged(in, n_in, out, keep, prompts, dropped);
    }
    for (int k = 0; k < n_in; k++) {
        eval_results_free(&in[k].res);
        cJSON_Delete(in[k].root);
        free(in[k].ref);
        free(keep[k]);
    }
    cJSON_Delete(prompts);
    return rc;
}
