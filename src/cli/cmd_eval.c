/* dfl eval: the drafter evaluation harness — tau on chain and DDTree, side by side. */
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "dfl/common.h"
#include "dfl/ddtree.h"
#include "dfl/eval.h"
#include "dfl/prompt.h"
#include "dfl/reference.h"

#define MAX_DRAFTERS 8
#define MAX_MODES 8

static const char *usage_text =
    "usage: dfl eval --target T --drafter D1 [--drafter D2 ...] --prompts FILE --out DIR\n"
    "                [--format gsm8k|mtbench|jsonl:FIELD|text] [--limit N] [--max-new N]\n"
    "                [--chat chatml|chatml-nothink|none] [--block-size B] [--tree-budget 0,8,32]\n"
    "                [--temperature X --seed S] [--first-turn] [--resume] [--shard i/n] [--keep-going]\n"
    "                [--reference FILE.jsonl | --reference-url URL] [--max-context N]\n"
    "\n"
    "For every prompt: one autoregressive greedy run of the target (timed; its tokens are the truth),\n"
    "then every drafter in every verification mode (tree budget 0 = chain, N = DDTree-N). Every\n"
    "speculative output is checked token for token against the autoregressive one (at temperature 0);\n"
    "a mismatch is reported with its position and makes the exit status 1.\n"
    "\n"
    "Output in DIR: results.jsonl (a line per prompt x drafter x mode, appended as it goes),\n"
    "summary.json, summary.md (drafters side by side, a column per mode), per_position.svg,\n"
    "tau_hist.svg, and reference.jsonl with a reference. Metric definitions are in summary.json.\n"
    "\n"
    "  --target DIR          target checkpoint\n"
    "  --drafter DIR         a DFlash drafter (repeat to compare several, up to 8)\n"
    "  --prompts FILE        prompt set\n"
    "  --format F            gsm8k (\"question\"), mtbench (\"turns\"), jsonl:FIELD, text (a prompt per\n"
    "                        line); default: gsm8k, or mtbench for a file with \"turns\"\n"
    "  --limit N             first N prompts\n"
    "  --max-new N           tokens per response (default 256)\n"
    "  --chat MODE           prompt template (default chatml)\n"
    "  --block-size B        verification block (default: each drafter's block_size)\n"
    "  --tree-budget LIST    verification modes, comma-separated: 0 = chain, N = DDTree-N (default 0)\n"
    "  --temperature X       sampling temperature (default 0); > 0 skips the token-for-token check\n"
    "  --seed S              sampling seed (default 0)\n"
    "  --first-turn          MT-Bench: only the first turn (default: both, the second built on the\n"
    "                        model's own first answer, as FastChat does)\n"
    "  --resume              keep DIR/results.jsonl and skip what it already holds\n"
    "  --shard i/n           only prompts whose index %% n == i (merge shards with dfl eval-merge)\n"
    "  --keep-going          skip malformed prompt lines (listed in summary.json) instead of failing\n"
    "  --reference FILE      reference outputs: JSON lines {\"id\", [\"turn\",] \"output_ids\" | \"text\"}\n"
    "  --reference-url URL   a server: .../v1/completions (OpenAI-compatible) or .../generate (SGLang)\n"
    "  --max-context N       positions to allocate (default: longest prompt + max-new + tree budget)\n"
    "  --progress MODE       auto | bar | lines | none (default auto: a bar on a terminal)\n";

typedef struct evo {
    const char *target, *prompts, *out, *reference, *reference_url;
    const char *drafters[MAX_DRAFTERS];
    int n_drafters;
    int budgets[MAX_MODES], n_modes;
    eval_format fmt;
    char field[128];
    int have_fmt, limit, max_new, chat, block, first_turn, resume, shard_i, shard_n, keep_going, max_ctx;
    double temperature;
    long seed;
    const char *progress;
} evo;

