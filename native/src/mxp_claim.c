/*
 * mxp_claim.c -- closing a range that is open on another thread's stack.
 *
 * Two things need it: set_state('stop') closes every open range there
 * (mxp_ranges_cut), and a stop on another thread (or asyncio task) than the
 * start closes the range where it began (mxpi_end_elsewhere).  A stack is
 * written only by its owner, without locks, so the claimer never changes
 * it: it marks the entry claimed (claim = seq) and the owner drops claimed
 * entries when it next touches its stack, recording nothing for them.
 *
 * The one race is an owner ending the same range at the same moment.  The
 * owner's stack edits are bracketed by an edit counter (odd while editing,
 * mxpi_edit_begin/end); the claimer writes the claim, makes every thread of
 * the process pass a full barrier (membarrier), waits until the owner is
 * between edits, and then reads the stack again: if the entry is still
 * there, every later edit sees the claim, and the range is the claimer's to
 * record; if it is gone, the owner ended it first.  Where membarrier is
 * missing, owners issue the fence themselves (mxpi_fence_needed).
 *
 * Claimers hold reg_lock, so stacks are neither reallocated (mxpi_stack_grow)
 * nor freed (thread exit) under them; they read stacks as seqlock readers.
 */
#include "mxpi_claim.h"
#include "mxpi_buffer.h"
#include "mxpi_clock.h"
#include "mxpi_core.h"
#include "mxpi_thread.h"
#include "mxpi_trace.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__linux__)
#include <sys/syscall.h>
#endif
#if defined(__linux__) && defined(SYS_membarrier)
#include <linux/membarrier.h>
#define HAVE_MEMBARRIER 1
#else
#define HAVE_MEMBARRIER 0
#endif

/* The stack entries a claimer copies are written by their owner without
 * atomics; the copy is validated by the edit counter (a seqlock read), so
 * ThreadSanitizer is told not to watch it. */
#ifdef MXPI_TSAN
#define NO_TSAN __attribute__((no_sanitize("thread")))
_Atomic int mxpi_fence_word;
#else
#define NO_TSAN
#endif

int mxpi_fence_needed = 1;

/* How long a claimer waits for an owner to finish one edit (a few
 * instructions, unless the owner was descheduled in the middle). */
#define SETTLE_NS 200000000
#define ROUNDS 8

void mxpi_claim_init(void) {
#if HAVE_MEMBARRIER
    if (syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0) == 0)
        mxpi_fence_needed = 0;
#endif
}

/* Every thread of the process has passed a full barrier when this returns. */
static void barrier_all(void) {
#if HAVE_MEMBARRIER
    if (!mxpi_fence_needed) {
        if (syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0) == 0) return;
        /* Not registered here (a forked child?): register, else fall back. */
        if (syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0) == 0 &&
            syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0) == 0)
            return;
        mxpi_fence_needed = 1;
    }
#endif
    mxpi_fence();
}

/* A copy of a stack and its claims. */
typedef struct snap {
    mxpi_open *e;
    uint64_t *claim;
    uint32_t n, cap;
} snap;

static void snap_free(snap *s) {
    free(s->e);
    free(s->claim);
}

/* Whether entry i of the copy was claimed (tag: 0 for any claim). */
static bool snap_claimed(const snap *s, uint32_t i) {
    return (s->claim[i] & ~MXPI_CLAIM_ENDED) == s->e[i].seq;
}

NO_TSAN static void copy_entries(mxpi_open *dst, const mxpi_open *src, uint32_t n) {
    const volatile mxpi_open *v = src;
    for (uint32_t i = 0; i < n; i++) {
        dst[i].id = v[i].id;
        dst[i].aux = v[i].aux;
        dst[i].flags = v[i].flags;
        dst[i].start = v[i].start;
        dst[i].child = v[i].child;
        dst[i].credit = v[i].credit;
        dst[i].seq = v[i].seq;
    }
}

NO_TSAN static uint32_t read_depth(const mxpi_thread *t) {
    uint32_t d = *(const volatile uint32_t *)&t->depth;
    return d > t->stack_cap ? t->stack_cap : d;
}

/* A consistent copy of t's stack (t between edits); false when t stayed in
 * one edit for longer than SETTLE_NS, or memory ran out. */
