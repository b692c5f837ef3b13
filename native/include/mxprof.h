/*
 * mxprof.h -- the one public header of the mxprof C core.
 *
 * The region between MXP_CDEF_BEGIN and MXP_CDEF_END is read verbatim by
 * native/build_ffi.py as the cffi cdef (with every #define value replaced by
 * "..." so the compiler, not the cdef, supplies it).  Keep that region plain
 * C declarations: no preprocessor conditionals, no attributes.
 *
 * Conventions
 *   - Every function returns MXP_OK (0) or a negative MXP_E_* code unless it
 *     says otherwise.  The hot functions (range, frame, counter, marker,
 *     scope) return MXP_NEW_THREAD (1) on the first call a thread makes, so a
 *     binding can learn about the thread once; they never fail because of the
 *     profiler's state.
 *   - Strings are (pointer, length) pairs of UTF-8; they need not be
 *     NUL-terminated and may contain NUL.  The core copies what it keeps.
 *   - Times are int64 nanoseconds of the core's monotonic clock.
 *   - Thread safety: every function may be called from any thread at any time
 *     unless it says otherwise.  The hot functions take no lock except when a
 *     thread records for the first time or fills a buffer chunk.
 *   - The core never calls back into the host and never prints or exits.
 */
#ifndef MXPROF_H
#define MXPROF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* MXP_CDEF_BEGIN */

/* Return codes. */
#define MXP_OK 0
#define MXP_NEW_THREAD 1       /* hot call: first call on this thread */
#define MXP_IN_LOOP 2          /* mxp_range_enter/exit: an asyncio loop runs here */
#define MXP_E_INVALID -1       /* an argument is out of range */
#define MXP_E_NOMEM -2         /* allocation failed */
#define MXP_E_IO -3            /* a file operation failed; see mxp_trace_errno */
#define MXP_E_STATE -4         /* the request does not fit the current state */
#define MXP_E_FULL -5          /* a fixed-size table is full */

/* Object kinds (the "kind" of an interned object). */
#define MXP_KIND_TASK 1
#define MXP_KIND_FRAME 2
#define MXP_KIND_EVENT 3
#define MXP_KIND_COUNTER 4
#define MXP_KIND_MARKER 5
#define MXP_KIND_SCOPE 6        /* an interned string: scope names, allocation tags */
#define MXP_KIND_ALLOC 7        /* allocation instants: domain = device, name = attribute */
#define MXP_KIND_FREE 8         /* free instants: likewise */
#define MXP_KIND_GPU 9          /* ranges timed on a device (trace category "<domain>,gpu") */

/* Memory devices (mxp_memory_device). */
#define MXP_DEVICE_CPU 0
#define MXP_DEVICE_GPU 1

/* mxp_memory_alloc's scope argument: the calling thread's current scope. */
#define MXP_SCOPE_OF_THREAD 4294967295
/* Bit of mxp_memory_free's result: the pointer had no live allocation. */
#define MXP_MEMORY_UNKNOWN 2

/* Marker scopes; the values are MXNet's and ITT's. */
#define MXP_SCOPE_GLOBAL 1
#define MXP_SCOPE_PROCESS 2
#define MXP_SCOPE_THREAD 3
#define MXP_SCOPE_TASK 4
#define MXP_SCOPE_MARKER 5

/* Session flags (mxp_flags_update). */
#define MXP_FLAG_RECORD 1      /* state is run and not paused */
#define MXP_FLAG_TRACE 2       /* buffer events for the trace file */
#define MXP_FLAG_AGGREGATE 4   /* keep per-name statistics */
#define MXP_FLAG_MEMORY 8      /* record memory (profile_memory) */
#define MXP_FLAG_MEMORY_EVENTS 16 /* also an instant per allocation and free */
#define MXP_FLAG_NVTX 128      /* also emit recorded ranges and marks as NVTX (mxp_nvtx.c) */

/* Trace file formats (mxp_trace_format), chosen by the file name's end. */
#define MXP_FORMAT_JSON 0      /* Chrome Trace Event JSON (any other name) */
#define MXP_FORMAT_JSON_GZ 1   /* the same, gzip-compressed (".gz") */
#define MXP_FORMAT_PERFETTO 2  /* Perfetto protobuf (".perfetto-trace", ".pftrace") */

/* Clock sources (mxp_clock_source). */
#define MXP_CLOCK_TSC 0
#define MXP_CLOCK_MONOTONIC 1
#define MXP_CLOCK_FAKE 2

/* The largest number of interned objects (ids are 0 .. MXP_MAX_OBJECTS-1). */
#define MXP_MAX_OBJECTS 1048576

