/* ctest.h - a tiny unit test framework for the engine's C tests.
 *
 *   TEST(name) { CHECK(x == 1); CHECK_EQ(a, b); CHECK_STR(s, "x"); ... }
 *   CTEST_MAIN()   -- once, at the end of the file
 *
 * A failed check prints file:line, the expression and (CHECK_EQ) both
 * values, then ends the test (the other tests still run).  The program runs
 * every test, or those named on the command line; `--list` prints the names.
 * It exits 1 if a test failed (or a name is unknown), else 0. */
#ifndef ERDMA_CTEST_H
#define ERDMA_CTEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ctest {
  const char *name;
  void (*fn)(int *failed_);
  struct ctest *next;
} ctest;

static ctest *ctest_head_, **ctest_tail_ = &ctest_head_;

/* tests register themselves at load time, in file order */
#define TEST(NAME)                                                         \
  static void test_##NAME(int *failed_);                                   \
  static ctest ctest_##NAME = {#NAME, test_##NAME, NULL};                  \
  __attribute__((constructor)) static void ctest_reg_##NAME(void) {        \
    *ctest_tail_ = &ctest_##NAME;                                          \
    ctest_tail_ = &ctest_##NAME.next;                                      \
  }                                                                        \
  static void test_##NAME(int *failed_)

#define CHECK(EXPR)                                                        \
  do {                                                                     \
    if (!(EXPR)) {                                                         \
      fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #EXPR); \
      *failed_ = 1;                                                        \
      return;                                                              \
    }                                                                      \
  } while (0)

/* integers (compared and printed as long long) */
#define CHECK_EQ(A, B)                                                     \
  do {                                                                     \
    long long a_ = (long long)(A), b_ = (long long)(B);                    \
    if (a_ != b_) {                                                        \
      fprintf(stderr, "%s:%d: CHECK_EQ(%s, %s) failed: %lld != %lld\n",    \
              __FILE__, __LINE__, #A, #B, a_, b_);                         \
      *failed_ = 1;                                                        \
      return;                                                              \
    }                                                                      \
  } while (0)

#define CHECK_MEM(A, B, N) CHECK(memcmp((A), (B), (N)) == 0)
#define CHECK_STR(A, B) CHECK(strcmp((A), (B)) == 0)

static int ctest_run_(ctest *t) {
  int failed = 0;
  t->fn(&failed);
  fprintf(stderr, "%s %s\n", failed ? "FAIL" : "ok  ", t->name);
  return failed;
}

#define CTEST_MAIN()                                                       \
  int main(int argc, char **argv) {                                        \
    int bad = 0, n = 0, unknown = 0;                                       \
    if (argc == 2 && strcmp(argv[1], "--list") == 0) {                     \
      for (ctest *t = ctest_head_; t; t = t->next) printf("%s\n", t->name); \
      return 0;                                                            \
    }                                                                      \
    for (ctest *t = ctest_head_; t; t = t->next) {                         \
      int want = argc == 1;                                                \
      for (int i = 1; i < argc; i++) want |= strcmp(argv[i], t->name) == 0; \
      if (want) bad += ctest_run_(t), n++;                                 \
    }                                                                      \
    for (int i = 1; i < argc; i++) {                                       \
      int known = 0;                                                       \
      for (ctest *t = ctest_head_; t; t = t->next) known |= strcmp(argv[i], t->name) == 0; \
      if (!known) fprintf(stderr, "no test named %s\n", argv[i]), unknown++; \
    }                                                                      \
    fprintf(stderr, "%d of %d tests failed\n", bad, n);                    \
    return bad || unknown ? 1 : 0;                                         \
  }

#endif
