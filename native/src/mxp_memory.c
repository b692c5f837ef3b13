/*
 * mxp_memory.c -- memory attribution.
 *
 * An allocation belongs to a device and a scope.  Both have a counter of
 * the bytes in use (domains "Device Storage" and "Scope Storage"), which
 * goes through the ordinary counter path, so it is sampled into the trace
 * and the statistics like any counter.  Beside the counters this file keeps
 * what a counter cannot: the table of live allocations (to know what a free
 * gives back), peaks, totals and counts.  All of it is under one lock;
 * recording memory is not a hot path the way ranges are, and a consistent
 * table matters more (MXNet's unsynchronised one crashed).
 *
 * The bytes in use count what the allocator took (actual, which defaults to
 * the bytes requested).  The table, and so the bytes in use, is kept while
 * MXP_FLAG_MEMORY is set, paused or not, so the numbers stay right across a
 * pause; samples and instants reach the trace only while recording.
 */
#include "mxpi_memory.h"
#include "mxpi_clock.h"
#include "mxpi_core.h"
#include "mxpi_json.h"
#include "mxpi_registry.h"
#include "mxpi_thread.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEVICES 256u
#define HANDLE_BIT ((uint64_t)1 << 63)
#define DEVICE_DOMAIN "Device Storage"
#define SCOPE_DOMAIN "Scope Storage"

typedef struct device {
    int type;
    uint32_t ordinal;
    char label[24]; /* "gpu/3" */
    mxp_memory_stat stat;
} device;

typedef struct slot {
    uint64_t ptr; /* 0 = empty */
    mxp_alloc a;
} slot;

static struct {
    pthread_mutex_t lock;
    device dev[MAX_DEVICES];
    uint32_t ndev;
    mxp_memory_stat *scopes; /* one per scope seen, in order of first use */
    uint32_t nscopes, scopes_cap;
    uint32_t *scope_index; /* scope id -> index in scopes + 1 (0: none yet) */
    uint32_t scope_index_len;
    slot *tab; /* open addressing, linear probing, power-of-two size */
    uint32_t tab_cap, tab_n;
    uint64_t next_handle;
} M = {.lock = PTHREAD_MUTEX_INITIALIZER};

static const char *type_name(int type) { return type == MXP_DEVICE_GPU ? "gpu" : "cpu"; }


static bool is_scope(uint32_t id) {
    return id == 0 || (id < atomic_load_explicit(&mxpi_g.nobj, MXPI_ACQUIRE) &&
                       mxpi_obj(id)->kind == MXP_KIND_SCOPE);
}

/* A counter object, or the kind's overflow object when the table is full. */
static uint32_t counter_named(const char *domain, const char *name, size_t name_len) {
    uint32_t id = 0;
    int rc = mxp_object_register(MXP_KIND_COUNTER, domain, strlen(domain), name, name_len, &id);
    return rc == MXP_OK || rc == MXP_E_FULL ? id : 0;
}

int mxp_memory_device(int type, uint32_t ordinal, uint32_t *slot_out) {
    mxp_init();
    if ((type != MXP_DEVICE_CPU && type != MXP_DEVICE_GPU) || slot_out == NULL) return MXP_E_INVALID;
    int rc = MXP_OK;
    pthread_mutex_lock(&M.lock);
    uint32_t i = 0;
    while (i < M.ndev && !(M.dev[i].type == type && M.dev[i].ordinal == ordinal)) i++;
    if (i == M.ndev) {
        if (M.ndev == MAX_DEVICES) {
            rc = MXP_E_FULL;
            goto out;
        }
        device *d = &M.dev[i];
        memset(d, 0, sizeof *d);
        d->type = type;
        d->ordinal = ordinal;
        snprintf(d->label, sizeof d->label, "%s/%u", type_name(type), ordinal);
        char name[40];
        int n = snprintf(name, sizeof name, "Memory: %s", d->label);
        d->stat.counter = counter_named(DEVICE_DOMAIN, name, (size_t)n);
        d->stat.key = i;
        M.ndev++;
    }
    *slot_out = i;
out:
    pthread_mutex_unlock(&M.lock);
    return rc;
}

