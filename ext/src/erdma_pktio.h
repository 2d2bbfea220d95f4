/* erdma_pktio.h - packet I/O: the interface and its backends
 * (erdma_pktio_udp.c, erdma_pktio_dpdk.c).
 *
 * The component owns the vtable a backend fills in e->io (erdma_pktio), the
 * batch sizes of its receive and send calls, the kernel UDP backend's entry
 * points, the ABI between the engine and the DPDK plugin, and the DPDK
 * backend's frame parser (plain bytes, no DPDK: fuzz/c/fuzz_dpdk_parse.c).
 * It needs only erdma.h: a backend reaches the engine through its
 * erdma_engine pointer and hands datagrams up with engine_rx_datagram
 * (erdma_engine.h), which includes this header for the struct's e->io. */
#ifndef ERDMA_PKTIO_H
#define ERDMA_PKTIO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "erdma.h"

#define ERDMA_BATCH 32     /* datagrams per recvmmsg */
#define ERDMA_TX_BATCH 64  /* packets per sendmmsg (one pacing burst at most) */

/* ---- packet I/O (erdma_pktio_*.c) ----
 * A backend moves whole UDP payloads; it hands each received one to
 * engine_rx_datagram() and sends runs of packets laid out at a stride. */
typedef struct erdma_pktio {
  const char *name;
  void (*send)(erdma_engine *e, const struct sockaddr_storage *to, socklen_t tolen,
               uint8_t *bufs, size_t stride, const size_t *lens, int n);
  void (*recv)(erdma_engine *e);   /* drain what has arrived, without blocking */
  void (*close)(erdma_engine *e);
  int fd;                          /* readable when input waits; < 0: poll recv() */
  void *state;                     /* backend-private */
  void (*report)(erdma_engine *e); /* optional: counters to stderr (verbose, at shutdown) */
  /* Optional zero-copy transmit (DPDK: mbufs).  The writer asks for packet
   * buffers of the batch it is writing in order, tx_buf(e, i, want) for
   * i = 0, 1, ... (want: how many the batch may take, a hint for a bulk
   * allocation); each has ERDMA_TX_PREFIX writable bytes in front of it and
   * e->pkt_size behind it.  NULL: none left (pool empty); the writer stops
   * writing for this round.  tx_commit sends the first n buffers to `to`,
   * packet i being lens[i] bytes that start `pre` (0 or ERDMA_TX_PREFIX)
   * bytes before buffer i, and releases the batch (buffers n and up
   * unsent); n may be 0.  Without these the writer uses e->txbuf and send. */
  uint8_t *(*tx_buf)(erdma_engine *e, int i, int want);
  void (*tx_commit)(erdma_engine *e, const struct sockaddr_storage *to, socklen_t tolen,
                    size_t pre, const size_t *lens, int n);
} erdma_pktio;
/* room in front of a zero-copy packet buffer: a TURN ChannelData header */
#define ERDMA_TX_PREFIX 4

int pktio_udp_open(erdma_engine *e);
/* the largest UDP payload to `to` when it is on a directly attached network
 * (route MTU less headers, <= 65000); 0 when routed through a gateway or unknown */
size_t pktio_udp_path_payload(erdma_engine *e, const struct sockaddr_storage *to,
                              socklen_t tolen);

/* The DPDK backend lives in its own shared object (erdmampi/_erdma_dpdk*.so,
 * built only where libdpdk is installed) which the engine dlopens when
 * cfg.pktio is ERDMA_PKTIO_DPDK: `import erdmampi` never loads DPDK.  The
 * plugin cannot see the engine's symbols (Python loads modules RTLD_LOCAL),
 * so the engine hands it what it calls. */
#define ERDMA_PKTIO_ABI 3
typedef struct erdma_pktio_host {
  int abi;                         /* ERDMA_PKTIO_ABI */
  size_t engine_size;              /* sizeof(erdma_engine): both built from one tree */
  /* engine_rx_datagram: 1 when the datagram authenticated as its sender's
   * (what a backend may learn from the packet's headers: only then) */
  int (*rx_datagram)(erdma_engine *e, const uint8_t *data, size_t len,
                     const struct sockaddr_storage *from, socklen_t fromlen);
  char *err;                       /* the plugin explains a failure here */
  size_t errlen;
} erdma_pktio_host;
typedef int (*erdma_pktio_open_fn)(erdma_engine *e, const erdma_pktio_host *host);
#define ERDMA_PKTIO_DPDK_OPEN "erdma_pktio_dpdk_open"
/* The DPDK backend's parser of received Ethernet frames (erdma_pktio_dpdk.c),
 * on plain bytes: no DPDK needed (fuzz/c/fuzz_dpdk_parse.c).  Addresses and
 * ports in network order; pointers point into the frame. */
enum {
  FRAME_IGNORED = 0, /* IPv4 not for our address and UDP port, runt, fragment, options */
  FRAME_OTHER,       /* not for our MAC (nor broadcast), or neither IPv4 nor ARP */
  FRAME_BAD_CSUM,    /* an IPv4 header or UDP checksum that does not verify */
  FRAME_UDP,         /* a UDP datagram for us: src_*, payload, len, partial */
  FRAME_ARP,         /* an Ethernet/IPv4 ARP packet: op, sha, sip, tip */
};
#define FRAME_HW_IP_CSUM_GOOD 1u /* the port verified the IPv4 header checksum */
#define FRAME_HW_L4_CSUM_GOOD 2u /* ... and the UDP checksum */
typedef struct dpdk_frame {
  const uint8_t *src_mac;    /* the Ethernet source (6 bytes) */
  uint32_t src_ip;           /* UDP */
  uint16_t src_port;
  const uint8_t *payload;
  size_t len;
  int partial;               /* the UDP checksum held only the pseudo-header sum */
  uint16_t op;               /* ARP: host order */
  const uint8_t *sha;        /* sender hardware address (6 bytes) */
  uint32_t sip, tip;
} dpdk_frame;
int dpdk_parse_frame(const uint8_t *f, size_t n, const uint8_t mac[6], uint32_t ip,
                     uint16_t udp_port, unsigned hw, dpdk_frame *out);

#endif /* ERDMA_PKTIO_H */
