// troupe: the command's dispatch. A thin layer over the libraries; see `troupe help`. main()
// is cli/main.cpp (the release binary) or tests/harness/troupe_test_main.cpp (the test build,
// which passes hooks for fault injection).
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "bench/bench.h"
#include "bench/kernels_bench.h"
#include "cli/commands.h"
#include "cli/main.h"
#include "cli/parse.h"
#include "comm/cuda_info.h"
#include "comm/error.h"
#include "comm/ucx.h"
#include "models/blas_kernels.h"
#include "models/devices.h"
#include "models/model.h"

namespace {

const char* kUsage = R"(troupe: actor-based elastic training

usage (troupe COMMAND --help: a command's options):
  troupe run CONFIG.toml [--set table.key=value]...   coordinator + local agents; trains; exits when done
      [--resume RUN_DIR | CHECKPOINT_DIR]            go on from the newest valid checkpoint
  troupe coordinator CONFIG.toml [--listen HOST:PORT]  the same, with agents started by hand
  troupe agent --join HOST:PORT --token-file F [--devices cpu:0,cpu:1]
  troupe status (--run-dir DIR | --coordinator HOST:PORT --token-file F) [--json | --watch]
  troupe top    (--run-dir DIR | ...)                  per-worker live view (status --watch)
  troupe stop   (--run-dir DIR | --coordinator HOST:PORT --token-file F) [--checkpoint]
  troupe checkpoint (--run-dir DIR | ...) [--no-wait]   checkpoint at the next step boundary
  troupe drain  (--run-dir DIR | ...) --agent ID|NAME the agent leaves at the next step boundary
  troupe scale  (--run-dir DIR | ...) --workers N     grow (local launcher starts agents) or shrink (drains)
  troupe lr     (--run-dir DIR | ...) LR             optimizer.lr from the next step boundary
  troupe export RUN_DIR [--step N] -o FILE.safetensors [--batch-of-step S]
                                    a checkpoint's parameters (and a step's batch; docs/export.md)
  troupe report RUN_DIR [-o FILE.html]   one self-contained HTML page: loss, throughput, workers, changes
  troupe data prepare INPUT... --out DIR [--tokenizer byte|bpe --vocab N [--max-words N]] [--field F]
                                    text, directories, JSON lines -> a token data set (data.kind = "tokens")
  troupe data import FILE.bin... --tokenizer TOKENIZER.bin --out DIR
                                    llm.c's token files (GPT-2's ids) -> a token data set
  troupe data encode|decode --data DIR   stdin -> stdout: bytes -> ids, ids -> bytes
  troupe data verify DIR...         every file of a data set against its manifest (exit 1: damaged)
  troupe version                    versions of Troupe and its libraries, CUDA devices
  troupe kinds                      the model and data set kinds this program trains (a program's
                                    own with their keys; docs/config.md has the built-in ones)
  troupe demo control               two-process control-plane demo (what `make run` shows)
  troupe node [options]             a control-plane node with echo and sink services
      --listen HOST:PORT  --connect HOST:PORT  --rejoin  --job-id ID  --token T | --token-file F
      --heartbeat-interval-ms N  --failure-timeout-ms N  --generation G  --spin-us N
      --max-frame-bytes N
  troupe bench control [--json] [--round-trips N] [--messages N]
                                    control-plane round trip and message rate, next to raw UCX
  troupe bench allreduce [--workers N]... [--sizes 4K,1M,64M] [--backend ucx|nccl] [--json]
      [--algorithm auto|ring|rd|shm] [--shm-slice-bytes B] [--segment-bytes B] [--window N]
                                    allreduce between processes (ucx) or GPUs (nccl): time, bus bandwidth
  troupe bench model [--model mlp|gpt|gpt2] [--device cpu|cuda:N] [--dtype f32|bf16] [--batch B]
      [--threads T] [--steps N] [--json] [--curve]
                                    one process's training throughput and MFU (gpt2: GPT-2 small)
  troupe bench kernels [--device cpu|cuda[:N]] [--bf16] [--json]
                                    each kernel of a device at a GPT's shapes (bench/compare_kernels.sh)
  troupe bench drift [--optimizer adamw|sgd] [--shards N] [--steps N] [--dump DIR]
                                    how far a change of world size moves a run (bench/compare_drift.sh)
  troupe bench data --data DIR [--context T] [--batch B] [--json]
                                    micro-batches from a token data set, as a worker gets them (bench/compare_data.sh)
  troupe bench checkpoint [--params N] [--dir DIR] [--json]
                                    a checkpoint's blocking copy, write and restore (bench/compare_checkpoint.sh)
)";

