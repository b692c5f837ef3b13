/*
 * mxpi_json.h -- a growable byte buffer and the JSON pieces the writers
 * need (mxp_json.c).
 */
#ifndef MXPI_JSON_H
#define MXPI_JSON_H

#include "mxpi_base.h"

typedef struct mxpi_buf {
    char *data;
    size_t len;
    size_t cap;
    bool failed; /* an allocation failed; the content is incomplete */
} mxpi_buf;

bool mxpi_buf_reserve(mxpi_buf *b, size_t extra);
void mxpi_buf_put(mxpi_buf *b, const char *s, size_t n);
void mxpi_buf_puts(mxpi_buf *b, const char *s);
void mxpi_buf_putc(mxpi_buf *b, char c);
void mxpi_buf_i64(mxpi_buf *b, int64_t v);
void mxpi_buf_u64(mxpi_buf *b, uint64_t v);
void mxpi_buf_us(mxpi_buf *b, int64_t ns); /* ns as µs with 3 decimals */

/* Unchecked formatting into room the caller reserved; each returns the end.
 * u64 needs 20 bytes, i64 21, us 26. */
char *mxpi_fmt_u64(char *p, uint64_t v);
char *mxpi_fmt_i64(char *p, int64_t v);
char *mxpi_fmt_us(char *p, int64_t ns);
void mxpi_buf_json_str(mxpi_buf *b, const char *s, size_t n);
void mxpi_buf_free(mxpi_buf *b);

/* A NUL-terminated heap copy of n bytes (NULL when memory ran out). */
char *mxpi_dup(const char *s, size_t n);

#endif /* MXPI_JSON_H */
