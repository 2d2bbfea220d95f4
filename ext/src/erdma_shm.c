/* erdma_shm.c - ranks on one host talk through shared memory.
 *
 * Each rank owns one POSIX shm segment holding an inbound byte ring per local
 * sender.  A ring carries exactly the frame stream a QUIC stream would
 * (erdma_conn.c parses it with the same code), so matching, eager and
 * rendezvous work unchanged.  Single producer, single consumer; head/tail are
 * byte counters.  A consumer whose progress thread is about to sleep sets
 * `sleeping`; a producer that sees it rings a doorbell: a 1-byte UDP
 * datagram to the consumer's QUIC socket, which the progress thread already
 * polls.  A producer blocked on a full ring sets `prod_waiting` and the
 * consumer rings it back.  All functions run under e->mu.
 *
 * Liveness: whoever polls our rings (the progress thread at least every
 * 200 ms, whatever the application does) bumps `beat` in our segment.  A
 * local peer whose beat stands still for cfg.idle_timeout (ERDMA_TIMEOUT,
 * the QUIC idle timeout) is failed as a silent QUIC peer would be; a process
 * that exited is failed at once.  The failing side marks the peer's ring
 * `dropped`, so that a peer that wakes up later fails us in turn.
 *
 * Segments are attached only when they are regular files of our uid without
 * group/other access, of the size and header we expect.  CMA reads need
 * ptrace access: under Yama (ptrace_scope 1) a rank lets the job's launcher
 * (ERDMA_LAUNCHER_PID when it is our ancestor, else our parent) and its
 * descendants read it, never everyone; without such a grant large messages
 * go through the rings. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "erdma_shm.h"
#include "erdma_conn.h"
#include "erdma_engine.h"
#include "erdma_match.h"
#include "erdma_ulfm.h"
#include "erdma_copy.h"

#define SHM_MAGIC 0x3630736d616d6465ull /* "edmams06" */
#define SHM_HDR 512
/* After the header: the ids of our sends whose buffers local peers may read
 * with CMA right now (slot id % SHM_CMA_SLOTS; 0: free).  A reader checks
 * the id before and after process_vm_readv: a send withdrawn meanwhile (its
 * buffer handed back to the application) is never delivered. */
#define SHM_CMA_SLOTS 512
/* Then a claim word per slot, for a copy split between the receiver and the
 * sender (shm_split_take): the send id << 8 | CLAIM_* bits. */
#define SHM_CLAIMS (SHM_HDR + SHM_CMA_SLOTS * sizeof(uint32_t))
/* Then the two-rank slots (shm_pair_*), two cache lines each: the
 * communicator's context << 32 | the operations by flags its owner entered,
 * then a small Bcast's count << 32 | length and its bytes (erdma_pair_put;
 * up to SHM_PAIR_LINE_MAX, 48 of them in the first line with the count);
 * then each slot's SHM_PAIR_DEPTH areas for larger ones, up to
 * ERDMA_PAIR_DATA_MAX, operation k in area k % SHM_PAIR_DEPTH: a line
 * naming the operation as the slot's second word does, then the bytes (the
 * pages are touched only once a slot carries such bytes). */
#define SHM_PAIR_BYTES 128
#define SHM_PAIR_LINE_MAX 112
#define SHM_PAIR_DEPTH 4
#define SHM_PAIR_AREA (64 + (size_t)ERDMA_PAIR_DATA_MAX)
#define SHM_PAIR_WORDS (SHM_CLAIMS + SHM_CMA_SLOTS * sizeof(uint64_t))
#define SHM_PAIR_AREAS ((SHM_PAIR_WORDS + SHM_PAIRS * SHM_PAIR_BYTES + 4095) & ~(size_t)4095)
#define SHM_RINGS \
  ((SHM_PAIR_AREAS + SHM_PAIRS * SHM_PAIR_DEPTH * SHM_PAIR_AREA + 4095) & ~(size_t)4095)
_Static_assert(SHM_PAIR_AREAS % 4096 == 0 && SHM_RINGS % 4096 == 0,
               "pair areas and rings start at a page");
/* An application thread that just left an engine call (between a send and
 * the wait for the reply, say) will poll the rings itself soon: producers
 * skip the doorbell for this long after it left, and the owner's progress
 * thread wakes by then anyway (so a thread that never comes back delays a
 * message by at most this much). */
#define SHM_GRACE_NS 2000000ull

/* An eager payload written into a ring is published in pieces of this size. */
#define SHM_PIECE ((uint64_t)16 << 10)

struct shm_ring {
  _Alignas(64) _Atomic uint64_t head;   /* bytes produced */
  _Alignas(64) _Atomic uint64_t tail;   /* bytes consumed */
  _Alignas(64) _Atomic uint32_t prod_waiting;
  _Atomic uint32_t dropped;            /* the consumer failed the producer */
  _Alignas(64) uint8_t data[];
};

/* Fields are grouped by who writes them how often, one cache line per
 * group: a producer reads `closed`, `bell_waiters`, `sleeping` and
 * `active_until` for every message it publishes, and a line the owner keeps
 * writing (the spin count at every wait, its CPU) would cost it a transfer
 * each time. */
struct shm_seg {
  /* set up once */
  _Atomic uint64_t magic;   /* set last: the segment is initialised */
  int32_t owner, nlocal;
  int32_t pid;
  _Atomic uint32_t attached; /* local peers that mapped it */
  _Atomic uint32_t closed;   /* owner shut down cleanly */
  uint64_t ring_bytes;
  /* written when one of the owner's threads goes to sleep or wakes */
  _Alignas(64) _Atomic uint32_t sleeping; /* owner's progress thread is (about to be) asleep */
  _Atomic uint32_t bell_waiters; /* owner's threads asleep on `bell` */
  /* refreshed at most every SHM_GRACE_NS / 4 */
  _Alignas(64) _Atomic uint64_t active_until; /* CLOCK_MONOTONIC ns: an application
                                                * thread of the owner left an engine
                                                * call lately */
  /* written at every wait; read by producers only once active_until passed */
  _Alignas(64) _Atomic uint32_t spinners; /* owner's threads polling the rings right now */
  _Alignas(64) _Atomic int32_t cpu; /* CPU the owner's application thread last ran an
                                     * engine call on (shm_shares_cpu) */
  _Alignas(64) _Atomic uint32_t bell; /* futex: bumped when bytes arrive for a bell waiter */
  _Atomic uint64_t beat;     /* bumped by the owner's polling (liveness) */
};

_Static_assert(sizeof(struct shm_seg) <= SHM_HDR, "shm header too large");

static size_t ring_stride(uint64_t ring_bytes) {
  return sizeof(struct shm_ring) + (size_t)ring_bytes;
}

static struct shm_ring *ring_at(struct shm_seg *s, int i) {
  return (struct shm_ring *)((uint8_t *)s + SHM_RINGS + (size_t)i * ring_stride(s->ring_bytes));
}

static _Atomic uint32_t *cma_slot(struct shm_seg *s, uint32_t sid) {
  return (_Atomic uint32_t *)((uint8_t *)s + SHM_HDR) + sid % SHM_CMA_SLOTS;
}

static _Atomic uint64_t *pair_word(struct shm_seg *s, int slot) {
  return (_Atomic uint64_t *)((uint8_t *)s + SHM_PAIR_WORDS + (size_t)slot * SHM_PAIR_BYTES);
}

static uint8_t *pair_area(struct shm_seg *s, int slot) {
  return (uint8_t *)s + SHM_PAIR_AREAS + (size_t)slot * SHM_PAIR_DEPTH * SHM_PAIR_AREA;
}

static _Atomic uint64_t *cma_claim(struct shm_seg *s, uint32_t sid) {
  return (_Atomic uint64_t *)((uint8_t *)s + SHM_CLAIMS) + sid % SHM_CMA_SLOTS;
}

/* A send of ours may be read with CMA (r->id is its id on the wire): 1 when
 * its slot was free and now names it (the caller sends a CMA RTS). */
static int shm_cma_publish(erdma_engine *e, erdma_req *r) {
  uint32_t sid = (uint32_t)r->id, none = 0;
  if (!e->shm.seg || !sid) return 0;
  if (!atomic_compare_exchange_strong(cma_slot(e->shm.seg, sid), &none, sid)) return 0;
  /* its claim word (shm_split_take) starts unclaimed; the RTS that follows
   * orders this store before any reader's claim */
  atomic_store_explicit(cma_claim(e->shm.seg, sid), (uint64_t)sid << 8, memory_order_relaxed);
  r->cma_sid = sid;
  return 1;
}

/* The send completed, failed or was withdrawn: no reader may use its buffer. */
static void shm_cma_release(erdma_req *r) {
  erdma_engine *e = r->e;
  uint32_t sid = r->cma_sid;
  r->cma_sid = 0;
  if (e->shm.seg) atomic_compare_exchange_strong(cma_slot(e->shm.seg, sid), &sid, 0);
}

/* Map the pages of a ring (in our segment: we read it; in a peer's: we
 * write it) now rather than on first use: else every message of the first
 * pass round a ring (~500 messages of 4 KiB in 2 MiB) paid a page fault on
 * each side (a 4 KiB Allreduce ran ~8 instead of ~2 us for its first
 * ~600 calls, which is where benchmarks time).  Only while the rings of a
 * segment take at most PREFAULT_MAX bytes; best effort. */
#define PREFAULT_MAX (64ull << 20)
static void ring_prefault(const erdma_engine *e, struct shm_ring *r) {
#ifdef MADV_POPULATE_WRITE
  if ((uint64_t)e->shm.nlocal * e->shm.ring_bytes > PREFAULT_MAX) return;
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t a = (uintptr_t)r->data & ~(page - 1);
  size_t len = (size_t)((uintptr_t)r->data + e->shm.ring_bytes - a);
  if (madvise((void *)a, len, MADV_POPULATE_WRITE) != 0) { /* older kernel: on first use */ }
#else
  (void)e;
  (void)r;
#endif
}

/* The parent of pid (0 when unknown), from /proc/<pid>/stat. */
static pid_t parent_of(pid_t pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "re");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *p = strrchr(buf, ')'); /* the command name may hold anything */
  int ppid = 0;
  if (!p || sscanf(p + 1, " %*c %d", &ppid) != 1) return 0;
  return (pid_t)ppid;
}

/* Is `anc` (> 1) an ancestor of this process? */
static int is_ancestor(pid_t anc) {
  pid_t p = getpid();
  for (int depth = 0; depth < 64 && p > 1; depth++) {
    p = parent_of(p);
    if (p == anc) return 1;
  }
  return 0;
}

/* CMA lets a local peer read our memory, which Yama (ptrace_scope 1)
 * allows only to a tracer we declare and its descendants.  The narrowest
 * grant that covers the job's local ranks is their common ancestor: the
 * launcher (ERDMA_LAUNCHER_PID, when it is an ancestor of ours) or else our
 * parent; never PR_SET_PTRACER_ANY, which would let any process of the
 * user read and write the rank.  Returns whether to try CMA at all: a
 * sibling outside the grant is refused and falls back to the ring. */
static int cma_grant(erdma_engine *e) {
  FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "re");
  int scope = 0;
  if (!f) return 1; /* no Yama: the usual same-user ptrace rules */
  if (fscanf(f, "%d", &scope) != 1) scope = 0;
  fclose(f);
  if (scope >= 3) return 0; /* no ptrace at all */
  if (scope != 1) return 1; /* 0: no restriction; 2: only CAP_SYS_PTRACE (tried, else refused) */
  pid_t tracer = 0;
  if (e->cfg.launcher_pid > 1 && is_ancestor((pid_t)e->cfg.launcher_pid))
    tracer = (pid_t)e->cfg.launcher_pid;
  if (!tracer) tracer = getppid();
  if (tracer <= 1) return 0; /* orphaned: declaring init would grant everyone */
  if (prctl(PR_SET_PTRACER, (unsigned long)tracer, 0, 0, 0) != 0) return 0;
  if (e->cfg.verbose)
    fprintf(stderr, "erdma[%d]: local peers under pid %d may read this rank (CMA)\n",
            e->cfg.rank, (int)tracer);
  return 1;
}

