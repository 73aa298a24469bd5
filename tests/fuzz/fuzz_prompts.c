/* Fuzz prompt files (eval_prompts_load) and --prompt-format values (eval_format_parse).
 * Input: a first line "FORMAT [FLAGS]" (FORMAT as for --prompt-format; FLAGS a number: bit 0
 * keep_going, bits 1.. the limit), then the prompt file. Any input loads or is refused with a
 * message naming the file; a loaded set has 1..limit prompts in increasing line order, unique
 * ids, 1 or 2 turns each (2 only for mtbench, messages, sharegpt), bad lines only with keep_going; and each prompt is
 * its line's text whole: a text line byte for byte, a JSON field as a parser that keeps NUL
 * characters reads it (so a prompt cut at a NUL is a failure: "a\u0000b" once loaded as "a"),
 * its id the line's id field (a string, or an integer written as one) or else its line number. */
#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/eval.h"
#include "fuzz_util.h"

/* Line k (1-based) of body, without its trailing \r and \n (as the loader reads it); malloc'd,
 * its length in *len (NUL bytes included). */
static char *line_of(const uint8_t *body, size_t n, int k, size_t *len) {
    size_t a = 0;
    for (int i = 1; i < k && a <= n; i++) {
        const uint8_t *nl = memchr(body + a, '\n', n - a);
        a = nl ? (size_t)(nl - body) + 1 : n + 1;
    }
    FUZZ_CHECK(a <= n, "line %d is not in the file", k);
    const uint8_t *nl = memchr(body + a, '\n', n - a);
    size_t b = nl ? (size_t)(nl - body) : n;
    while (b > a && (body[b - 1] == '\r' || body[b - 1] == '\n')) b--;
    char *s = malloc(b - a + 1);
    FUZZ_CHECK(s, "malloc");
    memcpy(s, body + a, b - a);
    s[b - a] = 0;
    *len = b - a;
    return s;
}

/* JSON text with every \u0000 escape made \u0001: cJSON then reads whole what it would cut. */
static void unnul(char *s) {
    for (char *p = s; (p = strstr(p, "u0000")); p++) {
        size_t bs = 0;
        for (char *q = p; q > s && q[-1] == '\\'; q--) bs++;
        if (bs % 2) p[4] = '1';
    }
}

static void check_whole(const eval_prompt *p, const uint8_t *body, size_t n, eval_format fmt, const char *field) {
    size_t len;
    char *line = line_of(body, n, p->line, &len);
    FUZZ_CHECK(strlen(line) == len, "line %d holds a NUL byte but was loaded", p->line);
    if (fmt == EVAL_FMT_TEXT) {
        FUZZ_CHECK(strcmp(p->turns[0], line) == 0, "line %d: prompt '%s' is not the line", p->line, p->turns[0]);
        free(line);
        return;
    }
    unnul(line);
    cJSON *o = cJSON_Parse(line);
    FUZZ_CHECK(cJSON_IsObject(o), "line %d loaded but is no JSON object", p->line);
    if (fmt == EVAL_FMT_MESSAGES || fmt == EVAL_FMT_SHAREGPT) { /* the user messages, in order */
        const int oa = fmt == EVAL_FMT_MESSAGES;
        int k = 0;
        const cJSON *m;
        cJSON_ArrayForEach(m, cJSON_GetObjectItemCaseSensitive(o, oa ? "messages" : "conversations")) {
            const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, oa ? "role" : "from");
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, oa ? "content" : "value");
            if (!cJSON_IsString(r) || (strcmp(r->valuestring, "user") && strcmp(r->valuestring, "human"))) continue;
            FUZZ_CHECK(k < p->n_turns && cJSON_IsString(v) && strcmp(v->valuestring, p->turns[k]) == 0,
                       "line %d user message %d: not the loaded turn (a NUL character?)", p->line, k);
            k++;
        }
        FUZZ_CHECK(k == p->n_turns, "line %d: %d user messages, %d turns loaded", p->line, k, p->n_turns);
    }
    for (int k = 0; fmt != EVAL_FMT_MESSAGES && fmt != EVAL_FMT_SHAREGPT && k < p->n_turns; k++) {
        const cJSON *v = fmt == EVAL_FMT_MTBENCH
                             ? cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "turns"), k)
                             : cJSON_GetObjectItemCaseSensitive(o, fmt == EVAL_FMT_GSM8K ? "question" : field);
        FUZZ_CHECK(cJSON_IsString(v) && strcmp(v->valuestring, p->turns[k]) == 0,
                   "line %d turn %d: loaded '%s', the field holds more (a NUL character?)", p->line, k, p->turns[k]);
    }
    static const char *const ids_m[] = {"question_id", "id", NULL}, *const ids_j[] = {"id", "idx", "question_id", NULL};
    const char *const *ids = fmt == EVAL_FMT_MTBENCH ? ids_m : ids_j;
    char want[64];
    snprintf(want, sizeof want, "%d", p->line);
    for (int i = 0; ids[i]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, ids[i]);
        if (!v) continue;
        if (cJSON_IsString(v)) snprintf(want, sizeof want, "%.63s", v->valuestring);
        else {
            FUZZ_CHECK(cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble) &&
                           fabs(v->valuedouble) <= 9007199254740992.0,
                       "line %d: id field '%s' is no string or integer, yet the prompt loaded", p->line, ids[i]);
            snprintf(want, sizeof want, "%.0f", v->valuedouble);
        }
        break;
    }
    FUZZ_CHECK(strncmp(p->id, want, 63) == 0, "line %d: id '%s', the line says '%s'", p->line, p->id, want);
    cJSON_Delete(o);
    free(line);
}

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
        const int two = fmt == EVAL_FMT_MTBENCH || fmt == EVAL_FMT_MESSAGES || fmt == EVAL_FMT_SHAREGPT;
        FUZZ_CHECK(p->id && p->n_turns >= 1 && p->n_turns <= (two ? 2 : 1), "prompt %d", i);
        for (int k = 0; k < p->n_turns; k++) FUZZ_CHECK(p->turns[k] != NULL, "turn %d of prompt %d", k, i);
        FUZZ_CHECK(i == 0 || p->line > ps.p[i - 1].line, "line order");
        for (int j = i < 2000 ? 0 : i; j < i; j++)
            FUZZ_CHECK(strcmp(ps.p[j].id, p->id) != 0, "repeated id '%s'", p->id);
        check_whole(p, body, (size_t)(data + size - body), fmt, field);
    }
    for (int i = 0; i < ps.n_bad; i++)
        for (int j = 0; j < ps.n; j++) FUZZ_CHECK(ps.bad_lines[i] != ps.p[j].line, "a bad line is a prompt");
    eval_prompts_free(&ps);
    free(head);
    return 0;
}
