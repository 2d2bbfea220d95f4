/* erdma_internal.h - engine-private types shared by the engine sources. */
#ifndef ERDMA_INTERNAL_H
#define ERDMA_INTERNAL_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>

#include <gnutls/gnutls.h>
#include <ngtcp2/ngtcp2.h>
#include <ngtcp2/ngtcp2_crypto.h>

#include "erdma.h"
#include "erdma_quic.h"

/* ---- wire protocol (docs/design.md, "Wire protocol") ---- */
#define ERDMA_HDR_LEN 32
enum { FR_HELLO = 1, FR_EAGER = 2, FR_RTS = 3, FR_CTS = 4, FR_DATA = 5, FR_CHUNK = 6 };
#define FR_FLAG_SYNC 1
#define FR_FLAG_CMA 2 /* shared memory: RTS id = sender address, aux = request id; CTS: done */
#define FR_FLAG_CHUNKS 4 /* CTS: the payload may come as CHUNK frames on data streams */
#define FR_FLAG_LANE 8   /* HELLO: this connection is extra lane `aux` of the sender */

typedef struct frame_hdr {
  uint8_t type, flags;
  uint32_t ctx;   /* HELLO: sender rank */
  int32_t tag;
  uint64_t len;   /* payload length (EAGER/DATA/RTS); HELLO: world size */
  uint64_t id;    /* RTS, CTS: sender req id; DATA: receiver req id (CTS: len = receiver req id) */
  uint32_t aux;   /* RTS with FR_FLAG_CMA: sender req id */
  uint64_t off;   /* CHUNK: offset of the payload in the message (bytes 8..15) */
} frame_hdr;

void hdr_encode(uint8_t out[ERDMA_HDR_LEN], const frame_hdr *h);
void hdr_decode(frame_hdr *h, const uint8_t in[ERDMA_HDR_LEN]);

/* ---- requests and unexpected messages (erdma_match.c) ---- */
enum { REQ_SEND = 1, REQ_RECV = 2 };

struct erdma_req {
  erdma_engine *e;
  int kind;
  int done;
  int user_freed;        /* erdma_req_free called before completion */
  int engine_refs;       /* engine structures still pointing at it */
  erdma_status st;
  uint64_t id;           /* for RTS/CTS */
  /* receive */
  void *buf;
  uint64_t cap;
  int alloc;
  int source, tag;
  uint32_t ctx;
  /* send */
  const void *sbuf;
  uint64_t nbytes;
  int dest;
  int flags;
  uint64_t got;          /* chunked receive: payload bytes arrived so far */
  uint64_t chunks_left;  /* chunked send: chunks not yet acknowledged */
  uint32_t cma_sid;      /* send readable with CMA under this id (erdma_shm.c) */
  uint64_t claimed;      /* chunked receive: payload bytes announced by CHUNK headers */
  int chunked;           /* a CHUNK arrived for it: a DATA frame is refused */
  int rndv_listed;       /* in e->rndv_recv (waiting for DATA or CHUNKs) */
  int rx_refs;           /* rx states (erdma_conn.c) filling it */
  struct erdma_req *prev, *next; /* posted-receive queue / pending-send list */
};

struct erdma_msg {
  int source, tag;
  uint32_t ctx;
  uint64_t len;
  int rndv;              /* RTS only: data still at the sender */
  int sync;
  uint64_t sender_id;
  uint64_t cma_addr;     /* FR_FLAG_CMA: the payload's address in the sender */
  int cma;
  uint8_t *data;         /* eager payload (owned) */
  uint64_t arrived;
  int complete;
  int queued;            /* in the unexpected queue */
  int taken;             /* held by a matched probe (erdma_msg handle) */
  int error;             /* its sender failed before the payload was complete */
  erdma_req *bound;      /* receive waiting for the rest of the payload */
  erdma_req *sreq;       /* local synchronous send completed on match */
  erdma_engine *acct_e;  /* acct bytes count against peer `source`'s unexpected bound */
  uint64_t acct;
  struct erdma_msg *prev, *next;
};

