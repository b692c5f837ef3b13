/*
 * test_core.c -- pure-C tests of the mxprof core, linked with its sources.
 *
 * Built and run by native/tests/run.sh (also under sanitizers).  Each test
 * checks what was recorded: statistics, tallies and the written file.
 */
#include "mxpi_agg.h"
#include "mxpi_json.h"

#include "check.h"

#include "../../mxprof/include/mxprof_capi.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#ifdef MXPI_HAVE_ZLIB
#include <zlib.h>
#endif
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmpdir[256];

static uint32_t reg(int kind, const char *domain, const char *name) {
    uint32_t id = 0;
    CHECK(mxp_object_register(kind, domain, strlen(domain), name, strlen(name), &id) == MXP_OK);
    return id;
}

static void fresh(void) {
    mxp_reset();
    mxp_flags_update(MXP_FLAG_RECORD | MXP_FLAG_TRACE | MXP_FLAG_AGGREGATE, 0);
}

static mxp_stat stat_of(uint32_t id) {
    static mxp_stat out[4096];
    uint32_t n = 0;
    mxp_stat none = {0};
    if (mxp_stats_snapshot(out, 4096, &n, 0) != MXP_OK) return none;
    for (uint32_t i = 0; i < n; i++)
        if (out[i].id == id) return out[i];
    return none;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    if (p) p[n] = '\0';
    fclose(f);
    if (len) *len = (size_t)n;
    return p;
}

/* (Not strstr: sanitizers' strstr re-measures the haystack on every call.) */
static size_t count_of(const char *hay, const char *needle) {
    size_t n = 0, k = strlen(needle);
    for (const char *p = hay; *p; p++)
        if (*p == *needle && strncmp(p, needle, k) == 0) n++;
    return n;
}

/* The file is one complete document: opening, closing, and balanced braces
 * outside strings. */
static int complete_json(const char *s) {
    int depth = 0, in_str = 0;
    if (s[0] != '{' || strstr(s, "\"traceEvents\":[") == NULL) return 0;
    for (const char *p = s; *p; p++) {
        if (in_str) {
            if (*p == '\\') p++;
            else if (*p == '"') in_str = 0;
            continue;
        }
        if (*p == '"') in_str = 1;
        else if (*p == '{' || *p == '[') depth++;
        else if (*p == '}' || *p == ']') depth--;
        if (depth < 0) return 0;
    }
    return depth == 0 && !in_str;
}

static void set_path(const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", tmpdir, name);
    CHECK(mxp_trace_path_set(out, strlen(out)) == MXP_OK);
}

/* ---- tests ---- */

static void test_json_escaping(void) {
    char in[256];
    for (int i = 0; i < 256; i++) in[i] = (char)(i == 0 ? 1 : i);
    in[0] = '\0';
    mxpi_buf b = {0};
    mxpi_buf_json_str(&b, in, sizeof in);
    mxpi_buf_putc(&b, '\0');
    CHECK(!b.failed);
    CHECK(strstr(b.data, "\\u0000\\u0001") == b.data + 1);
    CHECK(strstr(b.data, "\\b\\t\\n\\u000b\\f\\r") != NULL);
    CHECK(strstr(b.data, "\\u001f !\\\"#") != NULL);
    CHECK(strstr(b.data, "[\\u005c]") != NULL);
    for (const char *p = b.data; *p; p++) CHECK((unsigned char)*p >= 0x20);
    mxpi_buf_free(&b);

    mxpi_buf n = {0};
    mxpi_buf_us(&n, 1234567);
    mxpi_buf_putc(&n, ' ');
    mxpi_buf_us(&n, -5);
    mxpi_buf_putc(&n, ' ');
    mxpi_buf_i64(&n, INT64_MIN);
    mxpi_buf_putc(&n, '\0');
    CHECK(strcmp(n.data, "1234.567 -0.005 -9223372036854775808") == 0);
    mxpi_buf_free(&n);
}

/* What a reader makes of one escaped string: "" on success, else why not.
 * The end is found the way Perfetto v52's JSON importer finds it -- the first
 * quote not right after a backslash -- and must be the string's real end;
 * then the escapes are undone (\uXXXX only below 0x80, all the writer uses
 * for these inputs) and must give back the input. */
static const char *misread(const char *in, size_t n, const mxpi_buf *b) {
    if (b->len < 2 || b->data[0] != '"') return "no opening quote";
    size_t end = 1;
    while (end < b->len && !(b->data[end] == '"' && b->data[end - 1] != '\\')) end++;
    if (end != b->len - 1) return "a quote-after-backslash scan ends elsewhere";
    char out[64];
    size_t k = 0;
    for (size_t i = 1; i < end; i++) {
        char c = b->data[i];
        if (c == '\\') {
            c = b->data[++i];
            if (c == 'u') {
                unsigned v = 0;
                for (int j = 0; j < 4; j++) {
                    char h = b->data[++i];
                    v = v * 16 + (unsigned)(h <= '9' ? h - '0' : h - 'a' + 10);
                }
                c = (char)v;
            } else if (c == 'n') {
                c = '\n';
            } else if (c != '"') {
                return "an unexpected escape";
            }
        }
        if (k == sizeof out) return "too long";
        out[k++] = c;
    }
    return k == n && memcmp(out, in, n) == 0 ? "" : "decodes to something else";
}

/* Every string of up to 6 characters from a hostile alphabet: backslashes
 * alone, doubled, last, before a quote.  None may leave "\\" in the output
 * (Perfetto v52 then misplaced the string's end and refused the trace). */
static void test_json_backslashes(void) {
    static const char alphabet[] = {'\\', '"', 'a', '\n'};
    char in[6];
    for (size_t n = 0; n <= sizeof in; n++) {
        size_t total = 1;
        for (size_t i = 0; i < n; i++) total *= sizeof alphabet;
        for (size_t code = 0; code < total; code++) {
            size_t c = code;
            for (size_t i = 0; i < n; i++, c /= sizeof alphabet)
                in[i] = alphabet[c % sizeof alphabet];
            mxpi_buf b = {0};
            mxpi_buf_json_str(&b, in, n);
            CHECK(!b.failed);
            const char *why = misread(in, n, &b);
            int doubled = 0;
            for (size_t i = 1; i < b.len; i++)
                doubled |= b.data[i - 1] == '\\' && b.data[i] == '\\';
            if (*why || doubled) {
                fprintf(stderr, "escaping %.*s (%zu bytes) gave %.*s: %s%s\n", (int)n, in, n,
                        (int)b.len, b.data, why, doubled ? " (has \\\\)" : "");
                failures++;
                mxpi_buf_free(&b);
                return;
            }
            mxpi_buf_free(&b);
        }
    }
    /* The exported function gives the same bytes. */
    char out[32];
    size_t needed = 0;
    CHECK_EQ(mxp_json_escape("a\\", 2, out, sizeof out, &needed), MXP_OK);
    CHECK(needed == 9 && memcmp(out, "\"a\\u005c\"", 9) == 0);
}

static void test_registry(void) {
    uint32_t a = reg(MXP_KIND_TASK, "d", "x");
    CHECK_EQ(reg(MXP_KIND_TASK, "d", "x"), a);
    CHECK(reg(MXP_KIND_FRAME, "d", "x") != a);
    CHECK(reg(MXP_KIND_TASK, "dx", "") != reg(MXP_KIND_TASK, "d", "x"));
    CHECK_EQ(reg(MXP_KIND_EVENT, "any", "e"), reg(MXP_KIND_EVENT, "other", "e"));
    uint32_t id = 0;
    CHECK_EQ(mxp_object_register(99, "d", 1, "n", 1, &id), MXP_E_INVALID);
    const char *name;
    size_t len;
    int kind;
    CHECK(mxp_object_info(a, &kind, &name, &len, NULL, NULL) == MXP_OK);
    CHECK(kind == MXP_KIND_TASK && len == 1 && strcmp(name, "x") == 0);
    CHECK_EQ(mxp_object_info(mxp_object_count(), NULL, NULL, NULL, NULL, NULL), MXP_E_INVALID);
}

