/*
 * mxp_sample.c -- what the stack sampler needs from the core: tables of
 * frames and stack nodes, and the record of one sample, attributed to the
 * innermost range open on the sampled thread (or asyncio task track).
 *
 * The sampler itself is not here: reading Python stacks touches Python
 * objects, so it lives in the binding (mxprof/_sampler.py), which interns
 * what it sees through mxp_sample_frame / mxp_sample_stack and hands each
 * sample over with mxp_sample_add.  The core never calls back into it.
 *
 * Tables are append-only pages: an entry, once its id is published (release
 * store of the count), never moves or changes, so writers read them under
 * out_lock without taking the tables' lock.
 */
#include "mxpi_sample.h"
#include "mxpi_buffer.h"
#include "mxpi_claim.h"
#include "mxpi_clock.h"
#include "mxpi_core.h"
#include "mxpi_registry.h"
#include "mxpi_thread.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

/* The stack entries are read as in mxp_claim.c: validated by the edit
 * counter, so ThreadSanitizer is told not to watch the copy. */
#ifdef MXPI_TSAN
#define NO_TSAN __attribute__((no_sanitize("thread")))
#else
#define NO_TSAN
#endif

#define PAGE_BITS 12u
#define PAGE (1u << PAGE_BITS)
#define PAGES 1024u /* 4 M entries per table */

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static mxpi_sframe *_Atomic frame_pages[PAGES];
static mxpi_snode *_Atomic node_pages[PAGES];
static _Atomic uint32_t nframes, nnodes;

static void fork_prepare(void) { pthread_mutex_lock(&table_lock); }
static void fork_parent(void) { pthread_mutex_unlock(&table_lock); }
static void fork_child(void) { pthread_mutex_init(&table_lock, NULL); }
static void init_once(void) { pthread_atfork(fork_prepare, fork_parent, fork_child); }

uint32_t mxpi_sframe_count(void) { return atomic_load_explicit(&nframes, MXPI_ACQUIRE); }
uint32_t mxpi_snode_count(void) { return atomic_load_explicit(&nnodes, MXPI_ACQUIRE); }

const mxpi_sframe *mxpi_sframe_get(uint32_t id) {
    if (id == 0 || id > mxpi_sframe_count()) return NULL;
    mxpi_sframe *p = atomic_load_explicit(&frame_pages[id >> PAGE_BITS], MXPI_ACQUIRE);
    return p ? &p[id & (PAGE - 1)] : NULL;
}

const mxpi_snode *mxpi_snode_get(uint32_t id) {
    if (id == 0 || id > mxpi_snode_count()) return NULL;
    mxpi_snode *p = atomic_load_explicit(&node_pages[id >> PAGE_BITS], MXPI_ACQUIRE);
    return p ? &p[id & (PAGE - 1)] : NULL;
}

/* The slot of the next id in a table (caller holds table_lock); NULL when
 * full or out of memory. */
static void *slot(void *_Atomic *pages, uint32_t next, size_t size) {
    if (next >= PAGES * PAGE) return NULL;
    void *p = atomic_load_explicit(&pages[next >> PAGE_BITS], MXPI_RELAXED);
    if (p == NULL) {
        p = calloc(PAGE, size);
        if (p == NULL) return NULL;
        atomic_store_explicit(&pages[next >> PAGE_BITS], p, MXPI_RELEASE);
    }
    return (char *)p + (size_t)(next & (PAGE - 1)) * size;
}

static char *dup_text(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p == NULL) return NULL;
    if (n) memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

int mxp_sample_frame(const char *name, size_t name_len, const char *file, size_t file_len,
                     uint32_t line, uint32_t *id_out) {
    pthread_once(&once, init_once);
    if (name_len > UINT32_MAX || file_len > UINT32_MAX) return MXP_E_INVALID;
    char *n = dup_text(name, name_len), *f = dup_text(file, file_len);
    if (n == NULL || f == NULL) {
        free(n);
        free(f);
        return MXP_E_NOMEM;
    }
    pthread_mutex_lock(&table_lock);
    uint32_t id = atomic_load_explicit(&nframes, MXPI_RELAXED) + 1;
    mxpi_sframe *e = slot((void *_Atomic *)frame_pages, id, sizeof *e);
    if (e != NULL) {
        *e = (mxpi_sframe){n, f, (uint32_t)name_len, (uint32_t)file_len, line};
        atomic_store_explicit(&nframes, id, MXPI_RELEASE);
    }
    pthread_mutex_unlock(&table_lock);
    if (e == NULL) {
        free(n);
        free(f);
        return MXP_E_FULL;
    }
    *id_out = id;
    return MXP_OK;
}

