// test-sources: ext/src/erdma_nat.c ext/src/erdma_quic.c
/* The demultiplexer of the engine's UDP socket (erdma_nat.c, nat_classify):
 * STUN (RFC 8489 section 6) vs QUIC from anyone, TURN ChannelData (RFC 8656
 * section 12.4, with up to 3 bytes of UDP padding) vs everything else from a
 * TURN server, datagrams built here byte by byte; and addr_equal.  What
 * erdma_nat.c calls outside itself is stubbed below (as in
 * fuzz/c/fuzz_nat_demux.c); nat_classify needs none of it. */
#include <arpa/inet.h>
#include <time.h>

#include "ctest.h"
#include "erdma_conn.h"
#include "erdma_engine.h"
#include "erdma_nat.h"
#include "erdma_shm.h"

int conn_handle_datagram(erdma_engine *e, const uint8_t *data, size_t len,
                         const struct sockaddr_storage *from, socklen_t fromlen) {
  (void)e; (void)data; (void)len; (void)from; (void)fromlen;
  return 0;
}
uint64_t conn_decrypted_count(void) { return 0; }
uint64_t erdma_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
int addr_resolve(const char *host, int port, struct sockaddr_storage *out, socklen_t *len) {
  (void)host; (void)port; (void)out; (void)len;
  return -1;
}
void addr_format(const struct sockaddr_storage *a, char *host, size_t hostcap, int *port) {
  (void)a;
  if (host && hostcap) host[0] = 0;
  *port = 0;
}
int shm_is_local(erdma_engine *e, int rank) { (void)e; (void)rank; return -1; }

/* a STUN message: type, body length, magic cookie 0x2112A442, 12-byte id, body */
static size_t stun(uint8_t *out, uint16_t type, uint16_t blen) {
  out[0] = (uint8_t)(type >> 8);
  out[1] = (uint8_t)type;
  out[2] = (uint8_t)(blen >> 8);
  out[3] = (uint8_t)blen;
  out[4] = 0x21, out[5] = 0x12, out[6] = 0xA4, out[7] = 0x42;
  for (int i = 0; i < 12; i++) out[8 + i] = (uint8_t)(0x80 + i);
  memset(out + 20, 0xab, blen);
  return 20u + blen;
}

static int classify(const uint8_t *d, size_t len, int from_turn) {
  uint16_t ch = 0;
  size_t plen = 0;
  return nat_classify(d, len, from_turn, &ch, &plen);
}

TEST(empty_datagram_dropped) {
  uint8_t d[1] = {0};
  CHECK_EQ(classify(d, 0, 0), NAT_DROP);
  CHECK_EQ(classify(d, 0, 1), NAT_DROP);
}

TEST(stun_from_anyone_is_raw) {
  uint8_t d[64];
  CHECK_EQ(classify(d, stun(d, 0x0001, 0), 0), NAT_RAW);  /* Binding request */
  CHECK_EQ(classify(d, stun(d, 0x0101, 12), 0), NAT_RAW); /* Binding success, one attribute */
}

TEST(almost_stun_is_quic) {
  uint8_t d[64];
  size_t n = stun(d, 0x0001, 8);
  CHECK_EQ(classify(d, n - 4, 0), NAT_QUIC); /* length field covers more than the datagram */
  n = stun(d, 0x0001, 8);
  d[3] = 6; /* a body length that is no multiple of 4 */
  CHECK_EQ(classify(d, 26, 0), NAT_QUIC);
  n = stun(d, 0x0001, 0);
  d[7] ^= 1; /* wrong magic cookie */
  CHECK_EQ(classify(d, n, 0), NAT_QUIC);
  n = stun(d, 0x0001, 0);
  d[0] |= 0x40; /* first two bits must be 0 (a QUIC short header has 01) */
  CHECK_EQ(classify(d, n, 0), NAT_QUIC);
  CHECK_EQ(classify(d, 19, 0), NAT_QUIC); /* shorter than a STUN header */
}

