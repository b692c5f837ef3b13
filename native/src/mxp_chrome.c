/*
 * mxp_chrome.c -- the Chrome Trace Event JSON format, plain or gzip.
 *
 * File layout, valid JSON after every flush:
 *
 *   {"displayTimeUnit":"ms","baseTimeNanoseconds":N,"traceEvents":[
 *   <process_name metadata>,
 *   <event>,            <- appended by each flush, one per line; a thread's
 *   ...                    first event is preceded by its thread_name
 *   <metadata events>   <- the "tail": every thread's latest name,
 *   ],                     rewritten by each flush
 *   ...,"otherData":{...}}
 *
 * A flush first cuts the file where the tail begins, then appends its
 * events and a new tail: a process killed mid-flush leaves a clean prefix,
 * which readers load up to the cut (with the process's and threads' names
 * and the time base, all written before their events).  If a write fails,
 * the file is cut back to where the old tail began and the old tail is
 * written again.
 *
 * Each object's event prefix ("name", "cat", "ph" and "ts":) and, for
 * counters and memory instants, its args key are built once, when the
 * object is registered (mxpi_chrome_fragments_build): a record is written
 * by copying them and formatting numbers, never by escaping names.
 *
 * Samples (mxp_sample.c) are thread-scoped instants of category
 * "mxprof.sample" named after the innermost function, with args {"stack":
 * node id, "range": object id}; the ids are defined, before their first use
 * in the file, by metadata events "mxprof_frame" {id, function, file, line},
 * "mxprof_stack" {id, parent, frame} and "mxprof_range" {id, name, cat}
 * (so a file cut short still defines every id it uses).  The Perfetto engine
 * imports the instants on the sampled thread's track and ignores the
 * definitions; mxprof.load reads both.
 *
 * Gzip: a gzip file may hold several members, read as one stream.  The head,
 * each flush's events and the tail are separate members, so the tail can be
 * cut off and replaced exactly like the plain tail.
 *
 * The index: the tail's top-level member "mxprofIndex" lists the blocks of
 * events the file holds, one per flush that wrote events, as
 * [offset, bytes, first ns, last ns, first frame, last frame, defines]:
 * where the block lies in the file (for gzip: in the compressed file, whole
 * members), the earliest start and latest end of its events (ns from ts 0),
 * the frame indexes of its steps (-1, -1: none) and whether it defines
 * sample ids (1: a reader of any window needs its metadata events).  A
 * reader that wants a window of time or steps reads the head, the blocks
 * that overlap it or define ids and the tail (which holds every thread's
 * name), not the rest.  Past INDEX_MAX blocks,
 * neighbours are merged two by two, so the tail stays small and the blocks
 * grow coarser over a long run.  It is written with the tail it is part of,
 * so it describes exactly the blocks of the last commit.
 */
#include "mxpi_chrome.h"
#include "mxpi_format.h"
#include "mxpi_buffer.h"
#include "mxpi_clock.h"
#include "mxpi_json.h"
#include "mxpi_registry.h"
#include "mxpi_sample.h"
#include "mxpi_thread_names.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef MXPI_HAVE_ZLIB
#include <zlib.h>
#endif

#define WRITE_THRESHOLD (1u << 20)

#define INDEX_MAX 1024u /* blocks in the index before neighbours are merged */

typedef struct index_block {
    int64_t off, len;  /* bytes in the file */
    int64_t t0, t1;    /* earliest start, latest end, ns from ts 0 */
    int64_t f0, f1;    /* frame indexes of its steps (-1: none) */
    int64_t defs;      /* 1: it defines sample ids */
} index_block;

typedef struct chrome {
    bool gz;
    uint8_t *announced;   /* per tid: 1 = its name is in the file, 2 = in this flush */
    uint32_t nannounced;
    mxpi_buf text;        /* formatted, not yet written (or compressed) */
    mxpi_buf tail;        /* the tail as it is on disk (a gzip member for gz) */
    mxpi_buf next_tail;   /* the tail end() wrote, kept by commit */
    int64_t tail_off;     /* where the tail begins on disk */
    int64_t next_tail_off;
    int64_t off;          /* where the next bytes go during a flush */
    bool member_open;     /* gz: an events member has data not yet finished */
    char pid_tid[48];     /* ,"pid":P,"tid": */
    size_t pid_tid_len;
    uint64_t async_ids;   /* ids given to async ranges (never reused in the file) */
    mxpi_seen frames, stacks, ranges; /* sample definitions in the file */
    index_block *blocks;  /* the index: blocks of the last commit, then this flush's */
    uint32_t nblocks;     /* committed */
    uint32_t next_nblocks; /* with this flush's, kept by commit */
    index_block flush;    /* what this flush's events span so far */
#ifdef MXPI_HAVE_ZLIB
    z_stream z;
    bool z_ready;
    unsigned char zout[1u << 16];
#endif
} chrome;


