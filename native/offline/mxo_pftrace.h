/*
 * mxo_pftrace.h -- the compiled fast path of the Perfetto (.pftrace) reader.
 *
 * mxprof/trace/perfetto.py decodes a trace packet by packet.  Where a
 * packet sequence is in the state of the core's compact encoding (a default
 * track, an incremental default clock: native/src/mxp_perfetto.c), it hands
 * the packets that follow to mxo_pf_run, which takes the slice begins and
 * ends and the counter samples of that shape and no other:
 *
 *   end:     0x40 delta, 0x50 seq, [0x68 flags], 0x5A { 0x48 2 }
 *   begin:   0x40 delta, 0x50 seq, [0x68 flags], 0x5A { 0x48 1, 0x50 name_iid, 0x18 cat_iid }
 *   counter: 0x40 delta, 0x50 seq, [0x68 flags], 0x5A { 0x48 4, 0x58 track, 0xF0 0x01 value }
 *
 * (the sequence the caller named, flags without INCREMENTAL_STATE_CLEARED).
 * A begin is pushed on its track's stack; an end pops it and the range
 * becomes a row of the mxo_reader's columns (ts, dur, key, thread: the
 * same rows mxo_parse makes of JSON), which Python hands to the threads'
 * sinks in batches (mxprof/trace/_fastread.py); a counter sample is a
 * point row of its track's name and (pid, 0), its value in the row's args
 * (MXO_COUNTER_ARGS: Python's {name: value} where a sink keeps args).
 * mxo_pf_run stops, having taken nothing of it, at the first packet of any
 * other shape, or whose numbers leave the range where int64 arithmetic is
 * exact, or whose end finds its stack empty or topped by a begin Python
 * holds (one with arguments): Python decodes that packet its own way,
 * which alone judges damage.  So a packet taken here is one Python would
 * decode to the same event, and everything else is decoded by Python.
 * Names (iids) and counter tracks are resolved by Python, once per
 * sequence state (MXO_PF_MISS, MXO_PF_MISS_TRACK), and cached here.
 *
 * The stacks of every track live here (Python pushes and pops the begins
 * and ends it decodes with mxo_pf_push / mxo_pf_pop), so a range may begin
 * on one side and end on the other.  A stack entry's ref is a "proto"
 * (>= 0: a (name, category) pair registered by mxo_pf_proto, whose
 * mxo_reader key is made when its first range ends, so keys are numbered
 * in the order of their first rows, as the pure reader's) or, < 0, a begin
 * Python holds (its args, or a time out of range).
 *
 * Python hands the events it decodes itself that go to a thread (points,
 * ranges with args) to the same rows (mxo_pf_put), their args held in a
 * Python list (MXO_HELD_ARGS), so that one stream of rows, in file order,
 * goes to the sinks.
 *
 * Every read of the data is bounded by its length; varints longer than 10
 * bytes or past 64 bits stop the run; no recursion; memory grows by
 * doubling and is freed by mxo_pf_free.
 */
#ifndef MXO_PFTRACE_H
#define MXO_PFTRACE_H

#include "mxo_read.h"

#include <stddef.h>
#include <stdint.h>

#define MXO_PF_STOP 0 /* a packet mxo_pf_run does not take: Python decodes it */
#define MXO_PF_MISS 1 /* a begin whose (miss_name, miss_cat) iids have no proto yet */
#define MXO_PF_FULL 2 /* row_limit rows: hand them on (Python), then call again */
#define MXO_PF_MISS_TRACK 3 /* a counter sample whose track (miss_track) is not cached */

typedef struct mxo_pf_stack {
    int64_t *ts;
    int64_t *ref;
    size_t n, cap;
} mxo_pf_stack;

typedef struct mxo_pf {
    /* The sequence mxo_pf_run reads, set by the caller before each call. */
    uint64_t seq;
    int64_t now;    /* the incremental clock's value (updated by the run) */
    int64_t shift;  /* ts = now + shift (|now|, |shift| <= MXO_PF_SAFE) */
    int32_t stack;  /* the default track's stack (mxo_pf_stack_new) */
    int32_t thread; /* its thread (mxo_pf_thread) */
    size_t count;   /* packets decoded (updated by the run) */
    size_t ranges;  /* ranges the runs paired, all told */
    size_t row_limit;
    uint64_t miss_name, miss_cat; /* MXO_PF_MISS's iids */
    uint64_t miss_track;          /* MXO_PF_MISS_TRACK's track */
    /* The stacks, by handle. */
    mxo_pf_stack *stacks;
    int32_t n_stacks, stacks_cap;
    size_t open; /* entries on all stacks */
    /* Protos: (name, category) texts in the arena, and their reader key (-1: none yet). */
    size_t *p_text, *p_name_len, *p_cat_len;
    int32_t *p_key;
    char *p_ph;
    size_t n_protos, protos_cap;
    char *arena;
    size_t arena_len, arena_cap;
    /* The sequence's (name_iid, category_iid) -> proto, open addressing. */
    uint64_t *c_name, *c_cat;
    int32_t *c_proto; /* proto + 1, 0: empty */
    size_t c_n, c_cap;
    /* The counter tracks: uuid -> proto (+ 1, 0: empty) and thread, open addressing. */
    uint64_t *t_uuid;
    int32_t *t_proto, *t_thread;
    size_t t_n, t_cap;
} mxo_pf;

#define MXO_PF_SAFE ((int64_t)1 << 61) /* |now|, |shift|: ts within +-2**62 */
#define MXO_PF_TS_LIMIT ((int64_t)1 << 62) /* |ts| below: a range's dur fits int64 */

mxo_pf *mxo_pf_new(void);
void mxo_pf_free(mxo_pf *pf);
int32_t mxo_pf_stack_new(mxo_pf *pf);
int mxo_pf_push(mxo_pf *pf, int32_t stack, int64_t ts, int64_t ref);
int mxo_pf_pop(mxo_pf *pf, int32_t stack, int64_t *ts, int64_t *ref);
int32_t mxo_pf_proto(mxo_pf *pf, const char *name, size_t name_len, const char *cat, size_t cat_len,
                     char ph);
int mxo_pf_put(mxo_reader *r, mxo_pf *pf, int64_t pid, int64_t tid, int64_t ts, int64_t dur,
               int32_t proto, size_t held);
int mxo_pf_cache(mxo_pf *pf, uint64_t name_iid, uint64_t cat_iid, int32_t proto);
void mxo_pf_uncache(mxo_pf *pf);
int mxo_pf_thread(mxo_reader *r, mxo_pf *pf, int64_t pid, int64_t tid);
int mxo_pf_cache_track(mxo_reader *r, mxo_pf *pf, uint64_t track, int32_t proto, int64_t pid,
                       int64_t tid);
int mxo_pf_run(mxo_reader *r, mxo_pf *pf, const char *data, size_t len, size_t *pos);

#endif
