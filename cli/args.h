// A small command-line parser: positional words, `--name value`, `--name=value`, and boolean
// `--name`. Unknown flags are an error with the flag named, so a typo never passes silently.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::cli {

class Args {
 public:
  // value_flags take a value; bool_flags do not. Throws std::invalid_argument on bad input.
  Args(const std::vector<std::string>& words, const std::set<std::string>& value_flags,
       const std::set<std::string>& bool_flags) {
    for (size_t i = 0; i < words.size(); ++i) {
      const std::string& w = words[i];
      if (w.rfind("--", 0) != 0 || w == "--") {
        positional_.push_back(w);
        continue;
      }
      std::string name = w.substr(2), value;
      bool has_value = false;
      auto eq = name.find('=');
      if (eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
        has_value = true;
      }
      if (bool_flags.count(name)) {
        if (has_value) throw std::invalid_argument("--" + name + " takes no value");
        values_[name].push_back("true");
      } else if (value_flags.count(name)) {
        if (!has_value) {
          if (i + 1 >= words.size()) throw std::invalid_argument("--" + name + " needs a value");
          value = words[++i];
        }
        values_[name].push_back(value);
      } else {
        throw std::invalid_argument("unknown option --" + name);
      }
    }
  }

  const std::vector<std::string>& positional() const { return positional_; }
  bool has(const std::string& name) const { return values_.count(name) != 0; }
  std::string get(const std::string& name, const std::string& fallback = "") const {
    auto it = values_.find(name);
    return it == values_.end() ? fallback : it->second.back();
  }
  std::vector<std::string> all(const std::string& name) const {
    auto it = values_.find(name);
    return it == values_.end() ? std::vector<std::string>{} : it->second;
  }
  int64_t get_int(const std::string& name, int64_t fallback) const {
    if (!has(name)) return fallback;
    std::string v = get(name);
    size_t used = 0;
    int64_t out = 0;
    try {
      out = std::stoll(v, &used);
    } catch (...) {
      used = 0;
    }
    if (used != v.size() || v.empty()) {
      throw std::invalid_argument("--" + name + " expects an integer, got '" + v + "'");
    }
    return out;
  }

 private:
  std::vector<std::string> positional_;
  std::map<std::string, std::vector<std::string>> values_;
};

}  // namespace troupe::cli
