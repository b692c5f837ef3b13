/*
 * mxp_sampler.c -- the stack sampler: a thread of the core that samples
 * every thread of the interpreter at instants of its own choosing.
 *
 * Why a thread of the core and not of Python: a Python thread needs the GIL
 * to look at other threads, and gets it only when the running thread lets
 * go (a sleep, a blocking call, the end of a switch interval).  Its samples
 * then fall where the program waits, never inside C code that holds the GIL,
 * and bursts shorter than the switch interval are missed.  This thread needs
 * nothing from the interpreter: it reads the interpreter's memory
 * (mxp_pyread.c), the OS's view of each thread (/proc), and the core's own
 * range stacks, at one instant per thread.
 *
 * Per instant and thread:
 *   1. the OS state, read now: running or ready to run ('R'), or blocked;
 *      in wall mode a blocked thread's sample ends in a frame "<waiting>"
 *      under the function that blocks; in CPU mode only a thread on a CPU is
 *      sampled: 'R' now and its CPU clock moved since the last look (one
 *      ready to run but not given a CPU has not run), and only once the CPU
 *      time it ran since its last sample covers a sampling interval (so
 *      threads sharing a CPU get samples in proportion to their CPU time);
 *   2. the thread's range stacks pinned (mxpi_sample_pin), its Python stack
 *      read, the innermost open range read and the pin checked
 *      (mxpi_sample_settle): a thread that began or ended a range meanwhile
 *      is read again, so a sample never lands in a range its stack did not
 *      run in;
 *   3. the stack interned as frame and node ids, and the sample recorded in
 *      this thread's buffer (its trace tid: the sampled thread's timeline)
 *      and counted for the statistics.
 *
 * Instants: the gap to the next one is drawn uniformly from [0.5, 1.5) of
 * the period, so work that repeats at the sampling rate is not always caught
 * at the same point of its cycle; a sampler that falls behind takes the next
 * instant from now on (no bursts) and counts it late, and one whose instants
 * take long (many threads at a high rate) waits as long as each took, so it
 * never takes more than half a CPU.
 *
 * Signals are blocked in this thread (the process's handlers run elsewhere),
 * and it asks the kernel for a 1 us timer slack and a short scheduler slice
 * (ask_short_slice), so its instants are where it put them.
 */
#include "mxpi_sampler.h"
#include "mxpi_buffer.h"
#include "mxpi_clock.h"
#include "mxpi_core.h"
#include "mxpi_pyread.h"
#include "mxpi_sample.h"
#include "mxpi_thread.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SKIPS 256u
#define TRIES 4 /* reads of one thread's sample before it is given up */

enum { GONE = -1, BLOCKED = 0, RUNNING = 1 };

/* One of the profiler's own threads (mxp_sampler_skip). */
typedef struct skip {
    int64_t os_tid;
    uint64_t tstate; /* its thread state, once seen (0: not yet) */
    uint32_t gen;    /* the last tick it was seen in */
    bool ending;     /* unmarked: forgotten once its thread state is gone */
} skip;

/* One sampled OS thread: its /proc stat file, kept open, and its last
 * sample while it was blocked (repeated while it stays blocked and idle). */
typedef struct seen {
    int64_t os_tid; /* 0: empty slot */
    int fd;         /* -1: not open */
    uint32_t gen;   /* the last tick it was sampled in */
    int64_t cpu_ns; /* its CPU time at its last blocked sample (-1: none) */
    int64_t cpu_last; /* cpu mode: its CPU time when last looked at (-1: never) */
    int64_t looked;   /* cpu mode: when (CLOCK_MONOTONIC ns) */
    int64_t credit;   /* cpu mode: CPU time run and not yet paid for by a sample */
    uint64_t tstate;
    uint32_t node, range, tid; /* that sample */
    mxpi_pin pin;
} seen;

