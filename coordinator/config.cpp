#include "coordinator/config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <tuple>
#include <variant>

#include "comm/checksum.h"

namespace troupe::coordinator {
namespace {

enum class Kind { integer, real, string, boolean, int_array, int_or_auto, weights, option };

// A text data set is read whole into every worker's memory (as 32-bit character indices).
constexpr int64_t kMaxTextBytes = int64_t(1) << 30;

struct Field {
  std::string table, key;
  Kind kind;
  void* target;
  double min = -1e300, max = 1e300;
  std::vector<std::string> choices;
  size_t option_type = 0;  // Kind::option: the OptionValue alternative (integer, number, ...)
};

const std::vector<std::string> kModelKinds{"mlp", "gpt", "external"};
const std::vector<std::string> kDataKinds{"synthetic", "text", "tokens", "external"};

// The built-in kinds and the program's, for model.kind and data.kind.
std::vector<std::string> kind_names(std::vector<std::string> builtin,
                                    const std::map<std::string, std::vector<OptionKey>>& added) {
  for (const auto& [name, keys] : added) builtin.push_back(name);
  return builtin;
}

// A program's kind's keys, from the values the config holds for them (their defaults first):
// Kind::option fields of the value's type, with the ranges `keys` give.
void add_option_fields(std::vector<Field>& fields, const char* table,
                       std::map<std::string, OptionValue>& values,
                       const std::vector<OptionKey>* keys) {
  for (auto& [name, value] : values) {
    Field f{table, name, Kind::option, &value, -1e300, 1e300, {}, value.index()};
    for (size_t i = 0; keys && i < keys->size(); ++i)
      if ((*keys)[i].name == name)
        std::tie(f.min, f.max) = std::pair((*keys)[i].min, (*keys)[i].max);
    fields.push_back(std::move(f));
  }
}

// The built-in keys of a table that a program's kind replaces: all but these.
bool kept_for_added_kind(const Field& f) {
  return f.key == "kind" || (f.table == "data" && f.key == "ledger");
}

std::vector<Field> builtin_fields(JobConfig& c, const ExtensionKinds& kinds) {
  auto I = [](const char* t, const char* k, int64_t* p, double lo, double hi) {
    return Field{t, k, Kind::integer, p, lo, hi, {}};
  };
  auto R = [](const char* t, const char* k, double* p, double lo, double hi) {
    return Field{t, k, Kind::real, p, lo, hi, {}};
  };
  auto S = [](const char* t, const char* k, std::string* p, std::vector<std::string> choices = {}) {
    return Field{t, k, Kind::string, p, 0, 0, std::move(choices)};
  };
  auto B = [](const char* t, const char* k, bool* p) {
    return Field{t, k, Kind::boolean, p, 0, 0, {}};
  };
  return {
      S("job", "name", &c.name),
      I("job", "seed", &c.seed, 0, 9e18),
      I("job", "steps", &c.steps, 1, 1e12),
      S("job", "run_dir", &c.run_dir),
      S("model", "kind", &c.model_kind, kind_names(kModelKinds, kinds.models)),
      Field{"model", "hidden", Kind::int_array, &c.hidden, 1, 1e7, {}},
      I("model", "inputs", &c.inputs, 1, 1e7),
      I("model", "classes", &c.classes, 2, 1e7),
      I("model", "layers", &c.layers, 1, 1000),
      I("model", "d_model", &c.d_model, 1, 1e6),
      I("model", "heads", &c.heads, 1, 1024),
      I("model", "context", &c.context, 1, 1e6),
      B("model", "tied_head", &c.tied_head),
      S("model", "dtype", &c.dtype, {"f32", "bf16"}),
      S("data", "kind", &c.data_kind, kind_names(kDataKinds, kinds.datasets)),
      S("data", "path", &c.data_path),
      Field{"data", "mix", Kind::weights, &c.data_mix, 0, 1e12, {}},
      S("data", "eval_path", &c.eval_path),
      R("data", "eval_fraction", &c.eval_fraction, 0, 0.5),
      I("eval", "every_steps", &c.eval_every_steps, 0, 1e12),
      I("data", "samples", &c.samples, 1, 1e12),
      B("data", "ledger", &c.ledger),
      B("data", "verify", &c.verify_data),
      I("batch", "global", &c.global_batch, 1, 1e9),
      I("batch", "micro", &c.micro_batch, 1, 1e9),
      S("optimizer", "kind", &c.optimizer, {"sgd", "adamw"}),
      R("optimizer", "lr", &c.lr, 1e-12, 1e3),
      R("optimizer", "momentum", &c.momentum, 0, 1),
      R("optimizer", "weight_decay", &c.weight_decay, 0, 10),
      R("optimizer", "clip_norm", &c.clip_norm, 0, 1e9),
      I("optimizer", "warmup_steps", &c.warmup_steps, 0, 1e12),
      I("optimizer", "decay_steps", &c.decay_steps, 0, 1e12),
      S("parallel", "backend", &c.backend, {"auto", "ucx", "nccl"}),
      S("parallel", "reduce_dtype", &c.reduce_dtype, {"f32", "bf16"}),
      Field{"parallel", "pipeline_stages", Kind::int_or_auto, &c.pipeline_stages, 1, 1024, {}},
      I("parallel", "max_params_per_worker", &c.max_params_per_worker, 0, 1e15),
      I("parallel", "stage_backup_steps", &c.stage_backup_steps, 0, 1e9),
      B("parallel", "recompute_activations", &c.recompute_activations),
      I("parallel", "threads_per_worker", &c.threads_per_worker, 1, 256),
      B("parallel", "overlap_reduce", &c.overlap_reduce),
      B("parallel", "deterministic", &c.deterministic),
      S("cluster", "launcher", &c.launcher, {"local", "external"}),
      I("cluster", "agents", &c.agents, 1, 4096),
      I("cluster", "devices_per_agent", &c.devices_per_agent, 1, 64),
      S("cluster", "devices", &c.devices, {"cpu", "cuda", "auto"}),
      S("cluster", "listen", &c.listen),
      I("elastic", "min_workers", &c.min_workers, 1, 1e6),
      I("elastic", "max_workers", &c.max_workers, 0, 1e6),
      I("elastic", "heartbeat_interval_ms", &c.heartbeat_interval_ms, 10, 600000),
      I("elastic", "failure_timeout_ms", &c.failure_timeout_ms, 50, 3600000),
      I("elastic", "max_restarts", &c.max_restarts, 0, 1000),
      I("elastic", "rejoin_timeout_ms", &c.rejoin_timeout_ms, 0, 86400000),
      I("elastic", "start_timeout_ms", &c.start_timeout_ms, 100, 86400000),
      I("elastic", "change_timeout_ms", &c.change_timeout_ms, 0, 86400000),
      I("elastic", "step_timeout_ms", &c.step_timeout_ms, 0, 604800000),
      I("elastic", "max_reforms", &c.max_reforms, 0, 1000),
      I("elastic", "worker_max_restarts", &c.worker_max_restarts, 0, 1000),
      I("elastic", "worker_restart_window_ms", &c.worker_restart_window_ms, 1, 86400000),
      R("elastic", "straggler_factor", &c.straggler_factor, 1.01, 1e6),
      I("elastic", "straggler_steps", &c.straggler_steps, 1, 1e9),
      B("elastic", "drain_stragglers", &c.drain_stragglers),
      S("checkpoint", "dir", &c.checkpoint_dir),
      I("checkpoint", "every_steps", &c.checkpoint_every_steps, 0, 1e12),
      I("checkpoint", "keep", &c.checkpoint_keep, 1, 1e6),
      S("checkpoint", "if_busy", &c.checkpoint_if_busy, {"wait", "skip"}),
      S("checkpoint", "on_state_lost", &c.checkpoint_on_state_lost, {"rollback", "fail"}),
      S("observability", "metrics_listen", &c.metrics_listen),
      S("observability", "trace_steps", &c.trace_steps),
      R("observability", "peak_tflops", &c.peak_tflops, 0, 1e9),
      S("logging", "level", &c.log_level, {"debug", "info", "warn", "error"}),
      B("logging", "progress", &c.progress),
  };
}

// Every key the config takes: the built-in ones, where a program's own model or data kind is
// chosen its keys instead of the built-in ones of that table.
std::vector<Field> fields_of(JobConfig& c, const ExtensionKinds& kinds = {}) {
  std::vector<Field> all = builtin_fields(c, kinds), out;
  for (auto& f : all) {
    const bool replaced =
        (f.table == "model" && !c.builtin_model()) || (f.table == "data" && !c.builtin_data());
    if (!replaced || kept_for_added_kind(f)) out.push_back(std::move(f));
  }
  auto keys = [](const auto& added, const std::string& kind) {
    auto it = added.find(kind);
    return it == added.end() ? nullptr : &it->second;
  };
  if (!c.builtin_model())
    add_option_fields(out, "model", c.model_options, keys(kinds.models, c.model_kind));
  if (!c.builtin_data())
    add_option_fields(out, "data", c.data_options, keys(kinds.datasets, c.data_kind));
  return out;
}

std::string where(const std::string& source, const toml::node& n) {
  const auto& s = n.source();
  if (s.path && s.path->rfind("--set ", 0) == 0) return *s.path;  // (apply_override's)
  if (!s.begin) return source;
  return source + ":" + std::to_string(s.begin.line) + ":" + std::to_string(s.begin.column);
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::integer:
      return "an integer";
    case Kind::real:
      return "a number";
    case Kind::string:
      return "a string";
    case Kind::boolean:
      return "true or false";
    case Kind::int_array:
      return "an array of integers";
    case Kind::int_or_auto:
      return "an integer or \"auto\"";
    case Kind::weights:
      return "a table of data sets and their weights ({ \"DIR\" = 3, \"DIR2\" = 1 })";
    case Kind::option:
      return "a value";
  }
  return "?";
}

void assign(const Field& f, const toml::node& n, const std::string& source);

// A string key with choices: one of them (model.kind and data.kind say where a program's own
// kinds come from).
void check_choice(const Field& f, const std::string& v, const std::string& at) {
  if (f.choices.empty() || std::find(f.choices.begin(), f.choices.end(), v) != f.choices.end())
    return;
  std::string list;
  for (auto& c : f.choices) list += (list.empty() ? "" : ", ") + c;
  const bool kind = f.key == "kind" && (f.table == "model" || f.table == "data");
  const std::string hint = nearest_word(v, f.choices);
  throw ConfigError(at + ": " + f.table + "." + f.key + " = \"" + v + "\" is not one of: " + list +
                    (hint.empty() ? "" : "; did you mean \"" + hint + "\"?") +
                    (kind ? " (a kind a program adds is known to that program: run the job "
                            "with it, docs/api.md)"
                          : ""));
}

// data.mix: data sets and their positive weights.
void assign_weights(const Field& f, const toml::table& t, const std::string& source) {
  std::map<std::string, double> out;
  for (auto&& [k, v] : t) {
    const std::string set(k.str());
    if (!v.is_number() || !std::isfinite(*v.value<double>()) || *v.value<double>() <= 0)
      throw ConfigError(where(source, v) + ": " + f.table + "." + f.key + ": the weight of '" +
                        set + "' must be a positive number");
    out[set] = *v.value<double>();
  }
  *static_cast<std::map<std::string, double>*>(f.target) = out;
}

// A program's key: checked as the built-in key of its type would be, then stored.
void assign_option(const Field& f, const toml::node& n, const std::string& source) {
  int64_t i = 0;
  double d = 0;
  bool b = false;
  std::string s;
  static const Kind kinds[] = {Kind::integer, Kind::real, Kind::boolean, Kind::string};
  void* targets[] = {&i, &d, &b, &s};
  Field scalar = f;
  scalar.kind = kinds[f.option_type];
  scalar.target = targets[f.option_type];
  assign(scalar, n, source);
  auto& out = *static_cast<OptionValue*>(f.target);
  switch (f.option_type) {
    case 0:
      out = i;
      break;
    case 1:
      out = d;
      break;
    case 2:
      out = b;
      break;
    default:
      out = s;
  }
}

// text as a TOML basic string: "...", with its quotes, backslashes and control characters escaped.
std::string toml_string(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20 || c == 0x7f) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", c);
      out += esc;
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

// A number as written in a config (%.15g: 1e12 as 1000000000000, 0.002 as 0.002).
std::string exact(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.15g", v);
  return text;
}

void assign(const Field& f, const toml::node& n, const std::string& source) {
  std::string at = where(source, n), name = f.table + "." + f.key;
  auto range = [&](double v, const std::string& shown) {  // (an integer's shown as it was given)
    if (v < f.min || v > f.max)
      throw ConfigError(at + ": " + name + " = " + shown + " is out of range [" + exact(f.min) +
                        ", " + exact(f.max) + "]");
  };
  auto wrong = [&]() -> ConfigError {
    const std::string type(toml::impl::node_type_friendly_names[size_t(n.type())]);
    const bool vowel = !type.empty() && std::string("aeiou").find(type[0]) != std::string::npos;
    // (a string's value shown: one a --set took for a bare word, e.g. "[1")
    const std::string shown =
        n.is_string() ? " (" + toml_string(*n.value<std::string>()) + ")" : "";
    // (--set observability.trace_steps=500: a bare number is one; a string of it is quoted)
    std::string value;
    if (f.kind == Kind::string && at.rfind("--set", 0) == 0) {
      if (auto v = n.as_integer()) value = std::to_string(v->get());
      if (auto v = n.as_floating_point()) value = exact(v->get());
      if (auto v = n.as_boolean()) value = v->get() ? "true" : "false";
    }
    const std::string quoted =
        value.empty() ? "" : "; as a string: --set " + name + "='\"" + value + "\"'";
    return ConfigError(at + ": " + name + " must be " + kind_name(f.kind) + ", not " +
                       (vowel ? "an " : "a ") + type + shown + quoted);
  };
  switch (f.kind) {
    case Kind::integer: {
      auto v = n.value<int64_t>();
      if (!n.is_integer() || !v) throw wrong();
      range(double(*v), std::to_string(*v));
      *static_cast<int64_t*>(f.target) = *v;
      break;
    }
    case Kind::int_or_auto: {  // "auto" is stored as 0
      if (n.is_string() && *n.value<std::string>() == "auto") {
        *static_cast<int64_t*>(f.target) = 0;
        break;
      }
      auto v = n.value<int64_t>();
      if (!n.is_integer() || !v) throw wrong();
      range(double(*v), std::to_string(*v));
      *static_cast<int64_t*>(f.target) = *v;
      break;
    }
    case Kind::real: {
      if (!n.is_number()) throw wrong();
      double v = *n.value<double>();
      if (!std::isfinite(v)) throw ConfigError(at + ": " + name + " must be a finite number");
      range(v, exact(v));
      *static_cast<double*>(f.target) = v;
      break;
    }
    case Kind::string: {
      if (!n.is_string()) throw wrong();
      std::string v = *n.value<std::string>();
      check_choice(f, v, at);
      *static_cast<std::string*>(f.target) = v;
      break;
    }
    case Kind::boolean: {
      if (!n.is_boolean()) throw wrong();
      *static_cast<bool*>(f.target) = *n.value<bool>();
      break;
    }
    case Kind::int_array: {
      auto* arr = n.as_array();
      if (!arr || arr->empty())
        throw ConfigError(at + ": " + name + " must be a non-empty array of integers");
      std::vector<int64_t> out;
      for (auto& e : *arr) {
        if (!e.is_integer())
          throw ConfigError(where(source, e) + ": " + name + " must hold integers only");
        int64_t v = *e.value<int64_t>();
        range(double(v), std::to_string(v));
        out.push_back(v);
      }
      *static_cast<std::vector<int64_t>*>(f.target) = out;
      break;
    }
    case Kind::weights:
      if (!n.as_table()) throw wrong();
      assign_weights(f, *n.as_table(), source);
      break;
    case Kind::option:
      assign_option(f, n, source);
      break;
  }
}

// (spaces around the key and the value, as a config file's `key = value` has them, go)
std::string trimmed(std::string s) {
  const char* space = " \t";
  s.erase(0, s.find_first_not_of(space));
  s.erase(s.find_last_not_of(space) + 1);
  return s;
}

void apply_override(toml::table& root, const std::string& ov) {
  auto eq = ov.find('=');
  auto dot = ov.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq) {
    throw ConfigError("--set " + ov + ": expected table.key=value");
  }
  std::string table = trimmed(ov.substr(0, dot)), key = trimmed(ov.substr(dot + 1, eq - dot - 1)),
              value = trimmed(ov.substr(eq + 1));
  // (Its nodes' source is "--set ...": what a message about the key names, not the file.)
  const std::string origin = "--set " + table + "." + key;
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value, origin);
  } catch (const toml::parse_error&) {  // a bare word: a string
    try {
      parsed = toml::parse("v = " + toml_string(value), origin);
    } catch (const toml::parse_error& e) {
      throw ConfigError(origin + ": " + std::string(e.description()));
    }
  }
  if (!root.contains(table)) root.insert(table, toml::table{});
  auto* t = root[table].as_table();
  if (!t) {  // (the file's mistake: named where it is)
    const auto& at = root[table].node()->source();
    const std::string where = at.path ? *at.path + ":" + std::to_string(at.begin.line) + ":" +
                                            std::to_string(at.begin.column)
                                      : std::string("the config");
    throw ConfigError(where + ": '" + table + "' is not a table (--set " + ov +
                      " sets a key in it)");
  }
  // (moved, not copied: a copy of a toml node drops its source)
  parsed["v"].node()->visit([&](auto&& n) { t->insert_or_assign(key, std::move(n)); });
}

