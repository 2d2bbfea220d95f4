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
 * memcpy elsewhere) and memcpy otherwise.  The kernel's copy of a
 * process_vm_readv/writev stalls the same way: see shm_cma_copy. */
#ifndef ERDMA_COPY_H
#define ERDMA_COPY_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* (dst - src) mod 4 KiB in [1, ERDMA_ALIAS_SPAN): the stalling case */
#define ERDMA_ALIAS_SPAN 64
/* below this memcpy never uses `rep movsb` (its threshold is 2 KiB at the
 * least); a stalled copy of 2 KiB costs about 1 us more */
#define ERDMA_ALIAS_MIN 2048

static inline int erdma_copy_aliases(const void *dst, const void *src) {
  return (((uintptr_t)dst - (uintptr_t)src) & 4095u) - 1u < ERDMA_ALIAS_SPAN - 1u;
}

#if defined(__x86_64__)
__attribute__((target("avx2"), unused)) static void erdma_copy_avx2(uint8_t *d,
                                                                    const uint8_t *s,
                                                                    size_t n) {
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    __m256i a = _mm256_loadu_si256((const __m256i *)(s + i));
    __m256i b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
    __m256i c = _mm256_loadu_si256((const __m256i *)(s + i + 64));
    __m256i x = _mm256_loadu_si256((const __m256i *)(s + i + 96));
    _mm256_storeu_si256((__m256i *)(d + i), a);
    _mm256_storeu_si256((__m256i *)(d + i + 32), b);
    _mm256_storeu_si256((__m256i *)(d + i + 64), c);
    _mm256_storeu_si256((__m256i *)(d + i + 96), x);
  }
  if (i < n) memcpy(d + i, s + i, n - i); /* < 128 bytes: no rep movsb */
}

__attribute__((unused)) static void erdma_copy_sse2(uint8_t *d, const uint8_t *s, size_t n) {
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
    __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
    __m128i x = _mm_loadu_si128((const __m128i *)(s + i + 48));
    _mm_storeu_si128((__m128i *)(d + i), a);
    _mm_storeu_si128((__m128i *)(d + i + 16), b);
    _mm_storeu_si128((__m128i *)(d + i + 32), c);
    _mm_storeu_si128((__m128i *)(d + i + 48), x);
  }
  if (i < n) memcpy(d + i, s + i, n - i);
}
#endif

/* memcpy(dst, src, n) for buffers that do not overlap; returns dst */
static inline void *erdma_copy(void *dst, const void *src, size_t n) {
#if defined(__x86_64__)
  if (n >= ERDMA_ALIAS_MIN && erdma_copy_aliases(dst, src)) {
    if (__builtin_cpu_supports("avx2"))
      erdma_copy_avx2((uint8_t *)dst, (const uint8_t *)src, n);
    else
      erdma_copy_sse2((uint8_t *)dst, (const uint8_t *)src, n);
    return dst;
  }
#endif
  return memcpy(dst, src, n);
}

/* memmove(dst, src, n): erdma_copy where the buffers do not overlap */
static inline void *erdma_move(void *dst, const void *src, size_t n) {
  uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
  if (d - s >= n && s - d >= n) return erdma_copy(dst, src, n);
  return memmove(dst, src, n);
}

#endif