// `troupe kinds`: the model and data set kinds this program trains, with a program's own keys.
const char* type_of(const troupe::models::OptionValue& v) {
  static const char* names[] = {"integer", "number", "boolean", "string"};
  return names[v.index()];
}
std::string text_of(const troupe::models::OptionValue& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) return "\"" + x + "\"";
        if constexpr (std::is_same_v<T, bool>) return x ? "true" : "false";
        if constexpr (std::is_same_v<T, double>) {  // (as a config writes it: 0.5, not 0.500000)
          char text[32];
          std::snprintf(text, sizeof text, "%.15g", x);
          return text;
        }
        if constexpr (!std::is_same_v<T, std::string> && !std::is_same_v<T, bool> &&
                      !std::is_same_v<T, double>)
          return std::to_string(x);
      },
      v);
}
void print_kind(const char* table, const std::string& name, const std::string& help,
                const std::vector<troupe::models::OptionSpec>& keys) {
  std::printf("  %s.kind = \"%s\"%s%s\n", table, name.c_str(), help.empty() ? "" : ": ",
              help.c_str());
  for (const auto& k : keys) {
    std::printf("      %s.%s (%s, default %s", table, k.name.c_str(), type_of(k.default_value),
                text_of(k.default_value).c_str());
    if (k.min > -1e300 || k.max < 1e300) std::printf(", in [%.15g, %.15g]", k.min, k.max);
    std::printf(")%s%s\n", k.help.empty() ? "" : ": ", k.help.c_str());
  }
}
int kinds(const troupe::cli::Hooks& hooks) {
  std::printf("models (docs/config.md for the built-in keys):\n");
  for (const char* k : {"mlp", "gpt", "external"}) std::printf("  model.kind = \"%s\"\n", k);
  if (hooks.extensions)
    for (const auto& m : hooks.extensions->models()) print_kind("model", m.name, m.help, m.options);
  std::printf("data sets:\n");
  for (const char* k : {"synthetic", "text", "tokens"}) std::printf("  data.kind = \"%s\"\n", k);
  if (hooks.extensions)
    for (const auto& d : hooks.extensions->datasets())
      print_kind("data", d.name, d.help, d.options);
  return 0;
}

int version() {
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  std::printf("troupe 0.1.0\nUCX %u.%u.%u\nCAF 0.17\n%s\n", major, minor, release,
              troupe::comm::cuda_summary().c_str());
  // (Loads the CUDA module: a build or installation that cannot open GPUs says why here.)
  int gpus = 0;
  const std::string why = troupe::models::cuda_workers_unavailable(&gpus);
  if (why.empty())
    std::printf("CUDA workers: %d GPU(s)\n", gpus);
  else
    std::printf("CUDA workers: none (%s)\n", why.c_str());
  return 0;
}

// The BLAS kernels by the CPU's features (models/blas_kernels.h): when the library loaded weaker
// ones than the CPU runs, the process executes itself again with OPENBLAS_CORETYPE set (once;
// TROUPE_BLAS_RESTARTED names the core OpenBLAS chose alone, for the workers' log line).
void choose_blas_kernels(char** argv) {
  const char* restarted = std::getenv("TROUPE_BLAS_RESTARTED");
  auto d = troupe::models::decide_blas_kernels(troupe::models::cpu_features(),
                                               troupe::models::loaded_blas_core(),
                                               std::getenv("TROUPE_BLAS_CORE"), restarted);
  if (!d.restart) {
    if (d.not_taken) std::fprintf(stderr, "troupe: %s\n", d.reason.c_str());
    return;
  }
  ::setenv("OPENBLAS_CORETYPE", d.wanted.c_str(), 1);
  ::setenv("TROUPE_BLAS_RESTARTED", troupe::models::loaded_blas_core().c_str(), 1);
  // By its own path, not /proc/self/exe: the process's name is the file's (ps, pgrep, top showed
  // "exe"); that link only when the file is gone (replaced while it ran).
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    self[n] = '\0';
    ::execv(self, argv);
  }
  ::execv("/proc/self/exe", argv);
  std::fprintf(stderr, "troupe: cannot execute itself again for the %s kernels (%s); going on\n",
               d.wanted.c_str(), std::strerror(errno));
}

