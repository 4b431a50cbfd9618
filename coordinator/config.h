// The job's configuration: a TOML file (docs/config.md lists every key with its default and
// unit) plus `--set table.key=value` overrides. Only the coordinator reads TOML; workers get the
// job spec as a Cap'n Proto message.
//
// Errors name the file, line and column and say what to do: a syntax error; an unknown table or
// key (with the nearest valid key); a value of the wrong type or out of range; a missing data
// file; a key this build cannot act on yet (parallel.backend = "nccl" with CPU workers,
// checkpoint.*): every key acts or is refused. They are thrown as ConfigError.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace troupe::coordinator {

class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A value of a program's own config key (models::OptionValue, the same type): an integer, a
// number, true or false, or a string.
using OptionValue = std::variant<int64_t, double, bool, std::string>;

// The model and data set kinds a program added (models/extension.h), as the config checks
// them: each kind's keys under [model] or [data], with their defaults (whose type is the key's)
// and ranges. The command (cli/) fills it from the program's models::Extensions.
struct OptionKey {
  OptionKey(std::string name, OptionValue default_value, double min = -1e300, double max = 1e300)
      : name(std::move(name)), default_value(std::move(default_value)), min(min), max(max) {}
  std::string name;
  OptionValue default_value;
  double min, max;
};
struct ExtensionKinds {
  std::map<std::string, std::vector<OptionKey>> models, datasets;
};

