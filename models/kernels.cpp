#include "models/kernels.h"

#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "models/compute.h"  // bf16_round

namespace troupe::models::kernels {
namespace {

inline void gemm(bool ta, bool tb, size_t M, size_t N, size_t K, float alpha, const float* A,
                 size_t lda, const float* B, size_t ldb, float beta, float* C, size_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M),
              int(N), int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}
inline void gemm(bool ta, bool tb, size_t M, size_t N, size_t K, double alpha, const double* A,
                 size_t lda, const double* B, size_t ldb, double beta, double* C, size_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M),
              int(N), int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}

constexpr double kGeluScale = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kLayerNormEps = 1e-5;

// tanh for the GELU's hot loops. double: the libm function (the gradient tests). float: through
// an exp written so the compiler vectorises the loop (libm's tanhf is a scalar call and took
// 30% of a GPT step). exp: 2^n * e^r with |r| <= ln2/2, degree-6 polynomial: relative error
// below 2e-7 on the range used; inputs are clamped where tanh is +-1 in float anyway.
inline float exp_approx(float x) {
  x = x < -87.0f ? -87.0f : (x > 87.0f ? 87.0f : x);
  float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693145751953125f - n * 1.42860682030941723212e-6f;
  float p = 1.0f + r * (1.0f + r * (0.5f + r * (0.16666667163372039794921875f +
                                                r * (0.041666667908430099487304688f +
                                                     r * (0.0083333337679505348205566406f +
                                                          r * 0.0013888889225199818611145020f)))));
  int32_t bits = (int32_t(n) + 127) << 23;
  float scale;
  __builtin_memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}
inline float tanh_fast(float x) {
  float c = x > 9.0f ? 9.0f : (x < -9.0f ? -9.0f : x);
  float e = exp_approx(2.0f * c);
  return (e - 1.0f) / (e + 1.0f);
}
inline double tanh_fast(double x) { return std::tanh(x); }

// GELU eight floats at a time (AVX2 + FMA: this library is built for x86-64-v3): the same
// polynomial as exp_approx, with the clamps as min/max. The scalar loops finish the tail. Returns
// how many elements it did (0 for double: the scalar loop does them all).
#if defined(__AVX2__) && defined(__FMA__)
inline __m256 exp_approx8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(87.0f));
  const __m256 n = _mm256_floor_ps(
      _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860682030941723212e-6f), r);
  __m256 p = _mm256_set1_ps(0.0013888889225199818611145020f);
  for (float c : {0.0083333337679505348205566406f, 0.041666667908430099487304688f,
                  0.16666667163372039794921875f, 0.5f, 1.0f, 1.0f})
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

inline __m256 tanh_fast8(__m256 x) {
  const __m256 c = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-9.0f)), _mm256_set1_ps(9.0f));
  const __m256 e = exp_approx8(_mm256_add_ps(c, c)), one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(_mm256_sub_ps(e, one), _mm256_add_ps(e, one));
}

// tanh(sqrt(2/pi) * (x + 0.044715 x^3)), and x^2.
inline __m256 gelu_tanh8(__m256 x, __m256& x2) {
  x2 = _mm256_mul_ps(x, x);
  const __m256 inner = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), x2), x, x);
  return tanh_fast8(_mm256_mul_ps(_mm256_set1_ps(float(kGeluScale)), inner));
}

size_t gelu_forward_wide(float* out, const float* inp, size_t n) {
  const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(inp + i);
    __m256 x2;
    const __m256 th = gelu_tanh8(x, x2);
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(half, x), _mm256_add_ps(one, th)));
  }
  return i;
}

