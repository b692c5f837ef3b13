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
} W = {.o = {.fd = -1}};

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
    mxp_counts_get(&W.base);
    pthread_mutex_unlock(&mxpi_g.out_lock);
    return MXP_OK;
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
