// Config files: every kind of mistake is refused with a message naming the file, line and what
// to do; --set overrides any key; the effective config round-trips.
#include "coordinator/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <tuple>

#include "coordinator/checkpoints.h"
#include "coordinator/run_dir.h"

namespace troupe::coordinator {
namespace {

struct Bad {
  const char* what;
  const char* text;
  std::vector<std::string> overrides;
  const char* expect;  // substring of the message
};

TEST(Config, BadFilesAreRefusedWithFileLineAndReason) {
  const Bad cases[] = {
      {"syntax", "[job]\nsteps = = 3\n", {}, "job.toml:2:"},
      {"syntax names it", "[job\n", {}, "syntax error"},
      {"unknown key with the nearest",
       "[job]\nstesp = 10\n",
       {},
       "job.toml:2:1: unknown key job.stesp; did you mean job.steps?"},
      {"every unknown key, in the file's order (not the tables')",
       "[job]\nstesp = 10\n[eval]\nevery_step = 5\n[checkpoint]\nevery_step = 5\n",
       {},
       "job.toml:2:1: unknown key job.stesp; did you mean job.steps?\njob.toml:4:1: unknown key "
       "eval.every_step; did you mean eval.every_steps?\njob.toml:6:1: unknown key "
       "checkpoint.every_step; did you mean checkpoint.every_steps?"},
      {"unknown table",
       "[optimiser]\nlr = 0.1\n",
       {},
       "unknown table [optimiser]; did you mean [optimizer]?"},
      {"wrong type",
       "[batch]\nglobal = \"lots\"\n",
       {},
       "job.toml:2:10: batch.global must be an integer"},
      {"out of range",
       "[optimizer]\nlr = -1.0\n",
       {},
       "job.toml:2:6: optimizer.lr = -1 is out of range"},
      // (an integer as given, and the bounds in full: it said 9.22337e+18 and [1, 1e+09])
      {"a large integer out of range",
       "[job]\nsteps = 9223372036854775807\n",
       {},
       "job.toml:2:9: job.steps = 9223372036854775807 is out of range [1, "},
      {"bad choice",
       "[model]\nkind = \"rnn\"\n",
       {},
       "model.kind = \"rnn\" is not one of: mlp, gpt"},
      {"missing data file",
       "[model]\nkind = \"gpt\"\n[data]\nkind = \"text\"\npath = \"/nonexistent/corpus.txt\"\n",
       {},
       "data.path: '/nonexistent/corpus.txt' cannot be read: No such file or directory"},
      {"a device as the data",
       "[model]\nkind = \"gpt\"\n[data]\nkind = \"text\"\npath = \"/dev/zero\"\n",
       {},
       "job.toml:5:8: data.path: '/dev/zero' is not a regular file (a character device)"},
      {"a directory as the data",
       "[model]\nkind = \"gpt\"\n[data]\nkind = \"text\"\npath = \"/usr\"\n",
       {},
       "'/usr' is a directory, not a text file"},
      {"binary data",
       "[model]\nkind = \"gpt\"\n[data]\nkind = \"text\"\npath = \"/bin/ls\"\n",
       {},
       "'/bin/ls' looks binary (a NUL byte at offset"},
      {"a context longer than the text",
       "[model]\nkind = \"gpt\"\ncontext = 100000\n[data]\nkind = \"text\"\n",
       {},
       "characters; model.context = 100000 needs more than 100001"},
      {"not a number",
       "[optimizer]\nlr = nan\n",
       {},
       "job.toml:2:6: optimizer.lr must be a finite number"},
      {"a huge integer as a float",
       "[job]\nsteps = 1e20\n",
       {},
       "job.steps must be an integer, not a floating-point"},
      {"micro above global",
       "[batch]\nglobal = 8\nmicro = 16\n",
       {},
       "job.toml:3:9: batch.micro (16) exceeds batch.global (8)"},
      {"bad override", "", {"batch.global=zero"}, "batch.global must be an integer"},
      {"override without a table", "", {"steps=3"}, "expected table.key=value"},
      {"a dtype this build does not compute in",
       "[model]\ndtype = \"f16\"\n",
       {},
       "job.toml:2:9: model.dtype = \"f16\" is not one of: f32, bf16"},
      {"nccl for CPU workers",
       "[parallel]\nbackend = \"nccl\"\n[cluster]\ndevices = \"cpu\"\n",
       {},
       "job.toml:4:11: parallel.backend = \"nccl\" reduces CUDA tensors, and cluster.devices = "
       "\"cpu\""},
      {"bf16 sums with exact sums",
       "[parallel]\ndeterministic = true\nreduce_dtype = \"bf16\"\n",
       {},
       "job.toml:3:16: parallel.reduce_dtype = \"bf16\" rounds the gradients of a data-parallel "
       "step; parallel.deterministic sums them exactly"},
      {"nccl with exact sums",
       "[parallel]\nbackend = \"nccl\"\ndeterministic = true\n",
       {},
       "job.toml:3:17: parallel.backend = \"nccl\" cannot make the sums exact"},
      {"skipping busy checkpoints without periodic ones",
       "",
       {"checkpoint.if_busy=\"skip\""},
       "checkpoint.if_busy = \"skip\" skips periodic checkpoints, and checkpoint.every_steps is 0"},
      {"a bad if_busy",
       "[checkpoint]\nif_busy = \"drop\"\n",
       {},
       "checkpoint.if_busy = \"drop\" is not one of: wait, skip"},
      {"a bad on_state_lost",
       "[checkpoint]\non_state_lost = \"restart\"\n",
       {},
       "job.toml:2:17: checkpoint.on_state_lost = \"restart\" is not one of: rollback, fail"},
      {"deterministic with a partial micro-batch",
       "[batch]\nglobal = 30\nmicro = 8\n[parallel]\ndeterministic = true\n",
       {},
       "parallel.deterministic needs batch.global (30) to be a multiple of batch.micro (8)"},
      {"deterministic with an overlapped reduction",
       "[parallel]\ndeterministic = true\noverlap_reduce = true\n",
       {},
       "it cannot overlap the reduction (set parallel.overlap_reduce = false)"},
      // A key from --set: the message names the --set, not the file.
      {"an unknown key from --set",
       "",
       {"job.stpes=3"},
       "--set job.stpes: unknown key job.stpes; did you mean job.steps?"},
      {"an unknown table from --set", "", {"foo.bar=1"}, "--set foo.bar: unknown table [foo]"},
      {"an array for an integer",
       "[job]\nsteps = [1]\n",
       {},
       "job.steps must be an integer, not an array"},
      {"a bad value from --set",
       "[job]\nsteps = 5\n",
       {"job.steps=abc"},
       "--set job.steps: job.steps must be an integer, not a string (\"abc\")"},
      {"a value that is no TOML, taken for a word",
       "",
       {"optimizer.lr=[1"},
       "--set optimizer.lr: optimizer.lr must be a number, not a string (\"[1\")"},
      {"a bare word from --set", "", {"model.kind=gtp"}, "--set model.kind: model.kind = \"gtp\""},
      {"a check of two keys names the first key's place (it named the file, given by --set)",
       "[batch]\nglobal = 32\n",
       {"parallel.deterministic=true", "batch.micro=12"},
       "--set parallel.deterministic: parallel.deterministic needs batch.global (32) to be"},
      {"the same from the file: its line",
       "[parallel]\ndeterministic = true\n[batch]\nmicro = 12\n",
       {},
       "job.toml:2:17: parallel.deterministic needs batch.global"},
      {"a number for a string from --set: how to quote it",
       "",
       {"observability.trace_steps=500"},
       "--set observability.trace_steps: observability.trace_steps must be a string, not an "
       "integer; as a string: --set observability.trace_steps='\"500\"'"},
      {"a bare word with quotes and a tab",
       "",
       {"model.kind=a\"b\tc"},
       "--set model.kind: model.kind = \"a\"b\tc\" is not one of"},
      {"a mix with a path",
       "[model]\nkind = \"gpt\"\n[data]\nkind = \"tokens\"\npath = \"/nonexistent-a\"\n",
       {"data.mix={ \"/nonexistent-b\" = 1 }"},
       "data.path is set too (set one of them"},
      {"a mix from --set past the file's path, unset",
       "[model]\nkind = \"gpt\"\n[data]\nkind = \"tokens\"\npath = \"/nonexistent-a\"\n",
       {"data.mix={ \"/nonexistent-b\" = 1 }", "data.path=\"\""},
       "--set data.mix: data.mix: '/nonexistent-b' is not a directory"},
      {"a trace past the job's steps",
       "[job]\nsteps = 20\n[observability]\ntrace_steps = \"1000-2000\"\n",
       {},
       "job.toml:4:15: observability.trace_steps = \"1000-2000\" starts past the job's last step "
       "(job.steps = 20: steps 0 to 19)"},
      {"heads that do not divide d_model",
       "[model]\nkind = \"gpt\"\nd_model = 64\nheads = 5\n[data]\nkind = \"text\"\n",
       {},
       "job.toml:4:9: model.d_model (64) must be divisible by model.heads (5)"},
      {"change timeout below the failure timeout",
       "[elastic]\nchange_timeout_ms = 1000\nfailure_timeout_ms = 3000\n",
       {},
       "job.toml:2:21: elastic.change_timeout_ms must be larger than elastic.failure_timeout_ms"},
  };
  for (const auto& c : cases) {
    try {
      parse_config(c.text, "job.toml", c.overrides);
      ADD_FAILURE() << c.what << ": accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos)
          << c.what << ": " << e.what();
    }
  }
}

// Keys, table headers and arrays nested past what toml++'s recursive parser survives (50,000
// parts crashed it) are refused first; the same characters in strings and comments are text.
TEST(Config, KeysAndArraysNestedTooDeepAreRefusedNotACrash) {
  std::string parts;
  for (int i = 0; i < 50000; ++i) parts += "a.";
  const std::string deep_array = "[job]\nx = " + std::string(50000, '[') + "\n";
  for (const std::string& text : {"[job]\n" + parts + "b = 1\n", "[" + parts + "b]\n", deep_array})
    try {
      parse_config(text, "job.toml");
      ADD_FAILURE() << "accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("job.toml:"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("256"), std::string::npos) << e.what();
    }
  // A string closed by more than three quotes (valid TOML) does not hide what follows.
  EXPECT_THROW(parse_config("[job]\nname = \"\"\"a \"b\"\"\"\"\n" + parts + "c = 1\n", "job.toml"),
               ConfigError);
  EXPECT_NE(toml_too_deep("x = \"\"\"a \"b\"\"\"\"\n" + parts + "c = 1\n"), "");
  // Numbers' dots are no key's: a mix of 300 weights on one line is a config.
  std::string weights;
  for (int i = 0; i < 300; ++i)
    weights += (i ? ", " : "") + std::string("s") + std::to_string(i) + " = 0.5";
  EXPECT_EQ(toml_too_deep("[data]\nmix = {" + weights + "}\n"), "");
  EXPECT_NE(toml_too_deep("[data]\nmix = {" + parts + "x = 1}\n"), "");
  const std::string dots(1000, '.');
  EXPECT_NO_THROW(parse_config("# " + dots + " [[[[\n[job]\nname = \"" + dots + "[{\"\n" +
                                   "[data]\npath = \'\'\'" + dots + "\n" + dots + "\'\'\'\n",
                               "job.toml"));
}

TEST(Config, DefaultsAndOverrides) {
  auto c = parse_config("[job]\nsteps = 30\n[model]\nhidden = [64, 32]\n", "a.toml",
                        {"optimizer.lr = 0.5", "job.name=demo", " cluster.agents =3"});
  EXPECT_EQ(c.steps, 30);
  EXPECT_EQ(c.hidden, (std::vector<int64_t>{64, 32}));
  EXPECT_DOUBLE_EQ(c.lr, 0.5);
  EXPECT_EQ(c.name, "demo");
  EXPECT_EQ(c.agents, 3);
  EXPECT_EQ(c.global_batch, 64);  // default
  // batch.micro not given: the default, or the global batch when that is smaller.
  EXPECT_EQ(c.micro_batch, 64);
  EXPECT_EQ(parse_config("[batch]\nglobal = 32\n", "b.toml").micro_batch, 32);
  EXPECT_EQ(parse_config("", "b.toml", {"batch.global=100"}).micro_batch, 64);
}

// The effective config.toml a run writes loads back to the same values: every value below
// differs from its default, so a key to_toml dropped or wrote wrong would come back as the
// default (or fail to parse) and differ here.
// A kind's key set for another kind would not act: named with its place (troupe run refuses a
// new run with it; a resume, whose checkpoints name the config as it was, warns).
TEST(Config, AKindsKeySetForAnotherKindIsNamedWithItsPlace) {
  struct Case {
    const char* text;
    std::vector<std::string> sets;
    const char* expect;
  } cases[] = {
      {"[model]\nkind = \"gpt\"\nhidden = [5]\n[data]\nkind = \"text\"\n",
       {},
       "job.toml:3:10: model.hidden acts only with model.kind = \"mlp\""},
      {"",
       {"model.layers=7"},
       "--set model.layers: model.layers acts only with model.kind = \"gpt\""},
      {"[model]\nkind = \"gpt\"\n[data]\nkind = \"text\"\nsamples = 5\n",
       {},
       "data.samples acts only with data.kind = \"synthetic\""},
      {"[optimizer]\nkind = \"adamw\"\nmomentum = 0.5\n",
       {},
       "optimizer.momentum acts only with optimizer.kind = \"sgd\""},
      // (a pipeline's keys without a pipeline were accepted and did nothing)
      {"[parallel]\nrecompute_activations = true\n",
       {},
       "job.toml:2:25: parallel.recompute_activations acts only with a pipeline"},
      {"",
       {"parallel.stage_backup_steps=5"},
       "parallel.stage_backup_steps acts only with a pipeline"},
      // ("auto" without a parameter budget is data parallelism alone: they were taken)
      {"[parallel]\npipeline_stages = \"auto\"\nstage_backup_steps = 5\n",
       {},
       "parallel.stage_backup_steps acts only with a pipeline"},
  };
  for (const Case& c : cases) {
    const JobConfig j = parse_config(c.text, "job.toml", c.sets);
    EXPECT_NE(j.inert_key.find(c.expect), std::string::npos) << j.inert_key;
  }
  EXPECT_EQ(parse_config("[model]\nkind = \"gpt\"\n[data]\nkind = \"text\"\n", "ok.toml").inert_key,
            "");
  // "auto" under a budget may plan a pipeline: its keys act; without one a tied head is taken
  // (it was refused though "auto" could only plan one stage).
  EXPECT_EQ(parse_config("[parallel]\npipeline_stages = \"auto\"\nmax_params_per_worker = "
                         "100000\nstage_backup_steps = 5\n",
                         "ok.toml")
                .inert_key,
            "");
  EXPECT_NO_THROW(
      parse_config("[model]\nkind = \"gpt\"\ntied_head = true\n[data]\nkind = "
                   "\"text\"\n[parallel]\npipeline_stages = \"auto\"\n",
                   "ok.toml"));
}

// elastic.min_workers and max_workers that could not act as documented: named with the key's
// place (troupe run refuses a new run with them; a resume of a run an older build started warns).
TEST(Config, WorkerBoundsTheJobsOwnWorkersBreakAreNamed) {
  auto refusal = [](std::vector<std::string> sets) {
    return parse_config("[cluster]\nagents = 2\n", "job.toml", sets).inert_key;
  };
  EXPECT_EQ(refusal({"elastic.max_workers=1"}),
            "--set elastic.max_workers: elastic.max_workers = 1 is below the workers the job "
            "starts with, 2 (cluster.agents x cluster.devices_per_agent), all of which train from "
            "the start (agents that join later wait above it as standbys)");
  EXPECT_NE(refusal({"elastic.min_workers=3"})
                .find("elastic.min_workers = 3 is above the workers "
                      "the job starts with, 2"),
            std::string::npos);
  EXPECT_NE(refusal({"elastic.min_workers=2", "elastic.max_workers=1"})
                .find("elastic.min_workers = 2 is above elastic.max_workers = 1"),
            std::string::npos);
  EXPECT_EQ(refusal({"elastic.min_workers=2", "elastic.max_workers=2"}), "");
  try {
    parse_config("", "job.toml", {"elastic.heartbeat_interval_ms=5000"});
    ADD_FAILURE() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "--set elastic.heartbeat_interval_ms: elastic.failure_timeout_ms (3000) must be "
              "larger than elastic.heartbeat_interval_ms (5000)");
  }
}

// A --set into a name the file made a value, not a table: the file's line is named (the message
// blamed the --set).
TEST(Config, ASetIntoAFilesValueNamesTheFile) {
  try {
    parse_config("job = 3\n", "bad.toml", {"job.steps=5"});
    ADD_FAILURE() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "bad.toml:1:7: 'job' is not a table (--set job.steps=5 sets a key in it)");
  }
}

