/* erdma_pktio_dpdk.c - packet I/O over a DPDK port (docs/dpdk.md).
 *
 * Built into its own shared object (erdmampi/_erdma_dpdk*.so) by
 * ext/build_engine.py when libdpdk is installed; the engine dlopens it only
 * when cfg.pktio is ERDMA_PKTIO_DPDK.  Without ERDMA_HAVE_DPDK it compiles to
 * a stub that only says so.
 *
 * The backend does what the kernel does for a UDP socket: it answers ARP for
 * our address and resolves peers' MAC addresses (or takes a static table),
 * writes Ethernet/IPv4/UDP headers with correct checksums (by the port's
 * offload when it has one, else in software), checks those of what arrives,
 * and hands every UDP payload for our address and port to the engine straight
 * from the mbuf.  The engine serialises every call under e->mu, so one queue
 * is only ever used by one thread at a time. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "erdma_pktio.h"
#include "erdma_engine.h"

/* What the Python wrapper asks before it passes the plugin's path on. */
int erdma_dpdk_built(void);

/* ------------------------------------------------------------ rx parser */
/* dpdk_parse_frame (erdma_pktio.h) reads only the bytes it was given and
 * needs no DPDK: the fuzz harness builds this file without ERDMA_HAVE_DPDK. */
static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }

/* RFC 1071: the ones' complement sum of big-endian 16-bit words (an odd last
 * byte padded with a zero), added to sum; folded by csum_fold */
static uint32_t csum_add(uint32_t sum, const uint8_t *p, size_t n) {
  for (; n > 1; p += 2, n -= 2) sum += rd16(p);
  if (n) sum += (uint32_t)p[0] << 8;
  return sum;
}

static uint16_t csum_fold(uint32_t sum) {
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return (uint16_t)sum;
}

static int parse_arp(const uint8_t *a, size_t n, dpdk_frame *out) {
  /* Ethernet/IPv4 ARP: 28 bytes; the fixed offsets hold only for these lengths */
  if (n < 28 || rd16(a) != 1 || rd16(a + 2) != 0x0800 || a[4] != 6 || a[5] != 4)
    return FRAME_IGNORED;
  out->op = rd16(a + 6);
  out->sha = a + 8;
  memcpy(&out->sip, a + 14, 4);
  memcpy(&out->tip, a + 24, 4);
  return FRAME_ARP;
}

/* A UDP checksum that does not verify is still accepted when it holds just
 * the pseudo-header sum: a Linux sender with checksum offload (a veth peer)
 * leaves it so (CHECKSUM_PARTIAL), trusting that the frame never leaves the
 * host.  QUIC's AEAD protects the payload either way. */
static int parse_ipv4(const uint8_t *ip, size_t n, uint32_t our_ip, uint16_t udp_port,
                      unsigned hw, dpdk_frame *out) {
  if (n < 20 + 8) return FRAME_IGNORED;
  size_t ihl = (size_t)(ip[0] & 0xf) * 4;
  if ((ip[0] >> 4) != 4 || ihl < 20 || memcmp(ip + 16, &our_ip, 4) != 0 || ip[9] != 17)
    return FRAME_IGNORED;
  size_t tot = rd16(ip + 2);
  if (tot < ihl + 8 || tot > n) return FRAME_IGNORED;
  if (rd16(ip + 6) & 0x3fff) return FRAME_IGNORED; /* fragments (MF, offset): our peers send DF */
  if (!(hw & FRAME_HW_IP_CSUM_GOOD) && csum_fold(csum_add(0, ip, ihl)) != 0xffff)
    return FRAME_BAD_CSUM;
  const uint8_t *uh = ip + ihl;
  size_t ulen = rd16(uh + 4);
  if (memcmp(uh + 2, &udp_port, 2) != 0 || ulen < 8 || ulen > tot - ihl) return FRAME_IGNORED;
  if (ihl != 20) return FRAME_IGNORED; /* options: no peer of ours sends them */
  uint16_t ck = rd16(uh + 6);
  if (ck != 0 && !(hw & FRAME_HW_L4_CSUM_GOOD)) { /* 0: the sender sent none (IPv4) */
    uint16_t phdr = csum_fold(csum_add(17 + (uint32_t)(tot - ihl), ip + 12, 8));
    if (ck == phdr) /* partial: checked first, it spares a pass over the data */
      out->partial = 1;
    else if (csum_fold(csum_add(phdr, uh, ulen)) != 0xffff)
      return FRAME_BAD_CSUM;
  }
  memcpy(&out->src_ip, ip + 12, 4);
  memcpy(&out->src_port, uh, 2);
  out->payload = uh + 8;
  out->len = ulen - 8;
  return FRAME_UDP;
}

int dpdk_parse_frame(const uint8_t *f, size_t n, const uint8_t mac[6], uint32_t ip,
                     uint16_t udp_port, unsigned hw, dpdk_frame *out) {
  static const uint8_t bcast[6] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  memset(out, 0, sizeof *out);
  if (n < 14) return FRAME_IGNORED;
  if (memcmp(f, mac, 6) != 0 && memcmp(f, bcast, 6) != 0)
    return FRAME_OTHER; /* the kernel's own traffic on this interface, multicast */
  out->src_mac = f + 6;
  switch (rd16(f + 12)) {
  case 0x0800: return parse_ipv4(f + 14, n - 14, ip, udp_port, hw, out);
  case 0x0806: return parse_arp(f + 14, n - 14, out);
  default: return FRAME_OTHER; /* IPv6 among them: this backend speaks IPv4 */
  }
}

#ifndef ERDMA_HAVE_DPDK
int erdma_dpdk_built(void) { return 0; }
#else

#include <rte_arp.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_ether.h>
#include <rte_ip.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_udp.h>

int erdma_dpdk_built(void) { return 1; }
int erdma_pktio_dpdk_open(erdma_engine *e, const erdma_pktio_host *host);

