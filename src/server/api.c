/* dfl serve: the request and response formats of the endpoints (docs/serve.md) — OpenAI
 * completions and chat completions, SGLang /generate, tokenize / detokenize. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dfl/common.h"
#include "dfl/kernels.h"
#include "dfl/prompt.h"
#include "server/server_internal.h"

void api_seterr(api_err *e, int status, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    e->status = status;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    switch (status) {
    case 400: e->type = "invalid_request_error"; break;
    case 404: e->type = "not_found_error"; break;
    case 405: e->type = "method_not_allowed_error"; break;
    case 413: e->type = "request_too_large_error"; break;
    case 503: e->type = "service_unavailable_error"; break;
    default: e->type = "internal_error"; break;
    }
}

char *api_error_body(const api_err *e) {
    cJSON *r = cJSON_CreateObject(), *o = cJSON_AddObjectToObject(r, "error");
    cJSON_AddStringToObject(o, "message", e->msg);
    cJSON_AddStringToObject(o, "type", e->type);
    if (e->param[0]) cJSON_AddStringToObject(o, "param", e->param);
    else cJSON_AddNullToObject(o, "param");
    cJSON_AddNumberToObject(o, "code", e->status);
    char *s = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    return s;
}

/* ---- typed field access: absent and null are the same; wrong types name the field ---- */

static cJSON *field(const cJSON *obj, const char *name) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* 1 = present (value in *out), 0 = absent, -1 = error */
static int get_double(const cJSON *obj, const char *name, const char *param, double lo, double hi, double *out,
                      api_err *e) {
    cJSON *v = field(obj, name);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
        api_seterr(e, 400, param, "'%s' must be a number", param);
        return -1;
    }
    if (v->valuedouble < lo || v->valuedouble > hi) {
        api_seterr(e, 400, param, "'%s' must be in [%g, %g], found %g", param, lo, hi, v->valuedouble);
        return -1;
    }
    *out = v->valuedouble;
    return 1;
}

static int get_int(const cJSON *obj, const char *name, const char *param, double lo, double hi, long long *out,
                   api_err *e) {
    cJSON *v = field(obj, name);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble)) {
        api_seterr(e, 400, param, "'%s' must be an integer", param);
        return -1;
    }
    if (v->valuedouble < lo || v->valuedouble > hi) {
        api_seterr(e, 400, param, "'%s' must be in [%.0f, %.0f], found %.0f", param, lo, hi, v->valuedouble);
        return -1;
    }
    *out = (long long)v->valuedouble;
    return 1;
}

static int get_bool(const cJSON *obj, const char *name, const char *param, int *out, api_err *e) {
    cJSON *v = field(obj, name);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) {
        api_seterr(e, 400, param, "'%s' must be a boolean", param);
        return -1;
    }
    *out = cJSON_IsTrue(v);
    return 1;
}

/* A list of token ids, each in [0, vocab). */
static int get_ids(const cJSON *arr, const char *param, int vocab, int32_t **ids, int *n, api_err *e) {
    const int k = cJSON_GetArraySize(arr);
    int32_t *v = malloc((size_t)(k ? k : 1) * sizeof *v);
    if (!v) {
        api_seterr(e, 500, NULL, "out of memory");
        return -1;
    }
    int i = 0;
    for (cJSON *x = arr->child; x; x = x->next, i++) {
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < 0 ||
            x->valuedouble >= vocab) {
            api_seterr(e, 400, param, "'%s' must hold token ids, integers in [0, %d); element %d is not", param, vocab,
                       i);
            free(v);
            return -1;
        }
        v[i] = (int32_t)x->valuedouble;
    }
    *ids = v;
    *n = k;
    return 0;
}

static int is_id_list(const cJSON *v) {
    if (!cJSON_IsArray(v) || !v->child) return 0;
    for (cJSON *x = v->child; x; x = x->next)
        if (!cJSON_IsNumber(x)) return 0;
    return 1;
}

static int encode(const api_ctx *cx, const char *text, int32_t **ids, int *n, api_err *e) {
    size_t k = 0;
    if (tok_encode(cx->tok, text, strlen(text), ids, &k) != DFL_OK) {
        api_seterr(e, 500, NULL, "tokenizer: %s", dfl_errmsg());
        return -1;
    }
    *n = (int)k;
    return 0;
}

/* ---- chat ---- */

typedef struct sbuf {
    char *s;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_add(sbuf *b, const char *s) {
    const size_t n = strlen(s);
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n + 1);
    b->len += n;
}

static int check_members(const cJSON *obj, const char *param, const char *const *known, api_err *e);

/* messages -> ChatML text: <|im_start|>{role}\n{content}<|im_end|>\n per message, then the
 * assistant header (and an empty think block when chat_template_kwargs.enable_thinking is false,
 * as Qwen3's template does). */
static char *chat_text(const cJSON *body, api_err *e) {
    char param[64];
    cJSON *msgs = cJSON_GetObjectItemCaseSensitive(body, "messages");
    if (!msgs || cJSON_IsNull(msgs)) {
        api_seterr(e, 400, "messages", "'messages' is required");
        return NULL;
    }
    if (!cJSON_IsArray(msgs) || !msgs->child) {
        api_seterr(e, 400, "messages", "'messages' must be a non-empty array of {role, content} objects");
        return NULL;
    }
    sbuf b = {0};
    int i = 0;
    for (cJSON *m = msgs->child; m; m = m->next, i++) {
        cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
            snprintf(param, sizeof param, "messages[%d].role", i);
            api_seterr(e, 400, param, "'%s' must be a string", param);
            free(b.s);
            return NULL;
        }
        static const char *const msg_known[] = {"role", "content", NULL}; /* no names, tool calls, ... */
        snprintf(param, sizeof param, "messages[%d]", i);
        if (check_members(m, param, msg_known, e) < 0) {
            free(b.s);
            return NULL;
        }
        sb_add(&b, "<|im_start|>");
        sb_add(&b, role->valuestring);
        sb_add(&b, "\n");
        if (cJSON_IsString(content)) {
            sb_add(&b, content->valuestring);
        } else if (cJSON_IsArray(content)) { /* OpenAI content parts: text only */
            for (cJSON *p = content->child; p; p = p->next) {
                cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
                cJSON *text = cJSON_GetObjectItemCaseSensitive(p, "text");
                if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 || !cJSON_IsString(text)) {
                    snprintf(param, sizeof param, "messages[%d].content", i);
                    api_seterr(e, 400, param, "'%s': only {\"type\": \"text\", \"text\": ...} parts are supported",
                               param);
                    free(b.s);
                    return NULL;
                }
                sb_add(&b, text->valuestring);
            }
        } else if (content && !cJSON_IsNull(content)) {
            snprintf(param, sizeof param, "messages[%d].content", i);
            api_seterr(e, 400, param, "'%s' must be a string or an array of text parts", param);
            free(b.s);
            return NULL;
        }
        sb_add(&b, "<|im_end|>\n");
    }
    sb_add(&b, "<|im_start|>assistant\n");
    cJSON *kw = field(body, "chat_template_kwargs");
    if (kw) {
        int think = 1;
        if (!cJSON_IsObject(kw)) {
            api_seterr(e, 400, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
            free(b.s);
            return NULL;
        }
        static const char *const kw_known[] = {"enable_thinking", NULL};
        if (check_members(kw, "chat_template_kwargs", kw_known, e) < 0 ||
            get_bool(kw, "enable_thinking", "chat_template_kwargs.enable_thinking", &think, e) < 0) {
            free(b.s);
            return NULL;
        }
        if (!think) sb_add(&b, "<think>\n\n</think>\n\n");
    }
    if (b.oom) {
        free(b.s);
        api_seterr(e, 500, NULL, "out of memory");
        return NULL;
    }
    return b.s;
}

