// The metrics endpoint (observability.metrics_listen) with real parts: a real Prometheus
// (Debian's `prometheus`) scrapes a running job and its query API gives the values back;
// `promtool check metrics` accepts the exposition; garbage, slow clients and other paths leave
// the endpoint serving and the job training.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "coordinator/metrics_server.h"
#include "tests/harness/jobs.h"

namespace troupe {
namespace {

using namespace std::chrono_literals;
using namespace testing;

const char* kMlp = R"([job]
name = "observed"
steps = 1000000
[model]
kind = "mlp"
[observability]
metrics_listen = "127.0.0.1:0"
[logging]
progress = false
)";

// HOST:PORT of a job's endpoint, once metrics.addr is there.
std::string metrics_address(const Job& job) {
  for (auto deadline = std::chrono::steady_clock::now() + 30s;
       std::chrono::steady_clock::now() < deadline; std::this_thread::sleep_for(50ms)) {
    auto lines = lines_of(job.run_dir + "/metrics.addr");
    if (!lines.empty() && !lines[0].empty()) return lines[0];
  }
  return "";
}

int port_of(const std::string& address) {
  return std::stoi(address.substr(address.rfind(':') + 1));
}

httplib::Result http_get(int port, const std::string& path) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(5);
  c.set_read_timeout(10);
  return c.Get(path.c_str());
}

std::string url_encoded(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '_' || c == '-' || c == '.') {
      out += char(c);
    } else {
      char hex[4];
      std::snprintf(hex, sizeof hex, "%%%02X", c);
      out += hex;
    }
  }
  return out;
}

// Prometheus' answer to an instant query: the first sample's value, or nullopt.
std::optional<double> query(int port, const std::string& promql) {
  auto r = http_get(port, "/api/v1/query?query=" + url_encoded(promql));
  if (!r || r->status != 200) return std::nullopt;
  auto j = nlohmann::json::parse(r->body, nullptr, false);
  if (j.is_discarded() || j["data"]["result"].empty()) return std::nullopt;
  const nlohmann::json& value = j["data"]["result"][0]["value"][1];
  return value.is_string() ? std::optional<double>(std::stod(value.get<std::string>()))
                           : std::nullopt;
}

void stop_job(const TempDir& dir, Job& job) {
  admin(dir, {"stop", "--run-dir", job.run_dir});
  auto st = job.proc->wait(60s);
  ASSERT_TRUE(st);
  EXPECT_EQ(WEXITSTATUS(*st), 0) << text_of(job.out);
}

TEST(Metrics, APrometheusScrapesARunningJobAndPromtoolAcceptsTheOutput) {
  TempDir dir;
  Job job = start_job(dir, "observed", kMlp, 2, {}, {pace(20000)});
  const std::string address = metrics_address(job);
  ASSERT_FALSE(address.empty()) << "no metrics.addr";
  wait_steps(job, 5);

  auto body = http_get(port_of(address), "/metrics");
  ASSERT_TRUE(body && body->status == 200);
  std::ofstream(dir.path() + "/metrics.txt") << body->body;
  coordinator::ChildProcess promtool(
      {{"/bin/sh", "-c", "promtool check metrics < " + dir.path() + "/metrics.txt"},
       dir.path() + "/promtool.out",
       dir.path() + "/promtool.out",
       {}});
  auto checked = promtool.wait(30s);
  ASSERT_TRUE(checked);
  EXPECT_EQ(WEXITSTATUS(*checked), 0) << text_of(dir.path() + "/promtool.out");

  const int prom_port = free_loopback_port();
  ASSERT_GT(prom_port, 0);
  std::ofstream(dir.path() + "/prometheus.yml")
      << "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
      << "scrape_configs:\n  - job_name: troupe\n    static_configs:\n      - targets: ['"
      << address << "']\n";
  coordinator::ChildProcess prometheus(
      {{"/usr/bin/prometheus", "--config.file=" + dir.path() + "/prometheus.yml",
        "--storage.tsdb.path=" + dir.path() + "/tsdb",
        "--web.listen-address=127.0.0.1:" + std::to_string(prom_port)},
       dir.path() + "/prometheus.log",
       dir.path() + "/prometheus.log",
       {}});
  std::optional<double> step, members, up;
  for (auto deadline = std::chrono::steady_clock::now() + 60s;
       std::chrono::steady_clock::now() < deadline && !(step && *step > 5);
       std::this_thread::sleep_for(500ms))
    step = query(prom_port, "troupe_step");
  ASSERT_TRUE(step) << text_of(dir.path() + "/prometheus.log");
  EXPECT_GT(*step, 5);
  up = query(prom_port, "up{job=\"troupe\"}");
  members = query(prom_port, "troupe_members{state=\"member\"}");
  ASSERT_TRUE(up && members);
  EXPECT_EQ(*up, 1);
  EXPECT_EQ(*members, 2);
  auto stalled = query(prom_port, "time() - troupe_last_commit_time_seconds");
  ASSERT_TRUE(stalled);
  EXPECT_LT(*stalled, 30);  // the alert an operator writes: no commit for a while
  prometheus.kill_and_reap();
  stop_job(dir, job);
}

