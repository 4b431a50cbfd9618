// Command-line parsing for every subcommand, with CLI11: each builds a CLI::App with its options
// and calls parse(); `--help` prints the options (exit 0), a mistake says what is wrong and how
// to get help (exit 2), so a typo never passes silently. Header-only (bench/ uses it too).
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/config.h"

namespace troupe::cli {

// CLI11 (2.1) reads an integer in C's bases: 010 is 8 and 0x10 is 16. Troupe's integers are
// decimal, leading zeros too (step-00000050 is step 50; `--workers 010` scaled to 8): this
// transform, added to every integer option by parse(), strips them and refuses anything else
// (other bases; 1e3, which a range check called "not in range").
inline const CLI::Validator kDecimal(
    [](std::string& s) -> std::string {
      const size_t at = !s.empty() && (s[0] == '-' || s[0] == '+') ? 1 : 0;
      if (s.size() <= at || s.find_first_not_of("0123456789", at) != std::string::npos)
        return s + " is not a decimal number";
      if (s.size() == at + 1 || s[at] != '0') return "";
      const size_t first = s.find_first_not_of('0', at);
      s.erase(at, (first == std::string::npos ? s.size() - 1 : first) - at);
      return "";
    },
    "");

inline void decimal_integers(CLI::App& app) {
  for (CLI::Option* o : app.get_options()) {
    const std::string type = o->get_type_name();
    if (type.rfind("INT", 0) == 0 || type.rfind("UINT", 0) == 0) o->transform(kDecimal);
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) decimal_integers(*sub);
}

// nullopt: parsed, go on. A value: the exit status (0 after --help, 2 after a mistake).
inline std::optional<int> parse(CLI::App& app, const std::vector<std::string>& words) {
  std::vector<std::string> reversed(words.rbegin(), words.rend());  // (CLI11 takes them so)
  decimal_integers(app);
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: %s\n(%s --help lists the options)\n", app.get_name().c_str(),
                 e.what(), app.get_name().c_str());
    return 2;
  }
  return std::nullopt;
}

// text as a whole finite number, or nullopt.
inline std::optional<double> whole_number(const std::string& text) {
  try {
    size_t used = 0;
    const double v = std::stod(text, &used);
    if (used == text.size() && std::isfinite(v)) return v;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

// A number above `floor` (or at it, when `or_equal`), else what it is not: for the options' checks
// (CLI11's own say "not in range 0.000000 to 179769313486231570814527...").
inline std::string number_check(const std::string& text, double floor, bool or_equal) {
  const auto v = whole_number(text);
  if (v && (*v > floor || (or_equal && *v == floor))) return "";
  return text + " is not a " + (or_equal ? "non-negative" : "positive") + " number";
}
inline const CLI::Validator kPositive([](std::string& s) { return number_check(s, 0, false); },
                                      "POSITIVE", "positive");
inline const CLI::Validator kNonNegative([](std::string& s) { return number_check(s, 0, true); },
                                         "NONNEGATIVE", "non-negative");

// A number in [lo, hi], else "TEXT is not a number in [lo, hi]" (or "is outside" for a number).
inline CLI::Validator number_in(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        const auto v = whole_number(s);
        if (v && *v >= lo && *v <= hi) return "";
        char range[64];
        std::snprintf(range, sizeof range, "[%.15g, %.15g]", lo, hi);
        return s + (v ? " is outside " : " is not a number in ") + range;
      },
      "NUMBER", "number in range");
}

// The candidate nearest to word, if it is near enough to be a typo; "" otherwise.
// A coordinator's address to reach: HOST:PORT with a port other than 0 (0 picks one to listen
// on, and is no address to reach).
inline bool address_to_reach(const std::string& address) {
  if (!coordinator::host_and_port(address)) return false;
  const std::string port = address.substr(address.rfind(':') + 1);
  return port.find_first_not_of('0') != std::string::npos;
}

inline std::string did_you_mean(const std::string& word,
                                const std::vector<std::string>& candidates) {
  return coordinator::nearest_word(word, candidates);
}

}  // namespace troupe::cli
