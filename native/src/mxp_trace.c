/*
 * mxp_trace.c -- draining the per-thread buffers into a Chrome trace file.
 *
 * File layout, valid JSON after every flush:
 *
 *   {"traceEvents":[
 *   <event>,            <- appended by each flush, one per line
 *   ...
 *   <metadata events>   <- the "tail": rewritten by each flush
 *   ],
 *   "displayTimeUnit":"ms","baseTimeNanoseconds":N,...,"otherData":{...}}
 *
 * A flush writes new events over the old tail, then a new tail, then cuts
 * the file after it.  If a write fails, the file is cut back to where the old
 * tail began and the old tail is written again, so the file stays the last
 * complete document, and the drained records stay buffered for the next try.
 * Records are freed only after the flush that wrote them succeeded.
 */
#include "mxp_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define WRITE_THRESHOLD (1u << 20)

typedef struct tinfo {
    char *name;
    size_t name_len;
    int64_t os_tid;
    bool used; /* has events in the current file */
} tinfo;

typedef struct cursor {
    mxpi_chunk *start; /* where reading began: chunks from here to chunk are done */
    mxpi_chunk *chunk;
    uint32_t pos;
    uint64_t consumed;
} cursor;

static struct {
    char *path;
    int fd; /* -1: the current file is not created yet */
    bool regular; /* a regular file (others, like /dev/null, cannot be cut) */
    bool profile_open;
    bool finished;
    int64_t epoch_ticks;
    int64_t base_wall_ns;
    int64_t tail_off;
    mxpi_buf tail; /* the tail as last written: restored after a failure */
    int err;
    int pid;
    char *process_name, *top_json, *other_json;
    size_t process_name_len, top_json_len, other_json_len;
    mxp_counts base; /* tallies when the profile began */
    mxpi_buf out;
    /* names_lock */
    tinfo *threads;
    uint32_t nthreads;
} W = {.fd = -1};

static bool pwrite_all(int fd, const char *p, size_t n, int64_t *off) {
    while (n) {
        ssize_t k = pwrite(fd, p, n, (off_t)*off);
        if (k < 0) {
            if (errno == EINTR) continue;
            W.err = errno;
            return false;
        }
        if (k == 0) {
            W.err = ENOSPC;
            return false;
        }
        p += k;
        n -= (size_t)k;
        *off += k;
    }
    return true;
}

/* ---- threads' names ---- */

void mxpi_trace_note_thread(uint32_t tid, int64_t os_tid) {
    pthread_mutex_lock(&mxpi_g.names_lock);
    if (tid >= W.nthreads) {
        uint32_t n = W.nthreads ? W.nthreads : 16;
        while (n <= tid) n *= 2;
        tinfo *p = realloc(W.threads, n * sizeof *p);
        if (p != NULL) {
            memset(p + W.nthreads, 0, (n - W.nthreads) * sizeof *p);
            W.threads = p;
            W.nthreads = n;
        }
    }
    if (tid < W.nthreads) W.threads[tid].os_tid = os_tid;
    pthread_mutex_unlock(&mxpi_g.names_lock);
}

int mxp_thread_name_set(uint32_t tid, const char *name, size_t name_len) {
    mxp_init();
    if (name == NULL && name_len) return MXP_E_INVALID;
    char *copy = mxpi_dup(name ? name : "", name_len);
    if (copy == NULL) return MXP_E_NOMEM;
    int rc = MXP_E_INVALID;
    pthread_mutex_lock(&mxpi_g.names_lock);
    if (tid > 0 && tid < W.nthreads && tid <= mxpi_g.next_tid) {
        free(W.threads[tid].name);
        W.threads[tid].name = copy;
        W.threads[tid].name_len = name_len;
        copy = NULL;
        rc = MXP_OK;
    }
    pthread_mutex_unlock(&mxpi_g.names_lock);
    free(copy);
    return rc;
}

/* ---- record formatting ---- */

static const char *marker_s(uint32_t scope) {
    return scope == MXP_SCOPE_GLOBAL ? "g" : scope == MXP_SCOPE_PROCESS ? "p" : "t";
}

static const char *scope_name(uint32_t scope) {
    static const char *names[] = {"unknown", "global", "process", "thread", "task", "marker"};
    return scope <= MXP_SCOPE_MARKER ? names[scope] : "unknown";
}

