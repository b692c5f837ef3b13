/*
 * mxo_depth.c -- see mxo_depth.h: the depth of each range, one pass.
 *
 * Ends are compared as 128-bit sums: a start near INT64_MAX plus its length
 * does not wrap, and a thread's first bound, 2**63, is the pure pass's
 * (mxprof/trace/parquet.py kept it as `1 << 63`).
 */
#include "mxo_read.h" /* MXO_ERR_* */
#include "mxo_depth.h"

#include <stdlib.h>

typedef struct {
    int64_t *starts; /* the stack */
    size_t n, cap;
    __int128 bound; /* the end of the last range met: later ones end no later */
} stack;

struct mxo_depths {
    stack *threads; /* by thread id */
    size_t n_threads;
};

mxo_depths *mxo_depths_new(void)
{
    return calloc(1, sizeof(mxo_depths));
}

void mxo_depths_free(mxo_depths *d)
{
    if (d == NULL)
        return;
    for (size_t i = 0; i < d->n_threads; i++)
        free(d->threads[i].starts);
    free(d->threads);
    free(d);
}

/* Thread t's stack, the table grown to hold it; NULL when out of memory. */
static stack *thread_of(mxo_depths *d, size_t t)
{
    if (t >= d->n_threads) {
        size_t cap = d->n_threads ? d->n_threads : 64;
        while (cap <= t) {
            if (cap > SIZE_MAX / 2 / sizeof(stack))
                return NULL;
            cap *= 2;
        }
        stack *grown = realloc(d->threads, cap * sizeof(stack));
        if (grown == NULL)
            return NULL;
        for (size_t i = d->n_threads; i < cap; i++) {
            grown[i].starts = NULL;
            grown[i].n = grown[i].cap = 0;
            grown[i].bound = (__int128)1 << 63;
        }
        d->threads = grown;
        d->n_threads = cap;
    }
    return &d->threads[t];
}

static int push(stack *s, int64_t start)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        if (cap > SIZE_MAX / sizeof(int64_t))
            return MXO_ERR_MEMORY;
        int64_t *grown = realloc(s->starts, cap * sizeof(int64_t));
        if (grown == NULL)
            return MXO_ERR_MEMORY;
        s->starts = grown;
        s->cap = cap;
    }
    s->starts[s->n++] = start;
    return 0;
}

int mxo_depths_run(mxo_depths *d, const int64_t *thread, const int64_t *ts, const int64_t *dur,
                   size_t n, int32_t *out)
{
    if (d == NULL || (n > 0 && (thread == NULL || ts == NULL || dur == NULL || out == NULL)))
        return MXO_ERR_ARG;
    stack *s = NULL;
    int64_t current = -1;
    for (size_t i = 0; i < n; i++) {
        if (thread[i] < 0)
            return MXO_ERR_ARG;
        if (thread[i] != current) {
            current = thread[i];
            if ((uint64_t)current > SIZE_MAX)
                return MXO_ERR_ARG;
            s = thread_of(d, (size_t)current);
            if (s == NULL)
                return MXO_ERR_MEMORY;
        }
        int64_t start = ts[i];
        __int128 end = (__int128)start + dur[i];
        if (end > s->bound)
            return 1;
        s->bound = end;
        while (s->n > 0 && s->starts[s->n - 1] > start)
            s->n--;
        if (s->n > INT32_MAX)
            return MXO_ERR_MEMORY; /* a depth past int32: the table's column type */
        out[i] = (int32_t)s->n;
        if (dur[i] > 0 && push(s, start) != 0)
            return MXO_ERR_MEMORY;
    }
    return 0;
}
