// test-sources: ext/src/erdma_quic.c ext/src/erdma_tls.c
/* erdma_quic.c (one QUIC connection, sans-I/O) with two endpoints joined in
 * memory, as aioquic's test_connection.py joins two QuicConnections: the
 * real ngtcp2 and GnuTLS with the certificates erdma_tls.c makes for
 * ranks, no sockets, and a virtual clock that jumps to the next event (a
 * datagram's arrival or a connection's timer).  The wire delays every
 * datagram by DELAY and may drop some by a fixed pattern or limit the
 * client's direction to a rate (a bottleneck with an unbounded queue); an
 * endpoint may fall silent or move to another address. */
#include <arpa/inet.h>
#include <stdint.h>

#include <ngtcp2/ngtcp2.h>

#include "ctest.h"
#include "erdma_quic.h"
#include "erdma_tls.h"

#define PKT 1452                      /* packet size (an Internet path's) */
#define DELAY (5 * NGTCP2_MILLISECONDS) /* one way */
#define IDLE (1 * NGTCP2_SECONDS)

/* ---- the wire: datagrams in flight, in order of arrival ---- */
typedef struct dgram {
  struct dgram *next;
  int to;                    /* endpoint index */
  uint64_t at;               /* arrival time */
  struct sockaddr_storage from;
  socklen_t fromlen;
  size_t len;
  uint8_t data[];
} dgram;

typedef struct ep {
  int idx;
  erdma_quic *q;
  int client;
  struct sockaddr_storage addr; /* where its datagrams come from */
  socklen_t addrlen;
  gnutls_certificate_credentials_t cred;
  gnutls_priority_t prio;
  char fp[65];
  uint8_t burst[ERDMA_QUIC_MAX_BURST][PKT];
  /* what it sends: one stream, tx_len bytes of tx_data */
  int64_t sid;
  const uint8_t *tx_data;
  uint64_t tx_len, tx_off, tx_acked;
  /* what it received on the peer's stream */
  uint8_t *rx;
  uint64_t rx_len, rx_cap;
  int rx_out_of_order;
  /* events */
  int verified, verify_ok, handshake, closed, closed_rv, paths;
  uint64_t authentic;        /* datagrams erdma_quic_read called authentic */
  uint64_t closed_at, last_rx_at;
  struct sockaddr_storage path; /* the last path_changed address */
  int mute;                     /* fell silent: reads nothing, writes nothing */
} ep;

static struct {
  uint64_t now, origin;
  ep e[2];                   /* 0: client, 1: server */
  dgram *head, *tail;
  uint64_t sent, dropped;
  int drop_every;            /* drop datagram k when k % drop_every == drop_every / 2 */
  int corrupt_next;          /* flip a byte in the next datagrams (count) */
  /* the connections' congestion control and pacing (params) */
  int cc_algo, pace;
  uint64_t max_pacing_rate;
  /* the client's bursts: when, how many bytes, BBR's pacing rate then */
  uint64_t *burst_at, *burst_bytes;
  double *burst_rate;
  size_t nbursts, burst_cap;
  /* the client -> server bottleneck: bytes per second (0: none), when it is
   * free again, and the client's bytes sent per RATE_BIN of time */
  uint64_t rate, link_free;
  uint64_t sent_bins[4096];
} W;

#define RATE_BIN (5 * NGTCP2_MILLISECONDS)

static void addr4(struct sockaddr_storage *a, socklen_t *len, const char *ip, int port) {
  struct sockaddr_in *s = (struct sockaddr_in *)a;
  memset(a, 0, sizeof *a);
  s->sin_family = AF_INET;
  s->sin_port = htons((uint16_t)port);
  inet_pton(AF_INET, ip, &s->sin_addr);
  *len = sizeof *s;
}

