/* dfl generate: greedy generation with a target model, streaming text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "dfl/common.h"
#include "dfl/model.h"
#include "dfl/prompt.h"

static const char *usage_text =
    "usage: dfl generate --target DIR (--prompt STR | --prompt-file F | --prompt-ids IDS)\n"
    "                    [--max-new N] [--chat MODE] [--max-context N] [--json] [--check-weights]\n"
    "\n"
    "Greedy generation. Streams the text to stdout, stops at the model's eos ids (config.json,\n"
    "generation_config.json, tokenizer_config.json) or after --max-new tokens.\n"
    "\n"
    "  --target DIR        target checkpoint (qwen3, qwen3_5 or qwen3_5_text)\n" CLI_PROMPT_HELP
    "  --max-new N         tokens to generate at most (default 128)\n"
    "  --max-context N     positions to allocate caches for (default prompt + max-new)\n"
    "  --ignore-eos        do not stop at eos ids\n"
    "  --json              print {\"tokens\": [...], \"text\": \"...\", \"stats\": {...}} at the end instead of\n"
    "                      streaming; tokens are the generated ids only\n"
    "  --check-weights     scan the weights for NaN/Inf at load\n";

static int is_eos(const dfl_model *m, int id) {
    for (int i = 0; i < m->n_eos; i++)
        if (m->eos_ids[i] == id) return 1;
    return 0;
}

/* Print the not yet printed part of the decoded text, holding back a trailing replacement
 * character that may be an incomplete UTF-8 sequence. */
static void stream_text(const dfl_tokenizer *tok, const int32_t *ids, size_t n, size_t *printed, int final) {
    char *s = tok_decode(tok, ids, n, 1);
    if (!s) return;
    size_t len = strlen(s);
    if (!final && len >= 3 && memcmp(s + len - 3, "\xef\xbf\xbd", 3) == 0) len -= 3;
    if (len > *printed) {
        fwrite(s + *printed, 1, len - *printed, stdout);
        fflush(stdout);
        *printed = len;
    }
    free(s);
}

