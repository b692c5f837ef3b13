/*
 * mxp_perfetto.c -- the Perfetto protobuf trace format.
 *
 * A Perfetto trace is the message Trace { repeated TracePacket packet = 1; },
 * so the file is a run of (0x0A, varint length, packet) blocks.  A flush only
 * appends packets, and a file cut after any whole packet is a valid trace:
 * a crash loses nothing that was flushed.  Field numbers are those of
 * protos/perfetto/trace/ in the Perfetto tree (trace_packet.proto,
 * clock_snapshot.proto, interned_data/, track_event/).
 *
 * Packet sequences: the process's (PROCESS_SEQ) holds create's ClockSnapshot
 * (MONOTONIC is the trace clock) and the process track, whose packet clears
 * its incremental state, and the samples (absolute MONOTONIC timestamps, a
 * clock_id each).  Each flush then writes, thread by thread, the thread's
 * events on the thread's own sequence (THREAD_SEQ + tid), a batch at a
 * time; each batch starts that sequence afresh (sequence_start): a packet
 * that clears its state and sets its TracePacketDefaults (the thread's
 * track, the clock CLOCK_DELTA_ID), and a ClockSnapshot that declares that
 * clock incremental and starts it at the file's MONOTONIC base.  So an event
 * packet holds a timestamp delta in ns, the sequence id and its TrackEvent,
 * with no clock id and no track uuid unless its track is another than the
 * thread's: about 30 bytes a range (begin and end) instead of 70.  A batch
 * re-interns the names it uses, so it needs nothing from an earlier flush,
 * and a file cut or restored after any batch stays whole.  The thread's
 * track comes first (its first time in the file, or when its name changed),
 * then its events, sorted so that begins and ends nest in file order (a
 * batch already in that order, as most are, is not sorted).  Ranges become
 * SLICE_BEGIN/SLICE_END pairs (Perfetto has no complete event), counter
 * samples COUNTER events on a track per counter (written before its first
 * sample), markers INSTANT events on the track their scope names: global
 * ones on the implicit trace-global track (uuid 0, which needs no
 * descriptor and is shared by every process loaded with this one, as
 * Chrome JSON's "s":"g" instants share Perfetto's one global track),
 * process ones on the process track, the others on the thread's.  An
 * object's name and category are both interned under its id, by the packet
 * that first uses them on its sequence; every named event carries its
 * category (TrackEventDefaults has none to inherit).
 *
 * Samples (mxp_sample.c) are PerfSample packets (pid, tid, callstack_iid)
 * on the sampled thread, which the Perfetto UI shows as a thread's
 * callstack samples and their flame graph.  The interned data they use
 * (InternedData function_names, frames, callstacks and one empty mapping)
 * comes in the packet that first uses it.  A frame is named
 * "function (file:line)".  The callstack iid says where the sample was
 * attributed: the stack node in its low 32 bits, and, when it had a range,
 * the range's object id + 1 in the high 32 (that name interned as an event
 * name under the object id, as a range's own is).
 *
 * There is no trailer: the profile's tallies (dropped events, unmatched and
 * non-LIFO stops, ignored calls) are not written in this format.
 *
 * What a flush marks as written (interned objects, counter tracks, thread
 * names) counts only after commit; restore cuts the file back to the last
 * commit and forgets it, so the next flush writes it again.
 */
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
#include <time.h>
#include <unistd.h>

#define WRITE_THRESHOLD (1u << 20)
/* One thread's records are sorted in batches of at most this many events;
 * a larger batch is cut, and (as for ranges that cross flushes) consumers
 * order its events by timestamp. */
#define BATCH_MAX (1u << 20)

/* Field numbers: Trace.packet = 1; TracePacket (trace_packet.proto). */
enum { TRACE_PACKET = 1 };
enum { PK_CLOCK_SNAPSHOT = 6, PK_TIMESTAMP = 8, PK_SEQUENCE_ID = 10, PK_TRACK_EVENT = 11 };
enum { PK_INTERNED_DATA = 12, PK_SEQUENCE_FLAGS = 13, PK_CLOCK_ID = 58, PK_DEFAULTS = 59 };
enum { PK_TRACK_DESCRIPTOR = 60 };
enum { SEQ_INCREMENTAL_STATE_CLEARED = 1, SEQ_NEEDS_INCREMENTAL_STATE = 2 };
/* TracePacketDefaults (trace_packet_defaults.proto) { timestamp_clock_id = 58;
 * track_event_defaults = 11 }; TrackEventDefaults { track_uuid = 11 }. */
enum { DEF_TIMESTAMP_CLOCK_ID = 58, DEF_TRACK_EVENT = 11, TED_TRACK_UUID = 11 };
/* ClockSnapshot { repeated Clock clocks = 1 {clock_id = 1, timestamp = 2,
 * is_incremental = 3}; primary_trace_clock = 2 }, with BuiltinClock ids;
 * ids 64 to 127 are clocks of one packet sequence. */
