/*
 * mxp_capi.c -- the C API's table (mxprof/include/mxprof_capi.h).
 *
 * Each entry checks what a native caller can get wrong and Python cannot (a
 * NULL name, an id never handed out, an id of another kind), tallies it in
 * invalid_calls, and otherwise is the core's own hot call: the same buffers,
 * statistics and files as the Python API.  The check is one load of the
 * object count and one of the object's kind.
 */
#include "mxpi_base.h"
#include "mxpi_core.h"
#include "mxpi_registry.h"

#include "../../mxprof/include/mxprof_capi.h"

#include <string.h>

/* The header repeats the core's values so that it stands alone. */
_Static_assert(MXPROF_CAPI_OK == MXP_OK && MXPROF_CAPI_NEW_THREAD == MXP_NEW_THREAD &&
                   MXPROF_CAPI_E_INVALID == MXP_E_INVALID && MXPROF_CAPI_E_FULL == MXP_E_FULL,
               "C API codes drifted from the core's");
_Static_assert(MXPROF_CAPI_TASK == MXP_KIND_TASK && MXPROF_CAPI_FRAME == MXP_KIND_FRAME &&
                   MXPROF_CAPI_EVENT == MXP_KIND_EVENT && MXPROF_CAPI_COUNTER == MXP_KIND_COUNTER &&
                   MXPROF_CAPI_MARKER == MXP_KIND_MARKER,
               "C API kinds drifted from the core's");
_Static_assert(MXPROF_CAPI_SCOPE_GLOBAL == MXP_SCOPE_GLOBAL &&
                   MXPROF_CAPI_SCOPE_THREAD == MXP_SCOPE_THREAD,
               "C API scopes drifted from the core's");

static int refuse(void) {
    atomic_fetch_add_explicit(&mxpi_g.invalid, 1, MXPI_RELAXED);
    return MXP_E_INVALID;
}

/* The kind of id, or 0 for an id not handed out. */
static inline uint32_t kind_of(uint32_t id) {
    if (MXPI_UNLIKELY(id >= atomic_load_explicit(&mxpi_g.nobj, MXPI_ACQUIRE))) return 0;
    return mxpi_obj(id)->kind;
}

static int capi_intern(int kind, const char *domain, const char *name, uint32_t *id_out) {
    if (kind < MXP_KIND_TASK || kind > MXP_KIND_MARKER || name == NULL || id_out == NULL)
        return refuse();
    if (domain == NULL && kind != MXP_KIND_EVENT) return refuse();
    const char *d = domain ? domain : "";
    return mxp_object_register(kind, d, strlen(d), name, strlen(name), id_out);
}

static int capi_range_begin(uint32_t id) {
    uint32_t kind = kind_of(id);
    if (MXPI_LIKELY(kind == MXP_KIND_TASK || kind == MXP_KIND_EVENT)) return mxp_range_begin(id);
    if (kind == MXP_KIND_FRAME) return mxp_frame_begin(id);
    return refuse();
}

static int capi_range_end(uint32_t id) {
    uint32_t kind = kind_of(id);
    if (MXPI_LIKELY(kind == MXP_KIND_TASK || kind == MXP_KIND_EVENT || kind == MXP_KIND_FRAME))
        return mxp_range_end(id);
    return refuse();
}

static int capi_counter_set(uint32_t id, int64_t value) {
    if (MXPI_UNLIKELY(kind_of(id) != MXP_KIND_COUNTER)) return refuse();
    return mxp_counter_set(id, value);
}

static int capi_counter_add(uint32_t id, int64_t delta) {
    if (MXPI_UNLIKELY(kind_of(id) != MXP_KIND_COUNTER)) return refuse();
    return mxp_counter_add(id, delta);
}

static int capi_mark(uint32_t id, int scope) {
    if (MXPI_UNLIKELY(kind_of(id) != MXP_KIND_MARKER)) return refuse();
    if (MXPI_UNLIKELY(scope < MXP_SCOPE_GLOBAL || scope > MXP_SCOPE_MARKER)) return refuse();
    return mxp_marker_mark(id, scope);
}

static int capi_enabled(void) { return (mxpi_flags_now() & MXP_FLAG_RECORD) != 0; }

static const mxprof_capi table = {
    .major = MXPROF_CAPI_MAJOR,
    .minor = MXPROF_CAPI_MINOR,
    .size = sizeof(mxprof_capi),
    .intern = capi_intern,
    .range_begin = capi_range_begin,
    .range_end = capi_range_end,
    .counter_set = capi_counter_set,
    .counter_add = capi_counter_add,
    .mark = capi_mark,
    .enabled = capi_enabled,
};

const void *mxp_capi_table(void) {
    mxp_init(); /* a native caller may record before any Python call did */
    return &table;
}

const char *mxp_capi_name(void) { return MXPROF_CAPI_NAME; }
