// Models and data sets a program adds to Troupe: each kind has a name (what `model.kind` or
// `data.kind` selects in the TOML config), its own config keys with their types and defaults
// (validated by the coordinator like the built-in ones, before anything starts), and a function
// that builds it from those keys' values.
//
// A program collects its kinds in an Extensions object and hands it to troupe::main (cli/main.h):
// the same program is then the coordinator, which checks the keys, and every agent it launches
// (`troupe run` starts its agents from its own executable), which build the kinds. No global
// registry: the program's main() wires it.
//
//   models::Extensions ext;
//   ext.add_model({"resmlp", {{"width", int64_t(64)}, {"depth", int64_t(2)}},
//                  [](const models::Options& o, const models::Dataset& data) { ... blocks ... }});
//   return troupe::main(argc, argv, ext);
//
// Thread-safety: an Extensions object is filled before troupe::main and only read after; the
// build and open functions are called on worker threads, several at once (one per device).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "models/blocks.h"
#include "models/data.h"

namespace troupe::models {

// A config value: an integer, a number, true or false, or a string (TOML's scalar types).
using OptionValue = std::variant<int64_t, double, bool, std::string>;

// One key of a kind's own: its name under [model] or [data], its type and default (the
// default's alternative is the type), the range a number must lie in, and a line of help.
struct OptionSpec {
  OptionSpec(std::string name, OptionValue default_value, std::string help = "")
      : name(std::move(name)), default_value(std::move(default_value)), help(std::move(help)) {}
  OptionSpec(std::string name, OptionValue default_value, double min, double max,
             std::string help = "")
      : name(std::move(name)),
        default_value(std::move(default_value)),
        min(min),
        max(max),
        help(std::move(help)) {}
  std::string name;
  OptionValue default_value;
  double min = -1e300, max = 1e300;
  std::string help;
};

// The values of a kind's keys, as the job's config set them (or their defaults).
class Options {
 public:
  Options() = default;
  explicit Options(std::map<std::string, OptionValue> values) : values_(std::move(values)) {}
  // The value of key `name`; throws std::invalid_argument naming the key when it is not there or
  // has another type (the coordinator checked the config against the kind's OptionSpecs).
  int64_t integer(const std::string& name) const;
  double number(const std::string& name) const;  // (an integer value is taken as a number too)
  bool boolean(const std::string& name) const;
  const std::string& string(const std::string& name) const;
  const std::map<std::string, OptionValue>& values() const { return values_; }

 private:
  const OptionValue& at(const std::string& name) const;
  std::map<std::string, OptionValue> values_;
};

// A model kind: a sequence of blocks (models/blocks.h; the built-in make_*_block pieces may be
// among them), built uninitialised (Model::init draws each block's parameters from the job's
// seed and the block's index). The last block's output is the logits, scored by softmax
// cross-entropy against the data set's targets (targets_per_sample rows per sample). The data
// set is the job's, opened already: the model may size itself from it.
struct ModelKind {
  using Build = std::function<std::vector<std::unique_ptr<Block>>(const Options& options,
                                                                  const Dataset& data)>;
  ModelKind(std::string name, std::vector<OptionSpec> options, Build build, std::string help = "")
      : name(std::move(name)),
        options(std::move(options)),
        build(std::move(build)),
        help(std::move(help)) {}
  std::string name;
  std::vector<OptionSpec> options;
  Build build;
  std::string help;  // one line: what the model is
};

// A data set kind: sample i of `size()` as Dataset::fill writes it (models/data.h), a pure
// function of (the options, the job's seed, i): every worker opens its own copy and reads only
// the samples it is given, so sharding, the exactly-once ledger, checkpoints and resumption apply
// unchanged.
struct DatasetKind {
  using Open = std::function<std::unique_ptr<Dataset>(const Options& options, uint64_t seed)>;
  DatasetKind(std::string name, std::vector<OptionSpec> options, Open open, std::string help = "")
      : name(std::move(name)),
        options(std::move(options)),
        open(std::move(open)),
        help(std::move(help)) {}
  std::string name;
  std::vector<OptionSpec> options;
  Open open;
  std::string help;
};

class Extensions {
 public:
  // Adds a kind. Throws std::invalid_argument when the name is a built-in kind's ("external"
  // too: the kind of a job whose members run their own loop) or taken, is
  // not a plain word, or a key is named twice, is a reserved key ("kind"; for data sets also
  // "ledger"), or has a default outside its range.
  Extensions& add_model(ModelKind kind);
  Extensions& add_dataset(DatasetKind kind);
  const ModelKind* model(const std::string& name) const;  // null: not added
  const DatasetKind* dataset(const std::string& name) const;
  const std::vector<ModelKind>& models() const { return models_; }
  const std::vector<DatasetKind>& datasets() const { return datasets_; }

 private:
  std::vector<ModelKind> models_;
  std::vector<DatasetKind> datasets_;
};

// The options a kind's specs and a job's values give: every spec's value, or its default.
Options options_of(const std::vector<OptionSpec>& specs,
                   const std::map<std::string, OptionValue>& values);

}  // namespace troupe::models
