/* Weight placement: bound matrices read in place from the file mapping, or copied once into an
 * anonymous arena at 64-byte aligned addresses on transparent huge pages (docs/design.md §1).
 *
 * Why copy: safetensors pads its header to 8 bytes only, so a tensor's data usually starts
 * 8..56 bytes into a cache line (the bench target: every tensor 24 bytes in). A 64-byte load of
 * a weight row then touches two lines: on an AMX host a 120-token lm_head product took 112-118 ms
 * from the mapping against 84-85 ms from an aligned copy, and a budget-64 tree forward 305 against
 * 250-256 ms (2 threads, 2026-12-05; bench/README.md, "Weight placement"). The mapping cannot be
 * aligned: a mapped address and its file offset agree modulo the page size. */
#include "dfl/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "dfl/common.h"

#define ARENA_ALIGN ((size_t)2 << 20) /* huge-page size: the arena's base */
#define SLOT_ALIGN 64                 /* each tensor's start: a cache line */
#define COPY_CHUNK ((size_t)4 << 20)  /* one thread's share of a large tensor's copy */
#define ALIGNED_MIN_BYTES (64 << 10)  /* auto: tensors from this size on decide whether a file is aligned */

static st_place place_mode = ST_PLACE_AUTO;
static int place_env_read;

static const char *const place_names[] = {"auto", "map", "copy"};

const char *st_place_name(st_place p) { return p >= ST_PLACE_AUTO && p <= ST_PLACE_COPY ? place_names[p] : "?"; }

int st_place_parse(const char *s, st_place *out) {
    for (int i = 0; i <= ST_PLACE_COPY; i++)
        if (s && strcmp(s, place_names[i]) == 0) {
            *out = (st_place)i;
            return DFL_OK;
        }
    return dfl_seterr("weights placement '%s': expected auto, map or copy", s ? s : "");
}

st_place st_place_get(void) {
    if (!place_env_read) {
        place_env_read = 1;
        const char *env = getenv("DFL_WEIGHTS");
        st_place p;
        if (env && *env) {
            if (st_place_parse(env, &p) == DFL_OK) place_mode = p;
            else fprintf(stderr, "dfl: DFL_WEIGHTS: %s; using auto\n", dfl_errmsg());
        }
    }
    return place_mode;
}

void st_place_set(st_place p) {
    place_env_read = 1;
    place_mode = p;
}

int st_place_fits(uint64_t bytes, uint64_t mem_available, int local_ranks) {
    if (local_ranks > 1) return 0; /* ranks on one machine share the page cache; copies would not */
    const uint64_t keep = mem_available / 4 > ((uint64_t)4 << 30) ? mem_available / 4 : (uint64_t)4 << 30;
    return mem_available > keep && bytes <= mem_available - keep;
}

uint64_t st_data_bytes(const st_checkpoint *m) {
    uint64_t b = 0;
    for (int i = 0; i < m->n_tensors; i++) b += m->tensors[i].nbytes;
    return b;
}

int st_place_decide(st_checkpoint *m, uint64_t bytes) {
    char *why = m->place_why;
    const size_t n = sizeof m->place_why;
    const st_place p = st_place_get();
    if (p != ST_PLACE_AUTO) {
        snprintf(why, n, "%s (DFL_WEIGHTS or --weights)", p == ST_PLACE_COPY ? "copy" : "map");
        return p == ST_PLACE_COPY;
    }
    int aligned = 1; /* a file whose matrices start on cache lines gains nothing from a copy */
    for (int i = 0; i < m->n_tensors && aligned; i++)
        aligned = m->tensors[i].nbytes < ALIGNED_MIN_BYTES || (uintptr_t)m->tensors[i].data % SLOT_ALIGN == 0;
    if (aligned) {
        snprintf(why, n, "map (auto: every tensor of 64 KiB or more starts on a cache line in the file)");
        return 0;
    }
    const char *ranks = getenv("OMPI_COMM_WORLD_LOCAL_SIZE"); /* Open MPI: ranks on this machine */
    const int local = ranks ? atoi(ranks) : 1;
    const uint64_t avail = dfl_mem_available(); /* 0 if unknown: then map */
    const int copy = st_place_fits(bytes, avail, local);
    if (local > 1) snprintf(why, n, "map (auto: %d MPI ranks on this machine share the page cache)", local);
    else
        snprintf(why, n, "%s (auto: %.2f GB of weights, %.2f GB of memory available)", copy ? "copy" : "map",
                 bytes / 1e9, avail / 1e9);
    return copy;
}

/* The arena: virtual space for every tensor of m (only the pages written are backed). */
static int arena_reserve(st_checkpoint *m) {
    size_t cap = ARENA_ALIGN;
    for (int i = 0; i < m->n_tensors; i++) cap += (m->tensors[i].nbytes + SLOT_ALIGN - 1) / SLOT_ALIGN * SLOT_ALIGN;
    cap = (cap + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    void *p = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return dfl_seterr("cannot reserve %.2f GB of address space for the weights", cap / 1e9);
    m->arena = p, m->arena_size = cap;
    /* from the first huge-page boundary on; where THP is off this only costs the advice */
    m->arena_used = (size_t)(((uintptr_t)p + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN - (uintptr_t)p);
    madvise((uint8_t *)p + m->arena_used, cap - m->arena_used, MADV_HUGEPAGE);
    return DFL_OK;
}

const uint8_t *st_place_tensor(st_checkpoint *m, const st_tensor *tc) {
    st_tensor *t = &m->tensors[tc - m->tensors]; /* one of m's: its copy is recorded there */
    if (t->placed) return t->placed;
    if (!m->arena && arena_reserve(m) != DFL_OK) return NULL;
    const size_t need = (t->nbytes + SLOT_ALIGN - 1) / SLOT_ALIGN * SLOT_ALIGN;
    if (m->arena_used + need > m->arena_size) {
        dfl_seterr("%s: tensor '%s' does not fit the weights' arena", m->files[t->file_index].path, t->name);
        return NULL;
    }
    uint8_t *dst = m->arena + m->arena_used;
    const size_t nb = t->nbytes, chunks = (nb + COPY_CHUNK - 1) / COPY_CHUNK;
    const double t0 = dfl_now();
    /* threads fault the arena's pages in and copy side by side */
#pragma omp parallel for schedule(dynamic, 1) if (chunks > 1)
    for (size_t k = 0; k < chunks; k++) {
        const size_t o = k * COPY_CHUNK, len = nb - o < COPY_CHUNK ? nb - o : COPY_CHUNK;
        memcpy(dst + o, t->data + o, len);
    }
    m->place_s += dfl_now() - t0;
    /* the mapping's pages of this tensor leave the process (they stay in the page cache) */
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    const uintptr_t a = ((uintptr_t)t->data + pg - 1) / pg * pg, e = ((uintptr_t)t->data + nb) / pg * pg;
    if (e > a) madvise((void *)a, e - a, MADV_DONTNEED);
    m->arena_used += need;
    m->placed_bytes += nb;
    return t->placed = dst;
}

void st_place_free(st_checkpoint *m) {
    if (m->arena) munmap(m->arena, m->arena_size);
    m->arena = NULL, m->arena_size = m->arena_used = 0, m->placed_bytes = 0;
}
