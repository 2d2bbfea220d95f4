/* erdma_copy.h - memcpy for message bytes, without its page-aliasing stall.
 *
 * glibc's memcpy (2.36, x86-64 with ERMS/FSRM) copies from 2 KiB up to its
 * non-temporal threshold with `rep movsb`.  On AMD EPYC that runs 10-20x
 * slower when the destination lies 1-63 bytes after the source modulo the
 * 4 KiB page (256 KiB: 94-153 us against 7 us): the loads wait on stores
 * they seem to alias.  Message copies hit that case all the time: a large
 * NumPy array starts 16 bytes into a page (malloc's header), the rings and
 * our buffers at a page, so every copy out of a ring into such an array
 * stalled.  erdma_copy takes a plain vector loop for that case (as fast as
 * memcpy elsewhere) and memcpy otherwise.  On Intel Xeons memcpy does not
 * stall, and is faster than the loop there (a 256 KiB copy 16 bytes off:
 * 4.9 us against 6.0): erdma_copy_calibrate, at an engine's creation,
 * keeps memcpy where the loop does not win.  The kernel's copy of a
 * process_vm_readv/writev stalls the same way: see shm_cma_copy. */
#ifndef ERDMA_COPY_H
#define ERDMA_COPY_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

/* 1: copies in the stalling case take the vector loop (the safe side,
 * until erdma_copy_calibrate has measured); 0: memcpy.  One per process. */
__attribute__((weak, visibility("hidden"))) int erdma_copy_stall = 1;

/* (dst - src) mod 4 KiB in [1, ERDMA_ALIAS_SPAN): the stalling case */
#define ERDMA_ALIAS_SPAN 64
/* below this memcpy never uses `rep movsb` (its threshold is 2 KiB at the
 * least); a stalled copy of 2 KiB costs about 1 us more */
#define ERDMA_ALIAS_MIN 2048

static inline int erdma_copy_aliases(const void *dst, const void *src) {
  return (((uintptr_t)dst - (uintptr_t)src) & 4095u) - 1u < ERDMA_ALIAS_SPAN - 1u;
}

#if defined(__x86_64__)
/* The loops: four unaligned loads, then four stores (STORE: storeu, or
 * stream for non-temporal stores), 128 bytes a turn with AVX2, 64 with
 * SSE2; what is left (less than a turn) by memcpy, which copies that
 * without rep movsb. */
#define ERDMA_COPY_LOOP(W, T, LOAD, STORE)                                    \
  size_t i = 0;                                                             \
  for (; i + 4 * (W) <= n; i += 4 * (W)) {                                  \
    T a = LOAD((const T *)(s + i)), b = LOAD((const T *)(s + i + (W)));     \
    T c = LOAD((const T *)(s + i + 2 * (W))), x = LOAD((const T *)(s + i + 3 * (W))); \
    STORE((T *)(d + i), a);                                                 \
    STORE((T *)(d + i + (W)), b);                                           \
    STORE((T *)(d + i + 2 * (W)), c);                                       \
    STORE((T *)(d + i + 3 * (W)), x);                                       \
  }

__attribute__((target("avx2"), unused)) static void erdma_copy_avx2(uint8_t *d,
                                                                    const uint8_t *s,
                                                                    size_t n) {
  ERDMA_COPY_LOOP(32, __m256i, _mm256_loadu_si256, _mm256_storeu_si256)
  if (i < n) memcpy(d + i, s + i, n - i);
}

__attribute__((unused)) static void erdma_copy_sse2(uint8_t *d, const uint8_t *s, size_t n) {
  ERDMA_COPY_LOOP(16, __m128i, _mm_loadu_si128, _mm_storeu_si128)
  if (i < n) memcpy(d + i, s + i, n - i);
}

/* With non-temporal stores, d at the start of a cache line (erdma_copy_nt) */
__attribute__((target("avx2"), unused)) static void erdma_copy_nt_avx2(uint8_t *d,
                                                                       const uint8_t *s,
                                                                       size_t n) {
  ERDMA_COPY_LOOP(32, __m256i, _mm256_loadu_si256, _mm256_stream_si256)
  _mm_sfence();
  if (i < n) memcpy(d + i, s + i, n - i);
}

__attribute__((unused)) static void erdma_copy_nt_sse2(uint8_t *d, const uint8_t *s, size_t n) {
  ERDMA_COPY_LOOP(16, __m128i, _mm_loadu_si128, _mm_stream_si128)
  _mm_sfence();
  if (i < n) memcpy(d + i, s + i, n - i);
}
#endif

/* memcpy(dst, src, n) for buffers that do not overlap; returns dst */
static inline void *erdma_copy(void *dst, const void *src, size_t n) {
#if defined(__x86_64__)
  if (n >= ERDMA_ALIAS_MIN && erdma_copy_aliases(dst, src) && erdma_copy_stall) {
    if (__builtin_cpu_supports("avx2"))
      erdma_copy_avx2((uint8_t *)dst, (const uint8_t *)src, n);
    else
      erdma_copy_sse2((uint8_t *)dst, (const uint8_t *)src, n);
    return dst;
  }
#endif
  return memcpy(dst, src, n);
}

