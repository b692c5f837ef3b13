/*
 * mxo_read.c -- see mxo_read.h: the rows of a block of Chrome JSON events
 * in mxprof's own shape, and the runs of text it leaves to Python.
 *
 * Times: a decimal d with at most 3 fraction digits and |d| < 10**12 us is
 * read as the integer N = d * 1000 ns, exactly.  The pure reader rounds the
 * double nearest d (x, |x - d| <= ulp(x) / 2 <= 2**-13 here) by
 * _convert.whole_ns's rule or, where that declines, by round_ratio of the
 * exact x * 1000; both give N because |x * 1000 - N| <= 1000 * 2**-13 < 0.13
 * and the float product adds at most ulp(2**50) / 2 = 0.125 more, still
 * below 0.5 (and a result within 0.001 of an integer is that integer).  A
 * range's end, ts + dur rounded exactly, is then N_ts + N_dur, so its length
 * is N_dur (0 when negative), as the pure reader's.  tests/test_fastjson.py
 * checks this against the pure reader.
 */
#include "mxo_read.h"

#include <stdlib.h>
#include <string.h>

#define MAX_INT_DIGITS_TIME 12 /* below 10**12 us: see the comment above */
#define MAX_INT_DIGITS_ID 18   /* below 10**18: an int64 */
#define MAX_MOVE 4096          /* a longer move back: the thread is merge sorted instead */

enum { F_NAME, F_CAT, F_PH, F_TS, F_DUR, F_PID, F_TID, F_ARGS };

typedef struct {
    size_t name, name_len, cat, cat_len; /* offsets in the text */
    size_t args, args_len;               /* the args object's text (args_len 0: none) */
    int async_args;                      /* its args hold "ph":"b" or "e" (see mxo_read.h) */
    char ph;
    int64_t ts, dur, pid, tid;
} row;

/* ---- memory ---- */

static int grow(void **p, size_t need, size_t size)
{
    if (need > SIZE_MAX / size)
        return MXO_ERR_MEMORY;
    void *q = realloc(*p, need * size);
    if (q == NULL)
        return MXO_ERR_MEMORY;
    *p = q;
    return 0;
}

static size_t doubled(size_t cap, size_t need)
{
    size_t c = cap ? cap : 1024;
    while (c < need)
        c *= 2;
    return c;
}

int mxo_grow(void **p, size_t need, size_t size) { return grow(p, need, size); }

size_t mxo_doubled(size_t cap, size_t need) { return doubled(cap, need); }

mxo_reader *mxo_new(void)
{
    return calloc(1, sizeof(mxo_reader));
}

void mxo_free(mxo_reader *r)
{
    if (r == NULL)
        return;
    free(r->ts), free(r->dur), free(r->key), free(r->thread), free(r->args), free(r->args_len);
    free(r->g_apos), free(r->g_aheld), free(r->g_alen), free(r->g_abegin), free(r->g_atext);
    free(r->g_atext_begin);
    free(r->g_atext_len), free(r->g_with_args);
    free(r->run_begin), free(r->run_end), free(r->run_at);
    free(r->key_first), free(r->key_global), free(r->key_name), free(r->key_name_len);
    free(r->key_cat), free(r->key_cat_len), free(r->key_ph), free(r->key_hash);
    free(r->key_table), free(r->arena);
    free(r->thread_pid), free(r->thread_tid), free(r->thread_table);
    free(r->g_ts), free(r->g_dur), free(r->g_kind), free(r->g_thread);
    free(r->g_begin), free(r->g_count), free(r->g_slot), free(r->g_key);
    free(r->s_starts), free(r->s_lengths), free(r->s_id), free(r->s_len), free(r->s_own);
    free(r->s_points), free(r->key_pointed);
    free(r->c_len), free(r->c_id), free(r->c_begin), free(r->c_count), free(r->c_own);
    free(r->c_own_overflow), free(r->c_own_each), free(r->c_slot);
    free(r);
}

/* ---- interning: keys (name, cat, ph) and threads (pid, tid) ---- */

static uint64_t mix(uint64_t h, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull; /* FNV-1a */
    return h;
}

static int key_rehash(mxo_reader *r, size_t cap)
{
    int32_t *table = calloc(cap, sizeof *table);
    if (table == NULL)
        return MXO_ERR_MEMORY;
    for (int32_t k = 0; k < r->n_keys; k++) {
        size_t at = (size_t)r->key_hash[k] & (cap - 1);
        while (table[at] != 0)
            at = (at + 1) & (cap - 1);
        table[at] = k + 1;
    }
    free(r->key_table);
    r->key_table = table;
    r->key_table_cap = cap;
    return 0;
}