static void seg_name(const erdma_engine *e, int rank, char *out, size_t n) {
  snprintf(out, n, "/erdma-%s-%d", e->shm.job, rank);
}

int shm_is_local(erdma_engine *e, int rank) {
  for (int i = 0; i < e->shm.nlocal; i++)
    if (e->shm.local[i] == rank) return i;
  return -1;
}

/* Where a collective's block to a local peer should leave the ring for a
 * CMA read (cfg.shm_bulk_cma_min 0: measured here).  Through the ring a
 * block is copied twice (in, then out, by another core), and in a
 * collective the receiver has usually not posted its receive yet, so the
 * way out goes through an unexpected-message buffer: three copies.  A CMA
 * read is one copy plus the pinning of the sender's pages and an RTS.  How
 * much the pinning costs depends on the machine: a 256 KiB read of our own
 * pages (a process may read itself) took 1.9x a memcpy on a 480 MiB-L3
 * Xeon, where blocks from 16 KiB were faster by CMA in every
 * collective; on an EPYC VM whose pinning ran at 13 GB/s, a 512 KiB
 * message took 2.8x longer by CMA than through the ring.  The median of
 * nine timed pairs after one to warm up, in well under a millisecond.  On
 * that VM the best of five of each flipped between launches and between
 * the two ranks of one job (both start at once): medians were 2.5-4.3,
 * single pairs 0.3-8, and the ring was faster there (two-rank Bcast of
 * 16 KiB-1 MiB 1.3-1.6x, Alltoall up to 1.4x); the Xeon read at 1.9x.
 * Never (UINT64_MAX) where a read costs more than 2.2 copies or fails. */
#define SHM_BULK_PROBE ((uint64_t)256 << 10)
#define SHM_BULK_MIN ((uint64_t)16 << 10)
#define SHM_BULK_TRIES 9
/* The kernel's copy of a CMA read whose destination lies 1-63 bytes after
 * its source modulo the page (two NumPy arrays allocated one after the
 * other) stalls as glibc's memcpy does (erdma_copy.h) on some CPUs: 5x
 * slower on an EPYC VM, 1.1x on a Xeon.  Where a self-read 16 bytes off
 * takes more than this (hundredths) of an aligned one, such reads go
 * through a bounce buffer (cma_io); elsewhere the bounce would only add a
 * copy (two-rank Alltoall of 512 KiB, Xeon: 24.7 us against 15.4). */
#define SHM_ALIAS_STALL 150

/* Medians of nine timed rounds after one to warm up, in a few
 * milliseconds at most: *bulk_min (when 0 on entry) as above, and
 * *bounce (when 0 on entry) 1 where the aliased read stalls, else 2.  A
 * read that fails leaves CMA for bulk off and the bounce on. */
static void shm_cma_calibrate(uint64_t *bulk_min, int *bounce) {
  const uint64_t n = SHM_BULK_PROBE;
  uint8_t *a = NULL, *b = NULL;
  uint64_t copy[SHM_BULK_TRIES], alias[SHM_BULK_TRIES]; /* a read / copy or aligned read, % */
  int ok = 1;
  if (posix_memalign((void **)&a, 4096, n) || posix_memalign((void **)&b, 4096, n + 4096)) {
    free(a);
    a = NULL;
    ok = 0;
  }
  pid_t me = getpid();
  if (ok) {
    memset(a, 1, n);
    memset(b, 2, n + 4096);
  }
  for (int k = -1; ok && k < SHM_BULK_TRIES; k++) { /* k = -1: a round to warm up */
    uint64_t t0 = erdma_now();
    memcpy(b, a, n);
    uint64_t t1 = erdma_now();
    struct iovec l = {b, (size_t)n}, r = {a, (size_t)n}, l16 = {b + 16, (size_t)n};
    ssize_t got = process_vm_readv(me, &l, 1, &r, 1, 0);
    uint64_t t2 = erdma_now();
    if (got == (ssize_t)n && *bounce == 0) got = process_vm_readv(me, &l16, 1, &r, 1, 0);
    uint64_t t3 = erdma_now();
    ok = got == (ssize_t)n;
    if (k < 0 || !ok) continue;
    erdma_sorted_insert(copy, k, (t2 - t1) * 100 / (t1 - t0 ? t1 - t0 : 1));
    erdma_sorted_insert(alias, k, (t3 - t2) * 100 / (t2 - t1 ? t2 - t1 : 1));
  }
  free(a);
  free(b);
  if (*bulk_min == 0)
    *bulk_min = ok && copy[SHM_BULK_TRIES / 2] <= 220 ? SHM_BULK_MIN : UINT64_MAX;
  if (*bounce == 0) *bounce = !ok || alias[SHM_BULK_TRIES / 2] > SHM_ALIAS_STALL ? 1 : 2;
}

/* A point-to-point message to a rank of this host from
 * cfg.shm_p2p_split_min bytes (default 16 KiB) goes by RTS, its receiver
 * reading the first part with CMA while its sender writes the second
 * (shm_split_take); from cfg.shm_p2p_cma_min (default never) below that,
 * by one CMA read.  A send from these sizes completes once its receiver has
 * the bytes; a smaller one goes into the peer's ring.  Ping-pong one way
 * (bench.pingpong, 2 ranks, Xeon VM), split against the ring and
 * MPICH+UCX, which reads by CMA: an unchanged buffer (OSU's latency test)
 * 64 KiB 3.5 us against 6.5 and 4.0, 1 MiB 31 against 94 and 57; a buffer
 * rewritten before each send 1 MiB 109 against 118 and 175.  The ring stays
 * faster at 16-256 KiB when the sender has just written its data (16 KiB
 * 4.2 against 6.2 split, MPICH 7.9): one CMA read pulls every line from the
 * sender's cache on one core, and even split the system calls cost more
 * than the ring's two copies on two cores.  A collective's messages (odd
 * contexts) keep their own rules; a buffered send (ERDMA_SEND_BUFFERED)
 * never waits for its receiver. */
int shm_p2p_by_cma(const erdma_engine *e, uint64_t nbytes, int flags, uint32_t ctx) {
  return !(ctx & 1) && !(flags & ERDMA_SEND_BUFFERED) && e->shm.cma &&
         ((e->cfg.shm_p2p_cma_min && nbytes >= e->cfg.shm_p2p_cma_min) ||
          (e->cfg.shm_p2p_split_min && nbytes >= e->cfg.shm_p2p_split_min));
}

/* In a collective both sides are busy copying, and a block put into the
 * ring usually waits there unexpected: from cfg.shm_bulk_cma_min on, one
 * read straight from the sender's buffer costs less. */
int shm_bulk_by_cma(const erdma_engine *e, uint64_t nbytes, int flags) {
  return (flags & ERDMA_SEND_BULK) && e->shm.cma && e->cfg.shm_bulk_cma_min &&
         nbytes >= e->cfg.shm_bulk_cma_min;
}

int erdma_engine_shm_setup(erdma_engine *e, const char *job, const int *local_ranks,
                           int nlocal, uint64_t ring_bytes, int use_cma) {
  shm_state *s = &e->shm;
  int fd, me = -1;
  if (e->started || s->seg || nlocal < 1 || !job) return ERDMA_ERR_STATE;
  for (int i = 0; i < nlocal; i++) {
    if (local_ranks[i] < 0 || local_ranks[i] >= e->cfg.size) return ERDMA_ERR_RANK;
    if (local_ranks[i] == e->cfg.rank) me = i;
  }
  if (me < 0) return ERDMA_ERR_INVAL;
  if (nlocal == 1) return 0;
  uint64_t rb = 4096;
  while (rb < ring_bytes) rb <<= 1; /* power of two: positions wrap with a mask */
  size_t j = 0;
  for (const char *p = job; *p && j < sizeof s->job - 1; p++)
    if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9'))
      s->job[j++] = *p;
  s->job[j] = 0;
  s->local = malloc(sizeof(int) * (size_t)nlocal);
  s->maps = calloc((size_t)nlocal, sizeof *s->maps);
  s->nmaps = nlocal;
  if (!s->local || !s->maps) {
    free(s->local);
    free(s->maps);
    s->local = NULL;
    s->maps = NULL;
    return ERDMA_ERR_NOMEM;
  }
  memcpy(s->local, local_ranks, sizeof(int) * (size_t)nlocal);
  s->nlocal = nlocal;
  s->my_index = me;
  s->ring_bytes = rb;
  s->cma = use_cma;
  cpu_set_t cpus;
  int ncpu = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  s->oversub = nlocal > ncpu;
  s->demote = e->cfg.shm_demote == 1 || (e->cfg.shm_demote == 0 && erdma_cpu_demotes());
  e->cfg.shm_demote = s->demote ? 1 : 2; /* as decided (Engine.config) */
  if (e->cfg.verbose)
    fprintf(stderr, "erdma[%d]: lines written for a rank of this host %s\n", e->cfg.rank,
            s->demote ? "go to the shared cache (CLDEMOTE)" : "stay in this core's cache");
  if (use_cma) s->cma = cma_grant(e);
  if (s->cma && (!e->cfg.shm_bulk_cma_min || !e->cfg.shm_cma_bounce)) {
    shm_cma_calibrate(&e->cfg.shm_bulk_cma_min, &e->cfg.shm_cma_bounce);
    if (e->cfg.verbose)
      fprintf(stderr, "erdma[%d]: a collective's block to a rank of this host goes by CMA "
                      "from %s%llu bytes; a copy 1-63 bytes after its source modulo the "
                      "page goes by %s, by CMA %s\n", e->cfg.rank,
              e->cfg.shm_bulk_cma_min == UINT64_MAX ? "(never) " : "",
              (unsigned long long)(e->cfg.shm_bulk_cma_min == UINT64_MAX
                                       ? 0 : e->cfg.shm_bulk_cma_min),
              erdma_copy_stall ? "the vector loop" : "memcpy",
              e->cfg.shm_cma_bounce == 1 ? "through a bounce buffer" : "straight");
  }
  s->map_len = s->maps_len = SHM_RINGS + (size_t)nlocal * ring_stride(rb);
  seg_name(e, e->cfg.rank, s->name, sizeof s->name);
  fd = shm_open(s->name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0 && errno == EEXIST) { /* left over by a crashed job with this id */
    shm_unlink(s->name);
    fd = shm_open(s->name, O_CREAT | O_EXCL | O_RDWR, 0600);
  }
  if (fd < 0) return ERDMA_ERR_SOCKET;
  if (ftruncate(fd, (off_t)s->map_len) != 0) {
    close(fd);
    shm_unlink(s->name);
    return ERDMA_ERR_NOMEM;
  }
  void *m = mmap(NULL, s->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) {
    shm_unlink(s->name);
    return ERDMA_ERR_NOMEM;
  }
  s->seg = m;
  s->seg->ring_bytes = rb;
  for (int i = 0; i < nlocal; i++)
    if (i != me) ring_prefault(e, ring_at(s->seg, i));
  s->seg->owner = e->cfg.rank;
  s->seg->nlocal = nlocal;
  s->next_liveness = 0;
  s->seg->pid = (int32_t)getpid();
  s->seg->ring_bytes = rb;
  atomic_store_explicit(&s->seg->cpu, -1, memory_order_relaxed);
  atomic_store_explicit(&s->seg->magic, SHM_MAGIC, memory_order_release);
  return 0;
}

