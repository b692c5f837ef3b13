/*
 * mxp_core.c -- global state, initialisation, session flags, tallies, and
 * the fork handlers.
 */
#include "mxpi_core.h"
#include "mxpi_buffer.h"
#include "mxpi_claim.h"
#include "mxpi_clock.h"
#include "mxpi_memory.h"
#include "mxpi_registry.h"
#include "mxpi_sample.h"
#include "mxpi_sampler.h"
#include "mxpi_thread.h"
#include "mxpi_trace.h"
#include "mxpi_track.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* No limit on buffered records: large, but far from overflowing the
 * budget's bits on adds. */
#define UNLIMITED_BUDGET (UINT64_C(1) << (MXPI_BUDGET_BITS - 1u))

mxpi_global mxpi_g = {
    .reg_lock = PTHREAD_MUTEX_INITIALIZER,
    .out_lock = PTHREAD_MUTEX_INITIALIZER,
    .free_lock = PTHREAD_MUTEX_INITIALIZER,
    .names_lock = PTHREAD_MUTEX_INITIALIZER,
};

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void wake_init(void) {
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_mutex_init(&mxpi_g.wake_lock, NULL);
    pthread_cond_init(&mxpi_g.wake_cond, &attr);
    pthread_condattr_destroy(&attr);
    mxpi_g.wake_flag = false;
}

/* Fork: hold the short locks across fork() (in the lock order) so the child
 * inherits consistent tracks, memory table, registry and free-list state; parent and child
 * (whose one thread is the one that took them) then release them.  The
 * writer's lock is not taken (a flush can run for seconds); the child
 * abandons the writer's state instead. */
static void fork_prepare(void) {
    mxpi_tracks_fork_lock();
    mxpi_memory_fork_lock();
    pthread_mutex_lock(&mxpi_g.reg_lock);
    pthread_mutex_lock(&mxpi_g.free_lock);
    pthread_mutex_lock(&mxpi_g.names_lock);
}

static void fork_release(void) {
    pthread_mutex_unlock(&mxpi_g.names_lock);
    pthread_mutex_unlock(&mxpi_g.free_lock);
    pthread_mutex_unlock(&mxpi_g.reg_lock);
    mxpi_memory_fork_unlock();
    mxpi_tracks_fork_unlock();
}

static void fork_child(void) {
    pthread_mutex_init(&mxpi_g.out_lock, NULL); /* another thread's, perhaps */
    /* Only the forking thread exists here: the thread list keeps its state
     * and the open tracks, with empty buffers (mxpi_threads_after_fork). */
    mxpi_threads_after_fork();
    fork_release(); /* this thread took them */
    mxpi_g.retired_unmatched = mxpi_g.retired_non_lifo = 0;
    mxpi_g.retired_ignored = mxpi_g.retired_dropped = mxpi_g.retired_cut = 0;
    atomic_store(&mxpi_g.pending_chunks, 0); /* the parent's chunks are abandoned */
    mxpi_budget_recount(); /* nothing is buffered here */
    wake_init();
    atomic_fetch_and_explicit(&mxpi_g.flags, ~(uint32_t)(MXP_FLAG_RECORD | MXP_FLAG_TRACE), MXPI_RELAXED);
    mxpi_trace_after_fork();
    mxpi_memory_after_fork();
    MXPI_STORE(mxpi_g.unknown_frees, 0);
    MXPI_STORE(mxpi_g.saturated, 0);
    MXPI_STORE(mxpi_g.invalid, 0);
    mxp_stats_reset(); /* the parent's statistics are not the child's */
}

static void init_once_fn(void) {
    wake_init();
    mxpi_clock_init();
    atomic_store(&mxpi_g.budget, UNLIMITED_BUDGET); /* epoch 0, as the flags */
    mxpi_registry_init();
    mxpi_threads_init();
    mxpi_claim_init();
    pthread_atfork(fork_prepare, fork_release, fork_child);
}

int mxp_init(void) {
    pthread_once(&init_once, init_once_fn);
    return MXP_OK;
}

int mxp_noop(uint32_t id) {
    (void)id;
    return MXP_OK;
}

int mxp_noop_released(uint32_t id) {
    (void)id;
    return MXP_OK;
}

static _Atomic int64_t last_reading;

int mxp_noop_clock(uint32_t id) {
    atomic_store_explicit(&last_reading, mxpi_ticks() + id, MXPI_RELAXED);
    return MXP_OK;
}

#define FLAG_MASK \
    ((uint32_t)(MXP_FLAG_RECORD | MXP_FLAG_TRACE | MXP_FLAG_AGGREGATE | MXP_FLAG_MEMORY | MXP_FLAG_MEMORY_EVENTS | \
                MXP_FLAG_NVTX))

uint32_t mxp_flags_update(uint32_t set, uint32_t clear) {
    mxp_init();
    set &= FLAG_MASK;
    clear &= FLAG_MASK;
    pthread_mutex_lock(&mxpi_g.reg_lock);
    uint32_t old = atomic_load(&mxpi_g.flags);
    uint32_t neu;
    do {
        neu = (old & ~clear) | set;
    } while (!atomic_compare_exchange_weak(&mxpi_g.flags, &old, neu));
    /* Keep the time spent recording: the wall time statistics cover. */
    if ((neu & MXP_FLAG_RECORD) && !(old & MXP_FLAG_RECORD)) {
        mxpi_g.recording_since = mxpi_ticks();
    } else if (!(neu & MXP_FLAG_RECORD) && (old & MXP_FLAG_RECORD)) {
        mxpi_g.recorded += mxpi_ticks() - mxpi_g.recording_since;
    }
    pthread_mutex_unlock(&mxpi_g.reg_lock);
    if ((neu & MXP_FLAG_AGGREGATE) && !(old & MXP_FLAG_AGGREGATE)) mxp_stats_reset();
    return neu & FLAG_MASK;
}

