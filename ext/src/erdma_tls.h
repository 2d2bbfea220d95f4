/* erdma_tls.h - TLS identities of ranks (erdma_tls.c).
 *
 * The component owns a rank's self-signed certificate, its credentials and
 * fingerprint, and the TLS priorities QUIC sessions use; it includes
 * gnutls.h for their types.  The engine (behind a pointer) keeps them. */
#ifndef ERDMA_TLS_H
#define ERDMA_TLS_H

#include <gnutls/gnutls.h>

#include "erdma.h"

/* tls.c */
/* a self-signed identity named after `rank`, its credentials, the TLS
 * priorities QUIC sessions use and the certificate's fingerprint (what
 * tls_identity_new makes for an engine; no engine needed) */
int tls_identity_make(int rank, gnutls_certificate_credentials_t *cred,
                      gnutls_priority_t *prio, char fingerprint[65]);
int tls_identity_new(erdma_engine *e);
void tls_identity_free(erdma_engine *e);

#endif /* ERDMA_TLS_H */
