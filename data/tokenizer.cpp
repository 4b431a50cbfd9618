#include "data/tokenizer.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <stdexcept>

#include "data/shards.h"

namespace troupe::data {
namespace {

uint64_t key(uint32_t a, uint32_t b) { return uint64_t(a) << 32 | b; }

// BPE training state: the distinct words as symbol sequences, how often each adjacent pair
// occurs (weighted by word counts) and in which words. A merge rewrites only the words that
// hold its pair and adjusts the counts of the pairs it destroys and creates.
class BpeTrainer {
 public:
  explicit BpeTrainer(const WordCounts& counts) {
    // Sorted words: the same result whatever the hash map's iteration order.
    std::vector<std::pair<std::string_view, uint64_t>> sorted;
    sorted.reserve(counts.distinct());
    for (const auto& [w, c] : counts.counts()) sorted.emplace_back(w, c);
    std::sort(sorted.begin(), sorted.end());
    words_.reserve(sorted.size());
    for (const auto& [w, c] : sorted) {
      Word word{{}, c};
      for (unsigned char ch : w) word.symbols.push_back(ch);
      words_.push_back(std::move(word));
    }
    for (uint32_t w = 0; w < words_.size(); ++w) add_pairs(w, +1);
    for (const auto& [k, c] : count_)
      if (c > 0) heap_.push({c, k});
  }

  std::vector<Tokenizer::Merge> run(size_t merges) {
    std::vector<Tokenizer::Merge> out;
    while (out.size() < merges && !heap_.empty()) {
      auto [c, k] = heap_.top();
      heap_.pop();
      const int64_t now = count_of(k);
      if (now <= 0) continue;
      if (now != c) {  // stale: counts of old pairs only fall, so re-queue at the true count
        heap_.push({now, k});
        continue;
      }
      const uint32_t id = uint32_t(256 + out.size());
      out.emplace_back(uint32_t(k >> 32), uint32_t(k & 0xffffffffu));
      merge(k, id);
    }
    return out;
  }

 private:
  struct Word {
    std::vector<uint32_t> symbols;
    uint64_t count;
  };
  // Highest count first; among equal counts the smallest pair.
  struct Entry {
    int64_t count;
    uint64_t pair;
    bool operator<(const Entry& o) const {
      return count != o.count ? count < o.count : pair > o.pair;
    }
  };

  int64_t count_of(uint64_t k) const {
    auto it = count_.find(k);
    return it == count_.end() ? 0 : it->second;
  }

  void add_pairs(uint32_t w, int sign) {
    const Word& word = words_[w];
    for (size_t i = 0; i + 1 < word.symbols.size(); ++i) {
      const uint64_t k = key(word.symbols[i], word.symbols[i + 1]);
      count_[k] += sign * int64_t(word.count);
      if (sign > 0) where_[k].push_back(w);
    }
  }

  void merge(uint64_t k, uint32_t id) {
    const uint32_t a = uint32_t(k >> 32), b = uint32_t(k & 0xffffffffu);
    std::vector<uint32_t> holders = std::move(where_[k]);
    where_.erase(k);
    std::sort(holders.begin(), holders.end());
    holders.erase(std::unique(holders.begin(), holders.end()), holders.end());
    std::vector<uint64_t> created;
    for (uint32_t w : holders) {
      Word& word = words_[w];
      auto& s = word.symbols;
      bool has = false;
      for (size_t i = 0; i + 1 < s.size() && !has; ++i) has = s[i] == a && s[i + 1] == b;
      if (!has) continue;  // (an earlier merge rewrote this word)
      add_pairs_counts_only(w, -1);
      size_t out = 0;
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          s[out++] = id;
          ++i;
        } else {
          s[out++] = s[i];
        }
      }
      s.resize(out);
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        const uint64_t p = key(s[i], s[i + 1]);
        count_[p] += int64_t(word.count);
        if (s[i] == id || s[i + 1] == id) {
          where_[p].push_back(w);
          created.push_back(p);
        }
      }
    }
    count_.erase(k);
    std::sort(created.begin(), created.end());
    created.erase(std::unique(created.begin(), created.end()), created.end());
    for (uint64_t p : created) heap_.push({count_of(p), p});
  }

  void add_pairs_counts_only(uint32_t w, int sign) {
    const Word& word = words_[w];
    for (size_t i = 0; i + 1 < word.symbols.size(); ++i)
      count_[key(word.symbols[i], word.symbols[i + 1])] += sign * int64_t(word.count);
  }

  std::vector<Word> words_;
  std::unordered_map<uint64_t, int64_t> count_;
  std::unordered_map<uint64_t, std::vector<uint32_t>> where_;
  std::priority_queue<Entry> heap_;
};

