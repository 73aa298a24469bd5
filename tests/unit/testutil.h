/* Minimal test helpers: CHECK records a failure and continues; test_done() prints the
 * summary line and returns the exit status. */
#ifndef DFL_TESTUTIL_H
#define DFL_TESTUTIL_H

#include <stdio.h>

extern int test_failures, test_checks;

#define CHECK(cond, ...)                                                             \
    do {                                                                             \
        test_checks++;                                                               \
        if (!(cond)) {                                                               \
            test_failures++;                                                         \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                            \
            fprintf(stderr, "\n");                                                   \
        }                                                                            \
    } while (0)

/* Path under $DFL_FIXTURES (static buffer per call site use; copy if kept). */
const char *test_fixture(const char *name);
/* A fresh temporary directory for the test (mkdtemp), removed by nobody: under /tmp. */
const char *test_tmpdir(void);
int test_done(const char *name);

#endif
