// troupe data prepare: text files, directories (recursively, in name order) and JSON-lines files
// (one document per line, the text in a named field) -> a token data set (data/shards.h).
//
// A document is a text file or a JSON line. Documents that cannot be text are skipped and
// counted, never trained on: binary (a NUL byte), invalid UTF-8, empty. The set is written into
// OUT.partial-PID and renamed to OUT when complete, so an interrupted prepare leaves nothing that
// looks like a data set; OUT must not exist.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace troupe::data {

struct PrepareOptions {
  std::vector<std::string> inputs;
  std::string out;
  std::string tokenizer = "byte";   // byte | bpe
  size_t vocab = 0;                 // bpe: ids in all (>= 258: a merge at least)
  std::string tokenizer_from = "";  // a data set whose tokenizer to use (none is trained)
  std::string jsonl_field = "text";
  uint64_t shard_tokens = uint64_t(1) << 27;  // 256 MiB of 16-bit ids a shard
  size_t most_words = 0;  // bpe: distinct words held while counting (0: kMostWords; WordCounts)
  // A text file (one document) larger is read in pieces, twice (checked whole, then used), not
  // held in memory; the same ids either way.
  uint64_t whole_text_bytes = uint64_t(16) << 20;
  // Held while the finished set is renamed into place, `published` set under it: a signal's
  // handler that takes it knows whether OUT is whole or the partial directory is to go.
  std::mutex* publishing = nullptr;
  bool* published = nullptr;
};

struct Progress {
  const char* phase;  // "counting words" (bpe), "training", "encoding"
  uint64_t bytes_done, bytes_total;
  double seconds;
};

struct PrepareSummary {
  uint64_t files = 0, documents = 0, bytes = 0, tokens = 0;
  uint64_t skipped_binary = 0, skipped_invalid_utf8 = 0, skipped_empty = 0, skipped_bad_json = 0;
  std::string first_skipped;    // where the first skipped document was, for the message
  uint64_t repeated_files = 0;  // met again (named twice, or a link to one): read once
  size_t vocab = 0;
  std::string tokenizer;  // byte | bpe
  // bpe: distinct words the merges were learned from; those dropped to keep the bound, and the
  // occurrences they had counted (WordCounts)
  uint64_t words = 0, words_dropped = 0, occurrences_dropped = 0;
  double seconds_train = 0, seconds_encode = 0;
};

// Throws std::invalid_argument for bad options or inputs (a missing input, OUT existing, no
// text at all), std::runtime_error for I/O failures; OUT is then absent.
PrepareSummary prepare(const PrepareOptions& options,
                       const std::function<void(const Progress&)>& progress = nullptr);

// The offset of the first byte of [p, p + n) that is not valid UTF-8 (overlong forms, surrogates
// and code points past U+10FFFF are not); n when every byte is.
size_t first_invalid_utf8(const char* p, size_t n);

}  // namespace troupe::data
