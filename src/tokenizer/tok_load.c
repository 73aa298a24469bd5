/* Loading a Hugging Face tokenizer.json (byte-level BPE). Every component the encoder and
 * decoder implement is validated; anything else is rejected with the field and the value found,
 * so a tokenizer that would silently encode differently from HF never loads. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "dfl/common.h"
#include "tokenizer/tok_internal.h"

/* What ByteLevel(use_regex = true) splits with (GPT-2's pattern). */
static const char gpt2_pattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

#define TOK_MAX_ID (1 << 24) /* bounds the id tables a malformed file can make us allocate */

static const char *type_name(const cJSON *o) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

static int expect_type(const cJSON *o, const char *field) {
    char b[96];
    if (!cJSON_IsObject(o))
        return dfl_seterr("%s: expected an object, found %s", field, dfl_json_brief(o, b, sizeof b));
    if (!type_name(o))
        return dfl_seterr("%s.type: expected a string, found %s", field,
                          dfl_json_brief(cJSON_GetObjectItemCaseSensitive(o, "type"), b, sizeof b));
    return DFL_OK;
}

/* Boolean field with a default; DFL_ERR if present but not a boolean. */
static int get_bool(const cJSON *o, const char *key, int dflt, int *out, const char *field) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    char b[96];
    if (!v || cJSON_IsNull(v)) *out = dflt;
    else if (cJSON_IsBool(v)) *out = cJSON_IsTrue(v);
    else return dfl_seterr("%s.%s: expected true or false, found %s", field, key, dfl_json_brief(v, b, sizeof b));
    return DFL_OK;
}

static int require_bool(const cJSON *o, const char *key, int dflt, int want, const char *field) {
    int v;
    if (get_bool(o, key, dflt, &v, field)) return DFL_ERR;
    if (v != want)
        return dfl_seterr("%s.%s: %s is not supported (only %s)", field, key, v ? "true" : "false",
                          want ? "true" : "false");
    return DFL_OK;
}

static int parse_id(const cJSON *v, int32_t *out, const char *field, const char *what) {
    char b[96];
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble < TOK_MAX_ID) ||
        v->valuedouble != (double)(int32_t)v->valuedouble)
        return dfl_seterr("%s: %s: expected an integer id in [0, %d), found %s", field, what, TOK_MAX_ID,
                          dfl_json_brief(v, b, sizeof b));
    *out = (int32_t)v->valuedouble;
    return DFL_OK;
}

