// `troupe export RUN_DIR|CHECKPOINT [--step N] [--format safetensors] -o FILE`: a checkpoint's
// model parameters in the safetensors format, named as the PyTorch twin's state_dict
// (bench/peers/torch_models.py; docs/export.md), with the model's shape in the metadata.
// --batch-of-step S also writes the tokens of step S's global batch (FILE.batch.safetensors),
// so another framework can check that the same weights compute the same loss on them.
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "cli/commands.h"
#include "coordinator/checkpoints.h"
#include "coordinator/config.h"
#include "coordinator/job_spec.h"
#include "models/data.h"
#include "models/safetensors.h"
#include "models/state.h"
#include "workers/checkpoint_writer.h"
#include "workers/datasets.h"
#include "workers/device_supervisor.h"

namespace troupe::cli {
namespace {

namespace st = models::safetensors;

// RUN_DIR as given: a run directory, or a checkpoint's (its directory or its manifest, as the
// events and troupe status name it), which stands for its run's (its grandparent: the default
// checkpoint.dir) and itself. Returns the checkpoint's directory ("" for a run directory).
std::string locate(std::string& run_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p = fs::absolute(run_dir, ec).lexically_normal();
  if (p.filename() == "manifest.json" && fs::is_regular_file(p, ec)) p = p.parent_path();
  if (p.filename().empty()) p = p.parent_path();  // (a trailing slash)
  if (!fs::is_regular_file(p / "manifest.json", ec)) {
    if (!fs::is_directory(run_dir, ec))
      throw std::invalid_argument("no run directory " + run_dir + ": it does not exist");
    if (!fs::exists(run_dir + "/config.toml"))
      throw std::invalid_argument(run_dir + " is not a run directory (no config.toml): troupe " +
                                  "export reads a run's (troupe run ... job.run_dir)");
    return "";
  }
  const fs::path run = p.parent_path().parent_path();
  if (!fs::is_regular_file(run / "config.toml", ec))
    throw std::invalid_argument(
        p.string() + " is a checkpoint whose run directory is not two levels up (no " +
        (run / "config.toml").string() + "): give the run directory and --step");
  run_dir = run.string();
  return p.string();
}

// The checkpoint to export: the one named, --step N, or the newest valid one. Throws naming why
// there is none.
coordinator::ValidCheckpoint choose(const coordinator::JobConfig& cfg, const std::string& run_dir,
                                    const std::string& named, int64_t step) {
  const std::string dir = coordinator::checkpoints_dir(cfg, run_dir);
  const coordinator::CheckpointIdentity hash = coordinator::checkpoint_identity(cfg);
  std::string why;
  if (!named.empty()) {
    auto c = coordinator::valid_checkpoint(named, hash, &why);
    if (!c) throw std::invalid_argument(named + ": " + why);
    if (step >= 0 && c->step != uint64_t(step))
      throw std::invalid_argument("--step " + std::to_string(step) + ": " + named +
                                  " is the checkpoint of step " + std::to_string(c->step));
    return *c;
  }
  if (step >= 0) {
    const std::string at = dir + "/" + workers::checkpoint_dir_name(uint64_t(step));
    if (auto c = coordinator::valid_checkpoint(at, hash, &why)) return *c;
    std::string valid;
    for (uint64_t s : coordinator::valid_checkpoint_steps(dir, hash))
      valid += (valid.empty() ? "" : ", ") + std::to_string(s);
    const std::string choose = valid.empty() ? "; there is no valid checkpoint in " + dir
                                             : "; the valid checkpoints are of steps " + valid;
    if (!std::filesystem::exists(at))
      throw std::invalid_argument("--step " + std::to_string(step) +
                                  ": no checkpoint of that step" + choose);
    throw std::invalid_argument(at + ": " + why + choose);
  }
  std::vector<std::string> refused;
  auto c = coordinator::newest_valid_checkpoint(dir, hash, &refused);
  for (const auto& r : refused) std::fprintf(stderr, "troupe: skipping checkpoint %s\n", r.c_str());
  if (!c)
    throw std::invalid_argument(
        "no valid checkpoint in " + dir +
        " (a job of Troupe's workers writes one when it completes, on troupe checkpoint, troupe "
        "stop --checkpoint or a signal, and every checkpoint.every_steps steps; a plain troupe "
        "stop writes none; a program's own loop keeps its own)");
  return *c;
}

std::vector<char> bytes_of(const float* p, size_t n) {
  const char* c = reinterpret_cast<const char*>(p);
  return std::vector<char>(c, c + n * sizeof(float));
}

void write_batch(const std::string& path, const models::Dataset& data, uint64_t seed, uint64_t step,
                 uint64_t B) {
  models::GlobalSampler sampler(seed, data.size());
  models::Batch b = models::make_batch(data, sampler, step * B, (step + 1) * B);
  std::vector<int32_t> in(b.inputs.numel());
  for (size_t i = 0; i < in.size(); ++i) in[i] = int32_t(b.inputs.data()[i]);
  const size_t T = in.size() / B;
  auto raw = [](const std::vector<int32_t>& v) {
    const char* p = reinterpret_cast<const char*>(v.data());
    return std::vector<char>(p, p + v.size() * 4);
  };
  const std::vector<size_t> shape{size_t(B), T};
  st::write(
      path,
      {{"inputs", "I32", shape, raw(in)}, {"targets", "I32", {b.targets.size()}, raw(b.targets)}},
      {{"step", std::to_string(step)}});
}

}  // namespace

std::string overwrites_run(const std::string& run_dir, const std::string& checkpoints,
                           const std::string& out, const std::vector<std::string>& data) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path o = fs::weakly_canonical(fs::absolute(out, ec), ec);
  if (fs::is_directory(o, ec)) return "is a directory";
  auto inside = [&](const std::string& dir) {  // (or it: a data file)
    const fs::path rel = o.lexically_relative(fs::weakly_canonical(fs::absolute(dir, ec), ec));
    return !rel.empty() && *rel.begin() != "..";
  };
  if (inside(checkpoints)) return "is inside the run's checkpoints (" + checkpoints + ")";
  for (const auto& d : data)
    if (!d.empty() && inside(d)) return "is the run's data (" + d + ")";
  const std::string name = o.filename().string();
  const bool own = name == "config.toml" || name == "events.jsonl" || name == "metrics.jsonl" ||
                   name == "ledger.jsonl" || name == "job.token" || name == "run.lock" ||
                   name == "coordinator.addr" || name == "trace.json" || o.extension() == ".log";
  if (own && o.parent_path() == fs::weakly_canonical(fs::absolute(run_dir, ec), ec))
    return "is the run's own " + name;
  return "";
}

