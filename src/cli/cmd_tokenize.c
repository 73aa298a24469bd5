/* dfl tokenize: encode text to ids or decode ids to text with a tokenizer.json. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "dfl/common.h"
#include "dfl/tokenizer.h"

#define CMD "tokenize"

static void usage(FILE *f) {
    fprintf(f, "usage: dfl tokenize --tokenizer PATH [--text STR] [--json] [--lines]\n"
               "       dfl tokenize --tokenizer PATH --decode [--text IDS] [--skip-special] [--json] [--lines]\n"
               "\n"
               "Encode text (--text, or all of stdin) and print the ids, space separated.\n"
               "Invalid UTF-8 input is encoded as if each invalid sequence were U+FFFD.\n"
               "\n"
               "  --tokenizer PATH  tokenizer.json, or a model directory holding one\n"
               "  --text STR        the input, instead of stdin\n"
               "  --json            print a JSON array of ids (with --decode: a JSON string)\n"
               "  --decode          read ids (whitespace/comma separated, or a JSON array); print the text and\n"
               "                    a newline. Bytes that are not valid UTF-8 (a cut character) print as U+FFFD\n"
               "  --skip-special    with --decode: drop special added tokens (e.g. <|im_end|>)\n"
               "  --lines           batch mode: every stdin line is a JSON string (with --decode: a list\n"
               "                    of ids); prints one JSON array (with --decode: a JSON string) per line\n");
}

static char *read_stdin(size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, stdin);
        if (n < cap - 1) break;
        char *nb = realloc(buf, cap *= 2);
        if (!nb) free(buf);
        buf = nb;
    }
    if (!buf) {
        fprintf(stderr, "dfl " CMD ": out of memory reading stdin\n");
        return NULL;
    }
    if (ferror(stdin)) {
        fprintf(stderr, "dfl " CMD ": reading stdin: %s\n", strerror(errno));
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

/* Ids separated by whitespace and/or commas, optionally inside [ ]. Prints the error (prefixed
 * by `where`) and returns DFL_ERR on bad input. */
static int parse_ids(const char *s, int32_t vocab, const char *where, int32_t **out, size_t *n_out) {
    size_t n = 0, cap = 64;
    int32_t *ids = malloc(cap * sizeof *ids);
    int bracket = 0, closed = 0;
    if (!ids) goto oom;
    while (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n') s++;
    if (*s == '[') {
        bracket = 1;
        s++;
    }
    for (;;) {
        while (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n' || *s == ',') s++;
        if (!*s) break;
        if (*s == ']' && bracket && !closed) {
            closed = 1;
            s++;
            continue;
        }
        char *end;
        errno = 0;
        long long v = closed ? 0 : strtoll(s, &end, 10);
        if (closed || end == s || errno) {
            fprintf(stderr, "dfl " CMD ": %sexpected an integer id, found '%.20s'\n", where, s);
            goto fail;
        }
        if (v < 0 || v >= vocab) {
            fprintf(stderr, "dfl " CMD ": %sid %lld is out of range [0, %d)\n", where, v, vocab);
            goto fail;
        }
        if (n == cap) {
            int32_t *p = realloc(ids, (cap *= 2) * sizeof *ids);
            if (!p) goto oom;
            ids = p;
        }
        ids[n++] = (int32_t)v;
        s = end;
    }
    if (bracket && !closed) {
        fprintf(stderr, "dfl " CMD ": %smissing ']'\n", where);
        goto fail;
    }
    *out = ids;
    *n_out = n;
    return DFL_OK;
oom:
    fprintf(stderr, "dfl " CMD ": out of memory\n");
fail:
    free(ids);
    return DFL_ERR;
}

static int hex4(const char *p, unsigned *v) {
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        unsigned d = c >= '0' && c <= '9'   ? (unsigned)(c - '0')
                     : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                     : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
                                            : 16u;
        if (d > 15) return -1;
        *v = *v << 4 | d;
    }
    return 0;
}

static size_t put_utf8(char *o, unsigned cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18);
    o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A JSON string literal (the whole line) into out, which has room for strlen(p) bytes: an
 * escape never decodes to more bytes than it takes. Our own parser rather than cJSON because
 * the text may contain \u0000. Lone surrogates become U+FFFD. Returns the length, or -1. */
static long json_unquote(const char *p, char *out) {
    size_t o = 0;
    while (*p == ' ' || *p == '\t' || *p == '\r') p++;
    if (*p++ != '"') return -1;
    for (;;) {
        char c = *p++;
        if (!c) return -1;
        if (c == '"') break;
        if (c != '\\') {
            out[o++] = c;
            continue;
        }
        unsigned cp, lo;
        switch (c = *p++) {
        case '"':
        case '\\':
        case '/': out[o++] = c; break;
        case 'b': out[o++] = '\b'; break;
        case 'f': out[o++] = '\f'; break;
        case 'n': out[o++] = '\n'; break;
        case 'r': out[o++] = '\r'; break;
        case 't': out[o++] = '\t'; break;
        case 'u':
            if (hex4(p, &cp)) return -1;
            p += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && p[0] == '\\' && p[1] == 'u' && !hex4(p + 2, &lo) && lo >= 0xDC00 &&
                lo < 0xE000) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                p += 6;
            } else if (cp >= 0xD800 && cp < 0xE000) {
                cp = 0xFFFD;
            }
            o += put_utf8(out + o, cp);
            break;
        default: return -1;
        }
    }
    while (*p == ' ' || *p == '\t' || *p == '\r') p++;
    return *p ? -1 : (long)o;
}

