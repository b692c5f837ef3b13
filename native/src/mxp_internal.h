/*
 * mxp_internal.h -- shared internals of the mxprof core (not installed).
 *
 * Ownership in one place:
 *   - A thread state (mxpi_thread) is created by its thread on its first hot
 *     call.  Its stack, chunk tail and aggregate pages are written only by that
 *     thread.  Its chunk head is owned by the writer (under out_lock).
 *   - Records are published by a release store of chunk->count; the writer
 *     reads them after an acquire load, so draining never stops recorders.
 *   - A chunk is freed only by the writer, and only once the owner has moved
 *     to a newer chunk (chunk->next != NULL).
 *   - Aggregate entries are written by their owner with relaxed atomic stores
 *     and read by mxp_stats_snapshot under reg_lock; a reset bumps an epoch
 *     instead of touching other threads' memory.
 *   - Lock order: out_lock, then reg_lock, then free_lock / names_lock.
 */
#ifndef MXP_INTERNAL_H
#define MXP_INTERNAL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "mxprof.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MXPI_TSAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__) && !defined(MXPI_TSAN)
#define MXPI_TSAN 1
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define MXPI_HAVE_TSC 1
#else
#define MXPI_HAVE_TSC 0
#endif

#define MXPI_LIKELY(x) __builtin_expect(!!(x), 1)
#define MXPI_CACHE_LINE 64
#define MXPI_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define MXPI_RELAXED memory_order_relaxed
#define MXPI_ACQUIRE memory_order_acquire
#define MXPI_RELEASE memory_order_release

/* ---- clock (mxp_clock.c) ---- */

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

/* ---- records and chunks ---- */

/* One trace record, 24 bytes.  ts is the start (ranges) or the instant, in
 * ticks; val is the duration in ticks (ranges) or the sample (counters); aux
 * is the scope (markers), or for ranges the frame index (frames) with the
 * MXPI_AUX_* bits below. */
typedef struct mxpi_rec {
    int64_t ts;
    int64_t val;
    uint32_t id;
    uint32_t aux;
} mxpi_rec;

/* Bits of a range record's aux. */
#define MXPI_AUX_CUT (1u << 31)      /* closed by a stop, not by its end */
#define MXPI_AUX_ASYNC (1u << 30)    /* ended on another thread or task than it began */
#define MXPI_AUX_INDEX 0x3fffffffu   /* the frame index */

#define MXPI_CHUNK_RECORDS 1024u
#define MXPI_RESERVE_STEP 256u

typedef struct mxpi_chunk {
    _Atomic(struct mxpi_chunk *) next; /* set once the owner moved on */
    _Atomic uint32_t count;            /* committed records */
    uint32_t unused;
    mxpi_rec rec[MXPI_CHUNK_RECORDS];
} mxpi_chunk;

/* ---- aggregates ---- */

/* Aggregates of one object on one thread.  count, total, self and sum only
 * ever grow (a statistics reset subtracts a baseline); min and max belong to
 * the statistics epoch in epoch and restart when it changes. */
/* Log-linear histogram of durations in ticks (HDR-histogram style): values
 * below 2^HIST_SUB_BITS have a bucket each; every further power of two is
 * split into HIST_HALF buckets of equal width, so a bucket is at most 1/64 of
 * its lower bound wide and its midpoint is within 0.79 % of any value in it.
 * Values of 2^HIST_MAX_BITS ticks and more share the last bucket. */
#define MXPI_HIST_SUB_BITS 7u
#define MXPI_HIST_SUB (1u << MXPI_HIST_SUB_BITS)
#define MXPI_HIST_HALF (MXPI_HIST_SUB / 2u)
#define MXPI_HIST_MAX_BITS 48u
#define MXPI_HIST_BUCKETS (MXPI_HIST_SUB + (MXPI_HIST_MAX_BITS - MXPI_HIST_SUB_BITS) * MXPI_HIST_HALF)

