/* erdma_nat.c - NAT traversal on the engine's UDP socket.
 *
 * Demultiplexing (RFC 9443 in spirit, docs/wire.md): STUN messages and
 * whatever a registered TURN server sends besides ChannelData of a bound
 * channel go to a bounded queue that the Python NAT code (STUN, TURN, ICE)
 * reads with erdma_engine_raw_recv; ChannelData of a bound channel is
 * unwrapped and handed to QUIC as if it came from the peer's QUIC address;
 * everything else is QUIC.
 *
 * Relay tunnels: QUIC packets to a peer with a relay go out as
 * ChannelData(channel) to the TURN server, always (ERDMA_RELAY_ALWAYS) or
 * once the direct path has been silent for cfg.path_timeout with packets in
 * flight (ERDMA_RELAY_FALLBACK).  ngtcp2 never sees the physical route: its
 * path stays the peer's QUIC address, so switching needs no migration and
 * QUIC's own retransmission covers what the dead path lost. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "erdma_nat.h"
#include "erdma_conn.h"
#include "erdma_engine.h"
#include "erdma_pktio.h"
#include "erdma_quic.h"
#include "erdma_shm.h"

#define STUN_MAGIC 0x2112A442u
#define CHANNEL_MIN 0x4000
#define CHANNEL_MAX 0x4FFF

static int turn_index(const nat_state *s, const struct sockaddr_storage *a) {
  for (int i = 0; i < s->nturn; i++)
    if (addr_equal(&s->turn[i], a)) return i;
  return -1;
}

/* ------------------------------------------------------ classification */
/* RFC 8489 section 6: first two bits 0, magic cookie, length a multiple of
 * 4 that covers exactly the rest of the datagram. */
static int is_stun(const uint8_t *d, size_t len) {
  if (len < 20 || (d[0] & 0xC0) != 0) return 0;
  uint32_t cookie = (uint32_t)d[4] << 24 | (uint32_t)d[5] << 16 | (uint32_t)d[6] << 8 | d[7];
  size_t mlen = (size_t)d[2] << 8 | d[3];
  return cookie == STUN_MAGIC && (mlen & 3) == 0 && mlen + 20 == len;
}

/* RFC 8656 section 12.4: channel number 0x4000..0x4FFF, then the length of
 * the application data; over UDP up to 3 bytes of padding may follow. */
static int channel_data(const uint8_t *d, size_t len, uint16_t *ch, size_t *plen) {
  if (len < 4 || (d[0] & 0xF0) != 0x40) return 0;
  *ch = (uint16_t)(d[0] << 8 | d[1]);
  *plen = (size_t)d[2] << 8 | d[3];
  return *plen + 4 <= len && len <= *plen + 4 + 3;
}

/* What nat_rx does with a datagram, from its bytes alone and whether it came
 * from a registered TURN server: QUIC (plain), RAW (for raw_recv), CHANNEL
 * (ChannelData: *ch and the payload's length *plen, which lies within the
 * datagram behind its 4-byte header; the caller looks the channel up) or
 * DROP.  No sockets: fuzz/c/fuzz_nat_demux.c drives it and nat_rx. */
int nat_classify(const uint8_t *d, size_t len, int from_turn, uint16_t *ch, size_t *plen) {
  if (len == 0) return NAT_DROP; /* nothing for anyone (ngtcp2 asserts on empty input) */
  if (from_turn) return channel_data(d, len, ch, plen) ? NAT_CHANNEL : NAT_RAW;
  return is_stun(d, len) ? NAT_RAW : NAT_QUIC;
}

/* -------------------------------------------------------------- raw queue */
static void raw_push(erdma_engine *e, const uint8_t *data, size_t len,
                     const struct sockaddr_storage *from, socklen_t fromlen) {
  nat_state *s = &e->nat;
  nat_raw *m;
  if (s->raw_count >= ERDMA_RAW_QUEUE_MAX || s->raw_bytes + len > ERDMA_RAW_QUEUE_BYTES ||
      !(m = malloc(sizeof *m + len))) {
    e->stats.raw_dropped++;
    return;
  }
  m->next = NULL;
  memcpy(&m->from, from, fromlen < sizeof m->from ? fromlen : sizeof m->from);
  m->fromlen = fromlen;
  m->len = len;
  memcpy(m->data, data, len);
  if (s->raw_tail) s->raw_tail->next = m; else s->raw_head = m;
  s->raw_tail = m;
  s->raw_count++;
  s->raw_bytes += len;
  e->stats.raw_queued++;
  pthread_cond_broadcast(&e->cv);
}

