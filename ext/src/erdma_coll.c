/*
 * erdma_coll.c - small collectives, run start to finish in the calling thread.
 *
 * Latency-bound collectives (up to tens of KiB) need no schedule and no
 * worker thread: the Python call costs more than the messages.  The algorithm becomes a
 * list of rounds (receive and/or send, then a local action); a wait that
 * runs out of time leaves the state for erdma_coll_resume, so the caller can
 * look at signals between slices. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "erdma.h"
#include "erdma_coll.h"
#include "erdma_copy.h"

enum { ACT_NONE, ACT_REDUCE_INTO_ACC, ACT_REDUCE_INTO_TMP_SWAP, ACT_REDUCE_AT };

typedef struct {
  int recv_from, send_to; /* world ranks, -1: none */
  int rbuf, sbuf;         /* 0: acc, 1: tmp, 2: none (zero bytes), 3: at (below) */
  int tag, act;
  /* rbuf/sbuf 3: these bytes; ACT_REDUCE_AT: at_acc = received OP at_acc */
  void *rat, *sat, *at_acc;
  uint64_t rlen, slen;
} coll_round;

/* a message of a collective that posts all of its messages at once */
typedef struct {
  int peer, tag, send;
  void *buf;
  uint64_t len;
} coll_msg;

struct erdma_coll {
  erdma_engine *e;
  uint64_t nbytes, count;
  int op, dtype;
  void *buf[2];    /* acc, tmp (swapped by ACT_REDUCE_INTO_TMP_SWAP) */
  void *out;       /* result lands here at the end (if not acc already) */
  void *tmp_mem;
  uint32_t ctx;
  int sflags;      /* erdma_isend flags of its sends: ERDMA_SEND_BULK for the data
                    * movers (Alltoall, Allgather, Bcast), whose receiver has
                    * rarely posted yet; 0 for the reductions' rounds, where a
                    * CMA read's RTS and completion measured slower (64 KiB) */
  /* a copy made once the messages are posted (Alltoall's own block), so
   * that the peers' RTS and reads overlap it */
  void *lc_dst;
  const void *lc_src;
  uint64_t lc_len;
  /* posted at once before the rounds: receives first, then sends */
  coll_msg *msg;
  erdma_req **mreq;
  int nmsg, mposted, mdone;
  int nr, cur, maxr;
  erdma_req *rreq, *sreq;
  coll_round r[]; /* maxr of them */
};

static int coll_add(erdma_coll *c, int from, int to, int rbuf, int sbuf, int tag, int act) {
  if (c->nr == c->maxr) return ERDMA_ERR_INVAL;
  coll_round *r = &c->r[c->nr++];
  memset(r, 0, sizeof *r);
  r->recv_from = from;
  r->send_to = to;
  r->rbuf = rbuf;
  r->sbuf = sbuf;
  r->tag = tag;
  r->act = act;
  return 0;
}

static void coll_free(erdma_coll *c) {
  if (!c) return;
  if (c->rreq) {
    erdma_req_abort(c->rreq);
    erdma_req_free(c->rreq);
  }
  if (c->sreq) {
    erdma_req_abort(c->sreq);
    erdma_req_free(c->sreq);
  }
  for (int i = c->mdone; i < c->mposted; i++)
    if (c->mreq[i]) {
      erdma_req_abort(c->mreq[i]);
      erdma_req_free(c->mreq[i]);
    }
  free(c->msg);
  free(c->mreq);
  free(c->tmp_mem);
  free(c);
}

/* Wait for a posted request; 0 (freed, *rp = NULL), TIMEOUT, or its error. */
static int coll_wait(erdma_req **rp, double slice) {
  erdma_status st;
  if (!*rp) return 0; /* sent straight into a local peer's ring */
  int rc = erdma_req_wait(*rp, slice, &st);
  if (rc) return rc;
  erdma_req_free(*rp);
  *rp = NULL;
  if (st.error) return st.error;
  return 0;
}

