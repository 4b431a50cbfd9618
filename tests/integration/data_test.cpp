// Token data sets as a user makes and trains on them: `troupe data prepare` (BPE), a GPT job on
// data.kind = "tokens" with an agent SIGKILLed mid-run that finishes with the static run's
// losses, every sample once (the ledger) and every window once per epoch; the encode/decode
// commands; bad inputs refused with the reason; a prepare killed midway leaves no data set;
// llm.c's GPT-2 token files imported, checked, decoded and trained on.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "coordinator/process.h"
#include "data/token_data.h"
#include "tests/harness/jobs.h"
#include "tests/harness/llmc_files.h"

namespace troupe {
namespace {

using namespace std::chrono_literals;
using namespace testing;
namespace fs = std::filesystem;

const char* kConfig = R"([job]
name = "tokens"
seed = 11
steps = 150
[model]
kind = "gpt"
layers = 1
d_model = 32
heads = 2
context = 16
[data]
kind = "tokens"
ledger = true
[batch]
global = 24
micro = 8
[optimizer]
kind = "adamw"
lr = 0.002
)";

struct Result {
  int exit_code = -1;
  std::string output;
};

// `sh -c COMMAND` (troupe is $T), its exit status and what it printed (both streams).
Result shell(const TempDir& dir, const std::string& command, std::chrono::seconds limit = 120s) {
  static int n = 0;
  const std::string out = dir.path() + "/shell" + std::to_string(n++) + ".out";
  coordinator::ChildProcess p({{"/bin/sh", "-c", command}, out, out, {"T=" + troupe_binary()}});
  Result r;
  auto status = p.wait(limit);
  if (status && WIFEXITED(*status)) r.exit_code = WEXITSTATUS(*status);
  r.output = text_of(out);
  return r;
}

std::string prepare_gpl(const TempDir& dir) {
  const std::string ds = dir.path() + "/gpl";
  Result r = shell(dir, "\"$T\" data prepare /usr/share/common-licenses/GPL-3 --out " + ds +
                            " --tokenizer bpe --vocab 320");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("-> "), std::string::npos) << r.output;
  return ds;
}

// Positions [s*B, (s+1)*B) of every committed step, read from the ledger, name each window of
// each epoch once: the ledger's exactly-once holds for the windows themselves.
void expect_each_window_once_per_epoch(const std::string& run_dir, const std::string& ds) {
  data::TokenData d({{ds, 1.0}}, 16, 11, 0.1);
  std::map<uint64_t, std::set<uint64_t>> seen;  // epoch -> windows
  size_t positions = 0;
  for (const std::string& line : lines_of(run_dir + "/ledger.jsonl")) {
    const size_t at = line.find("\"positions\":[");
    ASSERT_NE(at, std::string::npos) << line;
    std::istringstream in(line.substr(at + 13));
    char c;
    uint64_t a, b;
    while (in >> c && c == '[' && in >> a >> c >> b >> c) {
      for (uint64_t p = a; p < b; ++p, ++positions) {
        const auto w = d.locate(p).window;
        EXPECT_LT(w, d.windows()) << "a held-out window was trained on";
        EXPECT_TRUE(seen[p / d.windows()].insert(w).second)
            << "window " << w << " twice in epoch " << p / d.windows();
      }
      if (!(in >> c) || c != ',') break;
    }
  }
  EXPECT_EQ(positions, 150u * 24);
  EXPECT_GE(seen.size(), 2u) << "the run should cross an epoch (" << d.windows() << " windows)";
}

// The "evaluated" events' losses, by step, as written (full precision).
std::map<long, std::string> eval_losses(const Job& job) {
  std::map<long, std::string> out;
  for (const std::string& e : events_of(job))
    if (json_field(e, "event") == "evaluated")
      out[std::stol(json_field(e, "step"))] = json_field(e, "loss");
  return out;
}

TEST(TokenJob, PreparedBpeDataTrainsAndSurvivesAKillWithEveryWindowOnce) {
  TempDir dir;
  const std::string ds = prepare_gpl(dir);
  const std::string path = "data.path=\"" + ds + "\"";
  const std::string every = "eval.every_steps=25", held_out = "data.eval_fraction=0.1";
  Job reference = start_job(dir, "static", kConfig, 1, {path, every, held_out});
  ASSERT_TRUE(reference.proc->wait(180s));
  const std::vector<double> want = committed_losses(reference.run_dir);
  ASSERT_EQ(want.size(), 150u);
  EXPECT_LT(want.back(), want.front() - 0.5) << "it learns";

  Job job = start_job(
      dir, "killed", kConfig, 3,
      {path, every, held_out, "elastic.failure_timeout_ms=4000", "elastic.max_restarts=0"},
      {pace(10000)});
  wait_steps(job, 20);
  auto pids = joined_pids(job);  // (no `troupe status`: slow under a sanitizer)
  ASSERT_EQ(pids.size(), 3u);
  ASSERT_EQ(::kill(pids[1], SIGKILL), 0);
  expect_same_function(job, want, 150, 24);
  EXPECT_EQ(count_events(job, "member_failed"), 1);
  expect_each_window_once_per_epoch(job.run_dir, ds);
  // Every evaluation once (a step redone evaluates again, written when it commits), and the
  // same held-out losses as the static run's.
  const auto want_eval = eval_losses(reference), got_eval = eval_losses(job);
  ASSERT_EQ(want_eval.size(), 7u) << "steps 0, 25, ..., 125, and the final parameters' (150)";
  ASSERT_EQ(got_eval.size(), 7u);
  EXPECT_EQ(count_events(job, "evaluated"), 7);
  for (const auto& [step, loss] : want_eval)
    EXPECT_NEAR(std::stod(got_eval.at(step)), std::stod(loss), 1e-4 * std::stod(loss)) << step;
  // troupe report draws the evaluations next to the training loss.
  const std::string html = dir.path() + "/killed.html";
  admin(dir, {"report", job.run_dir, "-o", html});
  const std::string page = text_of(html);
  EXPECT_NE(page.find(">eval</text>"), std::string::npos);
  EXPECT_EQ(page.find("No eval loss"), std::string::npos);
}

