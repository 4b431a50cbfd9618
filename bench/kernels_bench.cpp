#include "bench/kernels_bench.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>

#include "cli/parse.h"
#include "models/compute.h"
#include "models/model.h"
#if TROUPE_HAVE_CUDA_KERNELS
#include "models/cuda/compute.h"
#endif

namespace troupe::bench {
namespace {

using models::Compute;
using models::Tensor;

struct Options {
  std::string device = "cpu";
  size_t B = 0, T = 0, C = 768, NH = 12, V = 50304, params = 0;
  int threads = 1;
  bool bf16 = false, json = false;
  double bandwidth_gbs = 0, tflops = 0;  // the device's limits (0: unknown)
};

struct Row {
  std::string kernel;
  double us = 0, bytes = 0, flops = 0;  // bytes moved at least, or FLOPs (the other 0)
  double of_limit = 0;                  // 0: the limit is unknown
};

// The median over 7 batches of 10 calls (3 first untimed), each batch ended by a
// synchronisation: on a GPU the launches queue and the batch's end waits for them.
double median_us(Compute& c, const std::function<void()>& run) {
  for (int i = 0; i < 3; ++i) run();
  c.synchronize();
  std::vector<double> us;
  for (int b = 0; b < 7; ++b) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 10; ++i) run();
    c.synchronize();
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
        10);
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

// Normal values (their magnitudes with `positive`: a second moment), moved to c's device.
Tensor filled(Compute& c, size_t n, float scale = 1.f, bool positive = false) {
  Tensor host({n});
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.f, scale);
  for (size_t i = 0; i < n; ++i) host.data()[i] = positive ? std::abs(d(rng)) : d(rng);
  return c.on_device(host);
}

class Table {
 public:
  Table(const Options& o, Compute& c) : o_(o), c_(c) {}
  void memory(const std::string& name, double bytes, const std::function<void()>& run) {
    const double us = median_us(c_, run);
    const double limit = o_.bandwidth_gbs * 1e9;
    rows_.push_back({name, us, bytes, 0, limit > 0 ? bytes / (us * 1e-6) / limit : 0});
  }
  void flops(const std::string& name, double flops, const std::function<void()>& run) {
    const double us = median_us(c_, run);
    const double limit = o_.tflops * 1e12;
    rows_.push_back({name, us, 0, flops, limit > 0 ? flops / (us * 1e-6) / limit : 0});
  }
  void print() const;

 private:
  const Options& o_;
  Compute& c_;
  std::vector<Row> rows_;
};

void Table::print() const {
  if (o_.json) {
    std::printf("[");
    for (size_t i = 0; i < rows_.size(); ++i) {
      const Row& r = rows_[i];
      std::printf(
          "%s{\"kernel\":\"%s\",\"us\":%.2f,\"bytes\":%.0f,\"flops\":%.0f,\"of_limit\":%.4f}",
          i ? "," : "", r.kernel.c_str(), r.us, r.bytes, r.flops, r.of_limit);
    }
    std::printf("]\n");
    return;
  }
  std::printf("device: %s\n| kernel | us | GB/s or GFLOP/s | of the limit |\n|---|---|---|---|\n",
              c_.describe().c_str());
  for (const Row& r : rows_) {
    const double rate = r.bytes > 0 ? r.bytes / (r.us * 1e-6) / 1e9 : r.flops / (r.us * 1e-6) / 1e9;
    char limit[16] = "-";
    if (r.of_limit > 0) std::snprintf(limit, sizeof limit, "%.0f%%", 100 * r.of_limit);
    std::printf("| %s | %.1f | %.1f %s | %s |\n", r.kernel.c_str(), r.us, rate,
                r.bytes > 0 ? "GB/s" : "GFLOP/s", limit);
  }
}

