/*
 * mxp_trace.c -- draining the per-thread buffers into the trace file.
 *
 * The format (Chrome JSON, gzip Chrome JSON, Perfetto protobuf) follows from
 * the file's name; this file drives it: create the file at a profile's first
 * flush, hand every buffered record to the format, and free the records only
 * after the flush that wrote them succeeded.  If any step fails, the format
 * restores the file to its last complete state and the records stay buffered
 * for the next try (or the next path).
 */
#include "mxpi_trace.h"
#include "mxpi_claim.h"
#include "mxpi_sample.h"
#include "mxpi_buffer.h"
#include "mxpi_clock.h"
#include "mxpi_core.h"
#include "mxpi_format.h"
#include "mxpi_json.h"
#include "mxpi_registry.h"
#include "mxpi_thread.h"
#include "mxpi_thread_names.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct cursor {
    mxpi_chunk *start; /* where reading began: chunks from here to chunk are done */
    mxpi_chunk *chunk;
    uint32_t pos;
    uint64_t consumed;
} cursor;

static struct {
    char *path;
    const mxpi_format *fmt; /* the format of path */
    mxpi_out o;             /* o.fd < 0: the current file is not created yet */
    bool profile_open;
    bool finished;
    char *process_name, *top_json, *other_json;
    size_t process_name_len, top_json_len, other_json_len;
    mxp_counts base; /* tallies when the profile began */
    /* ranges closed on behalf of other threads (mxpi_trace_add_cut) */
    struct cut_rec {
        mxpi_rec r;
        uint32_t tid;
    } *cuts;
    uint32_t ncuts, cuts_cap;
    /* the open file, to notice its path no longer leads to it */
    dev_t dev;
    ino_t ino;
    char *abs_path; /* NULL: not checked */
    /* the flight recorder: the cap's floor, in ticks (INT64_MIN: never
     * bound), and each counter's last value that trimming dropped */
    int64_t ring_floor;
    struct last_value {
        int64_t ts, val;
        uint32_t tid, set;
    } *last;
    uint32_t nlast;
} W = {.o = {.fd = -1}, .ring_floor = INT64_MIN};

/* ---- draining ---- */

/* Where the writer resumes reading thread t. */
static cursor cursor_of(mxpi_thread *t) {
    cursor c = {t->head, t->head, t->head_pos, 0};
    if (c.chunk == NULL) {
        c.start = c.chunk = atomic_load_explicit(&t->first, MXPI_ACQUIRE);
        c.pos = 0;
    }
    return c;
}

/* Advance c over every committed record, handing each to the format (if
 * given).  Returns false if the format failed; *any is set if a record of
 * this profile was given. */
static bool walk(cursor *c, uint32_t tid, const mxpi_format *fmt, bool *any) {
    while (c->chunk != NULL) {
        mxpi_chunk *next = atomic_load_explicit(&c->chunk->next, MXPI_ACQUIRE);
        uint32_t count = atomic_load_explicit(&c->chunk->count, MXPI_ACQUIRE);
        for (; c->pos < count; c->pos++, c->consumed++) {
            const mxpi_rec *r = &c->chunk->rec[c->pos];
            if (fmt == NULL || r->ts < W.o.epoch_ticks) continue; /* discarded, or from an ended profile */
            /* A sample is the sampled thread's event (its writer marks that
             * one used), not the sampling thread's: a sampler is no track. */
            if (r->id != MXPI_SAMPLE_ID) *any = true;
            if (!fmt->record(&W.o, r, tid)) return false;
        }
        if (next == NULL) break;
        c->chunk = next;
        c->pos = 0;
    }
    return true;
}

/* Make t's read position c, freeing the chunks passed over.  Only chunks
 * from c.start on were read: the thread may have published its first chunk
 * since, and that one must stay. */
static void commit_cursor(mxpi_thread *t, cursor c) {
    mxpi_chunk *p = c.start;
    int64_t freed = 0;
    while (p != NULL && p != c.chunk) {
        mxpi_chunk *next = atomic_load_explicit(&p->next, MXPI_ACQUIRE);
        mxpi_chunk_put(p);
        freed++;
        p = next;
    }
    mxpi_chunks_freed(freed);
    t->head = c.chunk;
    t->head_pos = c.pos;
    if (c.consumed) atomic_fetch_add_explicit(&mxpi_g.budget, c.consumed, MXPI_RELAXED);
}