static nat_raw *raw_pop(nat_state *s) {
  nat_raw *m = s->raw_head;
  if (!m) return NULL;
  s->raw_head = m->next;
  if (!s->raw_head) s->raw_tail = NULL;
  s->raw_count--;
  s->raw_bytes -= m->len;
  return m;
}

/* ------------------------------------------------------------ relay tunnels */
/* The address ngtcp2 knows the peer by: its connection's path if there is
 * one (a server-side connection keeps the address its first packet came
 * from), else the address of erdma_engine_set_peer. */
static const struct sockaddr_storage *quic_addr(erdma_engine *e, int rank, socklen_t *len) {
  erdma_conn *c = e->peers[rank].conn;
  if (c && !c->shm && c->remote_len) {
    *len = c->remote_len;
    return &c->remote;
  }
  *len = e->peers[rank].addr_len;
  return &e->peers[rank].addr;
}

static int relay_of_conn(erdma_engine *e, const erdma_conn *c) {
  nat_state *s = &e->nat;
  if (c->peer >= 0) return s->relay[c->peer].mode != ERDMA_RELAY_OFF ? c->peer : -1;
  for (int i = 0; i < s->nrelay; i++) { /* a server connection before its HELLO */
    socklen_t l;
    if (addr_equal(quic_addr(e, s->relay_ranks[i], &l), &c->remote)) return s->relay_ranks[i];
  }
  return -1;
}

/* The first probe of the direct path goes this long after a move to the
 * relay; each unanswered one doubles the gap, up to cfg.direct_recheck. */
#define PROBE_FIRST_NS 250000000ull

static void probe_restart(nat_relay *r) {
  r->probe_gap = PROBE_FIRST_NS;
  r->probe_at = erdma_now() + PROBE_FIRST_NS;
}

static void relay_activate(erdma_engine *e, int rank, const char *why) {
  nat_relay *r = &e->nat.relay[rank];
  if (r->active) return;
  r->active = 1;
  probe_restart(r);
  if (r->mode == ERDMA_RELAY_FALLBACK) e->stats.to_relay++;
  if (e->cfg.verbose >= 1)
    fprintf(stderr, "erdma[%d]: rank %d: %s; QUIC now goes through the TURN relay\n",
            e->cfg.rank, rank, why);
}

/* A FALLBACK tunnel on the relay whose peer's packets come straight again:
 * the direct path works (NAT bindings and firewalls pass both ways, which
 * our own probes keep open), so QUIC goes back to it.  Should it fail after
 * all, the silence check moves it to the relay again. */
static void relay_deactivate(erdma_engine *e, int rank) {
  nat_relay *r = &e->nat.relay[rank];
  r->active = 0;
  r->quiet_since = 0;
  e->stats.to_direct++;
  if (e->cfg.verbose >= 1)
    fprintf(stderr, "erdma[%d]: rank %d: the direct path answers again; QUIC leaves the "
            "TURN relay\n", e->cfg.rank, rank);
}

/* On the relay, a copy of one QUIC packet goes the direct way now and then:
 * ngtcp2 drops the duplicate, and the peer learns from it that the direct
 * path carries packets again. */
static void direct_probe(erdma_engine *e, erdma_conn *c, nat_relay *r, uint8_t *pkt,
                         size_t len) {
  uint64_t cap = (uint64_t)(e->cfg.direct_recheck * 1e9), now;
  if (r->mode != ERDMA_RELAY_FALLBACK || cap == 0 || c->peer < 0 ||
      (now = erdma_now()) < r->probe_at)
    return;
  socklen_t alen;
  const struct sockaddr_storage *a = quic_addr(e, c->peer, &alen);
  size_t one = len;
  /* through the backend's copying path: a zero-copy batch is not ours to split */
  e->io.send(e, a, alen, pkt, len, &one, 1);
  e->stats.direct_probes++;
  r->probe_gap = r->probe_gap * 2 < cap ? r->probe_gap * 2 : cap;
  r->probe_at = now + r->probe_gap;
}

