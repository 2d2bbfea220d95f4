/* erdma_quic.c - one QUIC connection (ngtcp2 + GnuTLS), sans-I/O: settings,
 * TLS session, connection IDs, the ngtcp2 callbacks, the packet writer's
 * burst loop, timers and path changes (erdma_quic.h).  No clock, no socket. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <netinet/in.h>

#include <gnutls/crypto.h>
#include <ngtcp2/ngtcp2_crypto.h>
#include <ngtcp2/ngtcp2_crypto_gnutls.h>

#include "erdma_quic.h"

struct erdma_quic {
  ngtcp2_conn *conn;
  gnutls_session_t tls;
  ngtcp2_crypto_conn_ref conn_ref;
  erdma_quic_callbacks cb;
  void *user;
  int client;
  int handshake_done;
  int closed;
  uint32_t cid_tag;
  ngtcp2_cid cids[ERDMA_QUIC_MAX_CIDS];
  int ncids;
  struct sockaddr_storage local, remote; /* remote: where the caller sends */
  socklen_t local_len, remote_len;
  /* pacing (pace_rate): on, its ceiling (bytes per ns, 0: none), and the
   * earliest time of the next burst */
  int pace;
  double pace_cap, pace_cap_cfg;
  uint64_t pace_next;
};

/* ------------------------------------------------------------- helpers */
static uint32_t get32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static void make_cid(ngtcp2_cid *cid, uint32_t tag) {
  uint8_t d[ERDMA_QUIC_CIDLEN];
  for (int i = 0; i < 4; i++) d[i] = (uint8_t)(tag >> (8 * i)); /* lets the receive
                                                                    path find it in O(1) */
  gnutls_rnd(GNUTLS_RND_NONCE, d + 4, sizeof d - 4);
  ngtcp2_cid_init(cid, d, sizeof d);
}

static void cid_add(erdma_quic *q, const ngtcp2_cid *cid) {
  if (q->ncids < ERDMA_QUIC_MAX_CIDS) q->cids[q->ncids++] = *cid;
}

int erdma_quic_has_cid(const erdma_quic *q, const uint8_t *d, size_t n) {
  for (int i = 0; i < q->ncids; i++)
    if (q->cids[i].datalen == n && memcmp(q->cids[i].data, d, n) == 0) return 1;
  return 0;
}

int addr_equal(const struct sockaddr_storage *a, const struct sockaddr_storage *b) {
  if (a->ss_family != b->ss_family) return 0;
  if (a->ss_family == AF_INET) {
    const struct sockaddr_in *x = (const void *)a, *y = (const void *)b;
    return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
  }
  if (a->ss_family == AF_INET6) {
    const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)b;
    return x->sin6_port == y->sin6_port &&
           memcmp(&x->sin6_addr, &y->sin6_addr, sizeof x->sin6_addr) == 0;
  }
  return 0;
}

static void path_of(erdma_quic *q, ngtcp2_path *path) {
  path->local.addr = (ngtcp2_sockaddr *)&q->local;
  path->local.addrlen = q->local_len;
  path->remote.addr = (ngtcp2_sockaddr *)&q->remote;
  path->remote.addrlen = q->remote_len;
  path->user_data = NULL;
}

/* The peer's address is now a: the caller sends there from now on. */
static void set_remote(erdma_quic *q, const struct sockaddr_storage *a, socklen_t alen) {
  if (alen > (socklen_t)sizeof q->remote || addr_equal(&q->remote, a)) return;
  memcpy(&q->remote, a, alen);
  q->remote_len = alen;
  if (q->cb.path_changed) q->cb.path_changed(q->user, &q->remote, q->remote_len);
}

/* A server connection sends along ngtcp2's current path, which moves when
 * the client's address changes (see erdma_quic_read). */
static void follow_path(erdma_quic *q) {
  struct sockaddr_storage a; /* (ngtcp2's copy is not aligned for sockaddr_storage) */
  if (q->client || q->closed) return;
  const ngtcp2_path *p = ngtcp2_conn_get_path(q->conn);
  if (!p || !p->remote.addrlen || p->remote.addrlen > sizeof a) return;
  memcpy(&a, p->remote.addr, p->remote.addrlen);
  set_remote(q, &a, (socklen_t)p->remote.addrlen);
}