/* Merged statistics of one object, as returned by mxp_stats_snapshot.
 * Ranges (task, frame, event): count, total/min/max/self in ns, and the
 * 50th/90th/99th percentiles of the durations in ns (nearest rank, from a
 * log-linear histogram: within 1 % of the exact value).
 * Counters: count = samples, min/max/last = sample values, sum = their sum.
 * Markers: count only. */
typedef struct mxp_stat {
    uint32_t id;
    uint32_t kind;
    uint64_t count;
    int64_t total;
    int64_t min;
    int64_t max;
    int64_t self;
    int64_t last;
    double sum;
    int64_t p50;
    int64_t p90;
    int64_t p99;
} mxp_stat;

/* Process-wide tallies of events the core did not record as asked.
 * All are cumulative since the process started (or mxp_reset). */
typedef struct mxp_counts {
    uint64_t dropped_events;    /* trace records refused by the event cap */
    uint64_t unmatched_stops;   /* stop with no open start on this thread */
    uint64_t non_lifo_stops;    /* stop of a range that was not innermost */
    uint64_t ignored_calls;     /* hot calls made while not recording */
    uint64_t unknown_frees;     /* frees of pointers with no live allocation */
    uint64_t written_events;    /* trace records written to files */
    uint64_t cut_ranges;        /* ranges closed by mxp_ranges_cut, not by their end */
    uint64_t saturated_values;  /* counter results beyond int64, held at the limit */
    uint64_t invalid_calls;     /* C API calls with a NULL name or an id not of its kind */
} mxp_counts;

/* One live allocation (mxp_memory_live). */
typedef struct mxp_alloc {
    uint64_t ptr;        /* the pointer, or the handle mxp_memory_alloc made */
    int64_t bytes;       /* requested */
    int64_t actual;      /* what the allocator took (>= bytes when it rounds) */
    uint32_t device;     /* slot from mxp_memory_device */
    uint32_t scope;      /* MXP_KIND_SCOPE id (0: "<unk>:") */
    uint32_t tag;        /* MXP_KIND_SCOPE id of the tag (0: none) */
    uint32_t reuse;      /* 1: served from an allocator's cache */
} mxp_alloc;

/* Memory in use by one device or one scope (mxp_memory_usage). */
typedef struct mxp_memory_stat {
    uint32_t counter;    /* the MXP_KIND_COUNTER object holding its bytes in use */
    uint32_t is_scope;   /* 0: a device, 1: a scope */
    uint32_t key;        /* device slot, or scope id */
    uint32_t unused;
    int64_t current;     /* bytes in use now */
    int64_t peak;        /* most bytes in use at any time */
    int64_t allocated;   /* bytes allocated in all */
    uint64_t allocs;
    uint64_t frees;
} mxp_memory_stat;

/* Initialise the core.  Idempotent; every other function calls it lazily,
 * but a binding should call it once at import.  Returns MXP_OK. */
int mxp_init(void);

/* ---- clock ---- */

/* Current time of the core's clock, in ns. */
int64_t mxp_clock_ns(void);

/* Which source the clock reads (MXP_CLOCK_*). */
int mxp_clock_source(void);

/* The wall clock traces are placed on (CLOCK_REALTIME, plus any skew from
 * mxp_clock_skew_set), in ns since the epoch: a profile's
 * baseTimeNanoseconds is read from it, and distributed clock alignment
 * measures it.  Thread-safe. */
int64_t mxp_clock_wall_ns(void);

/* ---- registry ---- */

/* Intern the object (kind, domain, name) and store its dense id in *id_out.
 * The same triple always yields the same id.  kind is MXP_KIND_*; for
 * MXP_KIND_EVENT and MXP_KIND_SCOPE the domain is ignored.  When the table is
 * full the call still succeeds with the id of a shared "<overflow>" object of
 * that kind and returns MXP_E_FULL.  MXP_E_INVALID for a bad kind. */
int mxp_object_register(int kind, const char *domain, size_t domain_len,
                        const char *name, size_t name_len, uint32_t *id_out);

/* Number of ids handed out so far. */
uint32_t mxp_object_count(void);

/* Describe object id: its kind, and its name and domain as NUL-terminated
 * copies (lengths exclude the NUL) that live as long as the process.
 * MXP_E_INVALID for an id not handed out. */
int mxp_object_info(uint32_t id, int *kind, const char **name, size_t *name_len,
                    const char **domain, size_t *domain_len);

/* ---- hot path (never blocks on the writer, never fails on state) ---- */

/* Open a task or event range on the calling thread. */
int mxp_range_begin(uint32_t id);

/* Close the innermost open range with this id on the calling thread and
 * record it (one complete record) if its begin was recorded; one that is
 * not the innermost is recorded and tallied in non_lifo_stops.  With none
 * open here, the range of id begun last on another thread or track is
 * closed and recorded as an async range of this thread (slow: it makes
 * every thread pass a memory barrier); with none anywhere, the stop is
 * tallied in unmatched_stops. */