/* FALLBACK: the direct path is dead once it has been silent for
 * path_timeout while ack-eliciting packets were outstanding (ACK-only
 * packets expect no answer, so an idle connection never trips it). */
static void fallback_check(erdma_engine *e, erdma_conn *c, nat_relay *r, int rank) {
  ngtcp2_conn_stat cs;
  uint64_t now = erdma_now();
  if (!c->q) return;
  erdma_quic_stat(c->q, &cs);
  if (cs.bytes_in_flight == 0) {
    r->quiet_since = 0;
  } else if (!r->quiet_since) {
    r->quiet_since = now;
  } else if (now - r->quiet_since > (uint64_t)(e->cfg.path_timeout * 1e9)) {
    char why[96];
    snprintf(why, sizeof why, "direct path silent for %.1f s",
             (double)(now - r->quiet_since) / 1e9);
    relay_activate(e, rank, why);
  }
}

int nat_sendv(erdma_engine *e, erdma_conn *c, uint8_t *bufs, size_t *lens, int n) {
  nat_state *s = &e->nat;
  int rank = relay_of_conn(e, c);
  if (rank < 0) return 0;
  nat_relay *r = &s->relay[rank];
  /* only the peer's own connections tell whether its direct path lives: an
   * unnamed one may be anyone's, sending as the peer's address */
  if (!r->active && r->mode == ERDMA_RELAY_FALLBACK && c->peer >= 0)
    fallback_check(e, c, r, rank);
  if (!r->active) return 0;
  /* bufs NULL: the backend's zero-copy batch, whose buffers it hands out again */
  direct_probe(e, c, r, bufs ? bufs : e->io.tx_buf(e, 0, n), lens[0]);
  if (r->turn < 0) { /* no allocation of ours: plain to the peer's relayed address */
    if (!bufs)
      e->io.tx_commit(e, &r->peer, r->peer_len, 0, lens, n);
    else
      e->io.send(e, &r->peer, r->peer_len, bufs, e->pkt_size, lens, n);
    e->stats.relay_sent += (uint64_t)n;
    return 1;
  }
  size_t stride = e->pkt_size + 4, rlens[ERDMA_TX_BATCH];
  if (!bufs) { /* zero-copy batch: each header goes in the room in front of its packet */
    for (int i = 0; i < n; i++) {
      uint8_t *out = e->io.tx_buf(e, i, n) - ERDMA_TX_PREFIX;
      out[0] = (uint8_t)(r->channel >> 8);
      out[1] = (uint8_t)r->channel;
      out[2] = (uint8_t)(lens[i] >> 8);
      out[3] = (uint8_t)lens[i];
      rlens[i] = lens[i] + ERDMA_TX_PREFIX;
    }
    e->io.tx_commit(e, &s->turn[r->turn], s->turn_len[r->turn], ERDMA_TX_PREFIX, rlens, n);
    e->stats.relay_sent += (uint64_t)n;
    return 1;
  }
  if (!s->txbuf && !(s->txbuf = malloc((size_t)ERDMA_TX_BATCH * stride))) return 0;
  /* each packet gets its own header; a run of equal-sized ones may still
   * leave as a GSO train, whose segments are whole ChannelData messages */
  for (int i = 0; i < n; i++) {
    uint8_t *out = s->txbuf + (size_t)i * stride;
    out[0] = (uint8_t)(r->channel >> 8);
    out[1] = (uint8_t)r->channel;
    out[2] = (uint8_t)(lens[i] >> 8);
    out[3] = (uint8_t)lens[i];
    memcpy(out + 4, bufs + (size_t)i * e->pkt_size, lens[i]);
    rlens[i] = lens[i] + 4;
  }
  e->io.send(e, &s->turn[r->turn], s->turn_len[r->turn], s->txbuf, stride, rlens, n);
  e->stats.relay_sent += (uint64_t)n;
  return 1;
}

/* The fallback relay whose peer has QUIC address `a`, if any. */
static int fallback_of_addr(erdma_engine *e, const struct sockaddr_storage *a) {
  nat_state *s = &e->nat;
  for (int i = 0; i < s->nrelay; i++) {
    nat_relay *r = &s->relay[s->relay_ranks[i]];
    socklen_t l;
    if (r->mode == ERDMA_RELAY_FALLBACK &&
        addr_equal(quic_addr(e, s->relay_ranks[i], &l), a))
      return s->relay_ranks[i];
  }
  return -1;
}

