/*
 * mxp_registry.c -- interned objects and their dense ids.
 *
 * An object is the triple (kind, domain, name).  Registering is the only
 * slow step (a lock, a hash lookup, copies); afterwards the hot path moves
 * the integer id only.  Each object keeps its Chrome JSON prefix, escaped
 * once when it is registered (mxp_chrome.c builds it), so the trace writer
 * copies it instead of escaping names per event.
 * Objects live as long as the process: ids are never reused.
 */
#include "mxpi_registry.h"
#include "mxpi_agg.h"
#include "mxpi_chrome.h"
#include "mxpi_core.h"
#include "mxpi_json.h"

#include <stdlib.h>
#include <string.h>


static uint64_t hash_of(uint32_t kind, const char *domain, size_t dlen, const char *name,
                        size_t nlen) {
    uint64_t h = 1469598103934665603ull ^ kind;
    for (size_t i = 0; i < dlen; i++) h = (h ^ (unsigned char)domain[i]) * 1099511628211ull;
    h = (h ^ 0xffu) * 1099511628211ull; /* separator: ("ab","c") != ("a","bc") */
    for (size_t i = 0; i < nlen; i++) h = (h ^ (unsigned char)name[i]) * 1099511628211ull;
    return h;
}

static bool rehash(uint32_t nbuckets) {
    uint32_t *nb = calloc(nbuckets, sizeof *nb);
    if (nb == NULL) return false;
    uint32_t n = atomic_load_explicit(&mxpi_g.nobj, MXPI_RELAXED);
    for (uint32_t id = 1; id < n; id++) {
        mxpi_object *o = mxpi_obj(id);
        uint32_t slot = (uint32_t)(o->hash % nbuckets);
        o->hash_next = nb[slot];
        nb[slot] = id;
    }
    free(mxpi_g.buckets);
    mxpi_g.buckets = nb;
    mxpi_g.nbuckets = nbuckets;
    return true;
}

static void drop_object(mxpi_object *o) {
    free(o->name);
    free(o->domain);
    free(o->frag);
    free(o->key);
    memset(o, 0, sizeof *o);
}

/* Caller holds reg_lock.  Returns the new id, or 0 when memory ran out. */
static uint32_t add_object(uint32_t kind, const char *domain, size_t dlen, const char *name,
                           size_t nlen, uint64_t h) {
    uint32_t id = atomic_load_explicit(&mxpi_g.nobj, MXPI_RELAXED);
    uint32_t page = id >> MXPI_PAGE_BITS;
    mxpi_object *objs = atomic_load_explicit(&mxpi_g.obj_pages[page], MXPI_RELAXED);
    if (objs == NULL) {
        objs = calloc(MXPI_PAGE_SIZE, sizeof *objs);
        if (objs == NULL) return 0;
        atomic_store_explicit(&mxpi_g.obj_pages[page], objs, MXPI_RELEASE);
    }
    mxpi_object *o = &objs[id & (MXPI_PAGE_SIZE - 1)];
    o->kind = kind;
    o->hash = h;
    o->name = mxpi_dup(name, nlen);
    o->domain = mxpi_dup(domain, dlen);
    o->name_len = (uint32_t)nlen;
    o->domain_len = (uint32_t)dlen;
    if (o->name == NULL || o->domain == NULL || !mxpi_chrome_fragments_build(o)) {
        drop_object(o);
        return 0;
    }
    if (id > 0) {
        if (mxpi_g.nbuckets == 0 || id + 1 > mxpi_g.nbuckets / 4 * 3) {
            if (!rehash(mxpi_g.nbuckets ? mxpi_g.nbuckets * 2 : 1024) && mxpi_g.nbuckets == 0) {
                drop_object(o);
                return 0;
            }
        }
        uint32_t slot = (uint32_t)(h % mxpi_g.nbuckets);
        o->hash_next = mxpi_g.buckets[slot];
        mxpi_g.buckets[slot] = id;
    }
    atomic_store_explicit(&mxpi_g.nobj, id + 1, MXPI_RELEASE);
    return id;
}

