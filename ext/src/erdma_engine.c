/* erdma_engine.c - engine lifecycle, the UDP socket, the progress thread and
 * the public point-to-point API (erdma.h).  One mutex guards all engine
 * state; waiting threads sleep on one condition variable. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <netdb.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/udp.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <gnutls/crypto.h>

#include "erdma_engine.h"
#include "erdma_conn.h"
#include "erdma_match.h"
#include "erdma_nat.h"
#include "erdma_pktio.h"
#include "erdma_shm.h"
#include "erdma_tls.h"
#include "erdma_ulfm.h"
#include "erdma_copy.h"

uint64_t erdma_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void engine_wake(erdma_engine *e) {
  uint64_t one = 1;
  if (write(e->evfd, &one, sizeof one) < 0) { /* counter full: already awake */ }
}

/* Threads wait for requests on e->cv, or (all peers on shared memory) on the
 * futex bell of our segment (shm_wait). */
void engine_wake_waiters(erdma_engine *e) {
  pthread_cond_broadcast(&e->cv);
  shm_wake_waiters(e);
}

/* verbose >= 2: the per-peer path report every path_log_ms (1000) ms */
static uint64_t path_log_period(const erdma_engine *e) {
  return (uint64_t)(e->cfg.path_log_ms > 0 ? e->cfg.path_log_ms : 1000) * 1000000u;
}

void erdma_config_default(erdma_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->size = 1;
  cfg->bind_addr = "127.0.0.1";
  cfg->cc_algo = ERDMA_CC_AUTO;
  cfg->eager_limit = 65536;
  cfg->shm_eager_limit = 1u << 20;
  cfg->shm_p2p_split_min = 16u << 10; /* erdma_shm.c */
  cfg->idle_timeout = 60.0;
  cfg->handshake_timeout = 60.0;
  /* a real peer sends its HELLO with its first 1-RTT packet: 10 s leaves room
   * for a handshake over a lossy long path (several lost flights at 300 ms)
   * while a stranger's half-open handshake is freed soon */
  cfg->hello_timeout = 10.0;
  /* windows start at 16/32 MiB and double while a long fat path uses them
   * up, to 256 MiB per stream and 1 GiB per connection (10 Gbit/s x 100 ms
   * is 125 MB in flight); memory is only taken by data that arrives out of
   * order, so idle or small jobs pay nothing for the ceilings */
  cfg->stream_window = 16u << 20;
  cfg->conn_window = 32u << 20;
  cfg->max_stream_window = 256u << 20;
  cfg->max_conn_window = 1024u << 20;
  cfg->sock_buf = 16 << 20;
  cfg->pace = 0;
  cfg->pace_learn = 1;
  cfg->data_streams = 4;
  cfg->chunk_size = 512u << 10;
  cfg->unexpected_max = 64u << 20;
  cfg->spin_us = 50;
  cfg->keepalive = -1;     /* idle_timeout / 4 */
  cfg->path_timeout = 5.0;
  cfg->pktio = ERDMA_PKTIO_UDP;
  cfg->dpdk_prefix = 24;
  cfg->dpdk_poll_us = 200;
}

static __thread char last_error[512];

const char *erdma_last_error(void) { return last_error; }

static void set_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
}

const char *erdma_strerror(int rc) {
  switch (rc) {
  case ERDMA_OK: return "success";
  case ERDMA_ERR_INVAL: return "invalid argument";
  case ERDMA_ERR_NOMEM: return "out of memory";
  case ERDMA_ERR_TRUNCATE: return "message truncated: receive buffer too small";
  case ERDMA_ERR_TIMEOUT: return "timed out";
  case ERDMA_ERR_PEER: return "connection to peer lost";
  case ERDMA_ERR_RANK: return "invalid rank";
  case ERDMA_ERR_CANCELLED: return "request cancelled";
  case ERDMA_ERR_SOCKET: return "UDP socket error";
  case ERDMA_ERR_TLS: return "TLS error";
  case ERDMA_ERR_QUIC: return "QUIC error";
  case ERDMA_ERR_STATE: return "invalid engine state";
  case ERDMA_ERR_AUTH: return "peer authentication failed";
  case ERDMA_ERR_PKTIO: return "packet I/O backend unavailable";
  default: return "unknown error";
  }
}

int erdma_err_is_fatal(int rc) { return rc < ERDMA_ERR_FATAL; }

/* ------------------------------------------------------------ socket io */
int addr_resolve(const char *host, int port, struct sockaddr_storage *out, socklen_t *len) {
  struct addrinfo hints = {0}, *res = NULL;
  char ps[16];
  if (!host || port < 0 || port > 65535) return ERDMA_ERR_INVAL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = AI_NUMERICSERV;
  snprintf(ps, sizeof ps, "%d", port);
  if (getaddrinfo(host, ps, &hints, &res) != 0 || !res) return ERDMA_ERR_INVAL;
  memcpy(out, res->ai_addr, res->ai_addrlen);
  *len = res->ai_addrlen;
  freeaddrinfo(res);
  return 0;
}

void addr_format(const struct sockaddr_storage *a, char *host, size_t hostcap, int *port) {
  char buf[INET6_ADDRSTRLEN] = "";
  *port = 0;
  if (a->ss_family == AF_INET) {
    const struct sockaddr_in *x = (const void *)a;
    inet_ntop(AF_INET, &x->sin_addr, buf, sizeof buf);
    *port = ntohs(x->sin_port);
  } else if (a->ss_family == AF_INET6) {
    const struct sockaddr_in6 *x = (const void *)a;
    inet_ntop(AF_INET6, &x->sin6_addr, buf, sizeof buf);
    *port = ntohs(x->sin6_port);
  }
  if (host && hostcap) snprintf(host, hostcap, "%s", buf);
}

int addr_is_loopback(const struct sockaddr_storage *a) {
  if (a->ss_family == AF_INET)
    return (ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) >> 24) == 127;
  if (a->ss_family == AF_INET6)
    return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)a)->sin6_addr);
  return 0;
}

/* Packets sit in bufs at a stride of pkt_size; the packet I/O backend
 * batches them (GSO trains on kernel UDP). */
void engine_sendv(erdma_engine *e, erdma_conn *c, uint8_t *bufs, size_t *lens, int n) {
  e->stats.pkts_sent += (uint64_t)n;
  if (n && e->nat.nrelay && nat_sendv(e, c, bufs, lens, n)) return; /* through a TURN relay */
  if (!bufs) /* zero-copy: the packets are in the backend's buffers already */
    e->io.tx_commit(e, &c->remote, c->remote_len, 0, lens, n);
  else
    e->io.send(e, &c->remote, c->remote_len, bufs, e->pkt_size, lens, n);
}

/* A connection's packet size: ERDMA_MAX_UDP_PAYLOAD when set, 65000 over
 * loopback, the route MTU to a peer on a directly attached network (jumbo
 * frames, veth), 1452 otherwise (PMTUD may probe up from there); never more
 * than the buffers (e->pkt_size) or a TURN relay carries. */
