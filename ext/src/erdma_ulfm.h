/* erdma_ulfm.h - failures of peers as ULFM reports them (erdma_ulfm.c).
 *
 * The component owns the order in which peers failed and each context's
 * members, and answers whether a request must report an unacknowledged
 * failure.  It needs only erdma.h (the engine and requests behind
 * pointers). */
#ifndef ERDMA_ULFM_H
#define ERDMA_ULFM_H

#include <stdint.h>

#include "erdma.h"

/* ulfm.c (under e->mu) */
void ulfm_note_failure(erdma_engine *e, int peer);
int ctx_failure_unacked(erdma_engine *e, uint32_t ctx); /* a member failed, unacknowledged */
int req_failure_pending(erdma_req *r); /* ANY_SOURCE receive with an unacked failure */
int reqs_failure_pending(erdma_req *const *reqs, int n);
void ulfm_free(erdma_engine *e);

#endif /* ERDMA_ULFM_H */
