#include "models/model.h"

#include <cblas.h>
#include <malloc.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

extern "C" void openblas_set_num_threads(int);

namespace troupe::models {

Model::Model(const ModelSpec& spec) : spec_(spec) {
  if (spec.kind == "mlp") {
    if (spec.mlp_sizes.size() < 2)
      throw std::invalid_argument("model.mlp sizes need an input and an output size");
    for (size_t i = 0; i < spec.mlp_sizes.size(); ++i) {
      if (spec.mlp_sizes[i] == 0)
        throw std::invalid_argument("model size " + std::to_string(i) + " is zero");
    }
    for (size_t i = 0; i + 1 < spec.mlp_sizes.size(); ++i) {
      bool last = i + 2 == spec.mlp_sizes.size();
      blocks_.push_back(make_linear_block(spec.mlp_sizes[i], spec.mlp_sizes[i + 1], !last));
    }
  } else if (spec.kind == "gpt") {
    if (spec.vocab == 0) throw std::invalid_argument("model.vocab is zero (no data?)");
    if (spec.context == 0) throw std::invalid_argument("model.context is zero");
    if (spec.d_model == 0) throw std::invalid_argument("model.d_model is zero");
    if (spec.heads == 0) throw std::invalid_argument("model.heads is zero");
    if (spec.layers == 0) throw std::invalid_argument("model.layers is zero");
    if (spec.d_model % spec.heads != 0)
      throw std::invalid_argument("model.d_model must be divisible by model.heads");
    blocks_.push_back(make_embedding_block(spec.vocab, spec.context, spec.d_model));
    for (size_t l = 0; l < spec.layers; ++l)
      blocks_.push_back(
          make_transformer_block(spec.context, spec.d_model, spec.heads, spec.layers));
    blocks_.push_back(make_head_block(spec.vocab, spec.context, spec.d_model,
                                      spec.tied_head ? blocks_.front().get() : nullptr));
  } else {
    throw std::invalid_argument("model.kind '" + spec.kind + "' is not mlp or gpt");
  }
  blocks_.front()->set_needs_input_grad(false);
}

Model::Model(const ModelSpec& spec, std::vector<std::unique_ptr<Block>> blocks)
    : spec_(spec), blocks_(std::move(blocks)), check_init_(true) {
  if (blocks_.empty()) throw std::invalid_argument("model '" + spec.kind + "' has no blocks");
  for (size_t i = 0; i < blocks_.size(); ++i)
    if (!blocks_[i])
      throw std::invalid_argument("model '" + spec.kind + "': block " + std::to_string(i) +
                                  " is null");
  blocks_.front()->set_needs_input_grad(false);
}

std::vector<size_t> Model::planned_block_param_counts(const ModelSpec& s) {
  std::vector<size_t> counts;
  if (s.kind == "mlp") {
    for (size_t i = 0; i + 1 < s.mlp_sizes.size(); ++i)
      counts.push_back(s.mlp_sizes[i] * s.mlp_sizes[i + 1] + s.mlp_sizes[i + 1]);
    return counts;
  }
  const size_t C = s.d_model;
  counts.push_back(s.vocab * C + s.context * C);               // embedding
  counts.insert(counts.end(), s.layers, 12 * C * C + 13 * C);  // transformer blocks
  counts.push_back(2 * C + (s.tied_head ? 0 : s.vocab * C));   // final norm, head
  return counts;
}

size_t Model::planned_param_count(const ModelSpec& s) {
  size_t n = 0;
  for (size_t c : planned_block_param_counts(s)) n += c;
  return n;
}

std::vector<size_t> Model::block_param_counts() const {
  std::vector<size_t> counts;
  for (auto& b : blocks_) counts.push_back(b->param_count());
  return counts;
}

size_t Model::param_count() const {
  size_t n = 0;
  for (auto& b : blocks_) n += b->param_count();
  return n;
}

std::vector<Model::Parameter> Model::parameters() const {
  std::vector<Parameter> out;
  for (size_t b = 0; b < blocks_.size(); ++b) {
    const std::string kind = blocks_[b]->kind();
    std::string prefix;
    if (kind == "transformer") prefix = "blocks." + std::to_string(b - 1) + ".";
    if (kind == "linear" || kind == "linear_relu") prefix = "layers." + std::to_string(b) + ".";
    if (spec_.kind != "mlp" && spec_.kind != "gpt") prefix = "blocks." + std::to_string(b) + ".";
    for (const auto& v : blocks_[b]->param_views())
      out.push_back({prefix + v.name, v.shape, b, v.offset});
  }
  return out;
}

double Model::flops_per_sample() const {
  double f = 0;
  for (auto& b : blocks_) f += b->flops_per_sample();
  return f;
}

void Model::init(uint64_t seed) {
  for (size_t i = 0; i < blocks_.size(); ++i) init_block(i, seed);
}

void Model::init_block(size_t i, uint64_t seed) {
  // (Initialised on the host, from models/random.h's numbers: the same on every device.)
  Block& b = *blocks_.at(i);
  Compute& device = b.compute();
  if (device.device() != Device::cpu) b.to(cpu_compute());
  // (Zeros first: a block's init sets what it draws, and leaves its biases to the zeros of a
  // fresh buffer; a block initialised again, as in a rollback to the seed, is trained.)
  cpu_compute().zero(b.params().data(), b.params().bytes());
  b.init(seed, i);
  if (check_init_) check_init_repeats(i, seed);
  if (device.device() != Device::cpu) b.to(device);
}

// (A program's own block: once more, and the same bits. Workers initialise apart, and a restart
// or a resumed pipeline stage initialises again: an init that reads the clock or an unseeded
// generator gives members different models, found otherwise only by the job's last checksum.)
void Model::check_init_repeats(size_t i, uint64_t seed) {
  Block& b = *blocks_[i];
  const float* p = b.params().data();
  const std::vector<float> first(p, p + b.param_count());
  b.init(seed, i);
  p = b.params().data();
  for (size_t k = 0; k < first.size(); ++k) {
    if (std::memcmp(&first[k], &p[k], sizeof(float)) == 0) continue;
    std::string name = "element " + std::to_string(k);
    for (const auto& v : b.param_views())
      if (k >= v.offset) name = "'" + v.name + "' element " + std::to_string(k - v.offset);
    throw ModelDefect("model '" + spec_.kind + "': block " + std::to_string(i) + " ('" + b.kind() +
                      "') initialised twice from the same seed gave different "
                      "parameters (" +
                      name + ": " + std::to_string(first[k]) + ", then " + std::to_string(p[k]) +
                      "): a block's init(seed, index) must depend on "
                      "them alone, or its workers start from different models");
  }
}

Tensor Model::forward_block(size_t i, const Tensor& x, size_t batch_size) {
  return in_block(i, "forward", [&] { return blocks_[i]->forward(x, batch_size); });
}

Tensor Model::backward_block(size_t i, const Tensor& dy, size_t input_numel) {
  Tensor d = in_block(i, "backward", [&] { return blocks_[i]->backward(dy); });
  if (input_numel != 0 && d.numel() != input_numel)  // (the block before reads it as its own)
    throw ModelDefect(block_name(i) + " returned a gradient of " + std::to_string(d.numel()) +
                      " values from backward for an input of " + std::to_string(input_numel) +
                      ": backward must return the gradient of its input, shaped as it");
  return d;
}

std::string Model::block_name(size_t i) const {
  return "model '" + spec_.kind + "': block " + std::to_string(i) + " ('" + blocks_[i]->kind() +
         "')";
}

void Model::to(Compute& compute) {
  for (auto& b : blocks_)
    if (!b->runs_on(compute.device()))
      throw std::invalid_argument("model '" + spec_.kind + "': its '" + b->kind() +
                                  "' block runs on the CPU only, not on " + compute.describe());
  for (auto& b : blocks_) b->to(compute);
  compute_ = &compute;
}

void Model::zero_grads() {
  for (auto& b : blocks_) compute_->zero(b->grads().data(), b->grads().bytes());
}

ForwardResult Model::forward_backward(const Batch& batch, double loss_scale,
                                      const std::function<void(size_t)>& block_done) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  Tensor x = batch.inputs;
  in_numel_.resize(blocks_.size());
  for (size_t i = 0; i < blocks_.size(); ++i) {
    in_numel_[i] = x.numel();
    x = forward_block(i, x, batch.size);
  }
  const size_t rows = batch.targets.size(),
               classes = scored_classes(x, batch.targets, batch.samples);
  x = compute_->on_device(x);
  if (!dlogits_.defined() || dlogits_.numel() != x.numel() ||
      &dlogits_.storage()->compute() != compute_)
    dlogits_ = compute_->tensor({rows, classes});
  ForwardResult r;
  r.rows = rows;
  r.loss = compute_->cross_entropy(dlogits_.data(), x.data(), batch.targets.data(), rows, classes,
                                   loss_scale, &r.correct);
  const auto t1 = Clock::now();
  Tensor d = dlogits_;
  for (size_t i = blocks_.size(); i-- > 0;) {
    d = backward_block(i, d, i > 0 ? in_numel_[i] : 0);  // (block 0's input: the data)
    if (block_done) block_done(i);
  }
  r.forward_seconds = std::chrono::duration<double>(t1 - t0).count();
  r.backward_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  return r;
}

