/*
 * mxp_api.c -- the hot path: ranges, frames, counters, markers, scopes.
 *
 * Each call: find the thread's state (one TLS load), load the session flags
 * (one relaxed atomic load), and when recording read the clock and write one
 * fixed-size record plus the thread's own aggregate entry.  No locks, no
 * allocation except on the slow paths in mxp_thread.c.
 *
 * Ranges live on a per-thread stack.  A begin made while not recording still
 * pushes an entry (with no clock read) so that its end is recognised and not
 * tallied as a stop without a start; nothing is recorded for it.
 */
#include "mxpi_agg.h"
#include "mxpi_buffer.h"
#include "mxpi_claim.h"
#include "mxpi_clock.h"
#include "mxpi_core.h"
#include "mxpi_nvtx.h"
#include "mxpi_registry.h"
#include "mxpi_thread.h"

#include <string.h>

static inline bool known(uint32_t id) {
    return id < atomic_load_explicit(&mxpi_g.nobj, MXPI_RELAXED);
}

/* Push an open range on t's stack; returns it, or NULL when the stack is at
 * its limit.  A frame's range takes the frame's next index. */
static inline mxpi_open *push(mxpi_thread *t, uint32_t id, bool frame) {
    if (MXPI_UNLIKELY(t->depth >= t->stack_cap) && !mxpi_stack_grow(t)) {
        mxpi_tally(&t->dropped);
        return NULL;
    }
    mxpi_edit_begin(t);
    /* Ranges another thread closed leave their entries: drop those on top. */
    while (MXPI_UNLIKELY(t->depth > 0 && mxpi_claimed(t, t->depth - 1))) {
        if (!mxpi_may_drop(t)) {
            mxpi_edit_end(t);
            mxpi_claim_wait(t);
            mxpi_edit_begin(t);
            continue;
        }
        t->depth--;
        if (MXPI_UNLIKELY(t->stack[t->depth].flags & MXPI_OPEN_NVTX)) mxpi_nvtx_end(t, t->depth);
    }
    mxpi_open *o = &t->stack[t->depth];
    o->id = id;
    o->aux = 0;
    o->seq = ++t->seq;
    atomic_store_explicit(&t->claims[t->depth], 0, MXPI_RELAXED);
    uint32_t f = mxpi_flags_now();
    if (MXPI_LIKELY(f & MXP_FLAG_RECORD)) {
        /* MXPI_OPEN_* share their bits with MXP_FLAG_*. */
        o->flags = f & (MXPI_OPEN_LIVE | MXPI_OPEN_TRACE | MXPI_OPEN_AGG);
        o->child = 0;
        o->start = o->credit = mxpi_ticks();
        if (frame)
            o->aux = atomic_fetch_add_explicit(&mxpi_obj(id)->frame_next, 1, MXPI_RELAXED) & MXPI_AUX_INDEX;
        if (MXPI_UNLIKELY(f & MXP_FLAG_NVTX)) mxpi_nvtx_begin(t, o);
    } else {
        o->flags = 0;
        o->start = o->credit = o->child = 0; /* read by claimers comparing starts */
        mxpi_tally(&t->ignored);
    }
    t->depth++;
    mxpi_edit_end(t);
    return o;
}

/* Record a finished range (a copy, already off the stack): its trace record
 * and its statistics. */
static inline void emit(mxpi_thread *t, const mxpi_open *o, int64_t now) {
    int64_t dur = now - o->start;
    if (MXPI_UNLIKELY(dur < 0)) dur = 0;
    uint32_t f = mxpi_flags_now();
    if (o->flags & f & MXPI_OPEN_TRACE) mxpi_record(t, f, o->start, dur, o->id, o->aux);
    if (o->flags & f & MXPI_OPEN_AGG) {
        int64_t self = dur - o->child;
        mxpi_aggregate_range(t, o->id, dur, self < 0 ? 0 : self);
    }
}

