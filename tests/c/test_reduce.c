// test-sources: ext/src/erdma_reduce.c
/* erdma_reduce_local (erdma_reduce.c): every predefined operation on every
 * element type it supports, against results computed here element by
 * element; integer overflow wraps, logical operations give 0/1, MAX/MIN
 * treat NaN and signed zeros as erdmampi/op.py documents, empty counts and
 * invalid pairs.  The engine has no MINLOC/MAXLOC or 16-bit float kernels
 * (erdmampi/op.py does those in NumPy). */
#include <math.h>
#include <stdint.h>

#include "ctest.h"
#include "erdma.h"

#define N 9

static const int INT_OPS[] = {ERDMA_OP_SUM, ERDMA_OP_PROD, ERDMA_OP_MAX, ERDMA_OP_MIN,
                              ERDMA_OP_LAND, ERDMA_OP_LOR, ERDMA_OP_LXOR, ERDMA_OP_BAND,
                              ERDMA_OP_BOR, ERDMA_OP_BXOR};

/* The reference: the operation on values held as (un)signed 64-bit
 * integers, truncated to `bits` (two's complement wrap), sign-extended
 * back for a signed type. */
static int64_t wrap(uint64_t v, int bits, int is_signed) {
  if (bits < 64) {
    v &= (1ull << bits) - 1;
    if (is_signed && (v >> (bits - 1)) & 1) v |= ~0ull << bits;
  }
  return (int64_t)v;
}

static int64_t ref_int(int op, int64_t a, int64_t b, int bits, int sg) {
  uint64_t ua = (uint64_t)a, ub = (uint64_t)b;
  int lt = sg ? a < b : ua < ub; /* a < b in the type's order */
  switch (op) {
  case ERDMA_OP_SUM: return wrap(ua + ub, bits, sg);
  case ERDMA_OP_PROD: return wrap(ua * ub, bits, sg);
  case ERDMA_OP_MAX: return lt ? b : a;
  case ERDMA_OP_MIN: return lt ? a : b;
  case ERDMA_OP_LAND: return a && b;
  case ERDMA_OP_LOR: return a || b;
  case ERDMA_OP_LXOR: return !a != !b;
  case ERDMA_OP_BAND: return wrap(ua & ub, bits, sg);
  case ERDMA_OP_BOR: return wrap(ua | ub, bits, sg);
  case ERDMA_OP_BXOR: return wrap(ua ^ ub, bits, sg);
  }
  abort();
}

/* in/inout pairs with the type's extremes, zero, one and -1 */
#define INT_CASE(T, DT, BITS, SG, MINV, MAXV)                                        \
  do {                                                                               \
    const T in0[N] = {0, 1, (T)-1, MAXV, MINV, MAXV, 3, (T)0x5a, 0};                 \
    const T io0[N] = {0, 1, 2, 1, (T)-1, MAXV, (T)-7, (T)0xa5, (T)-1};               \
    for (size_t k = 0; k < sizeof INT_OPS / sizeof INT_OPS[0]; k++) {                \
      int op = INT_OPS[k];                                                           \
      T in[N], io[N];                                                                \
      memcpy(in, in0, sizeof in);                                                    \
      memcpy(io, io0, sizeof io);                                                    \
      CHECK_EQ(erdma_reduce_local(in, io, N, op, DT), 0);                            \
      CHECK_MEM(in, in0, sizeof in); /* the input is only read */                    \
      for (int i = 0; i < N; i++) {                                                  \
        int64_t want = ref_int(op, (int64_t)in0[i], (int64_t)io0[i], BITS, SG);      \
        if ((int64_t)io[i] != want)                                                  \
          fprintf(stderr, "  dtype %d op %d element %d: in %lld inout %lld\n", DT,   \
                  op, i, (long long)in0[i], (long long)io0[i]);                      \
        CHECK_EQ(io[i], want);                                                       \
      }                                                                              \
    }                                                                                \
  } while (0)