/* intrusive doubly linked list of reqs or msgs */
#define DL_APPEND(head, tail, x) do { (x)->next = NULL; (x)->prev = (tail); \
    if (tail) (tail)->next = (x); else (head) = (x); (tail) = (x); } while (0)
#define DL_REMOVE(head, tail, x) do { \
    if ((x)->prev) (x)->prev->next = (x)->next; else (head) = (x)->next; \
    if ((x)->next) (x)->next->prev = (x)->prev; else (tail) = (x)->prev; \
    (x)->prev = (x)->next = NULL; } while (0)

/* ---- outgoing stream items ---- */
typedef struct tx_item {
  uint8_t hdr[ERDMA_HDR_LEN];
  const uint8_t *payload;
  uint64_t plen;
  uint64_t written;      /* bytes of hdr+payload handed to ngtcp2 */
  uint64_t stream_end;   /* stream offset just past this item */
  uint8_t *owned;        /* eager copy, freed on ack */
  erdma_req *req;        /* send completed on ack (DATA) */
  int chunk;             /* a CHUNK: req completes when its last chunk is acked */
  struct tx_item *next;
} tx_item;

/* ---- connections (erdma_conn.c; the QUIC side in erdma_quic.c) ---- */
#define ERDMA_CIDLEN ERDMA_QUIC_CIDLEN

typedef struct rx_state {
  uint8_t hdr[ERDMA_HDR_LEN];
  size_t hdr_got;
  uint64_t remaining;    /* payload bytes still to come for the current frame */
  uint8_t *dst;          /* where payload goes */
  uint64_t room;         /* bytes of dst still writable; beyond that: discard */
  erdma_req *req;        /* completed when the payload is done */
  erdma_msg *msg;        /* or: unexpected message being filled */
  frame_hdr cur;
  int data;              /* a data stream: CHUNK frames only */
} rx_state;

/* The longest EAGER frame taken (a sender's eager limit may differ from
 * ours): larger is a protocol violation unless our own limit is larger. */
#define ERDMA_EAGER_FRAME_MAX (16u << 20)
/* The longest CHUNK frame (the largest chunk_size a sender can configure). */
#define ERDMA_CHUNK_FRAME_MAX (1u << 30)

/* A unidirectional stream we opened to carry CHUNK frames. */
#define ERDMA_MAX_DSTREAMS 16
/* congestion control towards other hosts when cfg.cc_algo is ERDMA_CC_AUTO */
#define ERDMA_DEFAULT_WAN_CC ERDMA_CC_BBR
/* connections to each peer on another host when cfg.lanes is 0 */
#define ERDMA_DEFAULT_LANES 2
typedef struct tx_stream {
  int64_t id;
  tx_item *head, *tail, *write;
  uint64_t offset;       /* stream offset assigned so far */
  uint64_t acked;
  uint64_t unwritten;    /* bytes queued but not yet handed to ngtcp2 */
} tx_stream;

typedef struct erdma_conn {
  erdma_engine *e;
  erdma_quic *q;         /* the QUIC connection (NULL: shared memory, or none yet) */
  int is_client;
  int peer;              /* peer rank, -1 until HELLO */
  int lane;              /* 0: the peer's main connection; k > 0: extra lane k (CHUNKs only) */
  int handshake_done;
  int hello_recv;
  int closed;            /* closing/draining/dead */
  int dirty;             /* has something to write: flush it */
  int64_t stream_id;     /* -1 until open */
  struct sockaddr_storage remote; /* where its packets go */
  socklen_t remote_len;
  /* tx */
  tx_item *tx_head, *tx_tail, *tx_write;
  uint64_t tx_offset;    /* stream offset assigned so far */
  uint64_t acked;
  rx_state rx;
  /* data streams (QUIC only): ours carry CHUNKs out, the peer's carry them in */
  tx_stream ds[ERDMA_MAX_DSTREAMS];
  int nds;               /* data streams opened */
  int ds_next;           /* next stream a chunk goes to */
  int ds_rr;             /* next stream the writer serves */
  int tx_sel;            /* the stream the writer pulled last: -1 control, i data stream i */
  rx_state drx[ERDMA_MAX_DSTREAMS]; /* by the peer's uni stream index */
  uint64_t credit_owed;  /* control-stream bytes consumed but not yet credited back to
                            the peer (held while its unexpected messages exceed the bound) */
  const char *violation; /* how the peer broke the wire protocol (NULL: it did not) */
  struct erdma_conn *next_pending; /* server conns awaiting HELLO */
  uint64_t accepted_at;  /* server conns: first packet (the HELLO deadline counts from it) */
  int from_peer_host;    /* server conns: from a source where a rank was published */
  /* shared memory (erdma_shm.c): a conn without ngtcp2 */
  int shm;
  struct shm_ring *tx_ring, *rx_ring;
  struct shm_seg *peer_seg;
  size_t peer_map_len;
  uint64_t beat_seen, beat_at; /* the peer's heartbeat, and when it last moved */
} erdma_conn;