/* A local peer's segment that is not what its rank would have made
 * (another user's, readable by others, a symlink, the wrong size): the job
 * cannot trust it. */
static int seg_refused(erdma_engine *e, const char *name, const char *why) {
  fprintf(stderr, "erdma[%d]: refusing shared-memory segment /dev/shm%s: %s\n", e->cfg.rank,
          name, why);
  return ERDMA_ERR_AUTH;
}

/* Map every local peer's segment that exists by now; 1 while some are missing,
 * < 0 on an error (ERDMA_ERR_AUTH: a segment refused). */
int shm_attach_peers(erdma_engine *e) {
  shm_state *s = &e->shm;
  int missing = 0;
  for (int i = 0; i < s->nlocal; i++) {
    int p = s->local[i];
    if (p == e->cfg.rank || e->peers[p].conn) continue;
    char name[128];
    seg_name(e, p, name, sizeof name);
    int fd = shm_open(name, O_RDWR | O_NOFOLLOW, 0600);
    if (fd < 0) {
      if (errno != ENOENT) return seg_refused(e, name, strerror(errno));
      missing = 1;
      continue;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
        (st.st_mode & 077)) {
      close(fd);
      return seg_refused(e, name, "not a regular file of our uid with mode 0600");
    }
    if ((size_t)st.st_size != s->map_len) {
      close(fd);
      if (st.st_size != 0) /* 0: its owner has not sized it yet */
        return seg_refused(e, name, "unexpected size");
      missing = 1;
      continue;
    }
    struct shm_seg *ps = mmap(NULL, s->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (ps == MAP_FAILED) return ERDMA_ERR_NOMEM;
    if (atomic_load_explicit(&ps->magic, memory_order_acquire) != SHM_MAGIC) {
      munmap(ps, s->map_len);
      missing = 1;
      continue;
    }
    pid_t pid = ps->pid;
    if (ps->owner != p || ps->nlocal != s->nlocal || ps->ring_bytes != s->ring_bytes ||
        pid <= 0 || pid == getpid()) {
      munmap(ps, s->map_len);
      return seg_refused(e, name, "its header does not describe this job's rank");
    }
    erdma_conn *c = conn_alloc(e, 0);
    if (!c) {
      munmap(ps, s->map_len);
      return ERDMA_ERR_NOMEM;
    }
    c->shm = 1;
    c->chan = &erdma_shm_chan;
    c->peer = p;
    c->handshake_done = c->hello_recv = 1;
    c->stream_id = 0;
    memcpy(&c->remote, &e->peers[p].addr, e->peers[p].addr_len);
    c->remote_len = e->peers[p].addr_len;
    c->peer_seg = ps;
    c->peer_pid = pid;
    c->peer_map_len = s->map_len;
    s->maps[i] = ps;
    c->tx_ring = ring_at(ps, s->my_index);
    c->tx_ring_head = atomic_load_explicit(&c->tx_ring->head, memory_order_relaxed);
    ring_prefault(e, c->tx_ring);
    c->rx_ring = ring_at(s->seg, i);
    c->beat_seen = atomic_load_explicit(&ps->beat, memory_order_relaxed);
    c->beat_at = erdma_now();
    e->peers[p].conn = c;
    atomic_fetch_add(&ps->attached, 1);
  }
  if (!s->unlinked && s->seg &&
      atomic_load(&s->seg->attached) == (uint32_t)(s->nlocal - 1)) {
    shm_unlink(s->name); /* everyone has it mapped: nothing left behind on a crash */
    s->unlinked = 1;
  }
  return missing;
}

static void ring_bell(struct shm_seg *seg) {
  atomic_fetch_add_explicit(&seg->bell, 1, memory_order_seq_cst);
  syscall(SYS_futex, &seg->bell, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

static void doorbell(erdma_engine *e, erdma_conn *c) {
  static const uint8_t ring = 0; /* never a valid QUIC first byte */
  if (sendto(e->fd, &ring, 1, MSG_DONTWAIT, (struct sockaddr *)&c->remote, c->remote_len) < 0) {
    /* the socket buffer is full of datagrams for it: it is awake anyway */
  }
}

/* After publishing bytes for c's peer: a thread of the peer asleep in
 * shm_wait drains the rings itself: wake it directly; none, none spinning on
 * the rings and no application thread active lately, but its progress
 * thread asleep: the doorbell. */
static void notify_peer(erdma_engine *e, erdma_conn *c) {
  struct shm_seg *ps = c->peer_seg;
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(&ps->bell_waiters, memory_order_relaxed))
    ring_bell(ps);
  else if (atomic_load_explicit(&ps->sleeping, memory_order_relaxed) &&
           erdma_now() >= atomic_load_explicit(&ps->active_until, memory_order_relaxed) &&
           !atomic_load_explicit(&ps->spinners, memory_order_relaxed))
    doorbell(e, c);
}

static void ring_put(struct shm_ring *r, uint64_t cap, uint64_t pos, const uint8_t *src,
                     uint64_t n) {
  uint64_t off = pos & (cap - 1), first = cap - off < n ? cap - off : n;
  erdma_copy_out(r->data + off, src, first);
  if (n > first) erdma_copy_out(r->data, src + first, n - first);
}

/* Ring bytes [from, to) and the head, just published: to the shared cache
 * (erdma_demote), where the consumer's next loads find them, when they are
 * a reply (rx_since_tx): the peer waits for them, and the bytes' latency is
 * the call's (a two-rank ping-pong one way, 4 KiB: 1.34 -> 1.19 us).  A
 * sender of frames back to back does not demote: there the consumer keeps
 * up from our cache, and the instruction costs the producer about 7 ns a
 * line (a stream of 4 KiB messages 0.62 -> 1.07 us each); nor does a send
 * of an exchange (shm_note_send clears rx_since_tx), whose peer is sending
 * too (Sendrecv of 4 KiB: 1.48 -> 1.57 us demoted; Irecv + Isend + Waitall
 * 1.84 -> 1.94), unless it is short (SHM_DEMOTE_EXCHANGE_MAX: Sendrecv of
 * 64 bytes 0.82 -> 0.76). */
static void ring_demote(erdma_engine *e, erdma_conn *c, uint64_t cap, uint64_t from,
                        uint64_t to) {
  struct shm_ring *r = c->tx_ring;
  if (!e->shm.demote || !c->rx_since_tx || to == from) return;
  e->stats.shm_demotes++;
  uint64_t off = from & (cap - 1), n = to - from, first = cap - off < n ? cap - off : n;
  erdma_demote(r->data + off, first);
  if (n > first) erdma_demote(r->data, n - first);
  erdma_demote(&r->head, sizeof r->head);
}

static int shm_flush(erdma_conn *c) {
  erdma_engine *e = c->e;
  struct shm_ring *r = c->tx_ring;
  uint64_t cap = e->shm.ring_bytes, wrote = 0;
  if (atomic_load_explicit(&c->peer_seg->closed, memory_order_relaxed)) return 0;
  for (;;) {
    uint64_t head = c->tx_ring_head, from = head;
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);
    uint64_t room = cap - (head - tail);
    c->tx_ring_tail = tail;
    while (c->tx_write && room > 0) {
      tx_item *t = c->tx_write;
      uint64_t n;
      if (t->written < ERDMA_HDR_LEN) {
        n = ERDMA_HDR_LEN - t->written;
        if (n > room) n = room;
        ring_put(r, cap, head, t->hdr + t->written, n);
      } else {
        uint64_t done = t->written - ERDMA_HDR_LEN;
        n = t->plen - done;
        if (n > room) n = room;
        ring_put(r, cap, head, t->payload + done, n);
      }
      t->written += n;
      head += n;
      room -= n;
      wrote += n;
      if (t->written == ERDMA_HDR_LEN + t->plen) c->tx_write = t->next;
    }
    atomic_store_explicit(&r->head, head, memory_order_release);
    c->tx_ring_head = head;
    ring_demote(e, c, cap, from, head);
    if (!c->tx_write) break;
    /* ring full: ask the consumer to ring us back, then look once more */
    atomic_store_explicit(&r->prod_waiting, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&r->tail, memory_order_seq_cst) == tail) break;
  }
  if (c->tx_write) c->dirty = 1; /* retried when the consumer rings back */
  if (wrote) {
    c->rx_since_tx = 0;
    e->stats.bytes_sent += wrote;
    conn_acked(c, c->acked + wrote); /* in the ring = delivered */
    notify_peer(e, c);
  }
  return 0;
}

/* An eager frame straight into the peer's ring, when nothing is queued
 * before it and it fits: no copy of the payload, no queue item.  1 when
 * written (the caller completes the send), 0: queue it as usual. */
static int shm_send_direct(erdma_conn *c, const frame_hdr *h, const void *buf, uint64_t n) {
  erdma_engine *e = c->e;
  struct shm_ring *r = c->tx_ring;
  uint64_t cap = e->shm.ring_bytes, len = ERDMA_HDR_LEN + n;
  if (c->tx_write || c->closed || atomic_load_explicit(&c->peer_seg->closed,
                                                       memory_order_relaxed))
    return 0;
  uint64_t head = c->tx_ring_head;
  /* the consumer's tail only when the one we saw last leaves too little room:
   * its cache line is the consumer's, and reading it costs a transfer */
  if (cap - (head - c->tx_ring_tail) < len) {
    c->tx_ring_tail = atomic_load_explicit(&r->tail, memory_order_acquire);
    if (cap - (head - c->tx_ring_tail) < len) return 0;
  }
  uint8_t hdr[ERDMA_HDR_LEN];
  hdr_encode(hdr, h);
  ring_put(r, cap, head, hdr, ERDMA_HDR_LEN);
  /* the payload in pieces, each published at once: a consumer polling the
   * ring copies one piece out while we copy the next in (two copies in a
   * row cost 64 KiB 13.9 us against MPICH's 8.6 in a two-rank Bcast) */
  uint64_t shown = head; /* published (and demoted) up to here */
  for (uint64_t off = 0; off < n;) {
    uint64_t k = n - off < SHM_PIECE ? n - off : SHM_PIECE;
    ring_put(r, cap, head + ERDMA_HDR_LEN + off, (const uint8_t *)buf + off, k);
    off += k;
    if (off < n) {
      atomic_store_explicit(&r->head, head + ERDMA_HDR_LEN + off, memory_order_release);
      ring_demote(e, c, cap, shown, head + ERDMA_HDR_LEN + off);
      shown = head + ERDMA_HDR_LEN + off;
    }
  }
  atomic_store_explicit(&r->head, head + len, memory_order_release);
  c->tx_ring_head = head + len;
  ring_demote(e, c, cap, shown, head + len);
  c->rx_since_tx = 0;
  c->tx_offset += len; /* as if queued and written at once */
  c->acked += len;
  e->stats.bytes_sent += len;
  e->stats.msgs_sent++;
  notify_peer(e, c);
  return 1;
}

/* A blocking send's shortcut (the CPython fast path calls it holding the
 * GIL): an eager message to a local peer goes into its ring now, with no
 * request, when the engine lock is free at once and nothing is queued before
 * it.  1: sent (complete); 0: nothing done (use erdma_send).  Never waits. */
int erdma_shm_try_send(erdma_engine *e, const void *buf, uint64_t nbytes, int dest, int tag,
                       uint32_t ctx, int flags) {
  if (dest < 0 || dest >= e->cfg.size || dest == e->cfg.rank || tag < 0 ||
      nbytes > e->cfg.shm_eager_limit || (!buf && nbytes) || !e->shm.seg)
    return 0;
  if (shm_bulk_by_cma(e, nbytes, flags) || shm_p2p_by_cma(e, nbytes, flags, ctx))
    return 0; /* erdma_isend sends it by RTS */
  if (pthread_mutex_trylock(&e->mu) != 0) return 0;
  int sent = 0;
  peer_info *p = &e->peers[dest];
  erdma_conn *c = p->conn;
  if (e->started && e->running && !p->error && c && c->shm && !c->closed) {
    frame_hdr h = {0};
    h.type = FR_EAGER;
    h.ctx = ctx;
    h.tag = tag;
    h.len = nbytes;
    shm_note_send(c, flags, nbytes);
    sent = shm_send_direct(c, &h, buf, nbytes);
    if (sent) {
      TRACE_MSG(e, ERDMA_TRACE_SEND, dest, tag, ctx, nbytes);
      shm_app_active(e);
    }
  }
  pthread_mutex_unlock(&e->mu);
  return sent;
}