/* Close the range at stack index i below the top (it was not innermost),
 * inside an edit, which this ends.  A range another thread already closed
 * (claimed) just leaves the stack.  False (nothing changed) when a claimer
 * is still deciding about it: the caller waits and starts over. */
static __attribute__((noinline, cold)) bool end_inner(mxpi_thread *t, uint32_t i) {
    mxpi_open o = t->stack[i];
    uint32_t top = t->depth - 1;
    bool claimed = mxpi_claimed(t, i);
    if (claimed && !mxpi_may_drop(t)) {
        mxpi_edit_end(t);
        return false;
    }
    bool live = !claimed && (o.flags & MXPI_OPEN_LIVE);
    int64_t now = 0;
    if (!claimed) mxpi_tally(&t->non_lifo);
    if (live) {
        now = mxpi_ticks();
        /* The range directly above was its child until now; from now on it
         * counts towards the grandparent. */
        mxpi_open *above = &t->stack[i + 1];
        if (above->flags & MXPI_OPEN_LIVE) {
            o.child += now - above->credit;
            above->credit = now;
        }
        mxpi_open *parent = i > 0 ? &t->stack[i - 1] : NULL;
        if (parent != NULL && (parent->flags & MXPI_OPEN_LIVE)) parent->child += now - o.credit;
    }
    if (MXPI_UNLIKELY(o.flags & MXPI_OPEN_NVTX)) mxpi_nvtx_end(t, i);
    memmove(&t->stack[i], &t->stack[i + 1], (top - i) * sizeof t->stack[0]);
    for (uint32_t k = i; k < top; k++)
        atomic_store_explicit(&t->claims[k], atomic_load_explicit(&t->claims[k + 1], MXPI_RELAXED),
                              MXPI_RELAXED);
    t->depth = top;
    mxpi_edit_end(t);
    if (live)
        emit(t, &o, now);
    else if (!claimed)
        mxpi_tally(&t->ignored);
    return true;
}

/* Close the innermost open range (index depth - 1), inside an edit, which
 * this ends. */
static inline void end_top(mxpi_thread *t) {
    uint32_t i = t->depth - 1;
    mxpi_open o = t->stack[i];
    t->depth = i;
    if (MXPI_UNLIKELY(!(o.flags & MXPI_OPEN_LIVE))) {
        mxpi_edit_end(t);
        mxpi_tally(&t->ignored);
        return;
    }
    if (MXPI_UNLIKELY(o.flags & MXPI_OPEN_NVTX)) mxpi_nvtx_end(t, i); /* only live ones have it */
    int64_t now = mxpi_ticks();
    mxpi_open *parent = i > 0 ? &t->stack[i - 1] : NULL;
    if (parent != NULL && (parent->flags & MXPI_OPEN_LIVE)) parent->child += now - o.credit;
    mxpi_edit_end(t);
    emit(t, &o, now);
}

/* Inside an edit: drop the claimed entries on top of the stack.  1 when
 * one of them is a range of id cut short by a stop (its end is this call:
 * nothing more to do), -1 when a claimer is still deciding (the edit is
 * ended: wait and start over), else 0. */
static inline int drop_claimed(mxpi_thread *t, uint32_t id) {
    while (MXPI_UNLIKELY(t->depth > 0 && mxpi_claimed(t, t->depth - 1))) {
        if (!mxpi_may_drop(t)) {
            mxpi_edit_end(t);
            return -1;
        }
        uint32_t i = --t->depth;
        if (MXPI_UNLIKELY(t->stack[i].flags & MXPI_OPEN_NVTX)) mxpi_nvtx_end(t, i);
        if (t->stack[i].id == id && mxpi_cut(t, i)) return 1;
    }
    return 0;
}

/* The end of id found no open range of it on top of t's stack (inside an
 * edit, which this ends): close one further down, or one open elsewhere.
 * False when it must wait for a claimer and start over. */