/* The usage entry of scope id, created on first use; NULL when memory ran
 * out.  Caller holds the lock. */
static mxp_memory_stat *scope_stat(uint32_t id) {
    if (id >= M.scope_index_len) {
        uint32_t n = M.scope_index_len ? M.scope_index_len : 64;
        while (n <= id) n *= 2;
        uint32_t *p = realloc(M.scope_index, n * sizeof *p);
        if (p == NULL) return NULL;
        memset(p + M.scope_index_len, 0, (n - M.scope_index_len) * sizeof *p);
        M.scope_index = p;
        M.scope_index_len = n;
    }
    if (M.scope_index[id]) return &M.scopes[M.scope_index[id] - 1];
    if (M.nscopes == M.scopes_cap) {
        uint32_t n = M.scopes_cap ? M.scopes_cap * 2 : 16;
        mxp_memory_stat *p = realloc(M.scopes, n * sizeof *p);
        if (p == NULL) return NULL;
        M.scopes = p;
        M.scopes_cap = n;
    }
    mxp_memory_stat *s = &M.scopes[M.nscopes];
    memset(s, 0, sizeof *s);
    s->is_scope = 1;
    s->key = id;
    if (id == 0)
        s->counter = counter_named(SCOPE_DOMAIN, "<unk>:", 6);
    else
        s->counter = counter_named(SCOPE_DOMAIN, mxpi_obj(id)->name, mxpi_obj(id)->name_len);
    M.scope_index[id] = ++M.nscopes;
    return s;
}

/* ---- the table of live allocations ---- */

static uint32_t hash_ptr(uint64_t p) {
    p ^= p >> 33;
    p *= 0xff51afd7ed558ccdULL;
    p ^= p >> 33;
    return (uint32_t)p;
}

static slot *find(uint64_t ptr) {
    if (M.tab_cap == 0) return NULL;
    uint32_t mask = M.tab_cap - 1;
    for (uint32_t i = hash_ptr(ptr) & mask;; i = (i + 1) & mask) {
        if (M.tab[i].ptr == ptr) return &M.tab[i];
        if (M.tab[i].ptr == 0) return NULL;
    }
}

static bool grow(void) {
    uint32_t cap = M.tab_cap ? M.tab_cap * 2 : 1024;
    slot *t = calloc(cap, sizeof *t);
    if (t == NULL) return false;
    for (uint32_t i = 0; i < M.tab_cap; i++) {
        if (M.tab[i].ptr == 0) continue;
        uint32_t j = hash_ptr(M.tab[i].ptr) & (cap - 1);
        while (t[j].ptr != 0) j = (j + 1) & (cap - 1);
        t[j] = M.tab[i];
    }
    free(M.tab);
    M.tab = t;
    M.tab_cap = cap;
    return true;
}

static bool insert(const mxp_alloc *a) {
    if ((M.tab_n + 1) * 2 > M.tab_cap && !grow()) return false;
    uint32_t mask = M.tab_cap - 1;
    uint32_t i = hash_ptr(a->ptr) & mask;
    while (M.tab[i].ptr != 0) i = (i + 1) & mask;
    M.tab[i].ptr = a->ptr;
    M.tab[i].a = *a;
    M.tab_n++;
    return true;
}

/* Remove a slot, shifting back the entries probed past it. */
static void erase(slot *s) {
    uint32_t mask = M.tab_cap - 1;
    uint32_t i = (uint32_t)(s - M.tab);
    for (uint32_t j = (i + 1) & mask; M.tab[j].ptr != 0; j = (j + 1) & mask) {
        uint32_t home = hash_ptr(M.tab[j].ptr) & mask;
        /* Move j into the hole at i when its home is not in (i, j]. */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            M.tab[i] = M.tab[j];
            i = j;
        }
    }
    M.tab[i].ptr = 0;
    M.tab_n--;
}

