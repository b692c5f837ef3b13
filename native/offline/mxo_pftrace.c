/*
 * mxo_pftrace.c -- see mxo_pftrace.h: the slice begins and ends of the
 * core's compact Perfetto encoding, paired per track into mxo_reader rows.
 */
#include "mxo_pftrace.h"

#include <stdlib.h>
#include <string.h>

#define ROW_LIMIT ((size_t)1 << 15) /* rows handed on at a time (about 1.3 MB) */
#define CACHE_MAX ((size_t)1 << 16) /* iid pairs cached at most: then forgotten */

enum { PACKET = 0x0a, TIMESTAMP = 0x40, SEQ = 0x50, FLAGS = 0x68, TRACK_EVENT = 0x5a };
enum { TYPE = 0x48, NAME_IID = 0x50, CATEGORY_IIDS = 0x18, TRACK_UUID = 0x58 };
enum { COUNTER_VALUE_0 = 0xf0, COUNTER_VALUE_1 = 0x01 }; /* field 30, a varint: two bytes */
enum { SLICE_BEGIN = 1, SLICE_END = 2, COUNTER = 4, INCREMENTAL_STATE_CLEARED = 1 };
/* A counter's value rides in its row's args (MXO_COUNTER_ARGS): 64 bits. */
#define COUNTERS (SIZE_MAX >= UINT64_MAX)

mxo_pf *mxo_pf_new(void)
{
    mxo_pf *pf = calloc(1, sizeof(mxo_pf));
    if (pf != NULL)
        pf->row_limit = ROW_LIMIT;
    return pf;
}

void mxo_pf_free(mxo_pf *pf)
{
    if (pf == NULL)
        return;
    for (int32_t s = 0; s < pf->n_stacks; s++)
        free(pf->stacks[s].ts), free(pf->stacks[s].ref);
    free(pf->stacks);
    free(pf->p_text), free(pf->p_name_len), free(pf->p_cat_len), free(pf->p_key), free(pf->p_ph);
    free(pf->arena);
    free(pf->c_name), free(pf->c_cat), free(pf->c_proto);
    free(pf->t_uuid), free(pf->t_proto), free(pf->t_thread);
    free(pf);
}

/* ---- stacks ---- */

int32_t mxo_pf_stack_new(mxo_pf *pf)
{
    if (pf == NULL)
        return MXO_ERR_ARG;
    if (pf->n_stacks == INT32_MAX)
        return MXO_ERR_MEMORY;
    if (pf->n_stacks == pf->stacks_cap) {
        size_t cap = mxo_doubled((size_t)pf->stacks_cap, (size_t)pf->n_stacks + 1);
        if (cap > INT32_MAX || mxo_grow((void **)&pf->stacks, cap, sizeof(mxo_pf_stack)))
            return MXO_ERR_MEMORY;
        pf->stacks_cap = (int32_t)cap;
    }
    memset(&pf->stacks[pf->n_stacks], 0, sizeof(mxo_pf_stack));
    return pf->n_stacks++;
}

int mxo_pf_push(mxo_pf *pf, int32_t stack, int64_t ts, int64_t ref)
{
    if (pf == NULL || stack < 0 || stack >= pf->n_stacks)
        return MXO_ERR_ARG;
    mxo_pf_stack *s = &pf->stacks[stack];
    if (s->n == s->cap) {
        size_t cap = mxo_doubled(s->cap, s->n + 1);
        if (mxo_grow((void **)&s->ts, cap, 8) || mxo_grow((void **)&s->ref, cap, 8))
            return MXO_ERR_MEMORY;
        s->cap = cap;
    }
    s->ts[s->n] = ts;
    s->ref[s->n] = ref;
    s->n++;
    pf->open++;
    return 0;
}

/* 1 and the top entry (removed), or 0 where the stack is empty. */
int mxo_pf_pop(mxo_pf *pf, int32_t stack, int64_t *ts, int64_t *ref)
{
    if (pf == NULL || stack < 0 || stack >= pf->n_stacks || ts == NULL || ref == NULL)
        return MXO_ERR_ARG;
    mxo_pf_stack *s = &pf->stacks[stack];
    if (s->n == 0)
        return 0;
    s->n--;
    pf->open--;
    *ts = s->ts[s->n];
    *ref = s->ref[s->n];
    return 1;
}

