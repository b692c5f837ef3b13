/*
 * mxp_thread.c -- per-thread state: attach and retire, record chunks and the
 * event cap, the range stack.  (Its aggregate pages are mxp_agg.c's.)
 *
 * Everything here is the slow side of the hot path: it runs when a thread
 * records for the first time, fills a chunk or its cap reservation, opens
 * ranges deeper than ever before, or touches a new page of object ids.
 */
#include "mxpi_thread.h"
#include "mxpi_agg.h"
#include "mxpi_buffer.h"
#include "mxpi_core.h"
#include "mxpi_thread_names.h"

#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

_Thread_local mxpi_thread *mxpi_tls;

static pthread_key_t exit_key;

/* Keep at most this many empty chunks for reuse (about 6 MB). */
#define MAX_FREE_CHUNKS 256u

/* ---- chunks ---- */

mxpi_chunk *mxpi_chunk_get(void) {
    mxpi_chunk *c = NULL;
    pthread_mutex_lock(&mxpi_g.free_lock);
    if (mxpi_g.free_chunks != NULL) {
        c = mxpi_g.free_chunks;
        mxpi_g.free_chunks = atomic_load_explicit(&c->next, MXPI_RELAXED);
        mxpi_g.nfree--;
    }
    pthread_mutex_unlock(&mxpi_g.free_lock);
    if (c == NULL) c = malloc(sizeof *c);
    if (c == NULL) return NULL;
    atomic_store_explicit(&c->next, NULL, MXPI_RELAXED);
    atomic_store_explicit(&c->count, 0, MXPI_RELAXED);
    return c;
}

void mxpi_chunk_put(mxpi_chunk *c) {
    pthread_mutex_lock(&mxpi_g.free_lock);
    if (mxpi_g.nfree < MAX_FREE_CHUNKS) {
        atomic_store_explicit(&c->next, mxpi_g.free_chunks, MXPI_RELAXED);
        mxpi_g.free_chunks = c;
        mxpi_g.nfree++;
        c = NULL;
    }
    pthread_mutex_unlock(&mxpi_g.free_lock);
    free(c);
}

/* Move t to the budget's epoch: what it held under an older one was
 * forfeited when the budget was recounted. */
static void follow_epoch(mxpi_thread *t, uint64_t w) {
    if (t->cap_epoch != MXPI_BUDGET_EPOCH(w)) {
        t->limit = t->pos;
        t->cap_epoch = MXPI_BUDGET_EPOCH(w);
    }
}

/* Take up to want record slots from the global cap, in t's epoch. */
static uint32_t reserve(mxpi_thread *t, uint32_t want) {
    uint64_t w = atomic_load_explicit(&mxpi_g.budget, MXPI_RELAXED);
    for (;;) {
        follow_epoch(t, w);
        uint64_t b = w & MXPI_BUDGET_MASK;
        if (b == 0) return 0;
        uint64_t take = b < want ? b : want;
        if (atomic_compare_exchange_weak_explicit(&mxpi_g.budget, &w, w - take, MXPI_RELAXED,
                                                  MXPI_RELAXED))
            return (uint32_t)take;
    }
}

/* t->pos reached t->limit, or the flags' cap epoch is not t's: move to a
 * fresh chunk and/or reserve more slots under the cap.  False when the
 * record must be dropped. */
bool mxpi_record_slow(mxpi_thread *t) {
    /* The budget word's epoch is the one that counts, not the flags'. */
    follow_epoch(t, atomic_load_explicit(&mxpi_g.budget, MXPI_RELAXED));
    if (t->cur == NULL || t->pos >= MXPI_CHUNK_RECORDS) {
        mxpi_chunk *c = mxpi_chunk_get();
        if (c == NULL) return false;
        if (t->cur == NULL)
            atomic_store_explicit(&t->first, c, MXPI_RELEASE);
        else
            atomic_store_explicit(&t->cur->next, c, MXPI_RELEASE);
        t->cur = c;
        t->pos = 0;
        t->limit = 0;
        /* Enough waits to be written: wake the background writer early (once,
         * as the count goes up through the threshold). */
        uint32_t wake = atomic_load_explicit(&mxpi_g.wake_chunks, MXPI_RELAXED);
        if (atomic_fetch_add_explicit(&mxpi_g.pending_chunks, 1, MXPI_RELAXED) + 1 == (int64_t)wake)
            mxpi_wake_writer();
    }
    if (t->pos < t->limit) return true; /* only the flags were behind the budget */
    uint32_t room = MXPI_CHUNK_RECORDS - t->pos;
    uint32_t got = reserve(t, room < MXPI_RESERVE_STEP ? room : MXPI_RESERVE_STEP);
    t->limit = t->pos + got;
    return got > 0;
}