void mxpi_trace_add_cut(const mxpi_rec *r, uint32_t tid) {
    if (W.ncuts == W.cuts_cap) {
        uint32_t cap = W.cuts_cap ? W.cuts_cap * 2 : 64;
        struct cut_rec *p = realloc(W.cuts, cap * sizeof *p);
        if (p == NULL) return; /* out of memory: this cut range is not written */
        W.cuts = p;
        W.cuts_cap = cap;
    }
    W.cuts[W.ncuts].r = *r;
    W.cuts[W.ncuts].tid = tid;
    W.ncuts++;
}

/* Hand the cut ranges to fmt (NULL: discard them). */
static bool walk_cuts(const mxpi_format *fmt) {
    for (uint32_t i = 0; fmt != NULL && i < W.ncuts; i++) {
        if (W.cuts[i].r.ts < W.o.epoch_ticks) continue;
        mxpi_thread_mark_used(W.cuts[i].tid);
        if (!fmt->record(&W.o, &W.cuts[i].r, W.cuts[i].tid)) return false;
    }
    return true;
}

/* Read every buffered record with fmt (NULL: discard them); commit only if
 * all went well.  Returns false on the format's failure. */
static bool drain(const mxpi_format *fmt, uint64_t *written) {
    uint32_t n;
    mxpi_thread **ts = mxpi_threads_snapshot(&n);
    cursor *cs = malloc((n ? n : 1) * sizeof *cs);
    if (ts == NULL || cs == NULL) {
        free(ts);
        free(cs);
        W.o.err = ENOMEM;
        return false;
    }
    bool ok = true;
    for (uint32_t i = 0; i < n && ok; i++) {
        bool any = false;
        cs[i] = cursor_of(ts[i]);
        ok = walk(&cs[i], ts[i]->tid, fmt, &any);
        if (any) mxpi_thread_mark_used(ts[i]->tid);
    }
    if (ok) ok = walk_cuts(fmt);
    if (ok && fmt != NULL) ok = fmt->end(&W.o);
    if (ok) {
        uint64_t total = W.ncuts;
        W.ncuts = 0;
        for (uint32_t i = 0; i < n; i++) {
            total += cs[i].consumed;
            commit_cursor(ts[i], cs[i]);
        }
        if (written) *written = total;
    }
    free(ts);
    free(cs);
    mxpi_threads_reap();
    return ok;
}

static void discard_locked(void) {
    drain(NULL, NULL);
    W.ncuts = 0;
}

/* ---- files ---- */

static void close_file(void) {
    if (W.fmt != NULL) W.fmt->release(&W.o);
    if (W.o.fd >= 0) close(W.o.fd);
    W.o.fd = -1;
    free(W.abs_path);
    W.abs_path = NULL;
}

static void tallies_now(void) {
    mxp_counts c;
    mxp_counts_get(&c);
    W.o.tallies.dropped_events = c.dropped_events - W.base.dropped_events;
    W.o.tallies.unmatched_stops = c.unmatched_stops - W.base.unmatched_stops;
    W.o.tallies.non_lifo_stops = c.non_lifo_stops - W.base.non_lifo_stops;
    W.o.tallies.ignored_calls = c.ignored_calls - W.base.ignored_calls;
    W.o.tallies.unknown_frees = c.unknown_frees - W.base.unknown_frees;
    W.o.tallies.cut_ranges = c.cut_ranges - W.base.cut_ranges;
    W.o.tallies.saturated_values = c.saturated_values - W.base.saturated_values;
    W.o.tallies.invalid_calls = c.invalid_calls - W.base.invalid_calls;
}

static void meta_into_out(void) {
    W.o.process_name = W.process_name ? W.process_name : "python";
    W.o.process_name_len = W.process_name ? W.process_name_len : 6;
    W.o.top_json = W.top_json;
    W.o.top_json_len = W.top_json_len;
    W.o.other_json = W.other_json;
    W.o.other_json_len = W.other_json_len;
}

/* The file's flags: O_NONBLOCK so that no open or write ever waits (a FIFO
 * without a reader would block open() for good, a device could block
 * write(); either would hold out_lock, so that even a signal's flush could
 * not return); O_NOCTTY so that a terminal never becomes ours. */
#define MXPI_OPEN_FLAGS (O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)

/* Remember which file the trace is (device, inode) and where it is (an
 * absolute path, as the relative one would follow a later chdir). */
