/*
 * mxpi_track.h -- tracks' calls from the rest of the core (mxp_track.c).
 */
#ifndef MXPI_TRACK_H
#define MXPI_TRACK_H

#include "mxpi_base.h"

void mxpi_tracks_after_fork(void);

#endif /* MXPI_TRACK_H */
