// troupe data prepare | import | encode | decode | verify: token data sets (data/prepare.h,
// data/import.h, data/shards.h).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "actors/signals.h"
#include "cli/commands.h"
#include "cli/parse.h"
#include "data/import.h"
#include "data/prepare.h"
#include "data/shards.h"
#include "data/tokenizer.h"

namespace troupe::cli {
namespace {

std::string megabytes(uint64_t bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f MB", double(bytes) / 1e6);
  return s;
}

// On a terminal: one line redrawn in place, with the rate and the time left.
void draw_progress(const data::Progress& p) {
  const double rate = p.seconds > 0 ? double(p.bytes_done) / p.seconds : 0;
  const double left = rate > 0 ? double(p.bytes_total - p.bytes_done) / rate : 0;
  const int width = 28;
  const int full =
      p.bytes_total ? int(double(width) * double(p.bytes_done) / double(p.bytes_total)) : width;
  std::string bar = std::string(size_t(full), '#') + std::string(size_t(width - full), '.');
  std::fprintf(stderr, "\r%-15s [%s] %s / %s  %.1f MB/s  ETA %.0f s   ", p.phase, bar.c_str(),
               megabytes(p.bytes_done).c_str(), megabytes(p.bytes_total).c_str(), rate / 1e6, left);
  if (p.bytes_done == p.bytes_total) std::fputc('\n', stderr);
  std::fflush(stderr);
}

// What --field may apply to: a JSON-lines file by its name, or a directory that may hold some.
// (An input that does not exist counts as one: prepare names it.)
bool jsonl_or_directory(const std::string& input) {
  std::string ext = std::filesystem::path(input).extension().string();
  for (char& c : ext) c = char(std::tolower(static_cast<unsigned char>(c)));
  std::error_code ec;
  return ext == ".jsonl" || ext == ".ndjson" || ext == ".json" ||
         std::filesystem::is_directory(input, ec) || !std::filesystem::exists(input, ec);
}

// While a prepare or an import runs: SIGINT, SIGTERM or SIGHUP removes its partial directory
// (OUT.partial-PID, where it writes until the data set is whole and renamed) and ends it with
// 128 + the signal. (One killed outright leaves it: the next of the same OUT removes it.)
class PrepareInterrupts {
 public:
  PrepareInterrupts(const std::string& out, const char* command) {
    std::string o = out;
    while (o.size() > 1 && o.back() == '/') o.pop_back();
    const std::string partial = o + ".partial-" + std::to_string(::getpid());
    thread_ = std::thread([this, partial, o, command] {
      while (!done_.load()) {
        if (const int sig = signals_.next()) {
          // Held until the exit: the set is not renamed into place meanwhile; it was, or not.
          publishing.lock();
          std::error_code ec;
          // (the writer goes on meanwhile: a file it adds during the removal is removed again)
          for (int i = 0; i < 5 && !published && std::filesystem::exists(partial, ec); ++i)
            std::filesystem::remove_all(partial, ec);
          std::fprintf(stderr, "\n%s: %s: stopped; %s\n", command, actors::signal_name(sig),
                       published ? ("the data set was written before it: " + o).c_str()
                       : std::filesystem::exists(partial, ec)
                           ? ("could not remove " + partial + ": " + ec.message()).c_str()
                           : "no data set written");
          std::fflush(nullptr);
          std::_Exit(128 + sig);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
  }
  ~PrepareInterrupts() {
    done_ = true;
    thread_.join();
  }

  std::mutex publishing;  // (data::PrepareOptions::publishing, published)
  bool published = false;

 private:
  actors::SignalWatcher signals_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// What prepare made and skipped: one JSON line, or lines for a person.
void print_summary(const data::PrepareOptions& o, const data::PrepareSummary& s, bool json) {
  const uint64_t skipped =
      s.skipped_binary + s.skipped_invalid_utf8 + s.skipped_empty + s.skipped_bad_json;
  if (json) {
    nlohmann::json j = {{"out", o.out},
                        {"tokenizer", s.tokenizer},
                        {"vocab", s.vocab},
                        {"files", s.files},
                        {"documents", s.documents},
                        {"bytes", s.bytes},
                        {"tokens", s.tokens},
                        {"skipped_binary", s.skipped_binary},
                        {"skipped_invalid_utf8", s.skipped_invalid_utf8},
                        {"skipped_empty", s.skipped_empty},
                        {"skipped_bad_json", s.skipped_bad_json},
                        {"repeated_files", s.repeated_files},
                        {"train_s", s.seconds_train},
                        {"encode_s", s.seconds_encode}};
    if (o.tokenizer == "bpe")
      j.update({{"words", s.words},
                {"words_dropped", s.words_dropped},
                {"occurrences_dropped", s.occurrences_dropped}});
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return;
  }
  std::printf(
      "troupe data prepare: %s: %llu document%s from %llu file%s (%s) -> %llu tokens, %s "
      "tokenizer, %zu ids; train %.1f s, encode %.1f s (%.1f MB/s)\n",
      o.out.c_str(), (unsigned long long)s.documents, s.documents == 1 ? "" : "s",
      (unsigned long long)s.files, s.files == 1 ? "" : "s", megabytes(s.bytes).c_str(),
      (unsigned long long)s.tokens, s.tokenizer.c_str(), s.vocab, s.seconds_train, s.seconds_encode,
      s.seconds_encode > 0 ? double(s.bytes) / s.seconds_encode / 1e6 : 0.0);
  if (s.repeated_files)
    std::printf(
        "read once: %llu file(s) met again (named twice, in a directory given too, or a "
        "link to one)\n",
        (unsigned long long)s.repeated_files);
  if (s.words_dropped)
    std::printf(
        "bpe: merges learned from %llu distinct words; %llu of the rarest were dropped as they "
        "came (%llu occurrences) to hold at most --max-words %zu\n",
        (unsigned long long)s.words, (unsigned long long)s.words_dropped,
        (unsigned long long)s.occurrences_dropped, o.most_words ? o.most_words : data::kMostWords);
  if (o.tokenizer == "bpe" && s.vocab < o.vocab)
    std::printf("fewer ids than --vocab %zu: the inputs have no pair left to merge past %zu\n",
                o.vocab, s.vocab);
  if (skipped)
    std::printf(
        "skipped %llu documents: %llu binary, %llu invalid UTF-8, %llu empty, %llu not "
        "JSON with the field; the first: %s\n",
        (unsigned long long)skipped, (unsigned long long)s.skipped_binary,
        (unsigned long long)s.skipped_invalid_utf8, (unsigned long long)s.skipped_empty,
        (unsigned long long)s.skipped_bad_json, s.first_skipped.c_str());
}

int prepare(const std::vector<std::string>& words) {
  CLI::App app{"Tokenizes text files, directories and JSON-lines files into a token data set.",
               "troupe data prepare"};
  data::PrepareOptions o;
  bool json = false;
  app.add_option("inputs", o.inputs, "text files, directories (recursively), *.jsonl files")
      ->required();
  app.add_option("--out", o.out, "the data set's directory (must not exist)")->required();
  app.add_option("--tokenizer", o.tokenizer,
                 "byte (257 ids; the default) or bpe (trained on the inputs)")
      ->check(CLI::IsMember({"byte", "bpe"}));
  app.add_option("--vocab", o.vocab, "bpe: ids in all, >= 258 (256 bytes, merges, end of text)")
      ->check(CLI::Range(size_t(1), size_t(1) << 24));
  app.add_option("--tokenizer-from", o.tokenizer_from,
                 "use this data set's tokenizer (for a mixture's other sets, an eval set)");
  app.add_option("--field", o.jsonl_field, "the text's field in JSON-lines files (default text)");
  app.add_option("--shard-tokens", o.shard_tokens, "ids per shard file")
      ->check(CLI::Range(uint64_t(1), uint64_t(1) << 40));
  app.add_option("--max-words", o.most_words,
                 "bpe: distinct words held while counting (default 4,194,304, ~1 GB); past it "
                 "the rarest are dropped")
      ->check(CLI::Range(size_t(2), size_t(1) << 40));
  app.add_flag("--json", json, "the summary as one JSON line");
  if (auto rc = parse(app, words)) return *rc;
  if (app.count("--tokenizer-from") && (app.count("--tokenizer") || app.count("--vocab")))
    throw std::invalid_argument(
        "--tokenizer-from takes its tokenizer from a data set: it cannot be given with "
        "--tokenizer or --vocab");
  if (app.count("--field") && std::none_of(o.inputs.begin(), o.inputs.end(), jsonl_or_directory))
    throw std::invalid_argument(
        "--field " + o.jsonl_field +
        ": none of the inputs is a JSON-lines file (*.jsonl, *.ndjson, *.json) or "
        "a directory; other files are read as text (rename it .jsonl)");
  const bool tty = ::isatty(2) && !json;
  std::optional<PrepareInterrupts> interrupts(std::in_place, o.out, "troupe data prepare");
  o.publishing = &interrupts->publishing;
  o.published = &interrupts->published;
  const data::PrepareSummary s =
      data::prepare(o, tty ? std::function<void(const data::Progress&)>(draw_progress) : nullptr);
  interrupts.reset();  // (done: a signal now finds no partial)
  print_summary(o, s, json);
  return 0;
}

int import_tokens(const std::vector<std::string>& words) {
  CLI::App app{
      "Another tool's token files -> a token data set, the same ids (llm.c's: GPT-2's "
      "tokens from its dev/data scripts).",
      "troupe data import"};
  data::ImportOptions o;
  bool json = false;
  app.add_option("inputs", o.inputs, "llm.c token files (*.bin), one stream in this order")
      ->required();
  app.add_option("--tokenizer", o.tokenizer,
                 "llm.c's tokenizer file of their ids (gpt2_tokenizer.bin): the set decodes "
                 "with it")
      ->required();
  app.add_option("--out", o.out, "the data set's directory (must not exist)")->required();
  app.add_option("--shard-tokens", o.shard_tokens, "ids per shard file")
      ->check(CLI::Range(uint64_t(1), uint64_t(1) << 40));
  app.add_flag("--json", json, "the summary as one JSON line");
  if (auto rc = parse(app, words)) return *rc;
  std::optional<PrepareInterrupts> interrupts(std::in_place, o.out, "troupe data import");
  o.publishing = &interrupts->publishing;
  o.published = &interrupts->published;
  const data::ImportSummary s = data::import_llmc(o);
  interrupts.reset();
  if (json) {
    const nlohmann::json j = {{"out", o.out},        {"tokenizer", s.tokenizer},
                              {"vocab", s.vocab},    {"end_of_document", s.end_of_document},
                              {"files", s.files},    {"bytes", s.bytes},
                              {"tokens", s.tokens},  {"documents", s.documents},
                              {"seconds", s.seconds}};
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  std::printf(
      "troupe data import: %s: %llu document%s from %llu file%s (%s) -> %llu tokens; %s, %zu "
      "ids, end of document %u; %.1f s\n",
      o.out.c_str(), (unsigned long long)s.documents, s.documents == 1 ? "" : "s",
      (unsigned long long)s.files, s.files == 1 ? "" : "s", megabytes(s.bytes).c_str(),
      (unsigned long long)s.tokens, s.tokenizer.c_str(), s.vocab, s.end_of_document, s.seconds);
  return 0;
}

// The data set's tokenizer, opened through its manifest (so a half-written set is refused).
data::Tokenizer tokenizer_of(const std::string& dir) {
  data::TokenShards::open(dir);
  return data::Tokenizer::load(dir + "/" + data::kTokenizerFile);
}

// troupe data verify DIR...: every data set's files read whole against what its manifest says.
// Exit 1 when a set is damaged (a file that differs, is missing or cut short, a manifest or
// tokenizer that is not what the prepare wrote), 2 when a directory is not a data set (no
// manifest.json), a file cannot be checked here (too many open files, no permission: not the
// data's fault) or the command line is wrong.
int verify(const std::vector<std::string>& words) {
  CLI::App app{
      "Reads every file of each data set (token files, documents.bin) and compares it with "
      "what troupe data prepare wrote in the manifest: size, checksum, ids within the "
      "vocabulary (troupe run checks the token files too, data.verify). Exit 1: a set is "
      "damaged; 2: a directory is not a data set, or a file cannot be read here for a reason "
      "that is not the data's (too many open files, no permission).",
      "troupe data verify"};
  std::vector<std::string> dirs;
  app.add_option("DIR", dirs, "data sets (troupe data prepare or import)")->required();
  if (auto rc = parse(app, words)) return *rc;
  int rc = 0;
  for (const std::string& dir : dirs) {
    const auto start = std::chrono::steady_clock::now();
    std::shared_ptr<const data::TokenShards> t;
    std::vector<std::string> bad;
    try {
      t = data::TokenShards::open(dir);
      bad = t->verify(std::max(1u, std::thread::hardware_concurrency()));
    } catch (const data::Unreadable& e) {
      std::fprintf(stderr, "troupe data verify: %s (not checked: the set may be sound)\n",
                   e.what());
      rc = std::max(rc, 2);
      continue;
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "troupe data verify: %s\n", e.what());
      std::error_code ec;  // (a manifest there, whatever it is: a set, damaged)
      const bool a_set = std::filesystem::status(dir + "/" + data::kManifestFile, ec).type() !=
                         std::filesystem::file_type::not_found;
      rc = std::max(rc, a_set ? 1 : 2);
      continue;
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (const std::string& b : bad)
      std::fprintf(stderr, "troupe data verify: %s/%s\n", dir.c_str(), b.c_str());
    if (!bad.empty()) {
      rc = std::max(rc, 1);
      continue;
    }
    std::printf("%s: %llu tokens in %zu shard(s) (%s): every checksum matches%s (%.1f s)\n",
                dir.c_str(), (unsigned long long)t->tokens(), t->shards(),
                megabytes(t->tokens() * t->token_bytes()).c_str(),
                t->documents_checksummed() ? ""
                                           : " (documents.bin has none: checked for its count "
                                             "and order only)",
                seconds);
  }
  return rc;
}

// Standard output written whole: a full disk, a file size limit or a closed pipe is an error
// naming the command, not a short output and exit 0.
int written(const char* command) {
  if (std::fflush(stdout) == 0 && !std::ferror(stdout)) return 0;
  std::fprintf(stderr, "troupe data %s: cannot write standard output: %s\n", command,
               std::strerror(errno));
  return 1;
}

// Standard input's bytes appended to `to` (up to `max`, when given): false, saying why, when it
// cannot be read (a directory, an I/O error).
bool read_input(const char* command, std::string& to, size_t max = SIZE_MAX) {
  char chunk[1 << 16];
  while (to.size() < max) {
    const size_t got = std::fread(chunk, 1, std::min(sizeof chunk, max - to.size()), stdin);
    to.append(chunk, got);
    if (got == 0 || std::feof(stdin)) break;
  }
  if (!std::ferror(stdin)) return true;
  std::fprintf(stderr, "troupe data %s: cannot read standard input: %s\n", command,
               std::strerror(errno));
  return false;
}

int encode(const std::vector<std::string>& words) {
  CLI::App app{"Standard input's bytes -> token ids (space-separated) on standard output.",
               "troupe data encode"};
  std::string dir;
  bool lines = false;
  app.add_option("--data", dir, "a data set (troupe data prepare or import)")->required();
  app.add_flag("--lines", lines, "one id a line");
  if (auto rc = parse(app, words)) return *rc;
  data::Tokenizer tok = tokenizer_of(dir);
  if (!tok.encodes())  // (before standard input is read)
    throw std::invalid_argument("--data " + dir + ": its tokenizer (" + tok.source() +
                                ") only decodes: encode with the tool that made its ids");
  // Streamed: each chunk is encoded up to its stable prefix, the rest carried into the next
  // chunk. So the ids equal encode(whole input), in bounded memory.
  std::string buffer, out;
  std::vector<uint32_t> ids;
  constexpr size_t kChunk = size_t(1) << 20;
  bool first = true, eof = false;
  while (!eof) {
    const size_t had = buffer.size();
    if (!read_input("encode", buffer, had + kChunk)) return 1;
    eof = buffer.size() < had + kChunk;
    const size_t cut = eof ? buffer.size() : data::stable_prefix(buffer);
    ids.clear();
    tok.encode(std::string_view(buffer).substr(0, cut), ids);
    buffer.erase(0, cut);
    out.clear();
    char num[16];
    for (uint32_t id : ids) {
      if (!first) out += lines ? '\n' : ' ';
      first = false;
      const auto r = std::to_chars(num, num + sizeof num, id);
      out.append(num, r.ptr);
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    if (std::ferror(stdout)) break;  // (said below; `yes | troupe data encode > /dev/full`)
  }
  if (!first) std::fputc('\n', stdout);
  return written("encode");
}

int decode(const std::vector<std::string>& words) {
  CLI::App app{"Token ids on standard input (separated by white space) -> their bytes.",
               "troupe data decode"};
  std::string dir;
  app.add_option("--data", dir, "a data set (troupe data prepare or import)")->required();
  if (auto rc = parse(app, words)) return *rc;
  const data::Tokenizer tok = tokenizer_of(dir);
  std::string in;
  if (!read_input("decode", in)) return 1;
  std::vector<uint32_t> ids;
  size_t i = 0, n = 0;
  while (i < in.size()) {
    while (i < in.size() && std::isspace(static_cast<unsigned char>(in[i]))) ++i;
    if (i == in.size()) break;
    const size_t start = i;
    uint64_t v = 0;
    while (i < in.size() && std::isdigit(static_cast<unsigned char>(in[i])) && v < (1ull << 32))
      v = v * 10 + uint64_t(in[i++] - '0');
    ++n;
    if (i == start || (i < in.size() && !std::isspace(static_cast<unsigned char>(in[i]))) ||
        v >= tok.vocab_size()) {
      const size_t end = in.find_first_of(" \t\r\n", start);
      std::fprintf(stderr,
                   "troupe data decode: token %zu ('%s') is not an id of this vocabulary "
                   "(0..%zu)\n",
                   n, in.substr(start, std::min<size_t>(end - start, 40)).c_str(),
                   tok.vocab_size() - 1);
      return 2;
    }
    ids.push_back(uint32_t(v));
  }
  std::string out;
  tok.decode(ids.data(), ids.size(), out);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return written("decode");
}

}  // namespace

int run_data(const std::vector<std::string>& args) {
  const std::string sub = args.empty() ? "" : args[0];
  const std::vector<std::string> rest(args.begin() + (args.empty() ? 0 : 1), args.end());
  if (sub == "prepare") return prepare(rest);
  if (sub == "import") return import_tokens(rest);
  if (sub == "encode") return encode(rest);
  if (sub == "decode") return decode(rest);
  if (sub == "verify") return verify(rest);
  const bool help = sub == "--help" || sub == "-h";
  const std::string near = did_you_mean(sub, {"prepare", "import", "encode", "decode", "verify"});
  const std::string said =
      help ? "Token data sets: prepare or import one, encode or decode with its tokenizer, "
             "verify one.\n"
      : sub.empty() ? "troupe data: expected prepare, import, encode, decode or verify\n"
                    : "troupe data: expected prepare, import, encode, decode or verify, not '" +
                          sub + "'" + (near.empty() ? "" : "; did you mean '" + near + "'?") + "\n";
  std::fprintf(help ? stdout : stderr,
               "%s"
               "  troupe data prepare INPUT... --out DIR [--tokenizer byte|bpe --vocab N "
               "[--max-words N]]\n"
               "  troupe data import FILE.bin... --tokenizer TOKENIZER.bin --out DIR   (llm.c's "
               "token files)\n"
               "  troupe data encode --data DIR   (stdin bytes -> ids)\n"
               "  troupe data decode --data DIR   (stdin ids -> bytes)\n"
               "  troupe data verify DIR...       (every file of a set against its manifest)\n"
               "(troupe data SUBCOMMAND --help lists its options)\n",
               said.c_str());
  return help ? 0 : 2;
}

}  // namespace troupe::cli
