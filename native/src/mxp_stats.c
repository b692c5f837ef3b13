/*
 * mxp_stats.c -- merging per-thread aggregates into per-object statistics.
 *
 * Aggregates are kept per thread (no sharing on the hot path) and merged
 * only here, so their cost does not depend on how many events were
 * recorded.  A reset bumps the epoch: entries of an older epoch read as
 * empty and are cleared by their owner on its next update.
 */
#include "mxp_internal.h"

#include <stdlib.h>
#include <string.h>

static void fold_dir(mxpi_agg *acc, mxpi_agg_dir *dir, uint32_t nobj, uint32_t epoch) {
    if (dir == NULL) return;
    for (uint32_t page = 0; page * MXPI_PAGE_SIZE < nobj; page++) {
        mxpi_agg *src = atomic_load_explicit(&(*dir)[page], MXPI_ACQUIRE);
        if (src == NULL) continue;
        for (uint32_t i = 0; i < MXPI_PAGE_SIZE; i++) {
            uint32_t id = page * MXPI_PAGE_SIZE + i;
            if (id >= nobj) break;
            if (atomic_load_explicit(&src[i].epoch, MXPI_ACQUIRE) != epoch) continue;
            mxpi_agg_merge(&acc[id], &src[i], mxpi_obj(id)->kind);
        }
    }
}

static bool is_range(uint32_t kind) {
    return kind == MXP_KIND_TASK || kind == MXP_KIND_FRAME || kind == MXP_KIND_EVENT;
}

int mxp_stats_snapshot(mxp_stat *out, uint32_t cap, uint32_t *n_out) {
    mxp_init();
    if (n_out == NULL || (out == NULL && cap)) return MXP_E_INVALID;
    mxpi_timebase tb;
    mxpi_timebase_get(&tb);
    uint32_t nobj = mxp_object_count();
    mxpi_agg *acc = malloc(nobj * sizeof *acc);
    if (acc == NULL) return MXP_E_NOMEM;

    pthread_mutex_lock(&mxpi_g.reg_lock);
    uint32_t epoch = atomic_load_explicit(&mxpi_g.agg_epoch, MXPI_RELAXED);
    for (uint32_t id = 0; id < nobj; id++) mxpi_agg_clear(&acc[id], epoch);
    for (mxpi_thread *t = mxpi_g.threads; t; t = t->next) fold_dir(acc, t->aggs, nobj, epoch);
    fold_dir(acc, mxpi_g.retired_aggs, nobj, epoch);
    pthread_mutex_unlock(&mxpi_g.reg_lock);

    uint32_t n = 0;
    for (uint32_t id = 0; id < nobj; id++) n += MXPI_LOAD(acc[id].count) > 0;
    *n_out = n;
    if (n > cap) {
        free(acc);
        return MXP_E_FULL;
    }
    n = 0;
    for (uint32_t id = 0; id < nobj; id++) {
        mxpi_agg *a = &acc[id];
        if (MXPI_LOAD(a->count) == 0) continue;
        uint32_t kind = mxpi_obj(id)->kind;
        mxp_stat *s = &out[n++];
        memset(s, 0, sizeof *s);
        s->id = id;
        s->kind = kind;
        s->count = MXPI_LOAD(a->count);
        if (is_range(kind)) {
            s->total = mxpi_tb_span(&tb, MXPI_LOAD(a->total));
            s->min = mxpi_tb_span(&tb, MXPI_LOAD(a->min));
            s->max = mxpi_tb_span(&tb, MXPI_LOAD(a->max));
            s->self = mxpi_tb_span(&tb, MXPI_LOAD(a->self));
        } else if (kind == MXP_KIND_COUNTER) {
            s->min = MXPI_LOAD(a->min);
            s->max = MXPI_LOAD(a->max);
            s->last = MXPI_LOAD(a->last);
            s->sum = MXPI_LOAD(a->sum);
        }
    }
    free(acc);
    return MXP_OK;
}

void mxp_stats_reset(void) {
    mxp_init();
    atomic_fetch_add_explicit(&mxpi_g.agg_epoch, 1, MXPI_RELAXED);
}