#define ERDMA_MAX_LANES 8
typedef struct peer_info {
  struct sockaddr_storage addr;
  socklen_t addr_len;
  int known;
  char fingerprint[65];
  erdma_conn *conn;
  /* Extra QUIC connections (lanes[1..]; [0] unused: that is conn), each with
   * its own congestion window: one connection's window is capped near
   * 2 x bandwidth x min RTT, which delayed ACKs (a busy receiver, ACKs queued
   * behind data) leave unfilled.  They carry only CHUNK frames. */
  erdma_conn *lanes[ERDMA_MAX_LANES];
  /* With several lanes: CHUNK frames not yet given to a lane.  Each lane
   * takes more only while it has less than two chunks unwritten, so the
   * chunks go to whichever lane's window drains them (a lane pinned by
   * loss recovery takes few), not round-robin up front. */
  tx_item *lazy_head, *lazy_tail;
  int error;             /* ERDMA_ERR_PEER once lost */
  int closed_by_peer;
  uint64_t unexp_bytes;  /* unexpected messages from it held here (cfg.unexpected_max) */
} peer_info;

/* connection k of a peer: 0 the main one, 1.. its lanes (NULL: none) */
static inline erdma_conn *peer_conn(const peer_info *p, int k) {
  return k == 0 ? p->conn : p->lanes[k];
}
/* every connection of every peer, as c (peer i, slot k): a double loop */
#define FOR_PEER_CONNS(e, i, k, c)                                             \
  for (int i = 0; i < (e)->cfg.size; i++)                                      \
    for (int k = 0; k < (e)->lanes_max; k++)                                   \
      if (((c) = peer_conn(&(e)->peers[i], k)) != NULL)
/* the bytes of payload per CHUNK frame */
#define ERDMA_CHUNK_BYTES(e) ((e)->cfg.chunk_size ? (e)->cfg.chunk_size : (512u << 10))

/* ---- shared memory between ranks on one host (erdma_shm.c) ---- */
typedef struct shm_state {
  char job[64];
  int *local;            /* world ranks on this host, ascending */
  int nlocal;
  int my_index;
  uint64_t ring_bytes;
  struct shm_seg *seg;   /* our inbound rings */
  size_t map_len;
  char name[128];
  int unlinked;
  uint64_t next_liveness;
  int cma;               /* single-copy reads (process_vm_readv) allowed */
  int oversub;           /* more local ranks than CPUs: spinners yield every turn */
  int lf_spin;           /* threads peeking at the rings without e->mu (atomic) */
  uint64_t spin_ns;      /* a waiter's spin now (adapts; 0: cfg.spin_us) */
} shm_state;

/* ---- packet I/O (erdma_pktio_*.c) ----
 * A backend moves whole UDP payloads; it hands each received one to
 * engine_rx_datagram() and sends runs of packets laid out at a stride. */
