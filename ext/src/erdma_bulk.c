/*
 * erdma_bulk.c - large collectives among ranks of one host.
 *
 * Large Bcast between two ranks and Alltoall with CMA single copies that
 * both processes of a pair make at the same time (one core each), instead
 * of one process_vm_readv by the receiver.  A round of small messages
 * trades the buffer addresses first; a pair that cannot use CMA (another
 * host, ERDMA_SHM_CMA=0, a refused process_vm_*) moves the same bytes as
 * ordinary messages, so the result never depends on the path.  Tags:
 * tag .. tag + ERDMA_BULK_TAGS - 1. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "erdma.h"
#include "erdma_coll.h"
#include "erdma_shm.h"
#include "erdma_copy.h"

typedef struct bulk_hdr {
  uint64_t addr;   /* the buffer (or block) in the sender's address space */
  uint64_t len;    /* its bytes */
  uint64_t raddr;  /* Alltoall: where the receiver's block from us lands */
  uint64_t prog;   /* address of the sender's progress word(s) */
  uint64_t limit;  /* chunks the sender may claim (static split), or UINT64_MAX */
  uint64_t done;   /* second round: the chunks its loop completed */
  uint64_t done2;
  uint32_t cma;    /* the sender can reach us with CMA */
  uint32_t pad;
} bulk_hdr;

/* A process's own block of a large one-host Alltoall is copied with
 * non-temporal stores when the collective's buffers (send and receive of
 * every rank) are well over the last-level cache: they skip the
 * read-for-ownership of the destination and leave the caches to the CMA
 * copies that run at the same time (bench/memfloor: 16 MiB Alltoall 3-10 %,
 * 64 MiB 15-35 % faster).  Below, where the buffers stay in the cache, they
 * would send them to memory (4 MiB: 1.7x slower).  glibc's memcpy would
 * stream only from 3/4 of the L3 per thread, which it reads from CPUID.
 * Same bytes as memcpy. */
#define BULK_NT_MIN ((uint64_t)1 << 20)
#define BULK_LLC_DEFAULT ((uint64_t)32 << 20)

/* The L3 size as the kernel reports it (sysfs; glibc's sysconf reads CPUID,
 * which on some virtual machines claims 320 MiB for a 32 MiB L3), else a guess. */
static uint64_t bulk_llc(void) {
  static uint64_t llc; /* racy but idempotent */
  uint64_t v = __atomic_load_n(&llc, __ATOMIC_RELAXED);
  if (!v) {
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
    unsigned long long x = 0;
    char unit = 0;
    if (f) {
      if (fscanf(f, "%llu%c", &x, &unit) < 1) x = 0;
      fclose(f);
    }
    v = (uint64_t)x * (unit == 'K' ? 1024u : unit == 'M' ? 1048576u : 1u);
    if (v < ((uint64_t)1 << 20)) v = BULK_LLC_DEFAULT;
    __atomic_store_n(&llc, v, __ATOMIC_RELAXED);
  }
  return v;
}

/* 1 if the own block (blk bytes) of an Alltoall of n ranks goes with NT stores */
static int bulk_nt(uint64_t blk, int n) {
  uint64_t llc = bulk_llc(), nn = (uint64_t)n * (uint64_t)n * 2; /* buffers: 2 n^2 blk */
  return blk >= BULK_NT_MIN && blk > (llc + llc / 2) / nn;
}

/* n bytes s -> d (not overlapping); nt: with non-temporal stores */
static void bulk_copy(uint8_t *d, const uint8_t *s, uint64_t n, int nt) {
  if (nt)
    erdma_copy_nt(d, s, n);
  else
    erdma_copy(d, s, n);
}

/* Pieces that both sides of a pair claim from opposite ends: each side
 * publishes its claim in a word of its own memory, which the other reads
 * with CMA before each chunk.  A chunk claimed by both is copied twice from
 * the same source to the same place (harmless); what neither completed (a
 * copy that failed) travels as a message afterwards. */
#define BULK_CHUNK_MIN ((uint64_t)64 << 10)
#define BULK_CHUNK_MAX ((uint64_t)1 << 20)

/* Piece size of a block of nbytes (the same on both sides): about an
 * eighth, so that the sides can meet near the middle, within 64 KiB..1 MiB
 * (a piece costs two system calls). */
static uint64_t bulk_chunk(uint64_t nbytes) {
  uint64_t c = ((nbytes / 8) + 4095) & ~(uint64_t)4095;
  return c < BULK_CHUNK_MIN ? BULK_CHUNK_MIN : c > BULK_CHUNK_MAX ? BULK_CHUNK_MAX : c;
}

static void bulk_publish(volatile uint64_t *w, uint64_t v) {
  __atomic_store_n((uint64_t *)w, v, __ATOMIC_SEQ_CST);
}

/* The peer's progress word; -1 if it cannot be read. */
static int bulk_peek(erdma_engine *e, int peer, uint64_t addr, uint64_t *v) {
  return shm_cma_copy(e, peer, v, addr, sizeof *v, 0);
}

/* Claim chunks [0, ...) of a block of `nbytes` (local <-> remote, write: push)
 * from the front while the peer's word at `peer_back` (its lowest claim from
 * the back; 0: none to read) stays above; up to `limit` chunks.  Returns the
 * chunks completed from the front. */
static uint64_t bulk_front(erdma_engine *e, int peer, uint8_t *local, uint64_t remote,
                           uint64_t nbytes, int write, uint64_t peer_back, uint64_t limit,
                           volatile uint64_t *mine, uint8_t *also, const uint8_t *also_src,
                           int also_nt) {
  uint64_t ch = bulk_chunk(nbytes), nch = (nbytes + ch - 1) / ch, i = 0;
  if (limit > nch) limit = nch;
  while (i < limit) {
    if (peer_back) {
      uint64_t b;
      if (bulk_peek(e, peer, peer_back, &b) || i >= b) break;
    }
    bulk_publish(mine, i + 1);
    uint64_t off = i * ch, len = nbytes - off < ch ? nbytes - off : ch;
    if (also) bulk_copy(also + off, also_src + off, len, also_nt);
    if (shm_cma_copy(e, peer, local + off, remote + off, len, write)) break;
    i++;
  }
  return i;
}

/* The mirror image: chunks claimed from the back while above the peer's
 * front word, down to chunk `limit`; returns the first chunk completed. */
static uint64_t bulk_back(erdma_engine *e, int peer, uint8_t *local, uint64_t remote,
                          uint64_t nbytes, int write, uint64_t peer_front, uint64_t limit,
                          volatile uint64_t *mine) {
  uint64_t ch = bulk_chunk(nbytes), nch = (nbytes + ch - 1) / ch, j = nch;
  while (j > limit) {
    if (peer_front) {
      uint64_t f;
      if (bulk_peek(e, peer, peer_front, &f) || j - 1 < f) break;
    }
    bulk_publish(mine, j - 1);
    uint64_t off = (j - 1) * ch, len = nbytes - off < ch ? nbytes - off : ch;
    if (shm_cma_copy(e, peer, local + off, remote + off, len, write)) break;
    j--;
  }
  return j;
}