/* Hand a datagram to QUIC; 1 if ngtcp2 authenticated a packet in it (so it
 * really came from the peer, not from someone spoofing an address). */
static int quic_rx(erdma_engine *e, const uint8_t *data, size_t len,
                   const struct sockaddr_storage *from, socklen_t fromlen) {
  uint64_t before = conn_decrypted_count();
  conn_handle_datagram(e, data, len, from, fromlen);
  return conn_decrypted_count() != before;
}

static void relay_rx(erdma_engine *e, int rank, const uint8_t *data, size_t len) {
  nat_relay *r = &e->nat.relay[rank];
  socklen_t alen;
  struct sockaddr_storage a = *quic_addr(e, rank, &alen); /* (the conn may go away) */
  e->stats.relay_recv++;
  /* a peer that uses the relay lost the direct path: answer it there too,
   * unless its packets also came straight lately (then it is the one still
   * moving back to the direct path, or these were in flight) */
  if (quic_rx(e, data, len, &a, alen) && r->mode == ERDMA_RELAY_FALLBACK &&
      erdma_now() - r->direct_rx > (uint64_t)(e->cfg.path_timeout * 1e9))
    relay_activate(e, rank, "the peer switched to the relay");
}

int nat_rx(erdma_engine *e, const uint8_t *data, size_t len,
           const struct sockaddr_storage *from, socklen_t fromlen) {
  nat_state *s = &e->nat;
  int t = s->nturn ? turn_index(s, from) : -1;
  uint16_t ch = 0;
  size_t plen = 0;
  int kind = nat_classify(data, len, t >= 0, &ch, &plen);
  if (kind == NAT_DROP) return 1;
  if (kind == NAT_CHANNEL)
    for (int i = 0; i < s->nrelay; i++) {
      nat_relay *r = &s->relay[s->relay_ranks[i]];
      if (r->turn == t && r->channel == ch) {
        if (plen) relay_rx(e, s->relay_ranks[i], data + 4, plen);
        return 1;
      }
    }
  if (kind != NAT_QUIC) {
    /* STUN; from a TURN server also Data indications and unbound channels */
    raw_push(e, data, len, from, fromlen);
    return 1;
  }
  for (int i = 0; i < s->nrelay; i++) { /* from a peer's relayed address we send to */
    nat_relay *r = &s->relay[s->relay_ranks[i]];
    if (r->turn < 0 && addr_equal(&r->peer, from)) {
      relay_rx(e, s->relay_ranks[i], data, len);
      return 1;
    }
  }
  int rank = s->nrelay ? fallback_of_addr(e, from) : -1;
  if (rank < 0) return 0; /* plain QUIC: the caller hands it on */
  /* the direct path of a fallback relay: alive while the peer's own 1-RTT
   * packets come (anyone can send a valid Initial from its address) */
  if (conn_handle_datagram(e, data, len, from, fromlen) && s->relay) {
    nat_relay *r = &s->relay[rank];
    r->quiet_since = 0;
    r->direct_rx = erdma_now();
    if (r->active && e->cfg.direct_recheck > 0) relay_deactivate(e, rank);
  }
  return 1;
}

size_t nat_max_udp_payload(erdma_engine *e, const erdma_conn *c) {
  if (e->nat.nrelay && e->pkt_size > ERDMA_RELAY_PAYLOAD && relay_of_conn(e, c) >= 0)
    return ERDMA_RELAY_PAYLOAD;
  return e->pkt_size;
}

uint64_t nat_keepalive_ns(erdma_engine *e) {
  double k = e->cfg.keepalive;
  if (k == 0) return 0;
  if (k < 0) k = e->cfg.idle_timeout / 4;
  return (uint64_t)(k * 1e9);
}

void nat_free(erdma_engine *e) {
  nat_state *s = &e->nat;
  nat_raw *m;
  while ((m = raw_pop(s))) free(m);
  free(s->relay);
  free(s->relay_ranks);
  free(s->txbuf);
  memset(s, 0, sizeof *s);
}

