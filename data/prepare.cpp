#include "data/prepare.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "data/set_directory.h"
#include "data/shards.h"
#include "data/tokenizer.h"

namespace troupe::data {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

size_t first_invalid_utf8(const char* s, size_t n) {
  const auto* p = reinterpret_cast<const unsigned char*>(s);
  size_t i = 0;
  while (i < n) {
    if (i + 8 <= n) {  // ASCII fast path
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if ((w & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if ((c & 0xe0) == 0xc0) {
      len = 2, cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3, cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4, cp = c & 0x07;
    } else {
      return i;
    }
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) return i;
      cp = cp << 6 | (p[i + k] & 0x3f);
    }
    static const uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    i += len;
  }
  return n;
}

namespace {

struct Input {
  std::string path;
  uint64_t bytes;
  bool jsonl;
};

// *.jsonl and *.ndjson; a *.json file whose first byte after blanks is '{' too (JSON lines named
// .json, as many data sets are: read as text, their keys and quotes would be trained on). One
// that holds an array is refused with how to convert it.
bool is_jsonl(const fs::path& p) {
  std::string e = p.extension().string();
  for (char& c : e) c = char(std::tolower(static_cast<unsigned char>(c)));  // (UP.JSONL too)
  if (e == ".jsonl" || e == ".ndjson") return true;
  if (e != ".json") return false;
  std::ifstream in(p, std::ios::binary);
  char c = 0;
  if (in.peek() == 0xEF) in.ignore(3);  // (a UTF-8 byte order mark)
  while (in.get(c) && std::isspace(static_cast<unsigned char>(c))) {
  }
  if (in && c == '[')
    throw std::invalid_argument("'" + p.string() +
                                "' holds a JSON array: troupe data prepare reads JSON lines, one "
                                "object per line (jq -c '.[]' FILE > FILE.jsonl converts it)");
  return in && c == '{';
}

// What a directory holds that cannot be read is an error, not a file fewer: a subdirectory it
// may not list, a link to nothing, a link to a directory (not followed).
void refuse_unreadable(const std::string& in, const fs::directory_entry& e) {
  std::error_code ec;
  if (e.is_symlink(ec) && !fs::exists(e.path(), ec))
    throw std::invalid_argument("input '" + in + "': '" + e.path().string() +
                                "' is a link to nothing");
  if (e.is_symlink(ec) && fs::is_directory(e.path(), ec))  // (not followed: it could loop)
    throw std::invalid_argument("input '" + in + "': '" + e.path().string() +
                                "' is a link to a directory, which is not followed: name that "
                                "directory as an input of its own");
  if (e.is_directory(ec) && ::access(e.path().c_str(), R_OK | X_OK) != 0)
    throw std::invalid_argument("input '" + in + "': its directory '" + e.path().string() +
                                "' cannot be read: " + std::strerror(errno));
}

// A file met again (named twice, in a directory given too, a link to one, a hard link) is read
// once, where it was met first: it would be trained on twice. Returns how many were dropped.
uint64_t drop_repeats(std::vector<Input>& files) {
  std::set<std::pair<dev_t, ino_t>> seen;  // (the file itself, whatever names it)
  const size_t before = files.size();
  files.erase(
      std::remove_if(
          files.begin(), files.end(),
          [&](const Input& f) {
            struct stat st {};
            return ::stat(f.path.c_str(), &st) == 0 && !seen.insert({st.st_dev, st.st_ino}).second;
          }),
      files.end());
  return before - files.size();
}

// A file that cannot be read is refused before anything is read (not hours into a corpus).
Input readable(const std::string& in, const fs::path& path, uint64_t bytes) {
  if (::access(path.c_str(), R_OK) != 0)
    throw std::invalid_argument("input '" + in + "': '" + path.string() +
                                "' cannot be read: " + std::strerror(errno));
  return {path.string(), bytes, is_jsonl(path)};
}

// Every input file, directories expanded recursively in name order.
std::vector<Input> collect(const std::vector<std::string>& inputs) {
  std::vector<Input> files;
  for (const std::string& in : inputs) {
    std::error_code ec;
    const fs::file_status st = fs::status(in, ec);
    if (ec || !fs::exists(st)) throw std::invalid_argument("input '" + in + "' does not exist");
    if (fs::is_directory(st)) {
      std::vector<Input> here;
      for (auto it = fs::recursive_directory_iterator(
               in, fs::directory_options::skip_permission_denied, ec);
           !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        refuse_unreadable(in, *it);
        if (it->is_regular_file(ec))
          here.push_back(readable(in, it->path(), uint64_t(it->file_size(ec))));
      }
      if (ec) throw std::invalid_argument("input '" + in + "' cannot be listed: " + ec.message());
      std::sort(here.begin(), here.end(),
                [](const Input& a, const Input& b) { return a.path < b.path; });
      files.insert(files.end(), here.begin(), here.end());
    } else if (fs::is_regular_file(st)) {
      files.push_back(readable(in, in, uint64_t(fs::file_size(in))));
    } else {
      throw std::invalid_argument("input '" + in +
                                  "' is neither a file nor a directory (a FIFO or a device)");
    }
  }
  return files;
}

// Calls line(text, its number, bytes read up to its end) for each line of a JSON-lines file, read
// in pieces: memory is bounded by its longest line, not by its size (a corpus's files are
// gigabytes). A byte-order mark at its start is passed over.
template <class F>
void each_line(const std::string& path, F&& line) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> in(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!in) throw std::runtime_error("cannot read '" + path + "': " + std::strerror(errno));
  constexpr size_t kRead = size_t(1) << 20;
  std::string buf;
  std::vector<char> chunk(kRead);
  uint64_t before = 0;  // bytes of the file before buf
  size_t start = 0, n = 0;
  for (bool eof = false, first = true; !eof; first = false) {
    before += start;
    buf.erase(0, start);
    const size_t scanned = buf.size();  // (a line longer than a piece: not searched again)
    const size_t got = std::fread(chunk.data(), 1, chunk.size(), in.get());
    if (std::ferror(in.get()))
      throw std::runtime_error("cannot read '" + path + "': " + std::strerror(errno));
    eof = got < chunk.size();
    buf.append(chunk.data(), got);
    start = first && buf.rfind("\xEF\xBB\xBF", 0) == 0 ? 3 : 0;
    for (size_t end, from = std::max(start, scanned);
         (end = buf.find('\n', from)) != std::string::npos; from = start = end + 1)
      line(std::string_view(buf).substr(start, end - start), ++n, before + end + 1);
  }
  if (start < buf.size()) line(std::string_view(buf).substr(start), ++n, before + buf.size());
}

// Calls piece(bytes) for each 1 MiB of the file, in order.
template <class F>
void each_piece(const std::string& path, F&& piece) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> in(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!in) throw std::runtime_error("cannot read '" + path + "': " + std::strerror(errno));
  std::vector<char> chunk(size_t(1) << 20);
  for (size_t got = chunk.size(); got == chunk.size();) {
    got = std::fread(chunk.data(), 1, chunk.size(), in.get());
    if (std::ferror(in.get()))
      throw std::runtime_error("cannot read '" + path + "': " + std::strerror(errno));
    if (got > 0) piece(std::string_view(chunk.data(), got));
  }
}

// What a text holds, fed in pieces: its size, its first NUL byte and its first byte that is not
// UTF-8 (npos when none; a character cut between two pieces is whole).
struct TextScan {
  static constexpr uint64_t npos = UINT64_MAX;
  uint64_t bytes = 0, nul = npos, invalid = npos;
  bool operator==(const TextScan& o) const {
    return bytes == o.bytes && nul == o.nul && invalid == o.invalid;
  }
};

class TextCheck {
 public:
  void feed(std::string_view p) {
    if (const void* z = std::memchr(p.data(), 0, p.size()); z && s_.nul == TextScan::npos)
      s_.nul = s_.bytes + uint64_t(static_cast<const char*>(z) - p.data());
    s_.bytes += p.size();
    if (s_.invalid != TextScan::npos) return;
    work_.append(p);
    const size_t bad = first_invalid_utf8(work_.data(), work_.size());
    if (bad + 4 > work_.size() || bad == work_.size()) {  // (whole, or its last character cut)
      at_ += bad;
      work_.erase(0, bad);
    } else {
      s_.invalid = at_ + bad;
    }
  }
  bool has_nul() const { return s_.nul != TextScan::npos; }
  TextScan end() const {
    TextScan s = s_;
    if (s.invalid == TextScan::npos && !work_.empty()) s.invalid = at_;  // (cut by the end)
    return s;
  }

