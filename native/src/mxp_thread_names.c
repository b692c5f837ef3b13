/*
 * mxp_thread_names.c -- what trace output shows of each thread and track:
 * its OS thread id, the name a binding gave it, and whether it has events
 * in the current trace file.
 *
 * The table is indexed by trace tid and lives as long as the process (names
 * outlive their threads: a thread that exited is still named in a file
 * written later).  It is under names_lock: thread states add to it when
 * they are created, bindings name threads from any thread, and the writer
 * (under out_lock) marks and visits the threads of the current file.
 */
#include "mxpi_thread_names.h"
#include "mxpi_core.h"
#include "mxpi_json.h"

#include <stdlib.h>
#include <string.h>

typedef struct tinfo {
    char *name;
    size_t name_len;
    int64_t os_tid;
    bool used; /* has events in the current file */
} tinfo;

static struct {
    tinfo *threads;
    uint32_t n;
} N;

void mxpi_thread_note(uint32_t tid, int64_t os_tid) {
    pthread_mutex_lock(&mxpi_g.names_lock);
    if (tid >= N.n) {
        uint32_t n = N.n ? N.n : 16;
        while (n <= tid) n *= 2;
        tinfo *p = realloc(N.threads, n * sizeof *p);
        if (p != NULL) {
            memset(p + N.n, 0, (n - N.n) * sizeof *p);
            N.threads = p;
            N.n = n;
        }
    }
    if (tid < N.n) N.threads[tid].os_tid = os_tid;
    pthread_mutex_unlock(&mxpi_g.names_lock);
}

int mxp_thread_name_set(uint32_t tid, const char *name, size_t name_len) {
    mxp_init();
    if (name == NULL && name_len) return MXP_E_INVALID;
    char *copy = mxpi_dup(name ? name : "", name_len);
    if (copy == NULL) return MXP_E_NOMEM;
    int rc = MXP_E_INVALID;
    pthread_mutex_lock(&mxpi_g.names_lock);
    if (tid > 0 && tid < N.n && tid <= MXPI_LOAD(mxpi_g.next_tid)) {
        free(N.threads[tid].name);
        N.threads[tid].name = copy;
        N.threads[tid].name_len = name_len;
        copy = NULL;
        rc = MXP_OK;
    }
    pthread_mutex_unlock(&mxpi_g.names_lock);
    free(copy);
    return rc;
}

void mxpi_thread_mark_used(uint32_t tid) {
    pthread_mutex_lock(&mxpi_g.names_lock);
    if (tid < N.n) N.threads[tid].used = true;
    pthread_mutex_unlock(&mxpi_g.names_lock);
}

void mxpi_threads_unmark(void) {
    pthread_mutex_lock(&mxpi_g.names_lock);
    for (uint32_t i = 0; i < N.n; i++) N.threads[i].used = false;
    pthread_mutex_unlock(&mxpi_g.names_lock);
}

void mxpi_threads_used(mxpi_thread_visit fn, void *ctx) {
    pthread_mutex_lock(&mxpi_g.names_lock);
    for (uint32_t tid = 1; tid < N.n; tid++) {
        tinfo *t = &N.threads[tid];
        if (t->used) fn(ctx, tid, t->os_tid, t->name, t->name_len);
    }
    pthread_mutex_unlock(&mxpi_g.names_lock);
}

void mxpi_thread_info(uint32_t tid, mxpi_thread_visit fn, void *ctx) {
    pthread_mutex_lock(&mxpi_g.names_lock);
    if (tid < N.n) fn(ctx, tid, N.threads[tid].os_tid, N.threads[tid].name, N.threads[tid].name_len);
    pthread_mutex_unlock(&mxpi_g.names_lock);
}

int mxp_thread_unnamed(uint32_t *tids_out, int64_t *os_tids_out, uint32_t cap, uint32_t *n_out) {
    uint32_t n = 0;
    pthread_mutex_lock(&mxpi_g.names_lock);
    for (uint32_t tid = 1; tid < N.n && n < cap; tid++) {
        tinfo *t = &N.threads[tid];
        if (t->name == NULL && t->os_tid != 0) {
            tids_out[n] = tid;
            os_tids_out[n++] = t->os_tid;
        }
    }
    pthread_mutex_unlock(&mxpi_g.names_lock);
    *n_out = n;
    return MXP_OK;
}
