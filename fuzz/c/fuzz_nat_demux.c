// fuzz-sources: ext/src/erdma_nat.c ext/src/erdma_quic.c
/* The STUN / TURN ChannelData / QUIC demultiplexer of the engine's UDP socket
 * (erdma_nat.c): nat_classify on its own, then nat_rx with its raw queue and
 * relay tunnels on an engine of four ranks, two TURN servers, an ALWAYS and a
 * FALLBACK relay.  The QUIC layer below (conn_handle_datagram) is replaced by
 * a sink that reads every byte it is given (ASan: in bounds), so one input
 * is a short conversation of datagrams, each in a buffer of its own size:
 *   [source 1 byte][length 2 bytes big-endian][datagram] ...
 * source & 3: 0 TURN server A, 1 TURN server B, 2 the fallback peer's
 * direct address, 3 a stranger.  Checked: the raw queue stays within its
 * bounds, raw_recv returns what was queued, and nothing leaks. */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "erdma_conn.h"
#include "erdma_engine.h"
#include "erdma_nat.h"
#include "erdma_shm.h"

/* ---- the engine functions erdma_nat.c calls, outside it ---- */
static uint64_t authentic;

int conn_handle_datagram(erdma_engine *e, const uint8_t *data, size_t len,
                         const struct sockaddr_storage *from, socklen_t fromlen) {
  (void)e;
  (void)from;
  if (len == 0 || fromlen == 0 || fromlen > sizeof(struct sockaddr_storage)) abort();
  volatile uint8_t sum = 0;
  for (size_t i = 0; i < len; i++) sum ^= data[i];
  if (data[0] != 0x5a) return 0;
  authentic++; /* as if it decrypted: the relay's switches */
  return 1;
}

uint64_t conn_decrypted_count(void) { return authentic; }

uint64_t erdma_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int addr_resolve(const char *host, int port, struct sockaddr_storage *out, socklen_t *len) {
  struct sockaddr_in *sin = (struct sockaddr_in *)out;
  memset(out, 0, sizeof *out);
  sin->sin_family = AF_INET;
  sin->sin_port = htons((uint16_t)port);
  if (inet_pton(AF_INET, host, &sin->sin_addr) != 1) return -1;
  *len = sizeof *sin;
  return 0;
}

void addr_format(const struct sockaddr_storage *a, char *host, size_t hostcap, int *port) {
  const struct sockaddr_in *sin = (const struct sockaddr_in *)a;
  if (host && hostcap) inet_ntop(AF_INET, &sin->sin_addr, host, (socklen_t)hostcap);
  *port = ntohs(sin->sin_port);
}

int shm_is_local(erdma_engine *e, int rank) {
  (void)e;
  (void)rank;
  return -1;
}

static void no_recv(erdma_engine *e) { (void)e; }

/* ---- the harness ---- */
#define NRANKS 4
static const char *SRC_HOST[4] = {"10.0.0.1", "10.0.0.9", "10.0.0.3", "192.0.2.7"};
static const int SRC_PORT[4] = {3478, 3479, 5001, 40000};

static erdma_engine *engine_new(void) {
  erdma_engine *e = calloc(1, sizeof *e);
  if (!e) abort();
  e->cfg.size = NRANKS;
  e->cfg.rank = 0;
  e->cfg.path_timeout = 0; /* FALLBACK trips on the first send with bytes in flight */
  e->peers = calloc(NRANKS, sizeof *e->peers);
  if (!e->peers) abort();
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cv, NULL);
  e->io.recv = no_recv;
  e->io.fd = -1;
  if (erdma_engine_add_turn_server(e, "10.0.0.1", 3478) != 0 ||
      erdma_engine_set_peer_relay(e, 1, "10.0.0.1", 3478, 0x4001, "10.0.0.2", 5000,
                                  ERDMA_RELAY_ALWAYS) != 0 ||
      erdma_engine_set_peer_relay(e, 2, "10.0.0.1", 3478, 0x4002, "10.0.0.3", 5001,
                                  ERDMA_RELAY_FALLBACK) != 0 ||
      erdma_engine_set_peer_relay(e, 3, "10.0.0.9", 3479, 0x4001, "10.0.0.4", 5002,
                                  ERDMA_RELAY_FALLBACK) != 0)
    abort();
  return e;
}

static void engine_free(erdma_engine *e) {
  nat_free(e);
  pthread_cond_destroy(&e->cv);
  pthread_mutex_destroy(&e->mu);
  free(e->peers);
  free(e);
}

int LLVMFuzzerTestOneInput(const uint8_t *in, size_t n) {
  /* the classifier alone, on the whole input as one datagram */
  uint16_t ch = 0;
  size_t plen = 0;
  for (int turn = 0; turn < 2; turn++) {
    int k = nat_classify(in, n, turn, &ch, &plen);
    if (k < NAT_QUIC || k > NAT_DROP) abort();
    if (k == NAT_DROP && n != 0) abort();
    if (k == NAT_CHANNEL) {
      if (!turn || plen + 4 > n || ch < 0x4000 || ch > 0x4FFF) abort();
    }
  }

  erdma_engine *e = engine_new();
  size_t queued = 0, queued_bytes = 0;
  while (n >= 3) {
    int src = in[0] & 3;
    size_t len = (size_t)in[1] << 8 | in[2];
    in += 3;
    n -= 3;
    if (len > n) len = n;
    uint8_t *dg = malloc(len ? len : 1); /* exactly its size: overreads show */
    if (!dg) abort();
    memcpy(dg, in, len);
    in += len;
    n -= len;
    struct sockaddr_storage from;
    socklen_t fromlen;
    if (addr_resolve(SRC_HOST[src], SRC_PORT[src], &from, &fromlen) != 0) abort();
    uint64_t raw_before = e->stats.raw_queued;
    pthread_mutex_lock(&e->mu);
    int consumed = nat_rx(e, dg, len, &from, fromlen);
    pthread_mutex_unlock(&e->mu);
    if (!consumed) conn_handle_datagram(e, dg, len, &from, fromlen); /* the caller's part */
    if (e->stats.raw_queued != raw_before) {
      queued++;
      queued_bytes += len;
    }
    /* strangers reach the raw queue only with STUN-shaped datagrams */
    if (src == 3 && e->stats.raw_queued != raw_before &&
        nat_classify(dg, len, 0, &ch, &plen) != NAT_RAW)
      abort();
    if (e->nat.raw_count > ERDMA_RAW_QUEUE_MAX || e->nat.raw_bytes > ERDMA_RAW_QUEUE_BYTES)
      abort();
    free(dg);
  }
  /* drain: what was queued comes out, truncated to a small buffer when long */
  uint8_t buf[64];
  char host[64];
  int port;
  size_t got = 0, got_bytes = 0, len;
  for (;;) {
    int rv = erdma_engine_raw_recv(e, buf, sizeof buf, &len, host, sizeof host, &port, 0);
    if (rv == ERDMA_ERR_TIMEOUT) break;
    if (rv != 0 && !(rv == ERDMA_ERR_TRUNCATE && len > sizeof buf)) abort();
    got++;
    got_bytes += len;
  }
  if (got != queued || got_bytes != queued_bytes || e->nat.raw_count || e->nat.raw_bytes) abort();
  engine_free(e);
  return 0;
}