[[noreturn]] void bad_file(const std::string& path, const std::string& what) {
  throw std::invalid_argument("tokenizer file '" + path + "': " + what);
}

}  // namespace

WordCounts::WordCounts(size_t most) : most_(std::max<size_t>(most, 2)) {}

void WordCounts::add(std::string_view text) {
  split_words(text, [&](std::string_view w) {
    auto [it, added] = counts_.try_emplace(std::string(w), 0);
    ++it->second;
    ++total_;
    if (added && counts_.size() > most_) drop_rarest();
  });
}

// Drops the rarest words down to half the bound: the least counts, ties to the smallest words
// (the same words whatever the map's order).
void WordCounts::drop_rarest() {
  std::vector<std::unordered_map<std::string, uint64_t>::iterator> all;
  all.reserve(counts_.size());
  for (auto it = counts_.begin(); it != counts_.end(); ++it) all.push_back(it);
  const size_t drop = all.size() - most_ / 2;
  std::nth_element(all.begin(), all.begin() + std::ptrdiff_t(drop), all.end(),
                   [](const auto& a, const auto& b) {
                     return a->second != b->second ? a->second < b->second : a->first < b->first;
                   });
  for (size_t i = 0; i < drop; ++i) {  // (erasing one leaves the others' iterators valid)
    ++dropped_words_;
    dropped_count_ += all[i]->second;
    counts_.erase(all[i]);
  }
}

Tokenizer::Tokenizer(std::vector<Merge> merges)
    : merges_(std::move(merges)), end_of_document_(uint32_t(256 + merges_.size())) {
  pieces_.reserve(257 + merges_.size());
  for (int c = 0; c < 256; ++c) pieces_.emplace_back(1, char(c));
  for (size_t i = 0; i < merges_.size(); ++i) {
    const auto [a, b] = merges_[i];
    if (a >= 256 + i || b >= 256 + i)
      throw std::invalid_argument("merge " + std::to_string(i) + " (" + std::to_string(a) + ", " +
                                  std::to_string(b) + ") names an id not yet defined");
    pieces_.push_back(pieces_[a] + pieces_[b]);
    rank_.emplace(key(a, b), uint32_t(i));
  }
  pieces_.emplace_back("<|endoftext|>");
}

Tokenizer Tokenizer::table(std::vector<std::string> pieces, uint32_t end_of_document,
                           std::string source) {
  if (pieces.empty()) throw std::invalid_argument(source + ": a tokenizer table of no ids");
  if (end_of_document >= pieces.size())
    throw std::invalid_argument(source + ": the end of a document, id " +
                                std::to_string(end_of_document) + ", is outside its " +
                                std::to_string(pieces.size()) + " ids");
  Tokenizer t({});
  t.pieces_ = std::move(pieces);
  t.end_of_document_ = end_of_document;
  t.table_ = true;
  t.source_ = std::move(source);
  return t;
}

Tokenizer Tokenizer::train_bpe(const WordCounts& words, size_t vocab) {
  if (vocab < 257)
    throw std::invalid_argument(
        "a BPE vocabulary needs at least 257 ids (256 bytes and the "
        "end of a document); asked for " +
        std::to_string(vocab));
  return Tokenizer(BpeTrainer(words).run(vocab - 257));
}