ForwardResult Model::evaluate(const Batch& batch) {
  Tensor x = batch.inputs;
  for (size_t i = 0; i < blocks_.size(); ++i) x = forward_block(i, x, batch.size);
  const size_t rows = batch.targets.size(),
               classes = scored_classes(x, batch.targets, batch.samples);
  x = compute_->on_device(x);
  Tensor scratch = compute_->tensor({rows, classes});
  ForwardResult r;
  r.rows = rows;
  r.loss = compute_->cross_entropy(scratch.data(), x.data(), batch.targets.data(), rows, classes,
                                   1.0 / double(rows), &r.correct);
  return r;
}

size_t scored_classes(const Tensor& logits, const std::vector<int32_t>& targets,
                      const std::vector<size_t>& samples) {
  const size_t rows = targets.size();
  if (rows == 0 || logits.numel() % rows != 0)
    throw ModelDefect("the model's output (" + std::to_string(logits.numel()) +
                      " values) does not divide into the batch's " + std::to_string(rows) +
                      " target rows: its last block must give (rows, classes) logits, rows = "
                      "samples x the data set's targets per sample");
  const size_t classes = logits.numel() / rows;
  for (size_t i = 0; i < rows; ++i) {
    if (targets[i] >= 0 && size_t(targets[i]) < classes) continue;
    const size_t per = samples.empty() || rows % samples.size() != 0
                           ? 0
                           : rows / samples.size();  // (targets per sample; 0: rows unnamed)
    const std::string where =
        per == 0 ? "row " + std::to_string(i)
                 : "sample " + std::to_string(samples[i / per]) +
                       (per > 1 ? ", position " + std::to_string(i % per) : std::string());
    throw SampleError("target " + std::to_string(targets[i]) + " (" + where +
                      " of the data set) is outside the model's " + std::to_string(classes) +
                      " outputs: the data set's classes do not fit the model");
  }
  return classes;
}

void set_compute_threads(int threads) { openblas_set_num_threads(threads < 1 ? 1 : threads); }

void keep_freed_memory() {
  if (!std::getenv("MALLOC_MMAP_THRESHOLD_")) mallopt(M_MMAP_THRESHOLD, 32 << 20);
  if (!std::getenv("MALLOC_TRIM_THRESHOLD_")) mallopt(M_TRIM_THRESHOLD, 256 << 20);
}

}  // namespace troupe::models