// Where each key was set ("table.key" -> "file:line:col"), for messages about it.
using Places = std::map<std::string, std::string>;

constexpr const char* kPipeline =
    "a pipeline (parallel.pipeline_stages above 1, or \"auto\" with "
    "parallel.max_params_per_worker)";

// Keys this build accepts but cannot act on: refused, never ignored.
// A built-in kind's key changed from its default while another kind is chosen would not act
// (data.samples of a token job, model.hidden of a GPT, optimizer.momentum of AdamW): the message
// naming it, or "". At their defaults they are not: the effective config writes every key.
std::string inert_key_of(const JobConfig& c, const std::function<std::string(const char*)>& place) {
  const JobConfig d;
  struct Key {
    const char* key;
    bool changed, acts;
    const char* with;
  };
  const bool mlp = c.model_kind == "mlp", gpt = c.model_kind == "gpt";
  const bool model = c.builtin_model(), data = c.builtin_data();
  // (A loop of its own, model.kind = "external", has its own optimizer: only optimizer.lr
  // reaches it, as LoopStep::lr.)
  const char* troupes =
      "Troupe's workers (model.kind = \"external\": the loop's optimizer is "
      "its own, and only optimizer.lr reaches it)";
  const Key keys[] = {
      {"optimizer.kind", c.optimizer != d.optimizer, !c.external(), troupes},
      {"optimizer.momentum", c.momentum != d.momentum, !c.external(), troupes},
      {"optimizer.weight_decay", c.weight_decay != d.weight_decay, !c.external(), troupes},
      {"optimizer.clip_norm", c.clip_norm != d.clip_norm, !c.external(), troupes},
      {"optimizer.warmup_steps", c.warmup_steps != d.warmup_steps, !c.external(), troupes},
      {"optimizer.decay_steps", c.decay_steps != d.decay_steps, !c.external(), troupes},
      {"model.hidden", c.hidden != d.hidden, mlp || !model, "model.kind = \"mlp\""},
      {"model.inputs", c.inputs != d.inputs, mlp || !model, "model.kind = \"mlp\""},
      {"model.classes", c.classes != d.classes, mlp || !model, "model.kind = \"mlp\""},
      {"model.layers", c.layers != d.layers, gpt || !model, "model.kind = \"gpt\""},
      {"model.d_model", c.d_model != d.d_model, gpt || !model, "model.kind = \"gpt\""},
      {"model.heads", c.heads != d.heads, gpt || !model, "model.kind = \"gpt\""},
      {"model.context", c.context != d.context, gpt || !model, "model.kind = \"gpt\""},
      {"model.tied_head", c.tied_head != d.tied_head, gpt || !model, "model.kind = \"gpt\""},
      {"data.samples", c.samples != d.samples, c.data_kind == "synthetic" || !data,
       "data.kind = \"synthetic\""},
      {"data.path", c.data_path != d.data_path && !c.data_path.empty(),
       c.data_kind != "synthetic" || !data, "data.kind = \"text\" or \"tokens\""},
      {"optimizer.momentum", c.momentum != d.momentum, c.optimizer == "sgd",
       "optimizer.kind = \"sgd\""},
      {"parallel.recompute_activations", c.recompute_activations != d.recompute_activations,
       c.may_pipeline(), kPipeline},
      {"parallel.stage_backup_steps", c.stage_backup_steps != d.stage_backup_steps,
       c.may_pipeline(), kPipeline},
  };
  for (const Key& k : keys)
    if (k.changed && !k.acts)
      return place(k.key) + ": " + k.key + " acts only with " + k.with +
             ": it would not act in this job";
  return "";
}