size_t gelu_backward_wide(float* dinp, const float* dout, const float* inp, size_t n) {
  const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
  const __m256 scale = _mm256_set1_ps(float(kGeluScale)), three = _mm256_set1_ps(3 * 0.044715f);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(inp + i);
    __m256 x2;
    const __m256 th = gelu_tanh8(x, x2);
    const __m256 sech2 = _mm256_fnmadd_ps(th, th, one);
    // 0.5 (1 + th) + 0.5 x sech2 scale (1 + 3 * 0.044715 x^2)
    const __m256 slope = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(half, x), sech2),
                                       _mm256_mul_ps(scale, _mm256_fmadd_ps(three, x2, one)));
    const __m256 local = _mm256_fmadd_ps(half, _mm256_add_ps(one, th), slope);
    _mm256_storeu_ps(dinp + i,
                     _mm256_fmadd_ps(local, _mm256_loadu_ps(dout + i), _mm256_loadu_ps(dinp + i)));
  }
  return i;
}
#else
size_t gelu_forward_wide(float*, const float*, size_t) { return 0; }
size_t gelu_backward_wide(float*, const float*, const float*, size_t) { return 0; }
#endif
size_t gelu_forward_wide(double*, const double*, size_t) { return 0; }
size_t gelu_backward_wide(double*, const double*, const double*, size_t) { return 0; }

}  // namespace

template <typename T>
void linear_forward(T* out, const T* inp, const T* weight, const T* bias, size_t N, size_t C,
                    size_t OC) {
  gemm(false, true, N, OC, C, T(1), inp, C, weight, C, T(0), out, OC);
  if (bias) {
    for (size_t n = 0; n < N; ++n) {
      T* row = out + n * OC;
      for (size_t o = 0; o < OC; ++o) row[o] += bias[o];
    }
  }
}

template <typename T>
void linear_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     size_t N, size_t C, size_t OC) {
  if (dinp) gemm(false, false, N, C, OC, T(1), dout, OC, weight, C, T(1), dinp, C);
  gemm(true, false, OC, C, N, T(1), dout, OC, inp, C, T(1), dweight, C);
  if (dbias) {
    for (size_t n = 0; n < N; ++n) {
      const T* row = dout + n * OC;
      for (size_t o = 0; o < OC; ++o) dbias[o] += row[o];
    }
  }
}

template <typename T>
void relu_forward(T* out, const T* inp, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = inp[i] > T(0) ? inp[i] : T(0);
}

template <typename T>
void relu_backward(T* dinp, const T* dout, const T* inp, size_t n) {
  for (size_t i = 0; i < n; ++i) dinp[i] += dout[i] * T(inp[i] > T(0));
}

template <typename T>
void gelu_forward(T* out, const T* inp, size_t n) {
  for (size_t i = gelu_forward_wide(out, inp, n); i < n; ++i) {
    T x = inp[i];
    T cube = T(0.044715) * x * x * x;
    out[i] = T(0.5) * x * (T(1) + tanh_fast(T(kGeluScale) * (x + cube)));
  }
}

template <typename T>
void gelu_backward(T* dinp, const T* dout, const T* inp, size_t n) {
  for (size_t i = gelu_backward_wide(dinp, dout, inp, n); i < n; ++i) {
    T x = inp[i];
    T cube = T(0.044715) * x * x * x;
    T arg = T(kGeluScale) * (x + cube);
    T th = tanh_fast(arg);
    T sech2 = T(1) - th * th;
    T local = T(0.5) * (T(1) + th) +
              x * T(0.5) * sech2 * T(kGeluScale) * (T(1) + T(3 * 0.044715) * x * x);
    dinp[i] += local * dout[i];
  }
}

