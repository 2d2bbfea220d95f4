// test-sources: ext/src/erdma_engine.c ext/src/erdma_conn.c ext/src/erdma_quic.c ext/src/erdma_match.c tests/c/engine_stubs.c
// test-cflags: -DERDMA_STUBS_WITH_ENGINE -DERDMA_STUBS_WITH_SHM
/* The split copy of a one-host point-to-point message (erdma_shm.c:
 * shm_split_take on the receiver, shm_split_push on the sender), driven
 * state by state through the sender's claim word.  One process plays both
 * sides: its "peer" is itself (CMA reads and writes of one's own memory
 * work), and the sender's segment is a buffer laid out as a real one. */
#define _GNU_SOURCE /* (erdma_shm.c's own, before any header) */
#include <pthread.h>
#include <time.h>

#include "ctest.h"
#include "erdma_shm.c"

#define N ((uint64_t)64 << 10)
#define SID 1000u
#define TAG ((uint64_t)SID << 8)

static erdma_engine E;
static erdma_conn C;
static struct shm_seg *SEG;
static uint8_t *SRC, *DST;
static erdma_req R;

/* A rank whose local peer 1 is itself, its send SID published in SEG. */
static void setup(double timeout) {
  static peer_info peers[2];
  memset(&E, 0, sizeof E);
  memset(&C, 0, sizeof C);
  memset(&R, 0, sizeof R);
  erdma_config_default(&E.cfg);
  E.cfg.size = 2;
  E.cfg.idle_timeout = timeout;
  if (!SEG) {
    SEG = aligned_alloc(64, SHM_RINGS);
    SRC = malloc(N);
    DST = malloc(N);
  }
  memset(SEG, 0, SHM_RINGS);
  SEG->pid = getpid();
  E.shm.seg = SEG;
  E.shm.cma = 1;
  memset(peers, 0, sizeof peers);
  E.peers = peers;
  peers[1].conn = &C;
  C.e = &E;
  C.shm = 1;
  C.peer = 1;
  C.peer_seg = SEG;
  C.peer_pid = getpid(); /* the "peer" is this process: CMA copies within it */
  for (uint64_t i = 0; i < N; i++) SRC[i] = (uint8_t)(i * 7 + 3);
  memset(DST, 0, N);
  atomic_store(cma_slot(SEG, SID), SID);
  atomic_store(cma_claim(SEG, SID), TAG);
  R.cma_sid = SID;
  R.sbuf = SRC;
  R.nbytes = N;
}

static uint64_t claim(void) { return atomic_load(cma_claim(SEG, SID)); }
static void set_claim(uint64_t v) { atomic_store(cma_claim(SEG, SID), v); }
static int take(void) { return shm_split_take(&C, DST, (uintptr_t)SRC, N, SID); }

static int all_zero(const uint8_t *p, uint64_t n) {
  for (uint64_t i = 0; i < n; i++)
    if (p[i]) return 0;
  return 1;
}

TEST(split_point_is_past_the_middle_and_within_the_message) {
  CHECK_EQ(split_at(N), N / 2 + SPLIT_LEAD);
  CHECK_EQ(split_at(16 << 10), (8 << 10) + SPLIT_LEAD);
  CHECK_EQ(split_at(1000), 1000); /* (500 + 2048) & ~63 is past the end: all of it */
  CHECK(split_at(100) <= 100);
}

TEST(receiver_first_claims_and_copies_everything) {
  setup(1.0);
  CHECK_EQ(take(), 0); /* 0: its CTS completes the send */
  CHECK_MEM(DST, SRC, N);
  CHECK_EQ(claim(), TAG | CLAIM_RECEIVER);
  /* the sender's CTS comes too late: it writes nothing */
  memset(DST, 0, N);
  CHECK_EQ(shm_split_push(&C, &R, (uintptr_t)DST), 0);
  CHECK(all_zero(DST, N));
  CHECK_EQ(claim(), TAG | CLAIM_RECEIVER);
}

TEST(sender_wrote_its_part_the_receiver_reads_its_own_and_marks_it) {
  setup(1.0);
  uint64_t h = split_at(N);
  memcpy(DST + h, SRC + h, N - h); /* what the sender wrote */
  set_claim(TAG | CLAIM_SENDER | CLAIM_SENT);
  CHECK_EQ(take(), 1); /* 1: the sender completes its send itself */
  CHECK_MEM(DST, SRC, N);
  CHECK_EQ(claim(), TAG | CLAIM_SENDER | CLAIM_SENT | CLAIM_READ);
}

TEST(sender_failed_to_write_the_receiver_reads_the_rest) {
  setup(1.0);
  set_claim(TAG | CLAIM_SENDER | CLAIM_FAILED);
  CHECK_EQ(take(), 0);
  CHECK_MEM(DST, SRC, N);
}