NO_TSAN static bool snapshot(mxpi_thread *t, snap *s) {
    int64_t deadline = mxpi_monotonic_ns() + SETTLE_NS;
    for (;;) {
        uint32_t e1 = atomic_load_explicit(&t->edits, MXPI_ACQUIRE);
        if (!(e1 & 1u)) {
            uint32_t d = read_depth(t);
            if (d > s->cap) {
                mxpi_open *p = realloc(s->e, d * sizeof *p);
                if (p != NULL) s->e = p;
                uint64_t *q = p ? realloc(s->claim, d * sizeof *q) : NULL;
                if (q == NULL) return false;
                s->claim = q;
                s->cap = d;
            }
            copy_entries(s->e, t->stack, d);
            for (uint32_t i = 0; i < d; i++) s->claim[i] = atomic_load_explicit(&t->claims[i], MXPI_RELAXED);
            mxpi_fence();
            if (atomic_load_explicit(&t->edits, MXPI_RELAXED) == e1) {
                s->n = d;
                return true;
            }
        }
        if (mxpi_monotonic_ns() > deadline) return false;
        sched_yield();
    }
}

void mxpi_claim_wait(mxpi_thread *t) {
    while (atomic_load_explicit(&t->claiming, MXPI_ACQUIRE)) sched_yield();
}

/* Write the claim of the entry with seq at its place in t's stack. */
static void mark(mxpi_thread *t, const snap *s, uint64_t seq, uint64_t tag) {
    for (uint32_t i = 0; i < s->n; i++)
        if (s->e[i].seq == seq) {
            /* Release: the owner that sees it sees claiming set too. */
            atomic_store_explicit(&t->claims[i], seq | tag, MXPI_RELEASE);
            return;
        }
}

/* Where the entry with seq is in s: -1 when gone. */
static int64_t find(const snap *s, uint64_t seq) {
    for (uint32_t i = 0; i < s->n; i++)
        if (s->e[i].seq == seq) return i;
    return -1;
}

/* Claim the entries with seqs want[0 .. n) on t (caller holds reg_lock).
 * On return want[i] is 0 for the entries the owner closed first; the others
 * are the caller's, and their last state is in got[i].  tag: 0 or
 * MXPI_CLAIM_ENDED. */
static void claim(mxpi_thread *t, uint64_t *want, mxpi_open *got, uint32_t n, uint64_t tag) {
    snap s = {0};
    /* While this is set, the owner leaves claimed entries where they are:
     * an entry gone from the stack was ended by its owner, never dropped. */
    atomic_store_explicit(&t->claiming, 1, MXPI_RELEASE);
    if (!snapshot(t, &s)) goto fail;
    for (uint32_t i = 0; i < n; i++) mark(t, &s, want[i], tag);
    for (uint32_t round = 0; round < ROUNDS; round++) {
        barrier_all();
        if (!snapshot(t, &s)) goto fail;
        bool again = false;
        for (uint32_t i = 0; i < n; i++) {
            if (want[i] == 0) continue;
            int64_t k = find(&s, want[i]);
            if (k < 0) {
                want[i] = 0; /* ended by its owner first */
            } else if (s.claim[k] != (want[i] | tag)) {
                mark(t, &s, want[i], tag); /* moved by an edit before it saw the claim */
                again = true;
            } else {
                got[i] = s.e[k];
            }
        }
        if (!again) {
            snap_free(&s);
            atomic_store_explicit(&t->claiming, 0, MXPI_RELEASE);
            return;
        }
    }
fail:
    /* Not settled: give up the claims (the owner may end these ranges as its
     * own), and leave them to the owner. */
    for (uint32_t i = 0; i < n; i++) {
        if (want[i] == 0) continue;
        for (uint32_t k = 0; k < s.n && k < t->stack_cap; k++) {
            uint64_t mine = want[i] | tag;
            atomic_compare_exchange_strong_explicit(&t->claims[k], &mine, 0, MXPI_RELAXED,
                                                    MXPI_RELAXED);
        }
        want[i] = 0;
    }
    snap_free(&s);
    atomic_store_explicit(&t->claiming, 0, MXPI_RELEASE);
}