/* ---- generation requests ---- */

static int parse_stop(const cJSON *obj, const char *param, job *j, api_err *e) {
    cJSON *v = field(obj, "stop");
    if (!v) return 0;
    int n = cJSON_IsString(v) ? 1 : cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (n < 0) {
        api_seterr(e, 400, param, "'%s' must be a string or an array of strings", param);
        return -1;
    }
    if (n > 16) {
        api_seterr(e, 400, param, "'%s': at most 16 stop strings", param);
        return -1;
    }
    j->stops = calloc((size_t)(n ? n : 1), sizeof *j->stops);
    if (!j->stops) {
        api_seterr(e, 500, NULL, "out of memory");
        return -1;
    }
    const cJSON *x = cJSON_IsString(v) ? v : v->child;
    for (; x; x = cJSON_IsString(v) ? NULL : x->next) {
        if (!cJSON_IsString(x)) {
            api_seterr(e, 400, param, "'%s' must be a string or an array of strings", param);
            return -1;
        }
        if (!x->valuestring[0]) continue; /* an empty stop string would match at once */
        if (!(j->stops[j->n_stops++] = strdup(x->valuestring))) {
            api_seterr(e, 500, NULL, "out of memory");
            return -1;
        }
    }
    return 0;
}

/* ---- the request fields: one rule ----
 *
 * Every field of a generation request is one of: implemented (parsed in api_parse_generation);
 * metadata that changes no output (model, user); or a control dfl does not implement, accepted
 * only at the value that makes it a no-op (n 1, logit_bias {}, response_format {"type": "text"},
 * tools [], ...; min_p at any value with greedy decoding, where it changes nothing). Anything
 * else, unknown fields included, is refused with 400 naming the field: no request silently gets
 * another output than it asked for. docs/serve.md lists the fields. */

enum {
    ON_CMPL = 1,
    ON_CHAT = 2,
    ON_GEN = 4 /* /generate's top level */,
    ON_SP = 8 /* its sampling_params */,
    ON_OAI = ON_CMPL | ON_CHAT
};

typedef enum fkind {
    F_PARSED,    /* implemented, or metadata: parsed (or ignored) elsewhere */
    F_NUM,       /* a number, accepted at `neutral` only (any value when greedy and `sampling_only`) */
    F_EMPTY_OBJ, /* {} */
    F_EMPTY_ARR, /* [] */
    F_FALSE,     /* false or 0 */
    F_TRUE,      /* true */
    F_STR,       /* the string `str` */
    F_TEXT_FMT,  /* {"type": "text"} */
    F_BOOL,      /* any boolean: nothing it could change exists (parallel_tool_calls without tools) */
} fkind;

typedef struct field_rule {
    const char *name;
    unsigned on; /* where the field exists */
    fkind kind;
    double neutral;
    int sampling_only;
    const char *str;
} field_rule;

