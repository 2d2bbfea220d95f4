/* erdma_cpu.c - the calling thread's vector-register state.
 *
 * Code that leaves the upper halves of the AVX registers in use without a
 * VZEROUPPER (the ChaCha20-Poly1305 of the OpenSSL inside the `cryptography`
 * wheel, which seals the rendezvous records at start-up) makes every later
 * SSE instruction of that thread wait on those halves: in every rank of a
 * job, NumPy's np.empty(1024, np.float32) then took 0.29 us instead of 0.15
 * until something cleared them, which nothing in NumPy or glibc's EVEX
 * string functions does.  erdma_cpu_settle clears them; the rank calls it
 * once start-up is done (bootstrap.init_world). */
#include <stdint.h>

#include "erdma.h"

#if defined(__x86_64__)
#include <cpuid.h>

/* AVX usable: the CPU has it and the OS saves its state (OSXSAVE, XCR0). */
static int cpu_avx(void) {
  static int known = -1;
  int k = __atomic_load_n(&known, __ATOMIC_RELAXED);
  if (k >= 0) return k;
  unsigned a, b, c, d;
  k = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) && (c >> 27 & 1) && (c >> 28 & 1)) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    k = (lo & 6) == 6;
  }
  __atomic_store_n(&known, k, __ATOMIC_RELAXED);
  return k;
}
#endif

void erdma_cpu_settle(void) {
#if defined(__x86_64__)
  if (cpu_avx()) __asm__ volatile("vzeroupper" ::: "memory");
#endif
}

int erdma_cpu_upper_in_use(void) {
#if defined(__x86_64__)
  unsigned a, b, c, d;
  if (!cpu_avx() || !__get_cpuid_count(0xd, 1, &a, &b, &c, &d) || !(a & 4))
    return -1; /* no XGETBV with ECX=1 (XINUSE) */
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(1));
  return (int)(lo >> 2 & 1); /* XINUSE bit 2: the upper halves of YMM0-15 */
#else
  return -1;
#endif
}
