#include "data/shards.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <new>
#include <nlohmann/json.hpp>
#include <numeric>
#include <stdexcept>
#include <thread>
#include <tuple>

#include "data/tokenizer.h"

namespace troupe::data {

std::string fnv1a64_hex(uint64_t checksum) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(checksum));
  return hex;
}

nlohmann::json manifest_of(const Tokenizer& tok, unsigned width, const ShardWriter& writer,
                           const std::vector<ShardWriter::Shard>& shards) {
  nlohmann::json m;
  m["format"] = "troupe-tokens";
  m["version"] = 1;
  m["tokenizer"] = {{"kind", tok.kind()},
                    {"file", kTokenizerFile},
                    {"fingerprint", fnv1a64_hex(tok.fingerprint())}};
  if (!tok.source().empty()) m["tokenizer"]["source"] = tok.source();
  m["vocab"] = tok.vocab_size();
  m["end_of_document"] = tok.end_of_document();
  m["token_bytes"] = width;
  m["tokens"] = writer.tokens();
  m["documents"] = writer.documents();
  m["documents_fnv1a64"] = fnv1a64_hex(writer.documents_checksum());
  auto& sh = m["shards"] = nlohmann::json::array();
  for (const auto& x : shards)
    sh.push_back({{"file", x.file}, {"tokens", x.tokens}, {"fnv1a64", fnv1a64_hex(x.checksum)}});
  return m;
}

void write_manifest_file(const std::string& dir, const nlohmann::json& m) {
  const std::string path = dir + "/" + kManifestFile;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << m.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  if (!out.flush()) throw std::runtime_error("cannot write " + path);
}

std::string json_error_text(const std::exception& e) {
  const std::string text = e.what();
  const size_t tag = text.rfind("[json.exception.", 0) == 0 ? text.find("] ") : std::string::npos;
  return tag == std::string::npos ? text : text.substr(tag + 2);
}

std::string shard_name(size_t index) {
  char name[32];
  std::snprintf(name, sizeof name, "tokens-%05zu.bin", index);
  return name;
}

ShardWriter::ShardWriter(std::string dir, unsigned token_bytes, uint64_t shard_tokens)
    : dir_(std::move(dir)), width_(token_bytes), shard_tokens_(shard_tokens) {
  if (width_ != 2 && width_ != 4) throw std::invalid_argument("token ids are 2 or 4 bytes");
  if (shard_tokens_ == 0) throw std::invalid_argument("a shard holds at least one token");
  buffer_.reserve(1 << 20);
  const std::string index = dir_ + "/" + kDocumentsFile;
  index_ = std::fopen(index.c_str(), "wb");
  if (!index_) throw std::runtime_error("cannot create " + index + ": " + std::strerror(errno));
}

ShardWriter::~ShardWriter() {
  if (out_) std::fclose(out_);
  if (index_) std::fclose(index_);
}

void ShardWriter::begin_document() {
  unsigned char b[8];
  for (int i = 0; i < 8; ++i) b[i] = uint8_t(total_ >> (8 * i));
  if (std::fwrite(b, 1, 8, index_) != 8)
    throw std::runtime_error("cannot write " + dir_ + "/" + kDocumentsFile + ": " +
                             std::strerror(errno));
  index_checksum_ = fnv1a64(b, 8, index_checksum_);
  ++documents_;
}

void ShardWriter::write(const void* p, size_t n) {
  if (std::fwrite(p, 1, n, out_) != n)
    throw std::runtime_error("cannot write " + dir_ + "/" + shards_.back().file + ": " +
                             std::strerror(errno));
  shards_.back().checksum = fnv1a64(p, n, shards_.back().checksum);
}

// Flushes, syncs and closes *f (null after, whatever happened); `name` in the error.
void ShardWriter::close_synced(std::FILE*& f, const std::string& name) {
  const bool synced = std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
  const bool closed = std::fclose(f) == 0;
  f = nullptr;
  if (!synced || !closed) throw std::runtime_error("cannot write " + dir_ + "/" + name);
}

// The current shard's buffered ids written, and the shard closed durable.
void ShardWriter::close_shard() {
  if (!buffer_.empty()) write(buffer_.data(), buffer_.size());
  buffer_.clear();
  close_synced(out_, shards_.back().file);
}

void ShardWriter::roll() {
  if (out_) close_shard();
  shards_.push_back({shard_name(shards_.size()), 0, 1469598103934665603ull});
  const std::string path = dir_ + "/" + shards_.back().file;
  out_ = std::fopen(path.c_str(), "wb");
  if (!out_) throw std::runtime_error("cannot create " + path + ": " + std::strerror(errno));
}

