/* memfloor: the memory traffic of a two-rank Alltoall, and nothing else.
 *
 * Two processes pinned to CPUs 0 and 1 run at the same time, per call,
 * exactly what an Alltoall of `size` bytes per rank moves: each copies its
 * own block (size/2) into its receive buffer and copies the peer's block
 * for it (size/2) out of the peer's send buffer, either straight from
 * memory both map (shm) or with process_vm_readv (cma: one call per block;
 * cma1m: 1 MiB pieces, as the engine; cmaN: N KiB pieces), or through a
 * small ring in shared memory (bounce: 64 KiB chunks; bounceN: N KiB), the
 * two-copy path of MPI libraries without CMA, or with process_vm_readv into
 * a small buffer of one's own that stays in the cache and from there with
 * the copy kind (cmab: 64 KiB pieces; cmabN: N KiB).  Copy kinds: glibc memcpy, rep movsb,
 * non-temporal stores of 16/32/64 bytes (+ sfence).  Pages: 4 KiB
 * (MADV_NOHUGEPAGE) or transparent huge pages (MADV_HUGEPAGE).
 *
 * For shm the send buffers are made before fork() and only read afterwards,
 * so both processes map the same physical pages (4 KiB or huge) without a
 * shared mapping (shmem THP is off on this host); for cma each process
 * reads the pages the other made after fork().
 *
 *   memfloor a2a COPY REMOTE PAGES [SIZE_BYTES [ITERS [WARMUP]]]
 *   memfloor pvr PAGES [ITERS]        per-page cost of process_vm_readv
 *
 * One JSON line per run on stdout (times in microseconds).
 * Build: cc -O2 -o memfloor bench/memfloor.c  (bench/memfloor.py does it). */
#define _GNU_SOURCE
#include <errno.h>
#include <immintrin.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define HUGE (2u << 20)

typedef void (*copy_fn)(void *d, const void *s, size_t n);

static void c_memcpy(void *d, const void *s, size_t n) { memcpy(d, s, n); }

static void c_movsb(void *d, const void *s, size_t n) {
  __asm__ __volatile__("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
}

/* NT kinds: 64-byte aligned, n a multiple of 256 (true for every use here) */
static void c_nt128(void *d, const void *s, size_t n) {
  __m128i *dp = d;
  const __m128i *sp = s;
  for (size_t i = 0; i < n / 16; i += 4) {
    __m128i a = _mm_load_si128(sp + i), b = _mm_load_si128(sp + i + 1),
            c = _mm_load_si128(sp + i + 2), e = _mm_load_si128(sp + i + 3);
    _mm_stream_si128(dp + i, a);
    _mm_stream_si128(dp + i + 1, b);
    _mm_stream_si128(dp + i + 2, c);
    _mm_stream_si128(dp + i + 3, e);
  }
  _mm_sfence();
}

__attribute__((target("avx2"))) static void c_nt256(void *d, const void *s, size_t n) {
  __m256i *dp = d;
  const __m256i *sp = s;
  for (size_t i = 0; i < n / 32; i += 4) {
    __m256i a = _mm256_load_si256(sp + i), b = _mm256_load_si256(sp + i + 1),
            c = _mm256_load_si256(sp + i + 2), e = _mm256_load_si256(sp + i + 3);
    _mm256_stream_si256(dp + i, a);
    _mm256_stream_si256(dp + i + 1, b);
    _mm256_stream_si256(dp + i + 2, c);
    _mm256_stream_si256(dp + i + 3, e);
  }
  _mm_sfence();
}

__attribute__((target("avx512f"))) static void c_nt512(void *d, const void *s, size_t n) {
  __m512i *dp = d;
  const __m512i *sp = s;
  for (size_t i = 0; i < n / 64; i += 4) {
    __m512i a = _mm512_load_si512(sp + i), b = _mm512_load_si512(sp + i + 1),
            c = _mm512_load_si512(sp + i + 2), e = _mm512_load_si512(sp + i + 3);
    _mm512_stream_si512(dp + i, a);
    _mm512_stream_si512(dp + i + 1, b);
    _mm512_stream_si512(dp + i + 2, c);
    _mm512_stream_si512(dp + i + 3, e);
  }
  _mm_sfence();
}

static copy_fn copy_by_name(const char *name) {
  if (!strcmp(name, "memcpy")) return c_memcpy;
  if (!strcmp(name, "movsb")) return c_movsb;
  if (!strcmp(name, "nt128")) return c_nt128;
  if (!strcmp(name, "nt256")) return c_nt256;
  if (!strcmp(name, "nt512")) return c_nt512;
  return NULL;
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static void die(const char *what) {
  perror(what);
  exit(2);
}

/* n bytes, 2 MiB aligned, 4 KiB or THP pages, touched */
static uint8_t *alloc_buf(size_t n, int thp, int fill) {
  uint8_t *raw = mmap(NULL, n + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) die("mmap");
  uint8_t *p = (uint8_t *)(((uintptr_t)raw + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
  if (madvise(p, n, thp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE)) die("madvise");
  for (size_t i = 0; i < n; i += 4096) p[i] = 0;
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = ((uint64_t)fill << 56) ^ (i * 0x9e3779b97f4a7c15ull);
    memcpy(p + i, &v, 8);
  }
  return p;
}

/* AnonHugePages of this process, kB */
static long thp_kb(void) {
  FILE *f = fopen("/proc/self/smaps_rollup", "r");
  char line[256];
  long kb = -1;
  if (!f) return -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "AnonHugePages: %ld kB", &kb) == 1) break;
  fclose(f);
  return kb;
}

static void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set)) die("sched_setaffinity");
}

