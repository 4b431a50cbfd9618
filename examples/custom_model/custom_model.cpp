// Your own model and data set, trained elastically by Troupe: a small convolutional network
// (3x3 convolutions with residual connections, global average pooling, a linear head) on a data
// set of your own (noisy images of stripes; the class is the stripes' direction). Nothing in
// Troupe resembles either: Troupe sees a sequence of blocks with flat parameter buffers and a
// function from a global sample position to a sample. Failures, joins, scaling, pipeline stages,
// state transfer, checkpoints and the exactly-once ledger work on them unchanged.
//
// Built against an installed Troupe (find_package(Troupe); see CMakeLists.txt here):
//
//   cmake -S examples/custom_model -B build-example -DCMAKE_PREFIX_PATH=PREFIX
//   cmake --build build-example
//   build-example/custom_model run examples/custom_model/convnet.toml
//
// This program is the whole `troupe` command with two more kinds: `model.kind = "convnet"` and
// `data.kind = "stripes"`, each with its own keys (convnet: channels, depth; stripes: size,
// samples, noise), checked like the built-in ones (`custom_model run` refuses an unknown or
// mistyped key with file:line:col). Expected output of the run above: progress lines, then
// "troupe: job 'convnet' finished after 300 of 300 steps, loss 0.2-0.4 (RUN_DIR)"; exit 0. The
// loss starts near ln 4 = 1.386 (four directions).
#include <troupe/cli/main.h>
#include <troupe/models/blocks.h>
#include <troupe/models/data.h>
#include <troupe/models/extension.h>
#include <troupe/models/kernels.h>
#include <troupe/models/random.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

using namespace troupe;
using models::Block;
using models::Tensor;

namespace {

// ---- The data set: stripes in four directions, with noise. --------------------------------
// Sample i is a pure function of (seed, i): every worker reads only the positions it is given.
class Stripes : public models::Dataset {
 public:
  Stripes(uint64_t seed, size_t samples, size_t size, double noise)
      : seed_(seed), samples_(samples), size_(size), noise_(noise) {}
  size_t size() const override { return samples_; }
  size_t input_width() const override { return size_ * size_; }  // one channel, size x size
  size_t targets_per_sample() const override { return 1; }
  size_t classes() const override { return 4; }
  void fill(size_t index, float* input, int32_t* targets) const override {
    models::Rng rng(models::mix(seed_, index, 0x57));
    const int direction = int(rng.below(4));  // horizontal, vertical, diagonal, anti-diagonal
    const double period = 3.0 + double(rng.below(3)), phase = rng.uniform() * period;
    static const int dx[] = {0, 1, 1, 1}, dy[] = {1, 0, 1, -1};
    for (size_t y = 0; y < size_; ++y)
      for (size_t x = 0; x < size_; ++x) {
        const double t = double(dx[direction]) * double(x) + double(dy[direction]) * double(y);
        const double stripe = std::sin(6.283185307179586 * (t + phase) / period);
        input[y * size_ + x] = float(stripe + noise_ * rng.normal());
      }
    targets[0] = direction;
  }

