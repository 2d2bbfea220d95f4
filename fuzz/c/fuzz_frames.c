// fuzz-sources: ext/src/erdma_conn.c ext/src/erdma_quic.c ext/src/erdma_match.c tests/c/engine_stubs.c
/* The engine's stream frame parser (erdma_conn.c, conn_rx_feed_at) with the
 * matching it drives (erdma_match.c), on an engine of two ranks whose peer
 * connection has no QUIC or socket below it.  One input is a conversation:
 * stream bytes from the peer interleaved with what the application does.
 *   [op 1 byte][arguments] ...
 * op % 8: 0 feed  [stream 1][len 2 BE][bytes]  (stream % 5: 0 control,
 *                 1..4 the peer's data streams; stream & 0x80: the stream ends)
 *         1 post a receive  [tag 1][cap 2 BE]  (cap 0xffff: allocating)
 *         2 post a rendezvous send  [tag 1][len 2 BE]  (waits for a CTS)
 *         3 abort request [k 1]    4 free request [k 1] if it is done
 *         5 the peer is lost       6 everything we sent is acknowledged
 *         7 matched probe: take an unexpected message, or receive the taken one
 * The first byte picks a QUIC or a shared-memory connection.  A feed the
 * parser refuses drops the connection as conn_lost does (the peer fails).
 * ASan/UBSan check every write and free; LeakSanitizer that nothing leaks. */
#include <stdlib.h>
#include <string.h>

#include "erdma_conn.h"
#include "erdma_engine.h"
#include "erdma_match.h"

/* what erdma_conn.c / erdma_match.c call outside themselves: tests/c/engine_stubs.c */

/* ---- the conversation ---- */
#define MAXREQ 32
typedef struct {
  erdma_req *r;
  uint8_t *ubuf; /* the application's buffer (receive or send) */
} app_req;

static size_t take(const uint8_t **p, size_t *n, void *out, size_t k) {
  size_t m = *n < k ? *n : k;
  memset(out, 0, k);
  memcpy(out, *p, m);
  *p += m;
  *n -= m;
  return m;
}

static void post_recv(erdma_engine *e, app_req *a, int tag, unsigned cap) {
  erdma_req *r = req_new(e, REQ_RECV);
  if (!r) return;
  r->alloc = cap == 0xffff;
  if (!r->alloc) {
    a->ubuf = malloc(cap ? cap : 1);
    r->buf = a->ubuf;
    r->cap = cap;
  }
  r->source = tag & 1 ? ERDMA_ANY_SOURCE : 1; /* as erdma_irecv */
  r->tag = tag & 2 ? ERDMA_ANY_TAG : tag;
  r->ctx = 7;
  a->r = r;
  erdma_msg *m = unexp_find(e, r->source, r->tag, r->ctx);
  if (m) {
    DL_REMOVE(e->unexp_head, e->unexp_tail, m);
    m->queued = 0;
    bind_recv(e, r, m);
  } else if (e->peers[1].error) {
    req_complete(r, e->peers[1].error);
  } else {
    DL_APPEND(e->posted_head, e->posted_tail, r);
  }
}

static void post_send(erdma_engine *e, app_req *a, int tag, unsigned len) {
  erdma_req *r = req_new(e, REQ_SEND);
  if (!r) return;
  a->ubuf = calloc(len ? len : 1, 1);
  r->sbuf = a->ubuf;
  r->nbytes = len;
  r->dest = 1;
  r->tag = tag;
  r->ctx = 7;
  a->r = r;
  if (e->peers[1].error) {
    req_complete(r, e->peers[1].error);
    return;
  }
  r->id = ++e->next_id & 0xffffffffu; /* the RTS itself is not modelled */
  DL_APPEND(e->rndv_send_head, e->rndv_send_tail, r);
}

/* as erdma_imrecv, allocating */
static void mrecv(erdma_engine *e, app_req *a, erdma_msg *m) {
  erdma_req *r = req_new(e, REQ_RECV);
  if (!r) abort();
  r->alloc = 1;
  r->source = m->source;
  r->tag = m->tag;
  r->ctx = m->ctx;
  m->taken = 0;
  a->r = r;
  bind_recv(e, r, m);
}

static void lose_peer(erdma_engine *e, erdma_conn *c) {
  c->closed = 1;
  engine_fail_peer(e, 1, ERDMA_ERR_PEER);
}

