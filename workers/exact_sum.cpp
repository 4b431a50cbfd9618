#include "workers/exact_sum.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "workers/host_staging.h"
#include "workers/registered_gradients.h"

namespace troupe::workers {

namespace {

// Doubles below 2^51 in magnitude turn into integers and back by adding 1.5 * 2^52 and reading
// the low bits (round to nearest even): what compilers vectorise, where llrint is one element at
// a time (AVX2 has no packed double <-> int64 conversion).
constexpr double kMagic = 0x1.8p52;
int64_t bits_of(double d) {
  int64_t b;
  std::memcpy(&b, &d, sizeof b);
  return b;
}
double double_of(int64_t b) {
  double d;
  std::memcpy(&d, &b, sizeof d);
  return d;
}

}  // namespace

int fixed_point_exponent(double max_abs, uint64_t terms) {
  if (!(max_abs > 0) || !std::isfinite(max_abs)) return 0;
  int E = 0;
  std::frexp(max_abs, &E);  // max_abs < 2^E
  int log_terms = 0;
  while ((uint64_t(1) << log_terms) < terms && log_terms < 50) ++log_terms;
  return kFixedPointBits - E - log_terms;
}

void add_fixed_point(int64_t* acc, const float* g, size_t n, int e) {
  const double scale = std::ldexp(1.0, e);  // g * scale is exact in double: no rounding but one
  const int64_t magic = bits_of(kMagic);
  for (size_t i = 0; i < n; ++i) acc[i] += bits_of(double(g[i]) * scale + kMagic) - magic;
}

void from_fixed_point(float* g, const int64_t* acc, size_t n, int e) {
  const double scale = std::ldexp(1.0, -e);
  const int64_t magic = bits_of(kMagic);
  for (size_t i = 0; i < n; ++i) g[i] = float((double_of(acc[i] + magic) - kMagic) * scale);
}

// (A loss that is not finite, or past what 64-bit fixed point holds, stays NaN through the sum:
// the step's divergence check sees it on every rank; llrint made it a finite INT64_MIN.)
double fixed_point_loss(double loss) {
  if (!(std::fabs(loss) < 0x1p30)) return std::numeric_limits<double>::quiet_NaN();
  return double(std::llrint(std::ldexp(loss, 32)));
}
double loss_from_fixed_point(double sum) { return std::ldexp(sum, -32); }

ExactSum::ExactSum(models::Model& model, uint32_t first, uint32_t last, uint64_t terms,
                   InPlaceBuffers* in_place)
    : model_(model), first_(first), last_(last), terms_(terms), in_place_(in_place) {
  for (uint32_t b = first_; b < last_; ++b)
    most_ = std::max(most_, model_.block(b).grads().numel());
}

int64_t* ExactSum::zeroed_sums(size_t count) {
  if (!shared_.defined() && own_.empty()) {  // (taken once, for the largest block's)
    if (in_place_)
      shared_ = in_place_->take(InPlaceBuffers::kExactSums, 2 * most_,
                                compute_of(model_.block(first_).grads()));
    if (!shared_.defined()) own_.resize(most_);
  }
  int64_t* p = shared_.defined() ? reinterpret_cast<int64_t*>(shared_.data()) : own_.data();
  std::memset(p, 0, count * sizeof(int64_t));
  return p;
}

void ExactSum::keep() {
  if (stash_.size() <= kept_) stash_.emplace_back(last_ - first_);
  for (uint32_t b = first_; b < last_; ++b) {
    auto& g = model_.block(b).grads();
    HostStaged host(static_cast<const models::Tensor&>(g));
    stash_[kept_][b - first_].assign(host.data(), host.data() + host.count());
    compute_of(g).zero(g.data(), g.bytes());
  }
  ++kept_;
}

// The largest |g| of block b over the micro-batches this member computed (NaN or inf if any
// value is: the max of them then is not finite).
double ExactSum::local_max(uint32_t b, bool has_gradient) const {
  float m = 0;
  int bad = 0;  // a NaN or an infinity seen (NaN fails every comparison)
  auto scan = [&](const float* g, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      const float a = std::fabs(g[i]);
      bad |= !(a <= std::numeric_limits<float>::max());
      m = a > m ? a : m;
    }
  };
  const auto& cur = model_.block(b).grads();
  if (has_gradient) {
    HostStaged host(cur);
    scan(host.data(), host.count());
  }
  for (size_t j = 0; j < kept_; ++j) scan(stash_[j][b - first_].data(), cur.numel());
  return bad ? std::numeric_limits<double>::infinity() : double(m);
}

void ExactSum::reduce(comm::Communicator& comm, bool has_gradient) {
  const uint32_t nb = last_ - first_, n = uint32_t(comm.size());
  // 1. Every member's largest magnitude per block; everyone takes the max of the same values.
  std::vector<double> mine(nb), all(size_t(nb) * n);
  for (uint32_t b = first_; b < last_; ++b) mine[b - first_] = local_max(b, has_gradient);
  comm.allgather(mine.data(), all.data(), nb, comm::DataType::f64);
  for (uint32_t b = first_; b < last_; ++b) {
    double max_abs = 0;
    for (uint32_t r = 0; r < n; ++r) max_abs = std::max(max_abs, all[size_t(r) * nb + b - first_]);
    // 2. This member's micro-batches in fixed point, summed; 3. the exact sum over members.
    HostStaged g(model_.block(b).grads(), has_gradient);
    const size_t count = g.count();
    const int e = fixed_point_exponent(max_abs, terms_);
    int64_t* acc = zeroed_sums(count);
    if (std::isfinite(max_abs)) {
      if (has_gradient) add_fixed_point(acc, g.data(), count, e);
      for (size_t j = 0; j < kept_; ++j)
        add_fixed_point(acc, stash_[j][b - first_].data(), count, e);
    }
    comm.allreduce(acc, acc, count, comm::DataType::i64, comm::ReduceOp::sum);
    if (std::isfinite(max_abs))
      from_fixed_point(g.data(), acc, count, e);
    else
      std::fill(g.data(), g.data() + count, std::numeric_limits<float>::quiet_NaN());
    g.store();
  }
  kept_ = 0;
}

}  // namespace troupe::workers
