// test-sources: ext/src/erdma_engine.c ext/src/erdma_conn.c ext/src/erdma_quic.c ext/src/erdma_match.c tests/c/engine_stubs.c
// test-cflags: -DERDMA_STUBS_WITH_ENGINE
/* MPI matching through the engine's own code paths, with no network: rank 0
 * of a two-rank engine whose connection to rank 1 has no QUIC below it
 * (as fuzz/c/fuzz_frames.c builds it).  The application side is the public
 * API of erdma_engine.c (erdma_isend, erdma_irecv, erdma_iprobe,
 * erdma_improbe, erdma_imrecv, erdma_req_cancel, erdma_req_test); rank 1 is
 * played by stream bytes fed to the frame parser (conn_rx_feed_at), written
 * here byte by byte from docs/wire.md, and by reading the frames rank 0
 * queues for it (the connection's tx list, never flushed). */
#include <stdint.h>

#include "ctest.h"
#include "erdma_conn.h"
#include "erdma_engine.h"
#include "erdma_match.h"

#define CTX 7

/* ---- a two-rank engine, rank 1 behind a fake connection ---- */
static erdma_engine *E;
static erdma_conn *C;

static void setup(void) {
  erdma_engine *e = calloc(1, sizeof *e);
  erdma_config_default(&e->cfg);
  e->cfg.rank = 0;
  e->cfg.size = 2;
  e->cfg.recv_alloc_max = 1u << 20;
  e->evfd = e->fd = e->io.fd = -1;
  e->lanes_max = 1;
  e->started = 1;
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cv, NULL);
  e->peers = calloc(2, sizeof *e->peers);
  erdma_conn *c = conn_alloc(e, 0);
  c->peer = 1;
  c->hello_recv = 1;
  c->handshake_done = 1;
  c->stream_id = 0;
  e->peers[1].conn = c;
  E = e;
  C = c;
}

static void teardown(void) {
  erdma_engine_free(E);
  E = NULL;
  C = NULL;
}

/* The request is finished and freed; its status is returned. */
static erdma_status finish(erdma_req *r) {
  erdma_status st;
  int done = 0;
  memset(&st, 0xee, sizeof st);
  erdma_req_test(r, &done, &st);
  if (!done) {
    fprintf(stderr, "  (request not done)\n");
    erdma_req_abort(r);
    st.error = 12345;
  }
  erdma_req_free(r);
  return st;
}

static int is_done(erdma_req *r) {
  int done = 0;
  erdma_req_test(r, &done, NULL);
  return done;
}

