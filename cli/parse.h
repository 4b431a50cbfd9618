// Command-line parsing for every subcommand, with CLI11: each builds a CLI::App with its options
// and calls parse(); `--help` prints the options (exit 0), a mistake says what is wrong and how
// to get help (exit 2), so a typo never passes silently. Header-only (bench/ uses it too).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace troupe::cli {

// nullopt: parsed, go on. A value: the exit status (0 after --help, 2 after a mistake).
inline std::optional<int> parse(CLI::App& app, const std::vector<std::string>& words) {
  std::vector<std::string> reversed(words.rbegin(), words.rend());  // (CLI11 takes them so)
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

// The edit distance of two words (for "did you mean").
inline size_t edit_distance(const std::string& a, const std::string& b) {
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

// The candidate nearest to word, if it is near enough to be a typo; "" otherwise.
inline std::string did_you_mean(const std::string& word,
                                const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& c : candidates) {
    const size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best_d <= std::max<size_t>(2, word.size() / 3) ? best : "";
}

}  // namespace troupe::cli
