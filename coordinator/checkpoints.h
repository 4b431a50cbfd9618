// The job's checkpoints on disk: checkpoint.dir/step-N/ holds one shard per model block
// (block-B.trpblk, models::save_block_state's bytes, written by the block's writer in the
// background: workers/checkpoint_writer.h) and, written last, manifest.json. A checkpoint without
// its manifest does not exist. The coordinator collects what workers report and writes the
// manifest once every block of the step is durable; it then keeps the newest `keep` complete
// checkpoints and deletes the rest. The manifest holds what resuming needs: the step (the next
// step to run), the data cursor (step x batch.global: the sampler is a pure function of seed and
// position), the config hash (the keys that shape the state and the data order), the layout it
// was saved from, and each shard's file, size and FNV-1a 64 checksum.
//
// Thread-safety: none; owned by the coordinator's actor.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "actors/job_protocol.h"
#include "coordinator/config.h"

namespace troupe::coordinator {

// The hash of what a checkpoint's state and data order depend on: model.*, data.* (the mix and
// the held-out fraction too: they change which windows are trained on), job.seed, batch.global,
// optimizer.kind (16 hex digits).
std::string checkpoint_config_hash(const JobConfig& cfg);

// A job as its checkpoints know it: the hash above, and the fields it is of (a JSON object's
// text, kept in every manifest: a refusal names the fields that differ). Made from a hash alone,
// a refusal only says that they differ.
struct CheckpointIdentity {
  CheckpointIdentity(std::string hash) : hash(std::move(hash)) {}  // NOLINT (implicit)
  CheckpointIdentity(std::string hash, std::string config)
      : hash(std::move(hash)), config(std::move(config)) {}
  std::string hash, config;
  std::string older_hash;        // the hash an older Troupe gave the job ("": the same as hash)
  std::string untokenized_hash;  // its hash without the tokenizer ("": the same as hash)
  std::string path_hash;         // its hash by the data's path, not content ("": the same) ...
  std::string path_config;       // ... of this config, and its data's paths made absolute
  std::string data_path;
  std::vector<std::string> mix_sets;
  uint64_t blocks = 0;   // the model's blocks, where known (a manifest of others is refused)
  std::string defaults;  // a program's kinds' keys at their defaults ({"model_options": {...}})
};
CheckpointIdentity checkpoint_identity(const JobConfig& cfg);
// The data a checkpoint's manifest says it was trained on (its identity's data digest, tokenizer
// and mix digests), taken as cfg's: its weights exported without reading the data, moved,
// deleted or prepared again since. False, cfg unchanged, when the manifest cannot be read or does
// not say (an older Troupe's names the data by its path).
bool take_data_identity(JobConfig& cfg, const std::string& manifest);
// The manifest of the newest checkpoint under dir that has one (a regular file); "" when none.
std::string newest_manifest(const std::string& dir);

struct CompletedCheckpoint {
  uint64_t step = 0;
  std::string manifest;                            // its path
  double blocking_seconds = 0, write_seconds = 0;  // the slowest writer's
};

class Checkpoints {
 public:
  Checkpoints(const JobConfig& cfg);