static uint32_t find_object(uint32_t kind, const char *domain, size_t dlen, const char *name,
                            size_t nlen, uint64_t h) {
    if (mxpi_g.nbuckets == 0) return 0;
    for (uint32_t id = mxpi_g.buckets[h % mxpi_g.nbuckets]; id; id = mxpi_obj(id)->hash_next) {
        mxpi_object *o = mxpi_obj(id);
        if (o->hash == h && o->kind == kind && o->name_len == nlen && o->domain_len == dlen &&
            memcmp(o->name, name, nlen) == 0 && memcmp(o->domain, domain, dlen) == 0)
            return id;
    }
    return 0;
}

void mxpi_registry_init(void) {
    /* id 0 is "none" (the empty scope); then one shared overflow object per
     * kind, handed out when the table is full. */
    add_object(0, "", 0, "", 0, 0);
    for (uint32_t kind = MXP_KIND_TASK; kind <= MXP_KIND_GPU; kind++) {
        static const char name[] = "<overflow>";
        static const char domain[] = "mxprof";
        uint64_t h = hash_of(kind, domain, sizeof domain - 1, name, sizeof name - 1);
        mxpi_g.overflow_id[kind] = add_object(kind, domain, sizeof domain - 1, name, sizeof name - 1, h);
    }
}

void mxpi_registry_reset_values(void) {
    uint32_t n = atomic_load_explicit(&mxpi_g.nobj, MXPI_ACQUIRE);
    for (uint32_t id = 0; id < n; id++) {
        mxpi_object *o = mxpi_obj(id);
        atomic_store_explicit(&o->value, 0, MXPI_RELAXED);
        atomic_store_explicit(&o->frame_next, 0, MXPI_RELAXED);
    }
}

int mxp_object_register(int kind, const char *domain, size_t domain_len, const char *name,
                        size_t name_len, uint32_t *id_out) {
    mxp_init();
    if (kind < MXP_KIND_TASK || kind > MXP_KIND_GPU || id_out == NULL) return MXP_E_INVALID;
    if ((name == NULL && name_len) || (domain == NULL && domain_len)) return MXP_E_INVALID;
    if (name_len > UINT32_MAX / 8 || domain_len > UINT32_MAX / 8) return MXP_E_INVALID;
    if (kind == MXP_KIND_EVENT || kind == MXP_KIND_SCOPE) {
        domain = "";
        domain_len = 0;
    }
    if (name == NULL) name = "";
    if (domain == NULL) domain = "";
    uint64_t h = hash_of((uint32_t)kind, domain, domain_len, name, name_len);
    int rc = MXP_OK;
    pthread_mutex_lock(&mxpi_g.reg_lock);
    uint32_t id = find_object((uint32_t)kind, domain, domain_len, name, name_len, h);
    if (id == 0) {
        if (atomic_load_explicit(&mxpi_g.nobj, MXPI_RELAXED) < MXP_MAX_OBJECTS)
            id = add_object((uint32_t)kind, domain, domain_len, name, name_len, h);
        if (id == 0) {
            id = mxpi_g.overflow_id[kind];
            rc = MXP_E_FULL;
        }
    }
    pthread_mutex_unlock(&mxpi_g.reg_lock);
    *id_out = id;
    return rc;
}

uint32_t mxp_object_count(void) {
    mxp_init();
    return atomic_load_explicit(&mxpi_g.nobj, MXPI_ACQUIRE);
}

int mxp_object_info(uint32_t id, int *kind, const char **name, size_t *name_len,
                    const char **domain, size_t *domain_len) {
    if (id >= mxp_object_count()) return MXP_E_INVALID;
    mxpi_object *o = mxpi_obj(id);
    if (kind) *kind = (int)o->kind;
    if (name) *name = o->name;
    if (name_len) *name_len = o->name_len;
    if (domain) *domain = o->domain;
    if (domain_len) *domain_len = o->domain_len;
    return MXP_OK;
}
