/*
 * mxo_read.h -- the offline reader's compiled fast path (mxprof.trace._fastjson).
 *
 * A block of a Chrome JSON trace's events, as mxprof.trace._scan.blocks
 * yields it ("[" + whole lines of events + "]"), is parsed by mxo_parse:
 * every event in the exact shape mxprof's core writes (only the keys name,
 * cat, ph, ts, dur, pid, tid, args; printable ASCII strings without escapes; ph one
 * of X i C n R, and no "i" of the sample category; args, if any, one flat
 * object of plain strings to plain strings or numbers; times with at most 3
 * fraction digits, below 10**12 us; integer ids below 10**18) becomes one
 * row of the event columns, its times in integer ns.  Anything else is a
 * "run" of text between rows, only located (byte offsets) for the Python
 * reader to decode and check: mxprof/trace/_fastread.py takes the block
 * this way only if every run decodes, which also proves that the rows were
 * the array's top-level events; otherwise the block is read the pure way.
 *
 * No call here touches Python; every read of the text is bounded by its
 * length; no recursion; memory grows by doubling and is freed by mxo_free.
 * Build: native/offline/build_fastjson.py (cffi).
 */
#ifndef MXO_READ_H
#define MXO_READ_H

#include <stddef.h>
#include <stdint.h>

#define MXO_NO_DUR INT64_MIN /* the dur of a point: _columns.NO_DUR */
#define MXO_ERR_MEMORY (-1)
#define MXO_ERR_ARG (-2)
#define MXO_HELD_ARGS SIZE_MAX /* args_len of a row whose args the caller holds */
#define MXO_COUNTER_ARGS (SIZE_MAX - 1) /* ... of a counter's: args, its value's 64 bits */

typedef struct mxo_reader {
    /* The last block's events that were parsed, in file order. */
    int64_t *ts;     /* ns */
    int64_t *dur;    /* ns (0 or more), MXO_NO_DUR for a point */
    int32_t *key;    /* the reader's key id of (name, cat, ph) */
    int32_t *thread; /* the reader's thread id of (pid, tid) */
    size_t *args, *args_len; /* the text of its args object (args_len 0: none; */
                             /* MXO_HELD_ARGS: args is an index into the caller's list; */
                             /* MXO_COUNTER_ARGS: a counter's value, {name: value}) */
    size_t n, cap;
    /* The runs the parser did not take: text [begin, end) of the block lies
     * after its first `at` events. */
    size_t *run_begin, *run_end, *run_at;
    size_t n_runs, runs_cap;
    /* Whether a row's args hold "ph":"b" or "e": model.read_lines's test
     * for async events (which sends a block to the raw dicts) would match
     * there; elsewhere it can match only in a run (a row's strings hold no '"'). */
    int async_args;
    /* Keys known so far; key_first[k]: the event index in the last block where
     * key k, new there, first appears (-1: known before). */
    int32_t n_keys, keys_cap;
    int64_t *key_first;
    int32_t *key_global; /* per key: its index in the trace's Keys (-1: not set) */
    size_t *key_name, *key_name_len, *key_cat, *key_cat_len; /* offsets in arena */
    char *key_ph;
    uint64_t *key_hash;
    int32_t *key_table; /* open addressing: key id + 1, 0 empty */
    size_t key_table_cap;
    char *arena;
    size_t arena_len, arena_cap;
    /* Threads known so far: their ids as in the file. */
    int32_t n_threads, threads_cap;
    int64_t *thread_pid, *thread_tid;
    int32_t *thread_table;
    size_t thread_table_cap;
    /* mxo_group's output: a segment's events by thread, threads in order of
     * their first event there. */
    int64_t *g_ts, *g_dur;
    int32_t *g_kind; /* the trace's key indexes (mxo_set_key) */
    size_t g_cap, g_n;
    int32_t *g_thread; /* per group */
    size_t *g_begin, *g_count;
    size_t n_groups, groups_cap;
    int32_t *g_slot; /* per thread: its group in this segment, -1 none */
    int32_t g_slot_cap;
    int32_t *g_key; /* per row of g_*: the reader's key id */
    size_t *g_with_args;         /* per group: its rows with args ... */
    size_t *g_abegin, *g_apos;   /* ... their positions in it: g_apos[g_abegin[g] + k] ... */
    size_t *g_aheld, *g_alen;    /* ... args and args_len of those not in the text ... */
    char *g_atext;               /* ... and their args as one JSON array: */
    size_t g_atext_cap;
    size_t *g_atext_begin, *g_atext_len; /* g_atext[begin, begin + len) */
    /* The summary (mxo_running): a thread's ranges no range seen so far
     * contains, pushed by the last call (after the `keep` older ones)... */
    int64_t *s_starts, *s_lengths;
    size_t s_n, s_cap;
    /* ... the ranges of the segment: summary id, length, own time ... */
    int32_t *s_id;
    int64_t *s_len, *s_own;
    size_t s_rows, s_rows_cap;
    /* ... and the keys first met as points (their categories go to the summary). */
    int32_t *s_points;
    size_t s_n_points, s_points_cap;
    uint8_t *key_pointed;
    size_t key_pointed_cap;
    /* mxo_collect's output: the segment's ranges by summary id. */
    int64_t *c_len;
    size_t c_cap;
    int32_t *c_id;
    size_t *c_begin, *c_count;
    int64_t *c_own;
    uint8_t *c_own_overflow; /* the own times' sum is past int64: sum c_own_each */
    int64_t *c_own_each;
    size_t n_c, c_groups_cap;
    int32_t *c_slot; /* per summary id: its group, -1 none */
    size_t c_slot_cap;
} mxo_reader;

mxo_reader *mxo_new(void);
void mxo_free(mxo_reader *r);
int mxo_parse(mxo_reader *r, const char *text, size_t len);
int mxo_key_text(const mxo_reader *r, int32_t key, const char **name, size_t *name_len,
                 const char **cat, size_t *cat_len, char *ph);
int mxo_forget(mxo_reader *r, int32_t keep);
int mxo_set_key(mxo_reader *r, int32_t key, int32_t global);
int mxo_group(mxo_reader *r, const char *text, size_t len, size_t begin, size_t end);
int mxo_globalize(mxo_reader *r);
int mxo_running(mxo_reader *r, size_t g, const int64_t *old_starts, const int64_t *old_lengths,
                size_t n_old, size_t *keep, int64_t *last_end, int broken);
int mxo_collect(mxo_reader *r);
int mxo_order(int64_t *ts, int64_t *dur, int32_t *kind, size_t n, size_t from);

/* For the other readers of this module (mxo_pftrace.c), not Python's: a
 * key's id (made if new, first seen at row `at`), a thread's id, room for
 * one more row (r->n < r->cap after it), memory. */
int32_t mxo_key_add(mxo_reader *r, const char *name, size_t name_len, const char *cat,
                    size_t cat_len, char ph, size_t at);
int32_t mxo_thread_add(mxo_reader *r, int64_t pid, int64_t tid);
int mxo_row_room(mxo_reader *r);
/* *p resized to need items of size bytes (0, or MXO_ERR_MEMORY with *p as it
 * was); a capacity doubled from cap (1024 from 0) until it holds need. */
int mxo_grow(void **p, size_t need, size_t size);
size_t mxo_doubled(size_t cap, size_t need);

#endif