int mxp_range_end(uint32_t id);

/* As mxp_range_begin, for a frame: the range gets the frame's next index
 * (0, 1, ... per frame object and profile).  Close it with mxp_range_end. */
int mxp_frame_begin(uint32_t id);

/* As mxp_range_begin (or mxp_frame_begin for a frame), but returns a token
 * naming this very range:
 * token >> 1 identifies it and bit 0 is the MXP_NEW_THREAD flag.  Ranges
 * begun this way are closed by mxp_range_end_token, which finds the exact
 * range even when several ranges of the same id are open (coroutines). */
int64_t mxp_range_begin_token(uint32_t id);

/* mxp_range_begin, mxp_frame_begin and mxp_range_end for bindings whose
 * ranges may run inside asyncio tasks: while the calling thread runs an
 * event loop (mxp_thread_loop_set), they do nothing and return MXP_IN_LOOP,
 * and the binding decides where the range goes (mxp_track_begin/end).
 * Elsewhere they are the plain calls, at the cost of one more load. */
int mxp_range_enter(uint32_t id);
int mxp_frame_enter(uint32_t id);
int mxp_range_exit(uint32_t id);

/* Whether an asyncio event loop runs on the calling thread (a binding sets
 * it when the loop starts and stops). */
int mxp_thread_loop_set(int running);

/* Close the range named by token (from mxp_range_begin_token). */
int mxp_range_end_token(uint32_t id, int64_t token);

/* Close every range open on any thread or track as ending now, cut short:
 * each is recorded (trace record flagged as cut, statistics) where its begin
 * was, and the later end of it records nothing and is no misuse.  For the
 * end of recording (set_state('stop'), a profile's last write).  Returns the
 * number of ranges closed, or MXP_E_NOMEM (some may be left open).  Slow
 * (every thread passes a memory barrier); safe while threads record. */
int mxp_ranges_cut(void);

/* The ranges open now on OS thread os_tid that were begun while recording
 * and are not closed elsewhere: object ids outermost first in ids_out and
 * how long each has been open in ns in ages_out (up to cap; *n_out the
 * count, 0 for a thread that never recorded).  A consistent copy of the
 * stack, taken as a cut takes it (mxp_claim.c), without stopping the
 * thread.  MXP_E_STATE when the thread stayed in the middle of a stack edit,
 * or memory ran out (try again).  Thread-safe; for `mxprof ctl where` and
 * `status`. */
int mxp_ranges_open(int64_t os_tid, uint32_t *ids_out, int64_t *ages_out, uint32_t cap,
                    uint32_t *n_out);

/* ---- tracks with a range stack of their own (asyncio tasks) ---- */

/* A new track named name with its own stack of open ranges, for a sequence
 * of work that is not a thread (an asyncio task): its ranges nest on the
 * track, pair within it, and are drawn on it.  Only one thread may use a
 * track at a time.  Until mxp_track_close. */
int mxp_track_open(const char *name, size_t name_len, uint32_t *tid_out);

/* mxp_range_begin / mxp_range_end (mxp_frame_begin for a frame) on track
 * tid, or with tid 0 on the calling thread's own stack (even while it runs
 * an event loop).  MXP_E_INVALID for a tid that is not an open track. */
int mxp_track_begin(uint32_t tid, uint32_t id);
int mxp_track_end(uint32_t tid, uint32_t id);

/* Done with track tid: ranges still open on it end now, cut short; its
 * records are written with the next flush and its statistics kept.  The tid
 * is never used again. */
int mxp_track_close(uint32_t tid);

/* Set a counter to value, recording a sample while recording.  The value is
 * kept in every state. */
int mxp_counter_set(uint32_t id, int64_t value);

/* As mxp_counter_set, for a counter's initial value: while not recording it
 * only stores the value (creating a counter is not a hot call to tally). */
int mxp_counter_init(uint32_t id, int64_t value);

/* Add delta (may be negative) to a counter; saturates at the int64 limits.
 * A saturated result is tallied in saturated_values, in every state. */
int mxp_counter_add(uint32_t id, int64_t delta);

/* Subtract delta from a counter: mxp_counter_add of -delta, exact for
 * INT64_MIN too; a binding need not negate (numpy's unsigned ints wrap). */
int mxp_counter_sub(uint32_t id, int64_t delta);

/* mxp_counter_add for a delta beyond int64 (a binding's unbounded integers):
 * adds magnitude (0 .. 2**64 - 1), or subtracts it when negative is nonzero,
 * atomically, saturating and tallying as mxp_counter_add.  A delta of 2**64
 * or more saturates whatever the value was: use mxp_counter_saturate. */
int mxp_counter_add_wide(uint32_t id, int negative, uint64_t magnitude);

