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

/* How a caller of the two-rank protocols below waits: wait(arg, e, slot)
 * runs erdma_pair_wait to its end and answers 0, the peer's error, or a
 * code of the caller's (`interrupted`: a signal), after which a counted
 * operation is withdrawn (erdma_pair_withdraw) and the protocol ends with
 * that code; release(arg) / acquire(arg, token), where not NULL, are called
 * around each copy of more than ERDMA_PAIR_DATA_MAX bytes (Python's GIL). */
typedef struct coll_pair_waiter {
  int (*wait)(void *arg, erdma_engine *e, int slot);
  void *(*release)(void *arg);
  void (*acquire)(void *arg, void *token);
  void *arg;
  int interrupted;
} coll_pair_waiter;

/* On pair `slot`, agreed with the peer (erdma_pair_find): an Allgather's or
 * Alltoall's exchange of blocks of at most ERDMA_PAIR_DATA_MAX bytes by
 * flags, `out` to the peer and its block into `in`, `own` bytes from `from`
 * to `to` once `out` is shared; a two-rank Alltoall of blocks below
 * ERDMA_PAIR_CMA_MAX (sbuf NULL: in place; `me` this rank's index); a
 * Bcast of more than ERDMA_PAIR_DATA_MAX bytes.  0 or an error code (the
 * waiter's own included).  The one form of these protocols for the
 * collectives in C (erdma_coll_*) and the one-call path (erdma_pyfast.c). */
int coll_pair_exchange(erdma_engine *e, int slot, const void *out, void *in, uint64_t blk,
                       void *to, const void *from, uint64_t own, const coll_pair_waiter *w);
int coll_pair_alltoall(erdma_engine *e, int slot, const void *sbuf, void *rbuf, uint64_t blk,
                       int me, const coll_pair_waiter *w);
int coll_pair_bcast_cma(erdma_engine *e, int slot, void *buf, uint64_t n, int isroot,
                        const coll_pair_waiter *w);

#endif /* ERDMA_COLL_H */