int mxp_sample_stack(uint32_t parent, uint32_t frame, uint32_t *id_out) {
    pthread_once(&once, init_once);
    const mxpi_snode *up = parent ? mxpi_snode_get(parent) : NULL;
    if ((parent && up == NULL) || mxpi_sframe_get(frame) == NULL) return MXP_E_INVALID;
    pthread_mutex_lock(&table_lock);
    uint32_t id = atomic_load_explicit(&nnodes, MXPI_RELAXED) + 1;
    mxpi_snode *e = slot((void *_Atomic *)node_pages, id, sizeof *e);
    if (e != NULL) {
        *e = (mxpi_snode){parent, frame, up ? up->depth + 1 : 1};
        atomic_store_explicit(&nnodes, id, MXPI_RELEASE);
    }
    pthread_mutex_unlock(&table_lock);
    if (e == NULL) return MXP_E_FULL;
    *id_out = id;
    return MXP_OK;
}

/* The innermost range open on t that was begun while recording, read as a
 * seqlock reader (caller holds reg_lock, so the stack is not freed or
 * replaced); MXPI_SAMPLE_NO_RANGE when none, or when t stayed mid-edit. */
NO_TSAN static uint32_t innermost(mxpi_thread *t) {
    for (int tries = 0; tries < 64; tries++) {
        uint32_t e1 = atomic_load_explicit(&t->edits, MXPI_ACQUIRE);
        if (e1 & 1u) {
            sched_yield();
            continue;
        }
        const volatile mxpi_thread *v = t;
        uint32_t d = v->depth, cap = v->stack_cap;
        const volatile mxpi_open *stack = v->stack;
        uint32_t id = MXPI_SAMPLE_NO_RANGE;
        if (d > cap) d = cap;
        while (stack != NULL && d > 0) {
            d--;
            if ((stack[d].flags & MXPI_OPEN_LIVE) && !mxpi_claimed(t, d)) {
                id = stack[d].id;
                break;
            }
        }
        mxpi_fence();
        if (atomic_load_explicit(&t->edits, MXPI_RELAXED) == e1) return id;
    }
    return MXPI_SAMPLE_NO_RANGE;
}

/* The live thread state of OS thread os_tid, or NULL (caller holds reg_lock). */
static mxpi_thread *by_os_tid(int64_t os_tid) {
    for (mxpi_thread *t = mxpi_g.threads; t; t = t->next)
        if (!t->retired && t->os_tid == os_tid && t->stack != NULL) return t;
    return NULL;
}

int mxp_sample_add(int64_t os_tid, uint32_t track, uint32_t stack, uint32_t *range_out,
                   uint32_t *tid_out) {
    int rc = MXP_OK;
    *range_out = MXPI_SAMPLE_NO_RANGE;
    *tid_out = 0;
    uint32_t f = mxpi_flags_now();
    if (!(f & MXP_FLAG_RECORD)) return MXP_E_STATE;
    if (stack == 0 || stack > mxpi_snode_count()) return MXP_E_INVALID;
    mxpi_thread *self = mxpi_self(&rc);
    if (self == NULL) return MXP_E_NOMEM;
    uint32_t tid = 0, range = MXPI_SAMPLE_NO_RANGE;
    mxpi_thread *t = track ? mxpi_track_of(track) : NULL;
    if (t == NULL) track = 0;
    pthread_mutex_lock(&mxpi_g.reg_lock);
    if (t == NULL) t = by_os_tid(os_tid);
    if (t != NULL) {
        tid = t->tid;
        range = innermost(t);
    }
    pthread_mutex_unlock(&mxpi_g.reg_lock);
    if (t == NULL) {
        /* A thread that never recorded: a timeline of its own for its
         * samples, found again by its OS thread id next time. */
        t = mxpi_thread_new(os_tid);
        if (t == NULL) return MXP_E_NOMEM;
        tid = t->tid;
    }
    *range_out = range;
    *tid_out = tid;
    if (f & MXP_FLAG_TRACE)
        mxpi_record(self, f, mxpi_ticks(), (int64_t)((uint64_t)range << 32 | stack), MXPI_SAMPLE_ID,
                    tid);
    return rc;
}

/* ---- for the writers ---- */

bool mxpi_seen_first(mxpi_seen *s, uint32_t id, bool *failed) {
    if (id >= s->n) {
        uint32_t n = s->n ? s->n : 256;
        while (n <= id) n *= 2;
        uint8_t *p = realloc(s->v, n);
        if (p == NULL) {
            *failed = true;
            return false;
        }
        memset(p + s->n, 0, n - s->n);
        s->v = p;
        s->n = n;
    }
    if (s->v[id]) return false;
    s->v[id] = 2;
    return true;
}

void mxpi_seen_settle(mxpi_seen *s, bool keep) {
    for (uint32_t i = 0; i < s->n; i++)
        if (s->v[i] == 2) s->v[i] = keep ? 1 : 0;
}

void mxpi_seen_free(mxpi_seen *s) {
    free(s->v);
    s->v = NULL;
    s->n = 0;
}
