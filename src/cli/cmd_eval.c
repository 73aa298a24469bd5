/* dfl eval: the drafter evaluation harness — tau on chain and DDTree, side by side. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "dfl/common.h"
#include "dfl/ddtree.h"
#include "dfl/eval.h"
#include "dfl/drafter.h"
#include "dfl/prompt.h"
#include "dfl/replay.h"

static const char *usage_text =
    "usage: dfl eval --target T --drafter D1 [--drafter D2 ...] --prompts FILE --out DIR [options]\n"
    "       dfl eval --features DIR --drafter D1 [...] --out DIR2 [--target T] [options]\n"
    "       dfl eval --prompts FILE --tokenizer PATH --dump-prompts F [--protocol zlab] (prompts only)\n"
    "\n"
    "tau of one or more drafters on chain and DDTree verification over a prompt set (docs/eval.md).\n"
    "\n"
    "Replay (default, temperature 0): per prompt ONE recording run of the target - a lossless\n"
    "speculative run with the first drafter in the recording mode, its online stats a result too -\n"
    "gives the truth (the target's greedy output) and the hidden states the drafters read; then every\n"
    "drafter x mode is replayed with drafter-only work: chain accepts the longest draft prefix equal\n"
    "to the truth, DDTree the deepest tree path equal to it. Exact: the same rounds as online runs.\n"
    "Speedups are modeled from costs measured in the run. --online instead runs the target\n"
    "autoregressively and every drafter x mode on it (measured speedups; needed at temperature > 0).\n"
    "\n"
    "Output in DIR: results.jsonl (a line per prompt x drafter x mode, appended as it goes),\n"
    "summary.json, summary.md (drafters side by side, a column per mode), per_position.svg,\n"
    "tau_hist.svg, tau_budget.svg (with DDTree modes), reference.jsonl with a reference.\n"
    "\n"
    "  --target DIR          target checkpoint (with --features: default the recorded one; only its\n"
    "                        embedding and lm_head are read, which the drafters share)\n"
    "  --drafter DIR         a DFlash drafter (repeat to compare several, up to 8); 'mtp' = the target's\n"
    "                        own MTP head, 'DIR:mtp' = the MTP head of checkpoint DIR (labelled 'mtp (DIR)')\n"
    "  --prompts FILE        prompt set\n"
    "  --device D            cpu (default) | cuda: where the target's forwards run (the drafters stay on\n"
    "                        the CPU; the devices this build has: dfl --version); recorded in the results\n"
    "                        and summary.json, and a --resume must use the same (not with "
    "--features)\n" CLI_WEIGHTS_HELP
    "  --tokenizer PATH      tokenizer.json or a directory holding one (default: the target's)\n"
    "  --format F            gsm8k (\"question\"), mtbench (\"turns\"), jsonl:FIELD, text (a prompt per\n"
    "                        line), messages (OpenAI {\"messages\": [{\"role\", \"content\"}]}) or sharegpt\n"
    "                        ({\"conversations\": [{\"from\", \"value\"}]}): their user turns (at most 2) in\n"
    "                        --chat's template, the assistant turn after the first the reference answer;\n"
    "                        default: from the first line (\"turns\", \"messages\", \"conversations\"), else gsm8k\n"
    "  --limit N             first N prompts\n"
    "  --max-new N           tokens per response (default 256; with --features: the recorded one)\n"
    "  --chat MODE           prompt template: chatml, chatml-nothink or none (default chatml)\n"
    "  --block-size B        verification block (default: each drafter's block_size; 4 for an MTP head)\n"
    "  --tree-budget LIST    modes, comma-separated, up to 16: 0 = chain, N = DDTree-N (default 0);\n"
    "                        replay takes budgets up to 4096, online up to 256\n"
    "  --first-turn          MT-Bench: only the first turn (default: both, the second built on the\n"
    "                        model's own first answer, as FastChat does)\n"
    "  --resume              keep DIR/results.jsonl and skip what it already holds\n"
    "  --shard i/n           only prompts whose index mod n == i (merge shards with dfl eval-merge)\n"
    "                        (or `mpirun -n N dfl eval ...`: rank 0 hands the prompts out, longest first,\n"
    "                        and alone writes DIR; dfl --version says whether MPI is built in)\n"
    "  --keep-going          skip malformed prompt lines (listed in summary.json) instead of failing\n"
    "  --reference FILE      reference outputs: JSON lines {\"id\", [\"turn\",] \"output_ids\" | \"text\"}\n"
    "  --reference-url URL   a server: .../v1/completions (OpenAI-compatible) or .../generate (SGLang)\n"
    "  --max-context N       positions to allocate (default: longest prompt + max-new + tree budget)\n"
    "  --protocol zlab       z-lab's dflash benchmark: its prompt format per dataset, its selection\n"
    "                        (random.Random(42).shuffle, then the first --limit), Qwen3's template with\n"
    "                        thinking off (--chat chatml-nothink), --max-new 2048 unless given; tau is\n"
    "                        its acceptance length (docs/eval.md)\n"
    "  --protocol-dataset D  gsm8k, math500, humaneval, mbpp or mt-bench (default: from --format or the\n"
    "                        fields of the first line)\n"
    "  --dump-prompts F      write every prompt (per turn) as JSON lines: text and token ids; without\n"
    "                        --drafter only the prompts are built (second turns need --dump-answer TEXT,\n"
    "                        the first answer they are built on)\n"
    "  --progress MODE       auto | bar | lines | none (default auto: a bar on a terminal); warnings\n"
    "                        and mismatches go to stderr in every mode\n"
    "replay:\n"
    "  --record-mode M       the recording run's mode: chain or ddtree-N (default: the first mode),\n"
    "                        its stats a result (online); or auto: each round a chain verification\n"
    "                        or a plain decode step, whichever commits tokens faster as measured so\n"
    "                        far - cheapest with weak drafters or many of them; no online row\n"
    "  --check-ar            also run the target autoregressively; the truth must equal it token for\n"
    "                        token (a mismatch is reported and makes the exit status 1)\n"
    "  --save-features DIR   write each truth with its features (safetensors per prompt and turn, in\n"
    "                        the `dfl hidden` layout) so a later --features run needs no target forward\n"
    "  --save-layers LIST    with --save-features: also these target layers (or 'all'), for drafters\n"
    "                        that read other layers than the ones given now\n"
    "  --features DIR        replay on saved features instead of recording (no --prompts)\n"
    "  --features-from PATH  also replay on another pipeline's features for the same sequences (a\n"
    "                        directory with the --features file names, `dfl hidden` layout): summary.md\n"
    "                        puts tau on dfl's and on the pipeline's features side by side\n"
    "  --cost-reps N         at least N timed repetitions of each cost measurement for the modeled\n"
    "                        speedup, the fastest kept (default 3; 0 = no modeled speedup)\n"
    "  --replay-batch N      replay N recorded responses together: each DFlash drafter forward drafts\n"
    "                        a block of each, its weights read once for all (default 8, at most 64;\n"
    "                        1 = one at a time; results identical, a crash redoes at most N)\n" CLI_BLOCK_ATTN_HELP
    "  --train-metrics       also compute what drafter training logs (SpecForge's accuracy on seeded\n"
    "                        random anchors, the all-anchor simulated acceptance length, the expected\n"
    "                        acceptance at T = 1) on the same truths, on the prompts' reference\n"
    "                        responses (\"answer\"/\"response\" fields) too, into train.jsonl and a\n"
    "                        \"Training vs serving\" section (docs/train-vs-serve.md)\n"
    "  --train-anchors N     random anchors per response (default 512, SpecForge's num_anchors;\n"
    "                        --seed seeds them)\n"
    "  --train-gamma G       loss decay of the weighted accuracy (default by block: 7 for 16)\n"
    "  --train-top-k K       the target's most probable tokens kept per position for the expected\n"
    "                        acceptance (default 64; the mass they leave out is reported)\n"
    "  --train-batch N       at most N anchors' blocks per drafter forward (default: as many as 64 MiB\n"
    "                        of logits hold, at most 32; the weights stream once per forward)\n"
    "  --train-attn MODE     also score the drafters with sliding_attention layers under this block\n"
    "                        attention (sliding-causal, bidirectional, causal): its row of the gap\n"
    "  --train-chat MODE     also score each response after its prompt rendered in this template\n"
    "                        (chatml, chatml-nothink, none): the chat template's share of the gap\n"
    "online:\n"
    "  --online              run every drafter x mode on the target (after an autoregressive run that\n"
    "                        gives the truth; every output checked against it at temperature 0)\n"
    "  --temperature X       sampling temperature (default 0; > 0 needs --online, skips the check)\n"
    "  --top-k K, --top-p P  at --temperature > 0: sample from the K most probable tokens, then from\n"
    "                        the smallest most-probable-first set holding P of their mass (Qwen's\n"
    "                        recommended serving settings, e.g. T 1, top-p 0.95, top-k 20); both accept\n"
    "                        rules stay lossless under that filtered distribution (0 / 1 = off)\n"
    "  --seed S              sampling seed (default 0)\n"
    "  --repeat N            run the autoregressive and every speculative run of each prompt N times\n"
    "                        (default 1): each measured speedup with its spread over runs (wall-clock\n"
    "                        ratios move with the machine's load); statistics come from the first run\n"
    "  --accept-rule R       at --temperature > 0: pq = speculative sampling (accept with min(1, p/q),\n"
    "                        residual; default) or match = the original DFlash loop (greedy drafts kept\n"
    "                        while they equal the target's sample); both lossless, tau differs\n";

/* Progress on stderr: a bar with ETA on a terminal, plain lines otherwise. */
typedef struct progress {
    int bar, quiet;
    double t0;
} progress;