static __attribute__((noinline, cold)) bool end_search(mxpi_thread *t, uint32_t id) {
    for (uint32_t d = t->depth; d > 1; d--) {
        if (t->stack[d - 2].id == id && (!mxpi_claimed(t, d - 2) || mxpi_cut(t, d - 2)))
            return end_inner(t, d - 2);
    }
    mxpi_edit_end(t);
    if (!mxpi_end_elsewhere(t, id, mxpi_ticks())) mxpi_tally(&t->unmatched);
    return true;
}

static inline void begin_on(mxpi_thread *t, uint32_t id, bool frame) {
    if (MXPI_LIKELY(known(id))) push(t, id, frame);
}

static inline void end_on(mxpi_thread *t, uint32_t id) {
    for (;;) {
        mxpi_edit_begin(t);
        int dropped = drop_claimed(t, id);
        if (MXPI_UNLIKELY(dropped != 0)) {
            if (dropped > 0) {
                mxpi_edit_end(t);
                return;
            }
            mxpi_claim_wait(t); /* the edit was ended */
            continue;
        }
        uint32_t d = t->depth;
        if (MXPI_LIKELY(d > 0 && t->stack[d - 1].id == id)) {
            end_top(t);
            return;
        }
        if (end_search(t, id)) return;
        mxpi_claim_wait(t);
    }
}

int mxp_range_begin(uint32_t id) {
    int rc = MXP_OK;
    mxpi_thread *t = mxpi_self(&rc);
    if (MXPI_LIKELY(t != NULL)) begin_on(t, id, false);
    return rc;
}

int mxp_frame_begin(uint32_t id) {
    int rc = MXP_OK;
    mxpi_thread *t = mxpi_self(&rc);
    if (MXPI_LIKELY(t != NULL)) begin_on(t, id, true);
    return rc;
}

int mxp_range_end(uint32_t id) {
    int rc = MXP_OK;
    mxpi_thread *t = mxpi_self(&rc);
    if (MXPI_LIKELY(t != NULL)) end_on(t, id);
    return rc;
}

static inline bool is_frame(uint32_t id) { return mxpi_obj(id)->kind == MXP_KIND_FRAME; }

int64_t mxp_range_begin_token(uint32_t id) {
    int rc = MXP_OK;
    mxpi_thread *t = mxpi_self(&rc);
    if (MXPI_UNLIKELY(t == NULL || !known(id))) return rc;
    mxpi_open *o = push(t, id, is_frame(id));
    if (o == NULL) return rc;
    return (int64_t)(o->seq << 1) | rc;
}

int mxp_range_end_token(uint32_t id, int64_t token) {
    int rc = MXP_OK;
    mxpi_thread *t = mxpi_self(&rc);
    if (MXPI_UNLIKELY(t == NULL)) return rc;
    uint64_t seq = (uint64_t)token >> 1;
again:
    mxpi_edit_begin(t);
    uint32_t d = t->depth;
    while (d > 0) {
        mxpi_open *o = &t->stack[--d];
        if (o->seq == seq && o->id == id) {
            if (d == t->depth - 1 && !mxpi_claimed(t, d)) {
                end_top(t);
            } else if (!end_inner(t, d)) {
                mxpi_claim_wait(t);
                goto again;
            }
            return rc;
        }
        if (o->seq < seq) break; /* sequence numbers grow up the stack */
    }
    mxpi_edit_end(t);
    mxpi_tally(&t->unmatched);
    return rc;
}

/* ---- ranges that may be in asyncio tasks ---- */

/* The calling thread's state for a checked call: NULL when it has none, or
 * (with *rc = MXP_IN_LOOP) when it runs an event loop. */
static inline mxpi_thread *outside_loop(int *rc) {
    mxpi_thread *t = mxpi_self(rc);
    if (MXPI_UNLIKELY(t != NULL && t->in_loop)) {
        *rc = MXP_IN_LOOP;
        return NULL;
    }
    return t;
}