typedef struct erdma_pktio {
  const char *name;
  void (*send)(erdma_engine *e, const struct sockaddr_storage *to, socklen_t tolen,
               uint8_t *bufs, size_t stride, const size_t *lens, int n);
  void (*recv)(erdma_engine *e);   /* drain what has arrived, without blocking */
  void (*close)(erdma_engine *e);
  int fd;                          /* readable when input waits; < 0: poll recv() */
  void *state;                     /* backend-private */
  void (*report)(erdma_engine *e); /* optional: counters to stderr (verbose, at shutdown) */
  /* Optional zero-copy transmit (DPDK: mbufs).  The writer asks for packet
   * buffers of the batch it is writing in order, tx_buf(e, i, want) for
   * i = 0, 1, ... (want: how many the batch may take, a hint for a bulk
   * allocation); each has ERDMA_TX_PREFIX writable bytes in front of it and
   * e->pkt_size behind it.  NULL: none left (pool empty); the writer stops
   * writing for this round.  tx_commit sends the first n buffers to `to`,
   * packet i being lens[i] bytes that start `pre` (0 or ERDMA_TX_PREFIX)
   * bytes before buffer i, and releases the batch (buffers n and up
   * unsent); n may be 0.  Without these the writer uses e->txbuf and send. */
  uint8_t *(*tx_buf)(erdma_engine *e, int i, int want);
  void (*tx_commit)(erdma_engine *e, const struct sockaddr_storage *to, socklen_t tolen,
                    size_t pre, const size_t *lens, int n);
} erdma_pktio;
/* room in front of a zero-copy packet buffer: a TURN ChannelData header */
#define ERDMA_TX_PREFIX 4

int pktio_udp_open(erdma_engine *e);
/* the largest UDP payload to `to` when it is on a directly attached network
 * (route MTU less headers, <= 65000); 0 when routed through a gateway or unknown */
size_t pktio_udp_path_payload(erdma_engine *e, const struct sockaddr_storage *to,
                              socklen_t tolen);

/* ---- NAT traversal (erdma_nat.c): demultiplexing, raw queue, relay tunnels ---- */
#define ERDMA_MAX_TURN 8          /* registered TURN servers */
#define ERDMA_RAW_QUEUE_MAX 256   /* datagrams waiting for erdma_engine_raw_recv */
#define ERDMA_RAW_QUEUE_BYTES (4u << 20)

typedef struct nat_raw {
  struct nat_raw *next;
  struct sockaddr_storage from;
  socklen_t fromlen;
  size_t len;
  uint8_t data[];
} nat_raw;

typedef struct nat_relay {
  int mode;              /* ERDMA_RELAY_*; OFF: no tunnel */
  int active;            /* packets to the peer go through the relay now */
  int turn;              /* index into nat_state.turn */
  uint16_t channel;
  struct sockaddr_storage peer; /* the address the channel is bound to */
  socklen_t peer_len;
  uint64_t quiet_since;  /* FALLBACK: first send, with packets in flight, since the
                            last direct datagram from the peer (0: none) */
  /* FALLBACK on the relay: the direct path is probed with a copy of a QUIC
   * packet at probe_at, the gap doubling up to cfg.direct_recheck */
  uint64_t probe_at, probe_gap;
  uint64_t direct_rx;    /* last authenticated direct datagram from the peer */
  uint64_t since;        /* when the route last changed */
} nat_relay;

typedef struct nat_state {
  struct sockaddr_storage turn[ERDMA_MAX_TURN];
  socklen_t turn_len[ERDMA_MAX_TURN];
  int nturn;
  nat_relay *relay;      /* by rank (allocated on the first erdma_engine_set_peer_relay) */
  int *relay_ranks;      /* ranks with a tunnel, nrelay of them */
  int nrelay;
  nat_raw *raw_head, *raw_tail;
  int raw_count;
  size_t raw_bytes;
  uint8_t *txbuf;        /* ChannelData staging: ERDMA_TX_BATCH x (pkt_size + 4) */
} nat_state;

/* nat_classify: the demultiplexer's verdict on a datagram's bytes (no state) */
enum { NAT_QUIC = 0, NAT_RAW, NAT_CHANNEL, NAT_DROP };
int nat_classify(const uint8_t *d, size_t len, int from_turn, uint16_t *ch, size_t *plen);
/* same family, address and port (IPv4, IPv6) */
int addr_equal(const struct sockaddr_storage *a, const struct sockaddr_storage *b);
/* All under e->mu.  nat_rx: 1 if the datagram was STUN/TURN (consumed);
 * nat_sendv: 1 if the packets went through a relay tunnel. */