/* ------------------------------------------------------------ public API */
int erdma_engine_raw_send(erdma_engine *e, const uint8_t *data, size_t len, const char *host,
                          int port) {
  struct sockaddr_storage to;
  socklen_t tolen;
  if (!e || (!data && len) || len > 65507) return ERDMA_ERR_INVAL;
  if (addr_resolve(host, port, &to, &tolen) != 0) return ERDMA_ERR_INVAL;
  /* a socket bound to "::" is dual-stack and sends to IPv4 addresses too */
  int dual = e->local.ss_family == AF_INET6 &&
             IN6_IS_ADDR_UNSPECIFIED(&((struct sockaddr_in6 *)&e->local)->sin6_addr);
  if (to.ss_family != e->local.ss_family && !(dual && to.ss_family == AF_INET))
    return ERDMA_ERR_INVAL;
  uint8_t *copy = malloc(len ? len : 1); /* backends take a writable run */
  if (!copy) return ERDMA_ERR_NOMEM;
  if (len) memcpy(copy, data, len);
  pthread_mutex_lock(&e->mu);
  e->io.send(e, &to, tolen, copy, len ? len : 1, &len, 1);
  pthread_mutex_unlock(&e->mu);
  free(copy);
  return 0;
}

static void wait_until(erdma_engine *e, uint64_t deadline) {
  struct timespec ts = {(time_t)(deadline / 1000000000ull), (long)(deadline % 1000000000ull)};
  pthread_cond_timedwait(&e->cv, &e->mu, &ts);
}

int erdma_engine_raw_recv(erdma_engine *e, uint8_t *buf, size_t cap, size_t *len, char *host,
                          size_t hostcap, int *port, double timeout) {
  if (!e || (!buf && cap) || !len || !port) return ERDMA_ERR_INVAL;
  uint64_t deadline = timeout < 0 ? UINT64_MAX : erdma_now() + (uint64_t)(timeout * 1e9);
  nat_raw *m = NULL;
  pthread_mutex_lock(&e->mu);
  for (;;) {
    if ((m = raw_pop(&e->nat))) break;
    if (!e->running) {
      /* no progress thread (before connect, or a world of one): read the
       * socket here; QUIC packets go their usual way */
      e->io.recv(e);
      if ((m = raw_pop(&e->nat))) break;
    }
    uint64_t now = erdma_now();
    if (now >= deadline) break;
    uint64_t until = deadline - now > 50000000ull ? now + 50000000ull : deadline;
    if (e->running) {
      wait_until(e, until);
    } else {
      int fd = e->io.fd;
      pthread_mutex_unlock(&e->mu);
      if (fd >= 0) {
        struct pollfd p = {fd, POLLIN, 0};
        int ms = (int)((until - now + 999999) / 1000000);
        poll(&p, 1, ms);
      } else {
        struct timespec nap = {0, 200000}; /* a polled backend: look again soon */
        nanosleep(&nap, NULL);
      }
      pthread_mutex_lock(&e->mu);
    }
  }
  pthread_mutex_unlock(&e->mu);
  if (!m) return ERDMA_ERR_TIMEOUT;
  *len = m->len;
  if (cap) memcpy(buf, m->data, m->len < cap ? m->len : cap);
  addr_format(&m->from, host, hostcap, port);
  int rv = m->len > cap ? ERDMA_ERR_TRUNCATE : 0;
  free(m);
  return rv;
}

int erdma_engine_add_turn_server(erdma_engine *e, const char *host, int port) {
  struct sockaddr_storage a;
  socklen_t alen;
  if (!e || port <= 0 || addr_resolve(host, port, &a, &alen) != 0) return ERDMA_ERR_INVAL;
  pthread_mutex_lock(&e->mu);
  nat_state *s = &e->nat;
  int rv = 0;
  if (turn_index(s, &a) < 0) {
    if (s->nturn >= ERDMA_MAX_TURN) {
      rv = ERDMA_ERR_INVAL;
    } else {
      s->turn[s->nturn] = a;
      s->turn_len[s->nturn++] = alen;
    }
  }
  pthread_mutex_unlock(&e->mu);
  return rv;
}

