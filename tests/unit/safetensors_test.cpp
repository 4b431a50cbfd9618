// The safetensors writer and reader: a round trip keeps names, shapes, dtypes, bytes and
// metadata; a damaged file (short, a header past the end, offsets outside the data or
// overlapping, a dtype or shape that does not fit its bytes) is refused naming the file and the
// reason, never read past its end.
#include "models/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

namespace troupe::models::safetensors {
namespace {

std::string temp_path() {
  char name[] = "/tmp/troupe-safetensors-XXXXXX";
  int fd = mkstemp(name);
  close(fd);
  return name;
}

std::vector<char> floats(std::vector<float> v) {
  std::vector<char> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// A file of one header text (its length written first) and `data` bytes.
void write_raw(const std::string& path, const std::string& header, size_t data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << std::string(data, '\0');
}

TEST(Safetensors, ARoundTripKeepsEverything) {
  const std::string path = temp_path();
  write(path,
        {{"blocks.0.qkv.weight", "F32", {2, 3}, floats({1, 2, 3, 4, 5, 6})},
         {"tokens", "I32", {1}, std::vector<char>{7, 0, 0, 0}},
         {"scalar", "F32", {}, floats({0.5f})}},
        {{"step", "42"}});
  File f = read(path);
  ASSERT_EQ(f.tensors.size(), 3u);
  const Tensor* w = f.find("blocks.0.qkv.weight");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->shape, (std::vector<size_t>{2, 3}));
  EXPECT_EQ(w->bytes, floats({1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(f.find("tokens")->dtype, "I32");
  EXPECT_EQ(f.find("scalar")->bytes, floats({0.5f}));
  EXPECT_EQ(f.metadata.at("step"), "42");
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);  // the data starts 8-byte aligned
  unlink(path.c_str());
}

TEST(Safetensors, DamagedFilesAreRefusedNamingTheReason) {
  const std::string path = temp_path();
  struct Case {
    const char* what;
    std::string header;
    size_t data;
    const char* expect;
  };
  const Case cases[] = {
      {"not JSON", "{\"a\":", 0, "the header is not a JSON object"},
      {"no offsets", R"({"a":{"dtype":"F32","shape":[1]}})", 4,
       "lacks dtype, shape or data_offsets"},
      {"a dtype not read here", R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})", 4,
       "dtype 'F16'"},
      {"past the data", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4,
       "lies outside the file's data"},
      {"shape against bytes", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8,
       "has 8 bytes for its shape's 12"},
      {"overlapping",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       8, "overlap"},
      {"a negative dimension", R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4,
       "bad shape"},
      {"a shape whose bytes wrap to 0 (2^31 x 2^31 x 4 bytes)",
       R"({"a":{"dtype":"F32","shape":[2147483648,2147483648],"data_offsets":[0,0]}})", 0,
       "has 0 bytes for its shape's 2^64 and more"},
  };
  for (const auto& c : cases) {
    write_raw(path, c.header, c.data);
    try {
      read(path);
      ADD_FAILURE() << c.what << ": accepted";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << c.what << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos)
          << c.what << ": " << e.what();
    }
  }
  // A header length past the end, and a file shorter than the length field.
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    uint64_t n = 1000;
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << "{}";
  }
  EXPECT_THROW(read(path), std::runtime_error);
  { std::ofstream(path, std::ios::binary | std::ios::trunc) << "abc"; }
  EXPECT_THROW(read(path), std::runtime_error);
  EXPECT_THROW(read("/nonexistent/x.safetensors"), std::runtime_error);
  unlink(path.c_str());
}

}  // namespace
}  // namespace troupe::models::safetensors
