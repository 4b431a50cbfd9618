// The BLAS kernels are chosen by the CPU's features, not its model: a CPU newer than OpenBLAS's
// tables (Intel family 6 model 207: AVX-512, AVX512_BF16, AMX) for which the library loaded its
// Prescott kernels is given its AVX-512 ones; a right choice is kept; never a restart loop.
#include "models/blas_kernels.h"

#include <gtest/gtest.h>

namespace troupe::models {
namespace {

CpuFeatures avx2_only() {
  CpuFeatures f;
  f.sse3 = f.avx = f.avx2 = f.fma = true;
  return f;
}

CpuFeatures sapphire_rapids_class() {
  CpuFeatures f = avx2_only();
  f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = f.avx512cd = f.avx512_bf16 = true;
  return f;
}

TEST(BlasKernels, ANewerCpuThanOpenBlasKnowsGetsItsAvx512Kernels) {
  auto d = decide_blas_kernels(sapphire_rapids_class(), "Prescott", nullptr, false);
  EXPECT_TRUE(d.restart);
  EXPECT_EQ(d.wanted, "Cooperlake");
  EXPECT_NE(d.reason.find("Prescott"), std::string::npos) << d.reason;
  CpuFeatures skx = sapphire_rapids_class();
  skx.avx512_bf16 = false;
  EXPECT_EQ(decide_blas_kernels(skx, "Prescott", nullptr, false).wanted, "SkylakeX");
  EXPECT_EQ(decide_blas_kernels(avx2_only(), "Core2", nullptr, false).wanted, "Haswell");
  // AVX-512 F alone (no BW/VL/DQ, as Knights Landing) is not SkylakeX's instruction set.
  CpuFeatures knl = avx2_only();
  knl.avx512f = knl.avx512cd = true;
  EXPECT_EQ(best_kernel_class(knl), KernelClass::avx2);
}

TEST(BlasKernels, ARightChoiceIsKeptAndNeverDowngraded) {
  for (const char* good : {"Cooperlake", "SapphireRapids"}) {
    auto d = decide_blas_kernels(sapphire_rapids_class(), good, nullptr, false);
    EXPECT_FALSE(d.restart) << good;
    EXPECT_EQ(d.wanted, "") << good;
  }
  // OpenBLAS's own AVX2 choices for AMD (Zen) are as good as Haswell.
  EXPECT_FALSE(decide_blas_kernels(avx2_only(), "Zen", nullptr, false).restart);
  // Better than the features say (a hypervisor hiding a flag): not lowered.
  EXPECT_FALSE(decide_blas_kernels(avx2_only(), "SkylakeX", nullptr, false).restart);
  EXPECT_FALSE(decide_blas_kernels(CpuFeatures{}, "Prescott", nullptr, false).restart);
}

TEST(BlasKernels, TheEnvironmentOverridesAndARestartHappensOnce) {
  EXPECT_FALSE(decide_blas_kernels(sapphire_rapids_class(), "Prescott", "openblas", false).restart);
  auto forced = decide_blas_kernels(sapphire_rapids_class(), "Cooperlake", "Haswell", false);
  EXPECT_TRUE(forced.restart);
  EXPECT_EQ(forced.wanted, "Haswell");
  EXPECT_FALSE(decide_blas_kernels(sapphire_rapids_class(), "Haswell", "Haswell", false).restart);
  EXPECT_FALSE(decide_blas_kernels(sapphire_rapids_class(), "Cooperlake", nullptr, true).not_taken);
  // Executed again and the library still runs the old core (a name it does not know): go on.
  auto again = decide_blas_kernels(sapphire_rapids_class(), "Prescott", nullptr, true);
  EXPECT_FALSE(again.restart);
  EXPECT_TRUE(again.not_taken);
  EXPECT_NE(again.reason.find("still runs Prescott"), std::string::npos) << again.reason;
}

TEST(BlasKernels, ThisCpuRunsTheBestClassItsFeaturesAllowOrTheCommandRestartsForIt) {
  // The unit-test binary is not the command (it does not execute itself again): OpenBLAS's own
  // choice here is either right, or the command's decision on this host restarts it with a
  // class that is (an Intel CPU newer than OpenBLAS 0.3.21 falls back to Prescott). The
  // command itself is checked in Kernels.* (tests/integration/kernels_test.cpp).
  const CpuFeatures f = cpu_features();
  if (!f.avx2) GTEST_SKIP() << "this CPU has no AVX2: " << describe(f);
  const std::string loaded = loaded_blas_core();
  std::printf("BLAS: %s\n", blas_summary().c_str());
  if (kernel_class(loaded) != KernelClass::generic) return;
  const auto d = decide_blas_kernels(f, loaded, nullptr, false);
  EXPECT_TRUE(d.restart) << loaded << " on " << describe(f) << ": " << d.reason;
  EXPECT_NE(kernel_class(d.wanted), KernelClass::generic) << d.wanted;
}

}  // namespace
}  // namespace troupe::models
