/* erdma_diag.c - a text description of the engine's pending operations, for
 * the stack dump a rank prints on SIGUSR1 or when its job times out.
 *
 * Reads the matching queues under the engine lock, taken with trylock and a
 * bounded wait: a dump must never block behind a wedged progress thread. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "erdma_conn.h"
#include "erdma_engine.h"
#include "erdma_match.h"
#include "erdma_quic.h"

typedef struct {
  char *buf;
  size_t cap, len;
  int full;
} text;

static void put(text *t, const char *fmt, ...) {
  if (t->full || t->cap == 0) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= t->cap - t->len) {
    t->full = 1;  /* truncated: end with a marker if there is room */
    const char *more = "...\n";
    if (t->cap > strlen(more)) {
      memcpy(t->buf + t->cap - strlen(more) - 1, more, strlen(more) + 1);
      t->len = t->cap - 1;
    }
    return;
  }
  t->len += (size_t)n;
}

static void peer_name(char *out, size_t n, int r) {
  if (r == ERDMA_ANY_SOURCE) snprintf(out, n, "ANY_SOURCE");
  else snprintf(out, n, "%d", r);
}

static void tag_name(char *out, size_t n, int tag) {
  if (tag == ERDMA_ANY_TAG) snprintf(out, n, "ANY_TAG");
  else snprintf(out, n, "%d", tag);
}

/* At most `limit` entries of each queue are listed, then a count. */
static void describe(erdma_engine *e, text *t, int limit) {
  char p[16], g[16];
  int n = 0, more = 0;
  for (erdma_req *r = e->posted_head; r; r = r->next) {
    if (n++ >= limit) { more++; continue; }
    peer_name(p, sizeof p, r->source);
    tag_name(g, sizeof g, r->tag);
    put(t, "  posted receive: source %s tag %s ctx %u, room for %llu bytes\n", p, g,
        (unsigned)r->ctx, (unsigned long long)r->cap);
  }
  if (more) put(t, "  ... and %d more posted receives\n", more);
  n = more = 0;
  for (erdma_req *r = e->rndv_recv_head; r; r = r->next) {
    if (n++ >= limit) { more++; continue; }
    put(t, "  receive waiting for data: source %d tag %d ctx %u, %llu bytes arrived\n",
        r->st.source, r->st.tag, (unsigned)r->ctx, (unsigned long long)r->got);
  }
  if (more) put(t, "  ... and %d more receives waiting for data\n", more);
  n = more = 0;
  for (erdma_req *r = e->rndv_send_head; r; r = r->next) {
    if (n++ >= limit) { more++; continue; }
    put(t, "  send waiting for the receiver: dest %d tag %d ctx %u, %llu bytes\n", r->dest,
        r->tag, (unsigned)r->ctx, (unsigned long long)r->nbytes);
  }
  if (more) put(t, "  ... and %d more sends waiting for their receivers\n", more);
  n = more = 0;
  for (erdma_msg *m = e->unexp_head; m; m = m->next) {
    if (n++ >= limit) { more++; continue; }
    put(t, "  unexpected message: source %d tag %d ctx %u, %llu bytes%s\n", m->source, m->tag,
        (unsigned)m->ctx, (unsigned long long)m->len,
        m->rndv ? " (announced)" : (m->complete ? "" : " (arriving)"));
  }
  if (more) put(t, "  ... and %d more unexpected messages\n", more);
  int lost = 0;
  for (int i = 0; i < e->cfg.size; i++) {
    if (i != e->cfg.rank && e->peers[i].error) {
      if (!lost++) put(t, "  lost peers:");
      put(t, " %d", i);
    }
  }
  if (lost) put(t, "\n");
}

int erdma_engine_describe(erdma_engine *e, char *buf, size_t cap, int limit) {
  if (!buf || cap == 0) return ERDMA_ERR_INVAL;
  text t = {buf, cap, 0, 0};
  buf[0] = '\0';
  /* up to ~0.5 s for the lock: the progress thread holds it only briefly */
  int locked = 0;
  for (int i = 0; i < 500 && !locked; i++) {
    if (pthread_mutex_trylock(&e->mu) == 0) {
      locked = 1;
      break;
    }
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  if (!locked) {
    put(&t, "  (the engine lock is held; pending operations not listed)\n");
    return 0;
  }
  describe(e, &t, limit > 0 ? limit : 20);
  pthread_mutex_unlock(&e->mu);
  if (t.len == 0) put(&t, "  no pending operations\n");
  return 0;
}

/* QUIC path figures of every connection to `rank` (its lanes summed; RTTs of
 * the main connection).  Zeros for a peer without a QUIC connection (self,
 * shared memory only). */
int erdma_engine_peer_stat(erdma_engine *e, int rank, erdma_peer_stat *out) {
  if (!e || !out) return ERDMA_ERR_INVAL;
  if (rank < 0 || rank >= e->cfg.size) return ERDMA_ERR_RANK;
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&e->mu);
  peer_info *p = &e->peers[rank];
  for (int k = 0; k < e->lanes_max; k++) {
    erdma_conn *c = peer_conn(p, k);
    if (!c || !c->q || c->closed) continue;
    ngtcp2_conn_stat cs;
    erdma_quic_stat(c->q, &cs);
    out->connections++;
    if (k == 0) {
      out->srtt_us = cs.smoothed_rtt / 1000.0;
      out->min_rtt_us = cs.min_rtt == UINT64_MAX ? 0.0 : cs.min_rtt / 1000.0;
      out->rttvar_us = cs.rttvar / 1000.0;
    }
    out->cwnd += cs.cwnd;
    out->bytes_in_flight += cs.bytes_in_flight;
    out->pto_count += cs.pto_count;
    /* packets with STREAM frames declared lost (and so resent), ours only */
    if (c->stream_id >= 0)
      out->lost_packets += erdma_quic_stream_loss(c->q, c->stream_id);
    for (int j = 0; j < c->nds; j++)
      out->lost_packets += erdma_quic_stream_loss(c->q, c->ds[j].id);
    out->delivery_rate_bps += (double)cs.delivery_rate_sec * 8.0;
  }
  out->lost = p->error != 0;
  pthread_mutex_unlock(&e->mu);
  return 0;
}