#define NB_DESC 1024        /* rx and tx ring sizes asked of the port */
/* rings (1024 rx, 1024 tx; AF_XDP: 2048 + 2048), 512 ARP holds, bursts */
#define POOL_MBUFS 8192
#define RX_BURST 32
#define MAX_NEIGH 64
#define NEIGH_HOLD 64       /* packets held per neighbour while ARP resolves it */
#define HOLD_MAX 512        /* ... and for all neighbours together (the pool's share) */
#define ARP_RETRY_NS 100000000ull
#define HDRS (RTE_ETHER_HDR_LEN + sizeof(struct rte_ipv4_hdr) + sizeof(struct rte_udp_hdr))

enum { NB_FREE = 0, NB_ASKING, NB_KNOWN, NB_STATIC };

typedef struct neigh {
  uint32_t ip;              /* network order */
  int state;
  struct rte_ether_addr mac;
  uint64_t asked;           /* last ARP request */
  struct rte_mbuf *hold[NEIGH_HOLD];
  int nhold;
} neigh;

typedef struct dpdk_state {
  erdma_engine *e;
  int (*rx_datagram)(erdma_engine *e, const uint8_t *data, size_t len,
                     const struct sockaddr_storage *from, socklen_t fromlen);
  uint16_t port, queue;
  struct rte_ether_addr mac;
  uint32_t ip, mask, gw;    /* network order; gw 0: none */
  uint16_t udp_port;        /* network order */
  int tx_offload;           /* port computes IPv4 and UDP checksums */
  uint16_t ip_id;
  neigh nb[MAX_NEIGH];
  /* counters, reported at close with verbose */
  uint64_t rx_frames, rx_udp, rx_partial, rx_bad_csum, rx_other, tx_frames, tx_drop, arp_rx,
      arp_tx, arp_req;
  uint64_t tx_zc;           /* packets the engine wrote straight into our mbufs */
  uint64_t tx_copied, tx_copied_bytes; /* packets (and bytes) copied in dpdk_send */
  uint64_t tx_nobuf;        /* tx_buf found the pool empty */
  /* zero-copy batch (dpdk_tx_buf): mbufs handed out, in order; those left
   * unsent by dpdk_tx_commit stay for the next batch */
  struct rte_mbuf *zc[ERDMA_TX_BATCH];
  int nzc;
  unsigned nobuf_every, nobuf_n; /* tests: every Nth allocation fails as if the pool were empty */
  uint64_t last_report;     /* verbose >= 3: counters every second */
  int dead;                 /* the process is exiting: the port is closed */
  int held;                 /* packets held for all neighbours */
  size_t max_payload;       /* largest UDP payload one frame carries (MTU - 28, mbuf) */
} dpdk_state;

/* EAL: once per process.  The port and the pool stay for a later engine with
 * the same EAL arguments; only one engine uses DPDK at a time. */
static int eal_state;       /* 0: not tried, 1: up, -1: rte_eal_init failed */
static char eal_args_used[1024];
static char eal_fail[256];
static int in_use;
static dpdk_state *live;    /* the engine's port, closed at exit */
static int atexit_set;
static struct rte_mempool *pool;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------ neighbours */
static neigh *neigh_find(dpdk_state *d, uint32_t ip, int create) {
  neigh *free_slot = NULL;
  for (int i = 0; i < MAX_NEIGH; i++) {
    if (d->nb[i].state != NB_FREE && d->nb[i].ip == ip) return &d->nb[i];
    if (d->nb[i].state == NB_FREE && !free_slot) free_slot = &d->nb[i];
  }
  if (!create || !free_slot) return NULL;
  memset(free_slot, 0, sizeof *free_slot);
  free_slot->ip = ip;
  free_slot->state = NB_ASKING;
  return free_slot;
}

static int on_link(const dpdk_state *d, uint32_t ip) { return (ip & d->mask) == (d->ip & d->mask); }

static void tx_frames(dpdk_state *d, struct rte_mbuf **m, uint16_t n) {
  uint16_t sent = 0;
  int tries = 0;
  while (sent < n) {
    uint16_t k = rte_eth_tx_burst(d->port, d->queue, m + sent, n - sent);
    sent += k;
    if (k == 0 && ++tries > 2000) break; /* ring stays full: drop, QUIC recovers */
  }
  d->tx_frames += sent;
  if (sent < n) {
    d->tx_drop += n - sent;
    rte_pktmbuf_free_bulk(m + sent, n - sent);
  }
}

static void arp_send(dpdk_state *d, uint16_t op, const struct rte_ether_addr *tha, uint32_t tip) {
  struct rte_mbuf *m = rte_pktmbuf_alloc(pool);
  if (!m) return;
  size_t len = RTE_ETHER_HDR_LEN + sizeof(struct rte_arp_hdr);
  struct rte_ether_hdr *eh = (struct rte_ether_hdr *)rte_pktmbuf_append(m, (uint16_t)len);
  struct rte_arp_hdr *a = (struct rte_arp_hdr *)(eh + 1);
  if (op == RTE_ARP_OP_REQUEST) memset(&eh->dst_addr, 0xff, RTE_ETHER_ADDR_LEN);
  else rte_ether_addr_copy(tha, &eh->dst_addr);
  rte_ether_addr_copy(&d->mac, &eh->src_addr);
  eh->ether_type = rte_cpu_to_be_16(RTE_ETHER_TYPE_ARP);
  a->arp_hardware = rte_cpu_to_be_16(RTE_ARP_HRD_ETHER);
  a->arp_protocol = rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4);
  a->arp_hlen = RTE_ETHER_ADDR_LEN;
  a->arp_plen = 4;
  a->arp_opcode = rte_cpu_to_be_16(op);
  rte_ether_addr_copy(&d->mac, &a->arp_data.arp_sha);
  a->arp_data.arp_sip = d->ip;
  if (op == RTE_ARP_OP_REQUEST) memset(&a->arp_data.arp_tha, 0, RTE_ETHER_ADDR_LEN);
  else rte_ether_addr_copy(tha, &a->arp_data.arp_tha);
  a->arp_data.arp_tip = tip;
  d->arp_tx++;
  tx_frames(d, &m, 1);
}

