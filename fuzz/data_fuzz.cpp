// Fuzzes the token data inputs: any text as a tokenizer file is loaded or refused with
// std::invalid_argument (never a crash or another exception); any bytes encode and decode back
// to themselves with a trained BPE, whole and in pieces cut at stable_prefix; any ids decode or
// are refused. `make fuzz`; the corpus is fuzz/corpus/data.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "data/tokenizer.h"

namespace {

troupe::data::Tokenizer& trained() {
  static troupe::data::Tokenizer t = [] {
    std::ifstream in("/usr/share/common-licenses/GPL-3");
    std::stringstream text;
    text << in.rdbuf();
    troupe::data::WordCounts words;
    words.add(text.str());
    return troupe::data::Tokenizer::train_bpe(words, 400);
  }();
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    (void)troupe::data::Tokenizer::parse(bytes, "fuzz.json");
  } catch (const std::invalid_argument&) {
  }
  auto& tok = trained();
  const std::vector<uint32_t> ids = tok.encode(bytes);
  std::string back;
  tok.decode(ids.data(), ids.size(), back);
  if (back != bytes) std::abort();  // decode(encode(x)) == x for any x
  const size_t cut = troupe::data::stable_prefix(bytes);
  std::vector<uint32_t> pieces = tok.encode(std::string_view(bytes).substr(0, cut));
  tok.encode(std::string_view(bytes).substr(cut), pieces);
  if (pieces != ids) std::abort();  // the pieces encode as the whole
  std::vector<uint32_t> raw(size / 4);
  for (size_t i = 0; i < raw.size(); ++i)
    raw[i] = uint32_t(data[4 * i]) | uint32_t(data[4 * i + 1]) << 8 |
             uint32_t(data[4 * i + 2]) << 16 | uint32_t(data[4 * i + 3]) << 24;
  try {
    std::string out;
    tok.decode(raw.data(), raw.size(), out);
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
