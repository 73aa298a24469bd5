/* dfl CLI: one file per subcommand (cmd_*.c), each `int cmd_NAME(int argc, char **argv)`
 * returning the process exit status. argv[0] is the subcommand name. */
#ifndef DFL_CLI_H
#define DFL_CLI_H

#include <stdio.h>

int cmd_inspect(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_hidden(int argc, char **argv);
int cmd_hidden_diff(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_eval_merge(int argc, char **argv);
int cmd_eval_compare(int argc, char **argv);
int cmd_serve(int argc, char **argv);

/* dfl eval under mpirun (eval_mpi.c, built with DFL_HAVE_MPI). eval_mpi_launched: the process
 * environment says it is one of several MPI ranks (Open MPI's OMPI_COMM_WORLD_SIZE, or PMI_SIZE).
 * eval_mpi_run: the whole run of this rank; its exit status. */
int eval_mpi_launched(void);
struct eval_opts;
int eval_mpi_run(struct eval_opts *o, int quiet);
/* The MPI library dfl was built with ("Open MPI v4.1.4"), or "no". */
const char *eval_mpi_library(void);

/* "--flag" handling helpers. cli_is_help returns 1 for -h / --help. */
int cli_is_help(const char *arg);
/* Value of an option that takes an argument: argv[*i+1]; exits with a message if missing. */
const char *cli_value(int argc, char **argv, int *i);
/* Parse integers/floats with range checks; on error print "dfl CMD: --opt: ..." and return -1. */
int cli_parse_long(const char *cmd, const char *opt, const char *s, long lo, long hi, long *out);
/* Comma-separated integers, each in [lo, hi], at most max of them; an error names the item as given. */
int cli_parse_long_list(const char *cmd, const char *opt, const char *s, long lo, long hi, long *out, int max, int *n);
int cli_parse_double(const char *cmd, const char *opt, const char *s, double *out);
/* Print "dfl CMD: message" to stderr and return 2 (usage error) — or 1 for cli_fail. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int cli_fail(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Escape a string as a JSON string literal onto f. */
void cli_json_string(FILE *f, const char *s);

#endif

/* Prompt options shared by generate and hidden:
 *   --prompt STR | --prompt-file F | --prompt-ids "1,2,3"   [--chat MODE] [--tokenizer PATH] */
#include <stddef.h>
#include <stdint.h>

#include "dfl/tokenizer.h"

typedef struct cli_prompt {
    const char *text, *file, *ids, *tokenizer;
    int chat; /* dfl_chat */
} cli_prompt;

#define CLI_PROMPT_HELP                                                                             \
    "  --prompt STR        the prompt text\n"                                                       \
    "  --prompt-file F     read the prompt text from F\n"                                           \
    "  --prompt-ids IDS    the prompt as token ids (\"1,2,3\"), no tokenizer needed\n"              \
    "  --chat MODE         chatml | chatml-nothink | none (default none): wrap the prompt as one\n" \
    "                      user turn of a ChatML conversation\n"                                    \
    "  --tokenizer PATH    tokenizer.json or directory (default: the target directory)\n"

/* 1 if argv[*i] was a prompt option (consumed, *i advanced), 0 if not, -1 on a bad value. */
int cli_prompt_option(const char *cmd, cli_prompt *p, int argc, char **argv, int *i);
/* Resolve the prompt to token ids. *tok is opened when text is involved or want_tok is set
 * (NULL otherwise). Returns 0 or prints the error and returns the exit status. */
int cli_prompt_tokens(const char *cmd, const cli_prompt *p, const char *model_dir, int want_tok, dfl_tokenizer **tok,
                      int32_t **ids, size_t *n);

/* --device (generate, hidden, bench, eval, serve): where the target's forward runs. */
#include "dfl/backend.h"
struct dfl_model;
#define CLI_DEVICE_HELP                                                                               \
    "  --device D          cpu (default) | cuda: where the target's forward runs (the devices this\n" \
    "                      build has: dfl --version)\n" CLI_WEIGHTS_HELP
#define CLI_WEIGHTS_HELP                                                                             \
    "  --weights MODE      auto (default) | copy | map: the CPU reads the weights from an aligned\n" \
    "                      copy in memory (copy), or in place from the file mapping (map: shared\n"  \
    "                      with other processes, no load time; loads straddle cache lines, slower\n" \
    "                      where compute-bound); auto copies when the file leaves tensors off\n"     \
    "                      cache lines, they fit the memory available with a quarter to spare, no\n" \
    "                      other MPI rank shares the machine and the device is the CPU (default:\n"  \
    "                      DFL_WEIGHTS or auto; docs/design.md §1)\n"
/* 1 if argv[*i] is --device (consumed, *i advanced, *d set) or --weights (consumed, the placement
 * set), 0 if neither, -1 after printing a bad value. */
#define CLI_OPEN_FLAGS(device) ((device) != DFL_DEVICE_CPU ? DFL_OPEN_FOR_DEVICE : 0)
int cli_device_option(const char *cmd, int argc, char **argv, int *i, dfl_device *d);
/* Move the opened model to device d (model_use_device), saying on stderr where it runs when not
 * the CPU; 0, or the message printed and 1. */
int cli_use_device(const char *cmd, struct dfl_model *m, dfl_device d);

/* --block-attn (generate, serve, bench): a DFlash / DFlash2 drafter's attention inside the block
 * (docs/design.md §4, "Block attention"). */
#define CLI_BLOCK_ATTN_HELP                                                                           \
    "  --block-attn MODE   a DFlash drafter's attention inside the draft block: auto (default: the\n" \
    "                      checkpoint's is_causal / dflash_config.causal, else sliding-causal) |\n"   \
    "                      sliding-causal (sliding_attention layers causal, full layers\n"            \
    "                      bidirectional: SpecForge, SGLang) | bidirectional (every layer: z-lab's\n" \
    "                      reference model) | causal (every layer)\n"
/* 1 if argv[*i] is --block-attn (consumed, *i advanced, *causal = DFL_BLOCK_ATTN_AUTO or the
 * drafter_set_causal value), 0 if not, -1 after printing a bad value. */
int cli_block_attn_option(const char *cmd, int argc, char **argv, int *i, int *causal);