static int parse_normalizer(dfl_tokenizer *tok, const cJSON *n, const char *field) {
    if (!n || cJSON_IsNull(n)) return DFL_OK;
    if (expect_type(n, field)) return DFL_ERR;
    const char *t = type_name(n);
    if (strcmp(t, "NFC") == 0) {
        tok->nfc = 1;
        return DFL_OK;
    }
    if (strcmp(t, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        if (!cJSON_IsArray(list)) return dfl_seterr("%s.normalizers: expected an array", field);
        char sub[64];
        int i = 0;
        for (const cJSON *c = list->child; c; c = c->next, i++) {
            snprintf(sub, sizeof sub, "%s.normalizers[%d]", field, i);
            if (expect_type(c, sub)) return DFL_ERR;
            if (strcmp(type_name(c), "NFC") != 0)
                return dfl_seterr("%s.type: unsupported \"%s\" (supported: NFC)", sub, type_name(c));
            tok->nfc = 1;
        }
        return DFL_OK;
    }
    return dfl_seterr("%s.type: unsupported \"%s\" (supported: NFC, Sequence of NFC, null)", field, t);
}

/* HF tokenizers runs its Split regexes with Oniguruma, whose \s is exactly Unicode White_Space.
 * PCRE2's \s under UCP differs (it lacks U+0085 and has U+180E), so \s and \S are spelled out. */
#define WHITE_SPACE \
    "\\t-\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"

static char *onig_compat(const char *p, const char *field) {
    size_t n = strlen(p);
    char *out = malloc(sizeof "[^" WHITE_SPACE "]" * n + 1), *o = out;
    if (!out) {
        dfl_seterr("out of memory");
        return NULL;
    }
    int in_class = 0;
    for (size_t i = 0; i < n;) {
        if (p[i] == '\\' && i + 1 < n) {
            const char *rep = NULL;
            if (p[i + 1] == 's') rep = in_class ? WHITE_SPACE : "[" WHITE_SPACE "]";
            else if (p[i + 1] == 'S') {
                if (in_class) {
                    free(out);
                    dfl_seterr("%s: \\S inside a character class is not supported", field);
                    return NULL;
                }
                rep = "[^" WHITE_SPACE "]";
            }
            if (rep) {
                o = stpcpy(o, rep);
            } else {
                *o++ = p[i];
                *o++ = p[i + 1];
            }
            i += 2;
        } else if (!in_class && p[i] == '[') {
            in_class = 1;
            *o++ = p[i++];
            if (i < n && p[i] == '^') *o++ = p[i++];
            if (i < n && p[i] == ']') *o++ = p[i++]; /* a leading ] is literal */
        } else if (in_class && p[i] == '[' && i + 1 < n && p[i + 1] == ':') {
            const char *end = strstr(p + i, ":]"); /* POSIX class [:alpha:] */
            size_t k = end ? (size_t)(end - (p + i)) + 2 : n - i;
            memcpy(o, p + i, k);
            o += k;
            i += k;
        } else {
            if (in_class && p[i] == ']') in_class = 0;
            *o++ = p[i++];
        }
    }
    *o = 0;
    return out;
}

static int add_split(dfl_tokenizer *tok, const char *pattern, int literal, const char *field) {
    char *pat = literal ? strdup(pattern) : onig_compat(pattern, field);
    if (!pat) return literal ? dfl_seterr("out of memory") : DFL_ERR;
    int err;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0), &err, &off, NULL);
    free(pat);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return dfl_seterr("%s: cannot compile regex \"%s\": %s", field, pattern, (const char *)msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* without JIT, pcre2_match interprets: same result */
    pcre2_code **s = realloc(tok->splits, (size_t)(tok->n_splits + 1) * sizeof *s);
    if (!s) {
        pcre2_code_free(re);
        return dfl_seterr("out of memory");
    }
    tok->splits = s;
    tok->splits[tok->n_splits++] = re;
    return DFL_OK;
}

