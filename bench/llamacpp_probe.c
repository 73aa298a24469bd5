/* llamacpp_probe: the two measurements bench/peer-llamacpp needs from llama.cpp that its own
 * tools do not give, written against llama.cpp's C API (llama.h) and built by that script.
 *
 *   llamacpp_probe verify MODEL.gguf THREADS CONTEXT NMAX REPS
 *       decode as dfl bench times it: after CONTEXT fixed pseudo-random tokens, 16 single-token
 *       forwards (greedy), the median token time; then the verification cost: one llama_decode over
 *       n = 1..NMAX new tokens with logits for every row (as a speculative verification needs;
 *       llama-bench's prompt processing asks for the last row only), best of REPS, the sequence
 *       state restored to the context before each (restore not timed). Prints one JSON object:
 *       {"context": C, "decode_ms": [16 token times, sorted], "decode_median_ms": m,
 *        "verify_ms": [t(1), ..., t(NMAX)]}.
 *   llamacpp_probe greedy MODEL.gguf THREADS NGEN TEXT
 *       greedy autoregressive generation (argmax of the raw logits, first index on ties) of up to
 *       NGEN tokens after TEXT, tokenized by the model's vocabulary with special tokens parsed and
 *       no BOS added; stops after an end-of-generation token. Prints {"prompt_ids": [...],
 *       "tokens": [...], "text": "...", "tokens_per_s": x} (text without the prompt, JSON-escaped).
 *
 * Exit status 1 with a message on stderr on any failure. Not part of dfl: see bench/README.md.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static void quiet_log(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static int fail(const char *what) {
    fprintf(stderr, "llamacpp_probe: %s\n", what);
    return 1;
}

static struct llama_context *open_ctx(struct llama_model *model, int threads, int n_ctx) {
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)n_ctx;
    cp.n_batch = (uint32_t)n_ctx;
    cp.n_ubatch = (uint32_t)n_ctx;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.no_perf = true;
    return llama_init_from_model(model, cp);
}

/* batch of n tokens at positions pos0.., logits for every row when all_logits, else the last. */
static void fill(struct llama_batch *b, const llama_token *tok, int n, int pos0, int all_logits) {
    b->n_tokens = n;
    for (int i = 0; i < n; i++) {
        b->token[i] = tok[i];
        b->pos[i] = pos0 + i;
        b->n_seq_id[i] = 1;
        b->seq_id[i][0] = 0;
        b->logits[i] = (int8_t)(all_logits || i == n - 1);
    }
}

enum { DECODE_TOKENS = 16 }; /* as dfl bench --decode's default */

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* first index of the largest logit */
static int argmax(const float *lg, int n) {
    int best = 0;
    for (int v = 1; v < n; v++)
        if (lg[v] > lg[best]) best = v;
    return best;
}

static int cmd_verify(struct llama_model *model, int threads, int context, int nmax, int reps) {
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);
    struct llama_context *ctx = open_ctx(model, threads, context + nmax + 16);
    if (!ctx) return fail("cannot create a context");
    int ntok = context + nmax;
    llama_token *tok = malloc(sizeof(*tok) * (size_t)ntok);
    struct llama_batch b = llama_batch_init(ntok, 0, 1);
    uint32_t s = 12345; /* fixed LCG: the same tokens on every run */
    for (int i = 0; i < ntok; i++) {
        s = s * 1664525u + 1013904223u;
        tok[i] = (llama_token)(s % (uint32_t)n_vocab);
    }
    fill(&b, tok, context, 0, 0);
    if (llama_decode(ctx, b) != 0) return fail("context decode failed");
    size_t state_n = llama_state_seq_get_size(ctx, 0);
    uint8_t *state = malloc(state_n);
    if (llama_state_seq_get_data(ctx, state, state_n, 0) != state_n) return fail("state save failed");
    double dt[DECODE_TOKENS];
    for (int i = 0; i < DECODE_TOKENS; i++) {
        llama_token next = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
        fill(&b, &next, 1, context + i, 1);
        int64_t t0 = llama_time_us();
        if (llama_decode(ctx, b) != 0) return fail("decode failed");
        llama_synchronize(ctx);
        dt[i] = (double)(llama_time_us() - t0) / 1e3;
    }
    qsort(dt, DECODE_TOKENS, sizeof(double), cmp_double);
    printf("{\"context\": %d, \"decode_ms\": [", context);
    for (int i = 0; i < DECODE_TOKENS; i++) printf("%s%.4f", i ? ", " : "", dt[i]);
    printf("], \"decode_median_ms\": %.4f, \"verify_ms\": [",
           0.5 * (dt[DECODE_TOKENS / 2 - 1] + dt[DECODE_TOKENS / 2]));
    for (int n = 1; n <= nmax; n++) {
        double best = 1e30;
        for (int r = 0; r < reps; r++) {
            llama_memory_clear(llama_get_memory(ctx), true);
            if (llama_state_seq_set_data(ctx, state, state_n, 0) == 0) return fail("state restore failed");
            fill(&b, tok + context, n, context, 1);
            int64_t t0 = llama_time_us();
            if (llama_decode(ctx, b) != 0) return fail("verify decode failed");
            llama_synchronize(ctx);
            (void)llama_get_logits_ith(ctx, n - 1);
            double ms = (double)(llama_time_us() - t0) / 1e3;
            if (ms < best) best = ms;
        }
        printf("%s%.4f", n > 1 ? ", " : "", best);
    }
    printf("]}\n");
    llama_batch_free(b);
    free(state);
    free(tok);
    llama_free(ctx);
    return 0;
}

