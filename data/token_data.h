// Training samples from prepared token data sets, in a global order.
//
// A window is model.context + 1 consecutive tokens of a data set's stream: sample i of a set is
// tokens [i*T, i*T + T + 1) (input the first T, targets the last T), so a set of N tokens has
// (N - 1) / T windows and none overlaps another's inputs.
//
// The global order: position p (step * batch.global + i) names one sample. With one set, p's
// epoch is p / W and its window permutation(seed, epoch)[p % W]. With a mixture (data.mix), each
// block of kMixBlock positions holds every set in proportion to its weight (largest remainders,
// so the counts are exact per block), in an order shuffled by (seed, block); the k-th position
// of set d anywhere is that set's k-th sample in its own order above. Both depend only on the
// seed and the position: not on the world size, the membership or where a run resumed.
//
// Held out: with eval_fraction f > 0, the last max(1, floor(f * W)) windows of each set are
// its evaluation windows (a contiguous tail: no training window shares their text) and the
// rest its training windows; f = 1 makes a set all evaluation (data.eval_path). The evaluation
// windows are numbered set by set, in stream order.
//
// Thread-safety: fill(), fill_eval() and locate() are const and safe from any number of threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/shards.h"

namespace troupe::data {

constexpr uint64_t kMixBlock = 1000;

// A bijection of [0, n) chosen by (seed, epoch): a 4-round Feistel network on the next even
// power of two, cycle-walked into range. O(1) memory and time per lookup, at any n.
class Permutation {
 public:
  Permutation(uint64_t n, uint64_t seed, uint64_t epoch);
  uint64_t operator()(uint64_t i) const;

 private:
  uint64_t n_, half_bits_, mask_;
  uint64_t keys_[4];
};

struct Source {
  std::string path;
  double weight = 1;
};

// How to give a set the tokenizer of `set` (its ids): text prepared with it, or ids of the same
// tokenizer imported (for messages).
inline std::string same_tokenizer_advice(const std::string& set) {
  return "troupe data prepare --tokenizer-from " + set +
         " for text; troupe data import with the tokenizer file of its ids for ids";
}

class TokenData {
 public:
  // Opens every set (throws std::invalid_argument naming the one that is wrong): they must share
  // one tokenizer and each hold at least one window.
  TokenData(const std::vector<Source>& sources, size_t context, uint64_t seed,
            double eval_fraction = 0);

  size_t vocab() const { return vocab_; }
  size_t context() const { return context_; }
  size_t sets() const { return sets_.size(); }
  uint64_t windows(size_t set) const { return sets_[set].windows; }  // training windows
  uint64_t windows() const;       // over all sets: the training samples of one pass
  uint64_t eval_windows() const;  // over all sets
  uint64_t tokenizer_fingerprint() const { return fingerprint_; }

  // The set and window at a global position.
  struct Place {
    size_t set;
    uint64_t window;
  };
  Place locate(uint64_t position) const;
  // input: T ids (as floats, the model's input); targets: the next T ids.
  void fill(uint64_t position, float* input, int32_t* targets) const;
  // Evaluation window i (< eval_windows()).
  void fill_eval(uint64_t i, float* input, int32_t* targets) const;

 private:
  struct Set {
    std::shared_ptr<const TokenShards> shards;
    uint64_t windows;    // for training: [0, windows)
    uint64_t eval;       // held out: [windows, windows + eval)
    uint64_t per_block;  // its positions in each block of kMixBlock (a mixture)
  };
  void read_window(size_t set, uint64_t window, float* input, int32_t* targets) const;
  std::vector<Set> sets_;
  size_t context_, vocab_ = 0;
  uint64_t seed_, fingerprint_ = 0;
};

}  // namespace troupe::data