/* The key id of (name, cat, ph), made if new (first seen at event `at`). */
int32_t mxo_key_add(mxo_reader *r, const char *name, size_t name_len, const char *cat,
                    size_t cat_len, char ph, size_t at)
{
    uint64_t h = mix(0xcbf29ce484222325ull, name, name_len);
    h = mix(h * 31 + 1, cat, cat_len);
    h = mix(h * 31 + 2, &ph, 1);
    if ((size_t)r->n_keys * 2 + 2 > r->key_table_cap
        && key_rehash(r, doubled(r->key_table_cap * 2, (size_t)r->n_keys * 2 + 2)) < 0)
        return MXO_ERR_MEMORY;
    size_t mask = r->key_table_cap - 1, slot = (size_t)h & mask;
    for (; r->key_table[slot] != 0; slot = (slot + 1) & mask) {
        int32_t k = r->key_table[slot] - 1;
        if (r->key_hash[k] == h && r->key_ph[k] == ph && r->key_name_len[k] == name_len
            && r->key_cat_len[k] == cat_len
            && memcmp(r->arena + r->key_name[k], name, name_len) == 0
            && memcmp(r->arena + r->key_cat[k], cat, cat_len) == 0)
            return k;
    }
    if (r->n_keys == INT32_MAX)
        return MXO_ERR_MEMORY;
    int32_t k = r->n_keys;
    if (k >= r->keys_cap) {
        size_t cap = doubled((size_t)r->keys_cap, (size_t)k + 1);
        if (cap > INT32_MAX || grow((void **)&r->key_first, cap, sizeof(int64_t))
            || grow((void **)&r->key_global, cap, sizeof(int32_t))
            || grow((void **)&r->key_name, cap, sizeof(size_t))
            || grow((void **)&r->key_name_len, cap, sizeof(size_t))
            || grow((void **)&r->key_cat, cap, sizeof(size_t))
            || grow((void **)&r->key_cat_len, cap, sizeof(size_t))
            || grow((void **)&r->key_ph, cap, 1) || grow((void **)&r->key_hash, cap, 8))
            return MXO_ERR_MEMORY;
        r->keys_cap = (int32_t)cap;
    }
    size_t need = r->arena_len + name_len + cat_len;
    if (need < r->arena_len)
        return MXO_ERR_MEMORY;
    if (need > r->arena_cap) {
        size_t cap = doubled(r->arena_cap, need);
        if (grow((void **)&r->arena, cap, 1))
            return MXO_ERR_MEMORY;
        r->arena_cap = cap;
    }
    r->key_name[k] = r->arena_len;
    r->key_name_len[k] = name_len;
    if (name_len)
        memcpy(r->arena + r->arena_len, name, name_len);
    r->arena_len += name_len;
    r->key_cat[k] = r->arena_len;
    r->key_cat_len[k] = cat_len;
    if (cat_len)
        memcpy(r->arena + r->arena_len, cat, cat_len);
    r->arena_len += cat_len;
    r->key_ph[k] = ph;
    r->key_hash[k] = h;
    r->key_first[k] = (int64_t)at;
    r->key_global[k] = -1;
    r->key_table[slot] = k + 1;
    r->n_keys++;
    return k;
}

/* The key id of row w's (name, cat, ph) in text (first seen at event `at`). */
static int32_t key_of(mxo_reader *r, const char *text, const row *w, size_t at)
{
    return mxo_key_add(r, text + w->name, w->name_len, text + w->cat, w->cat_len, w->ph, at);
}

static uint64_t thread_hash(int64_t pid, int64_t tid)
{
    uint64_t h = (uint64_t)pid * 0x9e3779b97f4a7c15ull ^ (uint64_t)tid * 0xc2b2ae3d27d4eb4full;
    return h ^ (h >> 29);
}

static int thread_rehash(mxo_reader *r, size_t cap)
{
    int32_t *table = calloc(cap, sizeof *table);
    if (table == NULL)
        return MXO_ERR_MEMORY;
    for (int32_t t = 0; t < r->n_threads; t++) {
        size_t at = (size_t)thread_hash(r->thread_pid[t], r->thread_tid[t]) & (cap - 1);
        while (table[at] != 0)
            at = (at + 1) & (cap - 1);
        table[at] = t + 1;
    }
    free(r->thread_table);
    r->thread_table = table;
    r->thread_table_cap = cap;
    return 0;
}

int32_t mxo_thread_add(mxo_reader *r, int64_t pid, int64_t tid)
{
    if ((size_t)r->n_threads * 2 + 2 > r->thread_table_cap
        && thread_rehash(r, doubled(r->thread_table_cap * 2, (size_t)r->n_threads * 2 + 2)) < 0)
        return MXO_ERR_MEMORY;
    size_t mask = r->thread_table_cap - 1, slot = (size_t)thread_hash(pid, tid) & mask;
    for (; r->thread_table[slot] != 0; slot = (slot + 1) & mask) {
        int32_t t = r->thread_table[slot] - 1;
        if (r->thread_pid[t] == pid && r->thread_tid[t] == tid)
            return t;
    }
    if (r->n_threads == INT32_MAX)
        return MXO_ERR_MEMORY;
    int32_t t = r->n_threads;
    if (t >= r->threads_cap) {
        size_t cap = doubled((size_t)r->threads_cap, (size_t)t + 1);
        if (cap > INT32_MAX || grow((void **)&r->thread_pid, cap, 8)
            || grow((void **)&r->thread_tid, cap, 8))
            return MXO_ERR_MEMORY;
        r->threads_cap = (int32_t)cap;
    }
    r->thread_pid[t] = pid;
    r->thread_tid[t] = tid;
    r->thread_table[slot] = t + 1;
    r->n_threads++;
    return t;
}