typedef struct done_set {
    eval_result *r;
    int32_t **ids;
    int *n_ids;
    int n;
    long good_end; /* bytes of complete lines: an interrupted write leaves a partial line after */
} done_set;

static int mkdir_p(const char *dir) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", dir);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(tmp, 0755);
            *p = '/';
        }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return dfl_seterr("%s: cannot create directory", dir);
    return DFL_OK;
}

/* Results already in DIR/results.jsonl (for --resume and the summary). */
static int load_done(done_set *d, const char *path) {
    memset(d, 0, sizeof *d);
    FILE *f = fopen(path, "r");
    if (!f) return DFL_OK;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int lineno = 0, rc = DFL_OK;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if (len <= 1) {
            d->good_end += len;
            continue;
        }
        d->r = realloc(d->r, (size_t)(d->n + 1) * sizeof *d->r);
        d->ids = realloc(d->ids, (size_t)(d->n + 1) * sizeof *d->ids);
        d->n_ids = realloc(d->n_ids, (size_t)(d->n + 1) * sizeof *d->n_ids);
        if (eval_result_parse(line, &d->r[d->n], &d->ids[d->n], &d->n_ids[d->n]) != DFL_OK) {
            /* an interrupted write leaves a partial last line: drop it, anything else is an error */
            if (line[len - 1] != '\n') break;
            rc = dfl_preperr("%s:%d", path, lineno);
            break;
        }
        if (line[len - 1] != '\n') { /* complete JSON but cut before its newline: redo it */
            free(d->ids[d->n]);
            break;
        }
        d->good_end += len;
        d->n++;
    }
    free(line);
    fclose(f);
    return rc;
}

static void done_free(done_set *d) {
    for (int i = 0; i < d->n; i++) free(d->ids[i]);
    free(d->r), free(d->ids), free(d->n_ids);
    memset(d, 0, sizeof *d);
}

static int done_find(const done_set *d, const char *pid, int turn, const char *drafter, const char *mode) {
    for (int i = 0; i < d->n; i++)
        if (d->r[i].turn == turn && strcmp(d->r[i].prompt_id, pid) == 0 && strcmp(d->r[i].drafter, drafter) == 0 &&
            strcmp(d->r[i].mode, mode) == 0)
            return i;
    return -1;
}

static void mode_name(int budget, char *buf, size_t n) {
    if (budget) snprintf(buf, n, "ddtree-%d", budget);
    else snprintf(buf, n, "chain");
}

/* Progress on stderr: a bar with ETA on a terminal, plain lines otherwise. */
typedef struct progress {
    int bar, quiet, total, done;
    double t0;
} progress;

static void progress_show(progress *p, const char *what, double tau) {
    if (p->quiet) return;
    const double el = dfl_now() - p->t0, eta = p->done ? el / p->done * (p->total - p->done) : 0;
    if (p->bar) {
        const int w = 30, fill = p->total ? w * p->done / p->total : w;
        fprintf(stderr, "\r[%.*s%*s] %d/%d  %s  elapsed %.0fs  ETA %.0fs  last tau %.2f   ", fill,
                "##############################", w - fill, "", p->done, p->total, what, el, eta, tau);
        if (p->done == p->total) fputc('\n', stderr);
    } else {
        fprintf(stderr, "[dfl eval] %d/%d %s (elapsed %.0fs, ETA %.0fs, last tau %.2f)\n", p->done, p->total, what,
                el, eta, tau);
    }
}