typedef struct ctl {
  uint64_t bar[2] __attribute__((aligned(64)));
  uint64_t pad[14];
  uint64_t prod[2] __attribute__((aligned(64))); /* bounce: chunks rank r put in its ring */
  uint64_t pad2[7];
  uint64_t cons[2] __attribute__((aligned(64))); /* ... and the peer took out of it */
  uint64_t pad3[7];
  pid_t pid[2];
  uintptr_t addr[2]; /* each one's send buffer */
  long thp_kb[2];
  int bad[2];
} ctl_t;

static void barrier(ctl_t *c, int me) {
  uint64_t v = __atomic_add_fetch(&c->bar[me], 1, __ATOMIC_SEQ_CST);
  while (__atomic_load_n(&c->bar[1 - me], __ATOMIC_ACQUIRE) < v) _mm_pause();
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int cma_read(pid_t pid, void *local, const void *remote, size_t n, size_t piece) {
  for (size_t off = 0; off < n;) {
    size_t len = n - off < piece ? n - off : piece;
    struct iovec l = {(uint8_t *)local + off, len}, r = {(uint8_t *)remote + off, len};
    ssize_t got = process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (got <= 0) return -1;
    off += (size_t)got;
  }
  return 0;
}

static void report(const char *head, double *t, int iters) {
  qsort(t, (size_t)iters, sizeof *t, cmp_d);
  printf("%s, \"best_us\": %.1f, \"p25_us\": %.1f, \"median_us\": %.1f, \"p90_us\": %.1f, "
         "\"iters\": %d}\n", head, t[0], t[iters / 4], t[iters / 2], t[iters * 9 / 10], iters);
  fflush(stdout);
}

/* bounce: the peer's block through a ring of RING_SLOTS chunks in shared
 * memory (small enough to stay in the caches): the owner of a block copies
 * it in with plain stores, the other copies it out with `fn`; the own block
 * is copied with `fn` in pieces while the ring is full or empty. */
#define RING_SLOTS 8

static void bounce_xchg(ctl_t *c, uint8_t *const ring[2], int me, copy_fn fn, uint8_t *in,
                        uint8_t *mine, const uint8_t *own, const uint8_t *out, size_t blk,
                        size_t chunk) {
  int p = 1 - me;
  size_t nch = (blk + chunk - 1) / chunk, pushed = 0, pulled = 0, local = 0;
  uint64_t base_prod = __atomic_load_n(&c->prod[me], __ATOMIC_ACQUIRE);
  uint64_t base_in = __atomic_load_n(&c->cons[p], __ATOMIC_ACQUIRE); /* == peer's prod base */
  while (pushed < nch || pulled < nch || local < blk) {
    int did = 0;
    if (pushed < nch &&
        base_prod + pushed - __atomic_load_n(&c->cons[me], __ATOMIC_ACQUIRE) < RING_SLOTS) {
      size_t off = pushed * chunk, len = blk - off < chunk ? blk - off : chunk;
      memcpy(ring[me] + ((base_prod + pushed) % RING_SLOTS) * chunk, out + off, len);
      __atomic_store_n(&c->prod[me], base_prod + ++pushed, __ATOMIC_RELEASE);
      did = 1;
    }
    if (pulled < nch && __atomic_load_n(&c->prod[p], __ATOMIC_ACQUIRE) > base_in + pulled) {
      size_t off = pulled * chunk, len = blk - off < chunk ? blk - off : chunk;
      fn(in + off, ring[p] + ((base_in + pulled) % RING_SLOTS) * chunk, len);
      __atomic_store_n(&c->cons[p], base_in + ++pulled, __ATOMIC_RELEASE);
      did = 1;
    }
    if (!did && local < blk) {
      size_t len = blk - local < chunk ? blk - local : chunk;
      fn(mine + local, own + local, len);
      local += len;
      did = 1;
    }
    if (!did) _mm_pause();
  }
}

/* ---- a2a: both processes, the Alltoall's traffic ---- */
static int run_a2a(const char *copy, const char *remote, int thp, size_t size, int iters,
                   int warmup) {
  copy_fn fn = copy_by_name(copy);
  int cmab = !strncmp(remote, "cmab", 4);
  int cma = !strncmp(remote, "cma", 3) && !cmab, bounce = !strncmp(remote, "bounce", 6);
  size_t chunk = bounce && remote[6] ? strtoul(remote + 6, NULL, 10) << 10
                 : cmab && remote[4] ? strtoul(remote + 4, NULL, 10) << 10 : (64u << 10);
  /* cma: one call; cmaN: pieces of N KiB (cma1m: 1 MiB, as the engine) */
  size_t piece = !strcmp(remote, "cma1m") ? (1u << 20)
                 : cma && remote[3] ? strtoul(remote + 3, NULL, 10) << 10 : size;
  if (cma && piece == 0) piece = size;
  if (!fn || (!cma && !cmab && !bounce && strcmp(remote, "shm")) || chunk < 4096 ||
      chunk % 256) {
    fprintf(stderr, "memfloor: bad copy %s or remote %s\n", copy, remote);
    return 2;
  }
  size_t blk = size / 2;
  ctl_t *c = mmap(NULL, sizeof *c, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (c == MAP_FAILED) die("mmap ctl");
  memset(c, 0, sizeof *c);
  uint8_t *ring[2] = {NULL, NULL};
  if (bounce)
    for (int r = 0; r < 2; r++) {
      ring[r] = mmap(NULL, RING_SLOTS * chunk, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
      if (ring[r] == MAP_FAILED) die("mmap ring");
    }
  uint8_t *sbuf[2] = {alloc_buf(size, thp, 1), alloc_buf(size, thp, 2)};
  c->pid[0] = getpid();
  pid_t child = fork();
  if (child < 0) die("fork");
  int me = child == 0, p = 1 - me;
  if (me) c->pid[1] = getpid();
  pin(me);
  uint8_t *rbuf = alloc_buf(size, thp, 0);
  /* cma reads the peer's own pages: a pin of a page still shared since
   * fork() would unshare (copy, and split a huge page) in the peer first */
  uint8_t *own = cma || cmab ? alloc_buf(size, thp, me + 1) : sbuf[me];
  uint8_t *tmp = cmab ? alloc_buf(chunk, 0, 0) : NULL;
  c->addr[me] = (uintptr_t)own;
  c->thp_kb[me] = thp_kb();
  double *t = calloc((size_t)iters, sizeof *t);
  barrier(c, me);
  pid_t ppid = c->pid[p];
  for (int it = -warmup; it < iters; it++) {
    barrier(c, me);
    double t0 = now_us();
    if (bounce)
      bounce_xchg(c, ring, me, fn, rbuf + p * blk, rbuf + me * blk, own + me * blk,
                  own + p * blk, blk, chunk);
    else
      fn(rbuf + me * blk, own + me * blk, blk);
    if (bounce) {
    } else if (cmab) {
      const uint8_t *r = (const uint8_t *)c->addr[p] + me * blk;
      for (size_t off = 0; off < blk; off += chunk) {
        size_t len = blk - off < chunk ? blk - off : chunk;
        if (cma_read(ppid, tmp, r + off, len, len)) die("process_vm_readv");
        fn(rbuf + p * blk + off, tmp, len);
      }
    } else if (cma) {
      if (cma_read(ppid, rbuf + p * blk, (uint8_t *)c->addr[p] + me * blk, blk, piece))
        die("process_vm_readv");
    } else {
      fn(rbuf + p * blk, sbuf[p] + me * blk, blk);
    }
    barrier(c, me);
    if (it >= 0) t[it] = now_us() - t0;
  }
  c->bad[me] = memcmp(rbuf + me * blk, sbuf[me] + me * blk, blk) != 0 ||
               memcmp(rbuf + p * blk, sbuf[p] + me * blk, blk) != 0;
  barrier(c, me);
  if (me) _exit(0);
  int st;
  waitpid(child, &st, 0);
  char head[512];
  snprintf(head, sizeof head,
           "{\"kind\": \"a2a\", \"copy\": \"%s\", \"remote\": \"%s\", \"pages\": \"%s\", "
           "\"size\": %zu, \"thp_kb\": [%ld, %ld], \"ok\": %s",
           copy, remote, thp ? "thp" : "4k", size, c->thp_kb[0], c->thp_kb[1],
           c->bad[0] || c->bad[1] ? "false" : "true");
  report(head, t, iters);
  return c->bad[0] || c->bad[1];
}

/* ---- pvr: per-page cost of process_vm_readv (rank 0 reads, rank 1 idles) ----
 * full: 8 MiB in one call; sparse: 64 bytes of each of the 2048 pages (one
 * remote iovec per page, 1024 per call): pin + unpin + a tiny copy per page;
 * memcpy: 8 MiB copied in-process from a local buffer (4 KiB pages) with the
 * same contents. */
static int run_pvr(int thp, int iters) {
  size_t n = 8u << 20, npg = n / 4096;
  ctl_t *c = mmap(NULL, sizeof *c, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (c == MAP_FAILED) die("mmap ctl");
  memset(c, 0, sizeof *c);
  c->pid[0] = getpid();
  pid_t child = fork();
  if (child < 0) die("fork");
  if (child == 0) { /* makes the source (its own pages) and keeps it until told */
    pin(1);
    c->addr[1] = (uintptr_t)alloc_buf(n, thp, 3);
    c->thp_kb[1] = thp_kb();
    barrier(c, 1);
    barrier(c, 1);
    _exit(0);
  }
  pin(0);
  uint8_t *dst = alloc_buf(n, thp, 0), *small = alloc_buf(npg * 64, 0, 0);
  uint8_t *ref = alloc_buf(n, 0, 3), *src = NULL; /* ref: what src holds */
  c->thp_kb[0] = thp_kb();
  barrier(c, 0);
  src = (uint8_t *)c->addr[1];
  struct iovec *riov = calloc(npg, sizeof *riov);
  for (size_t i = 0; i < npg; i++) riov[i] = (struct iovec){src + i * 4096 + 128, 64};
  double *t = calloc((size_t)iters, sizeof *t);
  const char *modes[] = {"full", "full1m", "sparse", "memcpy"};
  int rc = 0;
  for (int m = 0; m < 4; m++) {
    for (int it = -5; it < iters; it++) {
      double t0 = now_us();
      if (m == 0 || m == 1) {
        if (cma_read(child, dst, src, n, m == 0 ? n : (1u << 20))) die("process_vm_readv");
      } else if (m == 2) {
        for (size_t i = 0; i < npg; i += 1024) {
          struct iovec l = {small + i * 64, 1024 * 64};
          if (process_vm_readv(child, &l, 1, riov + i, 1024, 0) != 1024 * 64)
            die("process_vm_readv sparse");
        }
      } else {
        memcpy(dst, ref, n);
      }
      if (it >= 0) t[it] = now_us() - t0;
    }
    if (m < 2 && memcmp(dst, ref, n)) rc = 1;
    char head[256];
    snprintf(head, sizeof head,
             "{\"kind\": \"pvr\", \"mode\": \"%s\", \"pages\": \"%s\", \"bytes\": %zu, "
             "\"src_pages\": %zu, \"thp_kb\": [%ld, %ld], \"ok\": %s",
             modes[m], thp ? "thp" : "4k", m == 2 ? npg * 64 : n, npg, c->thp_kb[0],
             c->thp_kb[1], rc ? "false" : "true");
    report(head, t, iters);
  }
  barrier(c, 0);
  int st;
  waitpid(child, &st, 0);
  return rc;
}

static int pages_arg(const char *s) {
  if (!strcmp(s, "thp")) return 1;
  if (!strcmp(s, "4k")) return 0;
  fprintf(stderr, "memfloor: pages must be 4k or thp, not %s\n", s);
  exit(2);
}

int main(int argc, char **argv) {
  if (argc >= 5 && !strcmp(argv[1], "a2a")) {
    size_t size = argc > 5 ? strtoul(argv[5], NULL, 10) : (size_t)16 << 20;
    int iters = argc > 6 ? atoi(argv[6]) : 200, warmup = argc > 7 ? atoi(argv[7]) : 20;
    if (size < 2 || size % 2 || size > ((size_t)1 << 34) || iters < 1 || warmup < 0) {
      fprintf(stderr, "memfloor: bad size (bytes, even) or iters\n");
      return 2;
    }
    return run_a2a(argv[2], argv[3], pages_arg(argv[4]), size, iters, warmup);
  }
  if (argc >= 3 && !strcmp(argv[1], "pvr"))
    return run_pvr(pages_arg(argv[2]), argc > 3 ? atoi(argv[3]) : 100);
  fprintf(stderr,
          "usage: memfloor a2a memcpy|movsb|nt128|nt256|nt512 shm|cma[N]|cma1m|cmab[N]|bounce[N] "
          "4k|thp "
          "[SIZE_BYTES [ITERS [WARMUP]]]\n       memfloor pvr 4k|thp [ITERS]\n");
  return 2;
}