// Each row as bench/peers/torch_kernels.py names it (compare_kernels.sh joins on the names).
void run_rows(const Options& o, Compute& c) {
  const size_t N = o.B * o.T, C = o.C, n = N * C, n4 = 4 * n;
  Table t(o, c);
  Tensor x = filled(c, n4), y = filled(c, n4), dy = filled(c, n4);
  t.memory("copy (N x 4C)", 2.0 * n4 * 4, [&] { c.copy(y.data(), x.data(), n4 * 4); });
  t.memory("gelu forward (N x 4C)", 2.0 * n4 * 4, [&] { c.gelu_forward(y.data(), x.data(), n4); });
  t.memory("gelu backward (N x 4C)", 4.0 * n4 * 4,
           [&] { c.gelu_backward(y.data(), dy.data(), x.data(), n4); });
  Tensor w = filled(c, C), b = filled(c, C), mean = filled(c, N), rstd = filled(c, N);
  Tensor dw = filled(c, C), db = filled(c, C);
  t.memory("layernorm forward (N x C)", 2.0 * n * 4, [&] {
    c.layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  });
  t.memory("layernorm backward (N x C)", 4.0 * n * 4, [&] {
    c.layernorm_backward(y.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(),
                         rstd.data(), N, C);
  });
  // Causal: half of QK^T and of PV, 2 * 2 * B * NH * T * T * hs / 2 forward.
  const double att_flops = 2.0 * double(o.B * o.NH) * double(o.T) * double(o.T) * double(C / o.NH);
  Tensor qkv = filled(c, 3 * n), dqkv = filled(c, 3 * n);
  Tensor saved = c.tensor({c.attention_saved(o.B, o.T, o.NH)});
  // (With --bf16 on tensor cores: models/cuda/kernels.h attention_forward_bf16.)
  const std::string bf16 = o.bf16 ? " bf16" : "";
  t.flops("attention forward (causal)" + bf16, att_flops,
          [&] { c.attention_forward(y.data(), saved.data(), qkv.data(), o.B, o.T, C, o.NH); });
  t.flops("attention backward (causal)" + bf16, 2.5 * att_flops, [&] {
    c.attention_backward(dqkv.data(), dy.data(), qkv.data(), y.data(), saved.data(), o.B, o.T, C,
                         o.NH);
  });
  Tensor wfc = filled(c, 4 * C * C, 0.02f), bfc = filled(c, 4 * C), dwfc = filled(c, 4 * C * C);
  const double fc_flops = 2.0 * double(N) * double(C) * double(4 * C);
  t.flops("linear C -> 4C forward" + bf16, fc_flops,
          [&] { c.linear_forward(y.data(), x.data(), wfc.data(), bfc.data(), N, C, 4 * C); });
  t.flops("linear C -> 4C backward", 2 * fc_flops, [&] {
    c.linear_backward(x.data(), dwfc.data(), bfc.data(), dy.data(), x.data(), wfc.data(), N, C,
                      4 * C);
  });
  {
    Tensor logits = filled(c, N * o.V), dlogits = c.tensor({N * o.V});
    std::vector<int32_t> targets(N);
    for (size_t i = 0; i < N; ++i) targets[i] = int32_t(i * 7919 % o.V);
    t.memory("softmax cross-entropy (N x V)", 3.0 * double(N * o.V) * 4, [&] {
      c.cross_entropy(dlogits.data(), logits.data(), targets.data(), N, o.V, 1.0 / double(N),
                      nullptr);
    });
  }
  Tensor p = filled(c, o.params), g = filled(c, o.params, 1e-3f), m = filled(c, o.params);
  Tensor v = filled(c, o.params, 1e-6f, true);
  const std::string P = std::to_string(o.params / 1000000) + "M";
  t.memory("gradient norm (" + P + ")", 4.0 * double(o.params),
           [&] { c.grad_norm_sq(g.data(), o.params); });
  const models::AdamWStep step{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.1f, 1.01f, 1.f};
  t.memory("AdamW (" + P + ", p g m v)", 7.0 * 4 * double(o.params),
           [&] { c.adamw(p.data(), g.data(), m.data(), v.data(), o.params, step); });
  t.print();
}

// The Compute for --device; throws std::invalid_argument when this build or machine has none.
std::unique_ptr<Compute> open_device(const Options& o) {
  if (o.device == "cpu") return nullptr;  // (cpu_compute() or cpu_bf16_compute(): not owned)
#if TROUPE_HAVE_CUDA_KERNELS
  const int ordinal = o.device.size() > 5 ? std::stoi(o.device.substr(5)) : 0;
  if (models::cuda::device_count() <= ordinal)
    throw std::invalid_argument("no " + o.device + ": " + models::cuda::describe(ordinal));
  return std::make_unique<models::cuda::CudaCompute>(
      ordinal, o.bf16 ? models::cuda::GemmInput::bf16 : models::cuda::GemmInput::f32);
#else
  throw std::logic_error("unreachable: CUDA devices run in troupe_cuda_kernels_bench");
#endif
}