static struct {
    pthread_mutex_t ctl; /* start/stop */
    pthread_mutex_t lock; /* with wake: the thread's sleep and its stop */
    pthread_cond_t wake;
    bool running, stopping;
    pthread_t thread;
    double period_ns;
    int mode;
    uint64_t rng;
    /* The profiler's own threads (under mxpi_py_lock). */
    skip skip[SKIPS];
    uint32_t nskip;
    /* Used by the sampling thread only (under mxpi_py_lock). */
    seen *seen;
    uint32_t seen_cap, seen_n, gen;
    uint32_t frames[MXPI_PY_DEPTH];
    uint32_t waiting; /* the "<waiting>" frame */
} S = {
    .ctl = PTHREAD_MUTEX_INITIALIZER,
    .lock = PTHREAD_MUTEX_INITIALIZER,
};

static _Atomic uint64_t n_ticks, n_samples, n_late, n_retried, n_lost;
static _Atomic bool sampling; /* the thread runs (S.running, readable without S.ctl) */
static _Atomic int64_t n_busy;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void count(_Atomic uint64_t *c) { atomic_fetch_add_explicit(c, 1, MXPI_RELAXED); }

/* xorshift64*: uniform in [0, 1). */
static double uniform(void) {
    uint64_t x = S.rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    S.rng = x;
    return (double)((x * UINT64_C(0x2545f4914f6cdd1d)) >> 11) * 0x1.0p-53;
}

/* ---- the OS's view of a thread (under mxpi_py_lock) ---- */

static uint32_t slot_of(int64_t os_tid) {
    uint32_t mask = S.seen_cap - 1, i = (uint32_t)((uint64_t)os_tid * 0x9e3779b97f4a7c15u >> 40) & mask;
    while (S.seen[i].os_tid != 0 && S.seen[i].os_tid != os_tid) i = (i + 1) & mask;
    return i;
}

static seen *seen_get(int64_t os_tid) {
    if ((S.seen_n + 1) * 2 > S.seen_cap) {
        uint32_t cap = S.seen_cap ? S.seen_cap * 2 : 64;
        seen *old = S.seen;
        uint32_t old_cap = S.seen_cap;
        seen *e = calloc(cap, sizeof *e);
        if (e == NULL) return NULL;
        S.seen = e;
        S.seen_cap = cap;
        for (uint32_t i = 0; i < old_cap; i++)
            if (old[i].os_tid != 0) S.seen[slot_of(old[i].os_tid)] = old[i];
        free(old);
    }
    seen *e = &S.seen[slot_of(os_tid)];
    if (e->os_tid == 0) {
        *e = (seen){.os_tid = os_tid, .fd = -1, .cpu_ns = -1, .cpu_last = -1};
        S.seen_n++;
    }
    return e;
}

/* Forget e: its thread is gone (the timeline the sampler made for it too,
 * so that a new thread given the same OS id gets a timeline of its own). */
static void seen_drop(seen *e) {
    if (e->fd >= 0) close(e->fd);
    mxpi_spares_end(e->os_tid);
    /* Backward-shift deletion keeps every probe sequence unbroken. */
    uint32_t mask = S.seen_cap - 1, i = (uint32_t)(e - S.seen);
    S.seen[i].os_tid = 0;
    S.seen_n--;
    for (uint32_t j = (i + 1) & mask; S.seen[j].os_tid != 0; j = (j + 1) & mask) {
        seen moved = S.seen[j];
        S.seen[j].os_tid = 0;
        S.seen[slot_of(moved.os_tid)] = moved;
    }
}

static int os_state(seen *e) {
    if (e->fd < 0) {
        char path[64];
        snprintf(path, sizeof path, "/proc/self/task/%lld/stat", (long long)e->os_tid);
        e->fd = open(path, O_RDONLY | O_CLOEXEC);
        if (e->fd < 0) return GONE;
    }
    char text[512];
    ssize_t n = pread(e->fd, text, sizeof text - 1, 0);
    if (n <= 0) return GONE; /* the task ended: its file reads nothing any more */
    text[n] = '\0';
    /* "tid (comm) state ...": the name may hold spaces and parentheses. */
    char *close_paren = strrchr(text, ')');
    if (close_paren == NULL || close_paren[1] == '\0') return RUNNING;
    char state = close_paren[2];
    if (state == 'R') return RUNNING;
    if (state == 'Z' || state == 'X' || state == 'x') return GONE;
    return BLOCKED;
}

