/* erdma_conn.c - one QUIC connection per peer rank (ngtcp2 + GnuTLS):
 * connection setup, the ngtcp2 callbacks, the stream framing parser
 * (frames -> matching) and the packet writer.  All under e->mu. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gnutls/crypto.h>

#include "erdma_internal.h"

/* ---------------------------------------------------------------- frames */
static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint32_t get32(const uint8_t *p) { uint32_t v = 0; for (int i = 3; i >= 0; i--) v = (v << 8) | p[i]; return v; }
static uint64_t get64(const uint8_t *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = (v << 8) | p[i]; return v; }

void hdr_encode(uint8_t out[ERDMA_HDR_LEN], const frame_hdr *h) {
  memset(out, 0, ERDMA_HDR_LEN);
  out[0] = h->type;
  out[1] = h->flags;
  put32(out + 4, h->ctx);
  if (h->type == FR_CHUNK) {
    put64(out + 8, h->off);
  } else {
    put32(out + 8, (uint32_t)h->tag);
    put32(out + 12, h->aux);
  }
  put64(out + 16, h->len);
  put64(out + 24, h->id);
}

void hdr_decode(frame_hdr *h, const uint8_t in[ERDMA_HDR_LEN]) {
  h->type = in[0];
  h->flags = in[1];
  h->ctx = get32(in + 4);
  h->tag = (int32_t)get32(in + 8);
  h->aux = get32(in + 12);
  h->off = get64(in + 8);
  h->len = get64(in + 16);
  h->id = get64(in + 24);
}

/* ------------------------------------------------------------- helpers */
/* The connection window of an accepted connection until its HELLO. */
#define PENDING_WINDOW (64u << 10)

static void make_cid(ngtcp2_cid *cid, uint32_t tag) {
  uint8_t d[ERDMA_CIDLEN];
  put32(d, tag); /* lets the receive path find the connection in O(1) */
  gnutls_rnd(GNUTLS_RND_NONCE, d + 4, sizeof d - 4);
  ngtcp2_cid_init(cid, d, sizeof d);
}

static void cid_add(erdma_conn *c, const ngtcp2_cid *cid) {
  if (c->ncids < ERDMA_MAX_CIDS) c->cids[c->ncids++] = *cid;
}

static int cid_has(const erdma_conn *c, const uint8_t *d, size_t n) {
  for (int i = 0; i < c->ncids; i++)
    if (c->cids[i].datalen == n && memcmp(c->cids[i].data, d, n) == 0) return 1;
  return 0;
}

static void path_of(erdma_conn *c, ngtcp2_path *path) {
  path->local.addr = (ngtcp2_sockaddr *)&c->e->local;
  path->local.addrlen = c->e->local_len;
  path->remote.addr = (ngtcp2_sockaddr *)&c->remote;
  path->remote.addrlen = c->remote_len;
  path->user_data = NULL;
}

static void log_conn(erdma_conn *c, const char *what, int rv) {
  if (c->e->cfg.verbose)
    fprintf(stderr, "erdma[%d]: peer %d: %s (%d: %s)\n", c->e->cfg.rank, c->peer, what,
            rv, rv < -200 ? ngtcp2_strerror(rv) : erdma_strerror(rv));
}

/* Tell the peer why we drop the connection (RFC 9000 CONNECTION_CLOSE). */
static void send_close(erdma_conn *c, int rv) {
  erdma_engine *e = c->e;
  ngtcp2_connection_close_error ccerr;
  ngtcp2_path_storage ps;
  ngtcp2_pkt_info pi;
  if (!c->conn || ngtcp2_conn_is_in_closing_period(c->conn) ||
      ngtcp2_conn_is_in_draining_period(c->conn) || rv == NGTCP2_ERR_DRAINING ||
      rv == NGTCP2_ERR_IDLE_CLOSE || rv == NGTCP2_ERR_DROP_CONN)
    return;
  uint8_t alert = ngtcp2_conn_get_tls_alert(c->conn);
  if (alert)
    ngtcp2_connection_close_error_set_transport_error_tls_alert(&ccerr, alert, NULL, 0);
  else if (rv == 0)
    ngtcp2_connection_close_error_set_application_error(&ccerr, 0, NULL, 0);
  else
    ngtcp2_connection_close_error_set_transport_error_liberr(&ccerr, rv, NULL, 0);
  ngtcp2_path_storage_zero(&ps);
  /* zero-copy where the backend offers it (no buffer: e->txbuf, copied) */
  uint8_t *zc = e->io.tx_buf ? e->io.tx_buf(e, 0, 1) : NULL;
  ngtcp2_ssize nw = ngtcp2_conn_write_connection_close(c->conn, &ps.path, &pi,
                                                       zc ? zc : e->txbuf, e->pkt_size, &ccerr,
                                                       erdma_now());
  size_t len = nw > 0 ? (size_t)nw : 0;
  if (zc) engine_sendv(e, c, NULL, &len, nw > 0);
  else if (nw > 0) engine_sendv(e, c, e->txbuf, &len, 1);
}

/* The connection is unusable: tell the peer, fail the rank unless we are
 * shutting down.  Closed connections still waiting for a HELLO are reaped
 * by conn_reap_pending. */
static void conn_lost(erdma_conn *c, int rv) {
  erdma_engine *e = c->e;
  if (c->closed) return;
  send_close(c, rv);
  c->closed = 1;
  if (c->peer >= 0 && !e->stopping && rv == NGTCP2_ERR_DRAINING) {
    /* the peer said goodbye (it finalized): later use of it fails quietly */
    engine_fail_peer(e, c->peer, ERDMA_ERR_PEER);
  } else if (c->peer >= 0 && !e->stopping) {
    /* always said: the user needs to know why their job failed */
    fprintf(stderr, "erdma[%d]: connection to rank %d lost: %s\n", e->cfg.rank, c->peer,
            c->violation ? "it broke the wire protocol"
            : rv == NGTCP2_ERR_IDLE_CLOSE ? "no reply within ERDMA_TIMEOUT"
            : rv < -200 ? ngtcp2_strerror(rv) : erdma_strerror(rv));
    engine_fail_peer(e, c->peer, ERDMA_ERR_PEER);
  } else {
    log_conn(c, "connection dropped", rv);
  }
}

/* Also closes accepted connections still without a HELLO after
 * cfg.hello_timeout (a stranger's half-open handshake, or one that
 * completed but never said who it is). */
void conn_reap_pending(erdma_engine *e) {
  erdma_conn **pp = &e->pending;
  uint64_t now = erdma_now(), limit = (uint64_t)(e->cfg.hello_timeout * 1e9);
  while (*pp) {
    erdma_conn *c = *pp;
    if (!c->closed && e->cfg.hello_timeout > 0 && now - c->accepted_at > limit) {
      log_conn(c, "no HELLO within hello_timeout", ERDMA_ERR_TIMEOUT);
      conn_lost(c, ERDMA_ERR_TIMEOUT);
      e->stats.pending_dropped++;
    }
    if (c->closed) {
      *pp = c->next_pending;
      conn_free(c);
    } else {
      pp = &c->next_pending;
    }
  }
}

/* ----------------------------------------------------------- rx framing */
/* A peer broke the wire protocol (docs/wire.md, "Protocol violations"): say
 * how; the caller drops the connection, which fails what involves the peer. */
static int violation(erdma_conn *c, const char *what) {
  if (!c->violation) {
    c->violation = what;
    fprintf(stderr, "erdma[%d]: rank %d broke the wire protocol: %s; dropping it\n",
            c->e->cfg.rank, c->peer, what);
  }
  return ERDMA_ERR_AUTH;
}

/* An rx state fills a receive only while counted in r->rx_refs, so that
 * whatever completes the receive (its last byte, another frame, a cancel, a
 * failed peer) detaches every rx state still pointing at it first. */
static void rx_attach(rx_state *x, erdma_req *r, uint8_t *dst, uint64_t room) {
  x->req = r;
  r->rx_refs++;
  x->dst = dst;
  x->room = room;
}

void rx_detach(rx_state *x) {
  if (x->req && x->req->rx_refs > 0) x->req->rx_refs--;
  x->req = NULL;
  x->dst = NULL; /* the rest of the frame's payload is discarded */
  x->room = 0;
}

void conn_detach_req(erdma_engine *e, erdma_req *r) {
  erdma_conn *c;
  if (!e->peers) {
    r->rx_refs = 0;
    return;
  }
  FOR_PEER_CONNS(e, i, k, c)
    for (int j = 0; j < CONN_RX_COUNT && r->rx_refs > 0; j++) {
      rx_state *x = conn_rx_at(c, j);
      if (x->req == r) rx_detach(x);
    }
  r->rx_refs = 0;
}

static void rx_reset(rx_state *x) {
  rx_detach(x);
  x->hdr_got = 0;
  x->remaining = 0;
  x->msg = NULL;
}

rx_state *conn_rx_at(erdma_conn *c, int i) { return i == 0 ? &c->rx : &c->drx[i - 1]; }