static void wire_put(int to, const struct sockaddr_storage *from, socklen_t fromlen,
                     const uint8_t *d, size_t n) {
  uint64_t k = W.sent++;
  if (W.drop_every && k % (uint64_t)W.drop_every == (uint64_t)W.drop_every / 2) {
    W.dropped++;
    return;
  }
  dgram *g = malloc(sizeof *g + n);
  g->next = NULL;
  g->to = to;
  g->at = W.now + DELAY;
  if (to == 1) {
    uint64_t bin = (W.now - W.origin) / RATE_BIN;
    if (bin < sizeof W.sent_bins / sizeof W.sent_bins[0]) W.sent_bins[bin] += n;
  }
  if (to == 1 && W.rate) { /* serialised behind what the bottleneck still holds */
    uint64_t start = W.link_free > W.now ? W.link_free : W.now;
    W.link_free = start + n * NGTCP2_SECONDS / W.rate;
    g->at = W.link_free + DELAY;
  }
  memcpy(&g->from, from, fromlen);
  g->fromlen = fromlen;
  g->len = n;
  memcpy(g->data, d, n);
  if (!W.tail || W.tail->at <= g->at) { /* in order of arrival */
    if (W.tail) W.tail->next = g; else W.head = g;
    W.tail = g;
    return;
  }
  dgram **pp = &W.head;
  while (*pp && (*pp)->at <= g->at) pp = &(*pp)->next;
  g->next = *pp;
  *pp = g;
}

static void wire_clear(void) {
  while (W.head) {
    dgram *g = W.head;
    W.head = g->next;
    free(g);
  }
  W.tail = NULL;
}

/* ---- the endpoint's callbacks ---- */
static uint8_t *cb_tx_buf(void *user, int i, int want, size_t *room) {
  ep *p = user;
  (void)want;
  *room = PKT;
  return p->burst[i];
}

static void note_burst(ep *p, const size_t *lens, int n) {
  if (p->idx != 0 || !W.burst_cap || W.nbursts == W.burst_cap || n == 0) return;
  ngtcp2_conn_stat cs;
  erdma_quic_stat(p->q, &cs);
  uint64_t bytes = 0;
  for (int i = 0; i < n; i++) bytes += lens[i];
  W.burst_at[W.nbursts] = W.now;
  W.burst_bytes[W.nbursts] = bytes;
  W.burst_rate[W.nbursts++] = cs.pacing_rate;
}

static void cb_tx_send(void *user, size_t *lens, int n) {
  ep *p = user;
  if (p->mute) return;
  note_burst(p, lens, n);
  for (int i = 0; i < n; i++) wire_put(1 - p->idx, &p->addr, p->addrlen, p->burst[i], lens[i]);
}

static size_t cb_tx_pull(void *user, const int64_t *blocked, int nblocked, int64_t *sid,
                         ngtcp2_vec *iov, size_t maxiov) {
  ep *p = user;
  (void)maxiov;
  *sid = -1;
  if (p->sid < 0 || p->tx_off >= p->tx_len) return 0;
  for (int i = 0; i < nblocked; i++)
    if (blocked[i] == p->sid) return 0;
  *sid = p->sid;
  iov[0].base = (uint8_t *)p->tx_data + p->tx_off;
  iov[0].len = p->tx_len - p->tx_off;
  return 1;
}

static void cb_tx_wrote(void *user, int64_t sid, uint64_t n) {
  ep *p = user;
  if (sid == p->sid) p->tx_off += n;
}

static int cb_verify(void *user, const char *fp) {
  ep *p = user;
  p->verified++;
  p->verify_ok = strcmp(fp, W.e[1 - p->idx].fp) == 0;
  return p->verify_ok ? 0 : -1;
}

static int cb_handshake(void *user) {
  ep *p = user;
  p->handshake = 1;
  return 0;
}

static int cb_stream_data(void *user, int64_t sid, const uint8_t *data, size_t len, int fin) {
  ep *p = user;
  (void)sid;
  (void)fin;
  if (p->rx_len + len > p->rx_cap) {
    p->rx_cap = (p->rx_len + len) * 2;
    p->rx = realloc(p->rx, p->rx_cap);
  }
  memcpy(p->rx + p->rx_len, data, len);
  p->rx_len += len;
  /* consumed at once: the peer gets the credit back */
  erdma_quic_extend_offset(p->q, len);
  erdma_quic_extend_stream_offset(p->q, sid, len);
  return 0;
}

static void cb_stream_acked(void *user, int64_t sid, uint64_t offset, uint64_t len) {
  ep *p = user;
  if (sid == p->sid && offset + len > p->tx_acked) p->tx_acked = offset + len;
}

static void cb_path(void *user, const struct sockaddr_storage *a, socklen_t alen) {
  ep *p = user;
  memcpy(&p->path, a, alen);
  p->paths++;
}