/* ---- protos: (name, category) pairs, their keys made at their first row ---- */

int32_t mxo_pf_proto(mxo_pf *pf, const char *name, size_t name_len, const char *cat, size_t cat_len,
                     char ph)
{
    if (pf == NULL || (name_len && name == NULL) || (cat_len && cat == NULL))
        return MXO_ERR_ARG;
    if (pf->n_protos >= INT32_MAX)
        return MXO_ERR_MEMORY;
    if (pf->n_protos == pf->protos_cap) {
        size_t cap = mxo_doubled(pf->protos_cap, pf->n_protos + 1);
        if (mxo_grow((void **)&pf->p_text, cap, sizeof(size_t))
            || mxo_grow((void **)&pf->p_name_len, cap, sizeof(size_t))
            || mxo_grow((void **)&pf->p_cat_len, cap, sizeof(size_t))
            || mxo_grow((void **)&pf->p_key, cap, 4) || mxo_grow((void **)&pf->p_ph, cap, 1))
            return MXO_ERR_MEMORY;
        pf->protos_cap = cap;
    }
    size_t need = pf->arena_len + name_len;
    if (need < pf->arena_len || need + cat_len < need)
        return MXO_ERR_MEMORY;
    need += cat_len;
    if (need > pf->arena_cap || pf->arena == NULL) { /* (never NULL: offsets from it) */
        size_t cap = mxo_doubled(pf->arena_cap, need);
        if (mxo_grow((void **)&pf->arena, cap, 1))
            return MXO_ERR_MEMORY;
        pf->arena_cap = cap;
    }
    size_t p = pf->n_protos;
    pf->p_text[p] = pf->arena_len;
    pf->p_name_len[p] = name_len;
    pf->p_cat_len[p] = cat_len;
    pf->p_key[p] = -1;
    pf->p_ph[p] = ph;
    if (name_len)
        memcpy(pf->arena + pf->arena_len, name, name_len);
    if (cat_len)
        memcpy(pf->arena + pf->arena_len + name_len, cat, cat_len);
    pf->arena_len = need;
    pf->n_protos++;
    return (int32_t)p;
}

/* ---- the sequence's iid pairs -> protos ---- */

static size_t iid_slot(uint64_t name, uint64_t cat, size_t cap)
{
    uint64_t h = name * 0x9e3779b97f4a7c15ull ^ cat * 0xc2b2ae3d27d4eb4full;
    return (size_t)(h ^ (h >> 29)) & (cap - 1);
}

/* The proto of (name, cat), or -1. */
static int32_t cached(const mxo_pf *pf, uint64_t name, uint64_t cat)
{
    if (pf->c_cap == 0)
        return -1;
    size_t mask = pf->c_cap - 1;
    for (size_t at = iid_slot(name, cat, pf->c_cap); pf->c_proto[at] != 0; at = (at + 1) & mask)
        if (pf->c_name[at] == name && pf->c_cat[at] == cat)
            return pf->c_proto[at] - 1;
    return -1;
}

void mxo_pf_uncache(mxo_pf *pf)
{
    if (pf != NULL && pf->c_n) {
        memset(pf->c_proto, 0, pf->c_cap * sizeof *pf->c_proto);
        pf->c_n = 0;
    }
    if (pf != NULL && pf->t_n) {
        memset(pf->t_proto, 0, pf->t_cap * sizeof *pf->t_proto);
        pf->t_n = 0;
    }
}

/* The counter track's proto and thread; 0 where it is not cached. */
static int cached_track(const mxo_pf *pf, uint64_t track, int32_t *proto, int32_t *thread)
{
    if (pf->t_cap == 0)
        return 0;
    size_t mask = pf->t_cap - 1;
    for (size_t at = iid_slot(track, 0, pf->t_cap); pf->t_proto[at] != 0; at = (at + 1) & mask)
        if (pf->t_uuid[at] == track) {
            *proto = pf->t_proto[at] - 1;
            *thread = pf->t_thread[at];
            return 1;
        }
    return 0;
}