/* Tell the peer why we drop the connection (RFC 9000 CONNECTION_CLOSE). */
static void send_close(erdma_quic *q, int rv, uint64_t now) {
  ngtcp2_connection_close_error ccerr;
  ngtcp2_path_storage ps;
  ngtcp2_pkt_info pi;
  size_t room = 0;
  if (!q->conn || ngtcp2_conn_is_in_closing_period(q->conn) ||
      ngtcp2_conn_is_in_draining_period(q->conn) || rv == NGTCP2_ERR_DRAINING ||
      rv == NGTCP2_ERR_IDLE_CLOSE || rv == NGTCP2_ERR_DROP_CONN)
    return;
  uint8_t alert = ngtcp2_conn_get_tls_alert(q->conn);
  if (alert)
    ngtcp2_connection_close_error_set_transport_error_tls_alert(&ccerr, alert, NULL, 0);
  else if (rv == 0)
    ngtcp2_connection_close_error_set_application_error(&ccerr, 0, NULL, 0);
  else
    ngtcp2_connection_close_error_set_transport_error_liberr(&ccerr, rv, NULL, 0);
  ngtcp2_path_storage_zero(&ps);
  uint8_t *buf = q->cb.tx_buf(q->user, 0, 1, &room);
  if (!buf) return;
  ngtcp2_ssize nw =
      ngtcp2_conn_write_connection_close(q->conn, &ps.path, &pi, buf, room, &ccerr, now);
  size_t len = nw > 0 ? (size_t)nw : 0;
  q->cb.tx_send(q->user, &len, nw > 0);
}

/* The connection is unusable: tell the peer, then the caller. */
static void lost(erdma_quic *q, int rv, uint64_t now) {
  if (q->closed) return;
  send_close(q, rv, now);
  q->closed = 1;
  if (q->cb.closed) q->cb.closed(q->user, rv);
}

void erdma_quic_close(erdma_quic *q, int rv, uint64_t now) {
  if (q->closed) return;
  send_close(q, rv, now);
  q->closed = 1;
}

int erdma_quic_is_closed(const erdma_quic *q) { return q->closed; }

/* ------------------------------------------------------ ngtcp2 callbacks */
static void rand_cb(uint8_t *dest, size_t destlen, const ngtcp2_rand_ctx *ctx) {
  (void)ctx;
  gnutls_rnd(GNUTLS_RND_RANDOM, dest, destlen);
}

static int new_cid_cb(ngtcp2_conn *conn, ngtcp2_cid *cid, uint8_t *token, size_t cidlen,
                      void *user_data) {
  erdma_quic *q = user_data;
  (void)conn;
  (void)cidlen;
  make_cid(cid, q->cid_tag);
  gnutls_rnd(GNUTLS_RND_RANDOM, token, NGTCP2_STATELESS_RESET_TOKENLEN);
  cid_add(q, cid);
  return 0;
}

static int remove_cid_cb(ngtcp2_conn *conn, const ngtcp2_cid *cid, void *user_data) {
  erdma_quic *q = user_data;
  (void)conn;
  for (int i = 0; i < q->ncids; i++)
    if (ngtcp2_cid_eq(&q->cids[i], cid)) {
      q->cids[i] = q->cids[--q->ncids];
      break;
    }
  return 0;
}

static int handshake_completed_cb(ngtcp2_conn *conn, void *user_data) {
  erdma_quic *q = user_data;
  (void)conn;
  q->handshake_done = 1;
  if (q->cb.handshake_done && q->cb.handshake_done(q->user) != 0)
    return NGTCP2_ERR_CALLBACK_FAILURE;
  return 0;
}

static int stream_open_cb(ngtcp2_conn *conn, int64_t stream_id, void *user_data) {
  erdma_quic *q = user_data;
  (void)conn;
  if (q->cb.stream_open) q->cb.stream_open(q->user, stream_id);
  return 0;
}

static int recv_stream_data_cb(ngtcp2_conn *conn, uint32_t flags, int64_t stream_id,
                               uint64_t offset, const uint8_t *data, size_t datalen,
                               void *user_data, void *stream_user_data) {
  erdma_quic *q = user_data;
  (void)conn;
  (void)offset;
  (void)stream_user_data;
  if (q->cb.stream_data(q->user, stream_id, data, datalen,
                        (flags & NGTCP2_STREAM_DATA_FLAG_FIN) != 0) != 0)
    return NGTCP2_ERR_CALLBACK_FAILURE;
  return 0;
}

static int stream_reset_cb(ngtcp2_conn *conn, int64_t stream_id, uint64_t final_size,
                           uint64_t app_error_code, void *user_data, void *stream_user_data) {
  erdma_quic *q = user_data;
  (void)conn;
  (void)final_size;
  (void)app_error_code;
  (void)stream_user_data;
  if (q->cb.stream_reset && q->cb.stream_reset(q->user, stream_id) != 0)
    return NGTCP2_ERR_CALLBACK_FAILURE;
  return 0;
}

