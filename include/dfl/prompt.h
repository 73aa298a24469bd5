/* Prompt construction shared by generate, eval and serve (src/tokenizer/chat.c). */
#ifndef DFL_PROMPT_H
#define DFL_PROMPT_H

#include <stddef.h>
#include <stdint.h>

#include "dfl/tokenizer.h"

typedef enum dfl_chat {
    DFL_CHAT_NONE,          /* the text as is */
    DFL_CHAT_CHATML,        /* <|im_start|>user\n...<|im_end|>\n<|im_start|>assistant\n */
    DFL_CHAT_CHATML_NOTHINK /* the same, then an empty <think>\n\n</think>\n\n block (Qwen3 enable_thinking=False) */
} dfl_chat;

/* Parse "chatml", "chatml-nothink" or "none"; -1 if unknown. */
int prompt_chat_parse(const char *s);
/* Format one user turn; malloc'd. */
char *prompt_format(const char *user, dfl_chat mode);
/* Parse "1,2,3" or "1 2 3" or a JSON array into malloc'd ids. DFL_ERR on bad input. */
int prompt_parse_ids(const char *s, int32_t **ids, size_t *n);

/* Decode generated ids for display, skipping special tokens and — as HF tokenizers does — ids
 * the tokenizer does not know (a model's vocabulary is often padded beyond the tokenizer's);
 * *n_unknown (if not NULL) counts those. malloc'd; NULL only when out of memory. */
char *prompt_decode(const dfl_tokenizer *tok, const int32_t *ids, size_t n, int *n_unknown);

#endif
