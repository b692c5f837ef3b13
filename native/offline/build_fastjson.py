"""cffi builder for mxprof.trace._fastjson: the offline reader's compiled fast path.

A module of its own, apart from the live core (mxprof._mxprof_native): the
offline tier never imports the core (docs/architecture.md), and a trace is
read the same way without this module (``mxprof/trace/_fastread.py``).
Sources: native/offline/*.c: mxo_read.c (JSON), mxo_pftrace.c (.pftrace,
``mxprof/trace/perfetto.py``'s fast path).  The calls keep the GIL: they parse a block
of at most a few MiB and never wait.

MXPROF_SANITIZE (as for the core, native/build_ffi.py) builds it under a
sanitizer: ``MXPROF_SANITIZE=address`` is how tests/test_fastjson.py's
and tests/test_fastpftrace.py's differential tests are run under
AddressSanitizer (native/offline/asan.sh, which .ci/run runs).
"""

import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = sorted(os.path.join("native", "offline", f) for f in os.listdir(HERE) if f.endswith(".c"))

CDEF = """
#define MXO_ERR_MEMORY ...
#define MXO_ERR_ARG ...
#define MXO_HELD_ARGS ...
#define MXO_COUNTER_ARGS ...
typedef struct mxo_reader {
    int64_t *ts;
    int64_t *dur;
    int32_t *key;
    int32_t *thread;
    size_t *args;
    size_t *args_len;
    size_t n;
    size_t *run_begin;
    size_t *run_end;
    size_t *run_at;
    size_t n_runs;
    int async_args;
    int32_t n_keys;
    int64_t *key_first;
    int32_t n_threads;
    int64_t *thread_pid;
    int64_t *thread_tid;
    int64_t *g_ts;
    int64_t *g_dur;
    int32_t *g_kind;
    int32_t *g_thread;
    size_t *g_begin;
    size_t *g_count;
    size_t n_groups;
    size_t *g_with_args;
    size_t *g_abegin;
    size_t *g_apos;
    size_t *g_aheld;
    size_t *g_alen;
    char *g_atext;
    size_t *g_atext_begin;
    size_t *g_atext_len;
    int64_t *s_starts;
    int64_t *s_lengths;
    size_t s_n;
    int32_t *s_points;
    size_t s_n_points;
    int64_t *c_len;
    int32_t *c_id;
    size_t *c_begin;
    size_t *c_count;
    int64_t *c_own;
    uint8_t *c_own_overflow;
    int64_t *c_own_each;
    size_t n_c;
    ...;
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
typedef struct mxo_pf {
    uint64_t seq;
    int64_t now;
    int64_t shift;
    int32_t stack;
    int32_t thread;
    size_t count;
    size_t ranges;
    size_t row_limit;
    uint64_t miss_name;
    uint64_t miss_cat;
    uint64_t miss_track;
    size_t open;
    ...;
} mxo_pf;
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
"""

with open(os.path.join(HERE, "mxo_depth.h")) as f:  # the depth pass (mxo_depth.c)
    CDEF += f.read()

CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-fvisibility=hidden"]
LDFLAGS: list = []
SANITIZE = os.environ.get("MXPROF_SANITIZE", "")
if SANITIZE:
    CFLAGS += [f"-fsanitize={SANITIZE}", "-fno-sanitize-recover=all", "-g"]
    CFLAGS += ["-fno-omit-frame-pointer"]
    LDFLAGS += [f"-fsanitize={SANITIZE}"]

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "mxprof.trace._fastjson",
    '#include "mxo_read.h"\n#include "mxo_pftrace.h"\n#include "mxo_depth.h"\n',
    sources=SOURCES,
    include_dirs=[os.path.join("native", "offline")],
    extra_compile_args=CFLAGS,
    extra_link_args=LDFLAGS,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