  // A worker's shards. Returns the checkpoint this completed (its manifest written), if any.
  // Throws std::runtime_error when the manifest cannot be written (named).
  // lr: optimizer.lr in effect at the checkpoint's step (a resume goes on with it).
  std::optional<CompletedCheckpoint> add(const actors::CheckpointWritten& w, uint32_t world_size,
                                         const std::string& plan, double lr);
  // A checkpoint of (step, generation) that cannot complete (a writer's error, its manifest not
  // written): its directory goes now (the shards written so far would fill the disk that most
  // likely failed it) and again at each later report of it (a slower writer's shards). Not when
  // the directory has a manifest, or another generation writes the same step there (a step
  // redone after a rollback). True the first time for that checkpoint.
  bool fail(uint64_t step, uint64_t generation);
  // The checkpoints add() gave up on since the last call: older ones still incomplete when a newer
  // one completed (a writer lost before its shards were durable: nothing writes them any more),
  // each failed as above. (step, why)
  std::vector<std::pair<uint64_t, std::string>> take_abandoned();
  // The newest complete checkpoint written by this job (step, manifest), if any.
  const std::optional<CompletedCheckpoint>& newest() const { return newest_; }
  // The job went back to `step` (a rollback) in `generation`: the steps after it are undone, and
  // so are their checkpoints. This job's complete ones past it are set aside as step-N.undone (a
  // resume does not take one: its steps are no longer in the ledger; they go once the redo has
  // written a checkpoint at or past their step), pending ones are removed, and a report of a
  // step past it from an earlier generation, coming later, changes nothing. Returns the
  // directories set aside.
  std::vector<std::string> roll_back(uint64_t step, uint64_t generation);
  // The job reloaded its state from the checkpoint in `directory` (of `step`): its newest now.
  void reloaded(uint64_t step, const std::string& directory);
  // This coordinator took the run over after its generation `generation`: the agents that come
  // back send their recent shard reports again (a checkpoint the lost coordinator never heard
  // complete is completed here). True for such a report that is to be passed over: of an
  // earlier generation (the lost coordinator heard it; a rollback since may have undone it), or
  // of that one and complete (a manifest), covered by the newest checkpoint, or gone.
  void taken_over(uint64_t generation) { taken_over_ = generation; }
  bool heard_before(const actors::CheckpointWritten& w) const;
  // The newest step of a complete checkpoint in checkpoint.dir, of any job (an earlier run's,
  // before this one writes: its manifest is there; nothing is read).
  std::optional<uint64_t> newest_in_dir() const;

 private:
  struct Pending {
    std::map<uint32_t, actors::CheckpointShard> shards;
    uint32_t blocks = 0;
    std::string directory;
    double blocking = 0, write = 0;
  };
  void prune(uint64_t through);
  void abandon_older(uint64_t step);
  void drop_undone(uint64_t through);
  void discard(uint64_t step);
  bool ours(const std::string& directory) const;
  bool undone(uint64_t step, uint64_t generation) const;
  static constexpr const char* kUndone = ".undone";
  std::string invalid(const actors::CheckpointWritten& w, uint32_t blocks) const;

  JobConfig cfg_;
  CheckpointIdentity identity_;
  std::map<std::pair<uint64_t, uint64_t>, Pending> pending_;  // by (step, generation)
  std::set<std::pair<uint64_t, uint64_t>> failed_;            // (step, generation)
  std::map<uint64_t, CompletedCheckpoint> written_;           // by step, those not pruned
  std::optional<CompletedCheckpoint> newest_;
  // Each rollback's (step, generation): the steps after it of the generations before it.
  std::vector<std::pair<uint64_t, uint64_t>> undone_;
  std::vector<std::pair<uint64_t, std::string>> abandoned_;
  uint64_t taken_over_ = 0;  // the lost coordinator's last generation (0: none)
};

// The checkpoints under dir, newest first, each checked: manifest readable, the config hash
// equal to `hash`, every shard present with its size and checksum. The first valid one, or
// nullopt; `refused` gets "PATH: reason" for each newer one that is not valid.
struct ValidCheckpoint {
  uint64_t step = 0;
  std::string directory;
  double lr = 0;        // optimizer.lr at its step, when the manifest says (0: the config's)
  uint64_t blocks = 0;  // the model's blocks it holds (a job of another count refuses it)
};
// One checkpoint directory, checked as above: its step, or the reason it is not valid.
std::optional<ValidCheckpoint> valid_checkpoint(const std::string& directory,
                                                const CheckpointIdentity& job, std::string* why);
// at_most: the newest of a step not past it (a rollback's: the steps after the committed one are
// not in the ledger).
std::optional<ValidCheckpoint> newest_valid_checkpoint(const std::string& dir,
                                                       const CheckpointIdentity& job,
                                                       std::vector<std::string>* refused,
                                                       uint64_t at_most = UINT64_MAX);
// The steps of the checkpoint directories in dir that hold a manifest, oldest first, unchecked
// (what a run's directory says it has, read cheaply; a resume checks them).
std::vector<uint64_t> checkpoint_steps(const std::string& dir);
// The steps of the valid checkpoints in dir, oldest first (what a user may choose from).
std::vector<uint64_t> valid_checkpoint_steps(const std::string& dir, const CheckpointIdentity& job);

}  // namespace troupe::coordinator