// A run directory moved takes its checkpoints along: its own checkpoints/ (named so by the
// effective config, or unset) is looked for where the directory is now; another is kept.
TEST(Config, ARunsOwnCheckpointsAreWhereTheRunDirectoryIsNow) {
  JobConfig c;
  EXPECT_EQ(checkpoints_dir(c, "/new/run"), "/new/run/checkpoints");  // (unset)
  c.run_dir = "/old/run";
  c.checkpoint_dir = "/old/run/checkpoints";
  EXPECT_EQ(checkpoints_dir(c, "/new/run"), "/new/run/checkpoints");
  c.checkpoint_dir = "/elsewhere/ckpt";
  EXPECT_EQ(checkpoints_dir(c, "/new/run"), "/elsewhere/ckpt");
  // An older effective config of a run in the default place: job.run_dir unset.
  c.run_dir.clear();
  c.checkpoint_dir = "/old/runs/job-1/checkpoints";
  EXPECT_EQ(checkpoints_dir(c, "/new/job-1/"), "/new/job-1//checkpoints");
  EXPECT_EQ(checkpoints_dir(c, "/new/other"), "/old/runs/job-1/checkpoints");
}

// What a resume names: every key whose value differs, as the effective config writes it.
TEST(Config, TheDifferencesOfTwoConfigsNameEachKeyWithBothValues) {
  JobConfig a, b;
  b.agents = 2;
  a.agents = 3;
  b.lr = 0.1;
  b.run_dir = "/elsewhere";  // (where, not what: left out)
  const auto d = config_differences(a, b);
  ASSERT_EQ(d.size(), 2u) << ::testing::PrintToString(d);
  EXPECT_EQ(d[0], "optimizer.lr = 0.1 (the run's: 0.001)");
  EXPECT_EQ(d[1], "cluster.agents = 2 (the run's: 3)");
  EXPECT_EQ(config_differences(a, b, {"optimizer.lr"}),
            std::vector<std::string>{"cluster.agents = 2 (the run's: 3)"});
}

