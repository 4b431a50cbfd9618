// Hex encoding of opaque addresses and ids (UCX worker addresses, NCCL unique ids) that travel
// as text between members.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/error.h"

namespace troupe::comm {

inline std::string to_hex(const void* data, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(digits[p[i] >> 4]);
    out.push_back(digits[p[i] & 15]);
  }
  return out;
}

// Throws Error(invalid_input) naming what is wrong.
inline std::vector<uint8_t> from_hex(const std::string& s) {
  if (s.size() % 2) TROUPE_FAIL(Errc::invalid_input, "odd number of hex digits");
  std::vector<uint8_t> out(s.size() / 2);
  auto nib = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    TROUPE_FAIL(Errc::invalid_input, "not a hex digit");
  };
  for (size_t i = 0; i < out.size(); ++i) out[i] = uint8_t(nib(s[2 * i]) << 4 | nib(s[2 * i + 1]));
  return out;
}

}  // namespace troupe::comm
