// A device's peak FLOP/s: the denominator of MFU (model FLOPs utilisation: the model's training
// FLOPs per step over the step's time, as a fraction of what the devices could do). Every peak
// says what it is, because an MFU means nothing without its peak.
//
// GPUs: the vendor's dense (no sparsity) figure for the GEMM precision, by the device's name:
// bf16 tensor cores for model.dtype = "bf16", plain f32 (no TF32: the f32 GEMMs do not use it)
// for f32. CPUs: an estimate, threads x f32 FLOP per cycle from the CPUID features x the clock
// (this_cpu). Unknown (flops 0) where neither is known: MFU is then not reported,
// or observability.peak_tflops names the peak.
//
// cpu_peak and gpu_peak are pure (the CPU and the name passed in) and unit-tested.
#pragma once

#include <string>

#include "models/blas_kernels.h"
#include "models/compute.h"  // (struct Peak)

namespace troupe::models {

struct CpuModel {
  CpuFeatures features;
  bool amd = false;
  int family = 0;                              // CPUID family (base + extended)
  double ghz = 0;                              // the clock; 0: unknown
  std::string clock_source = "/proc/cpuinfo";  // (or "measured", "cpufreq's maximum")
  int cores = 0;  // the cores this process may run on (its affinity); 0: unknown
};

// This CPU: CPUID, and its clock: the fastest of the first processor's in /proc/cpuinfo, the
// frequency driver's maximum, and the one measured running (a chain of dependent adds, 5–50 ms)
// (a boosting core; a virtual machine's nominal clock).
CpuModel this_cpu();

// f32 FLOP per cycle and core: FMA lanes x 2 x FMA units (two 512-bit units on Intel AVX-512;
// AMD before Zen 5 executes 512-bit FMAs as two 256-bit halves: 32).
double cpu_flops_per_cycle(const CpuModel& cpu);

// `threads` cores of this CPU model.
Peak cpu_peak(const CpuModel& cpu, int threads);

// The GPU called `name` (cudaDeviceProp::name); flops 0 for one not in the table.
Peak gpu_peak(const std::string& name, bool bf16);

// A peak the user gave (observability.peak_tflops, per worker).
Peak given_peak(double tflops);

}  // namespace troupe::models