void ShardWriter::put(uint32_t id) {
  if (!out_ || shards_.back().tokens == shard_tokens_) roll();
  unsigned char b[4] = {uint8_t(id), uint8_t(id >> 8), uint8_t(id >> 16), uint8_t(id >> 24)};
  buffer_.insert(buffer_.end(), b, b + width_);
  ++shards_.back().tokens;
  ++total_;
  if (buffer_.size() >= (1 << 20)) {
    write(buffer_.data(), buffer_.size());
    buffer_.clear();
  }
}

void ShardWriter::append(const uint32_t* ids, size_t n) {
  for (size_t i = 0; i < n; ++i) put(ids[i]);
}

void ShardWriter::end_document(uint32_t end_of_document) { put(end_of_document); }

std::vector<ShardWriter::Shard> ShardWriter::finish() {
  if (out_) close_shard();
  close_synced(index_, kDocumentsFile);
  return shards_;
}

namespace {

[[noreturn]] void bad(const std::string& dir, const std::string& what) {
  throw std::invalid_argument("data set '" + dir + "': " + what);
}

nlohmann::json read_manifest(const std::string& dir) {
  const std::string path = dir + "/" + kManifestFile;
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) bad(dir, std::string("cannot be read: ") + strerror(errno));
  if (!S_ISDIR(st.st_mode)) bad(dir, "is not a directory (troupe data prepare makes one)");
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))  // (a FIFO would block the read)
    bad(dir, std::string(kManifestFile) + " is not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in)
    unreadable_if_not_the_data(errno,
                               "data set '" + dir + "': " + kManifestFile + " cannot be read");
  if (!in)
    bad(dir, std::string("has no ") + kManifestFile +
                 ": not a prepared data set, or its prepare did not finish");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    bad(dir, std::string(kManifestFile) + " is not JSON: " + json_error_text(e));
  }
}

// Field `key` of the manifest object `o` (what `where` names): a non-negative integer at most
// `most`, else the data set is refused naming it.
uint64_t count_in(const nlohmann::json& o, const char* key, const std::string& dir,
                  const std::string& where, uint64_t most) {
  const auto it = o.find(key);
  if (it == o.end() || !it->is_number_unsigned() || it->get<uint64_t>() > most)
    bad(dir, where + "'s \"" + key + "\" is not an integer from 0 to " + std::to_string(most));
  return it->get<uint64_t>();
}

// o[key], 16 lowercase hex digits (an FNV-1a); "" when o has no such key.
std::string checksum_in(const nlohmann::json& o, const char* key, const std::string& dir,
                        const std::string& where) {
  const auto c = o.find(key);
  if (c == o.end()) return "";
  if (!c->is_string() || c->get<std::string>().size() != 16 ||
      c->get<std::string>().find_first_not_of("0123456789abcdef") != std::string::npos)
    bad(dir, where + ": its \"" + key + "\" is not 16 lowercase hex digits");
  return c->get<std::string>();
}

}  // namespace