static const field_rule field_rules[] = {
    /* implemented */
    {"prompt", ON_CMPL, F_PARSED, 0, 0, NULL},
    {"messages", ON_CHAT, F_PARSED, 0, 0, NULL},
    {"text", ON_GEN, F_PARSED, 0, 0, NULL},
    {"input_ids", ON_GEN, F_PARSED, 0, 0, NULL},
    {"sampling_params", ON_GEN, F_PARSED, 0, 0, NULL},
    {"max_tokens", ON_OAI, F_PARSED, 0, 0, NULL},
    {"max_completion_tokens", ON_CHAT, F_PARSED, 0, 0, NULL},
    {"max_new_tokens", ON_SP, F_PARSED, 0, 0, NULL},
    {"temperature", ON_OAI | ON_SP, F_PARSED, 0, 0, NULL},
    {"top_p", ON_OAI | ON_SP, F_PARSED, 0, 0, NULL},
    {"top_k", ON_OAI | ON_SP, F_PARSED, 0, 0, NULL},
    {"seed", ON_OAI | ON_SP, F_PARSED, 0, 0, NULL},
    {"sampling_seed", ON_SP, F_PARSED, 0, 0, NULL},
    {"stop", ON_OAI | ON_SP, F_PARSED, 0, 0, NULL},
    {"ignore_eos", ON_OAI | ON_SP, F_PARSED, 0, 0, NULL},
    {"stream", ON_OAI | ON_GEN, F_PARSED, 0, 0, NULL},
    {"stream_options", ON_OAI, F_PARSED, 0, 0, NULL},
    {"logprobs", ON_OAI, F_PARSED, 0, 0, NULL},
    {"echo", ON_CMPL, F_PARSED, 0, 0, NULL},
    {"top_logprobs", ON_CHAT, F_PARSED, 0, 0, NULL},
    {"chat_template_kwargs", ON_CHAT, F_PARSED, 0, 0, NULL},
    /* metadata; vLLM's return_token_ids: dfl always returns token_ids */
    {"model", ON_OAI, F_PARSED, 0, 0, NULL},
    {"user", ON_OAI, F_PARSED, 0, 0, NULL},
    {"return_token_ids", ON_OAI, F_BOOL, 0, 0, NULL},
    /* not implemented: accepted as no-ops only */
    {"n", ON_OAI | ON_SP, F_NUM, 1, 0, NULL},
    {"best_of", ON_CMPL, F_NUM, 1, 0, NULL},
    {"min_p", ON_OAI | ON_SP, F_NUM, 0, 1, NULL},
    {"presence_penalty", ON_OAI | ON_SP, F_NUM, 0, 0, NULL},
    {"frequency_penalty", ON_OAI | ON_SP, F_NUM, 0, 0, NULL},
    {"repetition_penalty", ON_OAI | ON_SP, F_NUM, 1, 0, NULL},
    {"min_tokens", ON_OAI, F_NUM, 0, 0, NULL},
    {"min_new_tokens", ON_SP, F_NUM, 0, 0, NULL},
    {"logit_bias", ON_OAI, F_EMPTY_OBJ, 0, 0, NULL},
    {"stop_token_ids", ON_OAI | ON_SP, F_EMPTY_ARR, 0, 0, NULL},
    {"skip_special_tokens", ON_OAI | ON_SP, F_TRUE, 0, 0, NULL},
    {"include_stop_str_in_output", ON_OAI, F_FALSE, 0, 0, NULL},
    {"suffix", ON_CMPL, F_STR, 0, 0, ""},
    {"echo", ON_CHAT, F_FALSE, 0, 0, NULL},
    {"return_logprob", ON_GEN, F_FALSE, 0, 0, NULL},
    {"response_format", ON_CHAT, F_TEXT_FMT, 0, 0, NULL},
    {"tools", ON_CHAT, F_EMPTY_ARR, 0, 0, NULL},
    {"functions", ON_CHAT, F_EMPTY_ARR, 0, 0, NULL},
    {"tool_choice", ON_CHAT, F_STR, 0, 0, "none"},
    {"function_call", ON_CHAT, F_STR, 0, 0, "none"},
    {"parallel_tool_calls", ON_CHAT, F_BOOL, 0, 0, NULL},
};

static const char *kind_accepts(const field_rule *r, char *b, size_t n) {
    switch (r->kind) {
    case F_NUM: snprintf(b, n, "%g%s", r->neutral, r->sampling_only ? " (any value at temperature 0)" : ""); break;
    case F_EMPTY_OBJ: snprintf(b, n, "{}"); break;
    case F_EMPTY_ARR: snprintf(b, n, "[]"); break;
    case F_FALSE: snprintf(b, n, "false"); break;
    case F_TRUE: snprintf(b, n, "true"); break;
    case F_STR: snprintf(b, n, "\"%s\"", r->str); break;
    case F_TEXT_FMT: snprintf(b, n, "{\"type\": \"text\"}"); break;
    default: snprintf(b, n, "a boolean"); break;
    }
    return b;
}

static int is_noop(const field_rule *r, const cJSON *v, int greedy) {
    switch (r->kind) {
    case F_NUM: return cJSON_IsNumber(v) && (v->valuedouble == r->neutral || (greedy && r->sampling_only));
    case F_EMPTY_OBJ: return cJSON_IsObject(v) && !v->child;
    case F_EMPTY_ARR: return cJSON_IsArray(v) && !v->child;
    case F_FALSE: return cJSON_IsFalse(v) || (cJSON_IsNumber(v) && v->valuedouble == 0);
    case F_TRUE: return cJSON_IsTrue(v);
    case F_STR: return cJSON_IsString(v) && strcmp(v->valuestring, r->str) == 0;
    case F_TEXT_FMT: {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(v, "type");
        return cJSON_IsObject(v) && cJSON_GetArraySize(v) == 1 && cJSON_IsString(t) &&
               strcmp(t->valuestring, "text") == 0;
    }
    case F_BOOL: return cJSON_IsBool(v);
    default: return 1;
    }
}

static const char *ep_path(endpoint ep) {
    return ep == EP_COMPLETIONS ? "/v1/completions" : ep == EP_CHAT ? "/v1/chat/completions" : "/generate";
}

/* Every field of obj (where: ON_*) under the rule above; prefix names the object ("" or
 * "sampling_params."). A null field counts as absent. */
static int check_fields(const cJSON *obj, unsigned where, const char *prefix, int greedy, endpoint ep, api_err *e) {
    char param[96], acc[96], val[64];
    for (const cJSON *v = obj->child; v; v = v->next) {
        if (cJSON_IsNull(v) || !v->string) continue;
        const field_rule *r = NULL;
        for (size_t i = 0; i < sizeof field_rules / sizeof field_rules[0] && !r; i++)
            if ((field_rules[i].on & where) && strcmp(field_rules[i].name, v->string) == 0) r = &field_rules[i];
        snprintf(param, sizeof param, "%s%s", prefix, v->string);
        if (!r) {
            api_seterr(e, 400, param,
                       "'%s' is not supported on %s (not a field dfl serve implements; docs/serve.md, "
                       "\"Request fields\", lists them)",
                       param, ep_path(ep));
            return -1;
        }
        if (r->kind == F_PARSED || is_noop(r, v, greedy)) continue;
        api_seterr(e, 400, param,
                   "'%s' = %s is not supported: dfl serve accepts it only as %s, where it changes "
                   "nothing (docs/serve.md, \"Request fields\")",
                   param, dfl_json_brief(v, val, sizeof val), kind_accepts(r, acc, sizeof acc));
        return -1;
    }
    return 0;
}

/* The members of a sub-object (stream_options, chat_template_kwargs, a message) that dfl reads:
 * any other is refused, naming it. */
