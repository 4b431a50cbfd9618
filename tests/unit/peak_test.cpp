// The peaks MFU is a fraction of (models/peak.h): pure functions of the CPU or the GPU's name.
#include "models/peak.h"

#include <gtest/gtest.h>

namespace troupe::models {
namespace {

CpuModel cpu(bool avx2, bool avx512, bool amd = false, int family = 6, double ghz = 2.5) {
  CpuModel m;
  m.features.sse3 = true;
  m.features.avx = avx2 || avx512;
  m.features.avx2 = m.features.fma = avx2 || avx512;
  m.features.avx512f = avx512;
  m.amd = amd;
  m.family = family;
  m.ghz = ghz;
  return m;
}

TEST(Peak, FlopsPerCycleFollowTheVectorUnitsNotTheModelNumber) {
  EXPECT_EQ(cpu_flops_per_cycle(cpu(false, false)), 8);
  EXPECT_EQ(cpu_flops_per_cycle(cpu(true, false)), 32);
  EXPECT_EQ(cpu_flops_per_cycle(cpu(true, true)), 64) << "Intel: two 512-bit FMA units";
  EXPECT_EQ(cpu_flops_per_cycle(cpu(true, true, true, 0x19)), 32) << "Zen 4: 256-bit halves";
  EXPECT_EQ(cpu_flops_per_cycle(cpu(true, true, true, 0x1a)), 64) << "Zen 5";
}

TEST(Peak, ACpusPeakIsThreadsTimesFlopsPerCycleTimesTheClockAndSaysSo) {
  const Peak p = cpu_peak(cpu(true, false), 2);
  EXPECT_DOUBLE_EQ(p.flops, 2 * 32 * 2.5e9);
  EXPECT_EQ(p.source, PeakSource::cpu_estimate);
  for (const char* part :
       {"estimated", "2 thread(s)", "32 f32 FLOP/cycle", "AVX2 FMA", "2.50 GHz", "160.0 GFLOP/s"})
    EXPECT_NE(p.what.find(part), std::string::npos) << part << " in " << p.what;
  EXPECT_EQ(cpu_peak(cpu(true, false, false, 6, 0), 2).flops, 0) << "no clock, no peak";
  // Threads beyond the cores the process may use share them: the peak is the cores'.
  CpuModel two = cpu(true, false);
  two.cores = 2;
  const Peak over = cpu_peak(two, 64);
  EXPECT_DOUBLE_EQ(over.flops, 2 * 32 * 2.5e9);
  EXPECT_NE(over.what.find("64 thread(s) on 2 core(s) x 32"), std::string::npos) << over.what;
  EXPECT_DOUBLE_EQ(cpu_peak(two, 1).flops, 32 * 2.5e9);
}

TEST(Peak, GpusByNameInTheirGemmPrecision) {
  EXPECT_DOUBLE_EQ(gpu_peak("NVIDIA H200", true).flops, 989e12);
  EXPECT_EQ(gpu_peak("NVIDIA H200", true).source, PeakSource::gpu_data_sheet);
  EXPECT_DOUBLE_EQ(gpu_peak("NVIDIA H200", false).flops, 67e12);
  EXPECT_NE(gpu_peak("NVIDIA H200", true).what.find("H200 SXM bf16 dense"), std::string::npos);
  EXPECT_DOUBLE_EQ(gpu_peak("NVIDIA H100 PCIe", true).flops, 756e12);
  EXPECT_DOUBLE_EQ(gpu_peak("NVIDIA H100 80GB HBM3", true).flops, 989e12);
  EXPECT_NE(gpu_peak("NVIDIA GH200 480GB", true).what.find("GH200"), std::string::npos);
  EXPECT_DOUBLE_EQ(gpu_peak("NVIDIA A100-SXM4-80GB", false).flops, 19.5e12);
  const Peak unknown = gpu_peak("NVIDIA GeForce RTX 4090", true);
  EXPECT_EQ(unknown.flops, 0);
  EXPECT_NE(unknown.what.find("not in troupe's table"), std::string::npos) << unknown.what;
  EXPECT_DOUBLE_EQ(given_peak(12.5).flops, 12.5e12);
  EXPECT_EQ(given_peak(12.5).source, PeakSource::given);
  EXPECT_EQ(unknown.source, PeakSource::unknown);
  EXPECT_NE(given_peak(12.5).what.find("observability.peak_tflops = 12.5"), std::string::npos);
}

// This host: every machine of this project has AVX2 and FMA, so never the generic 8.
TEST(Peak, ThisCpuIsNotAGenericFallback) {
  const CpuModel here = this_cpu();
  ASSERT_TRUE(here.features.avx2 && here.features.fma);
  EXPECT_GE(cpu_flops_per_cycle(here), 32);
  if (here.ghz > 0) {
    EXPECT_GT(cpu_peak(here, 1).flops, 1e9);
  }
}

}  // namespace
}  // namespace troupe::models