/* Set a counter to its limit, INT64_MAX (INT64_MIN when negative is nonzero),
 * for a value asked for beyond it: as mxp_counter_init when init is nonzero,
 * else as mxp_counter_set, and tallied in saturated_values in every state. */
int mxp_counter_saturate(uint32_t id, int negative, int init);

/* Current value of a counter (0 for a never-set counter or a non-counter). */
int64_t mxp_counter_value(uint32_t id);

/* Record an instant marker with an MXP_SCOPE_* scope.  MXP_E_INVALID (and
 * nothing recorded) for an unknown scope. */
int mxp_marker_mark(uint32_t id, int scope);

/* Set the calling thread's current scope to an MXP_KIND_SCOPE object id
 * (0 = none).  Cheap; a binding mirrors its context variable with it. */
int mxp_scope_set(uint32_t scope_id);

/* The calling thread's current scope id (0 = none). */
uint32_t mxp_scope_current(void);

/* ---- memory (active while MXP_FLAG_MEMORY is set) ----
 * Every allocation is attributed to a device and a scope.  The bytes in use
 * of each device and each scope are counters (domains "Device Storage" and
 * "Scope Storage"), sampled into the trace and statistics like any counter;
 * the table of live allocations and the peaks are kept under one lock. */

/* The slot of device (MXP_DEVICE_*, ordinal), registering it ("cpu/0",
 * "gpu/3") on first use.  MXP_E_INVALID for a bad type, MXP_E_FULL past 256
 * devices. */
int mxp_memory_device(int type, uint32_t ordinal, uint32_t *slot_out);

/* Record an allocation of bytes (actual: what the allocator took, 0 = bytes)
 * on device slot, by scope (an MXP_KIND_SCOPE id, or MXP_SCOPE_OF_THREAD)
 * with tag (an MXP_KIND_SCOPE id, 0 = none).  ptr identifies it for
 * mxp_memory_free; 0 asks for a handle, stored in *handle_out (which also
 * receives ptr otherwise).  A ptr already live is first freed.  MXP_OK or
 * MXP_NEW_THREAD (as the hot calls), MXP_E_STATE (nothing recorded) while
 * memory is not recorded, MXP_E_INVALID for a bad device, scope or tag. */
int mxp_memory_alloc(uint64_t ptr, int64_t bytes, int64_t actual, uint32_t device, uint32_t scope,
                     uint32_t tag, int reuse, uint64_t *handle_out);

/* Record the free of ptr (or of a handle), from any thread.  MXP_OK or
 * MXP_NEW_THREAD, with MXP_MEMORY_UNKNOWN or'ed in when no such allocation
 * is live (tallied in unknown_frees while memory is recorded; not an error). */
int mxp_memory_free(uint64_t ptr);

/* Fill out with the live allocations (as mxp_stats_snapshot: MXP_E_FULL
 * and the number needed when cap is too small). */
int mxp_memory_live(mxp_alloc *out, uint32_t cap, uint32_t *n_out);

/* Fill out with the usage of every device and scope seen. */
int mxp_memory_usage(mxp_memory_stat *out, uint32_t cap, uint32_t *n_out);

/* ---- tracks: timelines that are not threads (e.g. a GPU stream) ---- */

/* A new track named name (a trace tid of its own).  Thread-safe. */
int mxp_track_new(const char *name, size_t name_len, uint32_t *tid_out);

/* Record a complete range of object id (usually MXP_KIND_GPU) on track tid,
 * from start_ns (mxp_clock_ns's clock) for dur_ns: in the trace when it is
 * written, in the statistics when they are kept.  The range's own start was
 * the moment to decide whether to record it; this call does not look at the
 * run state.  Ranges are added as they end, children before parents: the
 * self time is dur_ns less the ranges added earlier on the track that lie
 * within it (of the last 64 not yet enclosed).  MXP_E_INVALID for an
 * unknown track or id. */
int mxp_range_add(uint32_t id, uint32_t tid, int64_t start_ns, int64_t dur_ns);

/* ---- threads ---- */

/* The calling thread's small trace id (1, 2, ... never reused). */
uint32_t mxp_thread_tid(void);

/* Name the thread with trace id tid in trace output.  MXP_E_INVALID for an
 * unknown tid. */
int mxp_thread_name_set(uint32_t tid, const char *name, size_t name_len);

/* Trace tids bound to an OS thread that have no name yet (up to cap, with
 * their OS thread ids): timelines the sampler made for threads that never
 * recorded, for the binding to name.  Thread-safe. */
int mxp_thread_unnamed(uint32_t *tids_out, int64_t *os_tids_out, uint32_t cap, uint32_t *n_out);

/* ---- session ---- */

/* Set the bits in set and clear those in clear (MXP_FLAG_*); returns the
 * new flags.  Turning MXP_FLAG_AGGREGATE on after it was off starts the
 * statistics afresh. */
uint32_t mxp_flags_update(uint32_t set, uint32_t clear);

