/*
 * mxp_nvtx.c -- emit recorded ranges and marks as NVTX (mxpi_nvtx.h).
 *
 * NVTX v3 is header-only (native/third_party/nvtx3, Apache-2.0): its first
 * call looks for a tool through NVTX_INJECTION64_PATH and, without one, every
 * later call is an empty function behind a pointer.  Each mxprof object gets,
 * on its first emission, its domain's handle (one nvtxDomainCreateA per
 * domain name; Events, which have no domain, use NVTX's default domain) and
 * its name registered once in that domain (nvtxDomainRegisterStringA); the
 * hot path then passes only those handles.  A frame's ranges carry its
 * index as their payload (an unsigned 64-bit integer).
 */
#include "mxpi_nvtx.h"

#include "mxpi_buffer.h"
#include "mxpi_registry.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wpedantic"
#include "../third_party/nvtx3/nvToolsExt.h"
#pragma GCC diagnostic pop

typedef struct name_entry {
    _Atomic uint32_t ready; /* the handles below are set (release) */
    nvtxDomainHandle_t domain;
    nvtxStringHandle_t name;
    bool frame; /* its ranges carry the frame index as payload */
} name_entry;

#define PAGE_BITS 10u
#define PAGE_SIZE (1u << PAGE_BITS)

static name_entry *_Atomic pages[MXP_MAX_OBJECTS / PAGE_SIZE];

/* Domains created so far, by name (few: a linear list). */
typedef struct domain_entry {
    char *name;
    nvtxDomainHandle_t handle;
} domain_entry;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static domain_entry *domains;
static size_t ndomains, domains_cap;

static nvtxDomainHandle_t domain_of(const char *name) {
    for (size_t i = 0; i < ndomains; i++)
        if (strcmp(domains[i].name, name) == 0) return domains[i].handle;
    if (ndomains == domains_cap) {
        size_t cap = domains_cap ? 2 * domains_cap : 16;
        domain_entry *d = realloc(domains, cap * sizeof *d);
        if (d == NULL) return NULL;
        domains = d;
        domains_cap = cap;
    }
    char *copy = strdup(name);
    if (copy == NULL) return NULL;
    nvtxDomainHandle_t h = nvtxDomainCreateA(name);
    domains[ndomains++] = (domain_entry){copy, h};
    return h;
}

/* Object id's handles, registering them on first use; NULL when memory ran
 * out (nothing is emitted then). */
static __attribute__((noinline, cold)) name_entry *entry_slow(uint32_t id) {
    name_entry *e = NULL;
    pthread_mutex_lock(&lock);
    name_entry *page = atomic_load_explicit(&pages[id / PAGE_SIZE], MXPI_ACQUIRE);
    if (page == NULL) {
        page = calloc(PAGE_SIZE, sizeof *page);
        if (page == NULL) goto out;
        atomic_store_explicit(&pages[id / PAGE_SIZE], page, MXPI_RELEASE);
    }
    e = &page[id % PAGE_SIZE];
    if (!atomic_load_explicit(&e->ready, MXPI_RELAXED)) {
        int kind;
        const char *name, *domain;
        size_t nlen, dlen;
        if (mxp_object_info(id, &kind, &name, &nlen, &domain, &dlen) != MXP_OK) {
            e = NULL;
            goto out;
        }
        e->domain = kind == MXP_KIND_EVENT ? NULL : domain_of(domain);
        e->name = nvtxDomainRegisterStringA(e->domain, name);
        e->frame = kind == MXP_KIND_FRAME;
        atomic_store_explicit(&e->ready, 1, MXPI_RELEASE);
    }
out:
    pthread_mutex_unlock(&lock);
    return e;
}

static inline name_entry *entry_of(uint32_t id) {
    name_entry *page = atomic_load_explicit(&pages[id / PAGE_SIZE], MXPI_ACQUIRE);
    if (MXPI_LIKELY(page != NULL)) {
        name_entry *e = &page[id % PAGE_SIZE];
        if (MXPI_LIKELY(atomic_load_explicit(&e->ready, MXPI_ACQUIRE))) return e;
    }
    return entry_slow(id);
}

static inline nvtxEventAttributes_t attributes(const name_entry *e) {
    nvtxEventAttributes_t a;
    memset(&a, 0, sizeof a);
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
    a.message.registered = e->name;
    return a;
}

/* Ranges on tracks (not the calling thread's own stack) are start/end. */
static inline bool on_track(const mxpi_thread *t) { return t != mxpi_tls; }

static void open_range(mxpi_thread *t, mxpi_open *o, const name_entry *e) {
    nvtxEventAttributes_t a = attributes(e);
    if (e->frame) {
        a.payloadType = NVTX_PAYLOAD_TYPE_UNSIGNED_INT64;
        a.payload.ullValue = o->aux & MXPI_AUX_INDEX;
    }
    if (on_track(t))
        o->nvtx = nvtxDomainRangeStartEx(e->domain, &a);
    else
        nvtxDomainRangePushEx(e->domain, &a);
}

void mxpi_nvtx_begin(mxpi_thread *t, mxpi_open *o) {
    name_entry *e = entry_of(o->id);
    if (e == NULL) return;
    o->flags |= MXPI_OPEN_NVTX;
    open_range(t, o, e);
}

void mxpi_nvtx_end(mxpi_thread *t, uint32_t i) {
    mxpi_open *o = &t->stack[i];
    name_entry *e = entry_of(o->id); /* registered at its begin */
    if (e == NULL) return;
    if (on_track(t)) {
        nvtxDomainRangeEnd(e->domain, o->nvtx);
        return;
    }
    /* Close the ranges of this domain above it, then it, then reopen them. */
    uint32_t above = 0;
    for (uint32_t k = i + 1; k < t->depth; k++) {
        mxpi_open *u = &t->stack[k];
        if ((u->flags & MXPI_OPEN_NVTX) && entry_of(u->id)->domain == e->domain) {
            nvtxDomainRangePop(e->domain);
            above++;
        }
    }
    nvtxDomainRangePop(e->domain);
    for (uint32_t k = i + 1; above > 0 && k < t->depth; k++) {
        mxpi_open *u = &t->stack[k];
        const name_entry *ue = entry_of(u->id);
        if ((u->flags & MXPI_OPEN_NVTX) && ue->domain == e->domain) {
            open_range(t, u, ue);
            above--;
        }
    }
}

void mxpi_nvtx_mark(uint32_t id) {
    name_entry *e = entry_of(id);
    if (e == NULL) return;
    nvtxEventAttributes_t a = attributes(e);
    nvtxDomainMarkEx(e->domain, &a);
}