// elastic.min_workers and max_workers against each other and the workers the job starts with
// (its first generation takes every one of them: a maximum below them, or a minimum above them,
// would not act as the documentation says): why, with the key's place, or "".
std::string worker_bounds_refusal(const JobConfig& c,
                                  const std::function<std::string(const char*)>& place) {
  const std::string workers =
      std::to_string(c.workers()) + " (cluster.agents x cluster.devices_per_agent)";
  if (c.max_workers > 0 && c.min_workers > c.max_workers)
    return place("elastic.min_workers") +
           ": elastic.min_workers = " + std::to_string(c.min_workers) +
           " is above elastic.max_workers = " + std::to_string(c.max_workers);
  if (c.min_workers > c.workers())
    return place("elastic.min_workers") +
           ": elastic.min_workers = " + std::to_string(c.min_workers) +
           " is above the workers the job starts with, " + workers;
  if (c.max_workers > 0 && c.max_workers < c.workers())
    return place("elastic.max_workers") +
           ": elastic.max_workers = " + std::to_string(c.max_workers) +
           " is below the workers the job starts with, " + workers +
           ", all of which train from the start (agents that join later wait above it " +
           "as standbys)";
  return "";
}

void refuse_what_cannot_act(const JobConfig& c, const std::string& source, const Places& at) {
  auto place = [&](const std::string& key) {
    auto it = at.find(key);
    return it == at.end() ? source : it->second;
  };
  // NCCL carries CUDA tensors of a job's members, each on its own GPU (workers/device_plane.h:
  // gradients, a pipeline's activations); what it cannot serve is refused here, the rest when a
  // generation forms (members sharing a GPU).
  auto refuse_nccl = [&](const std::string& key, const std::string& why) {
    throw ConfigError(place(key) + ": parallel.backend = \"nccl\" " + why +
                      "; \"auto\" picks NCCL where it can serve the members");
  };
  if (c.backend == "nccl" && c.devices == "cpu")
    refuse_nccl("cluster.devices",
                "reduces CUDA tensors, and cluster.devices = \"cpu\" (the workers compute on the "
                "CPU)");
  if (c.backend == "nccl" && c.deterministic)
    refuse_nccl("parallel.deterministic",
                "cannot make the sums exact (exact sums are formed host-staged over UCX)");
  if (c.backend == "nccl" && c.external())
    refuse_nccl("model.kind", "serves Troupe's own workers (an external loop reduces host memory)");
  // (checkpoint.dir acts without every_steps: troupe checkpoint, stop --checkpoint and SIGTERM
  // write there; a checkpoint asked for always waits for the write before it.)
  if (c.checkpoint_if_busy == "skip" && c.checkpoint_every_steps == 0)
    throw ConfigError(place("checkpoint.if_busy") +
                      ": checkpoint.if_busy = \"skip\" skips periodic checkpoints, and "
                      "checkpoint.every_steps is 0 (a checkpoint asked for is never skipped)");
  if (!c.verify_data && c.data_kind != "tokens")  // (at its default it is accepted, as all)
    throw ConfigError(place("data.verify") +
                      ": data.verify checks token data sets' files against their manifests; "
                      "data.kind is \"" +
                      c.data_kind + "\"");
  if (c.change_timeout_ms > 0 && c.change_timeout_ms <= c.failure_timeout_ms)
    throw ConfigError(place("elastic.change_timeout_ms") +
                      ": elastic.change_timeout_ms must be larger than "
                      "elastic.failure_timeout_ms (a member needs that long to notice a loss)");
  if (c.step_timeout_ms > 0 && c.step_timeout_ms <= c.failure_timeout_ms)
    throw ConfigError(place("elastic.step_timeout_ms") +
                      ": elastic.step_timeout_ms must be larger than "
                      "elastic.failure_timeout_ms (a member's peers notice a loss within that)");
}

