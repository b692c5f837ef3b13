/*
 * mxpi_buffer.h -- the per-thread buffers' layout: fixed-size trace records
 * in chunks.  (The chunks' free list and the event cap are in mxp_thread.c,
 * the writer that drains them in mxp_trace.c.)
 *
 * Ownership:
 *   - A thread appends to its own last chunk only (mxpi_record).  Records
 *     are published by a release store of chunk->count; the writer reads
 *     them after an acquire load, so draining never stops recorders.
 *   - A chunk is freed only by the writer, and only once the owner has moved
 *     to a newer chunk (chunk->next != NULL).
 */
#ifndef MXPI_BUFFER_H
#define MXPI_BUFFER_H

#include "mxpi_base.h"

/* One trace record, 24 bytes.  ts is the start (ranges) or the instant, in
 * ticks; val is the duration in ticks (ranges) or the sample (counters); aux
 * is the scope (markers), or for ranges the frame index (frames) with the
 * MXPI_AUX_* bits below. */
typedef struct mxpi_rec {
    int64_t ts;
    int64_t val;
    uint32_t id;
    uint32_t aux;
} mxpi_rec;

/* Bits of a range record's aux. */
#define MXPI_AUX_CUT (1u << 31)      /* closed by a stop, not by its end */
#define MXPI_AUX_ASYNC (1u << 30)    /* ended on another thread or task than it began */
#define MXPI_AUX_INDEX 0x3fffffffu   /* the frame index */

#define MXPI_CHUNK_RECORDS 1024u
#define MXPI_RESERVE_STEP 256u

typedef struct mxpi_chunk {
    _Atomic(struct mxpi_chunk *) next; /* set once the owner moved on */
    _Atomic uint32_t count;            /* committed records */
    uint32_t unused;
    mxpi_rec rec[MXPI_CHUNK_RECORDS];
} mxpi_chunk;

#endif /* MXPI_BUFFER_H */
