/* Fuzz prompt files (eval_prompts_load) and --prompt-format values (eval_format_parse).
 * Input: a first line "FORMAT [FLAGS]" (FORMAT as for --prompt-format; FLAGS a number: bit 0
 * keep_going, bits 1.. the limit), then the prompt file. Any input loads or is refused with a
 * message naming the file; a loaded set has 1..limit prompts in increasing line order, unique
 * ids, 1 or 2 turns each (2 only for mtbench), bad lines only with keep_going. */
#include <string.h>

#include "dfl/common.h"
#include "dfl/eval.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nl = memchr(data, '\n', size);
    if (!nl) nl = data + size;
    char *head = fuzz_cstr(data, (size_t)(nl - data));
    char *sp = strchr(head, ' ');
    unsigned flags = 0;
    if (sp) {
        *sp = 0;
        flags = (unsigned)strtoul(sp + 1, NULL, 10) & 0xffff;
    }
    eval_format fmt;
    char field[16];
    dfl_clearerr();
    if (eval_format_parse(head, &fmt, field, (int)sizeof field) != DFL_OK) {
        FUZZ_CHECK(strstr(dfl_errmsg(), "format") != NULL, "format error: %s", dfl_errmsg());
        free(head);
        return 0;
    }
    FUZZ_CHECK(fmt != EVAL_FMT_JSONL || (field[0] && strlen(field) < sizeof field), "jsonl field '%s'", field);
    const int keep_going = flags & 1, limit = (int)(flags >> 1);
    const uint8_t *body = nl < data + size ? nl + 1 : nl;
    const char *path = fuzz_file(0, body, (size_t)(data + size - body));
    eval_prompts ps;
    if (eval_prompts_load(&ps, path, fmt, field, limit, keep_going) != DFL_OK) {
        FUZZ_CHECK(strstr(dfl_errmsg(), path) != NULL, "error does not name the file: %s", dfl_errmsg());
        FUZZ_CHECK(ps.n == 0 && ps.p == NULL && ps.bad_lines == NULL, "a refused file left prompts behind");
        free(head);
        return 0;
    }
    FUZZ_CHECK(ps.n >= 1 && (limit <= 0 || ps.n <= limit), "%d prompts, limit %d", ps.n, limit);
    FUZZ_CHECK(keep_going || ps.n_bad == 0, "bad lines without keep_going");
    for (int i = 0; i < ps.n; i++) {
        const eval_prompt *p = &ps.p[i];
        FUZZ_CHECK(p->id && p->n_turns >= 1 && p->n_turns <= (fmt == EVAL_FMT_MTBENCH ? 2 : 1), "prompt %d", i);
        for (int k = 0; k < p->n_turns; k++) FUZZ_CHECK(p->turns[k] != NULL, "turn %d of prompt %d", k, i);
        FUZZ_CHECK(i == 0 || p->line > ps.p[i - 1].line, "line order");
        for (int j = i < 2000 ? 0 : i; j < i; j++) FUZZ_CHECK(strcmp(ps.p[j].id, p->id) != 0, "repeated id '%s'", p->id);
    }
    for (int i = 0; i < ps.n_bad; i++)
        for (int j = 0; j < ps.n; j++) FUZZ_CHECK(ps.bad_lines[i] != ps.p[j].line, "a bad line is a prompt");
    eval_prompts_free(&ps);
    free(head);
    return 0;
}