int cmd_generate(int argc, char **argv) {
    const char *target = NULL;
    cli_prompt pr = {0};
    long max_new = 128, max_ctx = 0;
    int json = 0, check = 0, ignore_eos = 0;
    for (int i = 1; i < argc; i++) {
        int r = cli_prompt_option("generate", &pr, argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (cli_is_help(argv[i])) {
            fputs(usage_text, stdout);
            return 0;
        } else if (strcmp(argv[i], "--target") == 0) {
            target = cli_value(argc, argv, &i);
        } else if (strcmp(argv[i], "--max-new") == 0) {
            if (cli_parse_long("generate", "--max-new", cli_value(argc, argv, &i), 1, 1 << 24, &max_new)) return 2;
        } else if (strcmp(argv[i], "--max-context") == 0) {
            if (cli_parse_long("generate", "--max-context", cli_value(argc, argv, &i), 1, 1 << 24, &max_ctx)) return 2;
        } else if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else if (strcmp(argv[i], "--check-weights") == 0) {
            check = 1;
        } else if (strcmp(argv[i], "--ignore-eos") == 0) {
            ignore_eos = 1;
        } else {
            return cli_usage_error("generate", "unknown argument '%s' (see dfl generate --help)", argv[i]);
        }
    }
    if (!target) return cli_usage_error("generate", "missing --target DIR");
    dfl_model m;
    double t0 = dfl_now();
    if (model_open(&m, target, check) != DFL_OK) return cli_fail("generate", "%s", dfl_errmsg());
    double t_load = dfl_now() - t0;
    dfl_tokenizer *tok = NULL;
    int32_t *prompt = NULL;
    size_t n_prompt = 0;
    int rc = cli_prompt_tokens("generate", &pr, target, 1, &tok, &prompt, &n_prompt);
    if (rc) {
        if (tok) tok_close(tok);
        model_close(&m);
        return rc;
    }
    if (!max_ctx) max_ctx = (long)n_prompt + max_new;
    if ((long)n_prompt + max_new > max_ctx) {
        rc = cli_fail("generate", "prompt (%zu tokens) + --max-new %ld exceeds --max-context %ld", n_prompt, max_new,
                      max_ctx);
        goto out;
    }
    if (m.cfg.max_position && max_ctx > m.cfg.max_position) {
        rc = cli_fail("generate", "context of %ld positions exceeds the model's max_position_embeddings %d", max_ctx,
                      m.cfg.max_position);
        goto out;
    }
    dfl_state s;
    if (state_init(&s, &m, (int)max_ctx, (int)n_prompt, 0) != DFL_OK) {
        rc = cli_fail("generate", "%s", dfl_errmsg());
        goto out;
    }
    const int V = m.cfg.vocab;
    float *logits = malloc((size_t)V * sizeof(float));
    int32_t *out = malloc((size_t)max_new * sizeof(int32_t));
    size_t n_out = 0, printed = 0;
    const char *stop = "max_new";
    t0 = dfl_now();
    if (model_forward(&s, prompt, (int)n_prompt, logits, 1, NULL) != DFL_OK) {
        rc = cli_fail("generate", "%s", dfl_errmsg());
        goto out2;
    }
    double t_prefill = dfl_now() - t0;
    t0 = dfl_now();
    for (;;) {
        int32_t next = kn_argmax(logits, V);
        out[n_out++] = next;
        if (!ignore_eos && is_eos(&m, next)) {
            stop = "eos";
            break;
        }
        if (!json) stream_text(tok, out, n_out, &printed, 0);
        if ((long)n_out >= max_new) break;
        if (model_forward(&s, &next, 1, logits, 1, NULL) != DFL_OK) {
            rc = cli_fail("generate", "%s", dfl_errmsg());
            goto out2;
        }
    }
    double t_decode = dfl_now() - t0;
    char *text = tok_decode(tok, out, n_out, 1);
    if (json) {
        printf("{\"tokens\": [");
        for (size_t i = 0; i < n_out; i++) printf("%s%d", i ? ", " : "", out[i]);
        printf("], \"text\": ");
        cli_json_string(stdout, text ? text : "");
        printf(", \"stats\": {\"mode\": \"greedy\", \"prompt_tokens\": %zu, \"generated_tokens\": %zu, "
               "\"stop\": \"%s\", \"load_s\": %.6f, \"prefill_s\": %.6f, \"decode_s\": %.6f, "
               "\"prefill_tokens_per_s\": %.3f, \"decode_tokens_per_s\": %.3f, \"weight_bytes\": %llu, "
               "\"state_bytes\": %llu, \"max_context\": %ld}}\n",
               n_prompt, n_out, stop, t_load, t_prefill, t_decode, n_prompt / (t_prefill > 0 ? t_prefill : 1e-9),
               (n_out - 1) / (t_decode > 0 ? t_decode : 1e-9), (unsigned long long)m.weight_bytes,
               (unsigned long long)s.bytes, max_ctx);
    } else {
        stream_text(tok, out, n_out, &printed, 1);
        printf("\n");
        fprintf(stderr, "[dfl] %zu prompt tokens, %zu generated (stop: %s); prefill %.1f tok/s, decode %.1f tok/s; "
                        "weights %.1f MB mmapped, state %.1f MB\n",
                n_prompt, n_out, stop, n_prompt / (t_prefill > 0 ? t_prefill : 1e-9),
                (n_out - 1) / (t_decode > 0 ? t_decode : 1e-9), m.weight_bytes / 1e6, s.bytes / 1e6);
    }
    free(text);
out2:
    free(logits);
    free(out);
    state_free(&s);
out:
    free(prompt);
    tok_close(tok);
    model_close(&m);
    return rc;
}