int nat_rx(erdma_engine *e, const uint8_t *data, size_t len,
           const struct sockaddr_storage *from, socklen_t fromlen);
int nat_sendv(erdma_engine *e, erdma_conn *c, uint8_t *bufs, size_t *lens, int n);
/* bufs NULL: the packets are the backend's zero-copy batch (e->io.tx_buf) */
uint64_t nat_keepalive_ns(erdma_engine *e); /* the QUIC keep-alive interval, 0: off */
/* QUIC packets through a relay stay within what TURN servers carry (coturn
 * relays at most 16 KiB; Internet paths 1500-byte frames): a connection to a
 * peer with a relay tunnel when it is created writes packets of at most this */
#define ERDMA_RELAY_PAYLOAD 1452
size_t nat_max_udp_payload(erdma_engine *e, const erdma_conn *c);
void nat_free(erdma_engine *e);
/* The DPDK backend lives in its own shared object (erdmampi/_erdma_dpdk*.so,
 * built only where libdpdk is installed) which the engine dlopens when
 * cfg.pktio is ERDMA_PKTIO_DPDK: `import erdmampi` never loads DPDK.  The
 * plugin cannot see the engine's symbols (Python loads modules RTLD_LOCAL),
 * so the engine hands it what it calls. */
#define ERDMA_PKTIO_ABI 3
typedef struct erdma_pktio_host {
  int abi;                         /* ERDMA_PKTIO_ABI */
  size_t engine_size;              /* sizeof(erdma_engine): both built from one tree */
  /* engine_rx_datagram: 1 when the datagram authenticated as its sender's
   * (what a backend may learn from the packet's headers: only then) */
  int (*rx_datagram)(erdma_engine *e, const uint8_t *data, size_t len,
                     const struct sockaddr_storage *from, socklen_t fromlen);
  char *err;                       /* the plugin explains a failure here */
  size_t errlen;
} erdma_pktio_host;
typedef int (*erdma_pktio_open_fn)(erdma_engine *e, const erdma_pktio_host *host);
#define ERDMA_PKTIO_DPDK_OPEN "erdma_pktio_dpdk_open"
/* The DPDK backend's parser of received Ethernet frames (erdma_pktio_dpdk.c),
 * on plain bytes: no DPDK needed (fuzz/c/fuzz_dpdk_parse.c).  Addresses and
 * ports in network order; pointers point into the frame. */
enum {
  FRAME_IGNORED = 0, /* IPv4 not for our address and UDP port, runt, fragment, options */
  FRAME_OTHER,       /* not for our MAC (nor broadcast), or neither IPv4 nor ARP */
  FRAME_BAD_CSUM,    /* an IPv4 header or UDP checksum that does not verify */
  FRAME_UDP,         /* a UDP datagram for us: src_*, payload, len, partial */
  FRAME_ARP,         /* an Ethernet/IPv4 ARP packet: op, sha, sip, tip */
};
#define FRAME_HW_IP_CSUM_GOOD 1u /* the port verified the IPv4 header checksum */
#define FRAME_HW_L4_CSUM_GOOD 2u /* ... and the UDP checksum */
typedef struct dpdk_frame {
  const uint8_t *src_mac;    /* the Ethernet source (6 bytes) */
  uint32_t src_ip;           /* UDP */
  uint16_t src_port;
  const uint8_t *payload;
  size_t len;
  int partial;               /* the UDP checksum held only the pseudo-header sum */
  uint16_t op;               /* ARP: host order */
  const uint8_t *sha;        /* sender hardware address (6 bytes) */
  uint32_t sip, tip;
} dpdk_frame;
int dpdk_parse_frame(const uint8_t *f, size_t n, const uint8_t mac[6], uint32_t ip,
                     uint16_t udp_port, unsigned hw, dpdk_frame *out);

/* ---- the engine ---- */
#define ERDMA_BATCH 32     /* datagrams per recvmmsg */
#define ERDMA_TX_BATCH 64  /* packets per sendmmsg (one pacing burst at most) */

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