/* The CPU time of OS thread os_tid of this process (-1: not known), from
 * its CPU clock: Linux numbers a thread's clock after its id (as glibc's
 * pthread_getcpuclockid does). */
static int64_t cpu_time(int64_t os_tid) {
    clockid_t clock = (clockid_t)((~(unsigned)os_tid << 3) | 6u); /* CPUCLOCK_SCHED, per thread */
    struct timespec ts;
    if (clock_gettime(clock, &ts) != 0) return -1;
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* A thread blocked at its last sample and at this one, that has not run
 * since (its CPU time stood still) and whose ranges did not change (no
 * other thread closed one): its stack and range are what they were, and
 * its last sample is taken again without reading them.  Most threads of a
 * program are such threads most of the time. */
static bool repeat(mxpi_thread *self, seen *e, const mxpi_pythread *t, uint32_t f, int64_t cpu) {
    if (cpu < 0 || cpu != e->cpu_ns || e->tstate != t->addr) return false;
    int64_t ts = mxpi_ticks();
    mxpi_pin pin;
    if (!mxpi_sample_pin(t->os_tid, &pin) || pin.t != e->pin.t || pin.edits != e->pin.edits ||
        pin.moves != e->pin.moves)
        return false;
    mxpi_sample_put(self, f, ts, e->tid, e->range, e->node);
    count(&n_samples);
    return true;
}

/* ---- one thread's sample ---- */

/* Whether thread state t is one of the profiler's own threads.  An entry
 * belongs to the first thread state seen with its OS id: another one with
 * that id (the OS reused it) is a thread of the program's. */
static bool skipped(const mxpi_pythread *t) {
    for (uint32_t i = 0; i < S.nskip; i++) {
        skip *k = &S.skip[i];
        if (k->os_tid != t->os_tid) continue;
        if (k->tstate == 0) k->tstate = t->addr;
        if (k->tstate != t->addr) {
            S.skip[i] = S.skip[--S.nskip];
            return false;
        }
        k->gen = S.gen;
        return true;
    }
    return false;
}

/* Entries whose thread is gone: an ending one as soon as its thread state
 * is not in the list, any other after a while (a thread that never said). */
static void skips_expire(void) {
    for (uint32_t i = 0; i < S.nskip;) {
        skip *k = &S.skip[i];
        if (k->gen != S.gen && k->tstate != 0 && (k->ending || S.gen - k->gen > 1000))
            S.skip[i] = S.skip[--S.nskip];
        else
            i++;
    }
}

/* The node id of the stack read into S.frames[0 .. n) (innermost first),
 * with "<waiting>" on top when the thread was blocked; 0 when full. */
static uint32_t stack_node(int n, bool waiting) {
    uint32_t node = 0;
    for (int i = n - 1; i >= 0; i--)
        if ((node = mxpi_snode_intern(node, S.frames[i])) == 0) return 0;
    if (waiting && (node = mxpi_snode_intern(node, S.waiting)) == 0) return 0;
    return node;
}

static void sample_thread(mxpi_thread *self, mxpi_pythread *t, uint32_t f) {
    seen *e = seen_get(t->os_tid);
    if (e == NULL) return;
    e->gen = S.gen;
    for (int attempt = 0; attempt < TRIES; attempt++) {
        if (attempt > 0) count(&n_retried);
        int state = os_state(e);
        if (state == GONE) {
            seen_drop(e);
            return;
        }
        if (S.mode == MXP_SAMPLE_CPU && attempt == 0) {
            /* A sample stands for one interval between looks of CPU time:
             * the CPU time the thread ran since its last look is credited,
             * and a sample is taken (on a CPU now: running or ready to run)
             * once the credit covers the interval.  Threads sharing one CPU
             * in slices shorter than the interval then get samples in
             * proportion to the CPU they had, not one at every look they
             * had run at all.  The credit is capped at two intervals, so a
             * thread that ran while blocked at the looks brings no burst. */
            int64_t was = e->cpu_last, at = mono_ns();
            e->cpu_last = cpu_time(t->os_tid);
            int64_t interval = e->looked > 0 ? at - e->looked : 0;
            e->looked = at;
            if (was >= 0 && e->cpu_last > was) e->credit += e->cpu_last - was;
            if (interval > 0 && e->credit > 2 * interval) e->credit = 2 * interval;
            if (state == BLOCKED || (was >= 0 && e->cpu_last == was)) return;
            if (interval > 0) {
                if (e->credit < interval) return;
                e->credit -= interval;
            }
        }
        /* Its CPU time before its stack is read: if it runs meanwhile, the
         * next sample sees the time moved and reads the stack again. */
        int64_t cpu = state == BLOCKED && S.mode == MXP_SAMPLE_WALL ? cpu_time(t->os_tid) : -1;
        if (attempt == 0 && repeat(self, e, t, f, cpu)) return;
        e->cpu_ns = -1;
        int64_t ts = mxpi_ticks();
        mxpi_pin pin;
        if (!mxpi_sample_pin(t->os_tid, &pin)) continue;
        /* The innermost frame is read after the pin: read before it, it could
         * be a frame the thread has since left (its memory still holds it)
         * for a range it has since ended, which the pin would not see. */
        if (!mxpi_py_thread(t->addr, t) || t->frame == 0) return; /* it ended */
        uint32_t track = 0, range = 0, tid = 0;
        int n = mxpi_py_stack(t, S.frames, MXPI_PY_DEPTH, &track);
        if (n < 0) continue;
        if (!mxpi_sample_settle(&pin, t->os_tid, track, &range, &tid)) continue;
        if (n == 0) return; /* nothing of the program's on it (a launcher's frames only) */
        uint32_t node = stack_node(n, state == BLOCKED);
        if (node == 0) break;
        if (tid == 0 && (tid = mxpi_sample_timeline(t->os_tid)) == 0) break;
        mxpi_sample_put(self, f, ts, tid, range, node);
        count(&n_samples);
        if (cpu >= 0) { /* blocked: to be taken again while it stays so */
            e->cpu_ns = cpu;
            e->tstate = t->addr;
            e->node = node;
            e->range = range;
            e->tid = tid;
            e->pin = pin;
        }
        return;
    }
    count(&n_lost);
}

static void tick(mxpi_thread *self, int64_t own) {
    uint32_t f = mxpi_flags_now();
    if (!(f & MXP_FLAG_RECORD)) return;
    mxpi_py_lock();
    S.gen++;
    uint64_t a = mxpi_py_first();
    for (uint32_t n = 0; a != 0 && n < MXPI_PY_THREADS; n++) {
        mxpi_pythread t;
        if (!mxpi_py_thread(a, &t)) {
            count(&n_lost); /* the list changed under us: the rest waits for the next tick */
            break;
        }
        a = t.next;
        if (t.os_tid <= 0 || t.os_tid == own || skipped(&t) || t.frame == 0) continue;
        sample_thread(self, &t, f);
    }
    if (a == 0) skips_expire(); /* the whole list was read */
    /* Now and then, let go of the files of threads no longer sampled. */
    if ((S.gen & 63u) == 0)
        for (uint32_t i = 0; i < S.seen_cap; i++)
            if (S.seen[i].os_tid != 0 && S.gen - S.seen[i].gen > 64) seen_drop(&S.seen[i--]);
    mxpi_py_unlock();
}

/* Ask the scheduler for a short slice (EEVDF, Linux 6.12 on; no privilege
 * needed): woken at its instant, the thread then gets a CPU at once instead
 * of waiting behind a thread that has just woken on the same CPU, which
 * would put the instant after that thread's burst and hide the burst
 * (docs/performance.md: 8 to 10 points off on the lock workload without it,
 * 1 to 3 with).  Its policy and nice value are kept; a real-time or idle
 * class is left alone; a kernel without the feature ignores the hint or
 * refuses it, and nothing else changes. */
static void ask_short_slice(void) {
#ifdef SYS_sched_getattr
    struct {
        uint32_t size, policy;
        uint64_t flags;
        int32_t nice;
        uint32_t priority;
        uint64_t runtime, deadline, period;
    } a;
    memset(&a, 0, sizeof a);
    if (syscall(SYS_sched_getattr, 0, &a, sizeof a, 0) != 0) return;
    if (a.policy != SCHED_OTHER && a.policy != SCHED_BATCH) return;
    a.size = sizeof a;
    a.flags = 0;
    a.runtime = 100000; /* ns: the shortest slice the kernel grants */
    (void)syscall(SYS_sched_setattr, 0, &a, 0);
#endif
}

static void *run(void *arg) {
    (void)arg;
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    ask_short_slice();
    int rc = MXP_OK;
    mxpi_thread *self = mxpi_self(&rc);
    int64_t own = (int64_t)syscall(SYS_gettid);
    int64_t due = mono_ns();
    pthread_mutex_lock(&S.lock);
    while (!S.stopping) {
        due += (int64_t)(S.period_ns * (0.5 + uniform()));
        struct timespec at = {(time_t)(due / 1000000000), (long)(due % 1000000000)};
        while (!S.stopping && pthread_cond_timedwait(&S.wake, &S.lock, &at) != ETIMEDOUT) {
        }
        if (S.stopping) break;
        pthread_mutex_unlock(&S.lock);
        int64_t start = mono_ns();
        if (start - due > (int64_t)S.period_ns) {
            count(&n_late);
            due = start;
        }
        if (self != NULL) tick(self, own);
        count(&n_ticks);
        int64_t end = mono_ns();
        atomic_fetch_add_explicit(&n_busy, end - start, MXPI_RELAXED);
        /* At most half a CPU, however many threads at whatever rate: after an
         * instant that took t, the next is t later at least. */
        int64_t floor = end + (end - start) - (int64_t)(S.period_ns * 0.5); /* gaps are >= half */
        if (due < floor) due = floor;
        pthread_mutex_lock(&S.lock);
    }
    pthread_mutex_unlock(&S.lock);
    return NULL;
}

/* ---- control ---- */

static void wake_init(void) {
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&S.wake, &attr);
    pthread_condattr_destroy(&attr);
}

