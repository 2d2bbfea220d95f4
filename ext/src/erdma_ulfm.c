/* erdma_ulfm.c - failure notification for receives from any source (ULFM).
 *
 * A receive from a named peer fails when that peer fails (erdma_match.c).
 * One from ANY_SOURCE cannot tell which peer would have sent: as MPI's
 * fault-tolerance chapter says, while a member of its communicator has failed
 * and the failure is not acknowledged (erdma_ctx_ack, Comm.Ack_failed), a
 * wait or test of a pending ANY_SOURCE receive returns
 * ERDMA_ERR_PEER_PENDING and the receive stays posted (a live sender can
 * still match it); a blocking receive is withdrawn and fails with
 * ERDMA_ERR_PEER.  The engine learns each context's members from
 * erdma_ctx_group; a context it was not told about counts every rank.
 * All under e->mu unless said otherwise. */
#include <stdlib.h>
#include <string.h>

#include "erdma_ulfm.h"
#include "erdma_engine.h"
#include "erdma_match.h"
#include "erdma_shm.h"

typedef struct ctx_group {
  uint32_t ctx;
  int n;         /* members; -1: every rank */
  int *ranks;    /* ascending world ranks */
  int nacked;    /* failed members acknowledged (a prefix of the failure order) */
} ctx_group;

struct ulfm_state {
  int *failed;   /* world ranks in the order they failed */
  int nfailed;
  ctx_group *groups;
  int ngroups, cap;
};

static struct ulfm_state *ulfm_get(erdma_engine *e) {
  if (!e->ulfm) e->ulfm = calloc(1, sizeof *e->ulfm);
  return e->ulfm;
}

static ctx_group *group_find(erdma_engine *e, uint32_t ctx) {
  struct ulfm_state *u = e->ulfm;
  for (int i = 0; u && i < u->ngroups; i++)
    if (u->groups[i].ctx == ctx) return &u->groups[i];
  return NULL;
}

static int group_has(const ctx_group *g, int rank) {
  if (!g || g->n < 0) return 1;
  int lo = 0, hi = g->n - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    if (g->ranks[mid] == rank) return 1;
    if (g->ranks[mid] < rank) lo = mid + 1;
    else hi = mid - 1;
  }
  return 0;
}

/* engine_fail_peer: `peer` has failed. */
void ulfm_note_failure(erdma_engine *e, int peer) {
  struct ulfm_state *u = ulfm_get(e);
  if (!u) return;
  if (!u->failed && !(u->failed = malloc(sizeof(int) * (size_t)e->cfg.size))) return;
  if (u->nfailed < e->cfg.size) u->failed[u->nfailed++] = peer; /* once per peer */
  shm_wake_waiters(e); /* a thread asleep on the bell re-checks its receives */
}

static int failed_members(erdma_engine *e, const ctx_group *g, int *out, int cap) {
  struct ulfm_state *u = e->ulfm;
  int n = 0;
  for (int i = 0; u && i < u->nfailed; i++)
    if (group_has(g, u->failed[i])) {
      if (out && n < cap) out[n] = u->failed[i];
      n++;
    }
  return n;
}

int ctx_failure_unacked(erdma_engine *e, uint32_t ctx) {
  if (!e->ulfm || !e->ulfm->nfailed) return 0;
  const ctx_group *g = group_find(e, ctx);
  return failed_members(e, g, NULL, 0) > (g ? g->nacked : 0);
}

int req_failure_pending(erdma_req *r) {
  erdma_engine *e = r->e;
  if (!e->ulfm || !e->ulfm->nfailed || r->kind != REQ_RECV || r->done ||
      r->source != ERDMA_ANY_SOURCE || r->st.source >= 0) /* matched: no longer "any" */
    return 0;
  return ctx_failure_unacked(e, r->ctx);
}

int reqs_failure_pending(erdma_req *const *reqs, int n) {
  for (int i = 0; i < n; i++)
    if (reqs[i] && req_failure_pending(reqs[i])) return 1;
  return 0;
}