/* A side that is through with its pieces says so in its `finished` word and
 * polls the other's with CMA peeks for a while rather than going to sleep in
 * the message wait that follows at once: the other is at most a piece
 * behind, and a sleeper pays a wake-up.  After BULK_SPIN_NS the message
 * wait (which sleeps) covers the rest. */
#define BULK_SPIN_NS 200000ull
#define BULK_PEEK_NS 5000ull

static inline void bulk_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static void bulk_finish(erdma_engine *e, int peer, volatile uint64_t *mine,
                        uint64_t peer_word) {
  bulk_publish(mine, 1);
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  uint64_t last = 0;
  for (;;) {
    clock_gettime(CLOCK_MONOTONIC, &t);
    uint64_t ns =
        (uint64_t)(t.tv_sec - t0.tv_sec) * 1000000000ull + (uint64_t)(t.tv_nsec - t0.tv_nsec);
    if (ns > BULK_SPIN_NS) return;
    if (ns - last < BULK_PEEK_NS && last) { /* a peek takes the peer's mm lock: not too often */
      bulk_relax();
      continue;
    }
    last = ns ? ns : 1;
    uint64_t v = 0;
    if (bulk_peek(e, peer, peer_word, &v) || v) return;
  }
}

static uint64_t bulk_limit(double part, uint64_t nbytes) {
  uint64_t ch = bulk_chunk(nbytes), nch = (nbytes + ch - 1) / ch;
  if (!(part >= 0.0 && part <= 1.0)) return UINT64_MAX; /* dynamic */
  return (uint64_t)((double)nch * part + 0.5);
}

/* Wait for *rp, free it (withdrawn first if the wait ran out); 0 or an error. */
static int bulk_wait(erdma_req **rp, double timeout, uint64_t want) {
  erdma_status st;
  if (!*rp) return 0;
  int rc = erdma_req_wait(*rp, timeout, &st);
  if (rc) {
    erdma_req_abort(*rp);
    erdma_req_free(*rp);
    *rp = NULL;
    return rc;
  }
  erdma_req_free(*rp);
  *rp = NULL;
  if (st.error) return st.error;
  if (want != UINT64_MAX && st.nbytes != want) return ERDMA_ERR_TRUNCATE;
  return 0;
}

/* The next of the n header receives in reqs to complete: its index in *j,
 * the request freed; 0 or an error. */
static int bulk_next_hdr(erdma_req **reqs, int n, double timeout, int *j) {
  *j = -1;
  int rc = erdma_req_waitany(reqs, n, timeout, j);
  if (rc) return rc;
  if (*j < 0 || *j >= n) return ERDMA_ERR_STATE;
  return bulk_wait(&reqs[*j], timeout, sizeof(bulk_hdr));
}

static void bulk_drop(erdma_req **reqs, int n) {
  for (int i = 0; i < n; i++)
    if (reqs[i]) {
      erdma_req_abort(reqs[i]);
      erdma_req_free(reqs[i]);
      reqs[i] = NULL;
    }
}

/* Send *mine to `peer` and receive its *theirs (tag). */
static int bulk_trade(erdma_engine *e, int peer, int tag, uint32_t ctx, const bulk_hdr *mine,
                      bulk_hdr *theirs, double timeout) {
  erdma_req *r[2] = {NULL, NULL};
  int rc = erdma_irecv(e, theirs, sizeof *theirs, peer, tag, ctx, 0, &r[0]);
  if (!rc) rc = erdma_isend(e, mine, sizeof *mine, peer, tag, ctx, 0, &r[1]);
  if (!rc) rc = bulk_wait(&r[0], timeout, sizeof *theirs);
  if (!rc) rc = bulk_wait(&r[1], timeout, UINT64_MAX);
  bulk_drop(r, 2);
  return rc;
}

int erdma_coll_bcast_pair(erdma_engine *e, void *buf, uint64_t nbytes, int root,
                          const int *ranks, int n, int me, double root_part, int tag,
                          uint32_t ctx, double timeout) {
  if (coll_check_comm(e, ranks, n, me) || n != 2 || root < 0 || root > 1 || (nbytes && !buf))
    return ERDMA_ERR_INVAL;
  int peer = ranks[1 - me], isroot = me == root, rc;
  uint8_t *b = buf;
  uint64_t ch = bulk_chunk(nbytes), nch = (nbytes + ch - 1) / ch;
  /* root: chunks claimed from the front; the other: lowest chunk claimed */
  /* prog[0]: the claim word; prog[1]: finished (bulk_finish) */
  volatile uint64_t prog[2] = {isroot ? 0 : nch, 0};
  bulk_hdr mine = {(uintptr_t)buf, nbytes, 0, (uintptr_t)prog, bulk_limit(root_part, nbytes),
                   0, 0, (uint32_t)shm_cma_ok(e, peer), 0}, theirs;
  if ((rc = bulk_trade(e, peer, tag, ctx, &mine, &theirs, timeout))) return rc;
  if (theirs.len != nbytes) return ERDMA_ERR_TRUNCATE;
  erdma_req *r[1] = {NULL};
  uint64_t lo = 0, hi = nbytes; /* bytes that go as a message */
  if (mine.cma && theirs.cma && nbytes) {
    /* the root writes from the front, the other reads from the back; a
     * static split (root_part) skips the progress words */
    uint64_t limit = isroot ? mine.limit : theirs.limit;
    int dyn = limit == UINT64_MAX;
    bulk_hdr done = mine, tdone;
    if (isroot)
      done.done = bulk_front(e, peer, b, theirs.addr, nbytes, 1, dyn ? theirs.prog : 0,
                             dyn ? nch : limit, &prog[0], NULL, NULL, 0);
    else
      done.done = bulk_back(e, peer, b, theirs.addr, nbytes, 0, dyn ? theirs.prog : 0,
                            dyn ? 0 : limit, &prog[0]);
    bulk_finish(e, peer, &prog[1], theirs.prog + sizeof(uint64_t));
    if ((rc = bulk_trade(e, peer, tag + 2, ctx, &done, &tdone, timeout))) return rc;
    uint64_t front = isroot ? done.done : tdone.done, back = isroot ? tdone.done : done.done;
    lo = front * ch;
    hi = back * ch < nbytes ? back * ch : nbytes;
  }
  if (lo >= hi) return 0;
  rc = isroot ? erdma_isend(e, b + lo, hi - lo, peer, tag + 1, ctx, 0, &r[0])
              : erdma_irecv(e, b + lo, hi - lo, peer, tag + 1, ctx, 0, &r[0]);
  if (!rc) rc = bulk_wait(&r[0], timeout, isroot ? UINT64_MAX : hi - lo);
  bulk_drop(r, 1);
  return rc;
}