static void emit_async(mxpi_thread *t, const mxpi_open *o, int64_t now) {
    if (!(o->flags & MXPI_OPEN_LIVE)) {
        mxpi_tally(&t->ignored);
        return;
    }
    int64_t dur = now > o->start ? now - o->start : 0;
    uint32_t f = mxpi_flags_now();
    if (o->flags & f & MXPI_OPEN_TRACE) mxpi_record(t, f, o->start, dur, o->id, o->aux | MXPI_AUX_ASYNC);
    if (o->flags & f & MXPI_OPEN_AGG) {
        int64_t self = dur - o->child;
        mxpi_aggregate_range(t, o->id, dur, self < 0 ? 0 : self);
    }
}

bool mxpi_end_elsewhere(mxpi_thread *t, uint32_t id, int64_t now) {
    pthread_mutex_lock(&mxpi_g.reg_lock);
    /* The range of id begun last, on any other stack. */
    mxpi_thread *owner = NULL;
    mxpi_open best = {0};
    snap s = {0};
    for (mxpi_thread *u = mxpi_g.threads; u; u = u->next) {
        if (u == t || u->retired || u->stack == NULL || !snapshot(u, &s)) continue;
        for (uint32_t i = s.n; i-- > 0;) {
            const mxpi_open *e = &s.e[i];
            if (e->id != id || snap_claimed(&s, i)) continue;
            /* Prefer a recorded range; among those, the one begun last. */
            bool live = (e->flags & MXPI_OPEN_LIVE) != 0, best_live = (best.flags & MXPI_OPEN_LIVE) != 0;
            if (owner == NULL || live > best_live || (live == best_live && e->start > best.start)) {
                owner = u;
                best = *e;
            }
            break;
        }
    }
    snap_free(&s);
    uint64_t want = owner ? best.seq : 0;
    if (owner) claim(owner, &want, &best, 1, MXPI_CLAIM_ENDED);
    pthread_mutex_unlock(&mxpi_g.reg_lock);
    if (want == 0) return false;
    emit_async(t, &best, now);
    return true;
}

bool mxpi_open_peek(int64_t at, mxpi_rec **recs, uint32_t **tids, uint32_t *n) {
    *recs = NULL;
    *tids = NULL;
    *n = 0;
    uint32_t cap = 0;
    bool ok = true;
    snap s = {0};
    pthread_mutex_lock(&mxpi_g.reg_lock);
    for (mxpi_thread *u = mxpi_g.threads; u && ok; u = u->next) {
        if (u->retired || u->stack == NULL || !snapshot(u, &s)) continue;
        for (uint32_t i = 0; i < s.n && ok; i++) {
            const mxpi_open *e = &s.e[i];
            uint32_t want = MXPI_OPEN_LIVE | MXPI_OPEN_TRACE;
            if ((e->flags & want) != want || snap_claimed(&s, i) || e->start > at) continue;
            if (*n == cap) {
                uint32_t c = cap ? cap * 2 : 64;
                mxpi_rec *r = realloc(*recs, c * sizeof *r);
                if (r != NULL) *recs = r;
                uint32_t *t = r ? realloc(*tids, c * sizeof *t) : NULL;
                if (t == NULL) {
                    ok = false;
                    break;
                }
                *tids = t;
                cap = c;
            }
            mxpi_rec *r = &(*recs)[*n];
            r->ts = e->start;
            r->val = at - e->start;
            r->id = e->id;
            r->aux = e->aux | MXPI_AUX_CUT;
            (*tids)[(*n)++] = u->tid;
        }
    }
    pthread_mutex_unlock(&mxpi_g.reg_lock);
    snap_free(&s);
    return ok;
}

int mxp_ranges_open(int64_t os_tid, uint32_t *ids_out, int64_t *ages_out, uint32_t cap,
                    uint32_t *n_out) {
    uint32_t n = 0;
    bool ok = true;
    snap s = {0};
    *n_out = 0;
    pthread_mutex_lock(&mxpi_g.reg_lock);
    for (mxpi_thread *u = mxpi_g.threads; u; u = u->next) {
        if (u->retired || u->stack == NULL || u->os_tid != os_tid) continue;
        ok = snapshot(u, &s);
        for (uint32_t i = 0; ok && i < s.n && n < cap; i++) {
            if (!(s.e[i].flags & MXPI_OPEN_LIVE) || snap_claimed(&s, i)) continue;
            ids_out[n] = s.e[i].id;
            ages_out[n++] = s.e[i].start;
        }
        break; /* the thread's own stack, not a track of the same OS thread */
    }
    pthread_mutex_unlock(&mxpi_g.reg_lock);
    snap_free(&s);
    if (!ok) return MXP_E_STATE;
    mxpi_timebase tb;
    mxpi_timebase_get(&tb);
    int64_t now = mxpi_ticks();
    for (uint32_t i = 0; i < n; i++) ages_out[i] = mxpi_tb_span(&tb, now - ages_out[i]);
    *n_out = n;
    return MXP_OK;
}

