// Data sets and the global sampler.
//
// A data set is a pure function from a sample index to (input, targets). The sampler maps a
// global position to a sample: the epoch's permutation is a pure function of (seed, epoch), and
// step s consumes global positions [s*B, (s+1)*B). So sample i of step s is the same whatever
// the world size, and a rank can fill exactly the positions it was assigned.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/model.h"

namespace troupe::models {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual size_t size() const = 0;                // samples per epoch
  virtual size_t input_width() const = 0;         // floats per sample's input
  virtual size_t targets_per_sample() const = 0;  // 1 (class) or T (next tokens)
  // Sample `index` (< size()): input_width() floats and targets_per_sample() targets. Called
  // from several threads at once (a worker's prefetch thread among them): it must not change
  // the data set.
  virtual void fill(size_t index, float* input, int32_t* targets) const = 0;
  // The targets lie in [0, classes()) (classes or vocabulary ids); 0: not known. A model may
  // size its output from it.
  virtual size_t classes() const { return 0; }
  // True for a data set that orders its samples itself (a token mixture, data/token_data.h):
  // fill() is then given the global position, not a sample the sampler chose.
  virtual bool orders_itself() const { return false; }
};

// Gaussian clusters around seeded class centroids: learnable, not noise.
class SyntheticClassification : public Dataset {
 public:
  SyntheticClassification(uint64_t seed, size_t samples, size_t dim, size_t classes,
                          double separation = 0.3, double noise = 1.0);
  size_t size() const override { return samples_; }
  size_t input_width() const override { return dim_; }
  size_t targets_per_sample() const override { return 1; }
  void fill(size_t index, float* input, int32_t* targets) const override;
  size_t classes() const override { return classes_; }

 private:
  uint64_t seed_;
  size_t samples_, dim_, classes_;
  double noise_;
  std::vector<float> centroids_;
};

// Characters of a text file; sample i is the window text[i, i+T) predicting text[i+1, i+T+1).
class CharText : public Dataset {
 public:
  // Throws std::invalid_argument naming the file if it is missing, unreadable or too short.
  CharText(const std::string& path, size_t context);
  size_t size() const override { return text_.size() - context_; }
  size_t input_width() const override { return context_; }
  size_t targets_per_sample() const override { return context_; }
  void fill(size_t index, float* input, int32_t* targets) const override;
  size_t classes() const override { return vocab_.size(); }
  size_t vocab() const { return vocab_.size(); }
  const std::string& vocabulary() const { return vocab_; }

 private:
  std::vector<int32_t> text_;
  std::string vocab_;
  size_t context_;
};

// The GPL-3 text every Debian system ships (base-files).
constexpr const char* kDefaultTextPath = "/usr/share/common-licenses/GPL-3";

class GlobalSampler {
 public:
  GlobalSampler(uint64_t seed, size_t dataset_size) : seed_(seed), n_(dataset_size) {}
  // The sample at a global position (step * global_batch + i).
  size_t sample_at(uint64_t position);

 private:
  void build(uint64_t epoch);
  uint64_t seed_;
  size_t n_;
  uint64_t epoch_ = UINT64_MAX;
  std::vector<uint32_t> perm_;
};

// Fills a batch with the samples at global positions [begin, end) (and Batch::samples). Throws
// SampleError naming the sample when the data set's fill throws.
Batch make_batch(const Dataset& data, GlobalSampler& sampler, uint64_t begin, uint64_t end);

}  // namespace troupe::models
