/*
 * mxpi_agg.h -- per-thread aggregates (mxp_agg.c): one entry per object
 * id, in pages, with a histogram of durations for ranges.  mxp_stats.c
 * merges the entries.
 *
 * Ownership: entries are written by their owner with relaxed atomic stores
 * and read by mxp_stats_snapshot under reg_lock; a reset bumps an epoch
 * instead of touching other threads' memory.
 */
#ifndef MXPI_AGG_H
#define MXPI_AGG_H

#include "mxpi_base.h"

/* Log-linear histogram of durations in ticks (HDR-histogram style): values
 * below 2^HIST_SUB_BITS have a bucket each; every further power of two is
 * split into HIST_HALF buckets of equal width, so a bucket is at most 1/64 of
 * its lower bound wide and its midpoint is within 0.79 % of any value in it.
 * Values of 2^HIST_MAX_BITS ticks and more share the last bucket. */
#define MXPI_HIST_SUB_BITS 7u
#define MXPI_HIST_SUB (1u << MXPI_HIST_SUB_BITS)
#define MXPI_HIST_HALF (MXPI_HIST_SUB / 2u)
#define MXPI_HIST_MAX_BITS 48u
#define MXPI_HIST_BUCKETS (MXPI_HIST_SUB + (MXPI_HIST_MAX_BITS - MXPI_HIST_SUB_BITS) * MXPI_HIST_HALF)

static inline uint32_t mxpi_hist_index(int64_t v) {
    if (v < (int64_t)MXPI_HIST_SUB) return v < 0 ? 0u : (uint32_t)v;
    uint32_t m = 63u - (uint32_t)__builtin_clzll((unsigned long long)v); /* 2^m <= v */
    if (m >= MXPI_HIST_MAX_BITS) return MXPI_HIST_BUCKETS - 1u;
    uint32_t shift = m - MXPI_HIST_SUB_BITS + 1u;
    uint32_t sub = (uint32_t)((uint64_t)v >> shift) - MXPI_HIST_HALF;
    return MXPI_HIST_SUB + (shift - 1u) * MXPI_HIST_HALF + sub;
}

typedef _Atomic uint32_t mxpi_hist[MXPI_HIST_BUCKETS];

int64_t mxpi_hist_lower(uint32_t index);
int64_t mxpi_hist_width(uint32_t index);

/* Aggregates of one object on one thread.  count, total, self and sum only
 * ever grow (a statistics reset subtracts a baseline); min and max belong to
 * the statistics epoch in epoch and restart when it changes. */
typedef struct mxpi_agg {
    _Atomic uint32_t epoch;
    _Atomic uint64_t count;
    _Atomic int64_t total;
    _Atomic int64_t min;
    _Atomic int64_t max;
    _Atomic int64_t self;
    _Atomic int64_t last;
    _Atomic int64_t last_ts;
    _Atomic double sum;
    _Atomic(mxpi_hist *) hist; /* ranges: allocated on the first duration */
} mxpi_agg;

#define MXPI_PAGE_BITS 8u
#define MXPI_PAGE_SIZE (1u << MXPI_PAGE_BITS)
#define MXPI_NPAGES (MXP_MAX_OBJECTS / MXPI_PAGE_SIZE)

typedef _Atomic(mxpi_agg *) mxpi_agg_dir[MXPI_NPAGES];

/* mxp_agg.c */
struct mxpi_thread;
/* A new page of t's aggregates (and t's directory of pages, the first
 * time); NULL when memory ran out.  Only t calls it. */
mxpi_agg *mxpi_agg_page_new(struct mxpi_thread *t, uint32_t page);
/* Fold a retiring thread's aggregates into the registry's retired table,
 * then free them.  Caller holds reg_lock. */
void mxpi_aggs_retire(struct mxpi_thread *t);
void mxpi_agg_clear(mxpi_agg *e, uint32_t epoch);
void mxpi_agg_roll(mxpi_agg *e, uint32_t epoch);
void mxpi_agg_fold(mxpi_agg *dst, const mxpi_agg *src, uint32_t epoch);
mxpi_hist *mxpi_hist_new(mxpi_agg *e);

#endif /* MXPI_AGG_H */