template <typename T>
void residual_forward(T* out, const T* a, const T* b, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <typename T>
void residual_backward(T* da, T* db, const T* dout, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

// Sums over a row in 16 interleaved partial sums, added at the end: the compiler vectorises them
// (one running sum is a single dependency chain it may not reorder). f(i) is the i-th term.
template <typename T, typename F>
inline __attribute__((always_inline)) T lane_sum(size_t n, F f) {
  constexpr size_t L = 16;
  T lanes[L] = {};
  size_t i = 0;
  for (; i + L <= n; i += L)
    for (size_t l = 0; l < L; ++l) lanes[l] += f(i + l);
  for (; i < n; ++i) lanes[0] += f(i);
  T s = 0;
  for (T v : lanes) s += v;
  return s;
}

template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                       size_t N, size_t C) {
  for (size_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    const T m = lane_sum<T>(C, [x](size_t i) { return x[i]; }) / T(C);
    const T v = lane_sum<T>(C, [x, m](size_t i) { return (x[i] - m) * (x[i] - m); }) / T(C);
    const T s = T(1) / std::sqrt(v + T(kLayerNormEps));
    T* y = out + n * C;
    for (size_t i = 0; i < C; ++i) y[i] = (x[i] - m) * s * weight[i] + bias[i];
    mean[n] = m;
    rstd[n] = s;
  }
}

// One row of layernorm_backward, its arrays distinct (as every caller passes them: said so, the
// loops vectorise).
template <typename T>
void layernorm_backward_row(T* __restrict dx, T* __restrict dw, T* __restrict db,
                            const T* __restrict dy, const T* __restrict x,
                            const T* __restrict weight, T m, T s, size_t C) {
  const T dnorm_mean = lane_sum<T>(C, [=](size_t i) { return weight[i] * dy[i]; }) / T(C);
  const T dnorm_norm_mean =
      lane_sum<T>(C, [=](size_t i) { return weight[i] * dy[i] * ((x[i] - m) * s); }) / T(C);
  for (size_t i = 0; i < C; ++i) {
    const T norm = (x[i] - m) * s;
    const T dnorm = weight[i] * dy[i];
    db[i] += dy[i];
    dw[i] += norm * dy[i];
    dx[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
  }
}

template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                        const T* mean, const T* rstd, size_t N, size_t C) {
  for (size_t n = 0; n < N; ++n)
    layernorm_backward_row(dinp + n * C, dweight, dbias, dout + n * C, inp + n * C, weight, mean[n],
                           rstd[n], C);
}

template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, size_t B,
                       size_t T_, size_t C) {
  for (size_t b = 0; b < B; ++b) {
    for (size_t t = 0; t < T_; ++t) {
      T* o = out + (b * T_ + t) * C;
      const T* we = wte + size_t(tokens[b * T_ + t]) * C;
      const T* pe = wpe + t * C;
      for (size_t i = 0; i < C; ++i) o[i] = we[i] + pe[i];
    }
  }
}

template <typename T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, size_t B, size_t T_,
                        size_t C) {
  for (size_t b = 0; b < B; ++b) {
    for (size_t t = 0; t < T_; ++t) {
      const T* d = dout + (b * T_ + t) * C;
      T* dwe = dwte + size_t(tokens[b * T_ + t]) * C;
      T* dpe = dwpe + t * C;
      for (size_t i = 0; i < C; ++i) {
        dwe[i] += d[i];
        dpe[i] += d[i];
      }
    }
  }
}

template <typename T>
void attention_forward(T* out, T* att, const T* qkv, size_t B, size_t T_, size_t C, size_t NH) {
  const size_t hs = C / NH, C3 = 3 * C;
  const T scale = T(1) / std::sqrt(T(hs));
  for (size_t b = 0; b < B; ++b) {
    for (size_t h = 0; h < NH; ++h) {
      const T* q = qkv + b * T_ * C3 + h * hs;
      const T* k = q + C;
      const T* v = q + 2 * C;
      T* a = att + (b * NH + h) * T_ * T_;
      gemm(false, true, T_, T_, hs, scale, q, C3, k, C3, T(0), a, T_);
      for (size_t t = 0; t < T_; ++t) {
        T* row = a + t * T_;
        T mx = row[0];
        for (size_t j = 1; j <= t; ++j) mx = std::max(mx, row[j]);
        T sum = 0;
        for (size_t j = 0; j <= t; ++j) {
          row[j] = std::exp(row[j] - mx);
          sum += row[j];
        }
        T inv = T(1) / sum;
        for (size_t j = 0; j <= t; ++j) row[j] *= inv;
        for (size_t j = t + 1; j < T_; ++j) row[j] = T(0);  // causal mask
      }
      gemm(false, false, T_, hs, T_, T(1), a, T_, v, C3, T(0), out + b * T_ * C + h * hs, C);
    }
  }
}

