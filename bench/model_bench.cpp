// `troupe bench model`: single-process training throughput of the two reference models, the
// same ones bench/peers/torch_models.py builds in PyTorch:
//   mlp: 784-1024-1024-10 (ReLU) on the synthetic set, batch 256, SGD  -> samples/s
//   gpt: 4 layers, d_model 128, 4 heads, context 64, GPL-3 text, batch 32, AdamW -> tokens/s
//   gpt2: the GPT-2 small shape (12 layers, d_model 768, 12 heads, context 1024, vocabulary
//         50304, tied head), batch 16, AdamW -> tokens/s; bench/peers/torch_gpt2.py is its PyTorch
//         peer
// on any device (--device cpu | cuda:N, --dtype f32 | bf16), with the model FLOP/s and the MFU
// of the device's peak (models/peak.h), named.
#include <chrono>
#include <cstdio>

#include "bench/bench.h"
#include "cli/parse.h"
#include "models/blas_kernels.h"
#include "models/data.h"
#include "models/devices.h"
#include "models/peak.h"
#include "models/trainer.h"

namespace troupe::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Setup {
  models::ModelSpec spec;
  std::unique_ptr<models::Dataset> data;
  models::OptimizerSpec opt;
  size_t batch = 0;
  size_t tokens_per_sample = 1;
};

Setup preset(const std::string& name, const std::string& text_path) {
  Setup s;
  if (name == "mlp") {
    s.spec.kind = "mlp";
    s.spec.mlp_sizes = {784, 1024, 1024, 10};
    s.data = std::make_unique<models::SyntheticClassification>(1, 60000, 784, 10);
    s.opt.kind = "sgd";
    s.opt.lr = 0.01;
    s.batch = 256;
  } else if (name == "gpt") {
    auto text = std::make_unique<models::CharText>(text_path, 64);
    s.spec.kind = "gpt";
    s.spec.vocab = text->vocab();
    s.spec.context = 64;
    s.spec.d_model = 128;
    s.spec.heads = 4;
    s.spec.layers = 4;
    s.data = std::move(text);
    s.opt.kind = "adamw";
    s.opt.lr = 1e-3;
    s.opt.weight_decay = 0.01;
    s.batch = 32;
    s.tokens_per_sample = 64;
  } else if (name == "gpt2") {
    auto text = std::make_unique<models::CharText>(text_path, 1024);
    s.spec.kind = "gpt";
    s.spec.vocab = 50304;  // GPT-2's 50257 padded to a multiple of 128 (the text uses the first)
    s.spec.context = 1024;
    s.spec.d_model = 768;
    s.spec.heads = 12;
    s.spec.layers = 12;
    s.spec.tied_head = true;  // (as GPT-2: 124M parameters)
    s.data = std::move(text);
    s.opt.kind = "adamw";
    s.opt.lr = 3e-4;
    s.opt.weight_decay = 0.1;
    s.opt.clip_norm = 1.0;
    s.batch = 16;
    s.tokens_per_sample = 1024;
  } else {
    throw std::invalid_argument("--model must be mlp, gpt or gpt2, got '" + name + "'");
  }
  return s;
}

}  // namespace