// data.kind = "text" reads the file's bytes as characters: a regular file (never a FIFO, a
// device or a directory: they could block or never end), of a bounded size, text rather than
// binary, and longer than the context. Opened without blocking and read no further than 64 KiB.
void check_text_file(const JobConfig& c, const std::string& at) {
  auto fail = [&](const std::string& m) {
    throw ConfigError(at + ": data.path: '" + c.data_path + "' " + m);
  };
  const int fd = ::open(c.data_path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) fail(std::string("cannot be read: ") + std::strerror(errno));
  struct stat st {};
  const bool ok = ::fstat(fd, &st) == 0;
  char head[65536];
  const ssize_t n = ok && S_ISREG(st.st_mode) ? ::read(fd, head, sizeof head) : 0;
  ::close(fd);
  if (!ok) fail("cannot be read");
  if (S_ISDIR(st.st_mode)) fail("is a directory, not a text file");
  if (!S_ISREG(st.st_mode))
    fail(std::string("is not a regular file (") +
         (S_ISFIFO(st.st_mode)  ? "a FIFO"
          : S_ISCHR(st.st_mode) ? "a character device"
                                : "special") +
         "): the text is read whole, so it must be a file of known size");
  if (st.st_size == 0) fail("is empty");
  if (st.st_size > kMaxTextBytes)
    fail("has " + std::to_string(st.st_size) + " bytes, more than the " +
         std::to_string(kMaxTextBytes) + " a text data set is read into memory with");
  if (n > 0 && std::memchr(head, 0, size_t(n)))
    fail("looks binary (a NUL byte at offset " +
         std::to_string(static_cast<const char*>(std::memchr(head, 0, size_t(n))) - head) +
         "): data.kind = \"text\" trains on its characters");
  if (c.model_kind == "gpt" && st.st_size <= c.context + 1)
    fail("has " + std::to_string(st.st_size) + " characters; model.context = " +
         std::to_string(c.context) + " needs more than " + std::to_string(c.context + 1));
}

// data.kind = "tokens": data.path, or data.mix's sets, are directories with a manifest (what is
// in them is checked when they are opened: troupe run does before anything starts).
// A prepared data set's tokenizer fingerprint, as its manifest says ("" when it does not say, or
// cannot be read: the workers name what is wrong with it).
std::string tokenizer_of(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (1 << 26)) return "";
  std::ifstream in(path);
  const nlohmann::json m = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!m.is_object() || !m.contains("tokenizer") || !m["tokenizer"].is_object()) return "";
  const auto& f = m["tokenizer"].value("fingerprint", nlohmann::json());
  return f.is_string() ? f.get<std::string>() : "";
}

}  // namespace