/* ---- bytes to disk: plain, or through deflate ---- */

#ifdef MXPI_HAVE_ZLIB
/* Run deflate over in (or finish the member), writing what comes out. */
static bool deflate_out(mxpi_out *o, chrome *c, const char *in, size_t n, int mode) {
    c->z.next_in = (Bytef *)(uintptr_t)in;
    c->z.avail_in = (uInt)n;
    do {
        c->z.next_out = c->zout;
        c->z.avail_out = sizeof c->zout;
        int rc = deflate(&c->z, mode);
        if (rc == Z_STREAM_ERROR) {
            o->err = EIO;
            return false;
        }
        size_t have = sizeof c->zout - c->z.avail_out;
        if (have && !mxpi_pwrite_all(o, (const char *)c->zout, have, &c->off)) return false;
    } while (c->z.avail_out == 0 || (mode == Z_FINISH && c->z.avail_in > 0));
    return true;
}

static bool z_start(mxpi_out *o, chrome *c) {
    if (c->z_ready) return true;
    memset(&c->z, 0, sizeof c->z);
    /* 31: a gzip wrapper; level 1: this is written while the program runs. */
    if (deflateInit2(&c->z, Z_BEST_SPEED, Z_DEFLATED, 31, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
        o->err = ENOMEM;
        return false;
    }
    c->z_ready = true;
    return true;
}

/* Finish the current member: everything given so far becomes readable. */
static bool member_end(mxpi_out *o, chrome *c) {
    if (!c->member_open) return true;
    c->member_open = false;
    if (!deflate_out(o, c, NULL, 0, Z_FINISH)) return false;
    deflateReset(&c->z);
    return true;
}

/* The tail as a gzip member of its own. */
static bool compress_member(mxpi_out *o, const mxpi_buf *text, mxpi_buf *out) {
    z_stream z;
    memset(&z, 0, sizeof z);
    if (deflateInit2(&z, Z_BEST_SPEED, Z_DEFLATED, 31, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
        o->err = ENOMEM;
        return false;
    }
    out->len = 0;
    out->failed = false;
    uLong bound = deflateBound(&z, (uLong)text->len) + 32;
    bool ok = mxpi_buf_reserve(out, bound);
    if (ok) {
        z.next_in = (Bytef *)text->data;
        z.avail_in = (uInt)text->len;
        z.next_out = (Bytef *)out->data;
        z.avail_out = (uInt)bound;
        ok = deflate(&z, Z_FINISH) == Z_STREAM_END;
        out->len = bound - z.avail_out;
    }
    deflateEnd(&z);
    if (!ok) o->err = ENOMEM;
    return ok;
}
#endif

/* Send the pending text to disk (compressing it for gz). */
static bool drain_text(mxpi_out *o, chrome *c) {
    if (c->text.failed) {
        o->err = ENOMEM;
        return false;
    }
    if (c->text.len == 0) return true;
    bool ok;
#ifdef MXPI_HAVE_ZLIB
    if (c->gz) {
        c->member_open = true;
        ok = z_start(o, c) && deflate_out(o, c, c->text.data, c->text.len, Z_NO_FLUSH);
    } else
#endif
        ok = mxpi_pwrite_all(o, c->text.data, c->text.len, &c->off);
    c->text.len = 0;
    return ok;
}

/* ---- the tail ---- */

typedef struct tail_ctx {
    mxpi_buf *b;
    int pid;
} tail_ctx;

/* A thread's name and sort index: two metadata events, ",\n"-separated. */
static void thread_meta(void *arg, uint32_t tid, int64_t os_tid, const char *name, size_t len) {
    tail_ctx *t = arg;
    mxpi_buf *b = t->b;
    mxpi_buf_puts(b, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":");
    mxpi_buf_i64(b, t->pid);
    mxpi_buf_puts(b, ",\"tid\":");
    mxpi_buf_u64(b, tid);
    mxpi_buf_puts(b, ",\"args\":{\"name\":");
    if (name != NULL) {
        mxpi_buf_json_str(b, name, len);
    } else {
        mxpi_buf_puts(b, "\"thread ");
        mxpi_buf_i64(b, os_tid);
        mxpi_buf_putc(b, '"');
    }
    mxpi_buf_puts(b, "}},\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":");
    mxpi_buf_i64(b, t->pid);
    mxpi_buf_puts(b, ",\"tid\":");
    mxpi_buf_u64(b, tid);
    mxpi_buf_puts(b, ",\"args\":{\"sort_index\":");
    mxpi_buf_u64(b, tid);
    mxpi_buf_puts(b, "}}");
}

static void tail_thread(void *arg, uint32_t tid, int64_t os_tid, const char *name, size_t len) {
    mxpi_buf_puts(((tail_ctx *)arg)->b, ",\n");
    thread_meta(arg, tid, os_tid, name, len);
}

static void process_meta(const mxpi_out *o, mxpi_buf *b) {
    mxpi_buf_puts(b, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":");
    mxpi_buf_i64(b, o->pid);
    mxpi_buf_puts(b, ",\"tid\":0,\"args\":{\"name\":");
    mxpi_buf_json_str(b, o->process_name, o->process_name_len);
    mxpi_buf_puts(b, "}}");
}

static void head_text(const mxpi_out *o, mxpi_buf *b) {
    mxpi_buf_puts(b, "{\"displayTimeUnit\":\"ms\",\"baseTimeNanoseconds\":");
    mxpi_buf_i64(b, o->base_wall_ns);
    mxpi_buf_puts(b, ",\"traceEvents\":[\n");
    process_meta(o, b);
    mxpi_buf_puts(b, ",\n");
}

/* The index's blocks, as the top-level member "mxprofIndex" and a comma. */
static void index_text(mxpi_buf *b, const index_block *blocks, uint32_t n) {
    mxpi_buf_puts(b, "\"mxprofIndex\":[");
    for (uint32_t i = 0; i < n; i++) {
        const index_block *k = &blocks[i];
        const int64_t v[7] = {k->off, k->len, k->t0, k->t1, k->f0, k->f1, k->defs};
        mxpi_buf_puts(b, i ? ",\n[" : "\n[");
        for (int j = 0; j < 7; j++) {
            if (j) mxpi_buf_putc(b, ',');
            mxpi_buf_i64(b, v[j]);
        }
        mxpi_buf_putc(b, ']');
    }
    mxpi_buf_puts(b, "],");
}

static void tail_text(const mxpi_out *o, const chrome *ch, uint32_t nblocks, mxpi_buf *b) {
    b->len = 0;
    b->failed = false;
    process_meta(o, b);
    tail_ctx t = {b, o->pid};
    mxpi_threads_used(tail_thread, &t);

    const mxp_counts *c = &o->tallies;
    mxpi_buf_puts(b, "\n],\n");
    if (o->top_json_len) {
        mxpi_buf_put(b, o->top_json, o->top_json_len);
        mxpi_buf_putc(b, ',');
    }
    index_text(b, ch->blocks, nblocks);
    mxpi_buf_puts(b, "\n\"otherData\":{");
    if (o->other_json_len) {
        mxpi_buf_put(b, o->other_json, o->other_json_len);
        mxpi_buf_putc(b, ',');
    }
    mxpi_buf_puts(b, "\"pid\":");
    mxpi_buf_i64(b, o->pid);
    mxpi_buf_puts(b, ",\"clock\":\"");
    mxpi_buf_puts(b, mxpi_clock_mode == MXP_CLOCK_TSC    ? "tsc"
                     : mxpi_clock_mode == MXP_CLOCK_FAKE ? "fake"
                                                         : "monotonic");
    mxpi_buf_puts(b, "\",\"dropped_events\":");
    mxpi_buf_u64(b, c->dropped_events);
    mxpi_buf_puts(b, ",\"unmatched_stops\":");
    mxpi_buf_u64(b, c->unmatched_stops);
    mxpi_buf_puts(b, ",\"non_lifo_stops\":");
    mxpi_buf_u64(b, c->non_lifo_stops);
    mxpi_buf_puts(b, ",\"ignored_calls\":");
    mxpi_buf_u64(b, c->ignored_calls);
    mxpi_buf_puts(b, ",\"unknown_frees\":");
    mxpi_buf_u64(b, c->unknown_frees);
    mxpi_buf_puts(b, ",\"cut_ranges\":");
    mxpi_buf_u64(b, c->cut_ranges);
    mxpi_buf_puts(b, ",\"saturated_values\":");
    mxpi_buf_u64(b, c->saturated_values);
    mxpi_buf_puts(b, ",\"invalid_calls\":");
    mxpi_buf_u64(b, c->invalid_calls);
    mxpi_buf_puts(b, "}}\n");
}

/* Build the tail as on disk into out (compressed for gz) and write it. */
static bool write_tail(mxpi_out *o, chrome *c, mxpi_buf *out, uint32_t nblocks) {
    tail_text(o, c, nblocks, &c->text);
    bool ok = !c->text.failed;
#ifdef MXPI_HAVE_ZLIB
    if (ok && c->gz) {
        ok = compress_member(o, &c->text, out);
    } else
#endif
        if (ok) {
        out->len = 0;
        mxpi_buf_put(out, c->text.data, c->text.len);
        ok = !out->failed;
    }
    c->text.len = 0;
    if (!ok) {
        if (!o->err) o->err = ENOMEM;
        return false;
    }
    return mxpi_pwrite_all(o, out->data, out->len, &c->off);
}

/* ---- per-object pieces, built once when the object is registered ---- */

static const char *phase_of(uint32_t kind) {
    switch (kind) {
    case MXP_KIND_COUNTER: return "C";
    case MXP_KIND_MARKER:
    case MXP_KIND_ALLOC:
    case MXP_KIND_FREE: return "i";
    default: return "X";
    }
}

/* Chrome's "cat", as a JSON string. */
static void category(mxpi_buf *b, const mxpi_object *o) {
    mxpi_buf cat = {0};
    mxpi_object_category(&cat, o);
    mxpi_buf_json_str(b, cat.data ? cat.data : "", cat.len);
    if (cat.failed) b->failed = true;
    mxpi_buf_free(&cat);
}

bool mxpi_chrome_fragments_build(mxpi_object *o) {
    if (o->kind == MXP_KIND_SCOPE || o->kind == 0) return true;
    bool memory = o->kind == MXP_KIND_ALLOC || o->kind == MXP_KIND_FREE;
    mxpi_buf b = {0};
    mxpi_buf_puts(&b, "{\"name\":");
    size_t title_len;
    const char *title = mxpi_object_title(o, &title_len);
    mxpi_buf_json_str(&b, title, title_len);
    mxpi_buf_puts(&b, ",\"cat\":");
    category(&b, o);
    mxpi_buf_puts(&b, ",\"ph\":\"");
    mxpi_buf_puts(&b, phase_of(o->kind));
    mxpi_buf_puts(&b, "\",\"ts\":");
    if (b.failed) {
        mxpi_buf_free(&b);
        return false;
    }
    o->frag = b.data;
    o->frag_len = (uint32_t)b.len;
    if (o->kind == MXP_KIND_COUNTER || memory) {
        /* What follows the pid and tid, up to the value. */
        mxpi_buf k = {0};
        if (memory) {
            mxpi_buf_puts(&k, ",\"s\":\"t\",\"args\":{\"device\":");
            mxpi_buf_json_str(&k, o->domain, o->domain_len);
            mxpi_buf_puts(&k, ",\"attribute\":");
            mxpi_buf_json_str(&k, o->name, o->name_len);
            mxpi_buf_puts(&k, ",\"bytes\":");
        } else {
            mxpi_buf_puts(&k, ",\"args\":{");
            mxpi_buf_json_str(&k, o->name, o->name_len);
            mxpi_buf_putc(&k, ':');
        }
        if (k.failed) {
            mxpi_buf_free(&k);
            return false;
        }
        o->key = k.data;
        o->key_len = (uint32_t)k.len;
    }
    return true;
}

/* ---- records ---- */

/* Before a thread's first event in the file, its name (so that a file cut
 * short by a crash still names its threads). */
static bool announce(chrome *c, const mxpi_out *o, uint32_t tid) {
    if (tid >= c->nannounced) {
        uint32_t n = c->nannounced ? c->nannounced : 16;
        while (n <= tid) n *= 2;
        uint8_t *p = realloc(c->announced, n);
        if (p == NULL) return false;
        memset(p + c->nannounced, 0, n - c->nannounced);
        c->announced = p;
        c->nannounced = n;
    }
    if (c->announced[tid]) return true;
    c->announced[tid] = 2;
    tail_ctx t = {&c->text, o->pid};
    mxpi_thread_info(tid, thread_meta, &t);
    mxpi_buf_puts(&c->text, ",\n");
    return !c->text.failed;
}

/* The most a record adds besides its object's prefix and counter key. */
#define REC_ROOM 160u

static char *put(char *p, const char *s, size_t n) {
    memcpy(p, s, n);
    return p + n;
}

#define PUT_LIT(p, lit) put((p), (lit), sizeof(lit) - 1)

/* A range's args, if it has any: its frame index, whether a stop cut it. */
static char *range_args(char *p, const mxpi_rec *r, const mxpi_object *obj) {
    bool frame = obj->kind == MXP_KIND_FRAME, cut = (r->aux & MXPI_AUX_CUT) != 0;
    if (!frame && !cut) return p;
    p = PUT_LIT(p, ",\"args\":{");
    if (frame) {
        p = PUT_LIT(p, "\"frame\":");
        p = mxpi_fmt_u64(p, r->aux & MXPI_AUX_INDEX);
    }
    if (cut) p = frame ? PUT_LIT(p, ",\"cut_short\":true") : PUT_LIT(p, "\"cut_short\":true");
    *p++ = '}';
    return p;
}

/* A range that ended on another thread or task than it began: a pair of
 * async events ("b" and "e") with an id of their own, which viewers draw
 * on a track of their own instead of nesting them with the thread's ranges. */
/* An instant, or a span t..end, into the flush's block of the index. */
static void flush_span(chrome *c, int64_t t, int64_t end) {
    index_block *k = &c->flush;
    if (t < k->t0) k->t0 = t;
    if (end > k->t1) k->t1 = end;
}

/* An object's record at t (ns from the file's base) into the flush's block:
 * a range's whole span, and a step's index.  format_rec calls it with the
 * object and the time it looked up and converted for the text. */
static void flush_note(chrome *c, const mxpi_out *o, const mxpi_rec *r, const mxpi_object *obj,
                       int64_t t) {
    uint32_t kind = obj->kind;
    int64_t end = t;
    if (kind != MXP_KIND_COUNTER && kind != MXP_KIND_MARKER && kind != MXP_KIND_ALLOC &&
        kind != MXP_KIND_FREE) {
        end = t + mxpi_tb_span(&o->tb, r->val);
        if (kind == MXP_KIND_FRAME && !(r->aux & MXPI_AUX_ASYNC)) {
            index_block *k = &c->flush;
            int64_t f = r->aux & MXPI_AUX_INDEX;
            if (f < k->f0) k->f0 = f;
            if (f > k->f1) k->f1 = f;
        }
    }
    flush_span(c, t, end);
}

static char *async_range(chrome *c, const mxpi_out *o, const mxpi_rec *r, uint32_t tid,
                         const mxpi_object *obj, char *p) {
    uint64_t id = ++c->async_ids;
    for (int end = 0; end < 2; end++) {
        char *ph = p + obj->frag_len - 8; /* the phase letter of the prefix ("X") */
        p = put(p, obj->frag, obj->frag_len);
        *ph = end ? 'e' : 'b';
        p = mxpi_fmt_us(p, mxpi_tb_span(&o->tb, r->ts + (end ? r->val : 0) - o->epoch_ticks));
        p = put(p, c->pid_tid, c->pid_tid_len);
        p = mxpi_fmt_u64(p, tid);
        p = PUT_LIT(p, ",\"id\":");
        p = mxpi_fmt_u64(p, id);
        if (!end) p = range_args(p, r, obj);
        p = PUT_LIT(p, "},\n");
    }
    return p;
}

static void format_rec(chrome *c, const mxpi_out *o, const mxpi_rec *r, uint32_t tid) {
    mxpi_buf *b = &c->text;
    mxpi_object *obj = mxpi_obj(r->id);
    int64_t t = mxpi_tb_span(&o->tb, r->ts - o->epoch_ticks);
    flush_note(c, o, r, obj, t);
    if (!mxpi_buf_reserve(b, 2 * (obj->frag_len + REC_ROOM) + obj->key_len)) return;
    if ((r->aux & MXPI_AUX_ASYNC) && obj->kind != MXP_KIND_MARKER && obj->kind != MXP_KIND_COUNTER) {
        b->len = (size_t)(async_range(c, o, r, tid, obj, b->data + b->len) - b->data);
        return;
    }
    char *p = put(b->data + b->len, obj->frag, obj->frag_len);
    p = mxpi_fmt_us(p, t);
    switch (obj->kind) {
    case MXP_KIND_COUNTER:
    case MXP_KIND_ALLOC: /* the key holds "s" and the args up to the bytes */
    case MXP_KIND_FREE:
        p = put(p, c->pid_tid, c->pid_tid_len);
        p = mxpi_fmt_u64(p, tid);
        p = put(p, obj->key, obj->key_len);
        p = mxpi_fmt_i64(p, r->val);
        p = PUT_LIT(p, "}},\n");
        break;
    case MXP_KIND_MARKER: {
        const char *name = mxpi_scope_name(r->aux);
        p = PUT_LIT(p, ",\"s\":\"");
        *p++ = mxpi_scope_letter(r->aux)[0];
        *p++ = '"';
        p = put(p, c->pid_tid, c->pid_tid_len);
        p = mxpi_fmt_u64(p, tid);
        p = PUT_LIT(p, ",\"args\":{\"scope\":\"");
        p = put(p, name, strlen(name));
        p = PUT_LIT(p, "\"}},\n");
        break;
    }
    default:
        p = PUT_LIT(p, ",\"dur\":");
        p = mxpi_fmt_us(p, mxpi_tb_span(&o->tb, r->val));
        p = put(p, c->pid_tid, c->pid_tid_len);
        p = mxpi_fmt_u64(p, tid);
        p = range_args(p, r, obj);
        p = PUT_LIT(p, "},\n");
    }
    b->len = (size_t)(p - b->data);
}

/* ---- samples ---- */

static void def_head(chrome *c, const mxpi_out *o, const char *what, uint32_t id) {
    mxpi_buf *b = &c->text;
    c->flush.defs = 1;
    mxpi_buf_puts(b, "{\"name\":\"");
    mxpi_buf_puts(b, what);
    mxpi_buf_puts(b, "\",\"ph\":\"M\",\"pid\":");
    mxpi_buf_i64(b, o->pid);
    mxpi_buf_puts(b, ",\"tid\":0,\"args\":{\"id\":");
    mxpi_buf_u64(b, id);
}

/* Define stack node id, and first whatever it refers to, unless the file has it. */
static void define_stack(chrome *c, const mxpi_out *o, uint32_t id, bool *failed) {
    mxpi_buf *b = &c->text;
    while (id != 0 && mxpi_seen_first(&c->stacks, id, failed)) {
        const mxpi_snode *n = mxpi_snode_get(id);
        const mxpi_sframe *f = n ? mxpi_sframe_get(n->frame) : NULL;
        if (f == NULL) return;
        if (mxpi_seen_first(&c->frames, n->frame, failed)) {
            def_head(c, o, "mxprof_frame", n->frame);
            mxpi_buf_puts(b, ",\"function\":");
            mxpi_buf_json_str(b, f->name, f->name_len);
            mxpi_buf_puts(b, ",\"file\":");
            mxpi_buf_json_str(b, f->file, f->file_len);
            mxpi_buf_puts(b, ",\"line\":");
            mxpi_buf_u64(b, f->line);
            mxpi_buf_puts(b, "}},\n");
        }
        def_head(c, o, "mxprof_stack", id);
        mxpi_buf_puts(b, ",\"parent\":");
        mxpi_buf_u64(b, n->parent);
        mxpi_buf_puts(b, ",\"frame\":");
        mxpi_buf_u64(b, n->frame);
        mxpi_buf_puts(b, "}},\n");
        id = n->parent; /* defined after its child: readers resolve at the end */
    }
}

static bool sample_rec(chrome *c, const mxpi_out *o, const mxpi_rec *r) {
    mxpi_buf *b = &c->text;
    uint32_t tid = r->aux, stack = (uint32_t)((uint64_t)r->val & 0xffffffffu);
    uint32_t range = (uint32_t)((uint64_t)r->val >> 32);
    const mxpi_snode *n = mxpi_snode_get(stack);
    const mxpi_sframe *leaf = n ? mxpi_sframe_get(n->frame) : NULL;
    if (leaf == NULL) return true; /* cannot happen: the core checked it */
    bool failed = false;
    mxpi_thread_mark_used(tid);
    if ((tid >= c->nannounced || !c->announced[tid]) && !announce(c, o, tid)) return false;
    define_stack(c, o, stack, &failed);
    bool has_range = range != MXPI_SAMPLE_NO_RANGE && range < mxp_object_count();
    if (has_range && mxpi_seen_first(&c->ranges, range, &failed)) {
        const mxpi_object *obj = mxpi_obj(range);
        size_t len;
        const char *title = mxpi_object_title(obj, &len);
        def_head(c, o, "mxprof_range", range);
        mxpi_buf_puts(b, ",\"name\":");
        mxpi_buf_json_str(b, title, len);
        mxpi_buf_puts(b, ",\"cat\":");
        category(b, obj);
        mxpi_buf_puts(b, "}},\n");
    }
    mxpi_buf_puts(b, "{\"name\":");
    mxpi_buf_json_str(b, leaf->name, leaf->name_len);
    mxpi_buf_puts(b, ",\"cat\":\"mxprof.sample\",\"ph\":\"i\",\"s\":\"t\",\"ts\":");
    mxpi_buf_us(b, mxpi_tb_span(&o->tb, r->ts - o->epoch_ticks));
    mxpi_buf_put(b, c->pid_tid, c->pid_tid_len);
    mxpi_buf_u64(b, tid);
    mxpi_buf_puts(b, ",\"args\":{\"stack\":");
    mxpi_buf_u64(b, stack);
    if (has_range) {
        mxpi_buf_puts(b, ",\"range\":");
        mxpi_buf_u64(b, range);
    }
    mxpi_buf_puts(b, "}},\n");
    return !failed && !b->failed;
}

/* ---- the format interface ---- */

static bool create(mxpi_out *o, bool gz) {
    chrome *c = calloc(1, sizeof *c);
    if (c == NULL) {
        o->err = ENOMEM;
        return false;
    }
    o->state = c;
    c->gz = gz;
    c->pid_tid_len = (size_t)snprintf(c->pid_tid, sizeof c->pid_tid, ",\"pid\":%d,\"tid\":", o->pid);
    c->blocks = calloc(INDEX_MAX + 1, sizeof *c->blocks);
    if (c->blocks == NULL) {
        o->err = ENOMEM;
        return false;
    }
    head_text(o, &c->text);
    if (!drain_text(o, c)) return false;
#ifdef MXPI_HAVE_ZLIB
    if (gz && !member_end(o, c)) return false;
#endif
    c->tail_off = c->off;
    return write_tail(o, c, &c->tail, 0);
}

static bool create_plain(mxpi_out *o) { return create(o, false); }

/* What a flush's records span, before the first. */
static void flush_reset(index_block *k, int64_t off) {
    *k = (index_block){off, 0, INT64_MAX, INT64_MIN, INT64_MAX, -1, 0};
}

static bool begin(mxpi_out *o) {
    chrome *c = o->state;
    c->off = c->tail_off;
    flush_reset(&c->flush, c->tail_off);
    c->text.len = 0;
    c->text.failed = false;
    /* Cut first: a crash while writing leaves a clean prefix, not events
     * followed by the old tail's remains. */
    if (o->regular && ftruncate(o->fd, (off_t)c->tail_off) != 0) {
        o->err = errno;
        return false;
    }
    return true;
}

static bool record(mxpi_out *o, const mxpi_rec *r, uint32_t tid) {
    chrome *c = o->state;
    if (r->id == MXPI_SAMPLE_ID) {
        int64_t t = mxpi_tb_span(&o->tb, r->ts - o->epoch_ticks);
        flush_span(c, t, t);
        if (!sample_rec(c, o, r)) {
            o->err = ENOMEM;
            return false;
        }
        return c->text.len < WRITE_THRESHOLD || drain_text(o, c);
    }
    if ((tid >= c->nannounced || !c->announced[tid]) && !announce(c, o, tid)) {
        o->err = ENOMEM;
        return false;
    }
    format_rec(c, o, r, tid);
    return c->text.len < WRITE_THRESHOLD ? !c->text.failed : drain_text(o, c);
}

static bool end(mxpi_out *o) {
    chrome *c = o->state;
    if (!drain_text(o, c)) return false;
#ifdef MXPI_HAVE_ZLIB
    if (c->gz && !member_end(o, c)) return false;
#endif
    c->next_tail_off = c->off;
    c->next_nblocks = c->nblocks;
    if (c->flush.t1 != INT64_MIN) { /* it wrote events: one more block */
        c->flush.len = c->off - c->flush.off;
        if (c->flush.f0 == INT64_MAX) c->flush.f0 = -1;
        c->blocks[c->next_nblocks++] = c->flush;
    }
    if (!write_tail(o, c, &c->next_tail, c->next_nblocks)) return false;
    if (o->regular && ftruncate(o->fd, (off_t)c->off) != 0) {
        o->err = errno;
        return false;
    }
    return true;
}

/* Announcements of this flush (2) become permanent (1), or are forgotten. */
static void settle(chrome *c, bool keep) {
    for (uint32_t i = 0; i < c->nannounced; i++)
        if (c->announced[i] == 2) c->announced[i] = keep ? 1 : 0;
    mxpi_seen_settle(&c->frames, keep);
    mxpi_seen_settle(&c->stacks, keep);
    mxpi_seen_settle(&c->ranges, keep);
}

/* Past INDEX_MAX blocks, neighbours merged two by two (a lone last one kept). */
static void index_merge(chrome *c) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < c->nblocks; i += 2, n++) {
        index_block k = c->blocks[i];
        if (i + 1 < c->nblocks) {
            const index_block *m = &c->blocks[i + 1];
            k.len = m->off + m->len - k.off;
            if (m->t0 < k.t0) k.t0 = m->t0;
            if (m->t1 > k.t1) k.t1 = m->t1;
            if (m->f1 >= 0 && (k.f1 < 0 || m->f0 < k.f0)) k.f0 = m->f0;
            if (m->f1 > k.f1) k.f1 = m->f1;
            k.defs |= m->defs;
        }
        c->blocks[n] = k;
    }
    c->nblocks = n;
}

static void commit(mxpi_out *o) {
    chrome *c = o->state;
    c->nblocks = c->next_nblocks;
    if (c->nblocks >= INDEX_MAX) index_merge(c);
    settle(c, true);
    mxpi_buf swap = c->tail;
    c->tail = c->next_tail;
    c->next_tail = swap;
    c->tail_off = c->next_tail_off;
}

static void restore(mxpi_out *o) {
    chrome *c = o->state;
    if (c == NULL) return;
    settle(c, false);
#ifdef MXPI_HAVE_ZLIB
    if (c->z_ready) deflateReset(&c->z); /* drop a member half written */
    c->member_open = false;
#endif
    int64_t off = c->tail_off;
    if (o->regular && ftruncate(o->fd, (off_t)off) == 0 && c->tail.len)
        mxpi_pwrite_all(o, c->tail.data, c->tail.len, &off);
}

static void release(mxpi_out *o) {
    chrome *c = o->state;
    if (c == NULL) return;
    mxpi_buf_free(&c->text);
    mxpi_buf_free(&c->tail);
    mxpi_buf_free(&c->next_tail);
    free(c->announced);
    free(c->blocks);
    mxpi_seen_free(&c->frames);
    mxpi_seen_free(&c->stacks);
    mxpi_seen_free(&c->ranges);
#ifdef MXPI_HAVE_ZLIB
    if (c->z_ready) deflateEnd(&c->z);
#endif
    free(c);
    o->state = NULL;
}

const mxpi_format mxpi_chrome_json = {"json", create_plain, begin, record, end, commit, restore, release};

#ifdef MXPI_HAVE_ZLIB
static bool create_gz(mxpi_out *o) { return create(o, true); }
const mxpi_format mxpi_chrome_json_gz = {"json.gz", create_gz, begin, record, end, commit, restore, release};
#endif
