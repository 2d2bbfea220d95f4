/* erdma_quic.h - one QUIC connection (ngtcp2 + GnuTLS), sans-I/O.
 *
 * The component owns the ngtcp2 side of a connection: its settings and
 * transport parameters, the TLS session, the connection IDs it issues, the
 * packet writer's loop and the timers.  It never reads a clock and never
 * touches a socket: time comes in as `now` (nanoseconds, any monotonic
 * origin), datagrams come in through erdma_quic_read, packets go out
 * through the tx_buf/tx_send callbacks, and what happens on the connection
 * (handshake done, stream data, acknowledgements, a new peer address, the
 * connection's end) goes up through the other callbacks.  The stream data
 * it writes comes from the caller too (tx_pull): what the streams carry,
 * and in which order, is the caller's business (erdma_conn.c: the engine's
 * frames).  The engine drives it with erdma_now() and its packet I/O;
 * tests/c/test_quic.c joins two of them in memory with virtual time.
 *
 * Errors: 0 or an ngtcp2 error code (NGTCP2_ERR_*, negative), or
 * ERDMA_QUIC_ERR_* below for what fails before ngtcp2 is reached.  Every
 * function is for one thread at a time per connection (the engine holds
 * e->mu). */
#ifndef ERDMA_QUIC_H
#define ERDMA_QUIC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include <gnutls/gnutls.h>
#include <ngtcp2/ngtcp2.h>

#define ERDMA_QUIC_CIDLEN 18    /* every CID we issue: a 4-byte tag, 14 random bytes */
#define ERDMA_QUIC_MAX_CIDS 16
#define ERDMA_QUIC_MAX_BURST 64 /* packets written between two tx_send calls, at most */
#define ERDMA_QUIC_MAX_BLOCKED 32

#define ERDMA_QUIC_ERR_NOMEM (-1)
#define ERDMA_QUIC_ERR_TLS (-2)
#define ERDMA_QUIC_ERR_CLOSED (-3) /* the connection has ended */

typedef struct erdma_quic erdma_quic;

/* How the caller hears of the connection and feeds its writer.  `user` is
 * the pointer given at creation.  Callbacks that return int return 0, or
 * nonzero to fail the connection (it then ends: `closed`).  tx_buf,
 * tx_send, tx_pull, tx_wrote and stream_data are required; the others may
 * be NULL (verify_peer NULL: any certificate is accepted). */
typedef struct erdma_quic_callbacks {
  /* ---- packet output ----
   * tx_buf: a buffer for packet i (0, 1, ...) of the burst being written,
   * with *room bytes writable; want: how many packets the burst may take.
   * NULL: none now (the writer stops; erdma_quic_flush reports
   * ERDMA_QUIC_MORE_LATER).
   * tx_send: send the first n packets of the burst, lens[i] bytes each
   * (n may be 0: nothing to send, release the burst's buffers). */
  uint8_t *(*tx_buf)(void *user, int i, int want, size_t *room);
  void (*tx_send)(void *user, size_t *lens, int n);
  /* ---- the stream data to write ----
   * tx_pull: the next stream with data to write, other than the `nblocked`
   * streams in `blocked` (flow control or a closed write side holds them
   * this round): its id in *sid and up to maxiov vectors of its unwritten
   * bytes, returning how many (0 and *sid -1: nothing to write).
   * tx_wrote: n bytes of stream sid (from the first byte tx_pull gave)
   * went into a packet.  tx_packet (optional): a packet was completed. */
  size_t (*tx_pull)(void *user, const int64_t *blocked, int nblocked, int64_t *sid,
                    ngtcp2_vec *iov, size_t maxiov);
  void (*tx_wrote)(void *user, int64_t sid, uint64_t n);
  void (*tx_packet)(void *user);
  /* ---- events ----
   * verify_peer: the peer's certificate arrived in the handshake (SHA-256
   * fingerprint, lowercase hex; "" when it sent none): 0 accepts it. */
  int (*verify_peer)(void *user, const char *fingerprint);
  int (*handshake_done)(void *user);
  void (*stream_open)(void *user, int64_t sid);          /* optional: the peer opened it */
  int (*stream_data)(void *user, int64_t sid, const uint8_t *data, size_t len, int fin);
  int (*stream_reset)(void *user, int64_t sid);         /* optional */
  /* [offset, offset + len) of stream sid was acknowledged */
  void (*stream_acked)(void *user, int64_t sid, uint64_t offset, uint64_t len);
  /* the peer's address is now a (NAT rebinding, a validated migration or
   * the way back): packets go there from now on */
  void (*path_changed)(void *user, const struct sockaddr_storage *a, socklen_t alen);
  /* the connection ended (rv: why; NGTCP2_ERR_DRAINING: the peer closed
   * it, NGTCP2_ERR_IDLE_CLOSE: no reply within the idle timeout); called
   * once, after any CONNECTION_CLOSE went out, unless erdma_quic_close
   * ended it */
  void (*closed)(void *user, int rv);
  void (*log)(void *user, const char *line); /* optional: ngtcp2's log (params.log) */
} erdma_quic_callbacks;

