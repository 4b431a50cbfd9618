// The device seam (models/compute.h) without a GPU: a Compute whose memory the host cannot read.
// GuardedCompute runs the CPU's kernels, but its memory is mapped PROT_NONE except while one of
// its own calls runs: any code that reads or writes a tensor on this "device" other than through
// its Compute (a block, the model's loss, the optimizer, clipping, block state) faults. Models
// trained there must compute what they compute on the CPU, bit for bit.
#include <gtest/gtest.h>

#include <cstring>

#include "models/data.h"
#include "models/state.h"
#include "models/trainer.h"
#include "tests/harness/guarded_compute.h"

namespace troupe::models {
namespace {

using testing::GuardedCompute;

std::vector<size_t> counts_of(Model& m) {
  std::vector<size_t> c;
  for (size_t i = 0; i < m.num_blocks(); ++i) c.push_back(m.block(i).param_count());
  return c;
}

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
  Optimizer opt(os, counts_of(m));
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
  Optimizer oa(os, counts_of(a)), ob(os, counts_of(b));
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

}  // namespace
}  // namespace troupe::models