std::string content_digest(const std::string& kind, const std::string& path) {
  uint64_t h = comm::fnv1a(nullptr, 0);
  auto add = [&h](const std::string& s) {
    h = comm::fnv1a(reinterpret_cast<const uint8_t*>(s.data()), s.size(), h);
  };
  if (kind == "text") {
    std::ifstream in(path, std::ios::binary);
    if (!in) return "";  // (not the digest of nothing)
    std::vector<char> buf(1 << 20);
    while (in && !in.eof()) {
      in.read(buf.data(), std::streamsize(buf.size()));
      h = comm::fnv1a(reinterpret_cast<const uint8_t*>(buf.data()), size_t(in.gcount()), h);
    }
    if (in.bad()) return "";
  } else {
    struct stat st {};
    const std::string manifest = path + "/manifest.json";
    if (::stat(manifest.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (1 << 26))
      return "";
    std::ifstream in(manifest);
    const nlohmann::json m = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!m.is_object() || !m.contains("shards") || !m["shards"].is_array()) return "";
    for (const auto& shard : m["shards"])
      if (shard.is_object())
        add(shard.value("fnv1a64", nlohmann::json()).dump() + ":" +
            shard.value("tokens", nlohmann::json()).dump() + ";");
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

namespace {

void check_token_sets(const JobConfig& c, const std::map<std::string, std::string>& at,
                      const std::string& source) {
  auto place = [&](const std::string& key) {
    auto it = at.find(key);
    return it == at.end() ? source : it->second;
  };
  // (data.path = "" is unset: how --set data.mix goes past a file's data.path)
  const bool path_set = at.count("data.path") > 0 && !c.data_path.empty();
  if (path_set && !c.data_mix.empty())
    throw ConfigError(place("data.mix") +
                      ": data.mix names the data sets; data.path is set too (set one of them; "
                      "--set data.path=\"\" unsets the file's)");
  if (!path_set && c.data_mix.empty())
    throw ConfigError(place("data.kind") +
                      ": data.kind = \"tokens\" needs data.path (a "
                      "directory made by troupe data prepare or import) or data.mix");
  std::vector<std::pair<std::string, std::string>> dirs;  // (dir, key)
  if (path_set) dirs.emplace_back(c.data_path, "data.path");
  for (const auto& [dir, w] : c.data_mix) dirs.emplace_back(dir, "data.mix");
  std::map<std::pair<dev_t, ino_t>, std::string> seen;  // (a set named twice: a.b and ./a.b)
  for (const auto& [dir, key] : dirs) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      throw ConfigError(place(key) + ": " + key + ": '" + dir +
                        "' is not a directory (troupe data prepare INPUT... --out DIR makes one; " +
                        "troupe data import of llm.c's token files too)");
    if (const auto [it, fresh] = seen.emplace(std::pair{st.st_dev, st.st_ino}, dir); !fresh)
      throw ConfigError(place(key) + ": " + key + ": '" + it->second + "' and '" + dir +
                        "' are the same data set (name it once, with the sum of the weights)");
    if (::stat((dir + "/manifest.json").c_str(), &st) != 0)
      throw ConfigError(place(key) + ": " + key + ": '" + dir +
                        "' has no manifest.json: not a prepared data set, or its prepare did "
                        "not finish");
  }
}

// eval.every_steps evaluates on data.eval_path or data.eval_fraction of a token job, data
// parallel; either without the other would not act.
void check_evaluation(const JobConfig& c, const std::map<std::string, std::string>& at,
                      const std::string& source, bool check_data) {
  auto place = [&](const std::string& key) {
    auto it = at.find(key);
    return it == at.end() ? source : it->second;
  };
  const bool held_out = !c.eval_path.empty() || c.eval_fraction > 0;
  if (c.eval_every_steps == 0) {
    if (held_out)
      throw ConfigError(place(c.eval_path.empty() ? "data.eval_fraction" : "data.eval_path") +
                        ": a held-out set without eval.every_steps is never evaluated (set "
                        "eval.every_steps = N)");
    return;
  }
  auto fail = [&](const std::string& m) {
    throw ConfigError(place("eval.every_steps") + ": eval.every_steps " + m);
  };
  if (c.data_kind != "tokens") fail("needs data.kind = \"tokens\"");
  if (!held_out) fail("needs a held-out set: data.eval_path = DIR or data.eval_fraction = F");
  if (!c.eval_path.empty() && c.eval_fraction > 0)
    throw ConfigError(place("data.eval_fraction") +
                      ": data.eval_path and data.eval_fraction both name the held-out set (set "
                      "one of them)");
  if (c.pipeline_stages != 1)
    fail("evaluates with data parallelism only (parallel.pipeline_stages = 1)");
  if (!c.eval_path.empty() && check_data) {
    struct stat st {};
    if (::stat((c.eval_path + "/manifest.json").c_str(), &st) != 0)
      throw ConfigError(place("data.eval_path") + ": data.eval_path: '" + c.eval_path +
                        "' is not a prepared data set (no manifest.json)");
  }
}

// model.kind = "external": the members' own loop computes and updates; the keys that would ask
// Troupe to compute something for it are refused.
void check_external(const JobConfig& c, const std::string& source, const Places& at) {
  auto place = [&](const std::string& key) {
    auto it = at.find(key);
    return it == at.end() ? source : it->second;
  };
  auto refuse = [&](const std::string& key, const std::string& why) {
    throw ConfigError(place(key) + ": " + key + " " + why +
                      " (model.kind = \"external\": the members run their own loop)");
  };
  if (c.pipeline_stages != 1) refuse("parallel.pipeline_stages", "must be 1");
  if (c.deterministic) refuse("parallel.deterministic", "cannot make another loop's sums exact");
  if (c.reduce_dtype != "f32")
    refuse("parallel.reduce_dtype", "must be \"f32\" (the loop's buffers are its own)");
  if (c.overlap_reduce) refuse("parallel.overlap_reduce", "acts on Troupe's own workers only");
  if (c.checkpoint_every_steps > 0 || !c.checkpoint_dir.empty())
    refuse(c.checkpoint_dir.empty() ? "checkpoint.every_steps" : "checkpoint.dir",
           "needs Troupe's workers: the loop keeps its own checkpoints");
  if (c.checkpoint_on_state_lost != "rollback")
    refuse("checkpoint.on_state_lost", "needs Troupe's workers: the loop keeps its own state");
  if (c.launcher != "external")
    refuse("cluster.launcher",
           "must be \"external\": the members are processes of your program, started by you");
}

// "A-B" (A <= B) or "N": the first and last step; false when it is neither.
bool step_range(const std::string& text, int64_t& first, int64_t& last) {
  const size_t dash = text.find('-');
  const std::string a = text.substr(0, dash),
                    b = dash == std::string::npos ? a : text.substr(dash + 1);
  auto digits = [](const std::string& x) {
    return !x.empty() && x.size() <= 12 && x.find_first_not_of("0123456789") == std::string::npos;
  };
  if (!digits(a) || !digits(b)) return false;
  first = std::stoll(a);
  last = std::stoll(b);
  return first <= last;
}

}  // namespace

bool host_and_port(const std::string& a) {
  const size_t colon = a.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  const std::string port = a.substr(colon + 1);
  return !port.empty() && port.size() <= 5 &&
         port.find_first_not_of("0123456789") == std::string::npos && std::stoi(port) <= 65535;
}

namespace {

// job.name (the job's id in its token file, "JOB_ID TOKEN", and its run directory's name) and
// the addresses the job listens on.
void check_name_and_addresses(const JobConfig& c,
                              const std::function<std::string(const char*)>& place) {
  const bool plain = std::none_of(c.name.begin(), c.name.end(), [](char ch) {
    return std::isspace(static_cast<unsigned char>(ch)) ||
           std::iscntrl(static_cast<unsigned char>(ch)) || ch == '/';
  });
  if (c.name.empty() || !plain)
    throw ConfigError(place("job.name") + ": job.name = \"" + c.name +
                      "\" must be a non-empty name without spaces, control characters or '/' "
                      "(it names the job's run directory and its id in the token file)");
  for (auto [key, value, example] :
       {std::tuple{"observability.metrics_listen", &c.metrics_listen, "127.0.0.1:9400"},
        std::tuple{"cluster.listen", &c.listen, "127.0.0.1:0"}})
    if ((!value->empty() || value == &c.listen) && !host_and_port(*value))  // ("": metrics off)
      throw ConfigError(place(key) + ": " + key + " = \"" + *value +
                        "\" is not HOST:PORT (e.g. \"" + example + "\"; port 0 picks one)");
}

void validate(const JobConfig& c, const std::string& source, const Places& at, bool check_data) {
  auto place = [&](const std::string& key) {
    auto it = at.find(key);
    return it == at.end() ? source : it->second;
  };
  refuse_what_cannot_act(c, source, at);
  // (placed at the key the message begins with: its line, or the --set that gave it)
  auto fail = [&](const std::string& m) {
    throw ConfigError(place(m.substr(0, m.find_first_of(" =("))) + ": " + m);
  };
  check_name_and_addresses(c, [&](const char* key) { return place(key); });
  if (c.micro_batch > c.global_batch)
    throw ConfigError(place("batch.micro") + ": batch.micro (" + std::to_string(c.micro_batch) +
                      ") exceeds batch.global (" + std::to_string(c.global_batch) +
                      "): a micro-batch is part of a step's samples");
  if (c.global_batch < c.workers())
    fail("batch.global (" + std::to_string(c.global_batch) +
         ") is smaller than the number of workers (" + std::to_string(c.workers()) + ")");
  if (c.model_kind == "gpt" && c.d_model % c.heads != 0)
    throw ConfigError(place("model.heads") + ": model.d_model (" + std::to_string(c.d_model) +
                      ") must be divisible by model.heads (" + std::to_string(c.heads) + ")");
  if (c.dtype == "bf16" && c.model_kind != "mlp" && c.model_kind != "gpt")
    fail(
        "model.dtype = \"bf16\" is for the built-in models (mlp, gpt): a program's own "
        "model.kind \"" +
        c.model_kind + "\" computes in the precision its blocks are written in");
  if (c.model_kind == "gpt" && c.data_kind != "text" && c.data_kind != "tokens")
    fail("model.kind = \"gpt\" needs data.kind = \"text\" or \"tokens\"");
  if (c.model_kind == "mlp" && (c.data_kind == "text" || c.data_kind == "tokens"))
    fail("model.kind = \"mlp\" needs data.kind = \"synthetic\" (or a program's own)");
  if (c.failure_timeout_ms <= c.heartbeat_interval_ms)
    throw ConfigError(place(at.count("elastic.heartbeat_interval_ms")
                                ? "elastic.heartbeat_interval_ms"
                                : "elastic.failure_timeout_ms") +
                      ": elastic.failure_timeout_ms (" + std::to_string(c.failure_timeout_ms) +
                      ") must be larger than elastic.heartbeat_interval_ms (" +
                      std::to_string(c.heartbeat_interval_ms) + ")");
  if (c.may_pipeline() && c.tied_head)
    fail("parallel.pipeline_stages = " +
         (c.pipeline_stages ? std::to_string(c.pipeline_stages) : std::string("\"auto\"")) +
         " needs model.tied_head = false (a tied head would span the first and last stages)");
  if (c.pipeline_stages > c.workers())
    fail("parallel.pipeline_stages = " + std::to_string(c.pipeline_stages) +
         " needs at least as many workers; cluster.agents x cluster.devices_per_agent = " +
         std::to_string(c.workers()));
  if (c.pipeline_stages != 1 && c.overlap_reduce)
    fail("parallel.overlap_reduce works with parallel.pipeline_stages = 1 only");
  if (c.deterministic && c.global_batch % c.micro_batch != 0)
    fail("parallel.deterministic needs batch.global (" + std::to_string(c.global_batch) +
         ") to be a multiple of batch.micro (" + std::to_string(c.micro_batch) +
         "): the global micro-batches are what every layout computes alike");
  if (c.reduce_dtype == "bf16" && (c.deterministic || c.pipeline_stages != 1))
    throw ConfigError(place("parallel.reduce_dtype") +
                      ": parallel.reduce_dtype = \"bf16\" rounds the gradients of a "
                      "data-parallel step; " +
                      (c.deterministic ? "parallel.deterministic sums them exactly"
                                       : "a pipeline's replicas reduce in f32 in this build"));
  if (c.deterministic && c.overlap_reduce)
    fail(
        "parallel.deterministic sums every micro-batch's gradient after the backward pass; "
        "it cannot overlap the reduction (set parallel.overlap_reduce = false)");
  if (c.external() != (c.data_kind == "external"))
    fail(
        "model.kind = \"external\" and data.kind = \"external\" go together: the members' "
        "own loop brings its model and its data");
  if (c.external()) check_external(c, source, at);
  if (c.data_kind == "text" && check_data) check_text_file(c, place("data.path"));
  if (c.data_kind == "tokens" && check_data) check_token_sets(c, at, source);
  check_evaluation(c, at, source, check_data);
  if (c.data_kind != "tokens" && !c.data_mix.empty())
    throw ConfigError(place("data.mix") +
                      ": data.mix mixes token data sets: it needs "
                      "data.kind = \"tokens\"");
}

}  // namespace

static size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] =
          std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string nearest_word(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best_d <= std::max<size_t>(2, word.size() / 2) ? best : "";
}

