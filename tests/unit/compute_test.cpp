// The device seam (models/compute.h) without a GPU: a Compute whose memory the host cannot read.
// GuardedCompute runs the CPU's kernels, but its memory is mapped PROT_NONE except while one of
// its own calls runs: any code that reads or writes a tensor on this "device" other than through
// its Compute (a block, the model's loss, the optimizer, clipping, block state) faults. Models
// trained there must compute what they compute on the CPU, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "models/data.h"
#include "models/state.h"
#include "models/trainer.h"
#include "tests/harness/guarded_compute.h"
#include "workers/host_staging.h"

namespace troupe::models {
namespace {

using testing::GuardedCompute;

std::vector<float> host_params(Model& m) {
  std::vector<float> out;
  for (size_t b = 0; b < m.num_blocks(); ++b) {
    Tensor host = cpu_compute().on_device(m.block(b).params());
    out.insert(out.end(), host.data(), host.data() + host.numel());
  }
  return out;
}

struct Trained {
  std::vector<double> losses;
  std::vector<float> params;
};

// `steps` steps of micro-batches of 3 (gradient accumulation), clipped, on `compute`.
Trained train(const ModelSpec& spec, const OptimizerSpec& os, const Dataset& data, Compute& compute,
              int steps) {
  Model m(spec);
  Optimizer opt(os, m.block_param_counts());
  m.to(compute);
  opt.to(compute);
  m.init(5);  // (after the move: initialised on the host, then moved back)
  Trainer t(m, opt, data, 9, 7, 3);
  Trained r;
  for (int s = 0; s < steps; ++s) r.losses.push_back(t.step(uint64_t(s)).loss);
  r.params = host_params(m);
  return r;
}

ModelSpec odd_gpt(size_t vocab) {
  ModelSpec spec;
  spec.kind = "gpt";
  spec.vocab = vocab;
  spec.context = 13;
  spec.d_model = 20;
  spec.heads = 5;
  spec.layers = 2;
  spec.tied_head = true;
  return spec;
}

// (The guard itself: the host reading this device's memory dies.)
TEST(ComputeSeamDeathTest, TheHostReadingTheGuardedDevicesMemoryFaults) {
  GuardedCompute device;
  Tensor t = device.tensor({4});
  EXPECT_EQ(t.device(), Device::cuda);
  EXPECT_DEATH(
      {
        volatile float x = t.data()[0];
        (void)x;
      },
      "");
  Tensor back = cpu_compute().on_device(t);  // through the Compute: fine
  EXPECT_EQ(back.data()[0], 0.0f);
}

TEST(ComputeSeam, AGptTrainedOnADeviceTheHostCannotReadMatchesTheCpuBitForBit) {
  set_compute_threads(1);
  CharText text(kDefaultTextPath, 13);
  OptimizerSpec os;
  os.kind = "adamw";
  os.lr = 3e-3;
  os.weight_decay = 0.1;
  os.clip_norm = 0.5;
  GuardedCompute device;
  const Trained cpu = train(odd_gpt(text.vocab()), os, text, cpu_compute(), 6);
  const Trained dev = train(odd_gpt(text.vocab()), os, text, device, 6);
  EXPECT_EQ(cpu.losses, dev.losses);
  EXPECT_EQ(0, std::memcmp(cpu.params.data(), dev.params.data(), cpu.params.size() * 4));
  EXPECT_GT(device.calls, 500u) << "the kernels ran through the device's Compute";
}

TEST(ComputeSeam, AnMlpWithSgdOnTheGuardedDeviceMatchesTheCpu) {
  SyntheticClassification data(7, 500, 33, 5);
  ModelSpec spec;
  spec.mlp_sizes = {33, 17, 5};
  OptimizerSpec os;
  os.kind = "sgd";
  os.lr = 0.05;
  GuardedCompute device;
  const Trained cpu = train(spec, os, data, cpu_compute(), 5);
  const Trained dev = train(spec, os, data, device, 5);
  EXPECT_EQ(cpu.losses, dev.losses);
  EXPECT_EQ(cpu.params, dev.params);
}

// Block state from the device is the CPU's bytes; loaded back (from memory and from a file) onto
// the device it trains on as the CPU model does.
TEST(ComputeSeam, BlockStateMovesBetweenTheDeviceAndTheHost) {
  CharText text(kDefaultTextPath, 13);
  OptimizerSpec os;
  GuardedCompute device;
  Model a(odd_gpt(text.vocab())), b(odd_gpt(text.vocab()));
  Optimizer oa(os, a.block_param_counts()), ob(os, b.block_param_counts());
  a.init(1);
  b.init(2);
  a.to(device);
  oa.to(device);
  Trainer ta(a, oa, text, 3, 6, 6);
  ta.step(0);
  const std::string dir = ::testing::TempDir();
  for (size_t i = 0; i < a.num_blocks(); ++i) {
    auto bytes = save_block_state(a.block(i), i, oa, {1, 6});
    load_block_state(bytes, b.block(i), i, ob);  // device -> CPU
    EXPECT_EQ(bytes, save_block_state(b.block(i), i, ob, {1, 6}));
    const std::string path = dir + "/block-" + std::to_string(i);
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_TRUE(f);
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
    load_block_state_file(path, a.block(i), i, oa);  // file -> device
  }
  EXPECT_EQ(host_params(a), host_params(b));
  Trainer tb(b, ob, text, 3, 6, 6);
  EXPECT_EQ(ta.step(1).loss, tb.step(1).loss);
  EXPECT_EQ(host_params(a), host_params(b));
}

// A program's own block reads its tensors on the host: moving it to a device is refused, naming
// it, before anything moves.
TEST(ComputeSeam, AProgramsOwnBlockIsRefusedOnADevice) {
  struct Own : Block {
    Own() { allocate(4); }
    std::string kind() const override { return "own"; }
    double flops_per_sample() const override { return 0; }
    void init(uint64_t, size_t) override {}
    Tensor forward(const Tensor& x, size_t) override { return x; }
    Tensor backward(const Tensor& dy) override { return dy; }
    Saved save() override { return nullptr; }
    void restore(const Saved&) override {}
  };
  std::vector<std::unique_ptr<Block>> blocks;
  blocks.push_back(make_linear_block(4, 4, true));
  blocks.push_back(std::make_unique<Own>());
  ModelSpec spec;
  spec.kind = "mine";
  Model m(spec, std::move(blocks));
  GuardedCompute device;
  try {
    m.to(device);
    FAIL() << "moved";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'own' block runs on the CPU only"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(m.block(0).params().device(), Device::cpu) << "nothing moved";
  EXPECT_EQ(&m.compute(), &cpu_compute());
}

// The data plane's view of a device tensor: the device's host memory for copies (pinned on
// CUDA), loaded from the device and stored back; a host tensor is used in place.
TEST(ComputeSeam, HostStagedCopiesGoThroughTheDevicesHostMemory) {
  GuardedCompute device;
  Tensor t = device.tensor({5});
  const float values[5] = {1, 2, 3, 4, 5};
  device.from_host(t.data(), values, sizeof values);
  {
    workers::HostStaged staged(t);
    EXPECT_EQ(device.host_buffers, 1u);
    EXPECT_EQ(std::memcmp(staged.data(), values, sizeof values), 0);
    staged.data()[0] = 42;
    staged.store();
  }
  EXPECT_EQ(cpu_compute().on_device(t).data()[0], 42.0f);
  Tensor host({5});
  workers::HostStaged in_place(host);
  EXPECT_EQ(in_place.data(), host.data());
}

// ---- model.dtype = "bf16" on the CPU: the CUDA device's mixed precision, emulated
// ----------------

TEST(CpuBf16, RoundsToTheNearestBf16TiesToEven) {
  const float one_ulp = std::ldexp(1.0f, -7);  // bf16's spacing above 1
  EXPECT_EQ(bf16_round(1.0f), 1.0f);
  EXPECT_EQ(bf16_round(1.0f + one_ulp / 2), 1.0f) << "a tie goes to the even neighbour";
  EXPECT_EQ(bf16_round(1.0f + 3 * one_ulp / 2), 1.0f + 2 * one_ulp) << "a tie goes up to even";
  EXPECT_EQ(bf16_round(1.0f + 0.6f * one_ulp), 1.0f + one_ulp);
  EXPECT_EQ(bf16_round(-3.0f), -3.0f);
  EXPECT_TRUE(std::isnan(bf16_round(std::nanf(""))));
  EXPECT_TRUE(std::isinf(bf16_round(3.4e38f))) << "past the largest bf16";
}

// A linear layer's forward is the f32 product of the bf16-rounded input and weight (the bias and
// the sums f32): bit for bit what cpu_compute() gives on rounded copies. The rest is f32.
TEST(CpuBf16, LinearForwardIsTheF32ProductOfTheRoundedInputs) {
  const size_t N = 7, C = 33, OC = 5;
  std::vector<float> inp(N * C), w(OC * C), bias(OC), rin(N * C), rw(OC * C);
  for (size_t i = 0; i < inp.size(); ++i) inp[i] = std::sin(0.37f * float(i)) * 1.7f;
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::cos(0.11f * float(i)) * 0.3f;
  for (size_t i = 0; i < OC; ++i) bias[i] = 0.01f * float(i);
  for (size_t i = 0; i < inp.size(); ++i) rin[i] = bf16_round(inp[i]);
  for (size_t i = 0; i < w.size(); ++i) rw[i] = bf16_round(w[i]);
  std::vector<float> out16(N * OC), want(N * OC), out32(N * OC);
  cpu_bf16_compute().linear_forward(out16.data(), inp.data(), w.data(), bias.data(), N, C, OC);
  cpu_compute().linear_forward(want.data(), rin.data(), rw.data(), bias.data(), N, C, OC);
  cpu_compute().linear_forward(out32.data(), inp.data(), w.data(), bias.data(), N, C, OC);
  EXPECT_EQ(out16, want);
  EXPECT_NE(out16, out32) << "the rounding acts";
  for (size_t i = 0; i < out16.size(); ++i) EXPECT_NEAR(out16[i], out32[i], 0.05) << i;
  std::vector<float> g16(N * C), g32(N * C);
  cpu_bf16_compute().gelu_forward(g16.data(), inp.data(), g16.size());
  cpu_compute().gelu_forward(g32.data(), inp.data(), g32.size());
  EXPECT_EQ(g16, g32) << "everything else is f32";
  EXPECT_EQ(cpu_bf16_compute().device(), Device::cpu);
  EXPECT_EQ(&cpu_bf16_compute().tensor({3}).storage()->compute(), &cpu_bf16_compute());
}

// Its backward GEMMs read bf16 operands too: dinp the f32 product of the rounded dout and weight,
// dweight of the rounded dout and input (both accumulated in f32), dbias the f32 dout's sums.
TEST(CpuBf16, LinearBackwardIsTheF32ProductOfTheRoundedOperands) {
  const size_t N = 6, C = 19, OC = 11;
  std::vector<float> inp(N * C), w(OC * C), dout(N * OC);
  for (size_t i = 0; i < inp.size(); ++i) inp[i] = std::sin(0.29f * float(i)) * 1.3f;
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::cos(0.13f * float(i)) * 0.4f;
  for (size_t i = 0; i < dout.size(); ++i) dout[i] = std::sin(0.71f * float(i) + 1) * 0.05f;
  auto rounded = [](std::vector<float> v) {
    for (float& x : v) x = bf16_round(x);
    return v;
  };
  const std::vector<float> rin = rounded(inp), rw = rounded(w), rdout = rounded(dout);
  std::vector<float> dinp(N * C, 0.5f), dw(OC * C, -0.25f), db(OC, 1.0f);
  std::vector<float> want_dinp = dinp, want_dw = dw, want_db = db, f32_dinp = dinp, f32_dw = dw;
  cpu_bf16_compute().linear_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(),
                                     w.data(), N, C, OC);
  cpu_compute().linear_backward(want_dinp.data(), want_dw.data(), nullptr, rdout.data(), rin.data(),
                                rw.data(), N, C, OC);
  cpu_compute().linear_backward(f32_dinp.data(), f32_dw.data(), want_db.data(), dout.data(),
                                inp.data(), w.data(), N, C, OC);
  EXPECT_EQ(dinp, want_dinp);
  EXPECT_EQ(dw, want_dw);
  EXPECT_EQ(db, want_db) << "the bias gradient sums the f32 dout";
  EXPECT_NE(dw, f32_dw) << "the rounding acts";
}

// Gradients reduced in bf16 (parallel.reduce_dtype) go through Compute::to_bf16 and back: the
// bits of bf16_round, on the CPU and on the stand-in device alike.
TEST(CpuBf16, ToBf16AndBackIsBf16Round) {
  std::vector<float> x(1001);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.77f * float(i)) * std::exp(float(i % 17));
  std::vector<uint16_t> bits(x.size());
  std::vector<float> back(x.size());
  cpu_compute().to_bf16(bits.data(), x.data(), x.size());
  cpu_compute().from_bf16(back.data(), bits.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(back[i], bf16_round(x[i])) << i;
  GuardedCompute device;
  Tensor on = device.tensor({x.size()}), half = device.tensor({(x.size() + 1) / 2}),
         again = device.tensor({x.size()});
  device.from_host(on.data(), x.data(), x.size() * sizeof(float));
  device.to_bf16(reinterpret_cast<uint16_t*>(half.data()), on.data(), x.size());
  device.from_bf16(again.data(), reinterpret_cast<const uint16_t*>(half.data()), x.size());
  std::vector<float> got(x.size());
  device.to_host(got.data(), again.data(), got.size() * sizeof(float));
  EXPECT_EQ(got, back);
}

// A GPT trained in bf16 on the CPU (its GEMMs and attention on bf16 operands): the smoothed loss
// curve stays within 2% of f32's (the CUDA device's criterion) and is not f32's (the key acts).
// At a learning rate where the f32 run itself is stable (lr 1e-3: a 1e-4 change of the rate moves
// its curve by 0.01%); at 3e-3 this shape escapes its loss plateau earlier or later with any
// perturbation (the rate changed by 1e-4 alone moved the curve 2.9% at head size 16), and bf16
// went 3-5% either way.
TEST(CpuBf16, AGptTrainedInBf16StaysWithinTwoPercentOfF32) {
  set_compute_threads(1);
  CharText text(kDefaultTextPath, 13);
  OptimizerSpec os;
  os.kind = "adamw";
  os.lr = 1e-3;
  const Trained f32 = train(odd_gpt(text.vocab()), os, text, cpu_compute(), 300);
  const Trained bf16 = train(odd_gpt(text.vocab()), os, text, cpu_bf16_compute(), 300);
  EXPECT_NE(f32.losses[0], bf16.losses[0]);
  double ema_a = f32.losses[0], ema_b = bf16.losses[0], worst = 0;
  for (size_t s = 1; s < f32.losses.size(); ++s) {
    ema_a = 0.95 * ema_a + 0.05 * f32.losses[s];
    ema_b = 0.95 * ema_b + 0.05 * bf16.losses[s];
    if (s >= 20) worst = std::max(worst, std::abs(ema_b - ema_a) / ema_a);
  }
  EXPECT_LT(worst, 0.02);
  EXPECT_LT(ema_a, 0.8 * f32.losses[0]) << "it learns";
}

}  // namespace
}  // namespace troupe::models