// Preempted (SIGTERM: a checkpoint where it stops) at 3 workers and resumed at 2: the global
// order goes on from the checkpoint's step, so the job computes the static run's losses and
// the ledger names every position once and every window once per epoch.
TEST(TokenJob, APreemptedRunResumesWithTheSameWindows) {
  TempDir dir;
  const std::string ds = prepare_gpl(dir);
  const std::string path = "data.path=\"" + ds + "\"", held_out = "data.eval_fraction=0.1",
                    every = "eval.every_steps=25";
  Job reference = start_job(dir, "static", kConfig, 1, {path, held_out, every});
  ASSERT_TRUE(reference.proc->wait(180s));
  const std::vector<double> want = committed_losses(reference.run_dir);
  Job job = start_job(dir, "preempted", kConfig, 3, {path, held_out, every}, {pace(5000)});
  wait_steps(job, 40);
  ASSERT_EQ(::kill(job.proc->pid(), SIGTERM), 0);
  auto st = job.proc->wait(60s);
  ASSERT_TRUE(st);
  EXPECT_EQ(WEXITSTATUS(*st), 0) << text_of(job.out);
  const std::string end = events_of(job).back();
  ASSERT_EQ(json_field(end, "resumable"), "true") << end;
  EXPECT_LT(std::stoi(json_field(end, "steps")), 150) << "it stopped before the end";
  // Resumed without the held-out fraction, it would train on the held-out windows: refused,
  // naming the key (it used to be accepted, and its "held-out" loss fell below a clean run's).
  Job unheld = start_job(dir, "preempted", kConfig, 2, {path, "data.eval_fraction=0"}, {},
                         {"--resume", job.run_dir});
  auto refused = unheld.proc->wait(60s);
  ASSERT_TRUE(refused && WIFEXITED(*refused));
  EXPECT_EQ(WEXITSTATUS(*refused), 2) << text_of(unheld.out);
  EXPECT_NE(text_of(unheld.out).find("eval_fraction: 0.1 in the checkpoint, unset now"),
            std::string::npos)
      << text_of(unheld.out);
  Job resumed = start_job(dir, "preempted", kConfig, 2, {path, held_out, every}, {},
                          {"--resume", job.run_dir});
  expect_same_function(resumed, want, 150, 24);
  expect_each_window_once_per_epoch(resumed.run_dir, ds);
  EXPECT_EQ(count_events(resumed, "resumed_from_checkpoint"), 1);
  // (what differs from the run's own config is named; where it goes on from is said)
  const std::string said = text_of(resumed.out);
  EXPECT_NE(said.find("--resume " + job.run_dir + ": cluster.agents = 2 (the run's: 3)"),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("troupe: resuming at step "), std::string::npos) << said;
}

// The held-out loss counts every evaluation window once, in groups computed alone and summed
// exactly: the same bits at 1 and 3 workers (with parallel.deterministic the parameters are
// too, so every evaluation matches; without it, the first, of the initial parameters).
TEST(TokenJob, TheHeldOutLossIsTheSameAtWorldSizesOneAndThree) {
  TempDir dir;
  const std::string ds = prepare_gpl(dir);
  for (const char* deterministic : {"true", "false"}) {
    const std::vector<std::string> sets = {"data.path=\"" + ds + "\"", "job.steps=30",
                                           "eval.every_steps=10", "data.eval_fraction=0.1",
                                           std::string("parallel.deterministic=") + deterministic};
    Job one = start_job(dir, std::string("one-") + deterministic, kConfig, 1, sets);
    Job three = start_job(dir, std::string("three-") + deterministic, kConfig, 3, sets);
    ASSERT_TRUE(one.proc->wait(180s));
    ASSERT_TRUE(three.proc->wait(180s));
    const auto a = eval_losses(one), b = eval_losses(three);
    ASSERT_EQ(a.size(), 4u) << "steps 0, 10, 20, and the final parameters' (30)";
    ASSERT_EQ(b.size(), 4u);
    EXPECT_EQ(a.at(0), b.at(0)) << "the initial parameters' held-out loss";
    if (std::string(deterministic) == "true") {
      EXPECT_EQ(a, b);
    }
    EXPECT_LT(std::stod(a.at(30)), std::stod(a.at(0))) << "it learns";
    // On the console too, the final parameters' last.
    const std::string said = text_of(one.out);
    EXPECT_NE(said.find("troupe: held-out loss "), std::string::npos) << said;
    EXPECT_NE(
        said.find(" at step 30 (" +
                  std::to_string(data::TokenData({{ds, 1.0}}, 16, 11, 0.1).eval_windows() * 16) +
                  " tokens): the final parameters"),
        std::string::npos)
        << said;
    const std::string first = wait_event(one, is("evaluated"), 0s);
    data::TokenData d({{ds, 1.0}}, 16, 11, 0.1);
    EXPECT_EQ(json_field(first, "tokens"), std::to_string(d.eval_windows() * 16)) << first;
    const std::string metrics = text_of(one.run_dir + "/metrics.jsonl");
    EXPECT_NE(metrics.find("\"eval_loss\":"), std::string::npos);
  }
}