static int parse_split(dfl_tokenizer *tok, const cJSON *p, const char *field) {
    char b[96], sub[96];
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    const cJSON *str = cJSON_GetObjectItemCaseSensitive(pat, "String");
    if (!cJSON_IsString(re) && !cJSON_IsString(str))
        return dfl_seterr("%s.pattern: expected {\"Regex\": ...} or {\"String\": ...}, found %s", field,
                          dfl_json_brief(pat, b, sizeof b));
    const cJSON *beh = cJSON_GetObjectItemCaseSensitive(p, "behavior");
    if (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated") != 0)
        return dfl_seterr("%s.behavior: unsupported %s (only \"Isolated\")", field, dfl_json_brief(beh, b, sizeof b));
    if (require_bool(p, "invert", 0, 0, field)) return DFL_ERR;
    snprintf(sub, sizeof sub, "%s.pattern", field);
    return add_split(tok, cJSON_IsString(re) ? re->valuestring : str->valuestring, !cJSON_IsString(re), sub);
}

static int parse_bytelevel(dfl_tokenizer *tok, const cJSON *p, const char *field) {
    int use_regex;
    /* HF's defaults for a missing add_prefix_space / use_regex are true. */
    if (require_bool(p, "add_prefix_space", 1, 0, field)) return DFL_ERR;
    if (get_bool(p, "use_regex", 1, &use_regex, field)) return DFL_ERR;
    return use_regex ? add_split(tok, gpt2_pattern, 0, field) : DFL_OK;
}

/* Supported: ByteLevel, or a Sequence of Split(Isolated) ... ending with ByteLevel. */
static int parse_pre_tokenizer(dfl_tokenizer *tok, const cJSON *p, const char *field) {
    char b[96], sub[64];
    if (!p || cJSON_IsNull(p)) return dfl_seterr("%s: null is not supported (byte-level BPE needs ByteLevel)", field);
    if (expect_type(p, field)) return DFL_ERR;
    const char *t = type_name(p);
    if (strcmp(t, "ByteLevel") == 0) return parse_bytelevel(tok, p, field);
    if (strcmp(t, "Sequence") != 0)
        return dfl_seterr("%s.type: unsupported \"%s\" (supported: ByteLevel, Sequence of Split + ByteLevel)", field,
                          t);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
    if (!cJSON_IsArray(list) || !list->child)
        return dfl_seterr("%s.pretokenizers: expected a non-empty array, found %s", field,
                          dfl_json_brief(list, b, sizeof b));
    int i = 0;
    for (const cJSON *c = list->child; c; c = c->next, i++) {
        snprintf(sub, sizeof sub, "%s.pretokenizers[%d]", field, i);
        if (expect_type(c, sub)) return DFL_ERR;
        const char *ct = type_name(c);
        if (strcmp(ct, "ByteLevel") == 0 && !c->next) return parse_bytelevel(tok, c, sub);
        if (strcmp(ct, "Split") != 0)
            return dfl_seterr("%s.type: unsupported \"%s\" here (expected Split ... then a final ByteLevel)", sub, ct);
        if (parse_split(tok, c, sub)) return DFL_ERR;
    }
    return dfl_seterr("%s.pretokenizers: the last one must be ByteLevel", field);
}

/* Components that only change offsets or batch layout are accepted; others would change ids. */
static int parse_misc(const cJSON *root) {
    char b[96];
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(root, "post_processor");
    if (pp && !cJSON_IsNull(pp)) {
        if (expect_type(pp, "post_processor")) return DFL_ERR;
        if (strcmp(type_name(pp), "ByteLevel") != 0)
            return dfl_seterr("post_processor.type: unsupported \"%s\" (supported: ByteLevel, null)", type_name(pp));
    }
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    if (!dec || cJSON_IsNull(dec)) return dfl_seterr("decoder: null is not supported (expected ByteLevel)");
    if (expect_type(dec, "decoder")) return DFL_ERR;
    if (strcmp(type_name(dec), "ByteLevel") != 0)
        return dfl_seterr("decoder.type: unsupported \"%s\" (supported: ByteLevel)", type_name(dec));
    const cJSON *tr = cJSON_GetObjectItemCaseSensitive(root, "truncation");
    if (tr && !cJSON_IsNull(tr))
        return dfl_seterr("truncation: %s is not supported (only null)", dfl_json_brief(tr, b, sizeof b));
    return DFL_OK;
}

static int parse_vocab(dfl_tokenizer *tok, const cJSON *vocab) {
    char b[96];
    if (!cJSON_IsObject(vocab))
        return dfl_seterr("model.vocab: expected an object, found %s", dfl_json_brief(vocab, b, sizeof b));
    size_t n = 0;
    int32_t max_id = -1;
    for (const cJSON *c = vocab->child; c; c = c->next, n++) {
        int32_t id;
        if (parse_id(c, &id, "model.vocab", c->string)) return DFL_ERR;
        if (id > max_id) max_id = id;
    }
    tok->n_ids = max_id + 1;
    tok->id_tok = calloc((size_t)tok->n_ids + 1, sizeof *tok->id_tok);
    if (!tok->id_tok || tok_strmap_init(&tok->vocab, n)) return dfl_seterr("out of memory (vocab of %zu)", n);
    for (const cJSON *c = vocab->child; c; c = c->next) {
        int32_t id = (int32_t)c->valuedouble;
        if (tok->id_tok[id])
            return dfl_seterr("model.vocab: id %d is given to both \"%s\" and \"%s\"", id, tok->id_tok[id], c->string);
        if (!(tok->id_tok[id] = strdup(c->string))) return dfl_seterr("out of memory");
        tok_strmap_put(&tok->vocab, tok->id_tok[id], strlen(c->string), id);
    }
    return DFL_OK;
}

static int vocab_id(const dfl_tokenizer *tok, const char *s, size_t len, int i, const char *what) {
    int32_t id = tok_strmap_get(&tok->vocab, s, len);
    if (id < 0) return dfl_seterr("model.merges[%d]: %s \"%.*s\" is not in the vocabulary", i, what, (int)len, s);
    return id;
}

/* Merges come as ["a", "b"] pairs or as legacy "a b" strings; rank = position in the list. */
static int parse_merges(dfl_tokenizer *tok, const cJSON *merges) {
    char b[96];
    if (!cJSON_IsArray(merges))
        return dfl_seterr("model.merges: expected an array, found %s", dfl_json_brief(merges, b, sizeof b));
    int n = cJSON_GetArraySize(merges);
    if (tok_pairmap_init(&tok->merges, (size_t)n)) return DFL_ERR;
    char *cat = NULL;
    size_t cat_cap = 0;
    int i = 0, rc = DFL_OK;
    for (const cJSON *c = merges->child; c; c = c->next, i++) {
        const char *l, *r;
        size_t ll, rl;
        if (cJSON_IsArray(c) && cJSON_GetArraySize(c) == 2 && cJSON_IsString(c->child) &&
            cJSON_IsString(c->child->next)) {
            l = c->child->valuestring;
            r = c->child->next->valuestring;
            ll = strlen(l);
            rl = strlen(r);
        } else if (cJSON_IsString(c) && strchr(c->valuestring, ' ') && !strchr(strchr(c->valuestring, ' ') + 1, ' ')) {
            l = c->valuestring;
            r = strchr(l, ' ') + 1;
            ll = (size_t)(r - 1 - l);
            rl = strlen(r);
        } else {
            rc = dfl_seterr("model.merges[%d]: expected [\"a\", \"b\"] or \"a b\", found %s", i,
                            dfl_json_brief(c, b, sizeof b));
            break;
        }
        if (ll + rl + 1 > cat_cap) {
            cat_cap = 2 * (ll + rl + 1);
            char *nc = realloc(cat, cat_cap);
            if (!nc) {
                rc = dfl_seterr("out of memory");
                break;
            }
            cat = nc;
        }
        memcpy(cat, l, ll);
        memcpy(cat + ll, r, rl);
        int32_t a, bb, m;
        if ((a = vocab_id(tok, l, ll, i, "left part")) < 0 || (bb = vocab_id(tok, r, rl, i, "right part")) < 0 ||
            (m = vocab_id(tok, cat, ll + rl, i, "merged token")) < 0) {
            rc = DFL_ERR;
            break;
        }
        tok_pairmap_put(&tok->merges, a, bb, i, m); /* a repeated pair keeps its last rank, as in HF */
    }
    free(cat);
    return rc;
}

static int parse_model(dfl_tokenizer *tok, const cJSON *m) {
    char b[96];
    if (!m) return dfl_seterr("model: missing");
    if (expect_type(m, "model")) return DFL_ERR;
    if (strcmp(type_name(m), "BPE") != 0)
        return dfl_seterr("model.type: unsupported \"%s\" (supported: BPE)", type_name(m));
    const cJSON *drop = cJSON_GetObjectItemCaseSensitive(m, "dropout");
    if (drop && !cJSON_IsNull(drop) && !(cJSON_IsNumber(drop) && drop->valuedouble == 0))
        return dfl_seterr("model.dropout: %s is not supported (only null)", dfl_json_brief(drop, b, sizeof b));
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, affixes[i]);
        if (v && !cJSON_IsNull(v) && !(cJSON_IsString(v) && !v->valuestring[0]))
            return dfl_seterr("model.%s: %s is not supported (only null or \"\")", affixes[i],
                              dfl_json_brief(v, b, sizeof b));
    }
    if (require_bool(m, "byte_fallback", 0, 0, "model")) return DFL_ERR;
    if (get_bool(m, "fuse_unk", 0, &tok->fuse_unk, "model")) return DFL_ERR;
    if (get_bool(m, "ignore_merges", 0, &tok->ignore_merges, "model")) return DFL_ERR;
    if (parse_vocab(tok, cJSON_GetObjectItemCaseSensitive(m, "vocab"))) return DFL_ERR;
    if (parse_merges(tok, cJSON_GetObjectItemCaseSensitive(m, "merges"))) return DFL_ERR;
    tok->unk_id = -1;
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(m, "unk_token");
    if (cJSON_IsString(unk)) {
        tok->unk_id = tok_strmap_get(&tok->vocab, unk->valuestring, strlen(unk->valuestring));
        if (tok->unk_id < 0) return dfl_seterr("model.unk_token: \"%s\" is not in the vocabulary", unk->valuestring);
    } else if (unk && !cJSON_IsNull(unk)) {
        return dfl_seterr("model.unk_token: expected a string or null, found %s", dfl_json_brief(unk, b, sizeof b));
    }
    return DFL_OK;
}

