/* delayline: a userspace one-way delay for a pair of Ethernet interfaces.
 *
 * The kernel here has no netem, so the WAN test bed (erdmampi/testing/wan.py)
 * bridges two veth ends with this program: every frame received on A is sent
 * out of B (and B out of A) DELAY microseconds after it arrived.
 *
 *   delayline -a IFA -b IFB -d US [-D US] [-m FRAMES] [-q BYTES] [-r PRIO] [-s FILE]
 *       -d US      delay A->B in microseconds (-D: B->A, default the same)
 *       -m FRAMES  receive through a TPACKET_V2 ring of FRAMES frames per
 *                  interface (PACKET_RX_RING) instead of recvmmsg
 *       -q BYTES   queue capacity per direction (default 16 MiB); a frame
 *                  that does not fit is dropped and counted
 *       -r PRIO    run SCHED_FIFO at PRIO (root)
 *       -s FILE    write the counters to FILE on exit and on SIGUSR1
 *                  (SIGUSR2 resets them)
 *   delayline --offload-off IF...
 *       turn off tx checksum, scatter-gather, TSO, GSO and GRO on IF so that
 *       frames stay MTU-sized with complete checksums
 *   delayline --gro-on IF...
 *       turn GRO on (a veth then receives through NAPI and merges frames for
 *       the local stack, as a real NIC does)
 *
 * Design: one thread, AF_PACKET raw sockets bound to each interface
 * (outgoing frames ignored), recvmmsg/sendmmsg in batches, one FIFO byte ring
 * per direction whose entries carry a CLOCK_MONOTONIC deadline.  A frame's
 * arrival time is the kernel's receive timestamp (SO_TIMESTAMPNS, converted
 * from CLOCK_REALTIME), so time the program spends asleep or busy does not add
 * to the delay.  Between events it sleeps in ppoll() until the head deadline
 * with a 1 ns timer slack.  "ready" is printed on stdout once both sockets
 * are bound; SIGTERM/SIGINT end it and the counters go to stderr (and -s).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/ethtool.h>
#include <linux/if_packet.h>
#include <linux/sockios.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BATCH 64
#define FRAME_MAX 2048 /* MTU 1500 + Ethernet header, with room */
#define HDR 16         /* entry header: u64 deadline, u32 len, u32 pad */

typedef struct {
    uint8_t *buf;
    size_t cap, head, tail, used; /* bytes; entries never straddle the end */
} ring_t;

typedef struct {
    uint64_t rx, tx, tx_bytes, drop_full, drop_tx, oversize, late_max_ns;
    uint64_t late_hist[24]; /* frames sent [2^(k-1), 2^k) us after their deadline */
} stats_t;

static volatile sig_atomic_t stop, dump, reset;
static void on_signal(int s)
{
    if (s == SIGUSR1)
        dump = 1;
    else if (s == SIGUSR2)
        reset = 1;
    else
        stop = 1;
}