namespace {

// A table's "kind" string in the file ("" if none).
std::string kind_in(toml::table& root, const char* table) {
  auto* t = root[table].as_table();
  auto v = t ? (*t)["kind"].value<std::string>() : std::nullopt;
  return v ? *v : "";
}

// A program's kinds chosen in the file: the config takes their keys, with their defaults.
void choose_added_kinds(toml::table& root, const ExtensionKinds& kinds, JobConfig& c) {
  if (kind_in(root, "model") == "external") {  // (its data and its members are its own too)
    c.model_kind = "external";
    c.data_kind = "external";
    c.launcher = "external";
  }
  if (auto it = kinds.models.find(kind_in(root, "model")); it != kinds.models.end()) {
    c.model_kind = it->first;
    for (const auto& k : it->second)
      c.model_options[k.name] = c.model_defaults[k.name] = k.default_value;
  }
  if (auto it = kinds.datasets.find(kind_in(root, "data")); it != kinds.datasets.end()) {
    c.data_kind = it->first;
    for (const auto& k : it->second)
      c.data_options[k.name] = c.data_defaults[k.name] = k.default_value;
  }
}

// A kind this program does not have is named as such first (not the keys it would take as
// unknown keys of the built-in kind).
void check_kinds(toml::table& root, const std::string& source, const std::vector<Field>& fields) {
  for (const char* table : {"model", "data"}) {
    const auto* t = root[table].as_table();
    const toml::node* kind = t ? t->get("kind") : nullptr;
    if (!kind) continue;
    for (const auto& f : fields)
      if (f.table == table && f.key == "kind") assign(f, *kind, source);
  }
}

// The message for a key the table does not take (with the nearest one, or the keys a
// program's kind takes).
std::string unknown_key(const JobConfig& c, const std::vector<Field>& fields,
                        const std::string& table, const std::string& key) {
  std::vector<std::string> keys;
  for (auto& f : fields)
    if (f.table == table) keys.push_back(f.key);
  const bool added =
      (table == "model" && !c.builtin_model()) || (table == "data" && !c.builtin_data());
  std::string msg = "unknown key " + table + "." + key;
  const std::string hint = nearest_word(key, keys);
  if (added) {
    std::string list;
    for (auto& k : keys) list += (list.empty() ? "" : ", ") + k;
    msg += " (" + table + ".kind = \"" + (table == "model" ? c.model_kind : c.data_kind) +
           "\" takes: " + list + ")";
  }
  return msg + (hint.empty() ? "" : "; did you mean " + table + "." + hint + "?");
}

// Every table and key the job does not take, one line each in the file's order (a file with two
// typos names both), as one ConfigError; nothing when there is none.
void reject_unknown(const toml::table& root, const std::string& source, const JobConfig& c,
                    const std::vector<Field>& fields, const std::vector<std::string>& tables) {
  std::vector<std::tuple<uint32_t, uint32_t, std::string>> found;  // (line, column, message)
  auto add = [&](const toml::source_region& s, const std::string& at, const std::string& what) {
    found.emplace_back(uint32_t(s.begin.line), uint32_t(s.begin.column), at + ": " + what);
  };
  for (auto& [tkey, tnode] : root) {
    const std::string tname(tkey.str());
    if (std::find(tables.begin(), tables.end(), tname) == tables.end()) {
      const std::string hint = nearest_word(tname, tables);
      const auto* made = tnode.as_table();  // (made by --set: its key names it, not the file)
      const toml::node& at = made && !tnode.source().begin && !made->empty()
                                 ? made->cbegin()->second
                                 : static_cast<const toml::node&>(tnode);
      add(tnode.source(), where(source, at),
          "unknown table [" + tname + "]" + (hint.empty() ? "" : "; did you mean [" + hint + "]?"));
      continue;
    }
    const auto* t = tnode.as_table();
    if (!t) {
      add(tnode.source(), where(source, tnode), "'" + tname + "' must be a table");
      continue;
    }
    for (auto& [kkey, knode] : *t) {
      const std::string kname(kkey.str());
      if (std::any_of(fields.begin(), fields.end(),
                      [&](const Field& f) { return f.table == tname && f.key == kname; }))
        continue;
      const auto& ks = kkey.source();
      const std::string at = ks.begin ? source + ":" + std::to_string(ks.begin.line) + ":" +
                                            std::to_string(ks.begin.column)
                                      : where(source, knode);
      add(ks.begin ? ks : knode.source(), at, unknown_key(c, fields, tname, kname));
    }
  }
  if (found.empty()) return;
  std::sort(found.begin(), found.end());
  std::string all;
  for (const auto& f : found) all += (all.empty() ? "" : "\n") + std::get<2>(f);
  throw ConfigError(all);
}

}  // namespace