/* A forked child has no sampling thread (the binding starts one again) and
 * must not read the parent's threads' /proc files. */
static void fork_child(void) {
    pthread_mutex_init(&S.ctl, NULL);
    pthread_mutex_init(&S.lock, NULL);
    wake_init();
    S.running = S.stopping = false;
    atomic_store_explicit(&sampling, false, MXPI_RELAXED);
    for (uint32_t i = 0; i < S.seen_cap; i++)
        if (S.seen[i].os_tid != 0 && S.seen[i].fd >= 0) close(S.seen[i].fd);
    if (S.seen != NULL) memset(S.seen, 0, S.seen_cap * sizeof *S.seen);
    S.seen_n = 0;
    S.nskip = 0; /* the parent's threads */
    mxpi_sampler_reset(); /* a new process: its own tallies */
}

static void init_once(void) {
    wake_init();
    pthread_atfork(NULL, NULL, fork_child);
}

static void stop_locked(void) {
    if (!S.running) return;
    pthread_mutex_lock(&S.lock);
    S.stopping = true;
    pthread_cond_broadcast(&S.wake);
    pthread_mutex_unlock(&S.lock);
    pthread_join(S.thread, NULL);
    S.running = false;
    atomic_store_explicit(&sampling, false, MXPI_RELAXED);
    /* The timelines made for threads that never recorded end with it: a
     * thread sampled again later gets a new one (its OS id may be another
     * thread's by then). */
    mxpi_py_lock();
    for (uint32_t i = 0; i < S.seen_cap; i++)
        if (S.seen[i].os_tid != 0 && S.seen[i].fd >= 0) close(S.seen[i].fd);
    if (S.seen != NULL) memset(S.seen, 0, S.seen_cap * sizeof *S.seen);
    S.seen_n = 0;
    mxpi_py_unlock();
    mxpi_spares_end(0);
}