/* Alltoall (or Allgather) of two ranks: each pushes its block for the peer
 * (out) into the peer's buffer (in, on the other side) from the front, a
 * chunk of its own block (own_src -> own_dst; none if own_src is NULL)
 * right before each chunk pushed, and then helps the peer by pulling its
 * own incoming block from the back, so a process that got less CPU time is
 * helped by the other.  Copying the own chunk first overlaps the two
 * copies of a chunk in the caches, and in an Allgather (out == own_src)
 * the push reads the chunk the own copy has just read (16 MiB Allgather:
 * 1.3 ms against 1.65 pulling after a whole own copy; 16 MiB Alltoall:
 * 1.45 against 1.7).  pull_part: static share of one's own pushes
 * (tests).  Blocks below BULK_DYN_MIN are pushed whole: the progress
 * words' CMA peeks cost more than the help brings (256 KiB Alltoall:
 * 39 -> 28 us). */
#define BULK_DYN_MIN ((uint64_t)1 << 20)
/* Allgather's pair from blocks of this size (below: erdma_coll_allgather) */
#define BULK_PAIR_MIN ((uint64_t)256 << 10)

typedef struct {
  const uint8_t *own_src; /* NULL: the own block is in place */
  uint8_t *own_dst;
  const uint8_t *out; /* my block for the peer */
  uint8_t *in;        /* where the peer's block for me lands */
} pair_bufs;

static int swap_pair(erdma_engine *e, const pair_bufs *pb, uint64_t blk, const int *ranks,
                     int me, double pull_part, int tag, uint32_t ctx, double timeout) {
  int p = 1 - me, peer = ranks[p], rc;
  if (pull_part < 0 && blk < BULK_DYN_MIN) pull_part = 1.0;
  uint64_t ch = bulk_chunk(blk), nch = (blk + ch - 1) / ch;
  /* [0]: chunks of the peer's incoming block pushed from the front; [1]:
   * lowest chunk of my incoming block pulled from the back */
  volatile uint64_t prog[3] = {0, nch, 0}; /* [2]: finished (bulk_finish) */
  bulk_hdr mine = {(uintptr_t)pb->out, blk, (uintptr_t)pb->in,
                   (uintptr_t)prog, bulk_limit(pull_part, blk), 0, 0,
                   (uint32_t)shm_cma_ok(e, peer), 0}, theirs;
  if ((rc = bulk_trade(e, peer, tag, ctx, &mine, &theirs, timeout))) return rc;
  if (theirs.len != blk) return ERDMA_ERR_TRUNCATE;
  int nt = bulk_nt(blk, 2);
  uint64_t in_lo = 0, in_hi = blk, out_lo = 0, out_hi = blk; /* left for messages */
  uint64_t own_from = 0; /* the own block is copied below this */
  if (mine.cma && theirs.cma && blk) {
    int dyn_me = mine.limit == UINT64_MAX, dyn_peer = theirs.limit == UINT64_MAX;
    uint64_t pw_front = (uintptr_t)theirs.prog, pw_back = pw_front + sizeof(uint64_t);
    bulk_hdr done = mine, tdone;
    /* an Allgather whose pushes from the send buffer would stall
     * (erdma_copy.h) pushes each chunk from its copy in the receive buffer,
     * made just before: two ranks' receive buffers usually lie alike in
     * their pages (a 1-4 MiB Allgather with the buffers 16 bytes apart:
     * 0.64-0.75 of MPICH's speed pushing from the send buffer, 0.85-1.01) */
    uint8_t *push = (uint8_t *)pb->out;
    void *to = (void *)(uintptr_t)theirs.raddr;
    if (pb->own_src && pb->own_src == pb->out && erdma_copy_aliases(to, pb->out) &&
        !erdma_copy_aliases(to, pb->own_dst))
      push = pb->own_dst;
    done.done = bulk_front(e, peer, push, theirs.raddr, blk, 1,
                           dyn_me ? pw_back : 0, dyn_me ? nch : mine.limit, &prog[0],
                           pb->own_src ? pb->own_dst : NULL, pb->own_src, nt);
    own_from = done.done * ch;
    if (pb->own_src && own_from < blk)
      bulk_copy(pb->own_dst + own_from, pb->own_src + own_from, blk - own_from, nt);
    done.done2 = bulk_back(e, peer, pb->in, theirs.addr, blk, 0,
                           dyn_peer ? pw_front : 0, dyn_peer ? 0 : theirs.limit, &prog[1]);
    bulk_finish(e, peer, &prog[2], pw_front + 2 * sizeof(uint64_t));
    if ((rc = bulk_trade(e, peer, tag + 2, ctx, &done, &tdone, timeout))) return rc;
    out_lo = done.done * ch;                          /* its block: I pushed [0, lo) */
    out_hi = tdone.done2 * ch < blk ? tdone.done2 * ch : blk;
    in_lo = tdone.done * ch;                          /* my block: it pushed [0, lo) */
    in_hi = done.done2 * ch < blk ? done.done2 * ch : blk;
  } else if (blk && pb->own_src) {
    bulk_copy(pb->own_dst, pb->own_src, blk, nt);
  }
  erdma_req *r[2] = {NULL, NULL};
  rc = 0;
  if (in_lo < in_hi)
    rc = erdma_irecv(e, pb->in + in_lo, in_hi - in_lo, peer, tag + 1, ctx, 0, &r[0]);
  if (!rc && out_lo < out_hi)
    rc = erdma_isend(e, pb->out + out_lo, out_hi - out_lo, peer, tag + 1, ctx, 0, &r[1]);
  if (!rc) rc = bulk_wait(&r[0], timeout, in_hi - in_lo);
  if (!rc) rc = bulk_wait(&r[1], timeout, UINT64_MAX);
  bulk_drop(r, 2);
  return rc;
}

/* Every rank reads from each peer j the block j publishes for it
 * (src(j): address, srclen(j): bytes) into dst(j) (dstlen(j) bytes expected),
 * in the order the headers come, and waits until every peer has read its
 * own; a pair without CMA moves the block as a message.  The caller copies
 * its own block. */
typedef struct bulk_xchg {
  const uint8_t *src;        /* alltoall: send buffer; allgather: my block */
  uint8_t *dst;
  uint64_t blk;              /* alltoall: block bytes */
  const uint64_t *off, *len; /* allgather: where block j lands, its bytes */
} bulk_xchg;

static const uint8_t *xsrc(const bulk_xchg *x, int j) {
  return x->off ? x->src : x->src + (uint64_t)j * x->blk;
}
static uint64_t xsrclen(const bulk_xchg *x, int me) { return x->off ? x->len[me] : x->blk; }
static uint8_t *xdst(const bulk_xchg *x, int j) {
  return x->dst + (x->off ? x->off[j] : (uint64_t)j * x->blk);
}
static uint64_t xdstlen(const bulk_xchg *x, int j) { return x->off ? x->len[j] : x->blk; }