/* ---- parsing one event ---- */

static int is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r'; /* JSON's whitespace */
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static size_t skip_ws(const char *t, size_t end, size_t p)
{
    while (p < end && is_ws(t[p]))
        p++;
    return p;
}

/* A string of printable ASCII without escapes: [*off, *off + *len). */
static int plain_string(const char *t, size_t end, size_t *p, size_t *off, size_t *len)
{
    size_t q = *p;
    if (q >= end || t[q] != '"')
        return 0;
    *off = ++q;
    while (q < end && t[q] != '"') {
        unsigned char c = (unsigned char)t[q];
        if (c < 0x20 || c > 0x7e || c == '\\')
            return 0;
        q++;
    }
    if (q >= end)
        return 0;
    *len = q - *off;
    *p = q + 1;
    return 1;
}

/* A JSON integer (no fraction, no exponent) of at most `digits` digits, times
 * 1000 and plus up to 3 fraction digits (as thousandths) when `fraction`. */
static int number(const char *t, size_t end, size_t *p, int digits, int fraction, int64_t *out)
{
    size_t q = *p;
    int neg = 0;
    if (q < end && t[q] == '-')
        neg = 1, q++;
    if (q >= end || !is_digit(t[q]))
        return 0;
    int64_t v = 0;
    if (t[q] == '0') {
        q++;
        if (q < end && is_digit(t[q]))
            return 0; /* a leading zero: not JSON */
    } else {
        int n = 0;
        while (q < end && is_digit(t[q])) {
            if (++n > digits)
                return 0;
            v = v * 10 + (t[q++] - '0');
        }
    }
    if (fraction) {
        int64_t f = 0;
        int n = 0;
        if (q < end && t[q] == '.') {
            q++;
            while (q < end && is_digit(t[q])) {
                if (++n > 3)
                    return 0;
                f = f * 10 + (t[q++] - '0');
            }
            if (n == 0)
                return 0;
        }
        for (; n < 3; n++)
            f *= 10;
        v = v * 1000 + f;
    }
    /* What follows (checked by the caller) must end the value: ws , } */
    *out = neg ? -v : v;
    *p = q;
    return 1;
}

/* A JSON number of at most 18 integer and 17 fraction digits, no exponent
 * (msgspec and json read it alike). */
static int plain_number(const char *t, size_t end, size_t *p)
{
    size_t q = *p;
    int n = 0;
    if (q < end && t[q] == '-')
        q++;
    if (q >= end || !is_digit(t[q]))
        return 0;
    if (t[q] == '0') {
        q++;
        if (q < end && is_digit(t[q]))
            return 0;
    } else {
        while (q < end && is_digit(t[q]))
            if (++n > 18)
                return 0;
            else
                q++;
    }
    if (q < end && t[q] == '.') {
        q++;
        n = 0;
        while (q < end && is_digit(t[q]))
            if (++n > 17)
                return 0;
            else
                q++;
        if (n == 0)
            return 0;
    }
    *p = q;
    return 1;
}

/* args as mxprof's counters and instants write them: one flat object of
 * plain strings to numbers or plain strings. */
static int flat_args(const char *t, size_t end, size_t *p, int *async_args)
{
    size_t q = *p, off, len, voff, vlen;
    if (q >= end || t[q] != '{')
        return 0;
    q = skip_ws(t, end, q + 1);
    if (q < end && t[q] == '}') {
        *p = q + 1;
        return 1;
    }
    for (;;) {
        if (!plain_string(t, end, &q, &off, &len))
            return 0;
        q = skip_ws(t, end, q);
        if (q >= end || t[q] != ':')
            return 0;
        q = skip_ws(t, end, q + 1);
        if (q < end && t[q] == '"') {
            if (!plain_string(t, end, &q, &voff, &vlen))
                return 0;
            if (len == 2 && memcmp(t + off, "ph", 2) == 0 && vlen == 1
                && (t[voff] == 'b' || t[voff] == 'e'))
                *async_args = 1;
        } else if (!plain_number(t, end, &q)) {
            return 0;
        }
        q = skip_ws(t, end, q);
        if (q >= end)
            return 0;
        if (t[q] == '}')
            break;
        if (t[q] != ',')
            return 0;
        q = skip_ws(t, end, q + 1);
    }
    *p = q + 1;
    return 1;
}