 private:
  TextScan s_;
  std::string work_;  // a piece, after at most 3 bytes of a character the one before cut
  uint64_t at_ = 0;   // work_'s place in the text
};

TextScan scan_text(const std::string& path) {
  TextCheck c;
  each_piece(path, [&](std::string_view p) { c.feed(p); });
  return c.end();
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read '" + path + "': " + std::strerror(errno));
  std::string s;
  in.seekg(0, std::ios::end);
  s.resize(size_t(in.tellg()));
  in.seekg(0);
  in.read(s.data(), std::streamsize(s.size()));
  s.resize(size_t(in.gcount()));
  return s;
}

// Walks the documents of every input, calling use(text) for each that can be trained on and
// counting the rest in the summary (when count is set).
class Documents {
 public:
  Documents(const std::vector<Input>& files, const PrepareOptions& o, PrepareSummary* summary,
            const std::function<void(const Progress&)>& progress)
      : files_(files),
        field_(o.jsonl_field),
        whole_text_(o.whole_text_bytes),
        summary_(summary),
        progress_(progress) {
    for (const Input& f : files_) total_ += f.bytes;
  }

  // use(piece, first, last): a document in word-aligned pieces of about kPiece bytes (whole
  // when smaller), so memory stays bounded and the progress moves within a large file.
  template <class F>
  void each(const char* phase, bool count, F&& use) {
    phase_ = phase;
    t0_ = last_ = Clock::now();
    done_ = 0;
    for (const Input& f : files_) {
      if (f.jsonl) {
        each_line(f.path, [&](std::string_view line, size_t n, uint64_t read) {
          json_line(line, f.path, n, count, use);
          tick(read);
        });
      } else if (f.bytes <= whole_text_) {
        const std::string body = slurp(f.path);  // (one document: checked whole before any use)
        document(body, f.path, count, use, body.data());
      } else {
        text_in_pieces(f.path, count, use);
      }
      done_ += f.bytes;
    }
    if (progress_) progress_({phase_, total_, total_, seconds()});
  }

