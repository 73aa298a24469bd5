/* Hugging Face tokenizer.json, byte-level BPE as used by Qwen (NFC normalizer, Split
 * pre-tokenizer with the file's regex, ByteLevel, BPE by merge rank, added tokens). */
#ifndef DFL_TOKENIZER_H
#define DFL_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct dfl_tokenizer dfl_tokenizer;

/* path: a tokenizer.json file, or a model directory holding one. NULL + dfl_errmsg() on error. */
dfl_tokenizer *tok_open(const char *path);
/* Before tok_open for a command (what: "the prompts need", "serving text needs"): the tokenizer is `given`
 * (--tokenizer: a tokenizer.json or a directory holding one), else model_dir's tokenizer.json.
 * DFL_ERR with a message that explains --tokenizer when it is not there. */
int tok_locate(const char *given, const char *model_dir, const char *what);
void tok_close(dfl_tokenizer *tok);

/* Encode UTF-8 text (len bytes). *ids is malloc'd (caller frees), *n_ids its length.
 * Returns DFL_OK or DFL_ERR. Thread-safe. Invalid UTF-8 is not an error: each maximal invalid
 * subpart becomes U+FFFD first (as Python's bytes.decode("utf-8", "replace")). */
int tok_encode(const dfl_tokenizer *tok, const char *text, size_t len, int32_t **ids, size_t *n_ids);

/* Decode ids to a malloc'd NUL-terminated UTF-8 string; skip_special drops special added tokens.
 * NULL + error on an id outside the vocabulary. Bytes that do not form valid UTF-8 (e.g. ids
 * ending mid-character) become U+FFFD, as in HF tokenizers. */
char *tok_decode(const dfl_tokenizer *tok, const int32_t *ids, size_t n_ids, int skip_special);
/* Same, also giving the length (the text can hold NUL bytes, e.g. from the token for byte 0). */
char *tok_decode_len(const dfl_tokenizer *tok, const int32_t *ids, size_t n_ids, int skip_special, size_t *len_out);

/* Id of a token given its exact string in the vocabulary / added tokens; -1 if absent. */
int32_t tok_token_id(const dfl_tokenizer *tok, const char *token);

/* Number of ids (max id + 1, added tokens included). */
int32_t tok_vocab_size(const dfl_tokenizer *tok);

/* 1 if id maps to a token (vocabulary or added token). */
int tok_has_id(const dfl_tokenizer *tok, int32_t id);

/* 1 if id is a special added token. */
int tok_is_special(const dfl_tokenizer *tok, int32_t id);
/* 1 if id is an added token (tokenizer.json "added_tokens"), special or not. */
int tok_is_added(const dfl_tokenizer *tok, int32_t id);

#endif