// A job paused below elastic.min_workers with one of its two members lost: the endpoint counts one
// live member (it counted the lost one too: an alert on live workers could not see the pause).
TEST(Metrics, APausedJobsLostMemberIsNoLiveMember) {
  TempDir dir;
  Job job = start_job(dir, "paused", kMlp, 2, {"elastic.min_workers=2", "elastic.max_restarts=0"},
                      {pace(20000)});
  const std::string address = metrics_address(job);
  ASSERT_FALSE(address.empty()) << "no metrics.addr";
  wait_steps(job, 5);
  ASSERT_EQ(::kill(pid_of(job, "agent-1"), SIGKILL), 0);
  ASSERT_NE(wait_event(job, is("job_paused"), 30s), "");
  const std::string one = "troupe_members{state=\"member\"} 1\n";
  std::string text;  // (the members' count is updated once a second)
  for (auto until = std::chrono::steady_clock::now() + 10s;
       std::chrono::steady_clock::now() < until && text.find(one) == std::string::npos;
       std::this_thread::sleep_for(200ms))
    if (auto r = http_get(port_of(address), "/metrics"); r && r->status == 200) text = r->body;
  EXPECT_NE(text.find(one), std::string::npos) << text;
  EXPECT_NE(text.find("troupe_paused 1\n"), std::string::npos) << text;
  admin(dir, {"stop", "--run-dir", job.run_dir});
  EXPECT_TRUE(job.proc->wait(60s));
}

// An endpoint closed as soon as it opens (a job refused before it starts) ends: its stop used to
// be lost when it came before the server's thread reached its accept loop, and `troupe run` then
// hung in the destructor, deaf to SIGTERM (2 runs in 8).
TEST(Metrics, AnEndpointClosedAsSoonAsItOpensEnds) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> ended = done->get_future();
  std::thread([done] {
    for (int i = 0; i < 300; ++i)
      coordinator::MetricsServer s("127.0.0.1:0", [] { return std::string(); });
    done->set_value();
  }).detach();  // (a hung one cannot be joined: the test fails instead)
  EXPECT_EQ(ended.wait_for(60s), std::future_status::ready) << "a server's destructor hung";
}

// A port another endpoint listens on (a second job given the same metrics_listen) is refused:
// the two shared it, each scrape answered by either job.
TEST(Metrics, APortAnotherEndpointListensOnIsRefused) {
  coordinator::MetricsServer first("127.0.0.1:0", [] { return std::string("first"); });
  const std::string taken = "127.0.0.1:" + std::to_string(port_of(first.address()));
  EXPECT_THROW(coordinator::MetricsServer(taken, [] { return std::string("second"); }),
               std::runtime_error);
}

