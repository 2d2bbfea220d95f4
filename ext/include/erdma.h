/*
 * erdma.h - the one public header of the erdmampi transport engine.
 *
 * The engine owns one UDP socket per rank, a QUIC connection (ngtcp2 +
 * GnuTLS) to every peer rank, MPI message matching and a progress thread.
 * Python drives it through cffi: ext/build_engine.py turns this header into
 * the cdef, so it must stay free of constructs cffi cannot parse.
 *
 * Every function returns 0 or a negative ERDMA_ERR_* code.  Blocking calls
 * (erdma_req_wait*, erdma_probe, erdma_engine_connect) only block on a
 * condition variable; cffi releases the GIL around them.
 */
#ifndef ERDMA_H
#define ERDMA_H

#include <stddef.h>
#include <stdint.h>

#define ERDMA_VERSION "0.1.0"
#define ERDMA_ALPN "erdma/1"

/* Wildcards, equal to MPICH's MPI_ANY_SOURCE / MPI_ANY_TAG. */
#define ERDMA_ANY_SOURCE (-2)
#define ERDMA_ANY_TAG (-1)

/* Error codes: negative.  Codes below ERDMA_ERR_FATAL break the engine. */
#define ERDMA_OK 0
#define ERDMA_ERR_INVAL (-1)      /* bad argument */
#define ERDMA_ERR_NOMEM (-2)
#define ERDMA_ERR_TRUNCATE (-3)   /* message longer than the receive buffer */
#define ERDMA_ERR_TIMEOUT (-4)    /* a wait with a timeout ran out */
#define ERDMA_ERR_PEER (-5)       /* peer connection lost or closed */
#define ERDMA_ERR_RANK (-6)       /* rank out of range */
#define ERDMA_ERR_CANCELLED (-7)  /* request was cancelled (not an error) */
#define ERDMA_ERR_SOCKET (-8)     /* socket setup failed */
#define ERDMA_ERR_TLS (-9)        /* TLS / certificate failure */
#define ERDMA_ERR_QUIC (-10)      /* ngtcp2 failure */
#define ERDMA_ERR_STATE (-11)     /* call not valid in this engine state */
#define ERDMA_ERR_AUTH (-12)      /* peer failed authentication */
#define ERDMA_ERR_PKTIO (-13)     /* packet I/O backend unavailable (erdma_last_error says why) */
#define ERDMA_ERR_PEER_PENDING (-14) /* an ANY_SOURCE receive's communicator lost a member
                                       (failure not acknowledged); the receive is still posted */
#define ERDMA_ERR_FATAL (-100)

/* Congestion control (values of ngtcp2_cc_algo); AUTO: BBR towards peers on
 * other hosts, CUBIC over loopback. */
#define ERDMA_CC_AUTO (-1)
#define ERDMA_CC_RENO 0
#define ERDMA_CC_CUBIC 1
#define ERDMA_CC_BBR 2
#define ERDMA_CC_BBR2 3

/* Packet I/O backends (erdma_config.pktio; docs/dpdk.md). */
#define ERDMA_PKTIO_UDP 0   /* kernel UDP socket (sendmmsg + GSO, recvmmsg + GRO) */
#define ERDMA_PKTIO_DPDK 1  /* DPDK port: own Ethernet/IPv4/UDP, ARP, polling */

/* Send flags. */
#define ERDMA_SEND_SYNC 1 /* complete only once the receiver matched (Ssend) */
#define ERDMA_SEND_BUFFERED 4 /* complete without the receiver (Bsend): eager wherever the
                                 size allows, never by the point-to-point CMA rule */
#define ERDMA_SEND_BULK 2 /* a collective's block: to a rank of this host, from
                             cfg.shm_bulk_cma_min bytes by one CMA read, not the ring */
#define ERDMA_SEND_EXCHANGE 8 /* the peer sends to us meanwhile (Sendrecv, a collective's
                                 round), rather than waiting for this as a reply: to a
                                 rank of this host, its bytes are not demoted (cfg.shm_demote) */

typedef struct erdma_engine erdma_engine;
typedef struct erdma_req erdma_req;
typedef struct erdma_msg erdma_msg; /* a message taken by a matched probe */