size_t engine_conn_payload(erdma_engine *e, const erdma_conn *c) {
  size_t n = nat_max_udp_payload(e, c);
  if (e->cfg.max_udp_payload || !e->io.name || strcmp(e->io.name, "udp") != 0 ||
      addr_is_loopback(&c->remote))
    return n;
  size_t path = pktio_udp_path_payload(e, &c->remote, c->remote_len);
  if (path < 1500) path = 1452; /* a standard link or not on-link: as everywhere */
  if (path > n) path = n;
  if (e->cfg.verbose && path > 1452) {
    char host[INET6_ADDRSTRLEN];
    int port;
    addr_format(&c->remote, host, sizeof host, &port);
    fprintf(stderr, "erdma[%d]: %s is on a link with a larger MTU: %zu-byte packets\n",
            e->cfg.rank, host, path);
  }
  return path;
}

/* Until the handshake is done a packet buffer holds at most 1452 bytes: a
 * client pads its Initial to the whole buffer, and before the peer's
 * transport parameters (its max_udp_payload_size) arrive, a datagram larger
 * than the peer's link carries would be lost for good (a peer on the same
 * link whose MTU is smaller than ours).  Afterwards ngtcp2 keeps to the
 * peer's limit itself. */
size_t engine_write_room(erdma_engine *e, const erdma_conn *c) {
  return c->handshake_done || e->pkt_size < ERDMA_RELAY_PAYLOAD ? e->pkt_size
                                                                : ERDMA_RELAY_PAYLOAD;
}

/* Every datagram the backend receives comes through here: STUN and TURN
 * go to erdma_nat.c (relayed QUIC comes back through conn_handle_datagram),
 * the rest is QUIC (or the shared-memory doorbell).  1: it authenticated as
 * a peer's (conn_handle_datagram), so the backend may trust its headers. */
int engine_rx_datagram(erdma_engine *e, const uint8_t *data, size_t len,
                       const struct sockaddr_storage *from, socklen_t fromlen) {
  e->stats.pkts_recv++;
  if (nat_rx(e, data, len, from, fromlen)) return 0;
  return conn_handle_datagram(e, data, len, from, fromlen);
}

/* A backend without a file descriptor (io.fd < 0: DPDK) is polled.  While
 * packets flow the thread spins (ppoll with a zero timeout keeps the eventfd
 * and timers working); once nothing has moved for POLL_BUSY_NS it sleeps
 * 1, 2, 4 ... microseconds up to cfg.dpdk_poll_us, so an idle rank costs a
 * few thousand wake-ups a second instead of a core, and the first packet
 * after a quiet spell waits at most dpdk_poll_us. */
#define POLL_BUSY_NS 50000ull

static void *progress_main(void *arg) {
  erdma_engine *e = arg;
  struct pollfd pfd[2];
  int polling = e->io.fd < 0;
  uint64_t max_idle = (uint64_t)(e->cfg.dpdk_poll_us > 0 ? e->cfg.dpdk_poll_us : 200) * 1000u;
  uint64_t idle_ns = 0, busy_until = 0;
  pthread_mutex_lock(&e->mu);
  while (e->running) {
    uint64_t now = erdma_now(), exp = shm_next_wake(e, conn_next_expiry(e), now);
    uint64_t wait_ns = exp <= now ? 0 : exp - now;
    if (wait_ns > 200000000ull) wait_ns = 200000000ull;
    if (polling && wait_ns > idle_ns) wait_ns = idle_ns;
    struct timespec ts = {(time_t)(wait_ns / 1000000000ull), (long)(wait_ns % 1000000000ull)};
    pfd[0].fd = e->io.fd; /* < 0: ppoll ignores it */
    pfd[0].events = POLLIN;
    pfd[1].fd = e->evfd;
    pfd[1].events = POLLIN;
    if (shm_sleep_prepare(e)) ts.tv_sec = ts.tv_nsec = 0;
    e->wake_at = now + (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    pthread_mutex_unlock(&e->mu);
    int rv = ppoll(pfd, 2, &ts, NULL);
    pthread_mutex_lock(&e->mu);
    e->wake_at = 0; /* awake: it looks at every timer before sleeping again */
    shm_sleep_done(e);
    shm_poll(e);
    if (rv > 0 && (pfd[1].revents & POLLIN)) {
      uint64_t v;
      if (read(e->evfd, &v, sizeof v) < 0) { /* spurious */ }
    }
    uint64_t moved = e->stats.pkts_recv + e->stats.pkts_sent;
    if (polling || (rv > 0 && (pfd[0].revents & POLLIN))) e->io.recv(e);
    conn_handle_expiry_all(e);
    conn_flush_all(e);
    conn_reap_pending(e);
    if (polling) {
      now = erdma_now();
      if (e->stats.pkts_recv + e->stats.pkts_sent != moved) busy_until = now + POLL_BUSY_NS;
      if (now < busy_until) idle_ns = 0;
      else idle_ns = idle_ns ? (idle_ns * 2 < max_idle ? idle_ns * 2 : max_idle) : 1000;
    }
    if (e->cfg.verbose >= 2 && erdma_now() - e->last_log > path_log_period(e)) {
      e->last_log = erdma_now();
      conn_log_paths(e);
    }
  }
  pthread_mutex_unlock(&e->mu);
  return NULL;
}

/* Loads the DPDK backend plugin and opens the port.  The plugin stays loaded
 * for the life of the process (DPDK's EAL cannot be unloaded).  An unbound
 * kernel UDP socket stays in e->fd for the shared-memory doorbell, which
 * wakes ranks on this host that sleep on kernel sockets. */
static int pktio_dpdk_open(erdma_engine *e) {
  const char *path = e->cfg.dpdk_plugin;
  char err[400] = "";
  if (!path || !*path) {
    set_error("this build has no DPDK support: install libdpdk-dev and rebuild");
    return ERDMA_ERR_PKTIO;
  }
  if (e->local.ss_family != AF_INET) {
    set_error("the DPDK backend speaks IPv4 only: bind must be the DPDK endpoint's IPv4 address");
    return ERDMA_ERR_PKTIO;
  }
  if (!(e->plugin = dlopen(path, RTLD_NOW | RTLD_LOCAL))) {
    set_error("cannot load the DPDK backend %s: %s", path, dlerror());
    return ERDMA_ERR_PKTIO;
  }
  erdma_pktio_open_fn open_fn;
  *(void **)&open_fn = dlsym(e->plugin, ERDMA_PKTIO_DPDK_OPEN);
  if (!open_fn) {
    set_error("this build has no DPDK support: install libdpdk-dev and rebuild (%s has no %s)",
              path, ERDMA_PKTIO_DPDK_OPEN);
    return ERDMA_ERR_PKTIO;
  }
  erdma_pktio_host host = {ERDMA_PKTIO_ABI, sizeof(erdma_engine), engine_rx_datagram, err,
                           sizeof err};
  int rv = open_fn(e, &host);
  if (rv != 0) {
    set_error("%s", err[0] ? err : "the DPDK backend failed to start");
    return rv;
  }
  e->fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  return 0;
}

/* ------------------------------------------------------------ lifecycle */
static pthread_once_t copy_once = PTHREAD_ONCE_INIT;

int erdma_engine_new(const erdma_config *cfg, erdma_engine **out) {
  erdma_engine *e;
  pthread_condattr_t ca;
  if (!cfg || !out || cfg->size < 1 || cfg->rank < 0 || cfg->rank >= cfg->size)
    return ERDMA_ERR_INVAL;
  pthread_once(&copy_once, erdma_copy_calibrate);
  if (!(e = calloc(1, sizeof *e))) return ERDMA_ERR_NOMEM;
  e->cfg = *cfg;
  snprintf(e->bind_addr, sizeof e->bind_addr, "%s", cfg->bind_addr ? cfg->bind_addr : "127.0.0.1");
  e->cfg.bind_addr = e->bind_addr;
  if (e->cfg.shm_eager_limit < e->cfg.eager_limit) e->cfg.shm_eager_limit = e->cfg.eager_limit;
  if (!e->cfg.unexpected_max) e->cfg.unexpected_max = 64u << 20;
  if (!e->cfg.shm_unexpected_max) e->cfg.shm_unexpected_max = 1u << 20;
  if (e->cfg.shm_unexpected_max > e->cfg.unexpected_max)
    e->cfg.shm_unexpected_max = e->cfg.unexpected_max;
  if (!e->cfg.recv_alloc_max) {
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    e->cfg.recv_alloc_max = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 1ull << 34;
  }
  e->evfd = e->fd = e->io.fd = -1;
  e->lanes_max = 1;
  pthread_mutex_init(&e->mu, NULL);
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&e->cv, &ca);
  pthread_condattr_destroy(&ca);
  int rv = ERDMA_ERR_SOCKET;
  last_error[0] = 0;
  if (addr_resolve(e->bind_addr, cfg->port, &e->local, &e->local_len) != 0) {
    set_error("cannot resolve bind address %s", e->bind_addr);
    goto fail;
  }
  if (cfg->pktio == ERDMA_PKTIO_DPDK) {
    rv = pktio_dpdk_open(e);
  } else if (cfg->pktio == ERDMA_PKTIO_UDP) {
    rv = pktio_udp_open(e);
    if (rv) set_error("cannot open a UDP socket on %s:%d: %s", e->bind_addr, cfg->port,
                      strerror(errno));
  } else {
    set_error("unknown packet I/O backend %d", cfg->pktio);
    rv = ERDMA_ERR_INVAL;
  }
  if (rv != 0) goto fail;
  e->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  rv = ERDMA_ERR_NOMEM;
  e->txbuf = malloc((size_t)ERDMA_TX_BATCH * e->pkt_size);
  e->rxbuf = malloc((size_t)ERDMA_BATCH * 65536);
  e->peers = calloc((size_t)cfg->size, sizeof *e->peers);
  if (e->evfd < 0 || !e->txbuf || !e->rxbuf || !e->peers) goto fail;
  if ((rv = tls_identity_new(e)) != 0) goto fail;
  gnutls_rnd(GNUTLS_RND_KEY, e->token_secret, sizeof e->token_secret);
  if (cfg->trace_msgs && (rv = erdma_trace_start(e, cfg->trace_msgs)) != 0) goto fail;
  *out = e;
  return 0;
fail:
  erdma_engine_free(e);
  return rv;
}

