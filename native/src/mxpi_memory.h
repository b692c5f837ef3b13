/*
 * mxpi_memory.h -- memory attribution's calls from the rest of the core
 * (mxp_memory.c).
 */
#ifndef MXPI_MEMORY_H
#define MXPI_MEMORY_H

#include "mxpi_base.h"

void mxpi_memory_reset(void);
/* fork(): the table's lock is held across it, then released in parent and
 * child (mxp_core.c); after that the child clears the table. */
void mxpi_memory_fork_lock(void);
void mxpi_memory_fork_unlock(void);
void mxpi_memory_after_fork(void);
void mxpi_memory_stats_reset(void); /* peaks restart at what is in use */

#endif /* MXPI_MEMORY_H */
