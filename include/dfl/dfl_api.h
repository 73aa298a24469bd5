/* dfl's C API for other languages (the Python package dflash_eval loads it with ctypes from
 * libdfl.so; docs/python.md). Small and explicit: plain C types, opaque handles, return codes.
 *
 * Every int function returns DFL_API_OK (0) or DFL_API_ERR (-1); on DFL_API_ERR the calling
 * thread's message is in dfl_api_last_error(), naming the field with the expected vs found value.
 * Strings handed out through char ** are malloc'd: release them with dfl_api_free.
 *
 * Threads: calls on different handles, and the handle-free calls (inspect, generate, eval,
 * replay), may run at the same time from several threads; one handle is used by one thread at
 * a time (its forward state is not shared). */
#ifndef DFL_API_H
#define DFL_API_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { DFL_API_OK = 0, DFL_API_ERR = -1 };

/* The library's version ("0.1.0"). */
const char *dfl_api_version(void);
/* This thread's last error message ("" when none). */
const char *dfl_api_last_error(void);
void dfl_api_free(void *p);

/* The report of `dfl inspect DIR --json` (one JSON object). target: for a drafter, the target to
 * check it against (NULL: none); check_weights: scan for NaN/Inf. */
int dfl_api_inspect(const char *path, const char *target, int check_weights, char **json);

/* ---- a loaded target: hidden states --------------------------------------------------------- */

typedef struct dfl_api_target dfl_api_target;

int dfl_api_target_open(const char *dir, dfl_api_target **out);
void dfl_api_target_close(dfl_api_target *t);
/* Decoder layers, hidden size and vocabulary size. */
int dfl_api_target_dims(const dfl_api_target *t, int *n_layers, int *hidden, int *vocab);
/* Token ids of text (chat: "chatml", "chatml-nothink" or "none", as dfl's --chat) with the
 * tokenizer of the target's directory: *ids malloc'd, *n of them. */
int dfl_api_tokenize(dfl_api_target *t, const char *text, const char *chat, int32_t **ids, int *n);
/* One forward of ids[0..n) (= dfl hidden): out[k][p][h] = the output of decoder layer layers[k]
 * (transformers' hidden_states[layers[k] + 1]) at position p; out holds n_layers * n * hidden floats. */
int dfl_api_hidden(dfl_api_target *t, const int32_t *ids, int n, const int *layers, int n_layers, float *out);

/* ---- generation, evaluation --------------------------------------------------------------- */

/* Greedy or sampled generation, speculative with a drafter (= dfl generate --json). options: a
 * JSON object {"target": DIR, "prompt": TEXT | "prompt_ids": [..], "drafter", "tokenizer",
 * "chat", "max_new", "max_context", "block_size", "tree_budget", "temperature", "seed",
 * "top_p", "top_k", "accept_rule", "ignore_eos", "block_attn"}; *result: {"tokens": [..], "text",
 * "unknown_ids", "stats": {..}}. */
int dfl_api_generate(const char *options, char **result);

/* Progress of a long call: prompts (or saved truths) done of total, the one just finished and
 * its tau. Called on the calling thread. */
typedef void (*dfl_api_progress_fn)(void *ud, int done, int total, const char *what, double last_tau);

/* dfl eval: options is a JSON object whose members are dfl eval's options without the leading
 * dashes, '-' written '_' ("target", "drafter": DIR or [DIR, ..], "prompts", "out", "limit",
 * "max_new", "tree_budget": N or [N, ..], "features", "online", ...; docs/python.md lists them).
 * Runs eval_run, the code of the CLI, into options.out; *summary: the text of its summary.json.
 * progress may be NULL. Outputs that differ from the autoregressive ones are not an error: the
 * summary counts them (mismatches). */
int dfl_api_eval(const char *options, dfl_api_progress_fn progress, void *ud, char **summary);

/* Replay on saved features (dfl eval --features DIR --drafter D --tree-budget B,..): no target
 * forward. options: further eval options as JSON (at least "out"; not "features", "drafter" or
 * "tree_budget"); NULL = "{}" (then "out" is missing). *summary: summary.json's text. */
int dfl_api_replay(const char *features_dir, const char *drafter, const int *budgets, int n_budgets,
                   const char *options, dfl_api_progress_fn progress, void *ud, char **summary);

#ifdef __cplusplus
}
#endif

#endif
