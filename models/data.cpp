#include "models/data.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <new>
#include <sstream>
#include <stdexcept>
#include <system_error>

#include "models/random.h"

namespace troupe::models {

SyntheticClassification::SyntheticClassification(uint64_t seed, size_t samples, size_t dim,
                                                 size_t classes, double separation, double noise)
    : seed_(seed), samples_(samples), dim_(dim), classes_(classes), noise_(noise) {
  if (samples == 0 || dim == 0 || classes < 2) {
    throw std::invalid_argument("synthetic data needs samples > 0, dim > 0 and at least 2 classes");
  }
  Rng rng(mix(seed, 0xc1a55));
  centroids_.resize(classes * dim);
  for (auto& c : centroids_) c = float(rng.normal() * separation);
}

void SyntheticClassification::fill(size_t index, float* input, int32_t* targets) const {
  Rng rng(mix(seed_, 0x5a3b1e, index));
  size_t cls = rng.below(classes_);
  const float* c = centroids_.data() + cls * dim_;
  // Noise: the sum of four 16-bit uniforms from one 64-bit draw (Irwin-Hall, close to a
  // Gaussian and several times cheaper than Box-Muller), scaled to standard deviation `noise`.
  const float scale = float(noise_ * std::sqrt(3.0) / 65536.0), shift = 2.0f * 65536.0f;
  for (size_t j = 0; j < dim_; ++j) {
    uint64_t r = rng.next();
    float sum =
        float(r & 0xffff) + float((r >> 16) & 0xffff) + float((r >> 32) & 0xffff) + float(r >> 48);
    input[j] = c[j] + (sum - shift) * scale;
  }
  targets[0] = int32_t(cls);
}

CharText::CharText(const std::string& path, size_t context) : context_(context) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument("text data file '" + path + "' cannot be opened");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string raw = ss.str();
  if (raw.empty()) throw std::invalid_argument("text data file '" + path + "' is empty");
  if (context == 0) throw std::invalid_argument("model.context is zero");
  if (raw.size() <= context + 1) {
    throw std::invalid_argument("text data file '" + path + "' has " + std::to_string(raw.size()) +
                                " characters, fewer than the context + 1 (" +
                                std::to_string(context + 1) + ")");
  }
  bool seen[256] = {};
  for (unsigned char ch : raw) seen[ch] = true;
  int index[256];
  for (int c = 0; c < 256; ++c) {
    if (seen[c]) {
      index[c] = int(vocab_.size());
      vocab_.push_back(char(c));
    }
  }
  text_.reserve(raw.size());
  for (unsigned char ch : raw) text_.push_back(index[ch]);
}

void CharText::fill(size_t index, float* input, int32_t* targets) const {
  for (size_t t = 0; t < context_; ++t) {
    input[t] = float(text_[index + t]);
    targets[t] = text_[index + t + 1];
  }
}

void GlobalSampler::build(uint64_t epoch) {
  perm_.resize(n_);
  for (size_t i = 0; i < n_; ++i) perm_[i] = uint32_t(i);
  Rng rng(mix(seed_, 0xe90c, epoch));
  for (size_t i = n_; i > 1; --i) std::swap(perm_[i - 1], perm_[rng.below(i)]);
  epoch_ = epoch;
}

size_t GlobalSampler::sample_at(uint64_t position) {
  uint64_t epoch = position / n_;
  if (epoch != epoch_) build(epoch);
  return perm_[position % n_];
}

// A sample's input with a NaN or an infinity would make the step's loss and every parameter NaN
// from there on, silently: refused, naming the sample.
static void check_finite(const float* input, size_t width, size_t sample) {
  for (size_t j = 0; j < width; ++j)
    if (!std::isfinite(input[j]))
      throw SampleError("sample " + std::to_string(sample) + "'s input has a non-finite value (" +
                        std::to_string(input[j]) + " at feature " + std::to_string(j) +
                        "): the data set gave it");
}

Batch make_batch(const Dataset& data, GlobalSampler& sampler, uint64_t begin, uint64_t end) {
  Batch b;
  b.size = size_t(end - begin);
  size_t w = data.input_width(), k = data.targets_per_sample();
  b.inputs = Tensor({b.size, w});
  b.targets.resize(b.size * k);
  b.samples.resize(b.size);
  for (size_t i = 0; i < b.size; ++i) {
    const uint64_t p = begin + i;
    const size_t sample = data.orders_itself() ? size_t(p) : sampler.sample_at(p);
    b.samples[i] = sample;
    try {
      data.fill(sample, b.inputs.data() + i * w, b.targets.data() + i * k);
    } catch (const SampleError&) {
      throw;
    } catch (const std::bad_alloc&) {  // (the machine's, not the sample's: a restart may pass)
      throw;
    } catch (const std::system_error&) {  // (an I/O error: EIO, a network file system's hiccup)
      throw;
    } catch (const std::exception& e) {
      throw SampleError("the data set failed on sample " + std::to_string(sample) + ": " +
                        e.what());
    }
    check_finite(b.inputs.data() + i * w, w, sample);
  }
  return b;
}

}  // namespace troupe::models
