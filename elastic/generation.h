// The start of a generation, as pure functions: from what each member holds, the step everyone
// resumes at, which committed steps are recovered or rolled back, and which blocks of the model
// move from whom to whom. No threads, no clock reads, no I/O.
//
// The coordinator calls start_generation when the members of generation g+1 have published
// (their Holding, in rank order): it commits or rolls back the ledger accordingly and sends the
// start step with the member list. Every worker of the generation then calls plan_migration with
// the same holdings and its layout's ownership and executes its part of the result
// (workers/state_transfer.h): all members compute the same list, so no one needs to be told.
//
// Legend: a member holds block b "live" (its training buffers as of `applied`), in a "snapshot"
// (a pipeline stage's copy from before its last update, as of applied - 1) or in a "backup" (a
// stage backup received from the previous stage, or its own, as of backup_step).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace troupe::elastic {

// What a member holds when a generation forms: the steps it applied, the blocks whose state it
// holds as of that step, and those it holds as of the step before (a pipeline stage's snapshot).
// The one shape of "what a worker holds" on the wire (actors/job_codec.h) and in every decision.
struct Holding {
  uint64_t applied = 0;
  std::vector<uint32_t> held, snapshot;
  uint64_t backup_step = 0;      // stage backups (pipeline stages without a replica) ...
  std::vector<uint32_t> backup;  // ... of these blocks, as of backup_step
  bool operator==(const Holding& o) const {
    return applied == o.applied && held == o.held && snapshot == o.snapshot &&
           backup_step == o.backup_step && backup == o.backup;
  }
};

// Where a member's copy of a block as of some step lives.
enum class Copy : uint8_t { live, snapshot, backup };

// The copy of block b as of `step` that m holds, preferring live, then snapshot, then backup.
std::optional<Copy> copy_at(const Holding& m, uint32_t block, uint64_t step);

// What `said` (the holding the coordinator relays for a member) claims that `own` (what the
// member holds) does not: "" when nothing, else the first such copy, named ("block 3 live as of
// step 40"). Claiming less is fine (the coordinator takes a member whose claim it doubts as
// holding nothing); claiming more would make the member send, keep or restore state it lacks.
std::string claims_beyond(const Holding& said, const Holding& own);

// The newest step at which every block in [0, blocks) is held by some member (live at its
// applied step, in a snapshot at applied - 1, or in a backup at backup_step); nullopt if there is
// none. blocks == 0: the newest applied step (nothing to check).
std::optional<uint64_t> choose_start_step(const std::vector<Holding>& members, uint32_t blocks);

struct GenerationStart {
  bool ok = false;
  std::string reason;         // why there is no start (a block held by no member)
  uint64_t start_step = 0;    // the first step the generation runs
  uint32_t state_source = 0;  // the lowest rank that applied start_step (named in the logs)
  uint32_t lacking = 0;       // members whose applied step is not start_step
  // Steps [committed, start_step) were applied by members of the old generation but not
  // reported by all of them (the lost one took part in their reduction): commit them now.
  uint64_t recover_from = 0, recover_to = 0;
  // start_step < committed: a pipeline stage without a replica was lost and everyone resumes
  // from the stage backups; steps [start_step, committed) are redone (their ledger lines go).
  bool rolled_back = false;
};

// Where two models differ ("" when they are the same): in how many blocks they have, else the
// first block whose parameter count differs; `a` and `b` name the models in the sentence ("worker
// 1.0's model", "the job's model"). Every member of a job must build the same model: a block's size
// that differs between them is another program version, or a model that depends on local data.
constexpr const char* kSameModelEverywhere =
    "every agent must run the same program, of the same version, on the same data";
std::string model_difference(const std::vector<uint64_t>& a_params, const std::string& a,
                             const std::vector<uint64_t>& b_params, const std::string& b);

// The start of the generation whose members (by rank) hold `members`, for a model of `blocks`
// blocks, when `committed` steps are committed so far.
GenerationStart start_generation(const std::vector<Holding>& members, uint32_t blocks,
                                 uint64_t committed);

// The start when no member holds some block any more and every member reloads the model's state
// as of `step` (a checkpoint's, or 0: the seed): `members` of them lack it until they reload, and
// the steps [step, committed) are redone (rolled_back).
GenerationStart reload_start(uint64_t step, uint64_t committed, uint32_t members);
// What a member holds once it reloaded: every one of `blocks` blocks live as of `step`.
Holding reloaded(uint64_t step, uint32_t blocks);

// The blocks a rank trains in the new layout: [begin, end) (begin == end: none, a standby).
struct BlockRange {
  uint32_t begin = 0, end = 0;
  bool contains(uint32_t b) const { return b >= begin && b < end; }
};

// A member takes a block's state from its own copy (a snapshot or a backup: a roll back).
struct StateRestore {
  uint32_t rank = 0, block = 0;
  Copy copy = Copy::snapshot;
};

// Blocks one member sends another, in one batch (every buffer in flight at once).
struct StateBatch {
  uint32_t from = 0, to = 0;
  std::vector<uint32_t> blocks;  // ascending
  std::vector<Copy> copies;      // where `from` reads each block
  uint64_t bytes = 0;
};

struct Migration {
  bool ok = false;
  std::string reason;                  // why not (a block its new owner lacks is held by no one)
  std::vector<StateRestore> restores;  // by block, then rank
  // The batches in one order every member computes: executed in this order with blocking calls
  // the first unfinished batch always has both its ends at it, so nothing deadlocks.
  std::vector<StateBatch> batches;
  std::vector<uint32_t> lost_blocks;  // owned by a member that lacks them, held by no one
  uint64_t bytes_moved = 0;
};

// What moves at the start of a generation: every member (rank r) must hold, as of start_step,
// the state of every block in owned[r]. A member that holds a block live keeps it; one with a
// snapshot or backup copy restores it; any other receives it from the lowest-ranked member
// holding it as of start_step. (Spreading the sources over replicas was measured: a joiner then
// receives its batches one after the other, and the 240 MB join of bench/compare_elastic.sh
// was no faster; one batch per receiver keeps every buffer in flight at once.) block_bytes:
// each block's state size. members and owned are by rank and of equal size.
Migration plan_migration(const std::vector<Holding>& members, uint64_t start_step,
                         const std::vector<BlockRange>& owned,
                         const std::vector<uint64_t>& block_bytes);

}  // namespace troupe::elastic
