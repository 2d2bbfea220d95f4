/* erdma_conn.h - connections to peer ranks (erdma_conn.c).
 *
 * The component owns the wire protocol's frame header (docs/wire.md) and
 * its codec, the frames queued on a connection's streams (tx_item,
 * tx_stream), the frame parser's receive states (rx_state), the connection
 * itself (erdma_conn, over QUIC or shared memory) and the engine's table
 * entry for a peer rank (peer_info: its connection and lanes).  It includes
 * erdma_quic.h for the QUIC connection a conn holds and the length of the
 * connection IDs it issues; requests and messages (erdma_match.h) and the
 * engine (erdma_engine.h) appear here only behind pointers, whose types
 * erdma.h declares, and shared memory's rings (erdma_shm.c) as struct tags. */
#ifndef ERDMA_CONN_H
#define ERDMA_CONN_H

#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "erdma.h"
#include "erdma_quic.h"

/* ---- wire protocol (docs/design.md, "Wire protocol") ---- */
#define ERDMA_HDR_LEN 32
enum { FR_HELLO = 1, FR_EAGER = 2, FR_RTS = 3, FR_CTS = 4, FR_DATA = 5, FR_CHUNK = 6,
       FR_RATE = 7 };
#define FR_FLAG_SYNC 1
#define FR_FLAG_CMA 2 /* shared memory: RTS id = sender address, aux = request id; CTS: done */
#define FR_FLAG_CHUNKS 4 /* CTS: the payload may come as CHUNK frames on data streams */
#define FR_FLAG_LANE 8   /* HELLO: this connection is extra lane `aux` of the sender */
#define FR_FLAG_SPLIT 16 /* CTS with FR_FLAG_CMA: len = the receiver's buffer, whose second
                          * part the sender may write while the receiver reads the first */

typedef struct frame_hdr {
  uint8_t type, flags;
  uint32_t ctx;   /* HELLO: sender rank */
  int32_t tag;
  uint64_t len;   /* payload length (EAGER/DATA/RTS); HELLO: world size; RATE: bytes/s */
  uint64_t id;    /* RTS, CTS: sender req id; DATA: receiver req id (CTS: len = receiver req id) */
  uint32_t aux;   /* RTS with FR_FLAG_CMA: sender req id */
  uint64_t off;   /* CHUNK: offset of the payload in the message (bytes 8..15) */
} frame_hdr;

void hdr_encode(uint8_t out[ERDMA_HDR_LEN], const frame_hdr *h);
void hdr_decode(frame_hdr *h, const uint8_t in[ERDMA_HDR_LEN]);

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

/* ---- the transport under a connection: its channel ----
 * Every connection carries the same frames through conn_enqueue and
 * conn_flush; what its transport adds is behind this table: QUIC
 * (erdma_conn.c: erdma_quic_chan) or a pair of shared-memory rings
 * (erdma_shm.c: erdma_shm_chan).  The send path (erdma_isend) and matching
 * reach a transport only through it (the conn_* calls below); a NULL entry
 * is a capability the transport lacks. */
struct erdma_conn;
typedef struct erdma_chan {
  const char *name;
  int in_place;          /* offers sends for the peer to read in place (RTS FR_FLAG_CMA) */
  int chunks;            /* takes CHUNK frames on data streams (CTS FR_FLAG_CHUNKS) */
  /* bytes up to which an eager frame is sent at once */
  uint64_t (*eager_max)(const struct erdma_conn *c);
  /* an eager frame written now, nothing queued before it: 1, else 0 (queue it) */
  int (*send_now)(struct erdma_conn *c, const frame_hdr *h, const void *buf, uint64_t n);
  /* send r's buffer may be read by the peer in place until withdraw: 1, else 0 */
  int (*offer)(struct erdma_conn *c, erdma_req *r);
  void (*withdraw)(erdma_req *r);
  /* n bytes at addr of the peer's offered send `sid` into dst: 0 done; -1
   * not possible (the payload comes as frames); -2 the peer withdrew it */
  int (*take)(struct erdma_conn *c, void *dst, uint64_t addr, uint64_t n, uint32_t sid);
  /* a message from the peer may be taken by take_split now */
  int (*split_ok)(const struct erdma_conn *c);
  /* the same, with the peer invited (a CTS FR_FLAG_SPLIT sent) to write the
   * second part into dst at once (push); returns as take once both parts
   * are in place or the copy is abandoned (nothing written into dst after),
   * or 1: done, and the peer completes its send without our CTS */
  int (*take_split)(struct erdma_conn *c, void *dst, uint64_t addr, uint64_t n, uint32_t sid);
  /* our offered send r: write its second part to address raddr of the peer,
   * unless the peer took it first; 1 when r is complete (the peer has read
   * the rest and sends no CTS), else 0 */
  int (*push)(struct erdma_conn *c, erdma_req *r, uint64_t raddr);
  int (*flush)(struct erdma_conn *c);     /* write what is queued, as far as it goes */
  void (*release)(struct erdma_conn *c);  /* the connection is freed */
} erdma_chan;