static void test_self_time_and_nesting(void) {
    fresh();
    mxp_clock_fake(1, 1000);
    uint32_t outer = reg(MXP_KIND_TASK, "t", "outer"), inner = reg(MXP_KIND_TASK, "t", "inner");
    mxp_range_begin(outer);
    mxp_clock_fake_advance(1000000);
    mxp_range_begin(inner);
    mxp_clock_fake_advance(2000000);
    mxp_range_end(inner);
    mxp_clock_fake_advance(1000000);
    mxp_range_end(outer);
    mxp_stat so = stat_of(outer), si = stat_of(inner);
    CHECK_EQ(so.total, 4000000);
    CHECK_EQ(so.self, 2000000);
    CHECK_EQ(si.total, 2000000);
    CHECK_EQ(si.self, 2000000);

    /* Not LIFO: a [0,2], b [1,3]; self times add up to the wall time. */
    uint32_t a = reg(MXP_KIND_TASK, "t", "a"), b = reg(MXP_KIND_TASK, "t", "b");
    mxp_range_begin(a);
    mxp_clock_fake_advance(1000);
    mxp_range_begin(b);
    mxp_clock_fake_advance(1000);
    mxp_range_end(a);
    mxp_clock_fake_advance(1000);
    mxp_range_end(b);
    CHECK_EQ(stat_of(a).total, 2000);
    CHECK_EQ(stat_of(b).total, 2000);
    CHECK_EQ(stat_of(a).self + stat_of(b).self, 3000);
    mxp_counts c;
    mxp_counts_get(&c);
    CHECK_EQ(c.non_lifo_stops, 1);
    CHECK_EQ(c.unmatched_stops, 0);
    mxp_range_end(a);
    mxp_counts_get(&c);
    CHECK_EQ(c.unmatched_stops, 1);
    mxp_clock_fake(0, 0);
}

/* The tallies reported with the statistics start with them: at a reset, when
 * aggregation turns on, and at mxp_stats_counts_get(.., 1); the process-wide
 * ones go on. */
static void test_stats_tallies(void) {
    fresh();
    uint32_t t = reg(MXP_KIND_TASK, "t", "lone");
    mxp_counts c;
    mxp_range_end(t);
    mxp_stats_counts_get(&c, 1);
    CHECK_EQ(c.unmatched_stops, 1);
    mxp_stats_counts_get(&c, 0);
    CHECK_EQ(c.unmatched_stops, 0);
    mxp_range_end(t);
    mxp_stats_reset();
    mxp_range_end(t);
    mxp_stats_counts_get(&c, 0);
    CHECK_EQ(c.unmatched_stops, 1);
    mxp_flags_update(0, MXP_FLAG_AGGREGATE);
    mxp_range_end(t);
    mxp_flags_update(MXP_FLAG_AGGREGATE, 0);
    mxp_stats_counts_get(&c, 0);
    CHECK_EQ(c.unmatched_stops, 0);
    mxp_counts_get(&c);
    CHECK_EQ(c.unmatched_stops, 4);
}

static void test_tokens(void) {
    fresh();
    uint32_t r = reg(MXP_KIND_TASK, "t", "tok");
    int64_t t1 = mxp_range_begin_token(r), t2 = mxp_range_begin_token(r);
    CHECK(t1 >> 1 != t2 >> 1);
    CHECK_EQ(mxp_range_end_token(r, t1), MXP_OK); /* the older one, not the innermost */
    CHECK_EQ(mxp_range_end_token(r, t2), MXP_OK);
    CHECK_EQ(stat_of(r).count, 2);
    mxp_counts c;
    mxp_counts_get(&c);
    CHECK_EQ(c.unmatched_stops, 0);
    CHECK_EQ(c.non_lifo_stops, 1);
}

/* Durations of one range object, recorded on a thread that then exits
 * (its statistics are retired) or on the calling thread. */
typedef struct {
    uint32_t id;
    const int64_t *durs;
    int n;
} pct_job;

