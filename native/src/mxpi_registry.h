/*
 * mxpi_registry.h -- interned objects (mxp_registry.c): (kind, domain,
 * name) triples with dense ids, alive as long as the process.
 */
#ifndef MXPI_REGISTRY_H
#define MXPI_REGISTRY_H

#include "mxpi_agg.h"
#include "mxpi_base.h"
#include "mxpi_core.h"

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
    char *frag;   /* Chrome JSON prefix up to and including "ts": (mxp_chrome.c) */
    char *key;    /* counters: escaped "name": for args (mxp_chrome.c) */
    _Atomic int64_t value;       /* counters */
    _Atomic uint32_t frame_next; /* frames */
} mxpi_object;

static inline mxpi_object *mxpi_obj(uint32_t id) {
    return &atomic_load_explicit(&mxpi_g.obj_pages[id >> MXPI_PAGE_BITS], MXPI_ACQUIRE)
                [id & (MXPI_PAGE_SIZE - 1)];
}

void mxpi_registry_init(void);
void mxpi_registry_reset_values(void);

#endif /* MXPI_REGISTRY_H */