static int coll_step(erdma_coll *c, double slice) {
  int rc;
  for (; c->mposted < c->nmsg; c->mposted++) {
    coll_msg *m = &c->msg[c->mposted];
    /* (every rank sends to every other: an exchange, see ERDMA_SEND_EXCHANGE) */
    int fl = c->sflags | ERDMA_SEND_EXCHANGE;
    if (m->send && erdma_shm_try_send(c->e, m->buf, m->len, m->peer, m->tag, c->ctx, fl))
      continue; /* complete, no request (its slot stays NULL) */
    rc = m->send ? erdma_isend(c->e, m->buf, m->len, m->peer, m->tag, c->ctx, fl,
                               &c->mreq[c->mposted])
                 : erdma_irecv(c->e, m->buf, m->len, m->peer, m->tag, c->ctx, 0,
                               &c->mreq[c->mposted]);
    if (rc) return rc;
  }
  if (c->lc_len) {
    erdma_copy(c->lc_dst, c->lc_src, c->lc_len);
    c->lc_len = 0;
  }
  for (; c->mdone < c->nmsg; c->mdone++)
    if ((rc = coll_wait(&c->mreq[c->mdone], slice))) return rc;
  while (c->cur < c->nr) {
    coll_round *r = &c->r[c->cur];
    if (!c->rreq && !c->sreq) { /* post this round */
      void *rb = r->rbuf == 3 ? r->rat : r->rbuf < 2 ? c->buf[r->rbuf] : NULL;
      const void *sb = r->sbuf == 3 ? r->sat : r->sbuf < 2 ? c->buf[r->sbuf] : NULL;
      uint64_t rn = r->rbuf == 3 ? r->rlen : r->rbuf < 2 ? c->nbytes : 0;
      uint64_t sn = r->sbuf == 3 ? r->slen : r->sbuf < 2 ? c->nbytes : 0;
      if (r->recv_from >= 0) {
        rc = erdma_irecv(c->e, rb, rn, r->recv_from, r->tag, c->ctx, 0, &c->rreq);
        if (rc) return rc;
      }
      int fl = c->sflags | (r->recv_from == r->send_to ? ERDMA_SEND_EXCHANGE : 0);
      if (r->send_to >= 0 && !erdma_shm_try_send(c->e, sb, sn, r->send_to, r->tag, c->ctx, fl)) {
        rc = erdma_isend(c->e, sb, sn, r->send_to, r->tag, c->ctx, fl, &c->sreq);
        if (rc) return rc;
      }
    }
    if (c->rreq && (rc = coll_wait(&c->rreq, slice))) return rc;
    if (c->sreq && (rc = coll_wait(&c->sreq, slice))) return rc;
    if (r->act == ACT_REDUCE_INTO_ACC) { /* acc = tmp OP acc (tmp from the lower rank) */
      rc = erdma_reduce_local(c->buf[1], c->buf[0], c->count, c->op, c->dtype);
      if (rc) return rc;
    } else if (r->act == ACT_REDUCE_INTO_TMP_SWAP) { /* tmp = acc OP tmp; swap */
      rc = erdma_reduce_local(c->buf[0], c->buf[1], c->count, c->op, c->dtype);
      if (rc) return rc;
      void *x = c->buf[0];
      c->buf[0] = c->buf[1];
      c->buf[1] = x;
    } else if (r->act == ACT_REDUCE_AT && r->rlen) {
      rc = erdma_reduce_local(r->rat, r->at_acc, r->rlen / erdma_dtype_size(c->dtype), c->op,
                              c->dtype);
      if (rc) return rc;
    }
    c->cur++;
  }
  if (c->out && c->buf[0] != c->out) erdma_copy(c->out, c->buf[0], c->nbytes);
  return 0;
}

/* Run c; on a timeout hand it back through *pending, else free it. */
static int coll_go(erdma_coll *c, double slice, erdma_coll **pending) {
  int rc = coll_step(c, slice);
  if (rc == ERDMA_ERR_TIMEOUT) {
    *pending = c;
    return rc;
  }
  coll_free(c);
  return rc;
}

int erdma_coll_resume(erdma_coll *c, double slice) {
  if (!c) return ERDMA_ERR_INVAL;
  int rc = coll_step(c, slice);
  if (rc != ERDMA_ERR_TIMEOUT) coll_free(c);
  return rc;
}

void erdma_coll_free(erdma_coll *c) { coll_free(c); }

/* Room for the rounds of any algorithm here on n ranks: 2 + 2 log2 n, or
 * n - 1 (a ring). */