namespace {

std::mutex open_mu;                       // (guards TokenShards::open and the limit)
std::atomic<size_t> open_shard_files{0};  // (the sets' budgets; their destructors take them off)
rlim_t first_soft_limit = 0;

// A file's last change of contents (a write, a truncation; a new file's creation). Not the
// change time: a chmod of the shards while a job reads them is no other file.
int64_t modified_ns(const struct stat& st) {
  return int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

}  // namespace

// Opens shard `s` of the manifest (its tokens of `width` bytes) after the ones opened so far.
void TokenShards::open_shard(const nlohmann::json& s) {
  const std::string where = std::string(kManifestFile) + ": a shard";
  if (!s.is_object() || !s.contains("file") || !s["file"].is_string())
    bad(dir_, where + " has no \"file\" string");
  const std::string file = s["file"].get<std::string>();
  if (file.empty() || file.find('/') != std::string::npos)
    bad(dir_, "shard file '" + file + "' is empty or has a '/'");
  const uint64_t tokens = count_in(s, "tokens", dir_, where, uint64_t(1) << 60);
  const std::string checksum = checksum_in(s, "fnv1a64", dir_, "shard " + file);
  const std::string path = dir_ + "/" + file;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);  // (a FIFO: no wait)
  if (fd < 0)
    unreadable_if_not_the_data(errno,
                               "data set '" + dir_ + "': shard " + file + " cannot be opened");
  if (fd < 0) bad(dir_, "shard " + file + " cannot be opened: " + strerror(errno));
  auto f = std::make_shared<const File>(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    bad(dir_, "shard " + file + " is not a regular file");
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // (kept open: reads that wait)
  const uint64_t bytes = uint64_t(st.st_size);
  if (bytes % width_ != 0 || bytes / width_ != tokens)
    bad(dir_, "shard " + file + " has " + std::to_string(bytes) + " bytes; the manifest says " +
                  std::to_string(tokens) + " tokens of " + std::to_string(width_) +
                  " bytes (truncated or replaced?)");
  shards_.push_back({bytes,
                     total_,
                     tokens,
                     file,
                     checksum,
                     uint64_t(st.st_dev),
                     uint64_t(st.st_ino),
                     modified_ns(st),
                     {},
                     {}});
  if (shards_.size() <= most_open_) {  // (kept open; the rest closed until read)
    shards_.back().open = std::move(f);
    shards_.back().recent = recent_.insert(recent_.end(), shards_.size() - 1);
  }
  total_ += tokens;  // (each at most 2^60, and as many as the files: no overflow)
}

// The tokenizer the shards were encoded with (its merges' fingerprint and its end of document,
// as the manifest says where it says them: a manifest of an older prepare has no fingerprint).
void check_tokenizer(const std::string& dir, const nlohmann::json& m, const Tokenizer& tok) {
  const auto t = m.find("tokenizer");
  const std::string said = t != m.end() && t->is_object() && t->contains("fingerprint") &&
                                   (*t)["fingerprint"].is_string()
                               ? (*t)["fingerprint"].get<std::string>()
                               : "";
  const std::string is = fnv1a64_hex(tok.fingerprint());
  if (!said.empty() && said != is)
    bad(dir, std::string(kTokenizerFile) + " is not the tokenizer its shards were encoded with " +
                 "(its fingerprint " + is + "; the manifest says " + said + ")");
  const auto eod = m.find("end_of_document");
  if (eod != m.end() && eod->is_number_unsigned() &&
      eod->get<uint64_t>() != uint64_t(tok.end_of_document()))
    bad(dir, std::string(kTokenizerFile) + "'s end of document (" +
                 std::to_string(tok.end_of_document()) + ") is not the manifest's (" +
                 std::to_string(eod->get<uint64_t>()) + ")");
}

namespace {

// Each data set open in the process keeps up to its budget of shard files open (a data set is
// open once in a process: TokenShards::open shares it). The soft limit on open files is raised
// by as many (up to the hard limit) above what it was at the first open, as a reader of many
// files does.
void allow_open_files(size_t more) {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return;
  if (first_soft_limit == 0) first_soft_limit = r.rlim_cur;
  rlim_t want = first_soft_limit + rlim_t(open_shard_files.load() + more);
  if (r.rlim_max != RLIM_INFINITY) want = std::min(want, r.rlim_max);
  if (want > r.rlim_cur) {
    r.rlim_cur = want;
    ::setrlimit(RLIMIT_NOFILE, &r);
  }
}

// Shard files a set keeps open: at most kMostOpenShards and a quarter of the descriptor limit
// (raised first by as many, as far as the hard limit allows).
size_t open_budget(size_t shards) {
  const size_t want = std::max<size_t>(1, std::min(shards, kMostOpenShards));
  allow_open_files(want);
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return want;
  return std::max<size_t>(1, std::min(want, size_t(r.rlim_cur / 4)));
}

}  // namespace

// (Known by its manifest: device, inode and change time. A set deleted and prepared again at the
// same path, its manifest's inode reused, is another set.)
std::shared_ptr<const TokenShards> TokenShards::open(const std::string& dir) {
  using Key = std::tuple<dev_t, ino_t, int64_t>;
  static std::map<Key, std::weak_ptr<const TokenShards>> opened;
  std::lock_guard<std::mutex> lock(open_mu);
  struct stat st {};
  const bool known = ::stat((dir + "/" + kManifestFile).c_str(), &st) == 0;
  const Key key{st.st_dev, st.st_ino, int64_t(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec};
  if (known)
    if (auto t = opened[key].lock()) return t;
  std::shared_ptr<const TokenShards> t = open_anew(dir);
  if (known) opened[key] = t;
  return t;
}

std::shared_ptr<const TokenShards> TokenShards::open_anew(const std::string& dir) {
  const nlohmann::json m = read_manifest(dir);
  std::shared_ptr<TokenShards> t(new TokenShards);
  t->dir_ = dir;
  if (!m.is_object() || m.value("format", nlohmann::json()) != "troupe-tokens" ||
      m.value("version", nlohmann::json()) != 1)
    bad(dir, std::string(kManifestFile) + " is not a troupe token manifest of version 1");
  const std::string manifest = kManifestFile;
  t->vocab_ = size_t(count_in(m, "vocab", dir, manifest, uint64_t(1) << 31));
  const uint64_t width = count_in(m, "token_bytes", dir, manifest, 4);
  if (width != 2 && width != 4) bad(dir, "token_bytes must be 2 or 4");
  t->width_ = unsigned(width);
  const Tokenizer tok = Tokenizer::load(dir + "/" + kTokenizerFile);
  t->fingerprint_ = tok.fingerprint();
  t->end_of_document_ = tok.end_of_document();
  if (tok.vocab_size() != t->vocab_)
    bad(dir, "the manifest's vocabulary (" + std::to_string(t->vocab_) +
                 ") is not its tokenizer's (" + std::to_string(tok.vocab_size()) + ")");
  check_tokenizer(dir, m, tok);
  if (t->width_ == 2 && t->vocab_ > 65536) bad(dir, "16-bit ids cannot hold its vocabulary");
  const auto shards = m.find("shards");
  if (shards == m.end() || !shards->is_array()) bad(dir, manifest + "'s \"shards\" is not a list");
  t->most_open_ = open_budget(shards->size());
  open_shard_files += t->most_open_;  // (taken off by the destructor, whatever happens next)
  for (const auto& s : *shards) t->open_shard(s);
  const uint64_t total = count_in(m, "tokens", dir, manifest, UINT64_MAX);
  if (t->total_ != total)
    bad(dir, "its shards hold " + std::to_string(t->total_) + " tokens; the manifest says " +
                 std::to_string(total));
  if (m.contains("documents")) t->documents_ = count_in(m, "documents", dir, manifest, total);
  t->documents_fnv1a64_ = checksum_in(m, "documents_fnv1a64", dir, manifest);
  return t;
}

TokenShards::~TokenShards() { open_shard_files -= most_open_; }

TokenShards::File::~File() { ::close(fd); }

std::shared_ptr<const TokenShards::File> TokenShards::file_of(const Shard& s) const {
  std::lock_guard<std::mutex> lock(files_mu_);
  if (s.open) {
    recent_.splice(recent_.begin(), recent_, s.recent);
    return s.open;
  }
  std::shared_ptr<const File> f = reopen(s);
  if (recent_.size() >= most_open_) {  // (closed when its readers let go)
    shards_[recent_.back()].open.reset();
    recent_.pop_back();
  }
  s.recent = recent_.insert(recent_.begin(), size_t(&s - shards_.data()));
  s.open = f;
  return f;
}

std::shared_ptr<const TokenShards::File> TokenShards::reopen(const Shard& s) const {
  const std::string path = dir_ + "/" + s.file;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) throw DamagedData(path + ": gone since it was opened");
  if (fd < 0) unreadable_if_not_the_data(errno, path + ": cannot be opened again");
  if (fd < 0) throw std::runtime_error(path + ": cannot be opened again: " + strerror(errno));
  auto f = std::make_shared<const File>(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || uint64_t(st.st_dev) != s.device || uint64_t(st.st_ino) != s.inode ||
      uint64_t(st.st_size) != s.bytes || modified_ns(st) != s.modified_ns)
    throw DamagedData(path + ": replaced or changed since it was opened (another file is there " +
                      "now, or it was written)");
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return f;
}

namespace {

// What a shard cut short since it was opened says, after its name.
// The file's size now (it changed since it was opened).
uint64_t size_now(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 ? uint64_t(st.st_size) : 0;
}

std::string cut_short(uint64_t bytes, uint64_t at) {
  return "cut short since it was opened: it ends at byte " + std::to_string(at) + ", not " +
         std::to_string(bytes);
}

}  // namespace

size_t TokenShards::read_bytes(const Shard& s, const File& f, uint64_t offset, size_t n,
                               unsigned char* to) const {
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(f.fd, to + done, n - done, off_t(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) unreadable_if_not_the_data(errno, dir_ + "/" + s.file + ": cannot be read");
    if (got < 0)
      throw std::runtime_error(dir_ + "/" + s.file + ": cannot be read: " + strerror(errno));
    if (got == 0) break;
    done += size_t(got);
  }
  return done;
}

void TokenShards::read(uint64_t begin, size_t n, int32_t* out) const {
  if (begin + n > total_ || begin + n < begin)
    throw std::out_of_range("tokens [" + std::to_string(begin) + ", +" + std::to_string(n) +
                            ") past the end of " + dir_ + " (" + std::to_string(total_) + ")");
  // The shard holding `begin`: the last whose first id is <= begin.
  size_t s = 0, lo = 0, hi = shards_.size();
  while (hi - lo > 1) {
    const size_t mid = (lo + hi) / 2;
    (shards_[mid].first <= begin ? lo : hi) = mid;
  }
  s = lo;
  while (n > 0) {
    const Shard& m = shards_[s];
    const std::shared_ptr<const File> f = file_of(m);
    const uint64_t at = begin - m.first;
    const size_t take = size_t(std::min<uint64_t>(n, m.tokens - at));
    // 16-bit ids are read into the upper half of out's bytes and widened from the front: the
    // id written at i ends before the one read at i + 1 begins (little-endian hosts only).
    unsigned char* bytes = reinterpret_cast<unsigned char*>(out) + (width_ == 2 ? take * 2 : 0);
    const size_t got = read_bytes(m, *f, at * width_, take * width_, bytes);
    if (got < take * width_)
      throw DamagedData(dir_ + "/" + m.file + ": " + cut_short(m.bytes, size_now(f->fd)));
    if (width_ == 2)
      for (size_t i = 0; i < take; ++i) out[i] = int32_t(bytes[2 * i] | bytes[2 * i + 1] << 8);
    for (size_t i = 0; i < take; ++i)
      if (uint32_t(out[i]) >= vocab_)
        throw DamagedData(
            dir_ + "/" + m.file + ": id " + std::to_string(uint32_t(out[i])) + " at token " +
            std::to_string(at + i) + " is outside the vocabulary of " + std::to_string(vocab_) +
            " (not what troupe data prepare or import wrote: the file changed since)");
    out += take;
    n -= take;
    begin += take;
    ++s;
  }
}

// The shard read whole, against the manifest's checksum and the vocabulary: what differs (its
// first id outside the vocabulary, with its place), named with its file; "" when nothing does.
std::string TokenShards::check(const Shard& s, uint64_t* ends) const {
  const std::shared_ptr<const File> f = file_of(s);
  std::vector<unsigned char> buf(
      size_t(std::min<uint64_t>(s.bytes, 1 << 20)));  // (width's multiple)
  uint64_t h = fnv1a64(nullptr, 0);
  std::string outside;
  for (uint64_t off = 0; off < s.bytes;) {
    const size_t n = size_t(std::min<uint64_t>(buf.size(), s.bytes - off));
    const size_t got = read_bytes(s, *f, off, n, buf.data());
    if (got < n) return s.file + ": " + cut_short(s.bytes, off + got);
    h = fnv1a64(buf.data(), n, h);
    for (size_t i = 0; i < n; i += width_) {
      const unsigned char* p = buf.data() + i;
      const uint32_t id = width_ == 2
                              ? uint32_t(p[0] | p[1] << 8)
                              : uint32_t(p[0] | p[1] << 8 | p[2] << 16 | uint32_t(p[3]) << 24);
      *ends += id == end_of_document();
      if (id >= vocab_ && outside.empty())
        outside = s.file + ": id " + std::to_string(id) + " at token " +
                  std::to_string((off + i) / width_) + " is outside the vocabulary of " +
                  std::to_string(vocab_);
    }
    off += n;
  }
  const std::string hex = fnv1a64_hex(h);
  if (s.fnv1a64.empty())
    return s.file + ": the manifest gives no checksum (\"fnv1a64\") to compare with";
  if (s.fnv1a64 != hex)
    return s.file + ": its bytes are not those prepared (FNV-1a " + hex + "; the manifest says " +
           s.fnv1a64 + ")";
  return outside;  // (bytes and checksum rewritten alike)
}

std::vector<std::string> TokenShards::verify(unsigned threads, Files files) const {
  std::vector<std::string> found(shards_.size() + 1);
  std::vector<uint64_t> ends(shards_.size(), 0);
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::exception_ptr here;  // (the first Unreadable: the check cannot be finished here)
  auto cannot = [&](std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mu);
    if (!here) here = e;
    next = shards_.size();  // (the other threads stop: nothing more is read)
  };
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < shards_.size();) try {
        found[i] = check(shards_[i], &ends[i]);
      } catch (const Unreadable&) {
        cannot(std::current_exception());
      } catch (const std::bad_alloc&) {  // (its buffer: the host's want, not the file's)
        cannot(std::make_exception_ptr(
            Unreadable(dir_ + "/" + shards_[i].file + ": cannot be read here: out of memory")));
      } catch (const std::exception& e) {  // (an I/O error, a file replaced or gone)
        found[i] = e.what();
        if (found[i].rfind(dir_ + "/", 0) == 0) found[i].erase(0, dir_.size() + 1);
      }
  };
  // (each thread holds a file open: at most half the set's budget of them, so the files kept
  // and those in use stay within a quarter and a half of the descriptor limit)
  const size_t most = std::min(
      {size_t(std::max(threads, 1u)), shards_.size(), std::max<size_t>(1, most_open_ / 2)});
  std::vector<std::thread> pool;
  for (size_t t = 1; t < most; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  // (damage found is said, whatever could not be read besides; else "not checked")
  const bool sound = std::all_of(found.begin(), found.end() - 1, std::mem_fn(&std::string::empty));
  if (here && sound) std::rethrow_exception(here);
  if (files == kEveryFile && !here) {
    try {  // (the shards' ends compared only when they are those prepared)
      found.back() = check_documents(
          sound ? std::optional(std::accumulate(ends.begin(), ends.end(), uint64_t(0)))
                : std::nullopt);
    } catch (const Unreadable&) {
      if (sound) throw;
    } catch (const std::exception& e) {
      found.back() = e.what();
    }
  }
  found.erase(std::remove(found.begin(), found.end(), std::string()), found.end());
  return found;
}