// A mixture of two sets with one tokenizer (the second prepared --tokenizer-from the first) and a
// held-out set of its own: the job trains on both, evaluates on the third; a held-out set with
// another tokenizer is refused before anything starts.
TEST(TokenJob, AMixtureWithAHeldOutSetOfItsOwn) {
  TempDir dir;
  const std::string a = prepare_gpl(dir), d = dir.path();
  const std::string lic = "/usr/share/common-licenses/";
  for (const auto& [name, from] :
       {std::pair{"apache", " --tokenizer-from " + a}, std::pair{"eval", " --tokenizer-from " + a},
        std::pair{"alien", std::string(" --tokenizer bpe --vocab 320")}}) {
    const std::string input = std::string(name) == "apache" ? lic + "Apache-2.0" : lic + "LGPL-2.1";
    const Result r = shell(dir, "\"$T\" data prepare " + input + " --out " + d + "/" + name + from);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  const std::vector<std::string> sets = {"data.mix={\"" + a + "\"=3, \"" + d + "/apache\"=1}",
                                         "job.steps=20", "eval.every_steps=10",
                                         "data.eval_path=\"" + d + "/eval\""};
  Job job = start_job(dir, "mix", kConfig, 2, sets);
  const auto done = job.proc->wait(180s);
  ASSERT_TRUE(done);
  EXPECT_EQ(WEXITSTATUS(*done), 0) << text_of(job.out);
  EXPECT_EQ(eval_losses(job).size(), 3u) << text_of(job.out);  // (0, 10 and the final 20)
  std::vector<std::string> alien = sets;
  alien.back() = "data.eval_path=\"" + d + "/alien\"";
  Job refused = start_job(dir, "alien", kConfig, 2, alien);
  auto status = refused.proc->wait(60s);
  ASSERT_TRUE(status);
  EXPECT_EQ(WEXITSTATUS(*status), 2);
  EXPECT_NE(text_of(refused.out).find("tokenized differently"), std::string::npos)
      << text_of(refused.out);
}

// configs/gpt_tokens.toml as its comment says to run it (with the set made where the test is).
// A data set damaged after it was prepared (a token id past the vocabulary, its size kept):
// troupe run refuses it before anything starts, naming the file, and so does troupe data verify.
// With data.verify = false the job fails at once when a worker reads the damage, and its reason
// names the file and the place.
TEST(TokenJob, ADamagedTokenFileIsRefusedOrFailsTheJobNamingTheDamage) {
  TempDir dir;
  const std::string ds = prepare_gpl(dir);
  Result r = shell(dir, "\"$T\" data verify " + ds);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(": every checksum matches"), std::string::npos) << r.output;
  std::vector<std::string> shards;
  for (const auto& e : fs::directory_iterator(ds))
    if (e.path().extension() == ".bin") shards.push_back(e.path().string());
  ASSERT_FALSE(shards.empty());
  {
    std::fstream f(shards.front(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.write("\xff\xff", 2);
  }
  const std::string file = fs::path(shards.front()).filename().string();
  r = shell(dir, "\"$T\" data verify " + ds);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(file + ": its bytes are not those prepared"), std::string::npos)
      << r.output;
  Job refused = start_job(dir, "verified", kConfig, 1, {"data.path=\"" + ds + "\""});
  auto rs = refused.proc->wait(60s);
  ASSERT_TRUE(rs);
  EXPECT_EQ(WEXITSTATUS(*rs), 2) << text_of(refused.out);
  EXPECT_NE(text_of(refused.out).find("changed since it was prepared: " + file), std::string::npos)
      << text_of(refused.out);
  EXPECT_FALSE(fs::exists(refused.run_dir + "/events.jsonl")) << "refused before it started";

  Job job = start_job(dir, "damaged", kConfig, 1,
                      {"data.path=\"" + ds + "\"", "elastic.max_restarts=0", "data.verify=false"});
  auto st = job.proc->wait(120s);
  ASSERT_TRUE(st);
  EXPECT_EQ(WEXITSTATUS(*st), 1) << text_of(job.out);
  EXPECT_NE(text_of(job.out).find(file + ": id 65535 at token 50 is outside the vocabulary of 320"),
            std::string::npos)
      << text_of(job.out);
  // (read again it is the same: the worker is not restarted for it)
  EXPECT_EQ(text_of(job.out).find("restarting"), std::string::npos) << text_of(job.out);
  // A command for the job says it ended, and at which step (its job_failed event's).
  const std::string step = json_field(events_of(job).back(), "step");
  ASSERT_NE(step, "");
  const std::string said = admin(dir, {"stop", "--run-dir", job.run_dir}, 1);
  EXPECT_NE(said.find("it ended at step " + step + " "), std::string::npos) << said;
}

TEST(DataCommands, TheTokensConfigTrainsOnTheSetItsCommentPrepares) {
  TempDir dir;
  const std::string ds = dir.path() + "/licenses-bpe";
  Result r = shell(dir, "\"$T\" data prepare /usr/share/common-licenses --out " + ds +
                            " --tokenizer bpe --vocab 1024");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = shell(dir, "\"$T\" run " + std::string(TROUPE_SOURCE_DIR) +
                     "/configs/gpt_tokens.toml --set job.steps=6 --set data.path=\\\"" + ds +
                     "\\\" --set job.run_dir=\\\"" + dir.path() +
                     "/run\\\" --set checkpoint.every_steps=3");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("finished after 6 of 6 steps"), std::string::npos) << r.output;
  // Its weights export with the tokenizer's vocabulary, and a step's batch of token ids.
  r = shell(dir, "\"$T\" export " + dir.path() + "/run -o " + dir.path() +
                     "/m.safetensors --batch-of-step 2");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir.path() + "/m.safetensors.batch.safetensors")) << r.output;
  // The weights are the checkpoint's: they export the same with the data set moved away, and
  // with another one prepared at its path (both were refused, the data gone or "another model,
  // data or seed"). A batch is the data's: refused without it, naming it.
  fs::rename(ds, ds + ".moved");
  for (const char* then : {"moved", "prepared again"}) {
    const std::string again = dir.path() + "/m-" + std::to_string(then[0]) + ".safetensors";
    r = shell(dir, "\"$T\" export " + dir.path() + "/run -o " + again);
    EXPECT_EQ(r.exit_code, 0) << then << ": " << r.output;
    EXPECT_EQ(text_of(again), text_of(dir.path() + "/m.safetensors")) << then;
    if (std::string(then) == "moved") {
      r = shell(dir, "\"$T\" export " + dir.path() + "/run -o " + again + " --batch-of-step 2");
      EXPECT_EQ(r.exit_code, 2) << r.output;
      EXPECT_NE(r.output.find("data.path: '" + ds + "' is not a directory"), std::string::npos)
          << r.output;
      r = shell(dir, "\"$T\" data prepare /usr/share/common-licenses/GPL-3 --out " + ds +
                         " --tokenizer bpe --vocab 300");
      ASSERT_EQ(r.exit_code, 0) << r.output;
    }
  }
}

