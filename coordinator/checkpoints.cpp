#include "coordinator/checkpoints.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <type_traits>
#include <variant>

#include "comm/checksum.h"

namespace troupe::coordinator {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
constexpr const char* kFormat = "troupe-checkpoint-1";

std::string hex(uint64_t v) {
  char s[17];
  std::snprintf(s, sizeof s, "%016llx", (unsigned long long)v);
  return s;
}

// Writes text to path through path.tmp: written, fsynced, renamed, the directory fsynced.
void write_durably(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  errno = 0;
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok =
      fd >= 0 && ::write(fd, text.data(), text.size()) == ssize_t(text.size()) && ::fsync(fd) == 0;
  if (fd >= 0) ::close(fd);
  ok = ok && ::rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) {
    const std::string why = errno != 0 ? std::strerror(errno) : "a short write (disk full?)";
    ::unlink(tmp.c_str());
    throw std::runtime_error("cannot write the checkpoint manifest " + path + ": " + why);
  }
  int dfd = ::open(fs::path(path).parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

// The checkpoint directories under dir (step-N, or step-N followed by `suffix`), by step.
std::map<uint64_t, fs::path> checkpoint_dirs(const std::string& dir,
                                             const std::string& suffix = "") {
  std::map<uint64_t, fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() != 13 + suffix.size() || name.rfind("step-", 0) != 0 || !e.is_directory() ||
        name.compare(13, std::string::npos, suffix) != 0)
      continue;
    const std::string digits = name.substr(5, 8);
    if (digits.find_first_not_of("0123456789") != std::string::npos) continue;
    out[std::stoull(digits)] = e.path();
  }
  return out;
}

// Field `key` of the JSON object `o` (what `where` names) into `out`, or why not: missing, or of
// another type than the writer's (a manifest edited by hand, damaged, another program's).
template <class T>
std::string field(const json& o, const char* key, const char* where, T& out) {
  const auto it = o.find(key);
  if (it == o.end()) return std::string(where) + " has no \"" + key + "\"";
  const bool text = std::is_same_v<T, std::string>, real = std::is_floating_point_v<T>;
  if (text ? !it->is_string() : real ? !it->is_number() : !it->is_number_unsigned())
    return std::string(where) + "'s \"" + key + "\" is not " +
           (text   ? "a string"
            : real ? "a number"
                   : "a non-negative integer");
  out = it->get<T>();
  return "";
}

// "" when the shard `s` of the manifest is in dir, whole and intact, and the only one of its block
// (`seen`: the blocks so far), else why not.
std::string check_shard(const fs::path& dir, const json& s, std::vector<bool>& seen) {
  if (!s.is_object()) return "a shard of the manifest is not an object";
  std::string file, checksum;
  uint64_t block = 0, bytes = 0;
  std::string why = field(s, "block", "a shard", block);
  if (why.empty()) why = field(s, "file", "a shard", file);
  if (why.empty()) why = field(s, "bytes", "a shard", bytes);
  if (why.empty()) why = field(s, "checksum", "a shard", checksum);
  if (!why.empty()) return why;
  if (block >= seen.size() || seen[block])
    return "the manifest lists block " + std::to_string(block) + " twice or past its blocks";
  seen[block] = true;
  if (file != actors::shard_file_name(uint32_t(block)))
    return "the manifest's shard of block " + std::to_string(block) + " names " + file + ", not " +
           actors::shard_file_name(uint32_t(block));
  std::error_code ec;  // (a FIFO would block the read; a directory throws from it)
  if (fs::exists(dir / file, ec) && !fs::is_regular_file(dir / file, ec))
    return (dir / file).string() + " is not a regular file";
  std::ifstream f(dir / file, std::ios::binary);
  if (!f) return (dir / file).string() + " is missing";
  // In pieces: a block's shard (its parameters and optimizer moments) may be gigabytes, and the
  // coordinator checks it while the job waits.
  std::vector<char> piece(size_t(1) << 20);
  uint64_t size = 0, sum = comm::fnv1a(nullptr, 0);
  while (f.read(piece.data(), std::streamsize(piece.size())) || f.gcount() > 0) {
    sum = comm::fnv1a(reinterpret_cast<const uint8_t*>(piece.data()), size_t(f.gcount()), sum);
    size += uint64_t(f.gcount());
  }
  if (f.bad()) return (dir / file).string() + " cannot be read";
  if (size != bytes)
    return (dir / file).string() + " has " + std::to_string(size) + " bytes, the manifest says " +
           std::to_string(bytes);
  if (hex(sum) != checksum) return (dir / file).string() + " does not match its checksum (damaged)";
  return "";
}

