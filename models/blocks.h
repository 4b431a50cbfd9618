// Blocks: the unit a model is made of, a pipeline stage is a range of, and a worker moves whole.
// Each block owns its parameters and gradients as one flat buffer (a stage reduces its gradients
// in few large calls), reports its parameter count and its forward+backward FLOPs per sample,
// and initialises as a pure function of (seed, block index).
//
// forward() caches what backward() needs, for one micro-batch at a time. backward() ADDS into
// the gradient buffer (gradient accumulation over micro-batches is free) and returns the
// gradient of the block's input (undefined for the first block).
//
// Activations between blocks are float tensors: (B, D) features for the MLP; (B, T) token ids
// (exact in float) into the GPT's embedding, then (B, T, C).
//
// A block is built and initialised in host memory and runs its kernels through a Compute
// (models/compute.h): to() moves its parameters and gradients to another device, and its
// forward() and backward() take their inputs from any device (copied to the block's first).
//
// Thread-safety: none; one block belongs to one worker thread.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include "models/compute.h"
#include "models/tensor.h"

namespace troupe::models {

class Block {
 public:
  virtual ~Block() = default;
  virtual std::string kind() const = 0;
  virtual double flops_per_sample() const = 0;  // forward + backward
  virtual void init(uint64_t seed, size_t index) = 0;
  virtual Tensor forward(const Tensor& x, size_t B) = 0;
  virtual Tensor backward(const Tensor& dy) = 0;
  // What forward() cached for backward(), taken out of the block (the next forward allocates
  // anew instead of overwriting it), and put back: a pipeline stage keeps several micro-batches
  // in flight this way instead of recomputing their forward.
  using Saved = std::shared_ptr<void>;
  virtual Saved save() = 0;
  virtual void restore(const Saved& saved) = 0;

  size_t param_count() const { return params_.numel(); }
  // The named tensors inside the flat parameter buffer, in buffer order ("weight", "bias", ...;
  // the model prefixes them: see Model::parameters). A tied weight another block owns is not
  // listed here.
  struct ParamView {
    std::string name;
    std::vector<size_t> shape;
    size_t offset = 0;  // in elements, into params()
  };
  const std::vector<ParamView>& param_views() const { return views_; }
  // The device this block's parameters live and its kernels run on (the CPU until to()).
  Compute& compute() const { return *compute_; }
  // Moves the parameters and gradients (and every view of them: a tied head's weight) to
  // `compute`'s device; what forward cached moves on its next call. Throws std::invalid_argument
  // for a block that runs on the CPU only (a program's own block: runs_on).
  void to(Compute& compute);
  // Whether the block's code runs on `device`: the built-in blocks call only their Compute; a
  // program's own block reads its tensors on the host unless it says otherwise.
  virtual bool runs_on(Device device) const { return device == Device::cpu; }
  // The first block of a model has no one to pass its input's gradient to: skip computing it.
  void set_needs_input_grad(bool needed) { needs_input_grad_ = needed; }
  Tensor& params() { return params_; }
  Tensor& grads() { return grads_; }
  const Tensor& params() const { return params_; }
  // Gives the memory of the parameters and gradients back (lazy buffers; both read zeros after).
  void discard() {
    params_.discard_storage();
    grads_.discard_storage();
  }

 protected:
  void allocate(size_t n) {
    const bool lazy = LazyParameters::active();
    params_ = lazy ? Tensor::lazy({n}) : Tensor({n});
    grads_ = lazy ? Tensor::lazy({n}) : Tensor({n});
  }
  // Carves consecutive views out of the flat parameter and gradient buffers (allocate()d first,
  // with their total).
  struct Carver {
    Block* b;
    size_t at = 0;
    std::pair<Tensor, Tensor> take(std::string name, std::vector<size_t> shape) {
      size_t n = 1;
      for (size_t d : shape) n *= d;
      if (at + n > b->params_.numel())
        throw std::logic_error(
            "a block carves '" + name + "' (" + std::to_string(n) + " values) past the " +
            std::to_string(b->params_.numel()) + " parameters it allocate()d" +
            (at == 0 ? ": allocate(n), with the total, before Carver::take" : ""));
      auto out = std::make_pair(b->params_.view(at, shape), b->grads_.view(at, shape));
      b->views_.push_back({std::move(name), std::move(shape), at});
      at += n;
      return out;
    }
  };

  // A cached activation of `shape` on this block's device, reallocated only when its shape or
  // device changes; zeroed() also zeroes it (for the kernels that accumulate).
  Tensor& ensure(Tensor& t, std::vector<size_t> shape);
  Tensor& zeroed(Tensor& t, std::vector<size_t> shape);

  // (A block with no parameters, an activation, need not allocate(): it has none.)
  Tensor params_{std::vector<size_t>{0}}, grads_{std::vector<size_t>{0}};
  std::vector<ParamView> views_;
  bool needs_input_grad_ = true;
  Compute* compute_ = &cpu_compute();
};

// For blocks' init(): t's values drawn in order from rng, uniform in [-bound, bound] or normal
// with the given standard deviation (models/random.h's Rng: the same numbers on every machine).
class Rng;
void fill_uniform(Tensor& t, Rng& rng, double bound);
void fill_normal(Tensor& t, Rng& rng, double stddev);

// Fully connected layer with optional ReLU: (B, in) -> (B, out).
std::unique_ptr<Block> make_linear_block(size_t in, size_t out, bool relu);

// GPT pieces. The head's lm_head weight is its own unless tie_to (the embedding block) is given,
// in which case it reads the embedding's token table and adds into its gradient.
std::unique_ptr<Block> make_embedding_block(size_t vocab, size_t context, size_t d_model);
std::unique_ptr<Block> make_transformer_block(size_t context, size_t d_model, size_t heads,
                                              size_t layers);
std::unique_ptr<Block> make_head_block(size_t vocab, size_t context, size_t d_model, Block* tie_to);

}  // namespace troupe::models
