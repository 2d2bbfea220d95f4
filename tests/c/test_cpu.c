/* erdma_cpu.c: a thread whose AVX upper halves an instruction left in use
 * (a 256-bit load of ones, as code without VZEROUPPER leaves them) reads
 * as in use, and clear after erdma_cpu_settle; settling twice or on a
 * clean state is harmless.  Where the CPU cannot tell (no XINUSE, no AVX)
 * erdma_cpu_upper_in_use says -1 and settling does nothing. */
// test-sources: ext/src/erdma_cpu.c
#include <stdint.h>

#include "ctest.h"
#include "erdma.h"

static void dirty_upper(void) {
#if defined(__x86_64__)
  __asm__ volatile("vpcmpeqd %%ymm1, %%ymm1, %%ymm1" ::: "xmm1");
#endif
}

TEST(settle_clears_the_upper_halves_an_avx_instruction_left_in_use) {
  if (erdma_cpu_upper_in_use() < 0) { /* nothing to see on this CPU */
    erdma_cpu_settle();
    CHECK_EQ(erdma_cpu_upper_in_use(), -1);
    return;
  }
  dirty_upper();
  CHECK_EQ(erdma_cpu_upper_in_use(), 1);
  erdma_cpu_settle();
  CHECK_EQ(erdma_cpu_upper_in_use(), 0);
  erdma_cpu_settle();
  CHECK_EQ(erdma_cpu_upper_in_use(), 0);
}

CTEST_MAIN()