namespace {

// One character of TOML text outside strings and comments, for toml_too_deep: the nesting of
// arrays and inline tables, and the dotted parts of the key being read.
struct TomlShape {
  std::string open;  // the '[' and '{' not yet closed (a table header's too)
  bool key = true;   // in a key (a line's start, a header, after '{' or an inline table's ',')
  size_t dots = 0;   // of the key being read
  void take(char ch) {
    if (ch == '\n' && open.empty()) key = true, dots = 0;
    if (ch == '=') key = false, dots = 0;
    if (ch == '.' && key) ++dots;
    if (ch == '[' || ch == '{') open.push_back(ch), key = key || ch == '{';
    if ((ch == ']' || ch == '}') && !open.empty()) {
      open.pop_back();
      key = key && ch == ']' && open.empty();  // (a header's key ends with its line)
    }
    if (ch == ',') key = !open.empty() && open.back() == '{', dots = 0;
  }
};

}  // namespace

std::string override_key(const std::string& ov) {
  const auto eq = ov.find('='), dot = ov.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq) return "";
  return trimmed(ov.substr(0, dot)) + "." + trimmed(ov.substr(dot + 1, eq - dot - 1));
}

std::string toml_too_deep(std::string_view text) {
  constexpr size_t kMax = 256;
  TomlShape shape;
  size_t line = 1;
  char quote = 0;  // inside a string of this quote
  bool comment = false, triple = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (ch == '\n') ++line, comment = false, quote = triple ? quote : 0;
    if (comment) continue;
    if (quote) {
      if (ch == '\\' && quote == '"') {
        ++i;
      } else if (ch == quote && (!triple || text.substr(i, 3) == std::string(3, quote))) {
        i += triple ? 2 : 0;
        while (triple && i + 1 < text.size() && text[i + 1] == quote) ++i;  // (""""" ends one)
        quote = 0;
      }
      continue;
    }
    if (ch == '#') comment = true;
    if (ch == '"' || ch == '\'') {
      quote = ch;
      triple = text.substr(i, 3) == std::string(3, ch);
      i += triple ? 2 : 0;
      continue;
    }
    shape.take(ch);
    if (shape.dots >= kMax || shape.open.size() > kMax)
      return std::to_string(line) + ": " +
             (shape.dots >= kMax ? "a key of more than 256 dotted parts"
                                 : "arrays or tables nested more than 256 deep");
  }
  return "";
}

namespace {}  // namespace

JobConfig parse_config(const std::string& text, const std::string& source,
                       const std::vector<std::string>& overrides, const ExtensionKinds& kinds,
                       bool check_data) {
  // (toml++ parses keys, headers and arrays recursively: 50,000 dotted parts overflowed its
  // stack, a crash on a 100 KB file)
  if (std::string why = toml_too_deep(text); !why.empty())
    throw ConfigError(source + ":" + why + ": not a config");
  toml::table root;
  try {
    root = toml::parse(std::string_view(text), source);
  } catch (const toml::parse_error& e) {
    const auto& s = e.source();
    throw ConfigError(source + ":" + std::to_string(s.begin.line) + ":" +
                      std::to_string(s.begin.column) +
                      ": syntax error: " + std::string(e.description()));
  }
  for (auto& ov : overrides) apply_override(root, ov);
  JobConfig c;
  choose_added_kinds(root, kinds, c);
  Places places;
  auto fields = fields_of(c, kinds);
  std::vector<std::string> tables;
  for (auto& f : fields)
    if (std::find(tables.begin(), tables.end(), f.table) == tables.end()) tables.push_back(f.table);
  check_kinds(root, source, fields);
  reject_unknown(root, source, c, fields, tables);
  for (auto& [tkey, tnode] : root) {
    std::string tname(tkey.str());
    for (auto& [kkey, knode] : *tnode.as_table()) {
      std::string kname(kkey.str());
      auto it = std::find_if(fields.begin(), fields.end(),
                             [&](const Field& f) { return f.table == tname && f.key == kname; });
      assign(*it, knode, source);
      places[tname + "." + kname] = where(source, knode);
    }
  }
  auto place = [&](const char* key) {
    auto it = places.find(key);
    return it == places.end() ? source : it->second;
  };
  if (!c.trace_steps.empty()) {
    const std::string bad =
        !step_range(c.trace_steps, c.trace_first, c.trace_last)
            ? "is not a step range: \"A-B\" (A <= B) or \"N\""
        : c.trace_first >= c.steps  // (it would trace nothing)
            ? "starts past the job's last step (job.steps = " + std::to_string(c.steps) +
                  ": steps 0 to " + std::to_string(c.steps - 1) + ")"
            : "";
    if (!bad.empty())
      throw ConfigError(place("observability.trace_steps") + ": observability.trace_steps = \"" +
                        c.trace_steps + "\" " + bad);
  }
  // (batch.micro not given: at most the global batch, so `batch.global = 32` alone is a job)
  if (!places.count("batch.micro")) c.micro_batch = std::min(c.micro_batch, c.global_batch);
  validate(c, source, places, check_data);
  c.inert_key = inert_key_of(c, place);
  if (c.inert_key.empty()) c.inert_key = worker_bounds_refusal(c, place);
  if (!check_data) return c;
  if (c.data_kind == "tokens")  // (a mix's sets share one tokenizer: the workers refuse others)
    c.data_tokenizer = tokenizer_of(c.data_mix.empty() ? c.data_path : c.data_mix.begin()->first);
  fill_data_digests(c);
  return c;
}

std::string data_digest_source(const JobConfig& c) {
  std::string s = c.data_kind + "\n" + c.data_path;
  for (const auto& [set, weight] : c.data_mix) s += "\n" + set;
  return s;
}

