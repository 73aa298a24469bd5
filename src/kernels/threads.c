/* The team size of the kernels' parallel regions (docs/threads.md, "Fewer threads when the cores
 * are taken: the adaptive team"). Fork-join threads wait for their slowest member at every
 * barrier: where other processes hold cores, a member that waits for a core holds up the region's
 * end, and a workload of many short regions (a small model) then runs slower on more threads than
 * on fewer, while one of long regions (a large model) still gains from them. Which wins is
 * measured, not guessed: every thread reads the kernel's count of the time it spent runnable but
 * waiting for a core (/proc/thread-self/schedstat); where that share is sizeable, a trial runs one
 * window of KN_TEAM_WINDOW_S on fewer threads between two on the current team and keeps the fewer
 * if they did as much work per second (the regions' own work estimates); a smaller team tries one
 * thread more the same way. Failed trials back off. Which thread computes what never changes a
 * result, so the team size is free to move. */
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "kn_internal.h"

#define KN_TEAM_WINDOW_S 0.15     /* one measurement: its wall time, at least */
#define KN_TEAM_GAP_S 1.0         /* a pause between regions this long drops the window (idle) */
#define KN_TEAM_CONTENDED 0.05    /* waiting share of the threads' wanted time that starts a trial */
#define KN_TEAM_FEWER_KEEP 0.97   /* fewer threads stay at this share of the rate, or more */
#define KN_TEAM_MORE_KEEP 1.03    /* more threads stay only at this share of the rate, or more */
#define KN_TEAM_BACKOFF_MIN_S 0.5 /* the shortest wait before a trial in a direction */
#define KN_TEAM_BACKOFF_MAX_S 8.0 /* the longest: a failed trial doubles the wait up to this */
#define KN_TEAM_TRIAL_COST 0.02   /* and waits long enough that failing trials cost about this share */

/* The next trial in a direction. Its window ran (or would run) `slower` longer than the best team
 * (0.5: half as fast again): wait at least long enough for such windows to cost KN_TEAM_TRIAL_COST
 * of the time, and twice the last wait if this trial failed. */
static void backoff(double *wait, double *next, double now, int failed, double slower, double window) {
    double w = slower > 0 ? slower * window / KN_TEAM_TRIAL_COST : 0;
    if (failed && 2 * *wait > w) w = 2 * *wait;
    *wait = w < KN_TEAM_BACKOFF_MIN_S ? KN_TEAM_BACKOFF_MIN_S : w > KN_TEAM_BACKOFF_MAX_S ? KN_TEAM_BACKOFF_MAX_S : w;
    *next = now + *wait;
}

/* The end of a trial: keep the other team if its rate held against the mean of the windows before
 * and after it on the old team. */
static void trial_end(kn_team_ctl *c, double now, double rate_after, double window) {
    const double base = 0.5 * (c->rate_before + rate_after), other = c->rate_other;
    const int fewer = c->other < c->team;
    const int keep = other >= base * (fewer ? KN_TEAM_FEWER_KEEP : KN_TEAM_MORE_KEEP);
    double *wait = fewer ? &c->wait_fewer : &c->wait_more, *next = fewer ? &c->next_fewer : &c->next_more;
    backoff(wait, next, now, !keep, keep || other <= 0 ? 0 : base / other - 1, window);
    if (keep) { /* a move: a trial back to the old team would run its slowness again */
        backoff(fewer ? &c->wait_more : &c->wait_fewer, fewer ? &c->next_more : &c->next_fewer, now, 0,
                base > 0 ? other / base - 1 : 0, window);
        c->shrinks += fewer;
        c->team = c->other;
    }
    c->trial = 0;
}

int kn_team_step(kn_team_ctl *c, double now, double work, double dt, double run, double wait) {
    const double rate = work / dt, share = run + wait > 0 ? wait / (run + wait) : 0;
    switch (c->trial) {
    case 1: /* the window on the other team */
        c->rate_other = rate;
        c->trial = 2;
        return c->team;
    case 2: /* back on the old team: decide */ trial_end(c, now, rate, dt); return c->team;
    }
    int other = c->team;
    if (c->team > 1 && share >= KN_TEAM_CONTENDED && now >= c->next_fewer) {
        other = (int)(c->team * (1.0 - share) + 0.5); /* the cores the threads got, about */
        other = other < 1 ? 1 : other >= c->team ? c->team - 1 : other;
    } else if (c->team < c->max && now >= c->next_more) {
        other = c->team + 1;
    }
    if (other == c->team) return c->team;
    c->rate_before = rate, c->other = other, c->trial = 1;
    c->trials++;
    return other;
}

