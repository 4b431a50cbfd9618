// Models trained on the CUDA device (models/cuda/compute.h) against the same models on the CPU:
// the same block code, the same data and initialisation, only the Compute differs. Each test
// skips, saying why, without a GPU.
#include <gtest/gtest.h>

#include <cmath>

#include "models/cuda/compute.h"
#include "models/data.h"
#include "models/state.h"
#include "models/trainer.h"

namespace troupe::models {
namespace {

// The CPU side's threads (on the emulated device, one: the device runs on the test's own thread,
// and idle compute threads only take turns from it).
#ifdef TROUPE_CUDA_EMULATION
constexpr int kCpuThreads = 1;
#else
constexpr int kCpuThreads = 4;
#endif

#define SKIP_WITHOUT_GPU() \
  if (cuda::device_count() == 0) GTEST_SKIP() << "needs a CUDA device: " << cuda::describe(0)

ModelSpec gpt(size_t vocab, size_t context, size_t d_model, size_t heads, size_t layers) {
  ModelSpec spec;
  spec.kind = "gpt";
  spec.vocab = vocab;
  spec.context = context;
  spec.d_model = d_model;
  spec.heads = heads;
  spec.layers = layers;
  return spec;
}

std::vector<double> losses(const ModelSpec& spec, const OptimizerSpec& os, const Dataset& data,
                           Compute& compute, int steps, size_t batch, size_t micro) {
  Model m(spec);
  Optimizer opt(os, m.block_param_counts());
  m.init(7);
  m.to(compute);
  opt.to(compute);
  Trainer t(m, opt, data, 11, batch, micro);
  std::vector<double> out;
  for (int s = 0; s < steps; ++s) out.push_back(t.step(uint64_t(s)).loss);
  return out;
}

OptimizerSpec adamw(double lr) {
  OptimizerSpec os;
  os.kind = "adamw";
  os.lr = lr;
  os.weight_decay = 0.1;
  os.clip_norm = 1.0;
  return os;
}

// The GPU's per-step losses within `tolerance` (relative) of the CPU's; prints the largest gap.
void expect_follows(const std::vector<double>& cpu, const std::vector<double>& gpu,
                    double tolerance, const char* what) {
  ASSERT_EQ(cpu.size(), gpu.size());
  double worst = 0;
  for (size_t s = 0; s < cpu.size(); ++s) {
    const double rel = std::abs(gpu[s] - cpu[s]) / std::abs(cpu[s]);
    worst = std::max(worst, rel);
    EXPECT_LT(rel, tolerance) << what << ", step " << s << ": cpu " << cpu[s] << ", gpu " << gpu[s];
  }
  std::printf("GPT %zu steps, %s: the largest relative loss difference GPU vs CPU %.3g\n",
              cpu.size(), what, worst);
}

// f32 on the GPU follows the CPU step by step (the bar: 1e-3 relative over 50 steps), at
// shapes that are not multiples of 8: context 37, d_model 60, 5 heads, micro-batches of 5.
TEST(GpuModel, AGptTrainedFiftyStepsFollowsTheCpusLosses) {
  SKIP_WITHOUT_GPU();
  set_compute_threads(kCpuThreads);
  CharText text(kDefaultTextPath, 37);
  const ModelSpec spec = gpt(text.vocab(), 37, 60, 5, 3);
  cuda::CudaCompute device(0);
  const auto cpu = losses(spec, adamw(2e-3), text, cpu_compute(), 50, 15, 5);
  const auto gpu = losses(spec, adamw(2e-3), text, device, 50, 15, 5);
  expect_follows(cpu, gpu, 1e-3, "f32");
  EXPECT_LT(gpu.back(), gpu.front() - 0.5) << "it learns";
}

TEST(GpuModel, AnMlpFollowsTheCpusLosses) {
  SKIP_WITHOUT_GPU();
  SyntheticClassification data(7, 4000, 97, 10);
  ModelSpec spec;
  spec.mlp_sizes = {97, 130, 61, 10};
  OptimizerSpec os;
  os.kind = "sgd";
  os.lr = 0.05;
  cuda::CudaCompute device(0);
  const auto cpu = losses(spec, os, data, cpu_compute(), 50, 33, 11);
  const auto gpu = losses(spec, os, data, device, 50, 33, 11);
  for (size_t s = 0; s < cpu.size(); ++s)
    EXPECT_NEAR(gpu[s], cpu[s], 1e-3 * std::abs(cpu[s])) << "step " << s;
}

// bf16 on the GPU follows the CPU's emulation of it (model.dtype = "bf16" on cpu_bf16_compute()):
// the same rounded inputs, f32 sums in another order; a sum that lands on the other side of a
// bf16 rounding boundary moves the next layer's input by one bf16 step, hence 1e-2.
TEST(GpuModel, Bf16FollowsTheCpusEmulationOfIt) {
  SKIP_WITHOUT_GPU();
  set_compute_threads(kCpuThreads);
  CharText text(kDefaultTextPath, 37);
  const ModelSpec spec = gpt(text.vocab(), 37, 60, 5, 3);
  cuda::CudaCompute device(0, cuda::GemmInput::bf16);
  const auto cpu = losses(spec, adamw(2e-3), text, cpu_bf16_compute(), 50, 15, 5);
  const auto gpu = losses(spec, adamw(2e-3), text, device, 50, 15, 5);
  expect_follows(cpu, gpu, 1e-2, "bf16");
}

// The bf16 operands a forward GEMM made, kept for its backward (CudaCompute::keep_bf16_operands),
// give the bits converting them again gives: a GPT (tied head, two micro-batches a step: the
// weights' copies replaced between them) and an MLP (its first block computes no input gradient:
// its weight's copy is never taken, and the next step's forward replaces it after the update),
// with a forward alone between steps.
TEST(GpuModel, Bf16OperandsKeptForTheBackwardChangeNoBit) {
  SKIP_WITHOUT_GPU();
  auto run = [](const ModelSpec& spec, const Dataset& data, bool keep) {
    cuda::CudaCompute device(0, cuda::GemmInput::bf16);
    device.keep_bf16_operands(keep);
    Model m(spec);
    Optimizer opt(adamw(2e-3), m.block_param_counts());
    m.init(7);
    m.to(device);
    opt.to(device);
    Trainer t(m, opt, data, 11, 12, 6);
    std::vector<double> out;
    for (uint64_t s = 0; s < 8; ++s) {
      out.push_back(t.step(s).loss);
      // A forward alone (its copies never taken) with other samples in the same buffers: the
      // next step's forward must replace them.
      out.push_back(m.evaluate(t.batch(s + 100, 0, 6)).loss);
    }
    EXPECT_EQ(device.bf16_operands_reused() > 0, keep) << spec.kind;
    return out;
  };
  CharText text(kDefaultTextPath, 21);
  const ModelSpec g = gpt(text.vocab(), 21, 48, 3, 2);
  EXPECT_EQ(run(g, text, true), run(g, text, false));
  SyntheticClassification data(7, 4000, 97, 10);
  ModelSpec m;
  m.mlp_sizes = {97, 130, 61, 10};
  EXPECT_EQ(run(m, data, true), run(m, data, false));
}

// bf16 GEMM inputs against f32, both on the GPU: the smoothed loss curves stay within 2%.
TEST(GpuModel, Bf16GemmInputsStayWithinTwoPercentOfF32) {
  SKIP_WITHOUT_GPU();
#ifdef TROUPE_CUDA_EMULATION
  GTEST_SKIP() << "600 steps of a larger GPT: on a GPU only (the emulated GEMMs round as the "
                  "CPU's bf16 emulation, which the test before compares)";
#endif
  CharText text(kDefaultTextPath, 64);
  const ModelSpec spec = gpt(text.vocab(), 64, 128, 4, 4);
  cuda::CudaCompute f32(0), bf16(0, cuda::GemmInput::bf16);
  const auto a = losses(spec, adamw(1e-3), text, f32, 300, 32, 32);
  const auto b = losses(spec, adamw(1e-3), text, bf16, 300, 32, 32);
  double ema_a = a[0], ema_b = b[0], worst = 0;
  for (size_t s = 1; s < a.size(); ++s) {
    ema_a = 0.95 * ema_a + 0.05 * a[s];
    ema_b = 0.95 * ema_b + 0.05 * b[s];
    if (s >= 20) worst = std::max(worst, std::abs(ema_b - ema_a) / ema_a);
  }
  std::printf("bf16 vs f32, 300 steps: smoothed losses %.4f vs %.4f, largest difference %.2f%%\n",
              ema_b, ema_a, 100 * worst);
  EXPECT_LT(worst, 0.02);
  EXPECT_LT(ema_a, 2.6) << "it learns";
}

// Block state saved on the GPU loads on the CPU (and back): the state transfer's and the
// checkpoint's bytes do not depend on the device.
TEST(GpuModel, BlockStateMovesBetweenTheGpuAndTheCpu) {
  SKIP_WITHOUT_GPU();
  CharText text(kDefaultTextPath, 16);
  const ModelSpec spec = gpt(text.vocab(), 16, 32, 4, 2);
  cuda::CudaCompute device(0);
  Model g(spec), c(spec);
  OptimizerSpec os = adamw(1e-3);
  Optimizer og(os, g.block_param_counts()), oc(os, c.block_param_counts());
  g.init(1);
  c.init(2);
  g.to(device);
  og.to(device);
  Trainer tg(g, og, text, 3, 8, 8);
  tg.step(0);
  for (size_t i = 0; i < g.num_blocks(); ++i) {
    const auto bytes = save_block_state(g.block(i), i, og, {1, 8});
    load_block_state(bytes, c.block(i), i, oc);
    EXPECT_EQ(bytes, save_block_state(c.block(i), i, oc, {1, 8})) << "block " << i;
    load_block_state(bytes, g.block(i), i, og);  // (a round trip changes nothing)
    EXPECT_EQ(bytes, save_block_state(g.block(i), i, og, {1, 8})) << "block " << i;
  }
}

}  // namespace
}  // namespace troupe::models