/* A neighbour's MAC became known: fill in and send what waited for it. */
static void neigh_resolved(dpdk_state *d, neigh *n, const struct rte_ether_addr *mac) {
  if (n->state == NB_STATIC) return;
  rte_ether_addr_copy(mac, &n->mac);
  n->state = NB_KNOWN;
  for (int i = 0; i < n->nhold; i++) {
    struct rte_ether_hdr *eh = rte_pktmbuf_mtod(n->hold[i], struct rte_ether_hdr *);
    rte_ether_addr_copy(mac, &eh->dst_addr);
  }
  if (n->nhold) tx_frames(d, n->hold, (uint16_t)n->nhold);
  d->held -= n->nhold;
  n->nhold = 0;
}

/* ------------------------------------------------------------------ tx */
static void fill_headers(dpdk_state *d, struct rte_mbuf *m, uint32_t dip, uint16_t dport,
                         size_t plen) {
  struct rte_ether_hdr *eh = rte_pktmbuf_mtod(m, struct rte_ether_hdr *);
  struct rte_ipv4_hdr *ip = (struct rte_ipv4_hdr *)(eh + 1);
  struct rte_udp_hdr *uh = (struct rte_udp_hdr *)(ip + 1);
  rte_ether_addr_copy(&d->mac, &eh->src_addr);
  eh->ether_type = rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4);
  ip->version_ihl = RTE_IPV4_VHL_DEF;
  ip->type_of_service = 0;
  ip->total_length = rte_cpu_to_be_16((uint16_t)(sizeof *ip + sizeof *uh + plen));
  ip->packet_id = rte_cpu_to_be_16(d->ip_id++);
  ip->fragment_offset = rte_cpu_to_be_16(RTE_IPV4_HDR_DF_FLAG);
  ip->time_to_live = 64;
  ip->next_proto_id = IPPROTO_UDP;
  ip->hdr_checksum = 0;
  ip->src_addr = d->ip;
  ip->dst_addr = dip;
  uh->src_port = d->udp_port;
  uh->dst_port = dport;
  uh->dgram_len = rte_cpu_to_be_16((uint16_t)(sizeof *uh + plen));
  uh->dgram_cksum = 0;
  if (d->tx_offload) {
    m->l2_len = RTE_ETHER_HDR_LEN;
    m->l3_len = sizeof *ip;
    m->ol_flags |= RTE_MBUF_F_TX_IPV4 | RTE_MBUF_F_TX_IP_CKSUM | RTE_MBUF_F_TX_UDP_CKSUM;
    uh->dgram_cksum = rte_ipv4_phdr_cksum(ip, m->ol_flags);
  } else {
    ip->hdr_checksum = rte_ipv4_cksum(ip);
    uh->dgram_cksum = rte_ipv4_udptcp_cksum(ip, uh); /* 0 comes out as 0xffff */
  }
}

/* Frames with their headers written go to the next hop towards dip: now
 * when its MAC is known, else held (up to NEIGH_HOLD) while ARP resolves it.
 * Takes the mbufs. */
static void tx_route(dpdk_state *d, uint32_t dip, struct rte_mbuf **m, int n) {
  uint32_t hop = on_link(d, dip) || !d->gw ? dip : d->gw;
  neigh *nb = neigh_find(d, hop, 1);
  if (!nb) { /* table full of others: drop, QUIC retransmits */
    d->tx_drop += (uint64_t)n;
    rte_pktmbuf_free_bulk(m, (unsigned)n);
    return;
  }
  for (int i = 0; i < n; i++)
    rte_ether_addr_copy(&nb->mac, &rte_pktmbuf_mtod(m[i], struct rte_ether_hdr *)->dst_addr);
  if (nb->state == NB_KNOWN || nb->state == NB_STATIC) {
    tx_frames(d, m, (uint16_t)n);
    return;
  }
  int keep = n < NEIGH_HOLD - nb->nhold ? n : NEIGH_HOLD - nb->nhold;
  if (keep > HOLD_MAX - d->held) keep = HOLD_MAX - d->held;
  d->held += keep;
  memcpy(nb->hold + nb->nhold, m, (size_t)keep * sizeof m[0]);
  nb->nhold += keep;
  if (keep < n) {
    d->tx_drop += (uint64_t)(n - keep);
    rte_pktmbuf_free_bulk(m + keep, (unsigned)(n - keep));
  }
  uint64_t t = now_ns();
  if (!nb->asked || t - nb->asked > ARP_RETRY_NS) {
    nb->asked = t;
    d->arp_req++;
    arp_send(d, RTE_ARP_OP_REQUEST, NULL, hop);
  }
}

/* Packets from a buffer of the engine's (e->txbuf: a connection close, a
 * STUN/TURN message; everything when zero-copy is off) are copied into mbufs
 * behind our headers: the engine reuses its buffer as soon as this returns. */
static void dpdk_send(erdma_engine *e, const struct sockaddr_storage *to, socklen_t tolen,
                      uint8_t *bufs, size_t stride, const size_t *lens, int n) {
  dpdk_state *d = e->io.state;
  struct rte_mbuf *m[ERDMA_TX_BATCH];
  (void)tolen;
  if (d->dead || to->ss_family != AF_INET || n <= 0) return;
  if (n > ERDMA_TX_BATCH) { /* in bursts of what m[] holds */
    dpdk_send(e, to, tolen, bufs, stride, lens, ERDMA_TX_BATCH);
    dpdk_send(e, to, tolen, bufs + (size_t)ERDMA_TX_BATCH * stride, stride,
              lens + ERDMA_TX_BATCH, n - ERDMA_TX_BATCH);
    return;
  }
  const struct sockaddr_in *sin = (const struct sockaddr_in *)to;
  if (rte_pktmbuf_alloc_bulk(pool, m, (unsigned)n) != 0) {
    d->tx_drop += (uint64_t)n;
    return;
  }
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (lens[i] > d->max_payload) { /* a datagram the MTU cannot carry (no fragments) */
      d->tx_drop++;
      continue;
    }
    uint8_t *p = (uint8_t *)rte_pktmbuf_append(m[k], (uint16_t)(HDRS + lens[i]));
    memcpy(p + HDRS, bufs + (size_t)i * stride, lens[i]);
    d->tx_copied++;
    d->tx_copied_bytes += lens[i];
    fill_headers(d, m[k], sin->sin_addr.s_addr, sin->sin_port, lens[i]);
    k++;
  }
  if (k < n) rte_pktmbuf_free_bulk(m + k, (unsigned)(n - k));
  if (k) tx_route(d, sin->sin_addr.s_addr, m, k);
}