/* How much of a local peer's traffic drain_ring takes in as unexpected
 * messages.  A sender that runs ahead of its receiver (back-to-back Gathers,
 * a Bcast root) would otherwise fill up to cfg.unexpected_max of newly
 * allocated buffers at the receiver, each page faulted in on first use
 * (~3 us a page on a VM, more than the message): past
 * cfg.shm_unexpected_max its bytes stay in the ring and its sends wait for
 * room, as in MPICH's fixed cells.  While anything here waits on a peer (a
 * posted receive, a probe, a rendezvous, our own frames queued for a full
 * ring) the bound is cfg.unexpected_max, so that a message it waits for is
 * never stuck behind held bytes (two ranks flooding each other, a receive
 * of the tag sent last). */
uint64_t shm_hold_max(const erdma_engine *e) {
  const shm_state *s = &e->shm;
  if (e->cfg.shm_unexpected_max >= e->cfg.unexpected_max || e->posted_head || e->probing ||
      e->rndv_send_head || e->rndv_recv_head)
    return e->cfg.unexpected_max;
  for (int i = 0; i < s->nlocal; i++) {
    int p = s->local[i];
    const erdma_conn *c = p == e->cfg.rank ? NULL : e->peers[p].conn;
    if (c && c->shm && c->tx_head) return e->cfg.unexpected_max;
  }
  return e->cfg.shm_unexpected_max;
}

/* A thread that took an unexpected message lifts the hold (e->mu held): it
 * reads on in its next wait, and the progress thread once SHM_GRACE_NS
 * passed without a call (shm_next_wake); woken at every message it would
 * copy a running-ahead sender's backlog into unexpected messages under the
 * receiving thread.  A progress thread asleep for longer (no call marked
 * this thread active: a probe, a test) is woken. */
void shm_hold_taken(erdma_engine *e) {
  if (!e->shm.held) return;
  e->shm.held = 0;
  if (e->wake_at > erdma_now() + SHM_GRACE_NS) engine_wake(e);
}

void shm_hold_lifted(erdma_engine *e) {
  if (!e->shm.held) return;
  e->shm.held = 0;
  engine_wake(e); /* the progress thread reads the rings again */
}

/* Bytes of the frame c's parser has begun still to read (0: between frames). */
static uint64_t frame_rest(const erdma_conn *c) {
  return c->rx.hdr_got && c->rx.hdr_got < ERDMA_HDR_LEN ? ERDMA_HDR_LEN - c->rx.hdr_got
                                                        : c->rx.remaining;
}

#define DRAIN_STEP (64u << 10)
/* Hand c's inbound ring to the frame parser, as far as shm_hold_max allows;
 * -1 on a bad frame or a corrupt ring.  all: read everything (the peer said
 * goodbye or exited), whatever the bound */
static int drain_ring(erdma_engine *e, erdma_conn *c, int *total, int all) {
  uint64_t cap = e->shm.ring_bytes;
  struct shm_ring *r = c->rx_ring;
  uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
  uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
  int rv = 0;
  /* nothing new: no store to the tail (its line would move to this core and
   * back to the producer's on its next send) */
  if (head == tail) return 0;
  if (head - tail > cap) return -1; /* a producer that broke the protocol */
  uint64_t start = tail;
  /* Unexpected messages from this peer beyond shm_hold_max: leave its bytes
   * in the ring, so its sends wait for room (the back-pressure QUIC gets
   * from withheld flow-control credit); unexp_release wakes us. */
  const peer_info *p = &e->peers[c->peer];
  /* (a frame begun is read to its end: a receive may wait on its payload;
   * the bound is looked at every DRAIN_STEP bytes, as a receive waited for
   * may have been matched meanwhile) */
  while (tail != head && rv == 0) {
    uint64_t off = tail & (cap - 1), n = head - tail;
    if (n > cap - off) n = cap - off;
    if (n > DRAIN_STEP) n = DRAIN_STEP;
    if (!all && p->unexp_bytes > shm_hold_max(e)) { /* held: the rest of a frame begun */
      uint64_t rest = frame_rest(c);
      if (!rest) break;
      if (n > rest) n = rest;
    }
    rv = conn_rx_feed(c, r->data + off, (size_t)n);
    tail += n;
    *total += (int)n;
    e->stats.bytes_recv += n;
  }
  if (tail != head && rv == 0) e->shm.held = 1;
  if (tail == start) return 0; /* held from the start: no room made, nobody to ring */
  c->rx_since_tx = 1;
  atomic_store_explicit(&r->tail, tail, memory_order_release);
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(&r->prod_waiting, memory_order_relaxed)) {
    atomic_store_explicit(&r->prod_waiting, 0, memory_order_relaxed);
    if (atomic_load_explicit(&c->peer_seg->bell_waiters, memory_order_seq_cst))
      ring_bell(c->peer_seg); /* its waiting thread flushes */
    else if (!atomic_load_explicit(&c->peer_seg->spinners, memory_order_seq_cst))
      doorbell(e, c);
    /* else a thread of the producer spins on its rings: it flushes its
     * stalled frames itself, and once more after it stops counting
     * (spin_progress, shm_wait), so the room is seen without a datagram
     * (a sendto and its softirq, several microseconds of ours per drain
     * when a Gather's or a Bcast's sender runs ahead) */
  }
  return rv ? -1 : 0;
}

/* A local peer is failed: it may wake up later (SIGSTOP, a swapped-out
 * host): mark its ring so that it fails us too rather than waiting on us. */
static void shm_fail(erdma_engine *e, erdma_conn *c) {
  c->closed = 1;
  atomic_store(&c->rx_ring->dropped, 1);
  if (!e->stopping) engine_fail_peer(e, c->peer, ERDMA_ERR_PEER);
}

static void check_alive(erdma_engine *e, erdma_conn *c, uint64_t now) {
  struct shm_seg *ps = c->peer_seg;
  int total = 0;
  if (c->closed) return;
  uint64_t beat = atomic_load_explicit(&ps->beat, memory_order_relaxed);
  if (beat != c->beat_seen) {
    c->beat_seen = beat;
    c->beat_at = now;
  }
  if (atomic_load(&c->tx_ring->dropped)) {
    c->closed = 1; /* it failed us: we were too slow for it */
    if (!e->stopping) {
      fprintf(stderr, "erdma[%d]: rank %d (same host) has declared this rank failed\n",
              e->cfg.rank, c->peer);
      engine_fail_peer(e, c->peer, ERDMA_ERR_PEER);
    }
  } else if (e->cfg.idle_timeout > 0 && now - c->beat_at > (uint64_t)(e->cfg.idle_timeout * 1e9) &&
             !atomic_load(&ps->closed)) {
    if (!e->stopping)
      fprintf(stderr, "erdma[%d]: rank %d (pid %d, same host) has not responded for %.1f s "
                      "(stopped or hung)\n", e->cfg.rank, c->peer, (int)c->peer_pid,
              (double)(now - c->beat_at) / 1e9);
    shm_fail(e, c);
  } else if (atomic_load(&ps->closed)) {
    drain_ring(e, c, &total, 1); /* its last messages, published before `closed` */
    c->closed = 1; /* a goodbye: later use of the peer fails quietly */
    if (!e->stopping) engine_fail_peer(e, c->peer, ERDMA_ERR_PEER);
  } else if (kill(c->peer_pid, 0) != 0 && errno == ESRCH) {
    drain_ring(e, c, &total, 1);
    if (!e->stopping)
      fprintf(stderr, "erdma[%d]: rank %d (pid %d, same host) has exited\n", e->cfg.rank,
              c->peer, (int)c->peer_pid);
    shm_fail(e, c);
  }
}

static void shm_bad_frame(erdma_engine *e, erdma_conn *c) {
  fprintf(stderr, "erdma[%d]: bad frame from rank %d over shared memory\n", e->cfg.rank,
          c->peer);
  c->closed = 1;
  engine_fail_peer(e, c->peer, ERDMA_ERR_PEER);
}

static int shm_poll_ex(erdma_engine *e, int full);

int shm_poll(erdma_engine *e) { return shm_poll_ex(e, 1); }

/* shm_poll without the liveness checks and the clock (a spinning waiter,
 * between the progress thread's polls, which make those checks) */
int shm_poll_rings(erdma_engine *e) { return shm_poll_ex(e, 0); }

static int shm_poll_ex(erdma_engine *e, int full) {
  shm_state *s = &e->shm;
  int total = 0;
  if (!s->seg) return 0;
  s->held = 0; /* (set again by a ring left with bytes in this pass) */
  if (!full) {
    for (int i = 0; i < s->nlocal; i++) {
      int p = s->local[i];
      erdma_conn *c = p == e->cfg.rank ? NULL : e->peers[p].conn;
      if (!c || !c->shm || c->closed) continue;
      if (drain_ring(e, c, &total, 0) != 0) shm_bad_frame(e, c);
    }
    return total;
  }
  uint64_t now = erdma_now();
  int check = now >= s->next_liveness;
  if (check) {
    atomic_fetch_add_explicit(&s->seg->beat, 1, memory_order_relaxed);
    /* we ourselves did not run for a while (stopped, starved): the peers'
     * silence over that time says nothing about them */
    int stalled = s->next_liveness && now - s->next_liveness > 1000000000ull;
    for (int i = 0; stalled && i < s->nlocal; i++) {
      erdma_conn *c = s->local[i] == e->cfg.rank ? NULL : e->peers[s->local[i]].conn;
      if (c && c->shm) c->beat_at = now;
    }
    s->next_liveness = now + 200000000ull;
  }
  if (!s->unlinked && atomic_load(&s->seg->attached) == (uint32_t)(s->nlocal - 1)) {
    shm_unlink(s->name);
    s->unlinked = 1;
  }
  for (int i = 0; i < s->nlocal; i++) {
    int p = s->local[i];
    erdma_conn *c = p == e->cfg.rank ? NULL : e->peers[p].conn;
    if (!c || !c->shm || c->closed) continue;
    if (drain_ring(e, c, &total, 0) != 0) {
      shm_bad_frame(e, c);
      continue;
    }
    if (check) check_alive(e, c, now);
  }
  return total;
}

int shm_sleep_prepare(erdma_engine *e) {
  shm_state *s = &e->shm;
  if (!s->seg) return 0;
  atomic_store_explicit(&s->seg->sleeping, 1, memory_order_seq_cst);
  uint64_t hold = shm_hold_max(e);
  for (int i = 0; i < s->nlocal; i++) {
    int p = s->local[i];
    erdma_conn *c = p == e->cfg.rank ? NULL : e->peers[p].conn;
    /* bytes a held-back peer left in its ring are no reason to stay awake */
    if (c && c->shm && !c->closed &&
        (e->peers[p].unexp_bytes <= hold || frame_rest(c)) &&
        atomic_load_explicit(&c->rx_ring->head, memory_order_seq_cst) !=
            atomic_load_explicit(&c->rx_ring->tail, memory_order_relaxed)) {
      atomic_store_explicit(&s->seg->sleeping, 0, memory_order_relaxed);
      return 1;
    }
  }
  return 0;
}