enum { CS_CLOCKS = 1, CS_PRIMARY_TRACE_CLOCK = 2, CLOCK_ID = 1, CLOCK_TIMESTAMP = 2 };
enum { CLOCK_IS_INCREMENTAL = 3 };
enum { CLOCK_REALTIME_ID = 1, CLOCK_MONOTONIC_ID = 3, CLOCK_BOOTTIME_ID = 6, CLOCK_DELTA_ID = 64 };
/* The process's packet sequence; thread tid's is THREAD_SEQ + tid. */
enum { PROCESS_SEQ = 1, THREAD_SEQ = 2 };
/* Tags (field << 3 | wire type) of the fields the fast path writes. */
enum { TAG_PACKET = 0x0a, TAG_TIMESTAMP = 0x40, TAG_SEQ = 0x50, TAG_FLAGS = 0x68 };
enum { TAG_TRACK_EVENT = 0x5a, TAG_TYPE = 0x48, TAG_TRACK_UUID = 0x58, TAG_NAME_IID = 0x50 };
enum { TAG_CATEGORY_IIDS = 0x18 };
/* TrackDescriptor; ProcessDescriptor and ThreadDescriptor (pid = 1 in both). */
enum { TD_UUID = 1, TD_NAME = 2, TD_PROCESS = 3, TD_THREAD = 4, TD_PARENT_UUID = 5, TD_COUNTER = 8 };
enum { DESC_PID = 1, THD_TID = 2, THD_THREAD_NAME = 5, PD_PROCESS_NAME = 6 };
/* TrackEvent, its Type, DebugAnnotation. */
enum { TE_CATEGORY_IIDS = 3, TE_DEBUG_ANNOTATIONS = 4, TE_TYPE = 9, TE_NAME_IID = 10 };
enum { TE_TRACK_UUID = 11, TE_COUNTER_VALUE = 30 };
enum { TYPE_SLICE_BEGIN = 1, TYPE_SLICE_END = 2, TYPE_INSTANT = 3, TYPE_COUNTER = 4 };
enum { DA_UINT_VALUE = 3, DA_INT_VALUE = 4, DA_STRING_VALUE = 6, DA_NAME = 10 };
/* InternedData { event_categories = 1, event_names = 2 }, each {iid = 1, name = 2}. */
enum { ID_EVENT_CATEGORIES = 1, ID_EVENT_NAMES = 2, INTERNED_IID = 1, INTERNED_NAME = 2 };
/* Samples: TracePacket.perf_sample = 66 {pid = 2, tid = 3, callstack_iid = 4};
 * InternedData function_names = 5 (InternedString {iid = 1, str = 2}),
 * frames = 6 {iid = 1, function_name_id = 2, mapping_id = 3, rel_pc = 4},
 * callstacks = 7 {iid = 1, repeated frame_ids = 2, root first},
 * mappings = 19 {iid = 1}. */
enum { PK_PERF_SAMPLE = 66, PS_PID = 2, PS_TID = 3, PS_CALLSTACK_IID = 4 };
enum { ID_FUNCTION_NAMES = 5, ID_FRAMES = 6, ID_CALLSTACKS = 7, ID_MAPPINGS = 19 };
enum { FR_FUNCTION_NAME_ID = 2, FR_MAPPING_ID = 3, FR_REL_PC = 4, CSK_FRAME_IDS = 2 };

/* Per object and file: what has been written. */
#define OBJ_INTERNED 1u
#define OBJ_TRACK 2u

/* An item is an event of a TYPE_* or a zero-length range (both its events). */
enum { EV_ZERO = 0 };

/* One event of the batch being sorted. */
typedef struct item {
    int64_t ts;   /* ns: the begin, the end or the instant */
    int64_t v;    /* ranges: the duration in ns; counters: the sample */
    uint32_t id;
    uint32_t aux;
    uint32_t seq; /* arrival order in the batch (records come in end order) */
    uint32_t what; /* TYPE_* or EV_ZERO */
    uint32_t lane; /* async ranges: the number of their own track */
    uint32_t unused;
} item;

typedef struct thr {
    char *name; /* on the thread's last committed track (NULL: none) */
    char *next; /* on its track written by this flush (NULL: none) */
    size_t len, next_len;
} thr;

typedef struct perfetto {
    mxpi_buf text;     /* encoded, not yet written */
    int64_t end;       /* the file's end at the last commit */
    int64_t off;       /* where the next bytes go during a flush */
    uint32_t seq;      /* the sequence packets go to: PROCESS_SEQ or a thread's */
    int64_t last_ts;   /* the thread sequence's CLOCK_DELTA_ID, in ns */
    uint32_t *stamp;   /* per object id: the batch that interned it on its sequence */
    uint32_t batch;    /* batches written (each clears its sequence's state) */
    uint64_t proc_uuid;
    uint8_t *done;     /* per object id: OBJ_* as of the last commit */
    uint8_t *work;     /* ... as of this flush */
    uint32_t top;      /* ids below it may have flags */
    thr *thr;          /* per trace tid */
    uint32_t nthr;
    item *items;       /* the batch: records of thread tid */
    size_t n, cap;
    bool unsorted;     /* the batch is not in file order (note_order) */
    uint32_t tid;
    uint32_t lanes;    /* tracks given to async ranges (never reused in the file) */
    mxpi_seen frames;  /* sample frames interned in the file (id 0: the mapping) */
    struct { uint64_t *key; uint8_t *st; size_t n, used; } stacks; /* callstack iids, as mxpi_seen */
    uint32_t *path;    /* a stack's frames, root first */
    uint32_t path_cap;
} perfetto;