// GPT-2's ids as llm.c's scripts write them: imported as they are (documents and their ends),
// verified, decoded with llm.c's tokenizer (not encoded: its merges are not there), trained on
// by the gpt_tokens config, and a step's batch exported.
TEST(DataCommands, LlmcGpt2TokenFilesImportVerifyDecodeAndTrain) {
  TempDir dir;
  const std::string d = dir.path();
  llmc::write_tokenizer(d + "/gpt2_tokenizer.bin", llmc::pieces(50257, 50256), 1, 0);
  std::mt19937 rng(5);
  std::vector<uint32_t> stream;
  for (int doc = 0; doc < 120; ++doc) {  // (each document begins with the end of text)
    stream.push_back(50256);
    for (int i = 0, n = 20 + int(rng() % 40); i < n; ++i) stream.push_back(rng() % 50256);
  }
  const size_t cut = stream.size() / 2 + 7;  // (a document goes on in the second file)
  llmc::write_tokens(d + "/train_000.bin", {stream.begin(), stream.begin() + long(cut)});
  llmc::write_tokens(d + "/train_001.bin", {stream.begin() + long(cut), stream.end()});
  const std::string ds = d + "/fineweb";
  Result r = shell(dir, "\"$T\" data import " + d + "/train_000.bin " + d +
                            "/train_001.bin --tokenizer " + d + "/gpt2_tokenizer.bin --out " + ds);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(": 120 documents from 2 files"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(std::to_string(stream.size()) + " tokens; llm.c's tokenizer, version 1, "
                                                          "50257 ids, end of document 50256"),
            std::string::npos)
      << r.output;
  r = shell(dir, "\"$T\" data verify " + ds);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = shell(dir, "echo 72 105 50256 300 | \"$T\" data decode --data " + ds);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "Hi<|endoftext|>p300");
  r = shell(dir, "echo text | \"$T\" data encode --data " + ds);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("only decodes"), std::string::npos) << r.output;
  r = shell(dir, "\"$T\" data import " + d + "/train_000.bin --tokenizer " + d +
                     "/train_001.bin --out " + d + "/again");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(
      r.output.find("troupe data import: " + d + "/train_001.bin: is not llm.c's tokenizer file"),
      std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(d + "/again"));
  // Given to prepare (which reads text), the files are named for what they are.
  r = shell(dir, "\"$T\" data prepare " + d + "/train_000.bin --out " + d + "/again");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(d + "/train_000.bin is an llm.c token file: troupe data import"),
            std::string::npos)
      << r.output;
  r = shell(dir, "\"$T\" run " + std::string(TROUPE_SOURCE_DIR) +
                     "/configs/gpt_tokens.toml --set job.steps=4 --set data.path=\\\"" + ds +
                     "\\\" --set model.layers=1 --set model.d_model=32 --set model.heads=2 " +
                     "--set model.context=16 --set job.run_dir=\\\"" + d + "/run\\\"");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("finished after 4 of 4 steps"), std::string::npos) << r.output;
  r = shell(dir, "\"$T\" export " + d + "/run -o " + d + "/m.safetensors --batch-of-step 1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(d + "/m.safetensors.batch.safetensors")) << r.output;
}

