/* dfl eval under mpirun (docs/eval.md, "Across machines: MPI, or job arrays"): built when CMake
 * finds MPI.
 *
 * Work is handed out dynamically, longest unit first: rank 0 keeps a queue of the units results.jsonl
 * does not complete, sorted by weight (prompt tokens plus --max-new per turn), and every rank
 * (rank 0 too) takes the next one when it finishes the last; that balances by length and by the
 * real cost (a response that stops early frees its rank early). Rank 0 runs its own units on the
 * main thread and serves the other ranks on a second one, the only thread of rank 0 that calls
 * MPI (MPI_THREAD_SERIALIZED): requests for work, and each finished results line, written to
 * results.jsonl (flushed) when it arrives. A rank that dies: its unit in progress is missing, the
 * others run the rest; rank 0 writes the reports of what it has and fails naming what is missing.
 * Open MPI 4.1 says nothing of a death (with mpirun --enable-recovery the job goes on), so a rank
 * sees one only of a process on its own host: its pid gone. */
#include <errno.h>
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "dfl/common.h"
#include "dfl/eval.h"

enum { TAG_REQ = 1, TAG_UNIT, TAG_LINE, TAG_DONE, TAG_BYE };

typedef struct peer {
    char host[256];
    int pid;
} peer;

typedef struct rank_info {
    int current;     /* the unit it runs, -1 none */
    int finished;    /* said it is done (or failed), or died */
    int dead;        /* its process is gone (seen from rank 0's host) */
    double last_tau; /* of the last line it sent */
    char *error;     /* its failure, if any (malloc'd) */
} rank_info;

typedef struct mpi_ctx {
    int rank, size;
    peer *peers; /* [size] host and pid of every rank */
    const eval_opts *o;
    /* rank 0 */
    pthread_mutex_t mu; /* the queue, results.jsonl, progress */
    pthread_t thread;
    int thread_joined;
    FILE *resf;
    char *res_path;
    int n;                       /* units */
    char **names;                /* [n] */
    char **held;                 /* [n] the results lines results.jsonl held for each (NULL: none) */
    int *state;                  /* [n]: 0 queued or complete, 1 running, 2 done in this run */
    int *queue, n_queue, q_next; /* units to run, heaviest first */
    rank_info *ranks;            /* [size] */
    int remote_mismatches;
    int deaths; /* ranks that died: then nobody calls MPI_Finalize (below) */
    int progress_done;
    void (*on_progress)(void *ud, const eval_progress *p);
    void *progress_ud;
    /* other ranks */
    int sent, exit_after; /* lines sent; the test hook's count (0: off) */
    int rank0_gone;       /* rank 0 died: nothing more can be said to it */
} mpi_ctx;

