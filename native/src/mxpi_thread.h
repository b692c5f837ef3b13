/*
 * mxpi_thread.h -- per-thread state (mxp_thread.c): the range stack, the
 * buffer's tail, aggregate pages and tallies, and the hot-path helpers that
 * append a record or update an aggregate.
 *
 * Ownership: a thread state is created by its thread on its first hot call.
 * Its stack, chunk tail and aggregate pages are written only by that thread.
 * Its chunk head is owned by the writer (under out_lock).  The registry's
 * list of thread states is under reg_lock.
 */
#ifndef MXPI_THREAD_H
#define MXPI_THREAD_H

#include "mxpi_agg.h"
#include "mxpi_base.h"
#include "mxpi_buffer.h"
#include "mxpi_core.h"

/* ---- the per-thread range stack ---- */

#define MXPI_OPEN_LIVE 1u   /* begun while recording: start is valid */
#define MXPI_OPEN_TRACE 2u  /* write a record at the end */
#define MXPI_OPEN_AGG 4u    /* aggregate at the end */
#define MXPI_OPEN_NVTX 128u /* has an NVTX range open (mxp_nvtx.c) */

/* An open range.  Written by the stack's owner only; read by a claimer
 * (mxp_claim.c) as a seqlock reader.  Its claim is beside it, in the
 * thread's claims array. */
typedef struct mxpi_open {
    uint32_t id;
    uint32_t aux;
    uint32_t flags;
    uint32_t unused;
    int64_t start;  /* ticks */
    int64_t child;  /* ticks covered by finished children */
    int64_t credit; /* the parent is credited with [credit, end] */
    uint64_t seq;   /* token for mxp_range_end_token; unique per stack */
    uint64_t nvtx;  /* NVTX range id of a range on a track (mxp_nvtx.c) */
} mxpi_open;

#define MXPI_STACK_MAX 65536u

/* ---- thread state ---- */

/* Allocated cache-line aligned, so threads never share a line of state. */
typedef struct mxpi_thread {
    /* owner only */
    _Alignas(MXPI_CACHE_LINE) mxpi_chunk *cur;
    uint32_t pos;
    uint32_t limit; /* slots below it are reserved under the event cap */
    uint32_t cap_epoch;
    mxpi_open *stack; /* replaced only under reg_lock (claimers read it) */
    /* Per stack entry: its seq (| MXPI_CLAIM_ENDED) once another thread
     * closed and recorded it (mxp_claim.c); the same length as stack. */
    _Atomic uint64_t *claims;
    uint32_t depth;
    uint32_t stack_cap;
    uint64_t seq;
    _Atomic uint32_t edits; /* odd while the owner changes its stack */
    _Atomic uint32_t moves; /* odd while the owner changes a track's stack (the sampler's check) */
    _Atomic uint32_t claiming; /* a claimer is deciding about this stack's entries */
    uint32_t in_loop;       /* an asyncio event loop runs on the thread */
    uint32_t scope;
    uint32_t tid;
    int64_t os_tid;
    mxpi_agg_dir *aggs; /* NULL until the first aggregate */

    /* owner writes (relaxed), anyone reads */
    _Atomic uint64_t unmatched;
    _Atomic uint64_t non_lifo;
    _Atomic uint64_t ignored;
    _Atomic uint64_t dropped;
    _Atomic uint64_t cut; /* ranges this thread closed in mxp_ranges_cut */
    _Atomic(mxpi_chunk *) first; /* the first chunk, published once */

    /* writer only (out_lock) */
    mxpi_chunk *head;
    uint32_t head_pos;

    /* registry (reg_lock) */
    int retired;
    int spare; /* a sampled thread's timeline that no thread owns yet (mxpi_spare_new) */
    struct mxpi_thread *next;
} mxpi_thread;

extern _Thread_local mxpi_thread *mxpi_tls;

/* mxp_thread.c */
mxpi_thread *mxpi_thread_attach(void);
/* A registered thread state not bound to any OS thread (tracks). */
mxpi_thread *mxpi_thread_new(int64_t os_tid);
/* Tracks with a stack of their own (mxp_track_begin): find one by tid;
 * register it; retire it (its statistics kept, its records written). */
mxpi_thread *mxpi_track_of(uint32_t tid);
void mxpi_track_register(mxpi_thread *t);
/* The timeline of a thread that is sampled but has not recorded: its thread
 * takes it over at its first record (mxpi_thread_attach).  The sampler ends
 * it when the thread is gone (os_tid 0: all of them). */