/* A counter track's (uuid) name, as a proto of phase C, and its thread (pid, tid). */
int mxo_pf_cache_track(mxo_reader *r, mxo_pf *pf, uint64_t track, int32_t proto, int64_t pid,
                       int64_t tid)
{
    if (r == NULL || pf == NULL || proto < 0 || (size_t)proto >= pf->n_protos)
        return MXO_ERR_ARG;
    int32_t t = mxo_thread_add(r, pid, tid);
    if (t < 0)
        return t;
    if (pf->t_n >= CACHE_MAX) /* a hostile file's many tracks: start again */
        mxo_pf_uncache(pf);
    if (pf->t_n * 2 + 2 > pf->t_cap) {
        size_t cap = mxo_doubled(pf->t_cap ? pf->t_cap * 2 : 64, pf->t_n * 2 + 2);
        uint64_t *uuids = calloc(cap, 8);
        int32_t *protos = calloc(cap, 4), *threads = calloc(cap, 4);
        if (uuids == NULL || protos == NULL || threads == NULL) {
            free(uuids), free(protos), free(threads);
            return MXO_ERR_MEMORY;
        }
        for (size_t i = 0; i < pf->t_cap; i++) {
            if (pf->t_proto[i] == 0)
                continue;
            size_t at = iid_slot(pf->t_uuid[i], 0, cap);
            while (protos[at] != 0)
                at = (at + 1) & (cap - 1);
            uuids[at] = pf->t_uuid[i], protos[at] = pf->t_proto[i], threads[at] = pf->t_thread[i];
        }
        free(pf->t_uuid), free(pf->t_proto), free(pf->t_thread);
        pf->t_uuid = uuids, pf->t_proto = protos, pf->t_thread = threads;
        pf->t_cap = cap;
    }
    size_t at = iid_slot(track, 0, pf->t_cap);
    for (; pf->t_proto[at] != 0; at = (at + 1) & (pf->t_cap - 1))
        if (pf->t_uuid[at] == track)
            break;
    if (pf->t_proto[at] == 0)
        pf->t_n++;
    pf->t_uuid[at] = track, pf->t_proto[at] = proto + 1, pf->t_thread[at] = t;
    return 0;
}

int mxo_pf_cache(mxo_pf *pf, uint64_t name_iid, uint64_t cat_iid, int32_t proto)
{
    if (pf == NULL || proto < 0 || (size_t)proto >= pf->n_protos)
        return MXO_ERR_ARG;
    if (pf->c_n >= CACHE_MAX) /* a hostile file's many iids: start again */
        mxo_pf_uncache(pf);
    if (pf->c_n * 2 + 2 > pf->c_cap) {
        size_t cap = mxo_doubled(pf->c_cap ? pf->c_cap * 2 : 64, pf->c_n * 2 + 2);
        uint64_t *names = calloc(cap, 8), *cats = calloc(cap, 8);
        int32_t *protos = calloc(cap, 4);
        if (names == NULL || cats == NULL || protos == NULL) {
            free(names), free(cats), free(protos);
            return MXO_ERR_MEMORY;
        }
        for (size_t i = 0; i < pf->c_cap; i++) {
            if (pf->c_proto[i] == 0)
                continue;
            size_t at = iid_slot(pf->c_name[i], pf->c_cat[i], cap);
            while (protos[at] != 0)
                at = (at + 1) & (cap - 1);
            names[at] = pf->c_name[i], cats[at] = pf->c_cat[i], protos[at] = pf->c_proto[i];
        }
        free(pf->c_name), free(pf->c_cat), free(pf->c_proto);
        pf->c_name = names, pf->c_cat = cats, pf->c_proto = protos;
        pf->c_cap = cap;
    }
    size_t at = iid_slot(name_iid, cat_iid, pf->c_cap);
    for (; pf->c_proto[at] != 0; at = (at + 1) & (pf->c_cap - 1))
        if (pf->c_name[at] == name_iid && pf->c_cat[at] == cat_iid)
            break;
    if (pf->c_proto[at] == 0)
        pf->c_n++;
    pf->c_name[at] = name_iid, pf->c_cat[at] = cat_iid, pf->c_proto[at] = proto + 1;
    return 0;
}

int mxo_pf_thread(mxo_reader *r, mxo_pf *pf, int64_t pid, int64_t tid)
{
    if (r == NULL || pf == NULL)
        return MXO_ERR_ARG;
    int32_t t = mxo_thread_add(r, pid, tid);
    if (t < 0)
        return t;
    pf->thread = t;
    return 0;
}