static void *record_durations(void *arg) {
    const pct_job *job = arg;
    for (int i = 0; i < job->n; i++) {
        mxp_range_begin(job->id);
        mxp_clock_fake_advance(job->durs[i]);
        mxp_range_end(job->id);
    }
    return NULL;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The percentiles mxp_stats_snapshot must report for these durations:
 * nearest rank; the smallest and largest exactly, others at their
 * bucket's midpoint kept within [min, max]. */
static void expected_percentiles(int64_t *v, int n, int64_t out[3]) {
    static const double ps[3] = {0.50, 0.90, 0.99};
    qsort(v, (size_t)n, sizeof *v, cmp_i64);
    for (int k = 0; k < 3; k++) {
        uint64_t rank = (uint64_t)(ps[k] * n);
        if ((double)rank < ps[k] * n || rank == 0) rank++;
        if (rank >= (uint64_t)n) {
            out[k] = v[n - 1];
        } else if (rank == 1) {
            out[k] = v[0];
        } else {
            uint32_t b = mxpi_hist_index(v[rank - 1]);
            int64_t mid = mxpi_hist_lower(b) + mxpi_hist_width(b) / 2;
            out[k] = mid < v[0] ? v[0] : mid > v[n - 1] ? v[n - 1] : mid;
        }
    }
}

/* Percentiles read only the buckets between min's and max's: the edges of
 * that span (bucket boundaries, the last bucket) and histograms merged from
 * a live and an exited thread, before and after a reset, give the same
 * values as the nearest rank over the durations themselves. */
static void test_percentiles_over_bucket_edges(void) {
    fresh();
    mxp_clock_fake(1, 0);
    static const int64_t sets[][8] = {
        {127, 128, 129, 191, 192, 255, 256, 257},
        {1, 1, 1, 1, 1, 1, 1, 127},
        {(1LL << 48) - 1, 1LL << 48, (1LL << 48) + 5, 1LL << 50, 3, 7, 1LL << 47, 100000},
        {1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000},
        {64, 4096, 262144, 16777216, 1073741824, 68719476736, 99, 5000},
    };
    char name[16];
    for (int s = 0; s < (int)(sizeof sets / sizeof sets[0]); s++) {
        snprintf(name, sizeof name, "edge%d", s);
        uint32_t id = reg(MXP_KIND_TASK, "pct", name);
        /* Something of the old epoch that the reset must hide. */
        int64_t old[2] = {5, 1LL << 52};
        pct_job before = {id, old, 2};
        record_durations(&before);
        mxp_stats_reset();
        pct_job mine = {id, sets[s], 5}, theirs = {id, sets[s] + 5, 3};
        pthread_t th;
        pthread_create(&th, NULL, record_durations, &theirs);
        pthread_join(th, NULL);
        record_durations(&mine);
        int64_t v[8], want[3];
        memcpy(v, sets[s], sizeof v);
        expected_percentiles(v, 8, want);
        mxp_stat st = stat_of(id);
        CHECK_EQ(st.count, 8);
        CHECK_EQ(st.min, v[0]);
        CHECK_EQ(st.max, v[7]);
        CHECK_EQ(st.p50, want[0]);
        CHECK_EQ(st.p90, want[1]);
        CHECK_EQ(st.p99, want[2]);
    }
    mxp_clock_fake(0, 0);
}

static void test_counters(void) {
    fresh();
    uint32_t c = reg(MXP_KIND_COUNTER, "m", "c");
    mxp_counter_set(c, 10);
    mxp_counter_add(c, -15);
    CHECK_EQ(mxp_counter_value(c), -5);
    mxp_counter_set(c, INT64_MAX - 1);
    mxp_counter_add(c, 100);
    CHECK_EQ(mxp_counter_value(c), INT64_MAX);
    mxp_stat s = stat_of(c);
    CHECK_EQ(s.count, 4);
    CHECK_EQ(s.min, -5);
    CHECK_EQ(s.max, INT64_MAX);
    CHECK_EQ(s.last, INT64_MAX);
    CHECK_EQ(mxp_counter_set(reg(MXP_KIND_TASK, "m", "not a counter"), 1), MXP_E_INVALID);
}

static uint64_t saturated_now(void) {
    mxp_counts c;
    mxp_counts_get(&c);
    return c.saturated_values;
}

/* Results beyond int64 are held at the limit and tallied once each, in every
 * state; wide deltas are exact up to the limit (no tally when it is reached
 * exactly). */
static void test_counter_saturation(void) {
    fresh();
    uint32_t c = reg(MXP_KIND_COUNTER, "m", "sat");
    const uint64_t two63 = (uint64_t)1 << 63;
    mxp_counter_set(c, INT64_MAX - 1);
    mxp_counter_add(c, 1);
    CHECK_EQ(saturated_now(), 0); /* exactly the limit */
    mxp_counter_add(c, 1);
    CHECK_EQ(mxp_counter_value(c), INT64_MAX);
    CHECK_EQ(saturated_now(), 1);
    mxp_counter_set(c, INT64_MIN + 1);
    mxp_counter_add(c, -2);
    CHECK_EQ(mxp_counter_value(c), INT64_MIN);
    CHECK_EQ(saturated_now(), 2);
    /* Wide deltas: exact where the result fits. */
    mxp_counter_set(c, -5);
    CHECK_EQ(mxp_counter_add_wide(c, 0, two63), MXP_OK);
    CHECK_EQ(mxp_counter_value(c), INT64_MAX - 4);
    CHECK_EQ(saturated_now(), 2);
    mxp_counter_add_wide(c, 0, two63);
    CHECK_EQ(mxp_counter_value(c), INT64_MAX);
    CHECK_EQ(saturated_now(), 3);
    mxp_counter_add_wide(c, 1, UINT64_MAX); /* INT64_MAX - (2**64 - 1) == INT64_MIN */
    CHECK_EQ(mxp_counter_value(c), INT64_MIN);
    mxp_counter_add_wide(c, 0, UINT64_MAX);
    CHECK_EQ(mxp_counter_value(c), INT64_MAX);
    CHECK_EQ(saturated_now(), 3);
    mxp_counter_add_wide(c, 1, two63 + 1);
    CHECK_EQ(mxp_counter_value(c), -2);
    mxp_counter_add_wide(c, 1, two63);
    CHECK_EQ(mxp_counter_value(c), INT64_MIN);
    CHECK_EQ(saturated_now(), 4);
    /* Subtracting INT64_MIN: no negation overflows. */
    mxp_counter_set(c, -1);
    CHECK_EQ(mxp_counter_sub(c, INT64_MIN), MXP_OK);
    CHECK_EQ(mxp_counter_value(c), INT64_MAX);
    CHECK_EQ(saturated_now(), 4);
    mxp_counter_set(c, 0);
    mxp_counter_sub(c, INT64_MIN);
    CHECK_EQ(mxp_counter_value(c), INT64_MAX);
    mxp_counter_sub(c, 7);
    CHECK_EQ(mxp_counter_value(c), INT64_MAX - 7);
    CHECK_EQ(saturated_now(), 5);
    /* A value beyond the limit, set. */
    CHECK_EQ(mxp_counter_saturate(c, 0, 0), MXP_OK);
    CHECK_EQ(mxp_counter_value(c), INT64_MAX);
    CHECK_EQ(mxp_counter_saturate(c, 1, 0), MXP_OK);
    CHECK_EQ(mxp_counter_value(c), INT64_MIN);
    CHECK_EQ(saturated_now(), 7);
    mxp_stat s = stat_of(c);
    CHECK_EQ(s.count, 19); /* every update was a sample */
    CHECK_EQ(s.max, INT64_MAX);
    CHECK_EQ(s.last, INT64_MIN);
    /* Not recording: the value and the tally still change; no sample, and an
     * initial value is not an ignored call. */
    mxp_flags_update(0, MXP_FLAG_RECORD);
    mxp_counts before;
    mxp_counts_get(&before);
    CHECK_EQ(mxp_counter_saturate(c, 0, 1), MXP_OK);
    CHECK_EQ(mxp_counter_value(c), INT64_MAX);
    mxp_counter_add(c, 1);
    mxp_counts after;
    mxp_counts_get(&after);
    CHECK_EQ(after.saturated_values, 9);
    CHECK_EQ(after.ignored_calls - before.ignored_calls, 1); /* the add only */
    CHECK_EQ(stat_of(c).count, 19);
    /* Not a counter: refused, nothing tallied. */
    uint32_t task = reg(MXP_KIND_TASK, "m", "not a counter");
    CHECK_EQ(mxp_counter_saturate(task, 0, 0), MXP_E_INVALID);
    CHECK_EQ(mxp_counter_add_wide(task, 0, two63), MXP_E_INVALID);
    CHECK_EQ(saturated_now(), 9);
    mxp_reset();
    CHECK_EQ(saturated_now(), 0);
}

/* A reset snapshot that does not fit reports how many it needs and resets
 * nothing: the same statistics are there for the retry. */
static void test_snapshot_too_small_keeps_everything(void) {
    fresh();
    uint32_t a = reg(MXP_KIND_COUNTER, "m", "a"), b = reg(MXP_KIND_COUNTER, "m", "b");
    mxp_counter_set(a, 1);
    mxp_counter_set(b, 2);
    mxp_stat out[2];
    uint32_t n = 0;
    CHECK_EQ(mxp_stats_snapshot(out, 1, &n, 1), MXP_E_FULL);
    CHECK_EQ(n, 2);
    CHECK_EQ(mxp_stats_snapshot(out, 2, &n, 1), MXP_OK);
    CHECK_EQ(n, 2);
    CHECK_EQ(out[0].count + out[1].count, 2);
    CHECK_EQ(mxp_stats_snapshot(out, 2, &n, 0), MXP_OK);
    CHECK_EQ(n, 0); /* that one reset them */
}

static void test_flush_and_cap(void) {
    fresh();
    char path[512];
    mxp_max_events_set(100);
    CHECK_EQ(mxp_trace_flush(0), MXP_E_STATE); /* no profile */
    mxp_profile_begin();
    set_path("cap.json", path, sizeof path);
    uint32_t r = reg(MXP_KIND_TASK, "cap", "r");
    for (int i = 0; i < 1000; i++) {
        mxp_range_begin(r);
        mxp_range_end(r);
    }
    CHECK_EQ(mxp_trace_flush(0), MXP_OK);
    char *text = read_file(path, NULL);
    CHECK(text && complete_json(text));
    CHECK_EQ(text ? count_of(text, "\"ph\":\"X\"") : 0, 100);
    CHECK(text && strstr(text, "\"dropped_events\":900") != NULL);
    free(text);
    /* Written records free their slots under the cap. */
    for (int i = 0; i < 50; i++) {
        mxp_range_begin(r);
        mxp_range_end(r);
    }
    CHECK_EQ(mxp_trace_flush(1), MXP_OK);
    text = read_file(path, NULL);
    CHECK_EQ(text ? count_of(text, "\"ph\":\"X\"") : 0, 150);
    free(text);
    CHECK_EQ(stat_of(r).count, 1050);
    mxp_max_events_set(0);
}

/* A thread that recorded once and then idles keeps slots reserved under the
 * old cap; a new cap must still hold exactly, without waiting for it. */
static pthread_barrier_t idle_barrier;

static void *idle_recorder(void *arg) {
    uint32_t r = *(uint32_t *)arg;
    mxp_range_begin(r);
    mxp_range_end(r);
    pthread_barrier_wait(&idle_barrier); /* recorded */
    pthread_barrier_wait(&idle_barrier); /* the main thread is done */
    return NULL;
}

static void test_new_cap_with_idle_threads(void) {
    fresh();
    char path[512];
    mxp_profile_begin();
    set_path("idle.json", path, sizeof path);
    uint32_t r = reg(MXP_KIND_TASK, "idle", "r");
    pthread_t th[3];
    pthread_barrier_init(&idle_barrier, NULL, 4);
    for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, idle_recorder, &r);
    pthread_barrier_wait(&idle_barrier);
    mxp_max_events_set(100); /* 3 buffered: 97 more fit */
    for (int i = 0; i < 1000; i++) {
        mxp_range_begin(r);
        mxp_range_end(r);
    }
    CHECK_EQ(mxp_trace_flush(0), MXP_OK);
    char *text = read_file(path, NULL);
    CHECK_EQ(text ? count_of(text, "\"ph\":\"X\"") : 0, 100);
    free(text);
    pthread_barrier_wait(&idle_barrier);
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&idle_barrier);
    mxp_max_events_set(0);
}

static void test_failed_write_keeps_records(void) {
    fresh();
    mxp_profile_begin();
    char bad[512], good[512];
    snprintf(bad, sizeof bad, "%s/missing/x.json", tmpdir);
    CHECK(mxp_trace_path_set(bad, strlen(bad)) == MXP_OK);
    uint32_t r = reg(MXP_KIND_TASK, "io", "r");
    for (int i = 0; i < 10; i++) {
        mxp_range_begin(r);
        mxp_range_end(r);
    }
    CHECK_EQ(mxp_trace_flush(0), MXP_E_IO);
    CHECK_EQ(mxp_trace_errno(), ENOENT);
    snprintf(good, sizeof good, "%s/good.json", tmpdir);
    /* The switch tries the old path once more, reports it, and switches. */
    CHECK_EQ(mxp_trace_path_set(good, strlen(good)), MXP_E_IO);
    CHECK_EQ(mxp_trace_flush(1), MXP_OK);
    char *text = read_file(good, NULL);
    CHECK(text && complete_json(text));
    CHECK_EQ(text ? count_of(text, "\"ph\":\"X\"") : 0, 10);
    free(text);
}

/* A FIFO is refused at once (open() would wait for a reader for good), and
 * a file removed under the writer fails the flush instead of taking the
 * records with it; the next flush makes the file anew. */
