// Which BLAS kernels the process runs, chosen from the CPU's features (CPUID), not its model.
//
// Debian's OpenBLAS (0.3.21, DYNAMIC_ARCH) picks its kernels once, when the library loads, from
// tables of CPU models: a CPU newer than its tables (Intel family 6 model 207, with AVX-512 and
// AMX) gets the Prescott (SSE3) kernels, 3.8x slower for the MLP. OPENBLAS_CORETYPE overrides the
// pick, but only before the library loads. So the command checks at its start
// (cli: choose_blas_kernels): when the features allow a better kernel class than the one loaded,
// it sets OPENBLAS_CORETYPE and executes itself again (once); processes it starts inherit the
// variable. TROUPE_BLAS_CORE=NAME forces a core, TROUPE_BLAS_CORE=openblas keeps OpenBLAS's own
// choice (and a user's OPENBLAS_CORETYPE).
//
// decide_blas_kernels is pure (features and names passed in) and unit-tested; cpu_features and
// loaded_blas_core read the machine. Thread-safe (no state).
#pragma once

#include <string>

namespace troupe::models {

// What the kernels need, with the operating system's support for the registers counted (XCR0).
struct CpuFeatures {
  bool sse3 = false, avx = false, avx2 = false, fma = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false, avx512cd = false;
  bool avx512_bf16 = false;
};

CpuFeatures cpu_features();                         // this CPU (CPUID + XGETBV)
std::string describe(const CpuFeatures& features);  // "avx2 fma avx512f ..."

// Kernel classes, weakest first. An OpenBLAS core name maps to one (unknown names: generic).
enum class KernelClass { generic = 0, avx = 1, avx2 = 2, avx512 = 3, avx512_bf16 = 4 };
KernelClass kernel_class(const std::string& openblas_core);
KernelClass best_kernel_class(const CpuFeatures& features);
// The OpenBLAS core of a class ("Cooperlake", "SkylakeX", "Haswell", "Sandybridge", "" for
// generic: nothing to ask for).
std::string core_for(KernelClass k);

struct BlasDecision {
  std::string wanted;      // the OPENBLAS_CORETYPE to set before loading again ("" : keep)
  std::string reason;      // one line for the log
  bool restart = false;    // execute the process again with `wanted` set
  bool not_taken = false;  // executed again, and the library still runs another core
};

// loaded: the core the library chose (openblas_get_corename); troupe_env: TROUPE_BLAS_CORE (null
// when unset); restarted: this process already executed itself again for the kernels (never twice).
BlasDecision decide_blas_kernels(const CpuFeatures& features, const std::string& loaded,
                                 const char* troupe_env, bool restarted);

std::string loaded_blas_core();  // the OpenBLAS core this process runs
// "OpenBLAS 0.3.21, Cooperlake kernels (CPU: avx2 fma avx512f ...)": logged once per worker,
// printed by `troupe bench model`.
std::string blas_summary();

}  // namespace troupe::models
