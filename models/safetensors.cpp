#include "models/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace troupe::models::safetensors {
namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw std::runtime_error(path + ": not a valid safetensors file: " + why);
}

// The bytes of a shape's 4-byte elements; SIZE_MAX when that overflows (no file holds it).
size_t bytes_of(const std::vector<size_t>& shape) {
  size_t n = 4;
  for (size_t d : shape)
    if (__builtin_mul_overflow(n, d, &n)) return SIZE_MAX;
  return n;
}

// One header entry read back into a Tensor (shape and offsets checked; bytes not yet read).
Tensor entry(const std::string& path, const std::string& name, const json& e, size_t data_size,
             std::pair<size_t, size_t>& range) {
  if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
    fail(path, "tensor '" + name + "' lacks dtype, shape or data_offsets");
  Tensor t;
  t.name = name;
  t.dtype = e["dtype"].is_string() ? e["dtype"].get<std::string>() : "";
  if (t.dtype != "F32" && t.dtype != "I32")
    fail(path, "tensor '" + name + "' has dtype '" + t.dtype + "' (F32 or I32 expected)");
  if (!e["shape"].is_array()) fail(path, "tensor '" + name + "' has a bad shape");
  for (const auto& d : e["shape"]) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t(1) << 40))
      fail(path, "tensor '" + name + "' has a bad shape");
    t.shape.push_back(d.get<size_t>());
  }
  const auto& off = e["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
      !off[1].is_number_unsigned())
    fail(path, "tensor '" + name + "' has bad data_offsets");
  range = {off[0].get<size_t>(), off[1].get<size_t>()};
  if (range.first > range.second || range.second > data_size)
    fail(path, "tensor '" + name + "' lies outside the file's data");
  if (range.second - range.first != bytes_of(t.shape))
    fail(path, "tensor '" + name + "' has " + std::to_string(range.second - range.first) +
                   " bytes for its shape's " +
                   (bytes_of(t.shape) == SIZE_MAX ? std::string("2^64 and more")
                                                  : std::to_string(bytes_of(t.shape))));
  return t;
}

}  // namespace

const Tensor* File::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

void write(const std::string& path, const std::vector<Tensor>& tensors,
           const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t at = 0;
  for (const auto& t : tensors) {
    if (t.bytes.size() != bytes_of(t.shape))
      throw std::invalid_argument("safetensors: tensor '" + t.name +
                                  "' bytes do not fit its shape");
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {at, at + t.bytes.size()}}};
    at += t.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  uint64_t n = text.size();  // little-endian on every host this builds for (x86-64)
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(text.data(), std::streamsize(text.size()));
  for (const auto& t : tensors) out.write(t.bytes.data(), std::streamsize(t.bytes.size()));
  out.flush();
  if (!out) throw std::runtime_error(path + ": cannot write: " + std::strerror(errno));
}

File read(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw std::runtime_error(path + ": cannot open: " + std::strerror(errno));
  const size_t size = size_t(in.tellg());
  in.seekg(0);
  uint64_t n = 0;
  if (size < 8 || !in.read(reinterpret_cast<char*>(&n), 8)) fail(path, "shorter than 8 bytes");
  if (n > size - 8 || n > (size_t(100) << 20)) fail(path, "header length past the file's end");
  std::string text(n, '\0');
  in.read(text.data(), std::streamsize(n));
  json header = json::parse(text, nullptr, false);
  if (header.is_discarded() || !header.is_object()) fail(path, "the header is not a JSON object");
  File f;
  std::vector<std::pair<size_t, size_t>> ranges;
  for (const auto& [name, e] : header.items()) {
    if (name == "__metadata__") {
      if (!e.is_object()) fail(path, "__metadata__ is not an object");
      for (const auto& [k, v] : e.items())
        if (v.is_string()) f.metadata[k] = v.get<std::string>();
      continue;
    }
    ranges.emplace_back();
    f.tensors.push_back(entry(path, name, e, size - 8 - n, ranges.back()));
  }
  std::vector<size_t> order(f.tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
  for (size_t i = 1; i < order.size(); ++i)
    if (ranges[order[i]].first < ranges[order[i - 1]].second)
      fail(path, "tensors '" + f.tensors[order[i - 1]].name + "' and '" + f.tensors[order[i]].name +
                     "' overlap");
  std::vector<Tensor> sorted;
  for (size_t i : order) {
    Tensor& t = f.tensors[i];
    t.bytes.resize(ranges[i].second - ranges[i].first);
    in.seekg(std::streamoff(8 + n + ranges[i].first));
    if (!in.read(t.bytes.data(), std::streamsize(t.bytes.size())))
      fail(path, "tensor '" + t.name + "' is cut short");
    sorted.push_back(std::move(t));
  }
  f.tensors = std::move(sorted);
  return f;
}

}  // namespace troupe::models::safetensors
