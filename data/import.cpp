#include "data/import.h"

#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <utility>

#include "data/set_directory.h"
#include "data/shards.h"
#include "data/unreadable.h"

namespace troupe::data {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kTokensMagic = 20240520;        // GPT-2's: version 1, uint16 ids
constexpr uint32_t kLlama3TokensMagic = 20240801;  // LLaMA 3's: version 7, uint32 ids
constexpr uint32_t kTokenizerMagic = 20240328;
constexpr size_t kHeaderWords = 256;
constexpr uint64_t kHeaderBytes = kHeaderWords * 4;

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw std::invalid_argument(path + ": " + what);
}

// A regular file opened for reading (closed with its scope), and its size.
class File {
 public:
  explicit File(const std::string& path) {
    struct stat st {};  // (before the open: a FIFO's would wait for a writer)
    if (::stat(path.c_str(), &st) != 0) {
      const int err = errno;
      unreadable_if_not_the_data(err, "'" + path + "' cannot be opened");
      bad(path, std::strerror(err));
    }
    if (!S_ISREG(st.st_mode)) bad(path, "is not a regular file");
    f = std::fopen(path.c_str(), "rb");
    if (!f) {
      const int err = errno;
      unreadable_if_not_the_data(err, "'" + path + "' cannot be opened");
      bad(path, std::string("cannot be opened: ") + std::strerror(err));
    }
    if (::fstat(::fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {  // (the file opened)
      std::fclose(f);
      bad(path, "is not a regular file");
    }
    bytes = uint64_t(st.st_size);
    device = st.st_dev;
    inode = st.st_ino;
  }
  ~File() { std::fclose(f); }
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  // llm.c's header, little-endian (as this host is); false when the file is shorter.
  bool header(uint32_t (&h)[kHeaderWords]) { return std::fread(h, 4, kHeaderWords, f) == 256; }

  std::FILE* f = nullptr;
  uint64_t bytes = 0;
  dev_t device = 0;
  ino_t inode = 0;
};

// One llm.c token file, its header checked against its size.
struct TokensFile {
  std::string path;
  unsigned width = 2;  // bytes an id
  uint64_t ids = 0, bytes = 0;
  std::pair<dev_t, ino_t> identity;
};

TokensFile tokens_file(const std::string& path) {
  File in(path);
  uint32_t h[kHeaderWords];
  if (!in.header(h)) bad(path, "is shorter than llm.c's header (1024 bytes): not a token file");
  if (h[0] != kTokensMagic && h[0] != kLlama3TokensMagic)
    bad(path, "is not an llm.c token file (it begins with " + std::to_string(h[0]) +
                  ", not 20240520 or 20240801)" +
                  (h[0] == kTokenizerMagic ? ": it is a tokenizer file (--tokenizer)" : ""));
  const uint32_t version = h[0] == kTokensMagic ? 1 : 7;
  if (h[1] != version)
    bad(path, "has version " + std::to_string(h[1]) + " of " + std::to_string(h[0]) +
                  "; this build reads 20240520 version 1 (uint16 ids, GPT-2's) and 20240801 "
                  "version 7 (uint32 ids, LLaMA 3's)");
  if (int32_t(h[2]) < 0)  // (an int32 in llm.c's header)
    bad(path, "says it holds " + std::to_string(int32_t(h[2])) + " ids");
  TokensFile t{path, version == 1 ? 2u : 4u, h[2], in.bytes, {in.device, in.inode}};
  const uint64_t want = kHeaderBytes + t.ids * t.width;
  if (in.bytes != want)
    bad(path, "holds " + std::to_string(in.bytes) + " bytes; its header says " +
                  std::to_string(t.ids) + " ids of " + std::to_string(t.width) +
                  " bytes: " + std::to_string(want) + (in.bytes < want ? " (cut short?)" : ""));
  return t;
}

// The stream's documents, written as they come: the runs of ids between two end-of-text ids,
// each ended by one.
class Documents {
 public:
  Documents(ShardWriter& writer, uint32_t end) : writer_(writer), end_(end) {}

  void add(const std::vector<uint32_t>& ids) {
    size_t from = 0;
    for (size_t i = 0; i <= ids.size(); ++i) {
      if (i < ids.size() && ids[i] != end_) continue;
      if (i > from) {
        if (!open_) writer_.begin_document();
        open_ = true;
        writer_.append(ids.data() + from, i - from);
      }
      if (i < ids.size() && open_) writer_.end_document(end_);
      if (i < ids.size()) open_ = false;
      from = i + 1;
    }
  }
  void finish() {
    if (open_) writer_.end_document(end_);
    open_ = false;
  }

 private:
  ShardWriter& writer_;
  const uint32_t end_;
  bool open_ = false;
};

// The file's ids into the stream, each checked against the vocabulary.
void copy_ids(const TokensFile& t, size_t vocab, const std::string& tokenizer, Documents& docs) {
  File in(t.path);
  if (std::make_pair(in.device, in.inode) != t.identity || in.bytes != t.bytes)
    bad(t.path, "was replaced or changed since its header was read");
  if (std::fseek(in.f, long(kHeaderBytes), SEEK_SET) != 0) bad(t.path, "cannot seek");
  std::vector<unsigned char> raw(size_t(1) << 22);
  std::vector<uint32_t> ids;
  for (uint64_t at = 0; at < t.ids;) {
    const size_t n = size_t(std::min<uint64_t>(t.ids - at, raw.size() / t.width));
    if (std::fread(raw.data(), t.width, n, in.f) != n) {
      const int err = std::ferror(in.f) ? errno : 0;  // (at the end, errno is anyone's)
      unreadable_if_not_the_data(err, "'" + t.path + "' cannot be read");
      if (err) bad(t.path, std::string("cannot be read: ") + std::strerror(err));
      bad(t.path, "ends before its " + std::to_string(t.ids) + " ids (changed while read?)");
    }
    ids.resize(n);
    for (size_t i = 0; i < n; ++i) {
      uint32_t id = 0;
      std::memcpy(&id, raw.data() + i * t.width, t.width);  // (little-endian host)
      if (id >= vocab)
        bad(t.path, "id " + std::to_string(id) + " at token " + std::to_string(at + i) +
                        " is outside the " + std::to_string(vocab) + " ids of --tokenizer " +
                        tokenizer);
      ids[i] = id;
    }
    docs.add(ids);
    at += n;
  }
}

void write_manifest(const std::string& dir, const Tokenizer& tok, unsigned width,
                    const ShardWriter& writer, const std::vector<ShardWriter::Shard>& shards,
                    const std::vector<TokensFile>& files, const std::string& tokenizer) {
  nlohmann::json m = manifest_of(tok, width, writer, shards);
  // (absolute: the set names where it came from wherever it is read)
  std::error_code ec;
  m["imported"] = {{"format", "llm.c"}, {"tokenizer", fs::absolute(tokenizer, ec).string()}};
  auto& src = m["sources"] = nlohmann::json::array();
  for (const TokensFile& f : files)
    src.push_back(
        {{"path", fs::absolute(f.path, ec).string()}, {"bytes", f.bytes}, {"ids", f.ids}});
  write_manifest_file(dir, m);
}

// The inputs' headers, before anything is written; a file named twice is refused (its ids
// would be trained on twice).
std::vector<TokensFile> tokens_files(const std::vector<std::string>& inputs) {
  std::vector<TokensFile> files;
  std::set<std::pair<dev_t, ino_t>> seen;
  for (const std::string& in : inputs) {
    files.push_back(tokens_file(in));
    if (!seen.insert(files.back().identity).second)
      bad(in, "is named twice (or a link to a file named before): its ids would be there twice");
  }
  return files;
}

}  // namespace

Tokenizer load_llmc_tokenizer(const std::string& path) {
  File in(path);
  uint32_t h[kHeaderWords];
  if (!in.header(h)) bad(path, "is shorter than llm.c's header (1024 bytes): not a tokenizer");
  if (h[0] != kTokenizerMagic)
    bad(path, "is not llm.c's tokenizer file (it begins with " + std::to_string(h[0]) +
                  ", not 20240328)" +
                  (h[0] == kTokensMagic ? ": it is a token file (an input)" : ""));
  if (h[1] != 1 && h[1] != 2)
    bad(path, "has version " + std::to_string(h[1]) + "; this build reads 1 and 2");
  const uint32_t vocab = h[2];
  if (vocab == 0 || vocab > (uint32_t(1) << 24))
    bad(path, "says " + std::to_string(vocab) + " ids (1 to 16,777,216)");
  if (h[1] == 1 && vocab != 50257)  // (llm.c: version 1 is GPT-2's, its end of text 50256)
    bad(path,
        "version 1 is GPT-2's tokenizer of 50257 ids; this one says " + std::to_string(vocab));
  const uint32_t end = h[1] == 1 ? 50256 : h[3];
  if (end >= vocab)
    bad(path, "its end-of-text id " + std::to_string(end) + " is outside its " +
                  std::to_string(vocab) + " ids");
  // (Grown as read: a header of 16,777,216 ids on a file of none held 512 MB before the end.)
  std::vector<std::string> pieces;
  for (uint32_t i = 0; i < vocab; ++i) {
    const int length = std::fgetc(in.f);
    if (std::ferror(in.f)) {  // (an I/O error, not a file cut short)
      const int err = errno;
      unreadable_if_not_the_data(err, "'" + path + "' cannot be read");
      bad(path, std::string("cannot be read: ") + std::strerror(err));
    }
    if (length <= 0)
      bad(path, length == 0 ? "piece " + std::to_string(i) + " is empty"
                            : "ends at piece " + std::to_string(i) + " of " +
                                  std::to_string(vocab) + " (cut short?)");
    pieces.emplace_back(size_t(length), '\0');
    const size_t got = std::fread(pieces[i].data(), 1, size_t(length), in.f);
    if (got != size_t(length) && std::ferror(in.f)) {  // (an I/O error, not a file cut short)
      const int err = errno;
      unreadable_if_not_the_data(err, "'" + path + "' cannot be read");
      bad(path, std::string("cannot be read: ") + std::strerror(err));
    }
    if (got != size_t(length))
      bad(path, "ends within piece " + std::to_string(i) + " of " + std::to_string(vocab) +
                    " (cut short?)");
  }
  if (std::fgetc(in.f) != EOF)
    bad(path, "has bytes after its " + std::to_string(vocab) + " pieces: not a tokenizer of " +
                  std::to_string(vocab) + " ids");
  return Tokenizer::table(std::move(pieces), end,
                          "llm.c's tokenizer, version " + std::to_string(h[1]));
}

ImportSummary import_llmc(const ImportOptions& o) {
  const auto t0 = Clock::now();
  if (o.inputs.empty()) throw std::invalid_argument("no inputs: name llm.c token files (*.bin)");
  if (o.tokenizer.empty())
    throw std::invalid_argument(
        "--tokenizer: llm.c's tokenizer file of the ids is required (gpt2_tokenizer.bin for "
        "GPT-2's)");
  const std::string out = new_set_directory(o.out);
  const Tokenizer tok = load_llmc_tokenizer(o.tokenizer);
  const std::vector<TokensFile> files = tokens_files(o.inputs);
  ImportSummary s;
  s.files = files.size();
  for (const TokensFile& f : files) s.bytes += f.bytes;
  s.vocab = tok.vocab_size();
  s.end_of_document = tok.end_of_document();
  s.tokenizer = tok.source();
  const std::string partial = make_partial(out);
  try {
    const unsigned width = tok.vocab_size() <= 65536 ? 2 : 4;
    ShardWriter writer(partial, width, o.shard_tokens);
    Documents docs(writer, tok.end_of_document());
    for (const TokensFile& f : files) copy_ids(f, tok.vocab_size(), o.tokenizer, docs);
    docs.finish();
    if (writer.documents() == 0)
      throw std::invalid_argument("no document in the inputs: they hold no id but the end of text");
    const auto shards = writer.finish();
    s.tokens = writer.tokens();
    s.documents = writer.documents();
    tok.save(partial + "/" + kTokenizerFile);
    write_manifest(partial, tok, width, writer, shards, files, o.tokenizer);
    for (const char* f : {kTokenizerFile, kManifestFile}) sync_path(partial + "/" + f);
    sync_path(partial);  // (the shards were synced as they were closed)
    publish(partial, out, o.publishing, o.published);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(partial, ec);
    throw;
  }
  s.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return s;
}

}  // namespace troupe::data