typedef struct erdma_config {
  int rank;
  int size;
  const char *bind_addr;     /* local IPv4/IPv6 address to bind, "0.0.0.0" ok */
  int port;                  /* 0 = ephemeral */
  int cc_algo;               /* ERDMA_CC_* (ERDMA_CC_AUTO: by path) */
  uint64_t eager_limit;      /* bytes; larger messages use RTS/CTS */
  uint64_t shm_eager_limit;  /* bytes (>= eager_limit): a message to a rank of this host up to
                                this size goes into its ring when it fits there now, else RTS */
  uint64_t shm_bulk_cma_min; /* bytes from which a collective's block to a rank of this host
                                goes by RTS and one CMA read even below shm_eager_limit
                                (0: measured at shm set-up; UINT64_MAX: never) */
  uint64_t shm_p2p_cma_min;  /* bytes from which a point-to-point message (an even context;
                                collectives use odd ones) to a rank of this host goes by RTS
                                and one CMA read (0: never; see erdma_shm.c) */
  uint64_t shm_p2p_split_min; /* bytes from which a point-to-point message to a rank of this
                                host goes by RTS and is copied half by its receiver, half by
                                its sender at once, with CMA (0: never; see erdma_shm.c) */
  int shm_cma_bounce;        /* a CMA copy whose destination lies 1-63 bytes after its source
                                modulo the page goes through a buffer at the source's offset
                                (the kernel's copy stalls there on some CPUs): 0: if a
                                self-read at shm set-up shows the stall, 1: always, 2: never */
  int shm_demote;            /* lines written for a rank of this host (ring bytes, pair
                                flags) go to the shared cache at once (CLDEMOTE): 0: where
                                the CPU has the instruction, 1: always (a NOP elsewhere),
                                2: never */
  double idle_timeout;       /* seconds without peer traffic before a peer is dead */
  double handshake_timeout;  /* seconds */
  double hello_timeout;      /* seconds an accepted connection has, from its first packet, to
                                complete the handshake and send its HELLO before it is dropped */
  int insecure;              /* 1: a peer given an empty fingerprint may present any
                                certificate (or none); 0: set_peer refuses an empty one */
  size_t max_udp_payload;    /* 0 = automatic (65000 on loopback, route MTU to an on-link jumbo peer, else 1452) */
  uint64_t stream_window;    /* initial QUIC stream flow-control window, bytes */
  uint64_t conn_window;      /* initial QUIC connection flow-control window, bytes */
  uint64_t max_stream_window; /* auto-tuning ceiling of the stream window, bytes */
  uint64_t max_conn_window;  /* auto-tuning ceiling of the connection window, bytes */
  int pace;                  /* 1: BBR connections are paced by the engine at BBR's rate
                                (0, the default: ngtcp2's pacing alone, which lets
                                bursts through) */
  uint64_t max_pacing_rate;  /* bytes per second: ceiling of each connection's pacing
                                rate, as Linux's SO_MAX_PACING_RATE (0: none); a
                                ceiling makes the engine pace BBR connections */
  int pace_learn;            /* 1: a connection that paces keeps below 1.25 x the rate
                                its packets reach the peer at (the peer's RATE
                                frames) */
  int sock_buf;              /* SO_SNDBUF/SO_RCVBUF bytes (forced when allowed) */
  int data_streams;          /* unidirectional streams per peer for payload (0: none) */
  int lanes;                 /* QUIC connections to each peer on another host (1-8; 0:
                                automatic); lanes after the first carry only payload */
  uint64_t chunk_size;       /* bytes of payload per CHUNK frame on a data stream */
  uint64_t unexpected_max;   /* bytes of unexpected messages held per peer; beyond, its
                                control stream gets no more QUIC flow-control credit
                                until the application receives some (0: default 64 MiB) */
  uint64_t recv_alloc_max;   /* the largest message a receive without a buffer (object,
                                Mrecv) allocates; larger fail with ERDMA_ERR_NOMEM (0:
                                the machine's physical memory) */
  uint64_t shm_unexpected_max; /* bytes of unexpected messages held per rank of this host
                                while nothing here waits for a message (a receive, a probe)
                                or for a peer (a send); beyond, its bytes stay in its ring and
                                its sends wait for room (0: default 1 MiB; at most
                                unexpected_max, which applies while something waits) */
  int spin_us;               /* a waiter polls the socket this long before sleeping */
  int verbose;
  /* NAT traversal (erdma_nat.c) */
  double keepalive;          /* seconds of idleness before a QUIC PING (keeps NAT
                                bindings open); < 0: automatic (idle_timeout / 4), 0: off */
  double path_timeout;       /* ERDMA_RELAY_FALLBACK: seconds of silence on the direct
                                path, with packets outstanding, before using the relay */
  double direct_recheck;     /* ERDMA_RELAY_FALLBACK on the relay: the longest gap in
                                seconds between probes of the direct path (the first
                                comes after 0.25 s, each next one twice as late); a
                                probe the peer answers directly moves QUIC back to the
                                direct path.  0: stay on the relay */
  /* packet I/O (docs/dpdk.md); the strings are read during erdma_engine_new only */
  int pktio;                 /* ERDMA_PKTIO_UDP or ERDMA_PKTIO_DPDK */
  const char *dpdk_plugin;   /* path of the DPDK backend shared object (_erdma_dpdk) */
  const char *dpdk_eal;      /* EAL arguments, separated by blanks */
  int dpdk_port;             /* DPDK port id */
  int dpdk_queue;            /* rx/tx queue of that port */
  int dpdk_prefix;           /* IPv4 prefix length of the local subnet (default 24) */
  const char *dpdk_gateway;  /* next hop towards peers off the subnet ("" none) */
  const char *dpdk_neigh;    /* static neighbours "ip=mac,ip=mac" ("" none: ARP) */
  int dpdk_poll_us;          /* longest sleep of the idle polling thread (microseconds) */
  int dpdk_copy;             /* 1: copy each packet into an mbuf (no zero-copy transmit) */
  int dpdk_nobuf_every;      /* tests: fail every Nth mbuf allocation (0: never) */
  /* diagnostics; the engine reads no environment variable (erdmampi/config.py does) */
  int cc_log;                /* ngtcp2's log on stderr: 0 off, 1 congestion-control events,
                                2 every line */
  int path_log_ms;           /* verbose >= 2: milliseconds between path reports (0: 1000) */
  int launcher_pid;          /* the ranks' launcher: it and its descendants may read this
                                rank's memory (CMA) under Yama scope 1; 0: the parent */
  uint64_t trace_msgs;       /* > 0: record the first this many point-to-point messages
                                posted (erdma_trace_start) from the start; 0: off */
} erdma_config;

typedef struct erdma_status {
  int source;        /* sender's rank (world) */
  int tag;
  int error;         /* 0 or ERDMA_ERR_* */
  int cancelled;
  uint64_t nbytes;   /* bytes received (or bytes of the probed message) */
} erdma_status;

typedef struct erdma_stats {
  uint64_t pkts_sent, pkts_recv, bytes_sent, bytes_recv;
  uint64_t msgs_sent, msgs_recv, unexpected;
  uint64_t chunks_sent, chunks_recv; /* CHUNK frames (payload on data streams) */
  /* NAT traversal: datagrams queued for erdma_engine_raw_recv, dropped because
   * that queue was full, and QUIC packets through TURN relay tunnels */
  uint64_t raw_queued, raw_dropped, relay_sent, relay_recv;
  /* FALLBACK tunnels: moves from the direct path to the relay and back, and
   * the probes of the direct path sent while on the relay */
  uint64_t to_relay, to_direct, direct_probes;
  /* CHUNK frames that went over, or came in on, a peer's extra lanes; extra
   * lanes ready to carry chunks now (all peers) */
  uint64_t lane_chunks_sent, lane_chunks_recv, lanes_ready;
  /* admission: accepted connections without a HELLO now; Retry packets
   * sent; unnamed connections dropped (table full, or no HELLO in time) */
  uint64_t conns_pending, retries_sent, pending_dropped;
  /* RATE frames: arrival rates told to peers, and told by them (ceilings
   * on our pacing) */
  uint64_t rate_reports_sent, rate_reports_recv;
  /* one-host point-to-point copies split between receiver and sender:
   * receives that invited their sender, and second parts this rank wrote
   * into a receiver's buffer as the sender */
  uint64_t split_recvs, split_pushes;
  /* ring writes to a local peer moved to the shared cache as replies
   * (ERDMA_SHM_DEMOTE) */
  uint64_t shm_demotes;
} erdma_stats;