static void sleep_ms(int ms) {
    struct timespec ts = {.tv_sec = 0, .tv_nsec = ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* A process on this host is gone (no such pid, or a zombie not yet reaped). */
static int local_dead(const peer *p, const char *myhost) {
    if (strcmp(p->host, myhost) != 0) return 0; /* another host: not observable from here */
    if (kill(p->pid, 0) != 0 && errno == ESRCH) return 1;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", p->pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *e = strrchr(buf, ')'); /* "pid (comm) S ..." */
    return e && e[1] == ' ' && (e[2] == 'Z' || e[2] == 'X');
}

static void progress_tick(mpi_ctx *c, const char *what, double tau) {
    c->progress_done++;
    if (!c->on_progress) return;
    eval_progress p = {.done = c->progress_done, .total = c->n, .what = what, .last_tau = tau};
    c->on_progress(c->progress_ud, &p);
}

/* A message to rank dst (a large one waits for dst to take it) that does not hang when dst is a
 * process on this host that is gone: 0 sent, 1 dst gone, -1 an MPI error. */
static int send_to(mpi_ctx *c, int dst, const void *buf, int len, MPI_Datatype type, int tag) {
    MPI_Request req;
    if (MPI_Isend(buf, len, type, dst, tag, MPI_COMM_WORLD, &req) != MPI_SUCCESS) return -1;
    for (int polls = 1;; polls++) {
        int flag = 0;
        if (MPI_Test(&req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) return -1;
        if (flag) return 0;
        if (polls > 1000) sleep_ms(1); /* a first stretch of pure polling: it is usually taken at once */
        if (polls % 1000 == 0 && local_dead(&c->peers[dst], c->peers[c->rank].host)) return 1;
    }
}

/* ---- rank 0 ------------------------------------------------------------------------------ */

static int take_unit(mpi_ctx *c, int rank) { /* under mu */
    rank_info *ri = &c->ranks[rank];
    if (ri->current >= 0) c->state[ri->current] = 2;
    ri->current = c->q_next < c->n_queue ? c->queue[c->q_next++] : -1;
    if (ri->current >= 0) c->state[ri->current] = 1;
    return ri->current;
}

static int write_line(mpi_ctx *c, const char *line) { /* under mu */
    fputs(line, c->resf);
    fputc('\n', c->resf);
    if (fflush(c->resf) != 0 || ferror(c->resf)) return dfl_seterr("%s: write error: %s", c->res_path, strerror(errno));
    return DFL_OK;
}

static void set_error(rank_info *ri, const char *msg) {
    if (!ri->error) ri->error = strdup(msg);
}

/* One message (tag, NUL-terminated text) from rank src. */
static void serve_one(mpi_ctx *c, int src, int tag, char *msg) {
    rank_info *ri = &c->ranks[src];
    if (tag == TAG_REQ) {
        pthread_mutex_lock(&c->mu);
        const int prev = ri->current;
        if (prev >= 0) progress_tick(c, c->names[prev], ri->last_tau);
        const int k = take_unit(c, src);
        pthread_mutex_unlock(&c->mu);
        /* the unit, its name (checked there) and the lines held for it */
        char *held = NULL;
        size_t len = 0;
        FILE *m = open_memstream(&held, &len);
        fprintf(m, "%d\t%s\n%s", k, k >= 0 ? c->names[k] : "", k >= 0 && c->held[k] ? c->held[k] : "");
        fclose(m);
        send_to(c, src, held, (int)len + 1, MPI_CHAR, TAG_UNIT); /* a death is seen by serve */
        free(held);
    } else if (tag == TAG_LINE) {
        eval_result e;
        if (eval_result_parse(msg, &e, NULL, NULL) != DFL_OK) {
            char err[600];
            snprintf(err, sizeof err, "sent a malformed results line (%s)", dfl_errmsg());
            set_error(ri, err);
            return;
        }
        pthread_mutex_lock(&c->mu);
        if (write_line(c, msg) != DFL_OK) set_error(&c->ranks[0], dfl_errmsg());
        c->remote_mismatches += e.match == 0;
        ri->last_tau = e.rounds ? (double)(e.tokens - 1) / e.rounds : 0;
        pthread_mutex_unlock(&c->mu);
    } else if (tag == TAG_DONE) {
        /* "0" or "1\tmessage": the rank ran out of work, or failed (its unit is missing) */
        if (msg[0] != '0') set_error(ri, msg[0] && msg[1] ? msg + 2 : "failed");
        ri->finished = 1;
    }
}

/* Receive what src has sent (or everything, src = MPI_ANY_SOURCE); 1 if anything came. */
static int serve_pending(mpi_ctx *c, int src) {
    int any = 0;
    for (;;) {
        int flag = 0;
        MPI_Status st;
        if (MPI_Iprobe(src, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st) != MPI_SUCCESS || !flag) return any;
        int len = 0;
        MPI_Get_count(&st, MPI_CHAR, &len);
        char *msg = malloc((size_t)len + 1);
        MPI_Recv(msg, len, MPI_CHAR, st.MPI_SOURCE, st.MPI_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        msg[len] = 0;
        serve_one(c, st.MPI_SOURCE, st.MPI_TAG, msg);
        free(msg);
        any = 1;
    }
}

static void *serve(void *arg) {
    mpi_ctx *c = arg;
    int polls = 0;
    for (;;) {
        int open = 0;
        for (int r = 1; r < c->size; r++) open += !c->ranks[r].finished;
        if (!open) break;
        if (serve_pending(c, MPI_ANY_SOURCE)) continue;
        sleep_ms(2);
        if (++polls % 50) continue;
        /* every ~0.1 s: a rank on this host that is gone (what it sent before is taken first) */
        for (int r = 1; r < c->size; r++)
            if (!c->ranks[r].finished && local_dead(&c->peers[r], c->peers[0].host)) {
                serve_pending(c, r);
                if (c->ranks[r].finished) continue;
                c->ranks[r].dead = c->ranks[r].finished = 1;
                c->deaths++;
                fprintf(stderr, "\ndfl eval: rank %d (host %s, pid %d) died%s%s\n", r, c->peers[r].host,
                        c->peers[r].pid, c->ranks[r].current >= 0 ? " running prompt " : "",
                        c->ranks[r].current >= 0 ? c->names[c->ranks[r].current] : "");
            }
    }
    /* every rank is done: tell the living ones whether a rank died. Open MPI 4.1's MPI_Finalize
     * waits for every rank, the dead one too (now and then forever, under --enable-recovery) */
    for (int r = 1; r < c->size; r++)
        if (!c->ranks[r].dead) send_to(c, r, &c->deaths, 1, MPI_INT, TAG_BYE);
    return NULL;
}

static int cmp_weight_desc(const void *a, const void *b, void *w) {
    const long wa = ((const long *)w)[*(const int *)a], wb = ((const long *)w)[*(const int *)b];
    if (wa != wb) return wa < wb ? 1 : -1;
    return *(const int *)a - *(const int *)b;
}

static int d_plan(void *ud, int n, char *const *names, const long *weight, const int *complete, char *const *done) {
    mpi_ctx *c = ud;
    c->n = n;
    if (!(c->names = calloc((size_t)n + 1, sizeof *c->names))) return dfl_seterr("out of memory");
    for (int k = 0; k < n; k++)
        if (!(c->names[k] = strdup(names[k]))) return dfl_seterr("out of memory");
    if (c->rank != 0) return DFL_OK; /* the names, to check what rank 0 hands out */
    c->state = calloc((size_t)n + 1, sizeof *c->state);
    c->queue = calloc((size_t)n + 1, sizeof *c->queue);
    if (!c->state || !c->queue) return dfl_seterr("out of memory");
    for (int k = 0; k < n; k++) {
        if (complete[k]) c->progress_done++;
        else c->queue[c->n_queue++] = k;
    }
    qsort_r(c->queue, (size_t)c->n_queue, sizeof *c->queue, cmp_weight_desc, (void *)weight);
    c->res_path = dfl_path_join(c->o->out, "results.jsonl");
    if (!(c->resf = fopen(c->res_path, "a"))) return dfl_seterr("%s: cannot write: %s", c->res_path, strerror(errno));
    /* the held lines travel with each unit handed out */
    if (!(c->held = calloc((size_t)n + 1, sizeof *c->held))) return dfl_seterr("out of memory");
    for (int k = 0; k < n; k++) c->held[k] = done[k][0] ? strdup(done[k]) : NULL;
    if (pthread_create(&c->thread, NULL, serve, c) != 0) return dfl_seterr("cannot start rank 0's MPI thread");
    return DFL_OK;
}

/* rank 0's own units: from the queue, no message */
static int d_next0(void *ud, int *unit, char **held) {
    mpi_ctx *c = ud;
    pthread_mutex_lock(&c->mu);
    *unit = take_unit(c, 0);
    pthread_mutex_unlock(&c->mu);
    *held = NULL; /* rank 0's run read results.jsonl itself */
    return DFL_OK;
}

static int d_emit0(void *ud, const char *line) {
    mpi_ctx *c = ud;
    pthread_mutex_lock(&c->mu);
    const int rc = write_line(c, line);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static void progress0(void *ud, const eval_progress *p) {
    mpi_ctx *c = ud;
    pthread_mutex_lock(&c->mu);
    progress_tick(c, p->what, p->last_tau);
    pthread_mutex_unlock(&c->mu);
}

/* Wait for the other ranks; name the units no rank finished. */
static int d_finish(void *ud) {
    mpi_ctx *c = ud;
    pthread_join(c->thread, NULL);
    c->thread_joined = 1;
    if (c->ranks[0].current >= 0) c->state[c->ranks[0].current] = 2;
    char *msg = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&msg, &len);
    int missing = 0;
    for (int k = 0; k < c->n; k++)
        if (c->state[k] == 1) fprintf(m, "%s%s", missing++ ? ", " : "", c->names[k]);
    for (int k = c->q_next; k < c->n_queue; k++) fprintf(m, "%s%s", missing++ ? ", " : "", c->names[c->queue[k]]);
    for (int r = 1; r < c->size; r++) {
        if (c->ranks[r].dead) fprintf(m, "; rank %d (host %s, pid %d) died", r, c->peers[r].host, c->peers[r].pid);
        else if (c->ranks[r].error) fprintf(m, "; rank %d: %s", r, c->ranks[r].error);
    }
    fclose(m);
    int rc = DFL_OK;
    if (missing)
        rc = dfl_seterr("%d prompt(s) missing: %s; the reports hold the others, rerun with --resume to complete them",
                        missing, msg);
    else if (c->ranks[0].error) rc = dfl_seterr("%s", c->ranks[0].error);
    free(msg);
    return rc;
}

/* ---- the other ranks --------------------------------------------------------------------- */

static int rank0_gone(mpi_ctx *c) {
    c->rank0_gone = 1;
    return dfl_seterr("rank 0 (host %s, pid %d) is gone", c->peers[0].host, c->peers[0].pid);
}

static int send0(mpi_ctx *c, const void *buf, int len, MPI_Datatype type, int tag) {
    const int rc = send_to(c, 0, buf, len, type, tag);
    if (rc == 1) return rank0_gone(c);
    return rc ? dfl_seterr("cannot reach rank 0") : DFL_OK;
}

static int d_next(void *ud, int *unit, char **held) {
    mpi_ctx *c = ud;
    int zero = 0;
    *held = NULL;
    if (send0(c, &zero, 1, MPI_INT, TAG_REQ)) return DFL_ERR;
    MPI_Status st;
    for (int polls = 1;; polls++) { /* wait for the answer, or for rank 0 to be gone */
        int flag = 0;
        if (MPI_Iprobe(0, TAG_UNIT, MPI_COMM_WORLD, &flag, &st) != MPI_SUCCESS)
            return dfl_seterr("cannot reach rank 0");
        if (flag) break;
        sleep_ms(1);
        if (polls % 100 == 0 && local_dead(&c->peers[0], c->peers[c->rank].host)) return rank0_gone(c);
    }
    int len = 0;
    MPI_Get_count(&st, MPI_CHAR, &len);
    char *msg = malloc((size_t)len + 1);
    if (!msg) return dfl_seterr("out of memory");
    MPI_Recv(msg, len, MPI_CHAR, 0, TAG_UNIT, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    msg[len] = 0;
    char *tab = strchr(msg, '\t'), *nl = tab ? strchr(tab, '\n') : NULL;
    int rc = DFL_OK;
    if (!tab || !nl) {
        rc = dfl_seterr("a malformed message from rank 0");
    } else {
        *nl = 0;
        *unit = atoi(msg);
        /* every rank must see the same units: the same prompt file (or features) and options */
        if (*unit >= c->n || (*unit >= 0 && strcmp(c->names[*unit], tab + 1) != 0))
            rc = dfl_seterr("rank 0's unit %d is prompt %s, here it is %s: every rank must read the same "
                            "prompts (--prompts, --limit, --shard, --features) with the same options",
                            *unit, tab + 1, *unit < c->n ? c->names[*unit] : "(none)");
        else if (nl[1]) *held = strdup(nl + 1);
    }
    free(msg);
    return rc;
}

static int d_emit(void *ud, const char *line) {
    mpi_ctx *c = ud;
    if (send0(c, line, (int)strlen(line) + 1, MPI_CHAR, TAG_LINE)) return DFL_ERR;
    /* test hook (tests/py/test_mpi.py): die without a word after this many lines */
    if (c->exit_after && ++c->sent == c->exit_after) _exit(3);
    return DFL_OK;
}

/* ---- entry -------------------------------------------------------------------------------- */

const char *eval_mpi_library(void) {
    static char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(v, &len); /* callable before MPI_Init */
    v[strcspn(v, ",\n")] = 0;         /* "Open MPI v4.1.4, package: ..." */
    return v;
}

int eval_mpi_run(eval_opts *o, int quiet) {
    mpi_ctx cc, *c = &cc; /* lives until the serve thread is joined: this function's whole run */
    memset(c, 0, sizeof *c);
    c->o = o;
    int prov = 0;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &prov) != MPI_SUCCESS)
        return cli_fail("eval", "MPI_Init_thread failed");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &c->size);
    if (prov < MPI_THREAD_SERIALIZED) {
        if (c->rank == 0)
            fprintf(stderr, "dfl eval: this MPI gives no MPI_THREAD_SERIALIZED (rank 0 serves the "
                            "others from a thread)\n");
        MPI_Finalize();
        return 1;
    }
    peer me = {.pid = (int)getpid()};
    gethostname(me.host, sizeof me.host - 1);
    c->peers = calloc((size_t)c->size, sizeof *c->peers);
    c->ranks = calloc((size_t)c->size, sizeof *c->ranks);
    MPI_Allgather(&me, (int)sizeof me, MPI_BYTE, c->peers, (int)sizeof me, MPI_BYTE, MPI_COMM_WORLD);
    for (int r = 0; r < c->size; r++) c->ranks[r].current = -1;
    pthread_mutex_init(&c->mu, NULL);
    const char *hook = getenv("DFL_TEST_MPI_EXIT"); /* "RANK:LINES", a test hook */
    if (hook && c->rank > 0 && atoi(hook) == c->rank && strchr(hook, ':')) c->exit_after = atoi(strchr(hook, ':') + 1);

    eval_dist dist = {.writer = c->rank == 0,
                      .ud = c,
                      .plan = d_plan,
                      .next = c->rank == 0 ? d_next0 : d_next,
                      .emit = c->rank == 0 ? d_emit0 : d_emit,
                      .finish = d_finish};
    o->dist = &dist;
    if (c->rank == 0) {
        c->on_progress = o->on_progress, c->progress_ud = o->progress_ud;
        o->on_progress = progress0, o->progress_ud = c;
        fprintf(stderr, "[dfl eval] MPI: %d ranks on", c->size);
        for (int r = 0; r < c->size; r++)
            if (r == 0 || strcmp(c->peers[r].host, c->peers[r - 1].host) != 0) fprintf(stderr, " %s", c->peers[r].host);
        fprintf(stderr, "\n");
    } else {
        o->on_progress = NULL; /* rank 0 shows everyone's */
    }
    eval_outcome res;
    int rc = eval_run(o, &res);
    int status = 0;
    if (c->rank == 0) {
        if (rc != DFL_OK) fprintf(stderr, "%sdfl eval: %s\n", c->on_progress ? "\n" : "", dfl_errmsg());
        if (rc != DFL_OK && !c->thread_joined) /* the others would wait for it: end them */
            MPI_Abort(MPI_COMM_WORLD, 1);
        const int mismatches = res.mismatches + c->remote_mismatches;
        status = rc != DFL_OK || mismatches;
        if (rc == DFL_OK && mismatches)
            fprintf(stderr, "dfl eval: %d outputs differ from the autoregressive ones (see above)\n", mismatches);
        else if (rc == DFL_OK && !quiet) fprintf(stderr, "[dfl eval] wrote %s/summary.md\n", o->out);
    } else {
        char *msg = NULL;
        size_t len = 0;
        FILE *m = open_memstream(&msg, &len);
        if (rc == DFL_OK) fputs("0", m);
        else fprintf(m, "1\t%s", dfl_errmsg());
        fclose(m);
        if (rc != DFL_OK) fprintf(stderr, "dfl eval: rank %d: %s\n", c->rank, dfl_errmsg());
        int heard = 0; /* rank 0 took the word: it names the failure, and its exit status says it */
        if (!c->rank0_gone && send0(c, msg, (int)len + 1, MPI_CHAR, TAG_DONE) == DFL_OK) {
            /* rank 0's word on whether a rank died */
            for (int polls = 1; !c->rank0_gone; polls++) {
                int flag = 0;
                if (MPI_Iprobe(0, TAG_BYE, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
                if (flag) {
                    MPI_Recv(&c->deaths, 1, MPI_INT, 0, TAG_BYE, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    heard = 1;
                    break;
                }
                sleep_ms(1);
                if (polls % 100 == 0 && local_dead(&c->peers[0], c->peers[c->rank].host)) c->rank0_gone = 1;
            }
        }
        free(msg);
        /* a failure rank 0 heard of ends this rank with 0: by default mpirun ends the whole job at a
         * non-zero exit, before rank 0 could write the others' results and the reports */
        status = rc != DFL_OK && !heard;
    }
    /* MPI_Finalize waits for every rank: not when one died (rank 0 said so), or rank 0 is gone */
    if (!c->deaths && !c->rank0_gone) MPI_Finalize();
    if (c->resf) fclose(c->resf);
    for (int k = 0; k < c->n; k++) free(c->names[k]), free(c->held ? c->held[k] : NULL);
    for (int r = 0; r < c->size; r++) free(c->ranks[r].error);
    free(c->names), free(c->held), free(c->state), free(c->queue), free(c->ranks), free(c->peers), free(c->res_path);
    pthread_mutex_destroy(&c->mu);
    return status;
}
