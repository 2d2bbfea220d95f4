/* erdma_pages.c: erdma_prefault maps the pages of a never-written anonymous
 * range (mincore says resident after it) without changing a byte; a range
 * already written, one under ERDMA_PREFAULT_MIN and NULL are left alone;
 * a mapping it cannot populate (read-only) fails quietly with 0. */
// test-sources: ext/src/erdma_pages.c
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ctest.h"
#include "erdma.h"

static long page(void) { return sysconf(_SC_PAGESIZE); }

/* resident pages of [p, p + n) */
static size_t resident(void *p, size_t n) {
  size_t np = (n + (size_t)page() - 1) / (size_t)page(), k = 0;
  unsigned char v[4096];
  if (np > sizeof v || mincore(p, n, v) != 0) return (size_t)-1;
  for (size_t i = 0; i < np; i++) k += v[i] & 1;
  return k;
}

static uint8_t *fresh(size_t n, int prot) {
  void *p = mmap(NULL, n, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

TEST(a_never_written_range_is_mapped_in_and_reads_zero) {
  size_t n = 64 * (size_t)page();
  uint8_t *p = fresh(n, PROT_READ | PROT_WRITE);
  CHECK(p != NULL);
  CHECK_EQ(resident(p, n), 0);
  /* from 100 bytes into the first page to the middle of the last */
  CHECK_EQ(erdma_prefault(p + 100, n - 100 - (size_t)page() / 2), 1);
  CHECK_EQ(resident(p, n), 64);
  for (size_t i = 0; i < n; i += 97) CHECK_EQ(p[i], 0);
  munmap(p, n);
}

TEST(a_written_range_and_its_bytes_stay_as_they_are) {
  size_t n = 32 * (size_t)page();
  uint8_t *p = fresh(n, PROT_READ | PROT_WRITE);
  CHECK(p != NULL);
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(i * 7 + 1);
  CHECK_EQ(erdma_prefault(p, n), 0);
  for (size_t i = 0; i < n; i++) CHECK_EQ(p[i], (uint8_t)(i * 7 + 1));
  /* only the last page written: taken as written (the check looks there) */
  uint8_t *q = fresh(n, PROT_READ | PROT_WRITE);
  CHECK(q != NULL);
  q[n - 1] = 5;
  CHECK_EQ(erdma_prefault(q, n), 0);
  CHECK_EQ(resident(q, n), 1);
  /* only the first page written (malloc's header): mapped in, bytes kept */
  munmap(q, n);
  q = fresh(n, PROT_READ | PROT_WRITE);
  CHECK(q != NULL);
  q[3] = 9;
  CHECK_EQ(erdma_prefault(q + 16, n - 16), 1);
  CHECK_EQ(resident(q, n), 32);
  CHECK_EQ(q[3], 9);
  munmap(p, n);
  munmap(q, n);
}

TEST(small_ranges_null_and_read_only_mappings_are_left_alone) {
  size_t n = 32 * (size_t)page();
  uint8_t *p = fresh(n, PROT_READ | PROT_WRITE);
  CHECK(p != NULL);
  CHECK_EQ(erdma_prefault(p, ERDMA_PREFAULT_MIN - 1), 0);
  CHECK_EQ(resident(p, n), 0);
  CHECK_EQ(erdma_prefault(NULL, n), 0);
  munmap(p, n);
  uint8_t *r = fresh(n, PROT_READ);
  CHECK(r != NULL);
  CHECK_EQ(erdma_prefault(r, n), 0);
  CHECK_EQ(resident(r, n), 0);
  munmap(r, n);
}

CTEST_MAIN()
