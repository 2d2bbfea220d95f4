/* erdma_copy (erdma_copy.h): the bytes memcpy would give, and nothing
 * outside the destination, for every size class (below the vector loop's
 * threshold, whole 128-byte rounds, ragged tails, larger than a page) and
 * every kind of distance between the buffers (the stalling 1-63 bytes
 * after the source modulo a page, and others); erdma_copy_aliases names
 * exactly those distances; erdma_copy_nt gives the same bytes; erdma_move
 * gives memmove's bytes, overlapping or not; erdma_copy_out the same
 * bytes as erdma_copy; erdma_demote none changed; erdma_copy_calibrate picks
 * memcpy or the loop for the stalling case, and either copies right. */
#include <stdint.h>
#include <stdlib.h>

#include "ctest.h"
#include "erdma_copy.h"

#define POOL (3u << 20)

static uint8_t *pool(void) {
  uint8_t *p = NULL;
  if (posix_memalign((void **)&p, 4096, POOL)) return NULL;
  return p;
}

TEST(aliases_names_one_to_63_bytes_after_modulo_a_page) {
  static uint8_t buf[3 * 4096] __attribute__((aligned(4096)));
  uint8_t *s = buf + 4096;
  CHECK(!erdma_copy_aliases(s, s));
  CHECK(erdma_copy_aliases(s + 1, s));
  CHECK(erdma_copy_aliases(s + 16, s));
  CHECK(erdma_copy_aliases(s + 63, s));
  CHECK(!erdma_copy_aliases(s + 64, s));
  CHECK(!erdma_copy_aliases(s + 4095, s)); /* the destination before the source */
  CHECK(!erdma_copy_aliases(s - 16, s));
  CHECK(erdma_copy_aliases(s + 4096 + 16, s));
  CHECK(erdma_copy_aliases(s - 4096 + 1, s));
}

TEST(copies_every_size_at_every_distance_by_the_loop_and_by_memcpy) {
  static const size_t sizes[] = {0, 1, 7, 127, 128, 129, 1023, 1024, 1500, 2047, 2048, 2049,
                                 4095, 4096, 4096 + 17, 65536 + 5, 300000, (1u << 20) + 3};
  static const size_t dists[] = {0, 1, 8, 16, 31, 48, 63, 64, 100, 4080, 4095};
  uint8_t *src = pool(), *dst = pool();
  CHECK(src && dst);
  for (size_t i = 0; i < POOL; i++) src[i] = (uint8_t)(i * 131u + (i >> 9) * 7u + 1u);
  for (int stall = 0; stall < 2; stall++) /* what erdma_copy_calibrate may choose */
  for (size_t a = 0; a < sizeof sizes / sizeof *sizes; a++)
    for (size_t b = 0; b < sizeof dists / sizeof *dists; b++) {
      erdma_copy_stall = stall;
      size_t n = sizes[a], so = 16, doff = (so + dists[b]) % 4096 + 4096;
      memset(dst, 0xEE, POOL);
      void *r = erdma_copy(dst + doff, src + so, n);
      CHECK(r == dst + doff);
      CHECK_MEM(dst + doff, src + so, n);
      memset(dst, 0xEE, POOL);
      r = erdma_copy_out(dst + doff, src + so, n); /* rep movsb for 1-4 KiB */
      CHECK(r == dst + doff);
      CHECK(erdma_copy_aliases(dst + doff, src + so) == (dists[b] >= 1 && dists[b] < 64));
      if (memcmp(dst + doff, src + so, n) != 0)
        fprintf(stderr, "size %zu distance %zu (stall %d) differs\n", n, dists[b], stall);
      CHECK_MEM(dst + doff, src + so, n);
      for (size_t k = 0; k < doff; k++) CHECK_EQ(dst[k], 0xEE);
      for (size_t k = doff + n; k < doff + n + 4096 && k < POOL; k++) CHECK_EQ(dst[k], 0xEE);
    }
  free(src);
  free(dst);
}

TEST(calibrate_chooses_one_of_the_two_and_the_copy_stays_right) {
  erdma_copy_stall = 7;
  erdma_copy_calibrate();
#if defined(__x86_64__)
  CHECK(erdma_copy_stall == 0 || erdma_copy_stall == 1);
#endif
  uint8_t *src = pool(), *dst = pool();
  CHECK(src && dst);
  for (size_t i = 0; i < POOL; i++) src[i] = (uint8_t)(i * 29u + 3u);
  erdma_copy(dst + 16, src, 1u << 20);
  CHECK_MEM(dst + 16, src, 1u << 20);
  erdma_copy_stall = 1;
  free(src);
  free(dst);
}

TEST(non_temporal_copy_gives_the_same_bytes) {
  static const size_t sizes[] = {0, 1, 63, 64, 65, 200, 4096 + 17, 300000};
  uint8_t *src = pool(), *dst = pool();
  CHECK(src && dst);
  for (size_t i = 0; i < POOL; i++) src[i] = (uint8_t)(i * 13u + (i >> 10));
  for (size_t a = 0; a < sizeof sizes / sizeof *sizes; a++)
    for (size_t doff = 4096; doff < 4096 + 130; doff += 43) { /* cache-line heads of 0-63 */
      size_t n = sizes[a];
      memset(dst, 0xEE, POOL);
      erdma_copy_nt(dst + doff, src + 16, n);
      CHECK_MEM(dst + doff, src + 16, n);
      CHECK_EQ(dst[doff - 1], 0xEE);
      CHECK_EQ(dst[doff + n], 0xEE);
    }
  free(src);
  free(dst);
}

TEST(move_handles_overlap_either_way) {
  static const long shifts[] = {-4096, -100, -16, -1, 1, 16, 63, 100, 4096, 70000};
  uint8_t *a = pool(), *b = pool();
  CHECK(a && b);
  for (size_t k = 0; k < sizeof shifts / sizeof *shifts; k++) {
    size_t n = 65536 + 7, at = 100000;
    for (size_t i = 0; i < POOL; i++) a[i] = b[i] = (uint8_t)(i * 7u + (i >> 8));
    void *r = erdma_move(a + at + shifts[k], a + at, n);
    memmove(b + at + shifts[k], b + at, n);
    CHECK(r == a + at + shifts[k]);
    CHECK_MEM(a, b, POOL);
  }
  free(a);
  free(b);
}

/* CLDEMOTE is a hint: run here whether or not CPUID lists it (where it
 * does not, the encoding must be a NOP, not an invalid instruction), it
 * leaves every byte as it was, at any size and alignment. */
TEST(demote_leaves_the_bytes_on_any_cpu) {
  uint8_t *a = pool();
  CHECK(a);
  for (size_t i = 0; i < POOL; i++) a[i] = (uint8_t)(i * 13u + (i >> 9));
  static const size_t sizes[] = {0, 1, 8, 63, 64, 65, 127, 4096, 4097, 65536 + 3};
  for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++)
    for (size_t off = 0; off < 130; off += 43) erdma_demote(a + 4096 + off, sizes[k]);
  for (size_t i = 0; i < POOL; i++)
    if (a[i] != (uint8_t)(i * 13u + (i >> 9))) CHECK_EQ(a[i], (uint8_t)(i * 13u + (i >> 9)));
  CHECK(erdma_cpu_demotes() == 0 || erdma_cpu_demotes() == 1);
  free(a);
}

CTEST_MAIN()