#if !TROUPE_HAVE_CUDA_KERNELS
// troupe itself does not load cuBLAS (0.15 s at every start warm, 1.3 s cold, for every agent
// and command): a CUDA device's kernels are timed by troupe_cuda_kernels_bench, beside it.
int run_in_cuda_binary(const std::vector<std::string>& words) {
#if TROUPE_CUDA_KERNELS_BUILT
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  std::string path = n > 0 ? std::string(self, size_t(n)) : std::string();
  path = path.substr(0, path.rfind('/') + 1) + "troupe_cuda_kernels_bench";
  if (::access(path.c_str(), X_OK) != 0) {
    std::fprintf(stderr,
                 "troupe bench kernels: a CUDA device's kernels are timed by %s, which is not "
                 "built (cmake --build build --target troupe_cuda_kernels_bench, or "
                 "scripts/gpu-bundle.sh)\n",
                 path.c_str());
    return 2;
  }
  std::vector<char*> argv{path.data()};
  std::vector<std::string> args = words;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execv(path.c_str(), argv.data());
  std::fprintf(stderr, "troupe bench kernels: cannot run %s\n", path.c_str());
  return 1;
#else
  (void)words;
  std::fprintf(stderr,
               "troupe bench kernels: this build has no CUDA kernels (nvcc was not "
               "found when it was configured)\n");
  return 2;
#endif
}
#endif

}  // namespace

int run_kernels_bench(const std::vector<std::string>& words, const std::string& default_device) {
  CLI::App app{"Each kernel of a device at a GPT's shapes, with its bandwidth or FLOP rate.",
               "troupe bench kernels"};
  Options o;
  o.device = default_device;
  app.add_option("--device", o.device, "cpu, cuda or cuda:N")
      ->check([](const std::string& d) -> std::string {
        const bool ok = d == "cpu" || d == "cuda" ||
                        (d.rfind("cuda:", 0) == 0 && d.size() > 5 &&
                         d.find_first_not_of("0123456789", 5) == std::string::npos);
        return ok ? "" : "not cpu, cuda or cuda:N";
      });
  app.add_option("--batch", o.B, "B (default: 8 on CUDA, 4 on the CPU)");
  app.add_option("--context", o.T, "T (default: 1024 on CUDA, 256 on the CPU)");
  app.add_option("--d-model", o.C, "C")->check(cli::kPositive);
  app.add_option("--heads", o.NH, "NH (dividing C)")->check(cli::kPositive);
  app.add_option("--vocab", o.V, "V")->check(cli::kPositive);
  app.add_option("--params", o.params,
                 "the optimizer's and the norm's size (default: 124M "
                 "on CUDA, 10M on the CPU)");
  app.add_option("--threads", o.threads, "CPU compute threads")->check(cli::kPositive);
  app.add_flag("--bf16", o.bf16, "bf16 GEMM inputs (model.dtype = \"bf16\"; on the CPU emulated)");
  app.add_option("--bandwidth-gbs", o.bandwidth_gbs,
                 "the device's memory bandwidth, GB/s "
                 "(default: 4,800 on CUDA, an H200's)");
  app.add_option("--tflops", o.tflops,
                 "the device's dense peak for the GEMMs' precision, "
                 "TFLOP/s (default on CUDA: 67 f32, 790 bf16)");
  app.add_flag("--json", o.json, "one JSON array instead of the table");
  if (auto rc = cli::parse(app, words)) return *rc;
  const bool gpu = o.device != "cpu";
#if !TROUPE_HAVE_CUDA_KERNELS
  if (gpu) return run_in_cuda_binary(words);
#endif
  if (o.B == 0) o.B = gpu ? 8 : 4;
  if (o.T == 0) o.T = gpu ? 1024 : 256;
  if (o.params == 0) o.params = gpu ? 124'000'000 : 10'000'000;
  if (gpu && o.bandwidth_gbs == 0) o.bandwidth_gbs = 4800;
  if (gpu && o.tflops == 0) o.tflops = o.bf16 ? 790 : 67;
  if (o.C % o.NH != 0) {
    std::fprintf(stderr, "troupe bench kernels: --heads %zu does not divide --d-model %zu\n", o.NH,
                 o.C);
    return 2;
  }
  try {
    models::set_compute_threads(o.threads);
    std::unique_ptr<Compute> device = open_device(o);
    run_rows(o, device ? *device : o.bf16 ? models::cpu_bf16_compute() : models::cpu_compute());
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "troupe bench kernels: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "troupe bench kernels: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace troupe::bench
