#include "models/blas_kernels.h"

#include <cpuid.h>

#include <algorithm>
#include <cctype>
#include <cstdint>

extern "C" char* openblas_get_corename(void);
extern "C" char* openblas_get_config(void);

namespace troupe::models {
namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

uint64_t xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

}  // namespace

CpuFeatures cpu_features() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  f.sse3 = c & bit_SSE3;
  const bool osxsave = c & bit_OSXSAVE;
  const uint64_t xcr = osxsave ? xcr0() : 0;
  const bool ymm = (xcr & 0x6) == 0x6;           // SSE and AVX state saved by the OS
  const bool zmm = ymm && (xcr & 0xe0) == 0xe0;  // opmask, upper ZMM, high ZMM
  f.avx = ymm && (c & bit_AVX);
  f.fma = f.avx && (c & bit_FMA);
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx2 = f.avx && (b & bit_AVX2);
    f.avx512f = zmm && (b & bit_AVX512F);
    f.avx512bw = f.avx512f && (b & bit_AVX512BW);
    f.avx512vl = f.avx512f && (b & bit_AVX512VL);
    f.avx512dq = f.avx512f && (b & bit_AVX512DQ);
    f.avx512cd = f.avx512f && (b & bit_AVX512CD);
  }
  if (f.avx512f && __get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512_bf16 = a & (1u << 5);
  return f;
}

std::string describe(const CpuFeatures& f) {
  std::string s;
  for (auto [on, name] : {std::pair{f.sse3, "sse3"},
                          {f.avx, "avx"},
                          {f.avx2, "avx2"},
                          {f.fma, "fma"},
                          {f.avx512f, "avx512f"},
                          {f.avx512bw, "avx512bw"},
                          {f.avx512vl, "avx512vl"},
                          {f.avx512dq, "avx512dq"},
                          {f.avx512cd, "avx512cd"},
                          {f.avx512_bf16, "avx512_bf16"}})
    if (on) s += (s.empty() ? "" : " ") + std::string(name);
  return s.empty() ? "no SIMD extension" : s;
}

KernelClass kernel_class(const std::string& core) {
  const std::string c = lower(core);
  if (c == "cooperlake" || c == "sapphirerapids") return KernelClass::avx512_bf16;
  if (c == "skylakex") return KernelClass::avx512;
  if (c == "haswell" || c == "zen" || c == "excavator" || c == "steamroller")
    return KernelClass::avx2;
  if (c == "sandybridge" || c == "bulldozer" || c == "piledriver") return KernelClass::avx;
  return KernelClass::generic;  // Prescott, Core2, Nehalem, Katmai, ...: SSE kernels
}

KernelClass best_kernel_class(const CpuFeatures& f) {
  // OpenBLAS's SkylakeX kernels use AVX-512 F, BW, VL, DQ and CD (what Skylake-SP has).
  const bool skx = f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512cd && f.avx2;
  if (skx && f.avx512_bf16) return KernelClass::avx512_bf16;
  if (skx) return KernelClass::avx512;
  if (f.avx2 && f.fma) return KernelClass::avx2;
  if (f.avx) return KernelClass::avx;
  return KernelClass::generic;
}

std::string core_for(KernelClass k) {
  switch (k) {
    case KernelClass::avx512_bf16:
      return "Cooperlake";
    case KernelClass::avx512:
      return "SkylakeX";
    case KernelClass::avx2:
      return "Haswell";
    case KernelClass::avx:
      return "Sandybridge";
    case KernelClass::generic:
      break;
  }
  return "";
}

BlasDecision decide_blas_kernels(const CpuFeatures& features, const std::string& loaded,
                                 const char* troupe_env, bool restarted) {
  BlasDecision d;
  const std::string env = troupe_env ? troupe_env : "";
  if (env == "openblas") {
    d.reason = "OpenBLAS chose " + loaded + " (TROUPE_BLAS_CORE=openblas)";
    return d;
  }
  if (!env.empty()) {
    d.wanted = env;
    d.reason = "TROUPE_BLAS_CORE=" + env;
  } else {
    const KernelClass best = best_kernel_class(features);
    if (kernel_class(loaded) >= best) {
      d.reason = "OpenBLAS chose " + loaded + ", the best class this CPU supports";
      return d;
    }
    d.wanted = core_for(best);
    d.reason =
        "OpenBLAS chose " + loaded + " but the CPU has " + describe(features) + ": " + d.wanted;
  }
  if (lower(loaded) == lower(d.wanted)) return d;
  if (restarted) {  // the library did not take the core asked for: never loop
    d.reason += "; OpenBLAS still runs " + loaded + " after setting OPENBLAS_CORETYPE";
    d.not_taken = true;
    return d;
  }
  d.restart = true;
  return d;
}

std::string loaded_blas_core() {
  const char* c = openblas_get_corename();
  return c ? c : "unknown";
}

std::string blas_summary() {
  std::string config = openblas_get_config() ? openblas_get_config() : "OpenBLAS";
  // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ...": the name and the version.
  const size_t second_space = config.find(' ', config.find(' ') + 1);
  return config.substr(0, second_space) + ", " + loaded_blas_core() +
         " kernels (CPU: " + describe(cpu_features()) + ")";
}

}  // namespace troupe::models
