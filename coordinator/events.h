// The run directory's JSON-lines logs: events.jsonl, metrics.jsonl and (with data.ledger)
// ledger.jsonl. One JSON object a line, `ts` in unix seconds. Plain C++: no actors.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace troupe::coordinator {

// A JSON object built field by field: Json().str("event", "x").num("step", 3).text()
class Json {
 public:
  Json& str(const std::string& key, const std::string& value);
  Json& num(const std::string& key, double value);
  Json& integer(const std::string& key, long long value);
  Json& boolean(const std::string& key, bool value);
  Json& raw(const std::string& key, const std::string& json);  // an already-encoded value
  std::string text() const { return "{" + body_ + "}"; }

 private:
  void key(const std::string& k);
  std::string body_;
};

std::string json_escape(const std::string& s);
double unix_seconds();

class RunLog {
 public:
  explicit RunLog(const std::string& run_dir, bool ledger);
  ~RunLog();
  RunLog(const RunLog&) = delete;
  RunLog& operator=(const RunLog&) = delete;

  void event(const std::string& name, Json fields);  // adds ts and event
  void metric(Json fields);                          // adds ts
  void ledger(Json fields);                          // no-op without data.ledger
  // Rewrites ledger.jsonl without the lines of steps >= step (rolled back: they are redone).
  // False if it could not (the caller fails the job: the ledger would show them twice).
  bool drop_ledger_from(uint64_t step);

 private:
  std::FILE* events_ = nullptr;
  std::FILE* metrics_ = nullptr;
  std::FILE* ledger_ = nullptr;
  std::string dir_;
};

}  // namespace troupe::coordinator
