/*
 * erdma_pack.c - gather/scatter of derived-datatype messages: the runs of
 * `count` items (item i at byte i * extent, its runs at off[j], len[j]
 * bytes) copied to or from a packed buffer, back to back in run order.
 *
 * The caller (erdmampi/typemap.py) has checked every byte against the
 * buffer bounds; these loops only copy.  A vector (one run per item) is the
 * common case (halo columns, strided slices): it gets a loop of its own,
 * with the 8- and 4-byte runs copied as plain loads and stores.
 */
#include <stdint.h>
#include <string.h>

#include "erdma.h"
#include "erdma_copy.h"

static int check_args(const void *a, const void *b, uint64_t count, const int64_t *off,
                      const int64_t *len, uint64_t nruns) {
  if (count == 0 || nruns == 0) return 0;
  if (!a || !b || !off || !len) return ERDMA_ERR_INVAL;
  for (uint64_t j = 0; j < nruns; j++)
    if (len[j] < 0) return ERDMA_ERR_INVAL;
  return 0;
}

/* PACK 1: memory -> packed (gather); 0: packed -> memory (scatter) */
#define VECTOR_LOOP(T)                                                      \
  do {                                                                      \
    for (uint64_t i = 0; i < count; i++, u += extent, p += sizeof(T)) {     \
      T v;                                                                  \
      if (pack) {                                                           \
        memcpy(&v, u, sizeof(T));                                           \
        memcpy(p, &v, sizeof(T));                                           \
      } else {                                                              \
        memcpy(&v, p, sizeof(T));                                           \
        memcpy(u, &v, sizeof(T));                                           \
      }                                                                     \
    }                                                                       \
  } while (0)

static void copy_vector(uint8_t *u, uint8_t *p, uint64_t count, int64_t extent,
                        size_t n, int pack) {
  if (n == 8) {
    VECTOR_LOOP(uint64_t);
  } else if (n == 4) {
    VECTOR_LOOP(uint32_t);
  } else if (pack) {
    for (uint64_t i = 0; i < count; i++, u += extent, p += n) erdma_copy(p, u, n);
  } else {
    for (uint64_t i = 0; i < count; i++, u += extent, p += n) erdma_copy(u, p, n);
  }
}

static int copy_runs(uint8_t *mem, uint8_t *packed, uint64_t count, int64_t extent,
                     const int64_t *off, const int64_t *len, uint64_t nruns, int pack) {
  int rc = check_args(mem, packed, count, off, len, nruns);
  if (rc || count == 0 || nruns == 0) return rc;
  if (nruns == 1) {
    if (len[0]) copy_vector(mem + off[0], packed, count, extent, (size_t)len[0], pack);
    return 0;
  }
  uint8_t *p = packed;
  for (uint64_t i = 0; i < count; i++, mem += extent) {
    for (uint64_t j = 0; j < nruns; j++) {
      size_t n = (size_t)len[j];
      if (pack)
        erdma_copy(p, mem + off[j], n);
      else
        erdma_copy(mem + off[j], p, n);
      p += n;
    }
  }
  return 0;
}

int erdma_pack_runs(void *dst, const void *src, uint64_t count, int64_t extent,
                    const int64_t *off, const int64_t *len, uint64_t nruns) {
  return copy_runs((uint8_t *)src, (uint8_t *)dst, count, extent, off, len, nruns, 1);
}

int erdma_unpack_runs(void *dst, const void *src, uint64_t count, int64_t extent,
                      const int64_t *off, const int64_t *len, uint64_t nruns) {
  return copy_runs((uint8_t *)dst, (uint8_t *)src, count, extent, off, len, nruns, 0);
}

int erdma_unpack_runs_head(void *dst, const void *src, uint64_t nbytes, uint64_t count,
                           int64_t extent, const int64_t *off, const int64_t *len,
                           uint64_t nruns) {
  int rc = check_args(dst, src, count, off, len, nruns);
  if (rc || count == 0 || nruns == 0) return rc;
  uint8_t *mem = dst;
  const uint8_t *p = src;
  for (uint64_t i = 0; i < count && nbytes; i++, mem += extent)
    for (uint64_t j = 0; j < nruns && nbytes; j++) {
      size_t n = (size_t)len[j] < nbytes ? (size_t)len[j] : (size_t)nbytes;
      erdma_copy(mem + off[j], p, n);
      p += n;
      nbytes -= n;
    }
  return 0;
}
