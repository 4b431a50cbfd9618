// The device seam (models/compute.h) without a GPU: a Compute whose memory the host cannot read.
// GuardedCompute runs the CPU's kernels, but its memory is mapped PROT_NONE except while one of
// its own calls runs: any code that reads or writes a tensor on this "device" other than through
// its Compute (a block, the model's loss, the optimizer, clipping, block state) faults. Models
// trained there must compute what they compute on the CPU, bit for bit.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>
#include <set>

#include "models/data.h"
#include "models/state.h"
#include "models/trainer.h"

namespace troupe::models {
namespace {

class GuardedCompute;

class GuardedMemory final : public Memory {
 public:
  GuardedMemory(size_t bytes, GuardedCompute& owner);
  ~GuardedMemory() override;
  void discard() override {}
  size_t mapped() const { return mapped_; }

 private:
  size_t mapped_;
  GuardedCompute& owner_;
};

class GuardedCompute final : public Compute {
 public:
  Device device() const override { return Device::cuda; }  // (a stand-in: not the CPU)
  std::string describe() const override { return "guarded host memory"; }
  size_t calls = 0;

  std::unique_ptr<Memory> allocate(size_t bytes) override {
    return std::make_unique<GuardedMemory>(bytes, *this);
  }
  void enlist(GuardedMemory* m) { regions_.insert(m); }
  void delist(GuardedMemory* m) { regions_.erase(m); }

  void zero(void* p, size_t n) override {
    Open o(*this);
    std::memset(p, 0, n);
  }
  void copy(void* d, const void* s, size_t n) override {
    Open o(*this);
    std::memcpy(d, s, n);
  }
  void to_host(void* d, const void* s, size_t n) override {
    Open o(*this);
    std::memcpy(d, s, n);
  }
  void from_host(void* d, const void* s, size_t n) override {
    Open o(*this);
    std::memcpy(d, s, n);
  }
  void synchronize() override {}

  void linear_forward(float* out, const float* inp, const float* w, const float* b, size_t N,
                      size_t C, size_t OC) override {
    Open o(*this);
    cpu().linear_forward(out, inp, w, b, N, C, OC);
  }
  void linear_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                       const float* w, size_t N, size_t C, size_t OC) override {
    Open o(*this);
    cpu().linear_backward(dinp, dw, db, dout, inp, w, N, C, OC);
  }
  void relu_forward(float* out, const float* inp, size_t n) override {
    Open o(*this);
    cpu().relu_forward(out, inp, n);
  }
  void relu_backward(float* dinp, const float* dout, const float* inp, size_t n) override {
    Open o(*this);
    cpu().relu_backward(dinp, dout, inp, n);
  }
  void gelu_forward(float* out, const float* inp, size_t n) override {
    Open o(*this);
    cpu().gelu_forward(out, inp, n);
  }
  void gelu_backward(float* dinp, const float* dout, const float* inp, size_t n) override {
    Open o(*this);
    cpu().gelu_backward(dinp, dout, inp, n);
  }
  void residual_forward(float* out, const float* a, const float* b, size_t n) override {
    Open o(*this);
    cpu().residual_forward(out, a, b, n);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, size_t N, size_t C) override {
    Open o(*this);
    cpu().layernorm_forward(out, mean, rstd, inp, w, b, N, C);
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, size_t N,
                          size_t C) override {
    Open o(*this);
    cpu().layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                         size_t B, size_t T, size_t C) override {
    Open o(*this);
    cpu().embedding_forward(out, tokens, wte, wpe, B, T, C);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                          size_t B, size_t T, size_t C) override {
    Open o(*this);
    cpu().embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
  }
  size_t attention_saved(size_t B, size_t T, size_t NH) const override {
    return cpu_compute().attention_saved(B, T, NH);
  }
  void attention_forward(float* out, float* saved, const float* qkv, size_t B, size_t T, size_t C,
                         size_t NH) override {
    Open o(*this);
    cpu().attention_forward(out, saved, qkv, B, T, C, NH);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                          const float* saved, size_t B, size_t T, size_t C, size_t NH) override {
    Open o(*this);
    cpu().attention_backward(dqkv, dout, qkv, out, saved, B, T, C, NH);
  }
  double cross_entropy(float* dlogits, const float* logits, const int32_t* targets, size_t N,
                       size_t V, double scale, size_t* correct) override {
    Open o(*this);
    return cpu().cross_entropy(dlogits, logits, targets, N, V, scale, correct);
  }
  double grad_norm_sq(const float* g, size_t n) override {
    Open o(*this);
    return cpu().grad_norm_sq(g, n);
  }
  void adamw(float* p, const float* g, float* m, float* v, size_t n, const AdamWStep& s) override {
    Open o(*this);
    cpu().adamw(p, g, m, v, n, s);
  }
  void sgd(float* p, const float* g, float* m, size_t n, float lr, float mu, float wd,
           float scale) override {
    Open o(*this);
    cpu().sgd(p, g, m, n, lr, mu, wd, scale);
  }

 private:
  // While one lives, this device's memory is readable and writable.
  struct Open {
    GuardedCompute& c;
    explicit Open(GuardedCompute& c) : c(c) {
      ++c.calls;
      c.protect(PROT_READ | PROT_WRITE);
    }
    ~Open() { c.protect(PROT_NONE); }
  };
  void protect(int how) {
    for (GuardedMemory* m : regions_) ASSERT_EQ(mprotect(m->data(), m->mapped(), how), 0);
  }
  static Compute& cpu() { return cpu_compute(); }
  std::set<GuardedMemory*> regions_;
};

GuardedMemory::GuardedMemory(size_t bytes, GuardedCompute& owner)
    : Memory(nullptr, bytes, Device::cuda, owner),
      mapped_((bytes + 4095) / 4096 * 4096 + 4096),
      owner_(owner) {
  data_ = mmap(nullptr, mapped_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);  // (zeros)
  if (data_ == MAP_FAILED) throw std::bad_alloc();
  owner_.enlist(this);
}

GuardedMemory::~GuardedMemory() {
  owner_.delist(this);
  munmap(data_, mapped_);
}

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
