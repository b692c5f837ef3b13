/*
 * mxp_track.c -- tracks: timelines that are not OS threads.
 *
 * A track has a thread state of its own (mxpi_thread_new), so a trace tid
 * and a name, and is one of two kinds:
 *   - a track that is given complete ranges after they happened
 *     (mxp_track_new, mxp_range_add), such as a GPU stream whose ranges were
 *     timed on the device: kept here;
 *   - a track with a range stack of its own, for an asyncio task
 *     (mxp_track_open): its ranges go through the hot path
 *     (mxp_track_begin/end/close in mxp_api.c), and the registry of thread
 *     states finds it by tid (mxpi_track_of in mxp_thread.c).
 */
#include "mxpi_track.h"
#include "mxpi_clock.h"
#include "mxpi_core.h"
#include "mxpi_registry.h"
#include "mxpi_thread.h"

#include <stdlib.h>
#include <string.h>

/* Tracks (track_lock; a track is never freed).  Each remembers the last
 * ranges added to it that no later range has enclosed yet: ranges arrive
 * when they end, children before their parent, so a parent's self time is
 * its duration less the unclaimed ranges it encloses. */
#define TRACK_OPEN 64u

typedef struct track {
    mxpi_thread *t;
    uint32_t n;
    struct {
        int64_t start, end; /* ns */
    } done[TRACK_OPEN];
} track;

static pthread_mutex_t track_lock = PTHREAD_MUTEX_INITIALIZER;
static track **tracks;
static uint32_t ntracks, tracks_cap;
static mxpi_timebase track_tb; /* ns -> ticks, refreshed at most once a second */
static int64_t track_tb_at;
static int track_tb_mode = -1; /* the clock source it was measured for */

/* Held across fork() (mxp_core.c's handlers) and released on both sides,
 * so that a child inherits the tracks whole: it keeps them, and its ranges
 * on them go to its own trace. */
void mxpi_tracks_fork_lock(void) { pthread_mutex_lock(&track_lock); }
void mxpi_tracks_fork_unlock(void) { pthread_mutex_unlock(&track_lock); }

/* ---- tracks given complete ranges ---- */

int mxp_track_new(const char *name, size_t name_len, uint32_t *tid_out) {
    mxp_init();
    if (tid_out == NULL || (name == NULL && name_len)) return MXP_E_INVALID;
    int rc = MXP_OK;
    pthread_mutex_lock(&track_lock);
    if (ntracks == tracks_cap) {
        uint32_t n = tracks_cap ? tracks_cap * 2 : 8;
        track **p = realloc(tracks, n * sizeof *p);
        if (p == NULL) {
            rc = MXP_E_NOMEM;
            goto out;
        }
        tracks = p;
        tracks_cap = n;
    }
    track *k = calloc(1, sizeof *k);
    mxpi_thread *t = k ? mxpi_thread_new(0) : NULL;
    if (t == NULL) {
        free(k);
        rc = MXP_E_NOMEM;
        goto out;
    }
    k->t = t;
    tracks[ntracks++] = k;
    *tid_out = t->tid;
    rc = mxp_thread_name_set(t->tid, name, name_len);
out:
    pthread_mutex_unlock(&track_lock);
    return rc;
}

/* Time of the ranges k holds within [start, end], which now become
 * children; the range itself is remembered in their place. */
static int64_t claim_children(track *k, int64_t start, int64_t end) {
    int64_t child = 0;
    uint32_t keep = 0;
    for (uint32_t i = 0; i < k->n; i++) {
        if (k->done[i].start >= start && k->done[i].end <= end)
            child += k->done[i].end - k->done[i].start;
        else
            k->done[keep++] = k->done[i];
    }
    if (keep == TRACK_OPEN) { /* forget the oldest */
        memmove(&k->done[0], &k->done[1], (TRACK_OPEN - 1) * sizeof k->done[0]);
        keep--;
    }
    k->done[keep].start = start;
    k->done[keep].end = end;
    k->n = keep + 1;
    return child;
}

int mxp_range_add(uint32_t id, uint32_t tid, int64_t start_ns, int64_t dur_ns) {
    mxp_init();
    if (id == 0 || id >= atomic_load_explicit(&mxpi_g.nobj, MXPI_ACQUIRE) || dur_ns < 0) return MXP_E_INVALID;
    uint32_t kind = mxpi_obj(id)->kind;
    if (kind == MXP_KIND_COUNTER || kind == MXP_KIND_MARKER || kind == MXP_KIND_SCOPE ||
        kind == MXP_KIND_ALLOC || kind == MXP_KIND_FREE)
        return MXP_E_INVALID;
    int rc = MXP_E_INVALID;
    pthread_mutex_lock(&track_lock);
    int64_t now = mxpi_monotonic_ns();
    if (track_tb_mode != mxpi_clock_mode || now - track_tb_at > 1000000000) {
        /* One conversion for ranges added close together, so that a child
         * and its parent given the same ns stay exactly aligned. */
        mxpi_timebase_get(&track_tb);
        track_tb_at = now;
        track_tb_mode = mxpi_clock_mode;
    }
    int64_t start = track_tb.tick0 + (int64_t)((double)(start_ns - track_tb.ns0) / track_tb.ns_per_tick);
    int64_t end = track_tb.tick0 + (int64_t)((double)(start_ns + dur_ns - track_tb.ns0) / track_tb.ns_per_tick);
    for (uint32_t i = 0; i < ntracks; i++) {
        track *k = tracks[i];
        if (k->t->tid != tid) continue;
        int64_t child_ns = claim_children(k, start_ns, start_ns + dur_ns);
        int64_t self = (int64_t)((double)(dur_ns - child_ns) / track_tb.ns_per_tick);
        uint32_t f = mxpi_flags_now();
        if (f & MXP_FLAG_TRACE) mxpi_record(k->t, f, start, end - start, id, 0);
        if (f & MXP_FLAG_AGGREGATE) mxpi_aggregate_range(k->t, id, end - start, self < 0 ? 0 : self);
        rc = MXP_OK;
        break;
    }
    pthread_mutex_unlock(&track_lock);
    return rc;
}

/* ---- tracks with a stack (asyncio tasks) ---- */

int mxp_track_open(const char *name, size_t name_len, uint32_t *tid_out) {
    mxp_init();
    if (tid_out == NULL || (name == NULL && name_len)) return MXP_E_INVALID;
    mxpi_thread *t = mxpi_thread_new(0);
    if (t == NULL) return MXP_E_NOMEM;
    mxpi_track_register(t);
    *tid_out = t->tid;
    return mxp_thread_name_set(t->tid, name, name_len);
}