static void cb_closed(void *user, int rv) {
  ep *p = user;
  p->closed++;
  p->closed_rv = rv;
  p->closed_at = W.now;
}

static const erdma_quic_callbacks CB = {
    .tx_buf = cb_tx_buf,
    .tx_send = cb_tx_send,
    .tx_pull = cb_tx_pull,
    .tx_wrote = cb_tx_wrote,
    .verify_peer = cb_verify,
    .handshake_done = cb_handshake,
    .stream_data = cb_stream_data,
    .stream_acked = cb_stream_acked,
    .path_changed = cb_path,
    .closed = cb_closed,
};

static void params(ep *p, erdma_quic_params *q) {
  ep *o = &W.e[1 - p->idx];
  memset(q, 0, sizeof *q);
  q->cc_algo = W.cc_algo;
  q->pace = W.pace;
  q->max_pacing_rate = W.max_pacing_rate;
  q->max_udp_payload = PKT;
  q->conn_window = 1u << 20;
  q->stream_window = 1u << 20;
  q->max_conn_window = 8u << 20;
  q->max_stream_window = 8u << 20;
  q->handshake_timeout = 10 * NGTCP2_SECONDS;
  q->idle_timeout = IDLE;
  q->cid_tag = (uint32_t)p->idx;
  q->dcid_tag = (uint32_t)o->idx;
  q->local = &p->addr;
  q->local_len = p->addrlen;
  q->remote = &o->addr;
  q->remote_len = o->addrlen;
  q->cred = p->cred;
  q->prio = p->prio;
  q->require_cert = 1;
  q->alpn = ERDMA_ALPN;
}

/* ---- the world ---- */
static void world_new(void) {
  memset(&W, 0, sizeof W);
  W.now = W.origin = 1000 * NGTCP2_SECONDS; /* any origin */
  W.cc_algo = NGTCP2_CC_ALGO_CUBIC;
  for (int i = 0; i < 2; i++) {
    ep *p = &W.e[i];
    p->idx = i;
    p->client = i == 0;
    p->sid = -1;
    addr4(&p->addr, &p->addrlen, i ? "10.0.0.2" : "10.0.0.1", i ? 2000 : 1000);
    if (tls_identity_make(i, &p->cred, &p->prio, p->fp) != 0) abort();
  }
}

static void world_free(void) {
  wire_clear();
  for (int i = 0; i < 2; i++) {
    ep *p = &W.e[i];
    erdma_quic_del(p->q);
    gnutls_certificate_free_credentials(p->cred);
    gnutls_priority_deinit(p->prio);
    free(p->rx);
  }
}

static int client_start(void) {
  erdma_quic_params q;
  params(&W.e[0], &q);
  return erdma_quic_client_new(&W.e[0].q, &q, &CB, &W.e[0], W.now);
}

static void deliver(dgram *g) {
  ep *p = &W.e[g->to];
  if (p->mute) return;
  if (W.corrupt_next > 0) {
    W.corrupt_next--;
    g->data[g->len / 2] ^= 0x5a;
  }
  if (!p->q && !p->client) { /* the server: a connection for an Initial */
    erdma_quic_initial ini;
    erdma_quic_params q;
    if (erdma_quic_accept(&ini, g->data, g->len) != 0) return;
    params(p, &q);
    q.remote = &g->from;
    q.remote_len = g->fromlen;
    q.cid_tag = erdma_quic_initial_tag(&ini);
    if (erdma_quic_server_new(&p->q, &q, &CB, p, &ini, W.now) != 0) return;
  }
  if (!p->q) return;
  p->last_rx_at = W.now;
  int auth = 0;
  erdma_quic_read(p->q, g->data, g->len, &g->from, g->fromlen, W.now, &auth);
  p->authentic += auth;
}

static void flush(ep *p) {
  int more = ERDMA_QUIC_MORE_NOW;
  for (int i = 0; i < 10000 && more == ERDMA_QUIC_MORE_NOW && p->q && !p->mute; i++)
    if (erdma_quic_flush(p->q, W.now, &more) != 0) break;
}

/* What is due now: datagrams that have arrived, timers, writes. */
static void process(void) {
  while (W.head && W.head->at <= W.now) {
    dgram *g = W.head;
    W.head = g->next;
    if (!W.head) W.tail = NULL;
    deliver(g);
    free(g);
  }
  for (int i = 0; i < 2; i++) {
    ep *p = &W.e[i];
    if (!p->q || p->mute) continue;
    erdma_quic_handle_expiry(p->q, W.now);
    flush(p);
  }
}

