/*
 * mxpi_thread_names.h -- threads and tracks as trace output shows them
 * (mxp_thread_names.c), by trace tid.  Every call takes names_lock.
 */
#ifndef MXPI_THREAD_NAMES_H
#define MXPI_THREAD_NAMES_H

#include "mxpi_base.h"

/* A new thread state with trace id tid (mxpi_thread_new). */
void mxpi_thread_note(uint32_t tid, int64_t os_tid);

/* The writer's marks: thread tid has events in the current file; a new
 * file begins, with no thread's events yet. */
void mxpi_thread_mark_used(uint32_t tid);
void mxpi_threads_unmark(void);

/* Visit, under names_lock, every thread that has events in the current
 * file, in trace-id order, with its name (NULL: never named). */
typedef void (*mxpi_thread_visit)(void *ctx, uint32_t tid, int64_t os_tid, const char *name,
                                  size_t name_len);
void mxpi_threads_used(mxpi_thread_visit fn, void *ctx);

/* Call fn, under names_lock, for the one thread with trace id tid. */
void mxpi_thread_info(uint32_t tid, mxpi_thread_visit fn, void *ctx);

#endif /* MXPI_THREAD_NAMES_H */
