/*
 * mxp_sample.c -- what every stack sample goes through, whoever took it (the
 * core's sampler thread, mxp_sampler.c, or a sampler of the binding's own
 * through mxp_sample_add): tables of frames and stack nodes, the attribution
 * of a sample to the innermost range open on its thread (or asyncio task
 * track) at the instant its stack was read, its record, and its count.
 *
 * Tables are append-only pages: an entry, once its id is published (release
 * store of the count), never moves or changes, so writers read them under
 * out_lock without taking the tables' lock.  Beside them, hash indexes (under
 * the tables' lock) give an equal frame or node the id it already has.
 *
 * Attribution is two steps around the read of the stack (mxpi_sample_pin,
 * then mxpi_sample_settle): the thread's stack-edit counters are read before
 * and after, and a sample whose thread began or ended a range in between is
 * taken again, so a sample never lands in a range its stack did not run in.
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
static pthread_mutex_t count_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static mxpi_sframe *_Atomic frame_pages[PAGES];
static mxpi_snode *_Atomic node_pages[PAGES];
static _Atomic uint32_t nframes, nnodes;

/* Indexes by content (table_lock): open addressing over ids (0: empty). */
typedef struct id_index {
    uint32_t *slot;
    uint32_t cap;
} id_index;
static id_index frame_index, node_index;

static void fork_prepare(void) {
    pthread_mutex_lock(&table_lock);
    pthread_mutex_lock(&count_lock);
}
static void fork_parent(void) {
    pthread_mutex_unlock(&count_lock);
    pthread_mutex_unlock(&table_lock);
}
static void fork_child(void) {
    pthread_mutex_init(&table_lock, NULL);
    pthread_mutex_init(&count_lock, NULL);
}
/* After the core's handlers (mxp_init): fork prepares in reverse order of
 * registration, and the core's locks come after these in the lock order. */