/* This thread's counters: nanoseconds on a core and runnable but waiting, since it started. */
static int sched_read(uint64_t *run, uint64_t *wait) {
    static _Thread_local int fd = -1;
    static _Thread_local pid_t tid;
    const pid_t me = (pid_t)syscall(SYS_gettid);
    if (fd < 0 || tid != me) { /* a thread's first sample, or a forked child's */
        if (fd >= 0) close(fd);
        fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
        tid = me;
        if (fd < 0) return 0;
    }
    char buf[96];
    const ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return 0;
    buf[n] = 0;
    unsigned long long r, w;
    if (sscanf(buf, "%llu %llu", &r, &w) != 2) return 0;
    *run = r, *wait = w;
    return 1;
}

/* Thread-seconds the team ran and waited since each member's previous sample. */
static void team_sample(int team, double *run, double *wait) {
    static _Thread_local uint64_t last_run, last_wait;
    static _Thread_local int seen;
    double r = 0, w = 0;
#pragma omp parallel num_threads(team) reduction(+ : r, w)
    {
        uint64_t a, b;
        if (sched_read(&a, &b)) {
            if (seen && a >= last_run && b >= last_wait) /* (lower: a forked child's first sample) */
                r += (double)(a - last_run) * 1e-9, w += (double)(b - last_wait) * 1e-9;
            last_run = a, last_wait = b, seen = 1;
        }
    }
    *run = r, *wait = w;
}

static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static struct {
    pthread_once_t once;
    pthread_mutex_t lock;
    atomic_int team; /* the next region's team, capped by omp_get_max_threads() (INT_MAX: that alone) */
    int adaptive;    /* under lock from here on; 0: fixed (OMP_NUM_THREADS, kn_team_fix, no schedstat) */
    kn_team_ctl ctl;
    double t_window, work;             /* the window being measured: its start; its regions' work estimates */
    double t_last;                     /* the last region's start */
    double t_start, t_mark, team_time; /* the first region; the integral of the team up to t_mark */
    int lowest;                        /* the smallest team so far */
} T = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER};

static void team_init(void) {
    const int max = omp_get_max_threads();
    uint64_t a, b;
    T.adaptive = !getenv("OMP_NUM_THREADS") && max > 1 && sched_read(&a, &b);
    T.ctl = (kn_team_ctl){.team = max, .max = max};
    T.lowest = max;
    atomic_store(&T.team, T.adaptive ? max : INT_MAX);
    T.t_start = T.t_mark = T.t_last = T.t_window = mono_now();
}

int kn_team_now(void) {
    pthread_once(&T.once, team_init);
    const int t = atomic_load_explicit(&T.team, memory_order_relaxed), max = omp_get_max_threads();
    return t < max ? t : max;
}

/* A region of this much work starts now (under the lock, adapting): account for it, and at the end
 * of a window let kn_team_step choose the team. */
static void team_account(double work) {
    const double now = mono_now();
    const int live = kn_team_now();
    double run, wait;
    T.team_time += live * (now - T.t_mark), T.t_mark = now;
    if (now - T.t_last > KN_TEAM_GAP_S) { /* idle since: measure afresh */
        team_sample(live, &run, &wait);
        T.t_window = now, T.work = 0;
    }
    T.t_last = now;
    if (now - T.t_window < KN_TEAM_WINDOW_S) {
        T.work += work;
        return;
    }
    team_sample(live, &run, &wait);
    const int next = kn_team_step(&T.ctl, now, T.work, now - T.t_window, run, wait);
    T.t_window = now, T.work = work; /* this region runs in the next window */
    if (next < T.lowest) T.lowest = next;
    atomic_store(&T.team, next);
}

int kn_team(size_t work) {
    pthread_once(&T.once, team_init);
    if (omp_in_parallel() || pthread_mutex_trylock(&T.lock) != 0) return kn_team_now();
    if (T.adaptive) team_account((double)work);
    pthread_mutex_unlock(&T.lock);
    return kn_team_now();
}

void kn_team_fix(int n) {
    pthread_once(&T.once, team_init);
    pthread_mutex_lock(&T.lock);
    T.adaptive = 0;
    T.lowest = n > 0 ? n : omp_get_max_threads();
    atomic_store(&T.team, n > 0 ? n : INT_MAX);
    pthread_mutex_unlock(&T.lock);
}

void kn_team_stats_get(kn_team_stats *s) {
    pthread_once(&T.once, team_init);
    pthread_mutex_lock(&T.lock);
    const double span = T.t_mark - T.t_start;
    *s = (kn_team_stats){.adaptive = T.adaptive,
                         .max = omp_get_max_threads(),
                         .now = kn_team_now(),
                         .lowest = T.lowest,
                         .shrinks = T.ctl.shrinks,
                         .trials = T.ctl.trials,
                         .mean = span > 0 ? T.team_time / span : kn_team_now()};
    pthread_mutex_unlock(&T.lock);
}