static int bulk_exchange(erdma_engine *e, const bulk_xchg *x, const int *ranks, int n, int me,
                         int tag, uint32_t ctx, double timeout) {
  /* per peer: header in/out, "done" in/out; requests: 6 per peer */
  bulk_hdr *h = calloc((size_t)n * 4, sizeof *h);
  erdma_req **rq = calloc((size_t)n * 6, sizeof *rq);
  if (!h || !rq) {
    free(h);
    free(rq);
    return ERDMA_ERR_NOMEM;
  }
  bulk_hdr *hin = h, *hout = h + n, *din = h + 2 * n, *dout = h + 3 * n;
  erdma_req **rh = rq, **sh = rq + n, **rd = rq + 2 * n, **sd = rq + 3 * n,
            **rf = rq + 4 * n, **sf = rq + 5 * n;
  uint64_t mylen = xsrclen(x, me);
  int rc = 0;
  for (int k = 1; k < n && !rc; k++) {
    int j = (me + k) % n;
    rc = erdma_irecv(e, &hin[j], sizeof(bulk_hdr), ranks[j], tag, ctx, 0, &rh[j]);
    if (!rc) rc = erdma_irecv(e, &din[j], sizeof(bulk_hdr), ranks[j], tag + 1, ctx, 0, &rd[j]);
  }
  for (int k = 1; k < n && !rc; k++) { /* where my block for j is */
    int j = (me + k) % n;
    hout[j].addr = (uintptr_t)xsrc(x, j);
    hout[j].len = mylen;
    hout[j].cma = (uint32_t)shm_cma_ok(e, ranks[j]);
    rc = erdma_isend(e, &hout[j], sizeof(bulk_hdr), ranks[j], tag, ctx, 0, &sh[j]);
  }
  /* pull each peer's block for me, in the order their headers come (a peer
   * that is not running does not hold up the others: CMA needs no help) */
  for (int left = n - 1; left > 0 && !rc; left--) {
    int j;
    if ((rc = bulk_next_hdr(rh, n, timeout, &j))) break;
    uint64_t want = xdstlen(x, j);
    if (hin[j].len != want) {
      rc = ERDMA_ERR_TRUNCATE;
      break;
    }
    int fail = 1;
    if (hin[j].cma && shm_cma_ok(e, ranks[j]))
      fail = want ? shm_cma_copy(e, ranks[j], xdst(x, j), hin[j].addr, want, 0) != 0 : 0;
    if (fail)
      rc = erdma_irecv(e, xdst(x, j), want, ranks[j], tag + 2, ctx, 0, &rf[j]);
    dout[j].done = (uint64_t)fail;
    if (!rc) rc = erdma_isend(e, &dout[j], sizeof(bulk_hdr), ranks[j], tag + 1, ctx, 0, &sd[j]);
  }
  /* peers done with my blocks, in any order; resend what they could not read */
  for (int left = n - 1; left > 0 && !rc; left--) {
    int j;
    if ((rc = bulk_next_hdr(rd, n, timeout, &j))) break;
    if (din[j].done)
      rc = erdma_isend(e, xsrc(x, j), mylen, ranks[j], tag + 2, ctx, 0, &sf[j]);
  }
  for (int j = 0; j < n && !rc; j++) {
    if (!rc) rc = bulk_wait(&rf[j], timeout, xdstlen(x, j));
    if (!rc) rc = bulk_wait(&sf[j], timeout, UINT64_MAX);
    if (!rc) rc = bulk_wait(&sh[j], timeout, UINT64_MAX);
    if (!rc) rc = bulk_wait(&sd[j], timeout, UINT64_MAX);
  }
  bulk_drop(rq, 6 * n);
  free(h);
  free(rq);
  return rc;
}

int erdma_coll_alltoall_bulk(erdma_engine *e, const void *sbuf, void *rbuf, uint64_t blk,
                             const int *ranks, int n, int me, double pull_part, int tag,
                             uint32_t ctx, double timeout) {
  if (coll_check_comm(e, ranks, n, me) || (blk && (!sbuf || !rbuf)) || sbuf == rbuf)
    return ERDMA_ERR_INVAL;
  const uint8_t *s = sbuf;
  uint8_t *d = rbuf;
  if (n == 1) {
    if (blk) erdma_copy(d, s, blk);
    return 0;
  }
  if (n == 2) {
    int p = 1 - me;
    pair_bufs pb = {s + (uint64_t)me * blk, d + (uint64_t)me * blk, s + (uint64_t)p * blk,
                    d + (uint64_t)p * blk};
    return swap_pair(e, &pb, blk, ranks, me, pull_part, tag, ctx, timeout);
  }
  if (blk) bulk_copy(d + (uint64_t)me * blk, s + (uint64_t)me * blk, blk, bulk_nt(blk, n));
  bulk_xchg x = {s, d, blk, NULL, NULL};
  return bulk_exchange(e, &x, ranks, n, me, tag, ctx, timeout);
}

int erdma_coll_allgather_bulk(erdma_engine *e, const void *sbuf, void *rbuf,
                              const uint64_t *offs, const uint64_t *lens, const int *ranks,
                              int n, int me, int tag, uint32_t ctx, double timeout) {
  if (coll_check_comm(e, ranks, n, me) || !offs || !lens || !rbuf) return ERDMA_ERR_INVAL;
  uint8_t *d = rbuf;
  const uint8_t *s = sbuf ? sbuf : d + offs[me];
  int apart = s == d + offs[me] || s + lens[me] <= d + offs[me] || s >= d + offs[me] + lens[me];
  if (n == 2 && lens[0] == lens[1] && lens[0] >= BULK_PAIR_MIN && apart) {
    /* as the Alltoall pair (swap_pair) */
    int p = 1 - me;
    pair_bufs pb = {s != d + offs[me] ? s : NULL, d + offs[me], s, d + offs[p]};
    return swap_pair(e, &pb, lens[0], ranks, me, -1.0, tag, ctx, timeout);
  }
  if (sbuf && lens[me] && s != d + offs[me]) erdma_move(d + offs[me], s, lens[me]);
  if (n == 1) return 0;
  bulk_xchg x = {s, d, 0, offs, lens};
  return bulk_exchange(e, &x, ranks, n, me, tag, ctx, timeout);
}