static char *nfc(const char *s, size_t len, size_t *out_len) {
    utf8proc_uint8_t *out = NULL;
    utf8proc_ssize_t n =
        utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &out, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (n < 0) {
        dfl_seterr("NFC: %s", utf8proc_errmsg(n));
        return NULL;
    }
    *out_len = (size_t)n;
    return (char *)out;
}

static int parse_added(dfl_tokenizer *tok, const cJSON *list) {
    char b[96], field[48];
    if (!list || cJSON_IsNull(list)) return DFL_OK;
    if (!cJSON_IsArray(list))
        return dfl_seterr("added_tokens: expected an array, found %s", dfl_json_brief(list, b, sizeof b));
    int n = cJSON_GetArraySize(list);
    tok->added = calloc((size_t)n + 1, sizeof *tok->added);
    if (!tok->added || tok_strmap_init(&tok->added_ids, (size_t)n)) return dfl_seterr("out of memory");
    int i = 0;
    for (const cJSON *c = list->child; c; c = c->next, i++) {
        struct tok_added *a = &tok->added[i];
        snprintf(field, sizeof field, "added_tokens[%d]", i);
        if (!cJSON_IsObject(c))
            return dfl_seterr("%s: expected an object, found %s", field, dfl_json_brief(c, b, sizeof b));
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(c, "content");
        if (!cJSON_IsString(content) || !content->valuestring[0])
            return dfl_seterr("%s.content: expected a non-empty string, found %s", field,
                              dfl_json_brief(content, b, sizeof b));
        if (parse_id(cJSON_GetObjectItemCaseSensitive(c, "id"), &a->id, field, "id")) return DFL_ERR;
        if (!(a->content = strdup(content->valuestring))) return dfl_seterr("out of memory");
        a->len = strlen(a->content);
        tok->n_added = i + 1;
        static const char *const unsupported[] = {"lstrip", "rstrip", "single_word"};
        for (int k = 0; k < 3; k++)
            if (require_bool(c, unsupported[k], 0, 0, field)) return DFL_ERR;
        if (get_bool(c, "special", 0, &a->special, field) || get_bool(c, "normalized", 1, &a->normalized, field))
            return DFL_ERR;
        tok_strmap_put(&tok->added_ids, a->content, a->len, a->id);
        a->match = a->content;
        a->match_len = a->len;
        /* normalized tokens are looked for in normalized text, so they are normalized too */
        if (a->normalized && tok->nfc && !(a->match = nfc(a->content, a->len, &a->match_len))) return DFL_ERR;
    }
    return DFL_OK;
}