void mxpi_budget_recount(void) {
    uint64_t cap = mxpi_g.max_events ? mxpi_g.max_events : UNLIMITED_BUDGET;
    uint64_t held = mxpi_buffered_records();
    uint32_t f = atomic_load(&mxpi_g.flags);
    uint64_t epoch = (MXPI_CAP_EPOCH(f) + 1u) & MXPI_CAP_EPOCH_MASK;
    /* The budget first: a thread that follows the new flags finds it ready. */
    atomic_store(&mxpi_g.budget, epoch << MXPI_BUDGET_BITS | (cap > held ? cap - held : 0));
    atomic_fetch_add(&mxpi_g.flags, 1u << MXPI_CAP_EPOCH_SHIFT);
}

void mxpi_wake_writer(void) {
    pthread_mutex_lock(&mxpi_g.wake_lock);
    mxpi_g.wake_flag = true;
    pthread_cond_signal(&mxpi_g.wake_cond);
    pthread_mutex_unlock(&mxpi_g.wake_lock);
}

void mxpi_chunks_freed(int64_t n) {
    if (n) atomic_fetch_sub_explicit(&mxpi_g.pending_chunks, n, MXPI_RELAXED);
}

int mxp_flush_threshold_set(uint64_t records) {
    mxp_init();
    uint64_t chunks = (records + MXPI_CHUNK_RECORDS - 1) / MXPI_CHUNK_RECORDS;
    atomic_store(&mxpi_g.wake_chunks, chunks > UINT32_MAX ? UINT32_MAX : (uint32_t)chunks);
    return MXP_OK;
}

int mxp_flush_wait(int64_t timeout_ns) {
    mxp_init();
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    if (timeout_ns < 0) timeout_ns = 0;
    deadline.tv_sec += timeout_ns / 1000000000;
    deadline.tv_nsec += timeout_ns % 1000000000;
    if (deadline.tv_nsec >= 1000000000) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000;
    }
    /* Still over the threshold after the last write: write again at once. */
    uint32_t wake = atomic_load_explicit(&mxpi_g.wake_chunks, MXPI_RELAXED);
    if (wake && atomic_load_explicit(&mxpi_g.pending_chunks, MXPI_RELAXED) >= (int64_t)wake) return 1;
    pthread_mutex_lock(&mxpi_g.wake_lock);
    while (!mxpi_g.wake_flag)
        if (pthread_cond_timedwait(&mxpi_g.wake_cond, &mxpi_g.wake_lock, &deadline) != 0) break;
    int woken = mxpi_g.wake_flag;
    mxpi_g.wake_flag = false;
    pthread_mutex_unlock(&mxpi_g.wake_lock);
    return woken;
}

void mxp_flush_wake(void) {
    mxp_init();
    mxpi_wake_writer();
}

int mxp_max_events_set(uint64_t max_events) {
    mxp_init();
    if (max_events >= UNLIMITED_BUDGET) max_events = 0;
    pthread_mutex_lock(&mxpi_g.out_lock);
    mxpi_g.max_events = max_events;
    mxpi_budget_recount();
    pthread_mutex_unlock(&mxpi_g.out_lock);
    return MXP_OK;
}

void mxp_counts_get(mxp_counts *out) {
    mxp_init();
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&mxpi_g.reg_lock);
    out->unmatched_stops = mxpi_g.retired_unmatched;
    out->non_lifo_stops = mxpi_g.retired_non_lifo;
    out->ignored_calls = mxpi_g.retired_ignored;
    out->dropped_events = mxpi_g.retired_dropped;
    out->cut_ranges = mxpi_g.retired_cut;
    for (mxpi_thread *t = mxpi_g.threads; t; t = t->next) {
        out->cut_ranges += MXPI_LOAD(t->cut);
        out->unmatched_stops += MXPI_LOAD(t->unmatched);
        out->non_lifo_stops += MXPI_LOAD(t->non_lifo);
        out->ignored_calls += MXPI_LOAD(t->ignored);
        out->dropped_events += MXPI_LOAD(t->dropped);
    }
    pthread_mutex_unlock(&mxpi_g.reg_lock);
    out->written_events = MXPI_LOAD(mxpi_g.written);
    out->unknown_frees = MXPI_LOAD(mxpi_g.unknown_frees);
    out->saturated_values = MXPI_LOAD(mxpi_g.saturated);
    out->invalid_calls = MXPI_LOAD(mxpi_g.invalid);
}

void mxp_reset(void) {
    mxp_init();
    mxp_flags_update(0, FLAG_MASK);
    mxp_clock_fake(0, 0);
    mxp_clock_skew_set(0);
    mxpi_trace_reset();
    mxpi_threads_reset();
    mxpi_registry_reset_values();
    mxp_max_events_set(0);
    MXPI_STORE(mxpi_g.written, 0);
    MXPI_STORE(mxpi_g.unknown_frees, 0);
    MXPI_STORE(mxpi_g.saturated, 0);
    MXPI_STORE(mxpi_g.invalid, 0);
    mxpi_memory_reset();
    mxp_stats_reset();
    mxp_sampler_stop();
    mxpi_samples_reset();
    mxpi_sampler_reset();
    pthread_mutex_lock(&mxpi_g.reg_lock);
    mxpi_g.recorded = mxpi_g.recorded_base = mxpi_g.recording_since = 0;
    pthread_mutex_unlock(&mxpi_g.reg_lock);
}
