/*
 * mxpi_nvtx.h -- NVTX output of recorded ranges and marks (mxp_nvtx.c),
 * while MXP_FLAG_NVTX is set.
 *
 * Ranges on a thread's own stack are NVTX push/pop ranges of their domain on
 * that thread; ranges on tracks (asyncio tasks), which may interleave on one
 * thread, are NVTX start/end ranges.  The hooks run on the stack's owner.
 */
#ifndef MXPI_NVTX_H
#define MXPI_NVTX_H

#include "mxpi_thread.h"

/* Entry o of t's stack was just begun (recording, the flag set): open its
 * NVTX range.  Sets MXPI_OPEN_NVTX in o->flags when it did. */
void mxpi_nvtx_begin(mxpi_thread *t, mxpi_open *o);

/* Entry i of t's stack, which has MXPI_OPEN_NVTX, leaves the stack now;
 * entries i+1 .. t->depth-1 are still above it.  Closes its NVTX range: a
 * push/pop range below others of its domain closes them too and reopens
 * them (NVTX ranges of a domain nest on a thread; mxprof's may not). */
void mxpi_nvtx_end(mxpi_thread *t, uint32_t i);

/* A recorded marker instant of object id. */
void mxpi_nvtx_mark(uint32_t id);

#endif /* MXPI_NVTX_H */