int erdma_coll_bcast_bulk(erdma_engine *e, void *buf, uint64_t nbytes, int root,
                          const int *ranks, int n, int me, int tag, uint32_t ctx,
                          double timeout) {
  if (coll_check_comm(e, ranks, n, me) || root < 0 || root >= n || (nbytes && !buf))
    return ERDMA_ERR_INVAL;
  if (n == 1) return 0;
  int rc = 0;
  if (me != root) { /* read it all straight out of the root's buffer */
    erdma_req *r[3] = {NULL, NULL, NULL};
    bulk_hdr hin, dout = {0};
    int peer = ranks[root];
    rc = erdma_irecv(e, &hin, sizeof hin, peer, tag, ctx, 0, &r[0]);
    if (!rc) rc = bulk_wait(&r[0], timeout, sizeof hin);
    if (!rc && hin.len != nbytes) rc = ERDMA_ERR_TRUNCATE;
    if (!rc) {
      int fail = 1;
      if (hin.cma && shm_cma_ok(e, peer))
        fail = nbytes ? shm_cma_copy(e, peer, buf, hin.addr, nbytes, 0) != 0 : 0;
      if (fail) rc = erdma_irecv(e, buf, nbytes, peer, tag + 2, ctx, 0, &r[1]);
      dout.done = (uint64_t)fail;
      if (!rc) rc = erdma_isend(e, &dout, sizeof dout, peer, tag + 1, ctx, 0, &r[2]);
      if (!rc) rc = bulk_wait(&r[1], timeout, nbytes);
      if (!rc) rc = bulk_wait(&r[2], timeout, UINT64_MAX);
    }
    bulk_drop(r, 3);
    return rc;
  }
  /* root: tell everyone where the data is, wait until all have read it */
  bulk_hdr *h = calloc((size_t)n * 2, sizeof *h);
  erdma_req **rq = calloc((size_t)n * 3, sizeof *rq);
  if (!h || !rq) {
    free(h);
    free(rq);
    return ERDMA_ERR_NOMEM;
  }
  bulk_hdr *hout = h, *din = h + n;
  erdma_req **sh = rq, **rd = rq + n, **sf = rq + 2 * n;
  for (int j = 0; j < n && !rc; j++) {
    if (j == me) continue;
    rc = erdma_irecv(e, &din[j], sizeof(bulk_hdr), ranks[j], tag + 1, ctx, 0, &rd[j]);
    hout[j].addr = (uintptr_t)buf;
    hout[j].len = nbytes;
    hout[j].cma = (uint32_t)shm_cma_ok(e, ranks[j]);
    if (!rc) rc = erdma_isend(e, &hout[j], sizeof(bulk_hdr), ranks[j], tag, ctx, 0, &sh[j]);
  }
  for (int left = n - 1; left > 0 && !rc; left--) {
    int j;
    if ((rc = bulk_next_hdr(rd, n, timeout, &j))) break;
    if (din[j].done) /* it could not read us: the buffer as a message */
      rc = erdma_isend(e, buf, nbytes, ranks[j], tag + 2, ctx, 0, &sf[j]);
  }
  for (int j = 0; j < n && !rc; j++) {
    if (!rc) rc = bulk_wait(&sf[j], timeout, UINT64_MAX);
    if (!rc) rc = bulk_wait(&sh[j], timeout, UINT64_MAX);
  }
  bulk_drop(rq, 3 * n);
  free(h);
  free(rq);
  return rc;
}

/* Reductions of two ranks in one sync: each reads the other's input (CMA,
 * in cache-sized pieces) over the bytes it computes and reduces it with its
 * own, both in rank order (in0 OP in1), so every result has the same bits;
 * then each waits until the other is done with its buffers.
 *   allreduce, below BULK_RED_HALVES: both compute the whole vector;
 *   allreduce, from there (push): each computes one half and writes every
 *     finished piece into the other's rbuf as well (read N/2, reduce N/2,
 *     write N/2 instead of read N, reduce N: from the pair's smallest size,
 *     above 64 KiB, 128 KiB took 18 us against 21 one call at a time);
 *   reduce_scatter: each computes its own block (into rbuf).
 * A pair without CMA trades the input ranges as messages instead.
 * In place (sbuf == rbuf, allreduce only): a push lands in the range of the
 * peer's input that the pusher itself reads, after reading it, and each
 * rank writes only into its own half, which the peer does not read; the
 * whole-vector size computes into a scratch copy until both are done.
 * Once a byte of an input is overwritten the message fallback cannot run:
 * a probe round (tag + 3) first checks that both can read, and a CMA
 * failure after a write is an error (ERDMA_ERR_STATE).  Either side in
 * place decides for both (the first header says it), so a pair of which
 * one rank is in place and the other not agrees too. */
#define BULK_RED_PIECE ((uint64_t)64 << 10)
#define BULK_RED_HALVES ((uint64_t)64 << 10) /* allreduce: halves from here */

typedef struct {
  uint64_t lo, len; /* bytes of the vector this rank computes */
  uint64_t plo;     /* ... and the peer (same length) */
  uint8_t *out;     /* where byte lo of the result goes */
  int push;         /* also write the result into the peer's rbuf at lo */
  int inplace;      /* out overlays this rank's input at lo */
  int nocma;        /* trade the inputs as messages (no scratch for CMA in place) */
} pair_part;

/* The CMA pass over part p; 1 when CMA failed (the fallback takes over).
 * *wrote: an input byte (ours in place, or the peer's) was overwritten. */
static int pair_cma(erdma_engine *e, int peer, int me, const uint8_t *s, const pair_part *p,
                    const bulk_hdr *theirs, int es, int op, int dtype, int *rc, int *wrote) {
  uint64_t piece = BULK_RED_PIECE - BULK_RED_PIECE % (uint64_t)es;
  int need_tmp = me == 1 || p->inplace;
  uint8_t *tmp = need_tmp ? malloc(piece) : NULL;
  if (need_tmp && !tmp) return 1;
  int fail = 0;
  for (uint64_t off = 0; !fail && !*rc && off < p->len; off += piece) {
    uint64_t len = p->len - off < piece ? p->len - off : piece, at = p->lo + off;
    uint64_t cnt = len / (uint64_t)es;
    uint8_t *d = p->out + off;
    if (me == 0 && !p->inplace) { /* d = in0 OP in1, in1 read into d */
      if (shm_cma_copy(e, peer, d, theirs->addr + at, len, 0)) fail = 1;
      else *rc = erdma_reduce_local(s + at, d, cnt, op, dtype);
    } else if (me == 0) { /* d is in0: in1 read into tmp, tmp = in0 OP in1 */
      if (shm_cma_copy(e, peer, tmp, theirs->addr + at, len, 0)) fail = 1;
      else if (!(*rc = erdma_reduce_local(d, tmp, cnt, op, dtype))) {
        *wrote = 1;
        erdma_copy(d, tmp, len);
      }
    } else { /* d = in0 OP in1: in1 copied to d (already there in place), in0 in tmp */
      if (shm_cma_copy(e, peer, tmp, theirs->addr + at, len, 0)) fail = 1;
      else {
        if (d != s + at) erdma_copy(d, s + at, len);
        *rc = erdma_reduce_local(tmp, d, cnt, op, dtype);
        if (p->inplace) *wrote = 1;
      }
    }
    if (!fail && !*rc && p->push) {
      *wrote = 1;
      if (shm_cma_copy(e, peer, d, theirs->raddr + at, len, 1)) fail = 1;
    }
  }
  free(tmp);
  return fail;
}