void erdma_config_default(erdma_config *cfg);
const char *erdma_strerror(int rc);
int erdma_err_is_fatal(int rc);
/* Why the last erdma_engine_new of this thread failed, in words ("" if not known). */
const char *erdma_last_error(void);
/* The calling thread's vector state (erdma_cpu.c): erdma_cpu_settle clears
 * the upper halves of the AVX registers (VZEROUPPER; nothing without AVX),
 * which code that leaves them in use makes every later SSE instruction of
 * the thread wait on; erdma_cpu_upper_in_use: whether they are in use now
 * (1, 0; -1 where the CPU cannot tell). */
void erdma_cpu_settle(void);
int erdma_cpu_upper_in_use(void);
/* A receive buffer's pages (erdma_pages.c): when the buffer (at least
 * ERDMA_PREFAULT_MIN bytes) has never been written, so that its writes would
 * fault page by page, erdma_prefault maps its pages in one system call:
 * 1 when it did, 0 when it was not needed or could not.  The bytes do not
 * change. */
#define ERDMA_PREFAULT_MIN 65536
int erdma_prefault(void *buf, uint64_t nbytes);

/* Create the engine: generates a TLS identity and binds the UDP socket. */
int erdma_engine_new(const erdma_config *cfg, erdma_engine **out);
/* "ip:port" of the bound socket; SHA-256 fingerprint (hex) of our certificate. */
int erdma_engine_local_addr(erdma_engine *e, char *buf, size_t len);
int erdma_engine_fingerprint(erdma_engine *e, char *buf, size_t len);
/* Tell the engine where rank `rank` listens and which certificate it holds.
 * A NULL or "" fingerprint (accept any certificate) is refused with
 * ERDMA_ERR_AUTH unless cfg.insecure is set. */
int erdma_engine_set_peer(erdma_engine *e, int rank, const char *host, int port,
                          const char *fingerprint);
/* Ranks on this host (ascending world ranks, including this one) talk through
 * shared memory instead of QUIC: call before erdma_engine_connect, with the
 * same list on every one of them.  `job` names the segments.  use_cma: large
 * messages are read straight from the sender (process_vm_readv, one copy). */
int erdma_engine_shm_setup(erdma_engine *e, const char *job, const int *local_ranks,
                           int nlocal, uint64_t ring_bytes, int use_cma);
/* Start the progress thread and open QUIC connections to all lower ranks;
 * wait (up to cfg.handshake_timeout) until every peer is connected. */
int erdma_engine_connect(erdma_engine *e);
/* Wait until all queued outgoing data is acknowledged, then close every
 * connection and stop the progress thread. */
int erdma_engine_shutdown(erdma_engine *e, double timeout);
void erdma_engine_free(erdma_engine *e);
int erdma_engine_stats(erdma_engine *e, erdma_stats *st);
/* The configuration in effect: erdma_engine_new's, with what the engine has
 * measured or settled since (cfg.shm_bulk_cma_min after shared memory was
 * set up: UINT64_MAX for never).  Its bind_addr is the engine's own: valid
 * while the engine lives. */
int erdma_engine_config(erdma_engine *e, erdma_config *out);
/* Name of the peer failure, if any ("" if none). */
int erdma_engine_peer_error(erdma_engine *e, int rank);
/* A text list of the pending operations (posted receives, sends waiting for
 * their receivers, unexpected messages, lost peers), at most `limit` of each,
 * NUL-terminated in buf (truncated to cap); never blocks for long. */
int erdma_engine_describe(erdma_engine *e, char *buf, size_t cap, int limit);
/* QUIC path figures towards one peer, for diagnostics (erdma_diag.c). */
typedef struct erdma_peer_stat {
  int connections;           /* open QUIC connections (main + lanes); 0: none (shm/self) */
  int lost;                  /* the peer failed */
  double srtt_us, min_rtt_us, rttvar_us;  /* of the main connection */
  uint64_t cwnd;             /* congestion windows, summed over connections */
  uint64_t bytes_in_flight;
  uint64_t pto_count;        /* probe timeouts in a row (loss recovery in progress) */
  uint64_t lost_packets;     /* our packets with stream data declared lost (resent) */
  double delivery_rate_bps;  /* ngtcp2's delivery-rate estimate, bits per second */
} erdma_peer_stat;
int erdma_engine_peer_stat(erdma_engine *e, int rank, erdma_peer_stat *out);

/* Point to point.  buf must stay valid until the request completes. */
int erdma_isend(erdma_engine *e, const void *buf, uint64_t nbytes, int dest,
                int tag, uint32_t ctx, int flags, erdma_req **out);
/* buf == NULL && alloc != 0: the engine allocates a buffer of the message's
 * size on match; read it with erdma_req_data. */
int erdma_irecv(erdma_engine *e, void *buf, uint64_t cap, int source, int tag,
                uint32_t ctx, int alloc, erdma_req **out);
int erdma_iprobe(erdma_engine *e, int source, int tag, uint32_t ctx, int *flag,
                 erdma_status *st);
int erdma_improbe(erdma_engine *e, int source, int tag, uint32_t ctx, int *flag,
                  erdma_msg **msg, erdma_status *st);
/* Blocking probes; timeout < 0 waits forever. */
int erdma_probe(erdma_engine *e, int source, int tag, uint32_t ctx,
                double timeout, erdma_status *st);
int erdma_mprobe(erdma_engine *e, int source, int tag, uint32_t ctx,
                 double timeout, erdma_msg **msg, erdma_status *st);
int erdma_imrecv(erdma_engine *e, erdma_msg *msg, void *buf, uint64_t cap,
                 int alloc, erdma_req **out);

/* Message trace (tests): every send and receive posted on the engine
 * (erdma_isend, erdma_irecv, erdma_imrecv, erdma_shm_try_send and all that
 * post through them: the collectives of erdma_coll.c, erdma_bulk.c and the
 * schedule executor), in the order they were posted, at the matching layer.
 * Off (the default) it costs one branch per message. */
