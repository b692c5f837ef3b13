/*
 * mxpi_sample.h -- the sampler's tables as the writers see them
 * (mxp_sample.c): frames (function, file, line) and stack nodes (a frame
 * and its caller's node), both interned by the binding and append-only, and
 * the record a sample leaves in the sampling thread's buffer.
 *
 * A sample record: id = MXPI_SAMPLE_ID (no object has it), ts = the instant,
 * aux = the trace tid of the sampled thread or track, val = the stack node
 * in the low 32 bits and the object id of the range it is attributed to in
 * the high 32 (MXPI_SAMPLE_NO_RANGE: none).
 */
#ifndef MXPI_SAMPLE_H
#define MXPI_SAMPLE_H

#include "mxpi_base.h"

#define MXPI_SAMPLE_ID 0xffffffffu
#define MXPI_SAMPLE_NO_RANGE 0xffffffffu

typedef struct mxpi_sframe {
    const char *name; /* NUL-terminated copies, kept for the process */
    const char *file;
    uint32_t name_len;
    uint32_t file_len;
    uint32_t line;
} mxpi_sframe;

typedef struct mxpi_snode {
    uint32_t parent; /* 0: a root */
    uint32_t frame;
    uint32_t depth;  /* 1 for a root */
} mxpi_snode;

/* Intern a frame (by content) or a stack node; 0 when the table is full or
 * memory ran out.  Thread-safe (mxp_sample_frame / mxp_sample_stack). */
uint32_t mxpi_sframe_intern(const char *name, size_t name_len, const char *file, size_t file_len,
                            uint32_t line);
uint32_t mxpi_snode_intern(uint32_t parent, uint32_t frame);

/* Attributing a sample whose stack is read between two steps: pin before the
 * read (the sampled thread's state and its edit counters), settle after (the
 * innermost range open on the thread, or on the asyncio task's track, and
 * the trace tid of the timeline the sample goes to).  settle is false when
 * the thread began or ended a range meanwhile (take the sample again); pin
 * is false when the thread stays mid-edit. */
struct mxpi_thread;
typedef struct mxpi_pin {
    struct mxpi_thread *t; /* NULL: the thread has not recorded yet */
    uint32_t edits, moves;
} mxpi_pin;
bool mxpi_sample_pin(int64_t os_tid, mxpi_pin *p);
bool mxpi_sample_settle(const mxpi_pin *p, int64_t os_tid, uint32_t track, uint32_t *range_out,
                        uint32_t *tid_out);
/* A timeline of its own for a thread that never recorded (its trace tid; 0:
 * out of memory); found again by its OS thread id from then on. */
uint32_t mxpi_sample_timeline(int64_t os_tid);
/* Record the sample in self's buffer (trace on) and count it (statistics on);
 * f is the flags word loaded for it. */
void mxpi_sample_put(struct mxpi_thread *self, uint32_t f, int64_t ts, uint32_t tid,
                     uint32_t range, uint32_t stack);
/* Register the tables' fork handlers now (mxp_pyread.c's must come after:
 * fork handlers prepare in reverse order, and its lock is taken first). */
void mxpi_sample_init(void);
/* Forget the counts (mxp_reset). */
void mxpi_samples_reset(void);

/* Ids handed out so far (ids are 1 .. count); entries below it are complete. */
uint32_t mxpi_sframe_count(void);
uint32_t mxpi_snode_count(void);
/* An entry by id (1 .. count); NULL for an id not handed out. */
const mxpi_sframe *mxpi_sframe_get(uint32_t id);
const mxpi_snode *mxpi_snode_get(uint32_t id);

/* Which ids (frames, stack nodes, ranges) a trace file has defined: 0 no,
 * 1 since a commit, 2 by the flush under way.  For the writers. */
typedef struct mxpi_seen {
    uint8_t *v;
    uint32_t n;
} mxpi_seen;

/* Whether id is not yet defined in the file; marks it defined by this flush.
 * On allocation failure returns false and sets *failed. */
bool mxpi_seen_first(mxpi_seen *s, uint32_t id, bool *failed);
/* The flush's marks become permanent (keep) or are forgotten. */
void mxpi_seen_settle(mxpi_seen *s, bool keep);
void mxpi_seen_free(mxpi_seen *s);

#endif /* MXPI_SAMPLE_H */