static void payload_done(erdma_conn *c, rx_state *x) {
  erdma_engine *e = c->e;
  erdma_req *r = x->req;
  erdma_msg *m = x->msg;
  int chunk = x->cur.type == FR_CHUNK;
  rx_reset(x); /* before completing r: completion may free it */
  if (chunk) {
    e->stats.chunks_recv++;
    e->stats.lane_chunks_recv += c->lane > 0;
  }
  if (r && chunk) {
    r->got += x->cur.len;
    if (r->got >= r->nbytes) { /* the last chunk of the message */
      rndv_recv_unlink(e, r);
      recv_finish(r);
    }
  } else if (r) {
    recv_finish(r);
  } else if (m) {
    m->complete = 1;
    if (m->bound) {
      erdma_req *b = m->bound;
      if (m->len) memcpy(b->buf, m->data, m->len < b->cap ? m->len : b->cap);
      recv_finish(b);
      msg_free(m);
    } else if (!m->queued && !m->taken) {
      msg_free(m); /* its receive failed or was cancelled */
    }
    pthread_cond_broadcast(&e->cv);
  }
}

/* The request with this id that belongs to `peer` (ids are guessable: a peer
 * must not claim another's). */
static erdma_req *list_find_id(erdma_req *head, uint64_t id, int peer) {
  for (erdma_req *r = head; r; r = r->next)
    if (r->id == id && (r->kind == REQ_SEND ? r->dest : r->st.source) == peer) return r;
  return NULL;
}

static erdma_req *list_take_id(erdma_req **head, erdma_req **tail, uint64_t id, int peer) {
  erdma_req *r = list_find_id(*head, id, peer);
  if (r) DL_REMOVE(*head, *tail, r);
  return r;
}

/* A HELLO names the peer; check it against its published certificate. */
static int on_hello(erdma_conn *c, const frame_hdr *h) {
  erdma_engine *e = c->e;
  int rank = (int)h->ctx;
  int lane = (h->flags & FR_FLAG_LANE) ? (int)h->aux : 0;
  if (h->type != FR_HELLO || rank < 0 || rank >= e->cfg.size || rank == e->cfg.rank ||
      (int)h->len != e->cfg.size || (c->is_client && rank != c->peer) || lane < 0 ||
      lane >= ERDMA_MAX_LANES || ((h->flags & FR_FLAG_LANE) && lane == 0)) {
    log_conn(c, "bad HELLO", ERDMA_ERR_AUTH);
    return ERDMA_ERR_AUTH;
  }
  if (!c->is_client) {
    peer_info *p = &e->peers[rank];
    if (p->fingerprint[0]) {
      char fp[65];
      tls_peer_fingerprint(c, fp);
      if (strcmp(fp, p->fingerprint) != 0) {
        fprintf(stderr, "erdma[%d]: refused a connection claiming rank %d: certificate "
                        "fingerprint does not match the rendezvous record\n", e->cfg.rank, rank);
        return ERDMA_ERR_AUTH;
      }
    }
    erdma_conn **slot = lane ? &p->lanes[lane] : &p->conn;
    if (*slot && *slot != c) {
      /* one connection per rank and lane: a second claimant is refused
       * while the first lives; a dead one is replaced */
      if (!(*slot)->closed) {
        fprintf(stderr, "erdma[%d]: refused a second connection claiming rank %d (lane %d)\n",
                e->cfg.rank, rank, lane);
        return ERDMA_ERR_AUTH;
      }
      conn_free(*slot);
      *slot = NULL;
    }
    /* leave the pending list, take the peer slot */
    erdma_conn **pp = &e->pending;
    while (*pp && *pp != c) pp = &(*pp)->next_pending;
    if (*pp) *pp = c->next_pending;
    *slot = c;
    c->peer = rank;
    c->lane = lane;
    if (lane >= e->lanes_max) e->lanes_max = lane + 1;
    /* a job member: open the connection window to its configured size */
    if (e->cfg.conn_window > PENDING_WINDOW)
      ngtcp2_conn_extend_max_offset(c->conn, e->cfg.conn_window - PENDING_WINDOW);
    c->dirty = 1;
  }
  c->hello_recv = 1;
  pthread_cond_broadcast(&e->cv);
  return 0;
}

/* A message from c's peer for the unexpected queue, counted against the
 * peer's bound (cfg.unexpected_max: recv_stream_data_cb withholds credit). */
static erdma_msg *msg_from_peer(erdma_conn *c, const frame_hdr *h, uint64_t held) {
  erdma_msg *m = msg_new(c->peer, h->tag, h->ctx, h->len);
  if (!m) return NULL;
  m->acct_e = c->e;
  m->acct = sizeof *m + held;
  c->e->peers[c->peer].unexp_bytes += m->acct;
  return m;
}

/* A receive id we never issued (ids count up from 1). */
static int id_unissued(const erdma_engine *e, uint64_t id) { return id == 0 || id > e->next_id; }

static int on_header(erdma_conn *c, rx_state *x) {
  erdma_engine *e = c->e;
  frame_hdr *h = &x->cur;
  erdma_req *r;
  erdma_msg *m;
  hdr_decode(h, x->hdr);
  if (!c->hello_recv) return x->data ? ERDMA_ERR_AUTH : on_hello(c, h);
  if (x->data && h->type != FR_CHUNK) return violation(c, "a frame other than CHUNK on a data stream");
  if (c->lane && !x->data) return violation(c, "a frame after HELLO on a lane's control stream");
  int src = c->peer;
  switch (h->type) {
  case FR_EAGER: {
    uint64_t lim = c->shm ? e->cfg.shm_eager_limit : e->cfg.eager_limit;
    if (h->len > (lim > ERDMA_EAGER_FRAME_MAX ? lim : ERDMA_EAGER_FRAME_MAX))
      return violation(c, "an EAGER frame longer than any eager limit");
    e->stats.msgs_recv++;
    r = posted_take(e, src, h->tag, h->ctx);
    if (r) {
      if (recv_prepare(r, src, h->tag, h->len) != 0) {
        req_complete(r, ERDMA_ERR_NOMEM);
        x->remaining = h->len; /* the payload is skipped, not parsed as frames */
        break;
      }
      rx_attach(x, r, r->buf, h->len < r->cap ? h->len : r->cap);
    } else {
      m = msg_from_peer(c, h, h->len);
      if (!m || !(m->data = malloc(h->len ? h->len : 1))) {
        if (m) msg_free(m);
        return ERDMA_ERR_NOMEM;
      }
      m->queued = 1;
      DL_APPEND(e->unexp_head, e->unexp_tail, m);
      e->stats.unexpected++;
      x->msg = m;
      x->dst = m->data;
      x->room = h->len;
      pthread_cond_broadcast(&e->cv);
    }
    x->remaining = h->len;
    break;
  }
  case FR_RTS:
    if ((h->flags & FR_FLAG_CMA) && !c->shm)
      return violation(c, "an RTS for a shared-memory read over QUIC");
    e->stats.msgs_recv++;
    m = msg_from_peer(c, h, 0);
    if (!m) return ERDMA_ERR_NOMEM;
    m->rndv = 1;
    m->sync = h->flags & FR_FLAG_SYNC;
    m->sender_id = h->id;
    if (h->flags & FR_FLAG_CMA) {
      m->cma = 1;
      m->cma_addr = h->id;
      m->sender_id = h->aux;
    }
    r = posted_take(e, src, h->tag, h->ctx);
    if (r) {
      bind_recv(e, r, m);
    } else {
      m->queued = 1;
      DL_APPEND(e->unexp_head, e->unexp_tail, m);
      e->stats.unexpected++;
      pthread_cond_broadcast(&e->cv);
    }
    break;
  case FR_CTS:
    if ((h->flags & FR_FLAG_CMA) && !c->shm)
      return violation(c, "a CTS for a shared-memory read over QUIC");
    if (h->id > e->next_id) return violation(c, "a CTS for a send id never issued");
    /* (an unknown id: a send cancelled meanwhile) */
    r = list_take_id(&e->rndv_send_head, &e->rndv_send_tail, h->id, src);
    if (r && (h->flags & FR_FLAG_CMA)) {
      req_complete(r, 0); /* the receiver copied it out of our memory */
    } else if (r) {
      conn_send_payload(c, r, h->len, (h->flags & FR_FLAG_CHUNKS) != 0);
    }
    break;
  case FR_DATA:
    if (id_unissued(e, h->id)) return violation(c, "DATA for a receive id never issued");
    r = list_find_id(e->rndv_recv_head, h->id, src);
    if (r) {
      if (r->chunked) return violation(c, "DATA for a receive already taking CHUNKs");
      if (h->len != r->nbytes) return violation(c, "DATA of another length than its RTS");
      rndv_recv_unlink(e, r);
      rx_attach(x, r, r->buf, h->len < r->cap ? h->len : r->cap);
    }
    x->remaining = h->len; /* a completed or cancelled receive: the bytes are discarded */
    break;
  case FR_CHUNK:
    /* one piece of a rendezvous payload, on any stream, in any order */
    if (id_unissued(e, h->id)) return violation(c, "a CHUNK for a receive id never issued");
    if (h->len > ERDMA_CHUNK_FRAME_MAX) return violation(c, "a CHUNK longer than any chunk size");
    r = list_find_id(e->rndv_recv_head, h->id, src);
    if (r) {
      if (h->len > r->nbytes || h->off > r->nbytes - h->len)
        return violation(c, "a CHUNK beyond the end of its message");
      if (h->len > r->nbytes - r->claimed)
        return violation(c, "CHUNKs that overlap (more bytes than the message)");
      r->claimed += h->len;
      r->chunked = 1;
      rx_attach(x, r, h->off < r->cap ? (uint8_t *)r->buf + h->off : NULL,
                h->off < r->cap ? (h->len < r->cap - h->off ? h->len : r->cap - h->off) : 0);
    }
    x->remaining = h->len; /* a completed or cancelled receive: discarded */
    break;
  default:
    return violation(c, "an unknown frame type");
  }
  return 0;
}

