/* erdma_engine.h - the engine (erdma_engine.c): the struct every engine
 * source shares.
 *
 * The component owns struct erdma_engine (configuration, socket and packet
 * I/O, the progress thread and its mutex, the TLS identity, the peer table,
 * the matching queues, shared-memory and NAT state, the message trace), the
 * helpers that read it, the clock (erdma_now), address helpers, and the
 * datagram path between packet I/O and the connections (engine_sendv,
 * engine_rx_datagram).  The struct holds the packet I/O vtable, the
 * shared-memory and the NAT state by value, hence erdma_pktio.h,
 * erdma_shm.h and erdma_nat.h; erdma_conn.h for the peer table.  Those
 * headers need the engine only behind a pointer (erdma.h declares the
 * type), so none of them includes this one. */
#ifndef ERDMA_ENGINE_H
#define ERDMA_ENGINE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include <gnutls/gnutls.h>

#include "erdma.h"
#include "erdma_conn.h"
#include "erdma_nat.h"
#include "erdma_pktio.h"
#include "erdma_shm.h"

struct erdma_engine {
  erdma_config cfg;
  char bind_addr[64];
  erdma_pktio io;
  int fd;                /* the kernel UDP socket (udp backend; dpdk: unbound, doorbells only) */
  int evfd;
  struct sockaddr_storage local;
  socklen_t local_len;
  size_t pkt_size;       /* max UDP payload we write */
  int gso;               /* kernel UDP GSO (UDP_SEGMENT) available */
  int gro;               /* UDP GRO enabled on the socket */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t thread;
  int running, started, stopping;
  uint64_t last_log;     /* verbose >= 2: last path report */
  uint64_t wake_at;      /* when the sleeping progress thread wakes (UINT64_MAX: awake) */
  /* TLS identity */
  gnutls_certificate_credentials_t cred;
  char fingerprint[65];
  gnutls_priority_t prio;
  /* peers */
  peer_info *peers;
  int lanes_max;         /* connection slots of a peer in use: 1 + its highest lane
                            opened or filed (loops over lanes stop there) */
  erdma_conn *pending;   /* accepted, rank unknown */
  uint8_t token_secret[32]; /* keys the Retry tokens this engine issues */
  /* matching */
  erdma_req *posted_head, *posted_tail;       /* posted receives */
  erdma_msg *unexp_head, *unexp_tail;         /* unexpected messages */
  erdma_req *rndv_send_head, *rndv_send_tail; /* sends waiting for CTS */
  erdma_req *rndv_recv_head, *rndv_recv_tail; /* receives waiting for DATA */
  int probing;                                /* threads in a probe (shm_hold_max) */
  uint64_t next_id;
  /* io buffers (used under mu) */
  uint8_t *txbuf;
  uint8_t *rxbuf;
  erdma_stats stats;
  shm_state shm;
  nat_state nat;         /* erdma_nat.c */
  void *plugin;          /* dlopen handle of the packet I/O plugin (dpdk) */
  struct ulfm_state *ulfm; /* erdma_ulfm.c: failure order, contexts' members */
  /* message trace (erdma_trace_start; under mu) */
  erdma_trace_rec *trace;
  uint64_t trace_cap, trace_n, trace_dropped;
};

/* Record a posted message in the trace, if one is on (caller holds e->mu). */
static inline void trace_msg(erdma_engine *e, int op, int peer, int tag, uint32_t ctx,
                             uint64_t nbytes) {
  if (e->trace_n == e->trace_cap) {
    e->trace_dropped++;
    return;
  }
  erdma_trace_rec *t = &e->trace[e->trace_n++];
  t->op = op;
  t->peer = peer;
  t->tag = tag;
  t->ctx = ctx;
  t->nbytes = nbytes;
}
#define TRACE_MSG(e, op, peer, tag, ctx, nbytes) \
  do {                                           \
    if ((e)->trace) trace_msg(e, op, peer, tag, ctx, nbytes); \
  } while (0)

/* every connection of every peer, as c (peer i, slot k): a double loop */
#define FOR_PEER_CONNS(e, i, k, c)                                             \
  for (int i = 0; i < (e)->cfg.size; i++)                                      \
    for (int k = 0; k < (e)->lanes_max; k++)                                   \
      if (((c) = peer_conn(&(e)->peers[i], k)) != NULL)
/* the bytes of payload per CHUNK frame */
#define ERDMA_CHUNK_BYTES(e) ((e)->cfg.chunk_size ? (e)->cfg.chunk_size : (512u << 10))

/* engine.c */
uint64_t erdma_now(void);
/* a spin-wait loop's pause */
static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

int addr_is_loopback(const struct sockaddr_storage *a);
/* numeric host and port of an IPv4/IPv6 address ("" and 0 for another family) */
void addr_format(const struct sockaddr_storage *a, char *host, size_t hostcap, int *port);
/* numeric or DNS host + port -> sockaddr (ERDMA_ERR_INVAL when it does not resolve) */
int addr_resolve(const char *host, int port, struct sockaddr_storage *out, socklen_t *len);
void engine_wake(erdma_engine *e);
void engine_wake_waiters(erdma_engine *e); /* a request completed: wake who waits for one */
/* bufs: n packets at a stride of e->pkt_size; NULL: the first n buffers of
 * the backend's zero-copy batch (e->io.tx_buf), which it releases (n >= 0) */
void engine_sendv(erdma_engine *e, erdma_conn *c, uint8_t *bufs, size_t *lens, int n);
int engine_rx_datagram(erdma_engine *e, const uint8_t *data, size_t len,
                       const struct sockaddr_storage *from, socklen_t fromlen);
/* the packet size of connection c (its settings' max_tx_udp_payload_size) */
size_t engine_conn_payload(erdma_engine *e, const erdma_conn *c);
/* bytes conn_flush lets ngtcp2 write into one packet buffer */
size_t engine_write_room(erdma_engine *e, const erdma_conn *c);

#endif /* ERDMA_ENGINE_H */
