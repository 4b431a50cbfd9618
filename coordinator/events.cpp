#include "coordinator/events.h"

#include <sys/time.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <stdexcept>

namespace troupe::coordinator {

std::string json_escape(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(char(c));
        }
    }
  }
  return out;
}

double unix_seconds() {
  timeval tv;
  gettimeofday(&tv, nullptr);
  return double(tv.tv_sec) + double(tv.tv_usec) * 1e-6;
}

void Json::key(const std::string& k) {
  if (!body_.empty()) body_ += ",";
  body_ += "\"" + json_escape(k) + "\":";
}
Json& Json::str(const std::string& k, const std::string& v) {
  key(k);
  body_ += "\"" + json_escape(v) + "\"";
  return *this;
}
Json& Json::num(const std::string& k, double v) {
  key(k);
  if (!std::isfinite(v)) {
    body_ += "null";
  } else {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    body_ += buf;
  }
  return *this;
}
Json& Json::integer(const std::string& k, long long v) {
  key(k);
  body_ += std::to_string(v);
  return *this;
}
Json& Json::boolean(const std::string& k, bool v) {
  key(k);
  body_ += v ? "true" : "false";
  return *this;
}
Json& Json::raw(const std::string& k, const std::string& json) {
  key(k);
  body_ += json;
  return *this;
}

RunLog::RunLog(const std::string& dir, bool ledger) : dir_(dir) {
  events_ = std::fopen((dir + "/events.jsonl").c_str(), "a");
  metrics_ = std::fopen((dir + "/metrics.jsonl").c_str(), "a");
  if (ledger) ledger_ = std::fopen((dir + "/ledger.jsonl").c_str(), "a");
  if (!events_ || !metrics_ || (ledger && !ledger_))
    throw std::runtime_error("cannot write the run logs in " + dir);
}

RunLog::~RunLog() {
  for (auto* f : {events_, metrics_, ledger_})
    if (f) std::fclose(f);
}

namespace {
void write_line(std::FILE* f, const std::string& line) {
  std::fputs((line + "\n").c_str(), f);
  std::fflush(f);
}
}  // namespace

// {"ts":..., <head>, <fields>}
std::string with_ts(const std::string& head, const Json& fields) {
  std::string body = fields.text();
  char ts[64];
  std::snprintf(ts, sizeof ts, "{\"ts\":%.3f", unix_seconds());
  std::string out = ts;
  if (!head.empty()) out += "," + head;
  if (body != "{}") out += "," + body.substr(1, body.size() - 2);
  return out + "}";
}

void RunLog::event(const std::string& name, Json fields) {
  write_line(events_, with_ts("\"event\":\"" + json_escape(name) + "\"", fields));
}

void RunLog::metric(Json fields) { write_line(metrics_, with_ts("", fields)); }

void RunLog::ledger(Json fields) {
  if (ledger_) write_line(ledger_, fields.text());
}

bool RunLog::drop_ledger_from(uint64_t step) {
  if (!ledger_) return true;
  const std::string path = dir_ + "/ledger.jsonl", tmp = path + ".tmp";
  std::ifstream in(path);
  std::ofstream out(tmp);
  for (std::string line; std::getline(in, line);) {
    // Every line starts {"step":N,
    auto at = line.find("\"step\":");
    if (at != std::string::npos && std::strtoull(line.c_str() + at + 7, nullptr, 10) >= step)
      continue;
    out << line << "\n";
  }
  out.close();
  if (!in.eof() || !out) return false;  // the old ledger stays as it was
  std::fclose(ledger_);
  const bool renamed = std::rename(tmp.c_str(), path.c_str()) == 0;
  ledger_ = std::fopen(path.c_str(), "a");
  return renamed && ledger_ != nullptr;
}

}  // namespace troupe::coordinator
