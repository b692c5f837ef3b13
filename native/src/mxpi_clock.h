/*
 * mxpi_clock.h -- the core's clock (mxp_clock.c): raw ticks on the hot
 * path, converted to ns through a timebase only by writers and statistics.
 */
#ifndef MXPI_CLOCK_H
#define MXPI_CLOCK_H

#include "mxpi_base.h"

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define MXPI_HAVE_TSC 1
#else
#define MXPI_HAVE_TSC 0
#endif

/* Set once by mxpi_clock_init and by the fake-clock test hook. */
extern int mxpi_clock_mode;
extern _Atomic int64_t mxpi_fake_now;

int64_t mxpi_ticks_slow(void);
void mxpi_clock_init(void);

/* The hot-path clock: raw ticks (TSC cycles, or ns for the other sources).
 * Ticks become ns only in writers and statistics, through a timebase. */
static inline int64_t mxpi_ticks(void) {
#if MXPI_HAVE_TSC
    if (MXPI_LIKELY(mxpi_clock_mode == MXP_CLOCK_TSC)) return (int64_t)__rdtsc();
#endif
    return mxpi_ticks_slow();
}

/* A linear map from ticks to monotonic ns, refreshed on every call of
 * mxpi_timebase_get (the longer the process runs, the finer the ratio). */
typedef struct mxpi_timebase {
    int64_t tick0;
    int64_t ns0;
    double ns_per_tick;
} mxpi_timebase;

void mxpi_timebase_get(mxpi_timebase *tb);
int64_t mxpi_realtime_ns(void);
int64_t mxpi_monotonic_ns(void);

static inline int64_t mxpi_tb_span(const mxpi_timebase *tb, int64_t ticks) {
    double ns = (double)ticks * tb->ns_per_tick;
    return (int64_t)(ns < 0 ? ns - 0.5 : ns + 0.5);
}

#endif /* MXPI_CLOCK_H */
