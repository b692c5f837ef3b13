/*
 * test_sampler.c -- pure-C tests of the stack sampler (mxp_pyread.c,
 * mxp_sampler.c) against a synthetic interpreter: thread states, frames,
 * code objects and strings laid out in plain memory at the offsets of a
 * layout chosen here.  Built and run by native/tests/run.sh, also under
 * AddressSanitizer and ThreadSanitizer.
 *
 * What it checks: frames become the right (function, file, line) ids,
 * innermost first; non-ASCII names come out as UTF-8; the interpreter's own
 * frames are skipped and a launcher's code cuts the stack; a coroutine known
 * as a task is found; a code object replaced at the same address is read
 * again; unmapped memory and cycles fail the read instead of faulting; and,
 * with the real sampling thread against a thread that keeps switching
 * ranges while reusing one frame slot, no sample lands in a range its stack
 * did not run in.
 */
#include "mxpi_base.h"

#include "check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>


/* ---- the synthetic interpreter ---- */

enum {
    TS_NEXT = 8, TS_INTERP = 16, TS_NATIVE = 24, TS_THREAD = 32, TS_FRAME = 40,
    TS_CHUNK = 48, TS_TOP = 56, TS_SIZE = 64,
    CHUNK_DATA = 24,
    F_CODE = 0, F_PREV = 8, F_OWNER = 16, F_SIZE = 24,
    CODE_NAME = 16, CODE_FILE = 24, CODE_LINE = 32, CODE_SIZE = 40,
    GEN_FRAME = 32,
    STR_LEN = 16, STR_STATE = 32, STR_ASCII = 40, STR_COMPACT = 56,
}; /* clang-format off */

static char code_type, str_type; /* their addresses stand for PyCode_Type, PyUnicode_Type */

/* The synthetic objects, freed together at the end of each test. */
static void *owned[256];
static int nowned;

static void *own(size_t size) {
    void *p = calloc(1, size);
    if (p != NULL && nowned < 256) owned[nowned++] = p;
    return p;
}

static void free_owned(void) {
    while (nowned > 0) free(owned[--nowned]);
}
static uint64_t interp[4];       /* [0]: the first thread state */

static void put64(void *base, int off, uint64_t v) {
    volatile uint64_t *p = (volatile uint64_t *)((char *)base + off);
    *p = v;
}

static void put32(void *base, int off, uint32_t v) { memcpy((char *)base + off, &v, 4); }

static uint64_t addr(const void *p) { return (uint64_t)(uintptr_t)p; }

/* A compact str: ASCII (kind 1) or two-byte code points. */
static void *make_str(const char *ascii, const uint16_t *ucs2, size_t n) {
    char *s = own(STR_COMPACT + 2 * n + 2);
    put64(s, 8, addr(&str_type));
    put64(s, STR_LEN, n);
    uint32_t kind = ascii ? 1 : 2, state = kind << 2 | 1u << 5 | (ascii ? 1u << 6 : 0);
    put32(s, STR_STATE, state);
    if (ascii)
        memcpy(s + STR_ASCII, ascii, n);
    else
        memcpy(s + STR_COMPACT, ucs2, 2 * n);
    return s;
}

static void *make_code(void *name, void *file, uint32_t line) {
    char *c = own(CODE_SIZE);
    put64(c, 8, addr(&code_type));
    put64(c, CODE_NAME, addr(name));
    put64(c, CODE_FILE, addr(file));
    put32(c, CODE_LINE, line);
    return c;
}

static void set_frame(char *f, void *code, void *prev, uint8_t owner) {
    put64(f, F_CODE, addr(code));
    put64(f, F_PREV, addr(prev));
    f[F_OWNER] = (char)owner;
}

static void layout_set(void) {
    mxp_pylayout l = {
        .interp = addr(interp), .code_type = addr(&code_type), .code_mask = UINT64_MAX,
        .interp_threads = 0, .tstate_next = TS_NEXT, .tstate_interp = TS_INTERP,
        .tstate_native_id = TS_NATIVE, .tstate_thread_id = TS_THREAD, .pthread_tid = -1,
        .tstate_frame = TS_FRAME, .cframe_frame = -1, .tstate_chunk = TS_CHUNK,
        .tstate_top = TS_TOP, .chunk_data = CHUNK_DATA, .frame_code = F_CODE,
        .frame_previous = F_PREV, .frame_owner = F_OWNER, .frame_size = F_SIZE,
        .owner_generator = 1, .owner_skip = 3, .gen_frame = GEN_FRAME, .code_name = CODE_NAME,
        .code_filename = CODE_FILE, .code_firstlineno = CODE_LINE, .str_state = STR_STATE,
        .str_length = STR_LEN, .str_ascii_data = STR_ASCII, .str_compact_data = STR_COMPACT,
        .str_kind_shift = 2, .str_compact_bit = 5, .str_ascii_bit = 6,
    };
    CHECK(mxp_sampler_layout(&l) == MXP_OK);
}