static int check_members(const cJSON *obj, const char *param, const char *const *known, api_err *e) {
    for (const cJSON *v = obj->child; v; v = v->next) {
        if (cJSON_IsNull(v) || !v->string) continue;
        int ok = 0;
        for (int i = 0; known[i] && !ok; i++) ok = strcmp(known[i], v->string) == 0;
        if (ok) continue;
        char p[96], list[96] = "";
        snprintf(p, sizeof p, "%s.%s", param, v->string);
        for (int i = 0; known[i]; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s'%s'", i ? ", " : "", known[i]);
        api_seterr(e, 400, p,
                   "'%s' is not supported (dfl serve reads only %s in '%s'; docs/serve.md, \"Request "
                   "fields\")",
                   p, list, param);
        return -1;
    }
    return 0;
}

/* One completions prompt (a string or token ids) into j; param names it ("prompt", "prompt[2]"). */
static int parse_prompt(const api_ctx *cx, const cJSON *p, const char *param, job *j, api_err *e) {
    if (cJSON_IsString(p)) {
        if (encode(cx, p->valuestring, &j->prompt, &j->n_prompt, e)) return -1;
        if (!(j->echo_text = strdup(p->valuestring))) {
            api_seterr(e, 500, NULL, "out of memory");
            return -1;
        }
    } else if (is_id_list(p)) {
        if (get_ids(p, param, cx->vocab, &j->prompt, &j->n_prompt, e)) return -1;
    } else if (!p || cJSON_IsNull(p)) {
        api_seterr(e, 400, param, "'%s' is required", param);
        return -1;
    } else {
        api_seterr(e, 400, param, "'%s' must be a string or an array of token ids%s", param,
                   strchr(param, '[') ? "" : " (or a list of those: one choice per prompt)");
        return -1;
    }
    return 0;
}

static int prompt_fits(const api_ctx *cx, const job *j, const char *param, api_err *e) {
    if (j->n_prompt < 1) {
        api_seterr(e, 400, param, "the prompt is empty (0 tokens)");
        return -1;
    }
    if (j->n_prompt >= cx->max_ctx) {
        api_seterr(e, 400, param, "the prompt has %d tokens; the context holds %d positions (prompt + output)",
                   j->n_prompt, cx->max_ctx);
        return -1;
    }
    return 0;
}

/* A list of prompts on /v1/completions: one sub-job per prompt, in order (api_parse_generation
 * copies the options into them). */
static int parse_prompt_list(const api_ctx *cx, const cJSON *list, job *j, int *longest, api_err *e) {
    const int n = cJSON_GetArraySize(list);
    if (!(j->sub = calloc((size_t)n, sizeof *j->sub))) {
        api_seterr(e, 500, NULL, "out of memory");
        return -1;
    }
    int i = 0;
    for (const cJSON *x = list->child; x; x = x->next, i++) {
        job *c = calloc(1, sizeof *c);
        if (!c) {
            api_seterr(e, 500, NULL, "out of memory");
            return -1;
        }
        pthread_cond_init(&c->cv, NULL);
        c->refs = 1, c->index = i, c->logprobs = -1;
        j->sub[j->n_sub++] = c;
        char param[32];
        snprintf(param, sizeof param, "prompt[%d]", i);
        if (parse_prompt(cx, x, param, c, e) || prompt_fits(cx, c, param, e)) return -1;
        if (c->n_prompt > j->sub[*longest]->n_prompt) *longest = i;
    }
    return 0;
}

int api_parse_generation(const api_ctx *cx, endpoint ep, cJSON *body, job *j, api_err *e) {
    const int vocab = cx->vocab;
    j->ep = ep;
    j->logprobs = -1;
    int longest = 0; /* a list of prompts: the longest one's index */
    /* the prompt */
    if (ep == EP_COMPLETIONS) {
        cJSON *p = cJSON_GetObjectItemCaseSensitive(body, "prompt");
        /* a list of prompts (strings or id lists): a list of one is that prompt */
        if (cJSON_IsArray(p) && p->child && !cJSON_IsNumber(p->child) && !p->child->next) p = p->child;
        if (cJSON_IsArray(p) && p->child && !cJSON_IsNumber(p->child)) {
            if (parse_prompt_list(cx, p, j, &longest, e)) return -1;
            j->n_prompt = j->sub[longest]->n_prompt;
        } else if (parse_prompt(cx, p, "prompt", j, e)) {
            return -1;
        }
    } else if (ep == EP_CHAT) {
        char *text = chat_text(body, e);
        if (!text) return -1;
        int rc = encode(cx, text, &j->prompt, &j->n_prompt, e);
        free(text);
        if (rc) return -1;
    } else {
        cJSON *text = field(body, "text"), *ids = field(body, "input_ids");
        if (!!text == !!ids) {
            api_seterr(e, 400, text ? "input_ids" : "text", "give exactly one of 'text' and 'input_ids'");
            return -1;
        }
        if (text && !cJSON_IsString(text)) {
            api_seterr(e, 400, "text", "'text' must be a string (batches are not supported)");
            return -1;
        }
        if (ids && !is_id_list(ids)) {
            api_seterr(e, 400, "input_ids", "'input_ids' must be a non-empty array of token ids");
            return -1;
        }
        if (text ? encode(cx, text->valuestring, &j->prompt, &j->n_prompt, e)
                 : get_ids(ids, "input_ids", vocab, &j->prompt, &j->n_prompt, e))
            return -1;
    }
    const char *pfield = ep == EP_COMPLETIONS               ? "prompt"
                         : ep == EP_CHAT                    ? "messages"
                         : j->prompt && field(body, "text") ? "text"
                                                            : "input_ids";
    if (!j->n_sub && prompt_fits(cx, j, pfield, e)) return -1;
    /* options */
    const cJSON *o = body;
    const char *pre = "";
    const char *p_max = "max_tokens", *p_temp = "temperature", *p_seed = "seed", *p_stop = "stop",
               *p_eos = "ignore_eos";
    if (ep == EP_GENERATE) {
        cJSON *sp = field(body, "sampling_params");
        if (sp && !cJSON_IsObject(sp)) {
            api_seterr(e, 400, "sampling_params", "'sampling_params' must be an object");
            return -1;
        }
        static cJSON empty = {.type = cJSON_Object};
        o = sp ? sp : &empty;
        pre = "sampling_params.";
        p_max = "sampling_params.max_new_tokens", p_temp = "sampling_params.temperature",
        p_seed = "sampling_params.seed", p_stop = "sampling_params.stop", p_eos = "sampling_params.ignore_eos";
    }
    const double max_new_hi = 1 << 24;
    long long max_new = 0, seed = 0, lp = -1;
    int r;
    if (ep == EP_COMPLETIONS) {
        if (get_int(body, "logprobs", "logprobs", 0, 20, &lp, e) < 0) return -1;
        if (get_bool(body, "echo", "echo", &j->echo, e) < 0) return -1;
        if (!j->echo) free(j->echo_text), j->echo_text = NULL; /* kept for echo only */
    } else if (ep == EP_CHAT) { /* logprobs: bool, top_logprobs: 0..20 (needs logprobs) */
        int on = 0;
        if (get_bool(body, "logprobs", "logprobs", &on, e) < 0) return -1;
        long long k = 0;
        const int rk = get_int(body, "top_logprobs", "top_logprobs", 0, 20, &k, e);
        if (rk < 0) return -1;
        if (rk && !on) {
            api_seterr(e, 400, "top_logprobs", "'top_logprobs' needs \"logprobs\": true");
            return -1;
        }
        if (on) lp = k;
    }
    j->logprobs = (int)lp;
    r = get_int(o, ep == EP_GENERATE ? "max_new_tokens" : "max_tokens", p_max, j->echo ? 0 : 1, max_new_hi, &max_new,
                e);
    if (r < 0) return -1;
    if (r == 0 && ep == EP_CHAT) {
        r = get_int(o, "max_completion_tokens", "max_completion_tokens", 1, max_new_hi, &max_new, e);
        if (r < 0) return -1;
        if (r) p_max = "max_completion_tokens";
    }
    if (r == 0) max_new = ep == EP_COMPLETIONS ? 16 : ep == EP_GENERATE ? 128 : cx->max_ctx - j->n_prompt;
    double temp = 1.0; /* the OpenAI and SGLang default */
    if (get_double(o, "temperature", p_temp, 0, 1e6, &temp, e) < 0) return -1;
    if (temp > 0 && cx->tree_budget > 0) {
        api_seterr(e, 400, p_temp, "this server verifies with DDTree (--tree-budget %d), which is greedy: send %s 0",
                   cx->tree_budget, p_temp);
        return -1;
    }
    /* top_p in (0, 1] (1 = off), top_k >= 1 or -1 / 0 = off (vLLM's and SGLang's off is -1);
     * checked at temperature 0 too, where they change nothing */
    double top_p = 1;
    long long top_k = 0;
    char p_top_p[40], p_top_k[40];
    snprintf(p_top_p, sizeof p_top_p, "%stop_p", pre);
    snprintf(p_top_k, sizeof p_top_k, "%stop_k", pre);
    if (get_double(o, "top_p", p_top_p, -1e300, 1e300, &top_p, e) < 0) return -1;
    if (!(top_p > 0 && top_p <= 1)) {
        api_seterr(e, 400, p_top_p, "'%s' must be in (0, 1], found %g", p_top_p, top_p);
        return -1;
    }
    cJSON *tk = field(o, "top_k");
    if (tk && (!cJSON_IsNumber(tk) || tk->valuedouble != floor(tk->valuedouble) || tk->valuedouble < -1 ||
               tk->valuedouble > 2147483647.0)) {
        char b[64];
        api_seterr(e, 400, p_top_k, "'%s' must be an integer >= 1, or -1 or 0 (off); found %s", p_top_k,
                   dfl_json_brief(tk, b, sizeof b));
        return -1;
    }
    if (tk) top_k = (long long)tk->valuedouble;
    r = get_int(o, "seed", p_seed, 0, 9007199254740992.0, &seed, e);
    if (r < 0) return -1;
    if (r == 0 && ep == EP_GENERATE) {
        r = get_int(o, "sampling_seed", "sampling_params.sampling_seed", 0, 9007199254740992.0, &seed, e);
        if (r < 0) return -1;
    }
    j->seed_given = r;
    if (get_bool(o, "ignore_eos", p_eos, &j->ignore_eos, e) < 0) return -1;
    if (parse_stop(o, p_stop, j, e) < 0) return -1;
    if (check_fields(body, ep == EP_COMPLETIONS ? ON_CMPL : ep == EP_CHAT ? ON_CHAT : ON_GEN, "", temp == 0, ep, e) < 0)
        return -1;
    if (ep == EP_GENERATE && check_fields(o, ON_SP, pre, temp == 0, ep, e) < 0) return -1;
    if (get_bool(body, "stream", "stream", &j->stream, e) < 0) return -1;
    if (j->n_sub && j->stream) {
        api_seterr(e, 400, "stream",
                   "'stream' is not supported with a list of prompts (send the list unstreamed, or "
                   "one prompt per streamed request)");
        return -1;
    }
    if (ep != EP_GENERATE && j->stream && (j->logprobs >= 0 || j->echo)) {
        const char *f = j->logprobs >= 0 ? "logprobs" : "echo";
        api_seterr(e, 400, f, "'%s' is not supported with \"stream\": true (send the request unstreamed)", f);
        return -1;
    }
    cJSON *so = field(body, "stream_options");
    if (so && ep != EP_GENERATE) {
        if (!cJSON_IsObject(so)) {
            api_seterr(e, 400, "stream_options", "'stream_options' must be an object");
            return -1;
        }
        static const char *const so_known[] = {"include_usage", NULL};
        if (check_members(so, "stream_options", so_known, e) < 0) return -1;
        if (get_bool(so, "include_usage", "stream_options.include_usage", &j->include_usage, e) < 0) return -1;
    }
    if (j->n_prompt + max_new > cx->max_ctx) {
        char which[32] = "prompt";
        if (j->n_sub) snprintf(which, sizeof which, "prompt[%d]", longest);
        api_seterr(e, 400, p_max, "%s (%d tokens) + %s %lld exceeds the context of %d positions", which, j->n_prompt,
                   p_max, max_new, cx->max_ctx);
        return -1;
    }
    j->max_new = (int)max_new;
    j->temperature = (float)temp;
    j->top_p = (float)top_p;
    j->top_k = top_k > 0 ? (int)top_k : 0;
    j->seed = (uint64_t)seed;
    /* a list of prompts: each sub-job gets the options (its own stop strings, for job_free) */
    for (int i = 0; i < j->n_sub; i++) {
        job *c = j->sub[i];
        c->ep = ep, c->max_new = j->max_new, c->temperature = j->temperature, c->top_p = j->top_p;
        c->top_k = j->top_k, c->seed = j->seed, c->seed_given = j->seed_given, c->ignore_eos = j->ignore_eos;
        c->logprobs = j->logprobs, c->echo = j->echo;
        if (!c->echo) free(c->echo_text), c->echo_text = NULL;
        if (j->n_stops && !(c->stops = calloc((size_t)j->n_stops, sizeof *c->stops))) {
            api_seterr(e, 500, NULL, "out of memory");
            return -1;
        }
        for (int k = 0; k < j->n_stops; k++)
            if (!(c->stops[c->n_stops++] = strdup(j->stops[k]))) {
                api_seterr(e, 500, NULL, "out of memory");
                return -1;
            }
    }
    return 0;
}

/* ---- tokenize / detokenize ---- */

static cJSON *int_array(const int32_t *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    return a;
}

cJSON *api_tokenize(const api_ctx *cx, cJSON *body, api_err *e) {
    cJSON *text = field(body, "text");
    const char *param = "text";
    if (!text) text = field(body, "prompt"), param = "prompt";
    char *owned = NULL;
    if (!text && field(body, "messages")) {
        if (!(owned = chat_text(body, e))) return NULL;
    } else if (!text) {
        api_seterr(e, 400, "text", "give 'text' (or 'prompt', or chat 'messages')");
        return NULL;
    } else if (!cJSON_IsString(text)) {
        api_seterr(e, 400, param, "'%s' must be a string", param);
        return NULL;
    }
    int32_t *ids = NULL;
    int n = 0;
    int rc = encode(cx, owned ? owned : text->valuestring, &ids, &n, e);
    free(owned);
    if (rc) return NULL;
    cJSON *r = cJSON_CreateObject();
    cJSON_AddItemToObject(r, "tokens", int_array(ids, n));
    cJSON_AddNumberToObject(r, "count", n);
    cJSON_AddNumberToObject(r, "max_model_len", cx->max_ctx);
    free(ids);
    return r;
}

cJSON *api_detokenize(const api_ctx *cx, cJSON *body, api_err *e) {
    cJSON *t = field(body, "tokens");
    if (!t) {
        api_seterr(e, 400, "tokens", "'tokens' is required");
        return NULL;
    }
    if (!cJSON_IsArray(t)) {
        api_seterr(e, 400, "tokens", "'tokens' must be an array of token ids");
        return NULL;
    }
    int32_t *ids = NULL;
    int n = 0;
    if (get_ids(t, "tokens", cx->vocab, &ids, &n, e)) return NULL;
    /* as HF tokenizers' decode: ids the tokenizer does not know are dropped, specials kept */
    int k = 0;
    for (int i = 0; i < n; i++)
        if (tok_has_id(cx->tok, ids[i])) ids[k++] = ids[i];
    char *s = tok_decode(cx->tok, ids, (size_t)k, 0);
    free(ids);
    if (!s) {
        api_seterr(e, 500, NULL, "tokenizer: %s", dfl_errmsg());
        return NULL;
    }
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "text", s);
    cJSON_AddStringToObject(r, "prompt", s); /* vLLM's name for it */
    free(s);
    return r;
}