std::string TokenShards::check_documents(std::optional<uint64_t> ends) const {
  const std::string name = kDocumentsFile;
  const int fd = ::open((dir_ + "/" + name).c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) unreadable_if_not_the_data(errno, dir_ + "/" + name + ": cannot be opened");
  if (fd < 0) return name + ": cannot be opened: " + strerror(errno);
  struct Closing {
    int fd;
    ~Closing() { ::close(fd); }
  } closing{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return name + ": not a regular file";
  const uint64_t bytes = uint64_t(st.st_size), n = bytes / 8;
  if (bytes % 8 != 0) return name + ": " + std::to_string(bytes) + " bytes, not 8 a document";
  if (documents_ && n != *documents_)
    return name + ": " + std::to_string(n) + " documents; the manifest says " +
           std::to_string(*documents_);
  if (ends && n != *ends)
    return name + ": " + std::to_string(n) + " documents; the token files end " +
           std::to_string(*ends) + " (end-of-document ids)";
  return check_index(fd, bytes);
}

// documents.bin's entries (0 first, each past the one before, within the stream) and checksum.
std::string TokenShards::check_index(int fd, uint64_t bytes) const {
  const std::string name = kDocumentsFile;
  std::vector<unsigned char> buf(size_t(1) << 20);
  uint64_t h = fnv1a64(nullptr, 0), before = 0;
  for (uint64_t off = 0; off < bytes;) {
    const size_t want = size_t(std::min<uint64_t>(buf.size(), bytes - off));
    const ssize_t got = ::pread(fd, buf.data(), want, off_t(off));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) unreadable_if_not_the_data(errno, dir_ + "/" + name + ": cannot be read");
    if (got < 0) return name + ": cannot be read: " + strerror(errno);
    const size_t whole = size_t(got) / 8 * 8;  // (a file cut short now: a part of one)
    if (whole == 0) return name + ": " + cut_short(bytes, off + uint64_t(got));
    h = fnv1a64(buf.data(), whole, h);
    for (size_t i = 0; i < whole; i += 8) {
      uint64_t first = 0;
      for (int b = 0; b < 8; ++b) first |= uint64_t(buf[i + b]) << (8 * b);
      const uint64_t k = (off + i) / 8;
      if (k == 0 ? first != 0 : first <= before || first >= total_)
        return name + ": document " + std::to_string(k) + " begins at token " +
               std::to_string(first) +
               (k == 0 ? ", not 0"
                       : ", not past " + std::to_string(before) + " and before " +
                             std::to_string(total_));
      before = first;
    }
    off += whole;
  }
  const std::string hex = fnv1a64_hex(h);
  if (!documents_fnv1a64_.empty() && hex != documents_fnv1a64_)
    return name + ": its bytes are not those prepared (FNV-1a " + hex + "; the manifest says " +
           documents_fnv1a64_ + ")";
  return "";
}

}  // namespace troupe::data