static void progress_show(void *ud, const eval_progress *e) {
    progress *p = ud;
    if (p->quiet) return;
    const double el = dfl_now() - p->t0, eta = e->done ? el / e->done * (e->total - e->done) : 0;
    if (p->bar) {
        const int w = 30, fill = e->total ? w * e->done / e->total : w;
        fprintf(stderr, "\r[%.*s%*s] %d/%d  %s  elapsed %.0fs  ETA %.0fs  last tau %.2f   ", fill,
                "##############################", w - fill, "", e->done, e->total, e->what, el, eta, e->last_tau);
        if (e->done == e->total) fputc('\n', stderr);
    } else {
        fprintf(stderr, "[dfl eval] %d/%d %s (elapsed %.0fs, ETA %.0fs, last tau %.2f)\n", e->done, e->total, e->what,
                el, eta, e->last_tau);
    }
}

/* Comma-separated integers in [0, hi] into ints (the range is checked on the long, before the cast). */
static int parse_list(const char *opt, const char *s, int *out, int max, long hi, int *n) {
    long v[EVAL_MAX_FEAT_LAYERS > EVAL_MAX_MODES ? EVAL_MAX_FEAT_LAYERS : EVAL_MAX_MODES];
    if (max > (int)(sizeof v / sizeof v[0])) max = (int)(sizeof v / sizeof v[0]);
    if (cli_parse_long_list("eval", opt, s, 0, hi, v, max, n)) return -1;
    for (int k = 0; k < *n; k++) out[k] = (int)v[k];
    return 0;
}

