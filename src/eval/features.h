/* Saved truths and features: one safetensors file per prompt and turn (src/eval/features.c). */
#ifndef DFL_EVAL_FEATURES_H
#define DFL_EVAL_FEATURES_H

#include <stddef.h>
#include <stdio.h>

#include "dfl/model.h"
#include "dfl/replay.h"

/* What identifies a target for its features. */
typedef struct eval_target_id {
    char config_hash[24];  /* FNV-1a 64 of config.json */
    char weights_hash[24]; /* FNV-1a 64 of the used tensors' names, shapes and first 4 KiB */
    char layout[16], dtype[16];
    int n_layers, hidden, vocab;
} eval_target_id;

typedef struct eval_features_meta {
    char prompt_id[128];
    int turn, max_new;
    int act_bf16;      /* the target ran with bf16 activations (kn_act) when recording */
    int device;        /* the dfl_device it ran on (__metadata__ "device", absent: the CPU) */
    char target[4096]; /* the target directory as given when recording */
    eval_target_id id;
} eval_features_meta;

/* The dfl_device named `name` ("cpu", "cuda"), built into this dfl or not; -1 for none. */
int eval_device_lookup(const char *name);
int eval_target_identity(const dfl_model *m, eval_target_id *id);
/* DFL_ERR naming `what` and both values when have is not the target want was recorded on. */
int eval_target_id_check(const eval_target_id *want, const eval_target_id *have, const char *what);
/* File name of prompt `index` (in the prompt file), turn `turn`. */
void eval_features_name(int index, int turn, char *buf, size_t n);
/* Write t (atomically: a temporary file renamed into place). */
int eval_features_save(const char *path, const eval_truth *t, const eval_features_meta *meta);
/* Read a saved truth: t initialised with the layers to load (each must be in the file). */
int eval_features_load(const char *path, eval_truth *t, eval_features_meta *meta, int vocab);
/* Features of another pipeline (`dfl hidden` layout: input_ids, layer.{k}) for ref's sequence:
 * input_ids must start with ref's prompt and output; t (initialised with the layers to load)
 * gets ref's truth and the file's rows. Layer `optional` (-1: none) may be missing: its columns
 * are zero and absent[its column] is set. */
int eval_features_load_pipeline(const char *path, const eval_truth *ref, eval_truth *t, int optional,
                                unsigned char *absent);

/* A pipeline's features against dfl's for one sequence, per column of pipe: the relative error
 * (Frobenius over the positions) and, when they differ, the known mistake they match. */
typedef struct eval_feat_check {
    int layer;
    double rel;       /* vs dfl's same layer; < 0: the pipeline lacks the layer */
    int kind;         /* EVAL_FEAT_* */
    int other;        /* the dfl layer it matches (EVAL_FEAT_SHIFTED, EVAL_FEAT_POSTNORM) */
    double other_rel; /* ... and how closely */
} eval_feat_check;
enum { EVAL_FEAT_MATCH, EVAL_FEAT_ABSENT, EVAL_FEAT_BF16, EVAL_FEAT_SHIFTED, EVAL_FEAT_POSTNORM, EVAL_FEAT_DIFFERS };
/* out [pipe->n_layers]; m: the target (final norm) */
void eval_features_check(const eval_truth *dfl, const eval_truth *pipe, const unsigned char *absent, const dfl_model *m,
                         eval_feat_check *out);
/* One verdict in words into buf. */
const char *eval_feat_check_text(const eval_feat_check *c, char *buf, size_t n);
/* A features_check.jsonl line for one response. */
void eval_feat_check_write(FILE *f, const char *pid, int turn, const eval_feat_check *c, int n);
/* From the lines of path (none: nothing written): a summary.md section and a "features_check"
 * summary.json member (with a comma before it; written only when there are lines). */
int eval_feat_check_report(const char *path, FILE *md, FILE *json);

#endif
