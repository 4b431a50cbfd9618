// A prepared token data set: a directory with
//   manifest.json    what is there: tokenizer, vocabulary, id width, shards with token counts
//                    and checksums, documents, sources, what was skipped. Written last: a
//                    directory without it is not a data set.
//   tokenizer.json   the tokenizer (data/tokenizer.h), for training and generation alike
//   tokens-NNNNN.bin the token stream, ids as little-endian uint16 (vocabulary <= 65,536) or
//                    uint32; documents follow each other, each ended by the end-of-document id
//   documents.bin    the index: the first token of each document, uint64 little-endian (its
//                    FNV-1a in the manifest's "documents_fnv1a64")
//
// TokenShards reads the shards (pread); read() is const and safe from any number of threads.
#pragma once

#include <cstdint>
#include <cstdio>
#include <list>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/unreadable.h"

namespace troupe::data {

constexpr const char* kManifestFile = "manifest.json";
constexpr const char* kTokenizerFile = "tokenizer.json";
constexpr const char* kDocumentsFile = "documents.bin";

// 64-bit FNV-1a, the checksum of shard files.
inline uint64_t fnv1a64(const void* bytes, size_t n, uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const unsigned char*>(bytes);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// fnv1a64 as the manifest writes it: 16 lowercase hex digits.
std::string fnv1a64_hex(uint64_t checksum);

std::string shard_name(size_t index);  // tokens-00000.bin

// A JSON library error's text without its "[json.exception.parse_error.101] " tag: where and why
// ("parse error at line 1, column 2: syntax error ...").
std::string json_error_text(const std::exception& e);

// Appends token ids to shard files of at most shard_tokens ids each, and the document index.
// Not thread-safe.
class ShardWriter {
 public:
  ShardWriter(std::string dir, unsigned token_bytes, uint64_t shard_tokens);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // One document's ids, then the end-of-document id.
  void add_document(const std::vector<uint32_t>& ids, uint32_t end_of_document) {
    begin_document();
    append(ids);
    end_document(end_of_document);
  }
  // The same in pieces: begin, any number of appends, end.
  void begin_document();
  void append(const std::vector<uint32_t>& ids) { append(ids.data(), ids.size()); }
  void append(const uint32_t* ids, size_t n);
  void end_document(uint32_t end_of_document);
  // Flushes and closes every file; the shards' (file, tokens, checksum).
  struct Shard {
    std::string file;
    uint64_t tokens, checksum;
  };
  std::vector<Shard> finish();
  uint64_t tokens() const { return total_; }
  uint64_t documents() const { return documents_; }
  uint64_t documents_checksum() const { return index_checksum_; }  // documents.bin's FNV-1a

 private:
  void put(uint32_t id);
  void write(const void* p, size_t n);
  void roll();
  void close_shard();
  void close_synced(std::FILE*& f, const std::string& name);
  std::string dir_;
  unsigned width_;
  uint64_t shard_tokens_, total_ = 0;
  std::vector<Shard> shards_;
  uint64_t documents_ = 0, index_checksum_ = fnv1a64(nullptr, 0);
  std::FILE* out_ = nullptr;
  std::FILE* index_ = nullptr;  // documents.bin, written as documents begin (not kept: 8 bytes a
                                // document, gigabytes for a corpus)
  std::vector<unsigned char> buffer_;
};

class Tokenizer;

// The manifest's fields every data set has (what TokenShards::open reads) for a set the writer
// wrote, finished (its shards) with ids `width` bytes each of tok's vocabulary; a writer adds
// where the set came from.
nlohmann::json manifest_of(const Tokenizer& tok, unsigned width, const ShardWriter& writer,
                           const std::vector<ShardWriter::Shard>& shards);
// dir/manifest.json: std::runtime_error naming it when it cannot be written.
void write_manifest_file(const std::string& dir, const nlohmann::json& manifest);

// A token file whose ids are not what its manifest says (changed after it was prepared: an id
// outside the vocabulary, or the file cut short since it was opened). Reading it again gives the
// same: a worker is not restarted for it.
class DamagedData : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

constexpr size_t kMostOpenShards = 256;

class TokenShards {
 public:
  // Throws std::invalid_argument naming the directory and what is wrong or missing (Unreadable
  // when a shard cannot be opened for a reason that is not the data's). A data set
  // open already in this process (the same manifest: device, inode, change time) is shared.
  // Thread-safe. At most kMostOpenShards of its shard files stay open (and at most a quarter of
  // the process's descriptor limit): others are opened again when read, the least recently read
  // closed, each checked to be the file opened first (device, inode, size and modification time).
  static std::shared_ptr<const TokenShards> open(const std::string& dir);
  ~TokenShards();
  TokenShards(const TokenShards&) = delete;
  TokenShards& operator=(const TokenShards&) = delete;

  uint64_t tokens() const { return total_; }
  size_t shards() const { return shards_.size(); }
  size_t vocab() const { return vocab_; }
  uint32_t end_of_document() const { return end_of_document_; }  // (a table's: anywhere)
  unsigned token_bytes() const { return width_; }
  uint64_t tokenizer_fingerprint() const { return fingerprint_; }  // Tokenizer::fingerprint()
  const std::string& dir() const { return dir_; }
  // Ids [begin, begin + n) of the stream into out; begin + n <= tokens(). Throws DamagedData
  // naming the file and the place of an id outside the vocabulary, or of a file cut short since
  // it was opened. (Read with pread, not mapped: a mapped file truncated while the job ran
  // killed its reader with SIGBUS.)
  void read(uint64_t begin, size_t n, int32_t* out) const;
  // Reads every shard whole and compares its FNV-1a with the manifest's "fnv1a64", shards
  // hashed on up to `threads` threads: one line per shard that differs ("tokens-00003.bin: its
  // bytes are not those prepared (FNV-1a ...; the manifest says ...)"), that the manifest gives
  // no checksum for, or that holds an id outside the vocabulary (its first, with its place);
  // then documents.bin's (check_documents), unless kShardsOnly (training reads no other file);
  // empty when every file is sound. Throws Unreadable when a file cannot be checked here.
  enum Files { kEveryFile, kShardsOnly };
  std::vector<std::string> verify(unsigned threads, Files files = kEveryFile) const;
  bool documents_checksummed() const { return !documents_fnv1a64_.empty(); }

 private:
  TokenShards() = default;
  static std::shared_ptr<const TokenShards> open_anew(const std::string& dir);
  void open_shard(const nlohmann::json& s);  // one of the manifest's shards, after the others
  struct File {                              // an open shard file, closed with its last holder
    explicit File(int descriptor) : fd(descriptor) {}
    ~File();
    File(const File&) = delete;
    File& operator=(const File&) = delete;
    int fd;
  };
  struct Shard {
    uint64_t bytes;
    uint64_t first, tokens;  // its ids' place in the stream
    std::string file;        // (for messages)
    std::string fnv1a64;     // the manifest's checksum, 16 hex digits ("" when it has none)
    uint64_t device, inode;  // of the file opened first, and its modification time (ns): an
    int64_t modified_ns;     // inode number freed and taken by a new file is another file
    mutable std::shared_ptr<const File> open;    // null while closed (files_mu_)
    mutable std::list<size_t>::iterator recent;  // its place in recent_ while open
  };
  // The shard's file, opened again if it was closed. Throws DamagedData when the file there now
  // is not the one first opened (or is gone), std::runtime_error when it cannot be opened.
  std::shared_ptr<const File> file_of(const Shard& s) const;
  std::shared_ptr<const File> reopen(const Shard& s) const;
  // Up to n bytes of the file from `offset` into `to`: fewer where it ends first. Throws
  // std::runtime_error naming the shard on an I/O error.
  size_t read_bytes(const Shard& s, const File& f, uint64_t offset, size_t n,
                    unsigned char* to) const;
  // What is wrong with the shard, read whole: "" when nothing. Adds its end-of-document ids to
  // *ends.
  std::string check(const Shard& s, uint64_t* ends) const;
  // What is wrong with documents.bin: "" when it holds one first token for each of the documents
  // the manifest counts and the shards end (`ends`, when they are sound), 0 first, each past the
  // one before, within the stream, and its FNV-1a is the manifest's (where it gives one).
  std::string check_documents(std::optional<uint64_t> ends) const;
  std::string check_index(int fd, uint64_t bytes) const;  // (its entries and checksum)
  std::string dir_;
  size_t vocab_ = 0;
  uint32_t end_of_document_ = 0;
  unsigned width_ = 2;
  uint64_t total_ = 0, fingerprint_ = 0;
  std::vector<Shard> shards_;
  std::optional<uint64_t> documents_;  // the manifest's "documents"
  std::string documents_fnv1a64_;      // its "documents_fnv1a64" ("" when it has none)
  size_t most_open_ = 0;               // shard files kept open (open_budget)
  mutable std::mutex files_mu_;        // (guards Shard::open, Shard::recent and recent_)
  mutable std::list<size_t> recent_;   // the open shards, the most recently read first
};

}  // namespace troupe::data
