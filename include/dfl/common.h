/* dfl — common definitions: error reporting and small helpers shared by every module.
 *
 * Library functions never exit(): they return an error code (DFL_OK == 0, DFL_ERR < 0) or
 * NULL, and leave a human-readable message in a thread-local buffer read by dfl_errmsg().
 * Messages name the file, tensor or field, and the expected vs found values. */
#ifndef DFL_COMMON_H
#define DFL_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum dfl_status {
    DFL_OK = 0,
    DFL_ERR = -1,
};

/* Set the thread's error message (printf format). Always returns DFL_ERR. */
int dfl_seterr(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prefix the current message with more context: "ctx: old message". Returns DFL_ERR. */
int dfl_preperr(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The last error message of this thread ("" when none). */
const char *dfl_errmsg(void);
void dfl_clearerr(void);

/* Wall-clock seconds (monotonic). */
double dfl_now(void);
/* MemAvailable of /proc/meminfo in bytes; 0 where it cannot be read. */
uint64_t dfl_mem_available(void);

/* Zeroed memory of at least `bytes`, aligned to a cache line (64 bytes), released with free();
 * NULL when out of memory. Kernels stream whole cache lines into such buffers. */
void *dfl_zalloc(size_t bytes);
/* The same, not zeroed: for logits and other large outputs of the matrix products, which write
 * rows that start on cache lines with streaming stores (a malloc'd block of megabytes starts 16
 * bytes into a page, and its stores then read every line first). */
void *dfl_alloc(size_t bytes);

/* Read a whole file into a NUL-terminated malloc'd buffer. NULL + error on failure. */
char *dfl_read_file(const char *path, size_t *len_out);

/* Join a directory and a file name into a malloc'd path. */
char *dfl_path_join(const char *dir, const char *name);

/* Write s as a JSON string literal (quoted, escaped) to f. */
void dfl_json_write_string(FILE *f, const char *s);

/* A JSON value (cJSON) for error messages, into buf (n bytes), returned: "nothing" for NULL,
 * numbers as written (integers exactly, 9e+98, the shortest exact form otherwise), anything else
 * as compact JSON cut short with "...". */
struct cJSON;
const char *dfl_json_brief(const struct cJSON *v, char *buf, size_t n);

/* 1 if path is a directory, 0 otherwise. */
int dfl_is_dir(const char *path);
/* 1 if path exists and is a regular file. */
int dfl_is_file(const char *path);

#endif