/* Without CMA: the peer's input over this rank's range as a message (and
 * ours over the peer's), then the same reduction; `fall` is the range
 * computed here (the whole vector where the CMA pass would have pushed). */
static int pair_messages(erdma_engine *e, int peer, int me, const uint8_t *s,
                         const pair_part *fall, int es, int op, int dtype, int tag,
                         uint32_t ctx, double timeout) {
  erdma_req *r[2] = {NULL, NULL};
  uint8_t *in = fall->len ? malloc(fall->len) : NULL;
  if (fall->len && !in) return ERDMA_ERR_NOMEM;
  int rc = erdma_irecv(e, in, fall->len, peer, tag, ctx, 0, &r[0]);
  if (!rc) rc = erdma_isend(e, s + fall->plo, fall->len, peer, tag, ctx, 0, &r[1]);
  if (!rc) rc = bulk_wait(&r[0], timeout, fall->len);
  if (!rc) rc = bulk_wait(&r[1], timeout, UINT64_MAX);
  bulk_drop(r, 2);
  uint64_t count = fall->len / (uint64_t)es;
  if (!rc && me == 0) { /* in0 OP in1 with in1 = in */
    rc = erdma_reduce_local(s + fall->lo, in, count, op, dtype);
    if (!rc) erdma_copy(fall->out, in, fall->len);
  } else if (!rc) {
    if (fall->out != s + fall->lo) erdma_copy(fall->out, s + fall->lo, fall->len);
    rc = erdma_reduce_local(in, fall->out, count, op, dtype);
  }
  free(in);
  return rc;
}

static int pair_reduce(erdma_engine *e, const void *sbuf, void *rbuf, uint64_t nbytes,
                       const pair_part *p, const pair_part *fall, int op, int dtype,
                       const int *ranks, int me, int tag, uint32_t ctx, double timeout) {
  int es = erdma_dtype_size(dtype), peer = ranks[1 - me], rc = 0;
  /* pad: this rank works in place (either side in place decides the
   * probe and whether a late CMA failure may still fall back) */
  bulk_hdr mine = {(uintptr_t)sbuf, nbytes, (uintptr_t)rbuf, 0, 0, 0, 0,
                   (uint32_t)(shm_cma_ok(e, peer) && !p->nocma), (uint32_t)p->inplace},
           theirs;
  if ((rc = bulk_trade(e, peer, tag, ctx, &mine, &theirs, timeout))) return rc;
  if (theirs.len != nbytes) return ERDMA_ERR_TRUNCATE;
  int inplace = p->inplace || theirs.pad;
  int wrote = 0, fail = !mine.cma || !theirs.cma;
  if (!fail && inplace && p->push && p->len) {
    /* both must be able to read before either overwrites an input: a probe
     * of one element, then a round that says whether it worked */
    uint8_t probe[16];
    bulk_hdr ok = {0}, tok;
    ok.done = (uint64_t)(shm_cma_copy(e, peer, probe, theirs.addr + p->lo, (uint64_t)es, 0) != 0);
    if ((rc = bulk_trade(e, peer, tag + 3, ctx, &ok, &tok, timeout))) return rc;
    fail = ok.done || tok.done;
  }
  if (!fail) fail = pair_cma(e, peer, me, sbuf, p, &theirs, es, op, dtype, &rc, &wrote);
  /* the closing round: done with the other's buffers, or fall back */
  bulk_hdr done = {0}, tdone;
  done.done = (uint64_t)fail;
  done.done2 = (uint64_t)wrote;
  int rc2 = bulk_trade(e, peer, tag + 1, ctx, &done, &tdone, timeout);
  if (rc) return rc;
  if (rc2) return rc2;
  if (!done.done && !tdone.done) return 0;
  if (inplace && (done.done2 || tdone.done2)) return ERDMA_ERR_STATE; /* inputs gone */
  return pair_messages(e, peer, me, sbuf, fall, es, op, dtype, tag + 2, ctx, timeout);
}

int erdma_coll_allreduce_pair(erdma_engine *e, const void *sbuf, void *rbuf, uint64_t count,
                              int op, int dtype, const int *ranks, int n, int me, int tag,
                              uint32_t ctx, double timeout) {
  int es = erdma_dtype_size(dtype);
  if (coll_check_comm(e, ranks, n, me) || n != 2 || es <= 0 || (count && !rbuf))
    return ERDMA_ERR_INVAL;
  if (!sbuf) sbuf = rbuf; /* in place */
  int inplace = sbuf == rbuf;
  uint64_t nbytes = count * (uint64_t)es, half = count / 2 * (uint64_t)es;
  pair_part whole = {0, nbytes, 0, rbuf, 0, 0, 0}, p = whole;
  uint8_t *scratch = NULL;
  if (nbytes >= BULK_RED_HALVES) { /* rank 0 the first half, rank 1 the rest */
    p.lo = me ? half : 0;
    p.len = me ? nbytes - half : half;
    p.out = (uint8_t *)rbuf + p.lo;
    p.push = 1;
    p.inplace = inplace;
  } else if (inplace && nbytes) { /* the peer reads all of our input to the end */
    if ((scratch = malloc(nbytes)))
      whole.out = p.out = scratch;
    else
      p.nocma = 1; /* messages: our input is sent before it is overwritten */
  }
  int rc = pair_reduce(e, sbuf, rbuf, nbytes, &p, &whole, op, dtype, ranks, me, tag, ctx,
                       timeout);
  if (!rc && scratch) erdma_copy(rbuf, scratch, nbytes);
  free(scratch);
  return rc;
}

int erdma_coll_reduce_scatter_pair(erdma_engine *e, const void *sbuf, void *rbuf,
                                   uint64_t count, int op, int dtype, const int *ranks, int n,
                                   int me, int tag, uint32_t ctx, double timeout) {
  int es = erdma_dtype_size(dtype);
  if (coll_check_comm(e, ranks, n, me) || n != 2 || es <= 0 || (count && (!sbuf || !rbuf)) ||
      sbuf == rbuf)
    return ERDMA_ERR_INVAL;
  uint64_t blk = count * (uint64_t)es;
  pair_part p = {me * blk, blk, (1 - me) * blk, rbuf, 0, 0, 0};
  return pair_reduce(e, sbuf, rbuf, 2 * blk, &p, &p, op, dtype, ranks, me, tag, ctx, timeout);
}