// The manifest's optimizer.lr when it says one (0: the config's), or why it is not a number.
std::string manifest_lr(const json& m, double& lr) {
  if (!m.contains("optimizer")) return "";
  if (!m["optimizer"].is_object()) return "the manifest's \"optimizer\" is not an object";
  if (!m["optimizer"].contains("lr")) return "";
  std::string why = field(m["optimizer"], "lr", "the manifest's optimizer", lr);
  if (why.empty() && lr != 0 && !(lr >= 1e-12 && lr <= 1e3))  // (a resume takes it)
    why = "the manifest's optimizer.lr " + json(lr).dump() + " is outside [1e-12, 1000]";
  return why;
}

// The fields of the job's identity that differ from the manifest's ("data.eval_fraction: 0.05 in
// the checkpoint, 0 now; "), where both are known.
std::string changes(const json& manifest, const CheckpointIdentity& job) {
  const auto theirs = manifest.find("config");
  const json ours = json::parse(job.config, nullptr, false);
  if (theirs == manifest.end() || !theirs->is_object() || !ours.is_object()) return "";
  std::string out;
  auto differs = [&](const std::string& key, const json* a, const json* b) {
    out += key + ": " + (a ? a->dump() : "unset") + " in the checkpoint, " +
           (b ? b->dump() : "unset") + " now; ";
  };
  for (const auto& [key, value] : theirs->items()) {
    const auto it = ours.find(key);
    if (it == ours.end())
      differs(key, &value, nullptr);
    else if (*it != value)
      differs(key, &value, &*it);
  }
  for (const auto& [key, value] : ours.items())
    if (!theirs->contains(key)) differs(key, nullptr, &value);
  return out;
}

// A manifest written before the data's content was in the identity, naming the job's data by
// another text of the same paths (relative, where the job names them absolute: its run's
// config.toml does since): its hash with its own texts of the paths.
bool same_paths(const json& config, const std::string& hash, const CheckpointIdentity& job) {
  const auto path = config.find("path");
  if (path == config.end() || !path->is_string() || job.path_config.empty() ||
      absolute_path(path->get<std::string>()) != job.data_path)
    return false;
  json ours = json::parse(job.path_config, nullptr, false);
  if (!ours.is_object()) return false;
  ours["path"] = *path;
  if (const auto mix = config.find("mix"); mix != config.end() && mix->is_object()) {
    std::vector<std::string> sets;  // (a json object's keys come sorted, as a std::map's)
    for (const auto& [set, weight] : mix->items()) sets.push_back(absolute_path(set));
    if (sets != job.mix_sets) return false;
    ours["mix"] = *mix;
  }
  if (!config.contains("tokenizer")) ours.erase("tokenizer");
  const std::string text = ours.dump();
  return hex(comm::fnv1a(reinterpret_cast<const uint8_t*>(text.data()), text.size())) == hash;
}

// A manifest written before the program's kinds had some of their keys: the job's identity without
// those of them at their defaults (a key added since, left at its default, changes nothing the
// checkpoint holds) has its hash.
bool same_but_new_keys(const json& config, const std::string& hash, const CheckpointIdentity& job) {
  const json defaults = json::parse(job.defaults.empty() ? "{}" : job.defaults, nullptr, false);
  json ours = json::parse(job.config, nullptr, false);
  if (!defaults.is_object() || defaults.empty() || !ours.is_object()) return false;
  for (const auto& [table, keys] : defaults.items()) {
    const auto theirs = config.find(table);
    for (const auto& [key, value] : keys.items())
      if (theirs == config.end() || !theirs->is_object() || !theirs->contains(key))
        ours[table].erase(key);
    if (ours[table].empty() && !config.contains(table)) ours.erase(table);
  }
  const std::string text = ours.dump();
  return hex(comm::fnv1a(reinterpret_cast<const uint8_t*>(text.data()), text.size())) == hash;
}

