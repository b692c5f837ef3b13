/*
 * mxpi_pyread.h -- a CPython interpreter read from a thread of the core
 * (mxp_pyread.c): its thread states and their stacks, without the GIL and
 * without Python.  Every read of the interpreter's memory is a safe copy, so
 * a thread state or frame freed while it is read gives a failed or stale
 * read, never a fault.  Where the fields are comes from the binding
 * (mxp_pylayout, mxp_sampler_layout).
 */
#ifndef MXPI_PYREAD_H
#define MXPI_PYREAD_H

#include "mxpi_base.h"

#define MXPI_PY_DEPTH 1024u   /* frames of one stack read at most */
#define MXPI_PY_THREADS 4096u /* thread states walked per list at most */

/* One thread state as read. */
typedef struct mxpi_pythread {
    uint64_t addr;  /* the thread state */
    uint64_t next;  /* the next one in the interpreter's list (0: last) */
    uint64_t frame; /* its innermost frame (0: it runs no Python) */
    uint64_t chunk; /* its frame stack's current chunk and top (0: none) */
    uint64_t top;
    int64_t os_tid; /* 0: not known */
} mxpi_pythread;

/* Whether a layout is set (reads fail without one). */
bool mxpi_py_ready(void);

/* The first thread state of the interpreter (0: none, or unreadable). */
uint64_t mxpi_py_first(void);

/* Read thread state addr into *out; false when it cannot be read or does
 * not belong to the interpreter (it was freed under the reader). */
bool mxpi_py_thread(uint64_t addr, mxpi_pythread *out);

/* The stack of t now: frame ids (mxpi_sframe) innermost first into frames
 * (up to cap), stopping at frames cut by mxp_sampler_cut; *track_out the
 * track of the outermost asyncio task coroutine on it (0: none).  Returns
 * the number of frames, or -1 when the stack could not be read whole (the
 * thread moved under the reader: try again). */
int mxpi_py_stack(const mxpi_pythread *t, uint32_t *frames, uint32_t cap, uint32_t *track_out);

/* Serialise readers: the code cache and the scratch buffers are shared.
 * mxpi_py_thread and mxpi_py_stack are called with it held. */
void mxpi_py_lock(void);
void mxpi_py_unlock(void);

#endif /* MXPI_PYREAD_H */