void fill_data_digests(JobConfig& c) {
  c.data_digest.clear();
  c.mix_digests.clear();
  if (c.data_kind == "text" || (c.data_kind == "tokens" && c.data_mix.empty()))
    c.data_digest = content_digest(c.data_kind, c.data_path);
  if (c.data_kind == "tokens")
    for (const auto& [set, weight] : c.data_mix)
      c.mix_digests.push_back(content_digest(c.data_kind, set));
  c.digest_source = data_digest_source(c);
}

JobConfig load_config(const std::string& path, const std::vector<std::string>& overrides,
                      const ExtensionKinds& kinds, bool check_data) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw ConfigError(path + ": cannot open the config file: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    throw ConfigError(path + ": is " +
                      (S_ISDIR(st.st_mode) ? "a directory" : "not a regular file") +
                      ", not a config file (a TOML file such as configs/quickstart.toml)");
  if (st.st_size > (1 << 20)) throw ConfigError(path + ": is larger than 1 MiB: not a config file");
  std::ifstream in(path);
  if (!in) throw ConfigError(path + ": cannot open the config file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str(), path, overrides, kinds, check_data);
}

namespace {
std::filesystem::path last_name(const std::string& path) {  // ("runs/x/": "x")
  const auto p = std::filesystem::path(path).lexically_normal();
  return p.filename().empty() ? p.parent_path().filename() : p.filename();
}
}  // namespace

std::string checkpoints_dir(const JobConfig& cfg, const std::string& run_dir) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(cfg.checkpoint_dir).lexically_normal();
  // (an older effective config of a run in the default place left job.run_dir unset: its own
  // is RUN_DIR-named/checkpoints)
  const bool own =
      !cfg.run_dir.empty()
          ? dir == (fs::path(cfg.run_dir) / "checkpoints").lexically_normal()
          : dir.filename() == "checkpoints" && dir.parent_path().filename() == last_name(run_dir);
  if (cfg.checkpoint_dir.empty() || own) return run_dir + "/checkpoints";
  return cfg.checkpoint_dir;
}

// One key's value into its table, as the effective config writes it.
void insert_field(toml::table* t, const Field& f) {
  switch (f.kind) {
    case Kind::integer:
      t->insert(f.key, *static_cast<int64_t*>(f.target));
      break;
    case Kind::int_or_auto: {
      int64_t v = *static_cast<int64_t*>(f.target);
      if (v == 0)
        t->insert(f.key, "auto");
      else
        t->insert(f.key, v);
      break;
    }
    case Kind::real:
      t->insert(f.key, *static_cast<double*>(f.target));
      break;
    case Kind::string:
      t->insert(f.key, *static_cast<std::string*>(f.target));
      break;
    case Kind::boolean:
      t->insert(f.key, *static_cast<bool*>(f.target));
      break;
    case Kind::int_array: {
      toml::array a;
      for (int64_t v : *static_cast<std::vector<int64_t>*>(f.target)) a.push_back(v);
      t->insert(f.key, a);
      break;
    }
    case Kind::option:
      std::visit([&](const auto& v) { t->insert(f.key, v); }, *static_cast<OptionValue*>(f.target));
      break;
    case Kind::weights: {
      toml::table w;
      for (const auto& [k, v] : *static_cast<std::map<std::string, double>*>(f.target))
        w.insert(k, v);
      w.is_inline(true);
      t->insert(f.key, w);
      break;
    }
  }
}

// One key's value as the effective config writes it ("[5, 7]", "'adamw'", "0.001").
std::string value_text(const Field& f) {
  toml::table t;
  insert_field(&t, f);
  if (f.kind == Kind::real) {  // (the shortest text that reads back the same: 0.1, not 0.1000...01)
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, *static_cast<const double*>(f.target));
    return std::string(buf, r.ptr);
  }
  std::ostringstream out;
  t.get(f.key)->visit([&](const auto& node) { out << node; });
  return out.str();
}

void check_config(const JobConfig& c, const std::string& source) {
  // (a program's kinds as the config holds them: their keys and defaults, without the ranges
  // its models::Extensions give)
  auto added = [](const std::vector<std::string>& builtin, const std::string& kind,
                  std::map<std::string, OptionValue> keys,
                  const std::map<std::string, OptionValue>& values) {
    std::map<std::string, std::vector<OptionKey>> kinds;
    if (std::find(builtin.begin(), builtin.end(), kind) != builtin.end()) return kinds;
    keys.insert(values.begin(), values.end());  // (keys set in code, not parsed: theirs too)
    auto& out = kinds[kind];
    for (const auto& [name, value] : keys) out.emplace_back(name, value);
    return kinds;
  };
  const ExtensionKinds kinds{added(kModelKinds, c.model_kind, c.model_defaults, c.model_options),
                             added(kDataKinds, c.data_kind, c.data_defaults, c.data_options)};
  const JobConfig checked = parse_config(to_toml(c), source, {}, kinds, /*check_data=*/false);
  // (as troupe run refuses it for a new run; a resume's is its run's config as it was)
  if (!checked.inert_key.empty() && c.resume_dir.empty()) throw ConfigError(checked.inert_key);
}

std::string to_toml(const JobConfig& config) {
  JobConfig copy = config;
  toml::table root;
  for (auto& f : fields_of(copy)) {
    if (!root.contains(f.table)) root.insert(f.table, toml::table{});
    insert_field(root[f.table].as_table(), f);
  }
  // (data.mix names the data sets: a data.path left at its default is not written, or the file
  // would set both; one the config unset, "", is)
  if (!config.data_mix.empty() && config.data_path == JobConfig{}.data_path)
    root["data"].as_table()->erase("path");
  std::ostringstream out;
  out << "# The effective configuration of this run (defaults and --set overrides applied).\n"
      << root << "\n";
  return out.str();
}

std::string absolute_path(const std::string& p) {
  std::error_code ec;
  const std::filesystem::path a = std::filesystem::absolute(p, ec);
  return p.empty() || ec ? p : a.lexically_normal().string();
}

JobConfig with_absolute_paths(JobConfig c) {
  c.data_path = absolute_path(c.data_path);
  c.eval_path = absolute_path(c.eval_path);
  c.checkpoint_dir = absolute_path(c.checkpoint_dir);
  // The mix's sets in their order (the sampler's): named absolute only when that keeps it.
  std::map<std::string, double> mix;
  std::string last;
  bool ordered = true;
  for (const auto& [set, weight] : c.data_mix) {
    const std::string a = absolute_path(set);
    ordered = ordered && (mix.empty() || a > last);
    mix[last = a] = weight;
  }
  if (ordered) c.data_mix = std::move(mix);
  return c;
}

std::vector<std::string> config_differences(const JobConfig& before, const JobConfig& now,
                                            const std::vector<std::string>& left_out) {
  // (a path named relative to another directory is the same path)
  JobConfig a = with_absolute_paths(before), b = with_absolute_paths(now);
  const auto fa = fields_of(a), fb = fields_of(b);
  std::map<std::string, const Field*> now_by_key;
  for (const auto& f : fb) now_by_key[f.table + "." + f.key] = &f;
  std::vector<std::string> out;
  for (const auto& f : fa) {
    const std::string key = f.table + "." + f.key;
    const auto it = now_by_key.find(key);
    if (key == "job.run_dir" || it == now_by_key.end() ||
        std::find(left_out.begin(), left_out.end(), key) != left_out.end())
      continue;
    const std::string was = value_text(f), is = value_text(*it->second);
    if (was != is) out.push_back(key + " = " + is + " (the run's: " + was + ")");
  }
  return out;
}

}  // namespace troupe::coordinator