// The commands of a group (troupe bench X, troupe demo X): each takes the words after its name.
struct SubCommand {
  const char* name;
  int (*run)(const std::vector<std::string>&);
  const char* help;  // (nullptr: internal, not listed)
};
int run_kernels_bench(const std::vector<std::string>& args) {
  return troupe::bench::run_kernels_bench(args);
}
const std::vector<SubCommand> kBench = {
    {"control", troupe::bench::run_control_bench, "control-plane round trip and message rate"},
    {"allreduce", troupe::bench::run_allreduce_bench, "allreduce between processes or GPUs"},
    {"model", troupe::bench::run_model_bench, "one process's training throughput and MFU"},
    {"kernels", run_kernels_bench, "each kernel of a device at a GPT's shapes"},
    {"drift", troupe::bench::run_drift_bench, "how far a change of world size moves a run"},
    {"data", troupe::bench::run_data_bench, "micro-batches from a token data set"},
    {"checkpoint", troupe::bench::run_checkpoint_bench, "a checkpoint's copy, write and restore"},
    {"allreduce-worker", troupe::bench::run_allreduce_worker, nullptr},
    {"raw-ucx-server", troupe::bench::run_raw_ucx_server, nullptr}};
const std::vector<SubCommand> kDemo = {
    {"control", troupe::cli::run_demo_control, "two-process control-plane demo"}};

// troupe GROUP SUB ARGS...: SUB's run; without SUB, or with --help, the group's list (exit 2 and
// 0); an unknown SUB named, with the nearest one.
int run_group(const std::string& group, const std::vector<SubCommand>& subs,
              const std::vector<std::string>& rest) {
  const std::string word = rest.empty() ? "" : rest[0];
  for (const auto& s : subs)
    if (word == s.name) return s.run({rest.begin() + 1, rest.end()});
  const bool help = word == "--help" || word == "-h" || word == "help";
  std::vector<std::string> names;
  for (const auto& s : subs)
    if (s.help) names.push_back(s.name);
  FILE* out = help ? stdout : stderr;
  if (!word.empty() && !help) {
    const std::string near = troupe::cli::did_you_mean(word, names);
    const std::string hint = near.empty() ? "" : "; did you mean '" + near + "'?";
    std::fprintf(out, "troupe %s: unknown command '%s'%s\n", group.c_str(), word.c_str(),
                 hint.c_str());
  }
  std::fprintf(out, "usage: troupe %s COMMAND [--help]\n", group.c_str());
  for (const auto& s : subs)
    if (s.help) std::fprintf(out, "  %-12s %s\n", s.name, s.help);
  return help ? 0 : 2;
}

// version and kinds take nothing: --help says so (exit 0), anything else is refused (exit 2);
// nothing without arguments.
std::optional<int> no_arguments(const std::string& cmd, const std::vector<std::string>& rest) {
  if (rest.empty()) return std::nullopt;
  const bool help = rest[0] == "--help" || rest[0] == "-h";
  const std::string refused = help ? "" : "troupe " + cmd + ": unexpected '" + rest[0] + "'; ";
  std::fprintf(help ? stdout : stderr, "%susage: troupe %s (no arguments)\n", refused.c_str(),
               cmd.c_str());
  return help ? 0 : 2;
}

// The command a message names: "data import" for a group's subcommand ("data" named its errors,
// and its summary and help "data import").
std::string command_of(const std::string& cmd, const std::vector<std::string>& rest) {
  const bool group = cmd == "data" || cmd == "bench" || cmd == "demo";
  return group && !rest.empty() && !rest[0].empty() && rest[0][0] != '-' ? cmd + " " + rest[0]
                                                                         : cmd;
}

}  // namespace