/* ---- responses ---- */

float api_logprobs_row(const float *row, int V, int32_t token, int k, int32_t *top_id, float *top_lp) {
    return (float)(row[token] - kn_logsoftmax_top(row, V, k, top_id, top_lp));
}

/* A token's text as the logprobs list it: the token decoded alone ("" for an id the tokenizer
 * does not know, as its decode drops those). */
static char *token_str(const api_ctx *cx, int32_t id) {
    if (!tok_has_id(cx->tok, id)) return strdup("");
    return tok_decode(cx->tok, &id, 1, 0);
}

/* Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}
 * over the output tokens, top_logprobs the k most probable. */
static cJSON *bytes_of(const char *s) {
    cJSON *a = cJSON_CreateArray();
    for (; *s; s++) cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)*s));
    return a;
}

static cJSON *chat_logprobs(const api_ctx *cx, const job *j) {
    cJSON *lo = cJSON_CreateObject(), *content = cJSON_AddArrayToObject(lo, "content");
    const size_t k = (size_t)j->logprobs;
    for (int i = 0; i < j->out.n; i++) {
        const size_t p = (size_t)j->n_prompt + (size_t)i;
        char *ts = token_str(cx, j->out.ids[i]);
        if (!ts) {
            cJSON_Delete(lo);
            return NULL;
        }
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "token", ts);
        cJSON_AddNumberToObject(x, "logprob", j->lp[p]);
        cJSON_AddItemToObject(x, "bytes", bytes_of(ts));
        free(ts);
        cJSON *tops = cJSON_AddArrayToObject(x, "top_logprobs");
        for (size_t a = 0; a < k; a++) {
            char *as = token_str(cx, j->top_id[p * k + a]);
            if (!as) continue;
            cJSON *t = cJSON_CreateObject();
            cJSON_AddStringToObject(t, "token", as);
            cJSON_AddNumberToObject(t, "logprob", j->top_lp[p * k + a]);
            cJSON_AddItemToObject(t, "bytes", bytes_of(as));
            cJSON_AddItemToArray(tops, t);
            free(as);
        }
        cJSON_AddItemToArray(content, x);
    }
    return lo;
}

