// troupe data import: token files another tool wrote -> a token data set (data/shards.h), the
// same ids, with the tool's tokenizer as a table that decodes them (data/tokenizer.h).
//
// llm.c's files (its dev/data/data_common.py and tokenizer writers), every number little-endian:
//   tokens   256 int32: the magic and version (20240520 and 1: ids as uint16, GPT-2's;
//            20240801 and 7: as uint32, LLaMA 3's), the count of ids; then the ids
//   tokenizer 256 uint32: 20240328, the version (1 or 2), the vocabulary, and for version 2 the
//            end-of-text id (version 1: GPT-2's, 50256); then each id's piece: its length in
//            one byte (1 to 255), its bytes
//
// The token files are one stream, in the order named: llm.c begins each document with the
// end-of-text id, a data set ends each with it, so a document is the run of ids between two of
// them (one cut by a file's end goes on in the next file; an empty run is no document). The set
// is written into OUT.partial-PID and renamed to OUT when whole (data/set_directory.h).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace troupe::data {

struct ImportOptions {
  std::vector<std::string> inputs;  // llm.c token files
  std::string tokenizer;            // llm.c's tokenizer file of their ids
  std::string out;
  uint64_t shard_tokens = uint64_t(1) << 27;
  std::mutex* publishing = nullptr;  // (data/set_directory.h publish)
  bool* published = nullptr;
};

struct ImportSummary {
  uint64_t files = 0, bytes = 0, tokens = 0, documents = 0;
  size_t vocab = 0;
  uint32_t end_of_document = 0;
  std::string tokenizer;  // where the table came from ("llm.c tokenizer, version 1")
  double seconds = 0;
};

// llm.c's tokenizer file as a table. std::invalid_argument naming the file and what is wrong.
Tokenizer load_llmc_tokenizer(const std::string& path);

// Throws std::invalid_argument naming the file (and for an id outside the vocabulary, its
// place) for bad options or inputs, std::runtime_error for I/O failures; OUT is then absent.
ImportSummary import_llmc(const ImportOptions& options);

}  // namespace troupe::data
