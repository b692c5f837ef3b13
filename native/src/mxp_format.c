/*
 * mxp_format.c -- what the trace file formats share: the choice of format by
 * the file's name, writing at an offset, and how objects and marker scopes
 * are named in a trace (the same in every format).
 */
#include "mxpi_format.h"
#include "mxpi_json.h"
#include "mxpi_registry.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

static bool has_suffix(const char *s, size_t n, const char *suffix) {
    size_t k = strlen(suffix);
    return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

const mxpi_format *mxpi_format_of(const char *path, size_t n) {
    if (has_suffix(path, n, ".perfetto-trace") || has_suffix(path, n, ".pftrace")) return &mxpi_perfetto;
    if (has_suffix(path, n, ".gz")) {
#ifdef MXPI_HAVE_ZLIB
        return &mxpi_chrome_json_gz;
#else
        return NULL;
#endif
    }
    return &mxpi_chrome_json;
}

int mxp_trace_format(const char *path, size_t path_len) {
    if (path == NULL) return MXP_E_INVALID;
    const mxpi_format *f = mxpi_format_of(path, path_len);
    return f == &mxpi_chrome_json      ? MXP_FORMAT_JSON
           : f == &mxpi_perfetto       ? MXP_FORMAT_PERFETTO
           : f != NULL                 ? MXP_FORMAT_JSON_GZ
                                       : MXP_E_INVALID;
}

bool mxpi_pwrite_all(mxpi_out *o, const char *p, size_t n, int64_t *off) {
    while (n) {
        ssize_t k = pwrite(o->fd, p, n, (off_t)*off);
        if (k < 0) {
            if (errno == EINTR) continue;
            o->err = errno;
            return false;
        }
        if (k == 0) {
            o->err = ENOSPC;
            return false;
        }
        p += k;
        n -= (size_t)k;
        *off += k;
    }
    return true;
}

const char *mxpi_object_title(const mxpi_object *o, size_t *len) {
    if (o->kind == MXP_KIND_ALLOC || o->kind == MXP_KIND_FREE) {
        *len = o->kind == MXP_KIND_ALLOC ? 5 : 4;
        return o->kind == MXP_KIND_ALLOC ? "alloc" : "free";
    }
    *len = o->name_len;
    return o->name;
}

void mxpi_object_category(mxpi_buf *b, const mxpi_object *o) {
    if (o->kind == MXP_KIND_EVENT) {
        mxpi_buf_puts(b, "event");
    } else if (o->kind == MXP_KIND_ALLOC || o->kind == MXP_KIND_FREE) {
        mxpi_buf_puts(b, "Device Storage");
    } else {
        mxpi_buf_put(b, o->domain, o->domain_len);
        mxpi_buf_puts(b, o->kind == MXP_KIND_FRAME ? ",frame" : o->kind == MXP_KIND_GPU ? ",gpu" : "");
    }
}

const char *mxpi_scope_letter(uint32_t scope) {
    return scope == MXP_SCOPE_GLOBAL ? "g" : scope == MXP_SCOPE_PROCESS ? "p" : "t";
}

const char *mxpi_scope_name(uint32_t scope) {
    static const char *names[] = {"unknown", "global", "process", "thread", "task", "marker"};
    return scope <= MXP_SCOPE_MARKER ? names[scope] : "unknown";
}