  uint64_t total_bytes() const { return total_; }

 private:
  static constexpr size_t kPiece = size_t(4) << 20;

  void skipped(uint64_t PrepareSummary::*counter, const std::string& where, bool count) {
    if (!count) return;
    ++(summary_->*counter);
    if (summary_->first_skipped.empty()) summary_->first_skipped = where;
  }

  double seconds() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }

  // Progress at most every 200 ms: the files before this one, and `in_file` bytes of it.
  void tick(uint64_t in_file) {
    if (!progress_ || Clock::now() - last_ < std::chrono::milliseconds(200)) return;
    last_ = Clock::now();
    progress_({phase_, std::min(total_, done_ + in_file), total_, seconds()});
  }

  template <class F>
  void document(std::string_view text, const std::string& where, bool count, F&& use,
                const char* file_start = nullptr) {
    if (text.empty()) return skipped(&PrepareSummary::skipped_empty, where + " (empty)", count);
    if (std::memchr(text.data(), 0, text.size()))
      return skipped(&PrepareSummary::skipped_binary, where + " (binary: a NUL byte)", count);
    if (const size_t bad = first_invalid_utf8(text.data(), text.size()); bad != text.size())
      return skipped(&PrepareSummary::skipped_invalid_utf8,
                     where + " (invalid UTF-8 at byte " + std::to_string(bad) + " of its text)",
                     count);
    if (count) {
      ++summary_->documents;
      summary_->bytes += text.size();
    }
    bool first = true;
    while (text.size() > kPiece) {
      const size_t cut = stable_prefix(text.substr(0, kPiece));
      if (cut == 0) break;  // (cannot happen: 4 MiB hold many 64-byte words)
      use(text.substr(0, cut), first, false);
      first = false;
      text.remove_prefix(cut);
      if (file_start) tick(uint64_t(text.data() - file_start));
    }
    use(text, first, true);
  }

