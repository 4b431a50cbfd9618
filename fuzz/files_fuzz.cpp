// Fuzzes what troupe reads back from disk that a person or a crash may have damaged: any bytes as
// a run directory's events.jsonl or metrics.jsonl give a report (coordinator::read_run and
// render_report, as `troupe report` does), and any bytes as a checkpoint's manifest.json are
// accepted or refused with a reason (valid_checkpoint, newest_valid_checkpoint: as a resume
// does), and any bytes as a token data set's manifest.json open it or refuse it with
// std::invalid_argument naming it (TokenShards::open), then reads of what it says it holds give
// ids or data::DamagedData naming the file and the place (a shard whose ids the vocabulary does
// not hold): never a crash, undefined behaviour or another exception; and any bytes as llm.c's
// tokenizer file or token file are imported (troupe data import) or refused with
// std::invalid_argument naming the file. The first byte chooses the file. `make fuzz`; the corpus
// is fuzz/corpus/files.
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "coordinator/checkpoints.h"
#include "coordinator/run_report.h"
#include "data/import.h"
#include "data/shards.h"
#include "data/tokenizer.h"

namespace {

const std::string* made = nullptr;  // (never freed: read by the atexit handler)

void remove_scratch() {
  std::error_code ec;
  if (made) std::filesystem::remove_all(*made, ec);
}

const std::string& scratch() {
  static const std::string dir = [] {
    std::string t = (std::filesystem::temp_directory_path() / "troupe-files-fuzz-XXXXXX").string();
    if (!::mkdtemp(t.data())) abort();
    made = new std::string(t);
    std::atexit(remove_scratch);  // (libFuzzer ends with exit(): each run left its directory)
    std::filesystem::create_directories(t + "/run");
    std::filesystem::create_directories(t + "/ckpt/step-00000010");
    std::ofstream(t + "/ckpt/step-00000010/block-00000.trpblk", std::ios::binary) << "state";
    std::filesystem::create_directories(t + "/tokens");
    troupe::data::Tokenizer::bytes().save(t + "/tokens/" + troupe::data::kTokenizerFile);
    std::ofstream(t + "/tokens/tokens-00000.bin", std::ios::binary) << std::string(40, 'a');
    // llm.c's tokenizer of 300 ids (version 2, its end of text 299), for token files
    uint32_t h[256] = {20240328, 2, 300, 299};
    std::string tok(reinterpret_cast<const char*>(h), sizeof h);
    for (int i = 0; i < 300; ++i) tok += std::string(1, char(1)) + char(i);
    std::ofstream(t + "/llmc-tokenizer.bin", std::ios::binary) << tok;
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
  switch (data[0] % 6) {
    case 0:
    case 1:
      write(dir + "/run/events.jsonl", data[0] % 4 == 0 ? bytes : R"({"event":"job_started"})");
      write(dir + "/run/metrics.jsonl", data[0] % 4 == 1 ? bytes : "");
      try {  // (a log with no job in it is refused: read_run's one throw, named)
        (void)troupe::coordinator::render_report(troupe::coordinator::read_run(dir + "/run"));
      } catch (const std::runtime_error& e) {
        if (std::string(e.what()).find("holds no job_started event") == std::string::npos) throw;
      }
      break;
    case 3:
      write(dir + "/tokens/" + troupe::data::kManifestFile, bytes);
      try {
        auto t = troupe::data::TokenShards::open(dir + "/tokens");
        int32_t ids[4];
        for (uint64_t at = 0; at + 4 <= t->tokens() && at < 64; at += 4) t->read(at, 4, ids);
      } catch (const std::invalid_argument&) {
      } catch (const troupe::data::DamagedData&) {
      }
      break;
    case 4:
    case 5: {
      const std::string tokenizer =
          data[0] % 6 == 4 ? dir + "/in.bin" : dir + "/llmc-tokenizer.bin";
      write(dir + "/in.bin", bytes);
      std::error_code ec;
      std::filesystem::remove_all(dir + "/imported", ec);
      try {
        (void)troupe::data::import_llmc({{dir + "/in.bin"}, tokenizer, dir + "/imported"});
        (void)troupe::data::TokenShards::open(dir + "/imported")->verify(1);
      } catch (const std::invalid_argument& e) {
        if (std::string(e.what()).find("in.bin") == std::string::npos &&
            std::string(e.what()).find("no document") == std::string::npos)
          throw;  // (a refusal names the file)
      }
      break;
    }
    default: {
      write(dir + "/ckpt/step-00000010/manifest.json", bytes);
      // (A job's fields too: a manifest of another hash is compared with them, field by field.)
      const troupe::coordinator::CheckpointIdentity job("0123456789abcdef",
                                                        R"({"seed":3,"model":"gpt"})");
      std::string why;
      (void)troupe::coordinator::valid_checkpoint(dir + "/ckpt/step-00000010", job, &why);
      std::vector<std::string> refused;
      (void)troupe::coordinator::newest_valid_checkpoint(dir + "/ckpt", job, &refused);
    }
  }
  return 0;
}
