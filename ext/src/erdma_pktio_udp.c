/* erdma_pktio_udp.c - packet I/O over a kernel UDP socket: sendmmsg with
 * UDP GSO trains, recvmmsg with UDP GRO.  The engine sees it only through
 * e->io (erdma_internal.h, "packet I/O"); other backends fill the same. */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/udp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "erdma_internal.h"

/* A run of full-size packets is contiguous in bufs, so with UDP GSO it leaves
 * in one datagram train (one sendmmsg entry with a UDP_SEGMENT message). */
static void udp_send(erdma_engine *e, const struct sockaddr_storage *to, socklen_t tolen,
                     uint8_t *bufs, size_t stride, const size_t *lens, int n) {
  struct mmsghdr msgs[ERDMA_TX_BATCH];
  struct iovec iov[ERDMA_TX_BATCH];
  union {
    char buf[CMSG_SPACE(sizeof(uint16_t))];
    struct cmsghdr align;
  } ctl[ERDMA_TX_BATCH];
  int sent = 0, m = 0, waits = 0;
  size_t max_run = e->gso ? 65000 / stride : 1; /* <= 64 segments (kernel limit) */
  if (max_run > 64) max_run = 64;
  for (int i = 0; i < n; m++) {
    int j = i + 1;
    if (lens[i] == stride)
      while (j < n && (size_t)(j - i) < max_run && lens[j - 1] == stride) j++;
    iov[m].iov_base = bufs + (size_t)i * stride;
    iov[m].iov_len = (size_t)(j - i - 1) * stride + lens[j - 1];
    memset(&msgs[m], 0, sizeof msgs[m]);
    msgs[m].msg_hdr.msg_name = (void *)to;
    msgs[m].msg_hdr.msg_namelen = tolen;
    msgs[m].msg_hdr.msg_iov = &iov[m];
    msgs[m].msg_hdr.msg_iovlen = 1;
    if (j - i > 1) {
      struct cmsghdr *cm = (struct cmsghdr *)ctl[m].buf;
      uint16_t seg = (uint16_t)stride;
      memset(ctl[m].buf, 0, sizeof ctl[m].buf);
      cm->cmsg_level = SOL_UDP;
      cm->cmsg_type = UDP_SEGMENT;
      cm->cmsg_len = CMSG_LEN(sizeof seg);
      memcpy(CMSG_DATA(cm), &seg, sizeof seg);
      msgs[m].msg_hdr.msg_control = ctl[m].buf;
      msgs[m].msg_hdr.msg_controllen = sizeof ctl[m].buf;
    }
    i = j;
  }
  n = m;
  while (sent < n) {
    int rv = sendmmsg(e->fd, msgs + sent, (unsigned)(n - sent), 0);
    if (rv < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == ENOBUFS) {
        /* socket buffer full: wait briefly rather than drop (QUIC would
         * recover, but a loss costs the congestion window) */
        struct pollfd p = {e->fd, POLLOUT, 0};
        if (++waits <= 100 && poll(&p, 1, 10) > 0) continue;
      }
      break; /* dropped; QUIC retransmits */
    }
    sent += rv;
  }
}

/* With UDP GRO the kernel may hand us several same-sized datagrams from one
 * sender in one buffer; a control message gives the segment size. */
static void udp_recv(erdma_engine *e) {
  struct mmsghdr msgs[ERDMA_BATCH];
  struct iovec iov[ERDMA_BATCH];
  struct sockaddr_storage from[ERDMA_BATCH];
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } ctl[ERDMA_BATCH];
  for (int round = 0; round < 8; round++) {
    for (int i = 0; i < ERDMA_BATCH; i++) {
      iov[i].iov_base = e->rxbuf + (size_t)i * 65536;
      iov[i].iov_len = 65536;
      memset(&msgs[i], 0, sizeof msgs[i]);
      msgs[i].msg_hdr.msg_name = &from[i];
      msgs[i].msg_hdr.msg_namelen = sizeof from[i];
      msgs[i].msg_hdr.msg_iov = &iov[i];
      msgs[i].msg_hdr.msg_iovlen = 1;
      if (e->gro) {
        msgs[i].msg_hdr.msg_control = ctl[i].buf;
        msgs[i].msg_hdr.msg_controllen = sizeof ctl[i].buf;
      }
    }
    int n = recvmmsg(e->fd, msgs, ERDMA_BATCH, MSG_DONTWAIT, NULL);
    if (n <= 0) return;
    for (int i = 0; i < n; i++) {
      size_t len = msgs[i].msg_len, seg = len;
      if (e->gro) {
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msgs[i].msg_hdr); cm;
             cm = CMSG_NXTHDR(&msgs[i].msg_hdr, cm))
          if (cm->cmsg_level == SOL_UDP && cm->cmsg_type == UDP_GRO) {
            int v;
            memcpy(&v, CMSG_DATA(cm), sizeof v);
            if (v > 0) seg = (size_t)v;
          }
      }
      for (size_t off = 0; off < len; off += seg) {
        size_t l = len - off < seg ? len - off : seg;
        engine_rx_datagram(e, (uint8_t *)iov[i].iov_base + off, l, &from[i],
                           msgs[i].msg_hdr.msg_namelen);
      }
    }
    if (n < ERDMA_BATCH) return;
  }
}