// Another method on /metrics is a 405, another path a 404; garbage is answered 400 and dropped;
// clients that send half a request and wait hold a thread for the read deadline only, so a scrape
// still gets its answer while more of them than the server has threads hang on.
TEST(Metrics, TheEndpointSurvivesGarbageSlowClientsAndOtherPaths) {
  TempDir dir;
  Job job = start_job(dir, "observed", kMlp, 2, {}, {pace(20000)});
  const std::string address = metrics_address(job);
  ASSERT_FALSE(address.empty());
  const int port = port_of(address);
  auto other = http_get(port, "/");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404);
  {
    httplib::Client c("127.0.0.1", port);
    auto posted = c.Post("/metrics", "x=1", "application/x-www-form-urlencoded");
    ASSERT_TRUE(posted);
    EXPECT_EQ(posted->status, 405);
    EXPECT_EQ(posted->get_header_value("Allow"), "GET, HEAD");
    auto elsewhere = c.Delete("/other");
    ASSERT_TRUE(elsewhere);
    EXPECT_EQ(elsewhere->status, 404);
  }
  int fd = connect_loopback(port);
  ASSERT_GE(fd, 0);
  const std::string junk = "\x16\x03\x01 not http at all\r\n\r\n";
  ASSERT_GT(::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL), 0);
  char answer[64] = {};
  ASSERT_GT(::recv(fd, answer, sizeof answer - 1, 0), 0);
  EXPECT_EQ(std::string(answer).rfind("HTTP/1.1 400", 0), 0u) << answer;
  ::close(fd);

  std::vector<int> slow;
  for (int i = 0; i < 8; ++i) {
    slow.push_back(connect_loopback(port));
    ASSERT_GE(slow.back(), 0);
    const std::string half = "GET /metr";
    ::send(slow.back(), half.data(), half.size(), MSG_NOSIGNAL);
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto scraped = http_get(port, "/metrics");
  ASSERT_TRUE(scraped) << "no answer while slow clients hang on";
  EXPECT_EQ(scraped->status, 200);
  EXPECT_NE(scraped->body.find("troupe_step "), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  for (int s : slow) ::close(s);
  const size_t before = committed_losses(job.run_dir).size();
  wait_steps(job, before + 5);  // the job trained on throughout
  stop_job(dir, job);
}

// A command's exit status and output (`troupe report`, chromium).
int run_command(const TempDir& dir, const std::vector<std::string>& argv, std::string* text) {
  const std::string out = dir.path() + "/command.out";
  coordinator::ChildProcess p({argv, out, out, {}});
  auto st = p.wait(120s);
  *text = text_of(out);
  return st && WIFEXITED(*st) ? WEXITSTATUS(*st) : -1;
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = 0; (at = text.find(what, at)) != std::string::npos; at += what.size()) ++n;
  return n;
}

// troupe report on a run with a failure, a restart (join) and checkpoints, while it runs and
// after: one HTML file that needs nothing else (no script, no link, nothing fetched), rendered in
// a real browser (headless Chromium): its plots are in the DOM with their lines, the failure and
// the join are marked on the timeline, the change's recovery time is in the table, and the
// screenshot is far from blank.
TEST(Report, AReportOfAnElasticRunIsSelfContainedAndDrawnInABrowser) {
  TempDir dir;
  Job job = start_job(dir, "observed", kMlp, 3, {"job.steps=400", "checkpoint.every_steps=50"},
                      {pace(5000)});
  wait_steps(job, 60);
  // The kill first, the live report after: under a sanitizer on 2 cores the report's process
  // takes seconds, and the job could end before a kill aimed after it.
  const int victim = pid_of(job, "agent-1");
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  std::string said;
  ASSERT_EQ(
      run_command(dir, {troupe_binary(), "report", job.run_dir, "-o", dir.path() + "/live.html"},
                  &said),
      0)
      << said;  // a running job's directory
  auto st = job.proc->wait(120s);
  ASSERT_TRUE(st);
  ASSERT_EQ(WEXITSTATUS(*st), 0) << text_of(job.out);
  const std::string html = dir.path() + "/report.html";
  ASSERT_EQ(run_command(dir, {troupe_binary(), "report", job.run_dir, "-o", html}, &said), 0)
      << said;
  const std::string page = text_of(html);
  for (const char* network : {"<script", "<link", "src=", "url(", "@import"})
    EXPECT_EQ(page.find(network), std::string::npos) << network;
  EXPECT_NE(page.find("class=\"mark failure\""), std::string::npos);
  EXPECT_NE(page.find("class=\"mark join\""), std::string::npos);
  EXPECT_NE(page.find("class=\"mark checkpoint\""), std::string::npos);
  EXPECT_EQ(page.find("not yet"), std::string::npos) << "a change without its recovery time";
  // It says what ran where and when: the run directory, the start, the model and the data.
  EXPECT_NE(page.find("<p id=\"about\">" + job.run_dir + ", started 20"), std::string::npos);
  EXPECT_NE(page.find("; model mlp; data synthetic</p>"), std::string::npos)
      << page.substr(0, 1500);

  const std::string browser = "/usr/bin/chromium-headless-shell";
  const std::vector<std::string> flags{browser, "--no-sandbox", "--disable-gpu",
                                       "--hide-scrollbars", "--window-size=1000,2400"};
  std::vector<std::string> dump = flags;
  dump.push_back("--dump-dom");
  dump.push_back("file://" + html);
  std::string dom;
  ASSERT_EQ(run_command(dir, dump, &dom), 0) << dom;
  EXPECT_EQ(count_of(dom, "<svg class=\"plot\""), 6u) << dom.substr(0, 2000);
  EXPECT_GE(count_of(dom, "<polyline"), 8u);  // loss, throughput, 3 + 3 per worker, idle, ...
  EXPECT_NE(dom.find("recovery (s)"), std::string::npos);
  auto shot = [&](const std::string& file, const std::string& png) {
    std::vector<std::string> a = flags;
    a.push_back("--screenshot=" + png);
    a.push_back("file://" + file);
    std::string out;
    EXPECT_EQ(run_command(dir, a, &out), 0) << out;
    std::error_code ec;
    return std::filesystem::file_size(png, ec);
  };
  std::ofstream(dir.path() + "/blank.html") << "<!DOCTYPE html><html><body></body></html>";
  const auto blank = shot(dir.path() + "/blank.html", dir.path() + "/blank.png");
  const auto drawn = shot(html, dir.path() + "/report.png");
  EXPECT_GT(blank, 0u);
  EXPECT_GT(drawn, 5 * blank) << "the report renders as (nearly) blank: " << drawn << " vs "
                              << blank << " bytes";
}