static int parse_args(eval_opts *o, int *save_layers, const char **progress_mode, int *prompts_only, int argc,
                      char **argv) {
    eval_opts_default(o);
    int chat_set = 0;
    *prompts_only = 0;
    *progress_mode = "auto";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        long v;
        dfl_device dev;
        const int dev_rc = cli_device_option("eval", argc, argv, &i, &dev);
        if (dev_rc < 0) return 2;
        if (dev_rc > 0) {
            o->device = (int)dev;
            continue;
        }
        if (cli_is_help(a)) {
            fputs(usage_text, stdout);
            exit(0);
        } else if (strcmp(a, "--target") == 0) o->target = cli_value(argc, argv, &i);
        else if (strcmp(a, "--tokenizer") == 0) o->tokenizer = cli_value(argc, argv, &i);
        else if (strcmp(a, "--drafter") == 0) {
            if (o->n_drafters == EVAL_MAX_DRAFTERS)
                return cli_usage_error("eval", "at most %d drafters", EVAL_MAX_DRAFTERS);
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
            o->max_new_set = 1;
        } else if (strcmp(a, "--max-context") == 0) {
            if (cli_parse_long("eval", a, cli_value(argc, argv, &i), 1, 1 << 24, &v)) return 2;
            o->max_ctx = (int)v;
        } else if (strcmp(a, "--protocol") == 0) {
            const char *pv = cli_value(argc, argv, &i);
            if (strcmp(pv, "zlab") != 0) return cli_usage_error("eval", "--protocol: expected zlab, found '%s'", pv);
            o->protocol = EVAL_PROTOCOL_ZLAB;
        } else if (strcmp(a, "--protocol-dataset") == 0) {
            const char *dv = cli_value(argc, argv, &i);
            if ((o->zlab_dataset = eval_zlab_dataset_parse(dv)) < 0)
                return cli_usage_error("eval",
                                       "--protocol-dataset: expected gsm8k, math500, humaneval, mbpp or "
                                       "mt-bench, found '%s'",
                                       dv);
        } else if (strcmp(a, "--dump-prompts") == 0) {
            o->dump_prompts = cli_value(argc, argv, &i);
        } else if (strcmp(a, "--dump-answer") == 0) {
            o->dump_answer = cli_value(argc, argv, &i);
        } else if (strcmp(a, "--chat") == 0) {
            chat_set = 1;
            const char *c = cli_value(argc, argv, &i);
            if ((o->chat = prompt_chat_parse(c)) < 0)
                return cli_usage_error("eval", "--chat: expected chatml, chatml-nothink or none, found '%s'", c);
        } else if (strcmp(a, "--block-size") == 0) {
            if (cli_parse_long("eval", a, cli_value(argc, argv, &i), 2, DFL_MAX_BLOCK, &v)) return 2;
            o->block = (int)v;
        } else if (strcmp(a, "--tree-budget") == 0) {
            const char *s = cli_value(argc, argv, &i);
            if (parse_list(a, s, o->budgets, EVAL_MAX_MODES, DDTREE_MAX_NODES, &o->n_modes)) return 2;
        } else if (strcmp(a, "--record-mode") == 0) {
            const char *s = cli_value(argc, argv, &i);
            if (eval_record_mode_parse(s, &o->record_budget) != DFL_OK)
                return cli_usage_error("eval", "--record-mode: %s", dfl_errmsg());
        } else if (strcmp(a, "--save-layers") == 0) {
            const char *s = cli_value(argc, argv, &i);
            if (strcmp(s, "all") == 0) o->n_save_layers = -1;
            else if (parse_list(a, s, save_layers, EVAL_MAX_FEAT_LAYERS, EVAL_MAX_FEAT_LAYERS - 1, &o->n_save_layers))
                return 2;
            o->save_layers = save_layers;
        } else if (strcmp(a, "--accept-rule") == 0) {
            const char *v = cli_value(argc, argv, &i);
            if ((o->accept_rule = spec_accept_rule_parse(v)) < 0)
                return cli_usage_error("eval", "--accept-rule: expected pq or match, found '%s'", v);
        } else if (strcmp(a, "--temperature") == 0) {
            if (cli_parse_double("eval", a, cli_value(argc, argv, &i), &o->temperature)) return 2;
            if (!(o->temperature >= 0)) return cli_usage_error("eval", "--temperature must be >= 0");
        } else if (strcmp(a, "--top-k") == 0) {
            if (cli_parse_long("eval", a, cli_value(argc, argv, &i), 0, 1 << 30, &v)) return 2;
            o->top_k = (int)v;
        } else if (strcmp(a, "--top-p") == 0) {
            if (cli_parse_double("eval", a, cli_value(argc, argv, &i), &o->top_p)) return 2;
            if (!(o->top_p > 0 && o->top_p <= 1)) return cli_usage_error("eval", "--top-p must be in (0, 1]");
        } else if (strcmp(a, "--seed") == 0) {
            if (cli_parse_long("eval", a, cli_value(argc, argv, &i), 0, 0x7fffffffffffffffL, &o->seed)) return 2;
        } else if (strcmp(a, "--repeat") == 0) {
            if (cli_parse_long("eval", a, cli_value(argc, argv, &i), 1, EVAL_MAX_REPEAT, &v)) return 2;
            o->repeat = (int)v;
        } else if (strcmp(a, "--cost-reps") == 0) {
            if (cli_parse_long("eval", a, cli_value(argc, argv, &i), 0, 100, &v)) return 2;
            o->cost_reps = (int)v;
        } else if (strcmp(a, "--replay-batch") == 0) {
            if (cli_parse_long("eval", a, cli_value(argc, argv, &i), 1, EVAL_MAX_REPLAY_BATCH, &v)) return 2;
            o->replay_batch = (int)v;
        } else if (strcmp(a, "--train-anchors") == 0) {
            if (cli_parse_long("eval", a, cli_value(argc, argv, &i), 1, 1 << 20, &v)) return 2;
            o->train_anchors = (int)v;
        } else if (strcmp(a, "--train-top-k") == 0) {
            if (cli_parse_long("eval", a, cli_value(argc, argv, &i), 1, 1 << 20, &v)) return 2;
            o->train_topk = (int)v;
        } else if (strcmp(a, "--train-gamma") == 0) {
            if (cli_parse_double("eval", a, cli_value(argc, argv, &i), &o->train_gamma)) return 2;
            if (!(o->train_gamma > 0)) return cli_usage_error("eval", "--train-gamma must be > 0");
        } else if (strcmp(a, "--block-attn") == 0) {
            if (cli_block_attn_option("eval", argc, argv, &i, &o->block_attn) < 0) return 2;
        } else if (strcmp(a, "--train-attn") == 0) {
            const char *v = cli_value(argc, argv, &i);
            int c;
            if (drafter_causal_parse(v, &c) != DFL_OK || c == DFL_BLOCK_ATTN_AUTO)
                return cli_usage_error("eval",
                                       "--train-attn: expected sliding-causal, bidirectional or causal, found "
                                       "'%s'",
                                       v);
            o->train_attn = c;
        } else if (strcmp(a, "--train-batch") == 0) {
            if (cli_parse_long("eval", a, cli_value(argc, argv, &i), 1, 32, &v)) return 2;
            o->train_batch = (int)v;
        } else if (strcmp(a, "--train-chat") == 0) {
            const char *v = cli_value(argc, argv, &i);
            if ((o->train_chat = prompt_chat_parse(v)) < 0)
                return cli_usage_error("eval", "--train-chat: expected chatml, chatml-nothink or none, found '%s'", v);
        } else if (strcmp(a, "--train-metrics") == 0) o->train_metrics = 1;
        else if (strcmp(a, "--first-turn") == 0) o->first_turn = 1;
        else if (strcmp(a, "--resume") == 0) o->resume = 1;
        else if (strcmp(a, "--keep-going") == 0) o->keep_going = 1;
        else if (strcmp(a, "--online") == 0) o->online = 1;
        else if (strcmp(a, "--check-ar") == 0) o->check_ar = 1;
        else if (strcmp(a, "--save-features") == 0) o->save_features = cli_value(argc, argv, &i);
        else if (strcmp(a, "--features") == 0) o->features_dir = cli_value(argc, argv, &i);
        else if (strcmp(a, "--features-from") == 0) o->features_from = cli_value(argc, argv, &i);
        else if (strcmp(a, "--reference") == 0) o->reference = cli_value(argc, argv, &i);
        else if (strcmp(a, "--reference-url") == 0) o->reference_url = cli_value(argc, argv, &i);
        else if (strcmp(a, "--progress") == 0) {
            *progress_mode = cli_value(argc, argv, &i);
            if (strcmp(*progress_mode, "auto") && strcmp(*progress_mode, "bar") && strcmp(*progress_mode, "lines") &&
                strcmp(*progress_mode, "none"))
                return cli_usage_error("eval", "--progress: expected auto, bar, lines or none");
        } else if (strcmp(a, "--shard") == 0) {
            const char *s = cli_value(argc, argv, &i);
            char *end, *end2 = NULL;
            errno = 0;
            const long si = strtol(s, &end, 10);
            const long sn = *end == '/' ? strtol(end + 1, &end2, 10) : 0;
            if (errno || *end != '/' || end == s || end2 == end + 1 || *end2 || sn < 1 || sn > 1 << 20 || si < 0 ||
                si >= sn)
                return cli_usage_error("eval", "--shard: expected i/n with 0 <= i < n <= %d, found '%s'", 1 << 20, s);
            o->shard_i = (int)si, o->shard_n = (int)sn;
        } else return cli_usage_error("eval", "unknown argument '%s' (see dfl eval --help)", a);
    }
    if (o->zlab_dataset >= 0 && !o->protocol)
        return cli_usage_error("eval", "--protocol-dataset needs --protocol zlab");
    eval_opts_protocol_defaults(o, chat_set);
    if (o->dump_answer && !o->dump_prompts) return cli_usage_error("eval", "--dump-answer needs --dump-prompts");
    if (o->dump_prompts && !o->n_drafters) {
        *prompts_only = 1;
        if (!o->prompts || (!o->tokenizer && !o->target))
            return cli_usage_error("eval", "--dump-prompts without --drafter builds the prompts only: it needs "
                                           "--prompts and --tokenizer (or --target)");
        return 0;
    }
    if (o->dump_answer)
        return cli_usage_error("eval", "--dump-answer: only without --drafter (a run builds second "
                                       "turns on the model's own answers)");
    if (!o->n_drafters || !o->out || (!o->features_dir && (!o->target || !o->prompts)))
        return cli_usage_error("eval", "needs --target, at least one --drafter, --prompts and --out (or --features "
                                       "DIR instead of --target and --prompts)");
    if (o->n_save_layers && !o->save_features) return cli_usage_error("eval", "--save-layers needs --save-features");
    return 0;
}

