/*
 * mxo_depth.h -- the Parquet form's depth pass (mxprof/trace/parquet.py, _finish).
 *
 * Ranges are met latest-ended first, per thread (a trace in mxprof's shape
 * lists a thread's ranges in the order they ended; read backwards, a parent
 * comes before its children).  Every range still on a thread's stack ended
 * no earlier than the current one, so it contains the current one exactly
 * when it began no later: the stack holds starts only, and a range's depth
 * is the stack's height once the starts after its own are popped.
 * Zero-length ranges contain nothing and are not pushed.
 *
 * The state (each thread's stack and the end of its last range met) lives
 * in an mxo_depths from mxo_depths_new until mxo_depths_free, across calls,
 * so that a table is passed row group by row group.  No call touches
 * Python; the calls keep no pointer to their arguments.  This header is
 * also cffi's declarations (native/offline/build_fastjson.py): no guards,
 * nothing but these declarations.
 */

typedef struct mxo_depths mxo_depths;

/* A pass's state, empty; NULL when out of memory. */
mxo_depths *mxo_depths_new(void);
/* Frees d and its stacks; NULL is fine. */
void mxo_depths_free(mxo_depths *d);
/* The depths of n ranges (thread ids 0 or more, starts and lengths in ns;
 * only a positive length is pushed: it can contain others), in the order
 * met, into out[0..n).  Returns 0; 1 when a thread's ranges did not come
 * latest-ended first (out then undefined, d not to be used again);
 * MXO_ERR_MEMORY; MXO_ERR_ARG for a negative thread id, or a NULL pointer
 * with n > 0. */
int mxo_depths_run(mxo_depths *d, const int64_t *thread, const int64_t *ts, const int64_t *dur,
                   size_t n, int32_t *out);