/* The clock jumps to the next event: an arrival or a timer. */
static void advance(void) {
  uint64_t next = W.head ? W.head->at : UINT64_MAX;
  for (int i = 0; i < 2; i++)
    if (W.e[i].q && !W.e[i].mute && erdma_quic_expiry(W.e[i].q) < next)
      next = erdma_quic_expiry(W.e[i].q);
  W.now = next > W.now ? next : W.now + 1000; /* (a timer due now: 1 us on) */
}

/* Until done() holds (1), or for `limit` of virtual time (0). */
static int run_until(int (*done)(void), uint64_t limit) {
  uint64_t end = W.now + limit;
  for (;;) {
    process();
    if (done()) return 1;
    if (W.now >= end) return 0;
    advance();
  }
}

static int both_handshaken(void) { return W.e[0].handshake && W.e[1].handshake; }
static int client_open(void) {
  /* the client opens its stream once the handshake is done */
  if (W.e[0].handshake && W.e[0].sid < 0) erdma_quic_open_bidi(W.e[0].q, &W.e[0].sid);
  return W.e[0].sid >= 0;
}
static int all_acked(void) { return W.e[0].tx_acked >= W.e[0].tx_len; }
static int client_closed(void) { return W.e[0].closed > 0; }
static int server_closed(void) { return W.e[1].closed > 0; }

static uint8_t *pattern(uint64_t n, uint64_t seed) {
  uint8_t *b = malloc(n);
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (uint64_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b[i] = (uint8_t)x;
  }
  return b;
}

/* handshake, then the client sends n bytes on its stream until all acked */
static int transfer(uint64_t n, uint64_t limit, uint8_t **data) {
  *data = pattern(n, n);
  if (!run_until(both_handshaken, 5 * NGTCP2_SECONDS)) return -1;
  if (!client_open()) return -2;
  W.e[0].tx_data = *data;
  W.e[0].tx_len = n;
  if (!run_until(all_acked, limit)) return -3;
  return 0;
}

/* ---- the tests ---- */
TEST(handshake) {
  world_new();
  CHECK_EQ(client_start(), 0);
  int ok = run_until(both_handshaken, 5 * NGTCP2_SECONDS);
  CHECK(ok);
  /* each side saw the other's certificate, as erdma_tls.c makes them */
  CHECK_EQ(W.e[0].verified, 1);
  CHECK(W.e[0].verify_ok);
  CHECK_EQ(W.e[1].verified, 1);
  CHECK(W.e[1].verify_ok);
  char fp[65];
  CHECK_EQ(erdma_quic_peer_fingerprint(W.e[0].q, fp), 0);
  CHECK_STR(fp, W.e[1].fp);
  CHECK(erdma_quic_handshake_done(W.e[0].q) && erdma_quic_handshake_done(W.e[1].q));
  /* a few round trips of virtual time, none of it real */
  CHECK(W.now - 1000 * NGTCP2_SECONDS < 100 * NGTCP2_MILLISECONDS);
  CHECK_EQ(W.e[0].closed + W.e[1].closed, 0);
  world_free();
}

TEST(refused_certificate) {
  world_new();
  /* the server expects another identity: the client's is refused */
  W.e[0].fp[0] ^= 1;
  CHECK_EQ(client_start(), 0);
  run_until(client_closed, 5 * NGTCP2_SECONDS);
  CHECK_EQ(W.e[1].verified, 1);
  CHECK(!W.e[1].verify_ok);
  CHECK(!W.e[0].handshake || !W.e[1].handshake);
  CHECK(W.e[1].closed || W.e[0].closed);
  world_free();
}

TEST(bulk_in_order) {
  uint8_t *data;
  uint64_t n = 6u << 20;
  world_new();
  CHECK_EQ(client_start(), 0);
  int rv = transfer(n, 60 * NGTCP2_SECONDS, &data);
  CHECK_EQ(rv, 0);
  CHECK_EQ(W.e[1].rx_len, n);
  CHECK_MEM(W.e[1].rx, data, n);
  CHECK_EQ(W.dropped, 0);
  ngtcp2_conn_stat cs;
  erdma_quic_stat(W.e[0].q, &cs);
  CHECK(cs.smoothed_rtt >= 2 * DELAY); /* the wire's round trip, in virtual time */
  CHECK_EQ(erdma_quic_stream_loss(W.e[0].q, W.e[0].sid), 0);
  CHECK_EQ(W.e[0].closed + W.e[1].closed, 0);
  /* 1-RTT packets from the address each side sends to */
  CHECK(W.e[1].authentic > (n / PKT) / 2);
  CHECK(W.e[0].authentic > 0);
  free(data);
  world_free();
}

