/* erdma_pages.c - the pages of a caller's receive buffer.
 *
 * A program that allocates its arrays for every call hands a collective
 * new pages of an anonymous mapping, which the kernel maps at their first
 * write, one page fault each.  On a virtual machine a fault costs about
 * 1 us a page, four times the copy of the page: a 1 MiB copy into such
 * pages took 298 us, a peer's CMA write into them 167 us.  Faulting the
 * range in with one MADV_POPULATE_WRITE first costs less than half (the
 * same copy: 133 us with it).  Its callers are the paths that see arrays
 * that are new to them (the one-call entries remembered by layout, and the
 * first call of a buffer); a buffer used before is left alone, since the
 * check below is a system call (0.3 us, more with its TLB cost). */
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "erdma.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

int erdma_prefault(void *buf, uint64_t nbytes) {
  static long page; /* racy but idempotent */
  if (nbytes < ERDMA_PREFAULT_MIN || !buf) return 0;
  long pg = __atomic_load_n(&page, __ATOMIC_RELAXED);
  if (!pg) {
    pg = sysconf(_SC_PAGESIZE);
    if (pg <= 0) pg = 4096;
    __atomic_store_n(&page, pg, __ATOMIC_RELAXED);
  }
  uintptr_t m = (uintptr_t)pg - 1, lo = (uintptr_t)buf & ~m;
  uintptr_t hi = ((uintptr_t)buf + nbytes + m) & ~m;
  unsigned char v = 1;
  /* the last page: the first may hold malloc's header, written already */
  if (mincore((void *)(hi - (uintptr_t)pg), (size_t)pg, &v) != 0 || (v & 1)) return 0;
  /* a mapping that cannot be populated leaves the faults to the writes;
   * the bytes are not changed either way */
  return madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE) == 0;
}
