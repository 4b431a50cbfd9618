// The safetensors format (https://github.com/huggingface/safetensors): an 8-byte little-endian
// header length, a JSON header {name: {dtype, shape, data_offsets: [begin, end)}, "__metadata__":
// {string: string}}, then the tensors' bytes. PyTorch and Hugging Face tools read it; so do a few
// lines of Python where the package is missing (bench/peers/torch_drift.py).
//
// The reader checks everything a file from elsewhere can get wrong (sizes, offsets inside the
// data, overlaps, dtype and shape agreeing with the byte count) and throws std::runtime_error
// naming the file and the reason; it never reads past what the file holds.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace troupe::models::safetensors {

struct Tensor {
  std::string name;
  std::string dtype;  // "F32" or "I32" (4-byte elements)
  std::vector<size_t> shape;
  std::vector<char> bytes;
};

// Writes the tensors (in the given order) to path; throws std::runtime_error naming the file.
void write(const std::string& path, const std::vector<Tensor>& tensors,
           const std::map<std::string, std::string>& metadata = {});

struct File {
  std::vector<Tensor> tensors;  // in the order of their data
  std::map<std::string, std::string> metadata;
  const Tensor* find(const std::string& name) const;
};
File read(const std::string& path);

}  // namespace troupe::models::safetensors