static int parse_args(evo *o, int argc, char **argv) {
    memset(o, 0, sizeof *o);
    o->max_new = 256;
    o->chat = DFL_CHAT_CHATML;
    o->n_modes = 1;
    o->shard_n = 1;
    o->progress = "auto";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        long v;
        if (cli_is_help(a)) {
            fputs(usage_text, stdout);
            exit(0);
        } else if (strcmp(a, "--target") == 0) o->target = cli_value(argc, argv, &i);
        else if (strcmp(a, "--drafter") == 0) {
            if (o->n_drafters == MAX_DRAFTERS) return cli_usage_error("eval", "at most %d drafters", MAX_DRAFTERS);
            o->drafters[o->n_drafters++] = cli_value(argc, argv, &i);
        } else if (strcmp(a, "--prompts") == 0) o->prompts = cli_value(argc, argv, &i);
        else if (strcmp(a, "--out") == 0) o->out = cli_value(argc, argv, &i);
        else if (strcmp(a, "--format") == 0) {
            if (eval_format_parse(cli_value(argc, argv, &i), &o->fmt, o->field, sizeof o->field) != DFL_OK)
                return cli_usage_error("eval", "--format: %s", dfl_errmsg());
            o->have_fmt = 1;
        } else if (strcmp(a, "--limit") == 0) {
            if (cli_parse_long("eval", a, cli_value(argc, argv, &i), 1, 1 << 30, &v)) return 2;
            o->limit = (int)v;
        } else if (strcmp(a, "--max-new") == 0) {
            if (cli_parse_long("eval", a, cli_value(argc, argv, &i), 1, 1 << 20, &v)) return 2;
            o->max_new = (int)v;
        } else if (strcmp(a, "--max-context") == 0) {
            if (cli_parse_long("eval", a, cli_value(argc, argv, &i), 1, 1 << 24, &v)) return 2;
            o->max_ctx = (int)v;
        } else if (strcmp(a, "--chat") == 0) {
            const char *c = cli_value(argc, argv, &i);
            if ((o->chat = prompt_chat_parse(c)) < 0)
                return cli_usage_error("eval", "--chat: expected chatml, chatml-nothink or none, found '%s'", c);
        } else if (strcmp(a, "--block-size") == 0) {
            if (cli_parse_long("eval", a, cli_value(argc, argv, &i), 2, DFL_MAX_BLOCK, &v)) return 2;
            o->block = (int)v;
        } else if (strcmp(a, "--tree-budget") == 0) {
            int32_t *ids = NULL;
            size_t n = 0;
            const char *s = cli_value(argc, argv, &i);
            if (strchr(s, '-') || prompt_parse_ids(s, &ids, &n) != DFL_OK || n == 0 || n > MAX_MODES) {
                free(ids);
                return cli_usage_error("eval", "--tree-budget: expected up to %d comma-separated budgets in [0, %d], "
                                       "found '%s'", MAX_MODES, DDTREE_MAX_BUDGET, s);
            }
            o->n_modes = (int)n;
            for (size_t k = 0; k < n; k++) {
                if (ids[k] > DDTREE_MAX_BUDGET) {
                    free(ids);
                    return cli_usage_error("eval", "--tree-budget: %d exceeds the maximum %d", ids[k],
                                           DDTREE_MAX_BUDGET);
                }
                o->budgets[k] = ids[k];
            }
            free(ids);
        } else if (strcmp(a, "--temperature") == 0) {
            if (cli_parse_double("eval", a, cli_value(argc, argv, &i), &o->temperature)) return 2;
            if (o->temperature < 0) return cli_usage_error("eval", "--temperature must be >= 0");
        } else if (strcmp(a, "--seed") == 0) {
            if (cli_parse_long("eval", a, cli_value(argc, argv, &i), 0, 0x7fffffffffffffffL, &o->seed)) return 2;
        } else if (strcmp(a, "--first-turn") == 0) o->first_turn = 1;
        else if (strcmp(a, "--resume") == 0) o->resume = 1;
        else if (strcmp(a, "--keep-going") == 0) o->keep_going = 1;
        else if (strcmp(a, "--reference") == 0) o->reference = cli_value(argc, argv, &i);
        else if (strcmp(a, "--reference-url") == 0) o->reference_url = cli_value(argc, argv, &i);
        else if (strcmp(a, "--progress") == 0) {
            o->progress = cli_value(argc, argv, &i);
            if (strcmp(o->progress, "auto") && strcmp(o->progress, "bar") && strcmp(o->progress, "lines") &&
                strcmp(o->progress, "none"))
                return cli_usage_error("eval", "--progress: expected auto, bar, lines or none");
        } else if (strcmp(a, "--shard") == 0) {
            const char *s = cli_value(argc, argv, &i);
            if (sscanf(s, "%d/%d", &o->shard_i, &o->shard_n) != 2 || o->shard_n < 1 || o->shard_i < 0 ||
                o->shard_i >= o->shard_n)
                return cli_usage_error("eval", "--shard: expected i/n with 0 <= i < n, found '%s'", s);
        } else return cli_usage_error("eval", "unknown argument '%s' (see dfl eval --help)", a);
    }
    if (!o->target || !o->n_drafters || !o->prompts || !o->out)
        return cli_usage_error("eval", "needs --target, at least one --drafter, --prompts and --out");
    if (o->reference && o->reference_url) return cli_usage_error("eval", "give --reference or --reference-url, not both");
    for (int k = 0; k < o->n_modes; k++)
        if (o->budgets[k] && o->temperature > 0)
            return cli_usage_error("eval", "DDTree (--tree-budget > 0) is greedy: it cannot be combined with --temperature");
    return 0;
}