void Tokenizer::encode_word(std::string_view word, std::vector<uint32_t>& out) {
  if (merges_.empty()) {
    for (unsigned char c : word) out.push_back(c);
    return;
  }
  auto hit = cache_.find(std::string(word));
  if (hit != cache_.end()) {
    out.insert(out.end(), hit->second.begin(), hit->second.end());
    return;
  }
  std::vector<uint32_t> s(word.begin(), word.end());
  for (auto& c : s) c &= 0xff;
  // Merge the adjacent pair of lowest rank, everywhere in the word, until none is a merge.
  while (s.size() > 1) {
    uint32_t best = UINT32_MAX;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      auto it = rank_.find(key(s[i], s[i + 1]));
      if (it != rank_.end() && it->second < best) best = it->second;
    }
    if (best == UINT32_MAX) break;
    const auto [a, b] = merges_[best];
    size_t o = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
        s[o++] = 256 + best;
        ++i;
      } else {
        s[o++] = s[i];
      }
    }
    s.resize(o);
  }
  out.insert(out.end(), s.begin(), s.end());
  if (cache_.size() > (1u << 20)) cache_.clear();  // (bounded memory on any corpus)
  cache_.emplace(std::string(word), std::move(s));
}

void Tokenizer::encode(std::string_view text, std::vector<uint32_t>& out) {
  if (table_)
    throw std::invalid_argument("this tokenizer (" + source_ +
                                ") only decodes: its merges are not here; encode text with the "
                                "tool that made it");
  split_words(text, [&](std::string_view w) { encode_word(w, out); });
}

void Tokenizer::decode(const uint32_t* ids, size_t n, std::string& out) const {
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] >= pieces_.size())
      throw std::invalid_argument("token id " + std::to_string(ids[i]) +
                                  " is outside the vocabulary (" + std::to_string(pieces_.size()) +
                                  " ids)");
    out += pieces_[ids[i]];
  }
}

uint64_t Tokenizer::fingerprint() const {
  static_assert(sizeof(Merge) == 8, "a merge is two uint32 ids");
  if (!table_) return fnv1a64(merges_.data(), merges_.size() * sizeof(Merge));  // (little-endian)
  uint64_t h = fnv1a64("table", 5);
  for (const std::string& p : pieces_) {
    const uint32_t n = uint32_t(p.size());
    h = fnv1a64(p.data(), p.size(), fnv1a64(&n, sizeof n, h));
  }
  return fnv1a64(&end_of_document_, sizeof end_of_document_, h);
}

namespace {
std::string hex_of(const std::string& bytes) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

// Hex digits' bytes; false when text is not an even number of hex digits.
bool bytes_of_hex(const std::string& text, std::string& out) {
  auto digit = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
  };
  if (text.size() % 2) return false;
  out.clear();
  for (size_t i = 0; i < text.size(); i += 2) {
    const int hi = digit(text[i]), lo = digit(text[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out += char(hi << 4 | lo);
  }
  return true;
}
}  // namespace

void Tokenizer::save(const std::string& path) const {
  nlohmann::json j;
  j["format"] = "troupe-tokenizer";
  j["version"] = 1;
  j["kind"] = kind();
  j["vocab"] = vocab_size();
  j["end_of_document"] = end_of_document();
  if (table_) {
    j["source"] = source_;
    auto& p = j["pieces"] = nlohmann::json::array();  // (hex: a piece may be any bytes)
    for (const std::string& piece : pieces_) p.push_back(hex_of(piece));
  } else {
    auto& m = j["merges"] = nlohmann::json::array();
    for (const auto& [a, b] : merges_) m.push_back({a, b});
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << j.dump() << '\n';
  if (!out.flush()) throw std::runtime_error("cannot write '" + path + "'");
}

Tokenizer Tokenizer::load(const std::string& path) {
  std::error_code ec;  // (a FIFO would block the read; a directory throws from it)
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec))
    bad_file(path, "is not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) unreadable_if_not_the_data(errno, "'" + path + "' cannot be opened");
  if (!in) bad_file(path, "cannot be opened");
  std::stringstream text;
  text << in.rdbuf();
  return parse(text.str(), path);
}

Tokenizer Tokenizer::parse(const std::string& text, const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    bad_file(path, std::string("is not JSON: ") + json_error_text(e));
  }
  try {
    return from_json(j, path);
  } catch (const nlohmann::json::exception& e) {  // (a field of the wrong type)
    bad_file(path, "a field of the wrong type: " + json_error_text(e));
  }
}