namespace troupe::cli {

coordinator::ExtensionKinds Hooks::kinds() const {
  coordinator::ExtensionKinds k;
  if (!extensions) return k;
  auto keys = [](const std::vector<models::OptionSpec>& specs) {
    std::vector<coordinator::OptionKey> out;
    for (const auto& o : specs) out.push_back({o.name, o.default_value, o.min, o.max});
    return out;
  };
  for (const auto& m : extensions->models()) k.models[m.name] = keys(m.options);
  for (const auto& d : extensions->datasets()) k.datasets[d.name] = keys(d.options);
  return k;
}

int troupe_main(int argc, char** argv, const Hooks& hooks) {
  choose_blas_kernels(argv);
  models::keep_freed_memory();
  // A write past the file-size limit (or onto a full disk) is an error the writer reports
  // (RunLog fails the job naming the file), not a signal that kills the process mid-line.
  ::signal(SIGXFSZ, SIG_IGN);
  // Logs go to stderr; stdout is for results and machine-readable lines.
  spdlog::set_default_logger(spdlog::stderr_color_mt("troupe"));
  // (UCX's own warnings and errors in the log at debug: Troupe says what they mean itself)
  comm::route_ucx_log([](bool error, const std::string& message) {
    spdlog::debug("UCX {}: {}", error ? "error" : "warning", message);
  });
  // (before spdlog's registry goes, at exit: UCX's own teardown may still log)
  std::atexit([] { comm::route_ucx_log(nullptr); });
  std::vector<std::string> words(argv + 1, argv + argc);
  if (words.size() > 1 && words[0] == "help") {  // (troupe help run: run's own, as run --help)
    words.erase(words.begin());
    words.push_back("--help");
  }
  // A job's console may go away under it (piped to head, a tee that ended): its writes then
  // fail and it goes on; SIGPIPE ended it with no event, its agents orphaned.
  if (!words.empty() && (words[0] == "run" || words[0] == "coordinator" || words[0] == "agent"))
    ::signal(SIGPIPE, SIG_IGN);
  if (words.empty() || words[0] == "help" || words[0] == "--help" || words[0] == "-h") {
    std::fputs(kUsage, words.empty() ? stderr : stdout);
    return words.empty() ? 2 : 0;
  }
  std::string cmd = words[0];
  std::vector<std::string> rest(words.begin() + 1, words.end());
  try {
    if (cmd == "version" || cmd == "kinds") {
      if (auto rc = no_arguments(cmd, rest)) return *rc;
      return cmd == "version" ? version() : kinds(hooks);
    }
    if (cmd == "node") return run_node(rest);
    if (cmd == "run") return run_run(rest, hooks);
    if (cmd == "coordinator") return run_coordinator(rest, hooks);
    if (cmd == "agent") return run_agent_command(rest, hooks);
    if (cmd == "status") return run_status(rest);
    if (cmd == "top") return run_top(rest);
    if (cmd == "stop") return run_stop(rest);
    if (cmd == "checkpoint") return run_checkpoint(rest);
    if (cmd == "drain") return run_drain(rest);
    if (cmd == "scale") return run_scale(rest);
    if (cmd == "lr") return run_lr(rest);
    if (cmd == "report") return run_report(rest);
    if (cmd == "export") return run_export(rest, hooks);
    if (cmd == "data") return run_data(rest);
    if (cmd == "demo") return run_group("demo", kDemo, rest);
    if (cmd == "bench") return run_group("bench", kBench, rest);
    const std::string near =
        cli::did_you_mean(cmd, {"run", "coordinator", "agent", "status", "top", "stop",
                                "checkpoint", "drain", "scale", "lr", "export", "report", "data",
                                "version", "kinds", "demo", "node", "bench", "help"});
    const std::string hint = near.empty() ? "" : "; did you mean '" + near + "'?";
    std::fprintf(stderr, "troupe: unknown command '%s'%s\n\n%s", cmd.c_str(), hint.c_str(), kUsage);
    return 2;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "troupe %s: %s\n", command_of(cmd, rest).c_str(), e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "troupe %s: error: %s\n", command_of(cmd, rest).c_str(), e.what());
    return 1;
  }
}

}  // namespace troupe::cli

namespace troupe {

int main(int argc, char** argv, const models::Extensions& extensions) {
  cli::Hooks hooks;
  hooks.extensions = std::make_shared<const models::Extensions>(extensions);
  return cli::troupe_main(argc, argv, hooks);
}

}  // namespace troupe
