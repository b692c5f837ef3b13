/*
 * mxpi_memory.h -- memory attribution's calls from the rest of the core
 * (mxp_memory.c).
 */
#ifndef MXPI_MEMORY_H
#define MXPI_MEMORY_H

#include "mxpi_base.h"

void mxpi_memory_reset(void);
void mxpi_memory_after_fork(void);
void mxpi_memory_stats_reset(void); /* peaks restart at what is in use */

#endif /* MXPI_MEMORY_H */