typedef struct erdma_quic_params {
  int cc_algo;                     /* ngtcp2_cc_algo */
  size_t max_udp_payload;          /* packet size; > 1452: the route carries it, no PMTUD */
  uint64_t conn_window, stream_window;         /* initial flow-control windows */
  uint64_t max_conn_window, max_stream_window; /* what ngtcp2 may grow them to */
  uint64_t server_conn_window;     /* server: the connection window until the caller
                                      opens it (erdma_quic_extend_offset); 0: conn_window */
  uint64_t handshake_timeout, idle_timeout;    /* ns */
  uint64_t ack_thresh;             /* 0: ngtcp2's default */
  int pace;                        /* BBR: erdma_quic_flush paces the bursts at BBR's
                                      rate (0: ngtcp2's pacing alone) */
  uint64_t max_pacing_rate;        /* bytes per second, ceiling of that rate (0: none) */
  uint64_t max_streams_bidi, max_streams_uni;  /* the peer may open (0: 4, 16) */
  uint32_t cid_tag;                /* the first 4 bytes of every CID we issue */
  uint32_t dcid_tag;               /* client: ... of the first Destination CID */
  int log;                         /* ngtcp2's log lines to callbacks.log */
  const struct sockaddr_storage *local, *remote;
  socklen_t local_len, remote_len;
  gnutls_certificate_credentials_t cred;
  gnutls_priority_t prio;
  int require_cert;                /* server: a client without a certificate fails */
  const char *alpn;
} erdma_quic_params;

/* A client's Initial that opens a connection (server side). */
typedef struct erdma_quic_initial {
  ngtcp2_pkt_hd hd;
  ngtcp2_cid odcid;                /* validated: the client's first Destination CID */
  int validated;                   /* it carried our Retry token, verified */
} erdma_quic_initial;

/* ---- connection-less helpers (server side) ---- */
/* The Destination CID of any QUIC packet: 0, or -1 when d is none. */
int erdma_quic_dcid(const uint8_t *d, size_t n, const uint8_t **dcid, size_t *dcidlen);
/* 0: d is an Initial that may open a connection (in *ini) */
int erdma_quic_accept(erdma_quic_initial *ini, const uint8_t *d, size_t n);
/* 1: it carries a Retry token (check it: erdma_quic_verify_retry) */
int erdma_quic_has_retry_token(const erdma_quic_initial *ini);
/* 0: the token is ours, fresh (ttl ns) and for address `from` (ini->validated) */
int erdma_quic_verify_retry(erdma_quic_initial *ini, const uint8_t *secret, size_t secretlen,
                            const struct sockaddr_storage *from, socklen_t fromlen,
                            uint64_t ttl, uint64_t now);
/* A Retry packet into buf for the Initial: its length, or < 0. */
ngtcp2_ssize erdma_quic_write_retry(uint8_t *buf, size_t cap, const erdma_quic_initial *ini,
                                    const uint8_t *secret, size_t secretlen,
                                    const struct sockaddr_storage *from, socklen_t fromlen,
                                    uint64_t now);
/* The tag of the Initial's Destination CID (the client names our rank
 * with it); 0xffffffff when too short. */
uint32_t erdma_quic_initial_tag(const erdma_quic_initial *ini);

