// `troupe bench drift`: how far two runs of the same job drift apart when the only difference is
// the order in which the global batch's gradient is summed — what a change of world size does.
//   A: one worker: the micro-batches accumulated one after the other into one gradient buffer;
//   B: the batch in `--shards` shares, each computed alone, the shares' gradients added in
//      reverse order (as an allreduce over that many workers adds them in its own order).
// Everything else (data, initialisation, optimizer) is the same, in one process. It prints the
// loss difference and the parameters' relative L2 difference over the steps, and the parameter
// tensors that drifted most. With --dump DIR it writes the initial parameters (safetensors, the
// PyTorch twin's names), every step's tokens and both loss curves, so that
// bench/peers/torch_drift.py runs the same experiment in PyTorch from the same start.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bench/bench.h"
#include "cli/parse.h"
#include "models/data.h"
#include "models/safetensors.h"
#include "models/trainer.h"

namespace troupe::bench {
namespace {

struct Run {
  models::Model model;
  models::Optimizer opt;
  models::Trainer trainer;
  Run(const models::ModelSpec& spec, const models::OptimizerSpec& o, const models::Dataset& data,
      size_t batch, size_t micro, uint64_t seed)
      : model(spec), opt(o, counts(model)), trainer(model, opt, data, seed + 1234, batch, micro) {
    model.init(seed);
  }
  static std::vector<size_t> counts(models::Model& m) { return m.block_param_counts(); }
  double norm_sq() {
    double s = 0;
    for (size_t b = 0; b < model.num_blocks(); ++b)
      s += models::grad_norm_sq(model.block(b).grads());
    return s;
  }
};

// One step of B: each share alone, the shares' gradients added last share first.
double sharded_step(Run& r, uint64_t step, size_t batch, size_t shards) {
  const size_t nb = r.model.num_blocks(), per = batch / shards;
  std::vector<std::vector<std::vector<float>>> g(shards, std::vector<std::vector<float>>(nb));
  double loss = 0;
  for (size_t k = 0; k < shards; ++k) {
    loss += r.trainer.forward_backward(step, k * per, k + 1 == shards ? batch : (k + 1) * per).loss;
    for (size_t b = 0; b < nb; ++b) {
      const auto& t = r.model.block(b).grads();
      g[k][b].assign(t.data(), t.data() + t.numel());
    }
  }
  for (size_t b = 0; b < nb; ++b) {
    float* out = r.model.block(b).grads().data();
    const size_t n = g[0][b].size();
    for (size_t i = 0; i < n; ++i) {
      float s = g[shards - 1][b][i];
      for (size_t k = shards - 1; k-- > 0;) s += g[k][b][i];
      out[i] = s;
    }
  }
  models::StepStats st;
  r.trainer.apply(step, r.norm_sq(), st);
  return loss;
}

struct Drift {
  double rel_l2 = 0;
  std::string worst;
  double worst_rel = 0;
};

Drift compare(models::Model& a, models::Model& b) {
  Drift d;
  double diff = 0, norm = 0;
  for (const auto& p : a.parameters()) {
    const float* x = a.block(p.block).params().data() + p.offset;
    const float* y = b.block(p.block).params().data() + p.offset;
    size_t n = 1;
    for (size_t s : p.shape) n *= s;
    double dd = 0, nn = 0;
    for (size_t i = 0; i < n; ++i) {
      dd += double(x[i] - y[i]) * double(x[i] - y[i]);
      nn += double(x[i]) * double(x[i]);
    }
    diff += dd, norm += nn;
    double rel = nn > 0 ? std::sqrt(dd / nn) : std::sqrt(dd);
    if (rel > d.worst_rel) d.worst_rel = rel, d.worst = p.name;
  }
  d.rel_l2 = norm > 0 ? std::sqrt(diff / norm) : 0;
  return d;
}

// The parameters as they are now (call it before the first step), with the twin's names.
void dump_init(const std::string& dir, models::Model& m) {
  std::vector<models::safetensors::Tensor> ts;
  for (const auto& p : m.parameters()) {
    size_t n = 1;
    for (size_t s : p.shape) n *= s;
    const char* at = reinterpret_cast<const char*>(m.block(p.block).params().data() + p.offset);
    ts.push_back({p.name, "F32", p.shape, std::vector<char>(at, at + n * 4)});
  }
  models::safetensors::write(dir + "/init.safetensors", ts);
}

// Every step's tokens as the sampler hands them out, the experiment's settings and both curves.
void dump_run(const std::string& dir, Run& r, const models::ModelSpec& spec,
              const models::OptimizerSpec& o, int steps, size_t batch, size_t micro, size_t shards,
              const std::vector<double>& la, const std::vector<double>& lb,
              const std::vector<double>& rel) {
  std::vector<int32_t> in, tg;
  for (int s = 0; s < steps; ++s) {
    auto b = r.trainer.batch(uint64_t(s), 0, batch);
    for (size_t i = 0; i < b.inputs.numel(); ++i) in.push_back(int32_t(b.inputs.data()[i]));
    tg.insert(tg.end(), b.targets.begin(), b.targets.end());
  }
  auto bytes = [](const std::vector<int32_t>& v) {
    const char* p = reinterpret_cast<const char*>(v.data());
    return std::vector<char>(p, p + v.size() * 4);
  };
  const std::vector<size_t> shape{size_t(steps), batch, spec.context};
  models::safetensors::write(dir + "/batches.safetensors", {{"inputs", "I32", shape, bytes(in)},
                                                            {"targets", "I32", shape, bytes(tg)}});
  nlohmann::json j = {{"layers", spec.layers},  {"d_model", spec.d_model},
                      {"heads", spec.heads},    {"context", spec.context},
                      {"vocab", spec.vocab},    {"batch", batch},
                      {"micro", micro},         {"shards", shards},
                      {"optimizer", o.kind},    {"lr", o.lr},
                      {"momentum", o.momentum}, {"weight_decay", o.weight_decay},
                      {"beta1", o.beta1},       {"beta2", o.beta2},
                      {"eps", o.eps},           {"steps", steps},
                      {"loss_a", la},           {"loss_b", lb},
                      {"param_rel", rel}};
  std::ofstream(dir + "/troupe.json") << j.dump() << "\n";
}

}  // namespace

int run_drift_bench(const std::vector<std::string>& words) {
  CLI::App app{"How far two runs drift apart when only the gradient's summation order differs.",
               "troupe bench drift"};
  models::ModelSpec spec;
  spec.kind = "gpt", spec.layers = 3, spec.d_model = 96, spec.heads = 3, spec.context = 32;
  models::OptimizerSpec o;
  o.lr = 2e-3;
  size_t batch = 24, micro = 8, shards = 3;
  int steps = 400, every = 50;
  uint64_t seed = 0;
  std::string dir, data_path = models::kDefaultTextPath;
  bool json = false;
  app.add_option("--optimizer", o.kind, "adamw or sgd")->check(CLI::IsMember({"adamw", "sgd"}));
  app.add_option("--lr", o.lr, "learning rate")->check(cli::kPositive);
  app.add_option("--eps", o.eps, "AdamW's epsilon")->check(cli::kPositive);
  app.add_option("--weight-decay", o.weight_decay, "weight decay");
  app.add_option("--steps", steps, "steps")->check(cli::kPositive);
  app.add_option("--every", every, "print every N steps")->check(cli::kPositive);
  app.add_option("--layers", spec.layers, "transformer layers")->check(cli::kPositive);
  app.add_option("--d-model", spec.d_model, "model width")->check(cli::kPositive);
  app.add_option("--heads", spec.heads, "attention heads")->check(cli::kPositive);
  app.add_option("--context", spec.context, "tokens per sample")->check(cli::kPositive);
  app.add_option("--batch", batch, "global batch")->check(cli::kPositive);
  app.add_option("--micro", micro, "micro-batch of run A")->check(cli::kPositive);
  app.add_option("--shards", shards, "shares of run B")->check(cli::kPositive);
  app.add_option("--seed", seed, "initialisation seed (the data order's is seed + 1234)");
  app.add_option("--data-path", data_path, "the text the gpt trains on");
  app.add_option("--dump", dir, "write init, tokens and losses here for torch_drift.py");
  app.add_flag("--json", json, "one JSON line per printed step");
  if (auto rc = cli::parse(app, words)) return *rc;
  if (batch % shards != 0) {
    std::fprintf(stderr, "troupe bench drift: --batch %zu is not a multiple of --shards %zu\n",
                 batch, shards);
    return 2;
  }
  models::set_compute_threads(1);
  models::CharText data(data_path, spec.context);
  spec.vocab = data.vocab();
  Run a(spec, o, data, batch, micro, seed), b(spec, o, data, batch, batch / shards, seed);
  if (!dir.empty()) dump_init(dir, a.model);
  std::vector<double> la, lb, rel;
  int first_diff = -1;
  if (!json)
    std::printf("%6s %14s %14s %12s  %s\n", "step", "loss A", "|A - B|", "params rel",
                "most drifted");
  for (int s = 0; s < steps; ++s) {
    la.push_back(a.trainer.step(uint64_t(s)).loss);
    lb.push_back(sharded_step(b, uint64_t(s), batch, shards));
    if (first_diff < 0 && la.back() != lb.back()) first_diff = s;
    Drift d = compare(a.model, b.model);
    rel.push_back(d.rel_l2);
    if ((s + 1) % every != 0 && s > 10 && s + 1 != steps) continue;
    double dl = std::fabs(la.back() - lb.back());
    if (json)
      std::printf(
          "{\"bench\":\"drift\",\"optimizer\":\"%s\",\"step\":%d,\"loss\":%.9g,"
          "\"loss_diff\":%.3g,\"param_rel_l2\":%.3g,\"worst\":\"%s\",\"worst_rel\":%.3g}\n",
          o.kind.c_str(), s, la.back(), dl, d.rel_l2, d.worst.c_str(), d.worst_rel);
    else
      std::printf("%6d %14.9f %14.3g %12.3g  %s (%.3g)\n", s, la.back(), dl, d.rel_l2,
                  d.worst.c_str(), d.worst_rel);
  }
  if (!json) std::printf("first step whose losses differ: %d\n", first_diff);
  if (!dir.empty()) dump_run(dir, a, spec, o, steps, batch, micro, shards, la, lb, rel);
  return 0;
}

}  // namespace troupe::bench