/* Our CPU in our segment's header, stored only when it changed: producers
 * read that cache line on every message (notify_peer), and a store would
 * take it away from them each time. */
static void seg_set_cpu(struct shm_seg *seg, int cpu) {
  if (atomic_load_explicit(&seg->cpu, memory_order_relaxed) != cpu)
    atomic_store_explicit(&seg->cpu, cpu, memory_order_relaxed);
}

/* A thread polls the rings itself for a while (erdma_req_wait's spin). */
void shm_spin_begin(erdma_engine *e) {
  if (!e->shm.seg) return;
  atomic_fetch_add_explicit(&e->shm.seg->spinners, 1, memory_order_seq_cst);
  seg_set_cpu(e->shm.seg, sched_getcpu());
}

/* Without e->mu, from a spinning thread: does a local peer's application
 * thread run on our CPU (as far as their last engine calls tell)?  Then
 * spinning only keeps it from running until the spin ends (sched_yield does
 * not hand the CPU over under the EEVDF scheduler): a 4 KiB Allreduce of two
 * ranks put on one CPU took the whole adaptive spin, ~500 us, per call.  The
 * spinner sleeps at once instead.  Publishes our CPU too. */
int shm_shares_cpu(erdma_engine *e) {
  struct shm_seg *seg = e->shm.seg;
  if (!seg) return 0;
  int cpu = sched_getcpu();
  if (cpu < 0) return 0;
  seg_set_cpu(seg, cpu);
  int n = seg->nlocal, me = e->shm.my_index;
  for (int i = 0; i < n; i++) {
    if (i == me) continue;
    erdma_conn *c = e->peers[e->shm.local[i]].conn;
    /* peers[].conn is set once at attach time, before any spin */
    if (c && c->peer_seg &&
        atomic_load_explicit(&c->peer_seg->cpu, memory_order_relaxed) == cpu &&
        atomic_load_explicit(&c->peer_seg->magic, memory_order_relaxed) == SHM_MAGIC)
      return 1;
  }
  return 0;
}

/* After the spin: anything a producer wrote while it counted on the spinner
 * is picked up here (the producer checks the count after publishing). */
void shm_spin_end(erdma_engine *e) {
  if (!e->shm.seg) return;
  atomic_fetch_sub_explicit(&e->shm.seg->spinners, 1, memory_order_seq_cst);
  shm_poll_rings(e);
}

/* Without e->mu: does one of our inbound rings hold unread bytes?  Callers
 * count themselves in shm.lf_spin first (teardown waits for them). */
int shm_rx_ready(erdma_engine *e) {
  struct shm_seg *seg = e->shm.seg;
  if (!seg) return 0;
  int n = seg->nlocal, me = e->shm.my_index;
  for (int i = 0; i < n; i++) {
    if (i == me) continue;
    struct shm_ring *r = ring_at(seg, i);
    if (atomic_load_explicit(&r->head, memory_order_acquire) !=
        atomic_load_explicit(&r->tail, memory_order_relaxed))
      return 1;
  }
  return 0;
}

/* A spinner found a local peer on its CPU (shm_shares_cpu) while the host's
 * ranks do not outnumber its CPUs (so there is a CPU for each): it moves
 * itself to another CPU of its affinity mask and restores the mask (the
 * kernel migrates a thread at once when its CPU leaves its mask, and does not
 * move it back when the mask returns).  Otherwise the pair stays together:
 * the sleeper is woken on its waker's CPU (wake-affine), every message costs
 * a futex wake-up (~5 us) where two spinning ranks need ~0.6 us.  At most once
 * a millisecond per thread; our published CPU reads -1 while moving, so the
 * peer does not move as well.  1 when moved (keep spinning), else 0. */
int shm_move_off_cpu(erdma_engine *e) {
  static __thread uint64_t next_move;
  struct shm_seg *seg = e->shm.seg;
  if (!seg || e->shm.oversub) return 0;
  uint64_t now = erdma_now();
  if (now < next_move) return 0;
  next_move = now + 1000000ull;
  cpu_set_t mask, away;
  int cpu = sched_getcpu();
  if (cpu < 0 || sched_getaffinity(0, sizeof mask, &mask) != 0 || !CPU_ISSET(cpu, &mask) ||
      CPU_COUNT(&mask) < 2)
    return 0;
  away = mask;
  CPU_CLR(cpu, &away);
  atomic_store_explicit(&seg->cpu, -1, memory_order_seq_cst);
  int moved = sched_setaffinity(0, sizeof away, &away) == 0;
  if (moved) sched_setaffinity(0, sizeof mask, &mask);
  atomic_store_explicit(&seg->cpu, sched_getcpu(), memory_order_relaxed);
  return moved;
}

/* An application thread leaves an engine call (e->mu held): producers may
 * skip our doorbell for SHM_GRACE_NS; make sure the progress thread wakes by
 * then (it caps its sleep with shm_next_wake). */
void shm_app_active(erdma_engine *e) {
  struct shm_seg *seg = e->shm.seg;
  if (!seg) return;
  seg_set_cpu(seg, sched_getcpu());
  uint64_t until = erdma_now() + SHM_GRACE_NS;
  /* refreshed once it is a quarter of the grace old, not at every call: a
   * store takes the line producers read for every message away from them */
  uint64_t cur = atomic_load_explicit(&seg->active_until, memory_order_relaxed);
  if (until - cur > SHM_GRACE_NS / 4 || cur > until)
    atomic_store_explicit(&seg->active_until, until, memory_order_seq_cst);
  else
    until = cur;
  if (e->wake_at > until + SHM_GRACE_NS) engine_wake(e); /* asleep for long */
}

/* An application thread goes to sleep on the condition variable: it counts
 * on the doorbell again. */
void shm_app_idle(erdma_engine *e) {
  if (e->shm.seg && atomic_load_explicit(&e->shm.seg->active_until, memory_order_relaxed))
    atomic_store_explicit(&e->shm.seg->active_until, 0, memory_order_seq_cst);
}

/* The progress thread's next wake-up given its timers' `exp`. */
uint64_t shm_next_wake(erdma_engine *e, uint64_t exp, uint64_t now) {
  if (!e->shm.seg) return exp;
  uint64_t a = atomic_load_explicit(&e->shm.seg->active_until, memory_order_seq_cst);
  return a > now && a < exp ? a : exp;
}

/* A request of ours completed (req_complete, under e->mu): wake our own
 * threads asleep in shm_wait. */
void shm_wake_waiters(erdma_engine *e) {
  struct shm_seg *seg = e->shm.seg;
  if (seg && atomic_load_explicit(&seg->bell_waiters, memory_order_seq_cst)) ring_bell(seg);
}

static int reqs_done(erdma_req *const *reqs, int n) {
  for (int i = 0; i < n; i++)
    if (reqs[i] && __atomic_load_n(&reqs[i]->done, __ATOMIC_ACQUIRE)) return 1;
  return 0;
}

/* (e->mu held) Has a consumer made room in a ring our stalled frames wait
 * for since we last flushed?  A consumer that saw this thread counted as a
 * spinner sent no doorbell for it (drain_ring); read after bell_waiters is
 * counted, as the consumer reads bell_waiters after its tail, so that one
 * of the two sees the other. */
static int tx_room(erdma_engine *e) {
  shm_state *s = &e->shm;
  for (int i = 0; i < s->nlocal; i++) {
    int p = s->local[i];
    erdma_conn *c = p == e->cfg.rank ? NULL : e->peers[p].conn;
    if (c && c->shm && !c->closed && c->tx_write &&
        atomic_load_explicit(&c->tx_ring->tail, memory_order_seq_cst) != c->tx_ring_tail)
      return 1;
  }
  return 0;
}

/* Wait (e->mu held; returned held) until one of reqs completes or the
 * deadline passes, when every peer is on shared memory: the thread sleeps on
 * the `bell` futex of our segment, which producers ring instead of the UDP
 * doorbell while it sleeps, and drains the rings itself: one wake-up per
 * message instead of the progress thread's and then this one's.  It counts
 * as a spinner, so producers never count on the progress thread for it.
 * 1 when done, 0 at the deadline. */
int shm_wait(erdma_engine *e, erdma_req *const *reqs, int n, uint64_t deadline) {
  shm_state *s = &e->shm;
  struct shm_seg *seg = s->seg;
  int done = 0;
  atomic_fetch_add_explicit(&seg->spinners, 1, memory_order_seq_cst);
  for (;;) {
    shm_poll(e);
    conn_flush_all(e);
    if (reqs_done(reqs, n)) {
      done = 1;
      break;
    }
    if (reqs_failure_pending(reqs, n)) break; /* the caller reports it */
    uint64_t now = erdma_now();
    if (now >= deadline || !e->running) break;
    uint64_t ns = deadline - now;
    if (ns > 200000000ull) ns = 200000000ull; /* liveness checks, shutdown */
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    /* announce the sleep, then look once more: a producer either saw us
     * (and bumps `bell`, so the wait returns at once) or published before */
    atomic_fetch_add_explicit(&seg->bell_waiters, 1, memory_order_seq_cst);
    uint32_t v = atomic_load_explicit(&seg->bell, memory_order_seq_cst);
    __atomic_add_fetch(&s->lf_spin, 1, __ATOMIC_ACQ_REL); /* teardown waits for us */
    int held = s->held; /* bytes left in a ring (shm_hold_max): no reason to spin */
    int room = tx_room(e); /* made before the consumer could see us asleep */
    pthread_mutex_unlock(&e->mu);
    if ((held || !shm_rx_ready(e)) && !room && !reqs_done(reqs, n))
      syscall(SYS_futex, &seg->bell, FUTEX_WAIT, v, &ts, NULL, 0);
    atomic_fetch_sub_explicit(&seg->bell_waiters, 1, memory_order_seq_cst);
    __atomic_sub_fetch(&s->lf_spin, 1, __ATOMIC_ACQ_REL);
    pthread_mutex_lock(&e->mu);
    if (s->seg != seg) return reqs_done(reqs, n); /* torn down meanwhile */
  }
  atomic_fetch_sub_explicit(&seg->spinners, 1, memory_order_seq_cst);
  shm_poll(e); /* what a producer published counting on us */
  conn_flush_all(e); /* room a consumer made counting on us (drain_ring) */
  return done || reqs_done(reqs, n);
}

void shm_sleep_done(erdma_engine *e) {
  if (e->shm.seg) atomic_store_explicit(&e->shm.seg->sleeping, 0, memory_order_relaxed);
}

/* The kernel copies a process_vm_readv/writev with `rep movsb` and on AMD stalls
 * as memcpy does (erdma_copy.h) when the destination lies 1-63 bytes after
 * the source modulo the page: 1 MiB from 118 us to 611 us on an EPYC VM,
 * where two NumPy arrays allocated one after the other are 16 bytes apart
 * modulo the page.  Where it does (cfg.shm_cma_bounce, shm_cma_calibrate),
 * such a transfer goes through a buffer of this thread placed at the remote
 * address's page offset, CMA_BOUNCE bytes at a time: a kernel copy that
 * does not stall, and an erdma_copy in the cache. */
#define CMA_BOUNCE ((size_t)128 << 10)
static pthread_key_t bounce_key;
static pthread_once_t bounce_once = PTHREAD_ONCE_INIT;
static int bounce_ok;

static void bounce_key_make(void) {
  bounce_ok = pthread_key_create(&bounce_key, free) == 0;
}

/* This thread's bounce buffer (CMA_BOUNCE + a page), or NULL */
static uint8_t *cma_bounce(void) {
  pthread_once(&bounce_once, bounce_key_make);
  if (!bounce_ok) return NULL;
  void *b = pthread_getspecific(bounce_key);
  if (b) return b;
  if (posix_memalign(&b, 4096, CMA_BOUNCE + 4096) != 0) return NULL;
  if (pthread_setspecific(bounce_key, b) != 0) {
    free(b);
    return NULL;
  }
  return b;
}

