/* erdma_pktio_udp.c - packet I/O over a kernel UDP socket: sendmmsg with
 * UDP GSO trains, recvmmsg with UDP GRO.  The engine sees it only through
 * e->io (erdma_pktio.h); other backends fill the same. */
#define _GNU_SOURCE
#include <errno.h>
#include <ifaddrs.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <netinet/udp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/time.h>
#include <unistd.h>

#include "erdma_pktio.h"
#include "erdma_engine.h"

/* A run of same-sized packets (the last may be shorter) leaves as one
 * datagram train with UDP GSO: one sendmmsg entry whose iovecs are the
 * packets, with a UDP_SEGMENT message of their size.  The packets need not
 * fill the stride (a connection may write packets smaller than e->pkt_size,
 * the buffer size: a path with a smaller MTU, a relay). */
static void udp_send(erdma_engine *e, const struct sockaddr_storage *to, socklen_t tolen,
                     uint8_t *bufs, size_t stride, const size_t *lens, int n) {
  struct mmsghdr msgs[ERDMA_TX_BATCH];
  struct iovec iov[ERDMA_TX_BATCH];
  union {
    char buf[CMSG_SPACE(sizeof(uint16_t))];
    struct cmsghdr align;
  } ctl[ERDMA_TX_BATCH];
  int sent = 0, m = 0, waits = 0;
  for (int i = 0; i < n; m++) {
    size_t seg = lens[i];
    /* at most 64 segments (the kernel's limit) and 65000 bytes per train */
    size_t max_run = e->gso && seg ? 65000 / seg : 1;
    if (max_run > 64) max_run = 64;
    int j = i + 1;
    while (j < n && (size_t)(j - i) < max_run && lens[j - 1] == seg && lens[j] <= seg) j++;
    for (int k = i; k < j; k++) {
      iov[k].iov_base = bufs + (size_t)k * stride;
      iov[k].iov_len = lens[k];
    }
    memset(&msgs[m], 0, sizeof msgs[m]);
    msgs[m].msg_hdr.msg_name = (void *)to;
    msgs[m].msg_hdr.msg_namelen = tolen;
    msgs[m].msg_hdr.msg_iov = &iov[i];
    msgs[m].msg_hdr.msg_iovlen = (size_t)(j - i);
    if (j - i > 1) {
      struct cmsghdr *cm = (struct cmsghdr *)ctl[m].buf;
      uint16_t sz = (uint16_t)seg;
      memset(ctl[m].buf, 0, sizeof ctl[m].buf);
      cm->cmsg_level = SOL_UDP;
      cm->cmsg_type = UDP_SEGMENT;
      cm->cmsg_len = CMSG_LEN(sizeof sz);
      memcpy(CMSG_DATA(cm), &sz, sizeof sz);
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

/* A socket bound to "::" is dual-stack: IPv4 senders arrive as v4-mapped
 * IPv6 addresses (::ffff:a.b.c.d).  The engine knows IPv4 peers (and TURN
 * servers) by their IPv4 addresses, so they are handed on as such; sending to
 * an IPv4 address works on such a socket as it is. */
static void unmap_v4(struct sockaddr_storage *a, socklen_t *len) {
  const struct sockaddr_in6 *x = (const void *)a;
  if (a->ss_family != AF_INET6 || !IN6_IS_ADDR_V4MAPPED(&x->sin6_addr)) return;
  struct sockaddr_in v4 = {.sin_family = AF_INET, .sin_port = x->sin6_port};
  memcpy(&v4.sin_addr, &x->sin6_addr.s6_addr[12], 4);
  memset(a, 0, sizeof *a);
  memcpy(a, &v4, sizeof v4);
  *len = sizeof v4;
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
      unmap_v4(&from[i], &msgs[i].msg_hdr.msg_namelen);
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

/* ------------------------------------------------------- packet size
 * Off the loopback, packets are 1452 bytes (QUIC's usual size, which
 * Internet paths carry; ngtcp2's PMTUD probes upward from there) unless the
 * peer is on a directly attached network whose MTU is larger (jumbo frames,
 * a veth pair): then they fill that MTU, up to 65000 bytes, and never exceed
 * it (the kernel keeps DF set: IP_PMTUDISC_WANT, no local fragmentation). */
#define IP4_UDP_HDRS 28
#define IP6_UDP_HDRS 48

static size_t hdrs_of(int family) { return family == AF_INET6 ? IP6_UDP_HDRS : IP4_UDP_HDRS; }

/* 1 when the kernel routes `to` straight out of an interface, without a
 * gateway (asked over rtnetlink, in this thread's network namespace); 0 when
 * through a gateway, not unicast, or unknown. */
static int route_on_link(const struct sockaddr_storage *to) {
  struct {
    struct nlmsghdr nh;
    struct rtmsg rt;
    char attrs[64];
  } req;
  char buf[8192];
  int fam = to->ss_family, alen = fam == AF_INET ? 4 : 16, ok = 0;
  if (fam != AF_INET && fam != AF_INET6) return 0;
  const void *a = fam == AF_INET ? (const void *)&((const struct sockaddr_in *)to)->sin_addr
                                 : (const void *)&((const struct sockaddr_in6 *)to)->sin6_addr;
  memset(&req, 0, sizeof req);
  req.nh.nlmsg_len = NLMSG_LENGTH(sizeof(struct rtmsg));
  req.nh.nlmsg_type = RTM_GETROUTE;
  req.nh.nlmsg_flags = NLM_F_REQUEST;
  req.nh.nlmsg_seq = 1;
  req.rt.rtm_family = (unsigned char)fam;
  req.rt.rtm_dst_len = (unsigned char)(alen * 8);
  struct rtattr *ra = (struct rtattr *)((char *)&req + NLMSG_ALIGN(req.nh.nlmsg_len));
  ra->rta_type = RTA_DST;
  ra->rta_len = (unsigned short)RTA_LENGTH(alen);
  memcpy(RTA_DATA(ra), a, (size_t)alen);
  req.nh.nlmsg_len = NLMSG_ALIGN(req.nh.nlmsg_len) + RTA_ALIGN(ra->rta_len);
  int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (fd < 0) return 0;
  struct timeval tv = {1, 0}; /* the kernel answers at once; never hang on it */
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
  if (sendto(fd, &req, req.nh.nlmsg_len, 0, (struct sockaddr *)&kernel, sizeof kernel) >= 0) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    struct nlmsghdr *nh = (struct nlmsghdr *)buf;
    if (n > 0 && NLMSG_OK(nh, (size_t)n) && nh->nlmsg_type == RTM_NEWROUTE) {
      struct rtmsg *rt = NLMSG_DATA(nh);
      int len = (int)RTM_PAYLOAD(nh);
      ok = rt->rtm_type == RTN_UNICAST;
      for (struct rtattr *x = RTM_RTA(rt); RTA_OK(x, len); x = RTA_NEXT(x, len))
        if (x->rta_type == RTA_GATEWAY || x->rta_type == RTA_VIA || x->rta_type == RTA_MULTIPATH)
          ok = 0;
    }
  }
  close(fd);
  return ok;
}

/* The MTU of the route from our address to `to` (what the kernel would
 * fragment at, learned PMTU included), from a connected probe socket; 0 if
 * unknown. */
static int route_mtu(erdma_engine *e, const struct sockaddr_storage *to, socklen_t tolen) {
  int fd = socket(to->ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0), mtu = 0;
  socklen_t l = sizeof mtu;
  if (fd < 0) return 0;
  if (e->local.ss_family == to->ss_family) { /* the route from the address we send from */
    struct sockaddr_storage src = e->local;
    if (src.ss_family == AF_INET) ((struct sockaddr_in *)&src)->sin_port = 0;
    else ((struct sockaddr_in6 *)&src)->sin6_port = 0;
    if (bind(fd, (struct sockaddr *)&src, e->local_len) != 0) { /* any source then */ }
  }
  if (connect(fd, (const struct sockaddr *)to, tolen) != 0 ||
      getsockopt(fd, to->ss_family == AF_INET6 ? IPPROTO_IPV6 : IPPROTO_IP,
                 to->ss_family == AF_INET6 ? IPV6_MTU : IP_MTU, &mtu, &l) != 0)
    mtu = 0;
  close(fd);
  return mtu;
}

size_t pktio_udp_path_payload(erdma_engine *e, const struct sockaddr_storage *to,
                              socklen_t tolen) {
  size_t hdrs = hdrs_of(to->ss_family);
  if (!route_on_link(to)) return 0;
  int mtu = route_mtu(e, to, tolen);
  if (mtu <= 0 || (size_t)mtu < hdrs + 1200) return 0;
  size_t p = (size_t)mtu - hdrs;
  return p > 65000 ? 65000 : p;
}

/* The largest payload an on-link peer could take from us: the MTU of the
 * interface that holds our address (of any up one when bound to the
 * wildcard) less the headers; 0 if none is found. */
static size_t local_link_payload(erdma_engine *e) {
  struct ifaddrs *ifs, *i;
  size_t best = 0, hdrs = hdrs_of(e->local.ss_family);
  int any = e->local.ss_family == AF_INET
                ? ((struct sockaddr_in *)&e->local)->sin_addr.s_addr == htonl(INADDR_ANY)
                : IN6_IS_ADDR_UNSPECIFIED(&((struct sockaddr_in6 *)&e->local)->sin6_addr);
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  if (getifaddrs(&ifs) != 0) {
    close(fd);
    return 0;
  }
  for (i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != e->local.ss_family) continue;
    if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
    if (!any) {
      int same = e->local.ss_family == AF_INET
          ? ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr ==
                ((struct sockaddr_in *)&e->local)->sin_addr.s_addr
          : IN6_ARE_ADDR_EQUAL(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr,
                               &((struct sockaddr_in6 *)&e->local)->sin6_addr);
      if (!same) continue;
    }
    struct ifreq r;
    memset(&r, 0, sizeof r);
    snprintf(r.ifr_name, sizeof r.ifr_name, "%s", i->ifa_name);
    if (ioctl(fd, SIOCGIFMTU, &r) == 0 && (size_t)r.ifr_mtu > hdrs + best)
      best = (size_t)r.ifr_mtu - hdrs;
  }
  freeifaddrs(ifs);
  close(fd);
  return best > 65000 ? 65000 : best;
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
  /* no SO_REUSEADDR: UDP has no TIME_WAIT to skip, and with it on two
   * sockets bound to port 0 may be given the same port (Linux picks a port
   * only those without it hold), so that a rank would receive another's
   * packets */
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
  /* e->pkt_size: the largest packet any connection may write (the buffers'
   * size); each connection takes the size of its own path (fill_settings,
   * engine_conn_payload) */
  if (cfg->max_udp_payload) {
    e->pkt_size = cfg->max_udp_payload;
  } else if (addr_is_loopback(&e->local)) {
    e->pkt_size = 65000;
  } else {
    size_t link = local_link_payload(e);
    e->pkt_size = link > 1452 ? link : 1452;
  }
  if (e->pkt_size < 1200) e->pkt_size = 1200;
  if (e->pkt_size > 65000) e->pkt_size = 65000;
  /* probe UDP GSO; without it each packet is its own sendmmsg entry */
  int seg = 1200;
  e->gso = setsockopt(e->fd, SOL_UDP, UDP_SEGMENT, &seg, sizeof seg) == 0;
  seg = 0;
  if (e->gso) setsockopt(e->fd, SOL_UDP, UDP_SEGMENT, &seg, sizeof seg);
  /* coalesced receive (a GSO train on a veth arrives as one buffer);
   * loopback's 64 KiB packets gain nothing from it */
  if (e->pkt_size <= 9000 || !addr_is_loopback(&e->local))
    e->gro = setsockopt(e->fd, SOL_UDP, UDP_GRO, &one, sizeof one) == 0;
  return 0;
}