// observability.trace_steps = "5-7": trace.json in the Chrome trace format with, for each of
// the two workers (a process per agent), its data, forward, backward, allreduce, vote and update
// spans of exactly those steps, named processes and threads, nothing of other steps.
TEST(Trace, TheTracedStepsOfEveryWorkerAreInTraceJson) {
  TempDir dir;
  Job job =
      start_job(dir, "observed", kMlp, 2, {"job.steps=20", "observability.trace_steps=\"5-7\""});
  auto st = job.proc->wait(60s);
  ASSERT_TRUE(st);
  ASSERT_EQ(WEXITSTATUS(*st), 0) << text_of(job.out);
  auto trace = nlohmann::json::parse(text_of(job.run_dir + "/trace.json"), nullptr, false);
  ASSERT_FALSE(trace.is_discarded());
  ASSERT_TRUE(trace["traceEvents"].is_array());
  std::map<int, std::set<std::string>> names;  // by pid
  std::set<int64_t> steps;
  int process_names = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M") {
      process_names += e["name"] == "process_name";
      continue;
    }
    ASSERT_EQ(e["ph"], "X") << e.dump();
    EXPECT_GE(e["dur"].get<int64_t>(), 0) << e.dump();
    EXPECT_GT(e["ts"].get<int64_t>(), int64_t(1.7e15)) << "not unix microseconds: " << e.dump();
    names[e["pid"].get<int>()].insert(e["name"].get<std::string>());
    steps.insert(e["args"]["step"].get<int64_t>());
  }
  EXPECT_EQ(process_names, 2);
  ASSERT_EQ(names.size(), 2u);
  for (const auto& [pid, n] : names)
    for (const char* want : {"data", "forward", "backward", "allreduce", "update"})
      EXPECT_TRUE(n.count(want)) << "worker of agent " << pid << " has no " << want;
  EXPECT_EQ(steps, (std::set<int64_t>{5, 6, 7}));
}

