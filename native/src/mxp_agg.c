/*
 * mxp_agg.c -- per-thread aggregates: pages of entries by object id, their
 * statistics epochs, duration histograms, and folding one entry into
 * another (a retiring thread's into the retired table here; every thread's
 * into a snapshot in mxp_stats.c).
 *
 * Like mxp_thread.c, this is the slow side of the hot path: a thread comes
 * here when it touches a new page of object ids, records a range's first
 * duration, or finds an entry of an older epoch.
 */
#include "mxpi_agg.h"
#include "mxpi_core.h"
#include "mxpi_thread.h"

#include <stdlib.h>

/* Zero an entry that has no histogram yet (a fresh page, a merge buffer). */
void mxpi_agg_clear(mxpi_agg *e, uint32_t epoch) {
    atomic_store_explicit(&e->hist, NULL, MXPI_RELAXED);
    MXPI_STORE(e->count, 0);
    MXPI_STORE(e->total, 0);
    MXPI_STORE(e->min, INT64_MAX);
    MXPI_STORE(e->max, INT64_MIN);
    MXPI_STORE(e->self, 0);
    MXPI_STORE(e->last, 0);
    MXPI_STORE(e->last_ts, INT64_MIN);
    MXPI_STORE(e->sum, 0.0);
    atomic_store_explicit(&e->epoch, epoch, MXPI_RELEASE);
}

static mxpi_agg *new_page(mxpi_agg_dir **dirp, uint32_t page) {
    if (*dirp == NULL) {
        *dirp = calloc(1, sizeof **dirp);
        if (*dirp == NULL) return NULL;
    }
    mxpi_agg *p = malloc(MXPI_PAGE_SIZE * sizeof *p);
    if (p == NULL) return NULL;
    uint32_t epoch = atomic_load_explicit(&mxpi_g.agg_epoch, MXPI_RELAXED);
    for (uint32_t i = 0; i < MXPI_PAGE_SIZE; i++) mxpi_agg_clear(&p[i], epoch);
    atomic_store_explicit(&(**dirp)[page], p, MXPI_RELEASE);
    return p;
}

mxpi_agg *mxpi_agg_page_new(mxpi_thread *t, uint32_t page) {
    if (t->aggs == NULL) {
        /* Readers find the directory under reg_lock. */
        pthread_mutex_lock(&mxpi_g.reg_lock);
        mxpi_agg *p = new_page(&t->aggs, page);
        pthread_mutex_unlock(&mxpi_g.reg_lock);
        return p;
    }
    return new_page(&t->aggs, page);
}

void mxpi_agg_roll(mxpi_agg *e, uint32_t epoch) {
    MXPI_STORE(e->min, INT64_MAX);
    MXPI_STORE(e->max, INT64_MIN);
    mxpi_hist *h = atomic_load_explicit(&e->hist, MXPI_RELAXED);
    if (h != NULL)
        for (uint32_t i = 0; i < MXPI_HIST_BUCKETS; i++) MXPI_STORE((*h)[i], 0);
    atomic_store_explicit(&e->epoch, epoch, MXPI_RELEASE);
}

mxpi_hist *mxpi_hist_new(mxpi_agg *e) {
    mxpi_hist *h = calloc(1, sizeof *h);
    if (h != NULL) atomic_store_explicit(&e->hist, h, MXPI_RELEASE);
    return h;
}

int64_t mxpi_hist_lower(uint32_t index) {
    if (index < MXPI_HIST_SUB) return index;
    uint32_t shift = (index - MXPI_HIST_SUB) / MXPI_HIST_HALF + 1u;
    uint32_t sub = (index - MXPI_HIST_SUB) % MXPI_HIST_HALF;
    return (int64_t)(MXPI_HIST_HALF + sub) << shift;
}

int64_t mxpi_hist_width(uint32_t index) {
    return index < MXPI_HIST_SUB ? 1 : (int64_t)1 << ((index - MXPI_HIST_SUB) / MXPI_HIST_HALF + 1u);
}

/* Add src's sums to dst's, and its min/max when they belong to epoch; the
 * later of the two samples is "last".  Histograms are folded apart
 * (hist_fold, below, and mxp_stats.c's percentiles). */
