// Fuzzes what troupe reads back from disk that a person or a crash may have damaged: any bytes as
// a run directory's events.jsonl or metrics.jsonl give a report (coordinator::read_run and
// render_report, as `troupe report` does), and any bytes as a checkpoint's manifest.json are
// accepted or refused with a reason (valid_checkpoint, newest_valid_checkpoint: as a resume
// does), never a crash, undefined behaviour or an exception. The first byte chooses the file.
// `make fuzz`; the corpus is fuzz/corpus/files.
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "coordinator/checkpoints.h"
#include "coordinator/run_report.h"

namespace {

const std::string& scratch() {
  static const std::string dir = [] {
    std::string t = (std::filesystem::temp_directory_path() / "troupe-files-fuzz-XXXXXX").string();
    if (!::mkdtemp(t.data())) abort();
    std::filesystem::create_directories(t + "/run");
    std::filesystem::create_directories(t + "/ckpt/step-00000010");
    std::ofstream(t + "/ckpt/step-00000010/block-00000.trpblk", std::ios::binary) << "state";
    return t;
  }();
  return dir;
}

void write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::string& dir = scratch();
  switch (data[0] % 3) {
    case 0:
    case 1:
      write(dir + "/run/events.jsonl", data[0] % 3 == 0 ? bytes : R"({"event":"job_started"})");
      write(dir + "/run/metrics.jsonl", data[0] % 3 == 1 ? bytes : "");
      (void)troupe::coordinator::render_report(troupe::coordinator::read_run(dir + "/run"));
      break;
    default: {
      write(dir + "/ckpt/step-00000010/manifest.json", bytes);
      std::string why;
      (void)troupe::coordinator::valid_checkpoint(dir + "/ckpt/step-00000010", "0123456789abcdef",
                                                  &why);
      std::vector<std::string> refused;
      (void)troupe::coordinator::newest_valid_checkpoint(dir + "/ckpt", "0123456789abcdef",
                                                         &refused);
    }
  }
  return 0;
}