// troupe status --watch (troupe top): a block per refresh with one row per worker (its device,
// rank, step time, compute time, how long ago it last reported, how long ago its agent was last
// heard, its state) until the job ends, then exit 0.
TEST(LiveView, StatusWatchRefreshesPerWorkerRowsUntilTheJobEnds) {
  TempDir dir;
  // (300 steps: `troupe top` starts in ~3 s under a sanitizer, and must see the job run.)
  Job job = start_job(dir, "observed", kMlp, 2, {"job.steps=300"}, {pace(10000)});
  wait_steps(job, 5);
  const std::string out = dir.path() + "/top.out";
  coordinator::ChildProcess top(
      {{troupe_binary(), "top", "--run-dir", job.run_dir, "--interval", "0.2"}, out, out, {}});
  auto st = top.wait(60s);
  ASSERT_TRUE(st) << "troupe top did not end with the job";
  EXPECT_EQ(WEXITSTATUS(*st), 0) << text_of(out);
  ASSERT_TRUE(job.proc->wait(30s));
  const std::string text = text_of(out);
  size_t blocks = 0;
  for (size_t at = 0; (at = text.find("job observed:", at)) != std::string::npos; ++at) ++blocks;
  EXPECT_GE(blocks, 3u) << text;
  EXPECT_NE(text.find("compute ms"), std::string::npos) << text;
  // It ends saying how the job ended, without the control plane's own lines.
  EXPECT_EQ(text.find("stopped answering"), std::string::npos) << text;
  EXPECT_EQ(text.find("control plane:"), std::string::npos) << text;
  EXPECT_NE(text.find("heard"), std::string::npos) << text;
  EXPECT_NE(text.find("model TFLOP/s); peak: 2 x cpu"), std::string::npos) << "MFU: " << text;
  EXPECT_NE(text.find(", epoch "), std::string::npos) << "the epochs trained: " << text;
  // Member rows with their times, heartbeat and state:
  // "rank agent name pid host cpu:N - step compute data N s N s training"
  int rows = 0;
  for (const auto& line : lines_of(out)) {
    std::istringstream in(line);
    std::string rank, agent, name, pid, host, device, stage, step, compute, data, seen, unit, heard,
        heard_unit, state;
    if (in >> rank >> agent >> name >> pid >> host >> device >> stage >> step >> compute >> data >>
            seen >> unit >> heard >> heard_unit >> state &&
        device.rfind("cpu:", 0) == 0 && unit == "s" && std::stod(step) > 0 && heard_unit == "s" &&
        state == "training") {
      // Heartbeats every 200 ms, refreshed as often: a live agent is never near the failure
      // timeout (3 s).
      EXPECT_LT(std::stod(heard), 3.0) << line;
      ++rows;
    }
  }
  EXPECT_GE(rows, 4) << text;
}

// A worker slowed through the fault-injection interface (30 ms more compute a step than the
// others' ~5 ms): after elastic.straggler_steps slow steps it gets a `straggler` event, and with
// elastic.drain_stragglers it is drained; the job finishes without it, every sample used once.
TEST(Stragglers, ASlowWorkerIsFoundAndDrainedAndTheJobGoesOnWithoutIt) {
  TempDir dir;
  Job job =
      start_job(dir, "observed", kMlp, 3,
                {"job.steps=300", "data.ledger=true", "elastic.straggler_steps=10",
                 "elastic.drain_stragglers=true"},
                {pace(5000), "TROUPE_TEST_SLOW_AGENT=agent-1", "TROUPE_TEST_SLOW_STEP_US=30000"});
  const std::string found = wait_event(job, is("straggler"), 60s);
  ASSERT_FALSE(found.empty());
  EXPECT_EQ(json_field(found, "name"), "agent-1") << found;
  EXPECT_EQ(json_field(found, "steps"), "10") << found;
  EXPECT_GT(std::stod(json_field(found, "compute_seconds")),
            2 * std::stod(json_field(found, "median_seconds")))
      << found;
  const std::string left = wait_event(job, is("member_left"), 60s);
  EXPECT_EQ(json_field(left, "member"), json_field(found, "member")) << left;
  auto st = job.proc->wait(120s);
  ASSERT_TRUE(st);
  EXPECT_EQ(WEXITSTATUS(*st), 0) << text_of(job.out);
  const std::string end = events_of(job).back();
  EXPECT_EQ(json_field(end, "identical_parameters"), "true") << end;
  EXPECT_EQ(count_events(job, "straggler"), 1);
  check_ledger(job.run_dir, 300, 64);
}

}  // namespace
}  // namespace troupe
