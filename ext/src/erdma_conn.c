/* erdma_conn.c - the connections to peer ranks: the stream framing parser
 * (frames -> matching), the tx queues of frames, lanes and data streams,
 * admission of accepted connections, and the engine's side of each QUIC
 * connection (erdma_quic.c: its settings from the configuration, its
 * events, its packets through the packet I/O layer, erdma_now() as its
 * clock).  All under e->mu. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gnutls/crypto.h>

#include "erdma_conn.h"
#include "erdma_engine.h"
#include "erdma_match.h"
#include "erdma_nat.h"
#include "erdma_quic.h"
#include "erdma_shm.h"
#include "erdma_copy.h"

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

static void log_conn(erdma_conn *c, const char *what, int rv) {
  if (c->e->cfg.verbose)
    fprintf(stderr, "erdma[%d]: peer %d: %s (%d: %s)\n", c->e->cfg.rank, c->peer, what,
            rv, rv < -200 ? ngtcp2_strerror(rv) : erdma_strerror(rv));
}

/* Tell the peer why we drop the connection (RFC 9000 CONNECTION_CLOSE). */
static void send_close(erdma_conn *c, int rv) {
  if (c->q) erdma_quic_close(c->q, rv, erdma_now());
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
            : c->foreign_cert ? "the process at its address presented a certificate other "
                                "than the one its rank published (another program on that "
                                "port, or a stale address)"
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
      if (m->len) erdma_copy(b->buf, m->data, m->len < b->cap ? m->len : b->cap);
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
      if (c->q) erdma_quic_peer_fingerprint(c->q, fp);
      else fp[0] = 0;
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
    if (c->q && e->cfg.conn_window > PENDING_WINDOW)
      erdma_quic_extend_offset(c->q, e->cfg.conn_window - PENDING_WINDOW);
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
    uint64_t lim = conn_eager_max(c);
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
      if (!m || msg_alloc_data(m)) {
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
    if ((h->flags & FR_FLAG_CMA) && !c->chan->in_place)
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
    if ((h->flags & FR_FLAG_CMA) && !c->chan->in_place)
      return violation(c, "a CTS for a shared-memory read over QUIC");
    if (h->id > e->next_id) return violation(c, "a CTS for a send id never issued");
    /* (an unknown id: a send cancelled meanwhile) */
    if (h->flags & FR_FLAG_SPLIT) {
      if (!(h->flags & FR_FLAG_CMA)) return violation(c, "a split CTS without a CMA read");
      r = list_find_id(e->rndv_send_head, h->id, src);
      if (r && conn_push(c, r, h->len)) { /* else the receiver's CMA CTS completes it */
        DL_REMOVE(e->rndv_send_head, e->rndv_send_tail, r);
        req_complete(r, 0);
      }
      break;
    }
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
  case FR_RATE: {
    /* the rate our packets reach the peer at: a ceiling for our pacing
     * towards it, a little above, so that it can still grow */
    if (h->len < RATE_MIN || h->len > RATE_MAX) return violation(c, "a RATE out of range");
    uint64_t cap = (uint64_t)((double)h->len * RATE_GAIN);
    for (int k = 0; e->cfg.pace_learn && k < e->lanes_max; k++) {
      erdma_conn *l = peer_conn(&e->peers[src], k);
      if (l && l->q) erdma_quic_set_pace_cap(l->q, cap);
    }
    e->stats.rate_reports_recv++;
    break;
  }
  default:
    return violation(c, "an unknown frame type");
  }
  return 0;
}

/* Header and short payload bytes leave the shared-memory ring by plain
 * 8-byte moves: glibc's memmove copies short runs with vector loads (masked
 * ones below 64 bytes where AVX-512 is used), which wait longer on a line
 * another core has just written (one way, 16-byte messages: 0.76 us with
 * memmove, 0.62 with these moves; 64 to 256 bytes 0.03-0.08 us less). */
#define RX_WORDS_MAX 256
static inline void copy_words(uint8_t *d, const uint8_t *s, size_t n) {
  for (; n >= 8; n -= 8, d += 8, s += 8) {
    uint64_t w;
    __builtin_memcpy(&w, s, 8);
    __builtin_memcpy(d, &w, 8);
  }
  for (; n; n--) *d++ = *s++;
}