static uint64_t clock_ns(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void die(const char *what)
{
    fprintf(stderr, "delayline: %s: %s\n", what, strerror(errno));
    exit(1);
}

/* ---- ring ------------------------------------------------------------- */

static size_t entry_size(uint32_t len) { return (HDR + len + 7u) & ~(size_t)7u; }

/* Where an entry of `len` bytes would go, or NULL when the ring is full. */
static uint8_t *ring_reserve(ring_t *r, uint32_t len)
{
    size_t need = entry_size(len);
    if (r->used == 0)
        r->head = r->tail = 0;
    if (r->tail >= r->head && !(r->used && r->tail == r->head)) {
        if (r->cap - r->tail >= need + HDR)
            return r->buf + r->tail;
        if (r->head > need) { /* wrap: mark the end, continue at 0 */
            *(uint32_t *)(r->buf + r->tail + 8) = UINT32_MAX;
            r->used += r->cap - r->tail;
            r->tail = 0;
            return r->buf;
        }
        return NULL;
    }
    return (r->head - r->tail > need) ? r->buf + r->tail : NULL;
}

static void ring_commit(ring_t *r, uint64_t deadline, uint32_t len)
{
    uint8_t *e = r->buf + r->tail;
    *(uint64_t *)e = deadline;
    *(uint32_t *)(e + 8) = len;
    r->tail += entry_size(len);
    r->used += entry_size(len);
}

/* Head entry (skipping a wrap marker), NULL when empty. */
static uint8_t *ring_head(ring_t *r)
{
    if (r->used == 0)
        return NULL;
    uint8_t *e = r->buf + r->head;
    if (*(uint32_t *)(e + 8) == UINT32_MAX) {
        r->used -= r->cap - r->head;
        r->head = 0;
        if (r->used == 0)
            return NULL;
        e = r->buf;
    }
    return e;
}

static void ring_pop(ring_t *r)
{
    size_t sz = entry_size(*(uint32_t *)(r->buf + r->head + 8));
    r->head += sz;
    r->used -= sz;
}

/* ---- sockets ----------------------------------------------------------- */

typedef struct {
    int in, out;
    uint64_t delay_ns;
    ring_t q;
    stats_t st;
    int blocked;      /* out socket said EAGAIN: wait for POLLOUT */
    uint8_t *rx_map;  /* PACKET_RX_RING (TPACKET_V2) of `in`, or NULL: recvmmsg */
    unsigned rx_nr, rx_idx;
} dir_t;

#define RX_FRAME 2048
#define RX_BLOCK (1u << 16)

/* Map a TPACKET_V2 receive ring of `frames` frames on fd (before bind). */
static uint8_t *rx_ring(int fd, unsigned frames)
{
    int v = TPACKET_V2;
    if (setsockopt(fd, SOL_PACKET, PACKET_VERSION, &v, sizeof v) < 0)
        die("PACKET_VERSION");
    unsigned per_block = RX_BLOCK / RX_FRAME;
    struct tpacket_req req = {.tp_block_size = RX_BLOCK, .tp_frame_size = RX_FRAME,
                              .tp_block_nr = (frames + per_block - 1) / per_block};
    req.tp_frame_nr = req.tp_block_nr * per_block;
    if (setsockopt(fd, SOL_PACKET, PACKET_RX_RING, &req, sizeof req) < 0)
        die("PACKET_RX_RING");
    void *m = mmap(NULL, (size_t)req.tp_block_size * req.tp_block_nr, PROT_READ | PROT_WRITE,
                   MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
        die("mmap(PACKET_RX_RING)");
    return m;
}

static int open_iface(const char *name, uint8_t **map, unsigned ring_frames)
{
    int fd = socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, htons(ETH_P_ALL));
    if (fd < 0)
        die("socket(AF_PACKET)");
    unsigned idx = if_nametoindex(name);
    if (!idx) {
        fprintf(stderr, "delayline: no interface %s\n", name);
        exit(1);
    }
    int one = 1, big = 32 << 20;
    setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one);
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof big) < 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &big, sizeof big) < 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one);
    *map = ring_frames ? rx_ring(fd, ring_frames) : NULL;
    struct sockaddr_ll sll = {0};
    sll.sll_family = AF_PACKET;
    sll.sll_protocol = htons(ETH_P_ALL);
    sll.sll_ifindex = (int)idx;
    if (bind(fd, (struct sockaddr *)&sll, sizeof sll) < 0)
        die("bind(AF_PACKET)");
    /* drop what was queued before the bind took effect on this interface */
    char junk[FRAME_MAX];
    while (!*map && recv(fd, junk, sizeof junk, MSG_DONTWAIT) >= 0)
        ;
    return fd;
}

static uint8_t rxbuf[BATCH][FRAME_MAX];
static uint8_t rxctl[BATCH][CMSG_SPACE(sizeof(struct timespec))];