#define ERDMA_TRACE_SEND 0
#define ERDMA_TRACE_RECV 1
typedef struct erdma_trace_rec {
  int op;          /* ERDMA_TRACE_SEND or ERDMA_TRACE_RECV */
  int peer;        /* world rank: destination, or source (ERDMA_ANY_SOURCE) */
  int tag;         /* may be ERDMA_ANY_TAG (a receive) */
  uint32_t ctx;    /* context id */
  uint64_t nbytes; /* a send's bytes; a receive's capacity (0: allocated on match) */
} erdma_trace_rec;
/* Start recording afresh, room for `cap` records (later ones are counted as
 * dropped); cap 0 stops and frees the trace. */
int erdma_trace_start(erdma_engine *e, uint64_t cap);
/* Move up to `max` of the oldest records into out (the rest stay); returns
 * how many.  *dropped (if not NULL): records lost to a full trace since the
 * last call, then zeroed. */
uint64_t erdma_trace_take(erdma_engine *e, erdma_trace_rec *out, uint64_t max,
                          uint64_t *dropped);

/* Two-rank Barriers between ranks of one host by flags in shared memory
 * (erdma_shm.c), once both ranks agreed at a Barrier by messages: each sends
 * erdma_pair_offer's byte as its 1-byte token (0: not offered; an agreed
 * pair's slot is 0x80 | slot) and both then call erdma_pair_settle with the
 * two bytes; it returns the slot when both offered, else -1.  ctx: the
 * communicator's collective context.  erdma_pair_find: the slot agreed for
 * (peer, ctx), else -1; erdma_pair_gen changes whenever one is agreed or
 * forgotten (erdma_ctx_group with n = 0 forgets ctx's).  A Barrier by flags:
 * erdma_pair_arrive, then erdma_pair_poll (lock-free: 1 when the peer
 * arrived, looking up to `spins` times, once where local ranks outnumber
 * the CPUs) and erdma_pair_wait (0; ERDMA_ERR_TIMEOUT when timeout, in
 * seconds, ran out: wait again; the peer's error once it failed). */
int erdma_pair_offer(erdma_engine *e, int peer, uint32_t ctx);
int erdma_pair_settle(erdma_engine *e, uint32_t ctx, int mine, int theirs);
int erdma_pair_find(erdma_engine *e, int peer, uint32_t ctx);
unsigned erdma_pair_gen(erdma_engine *e);
int erdma_pair_is(erdma_engine *e, int slot, uint32_t ctx);
void erdma_pair_arrive(erdma_engine *e, int slot);
int erdma_pair_poll(erdma_engine *e, int slot, int spins);
int erdma_pair_wait(erdma_engine *e, int slot, double timeout);
/* A two-rank Bcast of 1 to ERDMA_PAIR_DATA_MAX bytes on an agreed pair
 * (every blocking path takes it, as the Barrier): the root calls
 * erdma_pair_lead with the size, waits (erdma_pair_wait: the peer took
 * enough of its last bytes to make room), then erdma_pair_put; the
 * other rank calls erdma_pair_expect, waits (erdma_pair_wait), then
 * erdma_pair_take (0; ERDMA_ERR_TRUNCATE when the root's bytes were not n
 * by flags; ERDMA_ERR_PEER when it freed the communicator instead), or
 * erdma_pair_withdraw where it gives the wait up (a signal).  A two-rank
 * Allgather of 1 to ERDMA_PAIR_DATA_MAX bytes a block: both call
 * erdma_pair_lead with 0 and wait (erdma_pair_wait), erdma_pair_share their
 * block, wait again, then
 * erdma_pair_take the peer's (or erdma_pair_withdraw).  erdma_pair_withdraw
 * undoes an expect or share not yet taken, and does nothing otherwise, so a
 * caller interrupted anywhere between the first and the take may call it.
 * A communicator freed before the peer took its last bytes keeps its slot
 * until the peer did (erdma_pair_offer reuses it only then). */
#define ERDMA_PAIR_DATA_MAX 8192
void erdma_pair_lead(erdma_engine *e, int slot, uint64_t n);
int erdma_pair_put(erdma_engine *e, int slot, const void *buf, uint64_t n);
void erdma_pair_expect(erdma_engine *e, int slot);
void erdma_pair_withdraw(erdma_engine *e, int slot);
int erdma_pair_share(erdma_engine *e, int slot, const void *buf, uint64_t n);
int erdma_pair_take(erdma_engine *e, int slot, void *buf, uint64_t n);
/* A two-rank Alltoall of blocks above ERDMA_PAIR_DATA_MAX and below
 * ERDMA_PAIR_CMA_MAX bytes on an agreed pair: an Allgather by flags of
 * each rank's erdma_pair_rec (where its block for the peer is, and whether
 * it can read the peer's memory: erdma_pair_cma_ok), then each reads the
 * peer's block with erdma_pair_read (0, or -1: not possible, as CMA
 * refused), then an Allgather by flags of whether that worked (so that no
 * rank returns while the peer still reads its buffer); where either did
 * not, the blocks move by flags, ERDMA_PAIR_DATA_MAX bytes at a time. */
#define ERDMA_PAIR_CMA_MAX (2u << 20)
typedef struct erdma_pair_rec {
  uint64_t addr; /* the block for the peer, in the sender's address space */
  uint64_t len;  /* its bytes (a peer whose block differs: ERDMA_ERR_TRUNCATE) */
  uint64_t cma;  /* the sender can read the peer's memory */
  uint64_t pad;
} erdma_pair_rec;
int erdma_pair_cma_ok(erdma_engine *e, int slot);
int erdma_pair_read(erdma_engine *e, int slot, void *dst, uint64_t addr, uint64_t n);
/* A two-rank Bcast of more than ERDMA_PAIR_DATA_MAX and less than
 * ERDMA_PAIR_BCAST_MAX bytes likewise: the records of the root's buffer and
 * the receiver's, then the root writes the second part (from
 * erdma_pair_split) into the receiver's buffer with erdma_pair_write while
 * the receiver reads the first, each on its core; whether both worked by
 * flags; else the bytes by flags from the root. */
