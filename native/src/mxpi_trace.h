/*
 * mxpi_trace.h -- the trace writer's calls from the rest of the core
 * (mxp_trace.c).  The writer runs under out_lock.
 */
#ifndef MXPI_TRACE_H
#define MXPI_TRACE_H

#include "mxpi_base.h"
#include "mxpi_buffer.h"

void mxpi_trace_reset(void);
void mxpi_trace_after_fork(void);
/* Hand the writer a range closed on behalf of thread tid (caller holds
 * out_lock). */
void mxpi_trace_add_cut(const mxpi_rec *r, uint32_t tid);

#endif /* MXPI_TRACE_H */