static void test_pipes_and_vanished_files(void) {
    fresh();
    mxp_profile_begin();
    char fifo[512], path[512];
    snprintf(fifo, sizeof fifo, "%s/fifo.json", tmpdir);
    CHECK(mkfifo(fifo, 0600) == 0);
    CHECK(mxp_trace_path_set(fifo, strlen(fifo)) == MXP_OK);
    uint32_t r = reg(MXP_KIND_TASK, "io", "v");
    for (int i = 0; i < 4; i++) {
        mxp_range_begin(r);
        mxp_range_end(r);
    }
    CHECK_EQ(mxp_trace_flush(0), MXP_E_IO);
    CHECK_EQ(mxp_trace_errno(), ESPIPE);
    CHECK_EQ(mxp_trace_pending(), 4);
    snprintf(path, sizeof path, "%s/vanish.json", tmpdir);
    CHECK_EQ(mxp_trace_path_set(path, strlen(path)), MXP_E_IO); /* the FIFO, once more */
    unlink(fifo);
    CHECK_EQ(mxp_trace_flush(0), MXP_OK);
    CHECK(unlink(path) == 0);
    for (int i = 0; i < 6; i++) {
        mxp_range_begin(r);
        mxp_range_end(r);
    }
    CHECK_EQ(mxp_trace_flush(0), MXP_E_IO);
    CHECK_EQ(mxp_trace_errno(), ESTALE);
    CHECK_EQ(mxp_trace_pending(), 6);
    CHECK_EQ(mxp_trace_flush(1), MXP_OK);
    char *text = read_file(path, NULL);
    CHECK(text && complete_json(text));
    CHECK_EQ(text ? count_of(text, "\"ph\":\"X\"") : 0, 6);
    free(text);
}

static void test_histogram_buckets(void) {
    /* Every value falls in its bucket, buckets tile the line, widths <= 1/64.
     * (v grows by 1 at first, then geometrically.)  Larger values share the
     * last bucket. */
    for (int64_t v = 0; v < ((int64_t)1 << MXPI_HIST_MAX_BITS); v += 1 + v / 97) {
        uint32_t b = mxpi_hist_index(v);
        int64_t lo = mxpi_hist_lower(b), w = mxpi_hist_width(b);
        if (!(lo <= v && v < lo + w)) {
            CHECK(lo <= v && v < lo + w);
            break;
        }
        CHECK(b == MXPI_HIST_BUCKETS - 1 || w == 1 || w * 64 <= lo);
        if (b + 1 < MXPI_HIST_BUCKETS) CHECK_EQ(mxpi_hist_lower(b + 1), lo + w);
    }
    CHECK_EQ(mxpi_hist_index(-5), 0);
    CHECK_EQ(mxpi_hist_index(INT64_MAX), MXPI_HIST_BUCKETS - 1);
}

static void test_percentiles_and_recorded_time(void) {
    fresh();
    mxp_clock_fake(1, 0);
    mxp_flags_update(0, MXP_FLAG_RECORD);
    mxp_stats_reset();
    mxp_flags_update(MXP_FLAG_RECORD, 0);
    uint32_t r = reg(MXP_KIND_TASK, "pct", "r"), one = reg(MXP_KIND_TASK, "pct", "one");
    for (int64_t ms = 1; ms <= 1000; ms++) { /* 1 ms .. 1000 ms, shuffled order does not matter */
        mxp_range_begin(r);
        mxp_clock_fake_advance(((ms * 7919) % 1000 + 1) * 1000000);
        mxp_range_end(r);
    }
    mxp_range_begin(one);
    mxp_clock_fake_advance(123456789);
    mxp_range_end(one);
    mxp_stat s = stat_of(r);
    int64_t want[3] = {500000000, 900000000, 990000000};
    int64_t got[3] = {s.p50, s.p90, s.p99};
    for (int k = 0; k < 3; k++) {
        double err = (double)(got[k] - want[k]) / (double)want[k];
        if (err < -0.01 || err > 0.01) fprintf(stderr, "p%d: %lld vs %lld\n", k, (long long)got[k], (long long)want[k]);
        CHECK(err >= -0.01 && err <= 0.01);
    }
    mxp_stat o = stat_of(one);
    CHECK(o.p50 == 123456789 && o.p90 == 123456789 && o.p99 == 123456789); /* clamped to min/max */
    /* Recorded time: 1000 ranges' worth plus the single one, then a pause. */
    int64_t recorded = mxp_stats_recorded_ns();
    CHECK_EQ(recorded, 500500LL * 1000000 + 123456789);
    mxp_flags_update(0, MXP_FLAG_RECORD);
    mxp_clock_fake_advance(5000000000LL); /* not recording: does not count */
    CHECK_EQ(mxp_stats_recorded_ns(), recorded);
    mxp_stats_reset();
    CHECK_EQ(mxp_stats_recorded_ns(), 0);
    CHECK_EQ(stat_of(r).count, 0);
    mxp_clock_fake(0, 0);
}

#define THREADS 4
#define PER_THREAD 50000

static uint32_t mt_range, mt_counter;

static void *recorder(void *arg) {
    (void)arg;
    for (int i = 0; i < PER_THREAD; i++) {
        mxp_range_begin(mt_range);
        mxp_counter_add(mt_counter, 1);
        mxp_range_end(mt_range);
    }
    return NULL;
}

static void test_threads_record_while_draining(void) {
    fresh();
    mxp_profile_begin();
    char path[512];
    set_path("threads.json", path, sizeof path);
    mt_range = reg(MXP_KIND_TASK, "mt", "r");
    mt_counter = reg(MXP_KIND_COUNTER, "mt", "c");
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) pthread_create(&th[i], NULL, recorder, NULL);
    int flushes = 0;
    for (int i = 0; i < 20; i++) {
        CHECK_EQ(mxp_trace_flush(0), MXP_OK);
        mxp_stat s = stat_of(mt_range);
        CHECK(s.count <= (uint64_t)THREADS * PER_THREAD);
        if (i % 5 == 0) mxp_stats_reset();
        flushes++;
        usleep(2000);
    }
    for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
    CHECK_EQ(mxp_trace_flush(1), MXP_OK);
    size_t len = 0;
    char *text = read_file(path, &len);
    CHECK(text && complete_json(text));
    CHECK_EQ(text ? count_of(text, "\"ph\":\"X\"") : 0, THREADS * PER_THREAD);
    CHECK_EQ(text ? count_of(text, "\"ph\":\"C\"") : 0, THREADS * PER_THREAD);
    /* Each thread's name: before its first event, and in the tail. */
    CHECK_EQ(text ? count_of(text, "\"name\":\"thread_name\"") : 0, 2 * THREADS);
    free(text);
    CHECK_EQ(mxp_counter_value(mt_counter), THREADS * PER_THREAD);
    CHECK(flushes == 20);
}

/* ---- the flight recorder: trims and snapshots while threads record ---- */

static char *snapshot_text(const char *name, int64_t from, int64_t to) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    CHECK_EQ(mxp_snapshot_write(path, strlen(path), from, to, "\"why\":1", 7), MXP_OK);
    char *text = read_file(path, NULL);
    CHECK(text && complete_json(text));
    CHECK(text && count_of(text, "\"why\":1") == 1);
    return text;
}

static void test_ring_while_recording(void) {
    fresh();
    mxp_profile_begin(); /* no path: a flight recorder's profile */
    mt_range = reg(MXP_KIND_TASK, "ring", "r");
    mt_counter = reg(MXP_KIND_COUNTER, "ring", "c");
    uint32_t open_range = reg(MXP_KIND_TASK, "ring", "open");
    CHECK_EQ(mxp_trace_flush(0), MXP_E_STATE); /* nothing to write to */
    mxp_range_begin(open_range);
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) pthread_create(&th[i], NULL, recorder, NULL);
    for (int i = 0; i < 20; i++) {
        /* keep the last 5 ms, at most 20,000 records */
        CHECK_EQ(mxp_ring_trim(5000000, 20000), MXP_OK);
        int64_t now = mxp_clock_ns();
        char name[32];
        snprintf(name, sizeof name, "ring%d.json", i);
        free(snapshot_text(name, now - 5000000, now));
        usleep(2000);
    }
    for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 100; i++) {
        mxp_range_begin(mt_range);
        mxp_range_end(mt_range);
    }
    /* Everything still buffered is in a snapshot of all time, once. */
    CHECK_EQ(mxp_ring_trim(INT64_MAX / 4, 0), MXP_OK);
    uint64_t kept = mxp_trace_pending();
    int64_t now = mxp_clock_ns();
    char *text = snapshot_text("all.json", INT64_MIN / 4, now);
    size_t ranges = text ? count_of(text, "\"name\":\"r\"") : 0;
    /* (and the counter's last value trimmed away, at the start) */
    CHECK_EQ(ranges + (text ? count_of(text, "\"ph\":\"C\"") : 0), kept + 1);
    CHECK(ranges >= 100);
    /* the open range, cut at the snapshot's end; the counter's value */
    CHECK_EQ(text ? count_of(text, "\"cut_short\":true") : 0, 1);
    free(text);
    CHECK_EQ(mxp_trace_pending(), kept); /* a snapshot consumes nothing */
    /* The cap: the oldest go, and the floor moves. */
    int64_t floor = mxp_ring_floor_ns();
    CHECK_EQ(mxp_ring_trim(INT64_MAX / 4, 50), MXP_OK);
    CHECK(mxp_trace_pending() <= 50);
    CHECK(mxp_ring_floor_ns() > floor);
    /* A window after all the records: only the counter's last value and the open range. */
    CHECK_EQ(mxp_ring_trim(0, 0), MXP_OK);
    CHECK_EQ(mxp_trace_pending(), 0);
    now = mxp_clock_ns();
    text = snapshot_text("empty.json", now - 1000, now);
    char want[64];
    snprintf(want, sizeof want, "{\"c\":%d}", THREADS * PER_THREAD);
    CHECK_EQ(text ? count_of(text, "\"name\":\"r\"") : 0, 0);
    CHECK_EQ(text ? count_of(text, want) : 0, 1);
    CHECK_EQ(text ? count_of(text, "\"cut_short\":true") : 0, 1);
    free(text);
    mxp_range_end(open_range);
    /* A profile with a trace path is no ring. */
    char path[512];
    set_path("notring.json", path, sizeof path);
    CHECK_EQ(mxp_ring_trim(0, 0), MXP_E_STATE);
    CHECK_EQ(mxp_snapshot_write(path, strlen(path), 0, now, "", 0), MXP_E_STATE);
}