int erdma_engine_local_addr(erdma_engine *e, char *buf, size_t len) {
  char host[INET6_ADDRSTRLEN];
  int port;
  addr_format(&e->local, host, sizeof host, &port);
  snprintf(buf, len, e->local.ss_family == AF_INET6 ? "[%s]:%d" : "%s:%d", host, port);
  return 0;
}

int erdma_engine_fingerprint(erdma_engine *e, char *buf, size_t len) {
  snprintf(buf, len, "%s", e->fingerprint);
  return 0;
}

int erdma_engine_set_peer(erdma_engine *e, int rank, const char *host, int port,
                          const char *fingerprint) {
  if (rank < 0 || rank >= e->cfg.size) return ERDMA_ERR_RANK;
  pthread_mutex_lock(&e->mu);
  peer_info *p = &e->peers[rank];
  int rv = addr_resolve(host, port, &p->addr, &p->addr_len);
  if (rv == 0 && (!fingerprint || !fingerprint[0]) && !e->cfg.insecure) {
    /* no fingerprint would let anyone claim the rank: only an engine
     * created insecure (tests, a trusted network) may do without */
    rv = ERDMA_ERR_AUTH;
  } else if (rv == 0) {
    p->known = 1;
    snprintf(p->fingerprint, sizeof p->fingerprint, "%s", fingerprint ? fingerprint : "");
  }
  pthread_mutex_unlock(&e->mu);
  return rv;
}

static int peer_ready(erdma_engine *e, int i) {
  erdma_conn *c = e->peers[i].conn;
  return c && c->handshake_done && c->hello_recv && c->stream_id >= 0;
}

static int deadline_wait(erdma_engine *e, uint64_t deadline) {
  struct timespec ts = {(time_t)(deadline / 1000000000ull), (long)(deadline % 1000000000ull)};
  return pthread_cond_timedwait(&e->cv, &e->mu, &ts);
}

static uint64_t deadline_of(double timeout) {
  return timeout < 0 ? UINT64_MAX : erdma_now() + (uint64_t)(timeout * 1e9);
}

int erdma_engine_connect(erdma_engine *e) {
  int rv = 0;
  if (e->started) return ERDMA_ERR_STATE;
  e->started = 1;
  if (e->cfg.size == 1) return 0;
  for (int i = 0; i < e->cfg.size; i++)
    if (i != e->cfg.rank && !e->peers[i].known) return ERDMA_ERR_STATE;
  e->running = 1;
  if (pthread_create(&e->thread, NULL, progress_main, e) != 0) {
    e->running = 0;
    return ERDMA_ERR_NOMEM;
  }
  pthread_mutex_lock(&e->mu);
  /* the lower rank is the server; extra lanes come up in the background */
  for (int i = 0; i < e->cfg.rank && rv == 0; i++)
    if (shm_is_local(e, i) < 0)
      for (int k = 0, n = conn_lanes_wanted(e, i); k < n && rv == 0; k++)
        rv = conn_client_new(e, i, k);
  engine_wake(e);
  uint64_t deadline = deadline_of(e->cfg.handshake_timeout);
  while (rv == 0) {
    int missing = -1;
    int att = e->shm.seg ? shm_attach_peers(e) : 0;
    if (att < 0) rv = att; /* out of memory, or a segment refused (AUTH) */
    for (int i = 0; i < e->cfg.size && missing < 0; i++) {
      if (i == e->cfg.rank) continue;
      if (e->peers[i].error) rv = ERDMA_ERR_PEER;
      else if (!peer_ready(e, i)) missing = i;
    }
    if (missing < 0 || rv) break;
    if (erdma_now() >= deadline) {
      fprintf(stderr, "erdma[%d]: no QUIC connection to rank %d after %.0f s\n", e->cfg.rank,
              missing, e->cfg.handshake_timeout);
      rv = ERDMA_ERR_TIMEOUT;
      break;
    }
    deadline_wait(e, erdma_now() + 50000000ull < deadline ? erdma_now() + 50000000ull : deadline);
  }
  pthread_mutex_unlock(&e->mu);
  return rv;
}