// Whether a manifest's config hash is the job's: its hash; an older Troupe's (a manifest without
// the config fields: its hash left the mix and the held-out fraction out); one written before
// a token data set's tokenizer was part of it (its config has no "tokenizer"); or one written
// before the data's content was (no "data_digest": the path's text, as given, was).
bool same_job(const json& m, const std::string& hash, const CheckpointIdentity& job) {
  if (hash == job.hash) return true;
  if (m.contains("config") && m["config"].is_object() && same_but_new_keys(m["config"], hash, job))
    return true;
  if (m.contains("config") && m["config"].is_object() && !m["config"].contains("data_digest") &&
      !job.path_hash.empty() && (hash == job.path_hash || same_paths(m["config"], hash, job)))
    return true;
  if (!m.contains("config")) return !job.older_hash.empty() && hash == job.older_hash;
  return m["config"].is_object() && !m["config"].contains("tokenizer") &&
         !job.untokenized_hash.empty() && hash == job.untokenized_hash;
}

// "" when the checkpoint in dir is complete and intact (its step, lr and blocks into `c`), else
// why not. c.step: the step its name says (UINT64_MAX: take the manifest's).
std::string check(const fs::path& dir, const CheckpointIdentity& job, ValidCheckpoint& c) {
  const fs::path manifest = dir / "manifest.json";
  std::error_code ec;  // (a FIFO would block the read; a directory throws from it)
  if (fs::exists(manifest, ec) && !fs::is_regular_file(manifest, ec))
    return "its manifest.json is not a regular file";
  std::ifstream in(manifest);
  if (!in) return "no manifest (a checkpoint still being written, or cut short by a crash)";
  const json m = json::parse(in, nullptr, false);
  if (m.is_discarded() || !m.is_object()) return "the manifest is not JSON";
  std::string format, config_hash;
  uint64_t says = 0, blocks = 0;
  std::string why = field(m, "format", "the manifest", format);
  if (why.empty() && format != kFormat)
    why = "the manifest's format is not " + std::string(kFormat);
  if (why.empty()) why = field(m, "step", "the manifest", says);
  if (why.empty() && c.step != UINT64_MAX && says != c.step)
    why = "the manifest's step (" + std::to_string(says) + ") is not the directory's (" +
          std::to_string(c.step) + ")";
  if (why.empty()) why = field(m, "config_hash", "the manifest", config_hash);
  if (why.empty() && !same_job(m, config_hash, job))
    why = "it belongs to another model, data or seed (" + changes(m, job) + "config hash " +
          config_hash + ", this job's " + job.hash + ")";
  if (why.empty()) why = manifest_lr(m, c.lr);
  if (why.empty()) why = field(m, "blocks", "the manifest", blocks);
  if (why.empty() && job.blocks != 0 && blocks != job.blocks)
    why = "it holds " + std::to_string(blocks) + " blocks of the model, which has " +
          std::to_string(job.blocks);
  if (!why.empty()) return why;
  const auto shards = m.find("shards");
  if (shards == m.end() || !shards->is_array() || shards->size() != blocks || shards->empty())
    return "the manifest does not list one shard per block";
  std::vector<bool> seen(blocks);
  for (const auto& s : *shards)
    if (std::string bad = check_shard(dir, s, seen); !bad.empty()) return bad;
  c.step = says;
  c.blocks = blocks;
  return "";
}

}  // namespace

std::string checkpoint_config_hash(const JobConfig& c) { return checkpoint_identity(c).hash; }

