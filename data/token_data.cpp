#include "data/token_data.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace troupe::data {
namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

Permutation::Permutation(uint64_t n, uint64_t seed, uint64_t epoch) : n_(n) {
  uint64_t bits = 2;
  while (bits < 64 && (uint64_t(1) << bits) < n) ++bits;
  bits += bits & 1;
  half_bits_ = bits / 2;
  mask_ = (uint64_t(1) << half_bits_) - 1;
  for (uint64_t r = 0; r < 4; ++r)
    keys_[r] = splitmix(splitmix(seed ^ 0x7065726dull) ^ (epoch * 4 + r));
}

uint64_t Permutation::operator()(uint64_t i) const {
  uint64_t x = i;
  do {
    uint64_t left = x >> half_bits_, right = x & mask_;
    for (uint64_t k : keys_) {
      const uint64_t next = left ^ (splitmix(right ^ k) & mask_);
      left = right;
      right = next;
    }
    x = left << half_bits_ | right;
  } while (x >= n_);  // (cycle-walking: a permutation of [0, 2^bits) restricted to [0, n))
  return x;
}

TokenData::TokenData(const std::vector<Source>& sources, size_t context, uint64_t seed,
                     double eval_fraction)
    : context_(context), seed_(seed) {
  if (sources.empty()) throw std::invalid_argument("no token data set named");
  if (context == 0) throw std::invalid_argument("model.context is zero");
  if (!(eval_fraction >= 0 && eval_fraction <= 1))
    throw std::invalid_argument("the held-out fraction must be in [0, 1]");
  double total = 0;
  for (const Source& s : sources) {
    if (!(s.weight > 0) || !std::isfinite(s.weight))
      throw std::invalid_argument("data set '" + s.path + "': its weight must be positive");
    total += s.weight;
  }
  for (const Source& s : sources) {
    Set set{TokenShards::open(s.path), 0, 0, 0};
    if (vocab_ == 0) vocab_ = set.shards->vocab();
    if (sets_.empty()) fingerprint_ = set.shards->tokenizer_fingerprint();
    if (set.shards->tokenizer_fingerprint() != fingerprint_)
      throw std::invalid_argument("data set '" + s.path + "' was tokenized differently from '" +
                                  sources[0].path +
                                  "': sets trained on together need one tokenizer (" +
                                  same_tokenizer_advice(sources[0].path) + ")");
    set.windows = set.shards->tokens() > 0 ? (set.shards->tokens() - 1) / context : 0;
    if (set.windows == 0)
      throw std::invalid_argument(
          "data set '" + s.path + "' has " + std::to_string(set.shards->tokens()) +
          " tokens, fewer than model.context + 1 (" + std::to_string(context + 1) + ")");
    if (eval_fraction > 0) {
      set.eval = std::max<uint64_t>(1, uint64_t(eval_fraction * double(set.windows)));
      set.windows -= set.eval;
      if (set.windows == 0 && eval_fraction < 1)
        throw std::invalid_argument("data set '" + s.path + "' has " + std::to_string(set.eval) +
                                    " window(s): none is left for training once "
                                    "data.eval_fraction holds out its share");
    }
    sets_.push_back(std::move(set));
  }
  // Per block of kMixBlock positions: floor(share), then the largest remainders get one more.
  std::vector<double> rest(sets_.size());
  uint64_t given = 0;
  for (size_t d = 0; d < sets_.size(); ++d) {
    const double exact = sources[d].weight / total * double(kMixBlock);
    if (exact < 1)  // (it would be given 1 in kMixBlock all the same: more than asked)
      throw std::invalid_argument(
          "data set '" + sources[d].path + "': its weight " + fmt::format("{}", sources[d].weight) +
          " is " + fmt::format("{:.3g}", exact) + " in " + std::to_string(kMixBlock) +
          " of the mixture's total " + fmt::format("{}", total) + ", below the 1 in " +
          std::to_string(kMixBlock) + " a mixture can give a set");
    sets_[d].per_block = uint64_t(std::floor(exact));
    rest[d] = exact - std::floor(exact);
    given += sets_[d].per_block;
  }
  std::vector<size_t> order(sets_.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return rest[a] > rest[b]; });
  for (size_t i = 0; given < kMixBlock; ++i, ++given) ++sets_[order[i % order.size()]].per_block;
}

uint64_t TokenData::windows() const {
  uint64_t n = 0;
  for (const Set& s : sets_) n += s.windows;
  return n;
}

uint64_t TokenData::eval_windows() const {
  uint64_t n = 0;
  for (const Set& s : sets_) n += s.eval;
  return n;
}

TokenData::Place TokenData::locate(uint64_t position) const {
  size_t d = 0;
  uint64_t k = position;  // the set's own position
  if (sets_.size() > 1) {
    const uint64_t block = position / kMixBlock;
    uint64_t slot = Permutation(kMixBlock, seed_ ^ 0x6d6978ull, block)(position % kMixBlock);
    while (slot >= sets_[d].per_block) slot -= sets_[d++].per_block;
    k = block * sets_[d].per_block + slot;
  }
  const uint64_t w = sets_[d].windows;
  if (w == 0) throw std::logic_error("a held-out set has no training windows");
  return {d, Permutation(w, seed_ + d, k / w)(k % w)};
}

void TokenData::fill(uint64_t position, float* input, int32_t* targets) const {
  if (windows() == 0) throw std::logic_error("a held-out set has no training windows");
  const Place at = locate(position);
  read_window(at.set, at.window, input, targets);
}

void TokenData::fill_eval(uint64_t i, float* input, int32_t* targets) const {
  size_t d = 0;
  while (d < sets_.size() && i >= sets_[d].eval) i -= sets_[d++].eval;
  if (d == sets_.size()) throw std::out_of_range("evaluation window past the held-out set");
  read_window(d, sets_[d].windows + i, input, targets);
}

void TokenData::read_window(size_t set, uint64_t window, float* input, int32_t* targets) const {
  const size_t T = context_;
  int32_t ids[4096];
  std::vector<int32_t> big;
  int32_t* buf = ids;
  if (T + 1 > 4096) {
    big.resize(T + 1);
    buf = big.data();
  }
  sets_[set].shards->read(window * T, T + 1, buf);
  for (size_t t = 0; t < T; ++t) {
    input[t] = float(buf[t]);
    targets[t] = buf[t + 1];
  }
}

}  // namespace troupe::data
