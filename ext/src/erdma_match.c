/* erdma_match.c - MPI matching: requests, the posted-receive queue, the
 * unexpected-message queue, and binding a receive to a message.  Pure
 * bookkeeping: every function runs under e->mu and does no I/O itself
 * (a rendezvous match queues a CTS frame on the peer's connection). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "erdma_match.h"
#include "erdma_conn.h"
#include "erdma_engine.h"
#include "erdma_ulfm.h"
#include "erdma_copy.h"

erdma_req *req_new(erdma_engine *e, int kind) {
  erdma_req *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->e = e;
  r->kind = kind;
  r->st.source = -1;
  r->st.tag = -1;
  return r;
}

static void req_destroy(erdma_req *r) {
  if (r->alloc) free(r->buf);
  free(r);
}

/* The engine references a request only while it is not done; the user's
 * reference lasts until erdma_req_free. */
void req_complete(erdma_req *r, int error) {
  /* nothing that could still write into it may keep pointing at it */
  if (r->rx_refs) conn_detach_req(r->e, r);
  if (r->kind == REQ_RECV) rndv_recv_unlink(r->e, r);
  if (r->done) return;
  if (r->offered) { /* its buffer goes back to the application */
    r->offered->withdraw(r);
    r->offered = NULL;
  }
  if (error && !r->st.error) r->st.error = error;
  __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE); /* (after st: erdma_req_peek) */
  engine_wake_waiters(r->e);
  if (r->user_freed) req_destroy(r);
}

void req_release(erdma_req *r) {
  if (r->done && r->user_freed) req_destroy(r);
}

int match(int want_src, int want_tag, uint32_t want_ctx, int src, int tag, uint32_t ctx) {
  return want_ctx == ctx && (want_src == ERDMA_ANY_SOURCE || want_src == src) &&
         (want_tag == ERDMA_ANY_TAG || want_tag == tag);
}

erdma_req *posted_take(erdma_engine *e, int src, int tag, uint32_t ctx) {
  for (erdma_req *r = e->posted_head; r; r = r->next)
    if (match(r->source, r->tag, r->ctx, src, tag, ctx)) {
      DL_REMOVE(e->posted_head, e->posted_tail, r);
      return r;
    }
  return NULL;
}

/* Whether a receive that `src` could match is posted, on any context,
 * among the first few (a hint: an exchange in progress). */
int posted_from(const erdma_engine *e, int src) {
  int n = 0;
  for (const erdma_req *r = e->posted_head; r && n < 8; r = r->next, n++)
    if (r->source == src || r->source == ERDMA_ANY_SOURCE) return 1;
  return 0;
}

erdma_msg *unexp_find(erdma_engine *e, int src, int tag, uint32_t ctx) {
  for (erdma_msg *m = e->unexp_head; m; m = m->next)
    if (match(src, tag, ctx, m->source, m->tag, m->ctx)) return m;
  return NULL;
}

erdma_msg *msg_new(int src, int tag, uint32_t ctx, uint64_t len) {
  erdma_msg *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  m->source = src;
  m->tag = tag;
  m->ctx = ctx;
  m->len = len;
  return m;
}

/* Payload buffers of unexpected eager messages of 1 KiB..1 MiB, kept for
 * the next ones: malloc gives freed memory of 32 KiB and more back to the
 * kernel (it trims the heap top, or unmaps), and every 4 KiB of a new buffer
 * then costs a page fault during the copy into it; a sender running ahead of
 * its receiver with 64 KiB messages between two ranks of a host ran at a
 * third of its speed.  From 1 KiB glibc serves malloc and free from its
 * sorted bins, merging the small free chunks first: a root receiving a
 * 4 KiB Gather block that arrived early spent a third of its call there.
 * One free list per power-of-two size, MSGBUF_BYTES in all,
 * shared by the process's engines (a message may outlive its engine in a
 * probe handle). */
#define MSGBUF_MIN_SHIFT 10
#define MSGBUF_MAX_SHIFT 20
#define MSGBUF_SIZES (MSGBUF_MAX_SHIFT - MSGBUF_MIN_SHIFT + 1)
#define MSGBUF_BYTES ((uint64_t)16 << 20)

static pthread_mutex_t msgbuf_mu = PTHREAD_MUTEX_INITIALIZER;
static void *msgbuf[MSGBUF_SIZES]; /* each free buffer starts with the next one's address */
static uint64_t msgbuf_bytes;

