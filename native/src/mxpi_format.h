/*
 * mxpi_format.h -- the interface of the trace file formats (Chrome JSON,
 * gzip Chrome JSON, Perfetto protobuf), which mxp_trace.c drives under
 * out_lock, and what the formats share.
 *
 * A flush calls begin, record for every record, then end; if all of them
 * succeeded it calls commit, otherwise restore.  After create, and after
 * every commit, the file on disk must be a complete, loadable trace; after
 * restore it must be what it was at the last commit (or create).
 */
#ifndef MXPI_FORMAT_H
#define MXPI_FORMAT_H

#include "mxpi_base.h"
#include "mxpi_buffer.h"
#include "mxpi_clock.h"
#include "mxpi_json.h"
#include "mxpi_registry.h"

typedef struct mxpi_out {
    int fd;
    bool regular;                /* a regular file (others cannot be cut) */
    int err;                     /* errno of the last failure */
    int pid;
    int64_t epoch_ticks;         /* ts 0 of the profile */
    int64_t base_wall_ns;        /* wall-clock time of ts 0 */
    int64_t base_mono_ns;        /* CLOCK_MONOTONIC time of ts 0 */
    mxpi_timebase tb;            /* tick -> ns for this flush */
    mxp_counts tallies;          /* this profile's tallies, for trailers */
    const char *process_name;    /* process_name metadata (never NULL) */
    size_t process_name_len;
    const char *top_json;        /* extra top-level JSON members (Chrome) */
    size_t top_json_len;
    const char *other_json;      /* extra otherData members (Chrome) */
    size_t other_json_len;
    void *state;                 /* the format's own, from create to release */
} mxpi_out;

typedef struct mxpi_format {
    const char *name;
    /* The file was just created, empty: write its beginning. */
    bool (*create)(mxpi_out *o);
    /* A flush begins. */
    bool (*begin)(mxpi_out *o);
    /* One record of the thread with trace id tid (ts >= the profile's ts 0). */
    bool (*record)(mxpi_out *o, const mxpi_rec *r, uint32_t tid);
    /* The flush's records are all given: write everything and any trailer. */
    bool (*end)(mxpi_out *o);
    /* end succeeded: the written state is the one to keep. */
    void (*commit)(mxpi_out *o);
    /* A step failed: put the file back as it was at the last commit. */
    void (*restore)(mxpi_out *o);
    /* The file is done with (closed or abandoned): free the state. */
    void (*release)(mxpi_out *o);
} mxpi_format;

extern const mxpi_format mxpi_chrome_json;    /* mxp_chrome.c */
extern const mxpi_format mxpi_chrome_json_gz; /* mxp_chrome.c (MXPI_HAVE_ZLIB) */
extern const mxpi_format mxpi_perfetto;       /* mxp_perfetto.c */

/* mxp_format.c */

/* The format a trace file named path (n bytes) is written in; NULL when
 * this build cannot write it (gzip without zlib). */
const mxpi_format *mxpi_format_of(const char *path, size_t n);

/* Write all of p at *off, advancing it; on failure set o->err. */
bool mxpi_pwrite_all(mxpi_out *o, const char *p, size_t n, int64_t *off);

/* What an object is called in a trace (alloc/free instants: "alloc",
 * "free"), and its category (Chrome's "cat"), unescaped: both formats
 * show the same. */
const char *mxpi_object_title(const mxpi_object *o, size_t *len);
void mxpi_object_category(mxpi_buf *b, const mxpi_object *o);

/* Marker scope as Chrome's "s" letter and as its MXNet name. */
const char *mxpi_scope_letter(uint32_t scope);
const char *mxpi_scope_name(uint32_t scope);

#endif /* MXPI_FORMAT_H */