int mxp_range_enter(uint32_t id) {
    int rc = MXP_OK;
    mxpi_thread *t = outside_loop(&rc);
    if (MXPI_LIKELY(t != NULL)) begin_on(t, id, false);
    return rc;
}

int mxp_frame_enter(uint32_t id) {
    int rc = MXP_OK;
    mxpi_thread *t = outside_loop(&rc);
    if (MXPI_LIKELY(t != NULL)) begin_on(t, id, true);
    return rc;
}

int mxp_range_exit(uint32_t id) {
    int rc = MXP_OK;
    mxpi_thread *t = outside_loop(&rc);
    if (MXPI_LIKELY(t != NULL)) end_on(t, id);
    return rc;
}

int mxp_thread_loop_set(int running) {
    int rc = MXP_OK;
    mxpi_thread *t = mxpi_self(&rc);
    if (t != NULL) t->in_loop = running != 0;
    return rc;
}

/* ---- ranges on tracks (asyncio tasks) ---- */

/* Track tid's state, or with tid 0 the calling thread's (*rc as mxpi_self). */
static inline mxpi_thread *stack_of(uint32_t tid, int *rc) {
    return tid ? mxpi_track_of(tid) : mxpi_self(rc);
}

/* The calling thread edits a track's stack: its moves counter is odd
 * meanwhile, so that the sampler, which reads the OS thread's stack and then
 * the range open on the task's track, sees that the two may not agree. */
static inline void move_begin(mxpi_thread *self) {
    if (self == NULL) return;
    atomic_store_explicit(&self->moves, atomic_load_explicit(&self->moves, MXPI_RELAXED) + 1,
                          MXPI_RELAXED);
#ifdef MXPI_TSAN
    mxpi_fence(); /* ThreadSanitizer models no fences (mxpi_claim.h) */
#else
    atomic_thread_fence(memory_order_release); /* before the track's stack changes */
#endif
}

static inline void move_end(mxpi_thread *self) {
    if (self == NULL) return;
    atomic_store_explicit(&self->moves, atomic_load_explicit(&self->moves, MXPI_RELAXED) + 1,
                          MXPI_RELEASE);
}

int mxp_track_begin(uint32_t tid, uint32_t id) {
    int rc = MXP_OK;
    mxpi_thread *t = stack_of(tid, &rc);
    if (MXPI_UNLIKELY(t == NULL)) return tid ? MXP_E_INVALID : rc;
    mxpi_thread *self = tid ? mxpi_self(&rc) : NULL;
    move_begin(self);
    begin_on(t, id, known(id) && is_frame(id));
    move_end(self);
    return rc;
}

int mxp_track_end(uint32_t tid, uint32_t id) {
    int rc = MXP_OK;
    mxpi_thread *t = stack_of(tid, &rc);
    if (MXPI_UNLIKELY(t == NULL)) return tid ? MXP_E_INVALID : rc;
    mxpi_thread *self = tid ? mxpi_self(&rc) : NULL;
    move_begin(self);
    end_on(t, id);
    move_end(self);
    return rc;
}

int mxp_track_close(uint32_t tid) {
    mxpi_thread *t = mxpi_track_of(tid);
    if (t == NULL) return MXP_E_INVALID;
    /* Its ranges still open end with it, cut short; those another thread
     * closed are left to it. */
    int64_t now = mxpi_ticks();
    for (;;) {
        mxpi_edit_begin(t);
        bool wait = false;
        for (uint32_t i = 0; i < t->depth && !wait; i++) wait = mxpi_claimed(t, i) && !mxpi_may_drop(t);
        if (!wait) break;
        mxpi_edit_end(t);
        mxpi_claim_wait(t);
    }
    uint32_t n = t->depth;
    for (uint32_t i = n; i-- > 0;) {
        mxpi_open o = t->stack[i];
        if (MXPI_UNLIKELY(o.flags & MXPI_OPEN_NVTX)) mxpi_nvtx_end(t, i);
        if (mxpi_claimed(t, i) || !(o.flags & MXPI_OPEN_LIVE)) continue;
        o.aux |= MXPI_AUX_CUT;
        emit(t, &o, now);
    }
    t->depth = 0;
    mxpi_edit_end(t);
    mxpi_track_retire(t);
    return MXP_OK;
}