extern const erdma_chan erdma_quic_chan; /* erdma_conn.c */
extern const erdma_chan erdma_shm_chan;  /* erdma_shm.c */

typedef struct erdma_conn {
  erdma_engine *e;
  const erdma_chan *chan; /* its transport (conn_alloc: QUIC) */
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
  int foreign_cert;       /* a client: the address dialled showed another certificate */
  struct erdma_conn *next_pending; /* server conns awaiting HELLO */
  uint64_t accepted_at;  /* server conns: first packet (the HELLO deadline counts from it) */
  int from_peer_host;    /* server conns: from a source where a rank was published */
  /* shared memory (erdma_shm.c): a conn without ngtcp2 (chan: erdma_shm_chan) */
  int shm;
  struct shm_ring *tx_ring, *rx_ring;
  uint64_t tx_ring_tail;  /* tx_ring's tail as last read: re-read only when room is short */
  uint64_t tx_ring_head;  /* tx_ring's head, which only we write: never read back from
                           * the ring, whose line the consumer keeps reading (and a
                           * demoted one has left our caches) */
  int rx_since_tx;        /* bytes came from the peer since our last frame to it: the next
                           * one is likely a reply it waits for (ring_demote) */
  struct shm_seg *peer_seg;
  pid_t peer_pid;         /* the peer's pid as its segment gave it when mapped: the
                           * segment stays writable by the peer, which must not
                           * steer our CMA copies to another process later */
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
  int cma_read;          /* a process_vm_readv from it has succeeded (shm_cma_copy) */
  /* The arrival rate of its QUIC packets, all its connections together, in
   * bins of about RATE_BIN (conn_rate_account): the open bin's start and
   * bytes, the last closed bin's rate, the highest rate two bins in a row
   * reached, and the highest told to it in a RATE frame (bytes/s) */
  uint64_t rx_bin_at, rx_bin_bytes, rx_prev_rate, rx_rate, rx_rate_sent;
} peer_info;

/* connection k of a peer: 0 the main one, 1.. its lanes (NULL: none) */
static inline erdma_conn *peer_conn(const peer_info *p, int k) {
  return k == 0 ? p->conn : p->lanes[k];
}

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
void conn_rate_account(erdma_engine *e, int peer, size_t len, uint64_t now);
/* RATE frames: the bounds of a rate a peer may report, and the ceiling a
 * report sets on our pacing towards it (RATE_GAIN x the rate) */
#define RATE_MIN (1u << 20)                  /* bytes/s: below it, no report */
#define RATE_MAX (1ull << 40)
#define RATE_GAIN 1.25
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
/* the channel's calls (see erdma_chan) */
uint64_t conn_eager_max(const erdma_conn *c);
int conn_send_now(erdma_conn *c, const frame_hdr *h, const void *buf, uint64_t n);
int conn_offer(erdma_conn *c, erdma_req *r);  /* records the channel in r->offered */
int conn_take(erdma_conn *c, void *dst, uint64_t addr, uint64_t n, uint32_t sid);
int conn_can_split(const erdma_conn *c);
int conn_take_split(erdma_conn *c, void *dst, uint64_t addr, uint64_t n, uint32_t sid);
int conn_push(erdma_conn *c, erdma_req *r, uint64_t raddr);
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

#endif /* ERDMA_CONN_H */
