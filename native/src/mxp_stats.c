/*
 * mxp_stats.c -- merging per-thread aggregates into per-object statistics.
 *
 * Aggregates are kept per thread (no sharing on the hot path) and merged
 * only here, so their cost does not depend on how many events were
 * recorded.  Their sums only grow; a reset stores the merged sums as a
 * baseline, in the same critical section as the snapshot it follows, so an
 * event is reported before or after a reset, never lost or counted twice.
 * Minimum and maximum cannot be subtracted: they restart per epoch.  The
 * tallies (mxp_counts) reported with the statistics start with them too.
 */
#include "mxpi_agg.h"
#include "mxpi_clock.h"
#include "mxpi_core.h"
#include "mxpi_memory.h"
#include "mxpi_registry.h"
#include "mxpi_thread.h"

#include <stdlib.h>
#include <string.h>

static void fold_dir(mxpi_agg *acc, mxpi_agg_dir *dir, uint32_t nobj, uint32_t epoch) {
    if (dir == NULL) return;
    for (uint32_t page = 0; page * MXPI_PAGE_SIZE < nobj; page++) {
        mxpi_agg *src = atomic_load_explicit(&(*dir)[page], MXPI_ACQUIRE);
        if (src == NULL) continue;
        for (uint32_t i = 0; i < MXPI_PAGE_SIZE && page * MXPI_PAGE_SIZE + i < nobj; i++)
            mxpi_agg_fold(&acc[page * MXPI_PAGE_SIZE + i], &src[i], epoch);
    }
}

/* The tallies when the statistics began (mxp_stats_counts_get); under reg_lock. */
static mxp_counts counts_base;

static void counts_rebase(void) {
    mxp_counts now;
    mxp_counts_get(&now);
    pthread_mutex_lock(&mxpi_g.reg_lock);
    counts_base = now;
    pthread_mutex_unlock(&mxpi_g.reg_lock);
}

void mxp_stats_counts_get(mxp_counts *out, int reset) {
    mxp_counts now;
    mxp_counts_get(&now); /* initialises the core */
    pthread_mutex_lock(&mxpi_g.reg_lock);
    const mxp_counts *b = &counts_base;
    out->dropped_events = now.dropped_events - b->dropped_events;
    out->unmatched_stops = now.unmatched_stops - b->unmatched_stops;
    out->non_lifo_stops = now.non_lifo_stops - b->non_lifo_stops;
    out->ignored_calls = now.ignored_calls - b->ignored_calls;
    out->unknown_frees = now.unknown_frees - b->unknown_frees;
    out->written_events = now.written_events - b->written_events;
    out->cut_ranges = now.cut_ranges - b->cut_ranges;
    out->saturated_values = now.saturated_values - b->saturated_values;
    out->invalid_calls = now.invalid_calls - b->invalid_calls;
    if (reset) counts_base = now;
    pthread_mutex_unlock(&mxpi_g.reg_lock);
}

/* Ticks recorded so far (caller holds reg_lock). */
static int64_t recorded_now(void) {
    bool on = atomic_load_explicit(&mxpi_g.flags, MXPI_RELAXED) & MXP_FLAG_RECORD;
    return mxpi_g.recorded + (on ? mxpi_ticks() - mxpi_g.recording_since : 0);
}

/* The entry of object id in an aggregate directory, or NULL. */
static const mxpi_agg *entry_of(mxpi_agg_dir *dir, uint32_t id) {
    if (dir == NULL) return NULL;
    mxpi_agg *page = atomic_load_explicit(&(*dir)[id >> MXPI_PAGE_BITS], MXPI_ACQUIRE);
    return page ? &page[id & (MXPI_PAGE_SIZE - 1)] : NULL;
}

/* Add e's histogram (of epoch) to buf, buckets first .. last only. */
static void hist_add(uint64_t *buf, const mxpi_agg *e, uint32_t epoch, uint32_t first, uint32_t last) {
    if (e == NULL || atomic_load_explicit(&e->epoch, MXPI_ACQUIRE) != epoch) return;
    mxpi_hist *h = atomic_load_explicit(&e->hist, MXPI_ACQUIRE);
    if (h == NULL) return;
    for (uint32_t i = first; i <= last; i++) buf[i] += MXPI_LOAD((*h)[i]);
}

/* P50, P90, P99 of object id (ticks) by nearest rank over its merged
 * histogram; each reported at its bucket's midpoint, kept within [lo, hi].
 * Every duration of the epoch lies in [lo, hi] (its min and max), so only
 * the buckets from lo's to hi's are read: a histogram has 2,752 buckets,
 * and reading them all for each of many names made this the largest cost
 * of dumps().  Caller holds reg_lock; buf has MXPI_HIST_BUCKETS slots. */