int erdma_engine_shutdown(erdma_engine *e, double timeout) {
  if (!e->running) return 0;
  pthread_mutex_lock(&e->mu);
  e->stopping = 1;
  uint64_t deadline = deadline_of(timeout);
  int rv = 0;
  for (;;) {
    int busy = 0;
    erdma_conn *c;
    FOR_PEER_CONNS(e, i, k, c) busy |= !c->closed && !conn_tx_idle(c);
    for (int i = 0; i < e->cfg.size; i++) /* chunks not yet on a lane */
      busy |= e->peers[i].lazy_head && !e->peers[i].error;
    if (!busy) break;
    if (erdma_now() >= deadline) {
      rv = ERDMA_ERR_TIMEOUT;
      break;
    }
    engine_wake(e);
    deadline_wait(e, erdma_now() + 20000000ull);
  }
  /* Let delayed ACKs go out before the close: a peer still waiting for
   * them (its sends complete on acknowledgment) would otherwise see the
   * CONNECTION_CLOSE first and fail those sends, although their data
   * arrived.  Nothing else (a barrier's messages) has to carry them on a
   * lane, which only carries payload.  ngtcp2 sends a delayed ACK within
   * max_ack_delay; the progress thread runs its timers meanwhile. */
  int quic = 0;
  for (int i = 0; i < e->cfg.size; i++)
    quic |= e->peers[i].conn && !e->peers[i].conn->shm && !e->peers[i].conn->closed;
  uint64_t linger = erdma_now() + 2 * NGTCP2_DEFAULT_MAX_ACK_DELAY;
  if (linger > deadline) linger = deadline;
  while (quic && erdma_now() < linger) {
    engine_wake(e);
    deadline_wait(e, linger);
  }
  erdma_conn *c;
  FOR_PEER_CONNS(e, i, k, c) conn_close(c, 1);
  e->running = 0;
  engine_wake(e);
  pthread_mutex_unlock(&e->mu);
  pthread_join(e->thread, NULL);
  pthread_mutex_lock(&e->mu); /* a waiter may still be spinning on the rings */
  if (e->cfg.verbose && e->io.report) e->io.report(e);
  shm_teardown(e);
  pthread_mutex_unlock(&e->mu);
  return rv;
}

void erdma_engine_free(erdma_engine *e) {
  if (!e) return;
  if (e->running) erdma_engine_shutdown(e, 1.0);
  pthread_mutex_lock(&e->mu);
  e->stopping = 1;
  if (e->peers)
    for (int i = 0; i < e->cfg.size; i++) {
      lanes_drop(e, i, ERDMA_ERR_PEER);
      for (int k = 0; k < e->lanes_max; k++) {
        erdma_conn *c = peer_conn(&e->peers[i], k);
        if (!c) continue;
        conn_free(c);
        if (k) e->peers[i].lanes[k] = NULL;
        else e->peers[i].conn = NULL;
      }
    }
  while (e->pending) {
    erdma_conn *c = e->pending;
    e->pending = c->next_pending;
    conn_free(c);
  }
  while (e->unexp_head) {
    erdma_msg *m = e->unexp_head;
    DL_REMOVE(e->unexp_head, e->unexp_tail, m);
    msg_free(m);
  }
  pthread_mutex_unlock(&e->mu);
  shm_teardown(e);
  shm_unmap_peers(e); /* the connections pointing into them are freed */
  ulfm_free(e);
  nat_free(e);
  tls_identity_free(e);
  if (e->io.close) e->io.close(e);
  if (e->fd >= 0) close(e->fd);
  if (e->evfd >= 0) close(e->evfd);
  free(e->txbuf);
  free(e->rxbuf);
  free(e->peers);
  free(e->trace);
  msgbuf_trim();
  /* requests still held by the user stay valid (they are never touched again) */
  free(e);
}

int erdma_trace_start(erdma_engine *e, uint64_t cap) {
  if (!e || cap > ((uint64_t)1 << 32)) return ERDMA_ERR_INVAL;
  erdma_trace_rec *t = NULL;
  if (cap && !(t = malloc(cap * sizeof *t))) return ERDMA_ERR_NOMEM;
  pthread_mutex_lock(&e->mu);
  erdma_trace_rec *old = e->trace;
  e->trace = t;
  e->trace_cap = cap;
  e->trace_n = e->trace_dropped = 0;
  pthread_mutex_unlock(&e->mu);
  free(old);
  return 0;
}

uint64_t erdma_trace_take(erdma_engine *e, erdma_trace_rec *out, uint64_t max,
                          uint64_t *dropped) {
  if (!e) return 0;
  pthread_mutex_lock(&e->mu);
  uint64_t k = e->trace_n < max ? e->trace_n : max;
  if (k) {
    memcpy(out, e->trace, k * sizeof *out);
    memmove(e->trace, e->trace + k, (e->trace_n - k) * sizeof *out);
    e->trace_n -= k;
  }
  if (dropped) *dropped = e->trace_dropped;
  e->trace_dropped = 0;
  pthread_mutex_unlock(&e->mu);
  return k;
}

int erdma_engine_stats(erdma_engine *e, erdma_stats *st) {
  pthread_mutex_lock(&e->mu);
  *st = e->stats;
  st->lanes_ready = conn_lanes_ready(e);
  st->conns_pending = 0;
  for (erdma_conn *c = e->pending; c; c = c->next_pending) st->conns_pending += !c->closed;
  pthread_mutex_unlock(&e->mu);
  return 0;
}

int erdma_engine_config(erdma_engine *e, erdma_config *out) {
  if (!e || !out) return ERDMA_ERR_INVAL;
  pthread_mutex_lock(&e->mu);
  *out = e->cfg;
  pthread_mutex_unlock(&e->mu);
  return 0;
}

int erdma_engine_peer_error(erdma_engine *e, int rank) {
  if (rank < 0 || rank >= e->cfg.size) return ERDMA_ERR_RANK;
  return e->peers[rank].error;
}

/* -------------------------------------------------------- point to point */
static int check_src(erdma_engine *e, int source) {
  return source == ERDMA_ANY_SOURCE || (source >= 0 && source < e->cfg.size);
}