static int cmp_added(const void *x, const void *y) {
    const struct tok_added *a = *(const struct tok_added *const *)x, *b = *(const struct tok_added *const *)y;
    unsigned char fa = (unsigned char)a->match[0], fb = (unsigned char)b->match[0];
    if (fa != fb) return fa < fb ? -1 : 1;
    if (a->match_len != b->match_len) return a->match_len > b->match_len ? -1 : 1;
    return a < b ? -1 : a > b;
}

static int build_matcher(dfl_tokenizer *tok, struct tok_matcher *m, int normalized) {
    m->toks = malloc(((size_t)tok->n_added + 1) * sizeof *m->toks);
    if (!m->toks) return dfl_seterr("out of memory");
    int32_t n = 0;
    for (int32_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].normalized == normalized) m->toks[n++] = &tok->added[i];
    qsort(m->toks, (size_t)n, sizeof *m->toks, cmp_added);
    int32_t k = 0;
    for (int c = 0; c < 256; c++) {
        m->start[c] = k;
        while (k < n && (unsigned char)m->toks[k]->match[0] == c) k++;
    }
    m->start[256] = n;
    return DFL_OK;
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes
 * for U+0100.. in byte order. */
static void init_bytelevel(dfl_tokenizer *tok) {
    uint32_t next = 256;
    memset(tok->cp_byte, 0xff, sizeof tok->cp_byte);
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
        uint32_t cp = printable ? (uint32_t)b : next++;
        char s[4];
        tok->byte_cp[b] = cp;
        tok->cp_byte[cp] = (int16_t)b;
        tok->byte_id[b] = tok_strmap_get(&tok->vocab, s, (size_t)tok_utf8_put(s, cp));
    }
}