CheckpointIdentity checkpoint_identity(const JobConfig& config) {
  // Digests of other data than the config's now (a program set its data after parsing): again.
  JobConfig fresh;
  const bool stale = config.digest_source != data_digest_source(config);
  if (stale) {
    fresh = config;
    fill_data_digests(fresh);
  }
  const JobConfig& c = stale ? fresh : config;
  json j = {{"model", c.model_kind}, {"hidden", c.hidden},      {"inputs", c.inputs},
            {"classes", c.classes},  {"layers", c.layers},      {"d_model", c.d_model},
            {"heads", c.heads},      {"context", c.context},    {"tied_head", c.tied_head},
            {"data", c.data_kind},   {"path", c.data_path},     {"samples", c.samples},
            {"seed", c.seed},        {"batch", c.global_batch}, {"optimizer", c.optimizer}};
  // A program's own kinds' keys, a mix and a held-out fraction only when there are (the hashes
  // of jobs without them stay what they were).
  json defaults = json::object();
  for (const auto& [table, options, given] :
       {std::tuple{"model_options", &c.model_options, &c.model_defaults},
        std::tuple{"data_options", &c.data_options, &c.data_defaults}})
    for (const auto& [key, value] : *options) {
      std::visit([&, table = table, key = key](const auto& v) { j[table][key] = v; }, value);
      if (const auto d = given->find(key); d != given->end() && d->second == value)
        defaults[table][key] = j[table][key];
    }
  auto hash_of = [](const std::string& text) {
    return hex(comm::fnv1a(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  };
  const std::string before = hash_of(j.dump());  // (what an older Troupe's manifests say)
  if (!c.data_mix.empty()) j["mix"] = c.data_mix;
  if (c.eval_fraction != 0) j["eval_fraction"] = c.eval_fraction;
  const std::string untokenized = hash_of(j.dump());
  // (The token data set's tokenizer: another one of the same vocabulary size trained on as the
  // old ids would change what every embedding row means.)
  if (!c.data_tokenizer.empty()) j["tokenizer"] = c.data_tokenizer;
  std::string by_path_config = j.dump();
  const std::string by_path = hash_of(by_path_config);
  // The data by its content, not the path's text (a checkpoint written before: by_path).
  if (!c.data_digest.empty()) {
    j.erase("path");
    j["data_digest"] = c.data_digest;
  }
  const bool mix_known =
      !c.mix_digests.empty() && c.mix_digests.size() == c.data_mix.size() &&
      std::none_of(c.mix_digests.begin(), c.mix_digests.end(), [](auto& d) { return d.empty(); });
  if (mix_known) {
    j["mix"] = json::array();
    size_t i = 0;  // (in the mix's order: the sampler's)
    for (const auto& [set, weight] : c.data_mix) j["mix"].push_back({c.mix_digests[i++], weight});
  }
  std::string text = j.dump();
  const std::string hash = hash_of(text);  // (before text moves: arguments have no order)
  CheckpointIdentity id(hash, std::move(text));
  if (!defaults.empty()) id.defaults = defaults.dump();
  if (before != id.hash) id.older_hash = before;
  if (untokenized != id.hash) id.untokenized_hash = untokenized;
  if (by_path != id.hash) {
    id.path_hash = by_path;
    id.path_config = std::move(by_path_config);
    id.data_path = absolute_path(c.data_path);
    for (const auto& [set, weight] : c.data_mix) id.mix_sets.push_back(absolute_path(set));
  }
  id.blocks = c.block_params.empty() ? c.model_blocks : c.block_params.size();  // (0: unknown)
  return id;
}

bool take_data_identity(JobConfig& cfg, const std::string& manifest) {
  std::error_code ec;
  if (manifest.empty() || !fs::is_regular_file(manifest, ec)) return false;
  std::ifstream in(manifest);
  const json m = json::parse(in, nullptr, false);
  if (m.is_discarded() || !m.is_object() || !m.contains("config") || !m["config"].is_object())
    return false;
  const json& c = m["config"];
  const bool mix = c.contains("mix") && c["mix"].is_array();
  if (!c.contains("data_digest") && !mix) return false;
  auto text = [&](const char* key) {
    return c.contains(key) && c[key].is_string() ? c[key].get<std::string>() : std::string();
  };
  cfg.data_digest = text("data_digest");
  cfg.data_tokenizer = text("tokenizer");
  cfg.mix_digests.clear();
  if (mix)
    for (const auto& d : c["mix"])
      if (d.is_array() && !d.empty() && d[0].is_string())
        cfg.mix_digests.push_back(d[0].get<std::string>());
  cfg.digest_source = data_digest_source(cfg);  // (not computed again from the data)
  return true;
}

std::string newest_manifest(const std::string& dir) {
  const auto dirs = checkpoint_dirs(dir);
  std::error_code ec;
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it)
    if (fs::is_regular_file(it->second / "manifest.json", ec))
      return (it->second / "manifest.json").string();
  return "";
}

Checkpoints::Checkpoints(const JobConfig& cfg) : cfg_(cfg), identity_(checkpoint_identity(cfg)) {}

// "" when a worker's report of its shards is one the manifest may list (every shard a block of
// the checkpoint under its own name, in this job's checkpoint directory, of as many blocks as the
// other writers said), else why not (a worker's bug or another version's).
std::string Checkpoints::invalid(const actors::CheckpointWritten& w, uint32_t blocks) const {
  const std::string who =
      "rank " + std::to_string(w.rank) + "'s shards of step " + std::to_string(w.step);
  if (w.blocks == 0 || (blocks != 0 && w.blocks != blocks))
    return who + " are of " + std::to_string(w.blocks) + " blocks, the others' of " +
           std::to_string(blocks);
  for (const auto& s : w.shards)
    if (s.block >= w.blocks || s.file != actors::shard_file_name(s.block))
      return who + ": block " + std::to_string(s.block) + " in " + s.file;
  const std::string name = actors::checkpoint_dir_name(w.step);
  std::error_code ec;
  const fs::path dir(w.directory);
  if (dir.filename() != name || !fs::equivalent(dir.parent_path(), cfg_.checkpoint_dir, ec))
    return who + " are in " + w.directory + ", not " + cfg_.checkpoint_dir + "/" + name;
  return "";
}

std::optional<CompletedCheckpoint> Checkpoints::add(const actors::CheckpointWritten& w,
                                                    uint32_t world_size, const std::string& plan,
                                                    double lr) {
  if (undone(w.step, w.generation))
    return std::nullopt;                        // (roll_back cleaned up; the redo's
                                                // writers may be writing there now)
  if (failed_.count({w.step, w.generation})) {  // (a slower writer's shards of a failed one)
    discard(w.step);
    return std::nullopt;
  }
  auto at = pending_.find({w.step, w.generation});
  if (std::string why = invalid(w, at == pending_.end() ? 0 : at->second.blocks); !why.empty())
    throw std::runtime_error(why);
  // (By step and generation: a step redone after a rollback may be written again by other
  // members, whose blocks need not match the first writers'.)
  Pending& p = pending_[{w.step, w.generation}];
  for (const auto& s : w.shards) p.shards[s.block] = s;
  p.blocks = w.blocks;
  p.directory = w.directory;
  p.blocking = std::max(p.blocking, w.blocking_seconds);
  p.write = std::max(p.write, w.write_seconds);
  if (p.blocks == 0 || p.shards.size() < p.blocks) return std::nullopt;
  json shards = json::array();
  for (const auto& [b, s] : p.shards)
    shards.push_back(
        {{"block", b}, {"file", s.file}, {"bytes", s.bytes}, {"checksum", hex(s.checksum)}});
  json m = {{"format", kFormat},
            {"job", cfg_.name},
            {"step", w.step},
            {"config_hash", identity_.hash},
            {"config", json::parse(identity_.config)},
            {"data",
             {{"seed", cfg_.seed},
              {"global_batch", cfg_.global_batch},
              {"cursor", w.step * uint64_t(cfg_.global_batch)}}},
            {"ledger", {{"committed_steps", w.step}}},
            {"layout", {{"world_size", world_size}, {"plan", plan}}},
            {"optimizer", {{"lr", lr}}},
            {"blocks", p.blocks},
            {"shards", shards}};
  const std::string path = p.directory + "/manifest.json";
  write_durably(path, m.dump(1) + "\n");
  CompletedCheckpoint done{w.step, path, p.blocking, p.write};
  if (!newest_ || newest_->step < w.step) newest_ = done;
  written_[w.step] = done;
  abandon_older(w.step);
  pending_.erase(pending_.begin(), pending_.upper_bound({w.step, UINT64_MAX}));
  prune(newest_->step);
  drop_undone(newest_->step);
  return done;
}

std::vector<std::string> Checkpoints::roll_back(uint64_t step, uint64_t generation) {
  undone_.emplace_back(step, generation);
  std::set<uint64_t> writing;  // (their shards written so far go)
  for (auto it = pending_.upper_bound({step, UINT64_MAX}); it != pending_.end();)
    writing.insert(it->first.first), it = pending_.erase(it);
  written_.erase(written_.upper_bound(step), written_.end());
  newest_.reset();
  if (!written_.empty()) newest_ = written_.rbegin()->second;
  std::vector<std::string> set_aside;
  std::error_code ec;
  for (const auto& [s, path] : checkpoint_dirs(cfg_.checkpoint_dir)) {
    if (s <= step) continue;
    if (!fs::exists(path / "manifest.json", ec)) {
      if (writing.count(s)) fs::remove_all(path, ec);
      continue;
    }
    if (!ours(path.string())) continue;
    const fs::path aside = path.string() + kUndone;
    fs::remove_all(aside, ec);
    fs::rename(path, aside, ec);
    if (!ec) set_aside.push_back(aside.string());
  }
  return set_aside;
}

void Checkpoints::reloaded(uint64_t step, const std::string& directory) {
  CompletedCheckpoint c{step, directory + "/manifest.json", 0, 0};
  written_[step] = c;
  newest_ = c;
}

bool Checkpoints::heard_before(const actors::CheckpointWritten& w) const {
  if (taken_over_ == 0 || w.generation > taken_over_) return false;
  if (w.generation < taken_over_) return true;
  std::error_code ec;
  return (newest_ && w.step <= newest_->step) || !fs::is_directory(w.directory, ec) ||
         fs::exists(w.directory + "/manifest.json", ec);
}

bool Checkpoints::undone(uint64_t step, uint64_t generation) const {
  for (const auto& [after, before] : undone_)
    if (step > after && generation < before) return true;
  return false;
}

std::optional<uint64_t> Checkpoints::newest_in_dir() const {
  std::optional<uint64_t> newest;
  std::error_code ec;
  for (const auto& [step, path] : checkpoint_dirs(cfg_.checkpoint_dir))
    if (fs::exists(path / "manifest.json", ec)) newest = step;
  return newest;
}

// A complete checkpoint of this job's config in `directory` (its manifest says so; the shards
// are not read): not a checkpoint of another job sharing checkpoint.dir, nor one cut short.
bool Checkpoints::ours(const std::string& directory) const {
  std::error_code ec;
  if (!fs::is_regular_file(directory + "/manifest.json", ec)) return false;
  std::ifstream in(directory + "/manifest.json");
  const json m = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!m.is_object() || !m.contains("config_hash") || !m["config_hash"].is_string()) return false;
  return same_job(m, m["config_hash"].get<std::string>(), identity_);
}

