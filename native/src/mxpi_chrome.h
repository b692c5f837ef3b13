/*
 * mxpi_chrome.h -- what the Chrome JSON writer (mxp_chrome.c) does outside
 * a flush.
 */
#ifndef MXPI_CHROME_H
#define MXPI_CHROME_H

#include "mxpi_base.h"
#include "mxpi_registry.h"

/* Build o's JSON pieces (frag and key), which the writer copies into every
 * event of o instead of escaping its names each time.  Called once, by the
 * registry, when o is registered; the object owns them.  False when memory
 * ran out. */
bool mxpi_chrome_fragments_build(mxpi_object *o);

#endif /* MXPI_CHROME_H */