struct JobConfig {
  // [job]
  std::string name = "troupe-job";
  int64_t seed = 0;
  int64_t steps = 100;
  std::string run_dir;  // empty: runs/<name>-<time>
  // [model]
  std::string model_kind = "mlp";
  std::vector<int64_t> hidden{256};  // mlp hidden sizes
  int64_t inputs = 784;              // mlp input width (synthetic data)
  int64_t classes = 10;              // mlp outputs (synthetic data)
  int64_t layers = 4, d_model = 128, heads = 4, context = 64;
  bool tied_head = false;
  std::string dtype = "f32";  // f32 | bf16 (the linear layers' GEMM operands)
  // A program's own model.kind: its keys' values (every key, defaults included); the built-in
  // keys above are then refused in the file.
  std::map<std::string, OptionValue> model_options;
  // Not keys: the program's kinds' defaults (a checkpoint written before a key was added, at its
  // default now, is the same job's).
  std::map<std::string, OptionValue> model_defaults, data_defaults;
  // [data]
  std::string data_kind = "synthetic";
  std::string data_path = "/usr/share/common-licenses/GPL-3";
  std::map<std::string, double> data_mix;  // data.mix: token data set -> weight
  // Not a key: the token data set's tokenizer fingerprint, as its manifest says ("" unknown), for
  // the checkpoints' identity.
  std::string data_tokenizer;
  // Not keys either: the content of the data (data.path's, and each data.mix set's in the mix's
  // order) as fnv1a-64 hex, "" unknown: the checkpoints' identity holds it, not the path's text
  // (the same set named another way, or moved, is the same data; another set at its path is not).
  std::string data_digest;
  std::vector<std::string> mix_digests;
  std::string digest_source;     // what they are of (data_digest_source): else computed again
  std::string eval_path;         // data.eval_path: a held-out token data set
  double eval_fraction = 0;      // data.eval_fraction: or the training sets' tail
  int64_t eval_every_steps = 0;  // eval.every_steps (0: never)
  int64_t samples = 20000;       // synthetic samples per epoch
  bool ledger = false;
  bool verify_data = true;  // data.verify: token sets' files checked against their manifests
  // A program's own data.kind: its keys' values (data.ledger is the only built-in key it takes).
  std::map<std::string, OptionValue> data_options;
  // [batch]
  int64_t global_batch = 64, micro_batch = 64;
  // [optimizer]
  std::string optimizer = "adamw";
  double lr = 1e-3, momentum = 0.9, weight_decay = 0.0, clip_norm = 0.0;
  int64_t warmup_steps = 0, decay_steps = 0;
  // [parallel]
  std::string backend = "auto";
  std::string reduce_dtype = "f32";    // the gradients' sums: f32 | bf16 (half the bytes moved)
  int64_t pipeline_stages = 1;         // 0: "auto" (the planner chooses)
  int64_t max_params_per_worker = 0;   // parameters one worker may hold; 0: no limit
  int64_t stage_backup_steps = 20;     // pipeline stages without a replica: backup interval
  bool recompute_activations = false;  // pipeline stages recompute forwards instead of keeping them
  int64_t threads_per_worker = 1;
  bool overlap_reduce = false;
  bool deterministic = false;  // the same bits at any world size and layout (workers/exact_sum.h)
  // [cluster]
  std::string launcher = "local";
  int64_t agents = 2, devices_per_agent = 1;
  // The local launcher's agents' devices: cpu, cuda (GPU i for device i, modulo the GPUs), or
  // auto (cuda where there is a GPU). Agents started by hand choose with --devices.
  std::string devices = "auto";
  std::string listen = "127.0.0.1:0";
  // [elastic]
  int64_t min_workers = 1, max_workers = 0;
  int64_t heartbeat_interval_ms = 200, failure_timeout_ms = 3000, max_restarts = 3,
          rejoin_timeout_ms = 30000;
  int64_t start_timeout_ms = 120000;  // every worker of the first generation ready by then
  int64_t change_timeout_ms = 0;      // a decided change forms in time; 0: 2 x failure + 30 s
  int64_t step_timeout_ms = 0;        // a step commits in time; 0: 10 min or 2 x failure + 30 s
  int64_t max_reforms = 3;            // a generation may break this often without a step
  int64_t worker_max_restarts = 3;    // a worker thread that throws: restarts per window
  int64_t worker_restart_window_ms = 60000;
  // A data-parallel worker computing straggler_factor x slower than the others' median for
  // straggler_steps committed steps in a row: a `straggler` event; drained with drain_stragglers.
  double straggler_factor = 2.0;
  int64_t straggler_steps = 20;
  bool drain_stragglers = false;
  // [checkpoint]
  std::string checkpoint_dir;               // "": the run directory's checkpoints/
  int64_t checkpoint_every_steps = 0;       // 0: none but on request and at the job's end
  int64_t checkpoint_keep = 3;              // the newest complete checkpoints kept
  std::string checkpoint_if_busy = "wait";  // the previous write still going: wait | skip
  // The model's state lost with the members that held it: rollback (to the newest checkpoint,
  // within the running job) | fail.
  std::string checkpoint_on_state_lost = "rollback";
  // Not keys: set by `troupe run --resume` (the checkpoint the job starts from; with take_over,
  // a run whose coordinator was lost: its agents still alive are adopted, coordinator/job.h).
  std::string resume_dir;
  uint64_t resume_step = 0;
  uint64_t resume_blocks = 0;  // the checkpoint's blocks: the model's must be as many
  double resume_lr = 0;        // optimizer.lr at the checkpoint's step (0: not known, or set anew)
  double configured_lr = 0;    // optimizer.lr as configured, where lr is the checkpoint's
  bool take_over = false;
  // Not a key: each block's parameter count in the model, where the coordinator could build it
  // before the start (else the first generation's); every worker is checked against it.
  std::vector<uint64_t> block_params;
  // Not a key: the model's blocks, where known and block_params is not (a GPT on text: its
  // vocabulary, so its blocks' sizes, are known once the text is read; their number before).
  uint64_t model_blocks = 0;
  // [observability]
  std::string metrics_listen;  // "": no endpoint; HOST:PORT serves GET /metrics (Prometheus)
  std::string trace_steps;     // "A-B" or "N": those steps' spans in RUN_DIR/trace.json
  double peak_tflops = 0;      // a worker's peak for MFU (0: its device's, models/peak.h)
  int64_t trace_first = -1, trace_last = -1;  // (parsed from trace_steps; -1: none)
  // [logging]
  std::string log_level = "info";
  bool progress = true;