TEST(DataCommands, EncodeAndDecodeCommandsRoundTripAnyBytes) {
  TempDir dir;
  const std::string ds = prepare_gpl(dir);
  std::mt19937 rng(3);
  std::string bytes(20000, '\0');
  for (auto& c : bytes) c = char(rng() & 0xff);
  std::ofstream(dir.path() + "/random.bin", std::ios::binary) << bytes;
  // (the files in the test's own directory, not wherever the tests run)
  const std::string d = dir.path();
  Result r =
      shell(dir, "\"$T\" data encode --data " + ds + " < " + d + "/random.bin > " + d +
                     "/ids.txt && \"$T\" data decode --data " + ds + " < " + d + "/ids.txt > " + d +
                     "/back.bin && cmp " + d + "/back.bin " + d + "/random.bin");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = shell(dir, "echo 'Copyright' | \"$T\" data encode --data " + ds +
                     " --lines | \"$T\" data decode --data " + ds);
  EXPECT_EQ(r.output, "Copyright\n");
  r = shell(dir, "echo '1 2 999' | \"$T\" data decode --data " + ds);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("token 3 ('999') is not an id of this vocabulary (0..319)"),
            std::string::npos)
      << r.output;
  // Output that cannot be written, input that cannot be read: exit 1, saying so (a short output
  // with exit 0, or nothing said).
  for (const char* command : {"encode", "decode"}) {
    r = shell(dir,
              std::string("echo 72 | \"$T\" data ") + command + " --data " + ds + " > /dev/full");
    EXPECT_EQ(r.exit_code, 1) << command << ": " << r.output;
    EXPECT_NE(r.output.find(std::string("troupe data ") + command +
                            ": cannot write standard output: No space left on device"),
              std::string::npos)
        << r.output;
    r = shell(dir, std::string("\"$T\" data ") + command + " --data " + ds + " < " + d);
    EXPECT_EQ(r.exit_code, 1) << command << ": " << r.output;
    EXPECT_NE(r.output.find("cannot read standard input: Is a directory"), std::string::npos)
        << r.output;
  }
}

// Ctrl-C during a prepare: its partial directory (OUT.partial-PID) goes with it, exit 130, and no
// data set (it was left behind until a prepare of the same OUT came).
TEST(DataCommands, AnInterruptedPrepareLeavesNothingBehind) {
  TempDir dir;
  const std::string d = dir.path();
  {  // 25 MB of words: a BPE's training, then its encoding into the partial, take seconds
    std::mt19937 rng(7);
    std::ofstream text(d + "/words.txt");
    std::string line;
    for (int i = 0; i < 300000; ++i, text << line << '\n')
      for (int w = (line.clear(), 0); w < 12; ++w, line += ' ')
        for (int c = 0; c < 6; ++c) line += char('a' + rng() % 10);
  }
  coordinator::ChildProcess p({{troupe_binary(), "data", "prepare", d + "/words.txt", "--out",
                                d + "/ds", "--tokenizer", "bpe", "--vocab", "2000"},
                               d + "/prepare.out",
                               d + "/prepare.out",
                               {}});
  auto partials = [&] {
    int n = 0;
    for (const auto& e : fs::directory_iterator(d))
      n += e.path().filename().string().rfind("ds.partial-", 0) == 0;
    return n;
  };
  for (auto until = std::chrono::steady_clock::now() + 120s;
       partials() == 0 && p.running() && std::chrono::steady_clock::now() < until;)
    std::this_thread::sleep_for(20ms);
  ASSERT_EQ(partials(), 1) << "no partial to see: " << text_of(d + "/prepare.out");
  ASSERT_TRUE(p.signal(SIGINT));
  auto st = p.wait(60s);
  ASSERT_TRUE(st);
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 130) << text_of(d + "/prepare.out");
  EXPECT_EQ(partials(), 0);
  EXPECT_FALSE(fs::exists(d + "/ds"));
  EXPECT_NE(text_of(d + "/prepare.out").find("SIGINT: stopped; no data set written"),
            std::string::npos);
}