static int acked_cb(ngtcp2_conn *conn, int64_t stream_id, uint64_t offset, uint64_t datalen,
                    void *user_data, void *stream_user_data) {
  erdma_quic *q = user_data;
  (void)conn;
  (void)stream_user_data;
  if (q->cb.stream_acked) q->cb.stream_acked(q->user, stream_id, offset, datalen);
  return 0;
}

/* Packets that passed AEAD authentication, counted per thread: the relay
 * code (erdma_nat.c) tells a live path from spoofed or garbled datagrams by
 * whether handing one to ngtcp2 moved this count.  decrypted_1rtt counts
 * those with a short header: 1-RTT keys come only out of a completed
 * handshake, whereas anyone can make a valid Initial packet. */
static __thread uint64_t decrypted_ok, decrypted_1rtt;

static int decrypt_cb(uint8_t *dest, const ngtcp2_crypto_aead *aead,
                      const ngtcp2_crypto_aead_ctx *aead_ctx, const uint8_t *ciphertext,
                      size_t ciphertextlen, const uint8_t *nonce, size_t noncelen,
                      const uint8_t *aad, size_t aadlen) {
  int rv = ngtcp2_crypto_decrypt_cb(dest, aead, aead_ctx, ciphertext, ciphertextlen, nonce,
                                    noncelen, aad, aadlen);
  if (rv == 0) {
    decrypted_ok++;
    decrypted_1rtt += aadlen > 0 && !(aad[0] & 0x80);
  }
  return rv;
}

uint64_t erdma_quic_decrypted_count(void) { return decrypted_ok; }

static void fill_callbacks(ngtcp2_callbacks *cb, int client) {
  memset(cb, 0, sizeof *cb);
  if (client) {
    cb->client_initial = ngtcp2_crypto_client_initial_cb;
    cb->recv_retry = ngtcp2_crypto_recv_retry_cb;
  } else {
    cb->recv_client_initial = ngtcp2_crypto_recv_client_initial_cb;
  }
  cb->recv_crypto_data = ngtcp2_crypto_recv_crypto_data_cb;
  cb->encrypt = ngtcp2_crypto_encrypt_cb;
  cb->decrypt = decrypt_cb;
  cb->hp_mask = ngtcp2_crypto_hp_mask_cb;
  cb->update_key = ngtcp2_crypto_update_key_cb;
  cb->delete_crypto_aead_ctx = ngtcp2_crypto_delete_crypto_aead_ctx_cb;
  cb->delete_crypto_cipher_ctx = ngtcp2_crypto_delete_crypto_cipher_ctx_cb;
  cb->get_path_challenge_data = ngtcp2_crypto_get_path_challenge_data_cb;
  cb->version_negotiation = ngtcp2_crypto_version_negotiation_cb;
  cb->rand = rand_cb;
  cb->get_new_connection_id = new_cid_cb;
  cb->remove_connection_id = remove_cid_cb;
  cb->handshake_completed = handshake_completed_cb;
  cb->stream_open = stream_open_cb;
  cb->recv_stream_data = recv_stream_data_cb;
  cb->stream_reset = stream_reset_cb;
  cb->acked_stream_data_offset = acked_cb;
}

/* ngtcp2's log lines (settings.log_printf), one line each to callbacks.log */
static void log_printf(void *user_data, const char *fmt, ...) {
  erdma_quic *q = user_data;
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (q->cb.log) q->cb.log(q->user, line);
}

static void fill_settings(erdma_quic *q, const erdma_quic_params *p, ngtcp2_settings *s,
                          ngtcp2_transport_params *tp, uint64_t now) {
  ngtcp2_settings_default(s);
  s->initial_ts = now;
  s->cc_algo = (ngtcp2_cc_algo)p->cc_algo;
  s->initial_rtt = 10 * NGTCP2_MILLISECONDS;
  s->max_tx_udp_payload_size = p->max_udp_payload;
  if (s->max_tx_udp_payload_size > 1452) {
    s->no_tx_udp_payload_size_shaping = 1; /* the route carries it: no PMTUD needed */
    s->no_pmtud = 1;
  }
  /* ngtcp2 doubles a window that the peer uses up within a few RTTs, up to
   * these ceilings */
  s->max_window = p->max_conn_window > p->conn_window ? p->max_conn_window : p->conn_window;
  s->max_stream_window =
      p->max_stream_window > p->stream_window ? p->max_stream_window : p->stream_window;
  s->handshake_timeout = p->handshake_timeout;
  if (p->ack_thresh) s->ack_thresh = p->ack_thresh;
  if (p->log) s->log_printf = log_printf;
  ngtcp2_transport_params_default(tp);
  tp->initial_max_stream_data_bidi_local = p->stream_window;
  tp->initial_max_stream_data_bidi_remote = p->stream_window;
  tp->initial_max_stream_data_uni = p->stream_window;
  tp->initial_max_data = p->conn_window;
  if (!q->client && p->server_conn_window && tp->initial_max_data > p->server_conn_window)
    tp->initial_max_data = p->server_conn_window;
  /* the most we take: our path's size (a peer on the same link with a larger
   * MTU than ours then sends no more than our link carries) */
  tp->max_udp_payload_size = s->max_tx_udp_payload_size;
  tp->initial_max_streams_bidi = p->max_streams_bidi ? p->max_streams_bidi : 4;
  tp->initial_max_streams_uni = p->max_streams_uni ? p->max_streams_uni : 16;
  tp->max_idle_timeout = p->idle_timeout;
  tp->active_connection_id_limit = 4;
}