// A run's config.toml names its data absolute (read from another directory, the same data), but a
// mix's sets only where that keeps their order (the sampler's): "../../z" sorts before "a/x",
// and after it once both are absolute.
TEST(Config, PathsMadeAbsoluteKeepTheMixsOrder) {
  JobConfig c;
  c.data_path = "text.txt";
  c.data_mix = {{"a", 1}, {"b", 2}};
  const JobConfig a = with_absolute_paths(c);
  const std::string cwd = std::filesystem::current_path().string();
  EXPECT_EQ(a.data_path, cwd + "/text.txt");
  EXPECT_EQ(a.data_mix, (std::map<std::string, double>{{cwd + "/a", 1}, {cwd + "/b", 2}}));
  c.data_mix = {{"a/x", 1}, {"../../z", 2}};  // ("/z" then comes after "/.../a/x")
  EXPECT_EQ(with_absolute_paths(c).data_mix, c.data_mix);
}

// A data.mix run's effective config (what export and a resume read) loads back: it wrote the
// default data.path next to the mix, which the file then refused as both set.
TEST(Config, AMixRunsEffectiveConfigLoadsBackWithTheSameIdentity) {
  const std::string dir = ::testing::TempDir() + "mix-set-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/manifest.json") << "{}";  // (opened only when the job starts)
  const std::string text =
      "[model]\nkind = \"gpt\"\n[data]\nkind = \"tokens\"\nmix = { \"" + dir + "\" = 2.0 }\n";
  JobConfig c = parse_config(text, "mix.toml");
  JobConfig d = parse_config(to_toml(c), "effective.toml");
  EXPECT_EQ(d.data_mix, c.data_mix);
  EXPECT_EQ(d.data_path, c.data_path);
  EXPECT_EQ(checkpoint_identity(d).hash, checkpoint_identity(c).hash);
  std::filesystem::remove_all(dir);
}