TEST(DataCommands, BadInputsAreRefusedWithTheReason) {
  TempDir dir;
  const std::string d = dir.path();
  fs::create_directories(d + "/in/deep");
  std::ofstream(d + "/in/a.txt") << "text\n";
  std::ofstream(d + "/in/deep/b.bin", std::ios::binary) << std::string(
      "\x7f"
      "ELF\0\0",
      6);
  std::ofstream(d + "/in/deep/c.txt", std::ios::binary) << "caf\xe9";
  std::ofstream(d + "/in/empty.txt");
  std::ofstream(d + "/in/x.jsonl") << "{\"body\": \"in json\"}\n[1]\n";
  auto expect = [&](const std::string& cmd, int code, const std::string& says) {
    const Result r = shell(dir, cmd);
    EXPECT_EQ(r.exit_code, code) << cmd << "\n" << r.output;
    EXPECT_NE(r.output.find(says), std::string::npos) << cmd << "\n" << r.output;
  };
  expect("\"$T\" data prepare " + d + "/in --out " + d + "/ok --field body", 0,
         "skipped 4 documents: 1 binary, 1 invalid UTF-8, 1 empty, 1 not JSON with the field");
  expect("\"$T\" data prepare " + d + "/in/deep/c.txt --out " + d + "/latin", 2,
         "c.txt (invalid UTF-8 at byte 3 of its text)");
  // (a JSON line with a raw Latin-1 byte was "not JSON with the field")
  fs::create_directories(d + "/jl");
  std::ofstream(d + "/jl/l.jsonl", std::ios::binary)
      << "{\"text\":\"good\"}\n{\"text\":\"caf\xe9\"}\n";
  expect("\"$T\" data prepare " + d + "/jl --out " + d + "/jl-ds", 0,
         "the first: " + d + "/jl/l.jsonl:2 (invalid UTF-8 at byte 12 of its line)");
  // A hard link is the file met again (it was trained on twice); a file named by a path that is
  // not UTF-8 is named in the manifest and the --json line all the same (both failed after the
  // work, with the JSON library's error, the data set written).
  fs::create_hard_link(d + "/in/a.txt", d + "/jl/a-hard.txt");
  std::ofstream(d + "/jl/caf\xe9.txt") << "text\n";
  expect("\"$T\" data prepare " + d + "/in/a.txt " + d + "/jl --out " + d + "/hard --json", 0,
         "\"repeated_files\":1");
  EXPECT_NE(text_of(d + "/hard/manifest.json").find("caf\xef\xbf\xbd.txt"), std::string::npos);
  // (--out DIR/. failed after the work, renaming onto '.', and left DIR behind)
  expect("\"$T\" data prepare " + d + "/in/a.txt --out " + d + "/nd/.", 2,
         "name the data set's own directory (a new one), not '.'");
  EXPECT_FALSE(fs::exists(d + "/nd"));
  // A file that cannot be read is named before anything is read (it failed when reached, exit 1).
  if (::geteuid() != 0) {  // (root reads it)
    std::ofstream(d + "/jl/z.txt") << "text\n";
    fs::permissions(d + "/jl/z.txt", fs::perms::none);
    expect("\"$T\" data prepare " + d + "/jl --out " + d + "/o7", 2,
           "'" + d + "/jl/z.txt' cannot be read: Permission denied");
    fs::remove(d + "/jl/z.txt");
  }
  // (a file named twice, or in a directory given too, was trained on twice without a word)
  expect("\"$T\" data prepare " + d + "/in/a.txt " + d + "/in/a.txt --out " + d + "/twice", 0,
         "read once: 1 file(s) met again");
  expect("\"$T\" data prepare " + d + "/in --out " + d + "/ok", 2, "exists");
  expect("\"$T\" data prepare " + d + "/absent --out " + d + "/o2", 2, "does not exist");
  // A tokenizer.json edited after the prepare (its first merge reversed): its ids are no longer
  // those of the shards; verify and every reader refuse it (every checksum matched).
  expect("\"$T\" data prepare " + d + "/in/a.txt " + d + "/in/x.jsonl --out " + d +
             "/bpe --tokenizer bpe --vocab 262",
         0, "bpe tokenizer");
  // (a --vocab the text cannot fill was lowered without a word; a negative one wrapped around)
  expect("\"$T\" data prepare " + d + "/in/a.txt --out " + d + "/few --tokenizer bpe --vocab 5000",
         0, "fewer ids than --vocab 5000: the inputs have no pair left to merge past ");
  expect("\"$T\" data prepare " + d + "/in/a.txt --out " + d + "/neg --tokenizer bpe --vocab -5", 2,
         "--vocab");
  EXPECT_FALSE(fs::exists(d + "/neg"));
  {
    nlohmann::json t = nlohmann::json::parse(std::ifstream(d + "/bpe/tokenizer.json"));
    ASSERT_GE(t["merges"].size(), 1u) << t.dump();
    auto& first = t["merges"][0];  // (a pair of bytes: merged the other way round)
    first = nlohmann::json::array({first[1], first[0]});
    std::ofstream(d + "/bpe/tokenizer.json") << t.dump();
  }
  // (a damaged set is exit 1 however it is damaged: a truncated shard was 2, as for no set)
  expect("\"$T\" data verify " + d + "/bpe", 1,
         "tokenizer.json is not the tokenizer its shards were encoded with");
  // (a link to nothing in a directory was dropped without a word)
  fs::create_directories(d + "/links");
  std::ofstream(d + "/links/a.txt") << "text\n";
  fs::create_symlink(d + "/nowhere.txt", d + "/links/gone.txt");
  expect("\"$T\" data prepare " + d + "/links --out " + d + "/o5", 2,
         "'" + d + "/links/gone.txt' is a link to nothing");
  fs::remove(d + "/links/gone.txt");
  fs::create_directory_symlink(d + "/in/deep", d + "/links/deep");
  expect("\"$T\" data prepare " + d + "/links --out " + d + "/o6", 2,
         "'" + d + "/links/deep' is a link to a directory, which is not followed");
  expect("\"$T\" data prepare " + d + "/in/deep --out " + d + "/o3", 2, "no text in the inputs");
  expect("\"$T\" data prepare " + d + "/in --out " + d + "/o4 --tokenizer bpe", 2,
         "--vocab N with N >= 258 (256 bytes, the end of a document and a merge at least; 257 "
         "ids are --tokenizer byte), and none was given");
  // (--tokenizer byte, the default, was ignored; --vocab blamed a byte tokenizer not asked for)
  for (const char* given : {" --tokenizer byte", " --vocab 300"})
    expect(
        "\"$T\" data prepare " + d + "/in --out " + d + "/o6 --tokenizer-from " + d + "/ok" + given,
        2, "--tokenizer-from takes its tokenizer from a data set: it cannot be given with");
  expect("\"$T\" data prepare " + d + "/in/a.txt --out " + d + "/o5 --field body", 2,
         "--field body: none of the inputs is a JSON-lines file");
  expect("\"$T\" data encode --data " + d + "/in < /dev/null", 2, "has no manifest.json");
  expect("\"$T\" data verify " + d + "/in", 2, "has no manifest.json");
  expect("\"$T\" data verify", 2, "DIR is required");
  EXPECT_FALSE(fs::exists(d + "/o3"));
  // The job refuses a directory that is not a data set, and a mixture with a text model's kind.
  const std::string cfg = d + "/tokens.toml";
  std::ofstream(cfg) << kConfig;
  expect("\"$T\" run " + cfg + " --set data.path=\\\"" + d + "/in\\\"", 2, "has no manifest.json");
  expect("\"$T\" run " + cfg + " --set data.kind=text --set 'data.mix={\"" + d + "/ok\"=1}'", 2,
         "data.mix mixes token data sets");
  expect("\"$T\" run " + cfg + " --set data.kind=text --set data.verify=false", 2,
         "data.verify checks token data sets' files against their manifests; data.kind is "
         "\"text\"");
  expect("\"$T\" run " + cfg + " --set data.path=\\\"" + d + "/ok\\\" --set eval.every_steps=5", 2,
         "needs a held-out set");
  expect("\"$T\" run " + cfg + " --set data.path=\\\"" + d + "/ok\\\" --set data.eval_fraction=0.1",
         2, "without eval.every_steps is never evaluated");
  expect("\"$T\" run " + cfg + " --set model.kind=mlp", 2,
         "model.kind = \"mlp\" needs data.kind = \"synthetic\"");
  std::ofstream(d + "/ok/tokens-00000.bin", std::ios::app) << "xx";
  expect("\"$T\" run " + cfg + " --set data.path=\\\"" + d + "/ok\\\"", 2, "tokens-00000.bin has");
}