/* ---- ranges closed by other threads: cuts racing with owners, handoffs ---- */

#define RACERS 3
#define RACE_RANGES 20000
#define RACE_CUTS 50
static uint32_t race_range;
static _Atomic int racers_done, cuts_made;
static _Atomic long race_begun;

/* Each racer records until it has made RACE_RANGES ranges and the cutter
 * RACE_CUTS cuts, so the two overlap however the threads are scheduled. */
static void *racer(void *arg) {
    (void)arg;
    long i = 0;
    for (; i < RACE_RANGES || atomic_load(&cuts_made) < RACE_CUTS; i++) {
        mxp_range_begin(race_range);
        mxp_range_end(race_range);
    }
    atomic_fetch_add(&race_begun, i);
    atomic_fetch_add(&racers_done, 1);
    return NULL;
}

/* Cuts race with owners ending the same ranges: each range is recorded
 * exactly once, by its owner or by a cut, and no end is misuse. */
static void test_cuts_race_with_owners(void) {
    fresh();
    race_range = reg(MXP_KIND_TASK, "race", "r");
    atomic_store(&racers_done, 0);
    atomic_store(&cuts_made, 0);
    atomic_store(&race_begun, 0);
    pthread_t th[RACERS];
    for (int i = 0; i < RACERS; i++) pthread_create(&th[i], NULL, racer, NULL);
    while (atomic_load(&racers_done) < RACERS) {
        CHECK(mxp_ranges_cut() >= 0);
        atomic_fetch_add(&cuts_made, 1);
    }
    for (int i = 0; i < RACERS; i++) pthread_join(th[i], NULL);
    mxp_counts c;
    mxp_counts_get(&c);
    CHECK_EQ(stat_of(race_range).count, atomic_load(&race_begun));
    CHECK_EQ(c.unmatched_stops, 0);
    CHECK_EQ(c.non_lifo_stops, 0);
    CHECK(atomic_load(&cuts_made) >= RACE_CUTS);
}

static _Atomic int handoff_turn;

static void *handoff_consumer(void *arg) {
    int n = *(int *)arg;
    for (int i = 0; i < n; i++) {
        while (atomic_load(&handoff_turn) != 1) sched_yield();
        mxp_range_end(race_range);
        atomic_store(&handoff_turn, 0);
    }
    return NULL;
}

/* A range begun on one thread and ended on another is recorded once, as
 * an async range of the thread that ended it. */
static void test_end_on_another_thread(void) {
    fresh();
    mxp_profile_begin();
    char path[512];
    set_path("handoff.json", path, sizeof path);
    race_range = reg(MXP_KIND_TASK, "race", "handoff");
    int n = 500;
    atomic_store(&handoff_turn, 0);
    pthread_t th;
    pthread_create(&th, NULL, handoff_consumer, &n);
    for (int i = 0; i < n; i++) {
        mxp_range_begin(race_range);
        atomic_store(&handoff_turn, 1);
        while (atomic_load(&handoff_turn) != 0) sched_yield();
    }
    pthread_join(th, NULL);
    mxp_counts c;
    mxp_counts_get(&c);
    CHECK_EQ(stat_of(race_range).count, n);
    CHECK_EQ(c.unmatched_stops, 0);
    mxp_range_end(race_range); /* each begin was ended already */
    mxp_counts_get(&c);
    CHECK_EQ(c.unmatched_stops, 1);
    CHECK_EQ(mxp_trace_flush(1), MXP_OK);
    size_t len = 0;
    char *text = read_file(path, &len);
    CHECK(text && complete_json(text));
    CHECK_EQ(text ? count_of(text, "\"ph\":\"b\"") : 0, n);
    CHECK_EQ(text ? count_of(text, "\"ph\":\"e\"") : 0, n);
    CHECK_EQ(text ? count_of(text, "\"ph\":\"X\"") : 0, 0);
    free(text);
}

/* ---- the other formats: gzip JSON and Perfetto, flushed while threads record ---- */

static void *format_recorder(void *arg) {
    (void)arg;
    for (int i = 0; i < 20000; i++) {
        mxp_range_begin(mt_range);
        mxp_counter_add(mt_counter, 1);
        mxp_range_end(mt_range);
    }
    return NULL;
}

static void record_format(const char *name, char *path, size_t cap) {
    fresh();
    mxp_profile_begin();
    set_path(name, path, cap);
    mt_range = reg(MXP_KIND_TASK, "fmt", "r");
    mt_counter = reg(MXP_KIND_COUNTER, "fmt", "c");
    uint32_t mark = reg(MXP_KIND_MARKER, "fmt", "m");
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, format_recorder, NULL);
    for (int i = 0; i < 10; i++) {
        mxp_marker_mark(mark, MXP_SCOPE_THREAD);
        CHECK_EQ(mxp_trace_flush(0), MXP_OK);
        usleep(1000);
    }
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    CHECK_EQ(mxp_trace_flush(1), MXP_OK);
}

#ifdef MXPI_HAVE_ZLIB
/* Inflate every member of a gzip file into a NUL-terminated string. */
static char *gunzip_all(const char *path) {
    size_t n = 0;
    char *in = read_file(path, &n);
    if (in == NULL) return NULL;
    mxpi_buf out = {0};
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, 31) != Z_OK) return NULL;
    z.next_in = (Bytef *)in;
    z.avail_in = (uInt)n;
    char chunk[1 << 16];
    int rc = Z_OK;
    while (z.avail_in > 0 && (rc == Z_OK || rc == Z_STREAM_END)) {
        if (rc == Z_STREAM_END) inflateReset(&z); /* the next member */
        z.next_out = (Bytef *)chunk;
        z.avail_out = sizeof chunk;
        rc = inflate(&z, Z_NO_FLUSH);
        mxpi_buf_put(&out, chunk, sizeof chunk - z.avail_out);
    }
    inflateEnd(&z);
    free(in);
    mxpi_buf_putc(&out, '\0');
    return rc == Z_STREAM_END ? out.data : (mxpi_buf_free(&out), NULL);
}
#endif

static void test_other_formats(void) {
    char path[512];
#ifdef MXPI_HAVE_ZLIB
    record_format("t.json.gz", path, sizeof path);
    char *text = gunzip_all(path);
    CHECK(text && complete_json(text));
    CHECK_EQ(text ? count_of(text, "\"ph\":\"X\"") : 0, 40000);
    CHECK_EQ(text ? count_of(text, "\"ph\":\"C\"") : 0, 40000);
    CHECK_EQ(text ? count_of(text, "\"ph\":\"i\"") : 0, 10);
    free(text);
#endif
    record_format("t.perfetto-trace", path, sizeof path);
    size_t n = 0;
    unsigned char *data = (unsigned char *)read_file(path, &n);
    CHECK(data != NULL);
    /* The file is whole TracePackets: tag 0x0A, varint length, payload. */
    size_t pos = 0, packets = 0, deltas = 0;
    while (data && pos < n && data[pos] == 0x0A) {
        uint64_t len = 0;
        pos++;
        for (int shift = 0; pos < n; shift += 7) {
            unsigned char byte = data[pos++];
            len |= (uint64_t)(byte & 0x7f) << shift;
            if (!(byte & 0x80)) break;
        }
        /* A thread's events open with their timestamp delta (field 8, tag
         * 0x40) on the thread's sequence, and short: no clock id, no track. */
        if (len > 0 && pos < n && data[pos] == 0x40 && len < 24) deltas++;
        pos += len;
        packets++;
    }
    CHECK_EQ(pos, n);
    /* 40,000 ranges (a begin and an end each), 40,000 samples, 10 marks, and
     * tracks, interned names and the clock snapshot. */
    CHECK(packets >= 40000 * 3 + 10);
    CHECK(deltas >= 40000 * 2);
    free(data);
}

