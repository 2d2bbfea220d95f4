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

/* On pair `slot`, agreed with the peer (erdma_pair_find): an Allgather's or
 * Alltoall's exchange of blocks of at most ERDMA_PAIR_DATA_MAX bytes by
 * flags, `out` to the peer and its block into `in`, `own` bytes from `from`
 * to `to` once `out` is shared; 0 or an error code (the waiter's own
 * included: erdma_pair_waiter in erdma.h).  With erdma_pair_alltoall and
 * erdma_pair_bcast_large, the one form of these protocols for the
 * collectives in C (erdma_coll_*), the one-call path (erdma_pyfast.c) and
 * the Python algorithms (erdmampi/_engine.py). */
int coll_pair_exchange(erdma_engine *e, int slot, const void *out, void *in, uint64_t blk,
                       void *to, const void *from, uint64_t own, const erdma_pair_waiter *w);

#endif /* ERDMA_COLL_H */