static char *make_tstate(int64_t native) {
    char *ts = own(TS_SIZE);
    put64(ts, TS_INTERP, addr(interp));
    put64(ts, TS_NATIVE, (uint64_t)native);
    return ts;
}

/* The frame ids read for tstate, innermost first, as "name;name;..." */
static int read_names(char *ts, char *out, size_t cap, uint32_t *track) {
    uint32_t ids[64], n = 0;
    int rc = mxp_sampler_read(addr(ts), ids, 64, &n, track);
    out[0] = '\0';
    size_t len = 0;
    for (uint32_t i = 0; i < n; i++) {
        const char *name, *file;
        size_t nl, fl;
        uint32_t line;
        CHECK(mxp_sample_frame_get(ids[i], &name, &nl, &file, &fl, &line) == MXP_OK);
        len += (size_t)snprintf(out + len, cap - len, "%s%.*s@%.*s:%u", i ? ";" : "", (int)nl, name,
                                (int)fl, file, line);
    }
    return rc;
}

static void test_stacks_read_as_python_names_them(void) {
    layout_set();
    char *chunk = own(4096);
    char *f_main = chunk + CHUNK_DATA, *f_shim = f_main + F_SIZE, *f_work = f_shim + F_SIZE;
    void *file = make_str("app.py", NULL, 6);
    void *c_main = make_code(make_str("<module>", NULL, 8), file, 1);
    void *c_shim = make_code(make_str("<shim>", NULL, 6), file, 0);
    const uint16_t lam[] = {0x00e9, 't', 0x00e9, '_', 0x03bb}; /* "été_λ" */
    void *c_work = make_code(make_str(NULL, lam, 5), file, 7);
    set_frame(f_main, c_main, NULL, 0);
    set_frame(f_shim, c_shim, f_main, 3); /* the interpreter's own: not shown */
    set_frame(f_work, c_work, f_shim, 0);
    char *ts = make_tstate(4242);
    put64(ts, TS_FRAME, addr(f_work));
    put64(ts, TS_CHUNK, addr(chunk));
    put64(ts, TS_TOP, addr(f_work + F_SIZE));
    interp[0] = addr(ts);

    char names[512];
    uint32_t track = 1;
    CHECK(read_names(ts, names, sizeof names, &track) == MXP_OK);
    CHECK(strcmp(names, "\xc3\xa9t\xc3\xa9_\xce\xbb@app.py:7;<module>@app.py:1") == 0);
    CHECK(track == 0);

    uint64_t tss[4];
    int64_t tids[4];
    uint32_t n = 0;
    CHECK(mxp_sampler_threads(tss, tids, 4, &n) == MXP_OK);
    CHECK(n == 1 && tss[0] == addr(ts) && tids[0] == 4242);

    /* A generator's frame (in its object, off the chunk) known as a task. */
    char *gen = own(GEN_FRAME + F_SIZE);
    char *f_coro = gen + GEN_FRAME;
    set_frame(f_coro, c_work, f_main, 1);
    put64(ts, TS_FRAME, addr(f_coro));
    CHECK(mxp_sampler_task(addr(gen), 77) == MXP_OK);
    CHECK(read_names(ts, names, sizeof names, &track) == MXP_OK);
    CHECK(track == 77);
    CHECK(mxp_sampler_task(addr(gen), 0) == MXP_OK);
    CHECK(read_names(ts, names, sizeof names, &track) == MXP_OK && track == 0);

    /* A code object replaced at the same address is read again. */
    put64(ts, TS_FRAME, addr(f_work));
    put64(c_work, CODE_NAME, addr(make_str("renamed", NULL, 7)));
    CHECK(read_names(ts, names, sizeof names, &track) == MXP_OK);
    CHECK(strncmp(names, "renamed@app.py:7;", 17) == 0);

    /* A launcher: its code and everything that called it are cut. */
    CHECK(mxp_sampler_cut(addr(c_main)) == MXP_OK);
    CHECK(read_names(ts, names, sizeof names, &track) == MXP_OK);
    CHECK(strcmp(names, "renamed@app.py:7") == 0);

    /* Memory that is gone, and a cycle: the read fails, nothing faults. */
    char *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(page != MAP_FAILED);
    set_frame(page, c_work, f_main, 0);
    put64(ts, TS_FRAME, addr(page));
    CHECK(read_names(ts, names, sizeof names, &track) == MXP_OK);
    munmap(page, 4096);
    CHECK(read_names(ts, names, sizeof names, &track) == MXP_E_IO);
    set_frame(f_work, c_work, f_work, 0);
    put64(ts, TS_FRAME, addr(f_work));
    CHECK(read_names(ts, names, sizeof names, &track) == MXP_E_IO);
    /* A thread state of another interpreter ends the list read. */
    put64(ts, TS_INTERP, 12345);
    CHECK(mxp_sampler_threads(tss, tids, 4, &n) == MXP_E_IO);
    interp[0] = 0;
    free_owned();
}

/* ---- the sampling thread against a thread that switches ranges ---- */

typedef struct mutator {
    char *ts, *slot, *base;
    void *code_a, *code_b;
    uint32_t range_a, range_b;
    _Atomic int ready, stop;
} mutator;