Tokenizer Tokenizer::from_json(const nlohmann::json& j, const std::string& path) {
  if (!j.is_object() || j.value("format", "") != "troupe-tokenizer")
    bad_file(path, "is not a troupe tokenizer (no \"format\": \"troupe-tokenizer\")");
  if (j.value("version", 0) != 1) bad_file(path, "has an unknown version (this build reads 1)");
  if (j.value("kind", "") == "table") return table_from_json(j, path);
  const auto& m = j.find("merges");
  if (m == j.end() || !m->is_array()) bad_file(path, "has no \"merges\" array");
  std::vector<Merge> merges;
  std::vector<size_t> length(256, 1);  // each id's piece, in bytes
  for (size_t i = 0; i < m->size(); ++i) {
    const auto& p = (*m)[i];
    if (!p.is_array() || p.size() != 2 || !p[0].is_number_unsigned() || !p[1].is_number_unsigned())
      bad_file(path, "merge " + std::to_string(i) + " is not a pair of ids");
    const uint64_t a = p[0], b = p[1];
    if (a >= 256 + i || b >= 256 + i)
      bad_file(path, "merge " + std::to_string(i) + " names an id not yet defined");
    // (Training merges within words: a longer piece is never made nor matched, and a chain of
    // merges of a piece with itself would double its length each time.)
    length.push_back(length[a] + length[b]);
    if (length.back() > kMaxWordBytes)
      bad_file(path, "merge " + std::to_string(i) + " makes a piece of " +
                         std::to_string(length.back()) + " bytes, longer than a word (" +
                         std::to_string(kMaxWordBytes) + ")");
    merges.emplace_back(uint32_t(a), uint32_t(b));
  }
  Tokenizer t(std::move(merges));
  check_said(j, t, path);
  return t;
}

// The vocabulary and end of document the file says are its tokenizer's.
void Tokenizer::check_said(const nlohmann::json& j, const Tokenizer& t, const std::string& path) {
  if (j.contains("end_of_document") &&
      j.value("end_of_document", nlohmann::json()) != t.end_of_document())
    bad_file(path, "says \"end_of_document\": " + j["end_of_document"].dump() +
                       " but its tokenizer ends a document with " +
                       std::to_string(t.end_of_document()));
  if (j.value("vocab", uint64_t(0)) == t.vocab_size()) return;
  if (!t.table_)
    bad_file(path, "says \"vocab\": " + j.value("vocab", nlohmann::json()).dump() + " but its " +
                       std::to_string(t.merges().size()) + " merges make " +
                       std::to_string(t.vocab_size()));
  bad_file(path, "says \"vocab\": " + j.value("vocab", nlohmann::json()).dump() + " but its " +
                     "table has " + std::to_string(t.vocab_size()) + " pieces");
}

Tokenizer Tokenizer::table_from_json(const nlohmann::json& j, const std::string& path) {
  const auto& p = j.find("pieces");
  if (p == j.end() || !p->is_array()) bad_file(path, "has no \"pieces\" array");
  if (p->empty() || p->size() > (size_t(1) << 24))
    bad_file(path, "has " + std::to_string(p->size()) + " pieces (1 to 16,777,216)");
  std::vector<std::string> pieces(p->size());
  for (size_t i = 0; i < p->size(); ++i)
    if (!(*p)[i].is_string() || !bytes_of_hex((*p)[i].get<std::string>(), pieces[i]))
      bad_file(path, "piece " + std::to_string(i) + " is not a string of hex digits");
  const auto& e = j.find("end_of_document");
  if (e == j.end() || !e->is_number_unsigned() || *e >= pieces.size())
    bad_file(path,
             "has no \"end_of_document\" among its " + std::to_string(pieces.size()) + " ids");
  Tokenizer t = table(std::move(pieces), e->get<uint32_t>(), j.value("source", "a table"));
  check_said(j, t, path);
  return t;
}

}  // namespace troupe::data
