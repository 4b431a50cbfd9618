// Every op's backward against central finite differences, all in double.
//
// Method: L = sum(out * R) for a fixed random R, so dL/dout = R. Each input element x is moved by
// ±h (h = 1e-6) and (L(x+h) - L(x-h)) / 2h is compared with the analytic gradient.
// Tolerance: |analytic - numeric| <= 1e-6 * max(1, |numeric|)  (double rounding of the central
// difference is about 1e-10 / h = 1e-4 relative in the worst case for large L; our L are
// O(1)-O(10), and the measured errors are below 1e-8).
#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "models/kernels.h"

namespace troupe::models::kernels {
namespace {

using Vec = std::vector<double>;

Vec random_vec(size_t n, std::mt19937_64& rng, double lo = -1, double hi = 1) {
  std::uniform_real_distribution<double> d(lo, hi);
  Vec v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Checks analytic gradient `grad` of loss() with respect to every element of `x`.
void check_gradient(const char* what, Vec& x, const Vec& grad,
                    const std::function<double()>& loss) {
  const double h = 1e-6;
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    double saved = x[i];
    x[i] = saved + h;
    double up = loss();
    x[i] = saved - h;
    double down = loss();
    x[i] = saved;
    double numeric = (up - down) / (2 * h);
    double err = std::abs(grad[i] - numeric) / std::max(1.0, std::abs(numeric));
    worst = std::max(worst, err);
    ASSERT_LE(err, 1e-6) << what << "[" << i << "]: analytic " << grad[i] << " numeric " << numeric;
  }
  ::testing::Test::RecordProperty(what, std::to_string(worst));
}

TEST(OpsGrad, Linear) {
  std::mt19937_64 rng(1);
  const size_t N = 5, C = 7, OC = 4;
  Vec x = random_vec(N * C, rng), w = random_vec(OC * C, rng), b = random_vec(OC, rng),
      R = random_vec(N * OC, rng);
  Vec out(N * OC);
  auto loss = [&] {
    linear_forward(out.data(), x.data(), w.data(), b.data(), N, C, OC);
    return dot(out, R);
  };
  Vec dx(N * C, 0), dw(OC * C, 0), db(OC, 0);
  loss();
  linear_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), N, C, OC);
  check_gradient("linear.dx", x, dx, loss);
  check_gradient("linear.dw", w, dw, loss);
  check_gradient("linear.db", b, db, loss);
}

TEST(OpsGrad, ReluAwayFromTheKink) {
  std::mt19937_64 rng(2);
  Vec x = random_vec(50, rng);
  for (auto& v : x) v += v > 0 ? 0.1 : -0.1;
  Vec R = random_vec(50, rng), out(50), dx(50, 0);
  auto loss = [&] {
    relu_forward(out.data(), x.data(), 50);
    return dot(out, R);
  };
  relu_backward(dx.data(), R.data(), x.data(), 50);
  check_gradient("relu.dx", x, dx, loss);
}

TEST(OpsGrad, Gelu) {
  std::mt19937_64 rng(3);
  Vec x = random_vec(64, rng, -4, 4), R = random_vec(64, rng), out(64), dx(64, 0);
  auto loss = [&] {
    gelu_forward(out.data(), x.data(), 64);
    return dot(out, R);
  };
  gelu_backward(dx.data(), R.data(), x.data(), 64);
  check_gradient("gelu.dx", x, dx, loss);
}

TEST(OpsGrad, Residual) {
  std::mt19937_64 rng(4);
  Vec a = random_vec(20, rng), b = random_vec(20, rng), R = random_vec(20, rng), out(20), da(20, 0),
      db(20, 0);
  auto loss = [&] {
    residual_forward(out.data(), a.data(), b.data(), 20);
    return dot(out, R);
  };
  residual_backward(da.data(), db.data(), R.data(), 20);
  check_gradient("residual.da", a, da, loss);
  check_gradient("residual.db", b, db, loss);
}

TEST(OpsGrad, LayerNorm) {
  std::mt19937_64 rng(5);
  const size_t N = 4, C = 9;
  Vec x = random_vec(N * C, rng, -2, 2), w = random_vec(C, rng), b = random_vec(C, rng),
      R = random_vec(N * C, rng);
  Vec out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    return dot(out, R);
  };
  loss();
  Vec dx(N * C, 0), dw(C, 0), db(C, 0);
  layernorm_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), N, C);
  check_gradient("layernorm.dx", x, dx, loss);
  check_gradient("layernorm.dw", w, dw, loss);
  check_gradient("layernorm.db", b, db, loss);
}

TEST(OpsGrad, Embedding) {
  std::mt19937_64 rng(6);
  const size_t B = 2, T = 3, C = 4, V = 5;
  std::vector<int32_t> tokens{0, 3, 3, 4, 1, 3};  // repeats: gradients must add up
  Vec wte = random_vec(V * C, rng), wpe = random_vec(T * C, rng), R = random_vec(B * T * C, rng),
      out(B * T * C);
  auto loss = [&] {
    embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    return dot(out, R);
  };
  Vec dwte(V * C, 0), dwpe(T * C, 0);
  embedding_backward(dwte.data(), dwpe.data(), R.data(), tokens.data(), B, T, C);
  check_gradient("embedding.dwte", wte, dwte, loss);
  check_gradient("embedding.dwpe", wpe, dwpe, loss);
}

TEST(OpsGrad, CausalMultiHeadAttention) {
  std::mt19937_64 rng(7);
  const size_t B = 2, T = 5, C = 6, NH = 2;
  Vec qkv = random_vec(B * T * 3 * C, rng), R = random_vec(B * T * C, rng);
  Vec out(B * T * C), att(B * NH * T * T);
  auto loss = [&] {
    attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    return dot(out, R);
  };
  loss();
  Vec dqkv(qkv.size(), 0);
  attention_backward(dqkv.data(), R.data(), qkv.data(), att.data(), B, T, C, NH);
  check_gradient("attention.dqkv", qkv, dqkv, loss);
}

TEST(OpsGrad, AttentionIsCausal) {
  std::mt19937_64 rng(8);
  const size_t B = 1, T = 4, C = 4, NH = 1;
  Vec qkv = random_vec(B * T * 3 * C, rng), out(B * T * C), att(T * T);
  attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  Vec first(out.begin(), out.begin() + C);
  for (size_t i = 3 * C; i < qkv.size(); ++i) qkv[i] += 1.0;  // change only the later positions
  attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  for (size_t i = 0; i < C; ++i) EXPECT_DOUBLE_EQ(out[i], first[i]);
}

TEST(OpsGrad, SoftmaxCrossEntropy) {
  std::mt19937_64 rng(9);
  const size_t N = 6, V = 5;
  Vec logits = random_vec(N * V, rng, -3, 3), dlogits(N * V), scratch(N * V);
  std::vector<int32_t> targets{0, 4, 2, 2, 1, 3};
  auto loss = [&] {
    return softmax_cross_entropy(scratch.data(), logits.data(), targets.data(), N, V, 1.0 / N);
  };
  softmax_cross_entropy(dlogits.data(), logits.data(), targets.data(), N, V, 1.0 / N);
  check_gradient("softmax_ce.dlogits", logits, dlogits, loss);
}

}  // namespace
}  // namespace troupe::models::kernels
