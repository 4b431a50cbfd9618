#include "comm/reduce.h"

#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace troupe::comm {
namespace {

inline float bf16_to_float(uint16_t v) {
  uint32_t bits = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline uint16_t float_to_bf16(float f) {  // round to nearest even
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x7fffffu))
    return uint16_t((bits >> 16) | 0x40);  // NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

template <typename T>
void add(T* __restrict acc, const T* __restrict in, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] += in[i];
}

template <typename T>
void add3(T* out, const T* a, const T* b, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace

size_t element_size(DataType t) {
  switch (t) {
    case DataType::f32:
      return 4;
    case DataType::f64:
      return 8;
    case DataType::bf16:
      return 2;
    case DataType::f16:
      return 2;
    case DataType::i64:
      return 8;
  }
  return 0;
}

const char* dtype_name(DataType t) {
  switch (t) {
    case DataType::f32:
      return "f32";
    case DataType::f64:
      return "f64";
    case DataType::bf16:
      return "bf16";
    case DataType::f16:
      return "f16";
    case DataType::i64:
      return "i64";
  }
  return "?";
}

void check_reduction(DataType t, ReduceOp op) {
  if (t == DataType::i64 && op == ReduceOp::avg)
    TROUPE_FAIL(Errc::invalid_input, "avg of i64 elements is refused (sum them, then divide)");
}

void reduce_sum(void* acc, const void* in, size_t n, DataType t) {
  switch (t) {
    case DataType::f32:
      add(static_cast<float*>(acc), static_cast<const float*>(in), n);
      break;
    case DataType::f64:
      add(static_cast<double*>(acc), static_cast<const double*>(in), n);
      break;
    case DataType::i64:  // (wraps on overflow, never traps: callers keep headroom)
      add(static_cast<uint64_t*>(acc), static_cast<const uint64_t*>(in), n);
      break;
    case DataType::f16:
      add(static_cast<_Float16*>(acc), static_cast<const _Float16*>(in), n);
      break;
    case DataType::bf16: {
      auto* a = static_cast<uint16_t*>(acc);
      auto* b = static_cast<const uint16_t*>(in);
      for (size_t i = 0; i < n; ++i)
        a[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
      break;
    }
  }
}

void reduce_sum_into(void* out, const void* a, const void* b, size_t n, DataType t) {
  switch (t) {
    case DataType::f32:
      add3(static_cast<float*>(out), static_cast<const float*>(a), static_cast<const float*>(b), n);
      break;
    case DataType::f64:
      add3(static_cast<double*>(out), static_cast<const double*>(a), static_cast<const double*>(b),
           n);
      break;
    case DataType::i64:
      add3(static_cast<uint64_t*>(out), static_cast<const uint64_t*>(a),
           static_cast<const uint64_t*>(b), n);
      break;
    case DataType::f16:
      add3(static_cast<_Float16*>(out), static_cast<const _Float16*>(a),
           static_cast<const _Float16*>(b), n);
      break;
    case DataType::bf16: {
      auto* o = static_cast<uint16_t*>(out);
      auto* x = static_cast<const uint16_t*>(a);
      auto* y = static_cast<const uint16_t*>(b);
      for (size_t i = 0; i < n; ++i)
        o[i] = float_to_bf16(bf16_to_float(x[i]) + bf16_to_float(y[i]));
      break;
    }
  }
}

void scale_down(void* buf, size_t n, DataType t, int divisor) {
  switch (t) {
    case DataType::i64:  // (refused by the communicators before any data moves)
      break;
    case DataType::f32: {
      auto* p = static_cast<float*>(buf);
      const float d = float(divisor);
      for (size_t i = 0; i < n; ++i) p[i] /= d;
      break;
    }
    case DataType::f64: {
      auto* p = static_cast<double*>(buf);
      for (size_t i = 0; i < n; ++i) p[i] /= double(divisor);
      break;
    }
    case DataType::f16: {
      auto* p = static_cast<_Float16*>(buf);
      for (size_t i = 0; i < n; ++i) p[i] = _Float16(float(p[i]) / float(divisor));
      break;
    }
    case DataType::bf16: {
      auto* p = static_cast<uint16_t*>(buf);
      for (size_t i = 0; i < n; ++i) p[i] = float_to_bf16(bf16_to_float(p[i]) / float(divisor));
      break;
    }
  }
}

namespace {

// A hint for the line `ahead` bytes past p: never faults, whatever the address (computed as an
// integer: it may lie past the end of p's buffer).
inline void prefetch(const void* p, size_t ahead) {
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) + ahead), _MM_HINT_T0);
}