static inline uint32_t mxpi_hist_index(int64_t v) {
    if (v < (int64_t)MXPI_HIST_SUB) return v < 0 ? 0u : (uint32_t)v;
    uint32_t m = 63u - (uint32_t)__builtin_clzll((unsigned long long)v); /* 2^m <= v */
    if (m >= MXPI_HIST_MAX_BITS) return MXPI_HIST_BUCKETS - 1u;
    uint32_t shift = m - MXPI_HIST_SUB_BITS + 1u;
    uint32_t sub = (uint32_t)((uint64_t)v >> shift) - MXPI_HIST_HALF;
    return MXPI_HIST_SUB + (shift - 1u) * MXPI_HIST_HALF + sub;
}

typedef _Atomic uint32_t mxpi_hist[MXPI_HIST_BUCKETS];

int64_t mxpi_hist_lower(uint32_t index);
int64_t mxpi_hist_width(uint32_t index);

typedef struct mxpi_agg {
    _Atomic uint32_t epoch;
    _Atomic uint64_t count;
    _Atomic int64_t total;
    _Atomic int64_t min;
    _Atomic int64_t max;
    _Atomic int64_t self;
    _Atomic int64_t last;
    _Atomic int64_t last_ts;
    _Atomic double sum;
    _Atomic(mxpi_hist *) hist; /* ranges: allocated on the first duration */
} mxpi_agg;

#define MXPI_PAGE_BITS 8u
#define MXPI_PAGE_SIZE (1u << MXPI_PAGE_BITS)
#define MXPI_NPAGES (MXP_MAX_OBJECTS / MXPI_PAGE_SIZE)

typedef _Atomic(mxpi_agg *) mxpi_agg_dir[MXPI_NPAGES];

/* ---- the per-thread range stack ---- */

#define MXPI_OPEN_LIVE 1u   /* begun while recording: start is valid */
#define MXPI_OPEN_TRACE 2u  /* write a record at the end */
#define MXPI_OPEN_AGG 4u    /* aggregate at the end */

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
    struct mxpi_thread *next;
} mxpi_thread;

/* ---- objects ---- */

typedef struct mxpi_object {
    uint32_t kind;
    uint32_t name_len;
    uint32_t domain_len;
    uint32_t frag_len;
    uint32_t key_len;
    uint32_t hash_next; /* chain in the registry's hash table, 0 = end */
    uint64_t hash;
    char *name;   /* raw bytes, NUL-terminated copy */
    char *domain; /* raw bytes, NUL-terminated copy */
    char *frag;   /* JSON prefix up to and including "ts": */
    char *key;    /* counters: escaped "name": for args */
    _Atomic int64_t value;       /* counters */
    _Atomic uint32_t frame_next; /* frames */
} mxpi_object;

/* ---- global state ---- */

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
    mxpi_object *_Atomic obj_pages[MXPI_NPAGES];
    uint32_t *buckets;
    uint32_t nbuckets;
    uint32_t overflow_id[MXP_KIND_GPU + 1];

    /* threads (reg_lock) */
    mxpi_thread *threads;
    uint32_t next_tid;
    mxpi_agg_dir *retired_aggs;
    uint64_t retired_unmatched, retired_non_lifo, retired_ignored, retired_dropped, retired_cut;
    _Atomic uint64_t unknown_frees;
    _Atomic uint64_t saturated; /* counter results held at an int64 limit */

    /* chunk free list (free_lock) */
    mxpi_chunk *free_chunks;
    uint32_t nfree;

    /* tallies of the writer (out_lock) */
    _Atomic uint64_t written;
} mxpi_global;

extern mxpi_global mxpi_g;
extern _Thread_local mxpi_thread *mxpi_tls;

static inline mxpi_object *mxpi_obj(uint32_t id) {
    return &atomic_load_explicit(&mxpi_g.obj_pages[id >> MXPI_PAGE_BITS], MXPI_ACQUIRE)
                [id & (MXPI_PAGE_SIZE - 1)];
}

