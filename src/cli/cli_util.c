#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "dfl/common.h"
#include "dfl/drafter.h"
#include "dfl/model.h"

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
    if (end == s || *end) {
        fprintf(stderr, "dfl %s: %s: expected an integer, found '%s'\n", cmd, opt, s);
        return -1;
    }
    /* ERANGE: beyond long itself; the range check happens on the long, before any cast */
    if (errno == ERANGE || v < lo || v > hi) {
        fprintf(stderr, "dfl %s: %s: %s is out of range [%ld, %ld]\n", cmd, opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_long_list(const char *cmd, const char *opt, const char *s, long lo, long hi, long *out, int max, int *n) {
    *n = 0;
    const char *p = s;
    for (;;) {
        size_t len = strcspn(p, ",");
        const char *next = p + len;
        while (len && (*p == ' ' || *p == '\t')) p++, len--; /* "1, 9, 17" */
        while (len && (p[len - 1] == ' ' || p[len - 1] == '\t')) len--;
        const char *item = p;
        char buf[64];
        if (len == 0) {
            fprintf(stderr, "dfl %s: %s: expected comma-separated integers, found an empty item in '%s'\n", cmd, opt,
                    s);
            return -1;
        }
        /* copy the item (long ones are cut: strtol reports them as out of range or not a number) */
        const size_t k = len < sizeof buf ? len : sizeof buf - 1;
        memcpy(buf, item, k);
        buf[k] = 0;
        char *end;
        errno = 0;
        const long v = strtol(buf, &end, 10);
        if (end == buf || *end || len != k || (*buf != '-' && (*buf < '0' || *buf > '9'))) {
            if (end != buf && !*end && len != k)
                fprintf(stderr, "dfl %s: %s: %.*s is out of range [%ld, %ld]\n", cmd, opt, (int)len, item, lo, hi);
            else
                fprintf(stderr, "dfl %s: %s: expected comma-separated integers, found '%.*s' in '%s'\n", cmd, opt,
                        (int)len, item, s);
            return -1;
        }
        if (errno == ERANGE || v < lo || v > hi) {
            fprintf(stderr, "dfl %s: %s: %.*s is out of range [%ld, %ld]\n", cmd, opt, (int)len, item, lo, hi);
            return -1;
        }
        if (*n == max) {
            fprintf(stderr, "dfl %s: %s: at most %d values, found more in '%s'\n", cmd, opt, max, s);
            return -1;
        }
        out[(*n)++] = v;
        p = next;
        if (!*p) return 0;
        p++; /* the comma */
    }
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

#ifndef DFL_HAVE_MPI
const char *eval_mpi_library(void) { return "no"; }
#endif

int eval_mpi_launched(void) {
    const char *s = getenv("OMPI_COMM_WORLD_SIZE");
    if (!s) s = getenv("PMI_SIZE");
    return s && atoi(s) > 1;
}

int cli_device_option(const char *cmd, int argc, char **argv, int *i, dfl_device *d) {
    if (strcmp(argv[*i], "--weights") == 0) {
        st_place p;
        if (st_place_parse(cli_value(argc, argv, i), &p) != DFL_OK) {
            cli_usage_error(cmd, "--weights: %s", dfl_errmsg());
            return -1;
        }
        st_place_set(p);
        return 1;
    }
    if (strcmp(argv[*i], "--device") != 0) return 0;
    if (dfl_device_parse(cli_value(argc, argv, i), d) != DFL_OK) {
        cli_usage_error(cmd, "%s", dfl_errmsg());
        return -1;
    }
    return 1;
}

int cli_use_device(const char *cmd, dfl_model *m, dfl_device d) {
    if (d == m->device) return 0;
    const double t0 = dfl_now();
    if (model_use_device(m, d) != DFL_OK) return cli_fail(cmd, "%s", dfl_errmsg());
    fprintf(stderr, "dfl %s: target on %s (%.2f GB of weights uploaded in %.1f s)\n", cmd, dfl_device_name(d),
            m->weight_bytes / 1e9, dfl_now() - t0);
    return 0;
}

int cli_block_attn_option(const char *cmd, int argc, char **argv, int *i, int *causal) {
    if (strcmp(argv[*i], "--block-attn") != 0) return 0;
    const char *v = cli_value(argc, argv, i);
    if (drafter_causal_parse(v, causal) != DFL_OK) {
        cli_usage_error(cmd, "--block-attn: expected auto, sliding-causal, bidirectional or causal, found '%s'", v);
        return -1;
    }
    return 1;
}
