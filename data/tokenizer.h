// Tokenizers: byte-level, byte-level BPE trained on a corpus, and tables another tool made.
//
// Ids: 0..255 are the bytes; 256..256+M-1 the M merges in the order they were learned; the last
// id (256+M) is the end-of-document token that separates documents in a data set. So
// vocab_size() = 257 + M, and any byte string encodes and decodes back to itself:
// decode(encode(x)) == x for every x (encode never emits the end-of-document token).
//
// BPE works on words, never across them: split_words() cuts text into chunks the way GPT-2's
// pattern does (an optional leading space and a run of letters, of digits or of other symbols;
// runs of whitespace), at most kMaxWordBytes each. Bytes >= 0x80 count as letters, so a UTF-8
// character stays inside its word.
//
// A table (kind "table") is another tool's tokenizer as its ids' pieces alone, e.g. GPT-2's as
// llm.c writes it (data/import.h): it decodes, and says its vocabulary and end of document, but
// does not encode (its merges and its pattern are not here): encode() throws.
//
// A Tokenizer is immutable after construction and safe to share between threads, except
// encode(), which keeps a per-object cache: give each thread its own copy.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace troupe::data {

constexpr size_t kMaxWordBytes = 64;

// Calls emit(chunk) for each word of text, in order; the chunks concatenate to text.
template <class F>
void split_words(std::string_view text, F&& emit);

// A prefix of text that ends where the whole text's split ends a word, whatever follows text:
// near its end, a position p whose byte before is not whitespace and of another class than
// text[p] (a run ends there, and nothing before it looks past it); failing that, the start of
// its second-to-last word (a word's end depends on at most one byte after it). 0 when text has
// fewer than two words. Text encoded, or its words counted, piece by piece at these cuts gives
// the same result as whole.
inline size_t stable_prefix(std::string_view text);

// Distinct words held by default while counting (a corpus's words number tens of millions: about
// 220 bytes each while counting and training, so ~1 GB at this bound).
constexpr size_t kMostWords = size_t(1) << 22;

// Counts of distinct words, the input of BPE training; fed text by text. At most `most` distinct
// words are held: when one more arrives, the rarest are dropped down to half the bound (the least
// counts; ties to the smallest words), as lossy counting does. A word dropped and met again
// counts from then on, so a frequent word's count is short by at most what it had at the drops:
// the merges come from the words a corpus repeats, and memory stays bounded. Deterministic for the
// same texts in the same order.
class WordCounts {
 public:
  explicit WordCounts(size_t most = kMostWords);
  void add(std::string_view text);
  size_t distinct() const { return counts_.size(); }
  uint64_t total() const { return total_; }
  // Words dropped to keep the bound (each time one was), and the occurrences they had counted.
  uint64_t dropped_words() const { return dropped_words_; }
  uint64_t dropped_count() const { return dropped_count_; }
  const std::unordered_map<std::string, uint64_t>& counts() const { return counts_; }

 private:
  void drop_rarest();
  size_t most_;
  std::unordered_map<std::string, uint64_t> counts_;
  uint64_t total_ = 0, dropped_words_ = 0, dropped_count_ = 0;
};

class Tokenizer {
 public:
  using Merge = std::pair<uint32_t, uint32_t>;

  static Tokenizer bytes() { return Tokenizer({}); }
  // Id i decodes to pieces[i]; end_of_document < pieces.size(). `source` says what made it (in
  // messages: "llm.c's GPT-2 tokenizer"). Throws std::invalid_argument for an empty table or an
  // end of document outside it.
  static Tokenizer table(std::vector<std::string> pieces, uint32_t end_of_document,
                         std::string source);
  // Learns vocab - 257 merges (fewer when the words run out of pairs: vocab_size() says).
  // Deterministic: the most frequent pair first, ties to the smallest (left, right) ids.
  static Tokenizer train_bpe(const WordCounts& words, size_t vocab);
  // Throws std::invalid_argument naming the file and what is wrong.
  static Tokenizer load(const std::string& path);
  // The same from the file's text; `name` says where it came from in messages.
  static Tokenizer parse(const std::string& text, const std::string& name);
  void save(const std::string& path) const;