/* One process_vm_readv (write 0: remote -> local) or process_vm_writev of
 * up to n bytes: what it returned. */
static ssize_t cma_io(const erdma_engine *e, pid_t pid, uint8_t *local, uint64_t remote,
                      size_t n, int write) {
  uint8_t *b;
  void *r0 = (void *)(uintptr_t)remote;
  int stall = e->cfg.shm_cma_bounce != 2 && n >= ERDMA_ALIAS_MIN &&
              (write ? erdma_copy_aliases(r0, local) : erdma_copy_aliases(local, r0));
  if (stall && (b = cma_bounce())) {
    b += remote & 4095u;
    if (n > CMA_BOUNCE) n = CMA_BOUNCE;
    struct iovec l = {b, n}, r = {r0, n};
    if (write) erdma_copy(b, local, n);
    ssize_t got = write ? process_vm_writev(pid, &l, 1, &r, 1, 0)
                        : process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (!write && got > 0) erdma_copy(local, b, (size_t)got);
    return got;
  }
  struct iovec l = {local, n}, r = {r0, n};
  return write ? process_vm_writev(pid, &l, 1, &r, 1, 0)
               : process_vm_readv(pid, &l, 1, &r, 1, 0);
}

/* Copy n bytes at addr in local peer `peer` into dst with one copy
 * (process_vm_readv), for its send `sid`.  0: done; -1: not possible (no
 * ptrace access: CMA off from now on; a bad address): use the ring; -2: the
 * peer withdrew that send (its buffer is no longer the message): what was
 * read is discarded. */
static int shm_cma_read(erdma_engine *e, int peer, void *dst, uint64_t addr, uint64_t n,
                        uint32_t sid) {
  erdma_conn *c = e->peers[peer].conn;
  uint64_t done = 0;
  if (!c || !c->shm || !e->shm.cma || !c->peer_seg) return -1;
  _Atomic uint32_t *live = cma_slot(c->peer_seg, sid);
  if (atomic_load(live) != sid) return -2;
  while (done < n) {
    ssize_t got = cma_io(e, c->peer_pid, (uint8_t *)dst + done, addr + done,
                         (size_t)(n - done), 0);
    if (got <= 0) {
      if (atomic_load(live) != sid) return -2; /* freed under us */
      if (done == 0 && got < 0 && (errno == EPERM || errno == EACCES || errno == ENOSYS)) {
        if (e->cfg.verbose)
          fprintf(stderr, "erdma[%d]: process_vm_readv from rank %d refused (%s); "
                          "large messages go through the ring\n", e->cfg.rank, peer,
                  strerror(errno));
        e->shm.cma = 0;
      }
      return -1;
    }
    done += (uint64_t)got;
  }
  atomic_thread_fence(memory_order_seq_cst);
  return atomic_load(live) == sid ? 0 : -2;
}

/* ---- point-to-point copies split between receiver and sender ----
 * A CMA read pulls every line on one core.  From cfg.shm_p2p_split_min the
 * receiver of an offered send instead sends a CTS FR_FLAG_SPLIT naming its
 * buffer and reads the first part, while the sender (spinning in its wait,
 * as a blocking send is) writes the second part with process_vm_writev.
 * The send's claim word in the sender's segment decides who copies the
 * second part: the send's id << 8 (set when the send is published) plus
 * CLAIM_* bits, each side claiming by compare-and-swap from the bare id.
 * A receiver that claims first copies everything and completes the send
 * with a CMA CTS, as after a plain read, so a sender busy elsewhere costs
 * nothing.  When the sender claims, the receiver waits for CLAIM_SENT,
 * then marks CLAIM_READ, and the sender completes its send itself, with no
 * message back; the receiver touches the word only before that. */
enum {
  CLAIM_SENDER = 1,    /* the sender copies the second part */
  CLAIM_SENT = 2,      /* ... and has written it */
  CLAIM_FAILED = 4,    /* ... or could not: the receiver reads it, then CTS */
  CLAIM_RECEIVER = 8,  /* the receiver copies everything, then CTS */
  CLAIM_READ = 16,     /* the receiver saw SENT and has its part: the sender completes */
  CLAIM_UNREAD = 32,   /* ... but could not read its part: the payload comes as frames */
  CLAIM_ABANDONED = 64 /* the sender gave up waiting for READ: the receiver sends its CTS */
};
#define CLAIM_GAVE_UP UINT64_MAX /* a wait timed out or the peer is gone */

/* Where the receiver's part ends (the same on both sides): it starts a CTS
 * earlier than the sender, so it takes a little more than half (ping-pong
 * of 16 KiB, 2 KiB more: 2.57 -> 2.55 us sending an unchanged buffer, 3.86
 * -> 3.73 sending back the one received; 4 KiB more: 2.47 and 4.06). */
#define SPLIT_LEAD ((uint64_t)2 << 10)
static uint64_t split_at(uint64_t n) {
  uint64_t h = (n / 2 + SPLIT_LEAD) & ~(uint64_t)63;
  return h < n ? h : n;
}

/* The deadline of a split copy's waits: cfg.idle_timeout from now, as for
 * a silent peer. */
static uint64_t claim_deadline(const erdma_engine *e) {
  return erdma_now() + (uint64_t)((e->cfg.idle_timeout > 0 ? e->cfg.idle_timeout : 60.0) * 1e9);
}

/* Spin while *w holds v: its next value, or CLAIM_GAVE_UP past `deadline`
 * or once process `pid` (the one that would change it) is gone.  The other
 * side is copying at that moment, so this is short; our beat goes on
 * meanwhile, so that a peer frozen mid-copy does not make us look frozen
 * to the others. */
static uint64_t claim_wait(erdma_engine *e, pid_t pid, _Atomic uint64_t *w, uint64_t v,
                           uint64_t deadline) {
  for (uint32_t spins = 1;; spins++) {
    uint64_t now_v = atomic_load_explicit(w, memory_order_acquire);
    if (now_v != v) return now_v;
    if (spins % 1024) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
      if (e->shm.oversub) sched_yield(); /* the other side may need our core */
      continue;
    }
    if (erdma_now() > deadline || (kill(pid, 0) != 0 && errno == ESRCH)) return CLAIM_GAVE_UP;
    if (e->shm.seg) atomic_fetch_add_explicit(&e->shm.seg->beat, 1, memory_order_relaxed);
  }
}

/* conn take_split for a local peer (see erdma_chan): 0 done, the send to be
 * completed by our CMA CTS; 1 done, the sender completes it; -1, -2 as
 * take.  A sender frozen mid-write for cfg.idle_timeout fails the receive
 * (-2), as a frozen peer is failed. */
static int shm_split_take(erdma_conn *c, void *dst, uint64_t addr, uint64_t n, uint32_t sid) {
  erdma_engine *e = c->e;
  if (!c->shm || !c->peer_seg) return -1;
  uint64_t h = split_at(n), tag = (uint64_t)sid << 8, v = tag;
  _Atomic uint64_t *claim = cma_claim(c->peer_seg, sid);
  int rv = shm_cma_read(e, c->peer, dst, addr, h, sid);
  if (atomic_compare_exchange_strong(claim, &v, tag | CLAIM_RECEIVER)) goto rest;
  if (v >> 8 != sid || !(v & CLAIM_SENDER)) return -2; /* withdrawn, or not this protocol */
  /* the sender claimed the rest: wait until it is written (or not) */
  uint64_t deadline = claim_deadline(e);
  while (v >> 8 == sid && !(v & (CLAIM_SENT | CLAIM_FAILED)))
    if ((v = claim_wait(e, c->peer_pid, claim, v, deadline)) == CLAIM_GAVE_UP) return -2;
  if (v >> 8 != sid) return -2;
  if (v & CLAIM_FAILED) goto rest; /* the sender waits for our CTS */
  /* SENT: our part read, the sender completes; else our CTS decides (an
   * honest sender changes the word at most once more: ABANDONED) */
  for (int tries = 0; tries < 8; tries++) {
    if (v >> 8 != sid) return -2;
    if (v & CLAIM_ABANDONED) return rv;
    if (atomic_compare_exchange_strong(claim, &v, v | (rv ? CLAIM_UNREAD : CLAIM_READ)))
      return rv ? rv : 1;
  }
  return -2;
rest: /* the second part is ours to read too */
  return rv ? rv : shm_cma_read(e, c->peer, (uint8_t *)dst + h, addr + h, n - h, sid);
}

/* conn push for a local peer: our send r's second part to raddr, unless the
 * receiver claimed it.  1 when r is complete (written, and the receiver has
 * its part), else 0 (a CTS completes it).  The address comes from the
 * peer: a bad one fails the write (EFAULT), and the receiver then reads
 * the part itself. */
static int shm_split_push(erdma_conn *c, erdma_req *r, uint64_t raddr) {
  erdma_engine *e = c->e;
  uint32_t sid = r->cma_sid;
  if (!sid || !e->shm.seg || !c->peer_seg) return 0;
  _Atomic uint64_t *claim = cma_claim(e->shm.seg, sid);
  uint64_t tag = (uint64_t)sid << 8, v = tag, h = split_at(r->nbytes);
  if (!atomic_compare_exchange_strong(claim, &v, tag | CLAIM_SENDER))
    return 0; /* the receiver was first (or a second CTS) */
  int rv = shm_cma_copy(e, c->peer, (uint8_t *)r->sbuf + h, raddr + h, r->nbytes - h, 1);
  v = atomic_fetch_or(claim, rv ? CLAIM_FAILED : CLAIM_SENT) | (rv ? CLAIM_FAILED : CLAIM_SENT);
  if (rv) return 0;
  e->stats.split_pushes++;
  uint64_t deadline = claim_deadline(e);
  for (int tries = 0; !(v & (CLAIM_READ | CLAIM_UNREAD));) {
    uint64_t w = claim_wait(e, c->peer_pid, claim, v, deadline);
    if (w != CLAIM_GAVE_UP) {
      v = w;
    } else if (atomic_compare_exchange_strong(claim, &v, v | CLAIM_ABANDONED) ||
               ++tries == 8) {
      return 0; /* the receiver, if it comes back, answers with its CTS */
    }
  }
  return (v & CLAIM_READ) != 0;
}

/* conn split_ok for a local peer: both sides can reach the claim word, and
 * our CMA reads have not been refused. */
static int shm_split_ok(const erdma_conn *c) {
  return c->peer_seg && __atomic_load_n(&c->e->shm.cma, __ATOMIC_RELAXED);
}

/* ---- bulk copies of the one-host collectives (erdma_bulk.c) ----
 * Unlike shm_cma_read these run without e->mu, so that both processes of a
 * pair copy at once while the engine goes on. */

/* 1 if local peer `peer` can be read and written with CMA right now. */
int shm_cma_ok(erdma_engine *e, int peer) {
  if (peer < 0 || peer >= e->cfg.size || peer == e->cfg.rank) return 0;
  erdma_conn *c = e->peers[peer].conn;
  return c && c->shm && c->peer_seg && __atomic_load_n(&e->shm.cma, __ATOMIC_RELAXED);
}

/* n bytes between `local` and address `remote` of local peer `peer`:
 * write != 0 copies local -> peer (process_vm_writev), else peer -> local.
 * 0 when done; -1 when CMA is off or failed (the caller sends the bytes as
 * a message instead); a refusal (no ptrace access) turns CMA off for good. */
