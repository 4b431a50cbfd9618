// coordinator::Checkpoints without processes: a manifest only once every block of one step from
// one generation is durable; keep; and the checks that refuse a checkpoint, each naming why.
#include "coordinator/checkpoints.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "comm/checksum.h"

namespace troupe::coordinator {
namespace {

namespace fs = std::filesystem;

struct Dir {
  std::string path;
  Dir() {
    std::string t = (fs::temp_directory_path() / "troupe-ckpt-XXXXXX").string();
    path = ::mkdtemp(t.data());
  }
  ~Dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::string step_dir(const std::string& root, uint64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08llu", (unsigned long long)step);
  return root + "/" + name;
}

// Writes block b's shard of `step` (its bytes: `content`) and returns the worker's report.
actors::CheckpointShard shard(const std::string& dir, uint32_t b, const std::string& content) {
  fs::create_directories(dir);
  const std::string file = actors::shard_file_name(b);
  std::ofstream(dir + "/" + file, std::ios::binary) << content;
  return {b, file, content.size(),
          comm::fnv1a(reinterpret_cast<const uint8_t*>(content.data()), content.size())};
}

actors::CheckpointWritten report(const std::string& root, uint64_t step, uint64_t generation,
                                 std::vector<uint32_t> blocks, uint32_t of) {
  actors::CheckpointWritten w;
  w.generation = generation;
  w.step = step;
  w.blocks = of;
  w.directory = step_dir(root, step);
  for (uint32_t b : blocks)
    w.shards.push_back(shard(w.directory, b, "state of block " + std::to_string(b)));
  return w;
}

JobConfig config(const std::string& dir, int64_t keep = 2) {
  JobConfig c;
  c.name = "unit";
  c.checkpoint_dir = dir;
  c.checkpoint_keep = keep;
  return c;
}

TEST(Checkpoints, TheManifestComesWhenEveryBlockIsDurableAndIsThenValid) {
  Dir d;
  Checkpoints ck(config(d.path));
  EXPECT_FALSE(ck.add(report(d.path, 10, 1, {0, 2}, 3), 2, "", 1e-3));
  EXPECT_FALSE(fs::exists(step_dir(d.path, 10) + "/manifest.json"));
  std::string why;
  EXPECT_FALSE(
      valid_checkpoint(step_dir(d.path, 10), checkpoint_config_hash(config(d.path)), &why));
  EXPECT_NE(why.find("no manifest"), std::string::npos) << why;
  auto done = ck.add(report(d.path, 10, 1, {1}, 3), 2, "", 2.5e-4);
  ASSERT_TRUE(done);
  EXPECT_EQ(done->step, 10u);
  auto valid = valid_checkpoint(step_dir(d.path, 10), checkpoint_config_hash(config(d.path)), &why);
  ASSERT_TRUE(valid) << why;
  EXPECT_EQ(valid->step, 10u);
  EXPECT_EQ(valid->lr, 2.5e-4);  // (the learning rate at its step: a resume goes on with it)
  ASSERT_TRUE(ck.newest());
  EXPECT_EQ(ck.newest()->manifest, step_dir(d.path, 10) + "/manifest.json");
}

// A step written again by another generation (after a rollback): the first generation's blocks
// and the second's are not one checkpoint; the second's, complete, is.
TEST(Checkpoints, BlocksOfOneStepFromTwoGenerationsAreNotOneCheckpoint) {
  Dir d;
  Checkpoints ck(config(d.path));
  EXPECT_FALSE(ck.add(report(d.path, 20, 1, {0}, 2), 2, "", 1e-3));
  EXPECT_FALSE(ck.add(report(d.path, 20, 2, {1}, 2), 1, "", 1e-3));
  EXPECT_FALSE(fs::exists(step_dir(d.path, 20) + "/manifest.json"));
  EXPECT_TRUE(ck.add(report(d.path, 20, 2, {0}, 2), 1, "", 1e-3));
}

// A checkpoint that failed (a writer's error, e.g. a full disk): the shards written so far go,
// and so do a slower writer's when it reports them; a complete checkpoint of the same step (a
// later generation's), or one another generation is writing there, stays.
TEST(Checkpoints, AFailedCheckpointsShardsGoNowAndWhenASlowerWriterReportsThem) {
  Dir d;
  Checkpoints ck(config(d.path));
  EXPECT_FALSE(ck.add(report(d.path, 10, 1, {0}, 2), 2, "", 1e-3));
  EXPECT_TRUE(ck.fail(10, 1));
  EXPECT_FALSE(fs::exists(step_dir(d.path, 10)));
  EXPECT_FALSE(ck.fail(10, 1));  // (each writer may say it failed: once a checkpoint)
  EXPECT_FALSE(ck.add(report(d.path, 10, 1, {1}, 2), 2, "", 1e-3));
  EXPECT_FALSE(fs::exists(step_dir(d.path, 10)));
  ASSERT_TRUE(ck.add(report(d.path, 10, 2, {0, 1}, 2), 1, "", 1e-3));  // redone, complete
  EXPECT_FALSE(ck.add(report(d.path, 10, 1, {1}, 2), 2, "", 1e-3));
  EXPECT_TRUE(fs::exists(step_dir(d.path, 10) + "/manifest.json"));
  EXPECT_FALSE(ck.add(report(d.path, 30, 2, {0}, 2), 1, "", 1e-3));
  EXPECT_TRUE(ck.fail(30, 1));
  EXPECT_TRUE(fs::exists(step_dir(d.path, 30) + "/" + actors::shard_file_name(0)));
  EXPECT_TRUE(ck.add(report(d.path, 30, 2, {1}, 2), 1, "", 1e-3));
}

// A checkpoint one of whose writers was lost before its shards were durable: nothing writes them
// any more. When a later one completes, the earlier is failed naming the blocks that never came,
// and its shards go (before, it stayed pending, said nothing, and its files stayed until keep
// pruned them). A step written again by a later generation is no such one.
TEST(Checkpoints, AnOlderCheckpointStillIncompleteWhenANewerOneIsIsFailed) {
  Dir d;
  Checkpoints ck(config(d.path, 5));
  EXPECT_FALSE(ck.add(report(d.path, 10, 1, {0, 2}, 3), 3, "", 1e-3));
  EXPECT_FALSE(ck.add(report(d.path, 15, 2, {0}, 3), 2, "", 1e-3));
  EXPECT_TRUE(ck.take_abandoned().empty());
  ASSERT_TRUE(ck.add(report(d.path, 15, 2, {1, 2}, 3), 2, "", 1e-3));
  const auto abandoned = ck.take_abandoned();
  ASSERT_EQ(abandoned.size(), 1u);
  EXPECT_EQ(abandoned[0].first, 10u);
  EXPECT_NE(abandoned[0].second.find("block(s) 1 (generation 1) had not come when the checkpoint "
                                     "at step 15 was complete"),
            std::string::npos)
      << abandoned[0].second;
  EXPECT_FALSE(fs::exists(step_dir(d.path, 10)));
  EXPECT_TRUE(ck.take_abandoned().empty());                          // (said once)
  EXPECT_FALSE(ck.add(report(d.path, 10, 1, {1}, 3), 3, "", 1e-3));  // (a slower writer's: gone)
  EXPECT_FALSE(fs::exists(step_dir(d.path, 10)));
  EXPECT_FALSE(ck.add(report(d.path, 20, 2, {0}, 3), 2, "", 1e-3));
  ASSERT_TRUE(ck.add(report(d.path, 20, 3, {0, 1, 2}, 3), 1, "", 1e-3));
  EXPECT_TRUE(ck.take_abandoned().empty());
}

// A coordinator that took the run over after generation 4, from the checkpoint of step 20: the
// agents send their recent shard reports again. Those of earlier generations, and those of 4 of
// steps up to 20 (complete, or pruned), complete or whose directory is gone, change nothing; a
// newer one of generation 4 completes its checkpoint here, and one that cannot complete is said
// to have gone to the coordinator that was lost.
TEST(Checkpoints, ShardReportsSentAgainAfterATakeOverCompleteOnlyWhatWasNotComplete) {
  Dir d;
  Checkpoints ck(config(d.path, 5));
  EXPECT_FALSE(ck.heard_before(report(d.path, 10, 2, {0}, 1)));  // (no take-over: every one counts)
  ck.taken_over(4);
  ck.reloaded(20, step_dir(d.path, 20));
  EXPECT_TRUE(ck.heard_before(report(d.path, 10, 2, {0}, 1)));
  EXPECT_TRUE(ck.heard_before(report(d.path, 22, 3, {0}, 1)));
  EXPECT_TRUE(ck.heard_before(report(d.path, 20, 4, {0}, 1)));
  actors::CheckpointWritten gone = report(d.path, 30, 4, {0}, 1);
  fs::remove_all(gone.directory);
  EXPECT_TRUE(ck.heard_before(gone));
  EXPECT_FALSE(ck.heard_before(report(d.path, 10, 5, {0}, 1)));  // (this coordinator's own)
  actors::CheckpointWritten late = report(d.path, 25, 4, {0, 1}, 2);
  EXPECT_FALSE(ck.heard_before(late));
  ASSERT_TRUE(ck.add(late, 2, "", 1e-3));
  EXPECT_TRUE(fs::exists(step_dir(d.path, 25) + "/manifest.json"));
  EXPECT_TRUE(ck.heard_before(late));  // (sent twice: complete now)
  actors::CheckpointWritten half = report(d.path, 27, 4, {0}, 2);
  ASSERT_FALSE(ck.heard_before(half));
  EXPECT_FALSE(ck.add(half, 2, "", 1e-3));
  ASSERT_TRUE(ck.add(report(d.path, 28, 5, {0, 1}, 2), 2, "", 1e-3));
  const auto abandoned = ck.take_abandoned();
  ASSERT_EQ(abandoned.size(), 1u);
  EXPECT_NE(abandoned[0].second.find("block(s) 1 (generation 4) had not come when the checkpoint "
                                     "at step 28 was complete: their writer's report went to the "
                                     "coordinator that was lost"),
            std::string::npos)
      << abandoned[0].second;
}

TEST(Checkpoints, KeepDeletesTheOldestCompleteOnes) {
  Dir d;
  Checkpoints ck(config(d.path, 2));
  for (uint64_t step : {10, 20, 30})
    ASSERT_TRUE(ck.add(report(d.path, step, 1, {0}, 1), 1, "", 1e-3));
  EXPECT_FALSE(fs::exists(step_dir(d.path, 10)));
  EXPECT_TRUE(fs::exists(step_dir(d.path, 20) + "/manifest.json"));
  EXPECT_TRUE(fs::exists(step_dir(d.path, 30) + "/manifest.json"));
}

// keep counts this job's checkpoints up to its newest: a newer one it did not write (damaged, a
// resume passed it over) and another job's in the same directory neither count nor push this
// job's newest out (keep 1 deleted the checkpoint just written, keeping the damaged one).
TEST(Checkpoints, KeepCountsOnlyThisJobsCheckpointsUpToItsNewest) {
  Dir d;
  {
    Checkpoints before(config(d.path, 10));
    for (uint64_t step : {20, 30})
      ASSERT_TRUE(before.add(report(d.path, step, 1, {0}, 1), 1, "", 1e-3));
  }
  std::ofstream(step_dir(d.path, 30) + "/" + actors::shard_file_name(0)) << "damaged";
  JobConfig other = config(d.path, 10);
  other.seed = 99;
  ASSERT_TRUE(Checkpoints(other).add(report(d.path, 24, 1, {0}, 1), 1, "", 1e-3));
  Checkpoints ck(config(d.path, 1));  // (resumed at 20: 30 is damaged)
  ASSERT_TRUE(ck.add(report(d.path, 25, 2, {0}, 1), 1, "", 1e-3));
  EXPECT_TRUE(fs::exists(step_dir(d.path, 25) + "/manifest.json"));
  EXPECT_FALSE(fs::exists(step_dir(d.path, 20)));
  EXPECT_TRUE(fs::exists(step_dir(d.path, 24) + "/manifest.json"));  // another job's
  EXPECT_TRUE(fs::exists(step_dir(d.path, 30)));
  ASSERT_TRUE(ck.newest());
  EXPECT_EQ(ck.newest()->step, 25u);
  ASSERT_TRUE(ck.add(report(d.path, 30, 2, {0}, 1), 1, "", 1e-3));  // written again, whole
  EXPECT_FALSE(fs::exists(step_dir(d.path, 25)));
  std::string why;
  EXPECT_TRUE(valid_checkpoint(step_dir(d.path, 30), checkpoint_identity(config(d.path)), &why))
      << why;
}

// A rollback to step 40 undoes the checkpoint of 45: set aside as step-00000045.undone (a resume
// from it would leave the ledger without the steps redone; it goes once the redo has written 45
// again), and the newest is 40 again; 50's partial shards go; the shards of 50 an earlier
// generation reports late change nothing (the redo's writers may be writing there).
TEST(Checkpoints, ARollbackUndoesTheCheckpointsOfTheStepsAfterIt) {
  Dir d;
  JobConfig other = config(d.path, 10);
  other.seed = 99;
  ASSERT_TRUE(Checkpoints(other).add(report(d.path, 60, 1, {0}, 1), 1, "", 1e-3));
  Checkpoints ck(config(d.path, 10));
  for (uint64_t step : {35, 40, 45})
    ASSERT_TRUE(ck.add(report(d.path, step, 1, {0, 1}, 2), 1, "", 1e-3));
  EXPECT_FALSE(ck.add(report(d.path, 50, 1, {0}, 2), 1, "", 1e-3));
  const auto aside = ck.roll_back(40, 2);
  ASSERT_EQ(aside, std::vector<std::string>{step_dir(d.path, 45) + ".undone"});
  EXPECT_FALSE(fs::exists(step_dir(d.path, 45)));
  EXPECT_TRUE(fs::exists(step_dir(d.path, 45) + ".undone/manifest.json"));
  EXPECT_FALSE(fs::exists(step_dir(d.path, 50)));
  EXPECT_TRUE(fs::exists(step_dir(d.path, 60) + "/manifest.json"));  // another job's
  ASSERT_TRUE(ck.newest());
  EXPECT_EQ(ck.newest()->step, 40u);
  EXPECT_FALSE(ck.fail(50, 1));                                       // late, of generation 1
  EXPECT_FALSE(ck.add(report(d.path, 50, 1, {1}, 2), 1, "", 1e-3));   // (written now, as the
  EXPECT_FALSE(fs::exists(step_dir(d.path, 50) + "/manifest.json"));  // redo's writer would)
  EXPECT_TRUE(fs::exists(step_dir(d.path, 50) + "/" + actors::shard_file_name(1)));
  const auto valid =
      newest_valid_checkpoint(d.path, checkpoint_identity(config(d.path)), nullptr, 44);
  ASSERT_TRUE(valid);
  EXPECT_EQ(valid->step, 40u);
  ASSERT_TRUE(ck.add(report(d.path, 45, 2, {0, 1}, 2), 1, "", 1e-3));
  EXPECT_EQ(ck.newest()->step, 45u);
  EXPECT_FALSE(fs::exists(step_dir(d.path, 45) + ".undone"));  // (replaced by the redo's)
}

// A job with a held-out fraction: its checkpoints from an older Troupe (a manifest without the
// fields, its hash without the fraction) are still taken; this version's, with another fraction,
// are not.
TEST(Checkpoints, AnOlderVersionsManifestIsTakenOnTheHashItWasWrittenWith) {
  Dir d;
  JobConfig c = config(d.path, 10);
  c.eval_fraction = 0.05;
  Checkpoints ck(c);
  ASSERT_TRUE(ck.add(report(d.path, 10, 1, {0}, 1), 1, "", 1e-3));
  std::string why;
  EXPECT_TRUE(valid_checkpoint(step_dir(d.path, 10), checkpoint_identity(c), &why)) << why;
  JobConfig other = c;
  other.eval_fraction = 0.1;
  EXPECT_FALSE(valid_checkpoint(step_dir(d.path, 10), checkpoint_identity(other), &why));
  // As an older Troupe wrote it: no "config", the hash of the fields without the fraction.
  const std::string path = step_dir(d.path, 10) + "/manifest.json";
  std::ifstream in(path);
  nlohmann::json m = nlohmann::json::parse(in);
  in.close();
  JobConfig without = c;
  without.eval_fraction = 0;
  m.erase("config");
  m["config_hash"] = checkpoint_config_hash(without);
  std::ofstream(path, std::ios::trunc) << m.dump(1);
  EXPECT_TRUE(valid_checkpoint(step_dir(d.path, 10), checkpoint_identity(c), &why)) << why;
  EXPECT_TRUE(valid_checkpoint(step_dir(d.path, 10), checkpoint_identity(other), &why)) << why;
}

// A program's own model kind that gained a key since its checkpoint was written: at the key's
// default the checkpoint is the same job's (it was "another model", export and resume refused);
// set otherwise, another's, naming the key.
TEST(Checkpoints, AKeyAddedToAKindSinceStaysTheSameJobAtItsDefault) {
  Dir d;
  JobConfig c = config(d.path, 10);
  c.model_kind = "swishnet";
  c.model_options = c.model_defaults = {{"width", int64_t(32)}};
  Checkpoints ck(c);
  ASSERT_TRUE(ck.add(report(d.path, 10, 1, {0}, 1), 1, "", 1e-3));
  JobConfig later = c;
  later.model_defaults["delay_us"] = int64_t(0);
  later.model_options = later.model_defaults;
  std::string why;
  EXPECT_TRUE(valid_checkpoint(step_dir(d.path, 10), checkpoint_identity(later), &why)) << why;
  later.model_options["delay_us"] = int64_t(5);
  EXPECT_FALSE(valid_checkpoint(step_dir(d.path, 10), checkpoint_identity(later), &why));
  EXPECT_NE(why.find("model_options: {\"width\":32} in the checkpoint"), std::string::npos) << why;
  JobConfig wider = c;  // (a key the checkpoint has, changed: another model)
  wider.model_options["width"] = int64_t(64);
  EXPECT_FALSE(valid_checkpoint(step_dir(d.path, 10), checkpoint_identity(wider), &why));
}

// A token data set replaced by one of another tokenizer (the same vocabulary size: the old ids'
// embeddings would be trained on other text) is another job's data: refused, naming it. A
// checkpoint written before the tokenizer was part of the identity is still taken.
TEST(Checkpoints, ACheckpointOfAnotherTokenizerIsAnotherJobs) {
  Dir d;
  JobConfig c = config(d.path, 10);
  c.data_kind = "tokens";
  c.data_tokenizer = "00000000000000aa";
  Checkpoints ck(c);
  ASSERT_TRUE(ck.add(report(d.path, 10, 1, {0}, 1), 1, "", 1e-3));
  std::string why;
  EXPECT_TRUE(valid_checkpoint(step_dir(d.path, 10), checkpoint_identity(c), &why)) << why;
  JobConfig swapped = c;
  swapped.data_tokenizer = "00000000000000bb";
  EXPECT_FALSE(valid_checkpoint(step_dir(d.path, 10), checkpoint_identity(swapped), &why));
  EXPECT_NE(why.find("tokenizer"), std::string::npos) << why;
  // As the version before wrote it: its config and hash without the tokenizer.
  const std::string path = step_dir(d.path, 10) + "/manifest.json";
  std::ifstream in(path);
  nlohmann::json m = nlohmann::json::parse(in);
  in.close();
  JobConfig before = c;
  before.data_tokenizer.clear();
  m["config"].erase("tokenizer");
  m["config_hash"] = checkpoint_config_hash(before);
  std::ofstream(path, std::ios::trunc) << m.dump(1);
  EXPECT_TRUE(valid_checkpoint(step_dir(d.path, 10), checkpoint_identity(swapped), &why)) << why;
}

// The data by its content: the same digest under another path is the same job's; another digest
// at the same path is not, named. A checkpoint written before the content was part of the
// identity (its config with the path, its hash by the path's text) is taken for that path.
TEST(Checkpoints, ACheckpointKnowsItsDataByItsContent) {
  Dir d;
  JobConfig c = config(d.path, 10);
  c.data_kind = "text";
  c.data_path = "a.txt";
  c.data_digest = "00000000000000aa";
  c.digest_source = data_digest_source(c);  // (as parsing computes it)
  Checkpoints ck(c);
  ASSERT_TRUE(ck.add(report(d.path, 10, 1, {0}, 1), 1, "", 1e-3));
  std::string why;
  JobConfig moved = c;
  moved.data_path = "/elsewhere/b.txt";
  moved.digest_source = data_digest_source(moved);
  EXPECT_TRUE(valid_checkpoint(step_dir(d.path, 10), checkpoint_identity(moved), &why)) << why;
  JobConfig swapped = c;
  swapped.data_digest = "00000000000000bb";
  EXPECT_FALSE(valid_checkpoint(step_dir(d.path, 10), checkpoint_identity(swapped), &why));
  EXPECT_NE(why.find("data_digest: \"00000000000000aa\" in the checkpoint, "
                     "\"00000000000000bb\" now"),
            std::string::npos)
      << why;
  // As the version before wrote it: its config and hash by the path.
  const std::string path = step_dir(d.path, 10) + "/manifest.json";
  std::ifstream in(path);
  nlohmann::json m = nlohmann::json::parse(in);
  in.close();
  JobConfig before = c;
  before.data_digest.clear();
  before.digest_source = data_digest_source(before);
  m["config"] = nlohmann::json::parse(checkpoint_identity(before).config);
  m["config_hash"] = checkpoint_config_hash(before);
  std::ofstream(path, std::ios::trunc) << m.dump(1);
  EXPECT_TRUE(valid_checkpoint(step_dir(d.path, 10), checkpoint_identity(c), &why)) << why;
  EXPECT_FALSE(valid_checkpoint(step_dir(d.path, 10), checkpoint_identity(moved), &why));
  // ... and for the same path named absolute (a run's config.toml names it so since).
  JobConfig absolute = c;
  absolute.data_path = std::filesystem::absolute("a.txt").string();
  absolute.digest_source = data_digest_source(absolute);
  EXPECT_TRUE(valid_checkpoint(step_dir(d.path, 10), checkpoint_identity(absolute), &why)) << why;
  // A config whose data was set after its digests were computed (a program embedding Troupe):
  // its digests are computed again, not taken for the other data's.
  JobConfig changed = c;
  changed.data_path = "/usr/share/common-licenses/GPL-2";
  EXPECT_FALSE(valid_checkpoint(step_dir(d.path, 10), checkpoint_identity(changed), &why));
  EXPECT_NE(checkpoint_identity(changed).config.find(
                content_digest("text", "/usr/share/common-licenses/GPL-2")),
            std::string::npos);
}

TEST(Checkpoints, DamagedOrForeignCheckpointsAreRefusedNamingWhyAndTheNewestValidIsFound) {
  Dir d;
  const std::string hash = checkpoint_config_hash(config(d.path));
  Checkpoints ck(config(d.path, 10));
  for (uint64_t step : {10, 20, 30, 40})
    ASSERT_TRUE(ck.add(report(d.path, step, 1, {0, 1}, 2), 1, "", 1e-3));
  {  // 40: a flipped byte
    std::fstream f(step_dir(d.path, 40) + "/" + actors::shard_file_name(1),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(3);
    f.put('X');
  }
  fs::resize_file(step_dir(d.path, 30) + "/" + actors::shard_file_name(0), 4);  // 30: truncated
  JobConfig other = config(d.path);
  other.seed = 99;  // 20: another seed's
  std::string why;
  EXPECT_FALSE(valid_checkpoint(step_dir(d.path, 20), checkpoint_config_hash(other), &why));
  EXPECT_NE(why.find("another model, data or seed"), std::string::npos) << why;
  // Given the job's fields (not only their hash), the refusal names what changed: a held-out
  // fraction too (it changes which windows are trained on).
  other.eval_fraction = 0.05;
  EXPECT_FALSE(valid_checkpoint(step_dir(d.path, 20), checkpoint_identity(other), &why));
  EXPECT_NE(
      why.find("(seed: " + std::to_string(config(d.path).seed) +
               " in the checkpoint, 99 now; eval_fraction: unset in the checkpoint, 0.05 now; "
               "config hash "),
      std::string::npos)
      << why;
  std::vector<std::string> refused;
  auto found = newest_valid_checkpoint(d.path, hash, &refused);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->step, 20u);
  ASSERT_EQ(refused.size(), 2u);
  EXPECT_NE(refused[0].find("step-00000040"), std::string::npos) << refused[0];
  EXPECT_NE(refused[1].find("step-00000030"), std::string::npos) << refused[1];
  // A model of 3 blocks (the job's, where known): a 2-block manifest is skipped like a damaged one
  // (a resume found it, then failed the job at its first generation, every time).
  CheckpointIdentity three = checkpoint_identity(config(d.path));
  three.blocks = 3;
  EXPECT_FALSE(valid_checkpoint(step_dir(d.path, 20), three, &why));
  EXPECT_NE(why.find("it holds 2 blocks of the model, which has 3"), std::string::npos) << why;
}

// A manifest whose fields have other types than the writer's (edited by hand, damaged, another
// program's): refused naming the field, never an exception out of the check.
// A worker's report the manifest may not list (a worker's bug, another version's): refused naming
// the rank and what, no manifest written, and the checkpoint completes from good reports after.
TEST(Checkpoints, AReportOfShardsOutsideTheCheckpointIsRefused) {
  Dir d;
  Checkpoints ck(config(d.path, 10));
  auto refused = [&](actors::CheckpointWritten w, const std::string& why) {
    try {
      ck.add(w, 1, "", 1e-3);
      ADD_FAILURE() << "accepted: " << why;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  actors::CheckpointWritten past = report(d.path, 10, 1, {0}, 2);
  past.shards[0].block = 2;  // of 2 blocks
  refused(past, "block 2 in");
  actors::CheckpointWritten named = report(d.path, 10, 1, {0}, 2);
  named.shards[0].file = "block-00001.trpblk";
  refused(named, "block 0 in block-00001.trpblk");
  actors::CheckpointWritten elsewhere = report(d.path, 10, 1, {0}, 2);
  elsewhere.directory = d.path + "/step-00000011";
  refused(elsewhere, "are in " + d.path + "/step-00000011");
  ASSERT_FALSE(ck.add(report(d.path, 10, 1, {0}, 2), 1, "", 1e-3));
  refused(report(d.path, 10, 1, {1}, 3), "are of 3 blocks, the others' of 2");
  EXPECT_FALSE(fs::exists(step_dir(d.path, 10) + "/manifest.json"));
  EXPECT_TRUE(ck.add(report(d.path, 10, 1, {1}, 2), 1, "", 1e-3));
}

// A checkpoint copied under another step's name: refused naming both steps (it named neither).
TEST(Checkpoints, ACheckpointUnderAnotherStepsNameIsRefusedNamingBoth) {
  Dir d;
  Checkpoints ck(config(d.path, 10));
  ASSERT_TRUE(ck.add(report(d.path, 10, 1, {0, 1}, 2), 1, "", 1e-3));
  fs::copy(step_dir(d.path, 10), step_dir(d.path, 20), fs::copy_options::recursive);
  std::vector<std::string> refused;
  auto found = newest_valid_checkpoint(d.path, checkpoint_config_hash(config(d.path)), &refused);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->step, 10u);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].find("the manifest's step (10) is not the directory's (20)"),
            std::string::npos)
      << refused[0];
}

// A manifest listing one block's shard twice (the other's file, damaged, never checked): refused.
TEST(Checkpoints, EveryBlocksOwnShardIsChecked) {
  Dir d;
  const std::string hash = checkpoint_config_hash(config(d.path));
  Checkpoints ck(config(d.path, 10));
  ASSERT_TRUE(ck.add(report(d.path, 10, 1, {0, 1}, 2), 1, "", 1e-3));
  const std::string manifest = step_dir(d.path, 10) + "/manifest.json";
  std::ifstream in(manifest);
  nlohmann::json m = nlohmann::json::parse(in);
  m["shards"][1] = m["shards"][0];
  std::ofstream(manifest, std::ios::trunc) << m.dump();
  std::ofstream(step_dir(d.path, 10) + "/" + actors::shard_file_name(1), std::ios::trunc) << "junk";
  std::string why;
  EXPECT_FALSE(valid_checkpoint(step_dir(d.path, 10), hash, &why));
  EXPECT_NE(why.find("block 0 twice"), std::string::npos) << why;
}

TEST(Checkpoints, AManifestOfTheWrongShapeIsRefusedNamingTheField) {
  Dir d;
  const std::string hash = checkpoint_config_hash(config(d.path));
  Checkpoints ck(config(d.path, 10));
  ASSERT_TRUE(ck.add(report(d.path, 10, 1, {0}, 1), 1, "", 1e-3));
  const std::string manifest = step_dir(d.path, 10) + "/manifest.json";
  std::string good;
  {
    std::ifstream in(manifest);
    good.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::string why;
  ASSERT_TRUE(valid_checkpoint(step_dir(d.path, 10), hash, &why)) << why;
  auto with = [&](const std::string& from, const std::string& to) {
    const size_t at = good.find(from);
    EXPECT_NE(at, std::string::npos) << from << " not in " << good;
    std::string text = good;
    if (at != std::string::npos) text.replace(at, from.size(), to);
    std::ofstream(manifest, std::ios::trunc) << text;
  };
  const std::vector<std::pair<std::pair<std::string, std::string>, std::string>> cases = {
      {{"\"format\":", "\"format\":7,\"was\":"}, "format"},
      {{"\"step\":", "\"step\":\"ten\",\"was\":"}, "step"},
      {{"\"config_hash\":", "\"config_hash\":[],\"was\":"}, "config_hash"},
      {{"\"blocks\":", "\"blocks\":-1,\"was\":"}, "blocks"},
      {{"\"shards\":", "\"shards\":[5],\"was\":"}, "shard"},
      {{"\"file\":", "\"file\":{},\"was\":"}, "file"},
      {{"\"bytes\":", "\"bytes\":\"many\",\"was\":"}, "bytes"},
      {{"\"checksum\":", "\"checksum\":1,\"was\":"}, "checksum"},
      {{"\"lr\":", "\"lr\":\"fast\",\"was\":"}, "lr"},
      {{"\"block\":", "\"block\":1,\"was\":"}, "block 1 twice or past its blocks"},
      {{"\"file\":", "\"file\":\"block-00001.trpblk\",\"was\":"}, "names block-00001.trpblk"},
  };
  for (const auto& [edit, field] : cases) {
    with(edit.first, edit.second);
    why.clear();
    bool valid = true;
    EXPECT_NO_THROW(valid = valid_checkpoint(step_dir(d.path, 10), hash, &why).has_value())
        << edit.second;
    EXPECT_FALSE(valid) << edit.second;
    EXPECT_NE(why.find(field), std::string::npos) << edit.second << ": " << why;
    std::vector<std::string> refused;
    EXPECT_NO_THROW(newest_valid_checkpoint(d.path, hash, &refused)) << edit.second;
  }
}

}  // namespace
}  // namespace troupe::coordinator