struct Measured {
  int exit_code;
  std::string output;  // (stdout, then stderr)
  double resident_mb;  // its own peak (wait4), not the largest of the test's children
};

// `troupe ARGS` run alone, waited for (at most two minutes).
Measured measured(const std::string& dir, std::vector<std::string> args) {
  args.insert(args.begin(), troupe_binary());
  for (const char* f : {"/measured.out", "/measured.err"}) fs::remove(dir + f);  // (appended to)
  coordinator::ChildProcess p({args, dir + "/measured.out", dir + "/measured.err", {}});
  rusage usage{};
  const std::optional<int> status = p.wait(std::chrono::minutes(2), &usage);
  return {status && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1,
          text_of(dir + "/measured.out") + text_of(dir + "/measured.err"),
          double(usage.ru_maxrss) / 1024};
}

// A JSON-lines file is read in pieces: a prepare's memory does not grow with the file (it read
// each file whole: 334 MB resident for a 323 MB file, std::bad_alloc under a memory limit), and
// a file of many lines, the last one 1.5 MB (longer than a piece) with no newline at its end, is
// prepared as read whole. A large text file too.
TEST(DataCommands, LargeFilesAreReadInPiecesInBoundedMemory) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "under AddressSanitizer a process's resident memory holds its shadow memory";
#endif
  TempDir dir;
  const std::string d = dir.path();
  std::string big;
  {
    std::ofstream out(d + "/big.jsonl", std::ios::binary);
    out << "\xEF\xBB\xBF";
    for (int i = 0; out.tellp() < (64 << 20); ++i)
      out << "{\"text\": \"line " << i % 1000 << " of a corpus far larger than a buffer\"}\n";
    out << "{\"text\": \"" << std::string(3 << 19, 'x') << "\"}";  // (no newline at its end)
  }
  const Measured r =
      measured(d, {"data", "prepare", d + "/big.jsonl", "--out", d + "/ds", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json s = nlohmann::json::parse(r.output.substr(r.output.find('{')));
  std::printf("prepare of a 65.5 MB JSON-lines file: %.0f MB resident at most\n", r.resident_mb);
  EXPECT_LT(r.resident_mb, 50) << "the file was read whole";
  for (const char* skipped :
       {"skipped_binary", "skipped_invalid_utf8", "skipped_empty", "skipped_bad_json"})
    EXPECT_EQ(s[skipped], 0) << r.output;
  const uint64_t lines = s["documents"];
  EXPECT_GT(lines, 1000000u) << r.output;
  // Every line's text, the last one's 1.5 MB too: the byte tokenizer's ids are its bytes, and each
  // document ends with one id of its own.
  EXPECT_EQ(uint64_t(s["tokens"]), uint64_t(s["bytes"]) + lines) << r.output;

  // A text file, one document, is read in pieces too (it was held whole, for BPE's word count
  // and then for the encoding: 114 MB resident, 58 MB now, most of it a 4 MiB piece's ids).
  {
    const std::string gpl = text_of("/usr/share/common-licenses/GPL-3");
    std::ofstream out(d + "/big.txt", std::ios::binary);
    while (out.tellp() < (64 << 20)) out << gpl;
  }
  const Measured t = measured(d, {"data", "prepare", d + "/big.txt", "--out", d + "/text",
                                  "--tokenizer", "bpe", "--vocab", "300", "--json"});
  ASSERT_EQ(t.exit_code, 0) << t.output;
  std::printf("prepare of a %.1f MB text file (bpe): %.0f MB resident at most\n",
              double(fs::file_size(d + "/big.txt")) / 1e6, t.resident_mb);
  EXPECT_LT(t.resident_mb, 80) << "the text file was read whole (114 MB)";
  const size_t at = t.output.find('{');
  const nlohmann::json ts =
      nlohmann::json::parse(t.output.substr(at, t.output.find('\n', at) - at));
  EXPECT_EQ(ts["documents"], 1) << t.output;
  EXPECT_EQ(uint64_t(ts["bytes"]), fs::file_size(d + "/big.txt")) << t.output;
}

// BPE's words bounded (memory grew with every distinct word), and only where one is trained; a
// damaged set is exit 1 however it is damaged (a truncated shard was 2, as for no set).
TEST(DataCommands, BpeWordsAreBoundedAndADamagedSetIsExitOne) {
  TempDir dir;
  const std::string d = dir.path();
  std::ofstream(d + "/words.txt") << "the cat sat on the mat and the dog ate the hat\n";
  auto expect = [&](const std::string& cmd, int code, const std::string& says) {
    const Result r = shell(dir, cmd);
    EXPECT_EQ(r.exit_code, code) << cmd << "\n" << r.output;
    EXPECT_NE(r.output.find(says), std::string::npos) << cmd << "\n" << r.output;
  };
  expect("\"$T\" data prepare " + d + "/words.txt --out " + d + "/mw --max-words 4", 2,
         "--max-words bounds the words a bpe tokenizer is trained on: it needs --tokenizer bpe");
  expect("\"$T\" data prepare " + d + "/words.txt --out " + d +
             "/mw --tokenizer bpe --vocab 262 --max-words 2",
         0, "were dropped as they came");
  expect("\"$T\" data verify " + d + "/mw", 0, "every checksum matches");
  fs::resize_file(d + "/mw/tokens-00000.bin", 2);
  expect("\"$T\" data verify " + d + "/mw", 1, "tokens-00000.bin has 2 bytes; the manifest says");
  expect("\"$T\" data verify " + d, 2, "has no manifest.json");
}

// A set of more shards than the process may open files (each kept a descriptor open: "Too many
// open files", exit 1) is verified and read under a limit of 64.
TEST(DataCommands, ASetOfManyShardsIsReadUnderALowDescriptorLimit) {
  TempDir dir;
  const std::string d = dir.path();
  Result r = shell(dir, "\"$T\" data prepare /usr/share/common-licenses/GPL-3 --out " + d +
                            "/many --shard-tokens 100");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = shell(dir, "ulimit -n 64 && \"$T\" data verify " + d + "/many");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("in 352 shard(s)"), std::string::npos) << r.output;
  r = shell(dir, "ulimit -n 64 && \"$T\" bench data --data " + d +
                     "/many --context 16 --batch 8 --seconds 0.3");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("micro-batches of 8 x 16 tokens"), std::string::npos) << r.output;
}

