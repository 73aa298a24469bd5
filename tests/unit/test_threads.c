/* The kernels' adaptive team (src/kernels/threads.c, docs/threads.md):
 * - the decision (kn_team_step) on scripted windows: no trial without contention; a contended
 *   team tries fewer threads (about the cores it got) between two windows on its own team, and
 *   keeps them if they did at least 97% of the work per second; a smaller team tries one thread
 *   more and keeps it at 103% or more; failed trials back off from 0.5 s, doubling up to 8 s, and
 *   at least long enough that windows as slow as the trial's cost 2% of the time;
 * - live, with the process confined to one CPU (ctest unsets OMP_NUM_THREADS, so the team adapts):
 *   the threads wait for that CPU, so trials run; every product meanwhile gives the same bits,
 *   whatever the team, adapting or fixed. */
#include <math.h>
#include <omp.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dfl/kernels.h"
#include "kernels/kn_internal.h"
#include "testutil.h"

#define W 0.15 /* a window, s */

/* One window at this rate (work per second) and waiting share of the threads' time. */
static int step(kn_team_ctl *c, double now, double rate, double share) {
    return kn_team_step(c, now, rate * W, W, 1.0 - share, share);
}

/* One trial from team c->team: windows at these rates before, on the other team and after, the
 * first with this waiting share; returns the team after it. */
static int trial(kn_team_ctl *c, double now, double share, double before, double other, double after) {
    const int team = c->team, got = step(c, now, before, share);
    CHECK(got != team && c->trial == 1, "a trial from %d threads at %.2f s (share %.2f)", team, now, share);
    CHECK(step(c, now + W, other, 0) == team, "back on %d threads after the trial's window", team);
    return step(c, now + 2 * W, after, 0);
}

static void check_step(void) {
    kn_team_ctl c = {.team = 2, .max = 2};
    CHECK(step(&c, 1.0, 100, 0.02) == 2 && c.trials == 0, "2%% waiting: no trial");
    CHECK(step(&c, 1.15, 100, 0) == 2 && c.trials == 0, "idle at the cap: no trial");
    /* contended, and 1 thread does 1.5x as much: kept; trying 2 again would cost half a window */
    CHECK(trial(&c, 2.0, 0.33, 100, 150, 100) == 1 && c.shrinks == 1, "1 thread at 150%%: kept");
    CHECK(fabs(c.wait_more - 0.5 * W / 0.02) < 1e-9, "one more thread tried after 3.75 s, not %.2f", c.wait_more);
    CHECK(step(&c, 3.0, 150, 0) == 1 && c.trial == 0, "no try before it");
    CHECK(trial(&c, c.next_more, 0, 150, 100, 150) == 1 && c.wait_more == 7.5, "a failed try: twice the wait");
    CHECK(trial(&c, c.next_more, 0, 150, 100, 150) == 1 && c.wait_more == 8.0, "up to 8 s, got %.1f", c.wait_more);
    /* tries that fail by little: the wait doubles from 0.5 s */
    c = (kn_team_ctl){.team = 1, .max = 2};
    double now = 1.0;
    for (int i = 0; i < 6; i++) {
        CHECK(trial(&c, now, 0, 100, 99, 100) == 1, "try %d of 2 threads undone", i);
        CHECK(c.wait_more == (i < 4 ? 0.5 * (1 << i) : 8.0), "try %d: back-off %.2f s", i, c.wait_more);
        CHECK(step(&c, c.next_more - 0.01, 100, 0) == 1, "no try within the back-off");
        now = c.next_more;
    }
    /* a 2% gain is not enough for one thread more, 4% is; drift between the windows is averaged */
    CHECK(trial(&c, now, 0, 100, 104, 110) == 1, "104 against a mean of 105: undone");
    CHECK(trial(&c, c.next_more, 0, 100, 104, 100) == 2 && c.wait_more == 0.5, "104%%: kept, back-off reset");
    CHECK(fabs(c.next_fewer - c.next_more) < 1e-9, "a small gain: both directions may look again in 0.5 s");
    /* contended, and fewer threads do less: undone, and the wait covers the slow window */
    now = c.next_fewer;
    CHECK(trial(&c, now, 0.5, 100, 80, 100) == 2 && fabs(c.wait_fewer - 0.25 * W / 0.02) < 1e-9,
          "1 thread at 80%%: undone, next try in 1.875 s, not %.3f", c.wait_fewer);
    CHECK(step(&c, c.next_fewer - 0.01, 100, 0.5) == 2 && c.trial == 0, "no trial within the back-off");
    CHECK(trial(&c, c.next_fewer, 0.5, 100, 98, 100) == 1, "98%% of the rate with fewer threads: kept");
    /* many threads: the trial takes about the cores they got */
    c = (kn_team_ctl){.team = 16, .max = 16};
    CHECK(kn_team_step(&c, 1.0, 100, W, 1.6, 0.2) == 14 && c.other == 14, "2 busy cores of 16: try 14, got %d",
          c.other);
    c = (kn_team_ctl){.team = 3, .max = 3};
    CHECK(kn_team_step(&c, 1.0, 100, W, 3.0, 0.1) == 3 && c.trials == 0, "3%% waiting on 3 threads: no trial");
    CHECK(kn_team_step(&c, 1.3, 100, W, 3.0, 0.2) == 2, "6%% waiting on 3 threads: try 2 (the fit rounds to 3)");
    c = (kn_team_ctl){.team = 1, .max = 1};
    CHECK(step(&c, 1.0, 100, 0.5) == 1 && c.trials == 0, "1 thread of 1: nothing to try");
}