template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, size_t B, size_t T_,
                        size_t C, size_t NH) {
  const size_t hs = C / NH, C3 = 3 * C;
  const T scale = T(1) / std::sqrt(T(hs));
  std::vector<T> datt(T_ * T_), dpre(T_ * T_);
  for (size_t b = 0; b < B; ++b) {
    for (size_t h = 0; h < NH; ++h) {
      const T* q = qkv + b * T_ * C3 + h * hs;
      const T* k = q + C;
      const T* v = q + 2 * C;
      T* dq = dqkv + b * T_ * C3 + h * hs;
      T* dk = dq + C;
      T* dv = dq + 2 * C;
      const T* a = att + (b * NH + h) * T_ * T_;
      const T* dy = dout + b * T_ * C + h * hs;
      gemm(false, true, T_, T_, hs, T(1), dy, C, v, C3, T(0), datt.data(), T_);
      gemm(true, false, T_, hs, T_, T(1), a, T_, dy, C, T(1), dv, C3);
      for (size_t t = 0; t < T_; ++t) {
        const T* arow = a + t * T_;
        const T* drow = datt.data() + t * T_;
        T* prow = dpre.data() + t * T_;
        T dot = 0;
        for (size_t j = 0; j <= t; ++j) dot += arow[j] * drow[j];
        for (size_t j = 0; j <= t; ++j) prow[j] = arow[j] * (drow[j] - dot);
        for (size_t j = t + 1; j < T_; ++j) prow[j] = T(0);
      }
      gemm(false, false, T_, hs, T_, scale, dpre.data(), T_, k, C3, T(1), dq, C3);
      gemm(true, false, T_, hs, T_, scale, dpre.data(), T_, q, C3, T(1), dk, C3);
    }
  }
}

namespace {
std::vector<float> rounded(const float* x, size_t n) {
  std::vector<float> r(n);
  for (size_t i = 0; i < n; ++i) r[i] = bf16_round(x[i]);
  return r;
}
}  // namespace

void attention_forward_bf16(float* out, float* att, const float* qkv, size_t B, size_t T_, size_t C,
                            size_t NH) {
  const size_t hs = C / NH, C3 = 3 * C;
  const std::vector<float> qkv16 = rounded(qkv, B * T_ * C3);
  attention_forward(out, att, qkv16.data(), B, T_, C, NH);  // att: the rounded q, k's softmax
  std::vector<float> a16(T_ * T_);
  for (size_t b = 0; b < B; ++b) {
    for (size_t h = 0; h < NH; ++h) {
      const float* a = att + (b * NH + h) * T_ * T_;
      for (size_t i = 0; i < T_ * T_; ++i) a16[i] = bf16_round(a[i]);
      const float* v = qkv16.data() + b * T_ * C3 + h * hs + 2 * C;
      gemm(false, false, T_, hs, T_, 1.f, a16.data(), T_, v, C3, 0.f, out + b * T_ * C + h * hs, C);
    }
  }
}