TEST(int8_all_ops) { INT_CASE(int8_t, ERDMA_DT_INT8, 8, 1, INT8_MIN, INT8_MAX); }
TEST(int16_all_ops) { INT_CASE(int16_t, ERDMA_DT_INT16, 16, 1, INT16_MIN, INT16_MAX); }
TEST(int32_all_ops) { INT_CASE(int32_t, ERDMA_DT_INT32, 32, 1, INT32_MIN, INT32_MAX); }
TEST(int64_all_ops) { INT_CASE(int64_t, ERDMA_DT_INT64, 64, 1, INT64_MIN, INT64_MAX); }
TEST(uint8_all_ops) { INT_CASE(uint8_t, ERDMA_DT_UINT8, 8, 0, 0, UINT8_MAX); }
TEST(uint16_all_ops) { INT_CASE(uint16_t, ERDMA_DT_UINT16, 16, 0, 0, UINT16_MAX); }
TEST(uint32_all_ops) { INT_CASE(uint32_t, ERDMA_DT_UINT32, 32, 0, 0, UINT32_MAX); }
TEST(uint64_all_ops) { INT_CASE(uint64_t, ERDMA_DT_UINT64, 64, 0, 0, UINT64_MAX); }

/* the wrap-around cases spelled out, independent of the reference above */
TEST(integer_overflow_wraps) {
  int8_t a8 = 127, b8 = 1;
  CHECK_EQ(erdma_reduce_local(&a8, &b8, 1, ERDMA_OP_SUM, ERDMA_DT_INT8), 0);
  CHECK_EQ(b8, -128);
  int16_t a16 = -32768, b16 = -1;
  CHECK_EQ(erdma_reduce_local(&a16, &b16, 1, ERDMA_OP_PROD, ERDMA_DT_INT16), 0);
  CHECK_EQ(b16, -32768);
  int32_t a32 = INT32_MAX, b32 = 2;
  CHECK_EQ(erdma_reduce_local(&a32, &b32, 1, ERDMA_OP_PROD, ERDMA_DT_INT32), 0);
  CHECK_EQ(b32, -2);
  int64_t a64 = INT64_MIN, b64 = -1;
  CHECK_EQ(erdma_reduce_local(&a64, &b64, 1, ERDMA_OP_SUM, ERDMA_DT_INT64), 0);
  CHECK_EQ(b64, INT64_MAX);
  uint8_t u8a = 200, u8b = 2;
  CHECK_EQ(erdma_reduce_local(&u8a, &u8b, 1, ERDMA_OP_PROD, ERDMA_DT_UINT8), 0);
  CHECK_EQ(u8b, 144);
  uint16_t u16a = 65535, u16b = 65535; /* 65535^2 overflows a 32-bit int: done unsigned */
  CHECK_EQ(erdma_reduce_local(&u16a, &u16b, 1, ERDMA_OP_PROD, ERDMA_DT_UINT16), 0);
  CHECK_EQ(u16b, 1);
  uint64_t u64a = UINT64_MAX, u64b = 2;
  CHECK_EQ(erdma_reduce_local(&u64a, &u64b, 1, ERDMA_OP_SUM, ERDMA_DT_UINT64), 0);
  CHECK_EQ(u64b, 1);
}

/* a length that is no multiple of a vector width: every element counts */
TEST(long_vectors_every_element) {
  enum { M = 1037 };
  static int32_t in[M], io[M];
  for (int i = 0; i < M; i++) in[i] = i * 7 - 3000, io[i] = 5000 - i * 3;
  CHECK_EQ(erdma_reduce_local(in, io, M, ERDMA_OP_SUM, ERDMA_DT_INT32), 0);
  for (int i = 0; i < M; i++) CHECK_EQ(io[i], (i * 7 - 3000) + (5000 - i * 3));
  static double din[M], dio[M];
  for (int i = 0; i < M; i++) din[i] = i * 0.5, dio[i] = (M - i) * 0.25;
  CHECK_EQ(erdma_reduce_local(din, dio, M, ERDMA_OP_MAX, ERDMA_DT_FLOAT64), 0);
  for (int i = 0; i < M; i++) CHECK(dio[i] == fmax(i * 0.5, (M - i) * 0.25));
}

/* floating point: arithmetic as C does it, MAX/MIN as
 * inout = (inout > in) ? inout : in  (resp. <): a NaN in `in` wins, a NaN in
 * `inout` gives `in`; between -0.0 and 0.0 `in` is kept */