static void note_identity(const struct stat *st) {
    W.dev = st->st_dev;
    W.ino = st->st_ino;
    free(W.abs_path);
    W.abs_path = NULL;
    if (W.path[0] == '/') {
        W.abs_path = mxpi_dup(W.path, strlen(W.path));
        return;
    }
    char *cwd = getcwd(NULL, 0);
    if (cwd == NULL) return; /* no check: the file cannot be found by its path anyway */
    size_t a = strlen(cwd), b = strlen(W.path);
    W.abs_path = malloc(a + b + 2);
    if (W.abs_path != NULL) snprintf(W.abs_path, a + b + 2, "%s/%s", cwd, W.path);
    free(cwd);
}

/* Whether the trace's path still leads to the open file.  A file removed
 * (or its directory), or replaced by another, takes every later write with
 * it: the flush must fail instead, keeping the records for a file that can
 * be found.  One stat() per flush; a path that cannot be looked up for
 * another reason (a permission taken away) is not a sign of loss. */
static bool file_still_there(void) {
    if (W.abs_path == NULL) return true;
    struct stat st;
    if (stat(W.abs_path, &st) != 0) return errno != ENOENT && errno != ENOTDIR;
    return st.st_dev == W.dev && st.st_ino == W.ino;
}

/* Create (or replace) the trace file so that it never exists empty: its
 * beginning is written to a temporary file beside it, which then takes its
 * name.  A path that is there and is not a regular file (/dev/null), or one
 * in a directory that takes no new file, is opened as it is.  Pipes and
 * sockets are refused (ESPIPE): the formats rewrite the file's end at every
 * flush, so they need a file they can seek in. */
static int create_file(void) {
    struct stat st;
    bool in_place = stat(W.path, &st) == 0 && !S_ISREG(st.st_mode);
    if (in_place && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))) {
        W.o.err = ESPIPE;
        return MXP_E_IO;
    }
    size_t n = strlen(W.path);
    char *tmp = in_place ? NULL : malloc(n + 32);
    if (!in_place && tmp == NULL) {
        W.o.err = ENOMEM;
        return MXP_E_IO;
    }
    if (tmp != NULL) snprintf(tmp, n + 32, "%s.%d.mxprof-tmp", W.path, (int)getpid());
    int fd = open(tmp ? tmp : W.path, MXPI_OPEN_FLAGS, 0644);
    if (fd < 0 && tmp != NULL) {
        /* No room for a file beside it (a directory we may not write to): the
         * file itself, as it is. */
        free(tmp);
        tmp = NULL;
        fd = open(W.path, MXPI_OPEN_FLAGS, 0644);
    }
    if (fd < 0) {
        /* ENXIO: a FIFO without a reader appeared since the stat() */
        W.o.err = errno == ENXIO ? ESPIPE : errno;
        free(tmp);
        return MXP_E_IO;
    }
    int bad = fstat(fd, &st) != 0 ? errno : S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode) ? ESPIPE : 0;
    if (bad) {
        W.o.err = bad;
        close(fd);
        if (tmp != NULL) unlink(tmp);
        free(tmp);
        return MXP_E_IO;
    }
    W.o.fd = fd;
    W.o.regular = S_ISREG(st.st_mode);
    mxpi_threads_unmark();
    bool ok = W.fmt->create(&W.o);
    if (ok && tmp != NULL && rename(tmp, W.path) != 0) {
        W.o.err = errno;
        ok = false;
    }
    if (ok) note_identity(&st);
    if (!ok) {
        close_file();
        if (tmp != NULL) unlink(tmp);
    }
    free(tmp);
    return ok ? MXP_OK : MXP_E_IO;
}

static int flush_locked(bool finish) {
    if (!W.profile_open || W.path == NULL) return MXP_E_STATE;
    if (W.finished) return MXP_OK;
    W.o.err = 0;
    mxpi_timebase_get(&W.o.tb);
    tallies_now();
    meta_into_out();
    if (W.o.fd >= 0 && !file_still_there()) {
        /* The next flush creates the file anew (or fails as the path does). */
        close_file();
        W.o.err = ESTALE;
        return MXP_E_IO;
    }
    if (W.o.fd < 0) {
        int rc = create_file();
        if (rc != MXP_OK) return rc;
    }
    uint64_t written = 0;
    if (!W.fmt->begin(&W.o) || !drain(W.fmt, &written)) {
        W.fmt->restore(&W.o);
        if (W.o.err == 0) W.o.err = EIO;
        return MXP_E_IO;
    }
    W.fmt->commit(&W.o);
    atomic_fetch_add_explicit(&mxpi_g.written, written, MXPI_RELAXED);
    if (finish) {
        close_file();
        W.finished = true;
    }
    return MXP_OK;
}

