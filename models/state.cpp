#include "models/state.h"

#include <cstring>
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
  const size_t n = block.param_count();
  const uint8_t moments = opt.has_v() ? 2 : 1;
  out.reserve(64 + (1 + moments) * n * sizeof(float));
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
  auto append = [&](const Tensor& t) {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(t.data());
    out.insert(out.end(), p, p + n * sizeof(float));
  };
  append(block.params());
  append(opt.m(index));
  if (moments == 2) append(opt.v(index));
  return out;
}

BlockState load_block_state(const std::vector<uint8_t>& bytes, Block& block, size_t index,
                            Optimizer& opt) {
  Reader r{bytes};
  r.need(8, "magic");
  if (std::memcmp(bytes.data(), kMagic, 8) != 0)
    throw std::invalid_argument("not a Troupe block state (bad magic)");
  r.at = 8;
  uint32_t version = r.get<uint32_t>("version");
  if (version != kVersion) {
    throw std::invalid_argument("block state version " + std::to_string(version) +
                                ", this build reads " + std::to_string(kVersion));
  }
  uint32_t kind_len = r.get<uint32_t>("kind length");
  r.need(kind_len, "kind");
  std::string kind(reinterpret_cast<const char*>(bytes.data() + r.at), kind_len);
  r.at += kind_len;
  if (kind != block.kind())
    throw std::invalid_argument("block state is for a '" + kind + "' block, not '" + block.kind() +
                                "'");
  uint64_t idx = r.get<uint64_t>("index");
  if (idx != index)
    throw std::invalid_argument("block state is for block " + std::to_string(idx) + ", not " +
                                std::to_string(index));
  uint64_t n = r.get<uint64_t>("param count");
  if (n != block.param_count()) {
    throw std::invalid_argument("block state has " + std::to_string(n) +
                                " parameters; the block has " +
                                std::to_string(block.param_count()));
  }
  BlockState s;
  s.step = r.get<uint64_t>("step");
  s.cursor = r.get<uint64_t>("cursor");
  uint8_t moments = r.get<uint8_t>("moments");
  if (moments != (opt.has_v() ? 2 : 1))
    throw std::invalid_argument("block state was saved with another optimizer");
  size_t bytes_per = n * sizeof(float);
  r.need((1 + moments) * bytes_per, "arrays");
  if (bytes.size() != r.at + (1 + moments) * bytes_per)
    throw std::invalid_argument("block state has trailing bytes");
  std::memcpy(block.params().data(), bytes.data() + r.at, bytes_per);
  std::memcpy(opt.m(index).data(), bytes.data() + r.at + bytes_per, bytes_per);
  if (moments == 2)
    std::memcpy(opt.v(index).data(), bytes.data() + r.at + 2 * bytes_per, bytes_per);
  return s;
}

}  // namespace troupe::models