int mxp_sampler_start(double hz, int mode, uint64_t seed) {
    pthread_once(&once, init_once);
    if (!(hz > 0 && hz <= 20000) || (mode != MXP_SAMPLE_WALL && mode != MXP_SAMPLE_CPU))
        return MXP_E_INVALID;
    if (!mxpi_py_ready()) return MXP_E_STATE;
    pthread_mutex_lock(&S.ctl);
    stop_locked();
    uint32_t waiting = mxpi_sframe_intern("<waiting>", 9, "", 0, 0);
    int rc = waiting ? MXP_OK : MXP_E_NOMEM;
    if (rc == MXP_OK) {
        S.waiting = waiting;
        S.period_ns = 1e9 / hz;
        S.mode = mode;
        S.rng = seed ? seed : UINT64_C(0x9e3779b97f4a7c15);
        S.stopping = false;
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old); /* the thread starts with every signal blocked */
        rc = pthread_create(&S.thread, NULL, run, NULL) == 0 ? MXP_OK : MXP_E_NOMEM;
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        S.running = rc == MXP_OK;
        atomic_store_explicit(&sampling, S.running, MXPI_RELAXED);
    }
    pthread_mutex_unlock(&S.ctl);
    return rc;
}

int mxp_sampler_stop(void) {
    pthread_once(&once, init_once);
    pthread_mutex_lock(&S.ctl);
    stop_locked();
    pthread_mutex_unlock(&S.ctl);
    return MXP_OK;
}

