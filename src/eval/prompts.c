/* Prompt sets for dfl eval: GSM8K, MT-Bench, generic JSON lines, plain text. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/jsonl.h"
#include "dfl/eval.h"

int eval_format_parse(const char *s, eval_format *fmt, char *field, int field_len) {
    field[0] = 0;
    if (strcmp(s, "gsm8k") == 0) *fmt = EVAL_FMT_GSM8K;
    else if (strcmp(s, "mtbench") == 0) *fmt = EVAL_FMT_MTBENCH;
    else if (strcmp(s, "text") == 0) *fmt = EVAL_FMT_TEXT;
    else if (strcmp(s, "messages") == 0) *fmt = EVAL_FMT_MESSAGES;
    else if (strcmp(s, "sharegpt") == 0) *fmt = EVAL_FMT_SHAREGPT;
    else if (strncmp(s, "jsonl:", 6) == 0 && s[6]) {
        *fmt = EVAL_FMT_JSONL;
        snprintf(field, (size_t)field_len, "%s", s + 6);
    } else {
        return dfl_seterr("format '%s': expected gsm8k, mtbench, text, messages, sharegpt or jsonl:FIELD", s);
    }
    return DFL_OK;
}

void eval_format_name(eval_format fmt, const char *field, char *out, size_t n) {
    static const char *const names[] = {"gsm8k", "mtbench", "jsonl:", "text", "messages", "sharegpt"};
    snprintf(out, n, "%s%s", names[fmt], fmt == EVAL_FMT_JSONL ? field : "");
}

eval_format eval_format_sniff(const char *path) {
    dfl_jsonl in;
    const int first = dfl_jsonl_open(&in, path, DFL_JSONL_LAST_LINE_OK) == DFL_OK && dfl_jsonl_next(&in) == 1;
    cJSON *o = first ? cJSON_Parse(in.line) : NULL;
    eval_format fmt = EVAL_FMT_GSM8K;
    if (cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(o, "turns"))) fmt = EVAL_FMT_MTBENCH;
    else if (cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(o, "messages"))) fmt = EVAL_FMT_MESSAGES;
    else if (cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(o, "conversations"))) fmt = EVAL_FMT_SHAREGPT;
    cJSON_Delete(o);
    dfl_jsonl_close(&in);
    return fmt;
}

/* cJSON ends a string at a NUL character: a prompt "a\\u0000b" would be cut to "a" without a word.
 * The text with each \\u0000 escape (an odd run of backslashes before "u0000") turned into \\u0001,
 * or NULL when there is none: its strings are as long as the file's, so a field whose string is
 * longer there than in the object parsed from the file holds a NUL. */
static char *nul_escaped(const char *text) {
    char *c = NULL;
    for (const char *p = text; (p = strstr(p, "u0000")); p++) {
        size_t bs = 0;
        for (const char *q = p; q > text && q[-1] == '\\'; q--) bs++;
        if (bs % 2 == 0) continue;
        if (!c && !(c = strdup(text))) return NULL;
        c[p - text + 4] = '1';
    }
    return c;
}

/* The first member, at any depth of a (alt: the same text with NULs made visible), whose key a
 * NUL cut short; NULL when none. */
static const cJSON *nul_key(const cJSON *a, const cJSON *alt) {
    for (const cJSON *x = a->child, *y = alt->child; x && y; x = x->next, y = y->next) {
        if (x->string && y->string && strlen(x->string) != strlen(y->string)) return x;
        const cJSON *in = nul_key(x, y);
        if (in) return in;
    }
    return NULL;
}

static int nul_cut(const cJSON *v, const cJSON *alt) {
    return cJSON_IsString(v) && cJSON_IsString(alt) && strlen(alt->valuestring) != strlen(v->valuestring);
}

/* The id of a JSON prompt: a named id field (a string, or an integer written as one), else the
 * line number. An id field of another kind (1.5, null, {}, true) is an error: it was meant as the
 * id, and a silent fallback or rounding would key the results by something else. alt: the
 * object with NUL characters made visible (see nul_escaped), or NULL. */