/* Monotonic arrival time from a CLOCK_REALTIME kernel timestamp `t`. */
static uint64_t arrival_of(uint64_t t, uint64_t mono, uint64_t real)
{
    /* ignore timestamps from the future or > 1 s old (clock step) */
    if (t && t <= real && real - t < 1000000000ull)
        return mono - (real - t);
    return mono;
}

static void enqueue(dir_t *d, const uint8_t *data, uint32_t len, uint64_t arrival)
{
    uint8_t *e = ring_reserve(&d->q, len);
    if (!e) {
        d->st.drop_full++;
        return;
    }
    memcpy(e + HDR, data, len);
    ring_commit(&d->q, arrival + d->delay_ns, len);
}

/* Take what the kernel put in d's receive ring. */
static void pump_ring(dir_t *d)
{
    uint64_t mono = clock_ns(CLOCK_MONOTONIC), real = clock_ns(CLOCK_REALTIME);
    for (unsigned k = 0; k < d->rx_nr; k++) {
        struct tpacket2_hdr *h = (void *)(d->rx_map + (size_t)d->rx_idx * RX_FRAME);
        if (!(__atomic_load_n(&h->tp_status, __ATOMIC_ACQUIRE) & TP_STATUS_USER))
            return;
        d->st.rx++;
        if (h->tp_len > h->tp_snaplen)
            d->st.oversize++;
        else
            enqueue(d, (uint8_t *)h + h->tp_mac, h->tp_snaplen,
                    arrival_of((uint64_t)h->tp_sec * 1000000000ull + h->tp_nsec, mono, real));
        __atomic_store_n(&h->tp_status, TP_STATUS_KERNEL, __ATOMIC_RELEASE);
        d->rx_idx = (d->rx_idx + 1) % d->rx_nr;
    }
}

/* Read what is waiting on d->in (up to a few batches) into d's queue. */
static void pump_in(dir_t *d)
{
    if (d->rx_map) {
        pump_ring(d);
        return;
    }
    struct mmsghdr m[BATCH];
    struct iovec iov[BATCH];
    for (int round = 0; round < 8; round++) {
        for (int i = 0; i < BATCH; i++) {
            iov[i].iov_base = rxbuf[i];
            iov[i].iov_len = FRAME_MAX;
            memset(&m[i].msg_hdr, 0, sizeof m[i].msg_hdr);
            m[i].msg_hdr.msg_iov = &iov[i];
            m[i].msg_hdr.msg_iovlen = 1;
            m[i].msg_hdr.msg_control = rxctl[i];
            m[i].msg_hdr.msg_controllen = sizeof rxctl[i];
        }
        int n = recvmmsg(d->in, m, BATCH, MSG_DONTWAIT | MSG_TRUNC, NULL);
        if (n <= 0)
            return;
        uint64_t mono = clock_ns(CLOCK_MONOTONIC), real = clock_ns(CLOCK_REALTIME);
        for (int i = 0; i < n; i++) {
            uint32_t len = m[i].msg_len;
            d->st.rx++;
            if (len > FRAME_MAX || (m[i].msg_hdr.msg_flags & MSG_TRUNC)) {
                d->st.oversize++;
                continue;
            }
            uint64_t t = 0;
            for (struct cmsghdr *c = CMSG_FIRSTHDR(&m[i].msg_hdr); c;
                 c = CMSG_NXTHDR(&m[i].msg_hdr, c)) {
                if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
                    struct timespec ts;
                    memcpy(&ts, CMSG_DATA(c), sizeof ts);
                    t = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
                }
            }
            enqueue(d, rxbuf[i], len, arrival_of(t, mono, real));
        }
        if (n < BATCH)
            return;
    }
}