/* ---- protobuf encoding (mxpi_buf records an allocation failure) ---- */

/* A varint at p (room for 10 bytes); returns the byte after it.  The hot
 * path reserves once per packet and writes through a local pointer, so the
 * buffer's length and data are not reloaded per byte. */
static inline uint8_t *pv(uint8_t *p, uint64_t v) {
    while (v >= 0x80) {
        *p++ = (uint8_t)(0x80 | (v & 0x7f));
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

static void put_varint(mxpi_buf *b, uint64_t v) {
    if (!mxpi_buf_reserve(b, 10)) return;
    b->len = (size_t)((char *)pv((uint8_t *)b->data + b->len, v) - b->data);
}

static void put_uint(mxpi_buf *b, uint32_t field, uint64_t v) {
    put_varint(b, (uint64_t)field << 3);
    put_varint(b, v);
}

static void put_bytes(mxpi_buf *b, uint32_t field, const char *s, size_t n) {
    put_varint(b, (uint64_t)field << 3 | 2);
    put_varint(b, n);
    mxpi_buf_put(b, s, n);
}

/* A length-delimited field (message or string) whose length is known only
 * at msg_close: one byte is reserved for it, and the content moved along
 * when the length needs more. */
static size_t msg_open(mxpi_buf *b, uint32_t field) {
    put_varint(b, (uint64_t)field << 3 | 2);
    mxpi_buf_putc(b, 0);
    return b->len;
}

static void msg_close(mxpi_buf *b, size_t start) {
    if (b->failed) return;
    size_t n = b->len - start;
    char len[10];
    size_t k = 0;
    for (uint64_t v = n; k == 0 || v; v >>= 7) len[k++] = (char)((v >= 0x80 ? 0x80 : 0) | (v & 0x7f));
    if (k > 1) {
        if (!mxpi_buf_reserve(b, k - 1)) return;
        memmove(b->data + start + k - 1, b->data + start, n);
        b->len += k - 1;
    }
    memcpy(b->data + start - 1, len, k);
}

/* ---- packets ---- */

/* Track uuids are global to a trace: derive them from the pid, so traces of
 * several processes can be loaded together.  The mix is a bijection. */
static uint64_t uuid_of(const mxpi_out *o, uint64_t kind, uint32_t n) {
    uint64_t z = ((uint64_t)(uint32_t)o->pid << 32 | kind << 28 | (n & 0x0fffffffu)) + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return z ? z : 1; /* 0 is the implicit global track */
}

/* The implicit trace-global track.  An event must name it explicitly: one
 * without a track_uuid goes to a thread track in trace processor. */
#define GLOBAL_TRACK 0u

enum { UUID_PROCESS, UUID_THREAD, UUID_COUNTER, UUID_ASYNC };

/* A packet on sequence s->seq.  ts < 0: without a timestamp; else on the
 * process sequence an absolute MONOTONIC time, on a thread's the delta from
 * the sequence's last time (its TracePacketDefaults name CLOCK_DELTA_ID). */
static size_t packet_open(perfetto *s, int64_t ts, uint32_t flags) {
    mxpi_buf *b = &s->text;
    size_t p = msg_open(b, TRACE_PACKET);
    if (ts >= 0 && s->seq != PROCESS_SEQ) {
        put_uint(b, PK_TIMESTAMP, (uint64_t)(ts - s->last_ts));
        s->last_ts = ts;
    }
    put_uint(b, PK_SEQUENCE_ID, s->seq);
    if (ts >= 0 && s->seq == PROCESS_SEQ) {
        put_uint(b, PK_TIMESTAMP, (uint64_t)ts);
        put_uint(b, PK_CLOCK_ID, CLOCK_MONOTONIC_ID);
    }
    if (flags) put_uint(b, PK_SEQUENCE_FLAGS, flags);
    return p;
}

static void clock_put(mxpi_buf *b, uint32_t id, int64_t ns) {
    size_t c = msg_open(b, CS_CLOCKS);
    put_uint(b, CLOCK_ID, id);
    put_uint(b, CLOCK_TIMESTAMP, (uint64_t)ns);
    if (id == CLOCK_DELTA_ID) put_uint(b, CLOCK_IS_INCREMENTAL, 1);
    msg_close(b, c);
}

/* Start thread tid's sequence afresh: clear its incremental state (interned
 * names, defaults), make its events' track the thread's and their clock
 * CLOCK_DELTA_ID, and set that clock to the file's MONOTONIC base.  Every
 * snapshot pairs the same two values, so the MONOTONIC clock's snapshots
 * never go back in file order, whatever the batches' times. */
static void sequence_start(perfetto *s, const mxpi_out *o, uint32_t tid) {
    mxpi_buf *b = &s->text;
    s->seq = THREAD_SEQ + tid;
    s->batch++;
    size_t p = packet_open(s, -1, SEQ_INCREMENTAL_STATE_CLEARED);
    size_t d = msg_open(b, PK_DEFAULTS);
    put_uint(b, DEF_TIMESTAMP_CLOCK_ID, CLOCK_DELTA_ID);
    size_t t = msg_open(b, DEF_TRACK_EVENT);
    put_uint(b, TED_TRACK_UUID, uuid_of(o, UUID_THREAD, tid));
    msg_close(b, t);
    msg_close(b, d);
    msg_close(b, p);
    p = packet_open(s, -1, 0);
    size_t c = msg_open(b, PK_CLOCK_SNAPSHOT);
    clock_put(b, CLOCK_DELTA_ID, o->base_mono_ns);
    clock_put(b, CLOCK_MONOTONIC_ID, o->base_mono_ns);
    msg_close(b, c);
    msg_close(b, p);
    s->last_ts = o->base_mono_ns;
}

static void clock_snapshot(perfetto *s, const mxpi_out *o) {
    mxpi_buf *b = &s->text;
    size_t p = packet_open(s, -1, 0);
    size_t c = msg_open(b, PK_CLOCK_SNAPSHOT);
    clock_put(b, CLOCK_MONOTONIC_ID, o->base_mono_ns);
    clock_put(b, CLOCK_REALTIME_ID, o->base_wall_ns);
#ifdef CLOCK_BOOTTIME
    struct timespec t;
    if (clock_gettime(CLOCK_BOOTTIME, &t) == 0) {
        int64_t boot = (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
        clock_put(b, CLOCK_BOOTTIME_ID, o->base_mono_ns + (boot - mxpi_monotonic_ns()));
    }
#endif
    put_uint(b, CS_PRIMARY_TRACE_CLOCK, CLOCK_MONOTONIC_ID);
    msg_close(b, c);
    msg_close(b, p);
}

/* A track: what is TD_PROCESS (the one that clears the incremental
 * state), TD_THREAD (the trace tid's), TD_COUNTER, or 0: a named track of
 * the process (an async range's). */
static void track_put(perfetto *s, const mxpi_out *o, uint32_t what, uint64_t uuid, uint32_t tid,
                      const char *name, size_t len) {
    mxpi_buf *b = &s->text;
    size_t p = packet_open(s, -1, what == TD_PROCESS ? SEQ_INCREMENTAL_STATE_CLEARED : 0);
    size_t t = msg_open(b, PK_TRACK_DESCRIPTOR);
    put_uint(b, TD_UUID, uuid);
    if (what != TD_PROCESS) put_uint(b, TD_PARENT_UUID, s->proc_uuid);
    if (what == TD_COUNTER || what == 0) put_bytes(b, TD_NAME, name, len);
    if (what != 0) {
        size_t d = msg_open(b, what); /* CounterDescriptor stays empty */
        if (what != TD_COUNTER) put_uint(b, DESC_PID, (uint64_t)(int64_t)o->pid);
        if (what == TD_THREAD) put_uint(b, THD_TID, tid);
        if (what != TD_COUNTER) put_bytes(b, what == TD_THREAD ? THD_THREAD_NAME : PD_PROCESS_NAME, name, len);
        msg_close(b, d);
    }
    msg_close(b, t);
    msg_close(b, p);
}

static bool is_memory(uint32_t kind) { return kind == MXP_KIND_ALLOC || kind == MXP_KIND_FREE; }

/* The object's name and category, interned under its id.  Samples intern a
 * range's name on the process sequence once per file (the OBJ_INTERNED flag);
 * events intern theirs once per batch of their thread (batch_first). */
static void intern_put(mxpi_buf *b, uint32_t id) {
    const mxpi_object *obj = mxpi_obj(id);
    size_t e = msg_open(b, ID_EVENT_NAMES);
    put_uint(b, INTERNED_IID, id);
    size_t title_len;
    const char *title = mxpi_object_title(obj, &title_len);
    put_bytes(b, INTERNED_NAME, title, title_len);
    msg_close(b, e);
    e = msg_open(b, ID_EVENT_CATEGORIES);
    put_uint(b, INTERNED_IID, id);
    size_t c = msg_open(b, INTERNED_NAME); /* the same as Chrome's "cat" */
    mxpi_object_category(b, obj);
    msg_close(b, c);
    msg_close(b, e);
}

static void annotation(mxpi_buf *b, const char *name, uint32_t field, const char *s, size_t n, uint64_t v) {
    size_t a = msg_open(b, TE_DEBUG_ANNOTATIONS);
    put_bytes(b, DA_NAME, name, strlen(name));
    if (s != NULL)
        put_bytes(b, field, s, n);
    else
        put_uint(b, field, v);
    msg_close(b, a);
}

/* Whether the file lacks the object's flag bit (OBJ_*) so far; sets it. */
static bool first_use(perfetto *s, uint32_t id, uint8_t bit) {
    if (s->work[id] & bit) return false;
    s->work[id] |= bit;
    if (id >= s->top) s->top = id + 1;
    return true;
}

/* Whether the object's name is new to the sequence's batch; marks it. */
static bool batch_first(perfetto *s, uint32_t id) {
    if (s->stamp[id] == s->batch) return false;
    s->stamp[id] = s->batch;
    return true;
}

/* One event on the thread's sequence (sequence_start came first).  Its time
 * is a delta; its track is the thread's by default, named only when it is
 * another (an async range's, a counter's, the process's or the global one).
 * A name is interned by the packet that first uses it in the batch.  The
 * common events (begins and ends without arguments, counter samples) take
 * the fast path: one reservation, a local pointer, lengths known to fit in
 * a byte. */
static void event_put(perfetto *s, const mxpi_out *o, const item *it, uint32_t type) {
    mxpi_buf *b = &s->text;
    const mxpi_object *obj = mxpi_obj(it->id);
    uint64_t track = 0;
    bool other_track = false;
    bool range = type == TYPE_SLICE_BEGIN || type == TYPE_SLICE_END;
    if (range && (it->aux & MXPI_AUX_ASYNC)) {
        track = uuid_of(o, UUID_ASYNC, it->lane);
        other_track = true;
        if (type == TYPE_SLICE_BEGIN) {
            size_t len;
            const char *title = mxpi_object_title(obj, &len);
            track_put(s, o, 0, track, 0, title, len);
        }
    } else if (type == TYPE_COUNTER) {
        track = uuid_of(o, UUID_COUNTER, it->id);
        other_track = true;
        if (first_use(s, it->id, OBJ_TRACK)) track_put(s, o, TD_COUNTER, track, 0, obj->name, obj->name_len);
    } else if (type == TYPE_INSTANT && obj->kind == MXP_KIND_MARKER) {
        if (it->aux == MXP_SCOPE_GLOBAL) track = GLOBAL_TRACK, other_track = true;
        if (it->aux == MXP_SCOPE_PROCESS) track = s->proc_uuid, other_track = true;
    }
    bool named = type != TYPE_SLICE_END && type != TYPE_COUNTER;
    bool intern = named && batch_first(s, it->id);
    bool annotated = type == TYPE_INSTANT ||
                     (type == TYPE_SLICE_BEGIN && (obj->kind == MXP_KIND_FRAME || (it->aux & MXPI_AUX_CUT)));
    if (!intern && !annotated) {
        /* Packet content: at most 10 + 2 + 2 + 2 + (2 + 11 + 13 + 12) bytes. */
        if (!mxpi_buf_reserve(b, 80)) return;
        uint8_t *head = (uint8_t *)b->data + b->len, *p = head + 2;
        *p++ = TAG_TIMESTAMP;
        p = pv(p, (uint64_t)(it->ts - s->last_ts));
        s->last_ts = it->ts;
        *p++ = TAG_SEQ;
        p = pv(p, s->seq);
        if (named) {
            *p++ = TAG_FLAGS;
            *p++ = SEQ_NEEDS_INCREMENTAL_STATE;
        }
        *p++ = TAG_TRACK_EVENT;
        uint8_t *te = p++;
        *p++ = TAG_TYPE;
        *p++ = (uint8_t)type;
        if (other_track) {
            *p++ = TAG_TRACK_UUID;
            p = pv(p, track);
        }
        if (type == TYPE_COUNTER) {
            p = pv(p, (uint64_t)TE_COUNTER_VALUE << 3);
            p = pv(p, (uint64_t)it->v);
        }
        if (named) {
            *p++ = TAG_NAME_IID;
            p = pv(p, it->id);
            *p++ = TAG_CATEGORY_IIDS;
            p = pv(p, it->id);
        }
        *te = (uint8_t)(p - te - 1);
        head[0] = TAG_PACKET;
        head[1] = (uint8_t)(p - head - 2);
        b->len = (size_t)((char *)p - b->data);
        return;
    }
    size_t p = packet_open(s, it->ts, named ? SEQ_NEEDS_INCREMENTAL_STATE : 0);
    if (intern) {
        size_t d = msg_open(b, PK_INTERNED_DATA);
        intern_put(b, it->id);
        msg_close(b, d);
    }
    size_t e = msg_open(b, PK_TRACK_EVENT);
    put_uint(b, TE_TYPE, type);
    if (other_track) put_uint(b, TE_TRACK_UUID, track);
    if (type == TYPE_COUNTER) put_uint(b, TE_COUNTER_VALUE, (uint64_t)it->v);
    if (named) {
        put_uint(b, TE_NAME_IID, it->id);
        put_uint(b, TE_CATEGORY_IIDS, it->id);
    }
    if (type == TYPE_INSTANT && is_memory(obj->kind)) {
        annotation(b, "device", DA_STRING_VALUE, obj->domain, obj->domain_len, 0);
        annotation(b, "attribute", DA_STRING_VALUE, obj->name, obj->name_len, 0);
        annotation(b, "bytes", DA_INT_VALUE, NULL, 0, (uint64_t)it->v);
    } else if (type == TYPE_INSTANT) {
        const char *scope = mxpi_scope_name(it->aux);
        annotation(b, "scope", DA_STRING_VALUE, scope, strlen(scope), 0);
    }
    if (type == TYPE_SLICE_BEGIN && obj->kind == MXP_KIND_FRAME)
        annotation(b, "frame", DA_UINT_VALUE, NULL, 0, it->aux & MXPI_AUX_INDEX);
    if (type == TYPE_SLICE_BEGIN && (it->aux & MXPI_AUX_CUT))
        annotation(b, "cut_short", DA_UINT_VALUE, NULL, 0, 1);
    msg_close(b, e);
    msg_close(b, p);
}

/* ---- bookkeeping ---- */

static bool drain_text(mxpi_out *o, perfetto *s) {
    if (s->text.failed) {
        o->err = ENOMEM;
        return false;
    }
    bool ok = mxpi_pwrite_all(o, s->text.data, s->text.len, &s->off);
    s->text.len = 0;
    return ok;
}

static thr *thr_of(perfetto *s, uint32_t tid) {
    if (tid >= s->nthr) {
        uint32_t n = s->nthr ? s->nthr : 16;
        while (n <= tid) n *= 2;
        thr *p = realloc(s->thr, n * sizeof *p);
        if (p == NULL) return NULL;
        memset(p + s->nthr, 0, (n - s->nthr) * sizeof *p);
        s->thr = p;
        s->nthr = n;
    }
    return &s->thr[tid];
}

typedef struct visit {
    perfetto *s;
    const mxpi_out *o;
    uint32_t only; /* 0: every thread */
} visit;

/* Write the thread's track unless the file has it under this name already. */
static bool thread_put(perfetto *s, const mxpi_out *o, uint32_t tid, const char *name, size_t len) {
    thr *t = thr_of(s, tid);
    if (t == NULL) return false;
    const char *last = t->next ? t->next : t->name;
    size_t last_len = t->next ? t->next_len : t->len;
    if (last != NULL && last_len == len && memcmp(last, name, len) == 0) return true;
    char *copy = mxpi_dup(name, len);
    if (copy == NULL) return false;
    free(t->next);
    t->next = copy;
    t->next_len = len;
    track_put(s, o, TD_THREAD, uuid_of(o, UUID_THREAD, tid), tid, name, len);
    return true;
}

/* Runs under names_lock; a failure marks the text failed. */
static void thread_visit(void *arg, uint32_t tid, int64_t os_tid, const char *name, size_t len) {
    visit *v = arg;
    if (v->only && tid != v->only) return;
    char unnamed[40];
    if (name == NULL) {
        len = (size_t)snprintf(unnamed, sizeof unnamed, "thread %lld", (long long)os_tid);
        name = unnamed;
    }
    if (!thread_put(v->s, v->o, tid, name, len)) v->s->text.failed = true;
}

static int cmp_i64(int64_t a, int64_t b) { return (a > b) - (a < b); }

/* At one timestamp: ends, then instants, then begins. */
static int rank(uint32_t what) {
    return what == TYPE_SLICE_END ? 0 : what == TYPE_SLICE_BEGIN || what == EV_ZERO ? 2 : 1;
}

/* File order that nests: by time; among ends, the one that began later
 * first; among begins, the longer first (a zero-length range, written as
 * begin and end together, last); equal ranges by arrival, which is end order,
 * so the outer one opens first and closes last. */
static int item_cmp(const void *pa, const void *pb) {
    const item *a = pa, *b = pb;
    int c = cmp_i64(a->ts, b->ts);
    if (c == 0) c = rank(a->what) - rank(b->what);
    if (c != 0) return c;
    switch (rank(a->what)) {
    case 0:
        c = cmp_i64(b->ts - b->v, a->ts - a->v);
        return c ? c : cmp_i64(a->seq, b->seq);
    case 2:
        c = cmp_i64(b->v, a->v);
        return c ? c : cmp_i64(b->seq, a->seq);
    default: return cmp_i64(a->seq, b->seq);
    }
}

/* Write the batch: the thread's track, then the events in nesting order. */
static bool batch_write(mxpi_out *o, perfetto *s) {
    mxpi_buf *b = &s->text;
    sequence_start(s, o, s->tid);
    visit v = {s, o, s->tid};
    mxpi_thread_info(s->tid, thread_visit, &v);
    if (b->failed) {
        o->err = ENOMEM;
        return false;
    }
    /* Records of ranges that do not nest (most of a busy thread's) come in
     * file order already (note_order looked as they came). */
    if (s->unsorted) qsort(s->items, s->n, sizeof *s->items, item_cmp);
    s->unsorted = false;
    size_t i;
    for (i = 0; i < s->n; i++) {
        const item *it = &s->items[i];
        event_put(s, o, it, it->what == EV_ZERO ? TYPE_SLICE_BEGIN : it->what);
        if (it->what == EV_ZERO) event_put(s, o, it, TYPE_SLICE_END);
        if (b->len >= WRITE_THRESHOLD && !drain_text(o, s)) return false;
    }
    s->n = 0;
    return !b->failed || drain_text(o, s); /* drain_text reports the failure */
}

/* Whether the item just added breaks file order; looked at while the two
 * are in cache, so that batch_write sorts only a batch that needs it. */
static inline void note_order(perfetto *s) {
    if (s->n < 2 || s->unsorted) return;
    const item *a = &s->items[s->n - 2], *z = &s->items[s->n - 1];
    if (a->ts < z->ts) return; /* the common case, without a call */
    if (a->ts > z->ts || item_cmp(a, z) > 0) s->unsorted = true;
}

static void forget_next(perfetto *s) {
    for (uint32_t i = 0; i < s->nthr; i++) {
        free(s->thr[i].next);
        s->thr[i].next = NULL;
    }
}

/* ---- samples ---- */

/* Whether callstack iid key is new to the file (marked for this flush);
 * false with *failed on allocation failure.  Open addressing, key != 0. */
static bool stack_first(perfetto *s, uint64_t key, bool *failed) {
    if (2 * (s->stacks.used + 1) > s->stacks.n) {
        size_t n = s->stacks.n ? 2 * s->stacks.n : 1024;
        uint64_t *k = calloc(n, sizeof *k);
        uint8_t *st = calloc(n, 1);
        if (k == NULL || st == NULL) {
            free(k);
            free(st);
            *failed = true;
            return false;
        }
        for (size_t i = 0; i < s->stacks.n; i++) {
            if (!s->stacks.key[i]) continue;
            size_t j = (size_t)(s->stacks.key[i] * 0x9e3779b97f4a7c15ull) & (n - 1);
            while (k[j]) j = (j + 1) & (n - 1);
            k[j] = s->stacks.key[i];
            st[j] = s->stacks.st[i];
        }
        free(s->stacks.key);
        free(s->stacks.st);
        s->stacks.key = k;
        s->stacks.st = st;
        s->stacks.n = n;
    }
    size_t j = (size_t)(key * 0x9e3779b97f4a7c15ull) & (s->stacks.n - 1);
    while (s->stacks.key[j] && s->stacks.key[j] != key) j = (j + 1) & (s->stacks.n - 1);
    if (s->stacks.key[j] && s->stacks.st[j]) return false;
    if (!s->stacks.key[j]) s->stacks.used++;
    s->stacks.key[j] = key;
    s->stacks.st[j] = 2;
    return true;
}

static void stacks_settle(perfetto *s, bool keep) {
    for (size_t i = 0; i < s->stacks.n; i++)
        if (s->stacks.st[i] == 2) s->stacks.st[i] = keep ? 1 : 0;
}

static void frame_intern(perfetto *s, uint32_t id, const mxpi_sframe *f) {
    mxpi_buf *b = &s->text;
    size_t e = msg_open(b, ID_FUNCTION_NAMES);
    put_uint(b, INTERNED_IID, id);
    size_t t = msg_open(b, INTERNED_NAME);
    mxpi_buf_put(b, f->name, f->name_len);
    mxpi_buf_puts(b, " (");
    mxpi_buf_put(b, f->file, f->file_len);
    mxpi_buf_putc(b, ':');
    mxpi_buf_u64(b, f->line);
    mxpi_buf_putc(b, ')');
    msg_close(b, t);
    msg_close(b, e);
    e = msg_open(b, ID_FRAMES);
    put_uint(b, INTERNED_IID, id);
    put_uint(b, FR_FUNCTION_NAME_ID, id);
    put_uint(b, FR_MAPPING_ID, 1);
    put_uint(b, FR_REL_PC, id);
    msg_close(b, e);
}

/* One PerfSample packet on thread tid (the thread's track first, if new). */
static bool sample_put(perfetto *s, const mxpi_out *o, const mxpi_rec *r) {
    mxpi_buf *b = &s->text;
    uint32_t tid = r->aux, stack = (uint32_t)((uint64_t)r->val & 0xffffffffu);
    uint32_t range = (uint32_t)((uint64_t)r->val >> 32);
    const mxpi_snode *leaf = mxpi_snode_get(stack);
    if (leaf == NULL) return true; /* cannot happen: the core checked it */
    bool failed = false, has_range = range != MXPI_SAMPLE_NO_RANGE && range < mxp_object_count();
    mxpi_thread_mark_used(tid);
    visit v = {s, o, tid};
    mxpi_thread_info(tid, thread_visit, &v);
    if (leaf->depth > s->path_cap) {
        uint32_t *p = realloc(s->path, leaf->depth * sizeof *p);
        if (p == NULL) return false;
        s->path = p;
        s->path_cap = leaf->depth;
    }
    uint32_t depth = 0;
    for (const mxpi_snode *n = leaf; n != NULL && depth < leaf->depth; n = mxpi_snode_get(n->parent))
        s->path[leaf->depth - 1 - depth++] = n->frame;
    uint64_t key = (uint64_t)(has_range ? range + 1u : 0u) << 32 | stack;
    int64_t ts = o->base_mono_ns + mxpi_tb_span(&o->tb, r->ts - o->epoch_ticks);
    size_t p = packet_open(s, ts, SEQ_NEEDS_INCREMENTAL_STATE);
    if (stack_first(s, key, &failed)) {
        size_t d = msg_open(b, PK_INTERNED_DATA);
        if (mxpi_seen_first(&s->frames, 0, &failed)) {
            size_t m = msg_open(b, ID_MAPPINGS);
            put_uint(b, INTERNED_IID, 1);
            msg_close(b, m);
        }
        for (uint32_t i = 0; i < depth; i++)
            if (mxpi_seen_first(&s->frames, s->path[i], &failed))
                frame_intern(s, s->path[i], mxpi_sframe_get(s->path[i]));
        if (has_range && first_use(s, range, OBJ_INTERNED)) intern_put(b, range);
        size_t c = msg_open(b, ID_CALLSTACKS);
        put_uint(b, INTERNED_IID, key);
        for (uint32_t i = 0; i < depth; i++) put_uint(b, CSK_FRAME_IDS, s->path[i]);
        msg_close(b, c);
        msg_close(b, d);
    }
    size_t e = msg_open(b, PK_PERF_SAMPLE);
    put_uint(b, PS_PID, (uint64_t)(int64_t)o->pid);
    put_uint(b, PS_TID, tid);
    put_uint(b, PS_CALLSTACK_IID, key);
    msg_close(b, e);
    msg_close(b, p);
    return !failed && !b->failed;
}

/* ---- the format interface ---- */

static bool create(mxpi_out *o) {
    perfetto *s = calloc(1, sizeof *s);
    if (s == NULL) {
        o->err = ENOMEM;
        return false;
    }
    o->state = s;
    s->done = calloc(MXP_MAX_OBJECTS, 1);
    s->work = calloc(MXP_MAX_OBJECTS, 1);
    s->stamp = calloc(MXP_MAX_OBJECTS, sizeof *s->stamp);
    if (s->done == NULL || s->work == NULL || s->stamp == NULL) {
        o->err = ENOMEM;
        return false;
    }
    s->seq = PROCESS_SEQ;
    s->proc_uuid = uuid_of(o, UUID_PROCESS, 0);
    clock_snapshot(s, o);
    track_put(s, o, TD_PROCESS, s->proc_uuid, 0, o->process_name, o->process_name_len);
    if (!drain_text(o, s)) return false;
    s->end = s->off;
    return true;
}

static bool begin(mxpi_out *o) {
    perfetto *s = o->state;
    s->off = s->end;
    s->text.len = 0;
    s->text.failed = false;
    s->n = 0;
    s->unsorted = false;
    s->tid = 0;
    s->seq = PROCESS_SEQ;
    memcpy(s->work, s->done, s->top);
    forget_next(s);
    return true;
}

static bool record(mxpi_out *o, const mxpi_rec *r, uint32_t tid) {
    perfetto *s = o->state;
    if (r->id == MXPI_SAMPLE_ID) {
        if (s->n && !batch_write(o, s)) return false;
        s->seq = PROCESS_SEQ;
        if (!sample_put(s, o, r)) {
            o->err = ENOMEM;
            return false;
        }
        return s->text.len < WRITE_THRESHOLD || drain_text(o, s);
    }
    if ((tid != s->tid || s->n + 2 > BATCH_MAX) && s->n && !batch_write(o, s)) return false;
    s->tid = tid;
    if (s->n + 2 > s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 1024;
        item *p = realloc(s->items, cap * sizeof *p);
        if (p == NULL) {
            o->err = ENOMEM;
            return false;
        }
        s->items = p;
        s->cap = cap;
    }
    int64_t ts = o->base_mono_ns + mxpi_tb_span(&o->tb, r->ts - o->epoch_ticks);
    item it = {ts, r->val, r->id, r->aux, (uint32_t)s->n, TYPE_COUNTER, 0, 0};
    uint32_t kind = mxpi_obj(r->id)->kind;
    if (kind == MXP_KIND_MARKER || is_memory(kind)) {
        it.what = TYPE_INSTANT;
    } else if (kind != MXP_KIND_COUNTER) {
        int64_t dur = mxpi_tb_span(&o->tb, r->val);
        it.v = dur > 0 ? dur : 0;
        it.what = dur > 0 ? TYPE_SLICE_BEGIN : EV_ZERO;
        if (r->aux & MXPI_AUX_ASYNC) it.lane = ++s->lanes;
        if (dur > 0) { /* the begin here, the end below */
            s->items[s->n++] = it;
            note_order(s);
            it.ts += dur;
            it.what = TYPE_SLICE_END;
        }
    }
    s->items[s->n++] = it;
    note_order(s);
    return true;
}

static bool end(mxpi_out *o) {
    perfetto *s = o->state;
    if (s->n && !batch_write(o, s)) return false;
    s->seq = PROCESS_SEQ;
    visit v = {s, o, 0}; /* threads renamed since their last track */
    mxpi_threads_used(thread_visit, &v);
    if (!drain_text(o, s)) return false;
    if (o->regular && ftruncate(o->fd, (off_t)s->off) != 0) {
        o->err = errno;
        return false;
    }
    return true;
}

static void commit(mxpi_out *o) {
    perfetto *s = o->state;
    s->end = s->off;
    uint8_t *swap = s->done;
    s->done = s->work;
    s->work = swap;
    mxpi_seen_settle(&s->frames, true);
    stacks_settle(s, true);
    for (uint32_t i = 0; i < s->nthr; i++) {
        thr *t = &s->thr[i];
        if (t->next == NULL) continue;
        free(t->name);
        t->name = t->next;
        t->len = t->next_len;
        t->next = NULL;
    }
}

static void restore(mxpi_out *o) {
    perfetto *s = o->state;
    if (s == NULL) return;
    if (o->regular && ftruncate(o->fd, (off_t)s->end) != 0 && o->err == 0) o->err = errno;
    forget_next(s);
    mxpi_seen_settle(&s->frames, false);
    stacks_settle(s, false);
    s->n = 0;
    s->unsorted = false;
}

static void release(mxpi_out *o) {
    perfetto *s = o->state;
    if (s == NULL) return;
    forget_next(s);
    for (uint32_t i = 0; i < s->nthr; i++) free(s->thr[i].name);
    free(s->thr);
    free(s->done);
    free(s->work);
    free(s->stamp);
    free(s->items);
    mxpi_seen_free(&s->frames);
    free(s->stacks.key);
    free(s->stacks.st);
    free(s->path);
    mxpi_buf_free(&s->text);
    free(s);
    o->state = NULL;
}

const mxpi_format mxpi_perfetto = {"perfetto", create, begin, record, end, commit, restore, release};