static size_t utf8_chars(const char *s) {
    size_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* OpenAI completions logprobs: tokens, token_logprobs, top_logprobs, text_offset over the echoed
 * prompt tokens (the first has none: null) and the output tokens. text_offset counts characters
 * as vLLM does (each token's offset is the previous one's plus the length of its token string)
 * from 0, the start of the returned text. */
static cJSON *completion_logprobs(const api_ctx *cx, const job *j) {
    cJSON *lo = cJSON_CreateObject();
    cJSON *toks = cJSON_AddArrayToObject(lo, "tokens"), *lps = cJSON_AddArrayToObject(lo, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(lo, "top_logprobs"), *offs = cJSON_AddArrayToObject(lo, "text_offset");
    const int np = j->echo ? j->n_prompt : 0, k = j->logprobs;
    size_t off = 0;
    for (int q = 0; q < np + j->out.n; q++) {
        const int32_t id = q < np ? j->prompt[q] : j->out.ids[q - np];
        const size_t p = q < np ? (size_t)q : (size_t)j->n_prompt + (size_t)(q - np);
        char *ts = token_str(cx, id);
        if (!ts) {
            cJSON_Delete(lo);
            return NULL;
        }
        cJSON_AddItemToArray(toks, cJSON_CreateString(ts));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        off += utf8_chars(ts);
        if (isnan(j->lp[p])) {
            cJSON_AddItemToArray(lps, cJSON_CreateNull());
            cJSON_AddItemToArray(tops, cJSON_CreateNull());
            free(ts);
            continue;
        }
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(j->lp[p]));
        /* the k most probable, and the token itself when it is not among them (as OpenAI: up to
         * logprobs + 1 entries); token strings that repeat keep their first (most probable) entry */
        cJSON *t = cJSON_CreateObject();
        int have_self = 0;
        for (int i = 0; i < k; i++) {
            const int32_t a = j->top_id[p * (size_t)k + (size_t)i];
            have_self |= a == id;
            char *as = token_str(cx, a);
            if (as && !cJSON_GetObjectItemCaseSensitive(t, as))
                cJSON_AddNumberToObject(t, as, j->top_lp[p * (size_t)k + (size_t)i]);
            free(as);
        }
        if (!have_self && !cJSON_GetObjectItemCaseSensitive(t, ts)) cJSON_AddNumberToObject(t, ts, j->lp[p]);
        cJSON_AddItemToArray(tops, t);
        free(ts);
    }
    return lo;
}

static int eos_stop(const job *j) { return j->out.stop_at < 0 && j->out.n > 0 && strcmp(j->finish, "stop") == 0; }

/* OpenAI/vLLM stop_reason: the stop string, the eos id, or null */
static cJSON *stop_reason(const job *j) {
    if (j->out.stop_at >= 0) return cJSON_CreateString(j->stops[j->out.stop_idx]);
    if (eos_stop(j)) return cJSON_CreateNumber(j->out.ids[j->out.n - 1]);
    return cJSON_CreateNull();
}

static cJSON *usage(const job *j) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", j->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", j->out.n);
    cJSON_AddNumberToObject(u, "total_tokens", j->n_prompt + j->out.n);
    return u;
}