static erdma_coll *coll_new(erdma_engine *e, uint64_t nbytes, uint32_t ctx, int n) {
  int maxr = 2;
  for (int d = 1; d < n; d <<= 1) maxr += 2;
  if (maxr < n - 1) maxr = n - 1;
  erdma_coll *c = malloc(sizeof *c + (size_t)maxr * sizeof(coll_round));
  if (!c) return NULL;
  memset(c, 0, sizeof *c);
  c->maxr = maxr;
  c->e = e;
  c->nbytes = nbytes;
  c->ctx = ctx;
  return c;
}

int erdma_coll_allreduce(erdma_engine *e, const void *sbuf, void *rbuf, uint64_t count,
                         int op, int dtype, const int *ranks, int n, int me, int tag,
                         uint32_t ctx, double slice, erdma_coll **pending) {
  *pending = NULL;
  int es = erdma_dtype_size(dtype);
  if (coll_check_comm(e, ranks, n, me) || es <= 0 || (count && !rbuf)) return ERDMA_ERR_INVAL;
  uint64_t nbytes = count * (uint64_t)es;
  if (sbuf && sbuf != rbuf && nbytes) erdma_copy(rbuf, sbuf, nbytes);
  if (n == 1 || nbytes == 0) return 0;
  erdma_coll *c = coll_new(e, nbytes, ctx, n);
  if (!c || !(c->tmp_mem = malloc(nbytes))) {
    free(c);
    return ERDMA_ERR_NOMEM;
  }
  c->count = count;
  c->op = op;
  c->dtype = dtype;
  c->buf[0] = c->out = rbuf;
  c->buf[1] = c->tmp_mem;
  int pof2 = 1;
  while (pof2 * 2 <= n) pof2 *= 2;
  int rem = n - pof2, newrank, rc = 0;
  /* fold the first 2*rem ranks pairwise: odd ones go on, with the sum */
  if (me < 2 * rem) {
    if (me % 2 == 0) {
      rc |= coll_add(c, -1, ranks[me + 1], 2, 0, tag, ACT_NONE);
      newrank = -1;
    } else {
      rc |= coll_add(c, ranks[me - 1], -1, 1, 2, tag, ACT_REDUCE_INTO_ACC);
      newrank = me / 2;
    }
  } else {
    newrank = me - rem;
  }
  if (newrank >= 0) {
    int step = 1;
    for (int mask = 1; mask < pof2; mask <<= 1, step++) {
      int nd = newrank ^ mask;
      int dst = nd < rem ? nd * 2 + 1 : nd + rem;
      rc |= coll_add(c, ranks[dst], ranks[dst], 1, 0, tag + step,
                     nd < newrank ? ACT_REDUCE_INTO_ACC : ACT_REDUCE_INTO_TMP_SWAP);
    }
  }
  if (me < 2 * rem) { /* hand the result back to the folded ranks */
    if (me % 2 == 0)
      rc |= coll_add(c, ranks[me + 1], -1, 0, 2, tag + 1000, ACT_NONE);
    else
      rc |= coll_add(c, -1, ranks[me - 1], 2, 0, tag + 1000, ACT_NONE);
  }
  if (rc) {
    coll_free(c);
    return ERDMA_ERR_INVAL;
  }
  return coll_go(c, slice, pending);
}

/* erdma_pair_wait to its end, slice by slice: the waiter of a collective in
 * C on an agreed pair (the one-call path waits in slices with signal
 * checks: erdma_pyfast.c) */
static int pair_wait_slices(void *arg, erdma_engine *e, int slot) {
  double slice = *(const double *)arg;
  int rc;
  while ((rc = erdma_pair_wait(e, slot, slice)) == ERDMA_ERR_TIMEOUT) {
  }
  return rc;
}

/* a copy of n bytes, the waiter's lock released around a long one */
static void pair_copy(const erdma_pair_waiter *w, void *to, const void *from, uint64_t n) {
  if (n > ERDMA_PAIR_DATA_MAX && w->release) {
    void *token = w->release(w->arg);
    erdma_copy(to, from, n);
    w->acquire(w->arg, token);
  } else if (n) {
    erdma_copy(to, from, n);
  }
}

