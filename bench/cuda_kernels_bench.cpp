// troupe_cuda_kernels_bench: each CUDA kernel of models/cuda/ at GPT-2 small's shapes (B x T =
// 8 x 1024 rows, C 768, 12 heads, vocabulary 50,304), timed with CUDA events (median of 20 after
// 3 warm-ups), with the bytes or FLOPs it must move and the fraction of the device's limit:
// HBM bandwidth (--bandwidth-gbs, H200: 4,800) or the dense peak (--tflops-f32, --tflops-bf16;
// 790 bf16 was measured on that machine). bench/peers/torch_kernels.py times PyTorch on the same
// shapes; scripts/gpu-check.sh prints both. Without a GPU: exits 2 saying so.
//
// Usage: troupe_cuda_kernels_bench [--json] [--bandwidth-gbs G] [--tflops-f32 F] [--tflops-bf16 F]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "models/cuda/gemm.h"
#include "models/cuda/kernels.h"
#include "models/cuda/runtime.h"

namespace cuda = troupe::models::cuda;

namespace {

struct Options {
  size_t B = 8, T = 1024, C = 768, NH = 12, V = 50304;
  double bandwidth_gbs = 4800, tflops_f32 = 67, tflops_bf16 = 790;
  bool json = false;
};

struct Row {
  std::string kernel;
  double us;
  double bytes;  // moved at least (0: FLOP-bound, see flops)
  double flops;
  double limit_fraction;
};

double median_us(const std::function<void()>& run, cudaStream_t stream) {
  cudaEvent_t a, b;
  TROUPE_CUDA_CHECK(cudaEventCreate(&a));
  TROUPE_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) run();
  std::vector<double> us;
  for (int i = 0; i < 20; ++i) {
    TROUPE_CUDA_CHECK(cudaEventRecord(a, stream));
    run();
    TROUPE_CUDA_CHECK(cudaEventRecord(b, stream));
    TROUPE_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    TROUPE_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    us.push_back(double(ms) * 1e3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

cuda::DeviceBuffer<float> filled(size_t n, cudaStream_t stream, float scale = 1.f) {
  std::vector<float> host(n);
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.f, scale);
  for (auto& x : host) x = d(rng);
  cuda::DeviceBuffer<float> buf(n, stream);
  cuda::copy_to_device(buf.data(), host.data(), n * sizeof(float), stream);
  return buf;
}

class Bench {
 public:
  Bench(const Options& o, cudaStream_t s) : o_(o), s_(s) {}
  void memory(const std::string& name, double bytes, const std::function<void()>& run) {
    const double us = median_us(run, s_);
    rows_.push_back({name, us, bytes, 0, bytes / (us * 1e-6) / (o_.bandwidth_gbs * 1e9)});
  }
  void compute(const std::string& name, double flops, double peak_tflops,
               const std::function<void()>& run) {
    const double us = median_us(run, s_);
    rows_.push_back({name, us, 0, flops, flops / (us * 1e-6) / (peak_tflops * 1e12)});
  }
  void print() const;

 private:
  const Options& o_;
  cudaStream_t s_;
  std::vector<Row> rows_;
};

void Bench::print() const {
  if (o_.json) {
    std::printf("[");
    for (size_t i = 0; i < rows_.size(); ++i)
      std::printf(
          "%s{\"kernel\":\"%s\",\"us\":%.2f,\"bytes\":%.0f,\"flops\":%.0f,\"of_limit\":%.4f}",
          i ? "," : "", rows_[i].kernel.c_str(), rows_[i].us, rows_[i].bytes, rows_[i].flops,
          rows_[i].limit_fraction);
    std::printf("]\n");
    return;
  }
  std::printf("| kernel | us | GB/s or TFLOP/s | of the limit |\n|---|---|---|---|\n");
  for (const auto& r : rows_) {
    const double rate =
        r.bytes > 0 ? r.bytes / (r.us * 1e-6) / 1e9 : r.flops / (r.us * 1e-6) / 1e12;
    std::printf("| %s | %.1f | %.1f %s | %.0f%% |\n", r.kernel.c_str(), r.us, rate,
                r.bytes > 0 ? "GB/s" : "TFLOP/s", 100 * r.limit_fraction);
  }
}

void run_all(const Options& o, cudaStream_t s) {
  const size_t N = o.B * o.T, C = o.C, n = N * C, n4 = 4 * n;
  Bench bench(o, s);
  auto x = filled(n4, s), y = filled(n4, s), dy = filled(n4, s);
  bench.memory("gelu forward (N x 4C)", 2.0 * n4 * 4,
               [&] { cuda::gelu_forward(y.data(), x.data(), n4, s); });
  bench.memory("gelu backward (N x 4C)", 4.0 * n4 * 4,
               [&] { cuda::gelu_backward(y.data(), dy.data(), x.data(), n4, s); });
  auto w = filled(C, s), b = filled(C, s), mean = filled(N, s), rstd = filled(N, s);
  auto sum = filled(n, s), dw = filled(C, s), db = filled(C, s);
  auto scratch = filled(cuda::layernorm_scratch(N, C), s);
  bench.memory("layernorm + residual forward", 4.0 * n * 4, [&] {
    cuda::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                            s, dy.data(), sum.data());
  });
  bench.memory("layernorm backward", 4.0 * n * 4, [&] {
    cuda::layernorm_backward(y.data(), dw.data(), db.data(), dy.data(), sum.data(), w.data(),
                             mean.data(), rstd.data(), N, C, scratch.data(), s);
  });
  // Attention: causal, so half of QK^T and of PV: 2 * 2 * B * NH * T * T * hs / 2 forward.
  const double att_flops = 2.0 * o.B * o.NH * double(o.T) * double(o.T) * double(C / o.NH);
  auto qkv = filled(3 * n, s), att = filled(n, s), lse = filled(o.B * o.NH * o.T, s);
  auto dqkv = filled(3 * n, s), d_scratch = filled(o.B * o.NH * o.T, s);
  bench.compute("attention forward (fused)", att_flops, o.tflops_f32, [&] {
    cuda::attention_forward(att.data(), lse.data(), qkv.data(), o.B, o.T, C, o.NH, s);
  });
  bench.compute("attention backward (fused)", 2.5 * att_flops, o.tflops_f32, [&] {
    cuda::attention_backward(dqkv.data(), dy.data(), qkv.data(), att.data(), lse.data(), o.B, o.T,
                             C, o.NH, d_scratch.data(), s);
  });
  cuda::Gemm gemm(s);
  auto wfc = filled(4 * C * C, s, 0.02f), bfc = filled(4 * C, s);
  const double fc_flops = 2.0 * N * C * 4 * C;
  bench.compute("linear C -> 4C f32 (cuBLASLt)", fc_flops, o.tflops_f32, [&] {
    gemm.linear_forward(y.data(), x.data(), wfc.data(), bfc.data(), N, C, 4 * C);
  });
  cuda::DeviceBuffer<uint16_t> x16(n, s), w16(4 * C * C, s);
  cuda::to_bf16(x16.data(), x.data(), n, s);
  cuda::to_bf16(w16.data(), wfc.data(), 4 * C * C, s);
  bench.compute("linear C -> 4C bf16 (cuBLASLt)", fc_flops, o.tflops_bf16, [&] {
    gemm.linear_forward_bf16(y.data(), x16.data(), w16.data(), bfc.data(), N, C, 4 * C);
  });
  {
    auto logits = filled(N * o.V, s);
    cuda::DeviceBuffer<double> losses(N, s);
    cuda::DeviceBuffer<int32_t> correct(N, s), targets(N, s);
    cuda::fill_zero(targets.data(), N * sizeof(int32_t), s);
    bench.memory("softmax cross-entropy (N x V, in place)", 3.0 * N * o.V * 4, [&] {
      cuda::softmax_cross_entropy(logits.data(), losses.data(), correct.data(), targets.data(), N,
                                  o.V, 1.0 / double(N), s);
    });
  }
  const size_t params = 124'000'000;
  auto p = filled(params, s), g = filled(params, s, 1e-3f), m = filled(params, s),
       v = filled(params, s, 1e-3f);
  cuda::DeviceBuffer<double> norm(1, s), norm_scratch(cuda::norm_scratch(params), s);
  bench.memory("gradient norm (124M)", 4.0 * params,
               [&] { cuda::grad_norm_sq(norm.data(), g.data(), params, norm_scratch.data(), s); });
  const cuda::AdamWStep step{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.1f, 1.01f, 1.f};
  bench.memory("AdamW (124M, p g m v)", 7.0 * 4 * params,
               [&] { cuda::adamw(p.data(), g.data(), m.data(), v.data(), params, step, s); });
  bench.print();
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Times each CUDA kernel of models/cuda/ at GPT-2 small's shapes."};
  app.add_flag("--json", o.json, "one JSON array instead of the table");
  app.add_option("--bandwidth-gbs", o.bandwidth_gbs, "the device's memory bandwidth (GB/s)");
  app.add_option("--tflops-f32", o.tflops_f32, "the device's dense f32 peak (TFLOP/s)");
  app.add_option("--tflops-bf16", o.tflops_bf16, "the device's dense bf16 peak (TFLOP/s)");
  CLI11_PARSE(app, argc, argv);
  if (cuda::device_count() == 0) {
    std::fprintf(stderr, "troupe_cuda_kernels_bench: %s\n", cuda::describe(0).c_str());
    return 2;
  }
  try {
    cuda::keep_pool_memory(0);
    cuda::Stream stream;
    std::printf("device: %s\n", cuda::describe(0).c_str());
    run_all(o, stream.get());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "troupe_cuda_kernels_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