/* y = x . W^T with a 160 x 2048 float32 matrix, 8 tokens: a region every call. */
static void product(float *y, const float *x, const float *w) {
    const dfl_mat m = {.data = w, .dtype = ST_F32, .rows = 160, .cols = 2048};
    kn_matmul(y, x, &m, 8);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(void) {
    check_step();
    const int max = omp_get_max_threads();
    float *w = malloc(sizeof(float) * 160 * 2048), *x = malloc(sizeof(float) * 8 * 2048);
    float *ref = malloc(sizeof(float) * 8 * 160), *y = malloc(sizeof(float) * 8 * 160);
    srand(7);
    for (int i = 0; i < 160 * 2048; i++) w[i] = (float)rand() / RAND_MAX - 0.5f;
    for (int i = 0; i < 8 * 2048; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
    /* every OpenMP thread starts after this, on one CPU: the team's threads take turns on it */
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu(), &one);
    const int confined = sched_setaffinity(0, sizeof one, &one) == 0;
    kn_team_stats s;
    kn_team_stats_get(&s);
    if (getenv("OMP_NUM_THREADS")) {
        CHECK(!s.adaptive, "OMP_NUM_THREADS set: a fixed team");
    } else if (max > 1 && confined) {
        CHECK(s.adaptive, "no OMP_NUM_THREADS, %d threads: the team adapts (/proc/thread-self/schedstat?)", max);
        product(ref, x, w);
        const double t0 = now_s();
        int differ = 0, teams = 0;
        do { /* the trials' outcome depends on the machine: their running does not */
            product(y, x, w);
            differ += memcmp(y, ref, sizeof(float) * 8 * 160) != 0;
            teams |= 1 << (kn_team_now() < 31 ? kn_team_now() : 31);
            kn_team_stats_get(&s);
        } while (s.trials < 2 && now_s() - t0 < 60);
        CHECK(s.trials >= 2, "%d threads on one CPU: %ld trials in 60 s", max, s.trials);
        CHECK(teams != 1 << max, "the team never left %d threads", max);
        CHECK(differ == 0, "%d products differ from the first", differ);
        kn_team_fix(0);
        kn_team_stats_get(&s);
        CHECK(!s.adaptive && s.now == max, "kn_team_fix(0): fixed at %d, got %d", max, s.now);
        product(y, x, w);
        CHECK(memcmp(y, ref, sizeof(float) * 8 * 160) == 0, "%d threads fixed differ", max);
    } else {
        printf("test_threads: %d thread(s) or no affinity: the live checks skipped\n", max);
    }
    free(w), free(x), free(ref), free(y);
    return test_done("test_threads");
}
