/*
 * mxpi_sampler.h -- the sampling thread (mxp_sampler.c); its public calls
 * are mxp_sampler_* in mxprof.h.
 */
#ifndef MXPI_SAMPLER_H
#define MXPI_SAMPLER_H

#include "mxpi_base.h"

/* Forget the sampler's tallies (mxp_reset; the sampler must be stopped). */
void mxpi_sampler_reset(void);

#endif /* MXPI_SAMPLER_H */