/* Whether a send of these flags may go eager at all (size limits aside). */
static int eager_ok(const erdma_engine *e, const erdma_conn *c, uint64_t nbytes, int flags,
                    uint32_t ctx) {
  return !(flags & ERDMA_SEND_SYNC) &&
         !(c->shm && (shm_bulk_by_cma(e, nbytes, flags) || shm_p2p_by_cma(e, nbytes, flags, ctx)));
}

int erdma_isend(erdma_engine *e, const void *buf, uint64_t nbytes, int dest, int tag,
                uint32_t ctx, int flags, erdma_req **out) {
  if (dest < 0 || dest >= e->cfg.size) return ERDMA_ERR_RANK;
  if ((!buf && nbytes) || tag < 0) return ERDMA_ERR_INVAL;
  if (dest != e->cfg.rank && !e->started) return ERDMA_ERR_STATE;
  erdma_req *r = req_new(e, REQ_SEND);
  if (!r) return ERDMA_ERR_NOMEM;
  r->sbuf = buf;
  r->nbytes = nbytes;
  r->dest = dest;
  r->tag = tag;
  r->ctx = ctx;
  r->flags = flags;
  r->st.nbytes = nbytes;
  pthread_mutex_lock(&e->mu);
  TRACE_MSG(e, ERDMA_TRACE_SEND, dest, tag, ctx, nbytes);
  if (dest == e->cfg.rank) {
    /* to ourselves: copy now (never blocks), match in place */
    erdma_msg *m = msg_new(dest, tag, ctx, nbytes);
    if (!m || msg_alloc_data(m)) {
      free(m);
      req_complete(r, ERDMA_ERR_NOMEM);
    } else {
      if (nbytes) erdma_copy(m->data, buf, nbytes);
      m->complete = 1;
      if (flags & ERDMA_SEND_SYNC) m->sreq = r;
      erdma_req *rr = posted_take(e, dest, tag, ctx);
      if (rr) {
        bind_recv(e, rr, m);
      } else {
        m->queued = 1;
        DL_APPEND(e->unexp_head, e->unexp_tail, m);
        pthread_cond_broadcast(&e->cv);
      }
      if (!(flags & ERDMA_SEND_SYNC)) req_complete(r, 0);
    }
  } else {
    peer_info *p = &e->peers[dest];
    frame_hdr h = {0};
    h.ctx = ctx;
    h.tag = tag;
    h.len = nbytes;
    if (p->conn) shm_note_send(p->conn, flags, nbytes);
    if (p->error || !p->conn || p->conn->closed) {
      req_complete(r, p->error ? p->error : ERDMA_ERR_PEER);
    } else if (nbytes <= conn_eager_max(p->conn) && eager_ok(e, p->conn, nbytes, flags, ctx) &&
               (h.type = FR_EAGER, conn_send_now(p->conn, &h, buf, nbytes))) {
      req_complete(r, 0); /* written into the channel (a local peer's ring) */
    } else if (p->conn->shm && nbytes <= conn_eager_max(p->conn) &&
               !(flags & ERDMA_SEND_BUFFERED) && eager_ok(e, p->conn, nbytes, flags, ctx)) {
      /* a local peer's ring is full (or messages wait before this one): the
       * send waits in the queue for room, its buffer in place, and completes
       * once written.  A copy would let a sender outrun its receiver by any
       * amount, each message in newly faulted pages (~3 us a page on a VM).
       * A buffered send (Bsend) completes without the receiver: copied. */
      h.type = FR_EAGER;
      conn_enqueue(p->conn, &h, buf, nbytes, NULL, r);
      conn_flush(p->conn);
      shm_hold_lifted(e); /* the peer may wait for room in our ring */
    } else if (nbytes <= e->cfg.eager_limit && eager_ok(e, p->conn, nbytes, flags, ctx)) {
      uint8_t *copy = malloc(nbytes ? nbytes : 1);
      if (!copy) {
        req_complete(r, ERDMA_ERR_NOMEM);
      } else {
        if (nbytes) erdma_copy(copy, buf, nbytes);
        h.type = FR_EAGER;
        conn_enqueue(p->conn, &h, copy, nbytes, copy, NULL);
        req_complete(r, 0);
        conn_flush(p->conn);
      }
    } else {
      h.type = FR_RTS;
      h.flags = (flags & ERDMA_SEND_SYNC) ? FR_FLAG_SYNC : 0;
      h.id = r->id = ++e->next_id & 0xffffffffu; /* fits the CMA RTS's aux field */
      if (nbytes && conn_offer(p->conn, r)) {
        h.flags |= FR_FLAG_CMA; /* the receiver reads buf straight from us */
        h.aux = (uint32_t)r->id;
        h.id = (uint64_t)(uintptr_t)buf;
      }
      DL_APPEND(e->rndv_send_head, e->rndv_send_tail, r);
      shm_hold_lifted(e); /* its CTS may be behind held bytes */
      conn_enqueue(p->conn, &h, NULL, 0, NULL, NULL);
      conn_flush(p->conn);
    }
  }
  shm_app_active(e);
  pthread_mutex_unlock(&e->mu);
  *out = r;
  return 0;
}

/* Bind r to m (taken out of the queue), then push any CTS it produced. */
static void bind_and_flush(erdma_engine *e, erdma_req *r, erdma_msg *m) {
  int src = m->source, rndv = m->rndv;
  bind_recv(e, r, m);
  if (rndv && e->peers[src].conn) conn_flush(e->peers[src].conn);
}

int erdma_irecv(erdma_engine *e, void *buf, uint64_t cap, int source, int tag, uint32_t ctx,
                int alloc, erdma_req **out) {
  if (!check_src(e, source)) return ERDMA_ERR_RANK;
  if ((!buf && cap && !alloc) || (tag < 0 && tag != ERDMA_ANY_TAG)) return ERDMA_ERR_INVAL;
  erdma_req *r = req_new(e, REQ_RECV);
  if (!r) return ERDMA_ERR_NOMEM;
  r->buf = alloc ? NULL : buf;
  r->cap = alloc ? 0 : cap;
  r->alloc = alloc;
  r->source = source;
  r->tag = tag;
  r->ctx = ctx;
  pthread_mutex_lock(&e->mu);
  TRACE_MSG(e, ERDMA_TRACE_RECV, source, tag, ctx, r->cap);
  erdma_msg *m = unexp_find(e, source, tag, ctx);
  if (m) {
    DL_REMOVE(e->unexp_head, e->unexp_tail, m);
    m->queued = 0;
    bind_and_flush(e, r, m);
  } else if (source >= 0 && source != e->cfg.rank && e->peers[source].error) {
    req_complete(r, e->peers[source].error);
  } else {
    DL_APPEND(e->posted_head, e->posted_tail, r);
    shm_hold_lifted(e); /* its message may be behind held bytes */
  }
  shm_app_active(e);
  pthread_mutex_unlock(&e->mu);
  *out = r;
  return 0;
}