/* Allreduce of n >= 3 ranks of one host in one call: rank k computes slice
 * k of the vector (count split as evenly as elements allow), reading that
 * slice of every input with CMA, in cache-sized pieces, and reducing them
 * in rank order (((in0 OP in1) OP in2) ...); then every rank reads each
 * other slice out of its owner's rbuf.  Each slice is computed once, so
 * every rank gets the same bits.  Rounds of messages (n - 1 each way):
 *   tag     buffer addresses;
 *   tag + 1 probes: one element read from each peer, and whether it worked
 *           (any failure anywhere: every rank returns 1 before writing,
 *           and the caller runs another algorithm); skipped when every
 *           rank's header says it has read from all its peers before (a
 *           refusal turns CMA off for good, so such a pair stays readable
 *           unless a process makes itself undumpable mid-job: then the
 *           call fails with ERDMA_ERR_STATE);
 *   tag + 2 slice done: the sender's slice is final and it has read all it
 *           needs of the others' inputs (in place, the slice of its input
 *           that the receiver will overwrite);
 *   tag + 3 read done: the sender has copied the receiver's slice.
 * In place, a rank's buffer is its input until the slice-done of the slice's
 * owner; each rank writes only its own slice before that. */
#define BULK_SLICE_PIECE ((uint64_t)128 << 10)

static void slice_of(uint64_t count, int n, int k, int es, uint64_t *lo, uint64_t *len) {
  uint64_t base = count / (uint64_t)n, rem = count % (uint64_t)n, kk = (uint64_t)k;
  *lo = (kk * base + (kk < rem ? kk : rem)) * (uint64_t)es;
  *len = (base + (kk < rem)) * (uint64_t)es;
}

/* Send hdr[j] to every peer j (tag) into sreq, receiving theirs into rhdr
 * (posted before); then wait for every receive.  0 or an error. */
static int slices_round(erdma_engine *e, const int *ranks, int n, int me, int tag, uint32_t ctx,
                        bulk_hdr *out, bulk_hdr *in, erdma_req **rreq, erdma_req **sreq,
                        double timeout) {
  int rc = 0;
  for (int k = 1; k < n && !rc; k++) {
    int j = (me + k) % n;
    rc = erdma_irecv(e, &in[j], sizeof(bulk_hdr), ranks[j], tag, ctx, 0, &rreq[j]);
  }
  for (int k = 1; k < n && !rc; k++) {
    int j = (me + k) % n;
    rc = erdma_isend(e, &out[j], sizeof(bulk_hdr), ranks[j], tag, ctx, 0, &sreq[j]);
  }
  for (int j = 0; j < n && !rc; j++)
    if (j != me) rc = bulk_wait(&rreq[j], timeout, sizeof(bulk_hdr));
  return rc;
}

/* The reduction of this rank's slice; 1 when a CMA read failed. */
static int slices_reduce(erdma_engine *e, const int *ranks, int n, int me, const uint8_t *s,
                         uint8_t *out, uint64_t lo, uint64_t len, const bulk_hdr *hin, int es,
                         int op, int dtype, uint8_t *acc, uint8_t *tmp, int *rc) {
  uint64_t piece = BULK_SLICE_PIECE - BULK_SLICE_PIECE % (uint64_t)es;
  for (uint64_t off = 0; off < len && !*rc; off += piece) {
    uint64_t l = len - off < piece ? len - off : piece, at = lo + off, cnt = l / (uint64_t)es;
    const uint8_t *a; /* the partial result so far */
    if (me == 0) a = s + at;
    else if (shm_cma_copy(e, ranks[0], acc, hin[0].addr + at, l, 0)) return 1;
    else a = acc;
    for (int j = 1; j < n && !*rc; j++) {
      /* the last operand lands where the result goes */
      uint8_t *d = j == n - 1 ? out + off : (a == tmp ? acc : tmp);
      if (j == me) {
        if (d != s + at) erdma_copy(d, s + at, l);
      } else if (shm_cma_copy(e, ranks[j], d, hin[j].addr + at, l, 0)) {
        return 1;
      }
      *rc = erdma_reduce_local(a, d, cnt, op, dtype); /* d = a OP in_j */
      a = d;
    }
  }
  return 0;
}

/* Rounds 0 and 1: addresses (into h[0..2n)), then the probes unless every
 * rank has read from all its peers before (h[2n..4n)).  *ok: CMA can be
 * used by every pair (the same on every rank).  probe_at: where in a peer's
 * input this rank reads; rprobe: also read one element of its rbuf.  A
 * communicator that spans hosts is refused at once, with no round (a rank
 * on another host is so for every rank, so all see it). */
static int slices_begin(erdma_engine *e, const int *ranks, int n, int me, int tag, uint32_t ctx,
                        const uint8_t *s, const uint8_t *d, uint64_t nbytes, uint64_t probe_at,
                        int rprobe, int es, bulk_hdr *h, erdma_req **rq, double timeout,
                        int *ok) {
  bulk_hdr *o0 = h, *i0 = h + n, *o1 = h + 2 * n, *i1 = h + 3 * n;
  int rc, cma = 1, seen = 1;
  *ok = 0;
  for (int j = 0; j < n; j++)
    if (j != me && shm_is_local(e, ranks[j]) < 0) return 0;
  *ok = 1;
  for (int j = 0; j < n; j++)
    if (j != me) {
      cma &= shm_cma_ok(e, ranks[j]);
      seen &= shm_cma_read_seen(e, ranks[j]);
    }
  for (int j = 0; j < n; j++) {
    if (j == me) continue;
    o0[j].addr = (uintptr_t)s;
    o0[j].raddr = (uintptr_t)d;
    o0[j].len = nbytes;
    o0[j].cma = (uint32_t)cma;
    o0[j].done2 = (uint64_t)(cma && seen); /* the same in every header */
  }
  if ((rc = slices_round(e, ranks, n, me, tag, ctx, o0, i0, rq, rq + n, timeout))) return rc;
  int skip = cma && seen;
  for (int j = 0; j < n; j++)
    if (j != me) {
      if (i0[j].len != nbytes) return ERDMA_ERR_TRUNCATE;
      skip &= i0[j].done2 != 0;
    }
  if (skip) return 0;
  for (int j = 0; j < n; j++) { /* one element of each peer's input */
    if (j == me) continue;
    uint8_t probe[16];
    if (!cma || !i0[j].cma ||
        (nbytes && shm_cma_copy(e, ranks[j], probe, i0[j].addr + probe_at, (uint64_t)es, 0)) ||
        (nbytes && rprobe && shm_cma_copy(e, ranks[j], probe, i0[j].raddr, (uint64_t)es, 0)))
      *ok = 0;
  }
  for (int j = 0; j < n; j++) o1[j].done = (uint64_t)!*ok;
  if ((rc = slices_round(e, ranks, n, me, tag + 1, ctx, o1, i1, rq + 2 * n, rq + 3 * n,
                         timeout)))
    return rc;
  for (int j = 0; j < n; j++)
    if (j != me && i1[j].done) *ok = 0;
  return 0;
}

/* The headers, requests (8 per peer) and two reduction pieces of a call. */
typedef struct {
  bulk_hdr *h;
  erdma_req **rq;
  uint8_t *acc, *tmp;
} slices_mem;

