/*
 * mxpi_claim.h -- closing ranges open on other stacks (mxp_claim.c: a stop
 * of recording, cross-thread ends), and the owner's side of that protocol,
 * which the hot path runs on every stack edit.
 */
#ifndef MXPI_CLAIM_H
#define MXPI_CLAIM_H

#include "mxpi_base.h"
#include "mxpi_thread.h"

extern int mxpi_fence_needed; /* no membarrier(): owners fence themselves */
void mxpi_claim_init(void);
/* The calling thread's end of id matched nothing on its own stack: close
 * the latest open range of id on another stack, recording it on t as an
 * async range.  False when there is none (a stop without a start). */
bool mxpi_end_elsewhere(mxpi_thread *t, uint32_t id, int64_t now);

/* The ranges open now on every stack that were begun while recording and
 * go to the trace, as records cut at `at` (those begun after it left out).
 * Nothing is claimed: their owners still end them.  *recs and *tids (the
 * stack's trace id beside each) hold *n entries; the caller frees both.
 * False when memory ran out.  Takes reg_lock. */
bool mxpi_open_peek(int64_t at, mxpi_rec **recs, uint32_t **tids, uint32_t *n);

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

void mxpi_claim_wait(mxpi_thread *t); /* until no claimer decides about t */

/* Whether entry i of t's stack was closed by another thread. */
static inline bool mxpi_claimed(const mxpi_thread *t, uint32_t i) {
    return (atomic_load_explicit(&t->claims[i], memory_order_relaxed) & ~MXPI_CLAIM_ENDED) ==
           t->stack[i].seq;
}

/* Claimed as cut short: the owner's own end of it is still to come. */
static inline bool mxpi_cut(const mxpi_thread *t, uint32_t i) {
    return atomic_load_explicit(&t->claims[i], memory_order_relaxed) == t->stack[i].seq;
}

#endif /* MXPI_CLAIM_H */