/* ---- accounting ---- */

static void account(mxp_memory_stat *s, int64_t delta) {
    if (s == NULL) return;
    if (__builtin_add_overflow(s->current, delta, &s->current)) s->current = delta > 0 ? INT64_MAX : INT64_MIN;
    if (s->current > s->peak) s->peak = s->current;
    if (delta > 0) {
        s->allocs++;
        if (__builtin_add_overflow(s->allocated, delta, &s->allocated)) s->allocated = INT64_MAX;
    } else {
        s->frees++;
    }
    if (s->counter) mxp_counter_add(s->counter, delta);
}

/* An allocation or free instant, when they are asked for and recorded. */
static void instant(int kind, const mxp_alloc *a) {
    uint32_t f = mxpi_flags_now();
    uint32_t need = MXP_FLAG_MEMORY_EVENTS | MXP_FLAG_RECORD | MXP_FLAG_TRACE;
    if ((f & need) != need) return;
    int rc = MXP_OK;
    mxpi_thread *t = mxpi_self(&rc);
    if (t == NULL) return;
    /* The attribute: the scope's name and the tag, as MXNet's CSV has it. */
    mxpi_buf attr = {0};
    if (a->scope == 0)
        mxpi_buf_puts(&attr, "<unk>:");
    else
        mxpi_buf_put(&attr, mxpi_obj(a->scope)->name, mxpi_obj(a->scope)->name_len);
    if (a->tag != 0) mxpi_buf_put(&attr, mxpi_obj(a->tag)->name, mxpi_obj(a->tag)->name_len);
    const char *label = M.dev[a->device].label;
    uint32_t id = 0;
    int r = attr.failed ? MXP_E_NOMEM
                        : mxp_object_register(kind, label, strlen(label), attr.data, attr.len, &id);
    mxpi_buf_free(&attr);
    if (r != MXP_OK && r != MXP_E_FULL) return;
    mxpi_record(t, f, mxpi_ticks(), a->bytes, id, a->device);
}

/* Take a live allocation out of the table and the usage. */
static void release(slot *s) {
    mxp_alloc a = s->a;
    erase(s);
    account(&M.dev[a.device].stat, -a.actual);
    account(scope_stat(a.scope), -a.actual);
    instant(MXP_KIND_FREE, &a);
}

int mxp_memory_alloc(uint64_t ptr, int64_t bytes, int64_t actual, uint32_t device, uint32_t scope,
                     uint32_t tag, int reuse, uint64_t *handle_out) {
    mxp_init();
    if (!(mxpi_flags_now() & MXP_FLAG_MEMORY)) return MXP_E_STATE;
    if (bytes < 0 || actual < 0) return MXP_E_INVALID;
    int first = MXP_OK;
    mxpi_thread *self = mxpi_self(&first);
    if (scope == MXP_SCOPE_OF_THREAD) scope = self ? self->scope : 0;
    if (!is_scope(scope) || !is_scope(tag)) return MXP_E_INVALID;
    int rc = MXP_OK;
    pthread_mutex_lock(&M.lock);
    if (device >= M.ndev) {
        rc = MXP_E_INVALID;
        goto out;
    }
    if (ptr == 0) {
        ptr = HANDLE_BIT | ++M.next_handle;
    } else {
        slot *old = find(ptr);
        if (old != NULL) release(old); /* its free was never seen */
    }
    mxp_alloc a = {ptr, bytes, actual ? actual : bytes, device, scope, tag, reuse != 0};
    mxp_memory_stat *ss = scope_stat(scope);
    if (ss == NULL || !insert(&a)) {
        rc = MXP_E_NOMEM;
        goto out;
    }
    account(&M.dev[device].stat, a.actual);
    account(ss, a.actual);
    instant(MXP_KIND_ALLOC, &a);
    if (handle_out) *handle_out = ptr;
out:
    pthread_mutex_unlock(&M.lock);
    return rc == MXP_OK ? first : rc;
}