/* Guess the format from the first line when --format is absent. */
static void sniff_format(evo *o) {
    FILE *f = fopen(o->prompts, "r");
    char line[8192] = "";
    if (f) {
        if (!fgets(line, sizeof line, f)) line[0] = 0;
        fclose(f);
    }
    o->fmt = strstr(line, "\"turns\"") ? EVAL_FMT_MTBENCH : EVAL_FMT_GSM8K;
}

/* The conversation text for a turn: turn 1 alone, or turn 1 + the model's answer + turn 2. */
static char *turn_text(const eval_prompt *p, int turn, const char *answer1, dfl_chat chat) {
    char *first = prompt_format(p->turns[0], chat);
    if (turn == 0 || chat == DFL_CHAT_NONE) {
        if (turn == 0) return first;
        /* no template: the raw texts one after another */
        size_t n = strlen(first) + strlen(answer1) + strlen(p->turns[1]) + 4;
        char *s = malloc(n);
        snprintf(s, n, "%s%s\n%s", first, answer1, p->turns[1]);
        free(first);
        return s;
    }
    char *second = prompt_format(p->turns[1], chat);
    size_t n = strlen(first) + strlen(answer1) + strlen(second) + 32;
    char *s = malloc(n);
    snprintf(s, n, "%s%s<|im_end|>\n%s", first, answer1, second);
    free(first);
    free(second);
    return s;
}