TEST(sender_that_gave_up_waiting_gets_the_receivers_cts) {
  setup(1.0);
  uint64_t h = split_at(N);
  memcpy(DST + h, SRC + h, N - h);
  set_claim(TAG | CLAIM_SENDER | CLAIM_SENT | CLAIM_ABANDONED);
  CHECK_EQ(take(), 0);
  CHECK_MEM(DST, SRC, N);
}

TEST(sender_frozen_mid_write_fails_the_receive_after_the_timeout) {
  setup(0.2);
  set_claim(TAG | CLAIM_SENDER);
  uint64_t t0 = erdma_now();
  CHECK_EQ(take(), -2);
  uint64_t waited = erdma_now() - t0;
  CHECK(waited >= 150000000ull && waited < 5000000000ull);
}

TEST(words_of_another_send_or_states_no_side_makes_are_refused) {
  setup(1.0);
  set_claim(((uint64_t)(SID + 512) << 8) | CLAIM_SENDER); /* the slot's next send */
  CHECK_EQ(take(), -2);
  setup(1.0);
  set_claim(TAG | CLAIM_READ); /* READ without a sender's claim */
  CHECK_EQ(take(), -2);
  setup(1.0);
  set_claim(TAG | CLAIM_RECEIVER);
  CHECK_EQ(shm_split_push(&C, &R, (uintptr_t)DST), 0);
  CHECK(all_zero(DST, N));
}

TEST(a_withdrawn_send_is_never_delivered) {
  setup(1.0);
  atomic_store(cma_slot(SEG, SID), 0); /* the sender took its buffer back */
  CHECK_EQ(take(), -2);
}

TEST(receiver_refused_cma_tells_the_sender_to_send_frames) {
  setup(1.0);
  E.shm.cma = 0; /* our reads are refused (as after EPERM) */
  set_claim(TAG | CLAIM_SENDER | CLAIM_SENT);
  CHECK_EQ(take(), -1);
  CHECK_EQ(claim(), TAG | CLAIM_SENDER | CLAIM_SENT | CLAIM_UNREAD);
  CHECK(!shm_split_ok(&C));
}

/* The receiver's side of a push: wait for SENT (or FAILED), then mark. */
static void *receiver_marks(void *arg) {
  uint64_t mark = (uint64_t)(uintptr_t)arg;
  for (int i = 0; i < 2000000; i++) {
    uint64_t v = claim();
    if (v & (CLAIM_SENT | CLAIM_FAILED)) {
      atomic_compare_exchange_strong(cma_claim(SEG, SID), &v, v | mark);
      return NULL;
    }
    struct timespec ts = {0, 1000};
    nanosleep(&ts, NULL);
  }
  return NULL;
}

/* shm_split_push's answer while a thread plays the receiver marking `mark` */
static int push_against(uint64_t mark) {
  pthread_t t;
  pthread_create(&t, NULL, receiver_marks, (void *)(uintptr_t)mark);
  int rv = shm_split_push(&C, &R, (uintptr_t)DST);
  pthread_join(t, NULL);
  return rv;
}

TEST(sender_writes_its_part_and_completes_once_the_receiver_marks_read) {
  setup(2.0);
  CHECK_EQ(push_against(CLAIM_READ), 1);
  uint64_t h = split_at(N);
  CHECK(all_zero(DST, h));
  CHECK_MEM(DST + h, SRC + h, N - h);
  CHECK_EQ(claim(), TAG | CLAIM_SENDER | CLAIM_SENT | CLAIM_READ);
  CHECK_EQ(E.stats.split_pushes, 1);
}

TEST(sender_keeps_its_send_when_the_receiver_could_not_read) {
  setup(2.0);
  CHECK_EQ(push_against(CLAIM_UNREAD), 0);
}

TEST(sender_gives_up_on_a_silent_receiver_and_marks_it) {
  setup(0.2);
  CHECK_EQ(shm_split_push(&C, &R, (uintptr_t)DST), 0);
  CHECK_EQ(claim(), TAG | CLAIM_SENDER | CLAIM_SENT | CLAIM_ABANDONED);
}

TEST(a_bad_receive_address_fails_the_write_and_leaves_the_part_to_the_receiver) {
  setup(1.0);
  CHECK_EQ(shm_split_push(&C, &R, 4096), 0); /* unmapped */
  CHECK_EQ(claim(), TAG | CLAIM_SENDER | CLAIM_FAILED);
  CHECK_EQ(take(), 0);
  CHECK_MEM(DST, SRC, N);
}

TEST(publish_resets_the_claim_word_for_the_new_send) {
  setup(1.0);
  set_claim(TAG | CLAIM_SENDER | CLAIM_SENT | CLAIM_READ);
  atomic_store(cma_slot(SEG, SID), 0);
  erdma_req r2 = {0};
  r2.id = SID + 512; /* the same slot */
  CHECK_EQ(shm_cma_publish(&E, &r2), 1);
  CHECK_EQ(atomic_load(cma_claim(SEG, SID + 512)), (uint64_t)(SID + 512) << 8);
}

CTEST_MAIN()