/* ---- the packets ---- */

/* A varint of data[*p, end) whose value fits 64 bits and whose bytes are at
 * most 10 (perfetto.py's _varint reads no more); 0 otherwise. */
static int varint(const unsigned char *data, size_t end, size_t *p, uint64_t *out)
{
    uint64_t v = 0;
    size_t q = *p;
    for (unsigned shift = 0; shift < 70; shift += 7) {
        if (q >= end)
            return 0;
        unsigned char b = data[q++];
        if (shift == 63 && (b & 0x7e))
            return 0; /* past 64 bits (or a longer varint) */
        v |= (uint64_t)(b & 0x7f) << shift;
        if (b < 0x80) {
            *p = q;
            *out = v;
            return 1;
        }
    }
    return 0;
}

/* One tag byte at data[*p] (< end) equal to tag; then past it. */
static int tag(const unsigned char *data, size_t end, size_t *p, unsigned char t)
{
    if (*p >= end || data[*p] != t)
        return 0;
    (*p)++;
    return 1;
}

/* A row of a proto's key (made now if new: keys come in the order of their
 * first rows) on thread t; its args (args_len 0: none; see mxo_read.h). */
static int row_out(mxo_reader *r, mxo_pf *pf, int64_t ts, int64_t dur, size_t proto, int32_t t,
                   size_t args, size_t args_len)
{
    int32_t k = pf->p_key[proto];
    if (k < 0) {
        const char *text = pf->arena + pf->p_text[proto];
        k = mxo_key_add(r, text, pf->p_name_len[proto], text + pf->p_name_len[proto],
                        pf->p_cat_len[proto], pf->p_ph[proto], r->n);
        if (k < 0)
            return k;
        pf->p_key[proto] = k;
    }
    if (mxo_row_room(r) < 0)
        return MXO_ERR_MEMORY;
    r->ts[r->n] = ts;
    r->dur[r->n] = dur;
    r->key[r->n] = k;
    r->thread[r->n] = t;
    r->args[r->n] = args;
    r->args_len[r->n] = args_len;
    r->n++;
    return 0;
}

/* An event Python decoded, to the rows after the ones before it (so every
 * thread's events and the keys stay in file order): ts, dur (MXO_NO_DUR for
 * a point; else 0 or more) within +-MXO_PF_TS_LIMIT, a proto (its ph the
 * event's), held: 0, or its args' index in the caller's list + 1.  Returns
 * MXO_PF_FULL once there are row_limit rows (hand them on), else 0. */
int mxo_pf_put(mxo_reader *r, mxo_pf *pf, int64_t pid, int64_t tid, int64_t ts, int64_t dur,
               int32_t proto, size_t held)
{
    if (r == NULL || pf == NULL || proto < 0 || (size_t)proto >= pf->n_protos
        || ts >= MXO_PF_TS_LIMIT || ts <= -MXO_PF_TS_LIMIT
        || (dur != MXO_NO_DUR && (dur < 0 || dur >= MXO_PF_TS_LIMIT)) || held == MXO_HELD_ARGS)
        return MXO_ERR_ARG;
    int32_t t = mxo_thread_add(r, pid, tid);
    if (t < 0)
        return t;
    size_t args = held ? held - 1 : 0, args_len = held ? MXO_HELD_ARGS : 0;
    int rc = row_out(r, pf, ts, dur, (size_t)proto, t, args, args_len);
    return rc < 0 ? rc : r->n >= pf->row_limit ? MXO_PF_FULL : 0;
}

/*
 * The packets of data from *pos on, while they are begins, ends and counter
 * samples of pf->seq in the shapes mxo_pftrace.h gives: each taken whole (its time
 * added to pf->now, pf->count counted, *pos past it).  Returns why it
 * stopped: MXO_PF_STOP at a packet it does not take (*pos there; also at
 * the end of the data, or a packet cut by it), MXO_PF_MISS at a begin
 * whose iids are not cached (pf->miss_name, pf->miss_cat), MXO_PF_MISS_TRACK
 * at a counter sample whose track is not (pf->miss_track), MXO_PF_FULL
 * with row_limit rows; or an error.
 */