TEST(lossy_wire) {
  uint8_t *data;
  uint64_t n = 3u << 20;
  world_new();
  W.drop_every = 9; /* one datagram in 9, either way, from the first on */
  CHECK_EQ(client_start(), 0);
  int rv = transfer(n, 120 * NGTCP2_SECONDS, &data);
  CHECK_EQ(rv, 0);
  CHECK(W.dropped > 100);
  CHECK_EQ(W.e[1].rx_len, n);
  CHECK_MEM(W.e[1].rx, data, n);
  /* what was lost was sent again, driven by the timers (handle_expiry) */
  CHECK(erdma_quic_stream_loss(W.e[0].q, W.e[0].sid) > 0);
  CHECK_EQ(W.e[0].closed + W.e[1].closed, 0);
  free(data);
  world_free();
}

TEST(silent_peer_idle_timeout) {
  uint8_t *data;
  world_new();
  CHECK_EQ(client_start(), 0);
  CHECK_EQ(transfer(100000, 10 * NGTCP2_SECONDS, &data), 0);
  /* the server stops answering while the client has data in flight */
  W.e[1].mute = 1;
  static uint8_t more[200000];
  W.e[0].tx_data = more;
  W.e[0].tx_len = sizeof more;
  W.e[0].tx_off = 0;
  W.e[0].tx_acked = 0;
  /* (the stream's offsets go on: a new stream for the new bytes) */
  CHECK_EQ(erdma_quic_open_bidi(W.e[0].q, &W.e[0].sid), 0);
  uint64_t silent_from = W.e[0].last_rx_at;
  int ok = run_until(client_closed, 30 * NGTCP2_SECONDS);
  CHECK(ok);
  CHECK_EQ(W.e[0].closed, 1);
  CHECK_EQ(W.e[0].closed_rv, NGTCP2_ERR_IDLE_CLOSE);
  /* after the idle timeout (at least; ngtcp2 takes 3 PTOs if longer) */
  CHECK(W.e[0].closed_at - silent_from >= IDLE);
  CHECK(W.e[0].closed_at - silent_from < IDLE + 2 * NGTCP2_SECONDS);
  CHECK(erdma_quic_is_closed(W.e[0].q));
  CHECK_EQ(erdma_quic_expiry(W.e[0].q), UINT64_MAX);
  /* once closed: no more reads or writes */
  CHECK_EQ(erdma_quic_read(W.e[0].q, data, 100, &W.e[1].addr, W.e[1].addrlen, W.now, NULL),
           ERDMA_QUIC_ERR_CLOSED);
  free(data);
  world_free();
}

TEST(close_reaches_peer) {
  uint8_t *data;
  world_new();
  CHECK_EQ(client_start(), 0);
  CHECK_EQ(transfer(10000, 10 * NGTCP2_SECONDS, &data), 0);
  erdma_quic_close(W.e[0].q, 0, W.now); /* CONNECTION_CLOSE, no `closed` callback */
  CHECK(erdma_quic_is_closed(W.e[0].q));
  int ok = run_until(server_closed, 5 * NGTCP2_SECONDS);
  CHECK(ok);
  CHECK_EQ(W.e[1].closed_rv, NGTCP2_ERR_DRAINING);
  CHECK_EQ(W.e[0].closed, 0);
  free(data);
  world_free();
}

