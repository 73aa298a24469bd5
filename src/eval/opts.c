/* dfl eval's options (include/dfl/eval.h): defaults, the --protocol's, --record-mode, the checks. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/ddtree.h"
#include "dfl/eval.h"
#include "dfl/prompt.h"

void eval_opts_default(eval_opts *o) {
    memset(o, 0, sizeof *o);
    o->max_new = 256;
    o->chat = DFL_CHAT_CHATML;
    o->n_modes = 1;
    o->shard_n = 1;
    o->record_budget = -1;
    o->cost_reps = 3;
    o->replay_batch = 8;
    o->repeat = 1;
    o->zlab_dataset = -1;
    o->train_anchors = 512;
    o->train_topk = 64;
    o->train_attn = EVAL_TRAIN_ATTN_NONE;
    o->train_chat = -1;
    o->block_attn = DFL_BLOCK_ATTN_AUTO;
}

void eval_opts_protocol_defaults(eval_opts *o, int chat_set) {
    if (!o->protocol) return;
    if (!chat_set) o->chat = DFL_CHAT_CHATML_NOTHINK;
    if (!o->max_new_set) o->max_new = EVAL_ZLAB_MAX_NEW;
}

int eval_record_mode_parse(const char *s, int *budget) {
    if (strcmp(s, "auto") == 0) return *budget = EVAL_RECORD_AUTO, DFL_OK;
    if (strcmp(s, "chain") == 0) return *budget = 0, DFL_OK;
    const char *num = strncmp(s, "ddtree-", 7) == 0 ? s + 7 : s;
    char *end;
    errno = 0;
    const long v = strtol(num, &end, 10);
    if (errno || *end || end == num || v < 0 || v > DDTREE_MAX_BUDGET)
        return dfl_seterr("expected chain, ddtree-N with N <= %d or auto, found '%s'", DDTREE_MAX_BUDGET, s);
    *budget = (int)v;
    return DFL_OK;
}

int eval_opts_check(const eval_opts *o) {
    if (!o->n_drafters || !o->out) return dfl_seterr("needs at least one --drafter and --out");
    if (!o->features_dir && (!o->target || !o->prompts)) return dfl_seterr("needs --target and --prompts");
    if (o->protocol == EVAL_PROTOCOL_ZLAB && o->chat != DFL_CHAT_CHATML_NOTHINK)
        return dfl_seterr("--protocol zlab uses Qwen3's template with thinking off (--chat chatml-nothink)");
    if (o->protocol == EVAL_PROTOCOL_ZLAB && o->features_dir)
        return dfl_seterr("--protocol zlab builds prompts: not with --features (the saved truths hold theirs)");
    if (o->dump_prompts && o->features_dir)
        return dfl_seterr("--dump-prompts: not with --features (no prompts are built)");
    if (o->dist && (o->save_features || o->dump_prompts || o->reference || o->reference_url))
        return dfl_seterr("a run spread over processes (MPI) writes results.jsonl and the reports only: "
                          "--save-features, --dump-prompts, --reference and --reference-url need one process "
                          "(or --shard i/n per process and dfl eval-merge)");
    if (o->features_dir && o->prompts) return dfl_seterr("--features replays the saved prompts: give no --prompts");
    if (o->train_metrics && (o->online || o->dist))
        return dfl_seterr("--train-metrics scores recorded truths: it needs replay (not --online) in one process "
                          "(not MPI; --shard i/n per process works)");
    if ((o->top_k > 0 || (o->top_p > 0 && o->top_p < 1)) && !(o->temperature > 0))
        return dfl_seterr("--top-k / --top-p filter sampling: they need --temperature > 0 (and --online)");
    if (o->top_k < 0 || o->top_p < 0 || o->top_p > 1) return dfl_seterr("--top-k must be >= 0 and --top-p in [0, 1]");
    if (o->train_chat >= 0 && (!o->train_metrics || o->train_chat == o->chat || o->features_dir))
        return dfl_seterr("--train-chat scores the responses after prompts in another template: it needs "
                          "--train-metrics, a template other than --chat's, and a target (not --features)");
    if (o->train_metrics && (o->train_anchors < 1 || o->train_topk < 1 || o->train_gamma < 0))
        return dfl_seterr("--train-anchors and --train-top-k must be >= 1, --train-gamma >= 0");
    if (o->reference && o->reference_url) return dfl_seterr("give --reference or --reference-url, not both");
    if (o->repeat < 1 || o->repeat > EVAL_MAX_REPEAT) return dfl_seterr("--repeat: 1 to %d runs", EVAL_MAX_REPEAT);
    if (o->n_modes < 1 || o->n_modes > EVAL_MAX_MODES) return dfl_seterr("1 to %d modes", EVAL_MAX_MODES);
    for (int k = 0; k < o->n_modes; k++) {
        const int lim = o->online ? DDTREE_MAX_BUDGET : DDTREE_MAX_NODES;
        if (o->budgets[k] < 0 || o->budgets[k] > lim)
            return dfl_seterr("--tree-budget %d: must be in [0, %d]%s", o->budgets[k], lim,
                              o->online ? " online (the target verifies the tree; replay goes further)" : "");
        if (o->budgets[k] && (o->temperature > 0 || o->top_k > 0 || (o->top_p > 0 && o->top_p < 1)))
            return dfl_seterr("DDTree (--tree-budget > 0) is greedy: it cannot be combined with --temperature");
    }
    if (o->online) {
        if (o->features_dir || o->features_from || o->save_features || o->check_ar || o->record_budget != -1)
            return dfl_seterr("--online runs every drafter x mode on the target: --features, --features-from, "
                              "--save-features, --check-ar and --record-mode belong to replay");
    } else {
        if (o->repeat > 1)
            return dfl_seterr("--repeat %d repeats the timed runs of --online; replay's speedups are modeled from "
                              "target costs measured at the start (their repetitions: --cost-reps)",
                              o->repeat);
        if (o->temperature > 0)
            return dfl_seterr("replay is exact at temperature 0 only (at T > 0 the target's sampled continuation "
                              "depends on the drafter's proposals): use --online for sampled evaluation");
        if (o->features_dir && (o->save_features || o->check_ar || o->record_budget != -1))
            return dfl_seterr("--features runs no target forward: --save-features, --check-ar and --record-mode "
                              "need a recording run");
        if (o->features_dir && o->device != DFL_DEVICE_CPU)
            return dfl_seterr("--features runs no target forward: --device does not apply (the results are marked "
                              "with the device the truths were recorded on)");
        if (o->record_budget >= 0) {
            if (o->record_budget > DDTREE_MAX_BUDGET)
                return dfl_seterr("--record-mode ddtree-%d: the target verifies at most %d nodes", o->record_budget,
                                  DDTREE_MAX_BUDGET);
        } else if (o->record_budget == -1 && o->budgets[0] > DDTREE_MAX_BUDGET) {
            return dfl_seterr("the first mode (ddtree-%d) is the recording mode, but the target verifies at most %d "
                              "nodes: give --record-mode",
                              o->budgets[0], DDTREE_MAX_BUDGET);
        }
    }
    return DFL_OK;
}