static int json_id(const cJSON *o, const cJSON *alt, const char *const *names, int line, char **out) {
    char buf[64], brief[96];
    for (int i = 0; names[i]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, names[i]);
        if (!v) continue;
        if (cJSON_IsString(v)) {
            if (nul_cut(v, alt ? cJSON_GetObjectItemCaseSensitive(alt, names[i]) : NULL))
                return dfl_seterr("field '%s' holds a NUL character (\\u0000), which dfl does not accept in an id",
                                  names[i]);
            *out = strdup(v->valuestring);
            return *out ? DFL_OK : dfl_seterr("out of memory");
        }
        if (cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble) &&
            fabs(v->valuedouble) <= 9007199254740992.0) {
            snprintf(buf, sizeof buf, "%.0f", v->valuedouble);
            *out = strdup(buf);
            return *out ? DFL_OK : dfl_seterr("out of memory");
        }
        return dfl_seterr("field '%s': a prompt id must be a string or an integer, found %s", names[i],
                          dfl_json_brief(v, brief, sizeof brief));
    }
    snprintf(buf, sizeof buf, "%d", line);
    *out = strdup(buf);
    return *out ? DFL_OK : dfl_seterr("out of memory");
}

/* "missing string field F" with a hint: the --format that fits the object's fields. */
static int missing_field(const cJSON *o, const char *f, eval_format fmt) {
    static const char *const known[] = {"question",    "prompt",  "text",    "input",
                                        "instruction", "content", "problem", NULL};
    if (cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(o, "turns")))
        return dfl_seterr("missing string field '%s'; the object has \"turns\": use --format mtbench", f);
    if (cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(o, "messages")))
        return dfl_seterr("missing string field '%s'; the object has OpenAI \"messages\": use --format messages", f);
    if (cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(o, "conversations")))
        return dfl_seterr("missing string field '%s'; the object has ShareGPT \"conversations\": use --format sharegpt",
                          f);
    for (int i = 0; known[i]; i++)
        if (strcmp(known[i], f) && cJSON_IsString(cJSON_GetObjectItemCaseSensitive(o, known[i])))
            return dfl_seterr("missing string field '%s'; the object has a string field \"%s\": use --format "
                              "jsonl:%s",
                              f, known[i], known[i]);
    /* else name the string fields it has (the first few) */
    char names[200] = "";
    int n = 0;
    size_t used = 0;
    for (const cJSON *c = o->child; c && n < 6; c = c->next)
        if (cJSON_IsString(c) && c->string) {
            int w = snprintf(names + used, sizeof names - used, "%s\"%s\"", n ? ", " : "", c->string);
            if (w < 0 || (size_t)w >= sizeof names - used) break;
            used += (size_t)w, n++;
        }
    if (n)
        return dfl_seterr("missing string field '%s'%s; its string fields: %s (use --format jsonl:FIELD)", f,
                          fmt == EVAL_FMT_GSM8K ? " (format gsm8k)" : "", names);
    return dfl_seterr("missing string field '%s'; the object has no string field", f);
}