int mxo_pf_run(mxo_reader *r, mxo_pf *pf, const char *text, size_t len, size_t *pos)
{
    if (r == NULL || pf == NULL || text == NULL || pos == NULL || *pos > len || pf->stack < 0
        || pf->stack >= pf->n_stacks || pf->thread < 0 || pf->thread >= r->n_threads
        || pf->now > MXO_PF_SAFE || pf->now < -MXO_PF_SAFE || pf->shift > MXO_PF_SAFE
        || pf->shift < -MXO_PF_SAFE)
        return MXO_ERR_ARG;
    const unsigned char *data = (const unsigned char *)text;
    mxo_pf_stack *stack = &pf->stacks[pf->stack];
    size_t at = *pos;
    while (at < len) {
        if (r->n >= pf->row_limit) {
            *pos = at;
            return MXO_PF_FULL;
        }
        size_t p = at;
        uint64_t size, delta, seq, flags, type, name = 0, cat = 0;
        if (!tag(data, len, &p, PACKET) || !varint(data, len, &p, &size) || size > len - p)
            break;
        size_t stop = p + (size_t)size;
        if (!tag(data, stop, &p, TIMESTAMP) || !varint(data, stop, &p, &delta)
            || !tag(data, stop, &p, SEQ) || !varint(data, stop, &p, &seq) || seq != pf->seq)
            break;
        if (p < stop && data[p] == FLAGS) {
            p++;
            if (!varint(data, stop, &p, &flags) || (flags & INCREMENTAL_STATE_CLEARED))
                break;
        }
        uint64_t event;
        if (!tag(data, stop, &p, TRACK_EVENT) || !varint(data, stop, &p, &event)
            || event != stop - p || !tag(data, stop, &p, TYPE) || !varint(data, stop, &p, &type))
            break;
        uint64_t track = 0, value = 0;
        if (type == SLICE_BEGIN) {
            if (!tag(data, stop, &p, NAME_IID) || !varint(data, stop, &p, &name)
                || !tag(data, stop, &p, CATEGORY_IIDS) || !varint(data, stop, &p, &cat))
                break;
        } else if (type == COUNTER && COUNTERS) {
            if (!tag(data, stop, &p, TRACK_UUID) || !varint(data, stop, &p, &track)
                || !tag(data, stop, &p, COUNTER_VALUE_0) || !tag(data, stop, &p, COUNTER_VALUE_1)
                || !varint(data, stop, &p, &value))
                break;
        } else if (type != SLICE_END) {
            break;
        }
        if (p != stop || delta > (uint64_t)MXO_PF_SAFE)
            break;
        int64_t now = pf->now + (int64_t)delta; /* below 2**62: no overflow */
        if (now > MXO_PF_SAFE)
            break;
        int64_t ts = now + pf->shift;
        if (ts >= MXO_PF_TS_LIMIT || ts <= -MXO_PF_TS_LIMIT)
            break;
        if (type == COUNTER) {
            int32_t proto, thread;
            if (!cached_track(pf, track, &proto, &thread)) {
                pf->miss_track = track;
                *pos = at;
                return MXO_PF_MISS_TRACK;
            }
            int rc = row_out(r, pf, ts, MXO_NO_DUR, (size_t)proto, thread, (size_t)value,
                             MXO_COUNTER_ARGS);
            if (rc < 0)
                return rc;
        } else if (type == SLICE_BEGIN) {
            int32_t proto = cached(pf, name, cat);
            if (proto < 0) {
                pf->miss_name = name;
                pf->miss_cat = cat;
                *pos = at;
                return MXO_PF_MISS;
            }
            int rc = mxo_pf_push(pf, pf->stack, ts, proto);
            if (rc < 0)
                return rc;
            stack = &pf->stacks[pf->stack];
        } else {
            if (stack->n == 0 || stack->ref[stack->n - 1] < 0)
                break; /* unmatched, or begun with args: Python's */
            int64_t start = stack->ts[stack->n - 1];
            int rc = row_out(r, pf, start, ts > start ? ts - start : 0, /* within +-2**62 */
                             (size_t)stack->ref[stack->n - 1], pf->thread, 0, 0);
            if (rc < 0)
                return rc;
            stack->n--;
            pf->open--;
            pf->ranges++;
        }
        pf->now = now;
        pf->count++;
        at = stop;
    }
    *pos = at;
    return MXO_PF_STOP;
}