static int rx_feed(erdma_conn *c, rx_state *x, const uint8_t *data, size_t len) {
  while (len > 0) {
    if (c->closed) return ERDMA_ERR_PEER; /* (a frame above failed the peer) */
    if (x->hdr_got < ERDMA_HDR_LEN) {
      size_t n = ERDMA_HDR_LEN - x->hdr_got;
      if (n > len) n = len;
      copy_words(x->hdr + x->hdr_got, data, n);
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
      if (w <= RX_WORDS_MAX)
        copy_words(x->dst, data, w);
      else
        erdma_copy(x->dst, data, w);
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

/* ---------------------------------------------------------- QUIC events
 * What erdma_quic.c reports about a connection (quic_events below). */

/* The peer's certificate, in the TLS handshake (from erdma_quic_read): a
 * client accepts only the fingerprint published for the rank it dials; a
 * server only one of the fingerprints set_peer gave (which rank it is comes
 * later, in the HELLO, and on_hello checks that the two agree).  Anyone
 * else fails the handshake with a TLS alert and never reaches stream data.
 * An empty fingerprint matches anything only in an insecure engine
 * (set_peer refuses it otherwise). */
static int on_verify_peer(void *user, const char *fp) {
  erdma_conn *c = user;
  erdma_engine *e = c->e;
  if (c->is_client) {
    const char *want = e->peers[c->peer].fingerprint;
    if (want[0] ? strcmp(fp, want) == 0 : e->cfg.insecure) return 0;
    c->foreign_cert = 1; /* conn_lost says so: another process at that address */
  } else {
    if (e->cfg.insecure) return 0;
    for (int i = 0; i < e->cfg.size; i++)
      if (i != e->cfg.rank && fp[0] && strcmp(fp, e->peers[i].fingerprint) == 0) return 0;
  }
  if (e->cfg.verbose)
    fprintf(stderr, "erdma[%d]: refused a %s certificate in the TLS handshake (%s)\n",
            e->cfg.rank, fp[0] ? "foreign" : "missing", fp[0] ? fp : "none presented");
  return -1;
}

static int on_handshake_done(void *user) {
  erdma_conn *c = user;
  erdma_engine *e = c->e;
  c->handshake_done = 1;
  erdma_quic_set_keep_alive(c->q, nat_keepalive_ns(e));
  if (c->is_client) {
    peer_info *p = &e->peers[c->peer];
    if (p->fingerprint[0]) {
      char fp[65];
      erdma_quic_peer_fingerprint(c->q, fp);
      if (strcmp(fp, p->fingerprint) != 0) {
        fprintf(stderr, "erdma[%d]: rank %d presented a certificate that does not match "
                        "the rendezvous record; refusing it\n", e->cfg.rank, c->peer);
        return -1;
      }
    }
    if (erdma_quic_open_bidi(c->q, &c->stream_id) != 0) return -1;
  }
  pthread_cond_broadcast(&e->cv);
  return 0;
}

static void on_stream_open(void *user, int64_t stream_id) {
  erdma_conn *c = user;
  if (!c->is_client && c->stream_id < 0 && (stream_id & 3) == 0) c->stream_id = stream_id;
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
  erdma_quic_extend_stream_offset(c->q, c->stream_id, c->credit_owed - held);
  c->credit_owed = held;
  return 1;
}

void unexp_release(erdma_engine *e, int peer, uint64_t n) {
  if (!e->peers || peer < 0 || peer >= e->cfg.size) return;
  peer_info *p = &e->peers[peer];
  erdma_conn *c = p->conn;
  uint64_t before = p->unexp_bytes;
  p->unexp_bytes = p->unexp_bytes > n ? p->unexp_bytes - n : 0;
  if (c && c->q && !c->closed && c->credit_owed && credit_release(c)) {
    c->dirty = 1; /* the progress thread sends the MAX_STREAM_DATA */
    engine_wake(e);
  } else if (c && c->shm && before > p->unexp_bytes && e->shm.held &&
             p->unexp_bytes <= shm_hold_max(e)) {
    shm_hold_taken(e); /* drain_ring left the peer's bytes in its ring: read on */
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

static int on_stream_data(void *user, int64_t stream_id, const uint8_t *data, size_t datalen,
                          int fin) {
  erdma_conn *c = user;
  int i = rx_index(c, stream_id);
  if (i >= 0) {
    c->e->stats.bytes_recv += datalen;
    if (conn_rx_feed_at(c, i, data, datalen, fin) != 0) return -1;
  }
  /* before its HELLO an accepted connection gets credit back on its control
   * stream only (a HELLO, or it is dropped): bytes on streams we ignore
   * cannot make ngtcp2 grow the small window of fill_params */
  if (!c->is_client && !c->hello_recv && stream_id != c->stream_id) return 0;
  /* every byte is consumed at once (copied to its destination); the
   * control stream's credit may wait for the application (credit_release) */
  erdma_quic_extend_offset(c->q, datalen);
  if (i == 0) {
    c->credit_owed += datalen;
    credit_release(c);
  } else {
    erdma_quic_extend_stream_offset(c->q, stream_id, datalen);
  }
  return 0;
}

/* The peer reset its control stream or a data stream: frames on it are lost. */
static int on_stream_reset(void *user, int64_t stream_id) {
  erdma_conn *c = user;
  if (c->hello_recv && rx_index(c, stream_id) >= 0) {
    violation(c, "it reset a stream");
    return -1;
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

static void on_stream_acked(void *user, int64_t stream_id, uint64_t offset, uint64_t datalen) {
  erdma_conn *c = user;
  if (stream_id == c->stream_id) {
    conn_acked(c, offset + datalen);
    return;
  }
  for (int i = 0; i < c->nds; i++)
    if (c->ds[i].id == stream_id) {
      tx_stream *d = &c->ds[i];
      if (offset + datalen > d->acked) d->acked = offset + datalen;
      if (release_acked(&d->head, &d->tail, d->write, d->acked))
        pthread_cond_broadcast(&c->e->cv);
    }
}

/* The connection ended (erdma_quic.c wrote any CONNECTION_CLOSE). */
static void on_closed(void *user, int rv) {
  erdma_conn *c = user;
  if (rv == NGTCP2_ERR_DRAINING && c->peer >= 0) c->e->peers[c->peer].closed_by_peer = 1;
  conn_lost(c, rv);
}

/* ERDMA_CC_LOG=1: ngtcp2's congestion-control events (lines naming bbr or
 * cubic: state changes, RTprop updates) on stderr, for diagnosing paths */
static void on_log(void *user, const char *line) {
  erdma_conn *c = user;
  if (c->e->cfg.cc_log < 2 && !strstr(line, "bbr") && !strstr(line, "cubic")) return;
  if (strstr(line, "RTprop")) return; /* every ACK */
  fprintf(stderr, "erdma[%d] %.3f peer %d: %s\n", c->e->cfg.rank, erdma_now() / 1e9, c->peer,
          line);
}

uint64_t conn_decrypted_count(void) { return erdma_quic_decrypted_count(); }

/* the QUIC connection's settings, from the engine's configuration */
static void fill_params(erdma_conn *c, erdma_quic_params *p) {
  erdma_engine *e = c->e;
  const erdma_config *cfg = &e->cfg;
  memset(p, 0, sizeof *p);
  /* BBR fills long lossy paths (random loss is not congestion to it); over
   * loopback CUBIC measured best */
  p->cc_algo = cfg->cc_algo >= 0 ? cfg->cc_algo
               : addr_is_loopback(&c->remote) ? ERDMA_CC_CUBIC
                                              : ERDMA_DEFAULT_WAN_CC;
  /* the path's size (a relay, a jumbo or loopback path: erdma_engine.c) */
  p->max_udp_payload = engine_conn_payload(e, c);
  p->conn_window = cfg->conn_window;
  p->stream_window = cfg->stream_window;
  /* ngtcp2 doubles a window that the peer uses up within a few RTTs, up to
   * these ceilings: a small job never grows them, a long fat path does */
  p->max_conn_window = cfg->max_conn_window;
  p->max_stream_window = cfg->max_stream_window;
  /* a connection we accept starts with a window just big enough for a
   * HELLO and what follows it at once: until the HELLO names a job member
   * (on_hello opens it up), that bounds the stream data, in order or not,
   * a stranger can make ngtcp2 buffer */
  p->server_conn_window = PENDING_WINDOW;
  p->handshake_timeout = (uint64_t)(cfg->handshake_timeout * NGTCP2_SECONDS);
  p->idle_timeout = (uint64_t)(cfg->idle_timeout * NGTCP2_SECONDS);
  p->ack_thresh = 16; /* fewer ACK-only packets on bulk transfers */
  p->pace = cfg->pace;
  p->max_pacing_rate = cfg->max_pacing_rate;
  p->max_streams_bidi = 4;
  p->max_streams_uni = ERDMA_MAX_DSTREAMS;
  p->log = cfg->cc_log > 0;
  p->local = &e->local;
  p->local_len = e->local_len;
  p->remote = &c->remote;
  p->remote_len = c->remote_len;
  p->cred = e->cred;
  p->prio = e->prio;
  p->require_cert = !cfg->insecure;
  p->alpn = ERDMA_ALPN;
}

erdma_conn *conn_alloc(erdma_engine *e, int client) {
  erdma_conn *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->e = e;
  c->chan = &erdma_quic_chan;
  c->is_client = client;
  c->peer = -1;
  c->stream_id = -1;
  return c;
}

static const erdma_quic_callbacks quic_events;

/* A new QUIC connection's first frame: the HELLO that names us. */
static void conn_start(erdma_conn *c) {
  frame_hdr h = {0};
  h.type = FR_HELLO;
  h.ctx = (uint32_t)c->e->cfg.rank;
  h.len = (uint64_t)c->e->cfg.size;
  if (c->lane) {
    h.flags = FR_FLAG_LANE;
    h.aux = (uint32_t)c->lane;
  }
  conn_enqueue(c, &h, NULL, 0, NULL, NULL);
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
  erdma_quic_params p;
  erdma_conn *c = conn_alloc(e, 1);
  if (!c) return ERDMA_ERR_NOMEM;
  c->peer = peer;
  c->lane = lane;
  memcpy(&c->remote, &e->peers[peer].addr, e->peers[peer].addr_len);
  c->remote_len = e->peers[peer].addr_len;
  fill_params(c, &p);
  p.cid_tag = (uint32_t)peer;
  p.dcid_tag = (uint32_t)e->cfg.rank; /* the server files us under our rank */
  int rv = erdma_quic_client_new(&c->q, &p, &quic_events, c, erdma_now());
  if (rv != 0) {
    free(c);
    return rv == ERDMA_QUIC_ERR_TLS ? ERDMA_ERR_TLS
           : rv == ERDMA_QUIC_ERR_NOMEM ? ERDMA_ERR_NOMEM : ERDMA_ERR_QUIC;
  }
  conn_start(c);
  if (lane) e->peers[peer].lanes[lane] = c;
  else e->peers[peer].conn = c;
  if (lane >= e->lanes_max) e->lanes_max = lane + 1;
  conn_flush(c);
  return 0;
}

/* A connection for the client's Initial (ini->validated: it carried our
 * Retry token). */
static erdma_conn *server_conn_new(erdma_engine *e, const erdma_quic_initial *ini,
                                   const struct sockaddr_storage *from, socklen_t fromlen) {
  erdma_quic_params p;
  erdma_conn *c = conn_alloc(e, 0);
  if (!c) return NULL;
  memcpy(&c->remote, from, fromlen);
  c->remote_len = fromlen;
  fill_params(c, &p);
  /* the client named our rank in its first DCID's tag: we issue CIDs with
   * it too */
  p.cid_tag = erdma_quic_initial_tag(ini);
  if (erdma_quic_server_new(&c->q, &p, &quic_events, c, ini, erdma_now()) != 0) {
    free(c);
    return NULL;
  }
  conn_start(c);
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

static void send_retry(erdma_engine *e, const erdma_quic_initial *ini,
                       const struct sockaddr_storage *from, socklen_t fromlen) {
  /* (its Source CID has the same rank tag as the client's first DCID: see
   * server_conn_new) */
  ngtcp2_ssize n = erdma_quic_write_retry(e->txbuf, e->pkt_size, ini, e->token_secret,
                                          sizeof e->token_secret, from, fromlen, erdma_now());
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
  erdma_quic_initial ini;
  int n = 0, from_host = 0;
  erdma_conn *victim = NULL;
  if (e->stopping || erdma_quic_accept(&ini, data, len) != 0) return NULL;
  if (erdma_quic_has_retry_token(&ini) &&
      erdma_quic_verify_retry(&ini, e->token_secret, sizeof e->token_secret, from, fromlen,
                              RETRY_TOKEN_TTL, erdma_now()) != 0)
    return NULL; /* forged, stale or for another address */
  for (erdma_conn *p = e->pending; p; p = p->next_pending) {
    if (p->closed) continue; /* freed by conn_reap_pending this round */
    n++;
    from_host += same_source(&p->remote, from);
    if (!victim || evict_before(p, victim)) victim = p;
  }
  int peers = peers_at_host(e, from);
  /* one host's own handshakes finish (or expire) before it gets more */
  if (from_host >= PENDING_PER_HOST + (ERDMA_MAX_LANES + 1) * peers) return NULL;
  if (!ini.validated && n >= retry_threshold(e)) {
    send_retry(e, &ini, from, fromlen);
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
  erdma_conn *c = server_conn_new(e, &ini, from, fromlen);
  if (c) c->from_peer_host = peers > 0;
  return c;
}

/* The peer's address for this connection is now a (its NAT gave it a new
 * external port, or ngtcp2 moved to a validated path or back: erdma_quic_read
 * says which): packets go there from now on, and so do new lanes to that
 * rank. */
static void on_path_changed(void *user, const struct sockaddr_storage *a, socklen_t alen) {
  erdma_conn *c = user;
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

static erdma_conn *find_conn(erdma_engine *e, const uint8_t *dcid, size_t n) {
  if (n == ERDMA_CIDLEN) {
    uint32_t tag = get32(dcid);
    if (tag < (uint32_t)e->cfg.size)
      for (int k = 0; k < e->lanes_max; k++) {
        erdma_conn *c = peer_conn(&e->peers[tag], k);
        if (c && c->q && erdma_quic_has_cid(c->q, dcid, n)) return c;
      }
  }
  erdma_conn *c;
  for (c = e->pending; c; c = c->next_pending)
    if (c->q && erdma_quic_has_cid(c->q, dcid, n)) return c;
  FOR_PEER_CONNS(e, i, k, c)
    if (c->q && erdma_quic_has_cid(c->q, dcid, n)) return c;
  return NULL;
}

int conn_handle_datagram(erdma_engine *e, const uint8_t *data, size_t len,
                         const struct sockaddr_storage *from, socklen_t fromlen) {
  const uint8_t *dcid;
  size_t dcidlen;
  int authentic = 0;
  if (len == 1 && data[0] == 0) return 0; /* shared-memory doorbell: just a wake-up */
  if (erdma_quic_dcid(data, len, &dcid, &dcidlen) != 0) return 0;
  erdma_conn *c = find_conn(e, dcid, dcidlen);
  if (!c && !(c = admit(e, data, len, from, fromlen))) return 0;
  if (c->closed) return 0;
  c->dirty = 1;
  /* (NAT rebinding: erdma_quic_read moves c->remote through on_path_changed;
   * an error ends the connection through on_closed) */
  uint64_t now = erdma_now();
  erdma_quic_read(c->q, data, len, from, fromlen, now, &authentic);
  /* authentic: a 1-RTT packet of a connection to a known rank, from the
   * address that connection has (not another peer's, spoofing it) */
  if (authentic && c->peer >= 0 && !c->closed) conn_rate_account(e, c->peer, len, now);
  return authentic && c->peer >= 0;
}

/* The rate a peer's packets arrive at, told back to it (FR_RATE) each time
 * it grows by a sixteenth.  Packets leave a bottleneck with a queue at the
 * bottleneck's rate, so while the peer sends faster than its path carries,
 * this measures the path: a figure ngtcp2 0.12 gives no sender (its
 * delivery-rate samples run high on bursts).  A bin counts only beside
 * another (the lower of two in a row), so one late read of a backlog cannot
 * inflate it. */
#define RATE_BIN (20 * NGTCP2_MILLISECONDS)

void conn_rate_account(erdma_engine *e, int peer, size_t len, uint64_t now) {
  peer_info *p = &e->peers[peer];
  uint64_t span = now - p->rx_bin_at;
  if (span >= RATE_BIN) {
    uint64_t rate = 0;
    if (span < 2 * RATE_BIN && p->rx_bin_at) {
      rate = p->rx_bin_bytes * NGTCP2_SECONDS / span;
      uint64_t both = rate < p->rx_prev_rate ? rate : p->rx_prev_rate;
      if (both > p->rx_rate) p->rx_rate = both;
    }
    p->rx_prev_rate = rate; /* after a gap: 0, no neighbour for the next bin */
    p->rx_bin_at = now;
    p->rx_bin_bytes = 0;
    erdma_conn *c = p->conn;
    if (p->rx_rate >= RATE_MIN && p->rx_rate > p->rx_rate_sent + p->rx_rate_sent / 16 &&
        c && c->q && c->hello_recv && !c->closed) {
      frame_hdr h;
      memset(&h, 0, sizeof h);
      h.type = FR_RATE;
      h.len = p->rx_rate < RATE_MAX ? p->rx_rate : RATE_MAX;
      conn_enqueue(c, &h, NULL, 0, NULL, NULL);
      p->rx_rate_sent = h.len;
      e->stats.rate_reports_sent++;
    }
  }
  p->rx_bin_bytes += len;
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
    if (erdma_quic_open_uni(c->q, &d->id) != 0) break;
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
  return l && l->q && !l->closed && l->handshake_done && l->hello_recv &&
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
  return k == 0 ? l && l->q && !l->closed && !l->shm : lane_ready(l);
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
  if (chunks_ok && !c->shm && c->q && e->cfg.data_streams > 0 && c->peer >= 0) {
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

/* ---- the QUIC writer's side (quic_events): packet buffers, stream data */
/* packet i of a burst: straight into the backend's buffers where it offers
 * them (zero-copy), else e->txbuf */
static uint8_t *on_tx_buf(void *user, int i, int want, size_t *room) {
  erdma_conn *c = user;
  erdma_engine *e = c->e;
  *room = engine_write_room(e, c);
  return e->io.tx_buf ? e->io.tx_buf(e, i, want) : e->txbuf + (size_t)i * e->pkt_size;
}

static void on_tx_send(void *user, size_t *lens, int n) {
  erdma_conn *c = user;
  erdma_engine *e = c->e;
  int zc = e->io.tx_buf != NULL;
  if (n || zc) engine_sendv(e, c, zc ? NULL : e->txbuf, lens, n); /* zc, n 0: release */
}

static int sid_blocked(int64_t sid, const int64_t *blocked, int nblocked) {
  for (int i = 0; i < nblocked; i++)
    if (blocked[i] == sid) return 1;
  return 0;
}

/* The control stream (matching frames) goes first; the data streams take
 * turns packet by packet (on_tx_packet). */
static size_t on_tx_pull(void *user, const int64_t *blocked, int nblocked, int64_t *sid,
                         ngtcp2_vec *iov, size_t maxiov) {
  erdma_conn *c = user;
  *sid = -1;
  c->tx_sel = -2;
  if (c->stream_id >= 0 && c->tx_write && !sid_blocked(c->stream_id, blocked, nblocked)) {
    c->tx_sel = -1;
    *sid = c->stream_id;
    return fill_iov(c->tx_write, iov, maxiov);
  }
  for (int k = 0; k < c->nds; k++) {
    int i = (c->ds_rr + k) % c->nds;
    if (c->ds[i].write && !sid_blocked(c->ds[i].id, blocked, nblocked)) {
      c->tx_sel = i;
      *sid = c->ds[i].id;
      return fill_iov(c->ds[i].write, iov, maxiov);
    }
  }
  return 0;
}

static void on_tx_wrote(void *user, int64_t sid, uint64_t n) {
  erdma_conn *c = user;
  int i = c->tx_sel;
  if (i == -1 && sid == c->stream_id)
    tx_advance(c, &c->tx_write, NULL, n);
  else if (i >= 0 && i < c->nds && sid == c->ds[i].id)
    tx_advance(c, &c->ds[i].write, &c->ds[i].unwritten, n);
}

static void on_tx_packet(void *user) {
  erdma_conn *c = user;
  if (c->nds) c->ds_rr = (c->ds_rr + 1) % c->nds;
}

static const erdma_quic_callbacks quic_events = {
    .tx_buf = on_tx_buf,
    .tx_send = on_tx_send,
    .tx_pull = on_tx_pull,
    .tx_wrote = on_tx_wrote,
    .tx_packet = on_tx_packet,
    .verify_peer = on_verify_peer,
    .handshake_done = on_handshake_done,
    .stream_open = on_stream_open,
    .stream_data = on_stream_data,
    .stream_reset = on_stream_reset,
    .stream_acked = on_stream_acked,
    .path_changed = on_path_changed,
    .closed = on_closed,
    .log = on_log,
};

/* Write packets while congestion control, flow control and pacing allow,
 * in bursts of at most ngtcp2's send quantum (erdma_quic_flush); after each
 * burst ngtcp2 learns the send time and refuses more until its pacing
 * timer, which erdma_quic_expiry reports, so the progress thread wakes for
 * it.  Each burst goes out at the time it is written (erdma_now()). */
static int quic_chan_flush(erdma_conn *c) {
  erdma_engine *e = c->e;
  if (c->closed || !c->q) return 0;
  peer_info *lazy = c->peer >= 0 ? &e->peers[c->peer] : NULL;
  for (int bursts = 0;;) {
    int more = 0;
    uint64_t now = erdma_now();
    if (lazy && lazy->lazy_head) lanes_refill(e, c->peer);
    if (erdma_quic_flush(c->q, now, &more) != 0) return ERDMA_ERR_QUIC; /* (on_closed) */
    if (more == ERDMA_QUIC_MORE_LATER) { /* no buffer (pool empty): try again soon */
      c->dirty = 1;
      break;
    }
    if (!more) break; /* nothing more now: window, cwnd, pacing, or no data */
    if (++bursts >= 256) {
      c->dirty = 1; /* let others have the lock; the progress thread goes on */
      break;
    }
  }
  /* a thread other than the progress thread may have moved the next timer
   * (pacing, loss detection) ahead of the one it sleeps for */
  if (c->dirty || erdma_quic_expiry(c->q) < e->wake_at) engine_wake(e);
  return 0;
}

int conn_flush(erdma_conn *c) {
  c->dirty = 0;
  return c->chan->flush(c);
}

static uint64_t quic_chan_eager_max(const erdma_conn *c) { return c->e->cfg.eager_limit; }

/* QUIC: frames only (no writes past the queue, no reads in place). */
const erdma_chan erdma_quic_chan = {
    .name = "quic",
    .chunks = 1,
    .eager_max = quic_chan_eager_max,
    .flush = quic_chan_flush,
};

uint64_t conn_eager_max(const erdma_conn *c) { return c->chan->eager_max(c); }

int conn_send_now(erdma_conn *c, const frame_hdr *h, const void *buf, uint64_t n) {
  return c->chan->send_now ? c->chan->send_now(c, h, buf, n) : 0;
}

int conn_offer(erdma_conn *c, erdma_req *r) {
  if (!c->chan->offer || !c->chan->offer(c, r)) return 0;
  r->offered = c->chan;
  return 1;
}

int conn_take(erdma_conn *c, void *dst, uint64_t addr, uint64_t n, uint32_t sid) {
  return c->chan->take ? c->chan->take(c, dst, addr, n, sid) : -1;
}

int conn_can_split(const erdma_conn *c) {
  return c->chan->split_ok && c->chan->split_ok(c) && c->chan->take_split;
}

int conn_take_split(erdma_conn *c, void *dst, uint64_t addr, uint64_t n, uint32_t sid) {
  return c->chan->take_split ? c->chan->take_split(c, dst, addr, n, sid) : -1;
}

int conn_push(erdma_conn *c, erdma_req *r, uint64_t raddr) {
  return c->chan->push ? c->chan->push(c, r, raddr) : 0;
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
  if (c->closed || !c->q) return;
  /* 1: timers handled, < 0: the connection ended (on_closed) */
  if (erdma_quic_handle_expiry(c->q, erdma_now()) != 0) c->dirty = 1;
}
void conn_handle_expiry_all(erdma_engine *e) { for_each_conn(e, expire_one); }

void conn_log_paths(erdma_engine *e) {
  erdma_conn *c;
  FOR_PEER_CONNS(e, i, k, c) {
    ngtcp2_conn_stat cs;
    if (!c->q || c->closed) continue;
    erdma_quic_stat(c->q, &cs);
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
    if (!c->closed && c->q && erdma_quic_expiry(c->q) < t) t = erdma_quic_expiry(c->q);
  FOR_PEER_CONNS(e, i, k, c)
    if (!c->closed && c->q && erdma_quic_expiry(c->q) < t) t = erdma_quic_expiry(c->q);
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
  erdma_quic_del(c->q);
  if (c->chan->release) c->chan->release(c);
  free(c);
}