// The incomplete checkpoints of steps before `step`, which just completed: a writer's shards of
// theirs come before its shards of a later step, so those missing now never come.
void Checkpoints::abandon_older(uint64_t step) {
  std::vector<std::pair<uint64_t, uint64_t>> older;
  for (auto it = pending_.begin(); it != pending_.end() && it->first.first < step; ++it) {
    std::string missing;
    for (uint32_t b = 0; b < it->second.blocks; ++b)
      if (!it->second.shards.count(b)) missing += (missing.empty() ? "" : ", ") + std::to_string(b);
    const bool lost_with_it = it->first.second <= taken_over_;
    abandoned_.emplace_back(
        it->first.first,
        "the shards of block(s) " + missing + " (generation " + std::to_string(it->first.second) +
            ") had not come when the checkpoint at step " + std::to_string(step) +
            " was complete: " +
            (lost_with_it ? "their writer's report went to the coordinator that was lost, and "
                            "its agent did not come back to send it again"
                          : "their writer was lost (or left before it wrote them)"));
    older.push_back(it->first);
  }
  for (const auto& [s, g] : older) fail(s, g);
}

std::vector<std::pair<uint64_t, std::string>> Checkpoints::take_abandoned() {
  return std::exchange(abandoned_, {});
}

bool Checkpoints::fail(uint64_t step, uint64_t generation) {
  if (undone(step, generation)) return false;  // (its directory was set aside or removed)
  const bool first = failed_.insert({step, generation}).second;
  pending_.erase({step, generation});
  discard(step);
  return first;
}