/* Zero-copy transmit (erdma_pktio.tx_buf): the engine's writer gets the data
 * area of an mbuf behind room for our headers, so ngtcp2 writes the QUIC
 * packet where it leaves from.  The frame starts where a fresh mbuf's data
 * does; a prefix (ChannelData) moves it ERDMA_TX_PREFIX bytes into the
 * headroom. */
static uint8_t *zc_payload(struct rte_mbuf *m) {
  return rte_pktmbuf_mtod_offset(m, uint8_t *, HDRS);
}

static uint8_t *dpdk_tx_buf(erdma_engine *e, int i, int want) {
  dpdk_state *d = e->io.state;
  if (i < d->nzc) return zc_payload(d->zc[i]);
  if (i != d->nzc || i >= ERDMA_TX_BATCH) return NULL; /* asked out of order */
  if (want > ERDMA_TX_BATCH) want = ERDMA_TX_BATCH;
  int k = want > i ? want - i : 1;
  if (d->nobuf_every && ++d->nobuf_n % d->nobuf_every == 0) {
    d->tx_nobuf++;
    return NULL;
  }
  if (rte_pktmbuf_alloc_bulk(pool, d->zc + i, (unsigned)k) != 0) { /* all or nothing */
    k = 1;
    if (!(d->zc[i] = rte_pktmbuf_alloc(pool))) {
      d->tx_nobuf++;
      return NULL;
    }
  }
  d->nzc += k;
  return zc_payload(d->zc[i]);
}

static void dpdk_tx_commit(erdma_engine *e, const struct sockaddr_storage *to, socklen_t tolen,
                           size_t pre, const size_t *lens, int n) {
  dpdk_state *d = e->io.state;
  struct rte_mbuf *m[ERDMA_TX_BATCH];
  (void)tolen;
  if (n > d->nzc) n = d->nzc;
  if (n <= 0) return; /* the batch's mbufs stay for the next one */
  memcpy(m, d->zc, (size_t)n * sizeof m[0]);
  memmove(d->zc, d->zc + n, (size_t)(d->nzc - n) * sizeof m[0]);
  d->nzc -= n;
  d->tx_zc += (uint64_t)n;
  if (d->dead || to->ss_family != AF_INET) {
    d->tx_drop += (uint64_t)n;
    rte_pktmbuf_free_bulk(m, (unsigned)n);
    return;
  }
  const struct sockaddr_in *sin = (const struct sockaddr_in *)to;
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (lens[i] > d->max_payload || pre > ERDMA_TX_PREFIX || pre > m[i]->data_off) {
      d->tx_drop++;
      rte_pktmbuf_free(m[i]);
      continue;
    }
    /* the frame starts HDRS bytes before the payload (and its prefix) */
    m[i]->data_off = (uint16_t)(m[i]->data_off - pre);
    rte_pktmbuf_append(m[i], (uint16_t)(HDRS + lens[i]));
    fill_headers(d, m[i], sin->sin_addr.s_addr, sin->sin_port, lens[i]);
    m[k++] = m[i];
  }
  if (k) tx_route(d, sin->sin_addr.s_addr, m, k);
}

/* ------------------------------------------------------------------ rx */
static void rx_arp(dpdk_state *d, const dpdk_frame *f) {
  struct rte_ether_addr sha;
  memcpy(&sha, f->sha, sizeof sha);
  d->arp_rx++;
  /* only for neighbours we talk to (an entry exists): strangers' requests
   * would fill the table and leave no room for a peer */
  neigh *n = neigh_find(d, f->sip, 0);
  if (f->tip == d->ip && f->sip != 0) {
    if (n) neigh_resolved(d, n, &sha); /* whoever asks or answers us is there */
    if (f->op == RTE_ARP_OP_REQUEST) arp_send(d, RTE_ARP_OP_REPLY, &sha, f->sip);
  } else if (n && n->state == NB_KNOWN) { /* gratuitous or someone else's: refresh only */
    rte_ether_addr_copy(&sha, &n->mac);
  }
}

static void rx_udp(dpdk_state *d, const dpdk_frame *f) {
  struct sockaddr_storage from;
  struct sockaddr_in *sin = (struct sockaddr_in *)&from;
  memset(&from, 0, sizeof from);
  sin->sin_family = AF_INET;
  sin->sin_addr.s_addr = f->src_ip;
  sin->sin_port = f->src_port;
  d->rx_udp++;
  d->rx_partial += (uint64_t)f->partial;
  /* Learn the sender's MAC, as ARP would tell, only from a datagram the
   * engine authenticated as its peer's: the headers of anything else may be
   * forged, and a spoofed frame (the peer's address, garbage inside) would
   * redirect what we send the peer. */
  if (!d->rx_datagram(d->e, f->payload, f->len, &from, sizeof *sin) || !on_link(d, f->src_ip))
    return;
  struct rte_ether_addr mac;
  memcpy(&mac, f->src_mac, sizeof mac);
  neigh *n = neigh_find(d, f->src_ip, 0);
  if (n && n->state == NB_ASKING) neigh_resolved(d, n, &mac);
  else if (n && n->state == NB_KNOWN && !rte_is_same_ether_addr(&n->mac, &mac))
    rte_ether_addr_copy(&mac, &n->mac); /* the peer moved */
}

static void dpdk_report(erdma_engine *e);

