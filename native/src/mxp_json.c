/*
 * mxp_json.c -- a growable byte buffer and the JSON pieces the writers need:
 * string escaping and fast integer / microsecond formatting (printf's
 * floating point would dominate the cost of writing millions of events).
 */
#include "mxp_internal.h"

#include <stdlib.h>
#include <string.h>

bool mxpi_buf_reserve(mxpi_buf *b, size_t extra) {
    if (b->failed) return false;
    if (b->len + extra <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra) cap *= 2;
    char *p = realloc(b->data, cap);
    if (p == NULL) {
        b->failed = true;
        return false;
    }
    b->data = p;
    b->cap = cap;
    return true;
}

void mxpi_buf_put(mxpi_buf *b, const char *s, size_t n) {
    if (!mxpi_buf_reserve(b, n)) return;
    memcpy(b->data + b->len, s, n);
    b->len += n;
}

void mxpi_buf_puts(mxpi_buf *b, const char *s) { mxpi_buf_put(b, s, strlen(s)); }

void mxpi_buf_putc(mxpi_buf *b, char c) {
    if (!mxpi_buf_reserve(b, 1)) return;
    b->data[b->len++] = c;
}

void mxpi_buf_u64(mxpi_buf *b, uint64_t v) {
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    if (!mxpi_buf_reserve(b, (size_t)n)) return;
    while (n) b->data[b->len++] = tmp[--n];
}

void mxpi_buf_i64(mxpi_buf *b, int64_t v) {
    if (v < 0) {
        mxpi_buf_putc(b, '-');
        mxpi_buf_u64(b, (uint64_t)0 - (uint64_t)v);
    } else {
        mxpi_buf_u64(b, (uint64_t)v);
    }
}

void mxpi_buf_us(mxpi_buf *b, int64_t ns) {
    uint64_t a = ns < 0 ? (uint64_t)0 - (uint64_t)ns : (uint64_t)ns;
    if (ns < 0) mxpi_buf_putc(b, '-');
    mxpi_buf_u64(b, a / 1000);
    uint64_t frac = a % 1000;
    if (!mxpi_buf_reserve(b, 4)) return;
    char *p = b->data + b->len;
    p[0] = '.';
    p[1] = (char)('0' + frac / 100);
    p[2] = (char)('0' + frac / 10 % 10);
    p[3] = (char)('0' + frac % 10);
    b->len += 4;
}

/* Escape per RFC 8259: quote, backslash and every control character; the
 * input is UTF-8 (the bindings guarantee it) and is copied through as is. */
void mxpi_buf_json_str(mxpi_buf *b, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    if (!mxpi_buf_reserve(b, n + 2)) return;
    b->data[b->len++] = '"';
    size_t run = 0; /* start of the pending unescaped run */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        mxpi_buf_put(b, s + run, i - run);
        run = i + 1;
        char esc[6] = {'\\', 0, 0, 0, 0, 0};
        size_t len = 2;
        switch (c) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        default:
            esc[1] = 'u';
            esc[2] = '0';
            esc[3] = '0';
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            len = 6;
        }
        mxpi_buf_put(b, esc, len);
    }
    mxpi_buf_put(b, s + run, n - run);
    mxpi_buf_putc(b, '"');
}

void mxpi_buf_free(mxpi_buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    b->failed = false;
}

char *mxpi_dup(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p == NULL) return NULL;
    if (n) memcpy(p, s, n);
    p[n] = '\0';
    return p;
}