int cmd_eval(int argc, char **argv) {
    eval_opts o;
    int save_layers[EVAL_MAX_FEAT_LAYERS];
    const char *pm;
    int prompts_only;
    int rc = parse_args(&o, save_layers, &pm, &prompts_only, argc, argv);
    if (rc) return rc;
    if (prompts_only) {
        if (eval_dump_prompts(&o) != DFL_OK) return cli_fail("eval", "%s", dfl_errmsg());
        return 0;
    }
    if (eval_opts_check(&o) != DFL_OK) return cli_usage_error("eval", "%s", dfl_errmsg());
    progress pg = {.t0 = dfl_now(), .quiet = strcmp(pm, "none") == 0};
    pg.bar = strcmp(pm, "bar") == 0 || (strcmp(pm, "auto") == 0 && isatty(2));
    o.log = stderr; /* warnings and mismatches: whatever the progress mode */
    o.on_progress = progress_show, o.progress_ud = &pg;
    if (eval_mpi_launched()) { /* one of several ranks: the prompts are spread over them */
#ifdef DFL_HAVE_MPI
        return eval_mpi_run(&o, pg.quiet);
#else
        return cli_fail("eval", "launched as one of several MPI ranks, but this dfl was built without MPI (CMake "
                                "found none; dfl --version says so): each rank would run every prompt. Install "
                                "libopenmpi-dev and rebuild, or use --shard i/n and dfl eval-merge");
#endif
    }
    eval_outcome res;
    if (eval_run(&o, &res) != DFL_OK) {
        if (pg.bar) fputc('\n', stderr);
        return cli_fail("eval", "%s", dfl_errmsg());
    }
    if (res.mismatches) {
        fprintf(stderr, "dfl eval: %d outputs differ from the autoregressive ones (see above)\n", res.mismatches);
        return 1;
    }
    if (!pg.quiet) fprintf(stderr, "[dfl eval] wrote %s/summary.md\n", o.out);
    return 0;
}