static int field_of(const char *k, size_t n)
{
    static const char *const names[] = {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"};
    for (int f = 0; f < 8; f++)
        if (strlen(names[f]) == n && memcmp(names[f], k, n) == 0)
            return f;
    return -1;
}

static const char SAMPLE_CATEGORY[] = "mxprof.sample"; /* trace/samples.py CATEGORY */

/* One object of the simple shape at t[*p] (< end); on success *p is past it. */
static int simple(const char *t, size_t end, size_t *p, row *w)
{
    size_t q = *p, kstart, klen;
    unsigned seen = 0;
    if (q >= end || t[q] != '{')
        return 0;
    q = skip_ws(t, end, q + 1);
    w->name = w->cat = w->name_len = w->cat_len = w->args = w->args_len = 0;
    w->async_args = 0;
    w->pid = w->tid = 0;
    w->ph = 0;
    for (;;) {
        if (!plain_string(t, end, &q, &kstart, &klen))
            return 0;
        int f = field_of(t + kstart, klen);
        if (f < 0 || (seen & (1u << f)))
            return 0; /* another key (args, id, ...) or one given twice */
        seen |= 1u << f;
        q = skip_ws(t, end, q);
        if (q >= end || t[q] != ':')
            return 0;
        q = skip_ws(t, end, q + 1);
        size_t off, len;
        switch (f) {
        case F_NAME:
            if (!plain_string(t, end, &q, &w->name, &w->name_len))
                return 0;
            break;
        case F_CAT:
            if (!plain_string(t, end, &q, &w->cat, &w->cat_len))
                return 0;
            break;
        case F_PH:
            if (!plain_string(t, end, &q, &off, &len) || len != 1)
                return 0;
            w->ph = t[off];
            if (w->ph != 'X' && w->ph != 'i' && w->ph != 'C' && w->ph != 'n' && w->ph != 'R')
                return 0;
            break;
        case F_TS:
            if (!number(t, end, &q, MAX_INT_DIGITS_TIME, 1, &w->ts))
                return 0;
            break;
        case F_DUR:
            if (!number(t, end, &q, MAX_INT_DIGITS_TIME, 1, &w->dur))
                return 0;
            break;
        case F_PID:
            if (!number(t, end, &q, MAX_INT_DIGITS_ID, 0, &w->pid))
                return 0;
            break;
        case F_TID:
            if (!number(t, end, &q, MAX_INT_DIGITS_ID, 0, &w->tid))
                return 0;
            break;
        default: /* F_ARGS */
            w->args = q;
            if (!flat_args(t, end, &q, &w->async_args))
                return 0;
            w->args_len = q - w->args;
            break;
        }
        q = skip_ws(t, end, q);
        if (q >= end)
            return 0;
        if (t[q] == '}')
            break;
        if (t[q] != ',')
            return 0;
        q = skip_ws(t, end, q + 1);
    }
    if (!(seen & (1u << F_TS)) || !(seen & (1u << F_PH)))
        return 0;
    if (w->ph == 'X') {
        if (!(seen & (1u << F_DUR)) || w->dur < 0)
            w->dur = 0;
    } else {
        if (w->ph == 'i' && w->cat_len == sizeof SAMPLE_CATEGORY - 1
            && memcmp(t + w->cat, SAMPLE_CATEGORY, w->cat_len) == 0)
            return 0; /* a stack sample: resolved with its definitions in Python */
        w->dur = MXO_NO_DUR;
    }
    *p = q + 1;
    return 1;
}

/* After an element: whitespace, then the end or a comma and the next element. */
static int separated(const char *t, size_t end, size_t *p)
{
    size_t q = skip_ws(t, end, *p);
    if (q == end) {
        *p = q;
        return 1;
    }
    if (t[q] != ',')
        return 0;
    q = skip_ws(t, end, q + 1);
    if (q == end)
        return 0; /* a trailing comma */
    *p = q;
    return 1;
}

/* Room for one more row. */
int mxo_row_room(mxo_reader *r)
{
    if (r->n == r->cap) {
        size_t cap = doubled(r->cap, r->n + 1);
        if (grow((void **)&r->ts, cap, 8) || grow((void **)&r->dur, cap, 8)
            || grow((void **)&r->key, cap, 4) || grow((void **)&r->thread, cap, 4)
            || grow((void **)&r->args, cap, sizeof(size_t))
            || grow((void **)&r->args_len, cap, sizeof(size_t)))
            return MXO_ERR_MEMORY;
        r->cap = cap;
    }
    return 0;
}

static int add_row(mxo_reader *r, const char *text, const row *w)
{
    if (mxo_row_room(r) < 0)
        return MXO_ERR_MEMORY;
    int32_t k = key_of(r, text, w, r->n);
    int32_t th = mxo_thread_add(r, w->pid, w->tid);
    if (k < 0 || th < 0)
        return MXO_ERR_MEMORY;
    r->ts[r->n] = w->ts;
    r->dur[r->n] = w->dur;
    r->key[r->n] = k;
    r->thread[r->n] = th;
    r->args[r->n] = w->args;
    r->args_len[r->n] = w->args_len;
    r->async_args |= w->async_args;
    r->n++;
    return 0;
}

static int add_run(mxo_reader *r, size_t begin, size_t end)
{
    if (r->n_runs == r->runs_cap) {
        size_t cap = doubled(r->runs_cap, r->n_runs + 1);
        if (grow((void **)&r->run_begin, cap, sizeof(size_t))
            || grow((void **)&r->run_end, cap, sizeof(size_t))
            || grow((void **)&r->run_at, cap, sizeof(size_t)))
            return MXO_ERR_MEMORY;
        r->runs_cap = cap;
    }
    r->run_begin[r->n_runs] = begin;
    r->run_end[r->n_runs] = end;
    r->run_at[r->n_runs] = r->n;
    r->n_runs++;
    return 0;
}

/* ---- a block ---- */

int mxo_parse(mxo_reader *r, const char *text, size_t len)
{
    if (r == NULL || text == NULL || len < 2 || text[0] != '[' || text[len - 1] != ']')
        return MXO_ERR_ARG;
    r->n = 0;
    r->n_runs = 0;
    r->async_args = 0;
    size_t end = len - 1, p = skip_ws(text, end, 1);
    row w;
    while (p < end) {
        size_t q = p;
        if (simple(text, end, &q, &w) && separated(text, end, &q)) {
            if (add_row(r, text, &w) < 0)
                return MXO_ERR_MEMORY;
            p = q;
            continue;
        }
        /* A run: up to the next line that opens with a simple event and
         * follows a comma (Python proves the run whole by decoding it). */
        size_t begin = p, from = p, run_end = end;
        p = end;
        for (;;) {
            const char *nl = memchr(text + from, '\n', end - from);
            if (nl == NULL)
                break;
            size_t line = (size_t)(nl - text) + 1, back = (size_t)(nl - text);
            while (back > begin && is_ws(text[back - 1]))
                back--;
            size_t at = skip_ws(text, end, line);
            q = at;
            if (back > begin && text[back - 1] == ',' && at < end && simple(text, end, &q, &w)
                && separated(text, end, &q)) {
                run_end = at;
                p = at; /* the row is parsed again by the outer loop */
                break;
            }
            from = line;
        }
        if (add_run(r, begin, run_end) < 0)
            return MXO_ERR_MEMORY;
    }
    return 0;
}

/* Forget the keys from `keep` on (those of a block the caller reads another
 * way: its events may hold no such key, and the keys' order is the file's). */
int mxo_forget(mxo_reader *r, int32_t keep)
{
    if (r == NULL || keep < 0 || keep > r->n_keys)
        return MXO_ERR_ARG;
    if (keep == r->n_keys)
        return 0;
    r->n_keys = keep;
    r->arena_len = keep ? r->key_cat[keep - 1] + r->key_cat_len[keep - 1] : 0;
    return key_rehash(r, r->key_table_cap);
}

int mxo_key_text(const mxo_reader *r, int32_t key, const char **name, size_t *name_len,
                 const char **cat, size_t *cat_len, char *ph)
{
    if (r == NULL || key < 0 || key >= r->n_keys)
        return MXO_ERR_ARG;
    *name = r->arena + r->key_name[key];
    *name_len = r->key_name_len[key];
    *cat = r->arena + r->key_cat[key];
    *cat_len = r->key_cat_len[key];
    *ph = r->key_ph[key];
    return 0;
}

int mxo_set_key(mxo_reader *r, int32_t key, int32_t global)
{
    if (r == NULL || key < 0 || key >= r->n_keys || global < 0)
        return MXO_ERR_ARG;
    r->key_global[key] = global;
    return 0;
}

/* The events [begin, end) of the last block (text, len: that block) grouped
 * by thread (stably); g_kind holds the reader's key ids until mxo_globalize.
 * Per group, its rows with args: their positions in the group (g_apos from
 * g_abegin) and their args' texts as one JSON array (g_atext from
 * g_atext_begin, g_atext_len bytes), or, for a row whose args the caller
 * holds (MXO_HELD_ARGS) or a counter's (MXO_COUNTER_ARGS), their args and
 * args_len (g_aheld, g_alen; a text's: g_alen only). */
int mxo_group(mxo_reader *r, const char *text, size_t len, size_t begin, size_t end)
{
    if (r == NULL || text == NULL || begin > end || end > r->n)
        return MXO_ERR_ARG;
    size_t n = end - begin;
    r->n_groups = 0;
    if (r->g_slot_cap < r->n_threads) {
        if (grow((void **)&r->g_slot, (size_t)r->n_threads, 4))
            return MXO_ERR_MEMORY;
        r->g_slot_cap = r->n_threads;
    }
    if (n > r->g_cap) {
        size_t cap = doubled(r->g_cap, n);
        if (grow((void **)&r->g_ts, cap, 8) || grow((void **)&r->g_dur, cap, 8)
            || grow((void **)&r->g_kind, cap, 4) || grow((void **)&r->g_key, cap, 4)
            || grow((void **)&r->g_apos, cap, sizeof(size_t))
            || grow((void **)&r->g_aheld, cap, sizeof(size_t))
            || grow((void **)&r->g_alen, cap, sizeof(size_t)))
            return MXO_ERR_MEMORY;
        r->g_cap = cap;
    }
    for (int32_t t = 0; t < r->n_threads; t++)
        r->g_slot[t] = -1;
    size_t text_bytes = 0;
    for (size_t i = begin; i < end; i++) { /* count, groups in order of first event */
        int32_t t = r->thread[i];
        int held = r->args_len[i] == MXO_HELD_ARGS || r->args_len[i] == MXO_COUNTER_ARGS;
        if (r->args_len[i] && !held && (r->args[i] > len || r->args_len[i] > len - r->args[i]))
            return MXO_ERR_ARG; /* not this block's */
        if (r->g_slot[t] < 0) {
            if (r->n_groups == r->groups_cap) {
                size_t cap = doubled(r->groups_cap, r->n_groups + 1);
                if (grow((void **)&r->g_thread, cap, 4)
                    || grow((void **)&r->g_begin, cap, sizeof(size_t))
                    || grow((void **)&r->g_count, cap, sizeof(size_t))
                    || grow((void **)&r->g_with_args, cap, sizeof(size_t))
                    || grow((void **)&r->g_abegin, cap, sizeof(size_t))
                    || grow((void **)&r->g_atext_begin, cap, sizeof(size_t))
                    || grow((void **)&r->g_atext_len, cap, sizeof(size_t)))
                    return MXO_ERR_MEMORY;
                r->groups_cap = cap;
            }
            r->g_slot[t] = (int32_t)r->n_groups;
            r->g_thread[r->n_groups] = t;
            r->g_count[r->n_groups] = 0;
            r->g_with_args[r->n_groups] = 0;
            r->g_atext_len[r->n_groups] = 0;
            r->n_groups++;
        }
        size_t g = (size_t)r->g_slot[t];
        r->g_count[g]++;
        if (held) {
            r->g_with_args[g]++;
        } else if (r->args_len[i]) {
            r->g_with_args[g]++;
            r->g_atext_len[g] += r->args_len[i] + 1; /* and a comma or the "[" */
        }
    }
    size_t at = 0, apos = 0;
    for (size_t g = 0; g < r->n_groups; g++) {
        r->g_begin[g] = at;
        at += r->g_count[g];
        r->g_count[g] = 0;
        r->g_abegin[g] = apos;
        apos += r->g_with_args[g];
        r->g_with_args[g] = 0;
        r->g_atext_begin[g] = text_bytes;
        if (r->g_atext_len[g])
            text_bytes += r->g_atext_len[g] + 1; /* and the "]" */
        r->g_atext_len[g] = 0;
    }
    if (text_bytes > r->g_atext_cap) {
        size_t cap = doubled(r->g_atext_cap, text_bytes);
        if (grow((void **)&r->g_atext, cap, 1))
            return MXO_ERR_MEMORY;
        r->g_atext_cap = cap;
    }
    for (size_t i = begin; i < end; i++) {
        size_t g = (size_t)r->g_slot[r->thread[i]];
        size_t j = r->g_begin[g] + r->g_count[g]++;
        r->g_ts[j] = r->ts[i];
        r->g_dur[j] = r->dur[i];
        r->g_kind[j] = r->key[i];
        r->g_key[j] = r->key[i];
        if (r->args_len[i] == MXO_HELD_ARGS || r->args_len[i] == MXO_COUNTER_ARGS) {
            r->g_aheld[r->g_abegin[g] + r->g_with_args[g]] = r->args[i];
            r->g_alen[r->g_abegin[g] + r->g_with_args[g]] = r->args_len[i];
            r->g_apos[r->g_abegin[g] + r->g_with_args[g]++] = j - r->g_begin[g];
        } else if (r->args_len[i]) {
            r->g_alen[r->g_abegin[g] + r->g_with_args[g]] = r->args_len[i];
            r->g_apos[r->g_abegin[g] + r->g_with_args[g]++] = j - r->g_begin[g];
            char *out = r->g_atext + r->g_atext_begin[g] + r->g_atext_len[g];
            *out = r->g_atext_len[g] ? ',' : '[';
            memcpy(out + 1, text + r->args[i], r->args_len[i]);
            r->g_atext_len[g] += r->args_len[i] + 1;
        }
    }
    for (size_t g = 0; g < r->n_groups; g++)
        if (r->g_atext_len[g])
            r->g_atext[r->g_atext_begin[g] + r->g_atext_len[g]++] = ']';
    r->g_n = n;
    return 0;
}

/* mxo_group's keys as the trace's indexes (each set by mxo_set_key). */
int mxo_globalize(mxo_reader *r)
{
    if (r == NULL)
        return MXO_ERR_ARG;
    for (size_t j = 0; j < r->g_n; j++) {
        int32_t k = r->g_kind[j];
        if (k < 0 || k >= r->n_keys || r->key_global[k] < 0)
            return MXO_ERR_ARG;
        r->g_kind[j] = r->key_global[k];
    }
    r->g_n = 0; /* once */
    return 0;
}

/* ---- the summary of model._Running, for rows of its threads ---- */

static int push_row(mxo_reader *r, int32_t id, int64_t length, int64_t own)
{
    if (r->s_rows == r->s_rows_cap) {
        size_t cap = doubled(r->s_rows_cap, r->s_rows + 1);
        if (grow((void **)&r->s_id, cap, 4) || grow((void **)&r->s_len, cap, 8)
            || grow((void **)&r->s_own, cap, 8))
            return MXO_ERR_MEMORY;
        r->s_rows_cap = cap;
    }
    r->s_id[r->s_rows] = id;
    r->s_len[r->s_rows] = length;
    r->s_own[r->s_rows] = own;
    r->s_rows++;
    return 0;
}

/*
 * Group g of mxo_group's output (kinds: summary ids) through model._Running's
 * rule, for a thread whose ranges that no range contains are
 * old_starts/old_lengths[0, n_old) (read only) and whose last end is
 * *last_end.  On return the thread's list is old[0, *keep) followed by
 * s_starts/s_lengths[0, s_n); each range is a row of the segment's (mxo_collect)
 * and each key first met as a point is in s_points.  Returns 1 where a range
 * breaks the rule (the summary is "broken": the rows after it are not
 * summed, as in Python), 0 otherwise, or an error.  Nothing the caller owns
 * is written but *keep and *last_end.
 */
int mxo_running(mxo_reader *r, size_t g, const int64_t *old_starts, const int64_t *old_lengths,
                size_t n_old, size_t *keep, int64_t *last_end, int broken)
{
    if (r == NULL || g >= r->n_groups || keep == NULL || last_end == NULL
        || (n_old > 0 && (old_starts == NULL || old_lengths == NULL)))
        return MXO_ERR_ARG;
    size_t begin = r->g_begin[g], count = r->g_count[g];
    size_t k_old = n_old, k_new = 0;
    int64_t last = *last_end;
    if (r->s_cap < count) {
        size_t cap = doubled(r->s_cap, count);
        if (grow((void **)&r->s_starts, cap, 8) || grow((void **)&r->s_lengths, cap, 8))
            return MXO_ERR_MEMORY;
        r->s_cap = cap;
    }
    if (r->key_pointed_cap < (size_t)r->n_keys) {
        size_t cap = doubled(r->key_pointed_cap, (size_t)r->n_keys);
        if (grow((void **)&r->key_pointed, cap, 1))
            return MXO_ERR_MEMORY;
        memset(r->key_pointed + r->key_pointed_cap, 0, cap - r->key_pointed_cap);
        r->key_pointed_cap = cap;
    }
    for (size_t j = begin; j < begin + count; j++) {
        int64_t start = r->g_ts[j], length = r->g_dur[j];
        if (length == MXO_NO_DUR) {
            int32_t k = r->g_key[j];
            if (!r->key_pointed[k]) {
                if (r->s_n_points == r->s_points_cap) {
                    size_t cap = doubled(r->s_points_cap, r->s_n_points + 1);
                    if (grow((void **)&r->s_points, cap, 4))
                        return MXO_ERR_MEMORY;
                    r->s_points_cap = cap;
                }
                r->key_pointed[k] = 1;
                r->s_points[r->s_n_points++] = k;
            }
            continue;
        }
        if (broken)
            continue;
        int64_t end = start + length; /* both below 2**50: no overflow */
        int have = k_new + k_old > 0;
        int64_t top_start = k_new ? r->s_starts[k_new - 1] : have ? old_starts[k_old - 1] : 0;
        int64_t top_length = k_new ? r->s_lengths[k_new - 1] : have ? old_lengths[k_old - 1] : 0;
        if (end < last || (end == last && length > 0 && have && top_start <= start && top_length > 0)) {
            broken = 1;
            continue;
        }
        last = end;
        int64_t children = 0;
        if (length > 0) {
            for (;;) {
                int64_t s_, l_;
                if (k_new > 0 && r->s_starts[k_new - 1] >= start)
                    s_ = r->s_starts[k_new - 1], l_ = r->s_lengths[k_new - 1], k_new--;
                else if (k_new == 0 && k_old > 0 && old_starts[k_old - 1] >= start)
                    s_ = old_starts[k_old - 1], l_ = old_lengths[k_old - 1], k_old--;
                else
                    break;
                (void)s_;
                /* Past int64 only when the sum exceeds any length: saturate. */
                if (__builtin_add_overflow(children, l_, &children))
                    children = INT64_MAX;
            }
        }
        r->s_starts[k_new] = start;
        r->s_lengths[k_new] = length;
        k_new++;
        if (push_row(r, r->g_kind[j], length, length > children ? length - children : 0) < 0)
            return MXO_ERR_MEMORY;
    }
    r->s_n = k_new;
    *keep = k_old;
    *last_end = last;
    return broken;
}

/* The segment's ranges (mxo_running's rows) by summary id, stably; then none. */
int mxo_collect(mxo_reader *r)
{
    if (r == NULL)
        return MXO_ERR_ARG;
    size_t n = r->s_rows;
    r->n_c = 0;
    if (n > r->c_cap) {
        size_t cap = doubled(r->c_cap, n);
        if (grow((void **)&r->c_len, cap, 8) || grow((void **)&r->c_own_each, cap, 8))
            return MXO_ERR_MEMORY;
        r->c_cap = cap;
    }
    for (size_t i = 0; i < n; i++) {
        int32_t id = r->s_id[i];
        if (id < 0)
            return MXO_ERR_ARG;
        if ((size_t)id >= r->c_slot_cap) {
            size_t cap = doubled(r->c_slot_cap, (size_t)id + 1);
            if (grow((void **)&r->c_slot, cap, 4))
                return MXO_ERR_MEMORY;
            for (size_t s = r->c_slot_cap; s < cap; s++)
                r->c_slot[s] = -1;
            r->c_slot_cap = cap;
        }
        if (r->c_slot[id] < 0) {
            if (r->n_c == r->c_groups_cap) {
                size_t cap = doubled(r->c_groups_cap, r->n_c + 1);
                if (grow((void **)&r->c_id, cap, 4) || grow((void **)&r->c_begin, cap, sizeof(size_t))
                    || grow((void **)&r->c_count, cap, sizeof(size_t))
                    || grow((void **)&r->c_own, cap, 8) || grow((void **)&r->c_own_overflow, cap, 1))
                    return MXO_ERR_MEMORY;
                r->c_groups_cap = cap;
            }
            r->c_slot[id] = (int32_t)r->n_c;
            r->c_id[r->n_c] = id;
            r->c_count[r->n_c] = 0;
            r->c_own[r->n_c] = 0;
            r->c_own_overflow[r->n_c] = 0;
            r->n_c++;
        }
        r->c_count[r->c_slot[id]]++;
    }
    size_t at = 0;
    for (size_t c = 0; c < r->n_c; c++) {
        r->c_begin[c] = at;
        at += r->c_count[c];
        r->c_count[c] = 0;
    }
    for (size_t i = 0; i < n; i++) {
        size_t c = (size_t)r->c_slot[r->s_id[i]];
        size_t j = r->c_begin[c] + r->c_count[c]++;
        r->c_len[j] = r->s_len[i];
        r->c_own_each[j] = r->s_own[i];
        if (__builtin_add_overflow(r->c_own[c], r->s_own[i], &r->c_own[c]))
            r->c_own_overflow[c] = 1;
    }
    for (size_t c = 0; c < r->n_c; c++)
        r->c_slot[r->c_id[c]] = -1;
    r->s_rows = 0;
    return 0;
}

/* ---- a thread's order: _columns.Thread's, (ts, longer first), ties as added ---- */

static int64_t length_of(int64_t d)
{
    return d > 0 ? d : 0;
}

/* Whether event a goes before event b. */
static int before(const int64_t *ts, const int64_t *dur, size_t a, size_t b)
{
    return ts[a] < ts[b] || (ts[a] == ts[b] && length_of(dur[a]) > length_of(dur[b]));
}

static int merge_sort(int64_t *ts, int64_t *dur, int32_t *kind, size_t n)
{
    size_t *idx = malloc(n * sizeof *idx), *tmp = malloc(n * sizeof *tmp);
    int64_t *col = malloc(n * sizeof *col);
    int rc = 0;
    if (idx == NULL || tmp == NULL || col == NULL) {
        rc = MXO_ERR_MEMORY;
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        idx[i] = i;
    for (size_t width = 1; width < n; width *= 2) { /* bottom-up, stable */
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n;
            size_t hi = mid + width < n ? mid + width : n;
            size_t a = lo, b = mid, o = lo;
            while (a < mid && b < hi)
                tmp[o++] = before(ts, dur, idx[b], idx[a]) ? idx[b++] : idx[a++];
            while (a < mid)
                tmp[o++] = idx[a++];
            while (b < hi)
                tmp[o++] = idx[b++];
        }
        size_t *swap = idx;
        idx = tmp;
        tmp = swap;
        if (width > SIZE_MAX / 2)
            break;
    }
    for (size_t i = 0; i < n; i++)
        col[i] = ts[idx[i]];
    memcpy(ts, col, n * sizeof *col);
    for (size_t i = 0; i < n; i++)
        col[i] = dur[idx[i]];
    memcpy(dur, col, n * sizeof *col);
    int32_t *kcol = (int32_t *)col; /* int32 fits in the int64 buffer */
    for (size_t i = 0; i < n; i++)
        kcol[i] = kind[idx[i]];
    memcpy(kind, kcol, n * sizeof *kcol);
out:
    free(idx), free(tmp), free(col);
    return rc;
}

/* Events [from, n) were appended to a thread whose [0, from) is in order:
 * each goes back past the events it goes before, as Thread.put places it;
 * where one would go back more than MAX_MOVE, the whole thread is merge
 * sorted instead (the same order: stable). */
int mxo_order(int64_t *ts, int64_t *dur, int32_t *kind, size_t n, size_t from)
{
    if ((ts == NULL || dur == NULL || kind == NULL) && n > 0)
        return MXO_ERR_ARG;
    if (from > n)
        return MXO_ERR_ARG;
    for (size_t i = from ? from : 1; i < n; i++) {
        if (!before(ts, dur, i, i - 1))
            continue;
        size_t lo = 0, hi = i - 1; /* the first j in [0, i) that i goes before */
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (before(ts, dur, i, mid))
                hi = mid;
            else
                lo = mid + 1;
        }
        if (i - lo > MAX_MOVE)
            return merge_sort(ts, dur, kind, n);
        int64_t t = ts[i], d = dur[i];
        int32_t k = kind[i];
        memmove(ts + lo + 1, ts + lo, (i - lo) * sizeof *ts);
        memmove(dur + lo + 1, dur + lo, (i - lo) * sizeof *dur);
        memmove(kind + lo + 1, kind + lo, (i - lo) * sizeof *kind);
        ts[lo] = t, dur[lo] = d, kind[lo] = k;
    }
    return 0;
}