static void udp_close(erdma_engine *e) {
  if (e->fd >= 0) close(e->fd);
  e->fd = e->io.fd = -1;
}

/* Binds e->local (resolved by the caller), sizes the socket buffers, picks
 * the packet size and probes GSO/GRO. */
int pktio_udp_open(erdma_engine *e) {
  const erdma_config *cfg = &e->cfg;
  int one = 1;
  e->io.name = "udp";
  e->io.send = udp_send;
  e->io.recv = udp_recv;
  e->io.close = udp_close;
  e->io.fd = e->fd = socket(e->local.ss_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (e->fd < 0) return ERDMA_ERR_SOCKET;
  setsockopt(e->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (cfg->sock_buf > 0) {
    /* FORCE works as root (CAP_NET_ADMIN) and ignores rmem_max/wmem_max;
     * otherwise the kernel caps the request at those limits */
    int got_r = 0, got_s = 0;
    socklen_t l = sizeof(int);
    if (setsockopt(e->fd, SOL_SOCKET, SO_RCVBUFFORCE, &cfg->sock_buf, sizeof(int)) != 0)
      setsockopt(e->fd, SOL_SOCKET, SO_RCVBUF, &cfg->sock_buf, sizeof(int));
    if (setsockopt(e->fd, SOL_SOCKET, SO_SNDBUFFORCE, &cfg->sock_buf, sizeof(int)) != 0)
      setsockopt(e->fd, SOL_SOCKET, SO_SNDBUF, &cfg->sock_buf, sizeof(int));
    getsockopt(e->fd, SOL_SOCKET, SO_RCVBUF, &got_r, &l);
    l = sizeof(int);
    getsockopt(e->fd, SOL_SOCKET, SO_SNDBUF, &got_s, &l);
    if (cfg->verbose && (got_r < cfg->sock_buf || got_s < cfg->sock_buf))
      fprintf(stderr, "erdma[%d]: UDP buffers %d/%d bytes (asked %d; raise "
              "net.core.rmem_max/wmem_max or run with CAP_NET_ADMIN)\n",
              cfg->rank, got_r, got_s, cfg->sock_buf);
  }
  if (bind(e->fd, (struct sockaddr *)&e->local, e->local_len) != 0) return ERDMA_ERR_SOCKET;
  e->local_len = sizeof e->local;
  getsockname(e->fd, (struct sockaddr *)&e->local, &e->local_len);
  e->pkt_size = cfg->max_udp_payload ? cfg->max_udp_payload
                                     : (addr_is_loopback(&e->local) ? 65000 : 1452);
  if (e->pkt_size < 1200) e->pkt_size = 1200;
  if (e->pkt_size > 65000) e->pkt_size = 65000;
  if (e->pkt_size <= 9000) {
    /* probe UDP GSO; without it each packet is its own sendmmsg entry */
    int seg = (int)e->pkt_size;
    e->gso = setsockopt(e->fd, SOL_UDP, UDP_SEGMENT, &seg, sizeof seg) == 0;
    seg = 0;
    if (e->gso) setsockopt(e->fd, SOL_UDP, UDP_SEGMENT, &seg, sizeof seg);
    /* coalesced receive; loopback's 64 KiB packets gain nothing from it */
    e->gro = setsockopt(e->fd, SOL_UDP, UDP_GRO, &one, sizeof one) == 0;
  }
  return 0;
}
