#include "elastic/data_plane.h"

#include <map>

namespace troupe::elastic {
namespace {

// Why the device plane cannot serve these members; empty when it can.
std::string why_not_device(const std::vector<MemberDevice>& members) {
  if (members.empty()) return "no members";
  std::map<std::string, size_t> first_on;  // device -> rank
  for (size_t r = 0; r < members.size(); ++r) {
    const MemberDevice& m = members[r];
    if (!m.gpu()) return "rank " + std::to_string(r) + " computes on the CPU";
    auto [at, fresh] = first_on.emplace(m.device, r);
    if (!fresh)
      return "ranks " + std::to_string(at->second) + " and " + std::to_string(r) +
             " share one GPU (" + m.device + "; NCCL needs a GPU per rank)";
  }
  return "";
}

}  // namespace

PlaneChoice choose_data_plane(const std::string& backend,
                              const std::vector<MemberDevice>& members) {
  if (backend == "ucx") return {DataPlane::host_staged, false, "parallel.backend = \"ucx\""};
  const std::string why_not = why_not_device(members);
  if (why_not.empty()) {
    return {DataPlane::device, false,
            members.size() == 1 ? "NCCL: one member on its GPU"
                                : "NCCL: every member on a GPU of its own"};
  }
  if (backend == "nccl")
    return {DataPlane::host_staged, true, "parallel.backend = \"nccl\", and " + why_not};
  return {DataPlane::host_staged, false, "host-staged over UCX: " + why_not};
}

}  // namespace troupe::elastic
