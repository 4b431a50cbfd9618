#include "elastic/generation.h"

#include <algorithm>
#include <map>

namespace troupe::elastic {
namespace {

bool has(const std::vector<uint32_t>& v, uint32_t b) {
  return std::find(v.begin(), v.end(), b) != v.end();
}

}  // namespace

std::optional<Copy> copy_at(const Holding& m, uint32_t b, uint64_t step) {
  if (m.applied == step && has(m.held, b)) return Copy::live;
  if (m.applied > 0 && m.applied - 1 == step && has(m.snapshot, b)) return Copy::snapshot;
  if (m.backup_step == step && has(m.backup, b)) return Copy::backup;
  return std::nullopt;
}

std::string claims_beyond(const Holding& said, const Holding& own) {
  auto named = [](uint32_t b, const char* copy, uint64_t step) {
    return "block " + std::to_string(b) + " " + copy + " as of step " + std::to_string(step);
  };
  for (uint32_t b : said.held)
    if (said.applied != own.applied || !has(own.held, b)) return named(b, "live", said.applied);
  for (uint32_t b : said.snapshot)
    if (said.applied == 0 || said.applied != own.applied || !has(own.snapshot, b))
      return named(b, "in a snapshot", said.applied > 0 ? said.applied - 1 : 0);
  for (uint32_t b : said.backup)
    if (said.backup_step != own.backup_step || !has(own.backup, b))
      return named(b, "in a backup", said.backup_step);
  return "";
}

std::optional<uint64_t> choose_start_step(const std::vector<Holding>& members, uint32_t blocks) {
  std::vector<uint64_t> candidates;
  for (const auto& m : members) {
    candidates.push_back(m.applied);
    if (m.applied > 0 && !m.snapshot.empty()) candidates.push_back(m.applied - 1);
    if (!m.backup.empty()) candidates.push_back(m.backup_step);
  }
  std::sort(candidates.rbegin(), candidates.rend());
  for (uint64_t s : candidates) {
    bool all = true;
    for (uint32_t b = 0; b < blocks && all; ++b) {
      bool found = false;
      for (const auto& m : members) found |= copy_at(m, b, s).has_value();
      all = found;
    }
    if (all) return s;
  }
  return std::nullopt;
}

GenerationStart reload_start(uint64_t step, uint64_t committed, uint32_t members) {
  GenerationStart g;
  g.ok = true;
  g.start_step = step;
  g.lacking = members;
  g.rolled_back = step < committed;
  return g;
}

Holding reloaded(uint64_t step, uint32_t blocks) {
  Holding h;
  h.applied = step;
  for (uint32_t b = 0; b < blocks; ++b) h.held.push_back(b);
  return h;
}

GenerationStart start_generation(const std::vector<Holding>& members, uint32_t blocks,
                                 uint64_t committed) {
  GenerationStart g;
  auto start = choose_start_step(members, blocks);
  if (!start) {
    g.reason =
        "no step at which every model block is held by a member: every member that held some of "
        "the model's state was lost (with pipelines: a stage with no replica and no backup)";
    return g;
  }
  g.ok = true;
  g.start_step = *start;
  for (uint32_t r = 0; r < members.size(); ++r)
    if (members[r].applied == g.start_step) {
      g.state_source = r;
      break;
    }
  for (const auto& m : members) g.lacking += m.applied != g.start_step;
  g.recover_from = committed;
  g.recover_to = std::max(committed, g.start_step);
  g.rolled_back = g.start_step < committed;
  return g;
}

Migration plan_migration(const std::vector<Holding>& members, uint64_t start,
                         const std::vector<BlockRange>& owned,
                         const std::vector<uint64_t>& block_bytes) {
  Migration mig;
  if (owned.size() != members.size()) {
    mig.reason = "ownership for " + std::to_string(owned.size()) + " ranks, holdings for " +
                 std::to_string(members.size());
    return mig;
  }
  const uint32_t n = uint32_t(members.size()), blocks = uint32_t(block_bytes.size());
  std::map<std::pair<uint32_t, uint32_t>, size_t> batch_of;  // (from, to) -> index in batches
  for (uint32_t b = 0; b < blocks; ++b) {
    for (uint32_t r = 0; r < n; ++r) {
      if (!owned[r].contains(b)) continue;
      auto own = copy_at(members[r], b, start);
      if (own == Copy::live) continue;
      if (own) {
        mig.restores.push_back({r, b, *own});
        continue;
      }
      int src = -1;
      for (uint32_t h = 0; h < n && src < 0; ++h)
        if (copy_at(members[h], b, start)) src = int(h);
      if (src < 0) {
        if (!has(mig.lost_blocks, b)) mig.lost_blocks.push_back(b);
        continue;
      }
      const uint32_t from = uint32_t(src);
      auto [it, fresh] = batch_of.try_emplace({from, r}, mig.batches.size());
      if (fresh) mig.batches.push_back({from, r, {}, {}, 0});
      StateBatch& batch = mig.batches[it->second];
      batch.blocks.push_back(b);
      batch.copies.push_back(*copy_at(members[from], b, start));
      batch.bytes += block_bytes[b];
      mig.bytes_moved += block_bytes[b];
    }
  }
  if (!mig.lost_blocks.empty()) {
    mig.reason = "block " + std::to_string(mig.lost_blocks.front()) +
                 " is held by no member at step " + std::to_string(start) +
                 " (its pipeline stage had no replica and no backup)";
    return mig;
  }
  mig.ok = true;
  return mig;
}

std::string model_difference(const std::vector<uint64_t>& a_params, const std::string& a,
                             const std::vector<uint64_t>& b_params, const std::string& b) {
  if (a_params.size() != b_params.size())
    return a + " has " + std::to_string(a_params.size()) + " blocks, " + b + " has " +
           std::to_string(b_params.size());
  for (size_t i = 0; i < a_params.size(); ++i)
    if (a_params[i] != b_params[i])
      return "block " + std::to_string(i) + " has " + std::to_string(a_params[i]) +
             " parameters in " + a + ", " + std::to_string(b_params[i]) + " in " + b;
  return "";
}

}  // namespace troupe::elastic