/* ---- counters and markers ---- */

static inline void sample(mxpi_thread *t, uint32_t id, int64_t value) {
    uint32_t f = mxpi_flags_now();
    if (MXPI_UNLIKELY(!(f & MXP_FLAG_RECORD))) {
        mxpi_tally(&t->ignored);
        return;
    }
    int64_t now = mxpi_ticks();
    if (f & MXP_FLAG_TRACE) mxpi_record(t, f, now, value, id, 0);
    if (f & MXP_FLAG_AGGREGATE) {
        mxpi_agg *e = mxpi_agg_of(t, id);
        if (MXPI_UNLIKELY(e == NULL)) return;
        MXPI_STORE(e->count, MXPI_LOAD(e->count) + 1);
        MXPI_STORE(e->sum, MXPI_LOAD(e->sum) + (double)value);
        if (value < MXPI_LOAD(e->min)) MXPI_STORE(e->min, value);
        if (value > MXPI_LOAD(e->max)) MXPI_STORE(e->max, value);
        MXPI_STORE(e->last, value);
        MXPI_STORE(e->last_ts, now);
    }
}

static inline mxpi_object *counter_of(uint32_t id) {
    if (MXPI_UNLIKELY(!known(id))) return NULL;
    mxpi_object *o = mxpi_obj(id);
    return o->kind == MXP_KIND_COUNTER ? o : NULL;
}

int mxp_counter_set(uint32_t id, int64_t value) {
    int rc = MXP_OK;
    mxpi_thread *t = mxpi_self(&rc);
    mxpi_object *o = counter_of(id);
    if (MXPI_UNLIKELY(o == NULL)) return MXP_E_INVALID;
    atomic_store_explicit(&o->value, value, MXPI_RELAXED);
    if (MXPI_LIKELY(t != NULL)) sample(t, id, value);
    return rc;
}

int mxp_counter_init(uint32_t id, int64_t value) {
    if (mxpi_flags_now() & MXP_FLAG_RECORD) return mxp_counter_set(id, value);
    mxpi_object *o = counter_of(id);
    if (MXPI_UNLIKELY(o == NULL)) return MXP_E_INVALID;
    atomic_store_explicit(&o->value, value, MXPI_RELAXED);
    return MXP_OK;
}

/* Saturation is rare: one process-wide atomic, kept in every state (as the
 * value is). */
static void saturated(void) { atomic_fetch_add_explicit(&mxpi_g.saturated, 1, MXPI_RELAXED); }

int mxp_counter_add(uint32_t id, int64_t delta) {
    int rc = MXP_OK;
    mxpi_thread *t = mxpi_self(&rc);
    mxpi_object *o = counter_of(id);
    if (MXPI_UNLIKELY(o == NULL)) return MXP_E_INVALID;
    int64_t cur = atomic_load_explicit(&o->value, MXPI_RELAXED), next;
    bool over;
    do {
        over = __builtin_add_overflow(cur, delta, &next);
        if (MXPI_UNLIKELY(over)) next = delta > 0 ? INT64_MAX : INT64_MIN;
    } while (!atomic_compare_exchange_weak_explicit(&o->value, &cur, next, MXPI_RELAXED, MXPI_RELAXED));
    if (MXPI_UNLIKELY(over)) saturated();
    if (MXPI_LIKELY(t != NULL)) sample(t, id, next);
    return rc;
}