static void dpdk_recv(erdma_engine *e) {
  dpdk_state *d = e->io.state;
  struct rte_mbuf *m[RX_BURST];
  if (d->dead) return;
  if (e->cfg.verbose >= 3 && now_ns() - d->last_report > 1000000000ull) {
    d->last_report = now_ns();
    dpdk_report(e);
  }
  for (int round = 0; round < 8; round++) {
    uint16_t n = rte_eth_rx_burst(d->port, d->queue, m, RX_BURST);
    for (uint16_t i = 0; i < n; i++) {
      struct rte_mbuf *p = m[i];
      d->rx_frames++;
      if (p->nb_segs > 1 && rte_pktmbuf_linearize(p) != 0) continue;
      unsigned hw = 0;
      if ((p->ol_flags & RTE_MBUF_F_RX_IP_CKSUM_MASK) == RTE_MBUF_F_RX_IP_CKSUM_GOOD)
        hw |= FRAME_HW_IP_CSUM_GOOD;
      if ((p->ol_flags & RTE_MBUF_F_RX_L4_CKSUM_MASK) == RTE_MBUF_F_RX_L4_CKSUM_GOOD)
        hw |= FRAME_HW_L4_CSUM_GOOD;
      dpdk_frame f;
      switch (dpdk_parse_frame(rte_pktmbuf_mtod(p, const uint8_t *), p->data_len,
                               d->mac.addr_bytes, d->ip, d->udp_port, hw, &f)) {
      case FRAME_UDP: rx_udp(d, &f); break;
      case FRAME_ARP: rx_arp(d, &f); break;
      case FRAME_BAD_CSUM: d->rx_bad_csum++; break;
      case FRAME_OTHER: d->rx_other++; break;
      default: break;
      }
    }
    if (n) rte_pktmbuf_free_bulk(m, n);
    if (n < RX_BURST) return;
  }
}

static void dpdk_report(erdma_engine *e) {
  dpdk_state *d = e->io.state;
  struct rte_eth_stats st;
  memset(&st, 0, sizeof st);
  rte_eth_stats_get(d->port, &st);
  fprintf(stderr,
          "erdma[%d]: dpdk port %u: rx %lu frames, %lu UDP for us (%lu with partial "
          "checksums), %lu bad checksums, %lu others; tx %lu frames, %lu dropped; QUIC tx %lu "
          "packets, %lu zero-copy, %lu copied (%lu bytes), %lu times no mbuf; arp rx %lu "
          "tx %lu (%lu requests); port: %lu missed, %lu rx errors, %lu no mbuf, %lu tx errors, "
          "pool %u free\n",
          e->cfg.rank, d->port, (unsigned long)d->rx_frames, (unsigned long)d->rx_udp,
          (unsigned long)d->rx_partial, (unsigned long)d->rx_bad_csum,
          (unsigned long)d->rx_other, (unsigned long)d->tx_frames, (unsigned long)d->tx_drop,
          (unsigned long)e->stats.pkts_sent, (unsigned long)d->tx_zc,
          (unsigned long)d->tx_copied, (unsigned long)d->tx_copied_bytes,
          (unsigned long)d->tx_nobuf,
          (unsigned long)d->arp_rx, (unsigned long)d->arp_tx, (unsigned long)d->arp_req,
          (unsigned long)st.imissed,
          (unsigned long)st.ierrors, (unsigned long)st.rx_nombuf, (unsigned long)st.oerrors,
          rte_mempool_avail_count(pool));
}

/* At process exit the port is closed even if the engine never was: AF_XDP
 * leaves its XDP program on the interface otherwise, and the kernel would
 * lose the interface to a socket nobody reads.  The engine's lock keeps the
 * progress thread (if the engine was never shut down) out meanwhile. */
static void dpdk_atexit(void) {
  dpdk_state *d = live;
  if (!d) return;
  pthread_mutex_lock(&d->e->mu);
  d->dead = 1;
  rte_eth_dev_stop(d->port);
  rte_eth_dev_close(d->port);
  live = NULL;
  pthread_mutex_unlock(&d->e->mu);
}

static void dpdk_close(erdma_engine *e) {
  dpdk_state *d = e->io.state;
  if (!d) return;
  live = NULL;
  for (int i = 0; i < MAX_NEIGH; i++)
    if (d->nb[i].nhold) rte_pktmbuf_free_bulk(d->nb[i].hold, (unsigned)d->nb[i].nhold);
  if (d->nzc) rte_pktmbuf_free_bulk(d->zc, (unsigned)d->nzc);
  if (!d->dead) rte_eth_dev_stop(d->port);
  free(d);
  e->io.state = NULL;
  in_use = 0;
}

/* ------------------------------------------------------------------ open */
#define FAIL(...) do { snprintf(host->err, host->errlen, __VA_ARGS__); goto fail; } while (0)

static int has_arg(char **argv, int argc, const char *name) {
  size_t l = strlen(name);
  for (int i = 0; i < argc; i++)
    if (strncmp(argv[i], name, l) == 0 && (argv[i][l] == 0 || argv[i][l] == '=')) return 1;
  return 0;
}

/* Checks rte_eal_init would make with a cryptic message or none: the
 * interfaces named by --vdev ...,iface=X and free hugepages. */
static int eal_precheck(char **argv, int argc, char *err, size_t errlen) {
  for (int i = 0; i < argc; i++) {
    const char *v = strstr(argv[i], "iface=");
    if (!v || (strncmp(argv[i], "--vdev", 6) != 0 && (i == 0 || strcmp(argv[i - 1], "--vdev"))))
      continue;
    char name[IF_NAMESIZE + 1];
    size_t l = strcspn(v + 6, ",");
    if (l > IF_NAMESIZE) l = IF_NAMESIZE;
    memcpy(name, v + 6, l);
    name[l] = 0;
    if (if_nametoindex(name) == 0) {
      snprintf(err, errlen, "DPDK: network interface %s (in %s) does not exist in this "
               "network namespace", name, argv[i]);
      return -1;
    }
  }
  if (!has_arg(argv, argc, "--no-huge")) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[128];
    long free_pages = -1;
    while (f && fgets(line, sizeof line, f))
      if (sscanf(line, "HugePages_Free: %ld", &free_pages) == 1) break;
    if (f) fclose(f);
    if (free_pages == 0) {
      snprintf(err, errlen, "DPDK: no free hugepages (HugePages_Free is 0): reserve some "
               "(echo 64 > /proc/sys/vm/nr_hugepages, mount -t hugetlbfs nodev DIR, "
               "--huge-dir=DIR) or run without them (--no-huge)");
      return -1;
    }
  }
  return 0;
}