/* pid_tid is ,"pid":P,"tid": */
static void format_rec(mxpi_buf *b, const mxpi_rec *r, const mxpi_timebase *tb,
                       const char *pid_tid, size_t pid_tid_len, uint32_t tid) {
    mxpi_object *o = mxpi_obj(r->id);
    mxpi_buf_put(b, o->frag, o->frag_len);
    mxpi_buf_us(b, mxpi_tb_span(tb, r->ts - W.epoch_ticks));
    switch (o->kind) {
    case MXP_KIND_COUNTER:
        mxpi_buf_put(b, pid_tid, pid_tid_len);
        mxpi_buf_u64(b, tid);
        mxpi_buf_put(b, o->key, o->key_len);
        mxpi_buf_i64(b, r->val);
        mxpi_buf_put(b, "}},\n", 4);
        return;
    case MXP_KIND_MARKER:
        mxpi_buf_puts(b, ",\"s\":\"");
        mxpi_buf_puts(b, marker_s(r->aux));
        mxpi_buf_putc(b, '"');
        mxpi_buf_put(b, pid_tid, pid_tid_len);
        mxpi_buf_u64(b, tid);
        mxpi_buf_puts(b, ",\"args\":{\"scope\":\"");
        mxpi_buf_puts(b, scope_name(r->aux));
        mxpi_buf_put(b, "\"}},\n", 5);
        return;
    default:
        mxpi_buf_put(b, ",\"dur\":", 7);
        mxpi_buf_us(b, mxpi_tb_span(tb, r->val));
        mxpi_buf_put(b, pid_tid, pid_tid_len);
        mxpi_buf_u64(b, tid);
        if (o->kind == MXP_KIND_FRAME) {
            mxpi_buf_puts(b, ",\"args\":{\"frame\":");
            mxpi_buf_u64(b, r->aux);
            mxpi_buf_putc(b, '}');
        }
        mxpi_buf_put(b, "},\n", 3);
    }
}

/* ---- tallies ---- */

static void counts_now(mxp_counts *c) { mxp_counts_get(c); }