namespace {

// The manifest of the checkpoint an export will choose: the one named, the one of --step, else
// (none there: a FIFO would block the read) the newest in the checkpoint directory.
std::string manifest_to_choose(const std::string& dir, const std::string& named, int64_t step) {
  std::error_code ec;
  const std::string chosen =
      !named.empty() ? named + "/manifest.json"
      : step >= 0    ? dir + "/" + workers::checkpoint_dir_name(uint64_t(step)) + "/manifest.json"
                     : "";
  if (!chosen.empty() && std::filesystem::is_regular_file(chosen, ec)) return chosen;
  return coordinator::newest_manifest(dir);
}

size_t gpt_vocab_of(const coordinator::ValidCheckpoint& ckpt, const models::ModelSpec& spec) {
  const std::string path = ckpt.directory + "/" + workers::shard_file_name(0);
  const uint64_t n = models::block_state_param_count(path);
  const uint64_t c = spec.d_model, t = spec.context;
  if (c == 0 || n % c != 0 || n / c <= t)
    throw std::invalid_argument(path + " holds " + std::to_string(n) +
                                " parameters: not the embedding of a GPT of model.d_model " +
                                std::to_string(c) + " and model.context " + std::to_string(t));
  return size_t(n / c - t);
}

// The run's config (bad input: exit 2, as the other refusals). With `weights_only` its data is
// not read where the weights do not need it (a GPT's, a synthetic MLP's); else, or when the
// checkpoint does not say which data it was of, `weights_only` is cleared and the data checked.
coordinator::JobConfig config_to_export(const std::string& run_dir, const Hooks& hooks,
                                        const std::string& named, int64_t step,
                                        bool& weights_only) {
  auto load = [&](bool check_data) {
    try {
      return coordinator::load_config(run_dir + "/config.toml", {}, hooks.kinds(), check_data);
    } catch (const coordinator::ConfigError& e) {
      throw std::invalid_argument(e.what());
    }
  };
  coordinator::JobConfig cfg = load(!weights_only);
  if (!weights_only) return cfg;
  weights_only =
      cfg.model_kind == "mlp" ||
      (cfg.model_kind == "gpt" &&
       coordinator::take_data_identity(
           cfg, manifest_to_choose(coordinator::checkpoints_dir(cfg, run_dir), named, step)));
  return weights_only ? cfg : load(true);
}

// The file's metadata: the job, the step, and the model's shape (what the PyTorch twin builds).
std::map<std::string, std::string> metadata_of(const std::string& job, uint64_t step,
                                               const models::ModelSpec& spec) {
  std::map<std::string, std::string> meta{{"format", "troupe"},
                                          {"job", job},
                                          {"step", std::to_string(step)},
                                          {"model.kind", spec.kind}};
  if (spec.kind != "gpt") return meta;
  for (auto [k, v] : {std::pair{"vocab", spec.vocab},
                      {"context", spec.context},
                      {"d_model", spec.d_model},
                      {"heads", spec.heads},
                      {"layers", spec.layers}})
    meta[std::string("model.") + k] = std::to_string(v);
  meta["model.tied_head"] = spec.tied_head ? "true" : "false";
  return meta;
}

// A batch of another step than the checkpoint's: which checkpoint its loss is of, and whether one
// is kept (where none is, --step would be refused: said, not offered).
void tell_pairing(const std::string& checkpoints, uint64_t batch_step, uint64_t step) {
  const bool kept = std::filesystem::exists(
      checkpoints + "/" + workers::checkpoint_dir_name(batch_step) + "/manifest.json");
  const std::string b = std::to_string(batch_step);
  const std::string pairs =
      kept ? ": --step " + b + " pairs them"
           : "; no checkpoint of step " + b + " is kept (checkpoint.every_steps, checkpoint.keep)";
  std::printf(
      "troupe: (step %s's loss in events.jsonl is of the checkpoint of step %s; this one is of "
      "step %llu%s)\n",
      b.c_str(), b.c_str(), (unsigned long long)step, pairs.c_str());
}

}  // namespace