/* ---- rank 1's frames, encoded here from docs/wire.md section 3 ---- */
static void le(uint8_t *p, uint64_t v, int n) {
  for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t getle(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* header: type flags reserved ctx tag(or offset lo) aux(or offset hi) len id */
static void wire_hdr(uint8_t out[32], int type, int flags, uint32_t ctx, uint64_t tag_or_off,
                     uint64_t len, uint64_t id) {
  memset(out, 0, 32);
  out[0] = (uint8_t)type;
  out[1] = (uint8_t)flags;
  le(out + 4, ctx, 4);
  le(out + 8, tag_or_off, type == FR_CHUNK ? 8 : 4);
  le(out + 16, len, 8);
  le(out + 24, id, 8);
}

/* feed bytes on stream index `s` (0 control, 1.. data streams): 0 or the
 * parser's error (the caller then drops the peer, as conn_lost does) */
static int feed(int s, const void *p, size_t n) {
  pthread_mutex_lock(&E->mu);
  int rv = conn_rx_feed_at(C, s, p, n, 0);
  pthread_mutex_unlock(&E->mu);
  return rv;
}

static int feed_frame(int s, int type, int flags, uint32_t ctx, uint64_t tag_or_off,
                      uint64_t len, uint64_t id, const void *payload, size_t plen) {
  uint8_t *b = malloc(32 + plen);
  wire_hdr(b, type, flags, ctx, tag_or_off, len, id);
  if (plen) memcpy(b + 32, payload, plen);
  int rv = feed(s, b, 32 + plen);
  free(b);
  return rv;
}

static int eager(int tag, const char *s) {
  return feed_frame(0, FR_EAGER, 0, CTX, (uint32_t)tag, strlen(s), 0, s, strlen(s));
}

static void lose_peer(void) {
  pthread_mutex_lock(&E->mu);
  C->closed = 1;
  engine_fail_peer(E, 1, ERDMA_ERR_PEER);
  pthread_mutex_unlock(&E->mu);
}

/* ---- what rank 0 queued for rank 1 ---- */
typedef struct {
  int type, flags;
  uint32_t ctx;
  int32_t tag;
  uint64_t len, id;
  const uint8_t *payload;
  erdma_req *req;
} sent_frame;

static int nsent(void) {
  int n = 0;
  for (tx_item *t = C->tx_head; t; t = t->next) n++;
  return n;
}

static sent_frame sent(int k) { /* k < 0: from the end */
  sent_frame f;
  memset(&f, 0, sizeof f);
  int n = nsent(), i = 0;
  if (k < 0) k += n;
  for (tx_item *t = C->tx_head; t; t = t->next, i++)
    if (i == k) {
      f.type = t->hdr[0];
      f.flags = t->hdr[1];
      f.ctx = (uint32_t)getle(t->hdr + 4, 4);
      f.tag = (int32_t)getle(t->hdr + 8, 4);
      f.len = getle(t->hdr + 16, 8);
      f.id = getle(t->hdr + 24, 8);
      f.payload = t->payload;
      f.req = t->req;
    }
  return f;
}

/* everything queued went into packets, and the peer acknowledged them */
static void ack_all(void) {
  pthread_mutex_lock(&E->mu);
  C->tx_write = NULL;
  conn_acked(C, C->tx_offset);
  pthread_mutex_unlock(&E->mu);
}

static erdma_req *irecv(void *buf, uint64_t cap, int src, int tag) {
  erdma_req *r = NULL;
  if (erdma_irecv(E, buf, cap, src, tag, CTX, 0, &r) != 0) abort();
  return r;
}

static int unexpected_count(void) {
  int n = 0;
  for (erdma_msg *m = E->unexp_head; m; m = m->next) n++;
  return n;
}

/* ================================================================ tests */

TEST(frame_header_encoding) {
  /* the engine's encoder and decoder against the layout of docs/wire.md */
  uint8_t want[32], got[32];
  frame_hdr h = {0};
  h.type = FR_RTS;
  h.flags = FR_FLAG_SYNC;
  h.ctx = 0x01020304;
  h.tag = -2;
  h.len = 0x1122334455667788ull;
  h.id = 42;
  hdr_encode(got, &h);
  wire_hdr(want, FR_RTS, FR_FLAG_SYNC, 0x01020304, 0xfffffffeu, 0x1122334455667788ull, 42);
  CHECK_MEM(got, want, 32);
  frame_hdr d;
  hdr_decode(&d, want);
  CHECK_EQ(d.type, FR_RTS);
  CHECK_EQ(d.tag, -2);
  CHECK_EQ(d.ctx, 0x01020304);
  CHECK(d.len == 0x1122334455667788ull);
  CHECK_EQ(d.id, 42);
  /* a CHUNK carries a 64-bit offset where the tag and aux are */
  memset(&h, 0, sizeof h);
  h.type = FR_CHUNK;
  h.off = 0x0000000500000003ull;
  h.len = 9;
  h.id = 3;
  hdr_encode(got, &h);
  wire_hdr(want, FR_CHUNK, 0, 0, 0x0000000500000003ull, 9, 3);
  CHECK_MEM(got, want, 32);
  hdr_decode(&d, want);
  CHECK(d.off == 0x0000000500000003ull);
}

TEST(eager_after_posted_receive) {
  setup();
  char buf[16];
  memset(buf, '#', sizeof buf);
  erdma_req *r = irecv(buf, sizeof buf, 1, 5);
  CHECK(!is_done(r));
  CHECK_EQ(eager(5, "hello world"), 0);
  erdma_status st = finish(r);
  CHECK_EQ(st.error, 0);
  CHECK_EQ(st.source, 1);
  CHECK_EQ(st.tag, 5);
  CHECK_EQ(st.nbytes, 11);
  CHECK_MEM(buf, "hello world#####", 16);
  CHECK_EQ(unexpected_count(), 0);
  CHECK_EQ(E->stats.unexpected, 0);
  teardown();
}

TEST(eager_before_posted_receive_is_unexpected) {
  setup();
  CHECK_EQ(eager(5, "early"), 0);
  CHECK_EQ(unexpected_count(), 1);
  CHECK_EQ(E->stats.unexpected, 1);
  char buf[8] = {0};
  erdma_req *r = irecv(buf, sizeof buf, 1, 5);
  CHECK(is_done(r)); /* matched at once from the unexpected queue */
  erdma_status st = finish(r);
  CHECK_EQ(st.error, 0);
  CHECK_EQ(st.nbytes, 5);
  CHECK_MEM(buf, "early", 5);
  CHECK_EQ(unexpected_count(), 0);
  teardown();
}

TEST(unexpected_payload_buffers_are_reused) {
  /* a 64 KiB unexpected message's buffer goes back to the pool when its
   * receive copies it out, and the next such message lands in it; an
   * allocating receive keeps the buffer it took; small and large sizes
   * are not pooled; every payload arrives intact */
  setup();
  msgbuf_trim();
  uint64_t n = 40000; /* in the 64 KiB class */
  uint8_t *pay = malloc(n), *buf = malloc(n);
  for (uint64_t i = 0; i < n; i++) pay[i] = (uint8_t)(i * 7 + 1);
  CHECK_EQ(feed_frame(0, FR_EAGER, 0, CTX, 3, n, 0, pay, n), 0);
  CHECK(E->unexp_head && E->unexp_head->pooled);
  void *first = E->unexp_head->data;
  erdma_status st = finish(irecv(buf, n, 1, 3));
  CHECK_EQ(st.error, 0);
  CHECK_MEM(buf, pay, n);
  pay[0] ^= 0xff;
  CHECK_EQ(feed_frame(0, FR_EAGER, 0, CTX, 3, n, 0, pay, n), 0);
  CHECK(E->unexp_head && E->unexp_head->data == first); /* reused */
  /* an allocating receive takes the payload buffer itself */
  erdma_req *r = NULL;
  CHECK_EQ(erdma_irecv(E, NULL, 0, 1, 3, CTX, 1, &r), 0);
  CHECK(is_done(r));
  CHECK(erdma_req_data(r) == first);
  CHECK_MEM(erdma_req_data(r), pay, n);
  CHECK_EQ(finish(r).error, 0);
  /* the pool is empty again: the next one is a new buffer */
  CHECK_EQ(feed_frame(0, FR_EAGER, 0, CTX, 3, n, 0, pay, n), 0);
  CHECK(E->unexp_head && E->unexp_head->pooled);
  CHECK(finish(irecv(buf, n, 1, 3)).error == 0);
  CHECK_MEM(buf, pay, n);
  /* a 4 KiB one (a Gather block that came early) is pooled too */
  CHECK_EQ(feed_frame(0, FR_EAGER, 0, CTX, 3, 4096, 0, pay, 4096), 0);
  CHECK(E->unexp_head && E->unexp_head->pooled);
  CHECK(finish(irecv(buf, 4096, 1, 3)).error == 0);
  CHECK_MEM(buf, pay, 4096);
  /* below 1 KiB: plain malloc */
  CHECK_EQ(eager(4, "small"), 0);
  CHECK(E->unexp_head && !E->unexp_head->pooled);
  char sb[8];
  CHECK_EQ(finish(irecv(sb, 8, 1, 4)).error, 0);
  CHECK_MEM(sb, "small", 5);
  free(pay);
  free(buf);
  teardown();
}

TEST(frames_split_anywhere) {
  /* two frames fed one byte at a time: the parser reassembles both */
  setup();
  char a[4], b[4];
  erdma_req *ra = irecv(a, 4, 1, 1), *rb = irecv(b, 4, 1, 2);
  uint8_t bytes[2 * 36];
  wire_hdr(bytes, FR_EAGER, 0, CTX, 1, 4, 0);
  memcpy(bytes + 32, "abcd", 4);
  wire_hdr(bytes + 36, FR_EAGER, 0, CTX, 2, 4, 0);
  memcpy(bytes + 68, "wxyz", 4);
  for (size_t i = 0; i < sizeof bytes; i++) {
    CHECK_EQ(feed(0, bytes + i, 1), 0);
    CHECK_EQ(is_done(ra), i >= 35);
  }
  CHECK_EQ(finish(ra).error, 0);
  CHECK_EQ(finish(rb).error, 0);
  CHECK_MEM(a, "abcd", 4);
  CHECK_MEM(b, "wxyz", 4);
  teardown();
}

TEST(non_overtaking_unexpected) {
  /* messages from one source with one tag match receives in send order */
  setup();
  CHECK_EQ(eager(3, "first"), 0);
  CHECK_EQ(eager(3, "second"), 0);
  CHECK_EQ(eager(3, "third"), 0);
  const char *want[] = {"first", "second", "third"};
  for (int i = 0; i < 3; i++) {
    char buf[8] = {0};
    erdma_status st = finish(irecv(buf, sizeof buf, 1, 3));
    CHECK_EQ(st.error, 0);
    CHECK_EQ(st.nbytes, strlen(want[i]));
    CHECK_MEM(buf, want[i], strlen(want[i]));
  }
  teardown();
}

TEST(non_overtaking_posted) {
  /* receives posted for one (source, tag) are filled in posting order,
   * also when some messages were already waiting */
  setup();
  char b[4][8];
  memset(b, 0, sizeof b);
  CHECK_EQ(eager(3, "m0"), 0);
  erdma_req *r[4];
  r[0] = irecv(b[0], 8, 1, 3);
  r[1] = irecv(b[1], 8, ERDMA_ANY_SOURCE, 3);
  r[2] = irecv(b[2], 8, 1, ERDMA_ANY_TAG);
  r[3] = irecv(b[3], 8, 1, 3);
  CHECK(is_done(r[0]));
  CHECK_EQ(eager(3, "m1"), 0);
  CHECK_EQ(eager(3, "m2"), 0);
  CHECK_EQ(eager(3, "m3"), 0);
  for (int i = 0; i < 4; i++) {
    char want[3] = {'m', (char)('0' + i), 0};
    CHECK_EQ(finish(r[i]).error, 0);
    CHECK_STR(b[i], want);
  }
  teardown();
}

TEST(wildcards_match_the_oldest_message) {
  setup();
  CHECK_EQ(eager(3, "a3"), 0);
  CHECK_EQ(eager(4, "b4"), 0);
  CHECK_EQ(eager(3, "c3"), 0);
  CHECK_EQ(feed_frame(0, FR_EAGER, 0, CTX + 1, 4, 2, 0, "x4", 2), 0); /* another communicator */
  char buf[4] = {0};
  erdma_status st = finish(irecv(buf, 4, ERDMA_ANY_SOURCE, 4));
  CHECK_EQ(st.tag, 4);
  CHECK_MEM(buf, "b4", 2);
  st = finish(irecv(buf, 4, 1, ERDMA_ANY_TAG));
  CHECK_EQ(st.tag, 3);
  CHECK_MEM(buf, "a3", 2);
  st = finish(irecv(buf, 4, ERDMA_ANY_SOURCE, ERDMA_ANY_TAG));
  CHECK_EQ(st.source, 1);
  CHECK_EQ(st.tag, 3);
  CHECK_MEM(buf, "c3", 2);
  /* the other communicator's message is left for a receive on it */
  CHECK_EQ(unexpected_count(), 1);
  erdma_req *r = irecv(buf, 4, ERDMA_ANY_SOURCE, ERDMA_ANY_TAG);
  CHECK(!is_done(r));
  erdma_req_cancel(r);
  erdma_req_free(r);
  teardown();
}

TEST(wildcards_posted_order) {
  /* an incoming message goes to the first posted receive it matches */
  setup();
  char b[3][4];
  memset(b, 0, sizeof b);
  erdma_req *ra = irecv(b[0], 4, 1, 9);
  erdma_req *rb = irecv(b[1], 4, ERDMA_ANY_SOURCE, ERDMA_ANY_TAG);
  erdma_req *rc = irecv(b[2], 4, 1, 9);
  CHECK_EQ(eager(8, "t8"), 0); /* only rb takes tag 8 */
  CHECK(is_done(rb));
  CHECK(!is_done(ra));
  CHECK_EQ(eager(9, "t9"), 0);
  CHECK(is_done(ra));
  CHECK(!is_done(rc));
  CHECK_EQ(eager(9, "u9"), 0);
  CHECK_EQ(finish(ra).tag, 9);
  CHECK_EQ(finish(rb).tag, 8);
  CHECK_EQ(finish(rc).tag, 9);
  CHECK_MEM(b[0], "t9", 2);
  CHECK_MEM(b[1], "t8", 2);
  CHECK_MEM(b[2], "u9", 2);
  teardown();
}

TEST(truncated_receive_posted) {
  /* MPI_ERR_TRUNCATE: the buffer's worth is stored, nothing past it, and
   * the rest of the payload is skipped (the next frame parses) */
  setup();
  char buf[8];
  memset(buf, '#', sizeof buf);
  char next[4] = {0};
  erdma_req *r = irecv(buf, 4, 1, 1);
  erdma_req *r2 = irecv(next, 4, 1, 2);
  CHECK_EQ(eager(1, "0123456789"), 0);
  CHECK_EQ(eager(2, "ok"), 0);
  erdma_status st = finish(r);
  CHECK_EQ(st.error, ERDMA_ERR_TRUNCATE);
  CHECK_EQ(st.nbytes, 4);
  CHECK_EQ(st.source, 1);
  CHECK_MEM(buf, "0123####", 8);
  st = finish(r2);
  CHECK_EQ(st.error, 0);
  CHECK_MEM(next, "ok", 2);
  teardown();
}

TEST(truncation_boundary) {
  /* a message of exactly the buffer's size fits; one byte more does not */
  setup();
  char buf[4];
  erdma_req *r = irecv(buf, 4, 1, 1);
  CHECK_EQ(eager(1, "abcd"), 0);
  erdma_status st = finish(r);
  CHECK_EQ(st.error, 0);
  CHECK_EQ(st.nbytes, 4);
  r = irecv(buf, 4, 1, 1);
  CHECK_EQ(eager(1, "vwxyz"), 0);
  st = finish(r);
  CHECK_EQ(st.error, ERDMA_ERR_TRUNCATE);
  CHECK_EQ(st.nbytes, 4);
  CHECK_MEM(buf, "vwxy", 4);
  CHECK_EQ(eager(1, "VWXYZ"), 0); /* the same from the unexpected queue */
  st = finish(irecv(buf, 4, 1, 1));
  CHECK_EQ(st.error, ERDMA_ERR_TRUNCATE);
  CHECK_MEM(buf, "VWXY", 4);
  teardown();
}

TEST(truncated_receive_unexpected) {
  setup();
  CHECK_EQ(eager(1, "0123456789"), 0);
  char buf[8];
  memset(buf, '#', sizeof buf);
  erdma_status st = finish(irecv(buf, 3, 1, 1));
  CHECK_EQ(st.error, ERDMA_ERR_TRUNCATE);
  CHECK_EQ(st.nbytes, 3);
  CHECK_MEM(buf, "012#####", 8);
  teardown();
}

TEST(recv_now_takes_a_whole_unexpected_message) {
  /* erdma_recv_now: the first match, here whole, taken without a request */
  setup();
  CHECK_EQ(eager(4, "first"), 0);
  CHECK_EQ(eager(4, "second"), 0);
  CHECK_EQ(eager(6, "0123456789"), 0);
  char buf[8];
  memset(buf, '#', sizeof buf);
  erdma_blocking out;
  CHECK_EQ(erdma_recv_now(E, buf, sizeof buf, ERDMA_ANY_SOURCE, 4, CTX, &out), 1);
  CHECK_MEM(buf, "first###", 8); /* the older of the two */
  CHECK_EQ(out.source, 1);
  CHECK_EQ(out.tag, 4);
  CHECK_EQ(out.error, 0);
  CHECK_EQ(out.nbytes, 5);
  CHECK_EQ(unexpected_count(), 2);
  CHECK_EQ(erdma_recv_now(E, buf, 3, 1, 6, CTX, &out), 1); /* truncated */
  CHECK_EQ(out.error, ERDMA_ERR_TRUNCATE);
  CHECK_EQ(out.nbytes, 3);
  CHECK_MEM(buf, "012", 3);
  CHECK_EQ(erdma_recv_now(E, buf, sizeof buf, 1, 9, CTX, &out), 0); /* none */
  CHECK_EQ(erdma_recv_now(E, buf, sizeof buf, 1, 4, CTX + 2, &out), 0); /* another context */
  CHECK_EQ(erdma_recv_now(E, buf, sizeof buf, 5, 4, CTX, &out), 0); /* no such rank */
  CHECK_EQ(unexpected_count(), 1);
  CHECK_EQ(erdma_recv_now(E, buf, sizeof buf, 1, ERDMA_ANY_TAG, CTX, &out), 1);
  CHECK_MEM(buf, "second", 6);
  CHECK_EQ(unexpected_count(), 0);
  teardown();
}

TEST(recv_now_leaves_a_rendezvous_or_partial_first_match) {
  /* the first match decides: an RTS (or a payload still arriving) before
   * an eager message of the same tag is left to the posted receive */
  setup();
  CHECK_EQ(feed_frame(0, FR_RTS, 0, CTX, 11, 100000, 0xabc, NULL, 0), 0);
  CHECK_EQ(eager(11, "later"), 0);
  char buf[8];
  erdma_blocking out;
  CHECK_EQ(erdma_recv_now(E, buf, sizeof buf, 1, 11, CTX, &out), 0);
  CHECK_EQ(unexpected_count(), 2);
  CHECK_EQ(nsent(), 0); /* nothing answered */
  teardown();
  setup();
  CHECK_EQ(feed_frame(0, FR_EAGER, 0, CTX, 12, 10, 0, "01234", 5), 0); /* half here */
  CHECK_EQ(erdma_recv_now(E, buf, sizeof buf, 1, 12, CTX, &out), 0);
  CHECK_EQ(unexpected_count(), 1);
  teardown();
}

TEST(cancel_posted_receive) {
  setup();
  char buf[8] = {0};
  erdma_req *r = irecv(buf, 8, 1, 4);
  CHECK_EQ(erdma_req_cancel(r), 0);
  erdma_status st = finish(r);
  CHECK_EQ(st.cancelled, 1);
  CHECK_EQ(st.error, 0);
  /* the message meant for it is now unexpected, the buffer untouched */
  CHECK_EQ(eager(4, "late"), 0);
  CHECK_EQ(unexpected_count(), 1);
  CHECK_EQ(buf[0], 0);
  /* a completed receive cannot be cancelled */
  r = irecv(buf, 8, 1, 4);
  CHECK_EQ(erdma_req_cancel(r), 0);
  st = finish(r);
  CHECK_EQ(st.cancelled, 0);
  CHECK_MEM(buf, "late", 4);
  teardown();
}

TEST(cancel_during_payload) {
  /* a receive cancelled while its payload streams in: the rest is dropped,
   * the buffer keeps only what came before */
  setup();
  char buf[8];
  memset(buf, '#', sizeof buf);
  erdma_req *r = irecv(buf, 8, 1, 4);
  uint8_t f[40];
  wire_hdr(f, FR_EAGER, 0, CTX, 4, 8, 0);
  memcpy(f + 32, "ABCDEFGH", 8);
  CHECK_EQ(feed(0, f, 34), 0);
  CHECK(!is_done(r));
  erdma_req_abort(r);
  CHECK_EQ(feed(0, f + 34, 6), 0);
  erdma_status st = finish(r);
  CHECK_EQ(st.cancelled, 1);
  CHECK_MEM(buf, "AB######", 8);
  CHECK_EQ(eager(4, "next"), 0); /* the stream is still in step */
  CHECK_EQ(unexpected_count(), 1);
  teardown();
}

TEST(probe_and_matched_probe) {
  setup();
  int flag = -1;
  erdma_status st;
  CHECK_EQ(erdma_iprobe(E, ERDMA_ANY_SOURCE, ERDMA_ANY_TAG, CTX, &flag, &st), 0);
  CHECK_EQ(flag, 0);
  CHECK_EQ(eager(2, "probed"), 0);
  CHECK_EQ(eager(2, "second"), 0);
  CHECK_EQ(erdma_iprobe(E, 1, 2, CTX, &flag, &st), 0);
  CHECK_EQ(flag, 1);
  CHECK_EQ(st.source, 1);
  CHECK_EQ(st.tag, 2);
  CHECK_EQ(st.nbytes, 6);
  CHECK_EQ(unexpected_count(), 2); /* a probe leaves it queued */
  erdma_msg *m = NULL;
  CHECK_EQ(erdma_improbe(E, ERDMA_ANY_SOURCE, 2, CTX, &flag, &m, &st), 0);
  CHECK_EQ(flag, 1);
  CHECK(m != NULL);
  CHECK_EQ(unexpected_count(), 1); /* a matched probe takes it */
  /* a receive now gets the second message, not the probed one */
  char buf[8] = {0};
  erdma_status st2 = finish(irecv(buf, 8, 1, 2));
  CHECK_MEM(buf, "second", 6);
  CHECK_EQ(st2.error, 0);
  erdma_req *r = NULL;
  CHECK_EQ(erdma_imrecv(E, m, buf, 8, 0, &r), 0);
  st2 = finish(r);
  CHECK_EQ(st2.error, 0);
  CHECK_EQ(st2.nbytes, 6);
  CHECK_MEM(buf, "probed", 6);
  teardown();
}

TEST(matched_probe_before_payload_arrives) {
  /* mprobe on a message whose header came but not all of its payload:
   * the mrecv completes when the last byte does */
  setup();
  uint8_t f[42];
  wire_hdr(f, FR_EAGER, 0, CTX, 6, 10, 0);
  memcpy(f + 32, "0123456789", 10);
  CHECK_EQ(feed(0, f, 35), 0);
  erdma_msg *m = NULL;
  erdma_status st;
  int flag = 0;
  CHECK_EQ(erdma_improbe(E, 1, 6, CTX, &flag, &m, &st), 0);
  CHECK_EQ(flag, 1);
  CHECK_EQ(st.nbytes, 10);
  erdma_req *r = NULL;
  CHECK_EQ(erdma_imrecv(E, m, NULL, 0, 1, &r), 0); /* allocating */
  CHECK(!is_done(r));
  CHECK_EQ(feed(0, f + 35, 7), 0);
  CHECK(is_done(r));
  CHECK_MEM(erdma_req_data(r), "0123456789", 10);
  CHECK_EQ(finish(r).nbytes, 10);
  teardown();
}

TEST(rendezvous_receive_data) {
  /* RTS -> our CTS (receive id) -> DATA into the buffer */
  setup();
  enum { LEN = 100000 };
  uint8_t *payload = malloc(LEN), *buf = calloc(1, LEN);
  for (int i = 0; i < LEN; i++) payload[i] = (uint8_t)(i * 7 + 1);
  CHECK_EQ(feed_frame(0, FR_RTS, 0, CTX, 11, LEN, 0xabc, NULL, 0), 0);
  CHECK_EQ(nsent(), 0);
  erdma_req *r = irecv(buf, LEN, 1, 11);
  CHECK_EQ(nsent(), 1);
  sent_frame cts = sent(-1);
  CHECK_EQ(cts.type, FR_CTS);
  CHECK_EQ(cts.id, 0xabc); /* the sender's id from the RTS */
  CHECK_EQ(cts.flags, FR_FLAG_CHUNKS);
  CHECK(cts.len != 0); /* our receive id */
  CHECK(!is_done(r));
  /* DATA in three pieces */
  uint8_t h[32];
  wire_hdr(h, FR_DATA, 0, 0, 0, LEN, cts.len);
  CHECK_EQ(feed(0, h, 32), 0);
  CHECK_EQ(feed(0, payload, 1000), 0);
  CHECK(!is_done(r));
  CHECK_EQ(feed(0, payload + 1000, LEN - 1000), 0);
  erdma_status st = finish(r);
  CHECK_EQ(st.error, 0);
  CHECK_EQ(st.nbytes, LEN);
  CHECK_EQ(st.tag, 11);
  CHECK_MEM(buf, payload, LEN);
  free(payload);
  free(buf);
  teardown();
}

TEST(rendezvous_receive_chunks_out_of_order) {
  /* the payload as CHUNK frames on two data streams, last piece first */
  setup();
  enum { LEN = 3000 };
  uint8_t payload[LEN], buf[LEN];
  for (int i = 0; i < LEN; i++) payload[i] = (uint8_t)(i ^ 0x5a);
  memset(buf, 0, sizeof buf);
  erdma_req *r = irecv(buf, LEN, ERDMA_ANY_SOURCE, ERDMA_ANY_TAG); /* posted first */
  CHECK_EQ(feed_frame(0, FR_RTS, 0, CTX, 12, LEN, 5, NULL, 0), 0);
  sent_frame cts = sent(-1);
  CHECK_EQ(cts.type, FR_CTS);
  CHECK_EQ(cts.id, 5);
  CHECK_EQ(feed_frame(2, FR_CHUNK, 0, 0, 2000, 1000, cts.len, payload + 2000, 1000), 0);
  CHECK_EQ(feed_frame(1, FR_CHUNK, 0, 0, 0, 1500, cts.len, payload, 1500), 0);
  CHECK(!is_done(r));
  CHECK_EQ(feed_frame(2, FR_CHUNK, 0, 0, 1500, 500, cts.len, payload + 1500, 500), 0);
  erdma_status st = finish(r);
  CHECK_EQ(st.error, 0);
  CHECK_EQ(st.tag, 12);
  CHECK_MEM(buf, payload, LEN);
  /* a CHUNK for a receive id never issued breaks the protocol */
  CHECK(feed_frame(1, FR_CHUNK, 0, 0, 0, 1, 999999, payload, 1) != 0);
  teardown();
}

TEST(rendezvous_receive_truncated) {
  setup();
  char buf[8];
  memset(buf, '#', sizeof buf);
  CHECK_EQ(feed_frame(0, FR_RTS, 0, CTX, 1, 20, 3, NULL, 0), 0);
  erdma_req *r = irecv(buf, 5, 1, 1);
  sent_frame cts = sent(-1);
  CHECK_EQ(feed_frame(0, FR_DATA, 0, 0, 0, 20, cts.len, "abcdefghijklmnopqrst", 20), 0);
  erdma_status st = finish(r);
  CHECK_EQ(st.error, ERDMA_ERR_TRUNCATE);
  CHECK_EQ(st.nbytes, 5);
  CHECK_MEM(buf, "abcde###", 8);
  teardown();
}

TEST(rendezvous_send) {
  /* a send above the eager limit: RTS, then the peer's CTS releases DATA;
   * the send completes when the DATA is acknowledged */
  setup();
  uint64_t len = E->cfg.eager_limit + 1;
  uint8_t *buf = malloc(len);
  memset(buf, 0x33, len);
  erdma_req *s = NULL;
  CHECK_EQ(erdma_isend(E, buf, len, 1, 21, CTX, 0, &s), 0);
  CHECK_EQ(nsent(), 1);
  sent_frame rts = sent(0);
  CHECK_EQ(rts.type, FR_RTS);
  CHECK_EQ(rts.flags, 0);
  CHECK_EQ(rts.ctx, CTX);
  CHECK_EQ(rts.tag, 21);
  CHECK(rts.len == len);
  CHECK(rts.id != 0);
  CHECK(!is_done(s));
  ack_all(); /* the RTS acknowledged: still waiting for the CTS */
  CHECK(!is_done(s));
  CHECK_EQ(feed_frame(0, FR_CTS, FR_FLAG_CHUNKS, 0, 0, 77, rts.id, NULL, 0), 0);
  sent_frame data = sent(-1);
  CHECK_EQ(data.type, FR_DATA); /* no QUIC, no data streams: one DATA frame */
  CHECK_EQ(data.id, 77);
  CHECK(data.len == len);
  CHECK(data.payload == buf); /* from the application's buffer, not a copy */
  CHECK(data.req == s);
  CHECK(!is_done(s));
  ack_all();
  CHECK_EQ(finish(s).error, 0);
  /* a CTS for a send id never issued breaks the protocol */
  CHECK(feed_frame(0, FR_CTS, 0, 0, 0, 1, rts.id + 100, NULL, 0) != 0);
  free(buf);
  teardown();
}

/* ---- a channel that reads in place, for the offer/take paths: rank 1's
 * "address space" is this process, so an address is a pointer here ---- */
static int offers, withdrawals, take_rc;
static uint64_t fake_eager_max(const erdma_conn *c) { return c->e->cfg.eager_limit; }
static int fake_offer(erdma_conn *c, erdma_req *r) { (void)c; (void)r; offers++; return 1; }
static void fake_withdraw(erdma_req *r) { (void)r; withdrawals++; }
static int fake_take(erdma_conn *c, void *dst, uint64_t addr, uint64_t n, uint32_t sid) {
  (void)c; (void)sid;
  if (take_rc == 0) memcpy(dst, (const void *)(uintptr_t)addr, n);
  return take_rc;
}
static int fake_flush(erdma_conn *c) { (void)c; return 0; }
static const erdma_chan in_place_chan = {
    .name = "test", .in_place = 1, .eager_max = fake_eager_max, .offer = fake_offer,
    .withdraw = fake_withdraw, .take = fake_take, .flush = fake_flush};

TEST(channel_that_reads_in_place) {
  /* matching and the send path use only the channel's table: a send above
   * the eager limit is offered (RTS with the buffer's address) and
   * withdrawn once the peer's CTS says it copied it; an offered message
   * from the peer is taken into the receive buffer and answered; a
   * withdrawn one fails the receive; without an in-place channel the
   * same RTS breaks the protocol */
  setup();
  C->chan = &in_place_chan;
  offers = withdrawals = take_rc = 0;
  uint64_t len = E->cfg.eager_limit + 10;
  uint8_t *buf = malloc(len), *got = calloc(1, len);
  for (uint64_t i = 0; i < len; i++) buf[i] = (uint8_t)(i * 13 + 5);
  erdma_req *s = NULL;
  CHECK_EQ(erdma_isend(E, buf, len, 1, 31, CTX, 0, &s), 0);
  sent_frame rts = sent(-1);
  CHECK_EQ(rts.type, FR_RTS);
  CHECK_EQ(rts.flags, FR_FLAG_CMA);
  CHECK(rts.id == (uint64_t)(uintptr_t)buf);
  CHECK_EQ(offers, 1);
  CHECK(!is_done(s));
  ack_all();
  CHECK_EQ(feed_frame(0, FR_CTS, FR_FLAG_CMA, 0, 0, 0, s->id, NULL, 0), 0);
  CHECK_EQ(withdrawals, 1); /* the buffer is the application's again */
  CHECK_EQ(finish(s).error, 0);
  /* the peer offers a message (its address is buf here): taken in place */
  erdma_req *r = irecv(got, len, 1, 32);
  CHECK_EQ(feed_frame(0, FR_RTS, FR_FLAG_CMA, CTX, 32, len, (uint64_t)(uintptr_t)buf, NULL, 0),
           0);
  CHECK(is_done(r));
  erdma_status st = finish(r);
  CHECK_EQ(st.error, 0);
  CHECK(st.nbytes == len);
  CHECK_MEM(got, buf, len);
  sent_frame cts = sent(-1);
  CHECK_EQ(cts.type, FR_CTS);
  CHECK_EQ(cts.flags, FR_FLAG_CMA);
  /* the peer withdrew its offer meanwhile: the receive fails */
  take_rc = -2;
  r = irecv(got, len, 1, 33);
  CHECK_EQ(feed_frame(0, FR_RTS, FR_FLAG_CMA, CTX, 33, len, (uint64_t)(uintptr_t)buf, NULL, 0),
           0);
  CHECK_EQ(finish(r).error, ERDMA_ERR_PEER);
  free(buf);
  free(got);
  teardown();
  /* the QUIC channel reads nothing in place: such an RTS is a violation */
  setup();
  CHECK(feed_frame(0, FR_RTS, FR_FLAG_CMA, CTX, 34, 100, 1234, NULL, 0) != 0);
  teardown();
}

TEST(eager_and_synchronous_send) {
  setup();
  char msg[] = "eager!";
  erdma_req *s = NULL;
  CHECK_EQ(erdma_isend(E, msg, 6, 1, 2, CTX, 0, &s), 0);
  CHECK(is_done(s)); /* copied: complete at once */
  sent_frame f = sent(0);
  CHECK_EQ(f.type, FR_EAGER);
  CHECK_EQ(f.tag, 2);
  CHECK_EQ(f.len, 6);
  msg[0] = 'X'; /* the queued copy is the application's bytes at the call */
  CHECK_MEM(f.payload, "eager!", 6);
  CHECK_EQ(finish(s).error, 0);
  /* a synchronous send of a small message still goes by RTS */
  CHECK_EQ(erdma_isend(E, msg, 6, 1, 3, CTX, ERDMA_SEND_SYNC, &s), 0);
  f = sent(-1);
  CHECK_EQ(f.type, FR_RTS);
  CHECK_EQ(f.flags, FR_FLAG_SYNC);
  CHECK(!is_done(s));
  erdma_req_abort(s);
  erdma_req_free(s);
  teardown();
}

TEST(send_to_self) {
  setup();
  erdma_req *s = NULL;
  CHECK_EQ(erdma_isend(E, "self", 4, 0, 1, CTX, ERDMA_SEND_SYNC, &s), 0);
  CHECK(!is_done(s)); /* synchronous: waits for the match */
  char buf[4];
  erdma_status st = finish(irecv(buf, 4, 0, 1));
  CHECK_EQ(st.source, 0);
  CHECK_MEM(buf, "self", 4);
  CHECK_EQ(finish(s).error, 0);
  CHECK_EQ(nsent(), 0);
  teardown();
}

TEST(peer_lost_fails_pending_receives) {
  setup();
  char b1[8], b2[8], b3[8];
  erdma_req *r1 = irecv(b1, 8, 1, 1);
  erdma_req *rany = irecv(b2, 8, ERDMA_ANY_SOURCE, 1);
  erdma_req *rmid = irecv(b3, 8, 1, 3);
  erdma_req *s = NULL;
  uint8_t *big = calloc(1, E->cfg.eager_limit + 1);
  CHECK_EQ(erdma_isend(E, big, E->cfg.eager_limit + 1, 1, 1, CTX, 0, &s), 0);
  uint8_t f[36];
  wire_hdr(f, FR_EAGER, 0, CTX, 3, 4, 0); /* r3's message, half arrived */
  memcpy(f + 32, "half", 4);
  CHECK_EQ(feed(0, f, 34), 0);
  lose_peer();
  CHECK_EQ(finish(r1).error, ERDMA_ERR_PEER);
  CHECK_EQ(finish(rmid).error, ERDMA_ERR_PEER);
  CHECK_EQ(finish(s).error, ERDMA_ERR_PEER);
  /* an ANY_SOURCE receive may still match another rank: it stays posted */
  CHECK(!is_done(rany));
  erdma_req_cancel(rany);
  CHECK_EQ(finish(rany).cancelled, 1);
  /* after the loss: receives from it and sends to it fail at once */
  erdma_req *r = irecv(b1, 8, 1, 1);
  CHECK(is_done(r));
  CHECK_EQ(finish(r).error, ERDMA_ERR_PEER);
  CHECK_EQ(erdma_isend(E, "x", 1, 1, 1, CTX, 0, &s), 0);
  CHECK_EQ(finish(s).error, ERDMA_ERR_PEER);
  free(big);
  teardown();
}

TEST(peer_lost_after_unexpected_message) {
  /* a complete message that arrived before the loss can still be received */
  setup();
  CHECK_EQ(eager(1, "kept"), 0);
  lose_peer();
  char buf[4];
  erdma_status st = finish(irecv(buf, 4, 1, 1));
  CHECK_EQ(st.error, 0);
  CHECK_MEM(buf, "kept", 4);
  teardown();
}

TEST(protocol_violations) {
  setup();
  /* an unknown frame type */
  CHECK_EQ(feed_frame(0, 9, 0, 0, 0, 0, 0, NULL, 0), ERDMA_ERR_AUTH);
  teardown();
  setup();
  /* an EAGER longer than any eager limit */
  CHECK_EQ(feed_frame(0, FR_EAGER, 0, CTX, 1, (uint64_t)ERDMA_EAGER_FRAME_MAX + 1, 0, NULL, 0),
           ERDMA_ERR_AUTH);
  teardown();
  setup();
  /* DATA for a receive id never issued; a non-CHUNK frame on a data stream */
  CHECK_EQ(feed_frame(0, FR_DATA, 0, 0, 0, 1, 1, "x", 1), ERDMA_ERR_AUTH);
  teardown();
  setup();
  CHECK_EQ(feed_frame(1, FR_EAGER, 0, CTX, 1, 1, 0, "x", 1), ERDMA_ERR_AUTH);
  teardown();
  setup();
  /* the control stream ends */
  pthread_mutex_lock(&E->mu);
  int rv = conn_rx_feed_at(C, 0, NULL, 0, 1);
  pthread_mutex_unlock(&E->mu);
  CHECK(rv != 0);
  teardown();
}

TEST(hello_checks) {
  /* the first frame must be a HELLO naming the rank we dialled */
  setup();
  C->hello_recv = 0;
  C->is_client = 1;
  CHECK(eager(1, "x") != 0);
  teardown();
  setup();
  C->hello_recv = 0;
  C->is_client = 1;
  CHECK(feed_frame(0, FR_HELLO, 0, 1, 0, 3, 0, NULL, 0) != 0); /* world size 3, not 2 */
  teardown();
  setup();
  C->hello_recv = 0;
  C->is_client = 1;
  CHECK(feed_frame(0, FR_HELLO, 0, 0, 0, 2, 0, NULL, 0) != 0); /* our own rank */
  teardown();
  setup();
  C->hello_recv = 0;
  C->is_client = 1;
  CHECK_EQ(feed_frame(0, FR_HELLO, 0, 1, 0, 2, 0, NULL, 0), 0);
  CHECK_EQ(C->hello_recv, 1);
  char buf[2];
  erdma_req *r = irecv(buf, 2, 1, 1);
  CHECK_EQ(eager(1, "hi"), 0);
  CHECK_EQ(finish(r).error, 0);
  teardown();
}

CTEST_MAIN()