  // A text file larger than whole_text_: checked in a first read (no NUL, UTF-8), then used in
  // the pieces document() cuts a text in memory into (the same cuts: the same ids), read again.
  template <class F>
  void text_in_pieces(const std::string& path, bool count, F&& use) {
    const TextScan scan = scan_text(path);
    if (scan.bytes == 0) return skipped(&PrepareSummary::skipped_empty, path + " (empty)", count);
    if (scan.nul != TextScan::npos)
      return skipped(&PrepareSummary::skipped_binary, path + " (binary: a NUL byte)", count);
    if (scan.invalid != TextScan::npos)
      return skipped(
          &PrepareSummary::skipped_invalid_utf8,
          path + " (invalid UTF-8 at byte " + std::to_string(scan.invalid) + " of its text)",
          count);
    std::string text;
    uint64_t read = 0;
    bool first = true;
    TextCheck again;  // (what is encoded is what was checked, or the prepare fails)
    each_piece(path, [&](std::string_view p) {
      read += p.size();
      again.feed(p);
      if (read > scan.bytes || again.has_nul())
        throw std::runtime_error("'" + path + "' changed while it was read");
      text.append(p);
      for (size_t cut; text.size() > kPiece &&
                       (cut = stable_prefix(std::string_view(text).substr(0, kPiece))) != 0;) {
        use(std::string_view(text).substr(0, cut), first, false);
        first = false;
        text.erase(0, cut);
      }
      tick(read);
    });
    if (!(again.end() == scan))
      throw std::runtime_error("'" + path + "' changed while it was read");
    use(std::string_view(text), first, true);
    if (count) {
      ++summary_->documents;
      summary_->bytes += scan.bytes;
    }
  }

  template <class F>
  void json_line(std::string_view line, const std::string& path, size_t n, bool count, F&& use) {
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) return;  // (blank line)
    const std::string where = path + ":" + std::to_string(n);
    if (const size_t bad = first_invalid_utf8(line.data(), line.size()); bad != line.size())
      return skipped(&PrepareSummary::skipped_invalid_utf8,
                     where + " (invalid UTF-8 at byte " + std::to_string(bad) + " of its line)",
                     count);
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    auto it = j.is_object() ? j.find(field_) : j.end();
    if (j.is_discarded() || !j.is_object() || it == j.end() || !it->is_string())
      return skipped(&PrepareSummary::skipped_bad_json,
                     where + " (not a JSON object with a string \"" + field_ + "\")", count);
    document(std::string_view(it->template get_ref<const std::string&>()), where, count, use);
  }

  const std::vector<Input>& files_;
  std::string field_;
  uint64_t whole_text_;
  PrepareSummary* summary_;
  const std::function<void(const Progress&)>& progress_;
  uint64_t total_ = 0, done_ = 0;
  const char* phase_ = "";
  Clock::time_point t0_, last_;
};

void write_manifest(const std::string& dir, const PrepareOptions& o, const PrepareSummary& s,
                    const std::vector<Input>& files, const ShardWriter& writer,
                    const std::vector<ShardWriter::Shard>& shards, const Tokenizer& tok,
                    unsigned width) {
  nlohmann::json m = manifest_of(tok, width, writer, shards);
  m["bytes"] = s.bytes;
  auto& src = m["sources"] = nlohmann::json::array();
  for (const Input& f : files)
    src.push_back({{"path", f.path}, {"bytes", f.bytes}, {"jsonl", f.jsonl}});
  if (!o.jsonl_field.empty()) m["jsonl_field"] = o.jsonl_field;
  m["skipped"] = {{"binary", s.skipped_binary},
                  {"invalid_utf8", s.skipped_invalid_utf8},
                  {"empty", s.skipped_empty},
                  {"bad_json", s.skipped_bad_json}};
  write_manifest_file(dir, m);
}

// "; F is an llm.c token file: ..." where one of the first inputs begins as one does (ids, not
// text: prepare skips it as binary), else "".
std::string token_file_hint(const std::vector<Input>& files) {
  for (size_t i = 0; i < files.size() && i < 16; ++i) {
    uint32_t magic = 0;
    std::ifstream in(files[i].path, std::ios::binary);
    if (in.read(reinterpret_cast<char*>(&magic), 4) && (magic == 20240520 || magic == 20240801))
      return "; " + files[i].path +
             " is an llm.c token file: troupe data import FILE... --tokenizer TOKENIZER.bin "
             "--out DIR takes its ids";
  }
  return "";
}