/* One message of a chat record: its role as user (1), assistant (2) or other (0), its text. */
static int chat_message(const cJSON *m, const cJSON *am, eval_format fmt, int i, int *role, const char **text) {
    const int oa = fmt == EVAL_FMT_MESSAGES;
    const char *key = oa ? "messages" : "conversations", *rk = oa ? "role" : "from", *ck = oa ? "content" : "value";
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, rk), *c = cJSON_GetObjectItemCaseSensitive(m, ck);
    if (!cJSON_IsString(r)) return dfl_seterr("%s[%d]: expected an object with a string \"%s\"", key, i, rk);
    if (nul_cut(r, am ? cJSON_GetObjectItemCaseSensitive(am, rk) : NULL)) /* "human\u0000x" is no "human" */
        return dfl_seterr("%s[%d].%s holds a NUL character (\\u0000), which no role name has", key, i, rk);
    const char *v = r->valuestring;
    *role = !strcmp(v, "user") || !strcmp(v, "human") ? 1 : !strcmp(v, "assistant") || !strcmp(v, "gpt") ? 2 : 0;
    if (!*role && !strcmp(v, "system"))
        return dfl_seterr(
            "%s[%d] is a system message: dfl's chat templates (--chat) render user turns only; drop it, or "
            "fold it into the first user turn",
            key, i);
    if (!*role)
        return dfl_seterr("%s[%d].%s: '%s' is no role dfl runs (expected %s)", key, i, rk, v,
                          oa ? "user or assistant" : "human or gpt");
    if (!cJSON_IsString(c))
        return dfl_seterr(
            "%s[%d].%s: expected a string (content parts or null are not read: give the text as a string)", key, i, ck);
    if (nul_cut(c, am ? cJSON_GetObjectItemCaseSensitive(am, ck) : NULL))
        return dfl_seterr("%s[%d].%s holds a NUL character (\\u0000), which dfl does not accept in a prompt", key, i,
                          ck);
    *text = c->valuestring;
    return DFL_OK;
}

/* A chat record (--format messages, sharegpt): its user turns are the prompt's turns (at most 2),
 * the assistant turn after the first user turn its reference answer. */
static int parse_chat(eval_prompt *p, const cJSON *o, const cJSON *alt, eval_format fmt) {
    const char *key = fmt == EVAL_FMT_MESSAGES ? "messages" : "conversations";
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(o, key);
    const cJSON *amsgs = alt ? cJSON_GetObjectItemCaseSensitive(alt, key) : NULL;
    if (!cJSON_IsArray(msgs))
        return dfl_seterr(
            "missing array field '%s' (format %s: %s)", key, fmt == EVAL_FMT_MESSAGES ? "messages" : "sharegpt",
            fmt == EVAL_FMT_MESSAGES ? "{\"messages\": [{\"role\": \"user\", \"content\": \"...\"}, ...]}"
                                     : "{\"conversations\": [{\"from\": \"human\", \"value\": \"...\"}, ...]}");
    for (int i = 0; i < cJSON_GetArraySize(msgs); i++) {
        int role = 0;
        const char *text = NULL;
        if (chat_message(cJSON_GetArrayItem(msgs, i), cJSON_GetArrayItem(amsgs, i), fmt, i, &role, &text))
            return DFL_ERR;
        if (role == 2 && !p->n_turns)
            return dfl_seterr("%s[%d]: the conversation starts with an assistant message, which dfl cannot render (its "
                              "templates begin with a user turn)",
                              key, i);
        if (role == 1 && p->n_turns == 2)
            return dfl_seterr("%s[%d]: a third user turn: dfl eval runs at most two (the second after the model's own "
                              "first answer, as MT-Bench); keep the first two",
                              key, i);
        if (role == 1 && !(p->turns[p->n_turns++] = strdup(text))) return dfl_seterr("out of memory");
        if (role == 2 && p->n_turns == 1 && !p->answer && !(p->answer = strdup(text)))
            return dfl_seterr("out of memory");
    }
    return p->n_turns ? DFL_OK : dfl_seterr("'%s' holds no user turn", key);
}

/* Parse one line (len bytes, without its newline) into p; DFL_ERR with a message (without
 * file/line, added by the caller). */