/* The most trace records held in memory awaiting output; beyond it records
 * are dropped and tallied.  0 (or 2^39 and more) means no limit.  Takes
 * effect at once for every thread, idle ones included: the budget is
 * recounted from the records buffered now. */
int mxp_max_events_set(uint64_t max_events);

/* Begin a new profile: ts 0 is now, the wall-clock time of now is recorded,
 * buffered records and per-profile tallies are discarded, frame indexes
 * restart at 0, and the path is forgotten: set it with mxp_trace_path_set,
 * whose first flush creates (truncates) the file.  A file still open from the
 * previous profile is closed as it is. */
int mxp_profile_begin(void);

/* The open profile's ts 0 on mxp_clock_ns's clock (0 before any profile). */
int64_t mxp_profile_epoch_ns(void);

/* Metadata written into every trace file of later flushes: the process name
 * (process_name metadata), a JSON fragment of extra top-level members and one
 * of extra otherData members (each "\"k\":v,..." without outer braces, or
 * empty).  The core does not validate the fragments. */
int mxp_trace_meta_set(const char *process_name, size_t process_name_len,
                       const char *top_json, size_t top_json_len,
                       const char *other_json, size_t other_json_len);

/* The format (MXP_FORMAT_*) a trace file named path is written in, or
 * MXP_E_INVALID when this build cannot write it (gzip without zlib). */
int mxp_trace_format(const char *path, size_t path_len);

/* Use path for the trace from the next flush on.  While a profile is open
 * and unfinished, everything buffered so far is first written to the old
 * path (creating its file if needed), which is then complete; if that fails,
 * MXP_E_IO is returned, the switch still happens and the records stay
 * buffered for the new path.  The same path again changes nothing.
 * MXP_E_INVALID (and no change) for a format this build cannot write. */
int mxp_trace_path_set(const char *path, size_t path_len);

/* Write every buffered record of the current profile to the trace file,
 * creating it on the first flush of a profile; afterwards the file is a
 * complete JSON document.  finish = 1 also ends output: later flushes do
 * nothing until mxp_profile_begin.  On a failed write, the records stay
 * buffered, the file is restored to its last complete state where possible,
 * and MXP_E_IO is returned (errno in mxp_trace_errno).  No flush waits on
 * the file: a path that is a pipe or socket fails with ESPIPE (the formats
 * rewrite the file's end), a device that would block fails with EAGAIN.  A
 * file that its path no longer leads to (removed, replaced, its directory
 * removed) fails with ESTALE and is let go; the next flush creates it anew.
 * MXP_E_STATE when no profile is open or no path is set.  Takes the writer
 * lock; safe while other threads record. */
int mxp_trace_flush(int finish);

/* Records waiting to be written (0 when none; after a finishing flush,
 * those recorded since). */
uint64_t mxp_trace_pending(void);

/* Continue a profile whose file was finished (mxp_trace_flush(1)) in a new
 * file at path, on the same time base: what was recorded since goes there,
 * starting with the next flush, which creates it.  MXP_E_STATE when no
 * profile is open or its file is not finished, MXP_E_INVALID for a path
 * this build cannot write. */
int mxp_trace_continue(const char *path, size_t path_len);

/* Wake mxp_flush_wait early once this many records wait in memory (0:
 * never; only its timeout).  Counted in whole chunks of 1,024 records. */
int mxp_flush_threshold_set(uint64_t records);

/* Block until records crossed the flush threshold or timeout_ns passed;
 * returns 1 at once when they are over it already, 1 when woken (by the
 * threshold or mxp_flush_wake), 0 on timeout.  For the one background
 * writer; a wake-up is kept until consumed. */
int mxp_flush_wait(int64_t timeout_ns);

/* Wake mxp_flush_wait now (for instance to stop the background writer). */
void mxp_flush_wake(void);

/* Discard every buffered record (they are not written). */
int mxp_trace_discard(void);

/* errno of the last failed trace write, 0 if none. */
int mxp_trace_errno(void);

/* ---- flight recorder ---- */

/* A flight recorder's profile has no trace path: its records stay buffered
 * and only the last window of them is kept.  Drop every buffered record
 * that ended more than keep_ns ago; then, while more than max_records stay
 * buffered (0: no cap), drop the oldest, moving the ring's floor (below)
 * forward.  A counter's last dropped value is kept for the snapshots'
 * values at their window's start.  MXP_E_STATE when no profile is open or
 * it writes a trace file. */
int mxp_ring_trim(int64_t keep_ns, uint64_t max_records);

/* The time (mxp_clock_ns) before which the cap made mxp_ring_trim drop
 * records of the current profile: a window reaching before it lost them.
 * INT64_MIN when the cap never bound. */
int64_t mxp_ring_floor_ns(void);