int erdma_pair_exchange(erdma_engine *e, int slot, const void *out, void *in, uint64_t blk,
                        void *to, const void *from, uint64_t own, const erdma_pair_waiter *w) {
  erdma_pair_lead(e, slot, 0);
  int rc = w->wait(w->arg, e, slot);
  if (rc || (rc = erdma_pair_share(e, slot, out, blk))) return rc;
  pair_copy(w, to, from, own);
  if (!(rc = w->wait(w->arg, e, slot))) return erdma_pair_take(e, slot, in, blk);
  if (rc == w->interrupted) erdma_pair_withdraw(e, slot);
  return rc;
}

/* 1 when the CMA copy of n bytes between `local` and the peer's `addr`
 * worked (write: to the peer), the waiter's lock released meanwhile */
static uint64_t pair_cma_copy(erdma_engine *e, int slot, const erdma_pair_waiter *w, void *local,
                              uint64_t addr, uint64_t n, int write) {
  void *token = w->release ? w->release(w->arg) : NULL;
  int rc = write ? erdma_pair_write(e, slot, addr, local, n)
                 : erdma_pair_read(e, slot, local, addr, n);
  if (w->release) w->acquire(w->arg, token);
  return rc == 0;
}

/* coll_pair_exchange of an Alltoall's blocks above ERDMA_PAIR_DATA_MAX (see
 * erdma_pair_rec in erdma.h): addresses by flags, each block read by its
 * receiver with one CMA copy, then whether it was; else by flags in
 * pieces.  `out` must stay unchanged until the peer has read it: in place,
 * the caller passes a copy. */
static int pair_exchange_cma(erdma_engine *e, int slot, const void *out, void *in, uint64_t blk,
                             void *to, const void *from, uint64_t own,
                             const erdma_pair_waiter *w) {
  erdma_pair_rec mine = {(uintptr_t)out, blk, (uint64_t)erdma_pair_cma_ok(e, slot), 0}, theirs;
  int rc = erdma_pair_exchange(e, slot, &mine, &theirs, sizeof mine, to, from, own, w);
  if (rc) return rc;
  if (theirs.len != blk) return ERDMA_ERR_TRUNCATE; /* (the peer sees it too) */
  uint64_t read = mine.cma && theirs.cma && pair_cma_copy(e, slot, w, in, theirs.addr, blk, 0),
           peer_read;
  if ((rc = erdma_pair_exchange(e, slot, &read, &peer_read, sizeof read, NULL, NULL, 0, w)))
    return rc;
  for (uint64_t off = 0; !(read && peer_read) && off < blk && !rc;) {
    uint64_t k = blk - off < ERDMA_PAIR_DATA_MAX ? blk - off : ERDMA_PAIR_DATA_MAX;
    rc = erdma_pair_exchange(e, slot, (const uint8_t *)out + off, (uint8_t *)in + off, k, NULL,
                             NULL, 0, w);
    off += k;
  }
  return rc;
}

int erdma_pair_alltoall(erdma_engine *e, int slot, const void *sbuf, void *rbuf, uint64_t blk,
                       int me, const erdma_pair_waiter *w) {
  uint8_t *d = rbuf;
  const uint8_t *src = sbuf ? (const uint8_t *)sbuf : d;
  uint64_t mine = (uint64_t)me * blk, theirs = (uint64_t)(1 - me) * blk;
  if (blk <= ERDMA_PAIR_DATA_MAX)
    return erdma_pair_exchange(e, slot, src + theirs, d + theirs, blk, d + mine, src + mine,
                               src != d ? blk : 0, w);
  void *tmp = src == d ? malloc(blk) : NULL; /* in place: the peer reads a copy */
  if (src == d && !tmp) return ERDMA_ERR_NOMEM;
  if (tmp) memcpy(tmp, src + theirs, blk);
  int rc = pair_exchange_cma(e, slot, tmp ? tmp : src + theirs, d + theirs, blk, d + mine,
                             src + mine, src != d ? blk : 0, w);
  free(tmp);
  return rc;
}

/* A two-rank Bcast above ERDMA_PAIR_DATA_MAX (erdma_pair_write in erdma.h):
 * both buffers' records by flags, the receiver reads the first part while
 * the root writes the rest, whether both did by flags; else by flags in
 * pieces from the root. */