/* ---- memory ---- */

static mxp_memory_stat usage_of(int is_scope, uint32_t key) {
    static mxp_memory_stat out[512];
    uint32_t n = 0;
    mxp_memory_stat none = {0};
    if (mxp_memory_usage(out, 512, &n) != MXP_OK) return none;
    for (uint32_t i = 0; i < n; i++)
        if (out[i].is_scope == (uint32_t)is_scope && out[i].key == key) return out[i];
    return none;
}

static void test_memory_accounting(void) {
    fresh();
    uint32_t gpu = 0, cpu = 0, again = 0;
    uint64_t h = 0;
    CHECK_EQ(mxp_memory_device(MXP_DEVICE_GPU, 1, &gpu), MXP_OK);
    CHECK_EQ(mxp_memory_device(MXP_DEVICE_CPU, 0, &cpu), MXP_OK);
    CHECK_EQ(mxp_memory_device(MXP_DEVICE_GPU, 1, &again), MXP_OK);
    CHECK_EQ(again, gpu);
    CHECK_EQ(mxp_memory_device(7, 0, &again), MXP_E_INVALID);
    /* Off until MXP_FLAG_MEMORY. */
    CHECK_EQ(mxp_memory_alloc(0x1000, 10, 0, gpu, 0, 0, 0, &h), MXP_E_STATE);
    mxp_flags_update(MXP_FLAG_MEMORY, 0);
    uint32_t layer = reg(MXP_KIND_SCOPE, "", "net:layer1:");
    uint32_t tag = reg(MXP_KIND_SCOPE, "", "weight");
    CHECK_EQ(mxp_scope_set(layer), MXP_OK);
    CHECK_EQ(mxp_memory_alloc(0x1000, 100, 128, gpu, MXP_SCOPE_OF_THREAD, tag, 0, &h), MXP_OK);
    CHECK_EQ(h, 0x1000);
    CHECK_EQ(mxp_memory_alloc(0, 50, 0, gpu, 0, 0, 1, &h), MXP_OK);
    CHECK(h >> 63); /* a handle */
    uint64_t handle = h;
    CHECK_EQ(mxp_memory_alloc(0x2000, 1, 0, 99, 0, 0, 0, &h), MXP_E_INVALID); /* no such device */
    CHECK_EQ(mxp_memory_alloc(0x2000, 1, 0, gpu, 0, 12345, 0, &h), MXP_E_INVALID); /* no such tag */
    mxp_memory_stat d = usage_of(0, gpu);
    CHECK_EQ(d.current, 178);
    CHECK_EQ(d.peak, 178);
    CHECK_EQ(d.allocs, 2);
    CHECK_EQ(mxp_counter_value(d.counter), 178);
    const char *name, *domain;
    size_t nl, dl;
    int kind;
    CHECK_EQ(mxp_object_info(d.counter, &kind, &name, &nl, &domain, &dl), MXP_OK);
    CHECK(strcmp(name, "Memory: gpu/1") == 0 && strcmp(domain, "Device Storage") == 0);
    mxp_memory_stat sc = usage_of(1, layer);
    CHECK_EQ(sc.current, 128);
    CHECK_EQ(mxp_object_info(sc.counter, &kind, &name, &nl, &domain, &dl), MXP_OK);
    CHECK(strcmp(name, "net:layer1:") == 0 && strcmp(domain, "Scope Storage") == 0);
    CHECK_EQ(usage_of(1, 0).current, 50);
    /* Live table. */
    mxp_alloc live[4];
    uint32_t n = 0;
    CHECK_EQ(mxp_memory_live(live, 1, &n), MXP_E_FULL);
    CHECK_EQ(n, 2);
    CHECK_EQ(mxp_memory_live(live, 4, &n), MXP_OK);
    int seen = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (live[i].ptr == 0x1000) {
            CHECK_EQ(live[i].bytes, 100);
            CHECK_EQ(live[i].actual, 128);
            CHECK_EQ(live[i].scope, layer);
            CHECK_EQ(live[i].tag, tag);
            seen++;
        } else if (live[i].ptr == handle) {
            CHECK_EQ(live[i].reuse, 1);
            seen++;
        }
    }
    CHECK_EQ(seen, 2);
    /* Frees: known, unknown, twice. */
    CHECK_EQ(mxp_memory_free(0x1000), MXP_OK);
    CHECK_EQ(mxp_memory_free(0x1000), MXP_MEMORY_UNKNOWN);
    CHECK_EQ(mxp_memory_free(0xdead), MXP_MEMORY_UNKNOWN);
    mxp_counts counts;
    mxp_counts_get(&counts);
    CHECK_EQ(counts.unknown_frees, 2);
    d = usage_of(0, gpu);
    CHECK_EQ(d.current, 50);
    CHECK_EQ(d.peak, 178);
    CHECK_EQ(d.frees, 1);
    CHECK_EQ(usage_of(1, layer).current, 0);
    /* A pointer allocated again without a free: the old one is freed first. */
    CHECK_EQ(mxp_memory_alloc(0x3000, 10, 0, cpu, 0, 0, 0, &h), MXP_OK);
    CHECK_EQ(mxp_memory_alloc(0x3000, 20, 0, cpu, 0, 0, 0, &h), MXP_OK);
    CHECK_EQ(usage_of(0, cpu).current, 20);
    CHECK_EQ(usage_of(0, cpu).peak, 20);
    /* A statistics reset restarts peaks at what is in use. */
    mxp_stats_reset();
    CHECK_EQ(usage_of(0, gpu).peak, 50);
    CHECK_EQ(usage_of(0, gpu).allocs, 0);
    CHECK_EQ(mxp_memory_free(handle), MXP_OK);
    CHECK_EQ(usage_of(0, gpu).current, 0);
    mxp_scope_set(0);
    mxp_flags_update(0, MXP_FLAG_MEMORY);
}

/* Many live pointers, freed in a scrambled order: the table's deletion must
 * keep every other entry findable. */
static void test_memory_table(void) {
    fresh();
    mxp_flags_update(MXP_FLAG_MEMORY, 0);
    uint32_t cpu = 0;
    mxp_memory_device(MXP_DEVICE_CPU, 0, &cpu);
    enum { N = 20000 };
    for (uint64_t i = 1; i <= N; i++) CHECK_EQ(mxp_memory_alloc(i * 64, (int64_t)i, 0, cpu, 0, 0, 0, NULL), MXP_OK);
    CHECK_EQ(usage_of(0, cpu).current, (int64_t)N * (N + 1) / 2);
    int64_t left = (int64_t)N * (N + 1) / 2;
    int bad = 0;
    for (uint64_t k = 0; k < N; k++) {
        uint64_t i = (k * 7919) % N + 1; /* 7919 is prime to N: a permutation */
        if (mxp_memory_free(i * 64) != MXP_OK) bad++;
        left -= (int64_t)i;
    }
    CHECK_EQ(bad, 0);
    CHECK_EQ(left, 0);
    CHECK_EQ(usage_of(0, cpu).current, 0);
    uint32_t n = 1;
    CHECK_EQ(mxp_memory_live(NULL, 0, &n), MXP_OK);
    CHECK_EQ(n, 0);
    mxp_flags_update(0, MXP_FLAG_MEMORY);
}

#define MEM_THREADS 4
#define MEM_PER_THREAD 20000

static void *mem_worker(void *arg) {
    uint64_t base = ((uint64_t)(uintptr_t)arg + 1) << 40;
    uint32_t slot = 0;
    mxp_memory_device(MXP_DEVICE_GPU, 0, &slot);
    for (uint64_t i = 0; i < MEM_PER_THREAD; i++) {
        mxp_memory_alloc(base + i * 16, 16, 0, slot, MXP_SCOPE_OF_THREAD, 0, 0, NULL);
        /* Free what the neighbouring thread allocated a while ago: frees
         * from another thread than the allocating one. */
        if (i >= 100) mxp_memory_free((((uint64_t)(uintptr_t)arg + 1) % MEM_THREADS + 1) << 40 | (i - 100) * 16);
    }
    return NULL;
}

