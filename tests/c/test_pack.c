// test-sources: ext/src/erdma_pack.c
/* erdma_pack_runs / erdma_unpack_runs (erdma_pack.c): the runs of `count`
 * items of a derived datatype (item i at byte i * extent, run j at off[j],
 * len[j] bytes) gathered into a packed buffer back to back and scattered
 * back, against a byte-by-byte model; the vector fast paths (one run of 4,
 * 8 or other sizes), negative extents and offsets, empty runs and counts,
 * and the argument checks.  Buffers are allocated to their exact size so
 * that AddressSanitizer sees any byte copied out of bounds. */
#include <stdint.h>

#include "ctest.h"
#include "erdma.h"

static uint8_t *fill(size_t n, uint8_t seed) {
  uint8_t *b = malloc(n ? n : 1);
  for (size_t i = 0; i < n; i++) b[i] = (uint8_t)(seed + i * 31 + (i >> 8));
  return b;
}

/* The model: the bytes a pack visits, in order, as offsets into memory. */
static size_t model(int64_t base, uint64_t count, int64_t extent, const int64_t *off,
                    const int64_t *len, uint64_t nruns, int64_t *at) {
  size_t n = 0;
  for (uint64_t i = 0; i < count; i++)
    for (uint64_t j = 0; j < nruns; j++)
      for (int64_t k = 0; k < len[j]; k++) at[n++] = base + (int64_t)i * extent + off[j] + k;
  return n;
}

/* pack then unpack into a fresh buffer: the packed bytes are the model's,
 * and the scatter writes exactly those bytes and leaves every other alone */
static int roundtrip(uint64_t count, int64_t extent, const int64_t *off, const int64_t *len,
                     uint64_t nruns, size_t memsize, int64_t base) {
  int64_t *at = malloc(sizeof(int64_t) * (memsize * 4 + 1));
  size_t n = model(base, count, extent, off, len, nruns, at);
  uint8_t *mem = fill(memsize, 7), *packed = malloc(n ? n : 1);
  int bad = 0;
  if (erdma_pack_runs(packed, mem + base, count, extent, off, len, nruns) != 0) bad |= 1;
  for (size_t k = 0; k < n; k++)
    if (packed[k] != mem[at[k]]) bad |= 2;
  uint8_t *back = fill(memsize, 99), *orig = fill(memsize, 99);
  if (erdma_unpack_runs(back + base, packed, count, extent, off, len, nruns) != 0) bad |= 4;
  for (size_t k = 0; k < n; k++) orig[at[k]] = packed[k];
  if (memcmp(back, orig, memsize) != 0) bad |= 8;
  free(at);
  free(mem);
  free(packed);
  free(back);
  free(orig);
  if (bad) fprintf(stderr, "  roundtrip(count %llu extent %lld nruns %llu): failure bits %d\n",
                   (unsigned long long)count, (long long)extent, (unsigned long long)nruns, bad);
  return bad;
}

TEST(vector_of_doubles) {
  /* a column of a 5x7 double matrix: one 8-byte run per row */
  int64_t off[] = {16}, len[] = {8};
  CHECK_EQ(roundtrip(5, 56, off, len, 1, 5 * 56, 0), 0);
}

TEST(vector_of_int32) {
  int64_t off[] = {0}, len[] = {4};
  CHECK_EQ(roundtrip(33, 12, off, len, 1, 33 * 12, 0), 0);
}

TEST(vector_of_odd_runs) {
  for (int64_t l = 1; l <= 13; l++) {
    int64_t off[] = {3}, len[] = {l};
    CHECK_EQ(roundtrip(9, l + 5, off, len, 1, (size_t)(9 * (l + 5)), 0), 0);
  }
}

TEST(contiguous_vector) {
  /* extent == run length: one contiguous block */
  int64_t off[] = {0}, len[] = {8};
  CHECK_EQ(roundtrip(64, 8, off, len, 1, 64 * 8, 0), 0);
}

TEST(several_runs_per_item) {
  /* a struct {char a; pad; int32 b; double c[2]} without the padding */
  int64_t off[] = {0, 4, 8}, len[] = {1, 4, 16};
  CHECK_EQ(roundtrip(7, 24, off, len, 3, 7 * 24, 0), 0);
}

TEST(runs_out_of_order_and_empty) {
  /* runs need not be sorted; a zero-length run copies nothing */
  int64_t off[] = {10, 0, 5}, len[] = {3, 2, 0};
  CHECK_EQ(roundtrip(4, 16, off, len, 3, 4 * 16, 0), 0);
}

TEST(negative_extent_and_offsets) {
  /* items walk backwards from the middle of the buffer; a run left of its item */
  int64_t off[] = {-4, 2}, len[] = {4, 2};
  CHECK_EQ(roundtrip(5, -10, off, len, 2, 64, 60), 0);
  int64_t off1[] = {-8}, len1[] = {8};
  CHECK_EQ(roundtrip(6, -8, off1, len1, 1, 48, 48), 0);
}

TEST(packed_layout_spelled_out) {
  /* independent of the model: items {a b c d} at extent 4, runs (2,1) and (0,1) */
  const uint8_t mem[8] = {'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'};
  int64_t off[] = {2, 0}, len[] = {1, 1};
  uint8_t packed[4] = {0};
  CHECK_EQ(erdma_pack_runs(packed, mem, 2, 4, off, len, 2), 0);
  CHECK_MEM(packed, "cage", 4);
  uint8_t out[8];
  memset(out, '.', sizeof out);
  CHECK_EQ(erdma_unpack_runs(out, "CAGE", 2, 4, off, len, 2), 0);
  CHECK_MEM(out, "A.C.E.G.", 8);
}

TEST(empty_counts_touch_nothing) {
  int64_t off[] = {0}, len[] = {4};
  CHECK_EQ(erdma_pack_runs(NULL, NULL, 0, 4, off, len, 1), 0);
  CHECK_EQ(erdma_unpack_runs(NULL, NULL, 3, 4, off, len, 0), 0);
  CHECK_EQ(erdma_pack_runs(NULL, NULL, 0, 4, NULL, NULL, 1), 0);
}

TEST(argument_checks) {
  uint8_t a[8] = {0}, b[8] = {0};
  int64_t off[] = {0}, len[] = {4}, neg[] = {-1};
  CHECK_EQ(erdma_pack_runs(NULL, a, 1, 4, off, len, 1), ERDMA_ERR_INVAL);
  CHECK_EQ(erdma_pack_runs(b, NULL, 1, 4, off, len, 1), ERDMA_ERR_INVAL);
  CHECK_EQ(erdma_unpack_runs(a, b, 1, 4, NULL, len, 1), ERDMA_ERR_INVAL);
  CHECK_EQ(erdma_unpack_runs(a, b, 1, 4, off, NULL, 1), ERDMA_ERR_INVAL);
  CHECK_EQ(erdma_pack_runs(b, a, 1, 4, off, neg, 1), ERDMA_ERR_INVAL);
}

CTEST_MAIN()