typedef struct cut {
    mxpi_rec r;
    uint32_t tid;
    uint32_t flags;
    int64_t child;
} cut;

/* Claim every live range open on thread u; append them to *out. */
static bool cut_thread(mxpi_thread *u, int64_t now, cut **out, uint32_t *n, uint32_t *cap) {
    snap s = {0};
    if (!snapshot(u, &s)) return true;
    uint32_t m = 0;
    uint64_t *want = malloc((s.n ? s.n : 1) * sizeof *want);
    mxpi_open *got = malloc((s.n ? s.n : 1) * sizeof *got);
    if (want == NULL || got == NULL) goto oom;
    for (uint32_t i = 0; i < s.n; i++)
        if ((s.e[i].flags & MXPI_OPEN_LIVE) && !snap_claimed(&s, i)) want[m++] = s.e[i].seq;
    if (m) claim(u, want, got, m, 0);
    /* A range cut with the one directly above it has that one as a child
     * until now (the stack is in want's order, bottom first). */
    for (uint32_t i = 0; i + 1 < m; i++)
        if (want[i] && want[i + 1]) got[i].child += now - got[i + 1].credit;
    for (uint32_t i = 0; i < m; i++) {
        if (want[i] == 0) continue;
        if (*n == *cap) {
            uint32_t c = *cap ? *cap * 2 : 16;
            cut *p = realloc(*out, c * sizeof *p);
            if (p == NULL) goto oom;
            *out = p;
            *cap = c;
        }
        const mxpi_open *o = &got[i];
        cut *k = &(*out)[(*n)++];
        k->r.ts = o->start;
        k->r.val = now > o->start ? now - o->start : 0;
        k->r.id = o->id;
        k->r.aux = o->aux | MXPI_AUX_CUT;
        k->tid = u->tid;
        k->flags = o->flags;
        k->child = o->child;
    }
    free(want);
    free(got);
    snap_free(&s);
    return true;
oom:
    free(want);
    free(got);
    snap_free(&s);
    return false;
}

int mxp_ranges_cut(void) {
    mxp_init();
    int rc = MXP_OK;
    mxpi_thread *self = mxpi_self(&rc);
    int64_t now = mxpi_ticks();
    cut *cuts = NULL;
    uint32_t n = 0, cap = 0;
    bool ok = true;
    pthread_mutex_lock(&mxpi_g.reg_lock);
    for (mxpi_thread *u = mxpi_g.threads; u && ok; u = u->next)
        if (!u->retired && u->stack != NULL) ok = cut_thread(u, now, &cuts, &n, &cap);
    pthread_mutex_unlock(&mxpi_g.reg_lock);
    uint32_t f = mxpi_flags_now();
    if (n && (f & MXP_FLAG_TRACE)) {
        pthread_mutex_lock(&mxpi_g.out_lock);
        for (uint32_t i = 0; i < n; i++)
            if (cuts[i].flags & MXPI_OPEN_TRACE) mxpi_trace_add_cut(&cuts[i].r, cuts[i].tid);
        pthread_mutex_unlock(&mxpi_g.out_lock);
    }
    if (self != NULL && (f & MXP_FLAG_AGGREGATE)) {
        for (uint32_t i = 0; i < n; i++) {
            if (!(cuts[i].flags & MXPI_OPEN_AGG)) continue;
            int64_t self_ticks = cuts[i].r.val - cuts[i].child;
            mxpi_aggregate_range(self, cuts[i].r.id, cuts[i].r.val, self_ticks < 0 ? 0 : self_ticks);
        }
    }
    if (self != NULL) atomic_fetch_add_explicit(&self->cut, n, MXPI_RELAXED);
    free(cuts);
    if (!ok) return MXP_E_NOMEM;
    return (int)(n > INT32_MAX ? INT32_MAX : n);
}