/* ------------------------------------------------------------------ TLS */
static ngtcp2_conn *get_conn(ngtcp2_crypto_conn_ref *ref) {
  return ((erdma_quic *)ref->user_data)->conn;
}

static void hex(const uint8_t *in, size_t n, char *out) {
  static const char d[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = d[in[i] >> 4];
    out[2 * i + 1] = d[in[i] & 15];
  }
  out[2 * n] = 0;
}

int erdma_quic_fingerprint(const uint8_t *der, size_t len, char out[65]) {
  uint8_t md[32];
  out[0] = 0;
  if (gnutls_hash_fast(GNUTLS_DIG_SHA256, der, len, md) < 0) return ERDMA_QUIC_ERR_TLS;
  hex(md, 32, out);
  return 0;
}

int erdma_quic_peer_fingerprint(const erdma_quic *q, char out[65]) {
  unsigned n = 0;
  const gnutls_datum_t *certs = q->tls ? gnutls_certificate_get_peers(q->tls, &n) : NULL;
  out[0] = 0;
  if (!certs || n == 0) return 0;
  return erdma_quic_fingerprint(certs[0].data, certs[0].size, out);
}

/* Called by GnuTLS inside the handshake (from ngtcp2_conn_read_pkt) as soon
 * as the peer's certificate arrives: the caller decides by its fingerprint;
 * a refusal fails the handshake with a TLS alert. */
static int verify_cb(gnutls_session_t session) {
  ngtcp2_crypto_conn_ref *ref = gnutls_session_get_ptr(session);
  erdma_quic *q = ref ? ref->user_data : NULL;
  char fp[65];
  if (!q || erdma_quic_peer_fingerprint(q, fp) != 0) return GNUTLS_E_CERTIFICATE_ERROR;
  if (q->cb.verify_peer && q->cb.verify_peer(q->user, fp) != 0)
    return GNUTLS_E_CERTIFICATE_ERROR;
  return 0;
}

static int tls_start(erdma_quic *q, const erdma_quic_params *p) {
  unsigned flags = (q->client ? GNUTLS_CLIENT : GNUTLS_SERVER) | GNUTLS_ENABLE_EARLY_DATA |
                   GNUTLS_NO_END_OF_EARLY_DATA;
  gnutls_datum_t alpn = {(unsigned char *)p->alpn, (unsigned)strlen(p->alpn)};
  if (gnutls_init(&q->tls, flags) < 0) {
    q->tls = NULL;
    return ERDMA_QUIC_ERR_TLS;
  }
  if (gnutls_priority_set(q->tls, p->prio) < 0) return ERDMA_QUIC_ERR_TLS;
  if ((q->client ? ngtcp2_crypto_gnutls_configure_client_session(q->tls)
                 : ngtcp2_crypto_gnutls_configure_server_session(q->tls)) != 0)
    return ERDMA_QUIC_ERR_TLS;
  q->conn_ref.get_conn = get_conn;
  q->conn_ref.user_data = q;
  gnutls_session_set_ptr(q->tls, &q->conn_ref);
  if (gnutls_credentials_set(q->tls, GNUTLS_CRD_CERTIFICATE, p->cred) < 0)
    return ERDMA_QUIC_ERR_TLS;
  if (gnutls_alpn_set_protocols(q->tls, &alpn, 1, GNUTLS_ALPN_MANDATORY) < 0)
    return ERDMA_QUIC_ERR_TLS;
  gnutls_session_set_verify_function(q->tls, verify_cb);
  if (q->client)
    gnutls_server_name_set(q->tls, GNUTLS_NAME_DNS, "localhost", 9);
  else /* a client without a certificate fails the handshake (verify_cb) */
    gnutls_certificate_server_set_request(q->tls, p->require_cert ? GNUTLS_CERT_REQUIRE
                                                                  : GNUTLS_CERT_REQUEST);
  ngtcp2_conn_set_tls_native_handle(q->conn, q->tls);
  return 0;
}