/* The size index of a pooled buffer for len bytes, or -1 (not pooled). */
static int msgbuf_index(uint64_t len) {
  if (len < ((uint64_t)1 << MSGBUF_MIN_SHIFT) || len > ((uint64_t)1 << MSGBUF_MAX_SHIFT))
    return -1;
  int sh = MSGBUF_MIN_SHIFT;
  while (((uint64_t)1 << sh) < len) sh++;
  return sh - MSGBUF_MIN_SHIFT;
}

int msg_alloc_data(erdma_msg *m) {
  int i = msgbuf_index(m->len);
  void *p = NULL;
  if (i >= 0) {
    pthread_mutex_lock(&msgbuf_mu);
    if ((p = msgbuf[i])) {
      memcpy(&msgbuf[i], p, sizeof(void *));
      msgbuf_bytes -= (uint64_t)1 << (i + MSGBUF_MIN_SHIFT);
    }
    pthread_mutex_unlock(&msgbuf_mu);
    if (!p) p = malloc((size_t)1 << (i + MSGBUF_MIN_SHIFT));
  } else {
    p = malloc(m->len ? m->len : 1);
  }
  m->data = p;
  m->pooled = p && i >= 0;
  return p ? 0 : -1;
}

/* Give a pooled buffer back: 1 if the pool took it. */
static int msgbuf_put(void *p, int i) {
  uint64_t size = (uint64_t)1 << (i + MSGBUF_MIN_SHIFT);
  int took = 0;
  pthread_mutex_lock(&msgbuf_mu);
  if (msgbuf_bytes + size <= MSGBUF_BYTES) {
    memcpy(p, &msgbuf[i], sizeof(void *));
    msgbuf[i] = p;
    msgbuf_bytes += size;
    took = 1;
  }
  pthread_mutex_unlock(&msgbuf_mu);
  return took;
}

void msgbuf_trim(void) {
  pthread_mutex_lock(&msgbuf_mu);
  for (int i = 0; i < MSGBUF_SIZES; i++)
    while (msgbuf[i]) {
      void *p = msgbuf[i];
      memcpy(&msgbuf[i], p, sizeof(void *));
      free(p);
    }
  msgbuf_bytes = 0;
  pthread_mutex_unlock(&msgbuf_mu);
}

void msg_free(erdma_msg *m) {
  if (m->acct) unexp_release(m->acct_e, m->source, m->acct);
  int i = m->data && m->pooled ? msgbuf_index(m->len) : -1;
  if (i < 0 || !msgbuf_put(m->data, i)) free(m->data);
  free(m);
}

/* A receive learns its message: note source/tag/length, allocate if asked. */
int recv_prepare(erdma_req *r, int src, int tag, uint64_t len) {
  r->st.source = src;
  r->st.tag = tag;
  r->nbytes = len;
  if (r->alloc) {
    /* a peer's claimed length: capped, and zeroed (pages are taken as the
     * payload arrives; a lying sender's gaps read as zeros) */
    if (len > r->e->cfg.recv_alloc_max) {
      fprintf(stderr, "erdma[%d]: a message of %llu bytes from rank %d exceeds "
                      "ERDMA_RECV_ALLOC_MAX (%llu bytes); its receive fails\n",
              r->e->cfg.rank, (unsigned long long)len, src,
              (unsigned long long)r->e->cfg.recv_alloc_max);
      return ERDMA_ERR_NOMEM;
    }
    r->buf = calloc(len ? len : 1, 1);
    if (!r->buf) return ERDMA_ERR_NOMEM;
    r->cap = len;
  }
  return 0;
}

/* All payload bytes have been stored: fill the status and complete. */
void recv_finish(erdma_req *r) {
  r->st.nbytes = r->nbytes < r->cap ? r->nbytes : r->cap;
  req_complete(r, r->nbytes > r->cap ? ERDMA_ERR_TRUNCATE : 0);
}

/* Is a send of ours to `peer` waiting for it to read it in place?  Then the
 * peer is (about to be) busy with it, as in a Sendrecv, and would not write
 * its part of a split copy in time. */
static int offered_to(const erdma_engine *e, int peer) {
  for (const erdma_req *s = e->rndv_send_head; s; s = s->next)
    if (s->dest == peer && s->offered) return 1;
  return 0;
}

/* Copy the send that m offers in place into r (see erdma_chan take): a
 * point-to-point message from cfg.shm_p2p_split_min, which fits, is copied
 * half by us and half by its sender at once (erdma_shm.c), unless the
 * sender is waiting for us to read its own message (a Sendrecv's two
 * messages: one read each, 16 KiB 5.0 -> 3.1 us, 1 MiB 65 -> 58). */