static int rx_feed(erdma_conn *c, rx_state *x, const uint8_t *data, size_t len) {
  while (len > 0) {
    if (c->closed) return ERDMA_ERR_PEER; /* (a frame above failed the peer) */
    if (x->hdr_got < ERDMA_HDR_LEN) {
      size_t n = ERDMA_HDR_LEN - x->hdr_got;
      if (n > len) n = len;
      memcpy(x->hdr + x->hdr_got, data, n);
      x->hdr_got += n;
      data += n;
      len -= n;
      if (x->hdr_got < ERDMA_HDR_LEN) break;
      int rv = on_header(c, x);
      if (rv) return rv;
      if (x->remaining == 0) payload_done(c, x);
      continue;
    }
    size_t n = len < x->remaining ? len : (size_t)x->remaining;
    size_t w = n < x->room ? n : (size_t)x->room;
    if (w) {
      memcpy(x->dst, data, w);
      x->dst += w;
      x->room -= w;
    }
    if (x->msg) x->msg->arrived += n;
    x->remaining -= n;
    data += n;
    len -= n;
    if (x->remaining == 0) payload_done(c, x);
  }
  return 0;
}

int conn_rx_feed_at(erdma_conn *c, int i, const uint8_t *data, size_t len, int fin) {
  if (i < 0 || i >= CONN_RX_COUNT) return ERDMA_ERR_INVAL;
  rx_state *x = conn_rx_at(c, i);
  x->data = i > 0;
  int rv = rx_feed(c, x, data, len);
  if (rv == 0 && fin && c->hello_recv && (i == 0 || x->hdr_got > 0))
    rv = violation(c, i == 0 ? "its control stream ended" : "a data stream ended inside a frame");
  return rv;
}

int conn_rx_feed(erdma_conn *c, const uint8_t *data, size_t len) {
  return rx_feed(c, &c->rx, data, len);
}

/* ------------------------------------------------------ ngtcp2 callbacks */
static void rand_cb(uint8_t *dest, size_t destlen, const ngtcp2_rand_ctx *ctx) {
  (void)ctx;
  gnutls_rnd(GNUTLS_RND_RANDOM, dest, destlen);
}

static int new_cid_cb(ngtcp2_conn *conn, ngtcp2_cid *cid, uint8_t *token, size_t cidlen,
                      void *user_data) {
  erdma_conn *c = user_data;
  (void)conn;
  (void)cidlen;
  make_cid(cid, c->cid_tag);
  gnutls_rnd(GNUTLS_RND_RANDOM, token, NGTCP2_STATELESS_RESET_TOKENLEN);
  cid_add(c, cid);
  return 0;
}

static int remove_cid_cb(ngtcp2_conn *conn, const ngtcp2_cid *cid, void *user_data) {
  erdma_conn *c = user_data;
  (void)conn;
  for (int i = 0; i < c->ncids; i++)
    if (ngtcp2_cid_eq(&c->cids[i], cid)) {
      c->cids[i] = c->cids[--c->ncids];
      break;
    }
  return 0;
}

static int handshake_completed_cb(ngtcp2_conn *conn, void *user_data) {
  erdma_conn *c = user_data;
  erdma_engine *e = c->e;
  c->handshake_done = 1;
  ngtcp2_conn_set_keep_alive_timeout(conn, (ngtcp2_duration)nat_keepalive_ns(e));
  if (c->is_client) {
    peer_info *p = &e->peers[c->peer];
    if (p->fingerprint[0]) {
      char fp[65];
      tls_peer_fingerprint(c, fp);
      if (strcmp(fp, p->fingerprint) != 0) {
        fprintf(stderr, "erdma[%d]: rank %d presented a certificate that does not match "
                        "the rendezvous record; refusing it\n", e->cfg.rank, c->peer);
        return NGTCP2_ERR_CALLBACK_FAILURE;
      }
    }
    if (ngtcp2_conn_open_bidi_stream(conn, &c->stream_id, NULL) != 0)
      return NGTCP2_ERR_CALLBACK_FAILURE;
  }
  pthread_cond_broadcast(&e->cv);
  return 0;
}

static int stream_open_cb(ngtcp2_conn *conn, int64_t stream_id, void *user_data) {
  erdma_conn *c = user_data;
  (void)conn;
  if (!c->is_client && c->stream_id < 0 && (stream_id & 3) == 0) c->stream_id = stream_id;
  return 0;
}

/* Credit control-stream bytes back to the peer, except (while the peer's
 * unexpected messages exceed cfg.unexpected_max) the excess: a peer that
 * sends faster than the application receives is held back by QUIC flow
 * control instead of filling our memory.  1: credit was given. */
static int credit_release(erdma_conn *c) {
  erdma_engine *e = c->e;
  uint64_t held = 0;
  if (c->peer >= 0 && e->peers[c->peer].unexp_bytes > e->cfg.unexpected_max)
    held = e->peers[c->peer].unexp_bytes - e->cfg.unexpected_max;
  if (c->credit_owed <= held) return 0;
  ngtcp2_conn_extend_max_stream_offset(c->conn, c->stream_id, c->credit_owed - held);
  c->credit_owed = held;
  return 1;
}

void unexp_release(erdma_engine *e, int peer, uint64_t n) {
  if (!e->peers || peer < 0 || peer >= e->cfg.size) return;
  peer_info *p = &e->peers[peer];
  erdma_conn *c = p->conn;
  uint64_t before = p->unexp_bytes;
  p->unexp_bytes = p->unexp_bytes > n ? p->unexp_bytes - n : 0;
  if (c && c->conn && !c->closed && c->credit_owed && credit_release(c)) {
    c->dirty = 1; /* the progress thread sends the MAX_STREAM_DATA */
    engine_wake(e);
  } else if (c && c->shm && before > e->cfg.unexpected_max &&
             p->unexp_bytes <= e->cfg.unexpected_max) {
    engine_wake(e); /* drain_ring left the peer's bytes in its ring: read on */
  }
}

/* The peer's control stream or one of its data streams: its rx state index
 * (conn_rx_at), else -1 (other streams are read and ignored). */
static int rx_index(const erdma_conn *c, int64_t stream_id) {
  if (stream_id == c->stream_id) return 0;
  if ((stream_id & 2) && (stream_id & 1) == (c->is_client ? 1 : 0) &&
      (stream_id >> 2) < ERDMA_MAX_DSTREAMS)
    return 1 + (int)(stream_id >> 2);
  return -1;
}

static int recv_stream_data_cb(ngtcp2_conn *conn, uint32_t flags, int64_t stream_id,
                               uint64_t offset, const uint8_t *data, size_t datalen,
                               void *user_data, void *stream_user_data) {
  erdma_conn *c = user_data;
  (void)offset;
  (void)stream_user_data;
  int i = rx_index(c, stream_id);
  if (i >= 0) {
    c->e->stats.bytes_recv += datalen;
    if (conn_rx_feed_at(c, i, data, datalen, (flags & NGTCP2_STREAM_DATA_FLAG_FIN) != 0) != 0)
      return NGTCP2_ERR_CALLBACK_FAILURE;
  }
  /* before its HELLO an accepted connection gets credit back on its control
   * stream only (a HELLO, or it is dropped): bytes on streams we ignore
   * cannot make ngtcp2 grow the small window of fill_settings */
  if (!c->is_client && !c->hello_recv && stream_id != c->stream_id) return 0;
  /* every byte is consumed at once (copied to its destination); the
   * control stream's credit may wait for the application (credit_release) */
  ngtcp2_conn_extend_max_offset(conn, datalen);
  if (i == 0) {
    c->credit_owed += datalen;
    credit_release(c);
  } else {
    ngtcp2_conn_extend_max_stream_offset(conn, stream_id, datalen);
  }
  return 0;
}