/* ------------------------------------------------------------- creation */
static erdma_quic *quic_alloc(const erdma_quic_params *p, const erdma_quic_callbacks *cb,
                              void *user, int client) {
  erdma_quic *q = calloc(1, sizeof *q);
  if (!q) return NULL;
  q->cb = *cb;
  q->user = user;
  q->client = client;
  q->cid_tag = p->cid_tag;
  q->pace = p->pace || p->max_pacing_rate;
  q->pace_cap = q->pace_cap_cfg = (double)p->max_pacing_rate / NGTCP2_SECONDS;
  if (p->local && p->local_len <= (socklen_t)sizeof q->local) {
    memcpy(&q->local, p->local, p->local_len);
    q->local_len = p->local_len;
  }
  if (p->remote && p->remote_len <= (socklen_t)sizeof q->remote) {
    memcpy(&q->remote, p->remote, p->remote_len);
    q->remote_len = p->remote_len;
  }
  return q;
}

/* The end of client_new/server_new: `rv` is ngtcp2's verdict on the new
 * connection; then the TLS session, and `q` is the caller's. */
static int finish_new(erdma_quic *q, int rv, const erdma_quic_params *p, erdma_quic **out) {
  if (rv != 0) {
    free(q);
    return rv;
  }
  if ((rv = tls_start(q, p)) != 0) {
    erdma_quic_del(q);
    return rv;
  }
  *out = q;
  return 0;
}

int erdma_quic_client_new(erdma_quic **out, const erdma_quic_params *p,
                          const erdma_quic_callbacks *cb, void *user, uint64_t now) {
  ngtcp2_callbacks ncb;
  ngtcp2_settings s;
  ngtcp2_transport_params tp;
  ngtcp2_cid dcid, scid;
  ngtcp2_path path;
  int rv;
  erdma_quic *q = quic_alloc(p, cb, user, 1);
  *out = NULL;
  if (!q) return ERDMA_QUIC_ERR_NOMEM;
  make_cid(&dcid, p->dcid_tag); /* the server files us under this tag */
  make_cid(&scid, q->cid_tag);
  cid_add(q, &scid);
  fill_callbacks(&ncb, 1);
  fill_settings(q, p, &s, &tp, now);
  path_of(q, &path);
  rv = ngtcp2_conn_client_new(&q->conn, &dcid, &scid, &path, NGTCP2_PROTO_VER_V1, &ncb, &s,
                              &tp, NULL, q);
  return finish_new(q, rv, p, out);
}

int erdma_quic_server_new(erdma_quic **out, const erdma_quic_params *p,
                          const erdma_quic_callbacks *cb, void *user,
                          const erdma_quic_initial *ini, uint64_t now) {
  ngtcp2_callbacks ncb;
  ngtcp2_settings s;
  ngtcp2_transport_params tp;
  ngtcp2_cid scid;
  ngtcp2_path path;
  const ngtcp2_pkt_hd *hd = &ini->hd;
  int rv;
  erdma_quic *q = quic_alloc(p, cb, user, 0);
  *out = NULL;
  if (!q) return ERDMA_QUIC_ERR_NOMEM;
  make_cid(&scid, q->cid_tag);
  cid_add(q, &scid);
  cid_add(q, &hd->dcid);
  fill_callbacks(&ncb, 0);
  fill_settings(q, p, &s, &tp, now);
  tp.original_dcid = hd->dcid;
  if (ini->validated) { /* the address is validated: RFC 9000 7.3 */
    tp.original_dcid = ini->odcid;
    tp.retry_scid = hd->dcid;
    tp.retry_scid_present = 1;
    s.token.base = (uint8_t *)hd->token.base;
    s.token.len = hd->token.len;
  }
  path_of(q, &path);
  rv = ngtcp2_conn_server_new(&q->conn, &hd->scid, &scid, &path, hd->version, &ncb, &s, &tp,
                              NULL, q);
  return finish_new(q, rv, p, out);
}

void erdma_quic_del(erdma_quic *q) {
  if (!q) return;
  if (q->conn) ngtcp2_conn_del(q->conn);
  if (q->tls) gnutls_deinit(q->tls);
  free(q);
}

/* ------------------------------------------------- connection-less (server) */
int erdma_quic_dcid(const uint8_t *d, size_t n, const uint8_t **dcid, size_t *dcidlen) {
  ngtcp2_version_cid vc;
  if (n == 0 || ngtcp2_pkt_decode_version_cid(&vc, d, n, ERDMA_QUIC_CIDLEN) != 0) return -1;
  *dcid = vc.dcid;
  *dcidlen = vc.dcidlen;
  return 0;
}