// The tokenizer's options agree with each other (std::invalid_argument naming them if not).
void check_tokenizer_options(const PrepareOptions& o) {
  if (!o.tokenizer_from.empty() && (o.vocab != 0 || o.tokenizer != "byte"))
    throw std::invalid_argument(
        "--tokenizer-from takes its tokenizer from a data set: it "
        "cannot be given with --tokenizer or --vocab");
  if (o.tokenizer != "byte" && o.tokenizer != "bpe")
    throw std::invalid_argument("--tokenizer must be byte or bpe, not '" + o.tokenizer + "'");
  if (o.tokenizer == "bpe" && o.vocab < 258)  // (257: no merge, the byte tokenizer)
    throw std::invalid_argument(
        "--tokenizer bpe needs --vocab N with N >= 258 (256 bytes, the end of a document and "
        "a merge at least; 257 ids are --tokenizer byte), " +
        (o.vocab == 0 ? std::string("and none was given") : "not " + std::to_string(o.vocab)));
  if (o.tokenizer == "byte" && o.vocab != 0 && o.vocab != 257)
    throw std::invalid_argument("--tokenizer byte has 257 ids; --vocab " + std::to_string(o.vocab) +
                                " is for --tokenizer bpe");
  if (o.vocab > (uint64_t(1) << 24))
    throw std::invalid_argument("--vocab is at most 16,777,216 (ids reach the model as floats)");
  if (o.most_words != 0 && o.tokenizer != "bpe")
    throw std::invalid_argument("--max-words bounds the words a bpe tokenizer is trained on: it " +
                                std::string("needs --tokenizer bpe"));
}

}  // namespace

PrepareSummary prepare(const PrepareOptions& o,
                       const std::function<void(const Progress&)>& progress) {
  if (o.inputs.empty()) throw std::invalid_argument("no inputs: name text files or directories");
  check_tokenizer_options(o);
  const std::string out = new_set_directory(o.out);  // (before hours of reading, not after)
  std::vector<Input> files = collect(o.inputs);
  PrepareSummary s;
  s.repeated_files = drop_repeats(files);
  s.files = files.size();
  Documents docs(files, o, &s, progress);

  Tokenizer tok = Tokenizer::bytes();
  if (!o.tokenizer_from.empty()) {
    TokenShards::open(o.tokenizer_from);  // (a whole data set, not a stray file)
    tok = Tokenizer::load(o.tokenizer_from + "/" + kTokenizerFile);
    if (!tok.encodes())
      throw std::invalid_argument("--tokenizer-from " + o.tokenizer_from + ": its tokenizer (" +
                                  tok.source() +
                                  ") only decodes: encode the text with the tool that made it "
                                  "and import its ids (troupe data import)");
  } else if (o.tokenizer == "bpe") {
    const auto t0 = Clock::now();
    WordCounts words(o.most_words ? o.most_words : kMostWords);
    docs.each("counting words", false, [&](std::string_view text, bool, bool) { words.add(text); });
    s.words = words.distinct();
    s.words_dropped = words.dropped_words();
    s.occurrences_dropped = words.dropped_count();
    if (progress) progress({"training", 0, 1, 0});
    tok = Tokenizer::train_bpe(words, o.vocab);
    s.seconds_train = std::chrono::duration<double>(Clock::now() - t0).count();
  }

  const std::string partial = make_partial(out);
  try {
    const auto t0 = Clock::now();
    const unsigned width = tok.vocab_size() <= 65536 ? 2 : 4;
    ShardWriter writer(partial, width, o.shard_tokens);
    std::vector<uint32_t> ids;
    // (What is written is counted, not what the word count read: a file changed between the two
    // reads made the manifest say documents the shards did not hold, or 0 tokens written.)
    docs.each("encoding", true, [&](std::string_view text, bool first, bool last) {
      ids.clear();
      tok.encode(text, ids);
      if (first) writer.begin_document();
      writer.append(ids);
      if (last) writer.end_document(tok.end_of_document());
    });
    if (s.documents == 0)
      throw std::invalid_argument(
          "no text in the inputs (" + std::to_string(files.size()) + " file(s)" +
          (s.first_skipped.empty() ? std::string() : ", all skipped; first: " + s.first_skipped) +
          ")" + token_file_hint(files));
    const auto shards = writer.finish();
    s.tokens = writer.tokens();
    s.vocab = tok.vocab_size();
    s.tokenizer = tok.kind();
    tok.save(partial + "/" + kTokenizerFile);
    write_manifest(partial, o, s, files, writer, shards, tok, width);
    for (const char* f : {kTokenizerFile, kManifestFile}) sync_path(partial + "/" + f);
    sync_path(partial);  // (the shards were synced as they were closed)
    s.seconds_encode = std::chrono::duration<double>(Clock::now() - t0).count();
    publish(partial, out, o.publishing, o.published);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(partial, ec);
    throw;
  }
  return s;
}

}  // namespace troupe::data