mxpi_thread *mxpi_spare_new(int64_t os_tid);
void mxpi_spares_end(int64_t os_tid);
void mxpi_track_retire(mxpi_thread *t);
void mxpi_threads_init(void);
mxpi_chunk *mxpi_chunk_get(void);
void mxpi_chunk_put(mxpi_chunk *c);
bool mxpi_record_slow(mxpi_thread *t);
bool mxpi_stack_grow(mxpi_thread *t);
mxpi_thread **mxpi_threads_snapshot(uint32_t *n); /* caller holds out_lock */
void mxpi_threads_reap(void);                       /* caller holds out_lock */
uint64_t mxpi_buffered_records(void);               /* caller holds out_lock */
void mxpi_threads_reset(void);
void mxpi_threads_after_fork(void); /* in a forked child (mxp_core.c's fork handler) */

/* ---- hot-path helpers ---- */

/* The calling thread's state, attaching it on the first call.  *rc becomes
 * MXP_NEW_THREAD on that first call.  NULL only when memory ran out. */
static inline mxpi_thread *mxpi_self(int *rc) {
    mxpi_thread *t = mxpi_tls;
    if (MXPI_LIKELY(t != NULL)) return t;
    t = mxpi_thread_attach();
    if (t) *rc = MXP_NEW_THREAD;
    return t;
}

/* Append one record to the calling thread's buffer (or tally a drop); f is
 * the flags word the caller loaded. */
static inline void mxpi_record(mxpi_thread *t, uint32_t f, int64_t ts, int64_t val, uint32_t id,
                               uint32_t aux) {
    if (MXPI_UNLIKELY(t->pos >= t->limit || MXPI_CAP_EPOCH(f) != t->cap_epoch) &&
        !mxpi_record_slow(t)) {
        mxpi_tally(&t->dropped);
        return;
    }
    mxpi_chunk *c = t->cur;
    mxpi_rec *r = &c->rec[t->pos];
    r->ts = ts;
    r->val = val;
    r->id = id;
    r->aux = aux;
    t->pos++;
    atomic_store_explicit(&c->count, t->pos, MXPI_RELEASE);
}

/* The calling thread's aggregate entry for id; its min and max restart if
 * they belong to an older statistics epoch.  NULL only when memory ran out. */
static inline mxpi_agg *mxpi_agg_of(mxpi_thread *t, uint32_t id) {
    mxpi_agg *page = NULL;
    if (MXPI_LIKELY(t->aggs != NULL))
        page = atomic_load_explicit(&(*t->aggs)[id >> MXPI_PAGE_BITS], MXPI_RELAXED);
    if (MXPI_UNLIKELY(page == NULL)) {
        page = mxpi_agg_page_new(t, id >> MXPI_PAGE_BITS);
        if (page == NULL) return NULL;
    }
    mxpi_agg *e = &page[id & (MXPI_PAGE_SIZE - 1)];
    uint32_t epoch = atomic_load_explicit(&mxpi_g.agg_epoch, MXPI_RELAXED);
    if (MXPI_UNLIKELY(atomic_load_explicit(&e->epoch, MXPI_RELAXED) != epoch))
        mxpi_agg_roll(e, epoch);
    return e;
}

/* Add one range of duration dur (self: without its children) to the
 * thread's aggregate of id. */
static inline void mxpi_aggregate_range(mxpi_thread *t, uint32_t id, int64_t dur, int64_t self) {
    mxpi_agg *e = mxpi_agg_of(t, id);
    if (MXPI_UNLIKELY(e == NULL)) return;
    MXPI_STORE(e->count, MXPI_LOAD(e->count) + 1);
    MXPI_STORE(e->total, MXPI_LOAD(e->total) + dur);
    MXPI_STORE(e->self, MXPI_LOAD(e->self) + self);
    if (dur < MXPI_LOAD(e->min)) MXPI_STORE(e->min, dur);
    if (dur > MXPI_LOAD(e->max)) MXPI_STORE(e->max, dur);
    mxpi_hist *h = atomic_load_explicit(&e->hist, MXPI_RELAXED);
    if (MXPI_UNLIKELY(h == NULL) && (h = mxpi_hist_new(e)) == NULL) return;
    _Atomic uint32_t *bucket = &(*h)[mxpi_hist_index(dur)];
    MXPI_STORE(*bucket, MXPI_LOAD(*bucket) + 1);
}

#endif /* MXPI_THREAD_H */