#define FLOAT_CASE(T, DT)                                                            \
  do {                                                                               \
    const T in0[N] = {1.5, -2, 0, (T)NAN, 4, -0.0, (T)INFINITY, 3, 1e30};            \
    const T io0[N] = {2.25, 8, -0.0, 5, (T)NAN, 0.0, -1, 0, 1e30};                   \
    const int ops[] = {ERDMA_OP_SUM, ERDMA_OP_PROD, ERDMA_OP_MAX, ERDMA_OP_MIN,      \
                       ERDMA_OP_LAND, ERDMA_OP_LOR, ERDMA_OP_LXOR};                  \
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {                        \
      T in[N], io[N];                                                                \
      memcpy(in, in0, sizeof in);                                                    \
      memcpy(io, io0, sizeof io);                                                    \
      CHECK_EQ(erdma_reduce_local(in, io, N, ops[k], DT), 0);                        \
      for (int i = 0; i < N; i++) {                                                  \
        T a = in0[i], b = io0[i], want;                                              \
        switch (ops[k]) {                                                            \
        case ERDMA_OP_SUM: want = a + b; break;                                      \
        case ERDMA_OP_PROD: want = a * b; break;                                     \
        case ERDMA_OP_MAX: want = isnan(a) ? a : isnan(b) ? a : b > a ? b : a; break; \
        case ERDMA_OP_MIN: want = isnan(a) ? a : isnan(b) ? a : b < a ? b : a; break; \
        case ERDMA_OP_LAND: want = a != 0 && b != 0; break;                          \
        case ERDMA_OP_LOR: want = a != 0 || b != 0; break;                           \
        default: want = (a != 0) != (b != 0); break;                                 \
        }                                                                            \
        if (!(isnan(want) ? isnan(io[i]) : io[i] == want && !signbit(io[i]) == !signbit(want))) \
          fprintf(stderr, "  dtype %d op %d element %d: got %g want %g\n", DT, ops[k], \
                  i, (double)io[i], (double)want);                                   \
        CHECK(isnan(want) ? isnan(io[i]) : io[i] == want);                           \
        CHECK(!signbit(io[i]) == !signbit(want));                                    \
      }                                                                              \
    }                                                                                \
    for (int op = ERDMA_OP_BAND; op <= ERDMA_OP_BXOR; op++) {                        \
      T a = 1, b = 1;                                                                \
      CHECK_EQ(erdma_reduce_local(&a, &b, 1, op, DT), ERDMA_ERR_INVAL);              \
    }                                                                                \
  } while (0)

TEST(float32_all_ops) { FLOAT_CASE(float, ERDMA_DT_FLOAT32); }
TEST(float64_all_ops) { FLOAT_CASE(double, ERDMA_DT_FLOAT64); }

TEST(nan_and_signed_zero_spelled_out) {
  double in = NAN, io = 1;
  erdma_reduce_local(&in, &io, 1, ERDMA_OP_MAX, ERDMA_DT_FLOAT64);
  CHECK(isnan(io)); /* NaN in `in` wins */
  in = 1, io = NAN;
  erdma_reduce_local(&in, &io, 1, ERDMA_OP_MIN, ERDMA_DT_FLOAT64);
  CHECK(io == 1); /* NaN in `inout` is replaced */
  float fin = -0.0f, fio = 0.0f;
  erdma_reduce_local(&fin, &fio, 1, ERDMA_OP_MAX, ERDMA_DT_FLOAT32);
  CHECK(fio == 0 && signbit(fio)); /* equal: `in` (-0.0) */
  double s = NAN, t = 2;
  erdma_reduce_local(&s, &t, 1, ERDMA_OP_SUM, ERDMA_DT_FLOAT64);
  CHECK(isnan(t));
}