/* Send every frame whose deadline has passed. */
static void pump_out(dir_t *d, uint64_t now)
{
    struct mmsghdr m[BATCH];
    struct iovec iov[BATCH];
    while (!d->blocked) {
        /* collect up to BATCH due entries without popping them */
        size_t save_head = d->q.head, save_used = d->q.used;
        int n = 0;
        uint8_t *e;
        while (n < BATCH && (e = ring_head(&d->q)) && *(uint64_t *)e <= now) {
            uint64_t late = now - *(uint64_t *)e;
            if (late > d->st.late_max_ns)
                d->st.late_max_ns = late;
            unsigned b = 0;
            for (uint64_t us = late / 1000; us && b < 23; us >>= 1)
                b++;
            d->st.late_hist[b]++;
            iov[n].iov_base = e + HDR;
            iov[n].iov_len = *(uint32_t *)(e + 8);
            memset(&m[n].msg_hdr, 0, sizeof m[n].msg_hdr);
            m[n].msg_hdr.msg_iov = &iov[n];
            m[n].msg_hdr.msg_iovlen = 1;
            n++;
            ring_pop(&d->q);
        }
        if (n == 0)
            return;
        /* sending may fail part-way: rewind and pop only what left */
        d->q.head = save_head;
        d->q.used = save_used;
        int done = 0;
        while (done < n) {
            int k = sendmmsg(d->out, m + done, (unsigned)(n - done), MSG_DONTWAIT);
            if (k > 0) {
                for (int i = 0; i < k; i++) {
                    d->st.tx++;
                    d->st.tx_bytes += iov[done + i].iov_len;
                    ring_head(&d->q);
                    ring_pop(&d->q);
                }
                done += k;
            } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
                d->blocked = 1; /* socket buffer full: resume on POLLOUT */
                return;
            } else if (errno == EINTR) {
                continue;
            } else { /* ENOBUFS from a full qdisc, ENETDOWN, ...: drop this frame */
                d->st.drop_tx++;
                ring_head(&d->q);
                ring_pop(&d->q);
                done++;
            }
        }
        if (n < BATCH)
            return;
    }
}

/* upper bound (us) of the bucket holding quantile q of the send lateness */
static double late_quantile(const stats_t *s, double q)
{
    uint64_t total = 0, acc = 0;
    for (int b = 0; b < 24; b++)
        total += s->late_hist[b];
    if (!total)
        return 0;
    for (int b = 0; b < 24; b++) {
        acc += s->late_hist[b];
        if (acc >= q * total)
            return b == 0 ? 1 : (double)(1u << b);
    }
    return s->late_max_ns / 1e3;
}

static void print_stats(FILE *f, const char *name, const stats_t *s)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    fprintf(f, "%s cpu_s=%.3f sys_s=%.3f rx=%llu tx=%llu tx_bytes=%llu drop_full=%llu drop_tx=%llu oversize=%llu "
            "late_p50_us=%.0f late_p99_us=%.0f late_p999_us=%.0f late_max_us=%.1f\n", name,
            ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6,
            ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6,
            (unsigned long long)s->rx, (unsigned long long)s->tx,
            (unsigned long long)s->tx_bytes, (unsigned long long)s->drop_full,
            (unsigned long long)s->drop_tx, (unsigned long long)s->oversize,
            late_quantile(s, 0.5), late_quantile(s, 0.99), late_quantile(s, 0.999),
            s->late_max_ns / 1e3);
}

/* The counters of both directions to `path` (atomically: temp file + rename). */
static void write_stats(const char *path, const dir_t *dir)
{
    if (!path)
        return;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return;
    print_stats(f, "ab", &dir[0].st);
    print_stats(f, "ba", &dir[1].st);
    if (fclose(f) == 0)
        rename(tmp, path);
}

/* ---- offloads ---------------------------------------------------------- */

static int set_gro(const char *name, uint32_t on)
{
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), rc = 0;
    if (fd < 0)
        die("socket");
    struct ethtool_value v = {.cmd = ETHTOOL_SGRO, .data = on};
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", name);
    ifr.ifr_data = (void *)&v;
    if (ioctl(fd, SIOCETHTOOL, &ifr) < 0) {
        fprintf(stderr, "delayline: %s: gro %s: %s\n", name, on ? "on" : "off", strerror(errno));
        rc = 1;
    }
    close(fd);
    return rc;
}