static void init_once(void) {
    mxp_init();
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

void mxpi_sample_init(void) { pthread_once(&once, init_once); }

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

static uint32_t mix(uint64_t h) {
    h ^= h >> 33;
    h *= UINT64_C(0xff51afd7ed558ccd);
    h ^= h >> 33;
    return (uint32_t)h;
}

static uint64_t text_hash(uint64_t h, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * UINT64_C(0x100000001b3);
    return h;
}

static uint32_t frame_hash(const char *name, size_t nl, const char *file, size_t fl, uint32_t line) {
    uint64_t h = text_hash(UINT64_C(0xcbf29ce484222325), name, nl);
    h = text_hash(h * 31 + nl, file, fl);
    return mix(h * 31 + line);
}

static uint32_t node_hash(uint32_t parent, uint32_t frame) { return mix((uint64_t)parent << 32 | frame); }

/* Put id, whose content hashes to h, in ix (caller holds table_lock); false
 * when the index cannot grow (the id then just has no index entry). */
static bool index_put(id_index *ix, uint32_t id, uint32_t h, uint32_t count,
                      uint32_t (*rehash)(uint32_t id)) {
    if ((count + 1) * 4 > ix->cap * 3) {
        uint32_t cap = ix->cap ? ix->cap * 2 : 1024;
        uint32_t *slot = calloc(cap, sizeof *slot);
        if (slot == NULL) return false;
        for (uint32_t i = 0; i < ix->cap; i++) {
            uint32_t old = ix->slot[i];
            if (old == 0) continue;
            uint32_t j = rehash(old) & (cap - 1);
            while (slot[j] != 0) j = (j + 1) & (cap - 1);
            slot[j] = old;
        }
        free(ix->slot);
        ix->slot = slot;
        ix->cap = cap;
    }
    uint32_t j = h & (ix->cap - 1);
    while (ix->slot[j] != 0) j = (j + 1) & (ix->cap - 1);
    ix->slot[j] = id;
    return true;
}

static uint32_t frame_rehash(uint32_t id) {
    const mxpi_sframe *f = mxpi_sframe_get(id);
    return frame_hash(f->name, f->name_len, f->file, f->file_len, f->line);
}

static uint32_t node_rehash(uint32_t id) {
    const mxpi_snode *n = mxpi_snode_get(id);
    return node_hash(n->parent, n->frame);
}

/* The id of an equal frame (caller holds table_lock); 0 when none. */
static uint32_t frame_find(const char *name, size_t nl, const char *file, size_t fl, uint32_t line,
                           uint32_t h) {
    for (uint32_t j = frame_index.cap ? h & (frame_index.cap - 1) : 0; frame_index.cap;
         j = (j + 1) & (frame_index.cap - 1)) {
        uint32_t id = frame_index.slot[j];
        if (id == 0) return 0;
        const mxpi_sframe *f = mxpi_sframe_get(id);
        if (f->line == line && f->name_len == nl && f->file_len == fl &&
            memcmp(f->name, name, nl) == 0 && memcmp(f->file, file, fl) == 0)
            return id;
    }
    return 0;
}

static uint32_t node_find(uint32_t parent, uint32_t frame, uint32_t h) {
    for (uint32_t j = node_index.cap ? h & (node_index.cap - 1) : 0; node_index.cap;
         j = (j + 1) & (node_index.cap - 1)) {
        uint32_t id = node_index.slot[j];
        if (id == 0) return 0;
        const mxpi_snode *n = mxpi_snode_get(id);
        if (n->parent == parent && n->frame == frame) return id;
    }
    return 0;
}

static int frame_intern(const char *name, size_t name_len, const char *file, size_t file_len,
                        uint32_t line, uint32_t *id_out) {
    pthread_once(&once, init_once);
    if (name_len > UINT32_MAX || file_len > UINT32_MAX) return MXP_E_INVALID;
    uint32_t h = frame_hash(name, name_len, file, file_len, line);
    pthread_mutex_lock(&table_lock);
    uint32_t id = frame_find(name, name_len, file, file_len, line, h);
    if (id != 0) {
        pthread_mutex_unlock(&table_lock);
        *id_out = id;
        return MXP_OK;
    }
    pthread_mutex_unlock(&table_lock);
    char *n = dup_text(name, name_len), *f = dup_text(file, file_len);
    if (n == NULL || f == NULL) {
        free(n);
        free(f);
        return MXP_E_NOMEM;
    }
    pthread_mutex_lock(&table_lock);
    id = frame_find(name, name_len, file, file_len, line, h); /* interned meanwhile? */
    bool full = false;
    if (id == 0) {
        uint32_t next = atomic_load_explicit(&nframes, MXPI_RELAXED) + 1;
        mxpi_sframe *e = slot((void *_Atomic *)frame_pages, next, sizeof *e);
        if (e != NULL) {
            *e = (mxpi_sframe){n, f, (uint32_t)name_len, (uint32_t)file_len, line};
            atomic_store_explicit(&nframes, next, MXPI_RELEASE);
            index_put(&frame_index, next, h, next - 1, frame_rehash);
            id = next;
            n = f = NULL; /* the table owns them */
        } else {
            full = true;
        }
    }
    pthread_mutex_unlock(&table_lock);
    free(n);
    free(f);
    if (full) return MXP_E_FULL;
    *id_out = id;
    return MXP_OK;
}

int mxp_sample_frame(const char *name, size_t name_len, const char *file, size_t file_len,
                     uint32_t line, uint32_t *id_out) {
    return frame_intern(name, name_len, file, file_len, line, id_out);
}

uint32_t mxpi_sframe_intern(const char *name, size_t name_len, const char *file, size_t file_len,
                            uint32_t line) {
    uint32_t id = 0;
    return frame_intern(name, name_len, file, file_len, line, &id) == MXP_OK ? id : 0;
}

int mxp_sample_stack(uint32_t parent, uint32_t frame, uint32_t *id_out) {
    pthread_once(&once, init_once);
    const mxpi_snode *up = parent ? mxpi_snode_get(parent) : NULL;
    if ((parent && up == NULL) || mxpi_sframe_get(frame) == NULL) return MXP_E_INVALID;
    uint32_t h = node_hash(parent, frame);
    pthread_mutex_lock(&table_lock);
    uint32_t id = node_find(parent, frame, h);
    if (id == 0) {
        id = atomic_load_explicit(&nnodes, MXPI_RELAXED) + 1;
        mxpi_snode *e = slot((void *_Atomic *)node_pages, id, sizeof *e);
        if (e != NULL) {
            *e = (mxpi_snode){parent, frame, up ? up->depth + 1 : 1};
            atomic_store_explicit(&nnodes, id, MXPI_RELEASE);
            index_put(&node_index, id, h, id - 1, node_rehash);
        } else {
            id = 0;
        }
    }
    pthread_mutex_unlock(&table_lock);
    if (id == 0) return MXP_E_FULL;
    *id_out = id;
    return MXP_OK;
}

uint32_t mxpi_snode_intern(uint32_t parent, uint32_t frame) {
    uint32_t id = 0;
    return mxp_sample_stack(parent, frame, &id) == MXP_OK ? id : 0;
}

int mxp_sample_frame_get(uint32_t id, const char **name_out, size_t *name_len_out,
                         const char **file_out, size_t *file_len_out, uint32_t *line_out) {
    const mxpi_sframe *f = mxpi_sframe_get(id);
    if (f == NULL) return MXP_E_INVALID;
    *name_out = f->name;
    *name_len_out = f->name_len;
    *file_out = f->file;
    *file_len_out = f->file_len;
    *line_out = f->line;
    return MXP_OK;
}

int mxp_sample_stack_get(uint32_t id, uint32_t *parent_out, uint32_t *frame_out) {
    const mxpi_snode *n = mxpi_snode_get(id);
    if (n == NULL) return MXP_E_INVALID;
    *parent_out = n->parent;
    *frame_out = n->frame;
    return MXP_OK;
}

/* ---- counts per (range, stack), for the statistics (count_lock) ---- */

typedef struct count_entry {
    uint64_t key; /* range << 32 | stack; stack 0: empty (no sample has stack 0) */
    uint64_t n;
} count_entry;

static struct {
    count_entry *e;
    uint32_t cap, used;
    uint32_t epoch; /* the statistics epoch (mxpi_g.agg_epoch) the counts belong to */
} C;

static void counts_clear(void) {
    if (C.e != NULL) memset(C.e, 0, C.cap * sizeof *C.e);
    C.used = 0;
}

static count_entry *count_slot(count_entry *e, uint32_t cap, uint64_t key) {
    uint32_t j = mix(key) & (cap - 1);
    while (e[j].key != 0 && e[j].key != key) j = (j + 1) & (cap - 1);
    return &e[j];
}

/* Caller holds count_lock: the counts of the current statistics epoch. */
static void counts_current(void) {
    uint32_t epoch = atomic_load_explicit(&mxpi_g.agg_epoch, MXPI_RELAXED);
    if (epoch != C.epoch) {
        counts_clear();
        C.epoch = epoch;
    }
}

static void count_one(uint32_t range, uint32_t stack) {
    pthread_once(&once, init_once);
    uint64_t key = (uint64_t)range << 32 | stack;
    pthread_mutex_lock(&count_lock);
    counts_current();
    if ((C.used + 1) * 4 > C.cap * 3) {
        uint32_t cap = C.cap ? C.cap * 2 : 1024;
        count_entry *e = calloc(cap, sizeof *e);
        if (e == NULL) {
            pthread_mutex_unlock(&count_lock);
            return;
        }
        for (uint32_t i = 0; i < C.cap; i++)
            if (C.e[i].key != 0) *count_slot(e, cap, C.e[i].key) = C.e[i];
        free(C.e);
        C.e = e;
        C.cap = cap;
    }
    count_entry *s = count_slot(C.e, C.cap, key);
    if (s->key == 0) {
        s->key = key;
        C.used++;
    }
    s->n++;
    pthread_mutex_unlock(&count_lock);
}

int mxp_sample_counts(mxp_sample_count *out, uint32_t cap, uint32_t *n_out, int reset) {
    pthread_once(&once, init_once);
    pthread_mutex_lock(&count_lock);
    counts_current();
    int rc = MXP_OK;
    *n_out = C.used;
    if (C.used > cap) {
        rc = MXP_E_FULL;
    } else {
        uint32_t k = 0;
        for (uint32_t i = 0; i < C.cap; i++)
            if (C.e[i].key != 0)
                out[k++] = (mxp_sample_count){(uint32_t)(C.e[i].key >> 32),
                                              (uint32_t)(C.e[i].key & 0xffffffffu), C.e[i].n};
        if (reset) counts_clear();
    }
    pthread_mutex_unlock(&count_lock);
    return rc;
}

void mxpi_samples_reset(void) {
    pthread_mutex_lock(&count_lock);
    counts_clear();
    C.epoch = atomic_load_explicit(&mxpi_g.agg_epoch, MXPI_RELAXED);
    pthread_mutex_unlock(&count_lock);
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
            /* mxpi_claimed, read through the volatile copy (as the rest). */
            uint64_t claim = atomic_load_explicit(&t->claims[d], MXPI_RELAXED) & ~MXPI_CLAIM_ENDED;
            if ((stack[d].flags & MXPI_OPEN_LIVE) && claim != stack[d].seq) {
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

/* Whether t is between edits of its stack or of a track's (its counters
 * even), reading them into p; spins a little first. */
NO_TSAN static bool quiet(mxpi_thread *t, mxpi_pin *p) {
    for (int tries = 0; tries < 64; tries++) {
        p->edits = atomic_load_explicit(&t->edits, MXPI_ACQUIRE);
        p->moves = atomic_load_explicit(&t->moves, MXPI_ACQUIRE);
        if (!((p->edits | p->moves) & 1u)) return true;
        sched_yield();
    }
    return false;
}

bool mxpi_sample_pin(int64_t os_tid, mxpi_pin *p) {
    bool ok = true;
    pthread_mutex_lock(&mxpi_g.reg_lock);
    p->t = by_os_tid(os_tid);
    if (p->t != NULL) ok = quiet(p->t, p);
    pthread_mutex_unlock(&mxpi_g.reg_lock);
    return ok;
}

bool mxpi_sample_settle(const mxpi_pin *p, int64_t os_tid, uint32_t track, uint32_t *range_out,
                        uint32_t *tid_out) {
    bool same = true;
    uint32_t tid = 0, range = MXPI_SAMPLE_NO_RANGE;
    mxpi_thread *k = track ? mxpi_track_of(track) : NULL;
    pthread_mutex_lock(&mxpi_g.reg_lock);
    mxpi_thread *t = by_os_tid(os_tid);
    if (t != p->t) {
        same = false; /* it began recording (or ended) while read */
    } else if (t != NULL) {
        mxpi_thread *on = k != NULL ? k : t;
        range = innermost(on);
        tid = on->tid;
        mxpi_pin now;
        same = quiet(t, &now) && now.edits == p->edits && now.moves == p->moves;
    } else if (k != NULL) {
        range = innermost(k);
        tid = k->tid;
    }
    pthread_mutex_unlock(&mxpi_g.reg_lock);
    *range_out = range;
    *tid_out = tid;
    return same;
}

void mxpi_sample_put(mxpi_thread *self, uint32_t f, int64_t ts, uint32_t tid, uint32_t range,
                     uint32_t stack) {
    if (f & MXP_FLAG_TRACE)
        mxpi_record(self, f, ts, (int64_t)((uint64_t)range << 32 | stack), MXPI_SAMPLE_ID, tid);
    if (f & MXP_FLAG_AGGREGATE) count_one(range, stack);
}

uint32_t mxpi_sample_timeline(int64_t os_tid) {
    mxpi_thread *t = mxpi_spare_new(os_tid);
    return t != NULL ? t->tid : 0;
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
    pthread_mutex_lock(&mxpi_g.reg_lock);
    if (t == NULL) t = by_os_tid(os_tid);
    if (t != NULL) {
        tid = t->tid;
        range = innermost(t);
    }
    pthread_mutex_unlock(&mxpi_g.reg_lock);
    if (t == NULL && (tid = mxpi_sample_timeline(os_tid)) == 0) return MXP_E_NOMEM;
    *range_out = range;
    *tid_out = tid;
    mxpi_sample_put(self, f, mxpi_ticks(), tid, range, stack);
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