static int take_offered(erdma_engine *e, erdma_conn *c, erdma_req *r, const erdma_msg *m) {
  uint32_t sid = (uint32_t)m->sender_id;
  if (!(m->ctx & 1) && e->cfg.shm_p2p_split_min && m->len >= e->cfg.shm_p2p_split_min &&
      m->len <= r->cap && conn_can_split(c) && !offered_to(e, m->source)) {
    frame_hdr h = {0};
    h.type = FR_CTS;
    h.flags = FR_FLAG_CMA | FR_FLAG_SPLIT;
    h.id = m->sender_id;
    h.len = (uint64_t)(uintptr_t)r->buf;
    conn_enqueue(c, &h, NULL, 0, NULL, NULL);
    conn_flush(c);
    e->stats.split_recvs++;
    return conn_take_split(c, r->buf, m->cma_addr, m->len, sid);
  }
  return conn_take(c, r->buf, m->cma_addr, m->len < r->cap ? m->len : r->cap, sid);
}

/* Bind receive r to message m (already out of the unexpected queue). */
void bind_recv(erdma_engine *e, erdma_req *r, erdma_msg *m) {
  if (m->rndv) {
    frame_hdr h = {0};
    peer_info *p = &e->peers[m->source];
    int cma = -1;
    int dead = p->error || !p->conn;
    int rv = dead ? (p->error ? p->error : ERDMA_ERR_PEER)
                  : recv_prepare(r, m->source, m->tag, m->len);
    if (rv) {
      req_complete(r, rv);
      if (!dead && !m->cma) {
        /* the payload is refused, not awaited: a receive id no receive
         * holds lets the sender finish while we discard its bytes */
        h.type = FR_CTS;
        h.flags = p->conn->chan->chunks ? FR_FLAG_CHUNKS : 0;
        h.id = m->sender_id;
        h.len = ++e->next_id;
        conn_enqueue(p->conn, &h, NULL, 0, NULL, NULL);
      }
    } else if (m->cma && (cma = take_offered(e, p->conn, r, m)) == -2) {
      req_complete(r, ERDMA_ERR_PEER); /* the sender withdrew it (its operation failed) */
    } else if (m->cma && cma == 1) {
      recv_finish(r); /* the sender wrote its part and completes its send */
    } else if (m->cma && cma == 0) {
      h.type = FR_CTS; /* single copy done: tell the sender it may complete */
      h.flags = FR_FLAG_CMA;
      h.id = m->sender_id;
      conn_enqueue(p->conn, &h, NULL, 0, NULL, NULL);
      recv_finish(r);
    } else {
      r->id = ++e->next_id;
      DL_APPEND(e->rndv_recv_head, e->rndv_recv_tail, r);
      shm_hold_lifted(e); /* its DATA may be behind held bytes */
      r->rndv_listed = 1;
      h.type = FR_CTS;
      h.flags = p->conn->chan->chunks ? FR_FLAG_CHUNKS : 0; /* CHUNKs on any stream */
      h.id = m->sender_id;
      h.len = r->id;
      conn_enqueue(p->conn, &h, NULL, 0, NULL, NULL);
    }
    msg_free(m);
    return;
  }
  if (m->error) {
    recv_prepare(r, m->source, m->tag, m->len);
    req_complete(r, m->error);
    msg_free(m);
    return;
  }
  if (!m->complete) {
    int rv = recv_prepare(r, m->source, m->tag, m->len);
    if (rv) {
      req_complete(r, rv); /* m, now orphaned, is freed when its payload ends */
      return;
    }
    m->bound = r;
    return;
  }
  if (r->alloc) {
    /* take the payload buffer instead of copying it */
    r->st.source = m->source;
    r->st.tag = m->tag;
    r->nbytes = r->cap = m->len;
    r->buf = m->data ? m->data : malloc(1);
    m->data = NULL;
  } else {
    recv_prepare(r, m->source, m->tag, m->len);
    if (m->len) erdma_copy(r->buf, m->data, m->len < r->cap ? m->len : r->cap);
  }
  if (m->sreq) req_complete(m->sreq, 0);
  recv_finish(r);
  msg_free(m);
}

void rndv_recv_unlink(erdma_engine *e, erdma_req *r) {
  if (!r->rndv_listed) return;
  DL_REMOVE(e->rndv_recv_head, e->rndv_recv_tail, r);
  r->rndv_listed = 0;
}