static void test_memory_threads(void) {
    fresh();
    mxp_flags_update(MXP_FLAG_MEMORY | MXP_FLAG_MEMORY_EVENTS, 0);
    pthread_t th[MEM_THREADS];
    for (uintptr_t i = 0; i < MEM_THREADS; i++) pthread_create(&th[i], NULL, mem_worker, (void *)i);
    for (int i = 0; i < MEM_THREADS; i++) pthread_join(th[i], NULL);
    uint32_t slot = 0;
    mxp_memory_device(MXP_DEVICE_GPU, 0, &slot);
    mxp_memory_stat d = usage_of(0, slot);
    CHECK_EQ(d.allocs, MEM_THREADS * MEM_PER_THREAD);
    mxp_counts counts;
    mxp_counts_get(&counts);
    /* Every free found its allocation or was early (the neighbour had not
     * allocated it yet); together they account for all bytes. */
    CHECK_EQ(d.frees + counts.unknown_frees, MEM_THREADS * (MEM_PER_THREAD - 100));
    CHECK_EQ(d.current, 16 * (int64_t)(d.allocs - d.frees));
    CHECK_EQ(mxp_counter_value(d.counter), d.current);
    mxp_flags_update(0, MXP_FLAG_MEMORY | MXP_FLAG_MEMORY_EVENTS);
}

static void test_memory_trace_and_tracks(void) {
    fresh();
    char path[512];
    mxp_profile_begin();
    set_path("memory.json", path, sizeof path);
    mxp_flags_update(MXP_FLAG_MEMORY | MXP_FLAG_MEMORY_EVENTS, 0);
    uint32_t gpu = 0;
    mxp_memory_device(MXP_DEVICE_GPU, 0, &gpu);
    uint32_t sc = reg(MXP_KIND_SCOPE, "", "conv1:");
    uint32_t tag = reg(MXP_KIND_SCOPE, "", "\"w\"");
    CHECK_EQ(mxp_memory_alloc(0x10, 4096, 0, gpu, sc, tag, 0, NULL), MXP_OK);
    CHECK_EQ(mxp_memory_free(0x10), MXP_OK);
    uint32_t track = 0;
    CHECK_EQ(mxp_track_new("GPU 0 stream 7", 14, &track), MXP_OK);
    uint32_t k = reg(MXP_KIND_GPU, "net", "kernel");
    int64_t now = mxp_clock_ns();
    CHECK_EQ(mxp_range_add(k, track, now, 1500000), MXP_OK);
    CHECK_EQ(mxp_range_add(k, track + 1000, now, 1), MXP_E_INVALID);
    CHECK_EQ(mxp_range_add(reg(MXP_KIND_COUNTER, "net", "c"), track, now, 1), MXP_E_INVALID);
    CHECK_EQ(mxp_trace_flush(1), MXP_OK);
    char *text = read_file(path, NULL);
    CHECK(text && complete_json(text));
    CHECK(text && strstr(text, "\"name\":\"alloc\",\"cat\":\"Device Storage\",\"ph\":\"i\"") != NULL);
    CHECK(text && strstr(text, "\"args\":{\"device\":\"gpu/0\",\"attribute\":\"conv1:\\\"w\\\"\",\"bytes\":4096}") != NULL);
    CHECK(text && strstr(text, "\"name\":\"free\"") != NULL);
    CHECK(text && strstr(text, "\"args\":{\"Memory: gpu/0\":4096}") != NULL);
    CHECK(text && strstr(text, "\"args\":{\"Memory: gpu/0\":0}") != NULL);
    CHECK(text && strstr(text, "\"args\":{\"conv1:\":4096}") != NULL);
    CHECK(text && strstr(text, "\"name\":\"kernel\",\"cat\":\"net,gpu\",\"ph\":\"X\"") != NULL);
    CHECK(text && strstr(text, "\"dur\":1500.000") != NULL);
    CHECK(text && strstr(text, "\"GPU 0 stream 7\"") != NULL);
    free(text);
    mxp_stat s = stat_of(k);
    CHECK_EQ(s.count, 1);
    mxp_flags_update(0, MXP_FLAG_MEMORY | MXP_FLAG_MEMORY_EVENTS);
}

/* Ranges added as they end: a parent's self time leaves out its children. */
static void test_track_self_time(void) {
    fresh();
    mxp_clock_fake(1, 1000000);
    uint32_t track = 0;
    CHECK_EQ(mxp_track_new("bw", 2, &track), MXP_OK);
    uint32_t parent = reg(MXP_KIND_TASK, "t", "parent"), child = reg(MXP_KIND_TASK, "t", "child");
    uint32_t sibling = reg(MXP_KIND_TASK, "t", "sibling");
    /* parent [0, 100) holds children [10, 30) and [40, 70); sibling [100, 150) after it. */
    CHECK_EQ(mxp_range_add(child, track, 10, 20), MXP_OK);
    CHECK_EQ(mxp_range_add(child, track, 40, 30), MXP_OK);
    CHECK_EQ(mxp_range_add(parent, track, 0, 100), MXP_OK);
    CHECK_EQ(mxp_range_add(sibling, track, 100, 50), MXP_OK);
    mxp_stat p = stat_of(parent), c = stat_of(child), sib = stat_of(sibling);
    CHECK_EQ(p.total, 100);
    CHECK_EQ(p.self, 50);
    CHECK_EQ(c.total, 50);
    CHECK_EQ(c.self, 50);
    CHECK_EQ(sib.self, 50);
    mxp_clock_fake(0, 0);
}

/* Tracks made before fork() are the child's too: a GPU stream's and an
 * asyncio task's ranges added in the child are counted as pending, written
 * to the child's trace under the track's name, and in its statistics; the
 * parent's records and its other threads' states stay behind. */
static void *record_once(void *arg) {
    uint32_t r = *(uint32_t *)arg;
    mxp_range_begin(r);
    mxp_range_end(r);
    return NULL;
}

static void test_tracks_survive_fork(void) {
    fresh();
    uint32_t stream = 0, task = 0;
    CHECK_EQ(mxp_track_new("GPU 0 stream 3", 14, &stream), MXP_OK);
    CHECK_EQ(mxp_track_open("task A", 6, &task), MXP_OK);
    uint32_t k = reg(MXP_KIND_GPU, "fork", "kernel"), r = reg(MXP_KIND_TASK, "fork", "step");
    uint32_t other = reg(MXP_KIND_TASK, "fork", "other");
    pthread_t th;
    CHECK(pthread_create(&th, NULL, record_once, &other) == 0);
    pthread_join(th, NULL);
    /* Parent records: never the child's to write. */
    CHECK_EQ(mxp_range_add(k, stream, mxp_clock_ns(), 1000), MXP_OK);
    CHECK_EQ(mxp_track_begin(task, r), MXP_OK); /* open across the fork */
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        failures = 0;
        /* The range begun in the parent still pairs (the child does not
         * record until told to). */
        CHECK_EQ(mxp_track_end(task, r), MXP_OK);
        mxp_stats_reset();
        char path[512];
        mxp_profile_begin();
        set_path("fork-child.json", path, sizeof path);
        mxp_flags_update(MXP_FLAG_RECORD | MXP_FLAG_TRACE | MXP_FLAG_AGGREGATE, 0);
        CHECK_EQ(mxp_trace_pending(), 0);
        CHECK_EQ(mxp_range_add(k, stream, mxp_clock_ns(), 2000), MXP_OK);
        CHECK_EQ(mxp_track_begin(task, r), MXP_OK);
        CHECK_EQ(mxp_track_end(task, r), MXP_OK);
        CHECK_EQ(mxp_trace_pending(), 2);
        CHECK_EQ(stat_of(k).count, 1);
        CHECK_EQ(stat_of(r).count, 1);
        CHECK_EQ(stat_of(other).count, 0);
        CHECK_EQ(mxp_trace_flush(1), MXP_OK);
        CHECK_EQ(mxp_trace_pending(), 0);
        char *text = read_file(path, NULL);
        CHECK(text && complete_json(text));
        CHECK_EQ(text ? count_of(text, "\"name\":\"kernel\"") : 0, 1);
        CHECK_EQ(text ? count_of(text, "\"name\":\"step\"") : 0, 1);
        CHECK_EQ(text ? count_of(text, "\"name\":\"other\"") : 0, 0);
        CHECK_EQ(text ? count_of(text, "\"dur\":2.000") : 0, 1);
        char want[64];
        snprintf(want, sizeof want, "\"tid\":%u,\"args\":{\"name\":\"GPU 0 stream 3\"}", stream);
        CHECK(text && strstr(text, want) != NULL);
        snprintf(want, sizeof want, "\"tid\":%u,\"args\":{\"name\":\"task A\"}", task);
        CHECK(text && strstr(text, want) != NULL);
        free(text);
        mxp_counts counts;
        mxp_counts_get(&counts);
        CHECK_EQ(counts.dropped_events, 0);
        CHECK_EQ(counts.written_events, 2);
        fflush(stderr);
        _exit(failures ? 1 : 0);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK_EQ(mxp_track_end(task, r), MXP_OK);
    CHECK_EQ(mxp_track_close(task), MXP_OK);
    CHECK_EQ(stat_of(r).count, 1);
}

