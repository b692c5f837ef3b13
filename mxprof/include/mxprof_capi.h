/*
 * mxprof_capi.h -- record into mxprof from native code (C, C++, Cython).
 *
 * The table below is published by the Python package as the capsule
 * mxprof._C_API.  Its functions record into the same per-thread buffers,
 * statistics and trace files as the Python API: a range begun here inside a
 * Python `with task:` nests in it, on the same thread, and dumps() counts it.
 *
 * Use (in an extension module, with the GIL held, once):
 *
 *     #include <Python.h>
 *     #include "mxprof_capi.h"    // include dir: mxprof.get_include()
 *
 *     static const mxprof_capi *mxp;
 *     static uint32_t step;
 *
 *     // in PyInit_*, or the first time it is needed:
 *     mxp = mxprof_capi_import();          // NULL with ImportError set
 *     if (mxp == NULL) return NULL;
 *     mxp->intern(MXPROF_CAPI_TASK, "loader", "decode", &step);
 *
 *     // anywhere, any thread, no GIL needed:
 *     mxp->range_begin(step);
 *     ...
 *     mxp->range_end(step);
 *
 * Versioning (the ABI rule)
 *   - MXPROF_CAPI_MAJOR changes when a member of mxprof_capi changes its
 *     type, meaning or place, or is removed.  A table of another major
 *     version is refused: mxprof_capi_import raises ImportError naming both
 *     versions; rebuild the extension against the installed mxprof.
 *   - MXPROF_CAPI_MINOR grows when members are appended at the end.  A table
 *     of the same major and a minor at least the one compiled against is
 *     accepted; members past what a client knows are never read by it.
 *   - size is sizeof the table as the library built it: a client may also
 *     test for a member with MXPROF_CAPI_HAS(api, member).
 *   - Codes and kinds (MXPROF_CAPI_OK, MXPROF_CAPI_TASK, ...) keep their
 *     values within a major version.
 *
 * Conventions
 *   - Every function may be called from any thread, with or without the GIL,
 *     and never calls into Python.  intern takes a lock; the others are the
 *     core's lock-free hot calls.
 *   - Recording follows the profiler's state (mxprof.set_state): calls made
 *     while it is stopped or paused record nothing and cost a flag check.
 *   - Misuse never crashes and never aborts: a NULL name, an id not handed
 *     out by intern or one of the wrong kind (a counter id to range_begin)
 *     returns MXPROF_CAPI_E_INVALID, records nothing, and is tallied in
 *     invalid_calls (dumps() and the trace's otherData show it).  An end
 *     without a begin is tallied in unmatched_stops, as from Python.
 *   - Ids are process-wide and stable: the same (kind, domain, name) from C
 *     or Python is the same object, sharing statistics.
 */
#ifndef MXPROF_CAPI_H
#define MXPROF_CAPI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MXPROF_CAPI_MAJOR 1
#define MXPROF_CAPI_MINOR 0
#define MXPROF_CAPI_NAME "mxprof._C_API"

/* Return codes (the core's MXP_* values). */
#define MXPROF_CAPI_OK 0
#define MXPROF_CAPI_NEW_THREAD 1   /* success; the first call this thread made */
#define MXPROF_CAPI_E_INVALID -1   /* NULL name, bad kind, or an id not of its kind */
#define MXPROF_CAPI_E_FULL -5      /* the name table is full: a shared "<overflow>" id */

/* Object kinds for intern (the core's MXP_KIND_* values). */
#define MXPROF_CAPI_TASK 1      /* a range in a domain (mxprof.Task) */
#define MXPROF_CAPI_FRAME 2     /* a numbered range in a domain (mxprof.Frame) */
#define MXPROF_CAPI_EVENT 3     /* a range with no domain (mxprof.Event; domain ignored) */
#define MXPROF_CAPI_COUNTER 4   /* a signed 64-bit counter (mxprof.Counter) */
#define MXPROF_CAPI_MARKER 5    /* an instant (mxprof.Marker) */

/* Marker scopes for mark (MXNet's values). */
#define MXPROF_CAPI_SCOPE_GLOBAL 1
#define MXPROF_CAPI_SCOPE_PROCESS 2
#define MXPROF_CAPI_SCOPE_THREAD 3

typedef struct mxprof_capi {
    uint32_t major; /* MXPROF_CAPI_MAJOR of the library */
    uint32_t minor; /* MXPROF_CAPI_MINOR of the library */
    size_t size;    /* sizeof(mxprof_capi) as the library built it */

    /* ---- minor 0 ---- */

    /* Intern (kind, domain, name) -- NUL-terminated UTF-8 -- and store its id
     * in *id_out.  Call it once per name, not per event.  MXPROF_CAPI_OK;
     * MXPROF_CAPI_E_FULL with a shared "<overflow>" id; MXPROF_CAPI_E_INVALID
     * (and *id_out untouched) for a bad kind, a NULL name or id_out, or a NULL
     * domain for a kind other than EVENT. */
    int (*intern)(int kind, const char *domain, const char *name, uint32_t *id_out);

    /* Open a range of a TASK, EVENT or FRAME id on the calling thread. */
    int (*range_begin)(uint32_t id);

    /* Close the innermost open range of id on the calling thread (or one
     * begun on another thread, as an async range), as Task.stop(). */
    int (*range_end)(uint32_t id);

    /* Set a COUNTER to value / add delta (negative to subtract; saturates
     * at the int64 limits), as Counter.set_value / increment. */
    int (*counter_set)(uint32_t id, int64_t value);
    int (*counter_add)(uint32_t id, int64_t delta);

    /* Record an instant of a MARKER id with an MXPROF_CAPI_SCOPE_* scope. */
    int (*mark)(uint32_t id, int scope);

    /* 1 while the profiler records (state 'run', not paused), else 0: skip
     * work that only feeds the profiler (formatting a name, say). */
    int (*enabled)(void);
} mxprof_capi;

/* Whether table api has member (a later minor's member, for instance). */
#define MXPROF_CAPI_HAS(api, member) \
    ((api)->size >= offsetof(mxprof_capi, member) + sizeof((api)->member))

#ifdef Py_PYTHON_H
/* Import the table from the capsule mxprof._C_API (importing mxprof).  Needs
 * the GIL.  Returns NULL with ImportError set when mxprof is missing, the
 * capsule is not mxprof's, or its version does not fit this header. */
static inline const mxprof_capi *mxprof_capi_import(void) {
    const mxprof_capi *api = (const mxprof_capi *)PyCapsule_Import(MXPROF_CAPI_NAME, 0);
    if (api == NULL) return NULL;
    if (api->major != MXPROF_CAPI_MAJOR || api->minor < MXPROF_CAPI_MINOR) {
        PyErr_Format(PyExc_ImportError,
                     "mxprof C API version %u.%u cannot serve an extension built for %u.%u "
                     "(same major, at least its minor needed): rebuild the extension against "
                     "the installed mxprof's header (mxprof.get_include())",
                     (unsigned)api->major, (unsigned)api->minor, (unsigned)MXPROF_CAPI_MAJOR,
                     (unsigned)MXPROF_CAPI_MINOR);
        return NULL;
    }
    return api;
}
#endif

#ifdef __cplusplus
}
#endif

#endif /* MXPROF_CAPI_H */
