#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "dfl/common.h"
#include "dfl/prompt.h"

int cli_prompt_option(const char *cmd, cli_prompt *p, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    if (strcmp(a, "--prompt") == 0) p->text = cli_value(argc, argv, i);
    else if (strcmp(a, "--prompt-file") == 0) p->file = cli_value(argc, argv, i);
    else if (strcmp(a, "--prompt-ids") == 0) p->ids = cli_value(argc, argv, i);
    else if (strcmp(a, "--tokenizer") == 0) p->tokenizer = cli_value(argc, argv, i);
    else if (strcmp(a, "--chat") == 0) {
        const char *v = cli_value(argc, argv, i);
        p->chat = prompt_chat_parse(v);
        if (p->chat < 0) {
            cli_usage_error(cmd, "--chat: expected chatml, chatml-nothink or none, found '%s'", v);
            return -1;
        }
    } else return 0;
    return 1;
}

int cli_prompt_tokens(const char *cmd, const cli_prompt *p, const char *model_dir, int want_tok, dfl_tokenizer **tok,
                      int32_t **ids, size_t *n) {
    *tok = NULL;
    int sources = !!p->text + !!p->file + !!p->ids;
    if (sources != 1) return cli_usage_error(cmd, "give exactly one of --prompt, --prompt-file, --prompt-ids");
    if (p->ids && p->chat != DFL_CHAT_NONE)
        return cli_usage_error(cmd, "--chat applies to text prompts, not --prompt-ids");
    if (want_tok || !p->ids) {
        *tok = tok_open(p->tokenizer ? p->tokenizer : model_dir);
        if (!*tok) return cli_fail(cmd, "%s", dfl_errmsg());
    }
    if (p->ids) {
        if (prompt_parse_ids(p->ids, ids, n) != DFL_OK) return cli_fail(cmd, "--prompt-ids: %s", dfl_errmsg());
    } else {
        char *text = p->text ? strdup(p->text) : dfl_read_file(p->file, NULL);
        if (!text) return cli_fail(cmd, "%s", dfl_errmsg());
        char *full = prompt_format(text, (dfl_chat)p->chat);
        free(text);
        int rc = tok_encode(*tok, full, strlen(full), ids, n);
        free(full);
        if (rc != DFL_OK) return cli_fail(cmd, "%s", dfl_errmsg());
    }
    if (*n == 0) {
        free(*ids);
        return cli_fail(cmd, "the prompt is empty (0 tokens)");
    }
    return 0;
}
