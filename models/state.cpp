#include "models/state.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>

namespace troupe::models {
namespace {

constexpr char kMagic[8] = {'T', 'R', 'P', 'B', 'L', 'K', '0', '1'};
constexpr uint32_t kVersion = 1;

template <typename T>
void put(std::vector<uint8_t>& out, const T& v) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}

struct Reader {
  const std::vector<uint8_t>& in;
  size_t at = 0;
  template <typename T>
  T get(const char* what) {
    T v;
    need(sizeof(T), what);
    std::memcpy(&v, in.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  void need(size_t n, const char* what) {
    if (in.size() - at < n)
      throw std::invalid_argument(std::string("block state is truncated (reading ") + what + ")");
  }
};

}  // namespace

std::vector<uint8_t> save_block_state(Block& block, size_t index, Optimizer& opt,
                                      const BlockState& s) {
  std::vector<uint8_t> out;
  save_block_state_into(out, block, index, opt, s);
  return out;
}

void save_block_state_into(std::vector<uint8_t>& into, Block& block, size_t index, Optimizer& opt,
                           const BlockState& s) {
  std::vector<uint8_t> out;  // the header
  const size_t n = block.param_count();
  const uint8_t moments = opt.has_v() ? 2 : 1;
  out.insert(out.end(), kMagic, kMagic + 8);
  put(out, kVersion);
  const std::string kind = block.kind();
  put(out, uint32_t(kind.size()));
  out.insert(out.end(), kind.begin(), kind.end());
  put(out, uint64_t(index));
  put(out, uint64_t(n));
  put(out, s.step);
  put(out, s.cursor);
  put(out, moments);
  const size_t bytes_per = n * sizeof(float);
  into.resize(out.size() + (1 + moments) * bytes_per);  // (same size again: nothing to touch)
  uint8_t* at = into.data();
  std::memcpy(at, out.data(), out.size());
  at += out.size();
  std::vector<Tensor*> arrays{&block.params(), &opt.m(index)};
  if (moments == 2) arrays.push_back(&opt.v(index));
  for (size_t i = 0; i < arrays.size(); ++i)
    arrays[i]->storage()->compute().to_host(at + i * bytes_per, arrays[i]->data(), bytes_per);
}

namespace {

// A block state's header: its fields in the order written, and where the arrays start.
struct Header {
  std::string kind;
  uint64_t index = 0, params = 0, step = 0, cursor = 0;
  uint8_t moments = 0;
  size_t arrays_at = 0;
};

// Reads the header from the first bytes of a state. Throws std::invalid_argument.
Header read_header(const std::vector<uint8_t>& bytes) {
  Reader r{bytes};
  r.need(8, "magic");
  if (std::memcmp(bytes.data(), kMagic, 8) != 0)
    throw std::invalid_argument("not a Troupe block state (bad magic)");
  r.at = 8;
  if (const uint32_t version = r.get<uint32_t>("version"); version != kVersion)
    throw std::invalid_argument("block state version " + std::to_string(version) +
                                ", this build reads " + std::to_string(kVersion));
  const uint32_t kind_len = r.get<uint32_t>("kind length");
  r.need(kind_len, "kind");
  Header h;
  h.kind.assign(reinterpret_cast<const char*>(bytes.data() + r.at), kind_len);
  r.at += kind_len;
  h.index = r.get<uint64_t>("index");
  h.params = r.get<uint64_t>("param count");
  h.step = r.get<uint64_t>("step");
  h.cursor = r.get<uint64_t>("cursor");
  h.moments = r.get<uint8_t>("moments");
  h.arrays_at = r.at;
  return h;
}

// Checks a block state's header (the first `bytes` bytes; `total` the whole state's size) against
// the block and the optimizer; returns where the arrays start. Throws std::invalid_argument.
size_t check_header(const std::vector<uint8_t>& bytes, size_t total, Block& block, size_t index,
                    Optimizer& opt, BlockState& s, uint8_t& moments) {
  const Header h = read_header(bytes);
  if (h.kind != block.kind())
    throw std::invalid_argument("block state is for a '" + h.kind + "' block, not '" +
                                block.kind() + "'");
  if (h.index != index)
    throw std::invalid_argument("block state is for block " + std::to_string(h.index) + ", not " +
                                std::to_string(index));
  if (h.params != block.param_count())
    throw std::invalid_argument("block state has " + std::to_string(h.params) +
                                " parameters; the block has " +
                                std::to_string(block.param_count()));
  s.step = h.step;
  s.cursor = h.cursor;
  moments = h.moments;
  if (moments != (opt.has_v() ? 2 : 1))
    throw std::invalid_argument("block state was saved with another optimizer");
  const size_t arrays = (1 + moments) * h.params * sizeof(float);
  if (total < h.arrays_at + arrays)
    throw std::invalid_argument("block state is truncated (reading arrays)");
  if (total != h.arrays_at + arrays) throw std::invalid_argument("block state has trailing bytes");
  return h.arrays_at;
}

std::vector<Tensor*> destinations(Block& block, size_t index, Optimizer& opt, uint8_t moments) {
  std::vector<Tensor*> out{&block.params(), &opt.m(index)};
  if (moments == 2) out.push_back(&opt.v(index));
  return out;
}

}  // namespace

BlockState load_block_state(const std::vector<uint8_t>& bytes, Block& block, size_t index,
                            Optimizer& opt) {
  BlockState s;
  uint8_t moments = 0;
  size_t at = check_header(bytes, bytes.size(), block, index, opt, s, moments);
  const size_t bytes_per = block.param_count() * sizeof(float);
  for (Tensor* t : destinations(block, index, opt, moments)) {
    t->storage()->compute().from_host(t->data(), bytes.data() + at, bytes_per);
    at += bytes_per;
  }
  return s;
}

BlockState load_block_state_file(const std::string& path, Block& block, size_t index,
                                 Optimizer& opt) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  ::fstat(fd, &st);
  std::vector<uint8_t> head(std::min<size_t>(size_t(st.st_size), 4096));
  auto read_at = [&](void* dst, size_t n, size_t off) {
    size_t got = 0;
    while (got < n) {
      ssize_t r = ::pread(fd, static_cast<uint8_t*>(dst) + got, n - got, off_t(off + got));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) throw std::runtime_error("cannot read " + path + ": cut short");
      got += size_t(r);
    }
  };
  read_at(head.data(), head.size(), 0);
  BlockState s;
  uint8_t moments = 0;
  size_t at = 0;
  try {
    at = check_header(head, size_t(st.st_size), block, index, opt, s, moments);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
  const size_t bytes_per = block.param_count() * sizeof(float);
  // Straight into host buffers; a device's through one staging buffer.
  std::vector<uint8_t> staging;
  for (Tensor* t : destinations(block, index, opt, moments)) {
    Compute& c = t->storage()->compute();
    if (c.device() == Device::cpu) {
      read_at(t->data(), bytes_per, at);
    } else {
      staging.resize(bytes_per);
      read_at(staging.data(), bytes_per, at);
      c.from_host(t->data(), staging.data(), bytes_per);
    }
    at += bytes_per;
  }
  return s;
}

uint64_t block_state_param_count(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  std::vector<uint8_t> head(4096);
  in.read(reinterpret_cast<char*>(head.data()), std::streamsize(head.size()));
  head.resize(size_t(in.gcount()));
  try {
    return read_header(head).params;
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
}

}  // namespace troupe::models
