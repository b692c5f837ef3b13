/*
 * mxpi_track.h -- tracks' calls from the rest of the core (mxp_track.c).
 */
#ifndef MXPI_TRACK_H
#define MXPI_TRACK_H

#include "mxpi_base.h"

/* fork(): the tracks' lock is held across it, then released in parent and
 * child alike (mxp_core.c). */
void mxpi_tracks_fork_lock(void);
void mxpi_tracks_fork_unlock(void);

#endif /* MXPI_TRACK_H */