#define ERDMA_PAIR_BCAST_MAX (1u << 30)
int erdma_pair_write(erdma_engine *e, int slot, uint64_t addr, const void *src, uint64_t n);
uint64_t erdma_pair_split(uint64_t n);
/* These protocols whole (erdma_coll.c), for every caller: how it waits
 * in them is a erdma_pair_waiter.  wait(arg, e, slot) runs erdma_pair_wait
 * to its end and answers 0, the peer's error, or `interrupted` (a signal,
 * a Python exception), after which a counted operation is withdrawn
 * (erdma_pair_withdraw) and the protocol ends with that code; release(arg)
 * and acquire(arg, token), where not NULL, are called around each copy of
 * more than ERDMA_PAIR_DATA_MAX bytes (Python's GIL).  erdma_pair_alltoall:
 * blocks of at most ERDMA_PAIR_DATA_MAX bytes by flags, larger ones (below
 * ERDMA_PAIR_CMA_MAX) by CMA as above; sbuf NULL: in place; `me` this
 * rank's index.  erdma_pair_bcast: a Bcast of 1 byte to less than
 * ERDMA_PAIR_BCAST_MAX (erdma_pair_bcast_large above ERDMA_PAIR_DATA_MAX).
 * erdma_pair_exchange: an Allgather's exchange by flags of blocks of at
 * most ERDMA_PAIR_DATA_MAX bytes, `out` to the peer and the peer's into
 * `in`, and `own` bytes copied from `from` to `to` once `out` is shared
 * (0: none).  0 or an error code. */
typedef struct erdma_pair_waiter {
  int (*wait)(void *arg, erdma_engine *e, int slot);
  void *(*release)(void *arg);
  void (*acquire)(void *arg, void *token);
  void *arg;
  int interrupted;
} erdma_pair_waiter;
int erdma_pair_alltoall(erdma_engine *e, int slot, const void *sbuf, void *rbuf, uint64_t blk,
                        int me, const erdma_pair_waiter *w);
int erdma_pair_bcast_large(erdma_engine *e, int slot, void *buf, uint64_t n, int isroot,
                           const erdma_pair_waiter *w);
int erdma_pair_bcast(erdma_engine *e, int slot, void *buf, uint64_t n, int isroot,
                     const erdma_pair_waiter *w);
int erdma_pair_exchange(erdma_engine *e, int slot, const void *out, void *in, uint64_t blk,
                        void *to, const void *from, uint64_t own, const erdma_pair_waiter *w);

/* Failures and receives from ANY_SOURCE (erdma_ulfm.c): tell the engine the
 * world ranks a receive on context ctx can match (n = 0: forget ctx, and
 * its two-rank Barrier slots; a context never named counts every rank).  While a failed member's failure
 * is not acknowledged, waits and tests of a pending ANY_SOURCE receive on
 * ctx return ERDMA_ERR_PEER_PENDING. */
int erdma_ctx_group(erdma_engine *e, uint32_t ctx, const int *ranks, int n);
/* The failed members of ctx in the order they failed (up to cap into out);
 * returns how many, *nacked how many of the first are acknowledged. */
int erdma_ctx_failed(erdma_engine *e, uint32_t ctx, int *out, int cap, int *nacked);
/* Acknowledge the first `upto` failed members of ctx; returns how many are. */
int erdma_ctx_ack(erdma_engine *e, uint32_t ctx, int upto);
/* A blocking receive gave up on ERDMA_ERR_PEER_PENDING: if r is still an
 * unmatched ANY_SOURCE receive with an unacknowledged failure, withdraw it
 * and complete it with ERDMA_ERR_PEER (returns 1); else 0 (wait on). */
int erdma_req_withdraw_failed(erdma_req *r);

/* Requests.  A pending ANY_SOURCE receive may answer ERDMA_ERR_PEER_PENDING
 * (see erdma_ctx_group). */
int erdma_req_test(erdma_req *r, int *done, erdma_status *st);
/* 1 (and *st) when r is done, read without the engine's lock (a request's
 * done flag only goes 0 -> 1, published after its status); else 0, and
 * nothing is polled: a caller that must progress calls erdma_req_test. */
int erdma_req_peek(erdma_req *r, erdma_status *st);
/* timeout < 0 waits forever; returns ERDMA_ERR_TIMEOUT when it runs out. */
int erdma_req_wait(erdma_req *r, double timeout, erdma_status *st);
/* Wait until at least one of reqs[0..n) (NULL entries skipped) completes;
 * *index gets the first completed one. */
int erdma_req_waitany(erdma_req **reqs, int n, double timeout, int *index);
/* Blocking send / receive in one call: post, wait up to timeout, free the
 * request.  0: done, out's status fields filled (as erdma_status).
 * ERDMA_ERR_TIMEOUT: out->left is the request, still pending (wait for it and
 * free it as usual).  Another error: nothing was posted (out->left == NULL). */
typedef struct erdma_blocking {
  int source;
  int tag;
  int error;
  int cancelled;
  uint64_t nbytes;
  erdma_req *left;
} erdma_blocking;
int erdma_send(erdma_engine *e, const void *buf, uint64_t nbytes, int dest, int tag,
               uint32_t ctx, int flags, double timeout, erdma_blocking *out);
int erdma_recv(erdma_engine *e, void *buf, uint64_t cap, int source, int tag,
               uint32_t ctx, double timeout, erdma_blocking *out);
/* Wait on up to timeout for a blocking call's request r (its out->left),
 * answering as the call does (r freed unless ERDMA_ERR_TIMEOUT: then
 * out->left is r again). */
int erdma_blocking_wait(erdma_req *r, double timeout, erdma_blocking *out);
/* erdma_recv's shortcut: the first message that matches is here whole
 * (eager, not a synchronous send's): taken, copied and freed under one
 * lock, without a request; 1 and *out as erdma_recv's, else 0 (nothing
 * done: post the receive).  Never waits (the engine lock busy: 0), so a
 * caller may hold the GIL. */
int erdma_recv_now(erdma_engine *e, void *buf, uint64_t cap, int source, int tag,
                   uint32_t ctx, erdma_blocking *out);
/* The same for a receive of any length: the buffer comes from
 * alloc(arg, length) (NULL: nothing taken, the message stays; 0), called
 * under the engine lock and so never calling back into the engine.  1 and
 * *out (nbytes the message's length) when taken. */
int erdma_recv_now_alloc(erdma_engine *e, int source, int tag, uint32_t ctx,
                         void *(*alloc)(void *arg, uint64_t n), void *arg, erdma_blocking *out);
/* erdma_recv_now_alloc that, while no message matches and every peer is on
 * this host, spins up to spin_ns reading the rings itself (never waiting
 * for the engine lock: a caller may hold the GIL): 1 and *out when taken,
 * else 0 (post the receive). */