template <bool kStream>
inline void store8(float* p, __m256 v) {
  if (kStream)
    _mm256_stream_ps(p, v);
  else
    _mm256_storeu_ps(p, v);
}

// One pass over count floats: the sum of the parts in order, divided unless divisor is 1, stored
// to out and, when copy is not null, to copy; each streamed or not as its flag says.
template <bool kStreamOut, bool kStreamCopy>
void sum_parts(float* o, float* copy, const float* const* parts, int nparts, int own, size_t count,
               int divisor) {
  const float d = float(divisor);
  auto one = [&](size_t i) {
    float acc = parts[0][i];
    for (int q = 1; q < nparts; ++q) acc += parts[q][i];
    o[i] = divisor == 1 ? acc : acc / d;
    if (copy) copy[i] = o[i];
  };
  // Streamed stores need 32-byte alignment: of whichever is streamed (both: the same offset).
  const float* aligned = kStreamOut ? o : kStreamCopy ? copy : nullptr;
  size_t i = 0;
  if (aligned)
    for (; i < count && (reinterpret_cast<uintptr_t>(aligned + i) & 31); ++i) one(i);
  const auto misaligned = [&](const float* p) {
    return (reinterpret_cast<uintptr_t>(p) & 31) != 0;
  };
  if ((kStreamOut && misaligned(o + i)) || (kStreamCopy && copy && misaligned(copy + i))) {
    for (; i < count; ++i) one(i);  // (two streamed outputs at different offsets: rare, scalar)
    return;
  }
  const __m256 dv = _mm256_set1_ps(d);
  const size_t ahead = peer_lines().prefetch_bytes;
  for (; i + 8 <= count; i += 8) {
    if (ahead && (i & 15) == 0)  // (once per line of each part another core wrote)
      for (int q = 0; q < nparts; ++q)
        if (q != own) prefetch(parts[q] + i, ahead);
    __m256 acc = _mm256_loadu_ps(parts[0] + i);
    for (int q = 1; q < nparts; ++q) acc = _mm256_add_ps(acc, _mm256_loadu_ps(parts[q] + i));
    if (divisor != 1) acc = _mm256_div_ps(acc, dv);
    store8<kStreamOut>(o + i, acc);
    if (copy) store8<kStreamCopy>(copy + i, acc);
  }
  for (; i < count; ++i) one(i);
  _mm_sfence();  // (streamed stores are weakly ordered: before whatever publishes them)
}

}  // namespace