/* engine.c */
uint64_t erdma_now(void);
int addr_is_loopback(const struct sockaddr_storage *a);
/* numeric host and port of an IPv4/IPv6 address ("" and 0 for another family) */
void addr_format(const struct sockaddr_storage *a, char *host, size_t hostcap, int *port);
/* numeric or DNS host + port -> sockaddr (ERDMA_ERR_INVAL when it does not resolve) */
int addr_resolve(const char *host, int port, struct sockaddr_storage *out, socklen_t *len);
void engine_wake(erdma_engine *e);
/* bufs: n packets at a stride of e->pkt_size; NULL: the first n buffers of
 * the backend's zero-copy batch (e->io.tx_buf), which it releases (n >= 0) */
void engine_sendv(erdma_engine *e, erdma_conn *c, uint8_t *bufs, size_t *lens, int n);
int engine_rx_datagram(erdma_engine *e, const uint8_t *data, size_t len,
                       const struct sockaddr_storage *from, socklen_t fromlen);
/* the packet size of connection c (its settings' max_tx_udp_payload_size) */
size_t engine_conn_payload(erdma_engine *e, const erdma_conn *c);
/* bytes conn_flush lets ngtcp2 write into one packet buffer */
size_t engine_write_room(erdma_engine *e, const erdma_conn *c);

/* match.c (all under e->mu) */
erdma_req *req_new(erdma_engine *e, int kind);
void req_complete(erdma_req *r, int error);
void req_release(erdma_req *r);      /* drop an engine reference */
int match(int want_src, int want_tag, uint32_t want_ctx, int src, int tag, uint32_t ctx);
erdma_req *posted_take(erdma_engine *e, int src, int tag, uint32_t ctx);
erdma_msg *unexp_find(erdma_engine *e, int src, int tag, uint32_t ctx);
erdma_msg *msg_new(int src, int tag, uint32_t ctx, uint64_t len);
void msg_free(erdma_msg *m);
void bind_recv(erdma_engine *e, erdma_req *r, erdma_msg *m);
int recv_prepare(erdma_req *r, int src, int tag, uint64_t len);
void recv_finish(erdma_req *r);
void engine_fail_peer(erdma_engine *e, int peer, int error);
void rndv_recv_unlink(erdma_engine *e, erdma_req *r); /* off e->rndv_recv, if on it */

/* ulfm.c (under e->mu) */
void ulfm_note_failure(erdma_engine *e, int peer);
int ctx_failure_unacked(erdma_engine *e, uint32_t ctx); /* a member failed, unacknowledged */
int req_failure_pending(erdma_req *r); /* ANY_SOURCE receive with an unacked failure */
int reqs_failure_pending(erdma_req *const *reqs, int n);
void ulfm_free(erdma_engine *e);

/* shm.c (all under e->mu) */
int shm_attach_peers(erdma_engine *e);  /* 0 when all attached, 1 if some not yet */
int shm_is_local(erdma_engine *e, int rank);
int shm_flush(erdma_conn *c);
int shm_send_direct(erdma_conn *c, const frame_hdr *h, const void *buf, uint64_t n);
int shm_poll(erdma_engine *e);          /* returns bytes consumed */
int shm_sleep_prepare(erdma_engine *e); /* 1: data pending, don't sleep */
void shm_sleep_done(erdma_engine *e);
void shm_spin_begin(erdma_engine *e);
void shm_spin_end(erdma_engine *e);
int shm_rx_ready(erdma_engine *e);      /* lock-free: some inbound ring has bytes */
int shm_shares_cpu(erdma_engine *e);    /* lock-free: a local peer runs on our CPU */
int shm_move_off_cpu(erdma_engine *e);  /* lock-free: go to another CPU of our mask */
int shm_wait(erdma_engine *e, erdma_req *const *reqs, int n, uint64_t deadline);
void shm_wake_waiters(erdma_engine *e); /* a request completed */
void shm_app_active(erdma_engine *e);   /* an application thread leaves a call */
void shm_app_idle(erdma_engine *e);     /* ... or sleeps on e->cv */
uint64_t shm_next_wake(erdma_engine *e, uint64_t exp, uint64_t now);
void shm_conn_release(erdma_conn *c);
void shm_teardown(erdma_engine *e);
int shm_cma_read(erdma_engine *e, int peer, void *dst, uint64_t addr, uint64_t n,
                 uint32_t sid);          /* 0, -1: use the ring, -2: send withdrawn */