void Checkpoints::discard(uint64_t step) {
  const auto others = pending_.lower_bound({step, 0});
  if (others != pending_.end() && others->first.first == step) return;  // another generation's
  const fs::path dir = fs::path(cfg_.checkpoint_dir) / actors::checkpoint_dir_name(step);
  std::error_code ec;
  if (!fs::exists(dir / "manifest.json", ec)) fs::remove_all(dir, ec);
}

// Keeps the newest checkpoint.keep complete checkpoints of this job up to `through` (the one
// just written); older directories of this job, and incomplete ones nobody writes, go. What is
// newer stays (a newer incomplete one's shards may still be coming; a damaged one a resume
// skipped is written again when the job gets there), and so does another job's checkpoint in a
// shared checkpoint.dir: neither counts, so neither pushes this job's newest out.
void Checkpoints::prune(uint64_t through) {
  auto dirs = checkpoint_dirs(cfg_.checkpoint_dir);
  std::vector<uint64_t> complete;
  std::set<uint64_t> foreign;
  for (const auto& [step, path] : dirs) {
    if (step > through || !fs::exists(path / "manifest.json")) continue;
    if (ours(path.string()))
      complete.push_back(step);
    else
      foreign.insert(step);
  }
  if (complete.size() <= size_t(cfg_.checkpoint_keep)) return;
  const uint64_t oldest_kept = complete[complete.size() - size_t(cfg_.checkpoint_keep)];
  auto writing = [&](uint64_t step) {
    const auto it = pending_.lower_bound({step, 0});
    return it != pending_.end() && it->first.first == step;
  };
  std::error_code ec;
  for (const auto& [step, path] : dirs)
    if (step < oldest_kept && !foreign.count(step) && !writing(step)) fs::remove_all(path, ec);
  written_.erase(written_.begin(), written_.lower_bound(oldest_kept));
}

