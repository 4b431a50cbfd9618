// FNV-1a 64: the checksum of parameters (members compare them at a job's end) and of checkpoint
// shards (written by workers, checked by the coordinator before a resume).
#pragma once

#include <cstddef>
#include <cstdint>

namespace troupe::comm {

inline uint64_t fnv1a(const uint8_t* bytes, size_t n, uint64_t h = 1469598103934665603ull) {
  for (size_t i = 0; i < n; ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  return h;
}

}  // namespace troupe::comm
