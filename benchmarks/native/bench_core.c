/*
 * bench_core.c -- the core's C API timed in C loops (no Python involved).
 *
 * Built against the core's sources by benchmarks/run.py (or by hand:
 *   gcc -O2 -std=c11 -pthread -Inative/include -Inative/src
 *       benchmarks/native/bench_core.c native/src/mxp_*.c -o bench_core)
 * and run as `bench_core <case> <iterations>`; prints one JSON object.
 *
 * Cases:
 *   clock      two clock reads (what a range costs at least)
 *   range      mxp_range_begin + mxp_range_end, recording, trace + statistics;
 *              timed in batches of BATCH ranges with the buffers drained in
 *              between, untimed: the steady state of a run whose background
 *              writer recycles chunks
 *   fresh      the same without draining: every record lands in memory never
 *              touched before (first-touch page faults included)
 *   trace      as range, trace only
 *   aggregate  as range, statistics only
 *   stopped    as range, while not recording
 *   threads1 / threads2
 *              ranges on 1 or 2 threads at once (aggregate throughput), while
 *              a third thread drains the buffers every millisecond, as the
 *              background writer of a long run would
 *   memory     heap bytes per buffered range (mallinfo2 before and after)
 */
#define _GNU_SOURCE
#include "mxpi_clock.h"

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint32_t range_id;
static volatile int64_t sink;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define BATCH 65536L

static void ranges(long n) {
    for (long i = 0; i < n; i++) {
        mxp_range_begin(range_id);
        mxp_range_end(range_id);
    }
}

/* Seconds spent in ranges(n), run in batches with the buffers drained
 * (untimed) in between. */
static double batched(long n) {
    double spent = 0;
    for (long done = 0; done < n; done += BATCH) {
        long k = n - done < BATCH ? n - done : BATCH;
        double t = now_s();
        ranges(k);
        spent += now_s() - t;
        mxp_trace_discard();
    }
    return spent;
}

static void *thread_main(void *arg) {
    ranges(*(long *)arg);
    return NULL;
}

static _Atomic int draining;

static void *drainer_main(void *arg) {
    (void)arg;
    struct timespec ms = {0, 1000000};
    while (atomic_load(&draining)) {
        mxp_trace_discard();
        nanosleep(&ms, NULL);
    }
    return NULL;
}

static void setup(uint32_t flags) {
    mxp_init();
    mxp_reset();
    mxp_max_events_set(0);
    mxp_object_register(MXP_KIND_TASK, "bench", 5, "range", 5, &range_id);
    mxp_profile_begin();
    mxp_flags_update(flags, 0);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s clock|range|fresh|trace|aggregate|stopped|threads1|threads2|memory N\n",
                argv[0]);
        return 2;
    }
    const char *c = argv[1];
    long n = atol(argv[2]);
    uint32_t all = MXP_FLAG_RECORD | MXP_FLAG_TRACE | MXP_FLAG_AGGREGATE;
    double t0, t1;
    if (strcmp(c, "clock") == 0) {
        setup(0);
        t0 = now_s();
        for (long i = 0; i < n; i++) sink += mxpi_ticks() - mxpi_ticks();
        t1 = now_s();
    } else if (strcmp(c, "range") == 0 || strcmp(c, "trace") == 0 || strcmp(c, "aggregate") == 0 ||
               strcmp(c, "stopped") == 0) {
        uint32_t f = strcmp(c, "range") == 0   ? all
                     : strcmp(c, "trace") == 0 ? MXP_FLAG_RECORD | MXP_FLAG_TRACE
                     : strcmp(c, "aggregate") == 0 ? MXP_FLAG_RECORD | MXP_FLAG_AGGREGATE
                                                   : 0;
        setup(f);
        batched(BATCH); /* warm: chunks, pages, histogram allocated */
        t0 = 0;
        t1 = batched(n);
    } else if (strcmp(c, "fresh") == 0) {
        setup(all);
        ranges(1000);
        mxp_trace_discard();
        t0 = now_s();
        ranges(n);
        t1 = now_s();
    } else if (strcmp(c, "threads1") == 0 || strcmp(c, "threads2") == 0) {
        int k = c[7] - '0';
        setup(all);
        pthread_t th[2], drainer;
        atomic_store(&draining, 1);
        pthread_create(&drainer, NULL, drainer_main, NULL);
        t0 = now_s();
        for (int i = 0; i < k; i++) pthread_create(&th[i], NULL, thread_main, &n);
        for (int i = 0; i < k; i++) pthread_join(th[i], NULL);
        t1 = now_s();
        atomic_store(&draining, 0);
        pthread_join(drainer, NULL);
        n *= k;
    } else if (strcmp(c, "memory") == 0) {
        setup(all);
        ranges(1000);
        mxp_trace_discard();
        struct mallinfo2 before = mallinfo2();
        ranges(n);
        struct mallinfo2 after = mallinfo2();
        size_t used = (after.uordblks + after.hblkhd) - (before.uordblks + before.hblkhd);
        printf("{\"case\":\"memory\",\"ranges\":%ld,\"bytes\":%zu,\"bytes_per_range\":%.3f}\n", n, used,
               (double)used / (double)n);
        return 0;
    } else {
        fprintf(stderr, "unknown case %s\n", c);
        return 2;
    }
    printf("{\"case\":\"%s\",\"events\":%ld,\"seconds\":%.6f,\"ns_per_op\":%.3f,\"per_second\":%.0f}\n", c, n,
           t1 - t0, (t1 - t0) * 1e9 / (double)n, (double)n / (t1 - t0));
    return 0;
}