int mxp_counter_sub(uint32_t id, int64_t delta) {
    if (MXPI_UNLIKELY(delta == INT64_MIN)) return mxp_counter_add_wide(id, 0, (uint64_t)1 << 63);
    return mxp_counter_add(id, -delta);
}

/* As mxp_counter_add (kept apart so that the hot one stays as lean).  The
 * builtins compute in infinite precision, so mixing int64 and uint64 is
 * exact. */
int mxp_counter_add_wide(uint32_t id, int negative, uint64_t magnitude) {
    int rc = MXP_OK;
    mxpi_thread *t = mxpi_self(&rc);
    mxpi_object *o = counter_of(id);
    if (MXPI_UNLIKELY(o == NULL)) return MXP_E_INVALID;
    int64_t cur = atomic_load_explicit(&o->value, MXPI_RELAXED), next;
    bool over;
    do {
        over = negative ? __builtin_sub_overflow(cur, magnitude, &next)
                        : __builtin_add_overflow(cur, magnitude, &next);
        if (over) next = negative ? INT64_MIN : INT64_MAX;
    } while (!atomic_compare_exchange_weak_explicit(&o->value, &cur, next, MXPI_RELAXED, MXPI_RELAXED));
    if (over) saturated();
    if (MXPI_LIKELY(t != NULL)) sample(t, id, next);
    return rc;
}

int mxp_counter_saturate(uint32_t id, int negative, int init) {
    if (counter_of(id) == NULL) return MXP_E_INVALID;
    int64_t limit = negative ? INT64_MIN : INT64_MAX;
    int rc = init ? mxp_counter_init(id, limit) : mxp_counter_set(id, limit);
    saturated();
    return rc;
}

int64_t mxp_counter_value(uint32_t id) {
    mxpi_object *o = counter_of(id);
    return o == NULL ? 0 : atomic_load_explicit(&o->value, MXPI_RELAXED);
}

int mxp_marker_mark(uint32_t id, int scope) {
    if (MXPI_UNLIKELY(scope < MXP_SCOPE_GLOBAL || scope > MXP_SCOPE_MARKER || !known(id)))
        return MXP_E_INVALID;
    int rc = MXP_OK;
    mxpi_thread *t = mxpi_self(&rc);
    if (MXPI_UNLIKELY(t == NULL)) return rc;
    uint32_t f = mxpi_flags_now();
    if (MXPI_UNLIKELY(!(f & MXP_FLAG_RECORD))) {
        mxpi_tally(&t->ignored);
        return rc;
    }
    int64_t now = mxpi_ticks();
    if (MXPI_UNLIKELY(f & MXP_FLAG_NVTX)) mxpi_nvtx_mark(id);
    if (f & MXP_FLAG_TRACE) mxpi_record(t, f, now, 0, id, (uint32_t)scope);
    if (f & MXP_FLAG_AGGREGATE) {
        mxpi_agg *e = mxpi_agg_of(t, id);
        if (MXPI_LIKELY(e != NULL)) {
            MXPI_STORE(e->count, MXPI_LOAD(e->count) + 1);
            MXPI_STORE(e->last_ts, now);
        }
    }
    return rc;
}

/* ---- scopes and threads ---- */

int mxp_scope_set(uint32_t scope_id) {
    int rc = MXP_OK;
    mxpi_thread *t = mxpi_self(&rc);
    if (MXPI_UNLIKELY(t == NULL)) return rc;
    if (MXPI_UNLIKELY(!known(scope_id))) return MXP_E_INVALID;
    t->scope = scope_id;
    return rc;
}

uint32_t mxp_scope_current(void) {
    mxpi_thread *t = mxpi_tls;
    return t ? t->scope : 0;
}

uint32_t mxp_thread_tid(void) {
    int rc = MXP_OK;
    mxpi_thread *t = mxpi_self(&rc);
    return t ? t->tid : 0;
}
