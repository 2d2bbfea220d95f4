/* udpflow.c - a plain UDP flow through a TURN relay, as fast as one core
 * sends it, for bench/nat_relay_bw.py: what coturn itself forwards, to set
 * QUIC's relayed throughput against.
 *
 *   udpflow send FD SERVER_IP SERVER_PORT CHANNEL PAYLOAD SECONDS
 *       FD: an inherited UDP socket holding a TURN allocation with CHANNEL
 *       bound to the receiver; sends ChannelData(CHANNEL, PAYLOAD bytes) to
 *       the server in sendmmsg batches for SECONDS; prints what it sent.
 *   udpflow recv BIND_IP PORT SECONDS
 *       counts what arrives for SECONDS after the first datagram; prints
 *       "recv BYTES DATAGRAMS SECONDS MB/s".
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BATCH 64

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int flow_send(int fd, const char *ip, int port, int channel, int payload, double secs) {
  struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  if (inet_pton(AF_INET, ip, &to.sin_addr) != 1 || payload < 1 || payload > 16000) return 2;
  size_t len = 4 + (size_t)payload;
  uint8_t *buf = calloc(1, len);
  if (!buf) return 2;
  buf[0] = (uint8_t)(channel >> 8);
  buf[1] = (uint8_t)channel;
  buf[2] = (uint8_t)(payload >> 8);
  buf[3] = (uint8_t)payload;
  struct mmsghdr msgs[BATCH];
  struct iovec iov[BATCH];
  for (int i = 0; i < BATCH; i++) {
    iov[i].iov_base = buf;
    iov[i].iov_len = len;
    memset(&msgs[i], 0, sizeof msgs[i]);
    msgs[i].msg_hdr.msg_name = &to;
    msgs[i].msg_hdr.msg_namelen = sizeof to;
    msgs[i].msg_hdr.msg_iov = &iov[i];
    msgs[i].msg_hdr.msg_iovlen = 1;
  }
  unsigned long long sent = 0;
  double t0 = now(), end = t0 + secs;
  while (now() < end) {
    int n = sendmmsg(fd, msgs, BATCH, 0);
    if (n > 0) sent += (unsigned long long)n;
  }
  printf("send %llu %d %.3f\n", sent, payload, now() - t0);
  free(buf);
  return 0;
}

static int flow_recv(const char *ip, int port, double secs) {
  int fd = socket(AF_INET, SOCK_DGRAM, 0), big = 8 << 20;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  if (fd < 0 || inet_pton(AF_INET, ip, &a.sin_addr) != 1) return 2;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof big);
  if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) return 2;
  struct timeval tv = {0, 200000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  static uint8_t bufs[BATCH][2048];
  struct mmsghdr msgs[BATCH];
  struct iovec iov[BATCH];
  for (int i = 0; i < BATCH; i++) {
    iov[i].iov_base = bufs[i];
    iov[i].iov_len = sizeof bufs[i];
    memset(&msgs[i], 0, sizeof msgs[i]);
    msgs[i].msg_hdr.msg_iov = &iov[i];
    msgs[i].msg_hdr.msg_iovlen = 1;
  }
  printf("ready\n");
  fflush(stdout);
  unsigned long long bytes = 0, dgrams = 0;
  double t0 = 0, deadline = now() + 60;
  while (t0 == 0 ? now() < deadline : now() < t0 + secs) {
    int n = recvmmsg(fd, msgs, BATCH, 0, NULL);
    if (n <= 0) continue;
    if (t0 == 0) t0 = now();
    for (int i = 0; i < n; i++) bytes += msgs[i].msg_len;
    dgrams += (unsigned long long)n;
  }
  double dt = t0 ? now() - t0 : 0;
  printf("recv %llu %llu %.3f %.1f\n", bytes, dgrams, dt, dt > 0 ? bytes / dt / 1e6 : 0.0);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 8 && strcmp(argv[1], "send") == 0)
    return flow_send(atoi(argv[2]), argv[3], atoi(argv[4]), (int)strtol(argv[5], NULL, 0),
                     atoi(argv[6]), atof(argv[7]));
  if (argc == 5 && strcmp(argv[1], "recv") == 0)
    return flow_recv(argv[2], atoi(argv[3]), atof(argv[4]));
  fprintf(stderr, "usage: udpflow send FD SERVER_IP SERVER_PORT CHANNEL PAYLOAD SECONDS\n"
                  "       udpflow recv BIND_IP PORT SECONDS\n");
  return 2;
}
