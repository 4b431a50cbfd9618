// Every CUDA kernel of models/cuda/ against its CPU kernel on the same inputs (ctest label gpu;
// without a CUDA device each test skips and says why). The same tests, but the memory pool's,
// also run without a GPU on the emulated device (troupe_cuda_emulated_tests, label emulated:
// tests/emulation/cuda_emulation.h; its GEMMs are the CPU's BLAS on cuBLASLt's layouts), which
// checks the kernels' logic, not the GPU. Shapes
// are odd on purpose: sizes that are not multiples of 8, 16 or 128, batch 1, context 1. f32 must
// agree within 1e-5 relative to the largest magnitude of the CPU's result (the sums run in other
// orders, so not bitwise); bf16 GEMMs agree with the CPU on the same bf16-rounded inputs within
// 1e-5, and with the unrounded f32 product within bf16's tolerance.
#include "models/cuda/kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "models/cuda/gemm.h"
#include "models/cuda/runtime.h"
#include "models/kernels.h"
#include "models/optim.h"

namespace troupe::models {
namespace {

namespace k = kernels;
using cuda::DeviceBuffer;
using Floats = std::vector<float>;

#define SKIP_WITHOUT_GPU() \
  if (cuda::device_count() == 0) GTEST_SKIP() << "needs a CUDA device: " << cuda::describe(0)

Floats random(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  Floats v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<int32_t> random_ids(size_t n, int32_t below, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, below - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// The GPU side of a test: one stream, buffers uploaded from and read back into host vectors.
class Gpu {
 public:
  template <typename T>
  DeviceBuffer<T> up(const std::vector<T>& host) {
    DeviceBuffer<T> d(host.size(), stream_.get());
    cuda::copy_to_device(d.data(), host.data(), host.size() * sizeof(T), stream_.get());
    return d;
  }
  template <typename T>
  DeviceBuffer<T> zeros(size_t n) {
    DeviceBuffer<T> d(n, stream_.get());
    cuda::fill_zero(d.data(), n * sizeof(T), stream_.get());
    return d;
  }
  template <typename T>
  std::vector<T> down(const DeviceBuffer<T>& d) {
    std::vector<T> host(d.size());
    cuda::copy_to_host(host.data(), d.data(), d.bytes(), stream_.get());
    stream_.synchronize();
    return host;
  }
  cudaStream_t stream() const { return stream_.get(); }

 private:
  cuda::Stream stream_;
};

void expect_close(const Floats& got, const Floats& want, double relative, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double largest = 0, worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    largest = std::max(largest, double(std::fabs(want[i])));
    const double diff = std::fabs(double(got[i]) - double(want[i]));
    if (!(diff <= worst)) {  // (a NaN is worst of all)
      worst = diff;
      at = i;
    }
  }
  EXPECT_LE(worst, relative * std::max(largest, 1e-30))
      << what << ": element " << at << " is " << got[at] << ", the CPU's " << want[at]
      << " (largest magnitude " << largest << ")";
}

[[maybe_unused]] uint16_t bf16_bits(
    float x) {  // round to nearest even, as __float2bfloat16_rn (finite inputs)
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

[[maybe_unused]] float from_bf16_bits(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

TEST(CudaKernels, ElementwiseForwardAndBackward) {
  SKIP_WITHOUT_GPU();
  Gpu gpu;
  for (size_t n : {size_t(1), size_t(1000003)}) {
    const Floats x = random(n, 1, 2.f), y = random(n, 2), dout = random(n, 3), acc = random(n, 4);
    auto dx = gpu.up(x), dy = gpu.up(y), ddout = gpu.up(dout);
    Floats want(n), want_grad = acc;
    auto out = gpu.zeros<float>(n), grad = gpu.up(acc);

    k::gelu_forward(want.data(), x.data(), n);
    cuda::gelu_forward(out.data(), dx.data(), n, gpu.stream());
    expect_close(gpu.down(out), want, 1e-5, "gelu forward n=" + std::to_string(n));
    k::gelu_backward(want_grad.data(), dout.data(), x.data(), n);
    cuda::gelu_backward(grad.data(), ddout.data(), dx.data(), n, gpu.stream());
    expect_close(gpu.down(grad), want_grad, 1e-5, "gelu backward");

    k::relu_forward(want.data(), x.data(), n);
    cuda::relu_forward(out.data(), dx.data(), n, gpu.stream());
    expect_close(gpu.down(out), want, 0, "relu forward");
    k::relu_backward(want_grad.data(), dout.data(), x.data(), n);
    cuda::relu_backward(grad.data(), ddout.data(), dx.data(), n, gpu.stream());
    expect_close(gpu.down(grad), want_grad, 1e-6, "relu backward");

    k::residual_forward(want.data(), x.data(), y.data(), n);
    cuda::residual_forward(out.data(), dx.data(), dy.data(), n, gpu.stream());
    expect_close(gpu.down(out), want, 0, "residual forward");
    Floats want_b = acc;
    auto grad_b = gpu.up(acc);
    k::residual_backward(want_grad.data(), want_b.data(), dout.data(), n);
    cuda::residual_backward(grad.data(), grad_b.data(), ddout.data(), n, gpu.stream());
    expect_close(gpu.down(grad), want_grad, 1e-6, "residual backward a");
    expect_close(gpu.down(grad_b), want_b, 1e-6, "residual backward b");
  }
}

struct LinearShape {
  size_t N, C, OC;
};

TEST(CudaKernels, LinearForwardAndBackwardThroughCublasLt) {
  SKIP_WITHOUT_GPU();
  Gpu gpu;
  cuda::Gemm gemm(gpu.stream());
  for (auto [N, C, OC] : {LinearShape{1, 1, 1}, LinearShape{7, 13, 11}, LinearShape{37, 129, 33},
                          LinearShape{203, 771, 65}}) {
    const std::string shape =
        std::to_string(N) + "x" + std::to_string(C) + "->" + std::to_string(OC);
    const Floats inp = random(N * C, 5), w = random(OC * C, 6, 0.1f), b = random(OC, 7);
    const Floats dout = random(N * OC, 8), dinp0 = random(N * C, 9), dw0 = random(OC * C, 10),
                 db0 = random(OC, 11);
    Floats want(N * OC), want_dinp = dinp0, want_dw = dw0, want_db = db0;
    k::linear_forward(want.data(), inp.data(), w.data(), b.data(), N, C, OC);
    k::linear_backward(want_dinp.data(), want_dw.data(), want_db.data(), dout.data(), inp.data(),
                       w.data(), N, C, OC);
    auto d_inp = gpu.up(inp), d_w = gpu.up(w), d_b = gpu.up(b), d_dout = gpu.up(dout);
    auto out = gpu.zeros<float>(N * OC);
    auto dinp = gpu.up(dinp0), dw = gpu.up(dw0), db = gpu.up(db0);
    gemm.linear_forward(out.data(), d_inp.data(), d_w.data(), d_b.data(), N, C, OC);
    gemm.linear_backward(dinp.data(), dw.data(), db.data(), d_dout.data(), d_inp.data(), d_w.data(),
                         N, C, OC);
    expect_close(gpu.down(out), want, 1e-5, "linear forward " + shape);
    expect_close(gpu.down(dinp), want_dinp, 1e-5, "linear backward dinp " + shape);
    expect_close(gpu.down(dw), want_dw, 1e-5, "linear backward dweight " + shape);
    expect_close(gpu.down(db), want_db, 1e-5, "linear backward dbias " + shape);
  }
}

TEST(CudaKernels, BiasForwardAndBackward) {
  SKIP_WITHOUT_GPU();
  Gpu gpu;
  for (auto [N, OC] : {std::pair<size_t, size_t>{1, 1}, {37, 257}, {300, 33}, {64, 5}}) {
    const Floats x = random(N * OC, 36), b = random(OC, 37), dout = random(N * OC, 38),
                 db0 = random(OC, 39);
    Floats want = x, want_db = db0;
    for (size_t r = 0; r < N; ++r)
      for (size_t c = 0; c < OC; ++c) want[r * OC + c] += b[c];
    for (size_t c = 0; c < OC; ++c) {  // per 32 rows, then over those sums, as the kernel
      float s = 0.f;
      for (size_t g = 0; g < N; g += 32) {
        float part = 0.f;
        for (size_t r = g; r < std::min(N, g + 32); ++r) part += dout[r * OC + c];
        s += part;
      }
      want_db[c] = db0[c] + s;
    }
    auto out = gpu.up(x), d_b = gpu.up(b), d_dout = gpu.up(dout), db = gpu.up(db0);
    cuda::bias_forward(out.data(), d_b.data(), N, OC, gpu.stream());
    cuda::bias_backward(db.data(), d_dout.data(), N, OC, gpu.stream());
    expect_close(gpu.down(out), want, 0, "bias forward");
    expect_close(gpu.down(db), want_db, 1e-6, "bias backward");
  }
}

TEST(CudaKernels, Bf16LinearIsTheF32ProductOfTheRoundedInputs) {
  SKIP_WITHOUT_GPU();
  Gpu gpu;
  cuda::Gemm gemm(gpu.stream());
  const size_t N = 37, C = 203, OC = 45;
  const Floats inp = random(N * C, 12), w = random(OC * C, 13, 0.1f), b = random(OC, 14);
  // Rounded on the device (checked against the host's rounding), multiplied by cuBLASLt.
  auto d_inp = gpu.up(inp), d_w = gpu.up(w), d_b = gpu.up(b);
  auto inp16 = gpu.zeros<uint16_t>(N * C), w16 = gpu.zeros<uint16_t>(OC * C);
  cuda::to_bf16(inp16.data(), d_inp.data(), N * C, gpu.stream());
  cuda::to_bf16(w16.data(), d_w.data(), OC * C, gpu.stream());
  const auto inp_bits = gpu.down(inp16), w_bits = gpu.down(w16);
  Floats inp_r(N * C), w_r(OC * C);
  for (size_t i = 0; i < inp.size(); ++i) {
    ASSERT_EQ(inp_bits[i], bf16_bits(inp[i])) << "element " << i << " = " << inp[i];
    inp_r[i] = from_bf16_bits(inp_bits[i]);
  }
  for (size_t i = 0; i < w.size(); ++i) w_r[i] = from_bf16_bits(w_bits[i]);
  auto back = gpu.zeros<float>(N * C);
  cuda::from_bf16(back.data(), inp16.data(), N * C, gpu.stream());
  expect_close(gpu.down(back), inp_r, 0, "from_bf16");

  auto out = gpu.zeros<float>(N * OC);
  gemm.linear_forward_bf16(out.data(), inp16.data(), w16.data(), d_b.data(), N, C, OC);
  const Floats got = gpu.down(out);
  Floats rounded(N * OC), exact(N * OC);
  k::linear_forward(rounded.data(), inp_r.data(), w_r.data(), b.data(), N, C, OC);
  k::linear_forward(exact.data(), inp.data(), w.data(), b.data(), N, C, OC);
  expect_close(got, rounded, 1e-5, "bf16 linear vs the CPU on the rounded inputs");
  expect_close(got, exact, 2e-2, "bf16 linear vs the f32 product");

  // The backward GEMMs on bf16 operands: dinp from dout and the weight, dweight from dout and
  // the input, both accumulated into f32.
  const Floats dout = random(N * OC, 15), dinp0 = random(N * C, 16), dw0 = random(OC * C, 17);
  auto d_dout = gpu.up(dout);
  auto dout16 = gpu.zeros<uint16_t>(N * OC);
  cuda::to_bf16(dout16.data(), d_dout.data(), N * OC, gpu.stream());
  const auto dout_bits = gpu.down(dout16);
  Floats dout_r(N * OC);
  for (size_t i = 0; i < dout.size(); ++i) dout_r[i] = from_bf16_bits(dout_bits[i]);
  auto d_dinp = gpu.up(dinp0), d_dw = gpu.up(dw0);
  gemm.linear_backward_bf16(d_dinp.data(), d_dw.data(), dout16.data(), inp16.data(), w16.data(), N,
                            C, OC);
  Floats want_dinp = dinp0, want_dw = dw0;
  k::linear_backward(want_dinp.data(), want_dw.data(), static_cast<float*>(nullptr), dout_r.data(),
                     inp_r.data(), w_r.data(), N, C, OC);
  expect_close(gpu.down(d_dinp), want_dinp, 1e-5, "bf16 dinp vs the CPU on the rounded operands");
  expect_close(gpu.down(d_dw), want_dw, 1e-5, "bf16 dweight vs the CPU on the rounded operands");
}

TEST(CudaKernels, LayerNormForwardBackwardAndTheFusedResidual) {
  SKIP_WITHOUT_GPU();
  Gpu gpu;
  for (auto [N, C] : {std::pair<size_t, size_t>{1, 1}, {1, 37}, {67, 13}, {131, 771}}) {
    const std::string shape = std::to_string(N) + "x" + std::to_string(C);
    const Floats x = random(N * C, 15, 3.f), r = random(N * C, 16), w = random(C, 17),
                 b = random(C, 18), dout = random(N * C, 19), dx0 = random(N * C, 20),
                 dw0 = random(C, 21), db0 = random(C, 22);
    Floats sum(N * C);
    k::residual_forward(sum.data(), x.data(), r.data(), N * C);
    Floats want(N * C), mean(N), rstd(N), want_dx = dx0, want_dw = dw0, want_db = db0;
    k::layernorm_forward(want.data(), mean.data(), rstd.data(), sum.data(), w.data(), b.data(), N,
                         C);
    k::layernorm_backward(want_dx.data(), want_dw.data(), want_db.data(), dout.data(), sum.data(),
                          w.data(), mean.data(), rstd.data(), N, C);
    auto d_x = gpu.up(x), d_r = gpu.up(r), d_w = gpu.up(w), d_b = gpu.up(b), d_dout = gpu.up(dout);
    auto out = gpu.zeros<float>(N * C), d_sum = gpu.zeros<float>(N * C);
    auto d_mean = gpu.zeros<float>(N), d_rstd = gpu.zeros<float>(N);
    cuda::layernorm_forward(out.data(), d_mean.data(), d_rstd.data(), d_x.data(), d_w.data(),
                            d_b.data(), N, C, gpu.stream(), d_r.data(), d_sum.data());
    expect_close(gpu.down(d_sum), sum, 0, "fused residual sum " + shape);
    expect_close(gpu.down(out), want, 1e-5, "layernorm forward " + shape);
    expect_close(gpu.down(d_mean), mean, 1e-5, "mean " + shape);
    expect_close(gpu.down(d_rstd), rstd, 1e-5, "rstd " + shape);
    // Without the residual: the plain input.
    cuda::layernorm_forward(out.data(), d_mean.data(), d_rstd.data(), d_sum.data(), d_w.data(),
                            d_b.data(), N, C, gpu.stream());
    expect_close(gpu.down(out), want, 1e-5, "layernorm forward, no residual " + shape);

    auto dx = gpu.up(dx0), dw = gpu.up(dw0), db = gpu.up(db0);
    auto scratch = gpu.zeros<float>(cuda::layernorm_scratch(N, C));
    cuda::layernorm_backward(dx.data(), dw.data(), db.data(), d_dout.data(), d_sum.data(),
                             d_w.data(), d_mean.data(), d_rstd.data(), N, C, scratch.data(),
                             gpu.stream());
    expect_close(gpu.down(dx), want_dx, 1e-5, "layernorm backward dinp " + shape);
    expect_close(gpu.down(dw), want_dw, 1e-5, "layernorm backward dweight " + shape);
    expect_close(gpu.down(db), want_db, 1e-5, "layernorm backward dbias " + shape);
  }
}

TEST(CudaKernels, EmbeddingForwardAndBackwardWithRepeatedTokens) {
  SKIP_WITHOUT_GPU();
  Gpu gpu;
  for (auto [B, T, C, V] : {std::tuple<size_t, size_t, size_t, int32_t>{1, 1, 7, 3},
                            {3, 37, 45, 11},
                            {5, 17, 129, 1003},
                            {2, 9, 300, 5}}) {
    const std::string shape = std::to_string(B) + "x" + std::to_string(T) + "x" + std::to_string(C);
    const auto tokens = random_ids(B * T, V, 23);
    const Floats wte = random(size_t(V) * C, 24), wpe = random(T * C, 25),
                 dout = random(B * T * C, 26), dwte0 = random(size_t(V) * C, 27),
                 dwpe0 = random(T * C, 28);
    Floats want(B * T * C), want_dwte = dwte0, want_dwpe = dwpe0;
    k::embedding_forward(want.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    k::embedding_backward(want_dwte.data(), want_dwpe.data(), dout.data(), tokens.data(), B, T, C);
    auto d_tokens = gpu.up(tokens);
    auto d_wte = gpu.up(wte), d_wpe = gpu.up(wpe), d_dout = gpu.up(dout);
    auto out = gpu.zeros<float>(B * T * C), dwte = gpu.up(dwte0), dwpe = gpu.up(dwpe0);
    cuda::embedding_forward(out.data(), d_tokens.data(), d_wte.data(), d_wpe.data(), B, T, C,
                            gpu.stream());
    expect_close(gpu.down(out), want, 0, "embedding forward " + shape);
    const cuda::TokenGroups groups = cuda::group_tokens(tokens.data(), tokens.size());
    auto g_tokens = gpu.up(groups.tokens), g_offsets = gpu.up(groups.offsets),
         g_positions = gpu.up(groups.positions);
    cuda::embedding_backward(dwte.data(), dwpe.data(), d_dout.data(), g_tokens.data(),
                             g_offsets.data(), g_positions.data(), groups.tokens.size(), B, T, C,
                             gpu.stream());
    expect_close(gpu.down(dwte), want_dwte, 1e-5, "embedding backward dwte " + shape);
    expect_close(gpu.down(dwpe), want_dwpe, 1e-5, "embedding backward dwpe " + shape);
  }
}

struct AttentionShape {
  size_t B, T, C, NH;
  std::string name() const {
    return std::to_string(B) + "x" + std::to_string(T) + " C" + std::to_string(C) + " NH" +
           std::to_string(NH);
  }
};

TEST(CudaKernels, FusedCausalAttentionForwardAndBackward) {
  SKIP_WITHOUT_GPU();
  Gpu gpu;
  for (auto [B, T, C, NH] : {AttentionShape{1, 1, 4, 1}, AttentionShape{2, 5, 12, 3},
                             AttentionShape{3, 37, 201, 3}, AttentionShape{1, 70, 256, 1},
                             AttentionShape{2, 65, 96, 4}, AttentionShape{1, 300, 128, 2}}) {
    const std::string shape = AttentionShape{B, T, C, NH}.name();
    const Floats qkv = random(B * T * 3 * C, 29), dout = random(B * T * C, 30),
                 dqkv0 = random(B * T * 3 * C, 31);
    Floats want(B * T * C), att(B * NH * T * T), want_dqkv = dqkv0;
    k::attention_forward(want.data(), att.data(), qkv.data(), B, T, C, NH);
    k::attention_backward(want_dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
    auto d_qkv = gpu.up(qkv), d_dout = gpu.up(dout), dqkv = gpu.up(dqkv0);
    auto out = gpu.zeros<float>(B * T * C), lse = gpu.zeros<float>(B * NH * T),
         scratch = gpu.zeros<float>(B * NH * T);
    cuda::attention_forward(out.data(), lse.data(), d_qkv.data(), B, T, C, NH, gpu.stream());
    expect_close(gpu.down(out), want, 1e-5, "attention forward " + shape);
    cuda::attention_backward(dqkv.data(), d_dout.data(), d_qkv.data(), out.data(), lse.data(), B, T,
                             C, NH, scratch.data(), gpu.stream());
    const Floats got = gpu.down(dqkv);
    expect_close(got, want_dqkv, 1e-5, "attention backward " + shape);
    // Deterministic: the same inputs, the same bits.
    auto again = gpu.up(dqkv0);
    cuda::attention_backward(again.data(), d_dout.data(), d_qkv.data(), out.data(), lse.data(), B,
                             T, C, NH, scratch.data(), gpu.stream());
    EXPECT_EQ(gpu.down(again), got) << shape;
  }
}

// bf16 attention on the tensor cores against the CPU's emulation of it (the same roundings, f32
// sums in another order: a probability on the other side of a bf16 rounding boundary moves a
// product by one bf16 step of one term) and against the f32 kernel (bf16 tolerance). Heads of
// 1-8 chunks of 16 columns, whole or padded; contexts shorter, longer, multiples and not of a
// block's 64 rows or a step's 32; blocks of 1-4 warps.
TEST(CudaKernels, Bf16AttentionOnTensorCoresIsTheCpusEmulationOfIt) {
  SKIP_WITHOUT_GPU();
  Gpu gpu;
  for (auto [B, T, C, NH] :
       {AttentionShape{1, 1, 4, 1}, AttentionShape{2, 5, 12, 3}, AttentionShape{3, 37, 201, 3},
        AttentionShape{1, 70, 256, 2}, AttentionShape{2, 65, 96, 4}, AttentionShape{1, 130, 128, 1},
        AttentionShape{1, 97, 192, 3}, AttentionShape{1, 24, 48, 1}, AttentionShape{2, 256, 192, 2},
        AttentionShape{1, 64, 112, 1}}) {
    const std::string shape = AttentionShape{B, T, C, NH}.name();
    const Floats qkv = random(B * T * 3 * C, 39), dout = random(B * T * C, 40),
                 dqkv0 = random(B * T * 3 * C, 41);
    Floats want(B * T * C), att(B * NH * T * T), want_dqkv = dqkv0;
    k::attention_forward_bf16(want.data(), att.data(), qkv.data(), B, T, C, NH);
    Floats exact(B * T * C), exact_att(B * NH * T * T);
    k::attention_forward(exact.data(), exact_att.data(), qkv.data(), B, T, C, NH);
    auto d_qkv = gpu.up(qkv), d_dout = gpu.up(dout), dqkv = gpu.up(dqkv0);
    auto out = gpu.zeros<float>(B * T * C), lse = gpu.zeros<float>(B * NH * T),
         scratch = gpu.zeros<float>(B * NH * T);
    cuda::attention_forward_bf16(out.data(), lse.data(), d_qkv.data(), B, T, C, NH, gpu.stream());
    const Floats got_out = gpu.down(out);
    expect_close(got_out, want, 4e-3, "bf16 attention forward " + shape);
    expect_close(got_out, exact, 3e-2, "bf16 attention forward vs f32 " + shape);
    k::attention_backward_bf16(want_dqkv.data(), dout.data(), qkv.data(), want.data(), att.data(),
                               B, T, C, NH);
    cuda::attention_backward_bf16(dqkv.data(), d_dout.data(), d_qkv.data(), out.data(), lse.data(),
                                  B, T, C, NH, scratch.data(), gpu.stream());
    const Floats got = gpu.down(dqkv);
    Floats got_grad = got, want_grad = want_dqkv;  // (added to dqkv0: compared without it)
    for (size_t i = 0; i < got.size(); ++i) {
      got_grad[i] -= dqkv0[i];
      want_grad[i] -= dqkv0[i];
    }
    expect_close(got_grad, want_grad, 4e-3, "bf16 attention backward " + shape);
    auto again = gpu.up(dqkv0);  // deterministic: the same bits
    cuda::attention_backward_bf16(again.data(), d_dout.data(), d_qkv.data(), out.data(), lse.data(),
                                  B, T, C, NH, scratch.data(), gpu.stream());
    EXPECT_EQ(gpu.down(again), got) << shape;
  }
}

TEST(CudaKernels, FusedSoftmaxCrossEntropy) {
  SKIP_WITHOUT_GPU();
  Gpu gpu;
  for (auto [N, V] : {std::pair<size_t, size_t>{1, 1}, {1, 97}, {37, 1003}, {9, 50257}}) {
    const std::string shape = std::to_string(N) + "x" + std::to_string(V);
    Floats logits = random(N * V, 32, 4.f);
    auto targets = random_ids(N, int32_t(V), 33);
    if (V > 2) {  // a tie for the maximum: the first is the argmax (the target, then another)
      logits[V - 1] = logits[1] = 100.f;
      targets[0] = 1;
      if (N > 1) {
        logits[V + 2] = logits[V + 1] = 100.f;
        targets[1] = 2;
      }
    }
    const double scale = 1.0 / 24;
    Floats want(N * V);
    size_t right = 0;
    const double loss =
        k::softmax_cross_entropy(want.data(), logits.data(), targets.data(), N, V, scale, &right);
    std::vector<int32_t> want_correct(N);  // row by row: one row at a time on the CPU
    for (size_t r = 0; r < N; ++r) {
      size_t one = 0;
      Floats scratch(V);
      k::softmax_cross_entropy(scratch.data(), logits.data() + r * V, targets.data() + r, 1, V,
                               scale, &one);
      want_correct[r] = int32_t(one);
    }
    auto d_logits = gpu.up(logits);
    auto d_targets = gpu.up(targets);
    auto losses = gpu.zeros<double>(N), total = gpu.zeros<double>(1);
    auto correct = gpu.zeros<int32_t>(N);
    // Out of place (the logits kept), then in place: the same bits.
    auto dlogits = gpu.zeros<float>(N * V);
    cuda::softmax_cross_entropy(dlogits.data(), d_logits.data(), losses.data(), correct.data(),
                                d_targets.data(), N, V, scale, gpu.stream());
    expect_close(gpu.down(d_logits), logits, 0, "the logits, kept " + shape);
    const Floats apart = gpu.down(dlogits);
    cuda::softmax_cross_entropy(d_logits.data(), d_logits.data(), losses.data(), correct.data(),
                                d_targets.data(), N, V, scale, gpu.stream());
    cuda::sum_to_double(total.data(), losses.data(), N, gpu.stream());
    expect_close(gpu.down(d_logits), want, 1e-5, "dlogits " + shape);
    EXPECT_EQ(gpu.down(d_logits), apart) << shape;
    EXPECT_NEAR(gpu.down(total)[0], loss, 1e-6 * std::fabs(loss)) << shape;
    const auto c = gpu.down(correct);
    EXPECT_EQ(size_t(std::count(c.begin(), c.end(), 1)), right) << shape;
    EXPECT_EQ(c, want_correct) << shape;
    if (V > 2) {
      EXPECT_EQ(c[0], 1) << "a tie: the first maximum is the target";
      if (N > 1) {
        EXPECT_EQ(c[1], 0) << "a tie: the first maximum is not the target";
      }
    }
  }
}

TEST(CudaKernels, GradientNormAndOptimizersAsTheCpu) {
  SKIP_WITHOUT_GPU();
  Gpu gpu;
  const size_t n = 300007;
  const Floats p0 = random(n, 34), g = random(n, 35, 0.01f);
  Tensor params({n}), grads({n});
  std::copy(p0.begin(), p0.end(), params.data());
  std::copy(g.begin(), g.end(), grads.data());
  auto d_g = gpu.up(g);
  auto norm = gpu.zeros<double>(1), scratch = gpu.zeros<double>(cuda::norm_scratch(n));
  cuda::grad_norm_sq(norm.data(), d_g.data(), n, scratch.data(), gpu.stream());
  const double want_norm = grad_norm_sq(grads);
  EXPECT_NEAR(gpu.down(norm)[0], want_norm, 1e-6 * want_norm);

  for (const char* kind : {"adamw", "sgd"}) {
    OptimizerSpec spec;
    spec.kind = kind;
    spec.lr = 2e-3;
    spec.weight_decay = 0.1;
    Optimizer cpu(spec, {n});
    std::copy(p0.begin(), p0.end(), params.data());
    auto p = gpu.up(p0), m = gpu.zeros<float>(n), v = gpu.zeros<float>(n);
    for (uint64_t step = 0; step < 3; ++step) {
      const double grad_scale = 0.5;
      cpu.update(0, params, grads, step, grad_scale);
      if (spec.kind == "adamw") {
        const double t = double(step + 1);
        cuda::AdamWStep s{float(cpu.lr_at(step)),
                          float(spec.beta1),
                          float(spec.beta2),
                          float(spec.eps),
                          float(spec.weight_decay),
                          float(1.0 / (1.0 - std::pow(spec.beta1, t))),
                          float(1.0 / (1.0 - std::pow(spec.beta2, t))),
                          float(grad_scale)};
        cuda::adamw(p.data(), d_g.data(), m.data(), v.data(), n, s, gpu.stream());
      } else {
        cuda::sgd(p.data(), d_g.data(), m.data(), n, float(cpu.lr_at(step)), float(spec.momentum),
                  float(spec.weight_decay), float(grad_scale), gpu.stream());
      }
    }
    expect_close(gpu.down(p), Floats(params.data(), params.data() + n), 1e-5,
                 std::string(kind) + " parameters after 3 steps");
    expect_close(gpu.down(m), Floats(cpu.m(0).data(), cpu.m(0).data() + n), 1e-5,
                 std::string(kind) + " first moment");
  }
}

#ifndef TROUPE_CUDA_EMULATION  // (the driver's memory pool: on a GPU only)
TEST(CudaRuntime, ThePoolServesRepeatedAllocationsWithoutGrowing) {
  SKIP_WITHOUT_GPU();
  cuda::keep_pool_memory(0);
  Gpu gpu;
  cudaMemPool_t pool = nullptr;
  ASSERT_EQ(cudaDeviceGetDefaultMemPool(&pool, 0), cudaSuccess);
  auto reserved = [&] {
    uint64_t bytes = 0;
    EXPECT_EQ(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &bytes),
              cudaSuccess);
    return bytes;
  };
  auto step = [&] {  // two 128 MiB buffers, as a step's activations; the step ends in a sync
    {
      DeviceBuffer<float> a(size_t(32) << 20, gpu.stream()), b(size_t(32) << 20, gpu.stream());
      cuda::fill_zero(a.data(), a.bytes(), gpu.stream());
    }
    ASSERT_EQ(cudaStreamSynchronize(gpu.stream()), cudaSuccess);
  };
  step();
  const uint64_t after_first = reserved();
  for (int i = 0; i < 20; ++i) step();
  gpu.down(gpu.zeros<float>(1));  // (synchronises)
  EXPECT_EQ(reserved(), after_first) << "the pool asked the driver for more memory";
}

#endif

}  // namespace
}  // namespace troupe::models