 private:
  uint64_t seed_;
  size_t samples_, size_;
  double noise_;
};

// ---- The blocks. Legend: B batch, C channels, H = W = size. Activations (B, C, H, W). --------

// y = relu(conv3x3(x) + bias), plus x when residual (cin == cout). Padding 1: H x W stays.
class Conv3x3 : public Block {
 public:
  Conv3x3(size_t cin, size_t cout, size_t size, bool residual)
      : cin_(cin), cout_(cout), hw_(size), residual_(residual) {
    allocate(cout * cin * 9 + cout);
    Carver c{this};
    std::tie(w_, dw_) = c.take("weight", {cout, cin, 3, 3});
    std::tie(b_, db_) = c.take("bias", {cout});
  }
  std::string kind() const override { return residual_ ? "conv3x3_residual" : "conv3x3"; }
  double flops_per_sample() const override {
    return 3.0 * 2.0 * double(cout_ * cin_ * 9 * hw_ * hw_);  // forward + twice that backward
  }
  void init(uint64_t seed, size_t index) override {
    models::Rng rng(models::mix(seed, index, 0xc0));
    const double bound = 1.0 / std::sqrt(double(cin_ * 9));
    models::fill_uniform(w_, rng, bound);
    models::fill_uniform(b_, rng, bound);
  }
  Tensor forward(const Tensor& x, size_t B) override {
    if (x.numel() != B * cin_ * hw_ * hw_)
      throw std::invalid_argument("conv3x3: the input is not (B, " + std::to_string(cin_) + ", " +
                                  std::to_string(hw_) + ", " + std::to_string(hw_) + ")");
    c_ = Cache{x, Tensor({B, cout_, hw_, hw_}), B};
    float* y = c_.y.data();
    for (size_t n = 0; n < B; ++n)
      for (size_t o = 0; o < cout_; ++o)
        for (size_t p = 0; p < hw_ * hw_; ++p) {
          const float v = b_.data()[o] + convolve(x.data(), n, o, p / hw_, p % hw_);
          y[(n * cout_ + o) * hw_ * hw_ + p] = v > 0 ? v : 0;
        }
    if (!residual_) return c_.y;
    Tensor out({B, cout_, hw_, hw_});
    for (size_t i = 0; i < out.numel(); ++i) out.data()[i] = c_.y.data()[i] + x.data()[i];
    return out;
  }
  Tensor backward(const Tensor& dy) override {
    const size_t B = c_.B, plane = hw_ * hw_;
    Tensor dx({B, cin_, hw_, hw_});  // zeros
    for (size_t n = 0; n < B; ++n)
      for (size_t o = 0; o < cout_; ++o)
        for (size_t p = 0; p < plane; ++p) {
          const size_t at = (n * cout_ + o) * plane + p;
          if (c_.y.data()[at] <= 0) continue;  // (the ReLU's gradient)
          const float g = dy.data()[at];
          db_.data()[o] += g;
          scatter(n, o, p / hw_, p % hw_, g, dx.data());
        }
    if (residual_)
      for (size_t i = 0; i < dx.numel(); ++i) dx.data()[i] += dy.data()[i];
    return dx;
  }
  Saved save() override { return std::make_shared<Cache>(std::move(c_)); }
  void restore(const Saved& saved) override { c_ = *std::static_pointer_cast<Cache>(saved); }

 private:
  struct Cache {
    Tensor x, y;  // the input, and relu(conv + bias)
    size_t B = 0;
  };
  // The 3x3 window of every input channel around (r, c), weighted for output channel o.
  float convolve(const float* x, size_t n, size_t o, size_t r, size_t c) const {
    float sum = 0;
    for (size_t i = 0; i < cin_; ++i)
      for (int kr = -1; kr <= 1; ++kr)
        for (int kc = -1; kc <= 1; ++kc) {
          const long rr = long(r) + kr, cc = long(c) + kc;
          if (rr < 0 || cc < 0 || rr >= long(hw_) || cc >= long(hw_)) continue;
          sum += w_.data()[((o * cin_ + i) * 3 + size_t(kr + 1)) * 3 + size_t(kc + 1)] *
                 x[(n * cin_ + i) * hw_ * hw_ + size_t(rr) * hw_ + size_t(cc)];
        }
    return sum;
  }
  // The gradient g of output (n, o, r, c) into the weights and (when needed) the input.
  void scatter(size_t n, size_t o, size_t r, size_t c, float g, float* dx) {
    for (size_t i = 0; i < cin_; ++i)
      for (int kr = -1; kr <= 1; ++kr)
        for (int kc = -1; kc <= 1; ++kc) {
          const long rr = long(r) + kr, cc = long(c) + kc;
          if (rr < 0 || cc < 0 || rr >= long(hw_) || cc >= long(hw_)) continue;
          const size_t w = ((o * cin_ + i) * 3 + size_t(kr + 1)) * 3 + size_t(kc + 1);
          const size_t xi = (n * cin_ + i) * hw_ * hw_ + size_t(rr) * hw_ + size_t(cc);
          dw_.data()[w] += g * c_.x.data()[xi];
          if (needs_input_grad_) dx[xi] += g * w_.data()[w];
        }
  }

