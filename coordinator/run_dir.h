// The run directory of one job: where it is (under runs/, whatever the job's name), and who owns
// it. A job claims its directory for its whole life with a lock (DIR/run.lock, flock(2), with the
// owner's job, pid, host and start time written in it); a second job is refused with the name of
// the first, and a directory that already holds a job's logs (events.jsonl) is refused: results
// are never interleaved or appended to, except by the same job resumed from its checkpoints
// (`troupe run --resume RUN_DIR`).
//
// Thread-safety: none; one owner.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>

namespace troupe::coordinator {

class RunDirError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "runs/NAME-YYYYMMDD-HHMMSS-PID", with NAME reduced to letters, digits, '.', '-' and '_' (every
// other byte becomes '_'), so that the directory stays under runs/.
std::string default_run_dir(const std::string& job_name);

// Whether a live job holds the run directory at path (its run.lock).
bool run_dir_in_use(const std::string& path);

class RunDirectory {
 public:
  // Creates the directory (and its parents) if needed and locks it for job_name. Throws
  // RunDirError: in use by another job (named), holds an earlier job's logs, cannot be created.
  // resuming: the directory's earlier logs are the same job's, continued (troupe run --resume).
  RunDirectory(const std::string& path, const std::string& job_name, bool resuming = false);
  ~RunDirectory();  // releases the lock (the file stays, naming the last owner)
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

  const std::string& path() const { return path_; }

  // Claims checkpoint.dir `dir` (created if needed) for its life (DIR/.claim.lock, as run.lock;
  // the run's own checkpoints/ too, which another job may name): two jobs writing in one
  // directory write the same step-N directories (their shards and manifests mixed), and a job of
  // the same configuration prunes the other's as its own. Throws RunDirError when a live job holds
  // it (named), or when `earlier` (given for a run that does not go on with that directory's
  // history; asked once the lock is held) finds a complete checkpoint there: a new run would
  // overwrite an earlier run's.
  void claim_checkpoints(const std::string& dir,
                         const std::function<std::optional<uint64_t>()>& earlier);

 private:
  std::string owner() const;  // who holds a lock: the job, its pid and host, since when
  std::string path_, job_name_;
  int lock_fd_ = -1, checkpoints_fd_ = -1;
};

}  // namespace troupe::coordinator