/* ---- stack ---- */

/* Under reg_lock: claimers read other threads' stacks holding it. */
bool mxpi_stack_grow(mxpi_thread *t) {
    if (t->stack_cap >= MXPI_STACK_MAX) return false;
    uint32_t cap = t->stack_cap ? t->stack_cap * 2 : 16;
    pthread_mutex_lock(&mxpi_g.reg_lock);
    mxpi_open *s = realloc(t->stack, cap * sizeof *s);
    if (s != NULL) t->stack = s;
    _Atomic uint64_t *c = s ? realloc(t->claims, cap * sizeof *c) : NULL;
    if (c != NULL) {
        t->claims = c;
        t->stack_cap = cap;
    }
    pthread_mutex_unlock(&mxpi_g.reg_lock);
    return c != NULL;
}

/* ---- tracks by trace id ---- */

#define TID_PAGE 1024u
#define TID_PAGES 16384u

/* Track states by tid, for mxp_track_begin/end: set and cleared under
 * reg_lock, read without it (a track is used by one task at a time, and
 * never after its mxp_track_close). */
static _Atomic(_Atomic(mxpi_thread *) *) by_tid[TID_PAGES];

static void tid_set(uint32_t tid, mxpi_thread *t) {
    uint32_t page = tid / TID_PAGE;
    if (page >= TID_PAGES) return;
    _Atomic(mxpi_thread *) *p = atomic_load_explicit(&by_tid[page], MXPI_ACQUIRE);
    if (p == NULL) {
        p = calloc(TID_PAGE, sizeof *p);
        if (p == NULL) return;
        atomic_store_explicit(&by_tid[page], p, MXPI_RELEASE);
    }
    atomic_store_explicit(&p[tid % TID_PAGE], t, MXPI_RELEASE);
}

mxpi_thread *mxpi_track_of(uint32_t tid) {
    uint32_t page = tid / TID_PAGE;
    if (page >= TID_PAGES) return NULL;
    _Atomic(mxpi_thread *) *p = atomic_load_explicit(&by_tid[page], MXPI_ACQUIRE);
    return p ? atomic_load_explicit(&p[tid % TID_PAGE], MXPI_ACQUIRE) : NULL;
}

void mxpi_track_register(mxpi_thread *t) {
    pthread_mutex_lock(&mxpi_g.reg_lock);
    tid_set(t->tid, t);
    pthread_mutex_unlock(&mxpi_g.reg_lock);
}

/* ---- attach / retire ---- */

static void retire_locked(mxpi_thread *t);

void mxpi_track_retire(mxpi_thread *t) {
    pthread_mutex_lock(&mxpi_g.reg_lock);
    tid_set(t->tid, NULL);
    retire_locked(t);
    pthread_mutex_unlock(&mxpi_g.reg_lock);
}

static void thread_exit(void *arg) {
    mxpi_thread *t = arg;
    if (mxpi_tls == t) mxpi_tls = NULL;
    pthread_mutex_lock(&mxpi_g.reg_lock);
    retire_locked(t);
    pthread_mutex_unlock(&mxpi_g.reg_lock);
}

/* Hand a thread's (or track's) statistics and tallies to the registry; its
 * records stay until written (mxpi_threads_reap).  Caller holds reg_lock. */