int run_model_bench(const std::vector<std::string>& words) {
  CLI::App app{"Single-process training throughput of the reference models.", "troupe bench model"};
  std::string name = "gpt", data_path = models::kDefaultTextPath, device = "cpu", dtype = "f32";
  int steps = 50, warmup = 5, threads = 1;
  size_t batch = 0;
  uint64_t seed = 0;
  bool json = false, curve = false;
  app.add_option("--model", name, "mlp, gpt or gpt2")->check(CLI::IsMember({"mlp", "gpt", "gpt2"}));
  app.add_option("--device", device, "cpu or cuda:N");
  app.add_option("--dtype", dtype, "f32 or bf16 (model.dtype)")
      ->check(CLI::IsMember({"f32", "bf16"}));
  app.add_option("--batch", batch, "samples a step (default: the model's)")->check(cli::kPositive);
  app.add_option("--steps", steps, "timed steps")->check(cli::kPositive);
  app.add_option("--warmup", warmup, "untimed steps first")->check(cli::kNonNegative);
  app.add_option("--threads", threads, "compute threads")->check(cli::kPositive);
  app.add_option("--data-path", data_path, "the text the gpt (or gpt2) trains on");
  app.add_option("--seed", seed, "initialisation seed");
  app.add_flag("--json", json, "one JSON line");
  app.add_flag("--curve", curve, "the loss every 20 steps on stderr");
  if (auto rc = cli::parse(app, words)) return *rc;
  if (name == "mlp" && app.count("--data-path"))  // (it was taken, and not read)
    throw std::invalid_argument("--data-path: the mlp trains on synthetic samples, not a text");
  models::set_compute_threads(threads);
  Setup s = preset(name, data_path);
  if (batch > 0) s.batch = batch;
  // (The CPU in f32 is cpu_compute(), where a model starts: nothing moves.)
  std::shared_ptr<models::Compute> compute;
  try {
    compute = models::open_compute(device, dtype == "bf16");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "troupe bench model: %s\n", e.what());
    return 2;
  }
  models::Model model(s.spec);
  model.init(seed);
  const std::vector<size_t> counts = model.block_param_counts();
  models::Optimizer opt(s.opt, counts);
  model.to(*compute);
  opt.to(*compute);
  models::Trainer trainer(model, opt, *s.data, 1234, s.batch, s.batch);
  Clock::time_point t0;
  double first_loss = 0, last_loss = 0;
  for (int i = 0; i < warmup + steps; ++i) {
    if (i == warmup) t0 = Clock::now();
    auto st = trainer.step(uint64_t(i));
    if (i == 0) first_loss = st.loss;
    last_loss = st.loss;
    if (curve && (i % 20 == 0 || i + 1 == warmup + steps))
      std::fprintf(stderr, "step %d loss %.4f\n", i, st.loss);
  }
  compute->synchronize();
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  double samples_per_s = double(steps) * double(s.batch) / secs;
  double tokens_per_s = samples_per_s * double(s.tokens_per_sample);
  double gflops = model.flops_per_sample() * samples_per_s / 1e9;
  const models::Peak peak = compute->peak(threads);
  const double mfu = peak.flops > 0 ? gflops * 1e9 / peak.flops : 0;
  const std::string core = models::loaded_blas_core();
  const std::string features = models::describe(models::cpu_features());
  if (json) {
    std::printf(
        "{\"bench\":\"model\",\"impl\":\"troupe\",\"model\":\"%s\",\"threads\":%d,\"batch\":%zu,"
        "\"params\":%zu,\"steps\":%d,\"samples_per_s\":%.1f,\"tokens_per_s\":%.1f,\"gflops\":%.2f,"
        "\"first_loss\":%.4f,\"last_loss\":%.4f,\"blas\":\"openblas\",\"blas_core\":\"%s\","
        "\"cpu_features\":\"%s\",\"device\":\"%s\",\"dtype\":\"%s\",\"mfu\":%.4f,"
        "\"peak_tflops\":%.3f,\"peak\":\"%s\"}\n",
        name.c_str(), threads, s.batch, model.param_count(), steps, samples_per_s, tokens_per_s,
        gflops, first_loss, last_loss, core.c_str(), features.c_str(), compute->describe().c_str(),
        dtype.c_str(), mfu, peak.flops / 1e12, peak.what.c_str());
  } else {
    std::printf("BLAS: %s\n", models::blas_summary().c_str());
    std::printf("%s: %zu parameters, batch %zu, %d threads, %d steps\n", name.c_str(),
                model.param_count(), s.batch, threads, steps);
    std::printf("  %.1f samples/s, %.1f tokens/s, %.2f GFLOP/s; loss %.4f -> %.4f\n", samples_per_s,
                tokens_per_s, gflops, first_loss, last_loss);
    std::printf("  on %s: MFU %.1f%% of %s\n", compute->describe().c_str(), 100 * mfu,
                peak.what.c_str());
  }
  return 0;
}

}  // namespace troupe::bench