TEST(garbage_rejected) {
  uint8_t *data;
  world_new();
  CHECK_EQ(client_start(), 0);
  CHECK_EQ(transfer(50000, 10 * NGTCP2_SECONDS, &data), 0);
  uint8_t junk[1400];
  for (int round = 0; round < 200; round++) {
    uint8_t *r = pattern(sizeof junk, 77 + (uint64_t)round);
    memcpy(junk, r, sizeof junk);
    free(r);
    size_t n = 1 + (size_t)round * 7 % sizeof junk;
    if (round % 3 == 0) junk[0] &= 0x7f;      /* a short header */
    else if (round % 3 == 1) junk[0] |= 0xc0; /* a long header */
    /* to both ends, from the peer's address */
    for (int i = 0; i < 2; i++) {
      int auth = 1;
      erdma_quic_read(W.e[i].q, junk, n, &W.e[1 - i].addr, W.e[1 - i].addrlen, W.now, &auth);
      CHECK_EQ(auth, 0);
    }
    /* a connection-less server would not take it either (except a valid
     * Initial, which random bytes are not) */
    erdma_quic_initial ini;
    CHECK(erdma_quic_accept(&ini, junk, n) != 0);
  }
  /* an empty datagram */
  CHECK_EQ(erdma_quic_read(W.e[1].q, junk, 0, &W.e[0].addr, W.e[0].addrlen, W.now, NULL), 0);
  CHECK_EQ(W.e[0].closed + W.e[1].closed, 0);
  /* datagrams of the connection with a byte flipped fail authentication */
  W.corrupt_next = 20;
  uint8_t *more = pattern(200000, 5);
  W.e[0].tx_data = more;
  W.e[0].tx_len = 200000;
  W.e[0].tx_off = W.e[0].tx_acked = 0;
  W.e[1].rx_len = 0;
  CHECK_EQ(erdma_quic_open_bidi(W.e[0].q, &W.e[0].sid), 0);
  int ok = run_until(all_acked, 20 * NGTCP2_SECONDS);
  CHECK(ok);
  CHECK_EQ(W.corrupt_next, 0);
  CHECK_EQ(W.e[1].rx_len, 200000);
  CHECK_MEM(W.e[1].rx, more, 200000);
  CHECK_EQ(W.e[0].closed + W.e[1].closed, 0);
  free(more);
  free(data);
  world_free();
}

TEST(client_address_change) {
  uint8_t *data;
  world_new();
  CHECK_EQ(client_start(), 0);
  CHECK_EQ(transfer(100000, 10 * NGTCP2_SECONDS, &data), 0);
  CHECK_EQ(W.e[1].paths, 0);
  /* the client's NAT gives it a new external port: the server validates
   * the new path and moves there (path_changed) */
  addr4(&W.e[0].addr, &W.e[0].addrlen, "10.0.0.1", 1001);
  uint8_t *more = pattern(300000, 9);
  W.e[0].tx_data = more;
  W.e[0].tx_len = 300000;
  W.e[0].tx_off = W.e[0].tx_acked = 0;
  W.e[1].rx_len = 0;
  CHECK_EQ(erdma_quic_open_bidi(W.e[0].q, &W.e[0].sid), 0);
  int ok = run_until(all_acked, 20 * NGTCP2_SECONDS);
  CHECK(ok);
  CHECK_EQ(W.e[1].rx_len, 300000);
  CHECK_MEM(W.e[1].rx, more, 300000);
  CHECK(W.e[1].paths >= 1);
  CHECK_EQ(ntohs(((struct sockaddr_in *)&W.e[1].path)->sin_port), 1001);
  free(more);
  free(data);
  world_free();
}

TEST(server_address_change) {
  uint8_t *data;
  world_new();
  CHECK_EQ(client_start(), 0);
  CHECK_EQ(transfer(100000, 10 * NGTCP2_SECONDS, &data), 0);
  /* the server's packets now come from another port (its NAT rebound):
   * the client moves its send address once one decrypts */
  addr4(&W.e[1].addr, &W.e[1].addrlen, "10.0.0.2", 2002);
  uint8_t *more = pattern(100000, 11);
  W.e[0].tx_data = more;
  W.e[0].tx_len = 100000;
  W.e[0].tx_off = W.e[0].tx_acked = 0;
  W.e[1].rx_len = 0;
  CHECK_EQ(erdma_quic_open_bidi(W.e[0].q, &W.e[0].sid), 0);
  int ok = run_until(all_acked, 20 * NGTCP2_SECONDS);
  CHECK(ok);
  CHECK_EQ(W.e[0].paths, 1);
  CHECK_EQ(ntohs(((struct sockaddr_in *)&W.e[0].path)->sin_port), 2002);
  free(more);
  free(data);
  world_free();
}