/* The peer reset its control stream or a data stream: frames on it are lost. */
static int stream_reset_cb(ngtcp2_conn *conn, int64_t stream_id, uint64_t final_size,
                           uint64_t app_error_code, void *user_data, void *stream_user_data) {
  erdma_conn *c = user_data;
  (void)conn;
  (void)final_size;
  (void)app_error_code;
  (void)stream_user_data;
  if (c->hello_recv && rx_index(c, stream_id) >= 0) {
    violation(c, "it reset a stream");
    return NGTCP2_ERR_CALLBACK_FAILURE;
  }
  return 0;
}

void item_release_req(tx_item *t, int error) {
  erdma_req *r = t->req;
  if (!r) return;
  t->req = NULL;
  if (t->chunk && r->chunks_left > 1) {
    r->chunks_left--;
    return;
  }
  req_complete(r, error);
}

/* Release the items of a queue that end at or before `acked`. */
static int release_acked(tx_item **head, tx_item **tail, tx_item *write, uint64_t acked) {
  while (*head && (*head)->stream_end <= acked && *head != write) {
    tx_item *t = *head;
    *head = t->next;
    if (!*head) *tail = NULL;
    item_release_req(t, 0);
    free(t->owned);
    free(t);
  }
  return *head == NULL;
}

/* Everything before stream offset `upto` has been delivered: release it. */
void conn_acked(erdma_conn *c, uint64_t upto) {
  if (upto > c->acked) c->acked = upto;
  if (release_acked(&c->tx_head, &c->tx_tail, c->tx_write, c->acked))
    pthread_cond_broadcast(&c->e->cv);
}

static int acked_cb(ngtcp2_conn *conn, int64_t stream_id, uint64_t offset, uint64_t datalen,
                    void *user_data, void *stream_user_data) {
  erdma_conn *c = user_data;
  (void)conn;
  (void)stream_user_data;
  if (stream_id == c->stream_id) {
    conn_acked(c, offset + datalen);
    return 0;
  }
  for (int i = 0; i < c->nds; i++)
    if (c->ds[i].id == stream_id) {
      tx_stream *d = &c->ds[i];
      if (offset + datalen > d->acked) d->acked = offset + datalen;
      if (release_acked(&d->head, &d->tail, d->write, d->acked))
        pthread_cond_broadcast(&c->e->cv);
    }
  return 0;
}

/* Packets that passed AEAD authentication, counted per thread: the relay
 * code (erdma_nat.c) tells a live path from spoofed or garbled datagrams by
 * whether handing one to ngtcp2 moved this count.  decrypted_1rtt counts
 * those with a short header: 1-RTT keys come only out of a completed
 * handshake, whereas anyone can make a valid Initial packet. */
static __thread uint64_t decrypted_ok, decrypted_1rtt;

static int decrypt_cb(uint8_t *dest, const ngtcp2_crypto_aead *aead,
                      const ngtcp2_crypto_aead_ctx *aead_ctx, const uint8_t *ciphertext,
                      size_t ciphertextlen, const uint8_t *nonce, size_t noncelen,
                      const uint8_t *aad, size_t aadlen) {
  int rv = ngtcp2_crypto_decrypt_cb(dest, aead, aead_ctx, ciphertext, ciphertextlen, nonce,
                                    noncelen, aad, aadlen);
  if (rv == 0) {
    decrypted_ok++;
    decrypted_1rtt += aadlen > 0 && !(aad[0] & 0x80);
  }
  return rv;
}

uint64_t conn_decrypted_count(void) { return decrypted_ok; }

static void fill_callbacks(ngtcp2_callbacks *cb, int client) {
  memset(cb, 0, sizeof *cb);
  if (client) {
    cb->client_initial = ngtcp2_crypto_client_initial_cb;
    cb->recv_retry = ngtcp2_crypto_recv_retry_cb;
  } else {
    cb->recv_client_initial = ngtcp2_crypto_recv_client_initial_cb;
  }
  cb->recv_crypto_data = ngtcp2_crypto_recv_crypto_data_cb;
  cb->encrypt = ngtcp2_crypto_encrypt_cb;
  cb->decrypt = decrypt_cb;
  cb->hp_mask = ngtcp2_crypto_hp_mask_cb;
  cb->update_key = ngtcp2_crypto_update_key_cb;
  cb->delete_crypto_aead_ctx = ngtcp2_crypto_delete_crypto_aead_ctx_cb;
  cb->delete_crypto_cipher_ctx = ngtcp2_crypto_delete_crypto_cipher_ctx_cb;
  cb->get_path_challenge_data = ngtcp2_crypto_get_path_challenge_data_cb;
  cb->version_negotiation = ngtcp2_crypto_version_negotiation_cb;
  cb->rand = rand_cb;
  cb->get_new_connection_id = new_cid_cb;
  cb->remove_connection_id = remove_cid_cb;
  cb->handshake_completed = handshake_completed_cb;
  cb->stream_open = stream_open_cb;
  cb->recv_stream_data = recv_stream_data_cb;
  cb->stream_reset = stream_reset_cb;
  cb->acked_stream_data_offset = acked_cb;
}

/* ERDMA_CC_LOG=1: ngtcp2's congestion-control events (lines naming bbr or
 * cubic: state changes, RTprop updates) on stderr, for diagnosing paths */
static void cc_log_printf(void *user_data, const char *fmt, ...) {
  erdma_conn *c = user_data;
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (c->e->cfg.cc_log < 2 && !strstr(line, "bbr") && !strstr(line, "cubic")) return;
  if (strstr(line, "RTprop")) return; /* every ACK */
  fprintf(stderr, "erdma[%d] %.3f peer %d: %s\n", c->e->cfg.rank, erdma_now() / 1e9, c->peer,
          line);
}

static void fill_settings(erdma_conn *c, ngtcp2_settings *s, ngtcp2_transport_params *p) {
  erdma_engine *e = c->e;
  const erdma_config *cfg = &e->cfg;
  ngtcp2_settings_default(s);
  s->initial_ts = erdma_now();
  /* BBR fills long lossy paths (random loss is not congestion to it); over
   * loopback CUBIC measured best */
  s->cc_algo = (ngtcp2_cc_algo)(cfg->cc_algo >= 0 ? cfg->cc_algo
                                : addr_is_loopback(&c->remote) ? ERDMA_CC_CUBIC
                                                               : ERDMA_DEFAULT_WAN_CC);
  s->initial_rtt = 10 * NGTCP2_MILLISECONDS;
  /* the path's size (a relay, a jumbo or loopback path: erdma_engine.c) */
  s->max_tx_udp_payload_size = engine_conn_payload(e, c);
  if (s->max_tx_udp_payload_size > 1452) {
    s->no_tx_udp_payload_size_shaping = 1; /* the route carries it: no PMTUD needed */
    s->no_pmtud = 1;
  }
  /* ngtcp2 doubles a window that the peer uses up within a few RTTs, up to
   * these ceilings: a small job never grows them, a long fat path does */
  s->max_window = cfg->max_conn_window > cfg->conn_window ? cfg->max_conn_window
                                                           : cfg->conn_window;
  s->max_stream_window = cfg->max_stream_window > cfg->stream_window ? cfg->max_stream_window
                                                                      : cfg->stream_window;
  s->handshake_timeout = (ngtcp2_duration)(cfg->handshake_timeout * NGTCP2_SECONDS);
  s->ack_thresh = 16; /* fewer ACK-only packets on bulk transfers */
  if (cfg->cc_log > 0) s->log_printf = cc_log_printf;
  ngtcp2_transport_params_default(p);
  p->initial_max_stream_data_bidi_local = cfg->stream_window;
  p->initial_max_stream_data_bidi_remote = cfg->stream_window;
  p->initial_max_stream_data_uni = cfg->stream_window;
  p->initial_max_data = cfg->conn_window;
  /* a connection we accept starts with a window just big enough for a
   * HELLO and what follows it at once: until the HELLO names a job member
   * (on_hello opens it up), that bounds the stream data, in order or not,
   * a stranger can make ngtcp2 buffer */
  if (!c->is_client && p->initial_max_data > PENDING_WINDOW) p->initial_max_data = PENDING_WINDOW;
  /* the most we take: our path's size (a peer on the same link with a larger
   * MTU than ours then sends no more than our link carries) */
  p->max_udp_payload_size = s->max_tx_udp_payload_size;
  p->initial_max_streams_bidi = 4;
  p->initial_max_streams_uni = ERDMA_MAX_DSTREAMS;
  p->max_idle_timeout = (ngtcp2_duration)(cfg->idle_timeout * NGTCP2_SECONDS);
  p->active_connection_id_limit = 4;
}

erdma_conn *conn_alloc(erdma_engine *e, int client) {
  erdma_conn *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->e = e;
  c->is_client = client;
  c->peer = -1;
  c->stream_id = -1;
  return c;
}