int mxp_sampler_skip(int64_t os_tid, int skip_it) {
    if (os_tid <= 0) return MXP_E_INVALID;
    int rc = MXP_OK;
    mxpi_py_lock();
    if (skip_it && S.nskip == SKIPS) { /* full: ending threads' marks go first */
        for (uint32_t k = 0; k < S.nskip;) {
            if (S.skip[k].ending)
                S.skip[k] = S.skip[--S.nskip];
            else
                k++;
        }
    }
    uint32_t i = 0;
    while (i < S.nskip && S.skip[i].os_tid != os_tid) i++;
    if (skip_it) {
        if (i < S.nskip)
            S.skip[i] = (skip){os_tid, 0, S.gen, false}; /* a new thread with that id */
        else if (S.nskip < SKIPS)
            S.skip[S.nskip++] = (skip){os_tid, 0, S.gen, false};
        else
            rc = MXP_E_FULL;
    } else if (i < S.nskip) {
        if (atomic_load_explicit(&sampling, MXPI_RELAXED))
            S.skip[i].ending = true; /* still skipped while its frames unwind */
        else
            S.skip[i] = S.skip[--S.nskip]; /* no sampler to see it unwind */
    }
    mxpi_py_unlock();
    return rc;
}

void mxp_sampler_stats_get(mxp_sampler_stats *out) {
    out->ticks = atomic_load_explicit(&n_ticks, MXPI_RELAXED);
    out->samples = atomic_load_explicit(&n_samples, MXPI_RELAXED);
    out->late = atomic_load_explicit(&n_late, MXPI_RELAXED);
    out->retried = atomic_load_explicit(&n_retried, MXPI_RELAXED);
    out->lost = atomic_load_explicit(&n_lost, MXPI_RELAXED);
    out->busy_ns = atomic_load_explicit(&n_busy, MXPI_RELAXED);
    pthread_mutex_lock(&S.ctl);
    out->running = S.running;
    pthread_mutex_unlock(&S.ctl);
}

void mxpi_sampler_reset(void) {
    atomic_store_explicit(&n_ticks, 0, MXPI_RELAXED);
    atomic_store_explicit(&n_samples, 0, MXPI_RELAXED);
    atomic_store_explicit(&n_late, 0, MXPI_RELAXED);
    atomic_store_explicit(&n_retried, 0, MXPI_RELAXED);
    atomic_store_explicit(&n_lost, 0, MXPI_RELAXED);
    atomic_store_explicit(&n_busy, 0, MXPI_RELAXED);
}