// One data set named twice in a mix (two spellings of its path) is refused, naming both: the
// sampler would have drawn it as two sets.
TEST(Config, AMixNamingOneSetTwiceIsRefusedNamingBoth) {
  const std::string dir = ::testing::TempDir() + "mix-twice-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir + "/other");
  std::ofstream(dir + "/manifest.json") << "{}";
  std::ofstream(dir + "/other/manifest.json") << "{}";
  auto mix = [&](const std::string& sets) {
    return "[model]\nkind = \"gpt\"\n[data]\nkind = \"tokens\"\nmix = { " + sets + " }\n";
  };
  EXPECT_NO_THROW(parse_config(mix("\"" + dir + "\" = 1, \"" + dir + "/other\" = 2"), "mix.toml"));
  try {
    parse_config(mix("\"" + dir + "\" = 1, \"" + dir + "/other/..\" = 2"), "mix.toml");
    ADD_FAILURE() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("' are the same data set"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'" + dir + "/other/..'"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(Config, TheEffectiveConfigLoadsBackToTheSameValues) {
  const char* text = R"([job]
name = "round\"trip\"é"
seed = 9007199254740993
steps = 77
[model]
kind = "gpt"
layers = 3
d_model = 96
heads = 3
context = 17
tied_head = true
[data]
kind = "text"
ledger = true
[batch]
global = 24
micro = 8
[optimizer]
kind = "sgd"
lr = 0.1
momentum = 0.3
weight_decay = 1e-7
clip_norm = 2.5
warmup_steps = 4
decay_steps = 50
[parallel]
stage_backup_steps = 0
recompute_activations = true
threads_per_worker = 2
overlap_reduce = true
[cluster]
launcher = "external"
agents = 5
devices_per_agent = 2
listen = "127.0.0.1:4321"
[elastic]
failure_timeout_ms = 4321
max_workers = 11
[logging]
level = "debug"
progress = false
)";
  JobConfig c = parse_config(text, "a.toml");
  JobConfig d = parse_config(to_toml(c), "effective.toml");
  EXPECT_EQ(d.name, "round\"trip\"é");
  EXPECT_EQ(d.seed, 9007199254740993);  // not through a double
  EXPECT_EQ(d.steps, 77);
  EXPECT_EQ(d.model_kind, "gpt");
  // (an array: an MLP's; a GPT refuses model.hidden, which would not act)
  EXPECT_EQ(parse_config(to_toml(parse_config("[model]\nhidden = [5, 7]\n", "mlp.toml")), "e.toml")
                .hidden,
            (std::vector<int64_t>{5, 7}));
  EXPECT_EQ(std::tie(d.layers, d.d_model, d.heads, d.context), std::make_tuple(3, 96, 3, 17));
  EXPECT_TRUE(d.tied_head);
  EXPECT_EQ(d.data_kind, "text");
  EXPECT_TRUE(d.ledger);
  EXPECT_EQ(std::tie(d.global_batch, d.micro_batch), std::make_tuple(24, 8));
  EXPECT_EQ(d.optimizer, "sgd");
  EXPECT_EQ(d.lr, 0.1);  // bitwise: the shortest text that reads back the same double
  EXPECT_EQ(d.momentum, 0.3);
  EXPECT_EQ(d.weight_decay, 1e-7);
  EXPECT_EQ(d.clip_norm, 2.5);
  EXPECT_EQ(std::tie(d.warmup_steps, d.decay_steps), std::make_tuple(4, 50));
  EXPECT_EQ(d.stage_backup_steps, 0);
  EXPECT_TRUE(d.recompute_activations);
  EXPECT_EQ(d.threads_per_worker, 2);
  EXPECT_TRUE(d.overlap_reduce);
  EXPECT_EQ(d.launcher, "external");
  EXPECT_EQ(std::tie(d.agents, d.devices_per_agent), std::make_tuple(5, 2));
  EXPECT_EQ(d.listen, "127.0.0.1:4321");
  EXPECT_EQ(std::tie(d.failure_timeout_ms, d.max_workers), std::make_tuple(4321, 11));
  EXPECT_EQ(d.log_level, "debug");
  EXPECT_FALSE(d.progress);
  // And pipelines, "auto" and numbered (neither with a tied head or an overlapped reduce).
  c.tied_head = false;
  c.overlap_reduce = false;
  for (int64_t stages : {0, 2}) {
    c.pipeline_stages = stages;
    EXPECT_EQ(parse_config(to_toml(c), "effective.toml").pipeline_stages, stages);
  }
}

TEST(Config, KeysThatWouldNotActAtTheirDefaultsAreAccepted) {
  // The effective config.toml of a run holds every key: its checkpoint defaults and the auto
  // backend must load again.
  JobConfig c = parse_config(
      "[checkpoint]\ndir = \"\"\nevery_steps = 0\n[parallel]\nbackend = \"ucx\"\n", "job.toml");
  EXPECT_EQ(c.backend, "ucx");
  EXPECT_NO_THROW(parse_config(to_toml(JobConfig{}), "effective.toml"));
}

TEST(Config, DeadlinesComeFromElasticKeys) {
  JobConfig d;
  EXPECT_EQ(d.start_timeout_ms, 120000);
  EXPECT_EQ(d.change_timeout(), 3 * 3000 + 30000);  // derived from failure_timeout_ms
  // A member hung in a change is cut before the change's deadline, at any failure timeout.
  for (int64_t ft : {500, 3000, 20000, 25000, 120000}) {
    JobConfig c = d;
    c.failure_timeout_ms = ft;
    EXPECT_GT(c.change_timeout(), ft + c.hung_after_ms()) << ft;
  }
  EXPECT_EQ(d.max_reforms, 3);
  JobConfig c = parse_config(
      "[elastic]\nstart_timeout_ms = 5000\nchange_timeout_ms = 9000\nmax_reforms = 1\n"
      "worker_max_restarts = 5\nworker_restart_window_ms = 1000\n",
      "job.toml");
  EXPECT_EQ(c.start_timeout_ms, 5000);
  EXPECT_EQ(c.change_timeout(), 9000);
  EXPECT_EQ(c.max_reforms, 1);
  EXPECT_EQ(c.worker_max_restarts, 5);
  EXPECT_EQ(c.worker_restart_window_ms, 1000);
}

TEST(Config, MissingFileIsRefused) {
  EXPECT_THROW(load_config("/nonexistent/job.toml"), ConfigError);
}

}  // namespace
}  // namespace troupe::coordinator