static int conn_start(erdma_conn *c) {
  frame_hdr h = {0};
  if (tls_session_new(c->e, c) != 0) return ERDMA_ERR_TLS;
  ngtcp2_conn_set_tls_native_handle(c->conn, c->tls);
  h.type = FR_HELLO;
  h.ctx = (uint32_t)c->e->cfg.rank;
  h.len = (uint64_t)c->e->cfg.size;
  if (c->lane) {
    h.flags = FR_FLAG_LANE;
    h.aux = (uint32_t)c->lane;
  }
  conn_enqueue(c, &h, NULL, 0, NULL, NULL);
  return 0;
}

/* The host part of an IPv4/IPv6 address, for comparing hosts. */
static int same_host(const struct sockaddr_storage *a, const struct sockaddr_storage *b) {
  if (a->ss_family != b->ss_family) return 0;
  if (a->ss_family == AF_INET)
    return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
           ((const struct sockaddr_in *)b)->sin_addr.s_addr;
  if (a->ss_family == AF_INET6)
    return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                  &((const struct sockaddr_in6 *)b)->sin6_addr, 16) == 0;
  return 0;
}

/* Connections to open to QUIC peer `peer`: ERDMA_LANES, or automatically
 * ERDMA_DEFAULT_LANES when every QUIC peer is at one address other than
 * loopback (a job on two hosts: one path carries everything), else one (a
 * rank with peers on several hosts already has several windows on its
 * uplink, and more flows overshot the bottleneck queue: wan_engine.md). */
int conn_lanes_wanted(erdma_engine *e, int peer) {
  int n = e->cfg.lanes;
  if (n <= 0) {
    n = addr_is_loopback(&e->peers[peer].addr) ? 1 : ERDMA_DEFAULT_LANES;
    for (int i = 0; i < e->cfg.size && n > 1; i++)
      if (i != e->cfg.rank && shm_is_local(e, i) < 0 &&
          !same_host(&e->peers[i].addr, &e->peers[peer].addr))
        n = 1;
  }
  return n > ERDMA_MAX_LANES ? ERDMA_MAX_LANES : n;
}

/* Open lane `lane` (0: the main connection) to `peer` as the QUIC client. */
int conn_client_new(erdma_engine *e, int peer, int lane) {
  ngtcp2_callbacks cb;
  ngtcp2_settings s;
  ngtcp2_transport_params p;
  ngtcp2_cid dcid, scid;
  ngtcp2_path path;
  erdma_conn *c = conn_alloc(e, 1);
  if (!c) return ERDMA_ERR_NOMEM;
  c->peer = peer;
  c->lane = lane;
  c->cid_tag = (uint32_t)peer;
  memcpy(&c->remote, &e->peers[peer].addr, e->peers[peer].addr_len);
  c->remote_len = e->peers[peer].addr_len;
  make_cid(&dcid, (uint32_t)e->cfg.rank); /* the server files us under our rank */
  make_cid(&scid, c->cid_tag);
  cid_add(c, &scid);
  fill_callbacks(&cb, 1);
  fill_settings(c, &s, &p);
  path_of(c, &path);
  int rv = ngtcp2_conn_client_new(&c->conn, &dcid, &scid, &path, NGTCP2_PROTO_VER_V1, &cb,
                                  &s, &p, NULL, c);
  if (rv != 0) {
    free(c);
    return ERDMA_ERR_QUIC;
  }
  if ((rv = conn_start(c)) != 0) {
    conn_free(c);
    return rv;
  }
  if (lane) e->peers[peer].lanes[lane] = c;
  else e->peers[peer].conn = c;
  if (lane >= e->lanes_max) e->lanes_max = lane + 1;
  conn_flush(c);
  return 0;
}

/* odcid: the client's first Destination CID when hd carries our Retry token
 * (hd->dcid is then the Retry's Source CID), else NULL. */
static erdma_conn *server_conn_new(erdma_engine *e, const ngtcp2_pkt_hd *hd,
                                   const struct sockaddr_storage *from, socklen_t fromlen,
                                   const ngtcp2_cid *odcid) {
  ngtcp2_callbacks cb;
  ngtcp2_settings s;
  ngtcp2_transport_params p;
  ngtcp2_cid scid;
  ngtcp2_path path;
  erdma_conn *c = conn_alloc(e, 0);
  if (!c) return NULL;
  memcpy(&c->remote, from, fromlen);
  c->remote_len = fromlen;
  c->cid_tag = hd->dcid.datalen >= 4 ? get32(hd->dcid.data) : 0xffffffffu;
  make_cid(&scid, c->cid_tag);
  cid_add(c, &scid);
  cid_add(c, &hd->dcid);
  fill_callbacks(&cb, 0);
  fill_settings(c, &s, &p);
  p.original_dcid = hd->dcid;
  if (odcid) { /* the address is validated: RFC 9000 7.3 */
    p.original_dcid = *odcid;
    p.retry_scid = hd->dcid;
    p.retry_scid_present = 1;
    s.token.base = (uint8_t *)hd->token.base;
    s.token.len = hd->token.len;
  }
  path_of(c, &path);
  if (ngtcp2_conn_server_new(&c->conn, &hd->scid, &scid, &path, hd->version, &cb, &s, &p,
                             NULL, c) != 0) {
    free(c);
    return NULL;
  }
  if (conn_start(c) != 0) {
    conn_free(c);
    return NULL;
  }
  c->accepted_at = erdma_now();
  c->next_pending = e->pending;
  e->pending = c;
  return c;
}

/* ------------------------------------------------------------ admission
 * Connections accepted but not yet named by a HELLO are bounded in number
 * (pending_cap), per source host, and in age (cfg.hello_timeout,
 * conn_reap_pending).  A full table makes room by dropping one
 * (evict_before).  Past retry_threshold, an Initial must carry a
 * Retry token, which proves that the source address receives our packets
 * (RFC 9000 8.1): spoofed Initials then cost one stateless Retry each and
 * take no slot, so only validated clients can fill the rest (and evict). */
#define PENDING_PER_HOST 8 /* pending connections from a host with no published peer */
#define RETRY_TOKEN_TTL (10 * NGTCP2_SECONDS)

static int pending_cap(const erdma_engine *e) { return (ERDMA_MAX_LANES + 1) * e->cfg.size + 16; }

/* Pending connections past which an Initial needs a Retry token: half the
 * table, at most 64 (a half-open connection holds about 90 KiB of ngtcp2
 * and GnuTLS state: spoofed sources get at most ~6 MiB whatever the job's
 * size; a large job starting up pays one round trip more) */
static int retry_threshold(const erdma_engine *e) {
  int half = pending_cap(e) / 2;
  return half < 64 ? half : 64;
}

/* One source for the per-host share: an IPv4 address, or an IPv6 /64 (one
 * host commonly holds a whole /64, so single IPv6 addresses cost nothing). */
static int same_source(const struct sockaddr_storage *a, const struct sockaddr_storage *b) {
  if (a->ss_family == AF_INET6 && b->ss_family == AF_INET6)
    return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                  &((const struct sockaddr_in6 *)b)->sin6_addr, 8) == 0;
  return same_host(a, b);
}

/* Ranks published (set_peer) at source a: each may open ERDMA_MAX_LANES + 1. */
static int peers_at_host(const erdma_engine *e, const struct sockaddr_storage *a) {
  int n = 0;
  for (int i = 0; i < e->cfg.size; i++)
    if (i != e->cfg.rank && e->peers[i].known && same_source(&e->peers[i].addr, a)) n++;
  return n;
}

static void send_retry(erdma_engine *e, const ngtcp2_pkt_hd *hd,
                       const struct sockaddr_storage *from, socklen_t fromlen) {
  uint8_t token[NGTCP2_CRYPTO_MAX_RETRY_TOKENLEN];
  ngtcp2_cid scid;
  /* the same rank tag as the client's first DCID: see server_conn_new */
  make_cid(&scid, hd->dcid.datalen >= 4 ? get32(hd->dcid.data) : 0xffffffffu);
  ngtcp2_ssize tl = ngtcp2_crypto_generate_retry_token(
      token, e->token_secret, sizeof e->token_secret, hd->version,
      (const ngtcp2_sockaddr *)from, (ngtcp2_socklen)fromlen, &scid, &hd->dcid, erdma_now());
  if (tl < 0) return;
  ngtcp2_ssize n = ngtcp2_crypto_write_retry(e->txbuf, e->pkt_size, hd->version, &hd->scid,
                                             &scid, &hd->dcid, token, (size_t)tl);
  if (n <= 0) return;
  /* a connection-less stand-in, so that it goes back the way the Initial
   * came: through a peer's TURN relay when from is one (engine_sendv) */
  erdma_conn *t = conn_alloc(e, 0);
  if (!t) return;
  memcpy(&t->remote, from, fromlen);
  t->remote_len = fromlen;
  size_t len = (size_t)n;
  engine_sendv(e, t, e->txbuf, &len, 1);
  free(t);
  e->stats.retries_sent++;
}

