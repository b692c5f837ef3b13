/*
 * mxp_pyread.c -- reading a CPython interpreter's threads and stacks from a
 * thread of the core, without the GIL.
 *
 * Why not ask Python: the stack sampler must see a thread at the instant it
 * chose, even while another thread holds the GIL in C code for milliseconds
 * (a sampler that needs the GIL samples only when the running thread lets go
 * of it, which biases every share towards waits).  So it reads the
 * interpreter's memory as a debugger would, from inside the process:
 *
 *   interpreter -> thread states (a list) -> innermost frame -> callers
 *   frame -> code object -> name, file, first line (strings)
 *
 * at offsets the binding gives (mxp_pylayout: one per CPython version,
 * checked by the binding against Python's own view before use).
 *
 * Safety: the interpreter changes these structures while they are read (a
 * thread returns from a function, exits, frees its state).  Every read is a
 * copy through the kernel (process_vm_readv on this process), which fails
 * cleanly on an address no longer mapped instead of faulting; where that
 * call is refused (some sandboxes), a pipe does the same (write() of the
 * address fails with EFAULT).  A read may still see memory that was freed
 * and reused: thread states are checked to belong to the interpreter, code
 * objects to have the code type, strings to be well formed, and a stack that
 * cannot be followed whole is given up (the caller tries again).
 *
 * Frames become ids through a cache of code objects (address, and the name,
 * file and line pointers it had: a code object freed and another made at the
 * same address is told apart by them), so a sample usually costs a copy of
 * the frame stack and one batched read of its code objects' headers.
 */
#include "mxpi_pyread.h"
#include "mxpi_sample.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#define OB_TYPE 8               /* PyObject_HEAD: the reference count, then the type */
#define MAX_OFFSET 65536        /* no field we read lies further into its struct */
#define WINDOW (32u << 10)      /* bytes of a thread's frame stack copied at once */
#define FRAME_MAX 512u          /* bytes read of one frame at most */
#define CODE_MAX 256u           /* bytes read of one code object's header at most */
#define NAME_MAX_CHARS 1024u    /* code points kept of a function's name */
#define FILE_MAX_CHARS 4096u    /* and of a file name */
#define BATCH 64u               /* code headers per read */
#define CUTS 16u

static pthread_mutex_t py_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* Under py_lock. */
static mxp_pylayout L;
static bool ready;
static size_t tstate_span, code_span, str_head;
static pid_t self_pid;
static int how;                  /* 0: process_vm_readv, 1: pipe, -1: neither works */
static int pipe_rd = -1, pipe_wr = -1;
static uint64_t cuts[CUTS];
static uint32_t ncuts;

static uint8_t window[WINDOW];
static uint8_t headers[MXPI_PY_DEPTH * CODE_MAX]; /* the code headers of one stack */
static uint8_t raw[FILE_MAX_CHARS * 4];

static void codes_clear(void);
static char text_name[NAME_MAX_CHARS * 4], text_file[FILE_MAX_CHARS * 4];

void mxpi_py_lock(void) { pthread_mutex_lock(&py_lock); }
void mxpi_py_unlock(void) { pthread_mutex_unlock(&py_lock); }
bool mxpi_py_ready(void) { return ready; }

/* ---- safe copies ---- */

static void pipe_close(void) {
    if (pipe_rd >= 0) close(pipe_rd);
    if (pipe_wr >= 0) close(pipe_wr);
    pipe_rd = pipe_wr = -1;
}

static bool pipe_open(void) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) return false;
    pipe_rd = fds[0];
    pipe_wr = fds[1];
    return true;
}

/* One copy through the pipe: what the kernel could read of addr goes in and
 * comes straight back out (the pipe is always left empty). */
static bool peek_pipe(uint64_t addr, void *out, size_t n) {
    uint8_t *o = out;
    while (n > 0) {
        size_t k = n > 4096 ? 4096 : n; /* within PIPE_BUF: one write, never split */
        ssize_t w = write(pipe_wr, (const void *)(uintptr_t)addr, k);
        if (w <= 0) return false;
        for (ssize_t got = 0; got < w;) {
            ssize_t r = read(pipe_rd, o + got, (size_t)(w - got));
            if (r <= 0) {
                if (r < 0 && errno == EINTR) continue;
                pipe_close(); /* out of step: start a clean pipe next time */
                pipe_open();
                return false;
            }
            got += r;
        }
        if ((size_t)w < k) return false;
        addr += k;
        o += k;
        n -= k;
    }
    return true;
}