static int parse_line(eval_prompt *p, char *text, size_t len, eval_format fmt, const char *field, int line) {
    memset(p, 0, sizeof *p);
    p->line = line;
    const char *nul = memchr(text, 0, len);
    if (nul) /* a C string would end there: the prompt would be cut short */
        return dfl_seterr("holds a NUL byte at column %d, which dfl does not accept in a prompt",
                          (int)(nul - text) + 1);
    if (fmt == EVAL_FMT_TEXT) {
        char id[32];
        snprintf(id, sizeof id, "%d", line);
        p->id = strdup(id);
        p->turns[0] = strdup(text);
        p->n_turns = 1;
        return DFL_OK;
    }
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithOpts(text, &end, 1); /* one object, nothing after it */
    if (!o) {
        cJSON *lax = cJSON_Parse(text);
        const int obj = cJSON_IsObject(lax);
        cJSON_Delete(lax);
        if (obj && end)
            return dfl_seterr("text after the JSON object at column %d: JSON lines hold one object per line",
                              (int)(end - text) + 1);
    }
    if (!o || !cJSON_IsObject(o)) {
        const int arr = cJSON_IsArray(o);
        cJSON_Delete(o);
        const char *t = text;
        while (*t == ' ' || *t == '\t') t++;
        if (arr || *t == '[')
            return dfl_seterr("a JSON array, not a JSON object: the prompt file must be JSON lines (one object per "
                              "line; convert an array with jq -c '.[]' FILE), or use --format text for a prompt "
                              "per line");
        if (*t == '{')
            return dfl_seterr("not a complete JSON object (JSON lines need one object per line, not one spread over "
                              "several; reformat with jq -c . FILE)");
        return dfl_seterr("not a JSON object (a CSV or plain-text file? use --format text for a prompt per line)");
    }
    char *esc = nul_escaped(text);
    cJSON *alt = esc ? cJSON_Parse(esc) : NULL;
    free(esc);
    int rc = DFL_OK;
    /* a key cut at a NUL ("id\\u0000x") would be read as another key ("id"), at any depth */
    const cJSON *cut = alt ? nul_key(o, alt) : NULL;
    if (cut)
        rc = dfl_seterr("key '%s' holds a NUL character (\\u0000) after these letters, which dfl does not accept",
                        cut->string);
    if (rc == DFL_OK && fmt == EVAL_FMT_MTBENCH) {
        static const char *const ids[] = {"question_id", "id", NULL};
        const cJSON *turns = cJSON_GetObjectItemCaseSensitive(o, "turns");
        const cJSON *aturns = alt ? cJSON_GetObjectItemCaseSensitive(alt, "turns") : NULL;
        int n = cJSON_IsArray(turns) ? cJSON_GetArraySize(turns) : 0;
        if (n < 1 || n > 2) {
            rc = dfl_seterr("field 'turns' must be an array of 1 or 2 strings");
        } else {
            for (int i = 0; i < n && rc == DFL_OK; i++) {
                const cJSON *t = cJSON_GetArrayItem(turns, i);
                if (!cJSON_IsString(t)) rc = dfl_seterr("turns[%d] is not a string", i);
                else if (nul_cut(t, aturns ? cJSON_GetArrayItem(aturns, i) : NULL))
                    rc = dfl_seterr("turns[%d] holds a NUL character (\\u0000), which dfl does not accept in a "
                                    "prompt",
                                    i);
                else p->turns[p->n_turns++] = strdup(t->valuestring);
            }
            if (rc == DFL_OK) rc = json_id(o, alt, ids, line, &p->id);
        }
    } else if (rc == DFL_OK && (fmt == EVAL_FMT_MESSAGES || fmt == EVAL_FMT_SHAREGPT)) {
        static const char *const ids[] = {"id", "idx", "question_id", NULL};
        rc = parse_chat(p, o, alt, fmt);
        if (rc == DFL_OK) rc = json_id(o, alt, ids, line, &p->id);
    } else if (rc == DFL_OK) {
        static const char *const ids[] = {"id", "idx", "question_id", NULL};
        const char *f = fmt == EVAL_FMT_GSM8K ? "question" : field;
        const cJSON *q = cJSON_GetObjectItemCaseSensitive(o, f);
        if (!cJSON_IsString(q)) {
            rc = missing_field(o, f, fmt);
        } else if (nul_cut(q, alt ? cJSON_GetObjectItemCaseSensitive(alt, f) : NULL)) {
            rc = dfl_seterr("field '%s' holds a NUL character (\\u0000), which dfl does not accept in a prompt", f);
        } else {
            p->turns[0] = strdup(q->valuestring);
            p->n_turns = 1;
            rc = json_id(o, alt, ids, line, &p->id);
            /* a reference response, for training metrics on dataset labels */
            for (const char *const *k = (const char *const[]){"answer", "response", NULL}; *k && !p->answer; k++) {
                const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, *k);
                if (cJSON_IsString(a) && !nul_cut(a, alt ? cJSON_GetObjectItemCaseSensitive(alt, *k) : NULL))
                    p->answer = strdup(a->valuestring);
            }
        }
    }
    cJSON_Delete(o);
    cJSON_Delete(alt);
    if (rc != DFL_OK) {
        for (int i = 0; i < p->n_turns; i++) free(p->turns[i]);
        free(p->id), free(p->answer);
        memset(p, 0, sizeof *p);
    }
    return rc;
}

