// The run directory's JSON-lines logs: events.jsonl, metrics.jsonl and (with data.ledger)
// ledger.jsonl. One JSON object a line (nlohmann's JSON writer), `ts` in unix seconds. Every
// write appends a whole line or nothing: a write that fails part way (a full disk) is cut back to
// the line before, so a reader never chokes on a partial line, and the failure is reported to
// the owner (the coordinator fails the job naming the file): never a silent success.
// Plain C++: no actors.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace troupe::coordinator {

// A JSON object built field by field, in order: Json().str("event", "x").num("loss", 0.5).text()
class Json {
 public:
  Json& str(const std::string& key, const std::string& value);
  Json& num(const std::string& key, double value);  // not finite: null
  Json& integer(const std::string& key, long long value);
  Json& boolean(const std::string& key, bool value);
  Json& value(const std::string& key, nlohmann::ordered_json value);
  std::string text() const { return object_.dump(); }
  const nlohmann::ordered_json& object() const { return object_; }

 private:
  nlohmann::ordered_json object_ = nlohmann::ordered_json::object();
};

double unix_seconds();

// Reading a line back: its field `key` when it has the type the job writes, else `otherwise`
// (absent, another type: a file edited by hand or damaged; a line that is not an object has no
// fields). Never an exception.
std::string text_field(const nlohmann::json& j, const char* key, const std::string& otherwise = "");
double number_field(const nlohmann::json& j, const char* key, double otherwise = 0);
// A count (a step): 0 when absent, negative or past what 63 bits hold.
uint64_t count_field(const nlohmann::json& j, const char* key);
// The lines of RUN_DIR/events.jsonl as written; none when it is not a regular file (a FIFO would
// block the read) or cannot be read.
std::vector<std::string> event_lines(const std::string& run_dir);

class RunLog {
 public:
  explicit RunLog(const std::string& run_dir, bool ledger);  // throws std::runtime_error
  ~RunLog();
  RunLog(const RunLog&) = delete;
  RunLog& operator=(const RunLog&) = delete;

  // Called once, with "cannot write FILE: REASON", when a write first fails.
  void on_error(std::function<void(const std::string&)> handler) { on_error_ = std::move(handler); }

  // Called with every events.jsonl and metrics.jsonl line as it is written (the metrics
  // endpoint folds them: coordinator/job_metrics.h).
  void observe(std::function<void(const nlohmann::ordered_json&)> f) {
    observers_.push_back(std::move(f));
  }

  void event(const std::string& name, const Json& fields);  // adds ts and event
  void metric(const Json& fields);                          // adds ts
  void ledger(const Json& fields);                          // no-op without data.ledger
  // Rewrites ledger.jsonl without the lines of steps >= step (rolled back: they are redone).
  // False if it could not (the caller fails the job: the ledger would show them twice).
  bool drop_ledger_from(uint64_t step);

 private:
  struct File {
    std::string path;
    int fd = -1;
  };
  void append(File& f, const std::string& line);

  std::string dir_;
  File events_, metrics_, ledger_;
  bool failed_ = false;
  std::function<void(const std::string&)> on_error_;
  std::vector<std::function<void(const nlohmann::ordered_json&)>> observers_;
};

}  // namespace troupe::coordinator