/* Which pending connection a full table drops first: one from a source
 * where no rank was published, then one still in its handshake (a job
 * member's takes a round trip or two), then the oldest. */
static int evict_before(const erdma_conn *p, const erdma_conn *v) {
  if (p->from_peer_host != v->from_peer_host) return p->from_peer_host < v->from_peer_host;
  if (p->handshake_done != v->handshake_done) return p->handshake_done < v->handshake_done;
  return p->accepted_at < v->accepted_at;
}

/* Decide on an Initial for no known connection: a new pending connection
 * (room made if the table is full), a Retry, or nothing. */
static erdma_conn *admit(erdma_engine *e, const uint8_t *data, size_t len,
                         const struct sockaddr_storage *from, socklen_t fromlen) {
  ngtcp2_pkt_hd hd;
  ngtcp2_cid odcid;
  int validated = 0, n = 0, from_host = 0;
  erdma_conn *victim = NULL;
  if (e->stopping || ngtcp2_accept(&hd, data, len) != 0) return NULL;
  if (hd.token.len && hd.token.base[0] == NGTCP2_CRYPTO_TOKEN_MAGIC_RETRY) {
    if (ngtcp2_crypto_verify_retry_token(&odcid, hd.token.base, hd.token.len, e->token_secret,
                                         sizeof e->token_secret, hd.version,
                                         (const ngtcp2_sockaddr *)from, (ngtcp2_socklen)fromlen,
                                         &hd.dcid, RETRY_TOKEN_TTL, erdma_now()) != 0)
      return NULL; /* forged, stale or for another address */
    validated = 1;
  }
  for (erdma_conn *p = e->pending; p; p = p->next_pending) {
    if (p->closed) continue; /* freed by conn_reap_pending this round */
    n++;
    from_host += same_source(&p->remote, from);
    if (!victim || evict_before(p, victim)) victim = p;
  }
  int peers = peers_at_host(e, from);
  /* one host's own handshakes finish (or expire) before it gets more */
  if (from_host >= PENDING_PER_HOST + (ERDMA_MAX_LANES + 1) * peers) return NULL;
  if (!validated && n >= retry_threshold(e)) {
    send_retry(e, &hd, from, fromlen);
    return NULL;
  }
  if (n >= pending_cap(e) && victim) {
    log_conn(victim, "table of unnamed connections full: dropped the oldest", ERDMA_ERR_NOMEM);
    erdma_conn **pp = &e->pending;
    while (*pp != victim) pp = &(*pp)->next_pending;
    *pp = victim->next_pending;
    conn_free(victim);
    e->stats.pending_dropped++;
  }
  erdma_conn *c = server_conn_new(e, &hd, from, fromlen, validated ? &odcid : NULL);
  if (c) c->from_peer_host = peers > 0;
  return c;
}

/* The peer's address for this connection is now a (its NAT gave it a new
 * external port, or ngtcp2 moved to a validated path or back): packets go
 * there from now on, and so do new lanes to that rank. */
static void set_remote(erdma_conn *c, const struct sockaddr_storage *a, socklen_t alen) {
  erdma_engine *e = c->e;
  if (addr_equal(&c->remote, a) || alen > (socklen_t)sizeof c->remote) return;
  if (e->cfg.verbose) {
    char h0[INET6_ADDRSTRLEN], h1[INET6_ADDRSTRLEN];
    int p0, p1;
    addr_format(&c->remote, h0, sizeof h0, &p0);
    addr_format(a, h1, sizeof h1, &p1);
    fprintf(stderr, "erdma[%d]: peer %d: address changed from %s:%d to %s:%d (NAT rebinding)\n",
            e->cfg.rank, c->peer, h0, p0, h1, p1);
  }
  if (c->peer >= 0 && addr_equal(&e->peers[c->peer].addr, &c->remote)) {
    memcpy(&e->peers[c->peer].addr, a, alen);
    e->peers[c->peer].addr_len = alen;
  }
  memcpy(&c->remote, a, alen);
  c->remote_len = alen;
}

/* A server connection sends along ngtcp2's current path, which moves when
 * the client's address changes (see conn_handle_datagram). */
static void follow_path(erdma_conn *c) {
  if (c->is_client || c->shm || !c->conn || c->closed) return;
  const ngtcp2_path *p = ngtcp2_conn_get_path(c->conn);
  if (p && p->remote.addrlen)
    set_remote(c, (const struct sockaddr_storage *)p->remote.addr, (socklen_t)p->remote.addrlen);
}

static erdma_conn *find_conn(erdma_engine *e, const uint8_t *dcid, size_t n) {
  if (n == ERDMA_CIDLEN) {
    uint32_t tag = get32(dcid);
    if (tag < (uint32_t)e->cfg.size)
      for (int k = 0; k < e->lanes_max; k++) {
        erdma_conn *c = peer_conn(&e->peers[tag], k);
        if (c && cid_has(c, dcid, n)) return c;
      }
  }
  erdma_conn *c;
  for (c = e->pending; c; c = c->next_pending)
    if (cid_has(c, dcid, n)) return c;
  FOR_PEER_CONNS(e, i, k, c)
    if (cid_has(c, dcid, n)) return c;
  return NULL;
}

int conn_handle_datagram(erdma_engine *e, const uint8_t *data, size_t len,
                         const struct sockaddr_storage *from, socklen_t fromlen) {
  ngtcp2_version_cid vc;
  ngtcp2_pkt_info pi = {0};
  ngtcp2_path path;
  if (len == 1 && data[0] == 0) return 0; /* shared-memory doorbell: just a wake-up */
  if (ngtcp2_pkt_decode_version_cid(&vc, data, len, ERDMA_CIDLEN) != 0) return 0;
  erdma_conn *c = find_conn(e, vc.dcid, vc.dcidlen);
  if (!c && !(c = admit(e, data, len, from, fromlen))) return 0;
  if (c->closed) return 0;
  c->dirty = 1;
  path_of(c, &path);
  /* NAT rebinding: a packet of a known connection (found by its DCID) from
   * a new address.  A server connection hands ngtcp2 the real source: on a
   * non-probing 1-RTT packet ngtcp2 makes it the current path and validates
   * it (PATH_CHALLENGE there; back to the old path if that fails), and
   * follow_path sends wherever ngtcp2's current path goes.  An ngtcp2 0.12
   * client drops packets from any address but the server's (RFC 9000 has no
   * server migration) and migrates only to a new local address, so a client
   * connection hands ngtcp2 its unchanged path (the server's first address)
   * and moves c->remote, where it sends, itself
   * once a 1-RTT packet from the new address decrypted under the
   * connection's keys (an off-path sender cannot make one). */
  struct sockaddr_storage known;
  int rebound = 0;
  if (c->is_client && c->handshake_done) {
    const ngtcp2_path *cur = ngtcp2_conn_get_path(c->conn);
    memcpy(&known, cur->remote.addr, cur->remote.addrlen);
    path.remote.addr = (ngtcp2_sockaddr *)&known;
    path.remote.addrlen = cur->remote.addrlen;
    rebound = !addr_equal(&c->remote, from);
  } else {
    path.remote.addr = (ngtcp2_sockaddr *)from;
    path.remote.addrlen = fromlen;
  }
  uint64_t before = decrypted_1rtt;
  int rv = ngtcp2_conn_read_pkt(c->conn, &path, &pi, data, len, erdma_now());
  if (rv == 0 && decrypted_1rtt != before && rebound && c->peer >= 0)
    set_remote(c, from, fromlen);
  else if (rv == 0 && !c->is_client)
    follow_path(c);
  /* authentic: a 1-RTT packet of a connection to a known rank, from the
   * address that connection has (not another peer's, spoofing it) */
  int authentic = rv == 0 && decrypted_1rtt != before && c->peer >= 0 &&
                  addr_equal(&c->remote, from);
  if (rv != 0) {
    if (rv == NGTCP2_ERR_DRAINING && c->peer >= 0) e->peers[c->peer].closed_by_peer = 1;
    conn_lost(c, rv);
  }
  return authentic;
}

/* ------------------------------------------------------------------ tx */
void conn_enqueue(erdma_conn *c, const frame_hdr *h, const void *payload, uint64_t plen,
                  uint8_t *owned, erdma_req *req) {
  tx_item *t = calloc(1, sizeof *t);
  if (!t) {
    if (req) req_complete(req, ERDMA_ERR_NOMEM);
    free(owned);
    return;
  }
  hdr_encode(t->hdr, h);
  t->payload = payload;
  t->plen = plen;
  t->owned = owned;
  t->req = req;
  c->tx_offset += ERDMA_HDR_LEN + plen;
  t->stream_end = c->tx_offset;
  if (c->tx_tail) c->tx_tail->next = t; else c->tx_head = t;
  c->tx_tail = t;
  if (!c->tx_write) c->tx_write = t;
  c->dirty = 1;
  c->e->stats.msgs_sent += (h->type == FR_EAGER || h->type == FR_RTS);
}