/* e->mu held: withdraw r (still posted, unmatched) and fail it. */
static int withdraw(erdma_req *r) {
  erdma_engine *e = r->e;
  if (!req_failure_pending(r)) return 0;
  DL_REMOVE(e->posted_head, e->posted_tail, r);
  req_complete(r, ERDMA_ERR_PEER);
  return 1;
}

int erdma_req_withdraw_failed(erdma_req *r) {
  erdma_engine *e = r->e;
  pthread_mutex_lock(&e->mu);
  int rv = withdraw(r);
  pthread_mutex_unlock(&e->mu);
  return rv;
}

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

/* A new entry for ctx (every rank until told otherwise); NULL: no memory. */
static ctx_group *group_add(erdma_engine *e, uint32_t ctx) {
  struct ulfm_state *u = ulfm_get(e);
  if (!u) return NULL;
  if (u->ngroups == u->cap) {
    int cap = u->cap ? 2 * u->cap : 16;
    ctx_group *ng = realloc(u->groups, sizeof *ng * (size_t)cap);
    if (!ng) return NULL;
    u->groups = ng;
    u->cap = cap;
  }
  ctx_group *g = &u->groups[u->ngroups++];
  memset(g, 0, sizeof *g);
  g->ctx = ctx;
  g->n = -1;
  return g;
}

int erdma_ctx_group(erdma_engine *e, uint32_t ctx, const int *ranks, int n) {
  if (!e || n < 0 || n > e->cfg.size || (n && !ranks)) return ERDMA_ERR_INVAL;
  for (int i = 0; i < n; i++)
    if (ranks[i] < 0 || ranks[i] >= e->cfg.size) return ERDMA_ERR_RANK;
  int *copy = NULL;
  if (n) {
    if (!(copy = malloc(sizeof(int) * (size_t)n))) return ERDMA_ERR_NOMEM;
    memcpy(copy, ranks, sizeof(int) * (size_t)n);
    qsort(copy, (size_t)n, sizeof(int), cmp_int);
  }
  pthread_mutex_lock(&e->mu);
  int rv = 0;
  ctx_group *g = group_find(e, ctx);
  if (n == 0) { /* forget it */
    shm_pair_forget(e, ctx);
    if (g) {
      struct ulfm_state *u = e->ulfm;
      free(g->ranks);
      *g = u->groups[--u->ngroups];
    }
  } else if (g || (g = group_add(e, ctx))) {
    free(g->ranks);
    g->ranks = copy;
    g->n = n;
    copy = NULL;
  } else {
    rv = ERDMA_ERR_NOMEM;
  }
  pthread_mutex_unlock(&e->mu);
  free(copy);
  return rv;
}

int erdma_ctx_failed(erdma_engine *e, uint32_t ctx, int *out, int cap, int *nacked) {
  if (!e || cap < 0 || (cap && !out)) return ERDMA_ERR_INVAL;
  pthread_mutex_lock(&e->mu);
  const ctx_group *g = group_find(e, ctx);
  int n = failed_members(e, g, out, cap);
  if (nacked) *nacked = g ? g->nacked : 0;
  pthread_mutex_unlock(&e->mu);
  return n;
}

int erdma_ctx_ack(erdma_engine *e, uint32_t ctx, int upto) {
  if (!e || upto < 0) return ERDMA_ERR_INVAL;
  pthread_mutex_lock(&e->mu);
  int rv;
  ctx_group *g = group_find(e, ctx);
  if (!g && upto > 0 && e->ulfm && e->ulfm->nfailed) g = group_add(e, ctx);
  if (!g) {
    rv = upto > 0 && e->ulfm && e->ulfm->nfailed ? ERDMA_ERR_NOMEM : 0;
  } else {
    int nf = failed_members(e, g, NULL, 0);
    if (upto > nf) upto = nf;
    if (upto > g->nacked) g->nacked = upto;
    rv = g->nacked;
  }
  pthread_mutex_unlock(&e->mu);
  return rv;
}

void ulfm_free(erdma_engine *e) {
  struct ulfm_state *u = e->ulfm;
  if (!u) return;
  for (int i = 0; i < u->ngroups; i++) free(u->groups[i].ranks);
  free(u->groups);
  free(u->failed);
  free(u);
  e->ulfm = NULL;
}
