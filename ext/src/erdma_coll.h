/* erdma_coll.h - the collectives in C (erdma_coll.c, erdma_bulk.c).
 *
 * What both collective sources share: the check of the communicator
 * arguments of the erdma_coll_* calls.  It needs only erdma.h. */
#ifndef ERDMA_COLL_H
#define ERDMA_COLL_H

#include "erdma.h"

/* the communicator arguments of the erdma_coll_* calls (coll.c, bulk.c) */
static inline int coll_check_comm(erdma_engine *e, const int *ranks, int n, int me) {
  if (!e || !ranks || n < 1 || me < 0 || me >= n) return ERDMA_ERR_INVAL;
  return 0;
}

#endif /* ERDMA_COLL_H */
