/* engine_stubs.c - what the engine's matching core (erdma_conn.c,
 * erdma_match.c) calls outside itself, for programs that run it with no
 * network, threads, TLS or shared memory below: the C unit tests
 * (tests/c/test_*.c) and the libFuzzer harness fuzz/c/fuzz_frames.c.
 *
 * Compiled with -DERDMA_STUBS_WITH_ENGINE when the real erdma_engine.c is
 * linked too (its point-to-point API then runs for real): the functions it
 * defines are left out, and what it needs besides (ULFM, NAT, the UDP
 * backend, the rest of shared memory, TLS identities) is stubbed instead.
 *
 * With -DERDMA_STUBS_WITH_SHM too, erdma_shm.c is the test's own (it
 * includes the file to reach its static functions).
 *
 * Behaviour: no connection is shared-memory local (every one has the QUIC
 * channel, which reads nothing in place; a test may give one another
 * channel), TLS identities fail, and nothing is ever sent on a socket:
 * queued frames stay on the connection's tx lists. */
#include <stdio.h>
#include <time.h>

#include "erdma_conn.h"
#include "erdma_engine.h"
#include "erdma_nat.h"
#include "erdma_pktio.h"
#include "erdma_shm.h"
#include "erdma_tls.h"
#include "erdma_ulfm.h"

#ifndef ERDMA_STUBS_WITH_ENGINE
/* ---- defined by erdma_engine.c ---- */
uint64_t erdma_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
int addr_is_loopback(const struct sockaddr_storage *a) { (void)a; return 1; }
void engine_wake(erdma_engine *e) { (void)e; }
void engine_wake_waiters(erdma_engine *e) { (void)e; }
void engine_sendv(erdma_engine *e, erdma_conn *c, uint8_t *bufs, size_t *lens, int n) {
  (void)e; (void)c; (void)bufs; (void)lens; (void)n;
}
size_t engine_conn_payload(erdma_engine *e, const erdma_conn *c) { (void)e; (void)c; return 1452; }
size_t engine_write_room(erdma_engine *e, const erdma_conn *c) { (void)e; (void)c; return 1452; }
const char *erdma_strerror(int rc) { (void)rc; return "error"; }
void addr_format(const struct sockaddr_storage *a, char *host, size_t hostcap, int *port) {
  (void)a;
  snprintf(host, hostcap, "?");
  *port = 0;
}
#endif

/* ---- erdma_nat.c, erdma_ulfm.c, erdma_shm.c ---- */
uint64_t nat_keepalive_ns(erdma_engine *e) { (void)e; return 0; }
void ulfm_note_failure(erdma_engine *e, int peer) { (void)e; (void)peer; }
#ifndef ERDMA_STUBS_WITH_SHM
int shm_is_local(erdma_engine *e, int rank) { (void)e; (void)rank; return -1; }
void shm_wake_waiters(erdma_engine *e) { (void)e; }
uint64_t shm_hold_max(const erdma_engine *e) { return e->cfg.unexpected_max; }
void shm_hold_lifted(erdma_engine *e) { (void)e; }
void shm_hold_taken(erdma_engine *e) { (void)e; }
#endif

#ifdef ERDMA_STUBS_WITH_ENGINE
/* ---- what erdma_engine.c needs besides ---- */
int ctx_failure_unacked(erdma_engine *e, uint32_t ctx) { (void)e; (void)ctx; return 0; }
int req_failure_pending(erdma_req *r) { (void)r; return 0; }
int reqs_failure_pending(erdma_req *const *reqs, int n) { (void)reqs; (void)n; return 0; }
int erdma_req_withdraw_failed(erdma_req *r) { (void)r; return 0; }
void ulfm_free(erdma_engine *e) { (void)e; }
void nat_free(erdma_engine *e) { (void)e; }
size_t nat_max_udp_payload(erdma_engine *e, const erdma_conn *c) { (void)e; (void)c; return 0; }
int nat_rx(erdma_engine *e, const uint8_t *data, size_t len, const struct sockaddr_storage *from,
           socklen_t fromlen) {
  (void)e; (void)data; (void)len; (void)from; (void)fromlen;
  return 0;
}
int nat_sendv(erdma_engine *e, erdma_conn *c, uint8_t *bufs, size_t *lens, int n) {
  (void)e; (void)c; (void)bufs; (void)lens; (void)n;
  return 0;
}
int pktio_udp_open(erdma_engine *e) { (void)e; return ERDMA_ERR_PKTIO; }
size_t pktio_udp_path_payload(erdma_engine *e, const struct sockaddr_storage *to,
                              socklen_t tolen) {
  (void)e; (void)to; (void)tolen;
  return 0;
}
#ifndef ERDMA_STUBS_WITH_SHM /* (a test that includes erdma_shm.c) */
int shm_attach_peers(erdma_engine *e) { (void)e; return 0; }
int shm_poll(erdma_engine *e) { (void)e; return 0; }
int shm_poll_rings(erdma_engine *e) { (void)e; return 0; }
int shm_sleep_prepare(erdma_engine *e) { (void)e; return 0; }
void shm_sleep_done(erdma_engine *e) { (void)e; }
void shm_spin_begin(erdma_engine *e) { (void)e; }
void shm_spin_end(erdma_engine *e) { (void)e; }
int shm_rx_ready(erdma_engine *e) { (void)e; return 0; }
int shm_shares_cpu(erdma_engine *e) { (void)e; return 0; }
int shm_move_off_cpu(erdma_engine *e) { (void)e; return 0; }
int shm_wait(erdma_engine *e, erdma_req *const *reqs, int n, uint64_t deadline) {
  (void)e; (void)reqs; (void)n; (void)deadline;
  return 0;
}
void shm_app_active(erdma_engine *e) { (void)e; }
void shm_app_idle(erdma_engine *e) { (void)e; }
uint64_t shm_next_wake(erdma_engine *e, uint64_t exp, uint64_t now) {
  (void)e; (void)now;
  return exp;
}
void shm_teardown(erdma_engine *e) { (void)e; }
void shm_unmap_peers(erdma_engine *e) { (void)e; }
int shm_bulk_by_cma(const erdma_engine *e, uint64_t nbytes, int flags) {
  (void)e;
  (void)nbytes;
  (void)flags;
  return 0;
}
int shm_p2p_by_cma(const erdma_engine *e, uint64_t nbytes, int flags, uint32_t ctx) {
  (void)e;
  (void)nbytes;
  (void)flags;
  (void)ctx;
  return 0;
}
int shm_cma_publish(erdma_engine *e, erdma_req *r) { (void)e; (void)r; return 0; }
#endif
int tls_identity_new(erdma_engine *e) { (void)e; return ERDMA_ERR_TLS; }
void tls_identity_free(erdma_engine *e) { (void)e; }
#endif