/* ---- public ---- */

int mxp_profile_begin(void) {
    mxp_init();
    pthread_mutex_lock(&mxpi_g.out_lock);
    close_file();
    free(W.path); /* a new profile writes nowhere until mxp_trace_path_set */
    W.path = NULL;
    W.fmt = NULL;
    discard_locked();
    uint32_t nobj = mxp_object_count();
    for (uint32_t id = 0; id < nobj; id++) atomic_store_explicit(&mxpi_obj(id)->frame_next, 0, MXPI_RELAXED);
    W.o.pid = (int)getpid();
    W.o.epoch_ticks = mxpi_ticks();
    W.o.base_wall_ns = mxp_clock_wall_ns();
    W.o.base_mono_ns = mxpi_monotonic_ns();
    W.profile_open = true;
    W.finished = false;
    W.o.err = 0;
    W.ring_floor = INT64_MIN;
    free(W.last);
    W.last = NULL;
    W.nlast = 0;
    mxp_counts_get(&W.base);
    pthread_mutex_unlock(&mxpi_g.out_lock);
    return MXP_OK;
}

int64_t mxp_profile_epoch_ns(void) {
    mxp_init();
    pthread_mutex_lock(&mxpi_g.out_lock);
    int64_t epoch = W.o.epoch_ticks;
    bool open = W.profile_open;
    pthread_mutex_unlock(&mxpi_g.out_lock);
    if (!open) return 0;
    mxpi_timebase tb;
    mxpi_timebase_get(&tb);
    return tb.ns0 + mxpi_tb_span(&tb, epoch - tb.tick0);
}

static bool set_str(char **dst, size_t *dlen, const char *s, size_t n) {
    char *p = mxpi_dup(s ? s : "", s ? n : 0);
    if (p == NULL) return false;
    free(*dst);
    *dst = p;
    if (dlen) *dlen = s ? n : 0;
    return true;
}

int mxp_trace_meta_set(const char *process_name, size_t process_name_len, const char *top_json,
                       size_t top_json_len, const char *other_json, size_t other_json_len) {
    mxp_init();
    pthread_mutex_lock(&mxpi_g.out_lock);
    bool ok = set_str(&W.process_name, &W.process_name_len, process_name, process_name_len) &&
              set_str(&W.top_json, &W.top_json_len, top_json, top_json_len) &&
              set_str(&W.other_json, &W.other_json_len, other_json, other_json_len);
    pthread_mutex_unlock(&mxpi_g.out_lock);
    return ok ? MXP_OK : MXP_E_NOMEM;
}

/* The format of a path the core can write (not empty, no NUL), else NULL. */
static const mxpi_format *path_format(const char *path, size_t path_len) {
    if (path == NULL || path_len == 0 || memchr(path, '\0', path_len) != NULL) return NULL;
    return mxpi_format_of(path, path_len);
}

int mxp_trace_path_set(const char *path, size_t path_len) {
    mxp_init();
    const mxpi_format *fmt = path_format(path, path_len);
    if (fmt == NULL) return MXP_E_INVALID;
    int rc = MXP_OK;
    pthread_mutex_lock(&mxpi_g.out_lock);
    bool same = W.path != NULL && strlen(W.path) == path_len && memcmp(W.path, path, path_len) == 0;
    if (!same) {
        if (W.profile_open && !W.finished && W.path != NULL) rc = flush_locked(false);
        close_file();
        if (set_str(&W.path, NULL, path, path_len))
            W.fmt = fmt;
        else
            rc = MXP_E_NOMEM;
    }
    pthread_mutex_unlock(&mxpi_g.out_lock);
    return rc;
}

int mxp_trace_flush(int finish) {
    mxp_init();
    pthread_mutex_lock(&mxpi_g.out_lock);
    int rc = flush_locked(finish != 0);
    pthread_mutex_unlock(&mxpi_g.out_lock);
    return rc;
}

