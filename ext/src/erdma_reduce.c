/*
 * erdma_reduce.c - vectorised reductions of the predefined MPI operations
 * on common element types: inout[i] = in[i] OP inout[i].
 *
 * Semantics follow erdmampi/op.py (which follows MPICH): MAX keeps inout
 * only where inout > in (so a NaN in `in` wins and -0.0 vs 0.0 yields `in`),
 * integer arithmetic wraps (done in unsigned types, no undefined
 * behaviour), logical operations store 0 or 1 in the element type.  The
 * loops are plain element loops over restrict pointers that the compiler
 * auto-vectorises (-O3).
 */
#include <stdint.h>
#include <string.h>

#include "erdma.h"

#define LOOP(T, EXPR)                                        \
  do {                                                       \
    const T *restrict a = (const T *)in;                     \
    T *restrict b = (T *)inout;                              \
    for (uint64_t i = 0; i < n; i++) b[i] = (T)(EXPR);       \
  } while (0)

/* Integer kernels; W is the unsigned type the arithmetic is done in. */
#define INT_KERNEL(NAME, T, W)                                               \
  static int NAME(const void *in, void *inout, uint64_t n, int op) {        \
    switch (op) {                                                            \
    case ERDMA_OP_SUM: LOOP(T, (W)a[i] + (W)b[i]); return 0;                \
    case ERDMA_OP_PROD: LOOP(T, (W)a[i] * (W)b[i]); return 0;               \
    case ERDMA_OP_MAX: LOOP(T, b[i] > a[i] ? b[i] : a[i]); return 0;        \
    case ERDMA_OP_MIN: LOOP(T, b[i] < a[i] ? b[i] : a[i]); return 0;        \
    case ERDMA_OP_LAND: LOOP(T, (a[i] != 0) & (b[i] != 0)); return 0;       \
    case ERDMA_OP_LOR: LOOP(T, (a[i] != 0) | (b[i] != 0)); return 0;        \
    case ERDMA_OP_LXOR: LOOP(T, (a[i] != 0) ^ (b[i] != 0)); return 0;       \
    case ERDMA_OP_BAND: LOOP(T, a[i] & b[i]); return 0;                     \
    case ERDMA_OP_BOR: LOOP(T, a[i] | b[i]); return 0;                      \
    case ERDMA_OP_BXOR: LOOP(T, a[i] ^ b[i]); return 0;                     \
    }                                                                        \
    return ERDMA_ERR_INVAL;                                                  \
  }

INT_KERNEL(red_i8, int8_t, uint32_t)
INT_KERNEL(red_i16, int16_t, uint32_t)
INT_KERNEL(red_i32, int32_t, uint32_t)
INT_KERNEL(red_i64, int64_t, uint64_t)
INT_KERNEL(red_u8, uint8_t, uint32_t)
INT_KERNEL(red_u16, uint16_t, uint32_t)
INT_KERNEL(red_u32, uint32_t, uint32_t)
INT_KERNEL(red_u64, uint64_t, uint64_t)

#define FLOAT_KERNEL(NAME, T)                                                \
  static int NAME(const void *in, void *inout, uint64_t n, int op) {        \
    switch (op) {                                                            \
    case ERDMA_OP_SUM: LOOP(T, a[i] + b[i]); return 0;                      \
    case ERDMA_OP_PROD: LOOP(T, a[i] * b[i]); return 0;                     \
    case ERDMA_OP_MAX: LOOP(T, b[i] > a[i] ? b[i] : a[i]); return 0;        \
    case ERDMA_OP_MIN: LOOP(T, b[i] < a[i] ? b[i] : a[i]); return 0;        \
    case ERDMA_OP_LAND: LOOP(T, (a[i] != 0) & (b[i] != 0)); return 0;       \
    case ERDMA_OP_LOR: LOOP(T, (a[i] != 0) | (b[i] != 0)); return 0;        \
    case ERDMA_OP_LXOR: LOOP(T, (a[i] != 0) ^ (b[i] != 0)); return 0;       \
    }                                                                        \
    return ERDMA_ERR_INVAL;                                                  \
  }

FLOAT_KERNEL(red_f32, float)
FLOAT_KERNEL(red_f64, double)

/* Complex: interleaved (re, im); PROD is the textbook formula, as NumPy's. */
#define COMPLEX_KERNEL(NAME, T)                                              \
  static int NAME(const void *in, void *inout, uint64_t n, int op) {        \
    const T *restrict a = (const T *)in;                                     \
    T *restrict b = (T *)inout;                                              \
    if (op == ERDMA_OP_SUM) {                                                \
      for (uint64_t i = 0; i < 2 * n; i++) b[i] = a[i] + b[i];               \
      return 0;                                                              \
    }                                                                        \
    if (op == ERDMA_OP_PROD) {                                               \
      for (uint64_t i = 0; i < n; i++) {                                     \
        T ar = a[2 * i], ai = a[2 * i + 1], br = b[2 * i], bi = b[2 * i + 1]; \
        b[2 * i] = ar * br - ai * bi;                                        \
        b[2 * i + 1] = ar * bi + ai * br;                                    \
      }                                                                      \
      return 0;                                                              \
    }                                                                        \
    return ERDMA_ERR_INVAL;                                                  \
  }

COMPLEX_KERNEL(red_c64, float)
COMPLEX_KERNEL(red_c128, double)

typedef int (*red_fn)(const void *, void *, uint64_t, int);

static const struct {
  red_fn fn;
  int size;
} KERNELS[] = {
    [ERDMA_DT_INT8] = {red_i8, 1},         [ERDMA_DT_INT16] = {red_i16, 2},
    [ERDMA_DT_INT32] = {red_i32, 4},       [ERDMA_DT_INT64] = {red_i64, 8},
    [ERDMA_DT_UINT8] = {red_u8, 1},        [ERDMA_DT_UINT16] = {red_u16, 2},
    [ERDMA_DT_UINT32] = {red_u32, 4},      [ERDMA_DT_UINT64] = {red_u64, 8},
    [ERDMA_DT_FLOAT32] = {red_f32, 4},     [ERDMA_DT_FLOAT64] = {red_f64, 8},
    [ERDMA_DT_COMPLEX64] = {red_c64, 8},   [ERDMA_DT_COMPLEX128] = {red_c128, 16},
};

#define NKERNELS ((int)(sizeof(KERNELS) / sizeof(KERNELS[0])))

int erdma_dtype_size(int dtype) {
  if (dtype < 0 || dtype >= NKERNELS) return 0;
  return KERNELS[dtype].size;
}

int erdma_reduce_local(const void *in, void *inout, uint64_t count, int op,
                       int dtype) {
  if (dtype < 0 || dtype >= NKERNELS || op < ERDMA_OP_SUM || op > ERDMA_OP_BXOR)
    return ERDMA_ERR_INVAL;
  if (count == 0) {
    /* validate the pair without touching memory */
    static const char dummy[16];
    char out[16];
    memset(out, 0, sizeof out);
    return KERNELS[dtype].fn(dummy, out, 1, op);
  }
  if (!in || !inout) return ERDMA_ERR_INVAL;
  return KERNELS[dtype].fn(in, inout, count, op);
}
