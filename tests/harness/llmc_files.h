// llm.c's token and tokenizer files as its Python writes them (dev/data/data_common.py and its
// tokenizer writer; little-endian, as this host), for `troupe data import`'s tests.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace troupe::llmc {

inline void write_file(const std::string& path, const std::string& body) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << body;
}

constexpr int32_t kGpt2 = 20240520, kLlama3 = 20240801;

// 256 int32: the magic and version (GPT-2's 20240520 and 1: uint16 ids; LLaMA 3's 20240801 and
// 7: uint32), the count; then the ids. (`version` 0: the magic's own.)
inline void write_tokens(const std::string& path, const std::vector<uint32_t>& ids,
                         int32_t magic = kGpt2, int32_t version = 0) {
  std::vector<int32_t> h(256, 0);
  h[0] = magic;
  h[1] = version ? version : magic == kLlama3 ? 7 : 1;
  h[2] = int32_t(ids.size());
  std::string body(reinterpret_cast<const char*>(h.data()), 1024);
  for (uint32_t id : ids) body.append(reinterpret_cast<const char*>(&id), magic == kLlama3 ? 4 : 2);
  write_file(path, body);
}

// 256 uint32: 20240328, the version, the vocabulary, (version 2) the end of text; then each
// piece: its length in a byte, its bytes.
inline void write_tokenizer(const std::string& path, const std::vector<std::string>& pieces,
                            uint32_t version, uint32_t end) {
  std::vector<uint32_t> h(256, 0);
  h[0] = 20240328;
  h[1] = version;
  h[2] = uint32_t(pieces.size());
  h[3] = version == 2 ? end : 0;
  std::string body(reinterpret_cast<const char*>(h.data()), 1024);
  for (const std::string& p : pieces) body += char(p.size()) + p;
  write_file(path, body);
}

// 256 bytes and `n` - 256 longer pieces ("p256", ...); piece `end` is "<|endoftext|>".
inline std::vector<std::string> pieces(size_t n, size_t end) {
  std::vector<std::string> p;
  for (int c = 0; c < 256; ++c) p.emplace_back(1, char(c));
  while (p.size() < n) p.push_back("p" + std::to_string(p.size()));
  p[end] = "<|endoftext|>";
  return p;
}

}  // namespace troupe::llmc