  size_t cin_, cout_, hw_;
  bool residual_;
  Tensor w_, dw_, b_, db_;
  Cache c_;
};

// Global average pooling over H x W, then a linear layer to the classes: (B, C, H, W) -> (B, K).
class PoolHead : public Block {
 public:
  PoolHead(size_t channels, size_t size, size_t classes) : c_(channels), hw_(size), k_(classes) {
    allocate(classes * channels + classes);
    Carver c{this};
    std::tie(w_, dw_) = c.take("weight", {classes, channels});
    std::tie(b_, db_) = c.take("bias", {classes});
  }
  std::string kind() const override { return "pool_head"; }
  double flops_per_sample() const override { return 3.0 * double(c_ * hw_ * hw_ + 2 * c_ * k_); }
  void init(uint64_t seed, size_t index) override {
    models::Rng rng(models::mix(seed, index, 0x4e));
    const double bound = 1.0 / std::sqrt(double(c_));
    models::fill_uniform(w_, rng, bound);
    models::fill_uniform(b_, rng, bound);
  }
  Tensor forward(const Tensor& x, size_t B) override {
    if (x.numel() != B * c_ * hw_ * hw_)
      throw std::invalid_argument("pool_head: the input is not (B, C, H, W)");
    pooled_ = Tensor({B, c_});
    for (size_t n = 0; n < B * c_; ++n) {
      double sum = 0;
      for (size_t p = 0; p < hw_ * hw_; ++p) sum += x.data()[n * hw_ * hw_ + p];
      pooled_.data()[n] = float(sum / double(hw_ * hw_));
    }
    Tensor logits({B, k_});
    models::kernels::linear_forward(logits.data(), pooled_.data(), w_.data(), b_.data(), B, c_, k_);
    B_ = B;
    return logits;
  }
  Tensor backward(const Tensor& dy) override {
    Tensor dpooled({B_, c_});
    models::kernels::linear_backward(dpooled.data(), dw_.data(), db_.data(), dy.data(),
                                     pooled_.data(), w_.data(), B_, c_, k_);
    Tensor dx({B_, c_, hw_, hw_});
    for (size_t n = 0; n < B_ * c_; ++n)
      for (size_t p = 0; p < hw_ * hw_; ++p)
        dx.data()[n * hw_ * hw_ + p] = dpooled.data()[n] / float(hw_ * hw_);
    return dx;
  }
  Saved save() override { return std::make_shared<std::pair<Tensor, size_t>>(pooled_, B_); }
  void restore(const Saved& saved) override {
    std::tie(pooled_, B_) = *std::static_pointer_cast<std::pair<Tensor, size_t>>(saved);
  }

 private:
  size_t c_, hw_, k_, B_ = 0;
  Tensor w_, dw_, b_, db_, pooled_;
};

// ---- The kinds, with their own config keys. ------------------------------------------------

models::DatasetKind stripes_kind() {
  return {"stripes",
          {{"samples", int64_t(4096), 1, 1e9, "images per epoch"},
           {"size", int64_t(12), 3, 256, "an image's height and width"},
           {"noise", 0.5, 0, 100, "the standard deviation of the noise added to every pixel"}},
          [](const models::Options& o, uint64_t seed) {
            return std::make_unique<Stripes>(seed, size_t(o.integer("samples")),
                                             size_t(o.integer("size")), o.number("noise"));
          },
          "noisy images of stripes in four directions"};
}

models::ModelKind convnet_kind() {
  return {
      "convnet",
      {{"channels", int64_t(8), 1, 1024, "channels of every convolution"},
       {"depth", int64_t(2), 0, 64, "residual 3x3 convolutions after the first one"}},
      [](const models::Options& o, const models::Dataset& data) {
        const size_t hw = size_t(std::lround(std::sqrt(double(data.input_width()))));
        if (hw * hw != data.input_width() || data.classes() == 0)
          throw std::invalid_argument("convnet needs square one-channel images with known classes");
        const size_t C = size_t(o.integer("channels"));
        std::vector<std::unique_ptr<Block>> blocks;
        blocks.push_back(std::make_unique<Conv3x3>(1, C, hw, false));
        for (int64_t d = 0; d < o.integer("depth"); ++d)
          blocks.push_back(std::make_unique<Conv3x3>(C, C, hw, true));
        blocks.push_back(std::make_unique<PoolHead>(C, hw, data.classes()));
        return blocks;
      },
      "3x3 convolutions with residual connections, average pooling, a linear head"};
}

}  // namespace

int main(int argc, char** argv) {
  models::Extensions extensions;
  extensions.add_dataset(stripes_kind()).add_model(convnet_kind());
  return troupe::main(argc, argv, extensions);
}