TEST(retry_token) {
  /* a server that asks for address validation: the first Initial gets a
   * Retry, the second carries its token, which verifies for the client's
   * address only */
  uint8_t secret[32] = {1, 2, 3};
  world_new();
  CHECK_EQ(client_start(), 0);
  flush(&W.e[0]);
  CHECK(W.head != NULL);
  dgram *g = W.head;
  W.head = g->next;
  if (!W.head) W.tail = NULL;
  erdma_quic_initial ini;
  CHECK_EQ(erdma_quic_accept(&ini, g->data, g->len), 0);
  CHECK(!erdma_quic_has_retry_token(&ini));
  CHECK_EQ(erdma_quic_initial_tag(&ini), 1); /* the client named endpoint 1 */
  uint8_t buf[PKT];
  ngtcp2_ssize n = erdma_quic_write_retry(buf, sizeof buf, &ini, secret, sizeof secret,
                                          &g->from, g->fromlen, W.now);
  free(g);
  CHECK(n > 0);
  wire_clear();
  W.now += DELAY;
  CHECK_EQ(erdma_quic_read(W.e[0].q, buf, (size_t)n, &W.e[1].addr, W.e[1].addrlen, W.now, NULL),
           0);
  flush(&W.e[0]);
  CHECK(W.head != NULL);
  g = W.head;
  W.head = g->next;
  if (!W.head) W.tail = NULL;
  CHECK_EQ(erdma_quic_accept(&ini, g->data, g->len), 0);
  CHECK(erdma_quic_has_retry_token(&ini));
  /* from another address the token is refused; stale too */
  struct sockaddr_storage other;
  socklen_t olen;
  addr4(&other, &olen, "10.9.9.9", 1000);
  erdma_quic_initial copy = ini;
  CHECK(erdma_quic_verify_retry(&copy, secret, sizeof secret, &other, olen,
                                10 * NGTCP2_SECONDS, W.now) != 0);
  copy = ini;
  CHECK(erdma_quic_verify_retry(&copy, secret, sizeof secret, &g->from, g->fromlen,
                                10 * NGTCP2_SECONDS, W.now + 60 * NGTCP2_SECONDS) != 0);
  CHECK_EQ(erdma_quic_verify_retry(&ini, secret, sizeof secret, &g->from, g->fromlen,
                                   10 * NGTCP2_SECONDS, W.now), 0);
  CHECK(ini.validated);
  /* the server's connection for the validated Initial completes */
  erdma_quic_params q;
  params(&W.e[1], &q);
  q.cid_tag = erdma_quic_initial_tag(&ini);
  CHECK_EQ(erdma_quic_server_new(&W.e[1].q, &q, &CB, &W.e[1], &ini, W.now), 0);
  CHECK_EQ(erdma_quic_read(W.e[1].q, g->data, g->len, &g->from, g->fromlen, W.now, NULL), 0);
  free(g);
  int ok = run_until(both_handshaken, 5 * NGTCP2_SECONDS);
  CHECK(ok);
  world_free();
}

/* Let `d` of virtual time pass (timers due within it run). */
static void idle_for(uint64_t d) {
  uint64_t end = W.now + d;
  while (W.now < end) {
    process();
    advance();
    if (W.now > end) W.now = end;
  }
  process();
}

/* The most the client sent in any RATE_BIN, as bytes per second. */
static double peak_send_rate(void) {
  uint64_t top = 0;
  for (size_t i = 0; i < sizeof W.sent_bins / sizeof W.sent_bins[0]; i++)
    if (W.sent_bins[i] > top) top = W.sent_bins[i];
  return (double)top * NGTCP2_SECONDS / RATE_BIN;
}

/* BBR over a 100 Mbit/s bottleneck, in bursts with idle gaps between them
 * (as a training step's gradients), paced by erdma_quic or not: how many
 * bursts left sooner after the one before than its bytes take at BBR's
 * pacing rate, the peak send rate, and the time taken */
