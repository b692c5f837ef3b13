/*
 * mxp_internal.h -- every internal header of the core at once, for tools
 * built against the core's sources from outside it (benchmarks/native).
 * The core's own files and its tests include the mxpi_*.h headers they
 * use instead; see mxpi_base.h for the naming.
 */
#ifndef MXP_INTERNAL_H
#define MXP_INTERNAL_H

#include "mxpi_base.h"

#include "mxpi_agg.h"
#include "mxpi_buffer.h"
#include "mxpi_chrome.h"
#include "mxpi_claim.h"
#include "mxpi_clock.h"
#include "mxpi_core.h"
#include "mxpi_format.h"
#include "mxpi_json.h"
#include "mxpi_memory.h"
#include "mxpi_registry.h"
#include "mxpi_thread.h"
#include "mxpi_thread_names.h"
#include "mxpi_trace.h"
#include "mxpi_track.h"

#endif /* MXP_INTERNAL_H */