static void put_json_string(const char *p, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c == '\n') fputs("\\n", stdout);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

static int cmd_greedy(struct llama_model *model, int threads, int ngen, const char *text) {
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);
    int tl = (int)strlen(text);
    int np = -llama_tokenize(vocab, text, tl, NULL, 0, false, true);
    if (np <= 0) return fail("prompt tokenizes to nothing");
    llama_token *tok = malloc(sizeof(*tok) * (size_t)(np + ngen + 1));
    if (llama_tokenize(vocab, text, tl, tok, np, false, true) != np) return fail("tokenize failed");
    struct llama_context *ctx = open_ctx(model, threads, np + ngen + 16);
    if (!ctx) return fail("cannot create a context");
    struct llama_batch b = llama_batch_init(np, 0, 1);
    fill(&b, tok, np, 0, 0);
    if (llama_decode(ctx, b) != 0) return fail("prompt decode failed");
    int n = 0;
    int64_t t1 = llama_time_us();
    for (; n < ngen; n++) {
        const int best = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
        tok[np + n] = best;
        if (llama_vocab_is_eog(vocab, best)) { n++; break; }
        fill(&b, tok + np + n, 1, np + n, 1);
        if (llama_decode(ctx, b) != 0) return fail("decode failed");
    }
    double dec_s = (double)(llama_time_us() - t1) / 1e6;
    fputs("{\"prompt_ids\": [", stdout);
    for (int i = 0; i < np; i++) printf("%s%d", i ? ", " : "", tok[i]);
    fputs("], \"tokens\": [", stdout);
    for (int i = 0; i < n; i++) printf("%s%d", i ? ", " : "", tok[np + i]);
    fputs("], \"text\": ", stdout);
    size_t cap = 64 + (size_t)n * 64, len = 0;
    char *out = malloc(cap);
    for (int i = 0; i < n; i++) {
        int k = llama_token_to_piece(vocab, tok[np + i], out + len, (int32_t)(cap - len), 0, false);
        if (k < 0) return fail("detokenize failed");
        len += (size_t)k;
    }
    put_json_string(out, len);
    printf(", \"tokens_per_s\": %.3f}\n", dec_s > 0 ? n / dec_s : 0.0);
    free(out);
    llama_batch_free(b);
    free(tok);
    llama_free(ctx);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || (strcmp(argv[1], "verify") && strcmp(argv[1], "greedy")) ||
        (!strcmp(argv[1], "verify") && argc != 7) || (!strcmp(argv[1], "greedy") && argc != 6)) {
        fprintf(stderr, "usage: llamacpp_probe verify MODEL.gguf THREADS CONTEXT NMAX REPS\n"
                        "       llamacpp_probe greedy MODEL.gguf THREADS NGEN TEXT\n");
        return 2;
    }
    llama_log_set(quiet_log, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(argv[2], mp);
    if (!model) return fail("cannot load the model");
    int threads = atoi(argv[3]);
    int rc = !strcmp(argv[1], "verify")
                 ? cmd_verify(model, threads, atoi(argv[4]), atoi(argv[5]), atoi(argv[6]))
                 : cmd_greedy(model, threads, atoi(argv[4]), argv[5]);
    llama_model_free(model);
    return rc;
}
