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
#define ERDMA_ERR_FATAL (-100)

/* Congestion control (values of ngtcp2_cc_algo). */
#define ERDMA_CC_RENO 0
#define ERDMA_CC_CUBIC 1
#define ERDMA_CC_BBR 2
#define ERDMA_CC_BBR2 3

/* Send flags. */
#define ERDMA_SEND_SYNC 1 /* complete only once the receiver matched (Ssend) */

typedef struct erdma_engine erdma_engine;
typedef struct erdma_req erdma_req;
typedef struct erdma_msg erdma_msg; /* a message taken by a matched probe */

typedef struct erdma_config {
  int rank;
  int size;
  const char *bind_addr;     /* local IPv4/IPv6 address to bind, "0.0.0.0" ok */
  int port;                  /* 0 = ephemeral */
  int cc_algo;               /* ERDMA_CC_* */
  uint64_t eager_limit;      /* bytes; larger messages use RTS/CTS */
  double idle_timeout;       /* seconds without peer traffic before a peer is dead */
  double handshake_timeout;  /* seconds */
  size_t max_udp_payload;    /* 0 = automatic (large on loopback, 1452 otherwise) */
  uint64_t stream_window;    /* QUIC stream flow-control window, bytes */
  uint64_t conn_window;      /* QUIC connection flow-control window, bytes */
  int sock_buf;              /* SO_SNDBUF/SO_RCVBUF bytes */
  int spin_us;               /* a waiter polls the socket this long before sleeping */
  int verbose;
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
} erdma_stats;

void erdma_config_default(erdma_config *cfg);
const char *erdma_strerror(int rc);
int erdma_err_is_fatal(int rc);

/* Create the engine: generates a TLS identity and binds the UDP socket. */
int erdma_engine_new(const erdma_config *cfg, erdma_engine **out);
/* "ip:port" of the bound socket; SHA-256 fingerprint (hex) of our certificate. */
int erdma_engine_local_addr(erdma_engine *e, char *buf, size_t len);
int erdma_engine_fingerprint(erdma_engine *e, char *buf, size_t len);
/* Tell the engine where rank `rank` listens and which certificate it holds
 * (fingerprint may be NULL or "" to accept any). */
int erdma_engine_set_peer(erdma_engine *e, int rank, const char *host, int port,
                          const char *fingerprint);
/* Start the progress thread and open QUIC connections to all lower ranks;
 * wait (up to cfg.handshake_timeout) until every peer is connected. */
int erdma_engine_connect(erdma_engine *e);
/* Wait until all queued outgoing data is acknowledged, then close every
 * connection and stop the progress thread. */
int erdma_engine_shutdown(erdma_engine *e, double timeout);
void erdma_engine_free(erdma_engine *e);
int erdma_engine_stats(erdma_engine *e, erdma_stats *st);
/* Name of the peer failure, if any ("" if none). */
int erdma_engine_peer_error(erdma_engine *e, int rank);

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

/* Requests. */
int erdma_req_test(erdma_req *r, int *done, erdma_status *st);
/* timeout < 0 waits forever; returns ERDMA_ERR_TIMEOUT when it runs out. */
int erdma_req_wait(erdma_req *r, double timeout, erdma_status *st);
/* Wait until at least one of reqs[0..n) (NULL entries skipped) completes;
 * *index gets the first completed one. */
int erdma_req_waitany(erdma_req **reqs, int n, double timeout, int *index);
int erdma_req_cancel(erdma_req *r);
void *erdma_req_data(erdma_req *r);      /* alloc buffer (owned by the req) */
void erdma_req_free(erdma_req *r);       /* free now, or when it completes */

#endif
