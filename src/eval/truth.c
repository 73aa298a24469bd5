/* A recorded truth saved to --save-features, and a saved one read back and checked against this run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/kernels.h"
#include "eval/features.h"
#include "eval/run.h"

/* The truth of prompt index's turn saved to --save-features, and listed in its manifest. */
int er_truth_save(run *r, const char *pid, int turn, int index, const eval_truth *t) {
    char name[64];
    eval_features_name(index, turn, name, sizeof name);
    char *path = dfl_path_join(r->o->save_features, name);
    eval_features_meta meta = {
        .turn = turn, .max_new = r->max_new, .id = r->id, .act_bf16 = kn_act_get() == KN_ACT_BF16, .device = r->device};
    snprintf(meta.prompt_id, sizeof meta.prompt_id, "%s", pid);
    snprintf(meta.target, sizeof meta.target, "%s", r->o->target);
    int rc = eval_features_save(path, t, &meta);
    free(path);
    if (rc) return rc;
    return er_manifest_append(r, index, turn, name, t);
}

/* A saved truth for this unit, checked against this target (features_dir or a resumed save). */
int er_truth_load(run *r, const char *dir, const mf_entry *u, eval_truth *t) {
    char *path = dfl_path_join(dir, u->file);
    eval_features_meta meta;
    eval_truth_free(t);
    int rc = eval_features_load(path, t, &meta, r->m.cfg.vocab);
    if (rc == DFL_OK && (strcmp(meta.prompt_id, u->prompt_id) != 0 || meta.turn != u->turn))
        rc = dfl_seterr("%s: holds prompt %s turn %d, the manifest says prompt %s turn %d", path, meta.prompt_id,
                        meta.turn + 1, u->prompt_id, u->turn + 1);
    if (rc == DFL_OK && (t->n_prompt != u->prompt_tokens || t->n != u->tokens))
        rc = dfl_seterr("%s: holds %d prompt tokens and %d output tokens, %s/manifest.jsonl says prompt_tokens %d, "
                        "tokens %d",
                        path, t->n_prompt, t->n, dir, u->prompt_tokens, u->tokens);
    if (rc == DFL_OK) rc = eval_target_id_check(&meta.id, &r->id, path);
    if (rc == DFL_OK && meta.max_new != r->max_new)
        rc = dfl_seterr("%s: recorded with --max-new %d, this run has %d", path, meta.max_new, r->max_new);
    if (rc == DFL_OK && meta.act_bf16 != (kn_act_get() == KN_ACT_BF16))
        rc = dfl_seterr("%s: recorded with %s activations, this run uses %s (DFL_ACT): a replay is exact only in the "
                        "same mode",
                        path, meta.act_bf16 ? "bf16" : "f32", meta.act_bf16 ? "f32" : "bf16");
    if (rc == DFL_OK && meta.device != r->device)
        rc = dfl_seterr("%s: recorded with the target on %s, %s on %s: truths of both devices must not mix in one "
                        "evaluation",
                        path, dfl_device_name((dfl_device)meta.device),
                        r->from_features ? "the first saved truth's" : "this run's (--device)",
                        dfl_device_name((dfl_device)r->device));
    free(path);
    return rc;
}