static void percentiles(uint32_t id, uint32_t epoch, uint64_t *buf, int64_t lo, int64_t hi,
                        int64_t out[3]) {
    static const double ps[3] = {0.50, 0.90, 0.99};
    out[0] = out[1] = out[2] = lo;
    if (lo > hi) return; /* no extremes of this epoch yet (a racing update) */
    uint32_t first = mxpi_hist_index(lo), last = mxpi_hist_index(hi);
    memset(buf + first, 0, (last - first + 1) * sizeof *buf);
    for (mxpi_thread *t = mxpi_g.threads; t; t = t->next)
        hist_add(buf, entry_of(t->aggs, id), epoch, first, last);
    hist_add(buf, entry_of(mxpi_g.retired_aggs, id), epoch, first, last);
    uint64_t n = 0;
    for (uint32_t i = first; i <= last; i++) n += buf[i];
    for (int k = 0; k < 3; k++) {
        if (n == 0) continue;
        uint64_t rank = (uint64_t)(ps[k] * (double)n);
        if ((double)rank < ps[k] * (double)n || rank == 0) rank++; /* ceil, at least 1 */
        if (rank >= n) { /* the largest value: known exactly */
            out[k] = hi;
            continue;
        }
        if (rank == 1) continue; /* the smallest: lo */
        uint64_t seen = 0;
        for (uint32_t i = first; i <= last; i++) {
            seen += buf[i];
            if (seen >= rank) {
                int64_t v = mxpi_hist_lower(i) + mxpi_hist_width(i) / 2;
                out[k] = v < lo ? lo : v > hi ? hi : v;
                break;
            }
        }
    }
}

static bool is_range(uint32_t kind) {
    return kind == MXP_KIND_TASK || kind == MXP_KIND_FRAME || kind == MXP_KIND_EVENT || kind == MXP_KIND_GPU;
}

static void subtract(mxpi_agg *a, const mxpi_agg *base) {
    MXPI_STORE(a->count, MXPI_LOAD(a->count) - MXPI_LOAD(base->count));
    MXPI_STORE(a->total, MXPI_LOAD(a->total) - MXPI_LOAD(base->total));
    MXPI_STORE(a->self, MXPI_LOAD(a->self) - MXPI_LOAD(base->self));
    MXPI_STORE(a->sum, MXPI_LOAD(a->sum) - MXPI_LOAD(base->sum));
}

/* Merge everything into acc[0..nobj) (and percentiles, in ticks, into
 * pct[3 * id ..] when pct is given) and, with reset, make it the new
 * baseline.  Leaves the statistics since the previous baseline in acc and
 * the number of objects with events in *n.  More than cap of them: nothing
 * changes and MXP_E_FULL (the count and the reset come from one critical
 * section, so a reset never drops what did not fit). */
static int merge(mxpi_agg *acc, int64_t *pct, uint32_t nobj, bool reset, uint32_t cap, uint32_t *n) {
    uint64_t *buf = pct ? malloc(MXPI_HIST_BUCKETS * sizeof *buf) : NULL;
    if (pct != NULL && buf == NULL) return MXP_E_NOMEM;
    pthread_mutex_lock(&mxpi_g.reg_lock);
    uint32_t epoch = atomic_load_explicit(&mxpi_g.agg_epoch, MXPI_RELAXED);
    for (uint32_t id = 0; id < nobj; id++) mxpi_agg_clear(&acc[id], epoch);
    for (mxpi_thread *t = mxpi_g.threads; t; t = t->next) fold_dir(acc, t->aggs, nobj, epoch);
    fold_dir(acc, mxpi_g.retired_aggs, nobj, epoch);
    uint32_t with_events = 0;
    for (uint32_t id = 0; id < nobj; id++) {
        uint64_t base = id < mxpi_g.nbaseline ? MXPI_LOAD(mxpi_g.baseline[id].count) : 0;
        with_events += MXPI_LOAD(acc[id].count) > base;
    }
    *n = with_events;
    if (with_events > cap) {
        pthread_mutex_unlock(&mxpi_g.reg_lock);
        free(buf);
        return MXP_E_FULL;
    }
    for (uint32_t id = 0; pct != NULL && id < nobj; id++)
        if (MXPI_LOAD(acc[id].count) && is_range(mxpi_obj(id)->kind))
            percentiles(id, epoch, buf, MXPI_LOAD(acc[id].min), MXPI_LOAD(acc[id].max), &pct[3 * id]);
    free(buf);
    mxpi_agg *fresh = NULL;
    if (reset) {
        fresh = malloc((nobj ? nobj : 1) * sizeof *fresh);
        if (fresh != NULL) memcpy(fresh, acc, nobj * sizeof *fresh);
    }
    for (uint32_t id = 0; id < nobj && id < mxpi_g.nbaseline; id++) subtract(&acc[id], &mxpi_g.baseline[id]);
    if (fresh != NULL) {
        free(mxpi_g.baseline);
        mxpi_g.baseline = fresh;
        mxpi_g.nbaseline = nobj;
        mxpi_g.recorded_base = recorded_now();
        atomic_fetch_add_explicit(&mxpi_g.agg_epoch, 1, MXPI_RELAXED);
    }
    pthread_mutex_unlock(&mxpi_g.reg_lock);
    return reset && fresh == NULL ? MXP_E_NOMEM : MXP_OK;
}