/* Write a snapshot of a flight recorder's profile to a new file at path,
 * in the format its name gives, leaving every record buffered: the records
 * that end at or after from_ns and begin at or before to_ns (mxp_clock_ns
 * times), each counter's last value before from_ns at from_ns, and the
 * ranges open now that began by to_ns, cut at to_ns.  other_json is added
 * to the trace's otherData members.  MXP_E_STATE when no profile is open or
 * it writes a trace file; MXP_E_INVALID for a path this build cannot write;
 * MXP_E_IO when the file cannot be written (errno in mxp_trace_errno; no
 * file is left behind). */
int mxp_snapshot_write(const char *path, size_t path_len, int64_t from_ns, int64_t to_ns,
                       const char *other_json, size_t other_json_len);

/* ---- statistics ---- */

/* Fill out[0 .. *n_out) with the merged statistics of every object that has
 * any (count > 0), over all threads, live and exited, since the last reset.
 * cap is the length of out; if it is too small, MXP_E_FULL, *n_out holds the
 * number needed and nothing is reset.  reset = 1 also starts new statistics
 * from exactly the state reported: every event is reported once, before or
 * after the reset. */
int mxp_stats_snapshot(mxp_stat *out, uint32_t cap, uint32_t *n_out, int reset);

/* Start new statistics (recording threads continue into them). */
void mxp_stats_reset(void);

/* Time spent recording (state run and not paused) since the statistics
 * began, in ns: the wall time the statistics cover. */
int64_t mxp_stats_recorded_ns(void);

/* Read the process-wide tallies. */
void mxp_counts_get(mxp_counts *out);

/* Read the tallies since the statistics began (mxp_stats_reset, the
 * aggregate flag turning on, fork, mxp_reset): what dumps() reports beside
 * the statistics.  reset != 0: they begin again from this same reading, so
 * that none is lost or counted twice; call it so right after
 * mxp_stats_snapshot(..., reset=1), which restarts the statistics only.
 * Thread-safe. */
void mxp_stats_counts_get(mxp_counts *out, int reset);

/* ---- the C API for native extensions (mxprof/include/mxprof_capi.h) ---- */

/* The table of function pointers that the capsule mxprof._C_API holds (a
 * const mxprof_capi *), and the capsule's name; both static, never freed. */
const void *mxp_capi_table(void);
const char *mxp_capi_name(void);

/* ---- stack sampling (mxp_sample.c, mxp_sampler.c, mxp_pyread.c) ----
 * Frames (function, file, line) and stack nodes (a frame and its caller's
 * node) are interned once each: ids count from 1, are never reused in the
 * process, and the same content always gets the same id.  Thread-safe. */

/* A frame: function name, file and line (n bytes each, copied); the id of
 * an equal frame interned before, if any.  MXP_E_FULL past 4 M frames. */
int mxp_sample_frame(const char *name, size_t name_len, const char *file, size_t file_len,
                     uint32_t line, uint32_t *id_out);

/* A stack node: frame called from the node parent (0: a root frame); the id
 * of the same node interned before, if any.  MXP_E_INVALID for an unknown
 * parent or frame, MXP_E_FULL past 4 M. */
int mxp_sample_stack(uint32_t parent, uint32_t frame, uint32_t *id_out);

/* Read back an interned frame (the strings live for the process) or stack
 * node.  MXP_E_INVALID for an id not handed out. */
int mxp_sample_frame_get(uint32_t id, const char **name_out, size_t *name_len_out,
                         const char **file_out, size_t *file_len_out, uint32_t *line_out);
int mxp_sample_stack_get(uint32_t id, uint32_t *parent_out, uint32_t *frame_out);

/* One sample, taken now, of OS thread os_tid (or, when track is an open
 * track of mxp_track_open, of that asyncio task's track) whose innermost
 * frame is stack node stack.  *range_out receives the object id of the
 * innermost range begun while recording and open there (0xffffffff: none),
 * *tid_out the trace tid the sample belongs to (a thread that never recorded
 * gets one now, as for a track).  While the trace is on, a record is
 * appended to the calling thread's buffer (under the event cap like any
 * record); while statistics are on, it is counted (mxp_sample_counts).
 * MXP_E_STATE (nothing done) while not recording, MXP_E_INVALID for an
 * unknown stack node.  Never blocks on the writer.  This is the way in for
 * a sampler of the binding's own (the fallback where mxp_sampler_start
 * cannot read the interpreter). */
int mxp_sample_add(int64_t os_tid, uint32_t track, uint32_t stack, uint32_t *range_out,
                   uint32_t *tid_out);

/* Samples per (range, stack) since the statistics began (they restart with
 * every statistics reset, as the aggregates do). */
typedef struct mxp_sample_count {
    uint32_t range; /* object id, or 0xffffffff: in no range */
    uint32_t stack;
    uint64_t n;
} mxp_sample_count;