/* mxp_registry.c */
void mxpi_registry_init(void);
void mxpi_registry_reset_values(void);

/* mxp_memory.c */
void mxpi_memory_reset(void);
void mxpi_memory_after_fork(void);
void mxpi_memory_stats_reset(void); /* peaks restart at what is in use */

/* mxp_core.c */
void mxpi_budget_recount(void); /* caller holds out_lock; starts a new cap epoch */
void mxpi_wake_writer(void);
void mxpi_chunks_freed(int64_t n);

/* mxp_thread.c */
mxpi_thread *mxpi_thread_attach(void);
/* A registered thread state not bound to any OS thread (tracks). */
mxpi_thread *mxpi_thread_new(int64_t os_tid);
/* Tracks with a stack of their own (mxp_track_begin): find one by tid;
 * register it; retire it (its statistics kept, its records written). */
mxpi_thread *mxpi_track_of(uint32_t tid);
void mxpi_track_register(mxpi_thread *t);
void mxpi_track_retire(mxpi_thread *t);
void mxpi_threads_init(void);
mxpi_chunk *mxpi_chunk_get(void);
void mxpi_chunk_put(mxpi_chunk *c);
bool mxpi_record_slow(mxpi_thread *t);
bool mxpi_stack_grow(mxpi_thread *t);
mxpi_agg *mxpi_agg_page_new(mxpi_thread *t, uint32_t page);
void mxpi_agg_clear(mxpi_agg *e, uint32_t epoch);
void mxpi_agg_roll(mxpi_agg *e, uint32_t epoch);
void mxpi_agg_fold(mxpi_agg *dst, const mxpi_agg *src, uint32_t epoch);
mxpi_hist *mxpi_hist_new(mxpi_agg *e);
mxpi_thread **mxpi_threads_snapshot(uint32_t *n); /* caller holds out_lock */
void mxpi_threads_reap(void);                       /* caller holds out_lock */
uint64_t mxpi_buffered_records(void);               /* caller holds out_lock */
void mxpi_threads_reset(void);

/* mxp_claim.c: closing ranges open on other stacks (stop, cross-thread ends) */
extern int mxpi_fence_needed; /* no membarrier(): owners fence themselves */
void mxpi_claim_init(void);
/* The calling thread's end of id matched nothing on its own stack: close
 * the latest open range of id on another stack, recording it on t as an
 * async range.  False when there is none (a stop without a start). */
bool mxpi_end_elsewhere(mxpi_thread *t, uint32_t id, int64_t now);
/* Hand the writer a range closed on behalf of thread tid (mxp_trace.c,
 * under out_lock). */
void mxpi_trace_add_cut(const mxpi_rec *r, uint32_t tid);

/* mxp_trace.c */
void mxpi_trace_reset(void);
void mxpi_trace_after_fork(void);
void mxpi_trace_note_thread(uint32_t tid, int64_t os_tid);

/* ---- trace file formats (mxp_trace.c drives them under out_lock) ----
 *
 * A flush calls begin, record for every record, then end; if all of them
 * succeeded it calls commit, otherwise restore.  After create, and after
 * every commit, the file on disk must be a complete, loadable trace; after
 * restore it must be what it was at the last commit (or create). */

typedef struct mxpi_out {
    int fd;
    bool regular;                /* a regular file (others cannot be cut) */
    int err;                     /* errno of the last failure */
    int pid;
    int64_t epoch_ticks;         /* ts 0 of the profile */
    int64_t base_wall_ns;        /* wall-clock time of ts 0 */
    int64_t base_mono_ns;        /* CLOCK_MONOTONIC time of ts 0 */
    mxpi_timebase tb;            /* tick -> ns for this flush */
    mxp_counts tallies;          /* this profile's tallies, for trailers */
    const char *process_name;    /* process_name metadata (never NULL) */
    size_t process_name_len;
    const char *top_json;        /* extra top-level JSON members (Chrome) */
    size_t top_json_len;
    const char *other_json;      /* extra otherData members (Chrome) */
    size_t other_json_len;
    void *state;                 /* the format's own, from create to release */
} mxpi_out;