#define COMPLEX_CASE(T, DT)                                                          \
  do {                                                                               \
    const T in0[6] = {1, 2, -3, 0.5, 0, 0};                                          \
    const T io0[6] = {3, -4, 2, 2, 7, -1};                                           \
    T io[6];                                                                         \
    memcpy(io, io0, sizeof io);                                                      \
    CHECK_EQ(erdma_reduce_local(in0, io, 3, ERDMA_OP_SUM, DT), 0);                   \
    for (int i = 0; i < 6; i++) CHECK(io[i] == in0[i] + io0[i]);                     \
    memcpy(io, io0, sizeof io);                                                      \
    CHECK_EQ(erdma_reduce_local(in0, io, 3, ERDMA_OP_PROD, DT), 0);                  \
    /* (1+2i)(3-4i) = 11+2i; (-3+0.5i)(2+2i) = -7-5i; 0 * (7-i) = 0 */               \
    const T want[6] = {11, 2, -7, -5, 0, 0};                                         \
    for (int i = 0; i < 6; i++) CHECK(io[i] == want[i]);                             \
    for (int op = ERDMA_OP_MAX; op <= ERDMA_OP_BXOR; op++) {                         \
      memcpy(io, io0, sizeof io);                                                    \
      CHECK_EQ(erdma_reduce_local(in0, io, 3, op, DT), ERDMA_ERR_INVAL);             \
      CHECK_MEM(io, io0, sizeof io); /* refused: untouched */                        \
    }                                                                                \
  } while (0)

TEST(complex64_sum_prod) { COMPLEX_CASE(float, ERDMA_DT_COMPLEX64); }
TEST(complex128_sum_prod) { COMPLEX_CASE(double, ERDMA_DT_COMPLEX128); }

TEST(empty_count_validates_without_touching_memory) {
  /* count 0: NULL buffers are fine, the pair is still checked */
  CHECK_EQ(erdma_reduce_local(NULL, NULL, 0, ERDMA_OP_SUM, ERDMA_DT_INT32), 0);
  CHECK_EQ(erdma_reduce_local(NULL, NULL, 0, ERDMA_OP_BXOR, ERDMA_DT_UINT64), 0);
  CHECK_EQ(erdma_reduce_local(NULL, NULL, 0, ERDMA_OP_BAND, ERDMA_DT_FLOAT32), ERDMA_ERR_INVAL);
  CHECK_EQ(erdma_reduce_local(NULL, NULL, 0, ERDMA_OP_MAX, ERDMA_DT_COMPLEX64), ERDMA_ERR_INVAL);
  int32_t a = 5, b = 6;
  CHECK_EQ(erdma_reduce_local(&a, &b, 0, ERDMA_OP_SUM, ERDMA_DT_INT32), 0);
  CHECK_EQ(b, 6);
}

TEST(invalid_arguments) {
  int32_t a = 1, b = 2;
  CHECK_EQ(erdma_reduce_local(&a, &b, 1, -1, ERDMA_DT_INT32), ERDMA_ERR_INVAL);
  CHECK_EQ(erdma_reduce_local(&a, &b, 1, ERDMA_OP_BXOR + 1, ERDMA_DT_INT32), ERDMA_ERR_INVAL);
  CHECK_EQ(erdma_reduce_local(&a, &b, 1, ERDMA_OP_SUM, -1), ERDMA_ERR_INVAL);
  CHECK_EQ(erdma_reduce_local(&a, &b, 1, ERDMA_OP_SUM, ERDMA_DT_COMPLEX128 + 1), ERDMA_ERR_INVAL);
  CHECK_EQ(erdma_reduce_local(NULL, &b, 1, ERDMA_OP_SUM, ERDMA_DT_INT32), ERDMA_ERR_INVAL);
  CHECK_EQ(erdma_reduce_local(&a, NULL, 1, ERDMA_OP_SUM, ERDMA_DT_INT32), ERDMA_ERR_INVAL);
  CHECK_EQ(b, 2);
}

TEST(dtype_sizes) {
  const int want[] = {1, 2, 4, 8, 1, 2, 4, 8, 4, 8, 8, 16};
  for (int dt = 0; dt <= ERDMA_DT_COMPLEX128; dt++) CHECK_EQ(erdma_dtype_size(dt), want[dt]);
  CHECK_EQ(erdma_dtype_size(-1), 0);
  CHECK_EQ(erdma_dtype_size(ERDMA_DT_COMPLEX128 + 1), 0);
}

CTEST_MAIN()