/* Copy up to cap counts into out and their number into *n_out; MXP_E_FULL
 * (with *n_out the number needed, nothing copied) when cap is too small.
 * reset != 0 clears them after the copy. */
int mxp_sample_counts(mxp_sample_count *out, uint32_t cap, uint32_t *n_out, int reset);

/* The native sampler: a thread of the core that samples every thread of one
 * CPython interpreter without the GIL, at instants of its own.  It reads the
 * interpreter's thread states, frames, code objects and strings with safe
 * copies (process_vm_readv on this process; a pipe where that is refused),
 * so a field it reads while the interpreter changes it is at worst a stale
 * or failed read, never a fault.  The binding supplies where the fields are
 * (mxp_pylayout, one per CPython version: mxprof/_pylayout.py) and checks
 * them against what Python itself sees (mxp_sampler_read) before starting.
 * The core links no Python and calls none. */

#define MXP_SAMPLE_WALL 0 /* every thread; one blocked at the instant as <waiting> */
#define MXP_SAMPLE_CPU 1  /* only threads on a CPU: running or ready to run, and ran since the last look */

/* Where the sampler finds things in the interpreter's memory: addresses, and
 * byte offsets of fields (-1: the field does not exist in this version). */
typedef struct mxp_pylayout {
    uint64_t interp;            /* the PyInterpreterState sampled */
    uint64_t code_type;         /* &PyCode_Type: a frame's code object must have it */
    uint64_t code_mask;         /* a frame's code field & code_mask = the object (tags off) */
    int32_t interp_threads;     /* interp: the first thread state */
    int32_t tstate_next;        /* thread state: the next one */
    int32_t tstate_interp;      /* thread state: its interpreter (checked against interp) */
    int32_t tstate_native_id;   /* thread state: the OS thread id; -1: see pthread_tid */
    int32_t tstate_thread_id;   /* thread state: its pthread_t */
    int32_t pthread_tid;        /* the OS thread id inside struct pthread (no tstate_native_id) */
    int32_t tstate_frame;       /* thread state: the innermost frame (or its holder, below) */
    int32_t cframe_frame;       /* the holder's innermost frame; -1: no holder */
    int32_t tstate_chunk;       /* thread state: the frame stack's chunk (-1: frames are objects) */
    int32_t tstate_top;         /* thread state: the frame stack's top */
    int32_t chunk_data;         /* chunk: where its frames begin */
    int32_t frame_code;         /* frame: its code object */
    int32_t frame_previous;     /* frame: its caller's frame */
    int32_t frame_owner;        /* frame: who owns it (-1: no such field) */
    int32_t frame_size;         /* bytes read of a frame (the fields above lie in them) */
    int32_t owner_generator;    /* the owner of a generator's or coroutine's frame */
    int32_t owner_skip;         /* frames owned by this or higher are the interpreter's own */
    int32_t gen_frame;          /* a coroutine's frame address - its object's (task keys) */
    int32_t code_name;          /* code: the name shown (co_qualname where there is one) */
    int32_t code_filename;
    int32_t code_firstlineno;   /* code: int */
    int32_t str_state;          /* str: the state bits (kind, compact, ascii) */
    int32_t str_length;         /* str: length in code points */
    int32_t str_ascii_data;     /* str: where an ASCII compact string's characters begin */
    int32_t str_compact_data;   /* str: where another compact string's characters begin */
    int32_t str_kind_shift;     /* state: the kind (1, 2, 4 bytes per code point), 3 bits */
    int32_t str_compact_bit;
    int32_t str_ascii_bit;
} mxp_pylayout;

/* Use layout from now on (copied; the cache of code objects read so far is
 * forgotten).  MXP_E_INVALID for an offset out of range or a missing
 * address, MXP_E_IO when this process's memory cannot be copied at all. */
int mxp_sampler_layout(const mxp_pylayout *layout);

/* The thread states of the interpreter now (up to cap) with their OS thread
 * ids, for the binding's check of the layout.  MXP_E_STATE with no layout,
 * MXP_E_IO when the list cannot be read. */
int mxp_sampler_threads(uint64_t *tstates_out, int64_t *os_tids_out, uint32_t cap,
                        uint32_t *n_out);

/* The stack of thread state tstate now, as the sampler would take it: frame
 * ids innermost first (up to cap, the count in *n_out), with frames cut by
 * mxp_sampler_cut left out, and in *track_out the track of the asyncio task
 * (mxp_sampler_task) whose coroutine is on it (0: none).  For the binding's check of the layout against
 * the calling thread's own stack.  MXP_E_STATE with no layout, MXP_E_IO when
 * the stack cannot be read. */
int mxp_sampler_read(uint64_t tstate, uint32_t *frames_out, uint32_t cap, uint32_t *n_out,
                     uint32_t *track_out);