int erdma_recv_soon_alloc(erdma_engine *e, int source, int tag, uint32_t ctx,
                          void *(*alloc)(void *arg, uint64_t n), void *arg, uint64_t spin_ns,
                          erdma_blocking *out);
int erdma_req_cancel(erdma_req *r);
/* Withdraw a pending request whatever its state, so the engine never touches
 * its buffer again (a send's unsent bytes are copied first); it completes as
 * cancelled.  For error paths: unlike MPI cancel it may drop a matched message. */
int erdma_req_abort(erdma_req *r);
void *erdma_req_data(erdma_req *r);      /* alloc buffer (owned by the req) */
void erdma_req_free(erdma_req *r);       /* free now, or when it completes */

/* ---- schedules (erdma_sched.c) ---- */
/*
 * A schedule is a graph of steps (send, recv, local reduce, local copy) built
 * once and then run by the engine: a worker thread (erdma_sched_start) or the
 * calling thread (erdma_sched_run) posts each step as soon as its
 * dependencies are met, using only the public p2p API above.
 *
 * Every step is split into chunks of `chunk` bytes (a multiple of 64; all
 * ranks of a collective must use the same value, since a send of n bytes and
 * the matching receive are split identically).  A dependency is either full
 * (the step waits for every chunk of the other) or chunkwise (chunk c waits
 * for chunk min(c, last) of the other): chunkwise is valid when the two
 * steps cover their buffers from the same relative offset, which lets the
 * reduction of chunk c overlap the transfer of chunk c+1.  Chunks of one
 * send or recv step are posted in order; two steps between the same pair of
 * ranks must not share a tag.  erdma_sched_barrier ends a round: later steps
 * start only once every earlier step has completed.
 *
 * Step-adding calls return the step's index (>= 0) or a negative error.
 */
/* Reduction operations and element types of erdma_reduce_local. */
#define ERDMA_OP_SUM 0
#define ERDMA_OP_PROD 1
#define ERDMA_OP_MAX 2
#define ERDMA_OP_MIN 3
#define ERDMA_OP_LAND 4
#define ERDMA_OP_LOR 5
#define ERDMA_OP_LXOR 6
#define ERDMA_OP_BAND 7
#define ERDMA_OP_BOR 8
#define ERDMA_OP_BXOR 9
#define ERDMA_DT_INT8 0
#define ERDMA_DT_INT16 1
#define ERDMA_DT_INT32 2
#define ERDMA_DT_INT64 3
#define ERDMA_DT_UINT8 4
#define ERDMA_DT_UINT16 5
#define ERDMA_DT_UINT32 6
#define ERDMA_DT_UINT64 7
#define ERDMA_DT_FLOAT32 8
#define ERDMA_DT_FLOAT64 9
#define ERDMA_DT_COMPLEX64 10  /* SUM, PROD only */
#define ERDMA_DT_COMPLEX128 11 /* SUM, PROD only */
#define ERDMA_SCHED_DEFAULT_CHUNK 524288

/* inout[i] = in[i] OP inout[i] for i < count (erdmampi/op.py semantics:
 * MAX keeps inout only where inout > in, so a NaN in `in` wins; integer
 * overflow wraps; logical ops give 0/1).  ERDMA_ERR_INVAL for a pair that
 * is not supported. */
int erdma_reduce_local(const void *in, void *inout, uint64_t count, int op,
                       int dtype);
/* Size in bytes of an element of dtype, 0 if unknown. */
int erdma_dtype_size(int dtype);

typedef struct erdma_sched erdma_sched;
/* chunk = 0: ERDMA_SCHED_DEFAULT_CHUNK. */
int erdma_sched_new(erdma_engine *e, uint64_t chunk, erdma_sched **out);
int erdma_sched_send(erdma_sched *s, const void *buf, uint64_t nbytes, int dest,
                     int tag, uint32_t ctx);
int erdma_sched_recv(erdma_sched *s, void *buf, uint64_t nbytes, int source,
                     int tag, uint32_t ctx);
/* inout = in OP inout over count elements (local, vectorised). */
int erdma_sched_reduce(erdma_sched *s, const void *in, void *inout,
                       uint64_t count, int op, int dtype);
int erdma_sched_copy(erdma_sched *s, const void *src, void *dst, uint64_t nbytes);
/* step waits for step `on` (on < step); chunkwise as described above. */
int erdma_sched_after(erdma_sched *s, int step, int on, int chunkwise);
/* End of round. */
int erdma_sched_barrier(erdma_sched *s);
/* Run it in a worker thread; erdma_sched_wait/test collect the result. */
int erdma_sched_start(erdma_sched *s);
/* Run it in the calling thread until done; returns the first error. */
int erdma_sched_run(erdma_sched *s);
/* timeout < 0 waits forever; ERDMA_ERR_TIMEOUT if it runs out; else the
 * schedule's result (0 or its first error). */
int erdma_sched_wait(erdma_sched *s, double timeout);
/* *done = 1 once finished; returns its result then, else 0. */
int erdma_sched_test(erdma_sched *s, int *done);
int erdma_sched_nsteps(erdma_sched *s);
/* Waits for a started schedule to finish, then frees it. */
void erdma_sched_free(erdma_sched *s);

/* ---- small collectives (erdma_coll.c) ----
 * Latency-bound collectives run start to finish in the calling thread.
 * ranks[0..n) maps communicator ranks to world ranks, me is the caller's
 * communicator rank; messages use ctx and tags tag .. tag + 1000 (the same
 * messages as erdmampi/collectives' algorithms of those names).  Each wait
 * lasts at most `slice` seconds: ERDMA_ERR_TIMEOUT hands the unfinished
 * collective back in *pending, to continue with erdma_coll_resume (which
 * frees it when it returns anything else) or drop with erdma_coll_free. */
typedef struct erdma_coll erdma_coll;
/* recursive doubling; sbuf NULL or == rbuf: in place */
int erdma_coll_allreduce(erdma_engine *e, const void *sbuf, void *rbuf, uint64_t count,
                         int op, int dtype, const int *ranks, int n, int me, int tag,
                         uint32_t ctx, double slice, erdma_coll **pending);
/* binomial tree */
int erdma_coll_bcast(erdma_engine *e, void *buf, uint64_t nbytes, int root, const int *ranks,
                     int n, int me, int tag, uint32_t ctx, double slice,
                     erdma_coll **pending);
