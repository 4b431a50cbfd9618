// Fuzzes the config parser: any text (and --set overrides made from it) is parsed or refused
// with a ConfigError, never a crash, a hang or another exception. `make fuzz`; the corpus is
// fuzz/corpus/config (seeds: the configs/ files).
#include <cstdint>
#include <string>

#include "coordinator/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    (void)troupe::coordinator::parse_config(text, "fuzz.toml");
  } catch (const troupe::coordinator::ConfigError&) {
  }
  // The same bytes as one override.
  try {
    (void)troupe::coordinator::parse_config("", "fuzz.toml", {text});
  } catch (const troupe::coordinator::ConfigError&) {
  }
  return 0;
}