static void retire_locked(mxpi_thread *t) {
    mxpi_aggs_retire(t);
    mxpi_g.retired_unmatched += MXPI_LOAD(t->unmatched);
    mxpi_g.retired_non_lifo += MXPI_LOAD(t->non_lifo);
    mxpi_g.retired_ignored += MXPI_LOAD(t->ignored);
    mxpi_g.retired_dropped += MXPI_LOAD(t->dropped);
    mxpi_g.retired_cut += MXPI_LOAD(t->cut);
    MXPI_STORE(t->cut, 0);
    MXPI_STORE(t->unmatched, 0);
    MXPI_STORE(t->non_lifo, 0);
    MXPI_STORE(t->ignored, 0);
    MXPI_STORE(t->dropped, 0);
    /* Unused cap reservations go back, if they belong to the current epoch. */
    uint64_t w = atomic_load_explicit(&mxpi_g.budget, MXPI_RELAXED);
    while (t->limit > t->pos && MXPI_BUDGET_EPOCH(w) == t->cap_epoch &&
           !atomic_compare_exchange_weak_explicit(&mxpi_g.budget, &w, w + (t->limit - t->pos),
                                                  MXPI_RELAXED, MXPI_RELAXED)) {
    }
    t->limit = t->pos;
    free(t->stack);
    free(t->claims);
    t->stack = NULL;
    t->claims = NULL;
    t->depth = t->stack_cap = 0;
    t->retired = 1;
}

void mxpi_threads_init(void) { pthread_key_create(&exit_key, thread_exit); }

mxpi_thread *mxpi_thread_new(int64_t os_tid) {
    mxp_init();
    size_t size = (sizeof(mxpi_thread) + MXPI_CACHE_LINE - 1) / MXPI_CACHE_LINE * MXPI_CACHE_LINE;
    mxpi_thread *t = aligned_alloc(MXPI_CACHE_LINE, size);
    if (t == NULL) return NULL;
    memset(t, 0, size);
    if (!mxpi_stack_grow(t)) {
        free(t->stack);
        free(t);
        return NULL;
    }
    t->os_tid = os_tid;
    pthread_mutex_lock(&mxpi_g.reg_lock);
    t->tid = ++mxpi_g.next_tid;
    t->next = mxpi_g.threads;
    mxpi_g.threads = t;
    pthread_mutex_unlock(&mxpi_g.reg_lock);
    mxpi_thread_note(t->tid, t->os_tid);
    return t;
}

mxpi_thread *mxpi_spare_new(int64_t os_tid) {
    mxpi_thread *t = mxpi_thread_new(os_tid);
    if (t == NULL) return NULL;
    pthread_mutex_lock(&mxpi_g.reg_lock);
    t->spare = 1;
    pthread_mutex_unlock(&mxpi_g.reg_lock);
    return t;
}

void mxpi_spares_end(int64_t os_tid) {
    pthread_mutex_lock(&mxpi_g.reg_lock);
    for (mxpi_thread *t = mxpi_g.threads; t; t = t->next)
        if (t->spare && !t->retired && (os_tid == 0 || t->os_tid == os_tid)) retire_locked(t);
    pthread_mutex_unlock(&mxpi_g.reg_lock);
}

mxpi_thread *mxpi_thread_attach(void) {
    int64_t me = (int64_t)syscall(SYS_gettid);
    /* A timeline the sampler made for this thread becomes its own, so that
     * the thread keeps one trace tid. */
    mxpi_thread *t;
    pthread_mutex_lock(&mxpi_g.reg_lock);
    for (t = mxpi_g.threads; t; t = t->next)
        if (t->spare && !t->retired && t->os_tid == me) break;
    if (t != NULL) t->spare = 0;
    pthread_mutex_unlock(&mxpi_g.reg_lock);
    if (t == NULL) t = mxpi_thread_new(me);
    if (t == NULL) return NULL;
    pthread_setspecific(exit_key, t);
    mxpi_tls = t;
    return t;
}

/* ---- for the writer (caller holds out_lock) ---- */

mxpi_thread **mxpi_threads_snapshot(uint32_t *n) {
    pthread_mutex_lock(&mxpi_g.reg_lock);
    uint32_t count = 0;
    for (mxpi_thread *t = mxpi_g.threads; t; t = t->next) count++;
    mxpi_thread **arr = malloc((count ? count : 1) * sizeof *arr);
    if (arr != NULL) {
        count = 0;
        for (mxpi_thread *t = mxpi_g.threads; t; t = t->next) arr[count++] = t;
    }
    pthread_mutex_unlock(&mxpi_g.reg_lock);
    *n = arr ? count : 0;
    return arr;
}