uint64_t mxp_trace_pending(void) {
    mxp_init();
    pthread_mutex_lock(&mxpi_g.out_lock);
    uint64_t n = mxpi_buffered_records() + W.ncuts;
    pthread_mutex_unlock(&mxpi_g.out_lock);
    return n;
}

int mxp_trace_continue(const char *path, size_t path_len) {
    mxp_init();
    const mxpi_format *fmt = path_format(path, path_len);
    if (fmt == NULL) return MXP_E_INVALID;
    int rc = MXP_E_STATE;
    pthread_mutex_lock(&mxpi_g.out_lock);
    if (W.profile_open && W.finished) {
        close_file();
        if (set_str(&W.path, NULL, path, path_len)) {
            W.fmt = fmt;
            W.finished = false;
            rc = MXP_OK;
        } else {
            rc = MXP_E_NOMEM;
        }
    }
    pthread_mutex_unlock(&mxpi_g.out_lock);
    return rc;
}

int mxp_trace_discard(void) {
    mxp_init();
    pthread_mutex_lock(&mxpi_g.out_lock);
    discard_locked();
    pthread_mutex_unlock(&mxpi_g.out_lock);
    return MXP_OK;
}

int mxp_trace_errno(void) {
    mxp_init();
    pthread_mutex_lock(&mxpi_g.out_lock);
    int e = W.o.err;
    pthread_mutex_unlock(&mxpi_g.out_lock);
    return e;
}

/* ---- the flight recorder ---- */

/* Ticks of a time on mxp_clock_ns's clock. */
static int64_t ticks_at(const mxpi_timebase *tb, int64_t ns) {
    double t = (double)tb->tick0 + (double)(ns - tb->ns0) / tb->ns_per_tick;
    if (t >= 9.2e18) return INT64_MAX;
    if (t <= -9.2e18) return INT64_MIN;
    return (int64_t)t;
}

static bool is_range(uint32_t kind) {
    return kind == MXP_KIND_TASK || kind == MXP_KIND_FRAME || kind == MXP_KIND_EVENT ||
           kind == MXP_KIND_GPU;
}

/* When a record's event ended: a range's end, any other's instant. */
static int64_t rec_end(const mxpi_rec *r) {
    if (r->id == MXPI_SAMPLE_ID) return r->ts;
    return is_range(mxpi_obj(r->id)->kind) && r->val > 0 ? r->ts + r->val : r->ts;
}

static bool is_counter(const mxpi_rec *r) {
    return r->id != MXPI_SAMPLE_ID && mxpi_obj(r->id)->kind == MXP_KIND_COUNTER;
}

/* Remember a counter's value that is about to be dropped (or lies before a
 * snapshot's window) if it is its latest so far. */
static void note_last(struct last_value *last, uint32_t nlast, const mxpi_rec *r, uint32_t tid) {
    if (r->id >= nlast) return;
    struct last_value *v = &last[r->id];
    if (v->set && v->ts > r->ts) return;
    v->ts = r->ts;
    v->val = r->val;
    v->tid = tid;
    v->set = 1;
}

/* W.last long enough for every object id (false: out of memory, and the
 * values are then not kept). */
static bool last_fit(void) {
    uint32_t nobj = mxp_object_count();
    if (nobj <= W.nlast) return true;
    struct last_value *p = realloc(W.last, nobj * sizeof *p);
    if (p == NULL) return false;
    memset(p + W.nlast, 0, (nobj - W.nlast) * sizeof *p);
    W.last = p;
    W.nlast = nobj;
    return true;
}

/* Drop t's records from its read position on while they ended before
 * cutoff.  A thread appends in the order its events end, so the first one
 * that ended later stops the walk. */
static void trim_thread(mxpi_thread *t, int64_t cutoff) {
    cursor c = cursor_of(t);
    while (c.chunk != NULL) {
        mxpi_chunk *next = atomic_load_explicit(&c.chunk->next, MXPI_ACQUIRE);
        uint32_t count = atomic_load_explicit(&c.chunk->count, MXPI_ACQUIRE);
        for (; c.pos < count; c.pos++, c.consumed++) {
            const mxpi_rec *r = &c.chunk->rec[c.pos];
            if (rec_end(r) >= cutoff) goto done;
            if (is_counter(r)) note_last(W.last, W.nlast, r, t->tid);
        }
        if (next == NULL) break;
        c.chunk = next;
        c.pos = 0;
    }
done:
    commit_cursor(t, c);
}

