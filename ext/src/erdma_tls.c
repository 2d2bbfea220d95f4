/* erdma_tls.c - per-rank TLS identity (self-signed ECDSA P-256) and GnuTLS
 * sessions for QUIC.  Peers authenticate each other by the SHA-256
 * fingerprint of their certificate, published through the rendezvous. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <gnutls/crypto.h>
#include <gnutls/x509.h>
#include <ngtcp2/ngtcp2_crypto_gnutls.h>

#include "erdma_internal.h"

/* TLS 1.3 only; AES-128-GCM first (GnuTLS's NORMAL puts AES-256-GCM first):
 * every payload byte is sealed and opened once, and with AES-NI the 128-bit
 * key is 5-7 % cheaper here; ChaCha20 is 9x slower and stays last */
#define PRIORITY                                                               \
  "%DISABLE_TLS13_COMPAT_MODE:NORMAL:-VERS-ALL:+VERS-TLS1.3:-CIPHER-ALL:"      \
  "+AES-128-GCM:+AES-256-GCM:+CHACHA20-POLY1305"

static void hex(const uint8_t *in, size_t n, char *out) {
  static const char d[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = d[in[i] >> 4];
    out[2 * i + 1] = d[in[i] & 15];
  }
  out[2 * n] = 0;
}

static int fingerprint_der(const gnutls_datum_t *der, char out[65]) {
  uint8_t md[32];
  if (gnutls_hash_fast(GNUTLS_DIG_SHA256, der->data, der->size, md) < 0)
    return ERDMA_ERR_TLS;
  hex(md, 32, out);
  return 0;
}

static ngtcp2_conn *get_conn(ngtcp2_crypto_conn_ref *ref) {
  return ((erdma_conn *)ref->user_data)->conn;
}

/* Called by GnuTLS inside the handshake, as soon as the peer's certificate
 * arrives (under e->mu, from ngtcp2_conn_read_pkt).  A client accepts only
 * the fingerprint published for the rank it dials; a server only one of the
 * fingerprints set_peer gave (which rank it is comes later, in the HELLO,
 * and on_hello checks that the two agree).  Anyone else fails the handshake
 * with a TLS alert and never reaches stream data.  An empty fingerprint
 * matches anything only in an insecure engine (set_peer refuses it
 * otherwise). */
static int verify_peer(gnutls_session_t session) {
  ngtcp2_crypto_conn_ref *ref = gnutls_session_get_ptr(session);
  erdma_conn *c = ref ? ref->user_data : NULL;
  char fp[65];
  if (!c) return GNUTLS_E_CERTIFICATE_ERROR;
  erdma_engine *e = c->e;
  if (tls_peer_fingerprint(c, fp) != 0) return GNUTLS_E_CERTIFICATE_ERROR;
  if (c->is_client) {
    const char *want = e->peers[c->peer].fingerprint;
    if (want[0] ? strcmp(fp, want) == 0 : e->cfg.insecure) return 0;
  } else {
    if (e->cfg.insecure) return 0;
    for (int i = 0; i < e->cfg.size; i++)
      if (i != e->cfg.rank && fp[0] && strcmp(fp, e->peers[i].fingerprint) == 0) return 0;
  }
  if (e->cfg.verbose)
    fprintf(stderr, "erdma[%d]: refused a %s certificate in the TLS handshake (%s)\n",
            e->cfg.rank, fp[0] ? "foreign" : "missing", fp[0] ? fp : "none presented");
  return GNUTLS_E_CERTIFICATE_ERROR;
}