const PeerLines& peer_lines() {
  // Measured with the shared-memory allreduce (docs/design.md, "Shared-memory allreduce"). AMD
  // (Zen 4, Zen 5): ordinary stores to lines another core read last fetch each line back for
  // ownership first (2.5x slower than streamed ones or a memcpy after the reduction, which is
  // what the staged path measured there does); memcpy and the hardware prefetchers do the
  // reading. Intel Xeon (family 6 model 207): streamed stores send the lines to memory and the
  // reader fetches them from there (10-15% slower than ordinary stores, which leave them in the
  // L3), a second store in the reduction's pass beats a memcpy after it, and reading lines
  // another core wrote waits on each one unless prefetched 2 KiB ahead (the allreduce of
  // 1-16 MiB between two processes 10-25% faster). Registered buffers read in place beat the
  // staged path from 256 KiB there (1 MiB: 1.2x with two processes, 1.5x with three or four;
  // 16-128 KiB either way), from 2 MiB on AMD (two processes; below, the extra wait costs more).
  // There, too, they go in slices of 1 MiB rather than the staged path's 128 KiB: 1.4x faster
  // from 5 MiB with two processes, 1.15-1.2x with three, 0.95-1.1x with four (oversubscribed):
  // lines another core wrote a chunk earlier have left its L2 by the time they are read.
  // TROUPE_PEER_LINES=intel|amd takes that vendor's choice on any CPU (to compare them on a new
  // one; the tests run both everywhere).
  static const PeerLines lines = [] {
    const PeerLines intel{"intel", Store::ordinary,   Store::ordinary,
                          2048,    size_t(256) << 10, size_t(1) << 20},
        amd{"amd", Store::streamed, Store::copied_after, 0, size_t(2) << 20, 0};
    const char* env = std::getenv("TROUPE_PEER_LINES");
    const std::string asked = env ? env : "";
    if (asked.empty()) return __builtin_cpu_is("intel") ? intel : amd;
    if (asked == "intel" || asked == "amd") return asked == "intel" ? intel : amd;
    TROUPE_FAIL(Errc::invalid_input,
                "TROUPE_PEER_LINES=" + asked + " is neither intel nor amd (unset: by the CPU)");
  }();
  return lines;
}

void copy_from_peer(void* dst, const void* src, size_t bytes) {
  const size_t ahead = peer_lines().prefetch_bytes;
  if (ahead == 0) {
    std::memcpy(dst, src, bytes);
    return;
  }
  auto* d = static_cast<char*>(dst);
  auto* s = static_cast<const char*>(src);
  size_t i = 0;
  for (; i + 64 <= bytes; i += 64) {
    prefetch(s + i, ahead);
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
  }
  std::memcpy(d + i, s + i, bytes - i);
}

namespace {

// The parts summed stepwise in order (types other than f32), through a buffer of this core's:
// out may be any one of the parts.
void sum_parts_stepwise(void* out, const void* const* parts, int nparts, size_t count, DataType t,
                        int divisor) {
  const size_t es = element_size(t);
  if (nparts == 1) {
    std::memmove(out, parts[0], count * es);
    if (divisor != 1) scale_down(out, count, t, divisor);
    return;
  }
  alignas(64) uint8_t acc[16384];
  const size_t step = sizeof(acc) / es;
  for (size_t at = 0; at < count; at += step) {
    const size_t n = std::min(step, count - at);
    auto part = [&](int q) { return static_cast<const uint8_t*>(parts[q]) + at * es; };
    reduce_sum_into(acc, part(0), part(1), n, t);
    for (int q = 2; q < nparts; ++q) reduce_sum(acc, part(q), n, t);
    if (divisor != 1) scale_down(acc, n, t, divisor);
    std::memcpy(static_cast<uint8_t*>(out) + at * es, acc, n * es);
  }
}

}  // namespace

void reduce_sum_parts(void* out, Store out_store, void* copy, Store copy_store,
                      const void* const* parts, int nparts, int own, size_t count, DataType t,
                      int divisor) {
  if (t != DataType::f32 || copy_store == Store::copied_after) {
    if (t == DataType::f32)
      reduce_sum_parts(out, out_store, nullptr, Store::ordinary, parts, nparts, own, count, t,
                       divisor);
    else
      sum_parts_stepwise(out, parts, nparts, count, t, divisor);
    if (copy) std::memcpy(copy, out, count * element_size(t));
    return;
  }
  auto* o = static_cast<float*>(out);
  auto* c = static_cast<float*>(copy);
  auto* p = reinterpret_cast<const float* const*>(parts);
  const bool so = out_store == Store::streamed, sc = copy && copy_store == Store::streamed;
  if (so && sc)
    sum_parts<true, true>(o, c, p, nparts, own, count, divisor);
  else if (so)
    sum_parts<true, false>(o, c, p, nparts, own, count, divisor);
  else if (sc)
    sum_parts<false, true>(o, c, p, nparts, own, count, divisor);
  else
    sum_parts<false, false>(o, c, p, nparts, own, count, divisor);
}

}  // namespace troupe::comm