static bool peek(uint64_t addr, void *out, size_t n) {
    if (n == 0) return true;
    if (addr < 4096 || addr + n < addr) return false;
    if (how == 0) {
        struct iovec local = {out, n}, remote = {(void *)(uintptr_t)addr, n};
        return process_vm_readv(self_pid, &local, 1, &remote, 1, 0) == (ssize_t)n;
    }
    return how == 1 && peek_pipe(addr, out, n);
}

/* Choose how to copy: process_vm_readv unless it is refused (or the
 * environment asks for the pipe: MXPROF_SAFE_READ=pipe, for tests). */
static void choose_how(void) {
    self_pid = getpid();
    pipe_close();
    const char *env = getenv("MXPROF_SAFE_READ");
    bool want_pipe = env != NULL && strcmp(env, "pipe") == 0;
    uint64_t probe = 0x6d787072u, got = 0;
    struct iovec local = {&got, sizeof got}, remote = {&probe, sizeof probe};
    if (!want_pipe && process_vm_readv(self_pid, &local, 1, &remote, 1, 0) == sizeof got &&
        got == probe) {
        how = 0;
        return;
    }
    how = pipe_open() ? 1 : -1;
}

static uint64_t rd64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* ---- fork: the child has its own pid and must not share the parent's pipe ---- */

static void fork_prepare(void) { pthread_mutex_lock(&py_lock); }
static void fork_parent(void) { pthread_mutex_unlock(&py_lock); }
static void fork_child(void) {
    pthread_mutex_init(&py_lock, NULL);
    if (ready) choose_how();
}
/* After the tables' handlers (mxpi_sample_init), so that fork takes py_lock
 * first: a sampler holding it may be waiting for the tables' locks. */