// Out of descriptors, data verify says the set was not checked (exit 2), never that it is damaged
// (exit 1 sent a user to prepare a sound set again): at each low limit it is sound or unchecked.
TEST(DataCommands, VerifyOutOfDescriptorsIsNotCheckedNotDamaged) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers' runtime needs descriptors of its own (UBSan's vptr check "
                  "opens a pipe): at 4 or 5 it reports its own failure, not verify's "
                  "(Prepare.VerifyOutOfDescriptorsIsNotDamage checks the same in one process)";
#endif
  TempDir dir;
  const std::string d = dir.path();
  Result r = shell(dir, "\"$T\" data prepare /usr/share/common-licenses/GPL-3 --out " + d + "/s");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  int unchecked = 0;
  for (int most = 4; most <= 12; ++most) {
    r = shell(dir, "ulimit -n " + std::to_string(most) + " && \"$T\" data verify " + d + "/s");
    EXPECT_TRUE(r.exit_code == 0 || r.exit_code == 2) << most << ": " << r.output;
    if (r.exit_code != 2) continue;
    ++unchecked;
    EXPECT_NE(r.output.find("Too many open files (not checked: the set may be sound)"),
              std::string::npos)
        << most << ": " << r.output;
  }
  EXPECT_GT(unchecked, 0) << "no limit from 4 descriptors ran out of them";
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(DataCommands, APrepareKilledMidwayLeavesNoDataSetAndTheNextOneFinishes) {
  TempDir dir;
  const std::string d = dir.path(), in = d + "/big.txt", out = d + "/big";
  {
    const std::string gpl = text_of("/usr/share/common-licenses/GPL-3");
    std::ofstream f(in);
    for (int i = 0; i < 1200; ++i) f << gpl;  // 42 MB
  }
  const std::string cmd =
      troupe_binary() + " data prepare " + in + " --out " + out + " --tokenizer bpe --vocab 400";
  coordinator::ChildProcess p({{"/bin/sh", "-c", "exec " + cmd}, d + "/p.out", d + "/p.out", {}});
  const std::string partial = out + ".partial-" + std::to_string(p.pid());
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!fs::exists(partial) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(2ms);
  ASSERT_TRUE(fs::exists(partial)) << text_of(d + "/p.out");
  std::this_thread::sleep_for(50ms);
  ASSERT_TRUE(p.signal(SIGKILL));
  ASSERT_TRUE(p.wait(30s));
  EXPECT_FALSE(fs::exists(out)) << "a killed prepare made something that looks like a data set";
  const Result r = shell(dir, "\"$T\" data prepare " + in + " --out " + out);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(out + "/manifest.json"));
  EXPECT_FALSE(fs::exists(partial)) << "the dead prepare's partial directory was removed";
}

}  // namespace
}  // namespace troupe
