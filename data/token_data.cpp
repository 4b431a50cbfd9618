#include "data/token_data.h"

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

TokenData::TokenData(const std::vector<Source>& sources, size_t context, uint64_t seed)
    : context_(context), seed_(seed) {
  if (sources.empty()) throw std::invalid_argument("no token data set named");
  if (context == 0) throw std::invalid_argument("model.context is zero");
  double total = 0;
  for (const Source& s : sources) {
    if (!(s.weight > 0) || !std::isfinite(s.weight))
      throw std::invalid_argument("data set '" + s.path + "': its weight must be positive");
    total += s.weight;
  }
  for (const Source& s : sources) {
    Set set{TokenShards::open(s.path), 0, 0};
    if (vocab_ == 0) vocab_ = set.shards->vocab();
    if (set.shards->vocab() != vocab_)
      throw std::invalid_argument("data set '" + s.path + "' has a vocabulary of " +
                                  std::to_string(set.shards->vocab()) + " ids; '" +
                                  sources[0].path + "' has " + std::to_string(vocab_) +
                                  ": a mixture needs one tokenizer");
    set.windows = set.shards->tokens() > 0 ? (set.shards->tokens() - 1) / context : 0;
    if (set.windows == 0)
      throw std::invalid_argument(
          "data set '" + s.path + "' has " + std::to_string(set.shards->tokens()) +
          " tokens, fewer than model.context + 1 (" + std::to_string(context + 1) + ")");
    sets_.push_back(std::move(set));
  }
  // Per block of kMixBlock positions: floor(share), then the largest remainders get one more.
  std::vector<double> rest(sets_.size());
  uint64_t given = 0;
  for (size_t d = 0; d < sets_.size(); ++d) {
    const double exact = sources[d].weight / total * double(kMixBlock);
    sets_[d].per_block = uint64_t(std::floor(exact));
    rest[d] = exact - std::floor(exact);
    given += sets_[d].per_block;
  }
  std::vector<size_t> order(sets_.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return rest[a] > rest[b]; });
  for (size_t i = 0; given < kMixBlock; ++i, ++given) ++sets_[order[i % order.size()]].per_block;
  for (size_t d = 0; d < sets_.size(); ++d)
    if (sets_[d].per_block == 0)
      throw std::invalid_argument("data set '" + sources[d].path + "': its weight is below 1 in " +
                                  std::to_string(kMixBlock) + " of the mixture's");
}

uint64_t TokenData::windows() const {
  uint64_t n = 0;
  for (const Set& s : sets_) n += s.windows;
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
  return {d, Permutation(w, seed_ + d, k / w)(k % w)};
}

void TokenData::fill(uint64_t position, float* input, int32_t* targets) const {
  const Place at = locate(position);
  const size_t T = context_;
  int32_t ids[4096];
  std::vector<int32_t> big;
  int32_t* buf = ids;
  if (T + 1 > 4096) {
    big.resize(T + 1);
    buf = big.data();
  }
  sets_[at.set].shards->read(at.window * T, T + 1, buf);
  for (size_t t = 0; t < T; ++t) {
    input[t] = float(buf[t]);
    targets[t] = buf[t + 1];
  }
}

}  // namespace troupe::data