TEST(quic_packets_are_quic) {
  uint8_t d[1200];
  memset(d, 0, sizeof d);
  d[0] = 0xc3; /* long header, Initial */
  d[4] = 1;    /* version 1 */
  CHECK_EQ(classify(d, sizeof d, 0), NAT_QUIC);
  d[0] = 0x41; /* short header */
  CHECK_EQ(classify(d, 40, 0), NAT_QUIC);
}

TEST(channel_data_from_turn) {
  uint8_t d[16] = {0x40, 0x01, 0x00, 0x05, 'h', 'e', 'l', 'l', 'o', 0, 0, 0, 0};
  uint16_t ch = 0;
  size_t plen = 99;
  for (size_t pad = 0; pad <= 3; pad++) {
    CHECK_EQ(nat_classify(d, 9 + pad, 1, &ch, &plen), NAT_CHANNEL);
    CHECK_EQ(ch, 0x4001);
    CHECK_EQ(plen, 5);
  }
  CHECK_EQ(classify(d, 9 + 4, 1), NAT_RAW); /* more padding than UDP allows */
  CHECK_EQ(classify(d, 8, 1), NAT_RAW);     /* payload cut short */
  CHECK_EQ(classify(d, 3, 1), NAT_RAW);     /* shorter than the header */
  d[0] = 0x4f, d[1] = 0xff;                 /* the last channel number */
  CHECK_EQ(nat_classify(d, 9, 1, &ch, &plen), NAT_CHANNEL);
  CHECK_EQ(ch, 0x4fff);
  d[0] = 0x50, d[1] = 0x00; /* beyond the channel range */
  CHECK_EQ(classify(d, 9, 1), NAT_RAW);
  uint8_t e[4] = {0x40, 0x00, 0, 0}; /* an empty ChannelData */
  CHECK_EQ(nat_classify(e, 4, 1, &ch, &plen), NAT_CHANNEL);
  CHECK_EQ(plen, 0);
}

TEST(turn_server_sends_stun_as_raw) {
  /* a TURN server's own STUN (Data indications, Refresh answers): raw */
  uint8_t d[64];
  CHECK_EQ(classify(d, stun(d, 0x0117, 8), 1), NAT_RAW);
  /* and ChannelData from anyone else is no ChannelData */
  uint8_t c[9] = {0x40, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5};
  CHECK_EQ(classify(c, 9, 0), NAT_QUIC);
}

TEST(address_equality) {
  struct sockaddr_storage a, b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  struct sockaddr_in *a4 = (void *)&a, *b4 = (void *)&b;
  a4->sin_family = b4->sin_family = AF_INET;
  a4->sin_port = b4->sin_port = htons(5000);
  inet_pton(AF_INET, "10.1.2.3", &a4->sin_addr);
  inet_pton(AF_INET, "10.1.2.3", &b4->sin_addr);
  CHECK(addr_equal(&a, &b));
  b4->sin_port = htons(5001);
  CHECK(!addr_equal(&a, &b));
  b4->sin_port = htons(5000);
  inet_pton(AF_INET, "10.1.2.4", &b4->sin_addr);
  CHECK(!addr_equal(&a, &b));
  struct sockaddr_in6 *c6 = (void *)&b;
  memset(&b, 0, sizeof b);
  c6->sin6_family = AF_INET6;
  c6->sin6_port = htons(5000);
  inet_pton(AF_INET6, "::ffff:10.1.2.3", &c6->sin6_addr);
  CHECK(!addr_equal(&a, &b)); /* another family */
  struct sockaddr_storage d = b;
  CHECK(addr_equal(&b, &d));
  ((struct sockaddr_in6 *)&d)->sin6_addr.s6_addr[15] ^= 1;
  CHECK(!addr_equal(&b, &d));
}

CTEST_MAIN()