typedef struct mxpi_format {
    const char *name;
    /* The file was just created, empty: write its beginning. */
    bool (*create)(mxpi_out *o);
    /* A flush begins. */
    bool (*begin)(mxpi_out *o);
    /* One record of the thread with trace id tid (ts >= the profile's ts 0). */
    bool (*record)(mxpi_out *o, const mxpi_rec *r, uint32_t tid);
    /* The flush's records are all given: write everything and any trailer. */
    bool (*end)(mxpi_out *o);
    /* end succeeded: the written state is the one to keep. */
    void (*commit)(mxpi_out *o);
    /* A step failed: put the file back as it was at the last commit. */
    void (*restore)(mxpi_out *o);
    /* The file is done with (closed or abandoned): free the state. */
    void (*release)(mxpi_out *o);
} mxpi_format;

extern const mxpi_format mxpi_chrome_json;    /* mxp_chrome.c */
extern const mxpi_format mxpi_chrome_json_gz; /* mxp_chrome.c (MXPI_HAVE_ZLIB) */
extern const mxpi_format mxpi_perfetto;       /* mxp_perfetto.c */

/* Write all of p at *off, advancing it; on failure set o->err. */
bool mxpi_pwrite_all(mxpi_out *o, const char *p, size_t n, int64_t *off);

/* Visit, under names_lock, every thread that has events in the current
 * file, in trace-id order, with its name (NULL: never named). */
typedef void (*mxpi_thread_visit)(void *ctx, uint32_t tid, int64_t os_tid, const char *name,
                                  size_t name_len);
void mxpi_threads_used(mxpi_thread_visit fn, void *ctx);

/* Call fn, under names_lock, for the one thread with trace id tid. */
void mxpi_thread_info(uint32_t tid, mxpi_thread_visit fn, void *ctx);

/* Marker scope as Chrome's "s" letter and as its MXNet name. */
const char *mxpi_scope_letter(uint32_t scope);
const char *mxpi_scope_name(uint32_t scope);

/* mxp_json.c */
typedef struct mxpi_buf {
    char *data;
    size_t len;
    size_t cap;
    bool failed; /* an allocation failed; the content is incomplete */
} mxpi_buf;

/* What an object is called in a trace (alloc/free instants: "alloc",
 * "free"), and its category (Chrome's "cat"), unescaped: both formats
 * show the same. */
const char *mxpi_object_title(const mxpi_object *o, size_t *len);
void mxpi_object_category(mxpi_buf *b, const mxpi_object *o);

bool mxpi_buf_reserve(mxpi_buf *b, size_t extra);
void mxpi_buf_put(mxpi_buf *b, const char *s, size_t n);
void mxpi_buf_puts(mxpi_buf *b, const char *s);
void mxpi_buf_putc(mxpi_buf *b, char c);
void mxpi_buf_i64(mxpi_buf *b, int64_t v);
void mxpi_buf_u64(mxpi_buf *b, uint64_t v);
void mxpi_buf_us(mxpi_buf *b, int64_t ns); /* ns as µs with 3 decimals */

/* Unchecked formatting into room the caller reserved; each returns the end.
 * u64 needs 20 bytes, i64 21, us 26. */
char *mxpi_fmt_u64(char *p, uint64_t v);
char *mxpi_fmt_i64(char *p, int64_t v);
char *mxpi_fmt_us(char *p, int64_t ns);
void mxpi_buf_json_str(mxpi_buf *b, const char *s, size_t n);
void mxpi_buf_free(mxpi_buf *b);

