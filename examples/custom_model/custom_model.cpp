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
// "troupe: job 'convnet' finished after 300 of 300 steps, loss 0.44 (RUN_DIR)"; exit 0. The
// loss starts at 1.81, above ln 4 = 1.386 (a guess of the four directions: the initial head does
// not give every class the same logit).
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
  size_t input_width() const override { return size_ * size_; }  // (size, size, 1 channel)
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

// ---- The blocks. Legend: B batch, H = W = size, C channels. Activations (B, H, W, C). ------

// y = relu(conv3x3(x) + bias), plus x when residual (cin == cout); padding 1: H x W stays. As a
// GEMM on Troupe's kernels (OpenBLAS): the 3x3 windows of every pixel as rows (im2col), times
// the weights.
class Conv3x3 : public Block {
 public:
  Conv3x3(size_t cin, size_t cout, size_t size, bool residual)
      : cin_(cin), cout_(cout), hw_(size), residual_(residual) {
    allocate(cout * 9 * cin + cout);
    Carver c{this};
    std::tie(w_, dw_) = c.take("weight", {cout, 3, 3, cin});
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
    if (x.numel() != B * hw_ * hw_ * cin_)
      throw std::invalid_argument("conv3x3: the input is not (B, " + std::to_string(hw_) + ", " +
                                  std::to_string(hw_) + ", " + std::to_string(cin_) + ")");
    const size_t rows = B * hw_ * hw_, k = 9 * cin_;
    c_ = Cache{im2col(x, B), Tensor({B, hw_, hw_, cout_}), B};
    Tensor pre({rows, cout_});
    models::kernels::linear_forward(pre.data(), c_.cols.data(), w_.data(), b_.data(), rows, k,
                                    cout_);
    models::kernels::relu_forward(c_.y.data(), pre.data(), pre.numel());
    if (!residual_) return c_.y;
    Tensor out({B, hw_, hw_, cout_});
    models::kernels::residual_forward(out.data(), c_.y.data(), x.data(), out.numel());
    return out;
  }
  Tensor backward(const Tensor& dy) override {
    const size_t rows = c_.B * hw_ * hw_, k = 9 * cin_;
    Tensor dpre({rows, cout_});  // (zeros: the kernels add into it)
    models::kernels::relu_backward(dpre.data(), dy.data(), c_.y.data(), dpre.numel());
    Tensor dcols = needs_input_grad_ ? Tensor({rows, k}) : Tensor();
    models::kernels::linear_backward(needs_input_grad_ ? dcols.data() : nullptr, dw_.data(),
                                     db_.data(), dpre.data(), c_.cols.data(), w_.data(), rows, k,
                                     cout_);
    Tensor dx({c_.B, hw_, hw_, cin_});
    if (needs_input_grad_) col2im(dcols, dx);
    if (residual_)
      for (size_t i = 0; i < dx.numel(); ++i) dx.data()[i] += dy.data()[i];
    return dx;
  }
  Saved save() override { return std::make_shared<Cache>(std::move(c_)); }
  void restore(const Saved& saved) override { c_ = *std::static_pointer_cast<Cache>(saved); }

 private:
  struct Cache {
    Tensor cols, y;  // the input's windows, and relu(conv + bias)
    size_t B = 0;
  };
  // The pixel at (r + dr, c + dc) of sample n, or null outside the image.
  long source(size_t n, size_t r, size_t c, int dr, int dc) const {
    const long rr = long(r) + dr, cc = long(c) + dc;
    if (rr < 0 || cc < 0 || rr >= long(hw_) || cc >= long(hw_)) return -1;
    return long((n * hw_ + size_t(rr)) * hw_ + size_t(cc));
  }
  // Row (n, r, c): the 3 x 3 x cin window around the pixel (zeros past the border).
  Tensor im2col(const Tensor& x, size_t B) const {
    Tensor cols({B * hw_ * hw_, 9 * cin_});
    for (size_t n = 0; n < B; ++n)
      for (size_t p = 0; p < hw_ * hw_; ++p)
        for (int k = 0; k < 9; ++k) {
          const long at = source(n, p / hw_, p % hw_, k / 3 - 1, k % 3 - 1);
          if (at < 0) continue;
          std::memcpy(cols.data() + ((n * hw_ * hw_ + p) * 9 + size_t(k)) * cin_,
                      x.data() + size_t(at) * cin_, cin_ * sizeof(float));
        }
    return cols;
  }
  // The windows' gradients added back onto the pixels they came from.
  void col2im(const Tensor& dcols, Tensor& dx) const {
    for (size_t n = 0; n < c_.B; ++n)
      for (size_t p = 0; p < hw_ * hw_; ++p)
        for (int k = 0; k < 9; ++k) {
          const long at = source(n, p / hw_, p % hw_, k / 3 - 1, k % 3 - 1);
          if (at < 0) continue;
          const float* from = dcols.data() + ((n * hw_ * hw_ + p) * 9 + size_t(k)) * cin_;
          float* to = dx.data() + size_t(at) * cin_;
          for (size_t i = 0; i < cin_; ++i) to[i] += from[i];
        }
  }

  size_t cin_, cout_, hw_;
  bool residual_;
  Tensor w_, dw_, b_, db_;
  Cache c_;
};

// Global average pooling over H x W, then a linear layer to the classes: (B, H, W, C) -> (B, K).
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
      throw std::invalid_argument("pool_head: the input is not (B, H, W, C)");
    pooled_ = Tensor({B, c_});  // (zeros)
    const float scale = 1.0f / float(hw_ * hw_);
    for (size_t n = 0; n < B; ++n)
      for (size_t p = 0; p < hw_ * hw_; ++p)
        for (size_t c = 0; c < c_; ++c)
          pooled_.data()[n * c_ + c] += x.data()[(n * hw_ * hw_ + p) * c_ + c] * scale;
    Tensor logits({B, k_});
    models::kernels::linear_forward(logits.data(), pooled_.data(), w_.data(), b_.data(), B, c_, k_);
    B_ = B;
    return logits;
  }
  Tensor backward(const Tensor& dy) override {
    Tensor dpooled({B_, c_});
    models::kernels::linear_backward(dpooled.data(), dw_.data(), db_.data(), dy.data(),
                                     pooled_.data(), w_.data(), B_, c_, k_);
    Tensor dx({B_, hw_, hw_, c_});
    for (size_t n = 0; n < B_; ++n)
      for (size_t p = 0; p < hw_ * hw_; ++p)
        for (size_t c = 0; c < c_; ++c)
          dx.data()[(n * hw_ * hw_ + p) * c_ + c] = dpooled.data()[n * c_ + c] / float(hw_ * hw_);
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