static void spin_us(int us) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    do clock_gettime(CLOCK_MONOTONIC, &b);
    while ((b.tv_sec - a.tv_sec) * 1000000 + (b.tv_nsec - a.tv_nsec) / 1000 < us);
}

/* As CPython runs `with a: fn_a()` then `with b: fn_b()`: the range begins
 * (in __enter__, the caller's frame innermost), the function's frame is
 * pushed into the one slot both use, popped, and the range ends. */
static void *mutate(void *arg) {
    mutator *m = arg;
    put64(m->ts, TS_NATIVE, (uint64_t)syscall(SYS_gettid));
    atomic_store(&m->ready, 1);
    while (!atomic_load(&m->stop)) {
        for (int i = 0; i < 2; i++) {
            mxp_range_begin(i ? m->range_b : m->range_a);
            set_frame(m->slot, i ? m->code_b : m->code_a, m->base, 0);
            put64(m->ts, TS_TOP, addr(m->slot + F_SIZE));
            put64(m->ts, TS_FRAME, addr(m->slot));
            spin_us(30);
            put64(m->ts, TS_FRAME, addr(m->base));
            put64(m->ts, TS_TOP, addr(m->base + F_SIZE));
            mxp_range_end(i ? m->range_b : m->range_a);
        }
    }
    return NULL;
}

static bool leaf_is(uint32_t stack, const char *name) {
    uint32_t parent, frame;
    const char *n, *f;
    size_t nl, fl;
    uint32_t line;
    if (mxp_sample_stack_get(stack, &parent, &frame) != MXP_OK) return false;
    if (mxp_sample_frame_get(frame, &n, &nl, &f, &fl, &line) != MXP_OK) return false;
    return nl == strlen(name) && memcmp(n, name, nl) == 0;
}

static void test_no_sample_lands_in_a_range_its_stack_did_not_run_in(void) {
    mxp_reset();
    mxp_flags_update(MXP_FLAG_RECORD | MXP_FLAG_AGGREGATE, 0);
    layout_set();
    mutator m = {0};
    char *chunk = own(4096);
    void *file = make_str("loop.py", NULL, 7);
    m.base = chunk + CHUNK_DATA;
    m.slot = m.base + F_SIZE;
    set_frame(m.base, make_code(make_str("<module>", NULL, 8), file, 1), NULL, 0);
    m.code_a = make_code(make_str("fn_a", NULL, 4), file, 10);
    m.code_b = make_code(make_str("fn_b", NULL, 4), file, 20);
    m.ts = make_tstate(0);
    put64(m.ts, TS_CHUNK, addr(chunk));
    put64(m.ts, TS_FRAME, addr(m.base));
    put64(m.ts, TS_TOP, addr(m.base + F_SIZE));
    CHECK(mxp_object_register(MXP_KIND_TASK, "d", 1, "phase_a", 7, &m.range_a) == MXP_OK);
    CHECK(mxp_object_register(MXP_KIND_TASK, "d", 1, "phase_b", 7, &m.range_b) == MXP_OK);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, mutate, &m) == 0);
    while (!atomic_load(&m.ready)) sched_yield();
    interp[0] = addr(m.ts);
    CHECK(mxp_sampler_start(20000, MXP_SAMPLE_WALL, 1) == MXP_OK);
    spin_us(600000);
    CHECK(mxp_sampler_stop() == MXP_OK);
    atomic_store(&m.stop, 1);
    pthread_join(t, NULL);
    interp[0] = 0;

    static mxp_sample_count counts[4096];
    uint32_t n = 0;
    CHECK(mxp_sample_counts(counts, 4096, &n, 0) == MXP_OK);
    uint64_t right = 0, wrong = 0;
    for (uint32_t i = 0; i < n; i++) {
        bool a = leaf_is(counts[i].stack, "fn_a"), b = leaf_is(counts[i].stack, "fn_b");
        if ((a && counts[i].range == m.range_a) || (b && counts[i].range == m.range_b)) right += counts[i].n;
        if ((a && counts[i].range != m.range_a) || (b && counts[i].range != m.range_b)) wrong += counts[i].n;
    }
    mxp_sampler_stats st;
    mxp_sampler_stats_get(&st);
    fprintf(stderr, "test_sampler: %llu samples in their range, %llu elsewhere (%llu ticks, "
            "%llu retried, %llu lost)\n", (unsigned long long)right, (unsigned long long)wrong,
            (unsigned long long)st.ticks, (unsigned long long)st.retried, (unsigned long long)st.lost);
    CHECK(right >= 500);
    CHECK(wrong == 0);
    mxp_reset();
    free_owned();
}

int main(void) {
    test_stacks_read_as_python_names_them();
    test_no_sample_lands_in_a_range_its_stack_did_not_run_in();
    if (failures) {
        fprintf(stderr, "%d sampler check(s) failed\n", failures);
        return 1;
    }
    fprintf(stderr, "native sampler tests passed\n");
    return 0;
}
