/*
 * mxpi_core.h -- the core's global state (mxp_core.c): session flags, the
 * event cap's budget, the locks, and the tables each subsystem keeps in it.
 *
 * Lock order: out_lock, then reg_lock, then free_lock / names_lock.  The
 * memory table's lock (mxp_memory.c) and track_lock (mxp_track.c) are never
 * held with out_lock nor with each other, and come before reg_lock,
 * free_lock and names_lock; wake_lock is taken with no other lock after it.
 * fork() is bracketed by track_lock, the memory table's lock, reg_lock,
 * free_lock, names_lock, taken in that order (mxp_core.c's fork handlers).
 *
 * The stack sampler's locks come before all of these: its control lock
 * (mxp_sampler.c), then py_lock (mxp_pyread.c: held through a sampling
 * tick), then the sample tables' lock and the counts' lock (mxp_sample.c),
 * then reg_lock and the rest.  fork() takes py_lock, then the tables' and
 * counts' locks, before the core's (their handlers are registered after the
 * core's, and prepare handlers run in reverse order).
 */
#ifndef MXPI_CORE_H
#define MXPI_CORE_H

#include "mxpi_agg.h"
#include "mxpi_base.h"
#include "mxpi_buffer.h"

struct mxpi_object; /* mxpi_registry.h */
struct mxpi_thread; /* mxpi_thread.h */

/* Layout: what every hot call reads (flags, agg_epoch, nobj) shares one cache
 * line that is written only by control calls; the event cap's budget, which
 * every recording thread updates, has a line of its own. */
typedef struct mxpi_global {
    _Alignas(MXPI_CACHE_LINE) _Atomic uint32_t flags; /* MXP_FLAG_* | cap epoch << MXPI_CAP_EPOCH_SHIFT */
    _Atomic uint32_t agg_epoch; /* bumped by a statistics reset */
    _Atomic uint32_t nobj;      /* ids handed out (registry) */

    _Alignas(MXPI_CACHE_LINE) _Atomic uint64_t budget; /* see MXPI_BUDGET_BITS */
    _Atomic int64_t pending_chunks;  /* chunks handed to recording, not yet freed */
    _Atomic uint32_t wake_chunks;    /* wake the writer when pending_chunks reaches it (0: never) */

    _Alignas(MXPI_CACHE_LINE) mxpi_agg *baseline; /* merged sums at the last reset (reg_lock) */
    uint32_t nbaseline;
    int64_t recorded;           /* ticks spent recording, up to recording_since (reg_lock) */
    int64_t recording_since;    /* ticks when recording last began (reg_lock) */
    int64_t recorded_base;      /* recorded at the last statistics reset */
    uint64_t max_events;        /* 0 = no limit (under out_lock) */

    pthread_mutex_t reg_lock;
    pthread_mutex_t out_lock;
    pthread_mutex_t free_lock;
    pthread_mutex_t names_lock;
    pthread_mutex_t wake_lock; /* with wake_cond: the background writer's wake-up */
    pthread_cond_t wake_cond;
    bool wake_flag;

    /* registry */
    struct mxpi_object *_Atomic obj_pages[MXPI_NPAGES];
    uint32_t *buckets;
    uint32_t nbuckets;
    uint32_t overflow_id[MXP_KIND_GPU + 1];

    /* threads (reg_lock) */
    struct mxpi_thread *threads;
    _Atomic uint32_t next_tid; /* written under reg_lock; read anywhere */
    mxpi_agg_dir *retired_aggs;
    uint64_t retired_unmatched, retired_non_lifo, retired_ignored, retired_dropped, retired_cut;
    _Atomic uint64_t unknown_frees;
    _Atomic uint64_t saturated; /* counter results held at an int64 limit */
    _Atomic uint64_t invalid;   /* C API calls refused (mxp_capi.c) */

    /* chunk free list (free_lock) */
    mxpi_chunk *free_chunks;
    uint32_t nfree;

    /* tallies of the writer (out_lock) */
    _Atomic uint64_t written;
} mxpi_global;

extern mxpi_global mxpi_g;

/* The flags word also carries the cap epoch in its upper bits: a change of
 * the event cap bumps it, and every thread then hands back the slots it had
 * reserved under the old cap before recording again. */
#define MXPI_CAP_EPOCH_SHIFT 8u
#define MXPI_CAP_EPOCH(f) ((f) >> MXPI_CAP_EPOCH_SHIFT)
#define MXPI_CAP_EPOCH_MASK ((1u << (32u - MXPI_CAP_EPOCH_SHIFT)) - 1u)

/* The cap's budget word: the records that may still be buffered in its low
 * MXPI_BUDGET_BITS bits, the cap epoch they belong to above.  A thread takes
 * slots from it only in its own epoch, so a change of the cap can recount
 * the budget from scratch: slots threads still held under the old epoch
 * (idle threads never give theirs back) are forfeited, not owed. */
#define MXPI_BUDGET_BITS 40u
#define MXPI_BUDGET_MASK ((UINT64_C(1) << MXPI_BUDGET_BITS) - 1u)
#define MXPI_BUDGET_EPOCH(w) ((uint32_t)((w) >> MXPI_BUDGET_BITS))

static inline uint32_t mxpi_flags_now(void) { return atomic_load_explicit(&mxpi_g.flags, MXPI_RELAXED); }

/* mxp_core.c */
void mxpi_budget_recount(void); /* caller holds out_lock; starts a new cap epoch */
void mxpi_wake_writer(void);
void mxpi_chunks_freed(int64_t n);

#endif /* MXPI_CORE_H */