void mxpi_agg_fold(mxpi_agg *dst, const mxpi_agg *src, uint32_t epoch) {
    uint64_t n = MXPI_LOAD(src->count);
    if (n == 0) return;
    MXPI_STORE(dst->count, MXPI_LOAD(dst->count) + n);
    MXPI_STORE(dst->total, MXPI_LOAD(dst->total) + MXPI_LOAD(src->total));
    MXPI_STORE(dst->self, MXPI_LOAD(dst->self) + MXPI_LOAD(src->self));
    MXPI_STORE(dst->sum, MXPI_LOAD(dst->sum) + MXPI_LOAD(src->sum));
    if (atomic_load_explicit(&src->epoch, MXPI_ACQUIRE) == epoch) {
        if (MXPI_LOAD(src->min) < MXPI_LOAD(dst->min)) MXPI_STORE(dst->min, MXPI_LOAD(src->min));
        if (MXPI_LOAD(src->max) > MXPI_LOAD(dst->max)) MXPI_STORE(dst->max, MXPI_LOAD(src->max));
    }
    if (MXPI_LOAD(src->last_ts) >= MXPI_LOAD(dst->last_ts)) {
        MXPI_STORE(dst->last_ts, MXPI_LOAD(src->last_ts));
        MXPI_STORE(dst->last, MXPI_LOAD(src->last));
    }
}

/* Add src's histogram (of epoch) to dst's, allocating dst's. */
static void hist_fold(mxpi_agg *dst, const mxpi_agg *src, uint32_t epoch) {
    mxpi_hist *hs = atomic_load_explicit(&src->hist, MXPI_ACQUIRE);
    if (hs == NULL || atomic_load_explicit(&src->epoch, MXPI_ACQUIRE) != epoch) return;
    mxpi_hist *hd = atomic_load_explicit(&dst->hist, MXPI_RELAXED);
    if (hd == NULL && (hd = mxpi_hist_new(dst)) == NULL) return;
    for (uint32_t i = 0; i < MXPI_HIST_BUCKETS; i++) {
        uint32_t c = MXPI_LOAD((*hs)[i]);
        if (c) MXPI_STORE((*hd)[i], MXPI_LOAD((*hd)[i]) + c);
    }
}

static void free_aggs(mxpi_agg_dir *dir) {
    if (dir == NULL) return;
    for (uint32_t i = 0; i < MXPI_NPAGES; i++) {
        mxpi_agg *page = atomic_load_explicit(&(*dir)[i], MXPI_RELAXED);
        if (page == NULL) continue;
        for (uint32_t j = 0; j < MXPI_PAGE_SIZE; j++) free(atomic_load_explicit(&page[j].hist, MXPI_RELAXED));
        free(page);
    }
    free(dir);
}

/* Fold a retiring thread's aggregates into the registry's retired table.
 * Caller holds reg_lock. */
static void retire_aggs(mxpi_thread *t) {
    if (t->aggs == NULL) return;
    uint32_t epoch = atomic_load_explicit(&mxpi_g.agg_epoch, MXPI_RELAXED);
    uint32_t nobj = atomic_load_explicit(&mxpi_g.nobj, MXPI_ACQUIRE);
    for (uint32_t page = 0; page < MXPI_NPAGES; page++) {
        mxpi_agg *src = atomic_load_explicit(&(*t->aggs)[page], MXPI_ACQUIRE);
        if (src == NULL) continue;
        for (uint32_t i = 0; i < MXPI_PAGE_SIZE; i++) {
            uint32_t id = page * MXPI_PAGE_SIZE + i;
            if (id >= nobj) break;
            if (MXPI_LOAD(src[i].count) == 0) continue;
            mxpi_agg *dpage = mxpi_g.retired_aggs
                                  ? atomic_load_explicit(&(*mxpi_g.retired_aggs)[page], MXPI_RELAXED)
                                  : NULL;
            if (dpage == NULL) dpage = new_page(&mxpi_g.retired_aggs, page);
            if (dpage == NULL) return; /* out of memory: these statistics are lost */
            mxpi_agg *d = &dpage[i];
            if (MXPI_LOAD(d->epoch) != epoch) mxpi_agg_roll(d, epoch);
            mxpi_agg_fold(d, &src[i], epoch);
            hist_fold(d, &src[i], epoch);
        }
    }
}

void mxpi_aggs_retire(mxpi_thread *t) {
    retire_aggs(t);
    free_aggs(t->aggs);
    t->aggs = NULL;
}