static void fill_probe(erdma_status *st, const erdma_msg *m) {
  memset(st, 0, sizeof *st);
  st->source = m->source;
  st->tag = m->tag;
  st->nbytes = m->len;
}

static int probe_impl(erdma_engine *e, int source, int tag, uint32_t ctx, double timeout,
                      int take, int *flag, erdma_msg **msg, erdma_status *st) {
  if (!check_src(e, source)) return ERDMA_ERR_RANK;
  uint64_t deadline = deadline_of(timeout);
  int rv = 0, read_on = 0;
  pthread_mutex_lock(&e->mu);
  e->probing++; /* a held peer's bytes are read (shm_hold_max) */
  for (;;) {
    erdma_msg *m = unexp_find(e, source, tag, ctx);
    if (m) {
      fill_probe(st, m);
      if (take) {
        DL_REMOVE(e->unexp_head, e->unexp_tail, m);
        m->queued = 0;
        m->taken = 1;
        *msg = m;
      }
      if (flag) *flag = 1;
      break;
    }
    if (source >= 0 && source != e->cfg.rank && e->peers[source].error) {
      rv = e->peers[source].error;
      break;
    }
    if (source == ERDMA_ANY_SOURCE && !flag && ctx_failure_unacked(e, ctx)) {
      rv = ERDMA_ERR_PEER; /* a blocking probe from ANY_SOURCE fails as its receive would */
      break;
    }
    if (!read_on && e->running && shm_rx_ready(e)) {
      /* what sits in our rings, read here and now: bytes left there
       * (shm_hold_max), or a local peer's message sent before a Barrier by
       * flags, which drains nothing */
      int held = e->shm.held;
      read_on = 1;
      shm_poll_rings(e); /* (which clears held, or sets it again) */
      if (held) engine_wake(e);
      continue;
    }
    if (flag && timeout == 0) {
      *flag = 0;
      break;
    }
    if (erdma_now() >= deadline) {
      rv = ERDMA_ERR_TIMEOUT;
      break;
    }
    shm_app_idle(e); /* producers ring the doorbell for us again */
    deadline_wait(e, deadline < erdma_now() + 100000000ull ? deadline : erdma_now() + 100000000ull);
  }
  e->probing--;
  pthread_mutex_unlock(&e->mu);
  return rv;
}

int erdma_iprobe(erdma_engine *e, int source, int tag, uint32_t ctx, int *flag,
                 erdma_status *st) {
  return probe_impl(e, source, tag, ctx, 0, 0, flag, NULL, st);
}

int erdma_improbe(erdma_engine *e, int source, int tag, uint32_t ctx, int *flag,
                  erdma_msg **msg, erdma_status *st) {
  *msg = NULL;
  return probe_impl(e, source, tag, ctx, 0, 1, flag, msg, st);
}

int erdma_probe(erdma_engine *e, int source, int tag, uint32_t ctx, double timeout,
                erdma_status *st) {
  return probe_impl(e, source, tag, ctx, timeout, 0, NULL, NULL, st);
}

int erdma_mprobe(erdma_engine *e, int source, int tag, uint32_t ctx, double timeout,
                 erdma_msg **msg, erdma_status *st) {
  *msg = NULL;
  return probe_impl(e, source, tag, ctx, timeout, 1, NULL, msg, st);
}

int erdma_imrecv(erdma_engine *e, erdma_msg *m, void *buf, uint64_t cap, int alloc,
                 erdma_req **out) {
  if (!m || (!buf && cap && !alloc)) return ERDMA_ERR_INVAL;
  erdma_req *r = req_new(e, REQ_RECV);
  if (!r) return ERDMA_ERR_NOMEM;
  r->buf = alloc ? NULL : buf;
  r->cap = alloc ? 0 : cap;
  r->alloc = alloc;
  r->source = m->source;
  r->tag = m->tag;
  r->ctx = m->ctx;
  pthread_mutex_lock(&e->mu);
  TRACE_MSG(e, ERDMA_TRACE_RECV, r->source, r->tag, r->ctx, r->cap);
  m->taken = 0;
  bind_and_flush(e, r, m);
  pthread_mutex_unlock(&e->mu);
  *out = r;
  return 0;
}

/* ------------------------------------------------------------- requests */
int erdma_req_test(erdma_req *r, int *done, erdma_status *st) {
  erdma_engine *e = r->e;
  pthread_mutex_lock(&e->mu);
  /* a test makes progress: what a local peer put in our ring before a
   * Barrier by flags (no message to drain it) is matched by then */
  if (!r->done && e->running && shm_rx_ready(e)) {
    shm_poll_rings(e);
    conn_flush_all(e); /* (what the frames read made us send) */
  }
  *done = r->done;
  if (r->done && st) *st = r->st;
  int rv = r->done || !req_failure_pending(r) ? 0 : ERDMA_ERR_PEER_PENDING;
  pthread_mutex_unlock(&e->mu);
  return rv;
}

int erdma_req_peek(erdma_req *r, erdma_status *st) {
  if (!__atomic_load_n(&r->done, __ATOMIC_ACQUIRE)) return 0;
  if (st) *st = r->st;
  return 1;
}

/* Every peer is on this host: waiters sleep on the shared-memory bell. */
static int all_shm(erdma_engine *e) {
  return e->shm.seg && e->shm.nlocal == e->cfg.size && e->running;
}

/* Read without e->mu: `done` only ever goes 0 -> 1 (under the lock). */
static int any_done(erdma_req *const *reqs, int n) {
  for (int i = 0; i < n; i++)
    if (reqs[i] && __atomic_load_n(&reqs[i]->done, __ATOMIC_ACQUIRE)) return 1;
  return 0;
}

/* Lock-free part of a spin over shared memory only: e->mu is released and
 * taken again only when a ring has bytes (or now and then, to push our own
 * stalled sends).  With a CPU for each local rank, when a peer runs on our
 * CPU (then the spin would only keep it from running: shm_shares_cpu) it
 * moves to another CPU (shm_move_off_cpu), or else leaves early and returns
 * 1.  With more ranks than CPUs it yields at every turn, as before.
 * Returns with e->mu held. */