int erdma_quic_accept(erdma_quic_initial *ini, const uint8_t *d, size_t n) {
  memset(ini, 0, sizeof *ini);
  if (n == 0 || ngtcp2_accept(&ini->hd, d, n) != 0) return -1;
  return 0;
}

int erdma_quic_has_retry_token(const erdma_quic_initial *ini) {
  return ini->hd.token.len && ini->hd.token.base[0] == NGTCP2_CRYPTO_TOKEN_MAGIC_RETRY;
}

int erdma_quic_verify_retry(erdma_quic_initial *ini, const uint8_t *secret, size_t secretlen,
                            const struct sockaddr_storage *from, socklen_t fromlen,
                            uint64_t ttl, uint64_t now) {
  if (ngtcp2_crypto_verify_retry_token(&ini->odcid, ini->hd.token.base, ini->hd.token.len,
                                       secret, secretlen, ini->hd.version,
                                       (const ngtcp2_sockaddr *)from, (ngtcp2_socklen)fromlen,
                                       &ini->hd.dcid, ttl, now) != 0)
    return -1;
  ini->validated = 1;
  return 0;
}

uint32_t erdma_quic_initial_tag(const erdma_quic_initial *ini) {
  return ini->hd.dcid.datalen >= 4 ? get32(ini->hd.dcid.data) : 0xffffffffu;
}

ngtcp2_ssize erdma_quic_write_retry(uint8_t *buf, size_t cap, const erdma_quic_initial *ini,
                                    const uint8_t *secret, size_t secretlen,
                                    const struct sockaddr_storage *from, socklen_t fromlen,
                                    uint64_t now) {
  uint8_t token[NGTCP2_CRYPTO_MAX_RETRY_TOKENLEN];
  ngtcp2_cid scid;
  const ngtcp2_pkt_hd *hd = &ini->hd;
  /* the same tag as the client's first DCID: see erdma_quic_server_new's caller */
  make_cid(&scid, erdma_quic_initial_tag(ini));
  ngtcp2_ssize tl = ngtcp2_crypto_generate_retry_token(
      token, secret, secretlen, hd->version, (const ngtcp2_sockaddr *)from,
      (ngtcp2_socklen)fromlen, &scid, &hd->dcid, now);
  if (tl < 0) return tl;
  return ngtcp2_crypto_write_retry(buf, cap, hd->version, &hd->scid, &scid, &hd->dcid, token,
                                   (size_t)tl);
}

/* ------------------------------------------------------------------- rx */
int erdma_quic_read(erdma_quic *q, const uint8_t *d, size_t n,
                    const struct sockaddr_storage *from, socklen_t fromlen, uint64_t now,
                    int *authentic) {
  ngtcp2_pkt_info pi = {0};
  ngtcp2_path path;
  struct sockaddr_storage known;
  int rebound = 0;
  if (authentic) *authentic = 0;
  if (q->closed) return ERDMA_QUIC_ERR_CLOSED;
  if (n == 0) return 0; /* nothing (ngtcp2 asserts on empty input) */
  path_of(q, &path);
  /* NAT rebinding: a packet of this connection from a new address.  A
   * server connection hands ngtcp2 the real source: on a non-probing 1-RTT
   * packet ngtcp2 makes it the current path and validates it
   * (PATH_CHALLENGE there; back to the old path if that fails), and
   * follow_path reports wherever ngtcp2's current path goes.  An ngtcp2
   * 0.12 client drops packets from any address but the server's (RFC 9000
   * has no server migration) and migrates only to a new local address, so
   * a client connection hands ngtcp2 its unchanged path (the server's first
   * address) and moves the send address itself once a 1-RTT packet from the
   * new address decrypted under the connection's keys (an off-path sender
   * cannot make one). */
  if (q->client && q->handshake_done) {
    const ngtcp2_path *cur = ngtcp2_conn_get_path(q->conn);
    memcpy(&known, cur->remote.addr, cur->remote.addrlen);
    path.remote.addr = (ngtcp2_sockaddr *)&known;
    path.remote.addrlen = cur->remote.addrlen;
    rebound = !addr_equal(&q->remote, from);
  } else {
    path.remote.addr = (ngtcp2_sockaddr *)from;
    path.remote.addrlen = fromlen;
  }
  uint64_t before = decrypted_1rtt;
  int rv = ngtcp2_conn_read_pkt(q->conn, &path, &pi, d, n, now);
  if (rv == 0 && decrypted_1rtt != before && rebound)
    set_remote(q, from, fromlen);
  else if (rv == 0 && !q->client)
    follow_path(q);
  if (authentic) *authentic = rv == 0 && decrypted_1rtt != before && addr_equal(&q->remote, from);
  if (rv != 0) lost(q, rv, now);
  return rv;
}