static int prompt_cmp(const void *a, const void *b) {
    const eval_prompt *x = *(const eval_prompt *const *)a, *y = *(const eval_prompt *const *)b;
    const int c = strcmp(x->id, y->id);
    return c ? c : x->line - y->line;
}

int eval_prompts_load(eval_prompts *ps, const char *path, eval_format fmt, const char *field, int limit,
                      int keep_going) {
    memset(ps, 0, sizeof *ps);
    dfl_jsonl in; /* blank lines carry no prompt */
    if (dfl_jsonl_open(&in, path, DFL_JSONL_LAST_LINE_OK)) return dfl_preperr("prompt file");
    int cap_p = 0, rc = DFL_OK, more;
    while ((more = dfl_jsonl_next(&in)) == 1) {
        const int lineno = in.lineno;
        if (limit > 0 && ps->n >= limit) break;
        if (ps->n == cap_p) {
            cap_p = cap_p ? 2 * cap_p : 64;
            ps->p = realloc(ps->p, (size_t)cap_p * sizeof *ps->p);
        }
        if (parse_line(&ps->p[ps->n], in.line, in.len, fmt, field, lineno) != DFL_OK) {
            if (!keep_going) {
                rc = dfl_preperr("%s:%d", path, lineno);
                break;
            }
            ps->bad_lines = realloc(ps->bad_lines, (size_t)(ps->n_bad + 1) * sizeof(int));
            ps->bad_lines[ps->n_bad++] = lineno;
            continue;
        }
        ps->n++;
    }
    if (more < 0) rc = DFL_ERR;
    dfl_jsonl_close(&in);
    if (rc == DFL_OK && ps->n == 0) rc = dfl_seterr("%s: no prompts", path);
    /* ids must be unique: results are keyed by them (sorted, so a large file stays O(n log n)) */
    const eval_prompt **by_id = rc == DFL_OK ? malloc((size_t)ps->n * sizeof *by_id) : NULL;
    if (rc == DFL_OK && !by_id) rc = dfl_seterr("%s: out of memory for %d prompt ids", path, ps->n);
    if (rc == DFL_OK) {
        for (int i = 0; i < ps->n; i++) by_id[i] = &ps->p[i];
        qsort(by_id, (size_t)ps->n, sizeof *by_id, prompt_cmp);
        for (int i = 1; i < ps->n; i++) /* equal ids sort by line: report the later line */
            if (strcmp(by_id[i - 1]->id, by_id[i]->id) == 0) {
                rc = dfl_seterr("%s:%d: prompt id '%s' repeats line %d's", path, by_id[i]->line, by_id[i]->id,
                                by_id[i - 1]->line);
                break;
            }
    }
    free(by_id);
    if (rc != DFL_OK) eval_prompts_free(ps);
    return rc;
}

void eval_prompts_free(eval_prompts *ps) {
    for (int i = 0; i < ps->n; i++) {
        free(ps->p[i].id), free(ps->p[i].answer);
        for (int k = 0; k < ps->p[i].n_turns; k++) free(ps->p[i].turns[k]);
    }
    free(ps->p);
    free(ps->bad_lines);
    memset(ps, 0, sizeof *ps);
}