static cJSON *openai_head(const api_ctx *cx, const job *j, const char *object) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "id", j->id);
    cJSON_AddStringToObject(r, "object", object);
    cJSON_AddNumberToObject(r, "created", (double)j->created);
    cJSON_AddStringToObject(r, "model", cx->model_name);
    return r;
}

/* SGLang meta_info, with the speculative-decoding statistics of the request. */
static cJSON *meta_info(const job *j, int final) {
    const dfl_gen_stats *st = &j->st;
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", j->id);
    cJSON_AddNumberToObject(m, "prompt_tokens", j->n_prompt);
    cJSON_AddNumberToObject(m, "completion_tokens", j->out.n);
    if (!final) {
        cJSON_AddNullToObject(m, "finish_reason");
        return m;
    }
    cJSON *f = cJSON_AddObjectToObject(m, "finish_reason");
    cJSON_AddStringToObject(f, "type", j->finish);
    if (strcmp(j->finish, "length") == 0) cJSON_AddNumberToObject(f, "length", j->out.n);
    else cJSON_AddItemToObject(f, "matched", stop_reason(j));
    cJSON_AddNumberToObject(m, "spec_verify_ct", st->rounds);
    cJSON_AddNumberToObject(m, "spec_accept_length", spec_tau(st));
    cJSON_AddNumberToObject(m, "spec_tau_accept", spec_tau_accept(st));
    cJSON_AddNumberToObject(m, "spec_block_size", st->max_block > 1 ? st->max_block : 0);
    cJSON_AddNumberToObject(m, "spec_draft_tokens", (double)st->drafted);
    cJSON_AddNumberToObject(m, "spec_accepted_tokens", (double)st->accepted);
    cJSON *rate = cJSON_AddArrayToObject(m, "spec_accept_rate_per_pos");
    for (int k = 1; k < st->max_block; k++) /* null: never proposed (a tree shallower than the block) */
        cJSON_AddItemToArray(rate, st->pos_drafted[k]
                                       ? cJSON_CreateNumber((double)st->pos_accepted[k] / st->pos_drafted[k])
                                       : cJSON_CreateNull());
    cJSON *hist = cJSON_AddArrayToObject(m, "spec_accept_histogram");
    for (int a = 0; a < st->max_block && st->max_block > 1; a++)
        cJSON_AddItemToArray(hist, cJSON_CreateNumber((double)st->accept_hist[a]));
    cJSON *lens = cJSON_AddArrayToObject(m, "spec_accept_lengths");
    for (int r = 0; r < j->n_rounds; r++) cJSON_AddItemToArray(lens, cJSON_CreateNumber(j->acc_len[r]));
    char seed[24]; /* raw: cJSON would print large integers in exponent form */
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)j->seed);
    cJSON_AddRawToObject(m, "seed", seed);
    cJSON_AddNumberToObject(m, "e2e_latency", j->t_done - j->t_start);
    return m;
}

/* The prompt's text for echo (malloc'd): the request's string, or its ids decoded. */
static char *echo_prefix(const api_ctx *cx, const job *j) {
    if (j->echo_text) return strdup(j->echo_text);
    int32_t *ids = malloc((size_t)j->n_prompt * sizeof *ids);
    if (!ids) return NULL;
    int k = 0;
    for (int i = 0; i < j->n_prompt; i++)
        if (tok_has_id(cx->tok, j->prompt[i])) ids[k++] = j->prompt[i];
    char *s = tok_decode(cx->tok, ids, (size_t)k, 0);
    free(ids);
    return s;
}

/* One OpenAI choice (index j->index): text (the echoed prompt first), logprobs, ids, finish. NULL
 * when out of memory. */
static cJSON *openai_choice(const api_ctx *cx, const job *j) {
    char *text = textout_final(&j->out);
    if (!text) return NULL;
    if (j->ep == EP_COMPLETIONS && j->echo) {
        char *pre = echo_prefix(cx, j);
        const size_t a = pre ? strlen(pre) : 0, b = strlen(text);
        char *both = pre ? malloc(a + b + 1) : NULL;
        if (!both) {
            free(pre), free(text);
            return NULL;
        }
        memcpy(both, pre, a);
        memcpy(both + a, text, b + 1);
        free(text), free(pre);
        text = both;
    }
    const int chat = j->ep == EP_CHAT;
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", j->index);
    if (chat) {
        cJSON *msg = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        cJSON_AddStringToObject(msg, "content", text);
        cJSON *lo = j->logprobs >= 0 ? chat_logprobs(cx, j) : NULL;
        if (lo) cJSON_AddItemToObject(c, "logprobs", lo);
        else cJSON_AddNullToObject(c, "logprobs");
    } else {
        cJSON_AddStringToObject(c, "text", text);
        cJSON *lo = j->logprobs >= 0 ? completion_logprobs(cx, j) : NULL;
        if (lo) cJSON_AddItemToObject(c, "logprobs", lo);
        else cJSON_AddNullToObject(c, "logprobs");
    }
    cJSON_AddItemToObject(c, "token_ids", int_array(j->out.ids, j->out.n));
    cJSON_AddStringToObject(c, "finish_reason", j->finish);
    cJSON_AddItemToObject(c, "stop_reason", stop_reason(j));
    free(text);
    return c;
}

