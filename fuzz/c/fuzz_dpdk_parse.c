// fuzz-sources: ext/src/erdma_pktio_dpdk.c
/* The DPDK backend's parser of received Ethernet frames (dpdk_parse_frame in
 * erdma_pktio_dpdk.c, built here without DPDK): Ethernet, ARP, IPv4, UDP and
 * their checksums.  Input: [hw checksum flags 1 byte][frame].  Checked: what
 * it points to lies within the frame (which sits in a buffer of exactly its
 * size), a UDP datagram is for our MAC, address and port, and its checksum
 * verdict agrees with a second computation over host-order words (as DPDK's
 * rte_raw_cksum sums them, which the backend used before). */
#include <stdlib.h>
#include <string.h>

#include "erdma_pktio.h"

static const uint8_t MAC[6] = {0x02, 0x00, 0x00, 0x00, 0x00, 0x01};
static const uint8_t IP[4] = {10, 0, 0, 2};
static const uint8_t PORT[2] = {0xb7, 0xed}; /* 47085 */

static int within(const uint8_t *p, size_t n, const uint8_t *f, size_t len) {
  return p >= f && n <= len && (size_t)(p - f) <= len - n;
}

/* the ones' complement sum over host-order (little-endian here) words */
static uint16_t sum_le(uint32_t s, const uint8_t *p, size_t n) {
  for (; n > 1; p += 2, n -= 2) s += (uint32_t)(p[0] | p[1] << 8);
  if (n) s += p[0];
  while (s >> 16) s = (s & 0xffff) + (s >> 16);
  return (uint16_t)s;
}

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

int LLVMFuzzerTestOneInput(const uint8_t *in, size_t n) {
  if (n < 1) return 0;
  unsigned hw = in[0] & 3;
  size_t len = n - 1;
  uint8_t *f = malloc(len ? len : 1); /* exactly its size: overreads show */
  if (!f) abort();
  memcpy(f, in + 1, len);
  uint32_t ip;
  uint16_t port;
  memcpy(&ip, IP, 4);
  memcpy(&port, PORT, 2);
  dpdk_frame fr;
  int k = dpdk_parse_frame(f, len, MAC, ip, port, hw, &fr);
  volatile uint8_t sink = 0;
  switch (k) {
  case FRAME_UDP: {
    if (!within(fr.src_mac, 6, f, len) || !within(fr.payload, fr.len, f, len)) abort();
    for (size_t i = 0; i < fr.len; i++) sink ^= fr.payload[i];
    if (len < 42 || (memcmp(f, MAC, 6) != 0 && memcmp(f, "\xff\xff\xff\xff\xff\xff", 6) != 0) ||
        f[12] != 0x08 || f[13] != 0 || f[14] != 0x45 || memcmp(f + 30, IP, 4) != 0 ||
        memcmp(f + 36, PORT, 2) != 0 || fr.payload != f + 42 ||
        fr.len + 8 != (size_t)(f[38] << 8 | f[39]))
      abort();
    /* the checksum verdict, again in host order (the sums are byte-order
     * independent, RFC 1071) */
    const uint8_t *iph = f + 14, *uh = f + 34;
    if (!(hw & FRAME_HW_IP_CSUM_GOOD) && sum_le(0, iph, 20) != 0xffff) abort();
    uint16_t ck = le16(uh + 6);
    if (ck != 0 && !(hw & FRAME_HW_L4_CSUM_GOOD)) {
      size_t tot = (size_t)(iph[2] << 8 | iph[3]);
      uint8_t lenbe[2] = {(uint8_t)((tot - 20) >> 8), (uint8_t)(tot - 20)};
      uint16_t phdr = sum_le(sum_le(le16((const uint8_t *)"\x00\x11"), iph + 12, 8), lenbe, 2);
      int partial = ck == phdr;
      if (partial != fr.partial) abort();
      if (!partial && sum_le(phdr, uh, fr.len + 8) != 0xffff) abort();
    } else if (fr.partial) {
      abort();
    }
    break;
  }
  case FRAME_ARP:
    if (!within(fr.sha, 6, f, len) || !within(fr.src_mac, 6, f, len) || len < 42) abort();
    sink ^= fr.sha[5];
    break;
  case FRAME_IGNORED:
  case FRAME_OTHER:
  case FRAME_BAD_CSUM:
    if (fr.payload || fr.len || fr.partial) abort();
    break;
  default:
    abort();
  }
  (void)sink;
  free(f);
  return 0;
}