/* ------------------------------------------------------------------- tx */
/* Pacing.  ngtcp2 0.12 lets a packet out when its pacing timer is at most
 * 1 ms ahead (NGTCP2_PKT_PACING_OVERHEAD) and sets that timer to now + the
 * last burst's time at the pacing rate: bursts of up to 1 ms each, written
 * back to back as erdma_quic_flush's callers do, are never held back, so a
 * sender ran as fast as its congestion window let it (a BBR connection was
 * seen at 459 Mbit/s on a 100 Mbit/s path, overflowing the bottleneck
 * queue).  So a BBR connection paces itself (params.pace): after each burst
 * none other before now + its bytes at BBR's pacing rate (pace_next).
 * Above FAST_PACE bursts are so short that sleeping between them costs
 * more than it saves. */
#define FAST_PACE (327680.0 / NGTCP2_SECONDS * 1000) /* bytes per ns: 64 KiB per 200 us */

/* the rate to pace at in bytes per ns, or 0: no pacing of our own */
static double pace_rate(const erdma_quic *q, const ngtcp2_conn_stat *cs) {
  if (!q->pace || cs->pacing_rate <= 0) return 0; /* off, or not BBR: ngtcp2's own */
  double rate = cs->pacing_rate;
  if (q->pace_cap > 0 && rate > q->pace_cap) rate = q->pace_cap;
  return rate < FAST_PACE ? rate : 0;
}

void erdma_quic_set_pace_cap(erdma_quic *q, uint64_t bytes_per_s) {
  double learnt = (double)bytes_per_s / NGTCP2_SECONDS, cfg = q->pace_cap_cfg;
  q->pace_cap = learnt > 0 && (cfg <= 0 || learnt < cfg) ? learnt : cfg;
}

/* Packets in one burst: ngtcp2's send quantum, but at least what the
 * pacing rate allows per millisecond (ngtcp2 lets a sender run up to 1 ms
 * ahead anyway), within [2 packets, 64 KiB] like TCP's TSO autosizing: on a
 * short path the quantum alone (rate x min RTT) would cost a system call
 * for every few packets. */
static int burst_packets(erdma_quic *q, const ngtcp2_conn_stat *cs, double paced) {
  size_t pkt = ngtcp2_conn_get_max_tx_udp_payload_size(q->conn);
  if (pkt > 9000) return ERDMA_QUIC_MAX_BURST; /* loopback or jumbo link: no pacing needed */
  double rate = paced > 0 ? paced : cs->pacing_rate; /* bytes per ns */
  if (rate <= 0 && cs->smoothed_rtt > 0) rate = (double)cs->cwnd / (double)cs->smoothed_rtt;
  size_t bytes = (size_t)(rate * NGTCP2_MILLISECONDS);
  if (bytes < cs->send_quantum && paced <= 0) bytes = cs->send_quantum;
  if (bytes > 65536) bytes = 65536;
  int n = (int)(bytes / (pkt ? pkt : 1452));
  if (n < 2) n = 2;
  return n > ERDMA_QUIC_MAX_BURST ? ERDMA_QUIC_MAX_BURST : n;
}

/* One burst: packets while congestion control, flow control and pacing
 * allow, at most the send quantum; then ngtcp2 learns the send time
 * (ngtcp2_conn_update_pkt_tx_time) and refuses more until its pacing timer,
 * which erdma_quic_expiry reports.  The streams come from tx_pull: several
 * may share a packet (NGTCP2_WRITE_STREAM_FLAG_MORE). */