/* Start sampling at hz (0 < hz <= 20000) in mode MXP_SAMPLE_*, the
 * intervals drawn uniformly from [0.5, 1.5) / hz with seed (so periodic
 * work does not alias with the sampler); a running sampler is replaced.
 * Samples are taken while recording, as mxp_sample_add takes them.
 * MXP_E_INVALID for a bad rate or mode, MXP_E_STATE with no layout,
 * MXP_E_NOMEM when the thread cannot start. */
int mxp_sampler_start(double hz, int mode, uint64_t seed);

/* Stop the sampler and wait for its thread (a sample under way ends
 * first).  MXP_OK when none runs. */
int mxp_sampler_stop(void);

/* Frames of an asyncio task's coroutine: a coroutine object (key: its
 * address, or its frame's where frames are objects) running on a thread is
 * sampled onto track (mxp_track_open); track 0 forgets the key. */
int mxp_sampler_task(uint64_t key, uint32_t track);

/* Frames of code object code (its address), and every frame that called
 * them, are not the program's (a launcher: mxprof run, runpy): stacks are cut
 * above them.  At most 16 codes; MXP_E_FULL past that. */
int mxp_sampler_cut(uint64_t code);

/* OS thread os_tid is the profiler's own (skip != 0: never sampled), or is
 * ending (0: it stays unsampled until its thread state leaves the
 * interpreter, then the mark is forgotten).  A mark belongs to the first
 * thread state seen with that id: a later one with the same id (the OS
 * reused it) is sampled.  At most 256 threads; MXP_E_FULL past that. */
int mxp_sampler_skip(int64_t os_tid, int skip);

/* What the sampler did since the process started (a forked child starts
 * from zero), or since mxp_reset. */
typedef struct mxp_sampler_stats {
    uint64_t ticks;   /* sampling instants */
    uint64_t samples; /* thread samples recorded */
    uint64_t late;    /* instants taken more than one period after they were due */
    uint64_t retried; /* thread samples taken again: its ranges changed while it was read */
    uint64_t lost;    /* thread samples given up: memory unreadable, or ranges kept moving */
    int64_t busy_ns;  /* time spent sampling */
    int64_t running;  /* 1 while the sampler thread runs */
} mxp_sampler_stats;

void mxp_sampler_stats_get(mxp_sampler_stats *out);

/* ---- test and benchmark seams: NOT API ----
 * Tests and benchmarks drive the core through these (a full reset, a fake
 * clock, a wall clock set wrong, the escaper alone) or measure the floor of
 * a call with them (the no-ops).  They are in the cdef only because the
 * Python tests (with mxprof._testing) and benchmarks reach them through
 * cffi: bindings and users must not call them, and they may change or go
 * away in any release.  Several must not race with recording threads; each
 * says so. */

/* Return the core to its initial state: state stopped, flags cleared, all
 * buffered records, statistics, counters' values, tallies and the trace
 * output discarded, the fake clock off.  Interned objects keep their ids.
 * For tests; must not race with other calls. */
void mxp_reset(void);

/* A no-op with the signature of the hot calls: the floor a binding pays for
 * one call.  Always returns MXP_OK. */
int mxp_noop(uint32_t id);

/* The same no-op, bound the way cffi binds by default (releasing the GIL
 * around the call): the floor of a binding without mxprof's GIL policy. */
int mxp_noop_released(uint32_t id);

/* A no-op that reads the clock and stores the reading: the floor of a call
 * that timestamps something.  Returns MXP_OK. */
int mxp_noop_clock(uint32_t id);

/* Write s (n bytes of UTF-8) as a JSON string literal, quotes included, the
 * way trace files write names.  *needed receives its length; MXP_E_FULL when
 * cap is smaller (out then holds nothing usable), MXP_E_NOMEM on allocation
 * failure.  Thread-safe; the tests check the writers' escaping with it. */
int mxp_json_escape(const char *s, size_t n, char *out, size_t cap, size_t *needed);

/* Test hook: while enabled, the clock reads now_ns and only moves by
 * mxp_clock_fake_advance.  Disabling returns to the real source.  Must not
 * race with recording threads.  Records and statistics hold raw ticks,
 * converted with the source in use when they are written or read: write and
 * read what was recorded under the fake clock before disabling it. */
void mxp_clock_fake(int enabled, int64_t now_ns);

/* Test hook: advance the fake clock by delta_ns (no effect when it is off). */
void mxp_clock_fake_advance(int64_t delta_ns);

/* Test hook: shift mxp_clock_wall_ns by skew_ns from now on, as if this
 * process's wall clock were set wrong (profiles begun later carry it). */
void mxp_clock_skew_set(int64_t skew_ns);

/* MXP_CDEF_END */

#ifdef __cplusplus
}
#endif

#endif /* MXPROF_H */
