/*
 * mxpi_base.h -- what every file of the core shares (internal, not
 * installed): feature macros, the standard headers the internal headers
 * rely on, branch hints and the shorthands for relaxed atomics.
 *
 * Internal headers are named mxpi_<subsystem>.h after the internal prefix;
 * each includes this one first, so _GNU_SOURCE precedes every system
 * header as long as a source file includes an mxpi_ header first.
 */
#ifndef MXPI_BASE_H
#define MXPI_BASE_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "mxprof.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MXPI_TSAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__) && !defined(MXPI_TSAN)
#define MXPI_TSAN 1
#endif

#define MXPI_LIKELY(x) __builtin_expect(!!(x), 1)
#define MXPI_CACHE_LINE 64
#define MXPI_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define MXPI_RELAXED memory_order_relaxed
#define MXPI_ACQUIRE memory_order_acquire
#define MXPI_RELEASE memory_order_release

#define MXPI_LOAD(x) atomic_load_explicit(&(x), MXPI_RELAXED)
#define MXPI_STORE(x, v) atomic_store_explicit(&(x), (v), MXPI_RELAXED)

/* Add one to a tally that only its owner writes (others read it). */
static inline void mxpi_tally(_Atomic uint64_t *c) {
    atomic_store_explicit(c, atomic_load_explicit(c, MXPI_RELAXED) + 1, MXPI_RELAXED);
}

#endif /* MXPI_BASE_H */