int shm_cma_publish(erdma_engine *e, erdma_req *r); /* 1: r may be read with CMA */
void shm_cma_release(erdma_req *r);
/* bulk copies for the one-host collectives (no lock needed) */
int shm_cma_ok(erdma_engine *e, int peer);
int shm_cma_copy(erdma_engine *e, int peer, void *local, uint64_t remote, uint64_t n,
                 int write);

/* conn.c (all under e->mu) */
erdma_conn *conn_alloc(erdma_engine *e, int client);
int conn_rx_feed(erdma_conn *c, const uint8_t *data, size_t len);
/* stream bytes of rx state i (0: control stream, 1..: the peer's data streams)
 * into the frame parser; fin: the stream ends after them.  Nonzero: the peer
 * broke the protocol (c->violation says how); drop the connection. */
int conn_rx_feed_at(erdma_conn *c, int i, const uint8_t *data, size_t len, int fin);
void rx_detach(rx_state *x);                     /* forget the receive x fills */
void conn_detach_req(erdma_engine *e, erdma_req *r); /* ... every rx state filling r */
void unexp_release(erdma_engine *e, int peer, uint64_t n); /* n bytes of peer's unexpected
                                                              messages are gone */
void conn_acked(erdma_conn *c, uint64_t upto);
void conn_send_payload(erdma_conn *c, erdma_req *r, uint64_t recv_id, int chunks_ok);
/* every rx state (control stream and data streams) of c */
#define CONN_RX_COUNT (1 + ERDMA_MAX_DSTREAMS)
rx_state *conn_rx_at(erdma_conn *c, int i);
int conn_client_new(erdma_engine *e, int peer, int lane);
int conn_lanes_wanted(erdma_engine *e, int peer); /* connections to open to a QUIC peer */
uint64_t conn_lanes_ready(erdma_engine *e);       /* extra lanes that carry chunks now */
/* 1: the datagram carried a 1-RTT packet that authenticated for a connection
 * to a known rank whose address is `from` (it came from that peer) */
int conn_handle_datagram(erdma_engine *e, const uint8_t *data, size_t len,
                         const struct sockaddr_storage *from, socklen_t fromlen);
int conn_flush(erdma_conn *c);
void conn_flush_all(erdma_engine *e);
void conn_handle_expiry_all(erdma_engine *e);
void conn_log_paths(erdma_engine *e); /* one line per QUIC peer: cwnd, RTT, rates */
uint64_t conn_decrypted_count(void);  /* packets authenticated by this thread so far */
uint64_t conn_next_expiry(erdma_engine *e);
void conn_enqueue(erdma_conn *c, const frame_hdr *h, const void *payload,
                  uint64_t plen, uint8_t *owned, erdma_req *req);
void conn_close(erdma_conn *c, int graceful);
void lanes_refill(erdma_engine *e, int peer); /* hand waiting chunks to lanes with room */
void lanes_drop(erdma_engine *e, int peer, int error); /* fail and free waiting chunks */
void conn_reap_pending(erdma_engine *e);
void conn_free(erdma_conn *c);
void item_release_req(tx_item *t, int error); /* drop t's reference to its send */
int conn_tx_idle(erdma_conn *c);

/* the communicator arguments of the erdma_coll_* calls (coll.c, bulk.c) */
static inline int coll_check_comm(erdma_engine *e, const int *ranks, int n, int me) {
  if (!e || !ranks || n < 1 || me < 0 || me >= n) return ERDMA_ERR_INVAL;
  return 0;
}

/* tls.c */
/* a self-signed identity named after `rank`, its credentials, the TLS
 * priorities QUIC sessions use and the certificate's fingerprint (what
 * tls_identity_new makes for an engine; no engine needed) */
int tls_identity_make(int rank, gnutls_certificate_credentials_t *cred,
                      gnutls_priority_t *prio, char fingerprint[65]);
int tls_identity_new(erdma_engine *e);
void tls_identity_free(erdma_engine *e);

#endif