// The checkpoints a rollback set aside (step-N.undone) go once the job has written one of a step
// at or past theirs again: the redo replaced them.
void Checkpoints::drop_undone(uint64_t through) {
  std::error_code ec;
  for (const auto& [step, path] : checkpoint_dirs(cfg_.checkpoint_dir, kUndone))
    if (step <= through) fs::remove_all(path, ec);
}

std::optional<ValidCheckpoint> newest_valid_checkpoint(const std::string& dir,
                                                       const CheckpointIdentity& job,
                                                       std::vector<std::string>* refused,
                                                       uint64_t at_most) {
  auto dirs = checkpoint_dirs(dir);
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    if (it->first > at_most) continue;
    ValidCheckpoint c{it->first, it->second.string()};
    std::string why = check(it->second, job, c);
    if (why.empty()) return c;
    if (refused) refused->push_back(it->second.string() + ": " + why);
  }
  return std::nullopt;
}

std::vector<uint64_t> checkpoint_steps(const std::string& dir) {
  std::vector<uint64_t> out;
  std::error_code ec;
  for (const auto& [step, path] : checkpoint_dirs(dir))
    if (fs::is_regular_file(path / "manifest.json", ec)) out.push_back(step);
  return out;
}

std::vector<uint64_t> valid_checkpoint_steps(const std::string& dir,
                                             const CheckpointIdentity& job) {
  std::vector<uint64_t> steps;
  for (const auto& [step, path] : checkpoint_dirs(dir)) {
    ValidCheckpoint c{step, path.string()};
    if (check(path, job, c).empty()) steps.push_back(step);
  }
  return steps;
}

std::optional<ValidCheckpoint> valid_checkpoint(const std::string& directory,
                                                const CheckpointIdentity& job, std::string* why) {
  ValidCheckpoint c{UINT64_MAX, directory};
  std::string reason = check(directory, job, c);
  if (reason.empty()) return c;
  if (why) *why = reason;
  return std::nullopt;
}

}  // namespace troupe::coordinator
