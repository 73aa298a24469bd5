/* Helpers shared by the libFuzzer harnesses (see fuzz_util.h). */
#include "fuzz_util.h"

#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <utf8proc.h>

const char *fuzz_file(int slot, const uint8_t *data, size_t size) {
    static int fds[4] = {-1, -1, -1, -1};
    static char paths[4][64];
    if (fds[slot] < 0) {
        fds[slot] = memfd_create("dfl-fuzz", 0);
        FUZZ_CHECK(fds[slot] >= 0, "memfd_create failed");
        snprintf(paths[slot], sizeof paths[slot], "/proc/self/fd/%d", fds[slot]);
    }
    int fd = fds[slot];
    FUZZ_CHECK(ftruncate(fd, 0) == 0, "ftruncate failed");
    size_t done = 0;
    while (done < size) {
        ssize_t w = pwrite(fd, data + done, size - done, (off_t)done);
        FUZZ_CHECK(w > 0, "pwrite failed");
        done += (size_t)w;
    }
    return paths[slot];
}

char *fuzz_cstr(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    FUZZ_CHECK(s, "out of memory");
    if (size) memcpy(s, data, size);
    s[size] = 0;
    return s;
}

/* Length of the valid sequence at s[i] (1..4), or 0 with *bad the length of the maximal
 * invalid subpart (>= 1) there. Table 3-7 of the Unicode standard. */
static size_t seq_len(const uint8_t *s, size_t n, size_t i, size_t *bad) {
    uint8_t c = s[i];
    if (c < 0x80) return 1;
    size_t len;
    uint8_t lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) len = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0) lo = 0xa0;
        if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f;
    } else {
        *bad = 1;
        return 0;
    }
    for (size_t k = 1; k < len; k++) {
        if (i + k >= n) {
            *bad = k;
            return 0;
        }
        uint8_t b = s[i + k];
        uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xbf;
        if (b < l || b > h) {
            *bad = k;
            return 0;
        }
    }
    return len;
}

int fuzz_utf8_valid(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t bad, l = seq_len(s, n, i, &bad);
        if (!l) return 0;
        i += l;
    }
    return 1;
}

uint8_t *fuzz_utf8_repair(const uint8_t *s, size_t n, size_t *out_len) {
    uint8_t *o = malloc(3 * n + 1);
    FUZZ_CHECK(o, "out of memory");
    size_t j = 0;
    for (size_t i = 0; i < n;) {
        size_t bad, l = seq_len(s, n, i, &bad);
        if (l) {
            memcpy(o + j, s + i, l);
            j += l;
            i += l;
        } else {
            memcpy(o + j, "\xef\xbf\xbd", 3);
            j += 3;
            i += bad;
        }
    }
    o[j] = 0;
    *out_len = j;
    return o;
}

uint8_t *fuzz_nfc(const uint8_t *s, size_t n, size_t *out_len) {
    utf8proc_uint8_t *out = NULL;
    utf8proc_ssize_t r =
        utf8proc_map(n ? s : (const uint8_t *)"", (utf8proc_ssize_t)n, &out, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    FUZZ_CHECK(r >= 0, "utf8proc_map: %s", utf8proc_errmsg(r));
    *out_len = (size_t)r;
    return out;
}

const char *fuzz_tokenizer_path(void) {
    const char *p = getenv("DFL_FUZZ_TOKENIZER");
    return p && *p ? p : DFL_SOURCE_DIR "/models/target/tokenizer.json";
}