/* dissemination, 1-byte tokens */
int erdma_coll_barrier(erdma_engine *e, const int *ranks, int n, int me, int tag,
                       uint32_t ctx, double slice, erdma_coll **pending);
/* Equal blocks of blk bytes, every message posted at once (the messages of
 * alltoallv_direct / allgatherv_direct); sbuf NULL or == rbuf: in place */
int erdma_coll_alltoall(erdma_engine *e, const void *sbuf, void *rbuf, uint64_t blk,
                        const int *ranks, int n, int me, int tag, uint32_t ctx, double slice,
                        erdma_coll **pending);
int erdma_coll_allgather(erdma_engine *e, const void *sbuf, void *rbuf, uint64_t blk,
                         const int *ranks, int n, int me, int tag, uint32_t ctx, double slice,
                         erdma_coll **pending);
/* ring (reduce_scatter_ring; commutative ops): rank me gets block me of
 * count elements; sbuf NULL: in place, the n blocks in rbuf */
int erdma_coll_reduce_scatter(erdma_engine *e, const void *sbuf, void *rbuf, uint64_t count,
                              int op, int dtype, const int *ranks, int n, int me, int tag,
                              uint32_t ctx, double slice, erdma_coll **pending);
/* linear (gatherv_linear / scatterv_linear): blk bytes per rank; rbuf
 * (gather) / sbuf (scatter) matter at the root; root's sbuf (gather) or
 * rbuf (scatter) NULL: its block in place */
int erdma_coll_gather(erdma_engine *e, const void *sbuf, void *rbuf, uint64_t blk, int root,
                      const int *ranks, int n, int me, int tag, uint32_t ctx, double slice,
                      erdma_coll **pending);
int erdma_coll_scatter(erdma_engine *e, const void *sbuf, void *rbuf, uint64_t blk, int root,
                       const int *ranks, int n, int me, int tag, uint32_t ctx, double slice,
                       erdma_coll **pending);
/* binomial tree at root (reduce_binomial, commutative ops); rbuf matters at
 * the root; the root's sbuf NULL: in place */
int erdma_coll_reduce(erdma_engine *e, const void *sbuf, void *rbuf, uint64_t count, int op,
                      int dtype, int root, const int *ranks, int n, int me, int tag,
                      uint32_t ctx, double slice, erdma_coll **pending);
int erdma_coll_resume(erdma_coll *c, double slice);
void erdma_coll_free(erdma_coll *c);

/* ---- bulk collectives among ranks of one host (erdma_bulk.c) ----
 * Large messages between ranks that share memory, in one call: CMA single
 * copies (process_vm_readv / process_vm_writev) straight between the user
 * buffers, made by every rank at once; a pair without CMA (another host, ERDMA_SHM_CMA=0, a refusal)
 * moves the same bytes as ordinary messages.  Arguments as for the small
 * collectives above; messages use tags tag .. tag + ERDMA_BULK_TAGS - 1;
 * each wait lasts at most `timeout` seconds (< 0: until a peer fails).
 * Every rank of the communicator must make the same call. */
#define ERDMA_BULK_TAGS 4
/* n == 2: the root writes buf into the other rank from the front while that
 * one reads it from the back, in pieces (an eighth, 64 KiB..1 MiB), until
 * they meet (each reads the other's progress with CMA).  root_part in
 * [0, 1]: a fixed share for the root instead (the root's value counts);
 * < 0: meet where they meet. */
int erdma_coll_bcast_pair(erdma_engine *e, void *buf, uint64_t nbytes, int root,
                          const int *ranks, int n, int me, double root_part, int tag,
                          uint32_t ctx, double timeout);
/* Allgather(v): rank j's block (lens[j] bytes) lands at rbuf + offs[j] on
 * every rank; each reads it straight out of rank j's sbuf (NULL: in place,
 * the block already at rbuf + offs[me]). */
int erdma_coll_allgather_bulk(erdma_engine *e, const void *sbuf, void *rbuf,
                              const uint64_t *offs, const uint64_t *lens, const int *ranks,
                              int n, int me, int tag, uint32_t ctx, double timeout);
/* n == 2: each rank reads the other's input (CMA) and reduces it with its
 * own in rank order (rank 0's operand on the left, as erdma_coll_allreduce),
 * so both get the same bits; one round of messages before and one after.
 * From 256 KiB each computes one half and writes it into the other's rbuf
 * too.  sbuf NULL or rbuf: in place. */
int erdma_coll_allreduce_pair(erdma_engine *e, const void *sbuf, void *rbuf, uint64_t count,
                              int op, int dtype, const int *ranks, int n, int me, int tag,
                              uint32_t ctx, double timeout);
/* n >= 3, one host: rank k reduces slice k of every input (CMA reads, in
 * rank order, as erdma_coll_allreduce), then every rank reads the other
 * slices out of their owners' rbuf.  Returns 1, on every rank alike and
 * before any buffer is written, where some pair cannot use CMA (the caller
 * then runs another algorithm).  sbuf NULL or rbuf: in place. */
int erdma_coll_allreduce_slices(erdma_engine *e, const void *sbuf, void *rbuf, uint64_t count,
                                int op, int dtype, const int *ranks, int n, int me, int tag,
                                uint32_t ctx, double timeout);
/* n >= 3, one host, sbuf and rbuf apart: Reduce_scatter_block of count
 * elements per block, rank me reducing block me of every input as above;
 * 1 (every rank alike) where some pair cannot use CMA, also when a read
 * fails midway (the inputs are intact): the caller runs another algorithm. */
int erdma_coll_reduce_scatter_slices(erdma_engine *e, const void *sbuf, void *rbuf,
                                     uint64_t count, int op, int dtype, const int *ranks,
                                     int n, int me, int tag, uint32_t ctx, double timeout);
/* n == 2, sbuf != rbuf: Reduce_scatter_block of count elements per block
 * the same way: rank me reads block me of the other's input. */
int erdma_coll_reduce_scatter_pair(erdma_engine *e, const void *sbuf, void *rbuf,
                                   uint64_t count, int op, int dtype, const int *ranks, int n,
                                   int me, int tag, uint32_t ctx, double timeout);
/* Any n: every rank reads buf straight out of the root's (one CMA read
 * each, needing no CPU time of the root), then tells the root. */
