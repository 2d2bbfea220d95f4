// test-sources: ext/src/erdma_engine.c ext/src/erdma_conn.c ext/src/erdma_quic.c ext/src/erdma_match.c tests/c/engine_stubs.c
// test-cflags: -DERDMA_STUBS_WITH_ENGINE -DERDMA_STUBS_WITH_SHM
/* How a collective's block to a rank of this host is routed
 * (erdma_shm.c: shm_bulk_by_cma): the costs timed as copies happen
 * (shm_cost_note, shm_cost_of), the peer's hints in the ring's header, the
 * period in which the way not taken is tried, and the fixed threshold of
 * ERDMA_SHM_BULK_CMA.  tests/test_shm_bulk_cma.py runs it between ranks. */
#define _GNU_SOURCE /* (erdma_shm.c's own, before any header) */
#include <time.h>

#include "ctest.h"
#include "erdma_shm.c"

#define RING ((uint64_t)1 << 20)
#define K256 ((uint64_t)256 << 10)

static erdma_engine E;
static erdma_conn C;
static struct shm_ring *TX;

/* An engine whose local peer 1 has a ring of RING bytes (TX) and a CMA
 * read of 256 KiB costs `read` ns (0: ERDMA_SHM_BULK_CMA set by hand). */
static void setup(uint64_t read) {
  static peer_info peers[2];
  memset(&E, 0, sizeof E);
  memset(&C, 0, sizeof C);
  erdma_config_default(&E.cfg);
  E.cfg.size = 2;
  E.shm.cma = 1;
  E.shm.ring_bytes = RING;
  E.shm.cma_read_ns = read;
  E.cfg.shm_bulk_cma_min = UINT64_MAX;
  memset(peers, 0, sizeof peers);
  E.peers = peers;
  peers[1].conn = &C;
  C.e = &E;
  C.shm = 1;
  C.peer = 1;
  if (!TX) TX = aligned_alloc(64, sizeof *TX + RING);
  memset(TX, 0, sizeof *TX);
  C.tx_ring = TX;
}

/* our copies into the ring timed at `in` ns per 256 KiB (a whole ring's
 * worth, so that the cost counts), the peer's hints out and read */
static void costs(uint64_t in, uint64_t out, uint64_t read) {
  uint64_t now = erdma_now();
  for (uint64_t b = 0; b < RING; b += K256) shm_cost_note(&C.tx_cost, RING, K256, in, now);
  atomic_store(&TX->out_cost, out);
  atomic_store(&TX->read_cost, read);
}

static int route(uint64_t n) { return shm_bulk_by_cma(&E, &C, n, ERDMA_SEND_BULK); }

/* the period began `ago` ns before now, the route so far `cma` */
static void period(uint64_t ago, int cma) {
  C.route_at = erdma_now() - ago;
  C.route_cma = cma;
  C.route_known = 1;
}

TEST(a_cost_is_the_latest_copy_until_a_ring_was_timed_then_an_average) {
  shm_cost k = {0};
  uint64_t now = 1000000000ull;
  shm_cost_note(&k, RING, K256, 40000, now);
  CHECK_EQ(k.ns, 40000);
  CHECK_EQ(shm_cost_of(&k, RING), 0); /* a ring not yet timed: not known */
  shm_cost_note(&k, RING, K256 / 2, 5000, now); /* 10000 per 256 KiB: replaces */
  CHECK_EQ(k.ns, 10000);
  shm_cost_note(&k, RING, K256, 10000, now);
  shm_cost_note(&k, RING, K256, 10000, now);
  CHECK_EQ(shm_cost_of(&k, RING), 0); /* 896 KiB of 1 MiB */
  shm_cost_note(&k, RING, K256, 10000, now);
  CHECK_EQ(shm_cost_of(&k, RING), 10000);
  shm_cost_note(&k, RING, K256, 30000, now); /* now averaged: 3/4 old + 1/4 new */
  CHECK_EQ(k.ns, 15000);
  shm_cost_note(&k, RING, K256, 10000000, now); /* a preemption counts as 4x at most */
  CHECK_EQ(k.ns, (3 * 15000 + 4 * 15000) / 4);
}

TEST(small_copies_are_not_timed_and_a_pause_starts_over) {
  shm_cost k = {0};
  uint64_t now = 1000000000ull;
  shm_cost_note(&k, RING, SHM_ROUTE_MIN / 4 - 1, 99, now);
  CHECK_EQ(k.ns, 0);
  for (int i = 0; i < 4; i++) shm_cost_note(&k, RING, K256, 20000, now);
  CHECK_EQ(shm_cost_of(&k, RING), 20000);
  now += SHM_ROUTE_STALE_NS; /* lines left alone: the first copies cost more */
  shm_cost_note(&k, RING, K256, 80000, now);
  CHECK_EQ(k.ns, 80000);
  CHECK_EQ(shm_cost_of(&k, RING), 0);
  CHECK_EQ(k.at, now);
}