static void tail_build(mxpi_buf *b) {
    b->len = 0;
    b->failed = false;
    mxpi_buf_puts(b, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":");
    mxpi_buf_i64(b, W.pid);
    mxpi_buf_puts(b, ",\"tid\":0,\"args\":{\"name\":");
    mxpi_buf_json_str(b, W.process_name ? W.process_name : "python", W.process_name ? W.process_name_len : 6);
    mxpi_buf_puts(b, "}}");
    pthread_mutex_lock(&mxpi_g.names_lock);
    for (uint32_t tid = 1; tid < W.nthreads; tid++) {
        tinfo *ti = &W.threads[tid];
        if (!ti->used) continue;
        mxpi_buf_puts(b, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":");
        mxpi_buf_i64(b, W.pid);
        mxpi_buf_puts(b, ",\"tid\":");
        mxpi_buf_u64(b, tid);
        mxpi_buf_puts(b, ",\"args\":{\"name\":");
        if (ti->name) {
            mxpi_buf_json_str(b, ti->name, ti->name_len);
        } else {
            mxpi_buf_puts(b, "\"thread ");
            mxpi_buf_i64(b, ti->os_tid);
            mxpi_buf_putc(b, '"');
        }
        mxpi_buf_puts(b, "}},\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":");
        mxpi_buf_i64(b, W.pid);
        mxpi_buf_puts(b, ",\"tid\":");
        mxpi_buf_u64(b, tid);
        mxpi_buf_puts(b, ",\"args\":{\"sort_index\":");
        mxpi_buf_u64(b, tid);
        mxpi_buf_puts(b, "}}");
    }
    pthread_mutex_unlock(&mxpi_g.names_lock);

    mxp_counts c;
    counts_now(&c);
    mxpi_buf_puts(b, "\n],\n\"displayTimeUnit\":\"ms\",\"baseTimeNanoseconds\":");
    mxpi_buf_i64(b, W.base_wall_ns);
    mxpi_buf_putc(b, ',');
    if (W.top_json_len) {
        mxpi_buf_put(b, W.top_json, W.top_json_len);
        mxpi_buf_putc(b, ',');
    }
    mxpi_buf_puts(b, "\n\"otherData\":{");
    if (W.other_json_len) {
        mxpi_buf_put(b, W.other_json, W.other_json_len);
        mxpi_buf_putc(b, ',');
    }
    mxpi_buf_puts(b, "\"pid\":");
    mxpi_buf_i64(b, W.pid);
    mxpi_buf_puts(b, ",\"clock\":\"");
    mxpi_buf_puts(b, mxpi_clock_mode == MXP_CLOCK_TSC ? "tsc" : mxpi_clock_mode == MXP_CLOCK_FAKE ? "fake" : "monotonic");
    mxpi_buf_puts(b, "\",\"dropped_events\":");
    mxpi_buf_u64(b, c.dropped_events - W.base.dropped_events);
    mxpi_buf_puts(b, ",\"unmatched_stops\":");
    mxpi_buf_u64(b, c.unmatched_stops - W.base.unmatched_stops);
    mxpi_buf_puts(b, ",\"non_lifo_stops\":");
    mxpi_buf_u64(b, c.non_lifo_stops - W.base.non_lifo_stops);
    mxpi_buf_puts(b, ",\"ignored_calls\":");
    mxpi_buf_u64(b, c.ignored_calls - W.base.ignored_calls);
    mxpi_buf_puts(b, "}}\n");
}

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

/* Advance c over every committed record, handing each to fn (if any).
 * Returns false if fn failed. */
typedef bool (*rec_fn)(const mxpi_rec *r, uint32_t tid, void *ctx);

static bool walk(cursor *c, uint32_t tid, rec_fn fn, void *ctx) {
    while (c->chunk != NULL) {
        mxpi_chunk *next = atomic_load_explicit(&c->chunk->next, MXPI_ACQUIRE);
        uint32_t count = atomic_load_explicit(&c->chunk->count, MXPI_ACQUIRE);
        for (; c->pos < count; c->pos++, c->consumed++)
            if (fn && !fn(&c->chunk->rec[c->pos], tid, ctx)) return false;
        if (next == NULL) break;
        c->chunk = next;
        c->pos = 0;
    }
    return true;
}

/* Make t's read position c, freeing the chunks passed over.  Only chunks
 * from c.start on were read: the thread may have published its first chunk
 * since, and that one must stay. */
static void commit(mxpi_thread *t, cursor c) {
    mxpi_chunk *p = c.start;
    while (p != NULL && p != c.chunk) {
        mxpi_chunk *next = atomic_load_explicit(&p->next, MXPI_ACQUIRE);
        mxpi_chunk_put(p);
        p = next;
    }
    t->head = c.chunk;
    t->head_pos = c.pos;
    if (c.consumed) atomic_fetch_add_explicit(&mxpi_g.budget, (int64_t)c.consumed, MXPI_RELAXED);
}

static void discard_locked(void) {
    uint32_t n;
    mxpi_thread **ts = mxpi_threads_snapshot(&n);
    for (uint32_t i = 0; i < n; i++) {
        cursor c = cursor_of(ts[i]);
        walk(&c, 0, NULL, NULL);
        commit(ts[i], c);
    }
    free(ts);
    mxpi_threads_reap();
}

typedef struct wctx {
    const mxpi_timebase *tb;
    char pid_tid[48];
    size_t pid_tid_len;
    int64_t off;
    uint64_t written;
} wctx;

static bool write_rec(const mxpi_rec *r, uint32_t tid, void *arg) {
    wctx *w = arg;
    if (r->ts < W.epoch_ticks) return true; /* from a profile that ended */
    format_rec(&W.out, r, w->tb, w->pid_tid, w->pid_tid_len, tid);
    w->written++;
    if (W.out.failed) {
        W.err = ENOMEM;
        return false;
    }
    if (W.out.len >= WRITE_THRESHOLD) {
        bool ok = pwrite_all(W.fd, W.out.data, W.out.len, &w->off);
        W.out.len = 0;
        return ok;
    }
    return true;
}

/* Cut the file back to its last complete state. */
static void restore(void) {
    int64_t off = W.tail_off;
    if (W.regular && ftruncate(W.fd, (off_t)off) == 0 && W.tail.len)
        pwrite_all(W.fd, W.tail.data, W.tail.len, &off);
}

static int create_file(void) {
    int fd = open(W.path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        W.err = errno;
        return MXP_E_IO;
    }
    W.fd = fd;
    struct stat st;
    W.regular = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    pthread_mutex_lock(&mxpi_g.names_lock);
    for (uint32_t i = 0; i < W.nthreads; i++) W.threads[i].used = false;
    pthread_mutex_unlock(&mxpi_g.names_lock);
    static const char head[] = "{\"traceEvents\":[\n";
    int64_t off = 0;
    tail_build(&W.tail);
    if (W.tail.failed || !pwrite_all(fd, head, sizeof head - 1, &off) ||
        !pwrite_all(fd, W.tail.data, W.tail.len, &off)) {
        if (W.tail.failed) W.err = ENOMEM;
        close(fd);
        W.fd = -1;
        W.tail.len = 0;
        return MXP_E_IO;
    }
    W.tail_off = (int64_t)(sizeof head - 1);
    return MXP_OK;
}

static int flush_locked(bool finish) {
    if (!W.profile_open || W.path == NULL) return MXP_E_STATE;
    if (W.finished) return MXP_OK;
    W.err = 0;
    if (W.fd < 0) {
        int rc = create_file();
        if (rc != MXP_OK) return rc;
    }

    mxpi_timebase tb;
    mxpi_timebase_get(&tb);
    wctx w = {.tb = &tb, .off = W.tail_off};
    w.pid_tid_len = (size_t)snprintf(w.pid_tid, sizeof w.pid_tid, ",\"pid\":%d,\"tid\":", W.pid);

    uint32_t n;
    mxpi_thread **ts = mxpi_threads_snapshot(&n);
    cursor *cs = malloc((n ? n : 1) * sizeof *cs);
    if (ts == NULL || cs == NULL) {
        free(ts);
        free(cs);
        W.err = ENOMEM;
        return MXP_E_NOMEM;
    }
    W.out.len = 0;
    W.out.failed = false;
    bool ok = true;
    for (uint32_t i = 0; i < n && ok; i++) {
        cs[i] = cursor_of(ts[i]);
        uint64_t before = w.written;
        ok = walk(&cs[i], ts[i]->tid, write_rec, &w);
        if (w.written != before) {
            pthread_mutex_lock(&mxpi_g.names_lock);
            if (ts[i]->tid < W.nthreads) W.threads[ts[i]->tid].used = true;
            pthread_mutex_unlock(&mxpi_g.names_lock);
        }
    }
    if (ok && W.out.len) ok = pwrite_all(W.fd, W.out.data, W.out.len, &w.off);
    W.out.len = 0;

    mxpi_buf tail = {0};
    if (ok) {
        tail_build(&tail);
        if (tail.failed) {
            W.err = ENOMEM;
            ok = false;
        }
    }
    int64_t tail_off = w.off;
    if (ok) ok = pwrite_all(W.fd, tail.data, tail.len, &w.off);
    if (ok && W.regular && ftruncate(W.fd, (off_t)w.off) != 0) {
        W.err = errno;
        ok = false;
    }
    if (!ok) {
        restore();
        mxpi_buf_free(&tail);
        free(ts);
        free(cs);
        return MXP_E_IO;
    }

    for (uint32_t i = 0; i < n; i++) commit(ts[i], cs[i]);
    free(ts);
    free(cs);
    mxpi_threads_reap();
    atomic_fetch_add_explicit(&mxpi_g.written, w.written, MXPI_RELAXED);
    mxpi_buf_free(&W.tail);
    W.tail = tail;
    W.tail_off = tail_off;
    if (finish) {
        close(W.fd);
        W.fd = -1;
        W.finished = true;
    }
    return MXP_OK;
}

/* ---- public ---- */

int mxp_profile_begin(void) {
    mxp_init();
    pthread_mutex_lock(&mxpi_g.out_lock);
    if (W.fd >= 0) close(W.fd);
    W.fd = -1;
    free(W.path); /* a new profile writes nowhere until mxp_trace_path_set */
    W.path = NULL;
    discard_locked();
    uint32_t nobj = mxp_object_count();
    for (uint32_t id = 0; id < nobj; id++) atomic_store_explicit(&mxpi_obj(id)->frame_next, 0, MXPI_RELAXED);
    W.pid = (int)getpid();
    W.epoch_ticks = mxpi_ticks();
    W.base_wall_ns = mxpi_realtime_ns();
    W.profile_open = true;
    W.finished = false;
    W.err = 0;
    W.tail.len = 0;
    counts_now(&W.base);
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

int mxp_trace_path_set(const char *path, size_t path_len) {
    mxp_init();
    if (path == NULL || path_len == 0 || memchr(path, '\0', path_len) != NULL) return MXP_E_INVALID;
    int rc = MXP_OK;
    pthread_mutex_lock(&mxpi_g.out_lock);
    bool same = W.path != NULL && strlen(W.path) == path_len && memcmp(W.path, path, path_len) == 0;
    if (!same) {
        if (W.profile_open && !W.finished && W.path != NULL) rc = flush_locked(false);
        if (W.fd >= 0) close(W.fd);
        W.fd = -1;
        if (!set_str(&W.path, NULL, path, path_len)) rc = MXP_E_NOMEM;
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
    int e = W.err;
    pthread_mutex_unlock(&mxpi_g.out_lock);
    return e;
}

void mxpi_trace_reset(void) {
    pthread_mutex_lock(&mxpi_g.out_lock);
    if (W.fd >= 0) close(W.fd);
    W.fd = -1;
    discard_locked();
    W.profile_open = false;
    W.finished = false;
    W.err = 0;
    free(W.path);
    W.path = NULL;
    mxpi_buf_free(&W.tail);
    pthread_mutex_unlock(&mxpi_g.out_lock);
}

/* In a forked child: the parent's file is not ours to write, and the buffers
 * hold the parent's records.  Called with every lock freshly initialised. */
void mxpi_trace_after_fork(void) {
    if (W.fd >= 0) close(W.fd);
    W.fd = -1;
    W.profile_open = false;
    W.finished = false;
    W.tail.len = 0;
    W.out.len = 0;
}