static void free_req(app_req *a) {
  a->r->user_freed = 1;
  req_release(a->r);
  free(a->ubuf);
  a->r = NULL;
  a->ubuf = NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *p = data;
  size_t n = size;
  uint8_t mode = 0;
  take(&p, &n, &mode, 1);

  erdma_engine *e = calloc(1, sizeof *e);
  e->cfg.rank = 0;
  e->cfg.size = 2;
  e->cfg.eager_limit = 65536;
  e->cfg.shm_eager_limit = 256u << 10;
  e->cfg.unexpected_max = 1u << 20;
  e->cfg.recv_alloc_max = 1u << 20;
  e->cfg.chunk_size = 512u << 10;
  e->cfg.data_streams = 4;
  e->evfd = e->fd = e->io.fd = -1;
  e->lanes_max = 1;
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cv, NULL);
  e->peers = calloc(2, sizeof *e->peers);
  erdma_conn *c = conn_alloc(e, mode & 1);
  c->peer = 1;
  c->hello_recv = 1;
  c->handshake_done = 1;
  c->stream_id = 0;
  c->shm = (mode & 2) != 0;
  e->peers[1].conn = c;

  app_req reqs[MAXREQ];
  memset(reqs, 0, sizeof reqs);
  int nreq = 0;
  erdma_msg *probed = NULL;

  while (n > 0) {
    uint8_t op = 0, a = 0;
    uint16_t v = 0;
    uint8_t be[2];
    take(&p, &n, &op, 1);
    switch (op % 8) {
    case 0: {
      take(&p, &n, &a, 1);
      take(&p, &n, be, 2);
      size_t len = (size_t)be[0] << 8 | be[1];
      if (len > n) len = n;
      /* a copy of its own size: ASan sees any read past the bytes given */
      uint8_t *chunk = malloc(len ? len : 1);
      memcpy(chunk, p, len);
      p += len;
      n -= len;
      if (!c->closed && conn_rx_feed_at(c, (a & 0x7f) % 5, chunk, len, (a & 0x80) != 0) != 0)
        lose_peer(e, c);
      free(chunk);
      break;
    }
    case 1:
    case 2:
      take(&p, &n, &a, 1);
      take(&p, &n, be, 2);
      v = (uint16_t)(be[0] << 8 | be[1]);
      if (nreq < MAXREQ) {
        if (op % 8 == 1) post_recv(e, &reqs[nreq], a, v);
        else post_send(e, &reqs[nreq], a, v);
        if (reqs[nreq].r) nreq++;
      }
      break;
    case 3:
      take(&p, &n, &a, 1);
      if (nreq && reqs[a % nreq].r) erdma_req_abort(reqs[a % nreq].r);
      break;
    case 4:
      take(&p, &n, &a, 1);
      if (nreq && reqs[a % nreq].r && reqs[a % nreq].r->done) free_req(&reqs[a % nreq]);
      break;
    case 5:
      lose_peer(e, c);
      break;
    case 6:
      conn_acked(c, c->tx_offset);
      break;
    case 7:
      if (!probed) {
        probed = unexp_find(e, ERDMA_ANY_SOURCE, ERDMA_ANY_TAG, 7);
        if (probed) {
          DL_REMOVE(e->unexp_head, e->unexp_tail, probed);
          probed->queued = 0;
          probed->taken = 1;
        }
      } else if (nreq < MAXREQ) {
        mrecv(e, &reqs[nreq++], probed);
        probed = NULL;
      }
      break;
    }
  }

  /* teardown, as the application and erdma_engine_free would */
  app_req last = {0};
  if (probed) mrecv(e, &last, probed); /* a matched probe is received */
  if (last.r && !last.r->done) erdma_req_abort(last.r);
  if (last.r) free_req(&last);
  for (int i = 0; i < nreq; i++)
    if (reqs[i].r && !reqs[i].r->done) erdma_req_abort(reqs[i].r);
  for (int i = 0; i < nreq; i++)
    if (reqs[i].r) free_req(&reqs[i]);
  e->stopping = 1;
  conn_free(c);
  e->peers[1].conn = NULL;
  while (e->unexp_head) {
    erdma_msg *m = e->unexp_head;
    DL_REMOVE(e->unexp_head, e->unexp_tail, m);
    msg_free(m);
  }
  free(e->peers);
  pthread_mutex_destroy(&e->mu);
  pthread_cond_destroy(&e->cv);
  free(e);
  return 0;
}