static int index_ids(dfl_tokenizer *tok) {
    int32_t n = tok->n_ids;
    for (int32_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].id >= n) n = tok->added[i].id + 1;
    char **t = realloc(tok->id_tok, ((size_t)n + 1) * sizeof *t);
    if (!t) return dfl_seterr("out of memory");
    tok->id_tok = t;
    memset(t + tok->n_ids, 0, (size_t)(n - tok->n_ids) * sizeof *t);
    tok->n_ids = n;
    if (!(tok->id_added = malloc(((size_t)n + 1) * sizeof *tok->id_added))) return dfl_seterr("out of memory");
    memset(tok->id_added, 0xff, ((size_t)n + 1) * sizeof *tok->id_added);
    for (int32_t i = 0; i < tok->n_added; i++) tok->id_added[tok->added[i].id] = i;
    return DFL_OK;
}

static int load_json(dfl_tokenizer *tok, const cJSON *root) {
    if (!cJSON_IsObject(root)) return dfl_seterr("expected a JSON object at the top level");
    if (parse_normalizer(tok, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), "normalizer") ||
        parse_pre_tokenizer(tok, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), "pre_tokenizer") ||
        parse_misc(root) || parse_model(tok, cJSON_GetObjectItemCaseSensitive(root, "model")) ||
        parse_added(tok, cJSON_GetObjectItemCaseSensitive(root, "added_tokens")) || index_ids(tok) ||
        build_matcher(tok, &tok->raw_match, 0) || build_matcher(tok, &tok->norm_match, 1))
        return DFL_ERR;
    init_bytelevel(tok);
    if (!(tok->cache = tok_cache_new())) return DFL_ERR;
    return DFL_OK;
}

int tok_locate(const char *given, const char *model_dir, const char *what) {
    const char *dir = given ? given : model_dir;
    char *file = dfl_is_dir(dir) ? dfl_path_join(dir, "tokenizer.json") : strdup(dir);
    const int ok = file && dfl_is_file(file);
    free(file);
    if (ok) return DFL_OK;
    if (given)
        return dfl_seterr("--tokenizer %s: no tokenizer.json there (give a tokenizer.json file, or a directory holding "
                          "one)",
                          given);
    return dfl_seterr(
        "%s a tokenizer: no tokenizer.json in %s (give --tokenizer PATH: a tokenizer.json, or a directory "
        "holding one, such as the original checkpoint's)",
        what, model_dir);
}

dfl_tokenizer *tok_open(const char *path) {
    char *file = dfl_is_dir(path) ? dfl_path_join(path, "tokenizer.json") : strdup(path);
    if (!file) {
        dfl_seterr("out of memory");
        return NULL;
    }
    size_t len;
    char *text = dfl_read_file(file, &len);
    if (!text) {
        free(file);
        return NULL;
    }
    cJSON *root = cJSON_ParseWithLength(text, len);
    dfl_tokenizer *tok = calloc(1, sizeof *tok);
    int rc;
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        rc = dfl_seterr("invalid JSON near byte %td", at ? at - text : (ptrdiff_t)0);
    } else if (!tok) {
        rc = dfl_seterr("out of memory");
    } else {
        rc = load_json(tok, root);
    }
    if (rc) {
        dfl_preperr("%s", file);
        tok_close(tok);
        tok = NULL;
    }
    cJSON_Delete(root);
    free(text);
    free(file);
    return tok;
}

void tok_close(dfl_tokenizer *tok) {
    if (!tok) return;
    if (tok->id_tok)
        for (int32_t i = 0; i < tok->n_ids; i++) free(tok->id_tok[i]);
    free(tok->id_tok);
    free(tok->id_added);
    tok_strmap_free(&tok->vocab);
    tok_strmap_free(&tok->added_ids);
    tok_pairmap_free(&tok->merges);
    for (int32_t i = 0; i < tok->n_added; i++) {
        if (tok->added[i].match != tok->added[i].content) free(tok->added[i].match);
        free(tok->added[i].content);
    }
    free(tok->added);
    free(tok->raw_match.toks);
    free(tok->norm_match.toks);
    for (int i = 0; i < tok->n_splits; i++) pcre2_code_free(tok->splits[i]);
    free(tok->splits);
    tok_cache_free(tok->cache);
    free(tok);
}