/* Open data streams up to cfg.data_streams (as far as the peer allows). */
static void ds_open(erdma_conn *c) {
  while (c->nds < c->e->cfg.data_streams && c->nds < ERDMA_MAX_DSTREAMS) {
    tx_stream *d = &c->ds[c->nds];
    if (ngtcp2_conn_open_uni_stream(c->conn, &d->id, NULL) != 0) break;
    c->nds++;
  }
}

static tx_item *chunk_item(const frame_hdr *h, const void *payload, uint64_t plen,
                           erdma_req *req) {
  tx_item *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  hdr_encode(t->hdr, h);
  t->payload = payload;
  t->plen = plen;
  t->req = req;
  t->chunk = 1;
  return t;
}

/* Append CHUNK item t to data stream d of c. */
static void ds_push(erdma_conn *c, tx_stream *d, tx_item *t) {
  d->offset += ERDMA_HDR_LEN + t->plen;
  d->unwritten += ERDMA_HDR_LEN + t->plen;
  t->stream_end = d->offset;
  t->next = NULL;
  if (d->tail) d->tail->next = t; else d->head = t;
  d->tail = t;
  if (!d->write) d->write = t;
  c->dirty = 1;
  c->e->stats.chunks_sent++;
  c->e->stats.lane_chunks_sent += c->lane > 0;
}

/* The data stream of c with the least unsent data (a stream held back by a
 * loss or by its flow-control window gets less); ties go round. */
static tx_stream *ds_pick(erdma_conn *c) {
  tx_stream *d = &c->ds[c->ds_next % c->nds];
  for (int i = 0; i < c->nds; i++)
    if (c->ds[i].unwritten < d->unwritten) d = &c->ds[i];
  c->ds_next = (int)(d - c->ds + 1) % c->nds;
  return d;
}

static uint64_t conn_unwritten(const erdma_conn *c) {
  uint64_t u = 0;
  for (int i = 0; i < c->nds; i++) u += c->ds[i].unwritten;
  return u;
}

/* A lane takes payload once the peer has filed it: its HELLO (the first
 * bytes of its control stream, handled on arrival) has been acknowledged,
 * so no CHUNK can reach the peer before the HELLO that names us. */
static int lane_ready(const erdma_conn *l) {
  return l && l->conn && !l->closed && l->handshake_done && l->hello_recv &&
         l->acked >= ERDMA_HDR_LEN;
}

uint64_t conn_lanes_ready(erdma_engine *e) {
  uint64_t n = 0;
  for (int i = 0; e->peers && i < e->cfg.size; i++)
    for (int k = 1; k < e->lanes_max; k++) n += lane_ready(e->peers[i].lanes[k]);
  return n;
}

/* Whether connection k of p may carry chunks now (the main one always). */
static int lane_usable(const peer_info *p, int k) {
  const erdma_conn *l = peer_conn(p, k);
  return k == 0 ? l && l->conn && !l->closed && !l->shm : lane_ready(l);
}

void lanes_refill(erdma_engine *e, int peer) {
  peer_info *p = &e->peers[peer];
  uint64_t ahead = 2 * (ERDMA_CHUNK_BYTES(e) + ERDMA_HDR_LEN);
  int woke = 0;
  while (p->lazy_head) {
    erdma_conn *best = NULL;
    uint64_t bu = 0;
    for (int k = 0; k < e->lanes_max; k++) {
      if (!lane_usable(p, k)) continue;
      erdma_conn *l = peer_conn(p, k);
      ds_open(l);
      uint64_t u = conn_unwritten(l);
      if (l->nds && u < ahead && (!best || u < bu)) {
        best = l;
        bu = u;
      }
    }
    if (!best) break;
    tx_item *t = p->lazy_head;
    p->lazy_head = t->next;
    if (!p->lazy_head) p->lazy_tail = NULL;
    ds_push(best, ds_pick(best), t);
    woke = 1;
  }
  if (woke) engine_wake(e); /* the progress thread flushes the lanes given work */
}

void lanes_drop(erdma_engine *e, int peer, int error) {
  peer_info *p = &e->peers[peer];
  while (p->lazy_head) {
    tx_item *t = p->lazy_head;
    p->lazy_head = t->next;
    item_release_req(t, error);
    free(t->owned);
    free(t);
  }
  p->lazy_tail = NULL;
}

/* The receiver matched send r (its receive id is recv_id): send the payload.
 * When the receiver accepts chunks, the payload is cut into CHUNK frames
 * spread over our data streams, so a lost packet stalls only the stream it
 * belongs to; with several lanes ready they wait on the peer's lazy list
 * and go to whichever lane has room (lanes_refill).  Otherwise it is one
 * DATA frame on the control stream. */
void conn_send_payload(erdma_conn *c, erdma_req *r, uint64_t recv_id, int chunks_ok) {
  erdma_engine *e = c->e;
  frame_hdr h = {0};
  uint64_t chunk = ERDMA_CHUNK_BYTES(e);
  int nl = 0;
  if (chunks_ok && !c->shm && c->conn && e->cfg.data_streams > 0 && c->peer >= 0) {
    ds_open(c);
    for (int k = 0; k < e->lanes_max; k++)
      nl += peer_conn(&e->peers[c->peer], k) != c && lane_usable(&e->peers[c->peer], k);
  }
  if (!chunks_ok || c->shm || c->nds == 0) {
    h.type = FR_DATA;
    h.id = recv_id;
    h.len = r->nbytes;
    conn_enqueue(c, &h, r->sbuf, r->nbytes, NULL, r);
    return;
  }
  /* the chunks, built before any is queued (out of memory: nothing sent) */
  uint64_t n = r->nbytes, count = n ? (n + chunk - 1) / chunk : 1;
  tx_item *head = NULL, *tail = NULL;
  for (uint64_t off = 0, k = 0; k < count; k++, off += chunk) {
    h.type = FR_CHUNK;
    h.id = recv_id;
    h.off = off;
    h.len = n - off < chunk ? n - off : chunk;
    tx_item *t = chunk_item(&h, (const uint8_t *)r->sbuf + off, h.len, r);
    if (!t) {
      while (head) {
        tx_item *x = head;
        head = x->next;
        free(x);
      }
      req_complete(r, ERDMA_ERR_NOMEM);
      return;
    }
    if (tail) tail->next = t; else head = t;
    tail = t;
  }
  r->chunks_left = count;
  if (nl == 0 && !e->peers[c->peer].lazy_head) { /* one connection: queue them all now */
    while (head) {
      tx_item *t = head;
      head = t->next;
      ds_push(c, ds_pick(c), t);
    }
    return;
  }
  peer_info *p = &e->peers[c->peer];
  if (p->lazy_tail) p->lazy_tail->next = head; else p->lazy_head = head;
  p->lazy_tail = tail;
  lanes_refill(e, c->peer);
}

/* n more bytes of the stream (from *write on) went into packets. */
static void tx_advance(erdma_conn *c, tx_item **write, uint64_t *unwritten, uint64_t n) {
  if (unwritten) *unwritten -= n;
  while (n > 0 && *write) {
    tx_item *t = *write;
    uint64_t rem = ERDMA_HDR_LEN + t->plen - t->written;
    uint64_t take = n < rem ? n : rem;
    t->written += take;
    n -= take;
    c->e->stats.bytes_sent += take;
    if (t->written == ERDMA_HDR_LEN + t->plen) *write = t->next;
  }
}

int conn_tx_idle(erdma_conn *c) {
  if (c->tx_head) return 0;
  for (int i = 0; i < c->nds; i++)
    if (c->ds[i].head) return 0;
  return 1;
}

/* iovecs for the unwritten bytes from item `t` on */
static size_t fill_iov(tx_item *t, ngtcp2_vec *iov, size_t max) {
  size_t niov = 0;
  for (; t && niov + 1 < max; t = t->next) {
    uint64_t w = t->written;
    if (w < ERDMA_HDR_LEN) {
      iov[niov].base = t->hdr + w;
      iov[niov++].len = ERDMA_HDR_LEN - w;
      w = ERDMA_HDR_LEN;
    }
    if (t->plen > w - ERDMA_HDR_LEN) {
      iov[niov].base = (uint8_t *)t->payload + (w - ERDMA_HDR_LEN);
      iov[niov++].len = t->plen - (w - ERDMA_HDR_LEN);
    }
  }
  return niov;
}

/* Packets in one burst: ngtcp2's send quantum, but at least what the
 * pacing rate allows per millisecond (ngtcp2 lets a sender run up to 1 ms
 * ahead anyway), within [2 packets, 64 KiB] like TCP's TSO autosizing: on a
 * short path the quantum alone (rate x min RTT) would cost a system call
 * for every few packets. */