TEST(a_slower_ring_sends_blocks_by_cma_a_faster_one_keeps_them) {
  setup(40000);
  costs(15000, 15000, 40000); /* in + out 30 us against a 40 us read */
  period(SHM_ROUTE_PERIOD_NS, 1);
  CHECK_EQ(route(1 << 20), 1); /* the period ended: decided, then tries CMA */
  CHECK_EQ(C.route_cma, 0);
  period(SHM_ROUTE_TRY_NS, 0);
  CHECK_EQ(route(1 << 20), 0);
  costs(50000, 30000, 40000); /* 80 us against 40 */
  period(SHM_ROUTE_PERIOD_NS, 0);
  CHECK_EQ(route(1 << 20), 0); /* decided CMA, tries the ring first */
  CHECK_EQ(C.route_cma, 1);
  period(SHM_ROUTE_TRY_NS, 1);
  CHECK_EQ(route(1 << 20), 1);
  CHECK_EQ(route(SHM_ROUTE_MIN), 1);
  CHECK_EQ(route(SHM_ROUTE_MIN - 1), 0); /* small blocks: always the ring */
  CHECK_EQ(shm_bulk_by_cma(&E, &C, 1 << 20, 0), 0); /* not a collective's block */
}

TEST(a_cost_not_known_leaves_the_route_alone) {
  setup(40000);
  costs(50000, 0, 40000); /* the peer has not timed a ring's worth of copies */
  period(SHM_ROUTE_PERIOD_NS, 0);
  route(1 << 20);
  CHECK_EQ(C.route_cma, 0);
  costs(50000, 30000, 0); /* nor of reads */
  period(SHM_ROUTE_PERIOD_NS, 0);
  route(1 << 20);
  CHECK_EQ(C.route_cma, 0);
  memset(&C.tx_cost, 0, sizeof C.tx_cost); /* nor have we */
  atomic_store(&TX->read_cost, 40000);
  period(SHM_ROUTE_PERIOD_NS, 1);
  route(1 << 20);
  CHECK_EQ(C.route_cma, 1);
}

TEST(the_first_decision_comes_after_a_short_period) {
  setup(40000);
  CHECK_EQ(route(1 << 20), 1); /* a new connection: tries CMA at once */
  CHECK_EQ(C.route_known, 0);
  uint64_t at = C.route_at;
  CHECK(at != 0);
  costs(50000, 30000, 40000);
  C.route_at = erdma_now() - SHM_ROUTE_FIRST_NS;
  CHECK_EQ(route(1 << 20), 0); /* decided (CMA) after 50 ms, tries the ring */
  CHECK_EQ(C.route_known, 1);
  CHECK_EQ(C.route_cma, 1);
}

TEST(a_fixed_threshold_or_no_cma_needs_no_costs) {
  setup(0);
  E.cfg.shm_bulk_cma_min = 64 << 10;
  CHECK_EQ(route(64 << 10), 1);
  CHECK_EQ(route((64 << 10) - 1), 0);
  E.cfg.shm_bulk_cma_min = UINT64_MAX; /* ERDMA_SHM_BULK_CMA=0: never */
  costs(500000, 500000, 1);
  period(SHM_ROUTE_PERIOD_NS, 1);
  CHECK_EQ(route(1 << 20), 0);
  setup(40000);
  E.shm.cma = 0; /* CMA refused */
  costs(500000, 500000, 1);
  period(SHM_ROUTE_PERIOD_NS, 1);
  CHECK_EQ(route(1 << 20), 0);
}

TEST(a_hostile_hint_only_picks_a_way) {
  setup(40000);
  costs(15000, UINT64_MAX, 1); /* no overflow to a wrong sum, either way is safe */
  period(SHM_ROUTE_PERIOD_NS, 0);
  route(1 << 20);
  CHECK_EQ(C.route_cma, 1);
  costs(15000, 1, UINT64_MAX);
  period(SHM_ROUTE_PERIOD_NS, 1);
  route(1 << 20);
  CHECK_EQ(C.route_cma, 0);
}

TEST(the_read_cost_is_measured) {
  uint64_t v = shm_read_cost();
  CHECK(v > 0);
  CHECK(v < 1000000000ull);
}

CTEST_MAIN()