int shm_cma_copy(erdma_engine *e, int peer, void *local, uint64_t remote, uint64_t n,
                 int write) {
  if (!shm_cma_ok(e, peer)) return -1;
  pid_t pid = e->peers[peer].conn->peer_pid;
  uint64_t done = 0;
  while (done < n) {
    ssize_t got =
        cma_io(e, pid, (uint8_t *)local + done, remote + done, (size_t)(n - done), write);
    if (got <= 0) {
      if (got < 0 && (errno == EPERM || errno == ENOSYS || errno == EACCES)) {
        if (e->cfg.verbose)
          fprintf(stderr, "erdma[%d]: %s rank %d refused (%s); large messages go "
                          "through the ring\n", e->cfg.rank,
                  write ? "process_vm_writev to" : "process_vm_readv from", peer,
                  strerror(errno));
        __atomic_store_n(&e->shm.cma, 0, __ATOMIC_RELAXED);
      }
      return -1;
    }
    done += (uint64_t)got;
  }
  if (!write && n) __atomic_store_n(&e->peers[peer].cma_read, 1, __ATOMIC_RELAXED);
  return 0;
}

int shm_cma_read_seen(erdma_engine *e, int peer) {
  return shm_cma_ok(e, peer) && __atomic_load_n(&e->peers[peer].cma_read, __ATOMIC_RELAXED);
}

static void shm_conn_release(erdma_conn *c) {
  c->peer_seg = NULL; /* unmapped at teardown (shm_state.maps) */
}

void shm_teardown(erdma_engine *e) {
  shm_state *s = &e->shm;
  /* a waiter peeking at the rings without the lock leaves within its spin;
   * one asleep on the bell is woken and leaves */
  while (__atomic_load_n(&s->lf_spin, __ATOMIC_ACQUIRE)) {
    if (s->seg) ring_bell(s->seg);
    sched_yield();
  }
  if (s->seg) {
    atomic_store(&s->seg->closed, 1);
    if (!s->unlinked) shm_unlink(s->name);
    munmap(s->seg, s->map_len);
  }
  /* the peers' segments stay mapped while connections point into them
   * (shm_unmap_peers, once erdma_engine_free has freed those) */
  struct shm_seg **maps = s->maps;
  int nmaps = s->nmaps;
  size_t maps_len = s->maps_len;
  free(s->local);
  memset(s, 0, sizeof *s);
  s->maps = maps;
  s->nmaps = nmaps;
  s->maps_len = maps_len;
}

void shm_unmap_peers(erdma_engine *e) {
  shm_state *s = &e->shm;
  for (int i = 0; s->maps && i < s->nmaps; i++)
    if (s->maps[i]) munmap(s->maps[i], s->maps_len);
  free(s->maps);
  s->maps = NULL;
  s->nmaps = 0;
}

/* ---- two-rank Barriers by flags ----
 * A two-rank Barrier by messages costs each side a ring write, a match and
 * a request; by flags it is one store and one load of a line each.  Both
 * ranks must take the same way at every Barrier, so they agree at one by
 * messages: each sends erdma_pair_offer's byte as its token (0: no, as
 * every other Barrier's token), and after the exchange both call
 * erdma_pair_settle with the two bytes, which both now know.  From then on
 * a Barrier counts its owner's slot up and waits for the peer's count to
 * reach it.  A slot holds ctx << 32 | count: a reader that finds another
 * context there knows that the peer freed the communicator, which it does
 * only after its last Barrier on it (context ids are never reused within a
 * job).  A slot freed before the peer took its last bytes stays as it is
 * (parked, found by no lookup) until the peer's count shows them taken. */

static int pair_done(const shm_pair *p) {
  uint64_t w = atomic_load_explicit(p->theirs, memory_order_acquire);
  if ((uint32_t)(w >> 32) != p->ctx || (int32_t)((uint32_t)w - (p->count - p->slack)) >= 0)
    return 1;
  if (!p->data_wait) return 0;
  uint64_t d = atomic_load_explicit(p->theirs + 1, memory_order_acquire);
  return (int32_t)((uint32_t)(d >> 32) - p->count) >= 0;
}

/* Whether the peer has taken everything we put in a slot: its count caught
 * up with ours, or it left the communicator (another context in its word),
 * or it failed.  Until then a freed slot stays as it was (parked): a
 * receiver may still be on its way to Bcasts' bytes (up to four
 * operations') that our rank put there and returned from. */
static int pair_peer_done(erdma_engine *e, const shm_pair *p) {
  uint64_t w = atomic_load_explicit(p->theirs, memory_order_acquire);
  return (uint32_t)(w >> 32) != p->ctx || (int32_t)((uint32_t)w - p->count) >= 0 ||
         e->peers[p->peer].error ||
         atomic_load_explicit(&p->peer_seg->closed, memory_order_relaxed);
}

static void pair_free(shm_state *s, shm_pair *p) {
  atomic_store_explicit(p->mine, 0, memory_order_release);
  if (p->on) s->pair_gen++; /* (an offer never agreed was never found) */
  memset(p, 0, sizeof *p);
}

int erdma_pair_offer(erdma_engine *e, int peer, uint32_t ctx) {
  if (!e || peer < 0 || peer >= e->cfg.size || peer == e->cfg.rank || !ctx) return 0;
  shm_state *s = &e->shm;
  int tok = 0, at = -1;
  pthread_mutex_lock(&e->mu);
  erdma_conn *c = e->peers[peer].conn;
  if (s->seg && c && c->shm && !c->closed && c->peer_seg && !e->peers[peer].error) {
    for (int i = 0; i < SHM_PAIRS; i++) {
      shm_pair *p = &s->pair[i];
      if (p->ctx == ctx && !p->on && !p->parked) { /* an offer never settled */
        at = i;
        break;
      }
      if (at < 0 && (!p->ctx || (p->parked && pair_peer_done(e, p)))) at = i;
    }
  }
  if (at >= 0) {
    shm_pair *p = &s->pair[at]; /* (a parked one's words are all written anew below) */
    memset(p, 0, sizeof *p);
    p->ctx = ctx;
    p->peer = peer;
    p->mine = pair_word(s->seg, at);
    p->my_area = pair_area(s->seg, at);
    p->peer_seg = c->peer_seg;
    atomic_store_explicit(p->mine + 1, 0, memory_order_relaxed);
    atomic_store_explicit(p->mine, (uint64_t)ctx << 32, memory_order_release);
    tok = 0x80 | at;
  }
  pthread_mutex_unlock(&e->mu);
  return tok;
}

int erdma_pair_settle(erdma_engine *e, uint32_t ctx, int mine, int theirs) {
  if (!e || !(mine & 0x80) || (mine & 0x7f) >= SHM_PAIRS) return -1;
  shm_state *s = &e->shm;
  int slot = -1;
  pthread_mutex_lock(&e->mu);
  shm_pair *p = &s->pair[mine & 0x7f];
  if (p->ctx == ctx && !p->on && !p->parked) {
    if ((theirs & 0x80) && (theirs & 0x7f) < SHM_PAIRS) {
      p->theirs = pair_word(p->peer_seg, theirs & 0x7f);
      p->their_area = pair_area(p->peer_seg, theirs & 0x7f);
      p->on = 1;
      s->pair_gen++;
      slot = mine & 0x7f;
    } else {
      pair_free(s, p);
    }
  }
  pthread_mutex_unlock(&e->mu);
  return slot;
}

int erdma_pair_find(erdma_engine *e, int peer, uint32_t ctx) {
  int slot = -1;
  if (!e || !ctx) return -1;
  pthread_mutex_lock(&e->mu);
  for (int i = 0; i < SHM_PAIRS && slot < 0; i++)
    if (e->shm.pair[i].on && e->shm.pair[i].ctx == ctx && e->shm.pair[i].peer == peer) slot = i;
  pthread_mutex_unlock(&e->mu);
  return slot;
}

unsigned erdma_pair_gen(erdma_engine *e) {
  return e ? __atomic_load_n(&e->shm.pair_gen, __ATOMIC_ACQUIRE) : 0;
}

int erdma_pair_is(erdma_engine *e, int slot, uint32_t ctx) {
  return e && slot >= 0 && slot < SHM_PAIRS && e->shm.pair[slot].on &&
         e->shm.pair[slot].ctx == ctx;
}

void shm_pair_forget(erdma_engine *e, uint32_t ctx) {
  shm_state *s = &e->shm;
  for (int i = 0; i < SHM_PAIRS; i++) { /* its point-to-point and collective contexts */
    shm_pair *p = &s->pair[i];
    if (!p->ctx || p->parked || (p->ctx != ctx && p->ctx != ctx + 1)) continue;
    if (p->on && !pair_peer_done(e, p)) { /* reused by an offer once it is (erdma_pair_offer) */
      p->on = 0;
      p->parked = 1;
      s->pair_gen++;
    } else {
      pair_free(s, p);
    }
  }
}

void erdma_pair_arrive(erdma_engine *e, int slot) {
  shm_pair *p = &e->shm.pair[slot];
  p->slack = 0;
  p->count++;
  atomic_store_explicit(p->mine, (uint64_t)p->ctx << 32 | p->count, memory_order_release);
  /* against a peer thread that announced its sleep and looked before our store */
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(&p->peer_seg->bell_waiters, memory_order_relaxed)) ring_bell(p->peer_seg);
}

/* A two-rank Bcast of at most ERDMA_PAIR_DATA_MAX bytes by flags: the
 * root's line carries up to SHM_PAIR_LINE_MAX bytes after a word naming
 * the operation they belong to (count << 32 | length), so that a receiver
 * whose root took another way (sizes that differ between the ranks: an
 * erroneous program) gets an error rather than stale bytes.  Larger bytes
 * go into the slot's area for the operation, after the same word.  The
 * root writes into its line only once the peer's count shows it took all
 * the bytes before, and into an area once it took all but the last
 * SHM_PAIR_DEPTH - 1 operations' (erdma_pair_lead, then erdma_pair_wait),
 * so that a root of back-to-back Bcasts runs ahead of its receiver as a
 * sender into a ring does.  The receiver counts the operation, waits,
 * copies, and only then publishes its count. */
_Static_assert(16 + SHM_PAIR_LINE_MAX <= SHM_PAIR_BYTES, "a pair's small bytes fit its lines");

/* The word naming operation `op` of n bytes and where its bytes go: the
 * slot's second word and line (w), or the operation's area (areas), whose
 * next word holds the communicator's context: a slot reused by another
 * communicator starts counting again, and its areas still hold the old
 * one's words. */
static _Atomic uint64_t *pair_head(_Atomic uint64_t *w, uint8_t *areas, uint32_t op, uint64_t n,
                                   uint8_t **data) {
  if (n <= SHM_PAIR_LINE_MAX) {
    *data = (uint8_t *)w + 16;
    return w + 1;
  }
  uint8_t *a = areas + (size_t)(op % SHM_PAIR_DEPTH) * SHM_PAIR_AREA;
  *data = a + 64;
  return (_Atomic uint64_t *)a;
}

/* n 0: the wait before an Allgather's share (the peer took everything) */
void erdma_pair_lead(erdma_engine *e, int slot, uint64_t n) {
  e->shm.pair[slot].slack = n > SHM_PAIR_LINE_MAX ? SHM_PAIR_DEPTH - 1 : 0;
}

/* Our next operation's n bytes and the word naming them (an area's also
 * its context), stored relaxed: the caller's release store publishes them */
static void pair_write(shm_pair *p, const void *buf, uint64_t n) {
  uint8_t *data;
  uint32_t op = p->count + 1;
  _Atomic uint64_t *head = pair_head(p->mine, p->my_area, op, n, &data);
  if (n) erdma_copy_out(data, buf, n);
  if (head != p->mine + 1) atomic_store_explicit(head + 1, p->ctx, memory_order_relaxed);
  atomic_store_explicit(head, (uint64_t)op << 32 | n, memory_order_relaxed);
}