static void trim_all(int64_t cutoff) {
    uint32_t n;
    mxpi_thread **ts = mxpi_threads_snapshot(&n);
    for (uint32_t i = 0; ts != NULL && i < n; i++) trim_thread(ts[i], cutoff);
    free(ts);
    uint32_t kept = 0;
    for (uint32_t i = 0; i < W.ncuts; i++)
        if (rec_end(&W.cuts[i].r) >= cutoff) W.cuts[kept++] = W.cuts[i];
    W.ncuts = kept;
}

int mxp_ring_trim(int64_t keep_ns, uint64_t max_records) {
    mxp_init();
    pthread_mutex_lock(&mxpi_g.out_lock);
    if (!W.profile_open || W.path != NULL) {
        pthread_mutex_unlock(&mxpi_g.out_lock);
        return MXP_E_STATE;
    }
    mxpi_timebase tb;
    mxpi_timebase_get(&tb);
    int64_t now = mxpi_ticks();
    int64_t cutoff = ticks_at(&tb, mxp_clock_ns() - (keep_ns > 0 ? keep_ns : 0));
    last_fit();
    trim_all(cutoff);
    /* Over the cap: the records lie between the cutoff and now, so move the
     * cutoff forward by the share that is too much, until they fit. */
    for (int round = 0; max_records && round < 32 && cutoff < now; round++) {
        uint64_t n = mxpi_buffered_records() + W.ncuts;
        if (n <= max_records) break;
        double excess = (double)(n - max_records) / (double)n;
        int64_t step = (int64_t)((double)(now - cutoff) * excess) + 1;
        cutoff = round == 31 || step > now - cutoff ? now : cutoff + step;
        if (cutoff > W.ring_floor) W.ring_floor = cutoff;
        trim_all(cutoff);
    }
    mxpi_threads_reap();
    pthread_mutex_unlock(&mxpi_g.out_lock);
    return MXP_OK;
}

int64_t mxp_ring_floor_ns(void) {
    mxp_init();
    pthread_mutex_lock(&mxpi_g.out_lock);
    int64_t floor = W.ring_floor;
    pthread_mutex_unlock(&mxpi_g.out_lock);
    if (floor == INT64_MIN) return INT64_MIN;
    mxpi_timebase tb;
    mxpi_timebase_get(&tb);
    return tb.ns0 + mxpi_tb_span(&tb, floor - tb.tick0);
}

/* Hand the format t's buffered records in [from, to] without consuming
 * them; counters' records before from go to last instead. */
static bool snap_thread(mxpi_thread *t, int64_t from, int64_t to, struct last_value *last,
                        uint32_t nlast) {
    cursor c = cursor_of(t);
    bool any = false;
    while (c.chunk != NULL) {
        mxpi_chunk *next = atomic_load_explicit(&c.chunk->next, MXPI_ACQUIRE);
        uint32_t count = atomic_load_explicit(&c.chunk->count, MXPI_ACQUIRE);
        for (; c.pos < count; c.pos++) {
            const mxpi_rec *r = &c.chunk->rec[c.pos];
            if (r->ts < W.o.epoch_ticks || r->ts > to) continue;
            if (rec_end(r) < from) {
                if (is_counter(r)) note_last(last, nlast, r, t->tid);
                continue;
            }
            if (r->id != MXPI_SAMPLE_ID) any = true;
            if (!W.fmt->record(&W.o, r, t->tid)) return false;
        }
        if (next == NULL) break;
        c.chunk = next;
        c.pos = 0;
    }
    if (any) mxpi_thread_mark_used(t->tid);
    return true;
}