int mxp_stats_snapshot(mxp_stat *out, uint32_t cap, uint32_t *n_out, int reset) {
    mxp_init();
    if (n_out == NULL || (out == NULL && cap)) return MXP_E_INVALID;
    mxpi_timebase tb;
    mxpi_timebase_get(&tb);
    uint32_t nobj = mxp_object_count();
    mxpi_agg *acc = malloc((nobj ? nobj : 1) * sizeof *acc);
    int64_t *pct = malloc((nobj ? nobj : 1) * 3 * sizeof *pct);
    if (acc == NULL || pct == NULL) {
        free(acc);
        free(pct);
        return MXP_E_NOMEM;
    }
    uint32_t n = 0;
    int rc = merge(acc, pct, nobj, reset != 0, cap, &n);
    *n_out = n;
    if (rc != MXP_OK) {
        free(acc);
        free(pct);
        return rc;
    }
    if (reset) mxpi_memory_stats_reset(); /* outside reg_lock: memory's lock comes first */
    n = 0;
    for (uint32_t id = 0; id < nobj && n < cap; id++) {
        mxpi_agg *a = &acc[id];
        uint64_t count = MXPI_LOAD(a->count);
        if (count == 0) continue;
        uint32_t kind = mxpi_obj(id)->kind;
        mxp_stat *s = &out[n++];
        memset(s, 0, sizeof *s);
        s->id = id;
        s->kind = kind;
        s->count = count;
        int64_t lo = MXPI_LOAD(a->min), hi = MXPI_LOAD(a->max);
        if (lo > hi) { /* only a racing update of the old epoch: no extremes yet */
            lo = hi = is_range(kind) ? MXPI_LOAD(a->total) / (int64_t)count
                                     : (int64_t)(MXPI_LOAD(a->sum) / (double)count);
        }
        if (is_range(kind)) {
            s->total = mxpi_tb_span(&tb, MXPI_LOAD(a->total));
            s->min = mxpi_tb_span(&tb, lo);
            s->max = mxpi_tb_span(&tb, hi);
            s->self = mxpi_tb_span(&tb, MXPI_LOAD(a->self));
            s->p50 = mxpi_tb_span(&tb, pct[3 * id]);
            s->p90 = mxpi_tb_span(&tb, pct[3 * id + 1]);
            s->p99 = mxpi_tb_span(&tb, pct[3 * id + 2]);
        } else if (kind == MXP_KIND_COUNTER) {
            s->min = lo;
            s->max = hi;
            s->last = MXPI_LOAD(a->last);
            s->sum = MXPI_LOAD(a->sum);
        }
    }
    *n_out = n;
    free(acc);
    free(pct);
    return MXP_OK;
}

void mxp_stats_reset(void) {
    mxp_init();
    counts_rebase();
    mxpi_memory_stats_reset();
    uint32_t nobj = mxp_object_count();
    mxpi_agg *acc = malloc((nobj ? nobj : 1) * sizeof *acc);
    if (acc == NULL) {
        /* Without memory for a baseline, at least restart min and max. */
        atomic_fetch_add_explicit(&mxpi_g.agg_epoch, 1, MXPI_RELAXED);
        return;
    }
    uint32_t n;
    merge(acc, NULL, nobj, true, UINT32_MAX, &n);
    free(acc);
}

int64_t mxp_stats_recorded_ns(void) {
    mxp_init();
    mxpi_timebase tb;
    mxpi_timebase_get(&tb);
    pthread_mutex_lock(&mxpi_g.reg_lock);
    int64_t ticks = recorded_now() - mxpi_g.recorded_base;
    pthread_mutex_unlock(&mxpi_g.reg_lock);
    return mxpi_tb_span(&tb, ticks);
}