static int eal_start(const erdma_engine *e, const erdma_pktio_host *host) {
  const char *args = e->cfg.dpdk_eal ? e->cfg.dpdk_eal : "";
  if (eal_state == 1) {
    if (strcmp(args, eal_args_used) != 0) {
      snprintf(host->err, host->errlen,
               "DPDK: the EAL is already initialised in this process with other arguments "
               "(\"%s\"); it can be initialised only once per process", eal_args_used);
      return -1;
    }
    return 0;
  }
  if (eal_state == -1) {
    snprintf(host->err, host->errlen, "DPDK: EAL initialisation already failed in this process "
             "(%s); it cannot be retried in the same process", eal_fail);
    return -1;
  }
  /* argv: our defaults only where the user gave none of their own */
  char *copy = strdup(args), *argv[128], *save = NULL, lcore[32], *tok;
  int argc = 0, rv = -1;
  if (!copy) return -1;
  argv[argc++] = "erdmampi";
  for (tok = strtok_r(copy, " \t\n", &save); tok && argc < 120;
       tok = strtok_r(NULL, " \t\n", &save))
    argv[argc++] = tok;
  int user_end = argc;
  if (!has_arg(argv, user_end, "-l") && !has_arg(argv, user_end, "-c") &&
      !has_arg(argv, user_end, "--lcores")) {
    /* one lcore, one we may run on: no worker threads, no pinning elsewhere */
    cpu_set_t cs;
    int cpu = 0;
    if (sched_getaffinity(0, sizeof cs, &cs) == 0)
      while (cpu < CPU_SETSIZE - 1 && !CPU_ISSET(cpu, &cs)) cpu++;
    snprintf(lcore, sizeof lcore, "-l%d", cpu);
    argv[argc++] = lcore;
  }
  /* no shared files in /var/run/dpdk, no clash between ranks on one host
   * (--no-huge implies legacy memory, which --in-memory refuses) */
  char prefix[64];
  if (!has_arg(argv, user_end, "--file-prefix") && !has_arg(argv, user_end, "--in-memory") &&
      !has_arg(argv, user_end, "--no-shconf")) {
    if (has_arg(argv, user_end, "--no-huge")) {
      snprintf(prefix, sizeof prefix, "--file-prefix=erdma%d", (int)getpid());
      argv[argc++] = "--no-shconf";
      argv[argc++] = prefix;
    } else {
      argv[argc++] = "--in-memory";
    }
  }
  if (!has_arg(argv, user_end, "--telemetry") && !has_arg(argv, user_end, "--no-telemetry"))
    argv[argc++] = "--no-telemetry";
  if (!has_arg(argv, user_end, "--log-level") && !e->cfg.verbose)
    argv[argc++] = "--log-level=lib.eal:warning";
  argv[argc] = NULL;
  if (eal_precheck(argv, argc, host->err, host->errlen) != 0) {
    free(copy);
    return -1;
  }
  /* rte_eal_init pins the calling thread to its main lcore: give it back
   * the CPUs it had (it is the application's thread, not a poller) */
  cpu_set_t before;
  int have_aff = pthread_getaffinity_np(pthread_self(), sizeof before, &before) == 0;
  char *argv_copy[128];
  memcpy(argv_copy, argv, sizeof(char *) * (size_t)(argc + 1)); /* EAL permutes argv */
  int r = rte_eal_init(argc, argv_copy);
  if (have_aff) pthread_setaffinity_np(pthread_self(), sizeof before, &before);
  if (r < 0) {
    int en = rte_errno;
    const char *hint = "";
    if (en == EACCES || en == EPERM || geteuid() != 0)
      hint = "; DPDK needs root or CAP_NET_RAW/CAP_SYS_ADMIN/CAP_IPC_LOCK for these PMDs";
    else if (en == ENOMEM)
      hint = "; not enough memory: raise -m, add hugepages or use --no-huge";
    else if (en == ENODEV || en == EINVAL || en == ENOENT)
      hint = "; check the --vdev driver name (net_af_packet0, net_af_xdp0, ...) and its options";
    snprintf(eal_fail, sizeof eal_fail, "%s", rte_strerror(en));
    snprintf(host->err, host->errlen, "DPDK: rte_eal_init(\"%s\") failed: %s%s (EAL messages "
             "above on stderr)", args, rte_strerror(en), hint);
    eal_state = -1;
  } else {
    snprintf(eal_args_used, sizeof eal_args_used, "%s", args);
    eal_state = 1;
    rv = 0;
  }
  free(copy);
  return rv;
}

static int parse_mac(const char *s, struct rte_ether_addr *mac) {
  unsigned b[6];
  if (sscanf(s, "%x:%x:%x:%x:%x:%x", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5]) != 6) return -1;
  for (int i = 0; i < 6; i++) {
    if (b[i] > 255) return -1;
    mac->addr_bytes[i] = (uint8_t)b[i];
  }
  return 0;
}

/* "ip=mac,ip=mac" */
static int parse_neigh(dpdk_state *d, const char *spec, char *err, size_t errlen) {
  char *copy = strdup(spec), *save = NULL;
  if (!copy) return -1;
  for (char *tok = strtok_r(copy, ", \t", &save); tok; tok = strtok_r(NULL, ", \t", &save)) {
    char *eq = strchr(tok, '=');
    struct in_addr a;
    struct rte_ether_addr mac;
    if (eq) *eq = 0;
    if (!eq || inet_pton(AF_INET, tok, &a) != 1 || parse_mac(eq + 1, &mac) != 0) {
      snprintf(err, errlen, "DPDK: bad neighbour entry \"%s%s%s\" (want ip=aa:bb:cc:dd:ee:ff)",
               tok, eq ? "=" : "", eq ? eq + 1 : "");
      free(copy);
      return -1;
    }
    neigh *n = neigh_find(d, a.s_addr, 1);
    if (!n) {
      snprintf(err, errlen, "DPDK: more than %d neighbours", MAX_NEIGH);
      free(copy);
      return -1;
    }
    n->state = NB_STATIC;
    n->mac = mac;
  }
  free(copy);
  return 0;
}

