#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "dfl/common.h"

int cli_is_help(const char *arg) { return strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0; }

const char *cli_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "dfl %s: option %s needs a value\n", argv[0], argv[*i]);
        exit(2);
    }
    return argv[++*i];
}

int cli_parse_long(const char *cmd, const char *opt, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end) {
        fprintf(stderr, "dfl %s: %s: expected an integer, found '%s'\n", cmd, opt, s);
        return -1;
    }
    if (v < lo || v > hi) {
        fprintf(stderr, "dfl %s: %s: %ld is out of range [%ld, %ld]\n", cmd, opt, v, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_double(const char *cmd, const char *opt, const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v)) {
        fprintf(stderr, "dfl %s: %s: expected a number, found '%s'\n", cmd, opt, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int vreport(int code, const char *cmd, const char *fmt, va_list ap) {
    fprintf(stderr, "dfl %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    return code;
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int r = vreport(2, cmd, fmt, ap);
    va_end(ap);
    return r;
}

int cli_fail(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int r = vreport(1, cmd, fmt, ap);
    va_end(ap);
    return r;
}

void cli_json_string(FILE *f, const char *s) { dfl_json_write_string(f, s); }
