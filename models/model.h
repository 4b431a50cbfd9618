// Models as a sequence of blocks, and the training step that reads top to bottom:
// forward, loss, backward (over micro-batches), [reduce — the distributed layer's job], update.
//
// models/ knows nothing of distribution: a worker runs forward_backward on its share of the
// global batch with loss_scale = 1 / global_batch, so its loss and gradients are its share of
// the global mean, and shares of different ranks simply add up.
#pragma once

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/blocks.h"

namespace troupe::models {

struct ModelSpec {
  std::string kind = "mlp";                            // mlp | gpt | a program's own (extension.h)
  std::vector<size_t> mlp_sizes{784, 1024, 1024, 10};  // input, hidden..., classes
  size_t vocab = 0;                                    // gpt: from the data set
  size_t context = 64;
  size_t d_model = 128;
  size_t heads = 4;
  size_t layers = 4;
  bool tied_head = false;
};

// A micro-batch: inputs (B, D) features or (B, T) token ids; targets (B) classes or (B*T) tokens.
struct Batch {
  Tensor inputs;
  std::vector<int32_t> targets;
  size_t size = 0;              // B
  std::vector<size_t> samples;  // the data set's index of each row's sample (empty: not known)
};

// A sample the job cannot train on: the data set threw filling it, or a target lies outside the
// model's outputs. The message names the sample. Reading it again gives the same: a worker is
// not restarted for it (workers/device_supervisor.cpp).
class SampleError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The training diverged: a step's loss or gradient norm is not finite. Its update is not applied
// (the parameters, and every checkpoint, stay those of the step before); computing the step
// again gives the same, so the job fails naming the step.
class Diverged : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A model no worker can train whatever it retries: a block whose init is not a function of its
// seed and index. Not restarted either.
class ModelDefect : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Any other exception a block's forward or backward threw (a std::runtime_error, a CUDA error),
// its message prefixed with the block and the pass. The worker is restarted for it, as for the
// exception itself: it may be the machine's (a transient device error), not the model's.
class BlockFailed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ForwardResult {
  double loss = 0;     // sum over rows of loss * loss_scale
  size_t rows = 0;     // rows scored (B for classification, B*T for tokens)
  size_t correct = 0;  // rows whose argmax is the target
  double forward_seconds = 0, backward_seconds = 0;  // (the loss is in forward)
};

class Model {
 public:
  // A built-in model (mlp, gpt). Validates the spec; throws std::invalid_argument with a message
  // naming the bad field.
  explicit Model(const ModelSpec& spec);
  // A model of the given blocks, in order (a program's own kind: models/extension.h). spec.kind
  // names it; its other fields are not read. Throws std::invalid_argument when there is none.
  Model(const ModelSpec& spec, std::vector<std::unique_ptr<Block>> blocks);

  const ModelSpec& spec() const { return spec_; }
  size_t num_blocks() const { return blocks_.size(); }
  Block& block(size_t i) { return *blocks_.at(i); }
  size_t param_count() const;
  // Each block's parameter count, in block order (what an Optimizer is built for).
  std::vector<size_t> block_param_counts() const;
  // The parameters a model of this spec has, without building it (for a gpt, spec.vocab is the
  // data's; 256 bounds it for byte-level text).
  static size_t planned_param_count(const ModelSpec& spec);
  // ... and block by block (what block_param_counts says once built).
  static std::vector<size_t> planned_block_param_counts(const ModelSpec& spec);
  double flops_per_sample() const;
  // Every named parameter tensor, in block order: the names of the PyTorch twin's state_dict
  // (bench/peers/torch_models.py): gpt "tok.weight", "blocks.{l}.qkv.weight", ..., "head.weight";
  // mlp "layers.{i}.weight" and ".bias"; another kind's "blocks.{b}.NAME". A tied head lists no
  // weight of its own.
  struct Parameter {
    std::string name;
    std::vector<size_t> shape;
    size_t block = 0;
    size_t offset = 0;  // in elements, into block(block).params()
  };
  std::vector<Parameter> parameters() const;

