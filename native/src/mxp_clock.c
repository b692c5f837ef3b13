/*
 * mxp_clock.c -- the core's clock.
 *
 * The hot path reads raw ticks: the TSC where it is invariant and the kernel
 * itself trusts it (about 10 ns a read), CLOCK_MONOTONIC otherwise (about
 * 25 ns).  Ticks become nanoseconds only when records are written or
 * statistics rendered, through a timebase anchored at initialisation and
 * re-measured on every use, so the tick rate is known ever more precisely
 * as the process runs.  MXPROF_CLOCK=monotonic forces the portable source.
 */
#include "mxpi_clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if MXPI_HAVE_TSC
#include <cpuid.h>
#endif

int mxpi_clock_mode = MXP_CLOCK_MONOTONIC;
_Atomic int64_t mxpi_fake_now;

static int real_mode = MXP_CLOCK_MONOTONIC;
static pthread_mutex_t tb_lock = PTHREAD_MUTEX_INITIALIZER;

#if MXPI_HAVE_TSC
/* The TSC's side of the timebase; without a TSC ticks are ns and need none. */
static int64_t anchor_tick;
static int64_t anchor_ns;

/* Ticks must span at least this long before their rate is trusted. */
#define MIN_CALIBRATION_NS 2000000
#endif

int64_t mxpi_monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t mxpi_realtime_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t mxpi_ticks_slow(void) {
    if (mxpi_clock_mode == MXP_CLOCK_FAKE) return atomic_load_explicit(&mxpi_fake_now, MXPI_RELAXED);
    return mxpi_monotonic_ns();
}

#if MXPI_HAVE_TSC
static bool tsc_invariant(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(0x80000000u, &a, &b, &c, &d) || a < 0x80000007u) return false;
    __get_cpuid(0x80000007u, &a, &b, &c, &d);
    return (d >> 8) & 1u;
}

/* The kernel demotes the TSC when it finds it unstable; follow its verdict. */
static bool kernel_trusts_tsc(void) {
    FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
    if (f == NULL) return true; /* cannot tell: rely on the CPU flag */
    char line[64] = {0};
    bool ok = fgets(line, sizeof line, f) != NULL && strncmp(line, "tsc", 3) == 0;
    fclose(f);
    return ok;
}

/* A (tick, ns) pair read as close together as the machine allows: the ns
 * reading is the midpoint of two around the tick, best of a few tries. */
static void tsc_pair(int64_t *tick, int64_t *ns) {
    int64_t best = INT64_MAX;
    for (int i = 0; i < 5; i++) {
        int64_t n0 = mxpi_monotonic_ns();
        int64_t t = (int64_t)__rdtsc();
        int64_t n1 = mxpi_monotonic_ns();
        if (n1 - n0 < best) {
            best = n1 - n0;
            *tick = t;
            *ns = n0 + (n1 - n0) / 2;
        }
    }
}
#endif

void mxpi_clock_init(void) {
    const char *env = getenv("MXPROF_CLOCK");
    int mode = MXP_CLOCK_MONOTONIC;
#if MXPI_HAVE_TSC
    bool want_tsc = env == NULL || strcmp(env, "tsc") == 0;
    if (want_tsc && tsc_invariant() && (env != NULL || kernel_trusts_tsc())) mode = MXP_CLOCK_TSC;
    if (mode == MXP_CLOCK_TSC) tsc_pair(&anchor_tick, &anchor_ns);
#else
    (void)env;
#endif
    real_mode = mode;
    mxpi_clock_mode = mode;
}

void mxpi_timebase_get(mxpi_timebase *tb) {
    pthread_mutex_lock(&tb_lock);
    tb->tick0 = 0;
    tb->ns0 = 0;
    tb->ns_per_tick = 1.0;
#if MXPI_HAVE_TSC
    if (mxpi_clock_mode == MXP_CLOCK_TSC) {
        int64_t tick, ns;
        tsc_pair(&tick, &ns);
        while (ns - anchor_ns < MIN_CALIBRATION_NS) tsc_pair(&tick, &ns);
        tb->tick0 = anchor_tick;
        tb->ns0 = anchor_ns;
        tb->ns_per_tick = (double)(ns - anchor_ns) / (double)(tick - anchor_tick);
    }
#endif
    pthread_mutex_unlock(&tb_lock);
}

int64_t mxp_clock_ns(void) {
    mxp_init();
    if (mxpi_clock_mode == MXP_CLOCK_FAKE) return atomic_load_explicit(&mxpi_fake_now, MXPI_RELAXED);
    return mxpi_monotonic_ns();
}

int mxp_clock_source(void) {
    mxp_init();
    return mxpi_clock_mode;
}

void mxp_clock_fake(int enabled, int64_t now_ns) {
    mxp_init();
    atomic_store_explicit(&mxpi_fake_now, now_ns, MXPI_RELAXED);
    mxpi_clock_mode = enabled ? MXP_CLOCK_FAKE : real_mode;
}

static _Atomic int64_t wall_skew;

int64_t mxp_clock_wall_ns(void) {
    return mxpi_realtime_ns() + atomic_load_explicit(&wall_skew, MXPI_RELAXED);
}

void mxp_clock_skew_set(int64_t skew_ns) { atomic_store_explicit(&wall_skew, skew_ns, MXPI_RELAXED); }

void mxp_clock_fake_advance(int64_t delta_ns) {
    atomic_fetch_add_explicit(&mxpi_fake_now, delta_ns, MXPI_RELAXED);
}
