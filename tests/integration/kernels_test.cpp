// The BLAS kernels a process runs are the best its CPU's features allow, whatever OpenBLAS's own
// detection says (models/blas_kernels.h). OpenBLAS's detection is made to fail the way it does on
// CPUs newer than its tables: OPENBLAS_CORETYPE=Prescott, the SSE3 kernels it falls back to.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include "comm/cuda_info.h"
#include "models/blas_kernels.h"
#include "tests/harness/jobs.h"

namespace troupe {
namespace {

using namespace std::chrono_literals;
using namespace testing;

// `troupe bench model --json` (the release binary) with extra environment: its JSON line.
std::string bench_line(const TempDir& dir, const std::vector<std::string>& env,
                       const std::vector<std::string>& more = {}) {
  static int runs = 0;  // (ChildProcess appends to its output files)
  const std::string name = dir.path() + "/bench-" + std::to_string(runs++);
  const std::string out = name + ".out", err = name + ".err";
  std::vector<std::string> argv{TROUPE_RELEASE_BINARY,
                                "bench",
                                "model",
                                "--model",
                                "mlp",
                                "--steps",
                                "2",
                                "--warmup",
                                "1",
                                "--json"};
  argv.insert(argv.end(), more.begin(), more.end());
  coordinator::ChildProcess p({argv, out, err, env});
  auto st = p.wait(120s);
  EXPECT_TRUE(st && WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << text_of(err);
  for (auto& l : lines_of(out))
    if (l.rfind("{\"bench\":\"model\"", 0) == 0) return l;
  return "";
}

TEST(Kernels, AWrongOpenBlasDetectionIsOverruledByTheCpusFeatures) {
  const auto features = models::cpu_features();
  if (!features.avx2) GTEST_SKIP() << "this CPU has no AVX2 (" << models::describe(features) << ")";
  const std::string best = models::core_for(models::best_kernel_class(features));
  TempDir dir;
  const std::string fixed = bench_line(dir, {"OPENBLAS_CORETYPE=Prescott"});
  EXPECT_EQ(json_field(fixed, "cpu_features"), models::describe(features));
  const std::string core = json_field(fixed, "blas_core");
  EXPECT_EQ(models::kernel_class(core), models::best_kernel_class(features))
      << core << " is not the class of " << best << " on " << models::describe(features);
  // The premise: without Troupe's choice the same environment runs the generic kernels.
  const std::string kept =
      bench_line(dir, {"OPENBLAS_CORETYPE=Prescott", "TROUPE_BLAS_CORE=openblas"});
  EXPECT_EQ(json_field(kept, "blas_core"), "Prescott") << kept;
}

// The benchmark says what it ran on, in which precision, and its MFU of a named peak; a device
// that is not there is refused with the reason.
TEST(Kernels, BenchModelNamesItsDeviceDtypeAndPeak) {
  TempDir dir;
  const std::string line = bench_line(dir, {}, {"--dtype", "bf16"});
  EXPECT_EQ(json_field(line, "device"), "cpu (bf16 GEMM inputs, emulated)") << line;
  EXPECT_EQ(json_field(line, "dtype"), "bf16") << line;
  EXPECT_EQ(json_field(line, "peak").rfind("cpu", 0), 0u) << line;
  if (std::stod(json_field(line, "peak_tflops")) > 0) {
    EXPECT_GT(std::stod(json_field(line, "mfu")), 0) << line;
  }
  if (comm::cuda_device_count() > 0) return;  // (tests/gpu cover a GPU)
  const std::string out = dir.path() + "/cuda.out";
  coordinator::ChildProcess p(
      {{TROUPE_RELEASE_BINARY, "bench", "model", "--device", "cuda:0"}, out, out, {}});
  auto st = p.wait(60s);
  ASSERT_TRUE(st);
  EXPECT_EQ(WEXITSTATUS(*st), 2);
  EXPECT_NE(text_of(out).find("device 'cuda:0': "), std::string::npos) << text_of(out);
}

// MFU is a fraction of a peak the device cannot pass: the best f32 kernels on one thread stay
// below it. (A virtual machine's /proc/cpuinfo says the nominal clock; a core boosting past it
// made the MLP's MFU 1.54 on an AMD EPYC of family 26 until the clock was measured.)
TEST(Kernels, TheMfuOfTheBestKernelsStaysBelowOne) {
  TempDir dir;
  const std::string line = bench_line(dir, {}, {"--threads", "1"});
  if (std::stod(json_field(line, "peak_tflops")) == 0) GTEST_SKIP() << "no peak: " << line;
  EXPECT_LT(std::stod(json_field(line, "mfu")), 1) << line;
  EXPECT_GT(std::stod(json_field(line, "mfu")), 0.05) << line;
}

TEST(Kernels, EveryWorkerLogsTheKernelsItRuns) {
  const char* config = R"([job]
name = "kernels"
steps = 3
[model]
kind = "mlp"
inputs = 16
hidden = [16]
classes = 4
[data]
kind = "synthetic"
samples = 256
[batch]
global = 8
micro = 8
[logging]
progress = false
)";
  TempDir dir;
  Job job = start_job(dir, "kernels", config, 2, {}, {"OPENBLAS_CORETYPE=Prescott"});
  auto st = job.proc->wait(120s);
  ASSERT_TRUE(st);
  ASSERT_EQ(WEXITSTATUS(*st), 0) << text_of(job.out);
  const std::string want = models::core_for(models::best_kernel_class(models::cpu_features()));
  for (const char* agent : {"agent-0.log", "agent-1.log"}) {
    const std::string log = text_of(job.run_dir + "/" + agent);
    EXPECT_NE(log.find("worker cpu:0: BLAS OpenBLAS"), std::string::npos) << agent << ":\n" << log;
    if (!want.empty()) {
      EXPECT_NE(log.find(want + " kernels"), std::string::npos) << agent << ":\n" << log;
    }
  }
}

}  // namespace
}  // namespace troupe