/* Records committed and not yet read by the writer, over all threads. */
uint64_t mxpi_buffered_records(void) {
    uint64_t n = 0;
    pthread_mutex_lock(&mxpi_g.reg_lock);
    for (mxpi_thread *t = mxpi_g.threads; t; t = t->next) {
        mxpi_chunk *c = t->head;
        uint32_t pos = t->head_pos;
        if (c == NULL) {
            c = atomic_load_explicit(&t->first, MXPI_ACQUIRE);
            pos = 0;
        }
        for (; c != NULL; c = atomic_load_explicit(&c->next, MXPI_ACQUIRE), pos = 0)
            n += atomic_load_explicit(&c->count, MXPI_ACQUIRE) - pos;
    }
    pthread_mutex_unlock(&mxpi_g.reg_lock);
    return n;
}

/* Free the states of exited threads whose records are all drained. */
void mxpi_threads_reap(void) {
    pthread_mutex_lock(&mxpi_g.reg_lock);
    mxpi_thread **pp = &mxpi_g.threads;
    while (*pp) {
        mxpi_thread *t = *pp;
        mxpi_chunk *c = t->head ? t->head : atomic_load_explicit(&t->first, MXPI_ACQUIRE);
        uint32_t done = t->head == c ? t->head_pos : 0;
        bool drained = c == NULL || (atomic_load_explicit(&c->next, MXPI_ACQUIRE) == NULL &&
                                     done >= atomic_load_explicit(&c->count, MXPI_ACQUIRE));
        if (t->retired && drained) {
            *pp = t->next;
            if (c) {
                mxpi_chunk_put(c);
                mxpi_chunks_freed(1);
            }
            free(t);
        } else {
            pp = &t->next;
        }
    }
    pthread_mutex_unlock(&mxpi_g.reg_lock);
}

/* A state kept by a forked child starts with no buffered records and no
 * tallies: the parent's are the parent's to write and count.  The memory
 * is abandoned, not freed (the parent's writer may have been mid-update). */
static void forget_buffers(mxpi_thread *t) {
    t->cur = NULL;
    t->pos = t->limit = 0;
    t->head = NULL;
    t->head_pos = 0;
    atomic_store_explicit(&t->first, NULL, MXPI_RELAXED);
    MXPI_STORE(t->unmatched, 0);
    MXPI_STORE(t->non_lifo, 0);
    MXPI_STORE(t->ignored, 0);
    MXPI_STORE(t->dropped, 0);
    MXPI_STORE(t->cut, 0);
}

/* In a forked child, still holding the locks fork_prepare (mxp_core.c)
 * took before the fork, reg_lock among them.  Of the OS threads only the
 * forking one exists; its state stays, open ranges included, so they may
 * still be closed.  Tracks (the
 * states of no OS thread, os_tid 0) are timelines of the process, not of a
 * thread: the child keeps the open ones, as it keeps the Python objects that
 * hold their tids, and their ranges go to the child's trace.  States of
 * other threads and of closed tracks are dropped (abandoned, not freed). */
void mxpi_threads_after_fork(void) {
    mxpi_thread *self = mxpi_tls, *keep = NULL, **tail = &keep;
    for (mxpi_thread *t = mxpi_g.threads, *next; t; t = next) {
        next = t->next;
        if (t->retired || (t != self && t->os_tid != 0)) continue;
        /* No claimer was mid-claim (claimers hold reg_lock), but another
         * thread may have been editing a track's stack: its entries cannot
         * be trusted, and its edit counter must be even again. */
        if (t != self && (atomic_load_explicit(&t->edits, MXPI_RELAXED) & 1u)) {
            atomic_fetch_add_explicit(&t->edits, 1, MXPI_RELAXED);
            t->depth = 0;
        }
        forget_buffers(t);
        *tail = t;
        tail = &t->next;
    }
    *tail = NULL;
    mxpi_g.threads = keep;
}

/* Clear every thread's open ranges, scope and tallies (tests). */
void mxpi_threads_reset(void) {
    pthread_mutex_lock(&mxpi_g.reg_lock);
    mxpi_g.retired_unmatched = mxpi_g.retired_non_lifo = 0;
    mxpi_g.retired_ignored = mxpi_g.retired_dropped = mxpi_g.retired_cut = 0;
    for (mxpi_thread *t = mxpi_g.threads; t; t = t->next) {
        MXPI_STORE(t->cut, 0);
        t->depth = 0;
        t->scope = 0;
        MXPI_STORE(t->unmatched, 0);
        MXPI_STORE(t->non_lifo, 0);
        MXPI_STORE(t->ignored, 0);
        MXPI_STORE(t->dropped, 0);
    }
    pthread_mutex_unlock(&mxpi_g.reg_lock);
}
