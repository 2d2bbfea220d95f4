/* erdma_nat.h - NAT traversal on the engine's socket (erdma_nat.c).
 *
 * The component owns the demultiplexing of received datagrams (STUN, TURN
 * ChannelData, QUIC), the queue of raw STUN/TURN datagrams for the Python
 * ICE agent, and the TURN relay tunnels under QUIC (nat_state, nat_relay).
 * It includes erdma_conn.h because a relay tunnel carries one connection's
 * packets and bounds their size (nat_sendv, nat_max_udp_payload). */
#ifndef ERDMA_NAT_H
#define ERDMA_NAT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "erdma.h"
#include "erdma_conn.h"

/* ---- NAT traversal (erdma_nat.c): demultiplexing, raw queue, relay tunnels ---- */
#define ERDMA_MAX_TURN 8          /* registered TURN servers */
#define ERDMA_RAW_QUEUE_MAX 256   /* datagrams waiting for erdma_engine_raw_recv */
#define ERDMA_RAW_QUEUE_BYTES (4u << 20)

typedef struct nat_raw {
  struct nat_raw *next;
  struct sockaddr_storage from;
  socklen_t fromlen;
  size_t len;
  uint8_t data[];
} nat_raw;

typedef struct nat_relay {
  int mode;              /* ERDMA_RELAY_*; OFF: no tunnel */
  int active;            /* packets to the peer go through the relay now */
  int turn;              /* index into nat_state.turn */
  uint16_t channel;
  struct sockaddr_storage peer; /* the address the channel is bound to */
  socklen_t peer_len;
  uint64_t quiet_since;  /* FALLBACK: first send, with packets in flight, since the
                            last direct datagram from the peer (0: none) */
  /* FALLBACK on the relay: the direct path is probed with a copy of a QUIC
   * packet at probe_at, the gap doubling up to cfg.direct_recheck */
  uint64_t probe_at, probe_gap;
  uint64_t direct_rx;    /* last authenticated direct datagram from the peer */
} nat_relay;

typedef struct nat_state {
  struct sockaddr_storage turn[ERDMA_MAX_TURN];
  socklen_t turn_len[ERDMA_MAX_TURN];
  int nturn;
  nat_relay *relay;      /* by rank (allocated on the first erdma_engine_set_peer_relay) */
  int *relay_ranks;      /* ranks with a tunnel, nrelay of them */
  int nrelay;
  nat_raw *raw_head, *raw_tail;
  int raw_count;
  size_t raw_bytes;
  uint8_t *txbuf;        /* ChannelData staging: ERDMA_TX_BATCH x (pkt_size + 4) */
} nat_state;

/* nat_classify: the demultiplexer's verdict on a datagram's bytes (no state) */
enum { NAT_QUIC = 0, NAT_RAW, NAT_CHANNEL, NAT_DROP };
int nat_classify(const uint8_t *d, size_t len, int from_turn, uint16_t *ch, size_t *plen);
/* All under e->mu.  nat_rx: 1 if the datagram was STUN/TURN (consumed);
 * nat_sendv: 1 if the packets went through a relay tunnel. */
int nat_rx(erdma_engine *e, const uint8_t *data, size_t len,
           const struct sockaddr_storage *from, socklen_t fromlen);
int nat_sendv(erdma_engine *e, erdma_conn *c, uint8_t *bufs, size_t *lens, int n);
/* bufs NULL: the packets are the backend's zero-copy batch (e->io.tx_buf) */
uint64_t nat_keepalive_ns(erdma_engine *e); /* the QUIC keep-alive interval, 0: off */
/* QUIC packets through a relay stay within what TURN servers carry (coturn
 * relays at most 16 KiB; Internet paths 1500-byte frames): a connection to a
 * peer with a relay tunnel when it is created writes packets of at most this */
#define ERDMA_RELAY_PAYLOAD 1452
size_t nat_max_udp_payload(erdma_engine *e, const erdma_conn *c);
void nat_free(erdma_engine *e);

#endif /* ERDMA_NAT_H */