static int spin_shm(erdma_engine *e, erdma_req *const *reqs, int n, uint64_t until) {
  int *lf = &e->shm.lf_spin;
  unsigned it = 0;
  int yield = e->shm.oversub, shared = 0;
  __atomic_add_fetch(lf, 1, __ATOMIC_ACQ_REL);
  pthread_mutex_unlock(&e->mu);
  for (;;) {
    if (any_done(reqs, n)) break;
    ++it;
    if (shm_rx_ready(e) || (it & 255) == 0) {
      /* never wait for the lock while counted: teardown holds it and waits for us */
      __atomic_sub_fetch(lf, 1, __ATOMIC_ACQ_REL);
      pthread_mutex_lock(&e->mu);
      if (!e->shm.seg || !e->running) return 0;
      shm_poll_rings(e);
      conn_flush_all(e);
      if (any_done(reqs, n) || erdma_now() >= until) return 0;
      __atomic_add_fetch(lf, 1, __ATOMIC_ACQ_REL);
      pthread_mutex_unlock(&e->mu);
      continue;
    }
    if ((it & 15) == 0 &&
        (erdma_now() >= until || !__atomic_load_n(&e->running, __ATOMIC_RELAXED)))
      break;
    if (!yield && (it & 63) == 1 && shm_shares_cpu(e) && !shm_move_off_cpu(e)) {
      shared = 1;
      break;
    }
    /* give the CPU away at every turn where our ranks outnumber the cores (4
     * ranks on 2 cores must not livelock); otherwise never: the spin is short
     * and ends in a sleep anyway, a peer on our CPU ends it at once (above),
     * and under other processes' load a yield hands the core to them for a
     * whole time slice */
    if (yield) sched_yield();
    else cpu_relax();
  }
  __atomic_sub_fetch(lf, 1, __ATOMIC_ACQ_REL);
  pthread_mutex_lock(&e->mu);
  return shared;
}

/* Before sleeping, a waiter polls for a short while itself: a reply that
 * arrives within the spin is processed by this thread directly, saving the
 * wake-up of the progress thread and then of this one.  With every peer on
 * shared memory the spin only reads the rings' counters (no syscall, no
 * lock); with QUIC peers it also polls the socket.  Called and returns with
 * e->mu held. */
static int spin_progress(erdma_engine *e, erdma_req *const *reqs, int n) {
  int shared = 0;
  if (e->cfg.spin_us <= 0 || !e->running) return 0;
  uint64_t spin = e->shm.spin_ns ? e->shm.spin_ns : (uint64_t)e->cfg.spin_us * 1000u;
  uint64_t until = erdma_now() + spin;
  int quic = e->shm.nlocal < e->cfg.size; /* some peer is not on this host */
  shm_spin_begin(e);
  if (!quic && e->shm.seg) {
    shared = spin_shm(e, reqs, n, until);
  } else {
    while (!any_done(reqs, n) && erdma_now() < until) {
      e->io.recv(e);
      shm_poll(e);
      conn_flush_all(e);
      if (any_done(reqs, n)) break;
      pthread_mutex_unlock(&e->mu);
      sched_yield();
      pthread_mutex_lock(&e->mu);
    }
  }
  shm_spin_end(e);
  conn_flush_all(e);
  return shared;
}

/* With every peer on shared memory: spin, then sleep on the bell.  The spin
 * adapts between cfg.spin_us and SPIN_MAX_FACTOR times that: a reply that
 * came soon after the spin gave up (a loaded machine, a slow peer) doubles
 * it; a long sleep (an idle rank) halves it, so an idle rank burns little.
 * A spin cut short by a peer on our CPU teaches nothing. */
#define SPIN_MAX_FACTOR 10
static void wait_shm(erdma_engine *e, erdma_req *const *reqs, int n, uint64_t deadline) {
  int shared = spin_progress(e, reqs, n);
  if (any_done(reqs, n) || !all_shm(e)) return;
  uint64_t base = (uint64_t)e->cfg.spin_us * 1000u, t0 = erdma_now();
  int done = shm_wait(e, reqs, n, deadline);
  uint64_t slept = erdma_now() - t0, cur = e->shm.spin_ns ? e->shm.spin_ns : base;
  if (shared) {
    /* nothing learnt about the peer's pace */
  } else if (done && slept < cur) {
    cur = cur * 2 < base * SPIN_MAX_FACTOR ? cur * 2 : base * SPIN_MAX_FACTOR;
  } else if (slept > 4 * cur) {
    cur = cur / 2 > base ? cur / 2 : base;
  }
  if (e->shm.seg) e->shm.spin_ns = cur;
}

int erdma_req_wait(erdma_req *r, double timeout, erdma_status *st) {
  erdma_engine *e = r->e;
  uint64_t deadline = deadline_of(timeout);
  int rv = 0;
  pthread_mutex_lock(&e->mu);
  if (!r->done && !req_failure_pending(r)) {
    if (all_shm(e))
      wait_shm(e, &r, 1, deadline);
    else
      spin_progress(e, &r, 1);
  }
  while (!r->done) {
    if (req_failure_pending(r)) {
      rv = ERDMA_ERR_PEER_PENDING;
      break;
    }
    if (erdma_now() >= deadline) {
      rv = ERDMA_ERR_TIMEOUT;
      break;
    }
    shm_app_idle(e);
    deadline_wait(e, deadline);
  }
  if (r->done && st) *st = r->st;
  shm_app_active(e);
  pthread_mutex_unlock(&e->mu);
  return rv;
}

/* erdma_send / erdma_recv: wait for a fresh request, free it when done. */
static int wait_blocking(erdma_req *r, double timeout, erdma_blocking *out) {
  erdma_status st;
  int rv = erdma_req_wait(r, timeout, &st);
  /* a blocking receive from ANY_SOURCE fails (ULFM: ERR_PROC_FAILED) */
  while (rv == ERDMA_ERR_PEER_PENDING) {
    erdma_req_withdraw_failed(r); /* unless it matched meanwhile */
    rv = erdma_req_wait(r, timeout, &st);
  }
  if (rv == ERDMA_ERR_TIMEOUT) {
    out->left = r;
    return rv;
  }
  erdma_req_free(r);
  out->source = st.source;
  out->tag = st.tag;
  out->error = st.error;
  out->cancelled = st.cancelled;
  out->nbytes = st.nbytes;
  return rv;
}

int erdma_blocking_wait(erdma_req *r, double timeout, erdma_blocking *out) {
  out->left = NULL;
  return wait_blocking(r, timeout, out);
}

int erdma_send(erdma_engine *e, const void *buf, uint64_t nbytes, int dest, int tag,
               uint32_t ctx, int flags, double timeout, erdma_blocking *out) {
  erdma_req *r;
  out->left = NULL;
  int rv = erdma_isend(e, buf, nbytes, dest, tag, ctx, flags, &r);
  return rv ? rv : wait_blocking(r, timeout, out);
}

/* The receive of erdma_recv_now and erdma_recv_now_alloc under e->mu: into
 * buf (cap bytes), or into what alloc(arg, length) gives (buf NULL). */
