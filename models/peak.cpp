#include "models/peak.h"

#include <cpuid.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <fstream>

namespace troupe::models {
namespace {

std::string format(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* f, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

// The clock of the first processor in /proc/cpuinfo ("cpu MHz : 2445.406"), in GHz; 0 if none.
double cpuinfo_ghz() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("cpu MHz", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) return 0;
    try {
      return std::stod(line.substr(colon + 1)) / 1000;
    } catch (const std::exception&) {
      return 0;
    }
  }
  return 0;
}

// The clock this core runs at now, in GHz: a chain of dependent register adds (one a cycle on
// every x86-64 core; an add of a register, not of an immediate, which some cores fold) timed in
// runs of 2M adds until two in a row agree within 2% (the clock has ramped up; at most ~50 ms),
// the fastest of them; 0 if implausible. A virtual machine's /proc/cpuinfo says the nominal
// clock, and a boosting core runs up to twice as fast: an MFU of that peak would pass 1.
double measured_ghz() {
  using Clock = std::chrono::steady_clock;
  uint64_t x = 0, one = 1;
  auto run_ghz = [&] {  // 20,000 x 100 adds
    const auto t0 = Clock::now();
    for (int i = 0; i < 20000; ++i)
      asm volatile(".rept 100\n\tadd %1, %0\n\t.endr" : "+r"(x) : "r"(one));
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    return s > 0 ? 2e6 / s / 1e9 : 0.0;
  };
  const auto deadline = Clock::now() + std::chrono::milliseconds(50);
  double best = 0, last = run_ghz();
  for (int agreed = 0; agreed < 2 && Clock::now() < deadline;) {
    const double now = run_ghz();
    agreed = std::abs(now - last) <= 0.02 * std::max(now, last) ? agreed + 1 : 0;
    best = std::max({best, now, last});
    last = now;
  }
  return best > 0.2 && best < 10 ? best : 0;
}

// The highest clock the kernel's frequency driver says the first core reaches, in GHz; 0 where
// there is none (a virtual machine).
double cpufreq_max_ghz() {
  std::ifstream in("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq");
  double khz = 0;
  return in >> khz && khz > 0 ? khz / 1e6 : 0;
}

const char* vector_unit(const CpuFeatures& f) {
  if (f.avx512f) return "AVX-512 FMA";
  if (f.avx2 && f.fma) return "AVX2 FMA";
  if (f.avx) return "AVX";
  return "SSE";
}

}  // namespace

CpuModel this_cpu() {
  CpuModel m;
  m.features = cpu_features();
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d)) m.amd = b == 0x68747541;  // "Auth"enticAMD
  if (__get_cpuid(1, &a, &b, &c, &d)) {
    const int base = int((a >> 8) & 0xf);
    m.family = base == 0xf ? base + int((a >> 20) & 0xff) : base;
  }
  // (the largest: a peak must not be below what the core does; a busy host slows the chain)
  for (auto [ghz, source] :
       {std::pair{cpuinfo_ghz(), "/proc/cpuinfo"},
        std::pair{cpufreq_max_ghz(), "cpufreq's maximum"}, std::pair{measured_ghz(), "measured"}})
    if (ghz > m.ghz) m.ghz = ghz, m.clock_source = source;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) m.cores = CPU_COUNT(&set);
  return m;
}

double cpu_flops_per_cycle(const CpuModel& cpu) {
  const CpuFeatures& f = cpu.features;
  if (f.avx512f) return cpu.amd && cpu.family < 0x1a ? 32 : 64;  // (Zen 4: 2 x 256-bit halves)
  if (f.avx2 && f.fma) return 32;                                // 8 lanes x 2 x 2 units
  if (f.avx) return 16;                                          // 8 lanes, add + mul ports
  return 8;
}

// (Threads beyond the cores share them: `bench model --threads 64` on 2 cores claimed 64 cores'
// peak, an MFU of 0.15%.)
Peak cpu_peak(const CpuModel& cpu, int threads) {
  if (cpu.ghz <= 0 || threads <= 0) return {0, "cpu: the clock is unknown"};
  const double per_cycle = cpu_flops_per_cycle(cpu);
  const int used = cpu.cores > 0 ? std::min(threads, cpu.cores) : threads;
  const double flops = used * per_cycle * cpu.ghz * 1e9;
  const std::string on =
      used < threads ? format(" on %d core(s)", used) : std::string();  // (its own peak)
  return {flops,
          format("cpu, estimated: %d thread(s)%s x %g f32 FLOP/cycle (%s) x %.2f GHz (%s) = "
                 "%.1f GFLOP/s",
                 threads, on.c_str(), per_cycle, vector_unit(cpu.features), cpu.ghz,
                 cpu.clock_source.c_str(), flops / 1e9),
          PeakSource::cpu_estimate};
}

Peak gpu_peak(const std::string& name, bool bf16) {
  struct Row {
    const char* match;  // a part of the name; the first row that matches is the GPU
    const char* model;
    double bf16, f32;  // dense TFLOP/s, the vendor's data sheet
  };
  static const Row rows[] = {
      {"GH200", "GH200", 989, 67},         {"H200 NVL", "H200 NVL", 835, 60},
      {"H200", "H200 SXM", 989, 67},       {"H100 NVL", "H100 NVL", 835, 60},
      {"H100 PCIe", "H100 PCIe", 756, 51}, {"H100", "H100 SXM", 989, 67},
      {"A100", "A100", 312, 19.5},
  };
  for (const Row& r : rows) {
    if (name.find(r.match) == std::string::npos) continue;
    const double tflops = bf16 ? r.bf16 : r.f32;
    return {tflops * 1e12,
            format("%s %s dense, data sheet: %g TFLOP/s", r.model, bf16 ? "bf16" : "f32 (no TF32)",
                   tflops),
            PeakSource::gpu_data_sheet};
  }
  return {0, "'" + name + "' is not in troupe's table of GPU peaks"};
}

Peak given_peak(double tflops) {
  return {tflops * 1e12, format("observability.peak_tflops = %g per worker", tflops),
          PeakSource::given};
}

}  // namespace troupe::models