int erdma_pair_bcast_large(erdma_engine *e, int slot, void *buf, uint64_t n, int isroot,
                        const erdma_pair_waiter *w) {
  erdma_pair_rec mine = {(uintptr_t)buf, n, (uint64_t)erdma_pair_cma_ok(e, slot), 0}, theirs;
  int rc = erdma_pair_exchange(e, slot, &mine, &theirs, sizeof mine, NULL, NULL, 0, w);
  if (rc) return rc;
  if (theirs.len != n) return ERDMA_ERR_TRUNCATE; /* (the peer sees it too) */
  uint64_t h = erdma_pair_split(n), done = 0, peer_done;
  if (mine.cma && theirs.cma)
    done = isroot ? pair_cma_copy(e, slot, w, (uint8_t *)buf + h, theirs.addr + h, n - h, 1)
                  : pair_cma_copy(e, slot, w, buf, theirs.addr, h, 0);
  if ((rc = erdma_pair_exchange(e, slot, &done, &peer_done, sizeof done, NULL, NULL, 0, w)))
    return rc;
  uint8_t scratch[ERDMA_PAIR_DATA_MAX];
  for (uint64_t off = 0; !(done && peer_done) && off < n && !rc;) {
    uint64_t k = n - off < ERDMA_PAIR_DATA_MAX ? n - off : ERDMA_PAIR_DATA_MAX;
    uint8_t *at = (uint8_t *)buf + off;
    rc = erdma_pair_exchange(e, slot, at, isroot ? scratch : at, k, NULL, NULL, 0, w);
    off += k;
  }
  return rc;
}

int erdma_pair_bcast(erdma_engine *e, int slot, void *buf, uint64_t n, int isroot,
                     const erdma_pair_waiter *w) {
  if (n > ERDMA_PAIR_DATA_MAX) return erdma_pair_bcast_large(e, slot, buf, n, isroot, w);
  if (isroot)
    erdma_pair_lead(e, slot, n);
  else
    erdma_pair_expect(e, slot);
  int rc = w->wait(w->arg, e, slot);
  if (!rc) return isroot ? erdma_pair_put(e, slot, buf, n) : erdma_pair_take(e, slot, buf, n);
  if (rc == w->interrupted) erdma_pair_withdraw(e, slot);
  return rc;
}

/* the waiter of the collectives in C: in slices of `slice` seconds */
#define SLICE_WAITER(slice) \
  (&(const erdma_pair_waiter){pair_wait_slices, NULL, NULL, (void *)&(slice), 0})