/* The C API's table from several threads at once, with NVTX output on (no
 * NVTX tool here: its calls are no-ops, but names are registered and the
 * non-innermost end takes the split path).  Misuse is tallied. */
#define CAPI_THREADS 4
#define CAPI_ROUNDS 500

static void *capi_worker(void *arg) {
    const mxprof_capi *api = arg;
    uint32_t outer, inner, items, tick;
    api->intern(MXPROF_CAPI_TASK, "capi", "outer", &outer);
    api->intern(MXPROF_CAPI_TASK, "capi", "inner", &inner);
    api->intern(MXPROF_CAPI_COUNTER, "capi", "items", &items);
    api->intern(MXPROF_CAPI_MARKER, "capi", "tick", &tick);
    for (int i = 0; i < CAPI_ROUNDS; i++) {
        api->range_begin(outer);
        api->range_begin(inner);
        api->mark(tick, MXPROF_CAPI_SCOPE_THREAD);
        api->range_end(outer); /* not innermost */
        api->range_end(inner);
        api->counter_add(items, 1);
    }
    return NULL;
}

static void test_capi_threads_and_nvtx(void) {
    mxp_reset();
    const mxprof_capi *api = mxp_capi_table();
    CHECK_EQ(api->major, MXPROF_CAPI_MAJOR);
    CHECK_EQ(api->size, sizeof *api);
    mxp_flags_update(MXP_FLAG_RECORD | MXP_FLAG_AGGREGATE | MXP_FLAG_NVTX, 0);
    CHECK_EQ(api->enabled(), 1);
    pthread_t th[CAPI_THREADS];
    for (int i = 0; i < CAPI_THREADS; i++) pthread_create(&th[i], NULL, capi_worker, (void *)api);
    for (int i = 0; i < CAPI_THREADS; i++) pthread_join(th[i], NULL);
    uint32_t outer, inner, items, tick, id = 0;
    CHECK_EQ(api->intern(MXPROF_CAPI_TASK, "capi", "outer", &outer), MXP_OK);
    CHECK_EQ(api->intern(MXPROF_CAPI_TASK, "capi", "inner", &inner), MXP_OK);
    CHECK_EQ(api->intern(MXPROF_CAPI_COUNTER, "capi", "items", &items), MXP_OK);
    CHECK_EQ(api->intern(MXPROF_CAPI_MARKER, "capi", "tick", &tick), MXP_OK);
    CHECK_EQ(stat_of(outer).count, CAPI_THREADS * CAPI_ROUNDS);
    CHECK_EQ(stat_of(inner).count, CAPI_THREADS * CAPI_ROUNDS);
    CHECK_EQ(stat_of(tick).count, CAPI_THREADS * CAPI_ROUNDS);
    CHECK_EQ(mxp_counter_value(items), CAPI_THREADS * CAPI_ROUNDS);
    mxp_counts c;
    mxp_counts_get(&c);
    CHECK_EQ(c.non_lifo_stops, CAPI_THREADS * CAPI_ROUNDS);
    CHECK_EQ(c.invalid_calls, 0);
    CHECK_EQ(api->intern(MXPROF_CAPI_TASK, "capi", NULL, &id), MXP_E_INVALID);
    CHECK_EQ(api->range_begin(mxp_object_count()), MXP_E_INVALID);
    CHECK_EQ(api->counter_add(outer, 1), MXP_E_INVALID);
    CHECK_EQ(api->mark(tick, 0), MXP_E_INVALID);
    mxp_counts_get(&c);
    CHECK_EQ(c.invalid_calls, 4);
    mxp_flags_update(0, MXP_FLAG_RECORD | MXP_FLAG_AGGREGATE | MXP_FLAG_NVTX);
    CHECK_EQ(api->enabled(), 0);
    mxp_reset();
    mxp_counts_get(&c);
    CHECK_EQ(c.invalid_calls, 0);
}

static _Atomic int64_t lister_tid;
static _Atomic int lister_phase; /* 0 loop, 1 park inside both, 2 parked, 3 leave */
static uint32_t open_outer, open_inner;

static void *ranges_owner(void *arg) {
    (void)arg;
    atomic_store(&lister_tid, (int64_t)syscall(SYS_gettid));
    while (atomic_load(&lister_phase) == 0) {
        mxp_range_begin(open_outer);
        mxp_range_begin(open_inner);
        mxp_range_end(open_inner);
        mxp_range_end(open_outer);
    }
    mxp_range_begin(open_outer);
    mxp_range_begin(open_inner);
    atomic_store(&lister_phase, 2);
    while (atomic_load(&lister_phase) != 3) sched_yield();
    mxp_range_end(open_inner);
    mxp_range_end(open_outer);
    return NULL;
}

/* mxp_ranges_open (mxprof ctl where) reads another thread's stack while its
 * owner edits it: every read is a prefix of the nesting, outermost first,
 * ages never negative; a parked owner shows both; a cut closes them. */
static void test_ranges_open_while_the_owner_edits(void) {
    fresh();
    open_outer = reg(MXP_KIND_TASK, "ctl", "outer");
    open_inner = reg(MXP_KIND_TASK, "ctl", "inner");
    atomic_store(&lister_tid, 0);
    atomic_store(&lister_phase, 0);
    pthread_t th;
    pthread_create(&th, NULL, ranges_owner, NULL);
    while (atomic_load(&lister_tid) == 0) sched_yield();
    int64_t tid = atomic_load(&lister_tid);
    uint32_t ids[8], n = 0, bad = 0, busy = 0;
    int64_t ages[8];
    for (int i = 0; i < 20000; i++) {
        int rc = mxp_ranges_open(tid, ids, ages, 8, &n);
        if (rc == MXP_E_STATE) {
            busy++;
            continue;
        }
        if (rc != MXP_OK || n > 2 || (n >= 1 && ids[0] != open_outer) ||
            (n == 2 && ids[1] != open_inner) || (n >= 1 && ages[0] < 0))
            bad++;
    }
    CHECK_EQ(bad, 0);
    CHECK(busy < 20000);
    atomic_store(&lister_phase, 1);
    while (atomic_load(&lister_phase) != 2) sched_yield();
    CHECK_EQ(mxp_ranges_open(tid, ids, ages, 8, &n), MXP_OK);
    CHECK_EQ(n, 2);
    CHECK_EQ(ids[0], open_outer);
    CHECK_EQ(ids[1], open_inner);
    CHECK(ages[0] >= ages[1] && ages[1] >= 0);
    CHECK_EQ(mxp_ranges_open(tid, ids, ages, 1, &n), MXP_OK); /* cap: the outermost */
    CHECK_EQ(n, 1);
    CHECK_EQ(ids[0], open_outer);
    CHECK_EQ(mxp_ranges_cut(), 2);
    CHECK_EQ(mxp_ranges_open(tid, ids, ages, 8, &n), MXP_OK);
    CHECK_EQ(n, 0);
    atomic_store(&lister_phase, 3);
    pthread_join(th, NULL);
    CHECK_EQ(mxp_ranges_open((int64_t)syscall(SYS_gettid) + 1000000, ids, ages, 8, &n), MXP_OK);
    CHECK_EQ(n, 0); /* a thread the core never saw */
}

int main(void) {
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(tmpdir, sizeof tmpdir, "%s/mxprof-ctest-XXXXXX", base);
    if (mkdtemp(tmpdir) == NULL) {
        perror("mkdtemp");
        return 2;
    }
    mxp_init();
    test_json_escaping();
    test_json_backslashes();
    test_registry();
    test_self_time_and_nesting();
    test_stats_tallies();
    test_tokens();
    test_histogram_buckets();
    test_percentiles_and_recorded_time();
    test_percentiles_over_bucket_edges();
    test_counters();
    test_counter_saturation();
    test_snapshot_too_small_keeps_everything();
    test_flush_and_cap();
    test_new_cap_with_idle_threads();
    test_failed_write_keeps_records();
    test_pipes_and_vanished_files();
    test_threads_record_while_draining();
    test_ring_while_recording();
    test_cuts_race_with_owners();
    test_end_on_another_thread();
    test_other_formats();
    test_memory_accounting();
    test_memory_table();
    test_memory_threads();
    test_memory_trace_and_tracks();
    test_track_self_time();
    test_tracks_survive_fork();
    test_capi_threads_and_nvtx();
    test_ranges_open_while_the_owner_edits();
    mxp_reset();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("native core tests passed\n");
    return 0;
}