  // Block i from (seed, i): the same whatever the layout (and device). A program's own block is
  // initialised twice and compared: ModelDefect (naming the block and parameter) when the two
  // differ.
  void init(uint64_t seed);
  void init_block(size_t i, uint64_t seed);  // block i alone, as init does it
  // Moves every block's parameters and gradients to `compute`'s device, where the model's
  // kernels run from now on (the CPU until then). Throws std::invalid_argument, before moving
  // anything, when a block runs on the CPU only.
  void to(Compute& compute);
  Compute& compute() const { return *compute_; }
  void zero_grads();
  // Forward and backward of one micro-batch through all blocks; gradients accumulate.
  // block_done(i), if given, runs right after block i's backward (in reverse order): its gradient
  // is final for this micro-batch, and the caller may start reducing it while the rest goes on.
  ForwardResult forward_backward(const Batch& batch, double loss_scale,
                                 const std::function<void(size_t)>& block_done = nullptr);
  ForwardResult evaluate(const Batch& batch);
  // Block i's forward and backward as forward_backward runs them (a pipeline stage's too): a
  // std::invalid_argument the block throws becomes a ModelDefect naming it, and a backward whose
  // gradient is not of its input's size (`input_numel`; 0: unchecked) is one.
  Tensor forward_block(size_t i, const Tensor& x, size_t batch_size);
  Tensor backward_block(size_t i, const Tensor& dy, size_t input_numel);

 private:
  void check_init_repeats(size_t i, uint64_t seed);  // throws ModelDefect
  // Block i's pass: a std::invalid_argument it throws (an input it cannot take: the same at
  // every retry) becomes a ModelDefect naming the block, any other exception a BlockFailed naming
  // it; a sample's error and std::bad_alloc pass as they are.
  template <class Pass>
  Tensor in_block(size_t i, const char* pass, Pass&& run) {
    try {
      return run();
    } catch (const SampleError&) {
      throw;
    } catch (const ModelDefect&) {
      throw;
    } catch (const std::invalid_argument& e) {
      throw ModelDefect(block_name(i) + " " + pass + ": " + e.what());
    } catch (const std::bad_alloc&) {
      throw;  // (the machine's: "out of memory" says it)
    } catch (const BlockFailed&) {
      throw;
    } catch (const std::exception& e) {
      throw BlockFailed(block_name(i) + " " + pass + ": " + e.what());
    }
  }
  std::string block_name(size_t i) const;  // "model 'gpt': block 2 ('attention')"

  ModelSpec spec_;
  std::vector<std::unique_ptr<Block>> blocks_;
  bool check_init_ = false;  // a program's own blocks: init_block checks init is repeatable
  Tensor dlogits_;
  std::vector<size_t> in_numel_;  // each block's input size in the last forward
  Compute* compute_ = &cpu_compute();
};

// The classes the logits score per target row: logits.numel() / targets.size(). Throws
// ModelDefect when they do not divide, SampleError when a target lies outside
// [0, classes): a data set and a model that do not fit (the message says which target of which
// sample, when `samples` knows the rows' samples: Batch::samples).
size_t scored_classes(const Tensor& logits, const std::vector<int32_t>& targets,
                      const std::vector<size_t>& samples = {});

// Intra-op threads for the BLAS (process-wide; default 1 per worker: several share a machine).
void set_compute_threads(int threads);

// Tells the C library to keep the memory a training step frees for the next step (process-wide;
// `troupe` calls it first thing; a program embedding the models may too). A step allocates and
// frees the same buffers every time (batches, activations, temporaries); glibc's defaults give
// freed blocks above 128 KiB back to the kernel (munmap, or trimming the heap's top) and the next
// step faults every page in again: ~120 page faults a step for the MLP of `troupe bench model`,
// several percent of its time. Now: mmap only from 32 MiB (the long-lived parameters, moments
// and gradients), trim the heap only past 256 MiB free. A variable the user set
// (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_) wins.
void keep_freed_memory();

}  // namespace troupe::models