/* ---- one connection ---- */
int erdma_quic_client_new(erdma_quic **out, const erdma_quic_params *p,
                          const erdma_quic_callbacks *cb, void *user, uint64_t now);
int erdma_quic_server_new(erdma_quic **out, const erdma_quic_params *p,
                          const erdma_quic_callbacks *cb, void *user,
                          const erdma_quic_initial *ini, uint64_t now);
void erdma_quic_del(erdma_quic *q);

/* One datagram from `from`.  *authentic (may be NULL): it held a 1-RTT
 * packet that decrypted under the connection's keys and came from the
 * address the connection sends to.  A fatal error ends the connection
 * (`closed`) and is returned. */
int erdma_quic_read(erdma_quic *q, const uint8_t *d, size_t n,
                    const struct sockaddr_storage *from, socklen_t fromlen, uint64_t now,
                    int *authentic);
/* Write one burst of packets (then tx_send): as many as congestion
 * control, flow control and pacing allow, at most the send quantum.
 * *more (may be NULL): 0 nothing more to write now (the next chance is at
 * erdma_quic_expiry, or when there is new data); ERDMA_QUIC_MORE_NOW the
 * burst was full: call again (with the time then; pacing counts from each
 * burst's `now`); ERDMA_QUIC_MORE_LATER tx_buf had no buffer: call again
 * soon. */
#define ERDMA_QUIC_MORE_NOW 1
#define ERDMA_QUIC_MORE_LATER 2
int erdma_quic_flush(erdma_quic *q, uint64_t now, int *more);
/* When erdma_quic_handle_expiry is due next (UINT64_MAX: never; a closed
 * connection: never). */
uint64_t erdma_quic_expiry(const erdma_quic *q);
/* 0: not due yet, 1: timers handled (flush next), < 0: the connection ended */
int erdma_quic_handle_expiry(erdma_quic *q, uint64_t now);
/* End the connection, telling the peer why (CONNECTION_CLOSE: rv 0 an
 * application close, else the error) unless it is closing or draining
 * already.  No `closed` callback. */
void erdma_quic_close(erdma_quic *q, int rv, uint64_t now);
int erdma_quic_is_closed(const erdma_quic *q);

/* ---- streams and flow control ---- */
int erdma_quic_open_bidi(erdma_quic *q, int64_t *sid);
int erdma_quic_open_uni(erdma_quic *q, int64_t *sid);
void erdma_quic_extend_offset(erdma_quic *q, uint64_t n);  /* connection credit */
void erdma_quic_extend_stream_offset(erdma_quic *q, int64_t sid, uint64_t n);

/* ---- state ---- */
void erdma_quic_set_keep_alive(erdma_quic *q, uint64_t ns); /* 0: off */
/* A ceiling on the pacing rate learnt from the peer (bytes/s; 0: none): the
 * lower of it and params.max_pacing_rate applies, where the connection paces
 * (params.pace or a max_pacing_rate) */
void erdma_quic_set_pace_cap(erdma_quic *q, uint64_t bytes_per_s);
int erdma_quic_handshake_done(const erdma_quic *q);
int erdma_quic_has_cid(const erdma_quic *q, const uint8_t *d, size_t n);
void erdma_quic_stat(const erdma_quic *q, ngtcp2_conn_stat *out);
uint64_t erdma_quic_stream_loss(const erdma_quic *q, int64_t sid);
size_t erdma_quic_max_udp_payload(const erdma_quic *q);
/* the peer's certificate's fingerprint ("" when none) */
int erdma_quic_peer_fingerprint(const erdma_quic *q, char out[65]);
/* the fingerprint QUIC pins a certificate by: SHA-256 of its DER bytes, in
 * lowercase hex (the TLS identity component names its own with it) */
int erdma_quic_fingerprint(const uint8_t *der, size_t len, char out[65]);
/* same family, address and port (IPv4, IPv6): a connection's path, and the
 * NAT layer's peers and TURN servers */
int addr_equal(const struct sockaddr_storage *a, const struct sockaddr_storage *b);
/* packets authenticated (AEAD) by this thread so far, any connection */
uint64_t erdma_quic_decrypted_count(void);

#endif