void attention_backward_bf16(float* dqkv, const float* dout, const float* qkv, const float* out,
                             const float* att, size_t B, size_t T_, size_t C, size_t NH) {
  const size_t hs = C / NH, C3 = 3 * C;
  const float scale = 1.f / std::sqrt(float(hs));
  const std::vector<float> qkv16 = rounded(qkv, B * T_ * C3), dout16 = rounded(dout, B * T_ * C);
  std::vector<float> dp(T_ * T_), a16(T_ * T_), ds16(T_ * T_);
  for (size_t b = 0; b < B; ++b) {
    for (size_t h = 0; h < NH; ++h) {
      const float* q = qkv16.data() + b * T_ * C3 + h * hs;
      const float *k = q + C, *v = q + 2 * C;
      float* dq = dqkv + b * T_ * C3 + h * hs;
      const float* a = att + (b * NH + h) * T_ * T_;
      const size_t row = b * T_ * C + h * hs;  // (b, 0, h) in dout and out
      gemm(false, true, T_, T_, hs, 1.f, dout16.data() + row, C, v, C3, 0.f, dp.data(), T_);
      for (size_t i = 0; i < T_ * T_; ++i) a16[i] = bf16_round(a[i]);
      gemm(true, false, T_, hs, T_, 1.f, a16.data(), T_, dout16.data() + row, C, 1.f, dq + 2 * C,
           C3);
      for (size_t t = 0; t < T_; ++t) {
        float D = 0;  // dot(dout, out) over the head, unrounded
        for (size_t d = 0; d < hs; ++d) D += dout[row + t * C + d] * out[row + t * C + d];
        for (size_t j = 0; j < T_; ++j)
          ds16[t * T_ + j] = j <= t ? bf16_round(a[t * T_ + j] * (dp[t * T_ + j] - D)) : 0.f;
      }
      gemm(false, false, T_, hs, T_, scale, ds16.data(), T_, k, C3, 1.f, dq, C3);
      gemm(true, false, T_, hs, T_, scale, ds16.data(), T_, q, C3, 1.f, dq + C, C3);
    }
  }
}

template <typename T>
double softmax_cross_entropy(T* dlogits, const T* logits, const int32_t* targets, size_t N,
                             size_t V, double scale, size_t* correct) {
  double total = 0;
  size_t right = 0;
  for (size_t n = 0; n < N; ++n) {
    const T* row = logits + n * V;
    T* drow = dlogits + n * V;
    size_t argmax = 0;
    T mx = row[0];
    for (size_t i = 1; i < V; ++i) {
      if (row[i] > mx) {
        mx = row[i];
        argmax = i;
      }
    }
    double sum = 0;
    for (size_t i = 0; i < V; ++i) {
      T e = std::exp(row[i] - mx);
      drow[i] = e;
      sum += e;
    }
    size_t target = size_t(targets[n]);
    double loss = -(double(row[target]) - double(mx) - std::log(sum));
    total += loss * scale;
    T inv = T(1.0 / sum);
    for (size_t i = 0; i < V; ++i) drow[i] = T(drow[i] * inv * scale);
    drow[target] -= T(scale);
    right += argmax == target;
  }
  if (correct) *correct += right;
  return total;
}

#define TROUPE_INSTANTIATE(T)                                                                    \
  template void linear_forward<T>(T*, const T*, const T*, const T*, size_t, size_t, size_t);     \
  template void linear_backward<T>(T*, T*, T*, const T*, const T*, const T*, size_t, size_t,     \
                                   size_t);                                                      \
  template void relu_forward<T>(T*, const T*, size_t);                                           \
  template void relu_backward<T>(T*, const T*, const T*, size_t);                                \
  template void gelu_forward<T>(T*, const T*, size_t);                                           \
  template void gelu_backward<T>(T*, const T*, const T*, size_t);                                \
  template void residual_forward<T>(T*, const T*, const T*, size_t);                             \
  template void residual_backward<T>(T*, T*, const T*, size_t);                                  \
  template void layernorm_forward<T>(T*, T*, T*, const T*, const T*, const T*, size_t, size_t);  \
  template void layernorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,        \
                                      const T*, size_t, size_t);                                 \
  template void embedding_forward<T>(T*, const int32_t*, const T*, const T*, size_t, size_t,     \
                                     size_t);                                                    \
  template void embedding_backward<T>(T*, T*, const T*, const int32_t*, size_t, size_t, size_t); \
  template void attention_forward<T>(T*, T*, const T*, size_t, size_t, size_t, size_t);          \
  template void attention_backward<T>(T*, const T*, const T*, const T*, size_t, size_t, size_t,  \
                                      size_t);                                                   \
  template double softmax_cross_entropy<T>(T*, const T*, const int32_t*, size_t, size_t, double, \
                                           size_t*);

TROUPE_INSTANTIATE(float)
TROUPE_INSTANTIATE(double)

}  // namespace troupe::models::kernels
