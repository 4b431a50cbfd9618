#include "models/extension.h"

#include <algorithm>
#include <stdexcept>

namespace troupe::models {
namespace {

const char* type_name(const OptionValue& v) {
  static const char* names[] = {"an integer", "a number", "true or false", "a string"};
  return names[v.index()];
}

bool plain_word(const std::string& s) {
  return !s.empty() && s.size() <= 64 && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  }) && !(s[0] >= '0' && s[0] <= '9');
}

// A kind's name and keys, checked as add_model and add_dataset promise.
void check_kind(const std::string& what, const std::string& name,
                const std::vector<OptionSpec>& options, const std::vector<std::string>& taken,
                const std::vector<std::string>& reserved) {
  const std::string at = what + " kind '" + name + "'";
  if (!plain_word(name))
    throw std::invalid_argument(at + ": a kind's name is a lower-case word ([a-z_][a-z0-9_]*)");
  if (std::find(taken.begin(), taken.end(), name) != taken.end())
    throw std::invalid_argument(at + " exists already (a built-in kind, or added before)");
  std::vector<std::string> seen;
  for (const auto& o : options) {
    if (!plain_word(o.name))
      throw std::invalid_argument(at + ": key '" + o.name + "' is not a lower-case word");
    if (std::find(reserved.begin(), reserved.end(), o.name) != reserved.end())
      throw std::invalid_argument(at + ": key '" + o.name + "' is Troupe's own");
    if (std::find(seen.begin(), seen.end(), o.name) != seen.end())
      throw std::invalid_argument(at + ": key '" + o.name + "' is named twice");
    seen.push_back(o.name);
    const bool ranged = o.min != -1e300 || o.max != 1e300;
    const bool number = std::holds_alternative<int64_t>(o.default_value) ||
                        std::holds_alternative<double>(o.default_value);
    if (ranged && !number)  // (a range on a string or a bool was accepted and never checked)
      throw std::invalid_argument(at + ": key '" + o.name +
                                  "' has a range, and only a number's is checked");
    if (!(o.min <= o.max))
      throw std::invalid_argument(at + ": key '" + o.name + "' has its range's minimum above " +
                                  "its maximum");
    double v = 0;
    if (auto* i = std::get_if<int64_t>(&o.default_value)) v = double(*i);
    if (auto* d = std::get_if<double>(&o.default_value)) v = *d;
    if (v < o.min || v > o.max)
      throw std::invalid_argument(at + ": the default of '" + o.name + "' is outside its range");
  }
}

template <typename Kind>
std::vector<std::string> names_of(const std::vector<Kind>& kinds, std::vector<std::string> out) {
  for (const auto& k : kinds) out.push_back(k.name);
  return out;
}

}  // namespace

const OptionValue& Options::at(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) throw std::invalid_argument("no option '" + name + "'");
  return it->second;
}

int64_t Options::integer(const std::string& name) const {
  const OptionValue& v = at(name);
  if (auto* i = std::get_if<int64_t>(&v)) return *i;
  throw std::invalid_argument("option '" + name + "' is " + type_name(v) + ", not an integer");
}

double Options::number(const std::string& name) const {
  const OptionValue& v = at(name);
  if (auto* d = std::get_if<double>(&v)) return *d;
  if (auto* i = std::get_if<int64_t>(&v)) return double(*i);
  throw std::invalid_argument("option '" + name + "' is " + type_name(v) + ", not a number");
}

bool Options::boolean(const std::string& name) const {
  const OptionValue& v = at(name);
  if (auto* b = std::get_if<bool>(&v)) return *b;
  throw std::invalid_argument("option '" + name + "' is " + type_name(v) + ", not true or false");
}

const std::string& Options::string(const std::string& name) const {
  const OptionValue& v = at(name);
  if (auto* s = std::get_if<std::string>(&v)) return *s;
  throw std::invalid_argument("option '" + name + "' is " + type_name(v) + ", not a string");
}

Extensions& Extensions::add_model(ModelKind kind) {
  check_kind("model", kind.name, kind.options, names_of(models_, {"mlp", "gpt", "external"}),
             {"kind"});
  if (!kind.build) throw std::invalid_argument("model kind '" + kind.name + "' has no build");
  models_.push_back(std::move(kind));
  return *this;
}

Extensions& Extensions::add_dataset(DatasetKind kind) {
  check_kind("data set", kind.name, kind.options,
             names_of(datasets_, {"synthetic", "text", "tokens", "external"}), {"kind", "ledger"});
  if (!kind.open) throw std::invalid_argument("data set kind '" + kind.name + "' has no open");
  datasets_.push_back(std::move(kind));
  return *this;
}

const ModelKind* Extensions::model(const std::string& name) const {
  for (const auto& k : models_)
    if (k.name == name) return &k;
  return nullptr;
}

const DatasetKind* Extensions::dataset(const std::string& name) const {
  for (const auto& k : datasets_)
    if (k.name == name) return &k;
  return nullptr;
}

Options options_of(const std::vector<OptionSpec>& specs,
                   const std::map<std::string, OptionValue>& values) {
  std::map<std::string, OptionValue> out;
  for (const auto& s : specs) {
    auto it = values.find(s.name);
    out[s.name] = it == values.end() ? s.default_value : it->second;
  }
  return Options(std::move(out));
}

}  // namespace troupe::models
