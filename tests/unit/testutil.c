#include "testutil.h"

#include <stdlib.h>
#include <string.h>

int test_failures = 0, test_checks = 0;

const char *test_fixture(const char *name) {
    static char buf[8][4096];
    static int k = 0;
    const char *dir = getenv("DFL_FIXTURES");
    if (!dir) dir = "build/fixtures";
    char *b = buf[k++ % 8];
    snprintf(b, 4096, "%s/%s", dir, name);
    return b;
}

const char *test_tmpdir(void) {
    static char dir[64];
    if (!dir[0]) {
        strcpy(dir, "/tmp/dfl-test-XXXXXX");
        if (!mkdtemp(dir)) {
            perror("mkdtemp");
            exit(2);
        }
    }
    return dir;
}

int test_done(const char *name) {
    printf("%s: %d checks, %d failed\n", name, test_checks, test_failures);
    return test_failures ? 1 : 0;
}