static void init_once(void) {
    mxp_init();
    mxpi_sample_init();
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* ---- the layout ---- */

static bool offset_ok(int32_t v, bool required) { return v < MAX_OFFSET && (v >= 0 || (!required && v == -1)); }

static size_t span_of(const int32_t *offsets, size_t n) {
    int32_t top = 0;
    for (size_t i = 0; i < n; i++)
        if (offsets[i] > top) top = offsets[i];
    return (size_t)top + 8;
}

int mxp_sampler_layout(const mxp_pylayout *layout) {
    pthread_once(&once, init_once);
    if (layout == NULL) return MXP_E_INVALID;
    const mxp_pylayout *l = layout;
    bool ok = l->interp >= 4096 && l->code_type >= 4096 && l->code_mask != 0 &&
              offset_ok(l->interp_threads, true) && offset_ok(l->tstate_next, true) &&
              offset_ok(l->tstate_interp, true) && offset_ok(l->tstate_native_id, false) &&
              offset_ok(l->tstate_thread_id, true) && offset_ok(l->pthread_tid, false) &&
              (l->tstate_native_id >= 0 || l->pthread_tid >= 0) && offset_ok(l->tstate_frame, true) &&
              offset_ok(l->cframe_frame, false) && offset_ok(l->tstate_chunk, false) &&
              offset_ok(l->tstate_top, l->tstate_chunk >= 0) && offset_ok(l->chunk_data, l->tstate_chunk >= 0) &&
              offset_ok(l->frame_code, true) && offset_ok(l->frame_previous, true) &&
              offset_ok(l->frame_owner, false) && l->frame_size > 0 && (uint32_t)l->frame_size <= FRAME_MAX &&
              l->frame_code + 8 <= l->frame_size && l->frame_previous + 8 <= l->frame_size &&
              l->frame_owner < l->frame_size && offset_ok(l->gen_frame, true) &&
              offset_ok(l->code_name, true) && offset_ok(l->code_filename, true) &&
              offset_ok(l->code_firstlineno, true) && offset_ok(l->str_state, true) &&
              offset_ok(l->str_length, true) && offset_ok(l->str_ascii_data, true) &&
              offset_ok(l->str_compact_data, true) && l->str_kind_shift >= 0 && l->str_kind_shift < 30 &&
              l->str_compact_bit >= 0 && l->str_compact_bit < 32 && l->str_ascii_bit >= 0 &&
              l->str_ascii_bit < 32;
    if (!ok) return MXP_E_INVALID;
    int32_t ts[] = {l->tstate_next, l->tstate_interp, l->tstate_native_id, l->tstate_thread_id,
                    l->tstate_frame, l->tstate_chunk, l->tstate_top};
    int32_t code[] = {OB_TYPE, l->code_name, l->code_filename, l->code_firstlineno};
    int32_t str[] = {l->str_state, l->str_length};
    size_t cs = span_of(code, 4);
    if (cs > CODE_MAX) return MXP_E_INVALID;
    pthread_mutex_lock(&py_lock);
    L = *l;
    tstate_span = span_of(ts, 7);
    code_span = cs;
    str_head = span_of(str, 2);
    codes_clear();
    choose_how();
    ready = how >= 0;
    pthread_mutex_unlock(&py_lock);
    return ready ? MXP_OK : MXP_E_IO;
}

/* ---- thread states ---- */

uint64_t mxpi_py_first(void) {
    uint8_t b[8];
    if (!ready || !peek(L.interp + (uint64_t)L.interp_threads, b, 8)) return 0;
    return rd64(b);
}

bool mxpi_py_thread(uint64_t addr, mxpi_pythread *out) {
    uint8_t b[MAX_OFFSET / 64];
    if (!ready || tstate_span > sizeof b || !peek(addr, b, tstate_span)) return false;
    if (rd64(b + L.tstate_interp) != L.interp) return false; /* freed, or another interpreter's */
    out->addr = addr;
    out->next = rd64(b + L.tstate_next);
    out->os_tid = 0;
    if (L.tstate_native_id >= 0) {
        out->os_tid = (int64_t)rd64(b + L.tstate_native_id);
    } else {
        uint8_t t[4];
        uint64_t pthread = rd64(b + L.tstate_thread_id);
        if (pthread != 0 && peek(pthread + (uint64_t)L.pthread_tid, t, 4)) out->os_tid = (int32_t)rd32(t);
    }
    uint64_t frame = rd64(b + L.tstate_frame);
    if (L.cframe_frame >= 0 && frame != 0) {
        uint8_t f[8];
        frame = peek(frame + (uint64_t)L.cframe_frame, f, 8) ? rd64(f) : 0;
    }
    out->frame = frame;
    out->chunk = L.tstate_chunk >= 0 ? rd64(b + L.tstate_chunk) : 0;
    out->top = L.tstate_chunk >= 0 ? rd64(b + L.tstate_top) : 0;
    return true;
}

/* ---- strings ---- */

static size_t put_utf8(char *o, uint32_t c) {
    if ((c >= 0xd800 && c < 0xe000) || c > 0x10ffff) c = 0xfffd; /* not a character */
    if (c < 0x80) {
        o[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (char)(0xc0 | (c >> 6));
        o[1] = (char)(0x80 | (c & 0x3f));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (char)(0xe0 | (c >> 12));
        o[1] = (char)(0x80 | ((c >> 6) & 0x3f));
        o[2] = (char)(0x80 | (c & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (c >> 18));
    o[1] = (char)(0x80 | ((c >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3f));
    o[3] = (char)(0x80 | (c & 0x3f));
    return 4;
}

/* The str at addr as UTF-8 into out (room for max_chars * 4 bytes);
 * its length, or -1 when it is not a compact str we can read. */
static long read_str(uint64_t addr, char *out, uint32_t max_chars) {
    uint8_t h[256];
    if (str_head > sizeof h || !peek(addr, h, str_head)) return -1;
    uint32_t state = rd32(h + L.str_state);
    int64_t len = (int64_t)rd64(h + L.str_length);
    uint32_t kind = (state >> L.str_kind_shift) & 7u;
    bool compact = (state >> L.str_compact_bit) & 1u, ascii = (state >> L.str_ascii_bit) & 1u;
    if (!compact || len < 0 || (kind != 1 && kind != 2 && kind != 4) || (ascii && kind != 1)) return -1;
    uint32_t n = len > (int64_t)max_chars ? max_chars : (uint32_t)len;
    uint64_t data = addr + (uint64_t)(ascii ? L.str_ascii_data : L.str_compact_data);
    if (!peek(data, raw, (size_t)n * kind)) return -1;
    size_t o = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t c = raw[i];
        if (kind == 2) {
            uint16_t u;
            memcpy(&u, raw + 2 * i, sizeof u); /* code units in the host's byte order */
            c = u;
        } else if (kind == 4) {
            c = rd32(raw + 4 * i);
        }
        if (ascii && c >= 0x80) return -1; /* not what an ASCII str holds: freed under us */
        o += put_utf8(out + o, c);
    }
    return (long)o;
}

/* ---- code objects -> frame ids ---- */

typedef struct code_entry {
    uint64_t code, name, file;
    uint32_t line;
    uint32_t frame; /* 0: empty slot */
} code_entry;

static code_entry *codes;
static uint32_t codes_cap, codes_n;

static void codes_clear(void) {
    free(codes);
    codes = NULL;
    codes_cap = codes_n = 0;
}

static uint32_t hash64(uint64_t v) {
    v ^= v >> 33;
    v *= UINT64_C(0xff51afd7ed558ccd);
    v ^= v >> 33;
    return (uint32_t)v;
}

static code_entry *code_slot(uint64_t code) {
    uint32_t mask = codes_cap - 1, i = hash64(code) & mask;
    while (codes[i].frame != 0 && codes[i].code != code) i = (i + 1) & mask;
    return &codes[i];
}

static bool codes_grow(void) {
    uint32_t cap = codes_cap ? codes_cap * 2 : 1024;
    code_entry *old = codes;
    uint32_t old_cap = codes_cap;
    codes = calloc(cap, sizeof *codes);
    if (codes == NULL) {
        codes = old;
        return false;
    }
    codes_cap = cap;
    for (uint32_t i = 0; i < old_cap; i++)
        if (old[i].frame != 0) *code_slot(old[i].code) = old[i];
    free(old);
    return true;
}

/* The frame id of code object code whose header is h (code_span bytes);
 * 0 when it is not a code object, or its strings cannot be read. */
static uint32_t code_frame(uint64_t code, const uint8_t *h) {
    if (rd64(h + OB_TYPE) != L.code_type) return 0;
    uint64_t name = rd64(h + L.code_name), file = rd64(h + L.code_filename);
    uint32_t line = rd32(h + L.code_firstlineno);
    if ((codes_n + 1) * 4 > codes_cap * 3 && !codes_grow()) return 0;
    code_entry *e = code_slot(code);
    if (e->frame != 0 && e->name == name && e->file == file && e->line == line) return e->frame;
    long nl = read_str(name, text_name, NAME_MAX_CHARS);
    long fl = read_str(file, text_file, FILE_MAX_CHARS);
    if (nl < 0 || fl < 0) return 0;
    uint32_t id = mxpi_sframe_intern(text_name, (size_t)nl, text_file, (size_t)fl, line);
    if (id == 0) return 0;
    if (e->frame == 0) codes_n++;
    *e = (code_entry){code, name, file, line, id};
    return id;
}

/* Read the headers of codes[0 .. n) into headers (code_span bytes each);
 * ok[i] says which could be read. */
static void read_headers(const uint64_t *addrs, uint32_t n, bool *ok) {
    if (how != 0) {
        for (uint32_t i = 0; i < n; i++) ok[i] = peek(addrs[i], headers + (size_t)i * code_span, code_span);
        return;
    }
    struct iovec local[BATCH], remote[BATCH];
    uint32_t i = 0;
    while (i < n) {
        uint32_t k = n - i < BATCH ? n - i : BATCH;
        for (uint32_t j = 0; j < k; j++) {
            local[j] = (struct iovec){headers + (size_t)(i + j) * code_span, code_span};
            remote[j] = (struct iovec){(void *)(uintptr_t)addrs[i + j], code_span};
        }
        ssize_t got = process_vm_readv(self_pid, local, k, remote, k, 0);
        /* Copies stop at the first element that fails: the whole ones before
         * it are good, that one is not, the rest are tried again. */
        uint32_t whole = got > 0 ? (uint32_t)((size_t)got / code_span) : 0;
        for (uint32_t j = 0; j < whole; j++) ok[i + j] = true;
        if (whole < k) ok[i + whole] = false;
        i += whole + (whole < k ? 1 : 0);
    }
}

/* ---- asyncio tasks and launchers ---- */

typedef struct task_entry {
    uint64_t key; /* 0: empty; 1: deleted */
    uint32_t track;
} task_entry;

static task_entry *tasks;
static uint32_t tasks_cap, tasks_used;

static task_entry *task_slot(uint64_t key, bool insert) {
    uint32_t mask = tasks_cap - 1, i = hash64(key) & mask;
    task_entry *tomb = NULL;
    for (;;) {
        task_entry *e = &tasks[i];
        if (e->key == key) return e;
        if (e->key == 0) return insert && tomb ? tomb : insert ? e : NULL;
        if (e->key == 1 && tomb == NULL) tomb = e;
        i = (i + 1) & mask;
    }
}

static bool tasks_rehash(uint32_t cap) {
    task_entry *old = tasks;
    uint32_t old_cap = tasks_cap;
    tasks = calloc(cap, sizeof *tasks);
    if (tasks == NULL) {
        tasks = old;
        return false;
    }
    tasks_cap = cap;
    tasks_used = 0;
    for (uint32_t i = 0; i < old_cap; i++)
        if (old[i].key > 1) {
            *task_slot(old[i].key, true) = old[i];
            tasks_used++;
        }
    free(old);
    return true;
}

int mxp_sampler_task(uint64_t key, uint32_t track) {
    pthread_once(&once, init_once);
    if (key <= 1) return MXP_E_INVALID;
    int rc = MXP_OK;
    pthread_mutex_lock(&py_lock);
    if (track == 0) {
        task_entry *e = tasks_cap ? task_slot(key, false) : NULL;
        if (e != NULL) e->key = 1; /* a tombstone: counted in tasks_used until a rehash */
    } else if ((tasks_used + 1) * 2 > tasks_cap && !tasks_rehash(tasks_cap ? tasks_cap * 2 : 64)) {
        rc = MXP_E_NOMEM;
    } else {
        task_entry *e = task_slot(key, true);
        if (e->key != key) tasks_used++;
        *e = (task_entry){key, track};
    }
    pthread_mutex_unlock(&py_lock);
    return rc;
}

static uint32_t task_of(uint64_t key) {
    if (tasks_cap == 0) return 0;
    task_entry *e = task_slot(key, false);
    return e != NULL ? e->track : 0;
}

int mxp_sampler_cut(uint64_t code) {
    pthread_once(&once, init_once);
    if (code == 0) return MXP_E_INVALID;
    int rc = MXP_OK;
    pthread_mutex_lock(&py_lock);
    bool have = false;
    for (uint32_t i = 0; i < ncuts; i++) have |= cuts[i] == code;
    if (!have) {
        if (ncuts < CUTS)
            cuts[ncuts++] = code;
        else
            rc = MXP_E_FULL;
    }
    pthread_mutex_unlock(&py_lock);
    return rc;
}

static bool is_cut(uint64_t code) {
    for (uint32_t i = 0; i < ncuts; i++)
        if (cuts[i] == code) return true;
    return false;
}

/* ---- stacks ---- */

int mxpi_py_stack(const mxpi_pythread *t, uint32_t *frames, uint32_t cap, uint32_t *track_out) {
    static uint64_t code_at[MXPI_PY_DEPTH], frame_at[MXPI_PY_DEPTH];
    static uint8_t owner_at[MXPI_PY_DEPTH];
    static bool ok[MXPI_PY_DEPTH];
    *track_out = 0;
    if (!ready) return -1;
    /* The top of the thread's frame stack in one copy; frames elsewhere
     * (generators', coroutines', older chunks', frame objects) one by one. */
    uint64_t lo = 0, hi = 0;
    if (t->chunk != 0 && t->top > t->chunk + (uint64_t)L.chunk_data) {
        hi = t->top;
        lo = t->chunk + (uint64_t)L.chunk_data;
        if (hi - lo > WINDOW) lo = hi - WINDOW;
        if (!peek(lo, window, (size_t)(hi - lo))) lo = hi = 0;
    }
    uint32_t n = 0, steps = 0;
    uint64_t size = (uint64_t)L.frame_size;
    for (uint64_t f = t->frame; f != 0 && n < MXPI_PY_DEPTH; steps++) {
        if (steps > 4 * MXPI_PY_DEPTH) return -1; /* a cycle: memory reused under us */
        uint8_t copy[FRAME_MAX];
        const uint8_t *p = copy;
        if (f >= lo && f + size <= hi)
            p = window + (f - lo);
        else if (!peek(f, copy, (size_t)size))
            return -1;
        uint64_t code = rd64(p + L.frame_code) & L.code_mask, prev = rd64(p + L.frame_previous);
        uint8_t owner = L.frame_owner >= 0 ? p[L.frame_owner] : 0;
        if (code != 0 && !(L.frame_owner >= 0 && owner >= (uint8_t)L.owner_skip)) {
            code_at[n] = code;
            frame_at[n] = f;
            owner_at[n] = owner;
            n++;
        }
        if (prev == f) return -1;
        f = prev;
    }
    /* Code headers, the same code read once per run of it (recursion). */
    uint64_t distinct[MXPI_PY_DEPTH];
    uint32_t nd = 0, idx[MXPI_PY_DEPTH];
    for (uint32_t i = 0; i < n; i++) {
        if (nd == 0 || distinct[nd - 1] != code_at[i]) distinct[nd++] = code_at[i];
        idx[i] = nd - 1;
    }
    read_headers(distinct, nd, ok);
    uint32_t out = 0, fid = 0, last = UINT32_MAX;
    for (uint32_t i = 0; i < n; i++) {
        if (is_cut(code_at[i])) break; /* a launcher: it and its callers are not the program's */
        if (!ok[idx[i]]) return -1;
        if (idx[i] != last) {
            fid = code_frame(code_at[i], headers + (size_t)idx[i] * code_span);
            last = idx[i];
        }
        if (fid == 0) continue; /* not a code object (a frame of the interpreter's own) */
        if (out < cap) frames[out++] = fid;
        if (L.frame_owner < 0 || owner_at[i] == (uint8_t)L.owner_generator) {
            uint32_t track = task_of(frame_at[i] - (uint64_t)L.gen_frame);
            if (track != 0) *track_out = track; /* the outermost one wins */
        }
    }
    return (int)out;
}

/* ---- for the binding's check ---- */

int mxp_sampler_threads(uint64_t *tstates_out, int64_t *os_tids_out, uint32_t cap, uint32_t *n_out) {
    pthread_once(&once, init_once);
    *n_out = 0;
    pthread_mutex_lock(&py_lock);
    int rc = MXP_OK;
    if (!ready) {
        rc = MXP_E_STATE;
    } else {
        uint32_t n = 0;
        for (uint64_t a = mxpi_py_first(); a != 0 && n < MXPI_PY_THREADS; n++) {
            mxpi_pythread t;
            if (!mxpi_py_thread(a, &t)) {
                rc = MXP_E_IO;
                break;
            }
            if (n < cap) {
                tstates_out[n] = t.addr;
                os_tids_out[n] = t.os_tid;
            }
            a = t.next;
        }
        *n_out = n < cap ? n : cap;
    }
    pthread_mutex_unlock(&py_lock);
    return rc;
}

int mxp_sampler_read(uint64_t tstate, uint32_t *frames_out, uint32_t cap, uint32_t *n_out,
                     uint32_t *track_out) {
    pthread_once(&once, init_once);
    *n_out = 0;
    *track_out = 0;
    pthread_mutex_lock(&py_lock);
    int rc = MXP_E_STATE;
    if (ready) {
        mxpi_pythread t;
        int n = mxpi_py_thread(tstate, &t) ? mxpi_py_stack(&t, frames_out, cap, track_out) : -1;
        rc = n < 0 ? MXP_E_IO : MXP_OK;
        if (n > 0) *n_out = (uint32_t)n;
    }
    pthread_mutex_unlock(&py_lock);
    return rc;
}
