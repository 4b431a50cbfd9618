#include "comm/reduce.h"

#include <immintrin.h>

#include <cstdint>
#include <cstring>

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

bool reduce_sum_streaming(void* out, const void* const* parts, int nparts, size_t count, DataType t,
                          int divisor) {
  if (t != DataType::f32 || nparts < 1) return false;
  auto* o = static_cast<float*>(out);
  auto part = [&](int q) { return static_cast<const float*>(parts[q]); };
  const float d = float(divisor);
  auto one = [&](size_t i) {
    float acc = part(0)[i];
    for (int q = 1; q < nparts; ++q) acc += part(q)[i];
    o[i] = divisor == 1 ? acc : acc / d;
  };
  size_t i = 0;
  for (; i < count && (reinterpret_cast<uintptr_t>(o + i) & 31); ++i) one(i);
  const __m256 dv = _mm256_set1_ps(d);
  for (; i + 8 <= count; i += 8) {
    __m256 acc = _mm256_loadu_ps(part(0) + i);
    for (int q = 1; q < nparts; ++q) acc = _mm256_add_ps(acc, _mm256_loadu_ps(part(q) + i));
    if (divisor != 1) acc = _mm256_div_ps(acc, dv);
    _mm256_stream_ps(o + i, acc);
  }
  for (; i < count; ++i) one(i);
  _mm_sfence();  // (the stores are weakly ordered: before whatever publishes them)
  return true;
}

}  // namespace troupe::comm
