#include "dfl/common.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static _Thread_local char errbuf[4096];

int dfl_seterr(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errbuf, sizeof errbuf, fmt, ap);
    va_end(ap);
    return DFL_ERR;
}

int dfl_preperr(const char *fmt, ...) {
    char prefix[1024], old[sizeof errbuf];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, errbuf, sizeof old);
    size_t k = strlen(prefix);
    if (k > sizeof errbuf - 3) k = sizeof errbuf - 3;
    memcpy(errbuf, prefix, k);
    memcpy(errbuf + k, ": ", 2);
    size_t room = sizeof errbuf - k - 3, n = strlen(old);
    if (n > room) n = room;
    memcpy(errbuf + k + 2, old, n);
    errbuf[k + 2 + n] = 0;
    return DFL_ERR;
}

const char *dfl_errmsg(void) { return errbuf; }
void dfl_clearerr(void) { errbuf[0] = 0; }

void *dfl_alloc(size_t bytes) { return aligned_alloc(64, bytes ? (bytes + 63) / 64 * 64 : 64); }

void *dfl_zalloc(size_t bytes) {
    const size_t n = bytes ? (bytes + 63) / 64 * 64 : 64;
    void *p = dfl_alloc(n);
    if (p) memset(p, 0, n);
    return p;
}

double dfl_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

uint64_t dfl_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb << 10;
}

char *dfl_read_file(const char *path, size_t *len_out) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        dfl_seterr("%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    long n = 0;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) != 0) goto fail;
    n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) goto fail;
    buf = malloc((size_t)n + 1);
    if (!buf) {
        fclose(f);
        dfl_seterr("%s: out of memory reading %ld bytes", path, n);
        return NULL;
    }
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        goto fail;
    }
    buf[n] = 0;
    fclose(f);
    if (len_out) *len_out = (size_t)n;
    return buf;
fail:
    dfl_seterr("%s: read error: %s", path, strerror(errno));
    fclose(f);
    return NULL;
}

char *dfl_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (a > 0 && dir[a - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

int dfl_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int dfl_is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

void dfl_json_write_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default:
            if (*p < 0x20) fprintf(f, "\\u%04x", *p);
            else fputc(*p, f);
        }
    }
    fputc('"', f);
}

const char *dfl_json_brief(const struct cJSON *v, char *buf, size_t n) {
    if (!v) return "nothing";
    if (cJSON_IsNumber(v)) {
        if (v->valuedouble == floor(v->valuedouble) && fabs(v->valuedouble) < 1e20) { /* integers exactly */
            snprintf(buf, n, "%.0f", v->valuedouble);
            return buf;
        }
        snprintf(buf, n, "%.15g", v->valuedouble);
        if (strtod(buf, NULL) != v->valuedouble) snprintf(buf, n, "%.17g", v->valuedouble);
        return buf;
    }
    char *s = cJSON_PrintUnformatted(v);
    if (!s) return "?";
    snprintf(buf, n, "%s", s);
    if (strlen(s) >= n && n > 4) memcpy(buf + n - 4, "...", 4);
    cJSON_free(s);
    return buf;
}