static int port_start(dpdk_state *d, const erdma_pktio_host *host) {
  struct rte_eth_dev_info info;
  struct rte_eth_conf conf;
  uint16_t nrx = NB_DESC, ntx = NB_DESC;
  int rv;
  memset(&conf, 0, sizeof conf);
  if ((rv = rte_eth_dev_info_get(d->port, &info)) != 0) {
    snprintf(host->err, host->errlen, "DPDK: port %u: no device info: %s", d->port,
             rte_strerror(-rv));
    return -1;
  }
  if (d->queue >= info.max_rx_queues || d->queue >= info.max_tx_queues) {
    snprintf(host->err, host->errlen, "DPDK: port %u (%s) has %u rx / %u tx queues; queue %u "
             "asked (af_packet: qpairs=N in --vdev)", d->port, info.driver_name,
             info.max_rx_queues, info.max_tx_queues, d->queue);
    return -1;
  }
  uint64_t want = RTE_ETH_TX_OFFLOAD_IPV4_CKSUM | RTE_ETH_TX_OFFLOAD_UDP_CKSUM;
  d->tx_offload = (info.tx_offload_capa & want) == want;
  if (d->tx_offload) conf.txmode.offloads = want;
  if ((info.rx_offload_capa & (RTE_ETH_RX_OFFLOAD_IPV4_CKSUM | RTE_ETH_RX_OFFLOAD_UDP_CKSUM)) ==
      (RTE_ETH_RX_OFFLOAD_IPV4_CKSUM | RTE_ETH_RX_OFFLOAD_UDP_CKSUM))
    conf.rxmode.offloads = RTE_ETH_RX_OFFLOAD_IPV4_CKSUM | RTE_ETH_RX_OFFLOAD_UDP_CKSUM;
  uint16_t nq = (uint16_t)(d->queue + 1);
  if ((rv = rte_eth_dev_configure(d->port, nq, nq, &conf)) != 0 ||
      (rv = rte_eth_dev_adjust_nb_rx_tx_desc(d->port, &nrx, &ntx)) != 0) {
    snprintf(host->err, host->errlen, "DPDK: configuring port %u (%s): %s", d->port,
             info.driver_name, rte_strerror(-rv));
    return -1;
  }
  int sock = rte_eth_dev_socket_id(d->port);
  for (uint16_t q = 0; q < nq; q++) {
    if ((rv = rte_eth_rx_queue_setup(d->port, q, nrx, sock < 0 ? 0 : (unsigned)sock, NULL,
                                     pool)) != 0 ||
        (rv = rte_eth_tx_queue_setup(d->port, q, ntx, sock < 0 ? 0 : (unsigned)sock, NULL)) != 0) {
      snprintf(host->err, host->errlen, "DPDK: queue %u of port %u (%s): %s", q, d->port,
               info.driver_name, rte_strerror(-rv));
      return -1;
    }
  }
  if ((rv = rte_eth_dev_start(d->port)) != 0) {
    snprintf(host->err, host->errlen, "DPDK: starting port %u (%s): %s", d->port,
             info.driver_name, rte_strerror(-rv));
    return -1;
  }
  rte_eth_macaddr_get(d->port, &d->mac);
  return 0;
}

/* The mbuf pool: objects of a power-of-two size (4 KiB for 1500-byte
 * frames, as AF_PACKET wants 2 KiB of data room) without the spreading
 * padding, so that they tile 4 KiB pages exactly.  AF_XDP registers the pool
 * as its UMEM assuming one object every rte_mempool_calc_obj_size() bytes;
 * objects padded to a page each (what rte_pktmbuf_pool_create gives on
 * --no-huge memory) left part of the pool outside the UMEM and the port
 * stalled.  SP/SC ring: e->mu serialises us. */
static struct rte_mempool *pool_new(size_t frame) {
  char name[RTE_MEMPOOL_NAMESIZE];
  uint32_t obj = 2048, hdr = rte_mempool_calc_obj_size(0, RTE_MEMPOOL_F_NO_SPREAD, NULL);
  /* AF_PACKET wants room for its whole ring frame (2 KiB by default) */
  size_t room = frame + 64 > 2048 ? frame + 64 : 2048;
  while (obj - hdr - sizeof(struct rte_mbuf) < RTE_PKTMBUF_HEADROOM + room) obj *= 2;
  uint32_t elt = obj - hdr;
  struct rte_pktmbuf_pool_private priv = {0};
  priv.mbuf_data_room_size = (uint16_t)(elt - sizeof(struct rte_mbuf));
  snprintf(name, sizeof name, "erdma%d", (int)getpid());
  int sock = rte_socket_id() == (unsigned)SOCKET_ID_ANY ? SOCKET_ID_ANY : (int)rte_socket_id();
  struct rte_mempool *mp = rte_mempool_create_empty(name, POOL_MBUFS, elt, 0, sizeof priv, sock,
                                                    RTE_MEMPOOL_F_NO_SPREAD);
  if (!mp) return NULL;
  if (rte_mempool_set_ops_byname(mp, "ring_sp_sc", NULL) != 0) goto fail;
  rte_pktmbuf_pool_init(mp, &priv);
  if (rte_mempool_populate_default(mp) != POOL_MBUFS) goto fail;
  rte_mempool_obj_iter(mp, rte_pktmbuf_init, NULL);
  return mp;
fail:
  rte_mempool_free(mp);
  return NULL;
}