/* JSON string with an explicit length: decoded text can hold NUL bytes, which
 * cli_json_string (NUL-terminated input) cannot carry. */
static void put_json_text(FILE *f, const char *s, size_t len) {
    fputc('"', f);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\r') fputs("\\r", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static void put_ids(const int32_t *ids, size_t n, int json) {
    if (json) putchar('[');
    for (size_t i = 0; i < n; i++) printf(i ? (json ? ",%d" : " %d") : "%d", ids[i]);
    if (json) putchar(']');
    putchar('\n');
}

static int encode_one(const dfl_tokenizer *tok, const char *text, size_t len, int json) {
    int32_t *ids;
    size_t n;
    if (tok_encode(tok, text, len, &ids, &n)) return cli_fail(CMD, "%s", dfl_errmsg());
    put_ids(ids, n, json);
    free(ids);
    return 0;
}

static int decode_one(const dfl_tokenizer *tok, const char *text, const char *where, int skip, int json) {
    int32_t *ids;
    size_t n, len;
    if (parse_ids(text, tok_vocab_size(tok), where, &ids, &n)) return 1;
    char *s = tok_decode_len(tok, ids, n, skip, &len);
    free(ids);
    if (!s) return cli_fail(CMD, "%s%s", where, dfl_errmsg());
    if (json) put_json_text(stdout, s, len);
    else fwrite(s, 1, len, stdout);
    putchar('\n');
    free(s);
    return 0;
}

static int run_lines(const dfl_tokenizer *tok, char *in, int decode, int skip) {
    char *out = malloc(strlen(in) + 1), where[48];
    if (!out) return cli_fail(CMD, "out of memory");
    int rc = 0;
    size_t lineno = 1;
    for (char *line = in; *line && rc == 0; lineno++) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        snprintf(where, sizeof where, "line %zu: ", lineno);
        if (decode) {
            rc = decode_one(tok, line, where, skip, 1);
        } else {
            long len = json_unquote(line, out);
            rc = len < 0 ? cli_fail(CMD, "%sexpected a JSON string", where) : encode_one(tok, out, (size_t)len, 1);
        }
        line = nl ? nl + 1 : line + strlen(line);
    }
    free(out);
    return rc;
}

int cmd_tokenize(int argc, char **argv) {
    const char *path = NULL, *text = NULL;
    int json = 0, decode = 0, skip = 0, lines = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (cli_is_help(a)) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "--tokenizer") == 0) path = cli_value(argc, argv, &i);
        else if (strcmp(a, "--text") == 0) text = cli_value(argc, argv, &i);
        else if (strcmp(a, "--json") == 0) json = 1;
        else if (strcmp(a, "--decode") == 0) decode = 1;
        else if (strcmp(a, "--skip-special") == 0) skip = 1;
        else if (strcmp(a, "--lines") == 0) lines = 1;
        else return cli_usage_error(CMD, "unknown option '%s' (see dfl tokenize --help)", a);
    }
    if (!path) return cli_usage_error(CMD, "--tokenizer PATH is required (see dfl tokenize --help)");
    if (lines && text) return cli_usage_error(CMD, "--lines reads stdin; it cannot be used with --text");
    if (skip && !decode) return cli_usage_error(CMD, "--skip-special only applies to --decode");

    dfl_tokenizer *tok = tok_open(path);
    if (!tok) return cli_fail(CMD, "%s", dfl_errmsg());
    size_t len = text ? strlen(text) : 0;
    char *in = text ? NULL : read_stdin(&len);
    int rc = 1;
    if (text || in) {
        const char *src = text ? text : in;
        if (lines) rc = run_lines(tok, in, decode, skip);
        else if (decode) rc = decode_one(tok, src, "", skip, json);
        else rc = encode_one(tok, src, len, json);
    }
    free(in);
    tok_close(tok);
    if (fflush(stdout) != 0 || ferror(stdout)) return cli_fail(CMD, "writing stdout: %s", strerror(errno));
    return rc;
}