  int64_t workers() const { return agents * devices_per_agent; }
  // A built-in kind's key changed from its default while another kind is chosen (it would not
  // act), or elastic.min_workers / max_workers that cannot act as documented against the workers
  // the job starts with, with its place; "" when none. `troupe run` refuses a new run with it; a
  // resume warns (a run's checkpoints name the config as it was).
  std::string inert_key;
  bool builtin_model() const { return model_kind == "mlp" || model_kind == "gpt"; }
  // A pipeline may be planned: stages above 1, or "auto" under a parameter budget (without one,
  // "auto" is data parallelism alone).
  bool may_pipeline() const {
    return pipeline_stages > 1 || (pipeline_stages == 0 && max_params_per_worker > 0);
  }
  // model.kind = "external": the members run their own training loop (workers/elastic_loop.h);
  // Troupe keeps the membership, the data positions, the state of joiners and the ledger.
  bool external() const { return model_kind == "external"; }
  bool builtin_data() const {
    return data_kind == "synthetic" || data_kind == "text" || data_kind == "tokens";
  }
  // How long after a member left a generation with an error (a collective that made no progress)
  // another still silent is taken for hung and cut: its own collectives and connections would
  // have failed by then.
  int64_t hung_after_ms() const { return 2 * failure_timeout_ms + 10000; }
  // elastic.change_timeout_ms, or its default: long enough for a member hung in a planned change
  // to be cut (the others' collectives fail within failure_timeout_ms, then hung_after_ms) and
  // the change to form without it (it was 2 x failure_timeout_ms + 30000: above 20 s the job
  // failed at the change's deadline first).
  int64_t change_timeout() const {
    return change_timeout_ms > 0 ? change_timeout_ms : failure_timeout_ms + hung_after_ms() + 20000;
  }
  // elastic.step_timeout_ms, or its default (as PyTorch's collective timeout, 10 minutes; longer
  // where a member's loss takes longer to notice). 0: none (a loop of its own, model.kind =
  // "external", whose steps may hold its own evaluation or saving, sets one if it wants one).
  int64_t step_timeout() const {
    if (step_timeout_ms > 0) return step_timeout_ms;
    return external() ? 0 : std::max<int64_t>(600000, 2 * failure_timeout_ms + 30000);
  }
};

// Loads path, applies overrides ("table.key=value", value in TOML syntax; a bare word is taken
// as a string), validates. model.kind and data.kind may also name the kinds in `kinds`, whose
// keys are then checked instead of the built-in ones. Throws ConfigError. Without check_data
// the data files it names need not be there (a finished run's weights exported after its data
// moved): nothing of them is read (no tokenizer, no digests).
JobConfig load_config(const std::string& path, const std::vector<std::string>& overrides = {},
                      const ExtensionKinds& kinds = {}, bool check_data = true);
// The "table.key" an override ("table.key=value", spaces around either part allowed) sets; ""
// when it is not one.
std::string override_key(const std::string& override_text);
// Parses TOML text (source names the origin in messages).
JobConfig parse_config(const std::string& text, const std::string& source,
                       const std::vector<std::string>& overrides = {},
                       const ExtensionKinds& kinds = {}, bool check_data = true);
// A config built or changed in code (an embedding program's) checked as a file is: throws
// ConfigError naming the key, e.g. "SOURCE: batch.micro (64) exceeds batch.global (32) ...".
// Its data files are not read again.
void check_config(const JobConfig& config, const std::string& source);
// The effective configuration as TOML (written to the run directory).
std::string to_toml(const JobConfig& config);
// The config with its paths (data.path, data.eval_path, data.mix's sets, checkpoint.dir) made
// absolute from the working directory: a run's config.toml, read from anywhere.
JobConfig with_absolute_paths(JobConfig c);
// A path made absolute from the working directory, normalised ("" stays "").
std::string absolute_path(const std::string& p);

// The content of a job's data, not its name (fnv1a-64 hex; "" where it cannot be read): a text
// file's bytes, or a token data set's shards (each one's checksum and tokens, in order).
std::string content_digest(const std::string& kind, const std::string& path);
// The config's data_digest and mix_digests, computed now (parsing a config does it).
void fill_data_digests(JobConfig& c);
// What the digests are of: the data's kind, path and mix sets (a config changed after its
// digests were computed, by a program that embeds Troupe, has them computed again).
std::string data_digest_source(const JobConfig& c);

// HOST:PORT or [V6]:PORT, the port 0..65535 in digits (cluster.listen, metrics_listen, --listen).
bool host_and_port(const std::string& address);

// The keys whose values differ between two configs ("cluster.agents = 2 (the run's: 3)"), in
// the order of docs/config.md; job.run_dir (where, not what) and the keys in `left_out` are not
// compared.
std::vector<std::string> config_differences(const JobConfig& before, const JobConfig& now,
                                            const std::vector<std::string>& left_out = {});

// Where a run's checkpoints are: checkpoint.dir, or RUN_DIR/checkpoints where it is unset or
// names the run's own (cfg.run_dir's checkpoints/, as an effective config wrote it): a run
// directory moved or copied takes its checkpoints along.
std::string checkpoints_dir(const JobConfig& cfg, const std::string& run_dir);

// The candidate nearest to word (edit distance) when it is near enough to be a typo, else "":
// the "did you mean" of config keys and of the command line.
std::string nearest_word(const std::string& word, const std::vector<std::string>& candidates);
// "LINE: why" when TOML text holds a key of 256 or more dotted parts, or arrays and tables nested
// more than 256 deep (toml++'s recursive parser overflows its stack on such a file); else "".
std::string toml_too_deep(std::string_view text);

}  // namespace troupe::coordinator