int erdma_quic_flush(erdma_quic *q, uint64_t now, int *more) {
  size_t lens[ERDMA_QUIC_MAX_BURST];
  int64_t blocked[ERDMA_QUIC_MAX_BLOCKED];
  int nblocked = 0;
  ngtcp2_path_storage ps;
  ngtcp2_pkt_info pi;
  if (more) *more = 0;
  if (q->closed) return 0;
  follow_path(q); /* a failed path validation may have moved it back */
  ngtcp2_path_storage_zero(&ps);
  if (q->pace_next > now) return 0; /* paced: erdma_quic_expiry wakes us */
  ngtcp2_conn_stat cs;
  ngtcp2_conn_get_conn_stat(q->conn, &cs);
  double paced = pace_rate(q, &cs);
  int maxp = burst_packets(q, &cs, paced);
  int n = 0, full = 1;
  size_t bytes = 0;
  while (n < maxp) {
    ngtcp2_vec iov[16];
    int64_t sid = -1;
    size_t room = 0;
    size_t niov = q->cb.tx_pull(q->user, blocked, nblocked, &sid, iov, 16);
    if (niov == 0 && sid >= 0) sid = -1; /* nothing of it to write */
    ngtcp2_ssize pdatalen = -1;
    uint8_t *buf = q->cb.tx_buf(q->user, n, maxp, &room);
    if (!buf) { /* no buffer (pool empty): nothing was written; try again soon */
      if (more) *more = ERDMA_QUIC_MORE_LATER;
      full = 0;
      break;
    }
    ngtcp2_ssize nw = ngtcp2_conn_writev_stream(
        q->conn, &ps.path, &pi, buf, room, &pdatalen,
        sid >= 0 ? NGTCP2_WRITE_STREAM_FLAG_MORE : 0, sid, niov ? iov : NULL, niov, now);
    if (pdatalen > 0) q->cb.tx_wrote(q->user, sid, (uint64_t)pdatalen);
    if (nw < 0) {
      if (nw == NGTCP2_ERR_WRITE_MORE) continue;
      if (nw == NGTCP2_ERR_STREAM_DATA_BLOCKED || nw == NGTCP2_ERR_STREAM_SHUT_WR) {
        if (nblocked < ERDMA_QUIC_MAX_BLOCKED) blocked[nblocked++] = sid;
        continue;
      }
      q->cb.tx_send(q->user, lens, n);
      lost(q, (int)nw, now);
      return (int)nw;
    }
    if (nw == 0) {
      full = 0; /* nothing more now: window, cwnd, pacing, or no data */
      break;
    }
    lens[n++] = (size_t)nw;
    bytes += (size_t)nw;
    if (q->cb.tx_packet) q->cb.tx_packet(q->user);
  }
  q->cb.tx_send(q->user, lens, n); /* n 0: the burst's buffers are released */
  ngtcp2_conn_update_pkt_tx_time(q->conn, now);
  if (paced > 0 && bytes > 0) { /* the next burst: one burst's time later, no sooner */
    uint64_t from = q->pace_next > now - NGTCP2_MILLISECONDS ? q->pace_next : now;
    q->pace_next = from + (uint64_t)((double)bytes / paced);
  } else {
    q->pace_next = 0;
  }
  if (full && more) *more = ERDMA_QUIC_MORE_NOW;
  return 0;
}

/* ---------------------------------------------------------------- timers */
uint64_t erdma_quic_expiry(const erdma_quic *q) {
  if (q->closed) return UINT64_MAX;
  uint64_t t = ngtcp2_conn_get_expiry(q->conn);
  return q->pace_next && q->pace_next < t ? q->pace_next : t;
}

int erdma_quic_handle_expiry(erdma_quic *q, uint64_t now) {
  if (q->closed) return 0;
  int paced = q->pace_next && q->pace_next <= now; /* our pacing pause is over: flush */
  if (paced) q->pace_next = 0;
  if (ngtcp2_conn_get_expiry(q->conn) > now) return paced;
  int rv = ngtcp2_conn_handle_expiry(q->conn, now);
  if (rv != 0) {
    lost(q, rv, now);
    return rv;
  }
  return 1;
}

/* --------------------------------------------------- streams and state */
int erdma_quic_open_bidi(erdma_quic *q, int64_t *sid) {
  return ngtcp2_conn_open_bidi_stream(q->conn, sid, NULL);
}

int erdma_quic_open_uni(erdma_quic *q, int64_t *sid) {
  return ngtcp2_conn_open_uni_stream(q->conn, sid, NULL);
}

void erdma_quic_extend_offset(erdma_quic *q, uint64_t n) { ngtcp2_conn_extend_max_offset(q->conn, n); }

void erdma_quic_extend_stream_offset(erdma_quic *q, int64_t sid, uint64_t n) {
  ngtcp2_conn_extend_max_stream_offset(q->conn, sid, n);
}

void erdma_quic_set_keep_alive(erdma_quic *q, uint64_t ns) {
  ngtcp2_conn_set_keep_alive_timeout(q->conn, (ngtcp2_duration)ns);
}

int erdma_quic_handshake_done(const erdma_quic *q) { return q->handshake_done; }

void erdma_quic_stat(const erdma_quic *q, ngtcp2_conn_stat *out) {
  ngtcp2_conn_get_conn_stat(q->conn, out);
}

uint64_t erdma_quic_stream_loss(const erdma_quic *q, int64_t sid) {
  return ngtcp2_conn_get_stream_loss_count(q->conn, sid);
}

size_t erdma_quic_max_udp_payload(const erdma_quic *q) {
  return ngtcp2_conn_get_max_tx_udp_payload_size(q->conn);
}