int erdma_pktio_dpdk_open(erdma_engine *e, const erdma_pktio_host *host) {
  dpdk_state *d = NULL;
  if (host->abi != ERDMA_PKTIO_ABI || host->engine_size != sizeof(erdma_engine)) {
    snprintf(host->err, host->errlen, "the DPDK backend was built from other engine sources: "
             "rebuild erdmampi");
    return ERDMA_ERR_PKTIO;
  }
  if (in_use) {
    snprintf(host->err, host->errlen, "DPDK: another engine in this process already uses DPDK "
             "(the EAL and the port serve one engine per process)");
    return ERDMA_ERR_PKTIO;
  }
  const struct sockaddr_in *local = (const struct sockaddr_in *)&e->local;
  if (local->sin_addr.s_addr == htonl(INADDR_ANY)) {
    snprintf(host->err, host->errlen, "DPDK: bind must be the endpoint's own IPv4 address "
             "(not 0.0.0.0): the address the port answers ARP for");
    return ERDMA_ERR_PKTIO;
  }
  if (e->cfg.dpdk_prefix < 1 || e->cfg.dpdk_prefix > 32) {
    snprintf(host->err, host->errlen, "DPDK: prefix length %d out of [1, 32]", e->cfg.dpdk_prefix);
    return ERDMA_ERR_PKTIO;
  }
  if (eal_start(e, host) != 0) return ERDMA_ERR_PKTIO;
  if (!(d = calloc(1, sizeof *d))) return ERDMA_ERR_NOMEM;
  d->e = e;
  d->rx_datagram = host->rx_datagram;
  d->port = (uint16_t)e->cfg.dpdk_port;
  d->queue = (uint16_t)e->cfg.dpdk_queue;
  if (e->cfg.dpdk_port < 0 || !rte_eth_dev_is_valid_port(d->port)) {
    const char *why = "";
    if (strstr(e->cfg.dpdk_eal ? e->cfg.dpdk_eal : "", "--vdev"))
      why = "; the --vdev was not probed (the EAL messages above say why): AF_PACKET needs "
            "CAP_NET_RAW, AF_XDP also CAP_NET_ADMIN and CAP_BPF (or root)";
    FAIL("DPDK: no port %d (%u ports found; give one with --vdev=net_af_packet0,iface=IF or "
         "--vdev=net_af_xdp0,iface=IF, or bind a NIC to vfio-pci)%s", e->cfg.dpdk_port,
         rte_eth_dev_count_avail(), why);
  }
  if (e->cfg.dpdk_queue < 0) FAIL("DPDK: queue %d", e->cfg.dpdk_queue);
  uint16_t mtu = 1500;
  rte_eth_dev_get_mtu(d->port, &mtu);
  size_t pkt = e->cfg.max_udp_payload ? e->cfg.max_udp_payload : 1452;
  if (pkt > (size_t)mtu - 28) pkt = (size_t)mtu - 28;
  if (pkt < 1200)
    FAIL("DPDK: port %u has MTU %u; QUIC needs 1228 bytes at least", d->port, mtu);
  if (!pool && !(pool = pool_new(HDRS + pkt)))
    FAIL("DPDK: cannot create a pool of %d mbufs: %s (raise -m or add hugepages)", POOL_MBUFS,
         rte_strerror(rte_errno));
  if (port_start(d, host) != 0) goto fail;
  d->ip = local->sin_addr.s_addr;
  d->mask = htonl(e->cfg.dpdk_prefix == 32 ? 0xffffffffu : ~(0xffffffffu >> e->cfg.dpdk_prefix));
  if (e->cfg.dpdk_gateway && *e->cfg.dpdk_gateway) {
    struct in_addr g;
    if (inet_pton(AF_INET, e->cfg.dpdk_gateway, &g) != 1) {
      rte_eth_dev_stop(d->port);
      FAIL("DPDK: bad gateway address \"%s\"", e->cfg.dpdk_gateway);
    }
    d->gw = g.s_addr;
  }
  if (e->cfg.dpdk_neigh && *e->cfg.dpdk_neigh &&
      parse_neigh(d, e->cfg.dpdk_neigh, host->err, host->errlen) != 0) {
    rte_eth_dev_stop(d->port);
    goto fail;
  }
  /* no kernel socket owns the port: an ephemeral one is ours to pick */
  uint16_t port = (uint16_t)e->cfg.port;
  if (!port)
    port = (uint16_t)(49152 + ((unsigned)getpid() * 2654435761u ^ (unsigned)now_ns()) % 16384);
  d->udp_port = htons(port);
  ((struct sockaddr_in *)&e->local)->sin_port = d->udp_port;
  e->pkt_size = pkt;
  e->gso = e->gro = 0;
  d->max_payload = (size_t)mtu - 28;
  if (d->max_payload > rte_pktmbuf_data_room_size(pool) - RTE_PKTMBUF_HEADROOM - HDRS)
    d->max_payload = rte_pktmbuf_data_room_size(pool) - RTE_PKTMBUF_HEADROOM - HDRS;
  if (e->pkt_size > d->max_payload) e->pkt_size = d->max_payload; /* pool of an earlier engine */
  e->io.name = "dpdk";
  e->io.send = dpdk_send;
  e->io.recv = dpdk_recv;
  e->io.close = dpdk_close;
  e->io.report = dpdk_report;
  /* zero-copy transmit where an mbuf holds headers and a whole packet behind its
   * headroom (which has room for a prefix)
   * (ERDMA_DPDK_COPY=1 turns it off: a comparison for bench/pktio.py) */
  if (!e->cfg.dpdk_copy && RTE_PKTMBUF_HEADROOM >= ERDMA_TX_PREFIX &&
      rte_pktmbuf_data_room_size(pool) >= RTE_PKTMBUF_HEADROOM + HDRS + e->pkt_size) {
    e->io.tx_buf = dpdk_tx_buf;
    e->io.tx_commit = dpdk_tx_commit;
  }
  if (e->cfg.dpdk_nobuf_every > 0) d->nobuf_every = (unsigned)e->cfg.dpdk_nobuf_every;
  e->io.fd = -1;
  e->io.state = d;
  in_use = 1;
  live = d;
  if (!atexit_set) atexit_set = atexit(dpdk_atexit) == 0;
  if (e->cfg.verbose) {
    char a[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &d->ip, a, sizeof a);
    fprintf(stderr, "erdma[%d]: dpdk port %u queue %u, %s:%u/%d, MAC " RTE_ETHER_ADDR_PRT_FMT
            ", %zu-byte packets, checksums in %s\n", e->cfg.rank, d->port, d->queue, a, port,
            e->cfg.dpdk_prefix, RTE_ETHER_ADDR_BYTES(&d->mac), e->pkt_size,
            d->tx_offload ? "the port" : "software");
  }
  return 0;
fail:
  free(d);
  return ERDMA_ERR_PKTIO;
}
#endif /* ERDMA_HAVE_DPDK */