static bool snap_records(int64_t from, int64_t to) {
    uint32_t n, nlast = W.nlast;
    struct last_value *last = malloc((nlast ? nlast : 1) * sizeof *last);
    mxpi_thread **ts = mxpi_threads_snapshot(&n);
    mxpi_rec *open = NULL;
    uint32_t *open_tids = NULL, nopen = 0;
    bool ok = last != NULL && ts != NULL && mxpi_open_peek(to, &open, &open_tids, &nopen);
    if (ok && nlast) memcpy(last, W.last, nlast * sizeof *last);
    for (uint32_t i = 0; ok && i < n; i++) ok = snap_thread(ts[i], from, to, last, nlast);
    for (uint32_t i = 0; ok && i < W.ncuts; i++) {
        const mxpi_rec *r = &W.cuts[i].r;
        if (r->ts < W.o.epoch_ticks || r->ts > to || rec_end(r) < from) continue;
        mxpi_thread_mark_used(W.cuts[i].tid);
        ok = W.fmt->record(&W.o, r, W.cuts[i].tid);
    }
    /* Each counter's value when the window opens. */
    int64_t start = from > W.o.epoch_ticks ? from : W.o.epoch_ticks;
    for (uint32_t id = 0; ok && id < nlast; id++) {
        if (!last[id].set) continue;
        mxpi_rec r = {start, last[id].val, id, 0};
        mxpi_thread_mark_used(last[id].tid);
        ok = W.fmt->record(&W.o, &r, last[id].tid);
    }
    for (uint32_t i = 0; ok && i < nopen; i++) {
        if (open[i].ts < W.o.epoch_ticks) {
            /* begun before the profile: shown from its start */
            open[i].val -= W.o.epoch_ticks - open[i].ts;
            open[i].ts = W.o.epoch_ticks;
        }
        mxpi_thread_mark_used(open_tids[i]);
        ok = W.fmt->record(&W.o, &open[i], open_tids[i]);
    }
    if (last == NULL || ts == NULL) W.o.err = ENOMEM;
    free(last);
    free(ts);
    free(open);
    free(open_tids);
    return ok;
}

int mxp_snapshot_write(const char *path, size_t path_len, int64_t from_ns, int64_t to_ns,
                       const char *other_json, size_t other_json_len) {
    mxp_init();
    const mxpi_format *fmt = path_format(path, path_len);
    if (fmt == NULL) return MXP_E_INVALID;
    pthread_mutex_lock(&mxpi_g.out_lock);
    if (!W.profile_open || W.path != NULL) {
        pthread_mutex_unlock(&mxpi_g.out_lock);
        return MXP_E_STATE;
    }
    /* The snapshot is this profile's file for the length of one flush. */
    char *other = NULL;
    size_t base_len = W.other_json ? W.other_json_len : 0;
    size_t other_len = base_len + (base_len && other_json_len ? 1 : 0) + other_json_len;
    W.path = mxpi_dup(path, path_len);
    other = malloc(other_len + 1);
    int rc = MXP_OK;
    if (W.path == NULL || other == NULL) {
        W.o.err = ENOMEM;
        rc = MXP_E_IO;
        goto out;
    }
    if (base_len) memcpy(other, W.other_json, base_len);
    if (base_len && other_json_len) other[base_len] = ',';
    if (other_json_len) memcpy(other + other_len - other_json_len, other_json, other_json_len);
    other[other_len] = '\0';
    W.fmt = fmt;
    W.o.err = 0;
    mxpi_timebase_get(&W.o.tb);
    tallies_now();
    meta_into_out();
    W.o.other_json = other;
    W.o.other_json_len = other_len;
    last_fit();
    rc = create_file();
    if (rc != MXP_OK) goto out;
    if (!fmt->begin(&W.o) || !snap_records(ticks_at(&W.o.tb, from_ns), ticks_at(&W.o.tb, to_ns)) ||
        !fmt->end(&W.o)) {
        fmt->restore(&W.o);
        if (W.o.err == 0) W.o.err = EIO;
        rc = MXP_E_IO;
        int err = W.o.err;
        close_file();
        unlink(W.path);
        W.o.err = err;
        goto out;
    }
    fmt->commit(&W.o);
    close_file();
out:
    free(W.path);
    W.path = NULL;
    W.fmt = NULL;
    free(other);
    meta_into_out();
    pthread_mutex_unlock(&mxpi_g.out_lock);
    return rc;
}

void mxpi_trace_reset(void) {
    pthread_mutex_lock(&mxpi_g.out_lock);
    close_file();
    discard_locked();
    W.profile_open = false;
    W.finished = false;
    W.o.err = 0;
    free(W.path);
    W.path = NULL;
    W.fmt = NULL;
    pthread_mutex_unlock(&mxpi_g.out_lock);
}

/* In a forked child: the parent's file is not ours to write, and the buffers
 * hold the parent's records.  Called with every lock freshly initialised;
 * the format's state is abandoned, not freed (the parent's writer may have
 * been in the middle of using it). */
void mxpi_trace_after_fork(void) {
    if (W.o.fd >= 0) close(W.o.fd);
    W.o.fd = -1;
    W.o.state = NULL;
    W.profile_open = false;
    W.finished = false;
}