static int take_now(erdma_engine *e, void *buf, uint64_t cap, int source, int tag, uint32_t ctx,
                    void *(*alloc)(void *arg, uint64_t n), void *arg, erdma_blocking *out) {
  erdma_msg *m = e->unexp_head ? unexp_find(e, source, tag, ctx) : NULL;
  if (!m || m->rndv || m->error || !m->complete || m->sync || m->sreq ||
      (alloc && !(buf = alloc(arg, cap = m->len))))
    return 0; /* (the first match decides: messages are taken in order) */
  TRACE_MSG(e, ERDMA_TRACE_RECV, source, tag, ctx, cap);
  DL_REMOVE(e->unexp_head, e->unexp_tail, m);
  m->queued = 0;
  uint64_t n = m->len < cap ? m->len : cap;
  if (n) erdma_copy(buf, m->data, n);
  out->source = m->source;
  out->tag = m->tag;
  out->error = m->len > cap ? ERDMA_ERR_TRUNCATE : 0;
  out->cancelled = 0;
  out->nbytes = n;
  out->left = NULL;
  msg_free(m);
  shm_app_active(e);
  return 1;
}

static int recv_args_ok(erdma_engine *e, void *buf, uint64_t cap, int source, int tag) {
  return check_src(e, source) && (buf || !cap) && (tag >= 0 || tag == ERDMA_ANY_TAG);
}

static int recv_now(erdma_engine *e, void *buf, uint64_t cap, int source, int tag, uint32_t ctx,
                    void *(*alloc)(void *arg, uint64_t n), void *arg, erdma_blocking *out) {
  if (!recv_args_ok(e, buf, cap, source, tag) || pthread_mutex_trylock(&e->mu) != 0) return 0;
  int got = take_now(e, buf, cap, source, tag, ctx, alloc, arg, out);
  pthread_mutex_unlock(&e->mu);
  return got;
}

int erdma_recv_now(erdma_engine *e, void *buf, uint64_t cap, int source, int tag,
                   uint32_t ctx, erdma_blocking *out) {
  return recv_now(e, buf, cap, source, tag, ctx, NULL, NULL, out);
}

int erdma_recv_now_alloc(erdma_engine *e, int source, int tag, uint32_t ctx,
                         void *(*alloc)(void *arg, uint64_t n), void *arg, erdma_blocking *out) {
  return alloc ? recv_now(e, NULL, 0, source, tag, ctx, alloc, arg, out) : 0;
}

/* A message from a local peer sent as this rank reached its receive (an
 * exchange) lands within a microsecond: reading it straight from the ring
 * into alloc's buffer spares the request, its zeroed buffer, a second copy
 * and the wait's hand-over of the caller's lock (the GIL).  The spin reads
 * the rings' counters without e->mu, counted in lf_spin (taken under the
 * lock, as spin_shm) so that teardown waits for it, and only ever tries the
 * lock while counted. */
int erdma_recv_soon_alloc(erdma_engine *e, int source, int tag, uint32_t ctx,
                          void *(*alloc)(void *arg, uint64_t n), void *arg, uint64_t spin_ns,
                          erdma_blocking *out) {
  if (!alloc || !recv_args_ok(e, NULL, 0, source, tag)) return 0;
  uint64_t until = spin_ns ? erdma_now() + spin_ns : 0;
  while (pthread_mutex_trylock(&e->mu) != 0) { /* busy (the progress thread): within the spin */
    if (!spin_ns || erdma_now() >= until) return 0;
    cpu_relax();
  }
  int got = take_now(e, NULL, 0, source, tag, ctx, alloc, arg, out);
  struct shm_seg *seg = e->shm.seg;
  if (got || !spin_ns || !all_shm(e) || e->shm.oversub || source == e->cfg.rank) {
    pthread_mutex_unlock(&e->mu);
    return got;
  }
  __atomic_add_fetch(&e->shm.lf_spin, 1, __ATOMIC_ACQ_REL);
  pthread_mutex_unlock(&e->mu);
  for (unsigned it = 1;; it++) {
    if (shm_rx_ready(e) && pthread_mutex_trylock(&e->mu) == 0) {
      int live = e->shm.seg == seg && e->running;
      if (live) {
        shm_poll_rings(e);
        conn_flush_all(e);
        got = take_now(e, NULL, 0, source, tag, ctx, alloc, arg, out);
      }
      if (got || !live) {
        __atomic_sub_fetch(&e->shm.lf_spin, 1, __ATOMIC_ACQ_REL);
        pthread_mutex_unlock(&e->mu);
        return got;
      }
      pthread_mutex_unlock(&e->mu); /* still counted: the segment stays */
    }
    if ((it & 15) == 0 && erdma_now() >= until) break;
    cpu_relax();
  }
  __atomic_sub_fetch(&e->shm.lf_spin, 1, __ATOMIC_ACQ_REL);
  return 0;
}

int erdma_recv(erdma_engine *e, void *buf, uint64_t cap, int source, int tag, uint32_t ctx,
               double timeout, erdma_blocking *out) {
  erdma_req *r;
  out->left = NULL;
  if (erdma_recv_now(e, buf, cap, source, tag, ctx, out)) return 0;
  int rv = erdma_irecv(e, buf, cap, source, tag, ctx, 0, &r);
  return rv ? rv : wait_blocking(r, timeout, out);
}

int erdma_req_waitany(erdma_req **reqs, int n, double timeout, int *index) {
  erdma_engine *e = NULL;
  int rv = 0, spun = 0;
  *index = -1;
  for (int i = 0; i < n && !e; i++)
    if (reqs[i]) e = reqs[i]->e;
  if (!e) return 0;
  uint64_t deadline = deadline_of(timeout);
  pthread_mutex_lock(&e->mu);
  for (;;) {
    for (int i = 0; i < n; i++)
      if (reqs[i] && reqs[i]->done) {
        *index = i;
        break;
      }
    if (*index >= 0) break;
    for (int i = 0; i < n && e->ulfm; i++)
      if (reqs[i] && req_failure_pending(reqs[i])) {
        *index = i;
        rv = ERDMA_ERR_PEER_PENDING;
        break;
      }
    if (rv) break;
    if (!spun) {
      spun = 1;
      if (all_shm(e))
        wait_shm(e, reqs, n, deadline);
      else
        spin_progress(e, reqs, n);
      continue;
    }
    if (erdma_now() >= deadline) {
      rv = ERDMA_ERR_TIMEOUT;
      break;
    }
    shm_app_idle(e);
    deadline_wait(e, deadline);
  }
  shm_app_active(e);
  pthread_mutex_unlock(&e->mu);
  return rv;
}

int erdma_req_cancel(erdma_req *r) {
  erdma_engine *e = r->e;
  pthread_mutex_lock(&e->mu);
  if (r->kind == REQ_RECV && !r->done) {
    for (erdma_req *q = e->posted_head; q; q = q->next)
      if (q == r) {
        DL_REMOVE(e->posted_head, e->posted_tail, r);
        r->st.cancelled = 1;
        req_complete(r, 0);
        break;
      }
  }
  pthread_mutex_unlock(&e->mu);
  return 0;
}

void *erdma_req_data(erdma_req *r) { return r->buf; }

void erdma_req_free(erdma_req *r) {
  if (!r) return;
  erdma_engine *e = r->e;
  pthread_mutex_lock(&e->mu);
  r->user_freed = 1;
  req_release(r);
  pthread_mutex_unlock(&e->mu);
}
