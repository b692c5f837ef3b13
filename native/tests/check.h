/*
 * check.h -- what the C test programs share: a failure count and the checks
 * that add to it (a failed check prints where and what, and the program goes
 * on, so one run shows every failure).
 */
#ifndef MXP_TESTS_CHECK_H
#define MXP_TESTS_CHECK_H

#include <stdio.h>

static int failures;

#define CHECK(cond)                                                                         \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "%s:%d: %s: CHECK failed: %s\n", __FILE__, __LINE__, __func__, \
                    #cond);                                                                 \
            failures++;                                                                     \
        }                                                                                   \
    } while (0)

#define CHECK_EQ(a, b)                                                                   \
    do {                                                                                 \
        long long va_ = (long long)(a), vb_ = (long long)(b);                            \
        if (va_ != vb_) {                                                                \
            fprintf(stderr, "%s:%d: %s: %s == %lld, expected %s == %lld\n", __FILE__,     \
                    __LINE__, __func__, #a, va_, #b, vb_);                               \
            failures++;                                                                  \
        }                                                                                \
    } while (0)

#endif /* MXP_TESTS_CHECK_H */