int run_export(const std::vector<std::string>& words, const Hooks& hooks) {
  CLI::App app{"A checkpoint's model parameters as a safetensors file (the PyTorch twin's names).",
               "troupe export"};
  std::string run_dir, out, format = "safetensors";
  int64_t step = -1, batch_step = -1;
  app.add_option("RUN_DIR", run_dir,
                 "the run directory, or one of its checkpoints (RUN_DIR/checkpoints/step-00000040)")
      ->required();
  app.add_option("-o,--output", out, "the file to write")->required();
  const CLI::Validator a_step(
      [](std::string& s) {
        // (cli::parse makes 00000017, as the directories name it, 17; CLI11 would take a number
        // past int64_t as its largest)
        if (s.rfind('-', 0) == 0) return s + " is not a step (0 or more)";
        int64_t v = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (ec == std::errc::result_out_of_range)
          return s + " is not a step (more than any job has)";
        if (s.empty() || ec != std::errc() || end != s.data() + s.size())
          return s + " is not a step (a decimal number, 0 or more)";
        return std::string();
      },
      "STEP");
  app.add_option("--step", step, "the checkpoint's step (default: the newest valid one)")
      ->check(a_step);
  app.add_option("--format", format, "safetensors")->check(CLI::IsMember({"safetensors"}));
  app.add_option("--batch-of-step", batch_step,
                 "also write step S's global batch (tokens) to OUTPUT.batch.safetensors")
      ->check(a_step);
  if (auto rc = parse(app, words)) return *rc;
  const std::string named = locate(run_dir);
  bool weights_only = batch_step < 0;  // (a batch is read from the data)
  const coordinator::JobConfig cfg = config_to_export(run_dir, hooks, named, step, weights_only);
  if (batch_step >= 0 && cfg.data_kind != "text" && cfg.data_kind != "tokens")
    throw std::invalid_argument(
        "--batch-of-step writes a batch of tokens: this run's data.kind is '" + cfg.data_kind +
        "'");
  if (batch_step >= cfg.steps)
    throw std::invalid_argument("--batch-of-step " + std::to_string(batch_step) +
                                ": the job's steps are 0 to " + std::to_string(cfg.steps - 1));
  std::vector<std::string> sets{cfg.data_path, cfg.eval_path};
  for (const auto& [set, weight] : cfg.data_mix) sets.push_back(set);
  if (std::string why =
          overwrites_run(run_dir, coordinator::checkpoints_dir(cfg, run_dir), out, sets);
      !why.empty())
    throw std::invalid_argument("-o " + out + ": " + why);
  const coordinator::ValidCheckpoint ckpt = choose(cfg, run_dir, named, step);
  workers::WorkerSpec w = workers::worker_spec_of(coordinator::job_spec_of(cfg, 0, 1));
  w.extensions = hooks.extensions;
  models::ModelSpec spec = w.model;
  // The data set as the workers opened it (text and tokens set the vocabulary from it), or for
  // a GPT's weights alone the vocabulary its checkpoint holds.
  std::unique_ptr<models::Dataset> data;
  std::unique_ptr<models::Model> built;
  if (weights_only && spec.kind == "gpt") {
    spec.vocab = gpt_vocab_of(ckpt, spec);
    built = std::make_unique<models::Model>(spec);
  } else {
    data = workers::open_dataset(w, spec);
    built = workers::build_model(w, spec, *data);
  }
  models::Model& model = *built;
  const std::vector<size_t> counts = model.block_param_counts();
  models::Optimizer opt(w.optimizer, counts);
  if (ckpt.blocks != model.num_blocks())
    throw std::invalid_argument("the checkpoint " + ckpt.directory + " holds " +
                                std::to_string(ckpt.blocks) + " blocks of the model, which has " +
                                std::to_string(model.num_blocks()));
  for (uint32_t b = 0; b < model.num_blocks(); ++b) {
    const std::string path = ckpt.directory + "/" + workers::shard_file_name(b);
    models::load_block_state_file(path, model.block(b), b, opt);
  }
  std::vector<st::Tensor> tensors;
  for (const auto& p : model.parameters()) {
    size_t n = 1;
    for (size_t d : p.shape) n *= d;
    tensors.push_back(
        {p.name, "F32", p.shape, bytes_of(model.block(p.block).params().data() + p.offset, n)});
  }
  st::write(out, tensors, metadata_of(cfg.name, ckpt.step, spec));
  std::printf("troupe: step %llu of %s -> %s (%zu tensors, %zu parameters)\n",
              (unsigned long long)ckpt.step, run_dir.c_str(), out.c_str(), tensors.size(),
              model.param_count());
  if (batch_step >= 0) {
    write_batch(out + ".batch.safetensors", *data, w.seed, uint64_t(batch_step),
                uint64_t(cfg.global_batch));
    std::printf("troupe: the global batch of step %lld -> %s.batch.safetensors\n",
                (long long)batch_step, out.c_str());
    if (uint64_t(batch_step) != ckpt.step)
      tell_pairing(coordinator::checkpoints_dir(cfg, run_dir), uint64_t(batch_step), ckpt.step);
  }
  return 0;
}

}  // namespace troupe::cli