/* The area our next operation of n bytes will write, asked for with
 * PREFETCHW once this one is out: the peer read it SHM_PAIR_DEPTH
 * operations ago, so each of its lines must be taken back from the peer's
 * cache before our stores to it complete, and the release that publishes
 * those bytes (erdma_pair_arrive's fence) waited for all of them.  Asked
 * for now, they come while the caller returns to its program (back to back,
 * 8 KiB Bcasts: 1.0-1.2 -> 0.87 us a call; 2-8 KiB Allgathers and Alltoalls
 * 1.2-1.35x faster).  Only above `above` bytes: a Bcast's root runs ahead of
 * its receiver, which may still be reading that area (4 KiB Bcasts: 0.58
 * -> 0.62 us).  A hint: a NOP on CPUs without it; the bytes and their order
 * do not change. */
static void pair_prepare_next(shm_pair *p, uint64_t n, uint64_t above) {
#if defined(__x86_64__)
  if (n <= above) return;
  uint8_t *data;
  _Atomic uint64_t *head = pair_head(p->mine, p->my_area, p->count + 1, n, &data);
  for (uint8_t *a = (uint8_t *)head; a < data + n; a += 64)
    __asm__ volatile("prefetchw (%0)" ::"r"(a));
#else
  (void)p;
  (void)n;
  (void)above;
#endif
}

int erdma_pair_put(erdma_engine *e, int slot, const void *buf, uint64_t n) {
  shm_pair *p = &e->shm.pair[slot];
  p->slack = 0;
  if (n > ERDMA_PAIR_DATA_MAX || (n && !buf)) return ERDMA_ERR_INVAL;
  pair_write(p, buf, n);
  erdma_pair_arrive(e, slot); /* (its release store publishes the bytes) */
  pair_prepare_next(p, n, 4096);
  return 0;
}

void erdma_pair_expect(erdma_engine *e, int slot) {
  e->shm.pair[slot].slack = 0;
  e->shm.pair[slot].count++;
  e->shm.pair[slot].expecting = 1;
}

/* A two-rank Allgather's exchange: both ranks put their block as a Bcast
 * root does (once the peer took all before: erdma_pair_lead with 0), but the slot's
 * second word (released last) is what the peer waits for, and the count is
 * published only once the peer's block is taken (erdma_pair_take), so that
 * neither writes its next block over one the other has not read. */
int erdma_pair_share(erdma_engine *e, int slot, const void *buf, uint64_t n) {
  shm_pair *p = &e->shm.pair[slot];
  p->slack = 0;
  if (!n || n > ERDMA_PAIR_DATA_MAX || !buf) return ERDMA_ERR_INVAL;
  pair_write(p, buf, n);
  p->count++;
  p->data_wait = 1;
  p->expecting = 1;
  /* (for bytes in the lines the same word as pair_write's, now released) */
  atomic_store_explicit(p->mine + 1, (uint64_t)p->count << 32 | n, memory_order_release);
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(&p->peer_seg->bell_waiters, memory_order_relaxed)) ring_bell(p->peer_seg);
  /* in step with the peer: it is done with that area (a line's bytes: no area) */
  pair_prepare_next(p, n, SHM_PAIR_LINE_MAX);
  return 0;
}

/* A receiver's wait given up (a signal) before erdma_pair_take: as if never
 * expected, so that the Bcast called again takes the root's bytes, as a
 * receive withdrawn and posted again takes its message.  Nothing once taken
 * (or never expected), so that a caller interrupted anywhere may call it. */
void erdma_pair_withdraw(erdma_engine *e, int slot) {
  shm_pair *p = &e->shm.pair[slot];
  if (!p->expecting) return;
  p->count--;
  p->expecting = 0;
  p->data_wait = 0;
}

int erdma_pair_take(erdma_engine *e, int slot, void *buf, uint64_t n) {
  shm_pair *p = &e->shm.pair[slot];
  uint8_t *data;
  uint64_t w = atomic_load_explicit(p->theirs, memory_order_acquire);
  _Atomic uint64_t *head = pair_head(p->theirs, p->their_area, p->count, n, &data);
  uint64_t d = atomic_load_explicit(head, memory_order_acquire);
  int rc = 0;
  p->data_wait = 0;
  p->expecting = 0;
  if ((uint32_t)(w >> 32) != p->ctx)
    rc = ERDMA_ERR_PEER; /* the root freed the communicator instead */
  else if ((uint32_t)(d >> 32) != p->count || (uint32_t)d != n ||
           (head != p->theirs + 1 &&
            atomic_load_explicit(head + 1, memory_order_relaxed) != p->ctx))
    rc = ERDMA_ERR_TRUNCATE; /* the root sent other bytes, or none this way */
  else if (n)
    erdma_copy(buf, data, n);
  /* taken: the root may write its next bytes (and the peer's Barriers go on) */
  atomic_store_explicit(p->mine, (uint64_t)p->ctx << 32 | p->count, memory_order_release);
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(&p->peer_seg->bell_waiters, memory_order_relaxed)) ring_bell(p->peer_seg);
  return rc;
}

int erdma_pair_cma_ok(erdma_engine *e, int slot) {
  if (slot < 0 || slot >= SHM_PAIRS) return 0;
  const shm_pair *p = &e->shm.pair[slot];
  return p->on && p->peer_seg && e->shm.cma && shm_cma_ok(e, p->peer);
}

/* n bytes at addr in the pair's peer into local (write 0) or from local to
 * there (shm_cma_copy).  The address comes from the peer: a bad one fails
 * the copy (EFAULT), and the length is ours, so a lying peer can make us
 * read or write only its own memory. */
static int pair_cma(erdma_engine *e, int slot, void *local, uint64_t addr, uint64_t n,
                    int write) {
  if (!erdma_pair_cma_ok(e, slot)) return -1;
  return shm_cma_copy(e, e->shm.pair[slot].peer, local, addr, n, write);
}

int erdma_pair_read(erdma_engine *e, int slot, void *dst, uint64_t addr, uint64_t n) {
  return pair_cma(e, slot, dst, addr, n, 0);
}

/* (the address comes from the peer, as erdma_pair_read's: a lying one
 * makes us write only into its own memory) */
int erdma_pair_write(erdma_engine *e, int slot, uint64_t addr, const void *src, uint64_t n) {
  return pair_cma(e, slot, (void *)src, addr, n, 1);
}

/* Where a Bcast's copy splits: the receiver reads [0, split), the root
 * writes the rest; a multiple of 4 KiB, so that the two copies share no
 * line of a buffer that starts a line */
uint64_t erdma_pair_split(uint64_t n) {
  return (n / 2 + 4095) & ~(uint64_t)4095;
}

int erdma_pair_poll(erdma_engine *e, int slot, int spins) {
  const shm_pair *p = &e->shm.pair[slot];
  if (e->shm.oversub) spins = 1; /* the peer may be waiting for our core */
  for (int i = 0; i < spins; i++) {
    if (pair_done(p)) return 1;
    cpu_relax();
  }
  return 0;
}

/* Spin as erdma_req_wait's waiter would, then sleep on our bell; a wake-up
 * with bytes in our rings drains them, as shm_wait does, since producers
 * that saw us asleep rang the bell instead of the doorbell. */
int erdma_pair_wait(erdma_engine *e, int slot, double timeout) {
  shm_state *s = &e->shm;
  shm_pair *p = &s->pair[slot];
  if (pair_done(p)) return 0;
  uint64_t now = erdma_now();
  uint64_t deadline = timeout < 0 ? UINT64_MAX : now + (uint64_t)(timeout * 1e9);
  uint64_t until = now + (s->spin_ns ? s->spin_ns : (uint64_t)e->cfg.spin_us * 1000u);
  struct shm_seg *seg = s->seg;
  int rv = 0;
  __atomic_add_fetch(&s->lf_spin, 1, __ATOMIC_ACQ_REL); /* teardown waits for us */
  for (unsigned it = 1; !pair_done(p); it++) {
    if ((it & 63) == 0 && (erdma_now() >= until || !__atomic_load_n(&e->running, __ATOMIC_RELAXED)))
      break;
    /* the peer on our CPU: sleep at once rather than keep it from running
     * (as spin_shm) */
    if (!s->oversub && (it & 63) == 1 && shm_shares_cpu(e) && !shm_move_off_cpu(e)) break;
    if (s->oversub) sched_yield(); /* the peer may need our core */
    else cpu_relax();
  }
  int slept = 0;
  for (;;) {
    if (pair_done(p)) break;
    int err = __atomic_load_n(&e->peers[p->peer].error, __ATOMIC_RELAXED);
    if (err || atomic_load_explicit(&p->peer_seg->closed, memory_order_relaxed)) {
      if (pair_done(p)) break; /* it arrived, then left or failed */
      rv = err ? err : ERDMA_ERR_PEER;
      break;
    }
    if ((now = erdma_now()) >= deadline) {
      rv = ERDMA_ERR_TIMEOUT;
      break;
    }
    /* as shm_wait: while we sleep, producers and consumers that see us
     * asleep ring our bell instead of the doorbell, so our rings and our
     * stalled sends are ours to move */
    __atomic_sub_fetch(&s->lf_spin, 1, __ATOMIC_ACQ_REL); /* never wait for the lock counted */
    pthread_mutex_lock(&e->mu);
    if (s->seg != seg || !e->running) { /* shut down meanwhile: teardown may have run */
      pthread_mutex_unlock(&e->mu);
      return ERDMA_ERR_STATE;
    }
    shm_poll(e);
    conn_flush_all(e);
    int held = s->held; /* bytes left in a ring (shm_hold_max): no reason to poll again */
    uint64_t ns = deadline - now;
    if (ns > 50000000ull) ns = 50000000ull; /* the peer's failure, shutdown */
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    atomic_fetch_add_explicit(&seg->bell_waiters, 1, memory_order_seq_cst);
    uint32_t v = atomic_load_explicit(&seg->bell, memory_order_seq_cst);
    __atomic_add_fetch(&s->lf_spin, 1, __ATOMIC_ACQ_REL);
    pthread_mutex_unlock(&e->mu);
    if (!pair_done(p) && (held || !shm_rx_ready(e)))
      syscall(SYS_futex, &seg->bell, FUTEX_WAIT, v, &ts, NULL, 0);
    atomic_fetch_sub_explicit(&seg->bell_waiters, 1, memory_order_seq_cst);
    slept = 1;
  }
  __atomic_sub_fetch(&s->lf_spin, 1, __ATOMIC_ACQ_REL);
  if (slept && !rv) { /* what came while we slept, as shm_wait leaves */
    pthread_mutex_lock(&e->mu);
    if (s->seg == seg && e->running) {
      shm_poll(e);
      conn_flush_all(e);
    }
    pthread_mutex_unlock(&e->mu);
  }
  return rv;
}

/* ---- the channel of a shared-memory connection (erdma_chan) ---- */
static uint64_t shm_chan_eager_max(const erdma_conn *c) { return c->e->cfg.shm_eager_limit; }

static int shm_chan_offer(erdma_conn *c, erdma_req *r) {
  return c->e->shm.cma && shm_cma_publish(c->e, r);
}

static int shm_chan_take(erdma_conn *c, void *dst, uint64_t addr, uint64_t n, uint32_t sid) {
  return shm_cma_read(c->e, c->peer, dst, addr, n, sid);
}

static int shm_chan_flush(erdma_conn *c) { return c->closed ? 0 : shm_flush(c); }

/* Rings: eager frames written straight in, sends read in place with CMA. */
const erdma_chan erdma_shm_chan = {
    .name = "shm",
    .in_place = 1,
    .eager_max = shm_chan_eager_max,
    .send_now = shm_send_direct,
    .offer = shm_chan_offer,
    .withdraw = shm_cma_release,
    .take = shm_chan_take,
    .split_ok = shm_split_ok,
    .take_split = shm_split_take,
    .push = shm_split_push,
    .flush = shm_chan_flush,
    .release = shm_conn_release,
};