int erdma_engine_set_peer_relay(erdma_engine *e, int rank, const char *turn_host,
                                int turn_port, int channel, const char *peer_host,
                                int peer_port, int mode) {
  struct sockaddr_storage ta, pa;
  socklen_t tlen, plen = 0;
  if (!e) return ERDMA_ERR_INVAL;
  if (rank < 0 || rank >= e->cfg.size || rank == e->cfg.rank) return ERDMA_ERR_RANK;
  if (mode != ERDMA_RELAY_OFF && mode != ERDMA_RELAY_ALWAYS && mode != ERDMA_RELAY_FALLBACK &&
      mode != ERDMA_RELAY_FIRST)
    return ERDMA_ERR_INVAL;
  int plain = !turn_host || !turn_host[0];
  if (plain && mode == ERDMA_RELAY_FALLBACK) return ERDMA_ERR_INVAL;
  if (mode != ERDMA_RELAY_OFF) {
    if ((!plain && (channel < CHANNEL_MIN || channel > CHANNEL_MAX || turn_port <= 0 ||
                    addr_resolve(turn_host, turn_port, &ta, &tlen) != 0)) ||
        !peer_host || addr_resolve(peer_host, peer_port, &pa, &plen) != 0)
      return ERDMA_ERR_INVAL;
  }
  pthread_mutex_lock(&e->mu);
  nat_state *s = &e->nat;
  int rv = 0;
  if (!s->relay) {
    s->relay = calloc((size_t)e->cfg.size, sizeof *s->relay);
    s->relay_ranks = calloc((size_t)e->cfg.size, sizeof *s->relay_ranks);
    if (!s->relay || !s->relay_ranks) {
      free(s->relay);
      free(s->relay_ranks);
      s->relay = NULL;
      s->relay_ranks = NULL;
      rv = ERDMA_ERR_NOMEM;
      goto out;
    }
  }
  nat_relay *r = &s->relay[rank];
  int had = r->mode != ERDMA_RELAY_OFF;
  if (mode == ERDMA_RELAY_OFF) {
    if (had)
      for (int i = 0; i < s->nrelay; i++)
        if (s->relay_ranks[i] == rank) {
          s->relay_ranks[i] = s->relay_ranks[--s->nrelay];
          break;
        }
    memset(r, 0, sizeof *r);
    goto out;
  }
  int t = plain ? -1 : turn_index(s, &ta);
  if (t < 0 && !plain) {
    if (s->nturn >= ERDMA_MAX_TURN) {
      rv = ERDMA_ERR_INVAL;
      goto out;
    }
    t = s->nturn++;
    s->turn[t] = ta;
    s->turn_len[t] = tlen;
  }
  for (int i = 0; i < s->nrelay; i++) { /* a channel names one peer */
    nat_relay *o = &s->relay[s->relay_ranks[i]];
    if (!plain && s->relay_ranks[i] != rank && o->turn == t && o->channel == channel) {
      rv = ERDMA_ERR_INVAL;
      goto out;
    }
  }
  r->mode = mode == ERDMA_RELAY_FIRST ? ERDMA_RELAY_FALLBACK : mode;
  r->turn = t;
  r->channel = plain ? 0 : (uint16_t)channel;
  r->peer = pa;
  r->peer_len = plen;
  r->active = mode == ERDMA_RELAY_ALWAYS || mode == ERDMA_RELAY_FIRST;
  r->quiet_since = 0;
  r->direct_rx = 0;
  probe_restart(r);
  if (!had) s->relay_ranks[s->nrelay++] = rank;
  if (!e->peers[rank].known && !e->peers[rank].addr_len) {
    /* a QUIC address until erdma_engine_set_peer gives one */
    e->peers[rank].addr = pa;
    e->peers[rank].addr_len = plen;
  }
out:
  pthread_mutex_unlock(&e->mu);
  return rv;
}

int erdma_engine_peer_route(erdma_engine *e, int rank, int *route) {
  if (!e || !route) return ERDMA_ERR_INVAL;
  if (rank < 0 || rank >= e->cfg.size) return ERDMA_ERR_RANK;
  pthread_mutex_lock(&e->mu);
  erdma_conn *c = e->peers[rank].conn;
  if (rank == e->cfg.rank)
    *route = ERDMA_ROUTE_SELF;
  else if ((c && c->shm) || (e->shm.seg && shm_is_local(e, rank) >= 0))
    *route = ERDMA_ROUTE_SHM;
  else if (e->nat.relay && e->nat.relay[rank].active)
    *route = ERDMA_ROUTE_RELAY;
  else
    *route = ERDMA_ROUTE_DIRECT;
  pthread_mutex_unlock(&e->mu);
  return 0;
}