static int offload_off(const char *name)
{
    static const uint32_t cmds[] = {ETHTOOL_STXCSUM, ETHTOOL_SSG, ETHTOOL_STSO,
                                    ETHTOOL_SGSO, ETHTOOL_SGRO};
    static const char *names[] = {"tx-checksum", "sg", "tso", "gso", "gro"};
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), rc = 0;
    if (fd < 0)
        die("socket");
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        struct ethtool_value v = {.cmd = cmds[i], .data = 0};
        struct ifreq ifr;
        memset(&ifr, 0, sizeof ifr);
        snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", name);
        ifr.ifr_data = (void *)&v;
        if (ioctl(fd, SIOCETHTOOL, &ifr) < 0 && errno != EOPNOTSUPP) {
            fprintf(stderr, "delayline: %s: %s off: %s\n", name, names[i], strerror(errno));
            rc = 1;
        }
    }
    close(fd);
    return rc;
}

/* ---- main -------------------------------------------------------------- */

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "--offload-off") == 0) {
        int rc = 0;
        for (int i = 2; i < argc; i++)
            rc |= offload_off(argv[i]);
        return rc;
    }
    if (argc >= 2 && strcmp(argv[1], "--gro-on") == 0) {
        int rc = 0;
        for (int i = 2; i < argc; i++)
            rc |= set_gro(argv[i], 1);
        return rc;
    }
    const char *ifa = NULL, *ifb = NULL, *statsfile = NULL;
    double d_ab = -1, d_ba = -1;
    size_t qcap = 16u << 20;
    int prio = 0, c;
    unsigned ring_frames = 0;
    while ((c = getopt(argc, argv, "a:b:d:D:m:q:r:s:")) != -1) {
        switch (c) {
        case 'a': ifa = optarg; break;
        case 'b': ifb = optarg; break;
        case 'd': d_ab = atof(optarg); break;
        case 'D': d_ba = atof(optarg); break;
        case 'm': ring_frames = (unsigned)strtoul(optarg, NULL, 10); break;
        case 'q': qcap = strtoull(optarg, NULL, 10); break;
        case 'r': prio = atoi(optarg); break;
        case 's': statsfile = optarg; break;
        default:
            fprintf(stderr, "usage: delayline -a IFA -b IFB -d US [-D US] [-m FRAMES] "
                            "[-q BYTES] [-r PRIO] [-s FILE] | --offload-off IF... "
                            "| --gro-on IF...\n");
            return 2;
        }
    }
    if (!ifa || !ifb || d_ab < 0) {
        fprintf(stderr, "delayline: -a, -b and -d are required\n");
        return 2;
    }
    if (d_ba < 0)
        d_ba = d_ab;
    if (qcap < (1u << 16))
        qcap = 1u << 16;

    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGUSR2, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM, 0, 0, 0);
    if (prio > 0) {
        struct sched_param sp = {.sched_priority = prio};
        if (sched_setscheduler(0, SCHED_FIFO, &sp) < 0)
            fprintf(stderr, "delayline: SCHED_FIFO: %s (continuing)\n", strerror(errno));
    }

    dir_t dir[2];
    memset(dir, 0, sizeof dir);
    uint8_t *ma, *mb;
    int fa = open_iface(ifa, &ma, ring_frames), fb = open_iface(ifb, &mb, ring_frames);
    dir[0].in = fa; dir[0].out = fb; dir[0].delay_ns = (uint64_t)(d_ab * 1000.0);
    dir[1].in = fb; dir[1].out = fa; dir[1].delay_ns = (uint64_t)(d_ba * 1000.0);
    dir[0].rx_map = ma; dir[1].rx_map = mb;
    dir[0].rx_nr = dir[1].rx_nr = ring_frames ? (ring_frames + RX_BLOCK / RX_FRAME - 1)
                                                / (RX_BLOCK / RX_FRAME) * (RX_BLOCK / RX_FRAME) : 0;
    for (int i = 0; i < 2; i++) {
        dir[i].q.cap = qcap;
        dir[i].q.buf = mmap(NULL, qcap, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (dir[i].q.buf == MAP_FAILED)
            die("mmap");
    }
    sigset_t blocked, orig;
    sigemptyset(&blocked);
    sigaddset(&blocked, SIGTERM);
    sigaddset(&blocked, SIGINT);
    sigaddset(&blocked, SIGHUP);
    sigaddset(&blocked, SIGUSR1);
    sigaddset(&blocked, SIGUSR2);
    sigprocmask(SIG_BLOCK, &blocked, &orig);
    printf("ready\n");
    fflush(stdout);

    while (!stop) {
        if (dump) {
            dump = 0;
            write_stats(statsfile, dir);
        }
        if (reset) {
            reset = 0;
            memset(&dir[0].st, 0, sizeof dir[0].st);
            memset(&dir[1].st, 0, sizeof dir[1].st);
        }
        uint64_t now = clock_ns(CLOCK_MONOTONIC);
        pump_out(&dir[0], now);
        pump_out(&dir[1], now);
        /* sleep until the earliest head deadline (or an event) */
        uint64_t next = UINT64_MAX;
        for (int i = 0; i < 2; i++) {
            uint8_t *e = dir[i].blocked ? NULL : ring_head(&dir[i].q);
            if (e && *(uint64_t *)e < next)
                next = *(uint64_t *)e;
        }
        struct pollfd p[2] = {{.fd = fa, .events = POLLIN}, {.fd = fb, .events = POLLIN}};
        /* a blocked direction waits for room on its output socket */
        if (dir[1].blocked) p[0].events |= POLLOUT; /* dir 1 writes to fa */
        if (dir[0].blocked) p[1].events |= POLLOUT; /* dir 0 writes to fb */
        struct timespec ts, *tsp = NULL;
        now = clock_ns(CLOCK_MONOTONIC);
        if (next != UINT64_MAX) {
            uint64_t wait = next > now ? next - now : 0;
            ts.tv_sec = (time_t)(wait / 1000000000ull);
            ts.tv_nsec = (long)(wait % 1000000000ull);
            tsp = &ts;
        }
        /* ppoll unblocks SIGTERM/SIGINT only while it waits */
        int rc = ppoll(p, 2, tsp, &orig);
        if (rc < 0) {
            if (errno == EINTR)
                continue;
            die("ppoll");
        }
        if (p[0].revents & POLLOUT) dir[1].blocked = 0;
        if (p[1].revents & POLLOUT) dir[0].blocked = 0;
        if (p[0].revents & POLLIN) pump_in(&dir[0]);
        if (p[1].revents & POLLIN) pump_in(&dir[1]);
        if ((p[0].revents | p[1].revents) & POLLNVAL)
            break;
        int gone = 0;
        for (int i = 0; i < 2; i++) {
            if (!(p[i].revents & POLLERR))
                continue;
            int err = 0;
            socklen_t len = sizeof err;
            getsockopt(p[i].fd, SOL_SOCKET, SO_ERROR, &err, &len); /* clears it */
            if (err == ENETDOWN || err == ENODEV || err == ENXIO) {
                fprintf(stderr, "delayline: %s: %s\n", i ? ifb : ifa, strerror(err));
                gone = 1;
            }
        }
        if (gone) /* interface went away (namespace deleted): nothing left to do */
            break;
    }
    char la[64], lb[64];
    snprintf(la, sizeof la, "%s>%s", ifa, ifb);
    snprintf(lb, sizeof lb, "%s>%s", ifb, ifa);
    print_stats(stderr, la, &dir[0].st);
    print_stats(stderr, lb, &dir[1].st);
    write_stats(statsfile, dir);
    return 0;
}