/* A NUL-terminated heap copy of n bytes (NULL when memory ran out). */
char *mxpi_dup(const char *s, size_t n);

/* ---- hot-path helpers ---- */

/* A full memory fence.  ThreadSanitizer does not model fences: there, a
 * sequentially consistent read-modify-write of one shared word stands in. */
#ifdef MXPI_TSAN
extern _Atomic int mxpi_fence_word;
static inline void mxpi_fence(void) { atomic_fetch_add_explicit(&mxpi_fence_word, 0, memory_order_seq_cst); }
#else
static inline void mxpi_fence(void) { atomic_thread_fence(memory_order_seq_cst); }
#endif

/* The owner's side of a stack edit: edits is odd from before its first
 * read of a claim to after its last write.  A claimer writes the claim,
 * then issues a process-wide barrier (membarrier), then reads edits: so
 * either this edit sees the claim or the claimer sees the edit.  Where
 * membarrier is missing the owner pays for a full fence instead. */
static inline void mxpi_edit_begin(mxpi_thread *t) {
    atomic_store_explicit(&t->edits, atomic_load_explicit(&t->edits, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    atomic_signal_fence(memory_order_seq_cst);
    if (__builtin_expect(mxpi_fence_needed, 0)) mxpi_fence();
}

static inline void mxpi_edit_end(mxpi_thread *t) {
    atomic_store_explicit(&t->edits, atomic_load_explicit(&t->edits, memory_order_relaxed) + 1,
                          memory_order_release);
}

/* A claim's tag: the range was ended elsewhere (a stop on another thread),
 * so a later stop here is not its end.  Untagged: cut short by a stop of
 * recording, and a later stop here is its end, which records nothing. */
#define MXPI_CLAIM_ENDED (UINT64_C(1) << 63)

/* Inside an edit, about to drop a claimed entry: false while a claimer is
 * still deciding about t's entries (it must find the entry there, or it
 * would take the owner for its recorder); the owner then ends its edit,
 * waits (mxpi_claim_wait) and starts over.  Cold: claimed entries are rare.
 * The fence orders the claim just read before the flag (the claimer sets
 * the flag before it writes claims). */
static inline bool mxpi_may_drop(mxpi_thread *t) {
    mxpi_fence();
    return atomic_load_explicit(&t->claiming, memory_order_relaxed) == 0;
}

void mxpi_claim_wait(mxpi_thread *t); /* mxp_claim.c: until no claimer decides about t */

/* Whether entry i of t's stack was closed by another thread. */
static inline bool mxpi_claimed(const mxpi_thread *t, uint32_t i) {
    return (atomic_load_explicit(&t->claims[i], memory_order_relaxed) & ~MXPI_CLAIM_ENDED) ==
           t->stack[i].seq;
}

/* Claimed as cut short: the owner's own end of it is still to come. */
static inline bool mxpi_cut(const mxpi_thread *t, uint32_t i) {
    return atomic_load_explicit(&t->claims[i], memory_order_relaxed) == t->stack[i].seq;
}

#define MXPI_LOAD(x) atomic_load_explicit(&(x), MXPI_RELAXED)
#define MXPI_STORE(x, v) atomic_store_explicit(&(x), (v), MXPI_RELAXED)

/* The calling thread's state, attaching it on the first call.  *rc becomes
 * MXP_NEW_THREAD on that first call.  NULL only when memory ran out. */
static inline mxpi_thread *mxpi_self(int *rc) {
    mxpi_thread *t = mxpi_tls;
    if (MXPI_LIKELY(t != NULL)) return t;
    t = mxpi_thread_attach();
    if (t) *rc = MXP_NEW_THREAD;
    return t;
}

static inline void mxpi_tally(_Atomic uint64_t *c) {
    atomic_store_explicit(c, atomic_load_explicit(c, MXPI_RELAXED) + 1, MXPI_RELAXED);
}

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

#endif /* MXP_INTERNAL_H */