/* erdma_copy into shared memory that another core reads next (a ring, a
 * pair slot's area): from ERDMA_OUT_MIN bytes to 4 KiB `rep movsb`, whose
 * full-line stores on CPUs with fast strings (ERMS) take each line without
 * first reading it from the reader's cache, as glibc's memcpy does only
 * from 2112 bytes; where the loop is kept for the stalling case
 * (erdma_copy_stall), that case goes to erdma_copy.  On a Xeon VM: a
 * two-rank Bcast of 2 KiB back to back 0.73 -> 0.40 us a call, a 2 KiB
 * ping-pong 1.10 -> 1.00 us one way; at 512 bytes the ping-pong was
 * faster with the loop. */
#define ERDMA_OUT_MIN 1024
static inline void *erdma_copy_out(void *dst, const void *src, size_t n) {
#if defined(__x86_64__)
  if (n >= ERDMA_OUT_MIN && n < 4096 && !(erdma_copy_stall && erdma_copy_aliases(dst, src))) {
    void *d = dst;
    const void *s = src;
    __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n)::"memory");
    return dst;
  }
#endif
  return erdma_copy(dst, src, n);
}

/* CLDEMOTE: lines this core has just written for another core go from its
 * private caches to the shared L3, where the reader's loads find them
 * instead of snooping them out of ours (Intel from Sapphire Rapids; other
 * CPUs treat the encoding as a NOP, and callers skip the loop where CPUID
 * does not list it: erdma_cpu_demotes).  A hint: the bytes and their
 * order do not change.  On a Xeon VM a two-rank ping-pong one way: 8 bytes
 * 0.61 -> 0.55 us, 512 bytes 0.78 -> 0.62, 2 KiB 1.03 -> 0.83. */
static inline int erdma_cpu_demotes(void) {
#if defined(__x86_64__)
  unsigned a, b, c, d;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c >> 25 & 1);
#else
  return 0;
#endif
}

static inline void erdma_demote(const void *p, size_t n) {
#if defined(__x86_64__)
  uintptr_t a = (uintptr_t)p & ~(uintptr_t)63, b = (uintptr_t)p + n;
  for (; a < b; a += 64) __asm__ volatile("cldemote (%0)" ::"r"(a) : "memory");
#else
  (void)p;
  (void)n;
#endif
}

/* erdma_copy with non-temporal stores, for a copy that would only push the
 * caches' useful lines out (erdma_bulk.c: a large own block) */
static inline void erdma_copy_nt(void *dst, const void *src, size_t n) {
#if defined(__x86_64__)
  uint8_t *d = dst;
  const uint8_t *s = src;
  if (n >= 64) {
    size_t head = (64 - ((uintptr_t)d & 63)) & 63; /* stores: whole cache lines */
    memcpy(d, s, head);
    if (__builtin_cpu_supports("avx2"))
      erdma_copy_nt_avx2(d + head, s + head, n - head);
    else
      erdma_copy_nt_sse2(d + head, s + head, n - head);
    return;
  }
#endif
  erdma_copy(dst, src, n);
}

/* v into a[0..k] kept ascending (a[0..k-1] already are): the medians of
 * the copy calibrations here and in erdma_shm.c */
static inline void erdma_sorted_insert(uint64_t *a, int k, uint64_t v) {
  int j = k;
  for (; j > 0 && a[j - 1] > v; j--) a[j] = a[j - 1];
  a[j] = v;
}

/* Sets erdma_copy_stall: 1 where memcpy of 64 KiB to 16 bytes after its
 * source modulo the page takes over 1.2x the vector loop (medians of nine
 * rounds after one to warm up; about 0.1 ms, 2 ms where it stalls). */
static inline void erdma_copy_calibrate(void) {
#if defined(__x86_64__)
  enum { N = 64 << 10, TRIES = 9 };
  uint8_t *s = NULL, *d = NULL;
  uint64_t lib[TRIES], loop[TRIES];
  if (posix_memalign((void **)&s, 4096, N) || posix_memalign((void **)&d, 4096, N + 4096)) {
    free(s);
    return;
  }
  memset(s, 1, N);
  memset(d, 2, N + 4096);
  for (int k = -1; k < TRIES; k++) {
    struct timespec t[3];
    clock_gettime(CLOCK_MONOTONIC, &t[0]);
    memcpy(d + 16, s, N);
    __asm__ volatile("" : : "r"(d) : "memory"); /* the copies are not dead stores */
    clock_gettime(CLOCK_MONOTONIC, &t[1]);
    if (__builtin_cpu_supports("avx2"))
      erdma_copy_avx2(d + 16, s, N);
    else
      erdma_copy_sse2(d + 16, s, N);
    __asm__ volatile("" : : "r"(d) : "memory");
    clock_gettime(CLOCK_MONOTONIC, &t[2]);
    if (k < 0) continue;
    uint64_t ns[3];
    for (int i = 0; i < 3; i++)
      ns[i] = (uint64_t)t[i].tv_sec * 1000000000u + (uint64_t)t[i].tv_nsec;
    erdma_sorted_insert(lib, k, ns[1] - ns[0]);
    erdma_sorted_insert(loop, k, ns[2] - ns[1]);
  }
  free(s);
  free(d);
  __atomic_store_n(&erdma_copy_stall, lib[TRIES / 2] * 100 > loop[TRIES / 2] * 120,
                   __ATOMIC_RELAXED);
#endif
}

/* memmove(dst, src, n): erdma_copy where the buffers do not overlap */
static inline void *erdma_move(void *dst, const void *src, size_t n) {
  uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
  if (d - s >= n && s - d >= n) return erdma_copy(dst, src, n);
  return memmove(dst, src, n);
}

#endif