static void bursts_over_bottleneck(int *failed_, int pace, uint64_t cap, size_t *early,
                                   size_t *bursts, double *peak, uint64_t *took) {
  enum { BURST = 1u << 20, BURSTS = 8, MAXB = 100000 };
  uint8_t *data = pattern(BURSTS * BURST, 7);
  world_new();
  W.cc_algo = NGTCP2_CC_ALGO_BBR;
  W.pace = pace;
  W.max_pacing_rate = cap;
  W.rate = 12500000;
  W.burst_cap = MAXB;
  W.burst_at = calloc(MAXB, sizeof *W.burst_at);
  W.burst_bytes = calloc(MAXB, sizeof *W.burst_bytes);
  W.burst_rate = calloc(MAXB, sizeof *W.burst_rate);
  CHECK_EQ(client_start(), 0);
  CHECK(run_until(both_handshaken, 5 * NGTCP2_SECONDS));
  CHECK(client_open());
  W.e[0].tx_data = data;
  uint64_t t0 = W.now;
  size_t first = W.nbursts;
  for (int b = 1; b <= BURSTS; b++) { /* one more MiB on the stream, then idle */
    W.e[0].tx_len = (uint64_t)b * BURST;
    CHECK(run_until(all_acked, 20 * NGTCP2_SECONDS));
    idle_for(100 * NGTCP2_MILLISECONDS);
  }
  *took = W.now - t0;
  *peak = peak_send_rate();
  *early = 0;
  for (size_t i = first + 1; i < W.nbursts; i++) {
    double rate = W.burst_rate[i - 1];
    if (rate > 0 && W.burst_at[i] + 1000 < W.burst_at[i - 1] + W.burst_bytes[i - 1] / rate)
      (*early)++;
  }
  *bursts = W.nbursts - first;
  CHECK(W.nbursts < MAXB);
  CHECK_EQ(W.e[1].rx_len, (uint64_t)BURSTS * BURST);
  CHECK_MEM(W.e[1].rx, data, (uint64_t)BURSTS * BURST);
  CHECK_EQ(W.e[0].closed + W.e[1].closed, 0);
  free(data);
  free(W.burst_at);
  free(W.burst_bytes);
  free(W.burst_rate);
  world_free();
}

TEST(bbr_bursts_keep_to_the_pacing_rate) {
  size_t early_off, early_on, n_off, n_on;
  double peak_off, peak_on;
  uint64_t took_off, took_on;
  bursts_over_bottleneck(failed_, 0, 0, &early_off, &n_off, &peak_off, &took_off);
  if (*failed_) return;
  bursts_over_bottleneck(failed_, 1, 0, &early_on, &n_on, &peak_on, &took_on);
  if (*failed_) return;
  fprintf(stderr, "8 x 1 MiB over a 12.5 MB/s bottleneck: ngtcp2 alone %zu of %zu bursts "
          "ahead of BBR's pacing rate, peak %.1f MB/s, %.0f ms; paced %zu of %zu, peak "
          "%.1f MB/s, %.0f ms\n", early_off, n_off, peak_off / 1e6, took_off / 1e6,
          early_on, n_on, peak_on / 1e6, took_on / 1e6);
  CHECK_EQ(early_on, 0);         /* paced: each burst waits out the one before */
  CHECK(early_off >= n_off / 20); /* ngtcp2 alone lets bursts through back to back */
  /* without costing time: the bottleneck sets it either way */
  CHECK(took_on <= took_off + took_off / 10);
}

/* a ceiling on the pacing rate (max_pacing_rate, without params.pace): the
 * sender keeps below it, where BBR's own pacing overshoots the bottleneck */
TEST(pacing_rate_ceiling) {
  size_t early, n;
  double peak_bbr, peak_cap;
  uint64_t took_bbr, took_cap;
  bursts_over_bottleneck(failed_, 1, 0, &early, &n, &peak_bbr, &took_bbr);
  if (*failed_) return;
  bursts_over_bottleneck(failed_, 0, 10000000, &early, &n, &peak_cap, &took_cap);
  if (*failed_) return;
  fprintf(stderr, "8 x 1 MiB over a 12.5 MB/s bottleneck: BBR's pacing peak %.1f MB/s, "
          "%.0f ms; ceiling 10 MB/s peak %.1f MB/s, %.0f ms\n", peak_bbr / 1e6,
          took_bbr / 1e6, peak_cap / 1e6, took_cap / 1e6);
  CHECK(peak_bbr > 12.5e6);          /* above the bottleneck: its queue grows */
  CHECK(peak_cap <= 10e6 * 1.15);    /* 5 ms bins: within a burst of the ceiling */
  /* 8 MiB at 10 MB/s take 0.84 s; the idle gaps 0.8 s, the handshake's RTTs */
  CHECK(took_cap >= 840 * NGTCP2_MILLISECONDS);
}

CTEST_MAIN()