int mxp_memory_free(uint64_t ptr) {
    mxp_init();
    int first = MXP_OK;
    mxpi_self(&first);
    pthread_mutex_lock(&M.lock);
    slot *s = ptr ? find(ptr) : NULL;
    if (s != NULL) release(s);
    pthread_mutex_unlock(&M.lock);
    if (s != NULL) return first;
    if (mxpi_flags_now() & MXP_FLAG_MEMORY) atomic_fetch_add_explicit(&mxpi_g.unknown_frees, 1, MXPI_RELAXED);
    return first | MXP_MEMORY_UNKNOWN;
}

int mxp_memory_live(mxp_alloc *out, uint32_t cap, uint32_t *n_out) {
    mxp_init();
    if (n_out == NULL || (out == NULL && cap)) return MXP_E_INVALID;
    pthread_mutex_lock(&M.lock);
    uint32_t n = M.tab_n;
    int rc = n > cap ? MXP_E_FULL : MXP_OK;
    if (rc == MXP_OK) {
        uint32_t k = 0;
        for (uint32_t i = 0; i < M.tab_cap; i++)
            if (M.tab[i].ptr != 0) out[k++] = M.tab[i].a;
    }
    pthread_mutex_unlock(&M.lock);
    *n_out = n;
    return rc;
}

int mxp_memory_usage(mxp_memory_stat *out, uint32_t cap, uint32_t *n_out) {
    mxp_init();
    if (n_out == NULL || (out == NULL && cap)) return MXP_E_INVALID;
    pthread_mutex_lock(&M.lock);
    uint32_t n = M.ndev + M.nscopes;
    int rc = n > cap ? MXP_E_FULL : MXP_OK;
    /* With nothing to copy, out and M.scopes may be NULL: memcpy from NULL,
     * and NULL + 0, are undefined even for zero bytes. */
    if (rc == MXP_OK && n) {
        for (uint32_t i = 0; i < M.ndev; i++) out[i] = M.dev[i].stat;
        if (M.nscopes) memcpy(out + M.ndev, M.scopes, M.nscopes * sizeof *out);
    }
    pthread_mutex_unlock(&M.lock);
    *n_out = n;
    return rc;
}

static void restart(mxp_memory_stat *s) {
    s->peak = s->current;
    s->allocated = 0;
    s->allocs = s->frees = 0;
}

void mxpi_memory_stats_reset(void) {
    pthread_mutex_lock(&M.lock);
    for (uint32_t i = 0; i < M.ndev; i++) restart(&M.dev[i].stat);
    for (uint32_t i = 0; i < M.nscopes; i++) restart(&M.scopes[i]);
    pthread_mutex_unlock(&M.lock);
}

/* Forget every allocation; devices keep their slots (bindings cache them). */
static void clear(void) {
    for (uint32_t i = 0; i < M.ndev; i++) {
        uint32_t counter = M.dev[i].stat.counter;
        memset(&M.dev[i].stat, 0, sizeof M.dev[i].stat);
        M.dev[i].stat.counter = counter;
        M.dev[i].stat.key = i;
    }
    M.nscopes = 0;
    if (M.scope_index) memset(M.scope_index, 0, M.scope_index_len * sizeof *M.scope_index);
    if (M.tab) memset(M.tab, 0, M.tab_cap * sizeof *M.tab);
    M.tab_n = 0;
}

void mxpi_memory_reset(void) {
    pthread_mutex_lock(&M.lock);
    clear();
    pthread_mutex_unlock(&M.lock);
}

/* Held across fork() (mxp_core.c's handlers) and released on both sides,
 * so that the child's copy of the table is not one another thread was
 * changing (growing the scope index, say) when the process forked. */
void mxpi_memory_fork_lock(void) { pthread_mutex_lock(&M.lock); }
void mxpi_memory_fork_unlock(void) { pthread_mutex_unlock(&M.lock); }

/* In a forked child, after the fork locks are released: the parent's
 * allocations are not the child's. */
void mxpi_memory_after_fork(void) { mxpi_memory_reset(); }