/* Peer `peer` is gone: fail everything that depends on it. */
void engine_fail_peer(erdma_engine *e, int peer, int error) {
  erdma_req *r, *nx;
  erdma_msg *m, *mn;
  peer_info *p = &e->peers[peer];
  if (p->error) return;
  p->error = error;
  ulfm_note_failure(e, peer);
  for (int k = 0; k < e->lanes_max; k++) {
    erdma_conn *c = peer_conn(p, k);
    /* receives being filled: a chunked one is still in rndv_recv (failed
     * below), a DATA one only here */
    for (int i = 0; c && i < CONN_RX_COUNT; i++) {
      rx_state *x = conn_rx_at(c, i);
      erdma_req *xr = x->req;
      rx_detach(x);
      if (xr && x->cur.type != FR_CHUNK) req_complete(xr, error);
    }
  }
  for (r = e->posted_head; r; r = nx) {
    nx = r->next;
    if (r->source == peer) {
      DL_REMOVE(e->posted_head, e->posted_tail, r);
      req_complete(r, error);
    }
  }
  for (r = e->rndv_send_head; r; r = nx) {
    nx = r->next;
    if (r->dest == peer) {
      DL_REMOVE(e->rndv_send_head, e->rndv_send_tail, r);
      req_complete(r, error);
    }
  }
  for (r = e->rndv_recv_head; r; r = nx) {
    nx = r->next;
    if (r->st.source == peer) {
      rndv_recv_unlink(e, r);
      req_complete(r, error);
    }
  }
  for (m = e->unexp_head; m; m = mn) {
    mn = m->next;
    if (m->source == peer && (m->rndv || !m->complete)) {
      DL_REMOVE(e->unexp_head, e->unexp_tail, m);
      if (p->conn && p->conn->rx.msg == m) p->conn->rx.msg = NULL;
      msg_free(m);
    }
  }
  if (p->conn) {
    erdma_conn *c = p->conn;

    erdma_msg *m = c->rx.msg;
    if (m && m->bound) {
      req_complete(m->bound, error);
      msg_free(m);
    } else if (m && m->taken) {
      m->error = error; /* held by a matched probe: its receive fails on bind */
    } else if (m && !m->queued) {
      msg_free(m);
    }
    c->rx.msg = NULL;
    for (tx_item *t = c->tx_head; t; t = t->next) item_release_req(t, error);
  }
  for (int k = 0; k < e->lanes_max; k++) {
    erdma_conn *c = peer_conn(p, k);
    for (int i = 0; c && i < c->nds; i++)
      for (tx_item *t = c->ds[i].head; t; t = t->next) item_release_req(t, error);
  }
  lanes_drop(e, peer, error);
  pthread_cond_broadcast(&e->cv);
}

static int list_remove(erdma_req **head, erdma_req **tail, erdma_req *r) {
  for (erdma_req *q = *head; q; q = q->next)
    if (q == r) {
      DL_REMOVE(*head, *tail, r);
      return 1;
    }
  return 0;
}

int erdma_req_abort(erdma_req *r) {
  erdma_engine *e = r->e;
  pthread_mutex_lock(&e->mu);
  if (!r->done) {
    if (r->kind == REQ_RECV) {
      if (!list_remove(&e->posted_head, &e->posted_tail, r)) rndv_recv_unlink(e, r);
    } else {
      list_remove(&e->rndv_send_head, &e->rndv_send_tail, r);
    }
    erdma_conn *c;
    FOR_PEER_CONNS(e, i, lane, c) {
      for (int k = 0; k < CONN_RX_COUNT; k++) {
        rx_state *x = conn_rx_at(c, k);
        if (x->req == r) rx_detach(x); /* the rest of its payload is discarded */
      }
      if (c->rx.msg && c->rx.msg->bound == r) c->rx.msg->bound = NULL; /* now an orphan */
      /* (the peer's chunks not yet on a lane: with its main connection) */
      tx_item *lazy = lane ? NULL : e->peers[i].lazy_head;
      for (int k = -2; k < c->nds; k++)
        for (tx_item *t = k == -2 ? lazy : k < 0 ? c->tx_head : c->ds[k].head; t; t = t->next) {
          if (t->req != r) continue;
          if (!t->owned && t->plen) { /* QUIC may still retransmit it: keep a copy */
            uint8_t *copy = malloc(t->plen);
            if (copy) {
              erdma_copy(copy, t->payload, t->plen);
              t->owned = copy;
              t->payload = copy;
            }
          }
          t->req = NULL;
        }
    }
    r->st.cancelled = 1;
    req_complete(r, 0);
  }
  pthread_mutex_unlock(&e->mu);
  return 0;
}