  explicit Tokenizer(std::vector<Merge> merges);

  std::string kind() const { return table_ ? "table" : merges_.empty() ? "byte" : "bpe"; }
  size_t vocab_size() const { return pieces_.size(); }
  uint32_t end_of_document() const { return end_of_document_; }
  const std::vector<Merge>& merges() const { return merges_; }
  bool encodes() const { return !table_; }
  const std::string& source() const { return source_; }  // a table's maker; "" otherwise
  // FNV-1a over the merges (a table: over its pieces and its end of document): equal exactly
  // when two tokenizers map every text alike.
  uint64_t fingerprint() const;

  // Appends the ids of text to out. A table throws std::invalid_argument (it cannot encode).
  void encode(std::string_view text, std::vector<uint32_t>& out);
  std::vector<uint32_t> encode(std::string_view text) {
    std::vector<uint32_t> out;
    encode(text, out);
    return out;
  }
  // Appends the bytes of the ids to out; the end-of-document id as "<|endoftext|>".
  // Throws std::invalid_argument for an id outside the vocabulary.
  void decode(const uint32_t* ids, size_t n, std::string& out) const;

 private:
  void encode_word(std::string_view word, std::vector<uint32_t>& out);
  static Tokenizer from_json(const nlohmann::json& j, const std::string& path);
  static Tokenizer table_from_json(const nlohmann::json& j, const std::string& path);
  static void check_said(const nlohmann::json& j, const Tokenizer& t, const std::string& path);

  std::vector<Merge> merges_;
  std::vector<std::string> pieces_;  // id -> its bytes
  uint32_t end_of_document_ = 256;
  bool table_ = false;
  std::string source_;
  std::unordered_map<uint64_t, uint32_t> rank_;  // (left << 32 | right) -> merge index
  std::unordered_map<std::string, std::vector<uint32_t>> cache_;  // word -> ids
};

// ---- implementation of the template ----

namespace detail {
// 0 whitespace, 1 letter (and every byte >= 0x80), 2 digit, 3 other.
inline int byte_class(unsigned char c) {
  if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') return 0;
  if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return 1;
  if (c >= 0x80) return 1;
  if (c >= '0' && c <= '9') return 2;
  return 3;
}
}  // namespace detail

template <class F>
void split_words(std::string_view text, F&& emit) {
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    size_t j = i;
    int cls = detail::byte_class(static_cast<unsigned char>(text[i]));
    if (cls == 0) {
      // A run of whitespace; its last space goes with the word that follows it.
      while (j < n && detail::byte_class(static_cast<unsigned char>(text[j])) == 0) ++j;
      if (j < n && j - i > 1 && text[j - 1] == ' ') {
        --j;
      } else if (j < n && j - i == 1 && text[i] == ' ') {
        cls = detail::byte_class(static_cast<unsigned char>(text[j]));
        while (j < n && detail::byte_class(static_cast<unsigned char>(text[j])) == cls) ++j;
      }
    } else {
      while (j < n && detail::byte_class(static_cast<unsigned char>(text[j])) == cls) ++j;
    }
    while (j - i > kMaxWordBytes) {
      emit(text.substr(i, kMaxWordBytes));
      i += kMaxWordBytes;
    }
    emit(text.substr(i, j - i));
    i = j;
  }
}

inline size_t stable_prefix(std::string_view text) {
  auto cls = [&](size_t i) { return detail::byte_class(static_cast<unsigned char>(text[i])); };
  const size_t stop = text.size() > 4096 ? text.size() - 4096 : 1;
  for (size_t p = text.size(); p-- > stop;)
    if (cls(p - 1) != 0 && cls(p) != cls(p - 1)) return p;
  size_t last = 0, before = 0, at = 0;
  split_words(text, [&](std::string_view w) {
    before = last;
    last = at;
    at += w.size();
  });
  return before;
}

}  // namespace troupe::data
