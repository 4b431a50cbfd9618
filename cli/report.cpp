// `troupe report RUN_DIR [-o FILE.html]`: the run directory as one self-contained HTML page
// (coordinator/run_report.h); a running job's directory too.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "cli/commands.h"
#include "cli/parse.h"
#include "coordinator/run_dir.h"
#include "coordinator/run_report.h"

namespace troupe::cli {

int run_report(const std::vector<std::string>& words) {
  CLI::App app{
      "Writes a run's report: one HTML file with its loss, throughput, step times per worker, "
      "idle fraction, membership timeline and recovery times (no network needed to view it).",
      "troupe report"};
  std::string dir, out;
  app.add_option("RUN_DIR", dir, "the run directory (a running job's too)")->required();
  app.add_option("-o,--output", out, "the HTML file (default RUN_DIR/report.html)");
  if (auto rc = parse(app, words)) return *rc;
  // (the run first: a missing one was named as -o's missing directory)
  coordinator::RunReport report;
  try {
    report = coordinator::read_run(dir);
  } catch (const std::runtime_error& e) {
    std::fprintf(stderr, "troupe report: %s\n", e.what());
    return 2;
  }
  if (out.empty()) out = dir + "/report.html";
  if (std::string why = overwrites_run(dir, dir + "/checkpoints", out); !why.empty()) {
    std::fprintf(stderr, "troupe report: -o %s: %s\n", out.c_str(), why.c_str());
    return 2;
  }
  std::error_code ec;
  const std::filesystem::path above = std::filesystem::path(out).parent_path();
  if (!above.empty() && !std::filesystem::is_directory(above, ec)) {
    std::fprintf(stderr, "troupe report: -o %s: %s is not a directory\n", out.c_str(),
                 above.c_str());
    return 2;
  }
  // (Its events end without an end while no process runs it: its coordinator was lost. The
  // report said "running", where troupe status said "not running".)
  if (report.state == "running" && !coordinator::run_dir_in_use(dir))
    report.state = "not running, and it did not finish";
  const std::string tmp = out + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    const int opened = f ? 0 : errno;  // (why it could not be opened: a missing directory, ...)
    f << coordinator::render_report(report);
    if (!f.flush()) {
      std::fprintf(stderr, "troupe report: cannot write %s: %s\n", out.c_str(),
                   std::strerror(opened ? opened : errno));
      std::remove(tmp.c_str());
      return 1;
    }
  }
  if (std::rename(tmp.c_str(), out.c_str()) != 0) {
    std::fprintf(stderr, "troupe report: cannot write %s: %s\n", out.c_str(), std::strerror(errno));
    std::remove(tmp.c_str());
    return 1;
  }
  std::printf("troupe: report of %s (%s, %llu steps): %s\n", report.job.c_str(),
              report.state.c_str(), (unsigned long long)report.steps, out.c_str());
  return 0;
}

}  // namespace troupe::cli