namespace troupe::coordinator {
namespace {

TEST(RunDirectoryName, StaysUnderRunsWhateverTheJobsName) {
  for (const char* name : {"../../etc/x y", "/abs/path", "..", "", "a/b\\c\n"}) {
    const std::string d = default_run_dir(name);
    ASSERT_EQ(d.rfind("runs/", 0), 0u) << d;
    EXPECT_EQ(d.find('/', 5), std::string::npos) << "leaves runs/: " << d;
    EXPECT_NE(d[5], '.') << "a hidden or parent name: " << d;
  }
  EXPECT_EQ(default_run_dir("gpt-small_2.1").rfind("runs/gpt-small_2.1-", 0), 0u);
}

// A config changed in code (an embedding program's) is checked as a file is: what cannot run is
// refused naming the key; a program's own kind set in code, with its keys, is taken.
TEST(Config, ACheckedConfigChangedInCodeIsRefusedAsAFileWouldBe) {
  const JobConfig parsed = parse_config("[batch]\nglobal = 32\nmicro = 8\n", "t");
  EXPECT_NO_THROW(check_config(parsed, "mine"));
  JobConfig micro = parsed;
  micro.micro_batch = 64;
  try {
    check_config(micro, "mine");
    ADD_FAILURE() << "batch.micro 64 of 32 was taken";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("batch.micro (64) exceeds batch.global (32)"),
              std::string::npos)
        << e.what();
  }
  JobConfig steps = parsed;
  steps.steps = 0;
  EXPECT_THROW(check_config(steps, "mine"), ConfigError);
  JobConfig inert = parsed;  // (a key that would not act: refused, as for troupe run)
  inert.momentum = 0.5;
  inert.optimizer = "adamw";
  EXPECT_THROW(check_config(inert, "mine"), ConfigError);
  JobConfig own = parsed;  // (a program's kind and key, set in code after parsing)
  own.model_kind = "mine";
  own.model_options["width"] = int64_t(64);
  EXPECT_NO_THROW(check_config(own, "mine"));
}

}  // namespace
}  // namespace troupe::coordinator