static int burst_packets(erdma_conn *c) {
  /* this connection's packets (the engine's buffers may be larger: a jumbo
   * interface elsewhere) */
  size_t pkt = ngtcp2_conn_get_max_tx_udp_payload_size(c->conn);
  if (pkt > 9000) return ERDMA_TX_BATCH; /* loopback or jumbo link: no pacing needed */
  ngtcp2_conn_stat cs;
  ngtcp2_conn_get_conn_stat(c->conn, &cs);
  double rate = cs.pacing_rate; /* bytes per ns */
  if (rate <= 0 && cs.smoothed_rtt > 0) rate = (double)cs.cwnd / (double)cs.smoothed_rtt;
  size_t bytes = (size_t)(rate * NGTCP2_MILLISECONDS);
  if (bytes < cs.send_quantum) bytes = cs.send_quantum;
  if (bytes > 65536) bytes = 65536;
  int n = (int)(bytes / (pkt ? pkt : 1452));
  if (n < 2) n = 2;
  return n > ERDMA_TX_BATCH ? ERDMA_TX_BATCH : n;
}

/* Write packets while congestion control, flow control and pacing allow.
 * Packets leave in bursts of at most ngtcp2's send quantum; after each burst
 * ngtcp2 learns the send time (ngtcp2_conn_update_pkt_tx_time) and refuses
 * more until its pacing timer, which ngtcp2_conn_get_expiry reports, so the
 * progress thread wakes for it.  The control stream (matching frames) goes
 * first; the data streams take turns packet by packet. */
int conn_flush(erdma_conn *c) {
  erdma_engine *e = c->e;
  size_t lens[ERDMA_TX_BATCH];
  int zc = e->io.tx_buf != NULL; /* packets written straight into the backend's buffers */
  uint32_t blocked = 0; /* bit 0: control stream, bit i+1: data stream i */
  ngtcp2_path_storage ps;
  ngtcp2_pkt_info pi;
  c->dirty = 0;
  if (c->shm) return c->closed ? 0 : shm_flush(c);
  if (c->closed || !c->conn) return 0;
  follow_path(c); /* a failed path validation may have moved it back */
  ngtcp2_path_storage_zero(&ps);
  int bursts = 0, done = 0;
  peer_info *lazy = c->peer >= 0 ? &e->peers[c->peer] : NULL;
  while (!done) {
    ngtcp2_tstamp ts = erdma_now();
    if (lazy && lazy->lazy_head) lanes_refill(e, c->peer);
    int maxp = burst_packets(c);
    int n = 0;
    while (n < maxp) {
      ngtcp2_vec iov[16];
      size_t niov = 0;
      int64_t sid = -1;
      int sel = -2; /* -1: control stream, >= 0: data stream */
      if (c->stream_id >= 0 && c->tx_write && !(blocked & 1)) {
        sel = -1;
      } else {
        for (int k = 0; k < c->nds; k++) {
          int i = (c->ds_rr + k) % c->nds;
          if (c->ds[i].write && !(blocked & (2u << i))) {
            sel = i;
            break;
          }
        }
      }
      if (sel == -1) {
        niov = fill_iov(c->tx_write, iov, 16);
        sid = c->stream_id;
      } else if (sel >= 0) {
        niov = fill_iov(c->ds[sel].write, iov, 16);
        sid = c->ds[sel].id;
      }
      ngtcp2_ssize pdatalen = -1;
      uint8_t *buf = zc ? e->io.tx_buf(e, n, maxp) : e->txbuf + (size_t)n * e->pkt_size;
      if (!buf) { /* no buffer (pool empty): nothing was written; try again soon */
        c->dirty = 1;
        done = 1;
        break;
      }
      ngtcp2_ssize nw = ngtcp2_conn_writev_stream(
          c->conn, &ps.path, &pi, buf, engine_write_room(e, c), &pdatalen,
          sid >= 0 ? NGTCP2_WRITE_STREAM_FLAG_MORE : 0, sid, niov ? iov : NULL, niov, ts);
      if (pdatalen > 0) {
        if (sel == -1)
          tx_advance(c, &c->tx_write, NULL, (uint64_t)pdatalen);
        else
          tx_advance(c, &c->ds[sel].write, &c->ds[sel].unwritten, (uint64_t)pdatalen);
      }
      if (nw < 0) {
        if (nw == NGTCP2_ERR_WRITE_MORE) continue;
        if (nw == NGTCP2_ERR_STREAM_DATA_BLOCKED || nw == NGTCP2_ERR_STREAM_SHUT_WR) {
          blocked |= sel == -1 ? 1u : (2u << sel);
          continue;
        }
        if (n || zc) engine_sendv(e, c, zc ? NULL : e->txbuf, lens, n);
        conn_lost(c, (int)nw);
        return ERDMA_ERR_QUIC;
      }
      if (nw == 0) {
        done = 1; /* nothing more now: window, cwnd, pacing, or no data */
        break;
      }
      lens[n++] = (size_t)nw;
      if (c->nds) c->ds_rr = (c->ds_rr + 1) % c->nds;
    }
    if (n || zc) engine_sendv(e, c, zc ? NULL : e->txbuf, lens, n); /* zc, n 0: release */
    ngtcp2_conn_update_pkt_tx_time(c->conn, ts);
    if (++bursts >= 256 && !done) {
      c->dirty = 1; /* let others have the lock; the progress thread goes on */
      break;
    }
  }
  /* a thread other than the progress thread may have moved the next timer
   * (pacing, loss detection) ahead of the one it sleeps for */
  if (c->dirty || ngtcp2_conn_get_expiry(c->conn) < e->wake_at) engine_wake(e);
  return 0;
}

static void for_each_conn(erdma_engine *e, void (*fn)(erdma_conn *)) {
  erdma_conn *c, *next;
  for (c = e->pending; c; c = next) {
    next = c->next_pending; /* fn may move c to a peer slot */
    fn(c);
  }
  FOR_PEER_CONNS(e, i, k, c) fn(c);
}

static void flush_one(erdma_conn *c) {
  if (c->dirty) conn_flush(c);
}
void conn_flush_all(erdma_engine *e) { for_each_conn(e, flush_one); }

static void expire_one(erdma_conn *c) {
  ngtcp2_tstamp now = erdma_now();
  if (c->closed || !c->conn || ngtcp2_conn_get_expiry(c->conn) > now) return;
  int rv = ngtcp2_conn_handle_expiry(c->conn, now);
  c->dirty = 1;
  if (rv != 0) conn_lost(c, rv);
}
void conn_handle_expiry_all(erdma_engine *e) { for_each_conn(e, expire_one); }

void conn_log_paths(erdma_engine *e) {
  erdma_conn *c;
  FOR_PEER_CONNS(e, i, k, c) {
    ngtcp2_conn_stat cs;
    if (!c->conn || c->closed) continue;
    ngtcp2_conn_get_conn_stat(c->conn, &cs);
    fprintf(stderr, "erdma[%d] %.3f: peer %d lane %d: sent %.1f MB cwnd %lu in flight %lu "
            "srtt %.1f ms min %.1f ms pacing %.0f Mbit/s delivery %.0f Mbit/s\n", e->cfg.rank,
            erdma_now() / 1e9, i, k, e->stats.bytes_sent / 1e6,
            (unsigned long)cs.cwnd, (unsigned long)cs.bytes_in_flight, cs.smoothed_rtt / 1e6,
            cs.min_rtt == UINT64_MAX ? 0.0 : cs.min_rtt / 1e6, cs.pacing_rate * 8e3,
            cs.delivery_rate_sec * 8 / 1e6);
  }
}

uint64_t conn_next_expiry(erdma_engine *e) {
  uint64_t t = UINT64_MAX;
  erdma_conn *c;
  for (c = e->pending; c; c = c->next_pending)
    if (!c->closed && c->conn && ngtcp2_conn_get_expiry(c->conn) < t)
      t = ngtcp2_conn_get_expiry(c->conn);
  FOR_PEER_CONNS(e, i, k, c)
    if (!c->closed && c->conn && ngtcp2_conn_get_expiry(c->conn) < t)
      t = ngtcp2_conn_get_expiry(c->conn);
  return t;
}

void conn_close(erdma_conn *c, int graceful) {
  if (graceful && !c->closed) send_close(c, 0);
  c->closed = 1;
}

void conn_free(erdma_conn *c) {
  tx_item *t, *n;
  for (t = c->tx_head; t; t = n) {
    n = t->next;
    item_release_req(t, ERDMA_ERR_PEER);
    free(t->owned);
    free(t);
  }
  for (int i = 0; i < c->nds; i++)
    for (t = c->ds[i].head; t; t = n) {
      n = t->next;
      item_release_req(t, ERDMA_ERR_PEER);
      free(t->owned);
      free(t);
    }
  if (c->rx.msg && !c->rx.msg->queued && !c->rx.msg->taken && !c->rx.msg->bound)
    msg_free(c->rx.msg); /* (data streams carry no unexpected messages) */
  if (c->conn) ngtcp2_conn_del(c->conn);
  if (c->tls) gnutls_deinit(c->tls);
  if (c->shm) shm_conn_release(c);
  free(c);
}