static int slices_alloc(slices_mem *m, int n) {
  m->h = calloc((size_t)n * 8, sizeof *m->h);
  m->rq = calloc((size_t)n * 8, sizeof *m->rq);
  m->acc = malloc(2 * BULK_SLICE_PIECE);
  m->tmp = m->acc ? m->acc + BULK_SLICE_PIECE : NULL;
  return m->h && m->rq && m->acc ? 0 : ERDMA_ERR_NOMEM;
}

/* Wait for the sends (the receives are done), free everything. */
static int slices_end(slices_mem *m, int n, int me, int rc, double timeout) {
  for (int j = 0; j < n && !rc; j++)
    for (int r = 0; r < 8 && !rc; r++)
      if (j != me && m->rq) rc = bulk_wait(&m->rq[r * n + j], timeout, UINT64_MAX);
  if (m->rq) bulk_drop(m->rq, 8 * n);
  free(m->h);
  free(m->rq);
  free(m->acc);
  return rc;
}

int erdma_coll_allreduce_slices(erdma_engine *e, const void *sbuf, void *rbuf, uint64_t count,
                                int op, int dtype, const int *ranks, int n, int me, int tag,
                                uint32_t ctx, double timeout) {
  int es = erdma_dtype_size(dtype);
  /* (an op the type lacks is refused here, on every rank, not mid-round) */
  if (coll_check_comm(e, ranks, n, me) || n < 3 || es <= 0 || (count && !rbuf) ||
      erdma_reduce_local(NULL, NULL, 0, op, dtype))
    return ERDMA_ERR_INVAL;
  if (!sbuf) sbuf = rbuf;
  const uint8_t *s = sbuf;
  uint8_t *d = rbuf;
  uint64_t nbytes = count * (uint64_t)es, mylo, mylen;
  slice_of(count, n, me, es, &mylo, &mylen);
  slices_mem m;
  int rc = slices_alloc(&m, n), ok = 0, fail = 0;
  if (rc) return slices_end(&m, n, me, rc, timeout);
  /* rounds 2 and 3: out h[4n..], in h[5n..]; out h[6n..], in h[7n..] */
  bulk_hdr *i0 = m.h + n, *o2 = m.h + 4 * n, *i2 = m.h + 5 * n, *o3 = m.h + 6 * n,
           *i3 = m.h + 7 * n;
  erdma_req **rq = m.rq;
  rc = slices_begin(e, ranks, n, me, tag, ctx, s, d, nbytes, mylen ? mylo : 0, 1, es, m.h, rq,
                    timeout, &ok);
  if (!rc && ok) {
    fail = slices_reduce(e, ranks, n, me, s, d + mylo, mylo, mylen, i0, es, op, dtype, m.acc,
                         m.tmp, &rc);
    for (int j = 0; j < n; j++) o2[j].done = (uint64_t)(fail || rc);
    /* post the read-done receives first, then say the slice is done */
    for (int j = 0; j < n && !rc; j++)
      if (j != me)
        rc = erdma_irecv(e, &i3[j], sizeof(bulk_hdr), ranks[j], tag + 3, ctx, 0,
                         &rq[7 * n + j]);
    for (int j = 0; j < n && !rc; j++)
      if (j != me)
        rc = erdma_irecv(e, &i2[j], sizeof(bulk_hdr), ranks[j], tag + 2, ctx, 0,
                         &rq[5 * n + j]);
    for (int k = 1; k < n && !rc; k++) {
      int j = (me + k) % n;
      rc = erdma_isend(e, &o2[j], sizeof(bulk_hdr), ranks[j], tag + 2, ctx, 0, &rq[4 * n + j]);
    }
    /* each slice as its owner finishes it */
    for (int left = n - 1; left > 0 && !rc; left--) {
      int k;
      if ((rc = bulk_next_hdr(rq + 5 * n, n, timeout, &k))) break;
      uint64_t lo, len;
      slice_of(count, n, k, es, &lo, &len);
      int bad = (int)i2[k].done;
      if (!bad && len && shm_cma_copy(e, ranks[k], d + lo, i0[k].raddr + lo, len, 0)) bad = 1;
      fail |= bad;
      o3[k].done = (uint64_t)bad;
      rc = erdma_isend(e, &o3[k], sizeof(bulk_hdr), ranks[k], tag + 3, ctx, 0, &rq[6 * n + k]);
    }
    for (int j = 0; j < n && !rc; j++)
      if (j != me) {
        rc = bulk_wait(&rq[7 * n + j], timeout, sizeof(bulk_hdr));
        if (!rc && i3[j].done) fail = 1;
      }
  }
  if ((rc = slices_end(&m, n, me, rc, timeout))) return rc;
  if (fail) return ERDMA_ERR_STATE; /* CMA refused after the probes: inputs may be gone */
  return ok ? 0 : 1;                 /* every rank saw the same flags: all fall back */
}

int erdma_coll_reduce_scatter_slices(erdma_engine *e, const void *sbuf, void *rbuf,
                                     uint64_t count, int op, int dtype, const int *ranks,
                                     int n, int me, int tag, uint32_t ctx, double timeout) {
  int es = erdma_dtype_size(dtype);
  uint64_t blk = count * (uint64_t)es, nbytes = blk * (uint64_t)n;
  const uint8_t *s = sbuf;
  uint8_t *d = rbuf;
  if (coll_check_comm(e, ranks, n, me) || n < 3 || es <= 0 || (count && (!sbuf || !rbuf)) ||
      erdma_reduce_local(NULL, NULL, 0, op, dtype) ||
      (count && d < s + nbytes && s < d + blk)) /* overlapping buffers */
    return ERDMA_ERR_INVAL;
  slices_mem m;
  int rc = slices_alloc(&m, n), ok = 0, fail = 0;
  if (rc) return slices_end(&m, n, me, rc, timeout);
  bulk_hdr *i0 = m.h + n, *o2 = m.h + 4 * n, *i2 = m.h + 5 * n;
  uint64_t lo = (uint64_t)me * blk;
  rc = slices_begin(e, ranks, n, me, tag, ctx, s, d, nbytes, lo, 0, es, m.h, m.rq, timeout,
                    &ok);
  if (!rc && ok) {
    fail = slices_reduce(e, ranks, n, me, s, d, lo, blk, i0, es, op, dtype, m.acc, m.tmp, &rc);
    /* done with the others' inputs: a failure anywhere and every rank runs
     * the caller's other algorithm (the inputs are intact) */
    for (int j = 0; j < n; j++) o2[j].done = (uint64_t)(fail || rc);
    if (!rc)
      rc = slices_round(e, ranks, n, me, tag + 2, ctx, o2, i2, m.rq + 5 * n, m.rq + 4 * n,
                        timeout);
    for (int j = 0; j < n && !rc; j++)
      if (j != me && i2[j].done) fail = 1;
  }
  if ((rc = slices_end(&m, n, me, rc, timeout))) return rc;
  return ok && !fail ? 0 : 1;
}