int erdma_coll_bcast_bulk(erdma_engine *e, void *buf, uint64_t nbytes, int root,
                          const int *ranks, int n, int me, int tag, uint32_t ctx,
                          double timeout);
/* Equal blocks of blk bytes: every rank copies its own block and reads its
 * block out of each peer's send buffer (sbuf != rbuf).  Two ranks: each
 * pushes its block into the other's buffer, and one that is done pulls the
 * rest of its own incoming block (pull_part in [0, 1]: a fixed share of
 * one's block to push; < 0: dynamic). */
int erdma_coll_alltoall_bulk(erdma_engine *e, const void *sbuf, void *rbuf, uint64_t blk,
                             const int *ranks, int n, int me, double pull_part, int tag,
                             uint32_t ctx, double timeout);

/* ---- NAT traversal (erdma_nat.c; docs/wire.md, "Demultiplexing") ---- */
/*
 * The engine's UDP socket also carries STUN and TURN: a received datagram
 * that is a STUN message (first two bits 00, magic cookie 0x2112A442 at bytes
 * 4..7, consistent length) and anything from a registered TURN server that is
 * not ChannelData of a bound channel goes to a bounded queue read with
 * erdma_engine_raw_recv; ChannelData of a channel bound to a peer's relay
 * tunnel is that peer's QUIC packet.  Everything else is QUIC.
 */
#define ERDMA_RELAY_OFF 0      /* remove the rank's relay tunnel */
#define ERDMA_RELAY_ALWAYS 1   /* every QUIC packet to the peer goes through TURN */
#define ERDMA_RELAY_FALLBACK 2 /* direct path; the relay once it falls silent */
#define ERDMA_RELAY_FIRST 3    /* FALLBACK that starts on the relay (the checks found no
                                  direct path in time): the direct path is probed and
                                  taken once the peer's packets come that way */
/* erdma_engine_peer_route values */
#define ERDMA_ROUTE_SELF 0
#define ERDMA_ROUTE_DIRECT 1
#define ERDMA_ROUTE_RELAY 2
#define ERDMA_ROUTE_SHM 3

/* Send one datagram from the engine's socket (works before connect). */
int erdma_engine_raw_send(erdma_engine *e, const uint8_t *data, size_t len,
                          const char *host, int port);
/* The next queued STUN/TURN datagram: up to cap bytes into buf, *len = its
 * full length (ERDMA_ERR_TRUNCATE if longer than cap), its source into
 * host (numeric) and *port.  Waits up to timeout seconds (< 0: forever;
 * ERDMA_ERR_TIMEOUT).  Before erdma_engine_connect the caller's thread reads
 * the socket itself (QUIC packets that arrive meanwhile are processed). */
int erdma_engine_raw_recv(erdma_engine *e, uint8_t *buf, size_t cap, size_t *len,
                          char *host, size_t hostcap, int *port, double timeout);
/* Register a TURN server: its datagrams are demultiplexed as above. */
int erdma_engine_add_turn_server(erdma_engine *e, const char *host, int port);
/* Tunnel QUIC to `rank` through a TURN allocation: packets leave as
 * ChannelData(channel) to the TURN server turn_host:turn_port (registered if
 * new), ChannelData(channel) from it are the peer's packets.  peer_host/
 * peer_port: the address the channel is bound to (the peer's relayed or
 * reflexive address).  The QUIC path (the address given to
 * erdma_engine_set_peer, which is still needed to pin the certificate) does
 * not change: the relay is a tunnel under QUIC.  mode: ERDMA_RELAY_*.
 * channel: 0x4000..0x4FFF, one rank per (server, channel).  turn_host NULL
 * or "": no allocation of ours, the peer's is the relay: packets go plainly
 * to peer_host:peer_port (its relayed address), and QUIC packets from there
 * are the peer's (modes ALWAYS and FIRST only). */
int erdma_engine_set_peer_relay(erdma_engine *e, int rank, const char *turn_host,
                                int turn_port, int channel, const char *peer_host,
                                int peer_port, int mode);
/* How packets to `rank` travel now: ERDMA_ROUTE_*. */
int erdma_engine_peer_route(erdma_engine *e, int rank, int *route);

/* ---- CPython fast path for blocking Send/Recv (erdma_pyfast.c) ---- */
/* Make the CPython module `name` (erdmampi._erdma_fast; see erdma_pyfast.c)
 * and put it in sys.modules: 0, or -1 where this Python (< 3.11) has none. */
int erdma_pyfast_init(const char *name);
/* Retire every fast-path state (an engine shuts down): they all miss. */
void erdma_pyfast_invalidate(void);
/* A blocking send's shortcut: an eager message to a peer on shared memory
 * written into its ring now, without a request, if the engine lock is free
 * and nothing is queued before it (flags: ERDMA_SEND_BULK as erdma_isend's,
 * which may decline).  1: sent (complete); 0: nothing done (use erdma_send).
 * Never waits, so a caller may hold the GIL. */
int erdma_shm_try_send(erdma_engine *e, const void *buf, uint64_t nbytes, int dest, int tag,
                       uint32_t ctx, int flags);

/* ---- derived-datatype pack/unpack (erdma_pack.c) ---- */
/* Gather `count` items from `src` into the packed buffer `dst`: item i's
 * runs are the len[j] bytes at src + i * extent + off[j] (j < nruns),
 * packed back to back in that order.  A vector is count blocks of one run
 * (nruns == 1, extent = the stride).  No bounds are checked (the caller
 * has); ERDMA_ERR_INVAL for a NULL pointer or a negative length. */
int erdma_pack_runs(void *dst, const void *src, uint64_t count, int64_t extent,
                    const int64_t *off, const int64_t *len, uint64_t nruns);
/* The inverse: scatter the packed bytes at `src` into the runs at `dst`. */
int erdma_unpack_runs(void *dst, const void *src, uint64_t count, int64_t extent,
                      const int64_t *off, const int64_t *len, uint64_t nruns);
/* erdma_unpack_runs of the first `nbytes` packed bytes only (a message
 * shorter than the datatype): the runs after them keep their bytes; a run
 * the message ends in gets its head. */
int erdma_unpack_runs_head(void *dst, const void *src, uint64_t nbytes, uint64_t count,
                           int64_t extent, const int64_t *off, const int64_t *len,
                           uint64_t nruns);

#endif