int erdma_coll_bcast(erdma_engine *e, void *buf, uint64_t nbytes, int root, const int *ranks,
                     int n, int me, int tag, uint32_t ctx, double slice,
                     erdma_coll **pending) {
  *pending = NULL;
  if (coll_check_comm(e, ranks, n, me) || root < 0 || root >= n || (nbytes && !buf))
    return ERDMA_ERR_INVAL;
  if (n == 1) return 0;
  int slot = n == 2 && nbytes && nbytes < ERDMA_PAIR_BCAST_MAX ? erdma_pair_find(e, ranks[1 - me], ctx) : -1;
  if (slot >= 0) /* by flags, agreed at an earlier Barrier (as erdma_coll_barrier) */
    return erdma_pair_bcast(e, slot, buf, nbytes, me == root, SLICE_WAITER(slice));
  erdma_coll *c = coll_new(e, nbytes, ctx, n);
  if (!c) return ERDMA_ERR_NOMEM;
  c->buf[0] = buf;
  c->sflags = ERDMA_SEND_BULK;
  int vr = (me - root + n) % n, mask = 1, rc = 0;
  while (mask < n) { /* binomial tree: receive from the parent ... */
    if (vr & mask) {
      rc |= coll_add(c, ranks[(vr - mask + root) % n], -1, 0, 2, tag, ACT_NONE);
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1) /* ... and pass it on to the children */
    if (vr + mask < n) rc |= coll_add(c, -1, ranks[(vr + mask + root) % n], 2, 0, tag, ACT_NONE);
  if (rc) {
    coll_free(c);
    return ERDMA_ERR_INVAL;
  }
  return coll_go(c, slice, pending);
}

int erdma_coll_barrier(erdma_engine *e, const int *ranks, int n, int me, int tag, uint32_t ctx,
                       double slice, erdma_coll **pending) {
  *pending = NULL;
  if (coll_check_comm(e, ranks, n, me)) return ERDMA_ERR_INVAL;
  if (n == 1) return 0;
  int slot = n == 2 ? erdma_pair_find(e, ranks[1 - me], ctx) : -1;
  if (slot >= 0) { /* the two agreed on flags at an earlier Barrier (erdma_pair_settle) */
    erdma_pair_arrive(e, slot);
    return pair_wait_slices(&slice, e, slot);
  }
  erdma_coll *c = coll_new(e, 1, ctx, n); /* 1-byte tokens, as the Python algorithm */
  if (!c || !(c->tmp_mem = calloc(2, 1))) {
    free(c);
    return ERDMA_ERR_NOMEM;
  }
  c->buf[0] = c->tmp_mem;
  c->buf[1] = (uint8_t *)c->tmp_mem + 1;
  int rc = 0, k = 0;
  for (int d = 1; d < n; d <<= 1, k++) /* dissemination */
    rc |= coll_add(c, ranks[(me - d + n) % n], ranks[(me + d) % n], 1, 0, tag + k, ACT_NONE);
  if (rc) {
    coll_free(c);
    return ERDMA_ERR_INVAL;
  }
  return coll_go(c, slice, pending);
}


static void coll_msg_add(erdma_coll *c, int send, int peer, int tag, void *buf, uint64_t len) {
  coll_msg *m = &c->msg[c->nmsg++];
  m->send = send;
  m->peer = peer;
  m->tag = tag;
  m->buf = buf;
  m->len = len;
}

/* A collective with room for `nmsg` messages posted at once. */
static erdma_coll *coll_new_msgs(erdma_engine *e, uint32_t ctx, int n, int nmsg) {
  erdma_coll *c = coll_new(e, 0, ctx, n);
  if (!c) return NULL;
  c->sflags = ERDMA_SEND_BULK;
  c->msg = calloc((size_t)nmsg, sizeof *c->msg);
  c->mreq = calloc((size_t)nmsg, sizeof *c->mreq);
  if (!c->msg || !c->mreq) {
    coll_free(c);
    return NULL;
  }
  return c;
}

int erdma_coll_alltoall(erdma_engine *e, const void *sbuf, void *rbuf, uint64_t blk,
                        const int *ranks, int n, int me, int tag, uint32_t ctx, double slice,
                        erdma_coll **pending) {
  *pending = NULL;
  if (coll_check_comm(e, ranks, n, me) || (blk && !rbuf)) return ERDMA_ERR_INVAL;
  if (blk == 0 || n == 1) {
    if (blk && sbuf && sbuf != rbuf) erdma_copy(rbuf, sbuf, blk);
    return 0;
  }
  uint8_t *d = rbuf;
  int slot = n == 2 && blk < ERDMA_PAIR_CMA_MAX ? erdma_pair_find(e, ranks[1 - me], ctx) : -1;
  if (slot >= 0) /* by flags, as erdma_coll_allgather: our block for the peer, its for us */
    return erdma_pair_alltoall(e, slot, sbuf, rbuf, blk, me, SLICE_WAITER(slice));
  erdma_coll *c = coll_new_msgs(e, ctx, n, 2 * (n - 1));
  if (!c) return ERDMA_ERR_NOMEM;
  const uint8_t *s = sbuf;
  if (!s || s == d) { /* in place: send from a copy of the input */
    if (!(c->tmp_mem = malloc(blk * (uint64_t)n))) {
      coll_free(c);
      return ERDMA_ERR_NOMEM;
    }
    s = erdma_copy(c->tmp_mem, d, blk * (uint64_t)n);
  } else {
    c->lc_dst = d + (uint64_t)me * blk;
    c->lc_src = s + (uint64_t)me * blk;
    c->lc_len = blk;
  }
  /* alltoallv_direct's messages: r -> r + k with tag k */
  for (int k = 1; k < n; k++) {
    int src = (me - k + n) % n;
    coll_msg_add(c, 0, ranks[src], tag + k % 1024, d + (uint64_t)src * blk, blk);
  }
  for (int k = 1; k < n; k++) {
    int dst = (me + k) % n;
    coll_msg_add(c, 1, ranks[dst], tag + k % 1024, (void *)(s + (uint64_t)dst * blk), blk);
  }
  return coll_go(c, slice, pending);
}

int erdma_coll_allgather(erdma_engine *e, const void *sbuf, void *rbuf, uint64_t blk,
                         const int *ranks, int n, int me, int tag, uint32_t ctx, double slice,
                         erdma_coll **pending) {
  *pending = NULL;
  if (coll_check_comm(e, ranks, n, me) || (blk && !rbuf)) return ERDMA_ERR_INVAL;
  uint8_t *mine = (uint8_t *)rbuf + (uint64_t)me * blk;
  if (blk && sbuf && sbuf != mine) erdma_copy(mine, sbuf, blk);
  if (blk == 0 || n == 1) return 0;
  int slot = n == 2 && blk <= ERDMA_PAIR_DATA_MAX ? erdma_pair_find(e, ranks[1 - me], ctx) : -1;
  if (slot >= 0) /* by flags, agreed at an earlier Barrier (as erdma_coll_bcast) */
    return erdma_pair_exchange(e, slot, mine, (uint8_t *)rbuf + (uint64_t)(1 - me) * blk, blk,
                               NULL, NULL, 0, SLICE_WAITER(slice));
  erdma_coll *c = coll_new_msgs(e, ctx, n, 2 * (n - 1));
  if (!c) return ERDMA_ERR_NOMEM;
  /* allgatherv_direct's messages: tag 0.  Sent from the caller's send
   * buffer when there is one: a peer's CMA read then finds clean lines, not
   * the ones our copy into `mine` has just dirtied in this core's cache */
  const uint8_t *from = sbuf ? sbuf : mine;
  for (int i = 0; i < n; i++)
    if (i != me) coll_msg_add(c, 0, ranks[i], tag, (uint8_t *)rbuf + (uint64_t)i * blk, blk);
  for (int k = 1; k < n; k++) coll_msg_add(c, 1, ranks[(me + k) % n], tag, (void *)from, blk);
  return coll_go(c, slice, pending);
}

int erdma_coll_reduce_scatter(erdma_engine *e, const void *sbuf, void *rbuf, uint64_t count,
                              int op, int dtype, const int *ranks, int n, int me, int tag,
                              uint32_t ctx, double slice, erdma_coll **pending) {
  *pending = NULL;
  int es = erdma_dtype_size(dtype);
  if (coll_check_comm(e, ranks, n, me) || es <= 0 || (count && !rbuf)) return ERDMA_ERR_INVAL;
  uint64_t blk = count * (uint64_t)es, all = blk * (uint64_t)n;
  if (blk == 0) return 0;
  if (n == 1) {
    if (sbuf && sbuf != rbuf) erdma_copy(rbuf, sbuf, blk);
    return 0;
  }
  erdma_coll *c = coll_new(e, blk, ctx, n);
  if (!c || !(c->tmp_mem = malloc(all + blk))) {
    free(c);
    return ERDMA_ERR_NOMEM;
  }
  uint8_t *acc = c->tmp_mem, *tmp = acc + all;
  erdma_copy(acc, sbuf ? sbuf : rbuf, all);
  c->count = count;
  c->op = op;
  c->dtype = dtype;
  /* reduce_scatter_ring's messages: in step k send block me-k-1 to the
   * right, reduce block me-k-2 from the left into it; block me ends whole */
  int right = ranks[(me + 1) % n], left = ranks[(me - 1 + n) % n];
  for (int k = 0; k < n - 1; k++) {
    int s = ((me - k - 1) % n + n) % n, q = ((me - k - 2) % n + n) % n;
    if (coll_add(c, left, right, 3, 3, tag + k, ACT_REDUCE_AT)) {
      coll_free(c);
      return ERDMA_ERR_INVAL;
    }
    coll_round *r = &c->r[c->nr - 1];
    r->rat = tmp;
    r->rlen = blk;
    r->sat = acc + (uint64_t)s * blk;
    r->slen = blk;
    r->at_acc = acc + (uint64_t)q * blk;
  }
  c->buf[0] = acc + (uint64_t)me * blk;
  c->out = rbuf;
  return coll_go(c, slice, pending);
}

/* gatherv_linear / scatterv_linear's messages (tag 0): the root receives
 * (gather) or sends (scatter) every other rank's block, each rank its own. */
static int coll_linear(erdma_engine *e, int scatter, const void *sbuf, void *rbuf, uint64_t blk,
                       int root, const int *ranks, int n, int me, int tag, uint32_t ctx,
                       double slice, erdma_coll **pending) {
  *pending = NULL;
  uint8_t *all = (uint8_t *)(scatter ? sbuf : rbuf); /* the root's n blocks */
  void *one = scatter ? rbuf : (void *)sbuf;         /* a rank's block; NULL at the root: in place */
  if (coll_check_comm(e, ranks, n, me) || root < 0 || root >= n ||
      (blk && (me == root ? !all : !one)))
    return ERDMA_ERR_INVAL;
  if (blk == 0) return 0;
  uint8_t *mine = all + (uint64_t)me * blk;
  if (me == root && one && one != mine) {
    if (scatter) erdma_copy(one, mine, blk);
    else erdma_copy(mine, one, blk);
  }
  if (n == 1) return 0;
  erdma_coll *c = coll_new_msgs(e, ctx, n, n - 1);
  if (!c) return ERDMA_ERR_NOMEM;
  c->sflags = 0; /* the ring, as point-to-point (not measured with CMA) */
  if (me != root)
    coll_msg_add(c, !scatter, ranks[root], tag, one, blk);
  else
    for (int i = 0; i < n; i++)
      if (i != root) coll_msg_add(c, scatter, ranks[i], tag, all + (uint64_t)i * blk, blk);
  return coll_go(c, slice, pending);
}

int erdma_coll_gather(erdma_engine *e, const void *sbuf, void *rbuf, uint64_t blk, int root,
                      const int *ranks, int n, int me, int tag, uint32_t ctx, double slice,
                      erdma_coll **pending) {
  return coll_linear(e, 0, sbuf, rbuf, blk, root, ranks, n, me, tag, ctx, slice, pending);
}

int erdma_coll_scatter(erdma_engine *e, const void *sbuf, void *rbuf, uint64_t blk, int root,
                       const int *ranks, int n, int me, int tag, uint32_t ctx, double slice,
                       erdma_coll **pending) {
  return coll_linear(e, 1, sbuf, rbuf, blk, root, ranks, n, me, tag, ctx, slice, pending);
}

int erdma_coll_reduce(erdma_engine *e, const void *sbuf, void *rbuf, uint64_t count, int op,
                      int dtype, int root, const int *ranks, int n, int me, int tag,
                      uint32_t ctx, double slice, erdma_coll **pending) {
  *pending = NULL;
  int es = erdma_dtype_size(dtype);
  const void *in = sbuf ? sbuf : rbuf;
  if (coll_check_comm(e, ranks, n, me) || es <= 0 || root < 0 || root >= n ||
      (count && (!in || (me == root && !rbuf))))
    return ERDMA_ERR_INVAL;
  uint64_t nbytes = count * (uint64_t)es;
  if (nbytes == 0) return 0;
  if (n == 1) {
    if (sbuf && sbuf != rbuf) erdma_copy(rbuf, sbuf, nbytes);
    return 0;
  }
  erdma_coll *c = coll_new(e, nbytes, ctx, n);
  if (!c || !(c->tmp_mem = malloc(2 * nbytes))) {
    free(c);
    return ERDMA_ERR_NOMEM;
  }
  c->count = count;
  c->op = op;
  c->dtype = dtype;
  c->buf[0] = erdma_copy(c->tmp_mem, in, nbytes); /* acc */
  c->buf[1] = (uint8_t *)c->tmp_mem + nbytes; /* tmp */
  c->out = me == root ? rbuf : NULL;
  /* reduce_binomial's messages (commutative: a tree rooted at root, tag 0) */
  int vr = (me - root + n) % n, rc = 0;
  for (int mask = 1; mask < n; mask <<= 1) {
    if (vr & mask) {
      rc |= coll_add(c, -1, ranks[(vr - mask + root) % n], 2, 0, tag, ACT_NONE);
      break;
    }
    if ((vr | mask) < n)
      rc |= coll_add(c, ranks[((vr | mask) + root) % n], -1, 1, 2, tag, ACT_REDUCE_INTO_ACC);
  }
  if (rc) {
    coll_free(c);
    return ERDMA_ERR_INVAL;
  }
  return coll_go(c, slice, pending);
}