int cmd_eval(int argc, char **argv) {
    evo o;
    int rc = parse_args(&o, argc, argv);
    if (rc) return rc;
    if (!o.have_fmt) sniff_format(&o);
    /* every input is checked before any work */
    eval_prompts ps;
    if (eval_prompts_load(&ps, o.prompts, o.fmt, o.field, o.limit, o.keep_going) != DFL_OK)
        return cli_fail("eval", "%s", dfl_errmsg());
    for (int i = 0; i < ps.n_bad; i++) fprintf(stderr, "dfl eval: %s:%d: malformed prompt line skipped\n", o.prompts, ps.bad_lines[i]);
    dfl_model m;
    if (model_open(&m, o.target, 0) != DFL_OK) {
        eval_prompts_free(&ps);
        return cli_fail("eval", "%s", dfl_errmsg());
    }
    dfl_drafter ds[MAX_DRAFTERS];
    int n_open = 0;
    dfl_tokenizer *tok = NULL;
    ref_set refs = {0};
    done_set done = {0};
    FILE *resf = NULL, *reff = NULL;
    for (; n_open < o.n_drafters; n_open++) {
        if (drafter_open(&ds[n_open], o.drafters[n_open], m.cfg.n_layers) != DFL_OK ||
            drafter_check_target(&ds[n_open], &m) != DFL_OK) {
            rc = cli_fail("eval", "%s", dfl_errmsg());
            if (ds[n_open].dir) drafter_close(&ds[n_open]);
            goto out;
        }
        if (o.block && o.block > ds[n_open].cfg.block_size) {
            rc = cli_fail("eval", "--block-size %d exceeds drafter %s's block_size %d", o.block, o.drafters[n_open],
                          ds[n_open].cfg.block_size);
            drafter_close(&ds[n_open]);
            goto out;
        }
    }
    if (!(tok = tok_open(o.target))) {
        rc = cli_fail("eval", "%s", dfl_errmsg());
        goto out;
    }
    if (o.reference && ref_file_load(&refs, o.reference, tok) != DFL_OK) {
        rc = cli_fail("eval", "%s", dfl_errmsg());
        goto out;
    }
    if (mkdir_p(o.out) != DFL_OK) {
        rc = cli_fail("eval", "%s", dfl_errmsg());
        goto out;
    }
    char *res_path = dfl_path_join(o.out, "results.jsonl"), *ref_path = dfl_path_join(o.out, "reference.jsonl");
    struct stat stt;
    if (!o.resume && stat(res_path, &stt) == 0 && stt.st_size > 0) {
        rc = cli_fail("eval", "%s already holds results: use --resume to continue it, or another --out", res_path);
        goto out_paths;
    }
    if (load_done(&done, res_path) != DFL_OK) {
        rc = cli_fail("eval", "%s", dfl_errmsg());
        goto out_paths;
    }
    if (o.resume && stat(res_path, &stt) == 0 && done.good_end < stt.st_size && truncate(res_path, done.good_end) != 0) {
        rc = cli_fail("eval", "%s: cannot drop the partial last line", res_path);
        goto out_paths;
    }
    resf = fopen(res_path, o.resume ? "a" : "w");
    reff = (o.reference || o.reference_url) ? fopen(ref_path, o.resume ? "a" : "w") : NULL;
    if (!resf || ((o.reference || o.reference_url) && !reff)) {
        rc = cli_fail("eval", "%s: cannot write", o.out);
        goto out_paths;
    }

    /* sizes: the longest first-turn prompt; second turns add an answer and a question */
    int max_prompt = 0, max_budget = 0, max_block = 2;
    for (int k = 0; k < o.n_modes; k++) max_budget = o.budgets[k] > max_budget ? o.budgets[k] : max_budget;
    for (int d = 0; d < o.n_drafters; d++) {
        const int b = o.block ? o.block : ds[d].cfg.block_size;
        max_block = b > max_block ? b : max_block;
    }
    for (int i = 0; i < ps.n; i++) {
        int need = 0;
        for (int t = 0; t < (o.first_turn ? 1 : ps.p[i].n_turns); t++) {
            char *txt = prompt_format(ps.p[i].turns[t], (dfl_chat)o.chat);
            int32_t *ids;
            size_t n;
            if (tok_encode(tok, txt, strlen(txt), &ids, &n) != DFL_OK) {
                free(txt);
                rc = cli_fail("eval", "prompt %s: %s", ps.p[i].id, dfl_errmsg());
                goto out_paths;
            }
            need += (int)n + (t ? o.max_new + 8 : 0);
            free(ids);
            free(txt);
        }
        max_prompt = need > max_prompt ? need : max_prompt;
    }
    const int max_ctx = o.max_ctx ? o.max_ctx : max_prompt + o.max_new + max_budget;
    const int chunk = max_prompt < 512 ? max_prompt : 512;
    int max_batch = chunk > max_block ? chunk : max_block;
    if (max_budget + 1 > max_batch) max_batch = max_budget + 1;
    dfl_state st;
    if (state_init(&st, &m, max_ctx, max_batch, 1) != DFL_OK ||
        (max_budget && state_enable_tree(&st, max_budget + 1) != DFL_OK)) {
        rc = cli_fail("eval", "%s", dfl_errmsg());
        goto out_paths;
    }
    dfl_dstate dst[MAX_DRAFTERS];
    uint64_t state_bytes = st.bytes, weight_bytes = m.weight_bytes;
    for (int d = 0; d < o.n_drafters; d++) {
        if (dstate_init(&dst[d], &ds[d], &m, max_ctx, o.block ? o.block : ds[d].cfg.block_size) != DFL_OK) {
            rc = cli_fail("eval", "%s", dfl_errmsg());
            for (int k = 0; k < d; k++) dstate_free(&dst[k]);
            state_free(&st);
            goto out_paths;
        }
        state_bytes += dst[d].bytes;
        weight_bytes += ds[d].weight_bytes;
    }

    int32_t *truth = malloc((size_t)o.max_new * sizeof(int32_t)), *out = malloc((size_t)o.max_new * sizeof(int32_t));
    int n_mine = 0, mismatches = 0, total = 0, ref_compared = 0, ref_agree = 0;
    for (int i = 0; i < ps.n; i++) n_mine += i % o.shard_n == o.shard_i;
    progress pg = {.total = n_mine, .t0 = dfl_now(), .quiet = strcmp(o.progress, "none") == 0};
    pg.bar = strcmp(o.progress, "bar") == 0 || (strcmp(o.progress, "auto") == 0 && isatty(2));
    for (int i = 0; i < ps.n && rc == 0; i++) {
        if (i % o.shard_n != o.shard_i) continue;
        const eval_prompt *p = &ps.p[i];
        char *answer1 = NULL;
        double last_tau = 0;
        for (int turn = 0; turn < (o.first_turn ? 1 : p->n_turns) && rc == 0; turn++) {
            char *txt = turn_text(p, turn, answer1 ? answer1 : "", (dfl_chat)o.chat);
            int32_t *pids = NULL;
            size_t np = 0;
            tok_encode(tok, txt, strlen(txt), &pids, &np);
            free(txt);
            if ((int)np + o.max_new + max_budget > max_ctx) {
                rc = cli_fail("eval", "prompt %s turn %d: %zu tokens + --max-new %d exceed the context %d", p->id,
                              turn + 1, np, o.max_new, max_ctx);
                free(pids);
                break;
            }
            /* 1. the autoregressive run: its tokens are the truth */
            dfl_gen_opts go = {.max_new = o.max_new, .temperature = (float)o.temperature, .seed = (uint64_t)o.seed};
            dfl_gen_stats gs;
            int n_truth;
            int k = done_find(&done, p->id, turn, "", "ar");
            if (k >= 0 && done.ids[k]) {
                n_truth = done.n_ids[k] < o.max_new ? done.n_ids[k] : o.max_new;
                memcpy(truth, done.ids[k], (size_t)n_truth * sizeof(int32_t));
            } else {
                state_reset(&st);
                if (spec_generate(&st, NULL, pids, (int)np, &go, truth, &gs, NULL, NULL) != DFL_OK) {
                    rc = cli_fail("eval", "prompt %s: %s", p->id, dfl_errmsg());
                    free(pids);
                    break;
                }
                n_truth = gs.generated;
                eval_result r = {.turn = turn, .match = -1, .first_mismatch = -1};
                snprintf(r.prompt_id, sizeof r.prompt_id, "%s", p->id);
                snprintf(r.mode, sizeof r.mode, "ar");
                eval_result_from_stats(&r, &gs);
                eval_result_write(resf, &r, truth, n_truth);
                fputc('\n', resf);
                fflush(resf);
            }
            /* reference agreement of the target's greedy output */
            if (o.reference || o.reference_url) {
                const ref_entry *re = o.reference ? ref_find(&refs, p->id, turn) : NULL;
                int32_t *rids = NULL;
                int nr = 0, have = 0;
                if (re) rids = re->ids, nr = re->n, have = 1;
                else if (o.reference_url) {
                    if (ref_url_generate(o.reference_url, pids, (int)np, o.max_new, &rids, &nr) != DFL_OK) {
                        rc = cli_fail("eval", "prompt %s: reference: %s", p->id, dfl_errmsg());
                        free(pids);
                        break;
                    }
                    have = 1;
                }
                if (have) {
                    const int div = ref_first_divergence(truth, n_truth, rids, nr);
                    fprintf(reff, "{\"prompt_id\": ");
                    cli_json_string(reff, p->id);
                    fprintf(reff, ", \"turn\": %d, \"dfl_tokens\": %d, \"reference_tokens\": %d, "
                                  "\"first_divergence\": %d}\n", turn, n_truth, nr, div);
                    fflush(reff);
                    ref_compared++;
                    ref_agree += div < 0;
                    if (div >= 0 && !pg.bar)
                        fprintf(stderr, "[dfl eval] prompt %s turn %d: target output diverges from the reference at "
                                        "token %d\n", p->id, turn + 1, div);
                } else {
                    fprintf(stderr, "dfl eval: prompt %s turn %d: no reference entry\n", p->id, turn + 1);
                }
                if (!re) free(rids);
            }
            /* 2. every drafter in every mode */
            for (int d = 0; d < o.n_drafters && rc == 0; d++) {
                for (int mi = 0; mi < o.n_modes; mi++) {
                    char mode[32];
                    mode_name(o.budgets[mi], mode, sizeof mode);
                    if (done_find(&done, p->id, turn, o.drafters[d], mode) >= 0) continue;
                    state_reset(&st);
                    dstate_reset(&dst[d]);
                    dfl_draft_if dif = spec_dflash_drafter(&dst[d]);
                    dfl_gen_opts so = go;
                    so.block = o.block ? o.block : ds[d].cfg.block_size;
                    so.tree_budget = o.budgets[mi];
                    if (spec_generate(&st, &dif, pids, (int)np, &so, out, &gs, NULL, NULL) != DFL_OK) {
                        rc = cli_fail("eval", "prompt %s, drafter %s, %s: %s", p->id, o.drafters[d], mode,
                                      dfl_errmsg());
                        break;
                    }
                    eval_result r = {.turn = turn, .match = -1, .first_mismatch = -1};
                    snprintf(r.prompt_id, sizeof r.prompt_id, "%s", p->id);
                    snprintf(r.drafter, sizeof r.drafter, "%s", o.drafters[d]);
                    snprintf(r.mode, sizeof r.mode, "%s", mode);
                    eval_result_from_stats(&r, &gs);
                    if (o.temperature <= 0) {
                        r.first_mismatch = ref_first_divergence(out, gs.generated, truth, n_truth);
                        r.match = r.first_mismatch < 0;
                        if (!r.match) {
                            mismatches++;
                            fprintf(stderr, "%sdfl eval: MISMATCH prompt %s turn %d, drafter %s, %s: the speculative "
                                            "output differs from the autoregressive one at token %d\n",
                                    pg.bar ? "\n" : "", p->id, turn + 1, o.drafters[d], mode, r.first_mismatch);
                        }
                    }
                    eval_result_write(resf, &r, out, gs.generated);
                    fputc('\n', resf);
                    fflush(resf);
                    last_tau = gs.rounds ? (double)(gs.generated - 1) / gs.rounds : 0;
                }
            }
            if (turn == 0 && !o.first_turn && p->n_turns > 1) answer1 = prompt_decode(tok, truth, (size_t)n_truth, NULL);
            free(pids);
        }
        free(answer1);
        total++;
        pg.done = total;
        progress_show(&pg, p->id, last_tau);
    }
    free(truth);
    free(out);
    for (int d = 0; d < o.n_drafters; d++) dstate_free(&dst[d]);
    state_free(&st);
    fclose(resf);
    resf = NULL;
    if (reff) fclose(reff);
    reff = NULL;

    /* 3. the summary, from everything in results.jsonl (this run and earlier ones) */
    if (rc == 0) {
        done_free(&done);
        if (load_done(&done, res_path) != DFL_OK) {
            rc = cli_fail("eval", "%s", dfl_errmsg());
            goto out_paths;
        }
        eval_summary sm;
        eval_summarize(&sm, done.r, done.n);
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        char *extra = NULL;
        size_t extra_len = 0;
        FILE *x = open_memstream(&extra, &extra_len);
        fprintf(x, "\"run\": {\"target\": ");
        cli_json_string(x, o.target);
        fprintf(x, ", \"prompts_file\": ");
        cli_json_string(x, o.prompts);
        fprintf(x, ", \"max_new\": %d, \"chat\": \"%s\", \"temperature\": %g, \"seed\": %ld, \"shard\": \"%d/%d\", "
                   "\"threads\": %d, \"weight_bytes\": %llu, \"state_bytes\": %llu, \"peak_rss_bytes\": %ld, "
                   "\"bad_prompt_lines\": [",
                o.max_new, o.chat == DFL_CHAT_NONE ? "none" : o.chat == DFL_CHAT_CHATML ? "chatml" : "chatml-nothink",
                o.temperature, o.seed, o.shard_i, o.shard_n, omp_get_max_threads(), (unsigned long long)weight_bytes,
                (unsigned long long)state_bytes, ru.ru_maxrss * 1024L);
        for (int i = 0; i < ps.n_bad; i++) fprintf(x, "%s%d", i ? ", " : "", ps.bad_lines[i]);
        fprintf(x, "]}");
        if (o.reference || o.reference_url) {
            fprintf(x, ",\n  \"reference\": {\"source\": ");
            cli_json_string(x, o.reference ? o.reference : o.reference_url);
            fprintf(x, ", \"compared\": %d, \"identical\": %d, \"diverged\": %d, \"details\": \"reference.jsonl\"}",
                    ref_compared, ref_agree, ref_compared - ref_agree);
        }
        fclose(x);
        if (eval_write_reports(&sm, o.out, extra) != DFL_OK) rc = cli_fail("eval", "%s", dfl_errmsg());
        for (int a = 1; a < sm.n_agg && !pg.quiet; a++)
            fprintf(stderr, "[dfl eval] %s %s: tau %.3f (token-weighted %.3f), speedup %.2fx, %d mismatches\n",
                    sm.agg[a].drafter, sm.agg[a].mode, eval_agg_tau(&sm.agg[a]), eval_agg_tau_tokens(&sm.agg[a]),
                    eval_agg_speedup(&sm.agg[a]), sm.agg[a].mismatches);
        if ((o.reference || o.reference_url) && !pg.quiet)
            fprintf(stderr, "[dfl eval] reference: %d of %d outputs identical\n", ref_agree, ref_compared);
        eval_summary_free(&sm);
        free(extra);
        if (rc == 0 && mismatches) {
            fprintf(stderr, "dfl eval: %d speculative outputs differ from the autoregressive ones (see above)\n",
                    mismatches);
            rc = 1;
        }
        if (rc == 0) fprintf(stderr, "[dfl eval] wrote %s/summary.md\n", o.out);
    }
out_paths:
    if (resf) fclose(resf);
    if (reff) fclose(reff);
    free(res_path);
    free(ref_path);
out:
    done_free(&done);
    ref_set_free(&refs);
    if (tok) tok_close(tok);
    for (int d = 0; d < n_open; d++) drafter_close(&ds[d]);
    model_close(&m);
    eval_prompts_free(&ps);
    return rc;
}