int tls_identity_new(erdma_engine *e) {
  gnutls_x509_privkey_t key = NULL;
  gnutls_x509_crt_t crt = NULL;
  gnutls_datum_t der = {NULL, 0};
  int rv = ERDMA_ERR_TLS;
  uint8_t serial[8];
  char cn[64];
  time_t now = time(NULL);

  if (gnutls_x509_privkey_init(&key) < 0 ||
      gnutls_x509_privkey_generate(key, GNUTLS_PK_ECDSA,
                                   GNUTLS_CURVE_TO_BITS(GNUTLS_ECC_CURVE_SECP256R1), 0) < 0)
    goto out;
  if (gnutls_x509_crt_init(&crt) < 0) goto out;
  gnutls_rnd(GNUTLS_RND_NONCE, serial, sizeof serial);
  serial[0] &= 0x7f;
  snprintf(cn, sizeof cn, "erdma-rank-%d", e->cfg.rank);
  if (gnutls_x509_crt_set_version(crt, 3) < 0 ||
      gnutls_x509_crt_set_serial(crt, serial, sizeof serial) < 0 ||
      gnutls_x509_crt_set_activation_time(crt, now - 3600) < 0 ||
      gnutls_x509_crt_set_expiration_time(crt, now + 30 * 86400) < 0 ||
      gnutls_x509_crt_set_dn_by_oid(crt, GNUTLS_OID_X520_COMMON_NAME, 0, cn, strlen(cn)) < 0 ||
      gnutls_x509_crt_set_subject_alt_name(crt, GNUTLS_SAN_DNSNAME, "localhost", 9,
                                           GNUTLS_FSAN_SET) < 0 ||
      gnutls_x509_crt_set_key(crt, key) < 0 ||
      gnutls_x509_crt_sign2(crt, crt, key, GNUTLS_DIG_SHA256, 0) < 0)
    goto out;
  if (gnutls_x509_crt_export2(crt, GNUTLS_X509_FMT_DER, &der) < 0) goto out;
  if (fingerprint_der(&der, e->fingerprint) != 0) goto out;
  if (gnutls_certificate_allocate_credentials(&e->cred) < 0) goto out;
  if (gnutls_certificate_set_x509_key(e->cred, &crt, 1, key) < 0) goto out;
  gnutls_certificate_set_verify_function(e->cred, verify_peer);
  if (gnutls_priority_init(&e->prio, PRIORITY, NULL) < 0) goto out;
  rv = 0;
out:
  if (der.data) gnutls_free(der.data);
  if (crt) gnutls_x509_crt_deinit(crt);
  if (key) gnutls_x509_privkey_deinit(key);
  return rv;
}

void tls_identity_free(erdma_engine *e) {
  if (e->cred) gnutls_certificate_free_credentials(e->cred);
  if (e->prio) gnutls_priority_deinit(e->prio);
  e->cred = NULL;
  e->prio = NULL;
}


int tls_session_new(erdma_engine *e, erdma_conn *c) {
  unsigned flags = (c->is_client ? GNUTLS_CLIENT : GNUTLS_SERVER) |
                   GNUTLS_ENABLE_EARLY_DATA | GNUTLS_NO_END_OF_EARLY_DATA;
  gnutls_datum_t alpn = {(unsigned char *)ERDMA_ALPN, sizeof(ERDMA_ALPN) - 1};
  if (gnutls_init(&c->tls, flags) < 0) return ERDMA_ERR_TLS;
  if (gnutls_priority_set(c->tls, e->prio) < 0) return ERDMA_ERR_TLS;
  if ((c->is_client ? ngtcp2_crypto_gnutls_configure_client_session(c->tls)
                    : ngtcp2_crypto_gnutls_configure_server_session(c->tls)) != 0)
    return ERDMA_ERR_TLS;
  c->conn_ref.get_conn = get_conn;
  c->conn_ref.user_data = c;
  gnutls_session_set_ptr(c->tls, &c->conn_ref);
  if (gnutls_credentials_set(c->tls, GNUTLS_CRD_CERTIFICATE, e->cred) < 0)
    return ERDMA_ERR_TLS;
  if (gnutls_alpn_set_protocols(c->tls, &alpn, 1, GNUTLS_ALPN_MANDATORY) < 0)
    return ERDMA_ERR_TLS;
  if (c->is_client)
    gnutls_server_name_set(c->tls, GNUTLS_NAME_DNS, "localhost", 9);
  else /* a client without a certificate fails the handshake (verify_peer) */
    gnutls_certificate_server_set_request(c->tls, e->cfg.insecure ? GNUTLS_CERT_REQUEST
                                                                  : GNUTLS_CERT_REQUIRE);
  return 0;
}

/* Fingerprint of the certificate the peer presented ("" if none). */
int tls_peer_fingerprint(erdma_conn *c, char out[65]) {
  unsigned n = 0;
  const gnutls_datum_t *certs = gnutls_certificate_get_peers(c->tls, &n);
  out[0] = 0;
  if (!certs || n == 0) return 0;
  return fingerprint_der(&certs[0], out);
}