cJSON *api_response(const api_ctx *cx, const job *j) {
    if (j->ep == EP_GENERATE) {
        char *text = textout_final(&j->out);
        if (!text) return NULL;
        cJSON *r = cJSON_CreateObject();
        cJSON_AddStringToObject(r, "text", text);
        cJSON_AddItemToObject(r, "output_ids", int_array(j->out.ids, j->out.n));
        cJSON_AddItemToObject(r, "meta_info", meta_info(j, 1));
        free(text);
        return r;
    }
    cJSON *r = openai_head(cx, j, j->ep == EP_CHAT ? "chat.completion" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(r, "choices");
    /* a list of prompts: one choice per prompt, in order; usage sums them */
    const int n = j->n_sub ? j->n_sub : 1;
    int prompt_tokens = 0, completion_tokens = 0;
    for (int i = 0; i < n; i++) {
        const job *c = j->n_sub ? j->sub[i] : j;
        cJSON *ch = openai_choice(cx, c);
        if (!ch) {
            cJSON_Delete(r);
            return NULL;
        }
        cJSON_AddItemToArray(choices, ch);
        prompt_tokens += c->n_prompt, completion_tokens += c->out.n;
    }
    cJSON *u = cJSON_AddObjectToObject(r, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", prompt_tokens + completion_tokens);
    return r;
}

/* "data: {json}\n\n" appended to *acc (malloc'd, grown); consumes o. */
static char *sse_add(char *acc, cJSON *o) {
    char *js = o ? cJSON_PrintUnformatted(o) : strdup("[DONE]");
    cJSON_Delete(o);
    if (!js) return acc;
    const size_t old = acc ? strlen(acc) : 0, n = strlen(js);
    char *r = realloc(acc, old + n + 9);
    if (r) snprintf(r + old, n + 9, "data: %s\n\n", js);
    free(js);
    return r ? r : acc;
}

/* One OpenAI chunk: text delta, token ids, finish_reason (NULL while streaming). */
static cJSON *openai_chunk(const api_ctx *cx, const job *j, const char *delta, int ids_from, int ids_to,
                           const char *finish, int role) {
    const int chat = j->ep == EP_CHAT;
    cJSON *r = openai_head(cx, j, chat ? "chat.completion.chunk" : "text_completion");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", 0);
    if (chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (role) cJSON_AddStringToObject(d, "role", "assistant");
        cJSON_AddStringToObject(d, "content", delta);
    } else {
        cJSON_AddStringToObject(c, "text", delta);
        cJSON_AddNullToObject(c, "logprobs");
    }
    cJSON_AddItemToObject(c, "token_ids", int_array(j->out.ids + ids_from, ids_to - ids_from));
    if (finish) {
        cJSON_AddStringToObject(c, "finish_reason", finish);
        cJSON_AddItemToObject(c, "stop_reason", stop_reason(j));
    } else {
        cJSON_AddNullToObject(c, "finish_reason");
    }
    cJSON_AddItemToArray(cJSON_AddArrayToObject(r, "choices"), c);
    return r;
}

/* SGLang streams the cumulative text and ids in every chunk. */
static cJSON *generate_chunk(const job *j, const char *text, int final) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "text", text);
    cJSON_AddItemToObject(r, "output_ids", int_array(j->out.ids, j->out.n));
    cJSON_AddItemToObject(r, "meta_info", meta_info(j, final));
    return r;
}

char *api_stream_start(const api_ctx *cx, const job *j) {
    if (j->ep != EP_CHAT) return NULL;
    return sse_add(NULL, openai_chunk(cx, j, "", 0, 0, NULL, 1));
}

char *api_stream_chunk(const api_ctx *cx, const job *j, int ids_from, size_t text_from, size_t text_to) {
    if (ids_from == j->out.n && text_to <= text_from) return NULL;
    if (j->ep == EP_GENERATE) {
        char *text = strndup(j->out.text ? j->out.text : "", text_to);
        char *r = text ? sse_add(NULL, generate_chunk(j, text, 0)) : NULL;
        free(text);
        return r;
    }
    char *delta = strndup(j->out.text ? j->out.text + text_from : "", text_to - text_from);
    char *r = delta ? sse_add(NULL, openai_chunk(cx, j, delta, ids_from, j->out.n, NULL, 0)) : NULL;
    free(delta);
    return r;
}

char *api_stream_end(const api_ctx *cx, const job *j, int ids_from, size_t text_from) {
    char *text = textout_final(&j->out);
    if (!text) return NULL;
    char *r;
    if (j->ep == EP_GENERATE) {
        r = sse_add(NULL, generate_chunk(j, text, 1));
    } else {
        const size_t len = strlen(text);
        r = sse_add(NULL,
                    openai_chunk(cx, j, text + (text_from < len ? text_from : len), ids_from, j->out.n, j->finish, 0));
        if (j->include_usage) {
            cJSON *u = openai_head(cx, j, j->ep == EP_CHAT ? "chat.completion.chunk" : "text_completion");
            cJSON_AddArrayToObject(u, "choices");
            cJSON_AddItemToObject(u, "usage", usage(j));
            r = sse_add(r, u);
        }
    }
    free(text);
    return sse_add(r, NULL);
}

char *api_stream_error(const job *j) {
    api_err e;
    api_seterr(&e, j->err_status ? j->err_status : 500, NULL, "%s", j->err_msg);
    char *body = api_error_body(&e);
    if (!body) return NULL;
    const size_t n = strlen(body) + 32;
    char *r = malloc(n);
    if (r) snprintf(r, n, "data: %s\n\ndata: [DONE]\n\n", body);
    free(body);
    return r;
}
