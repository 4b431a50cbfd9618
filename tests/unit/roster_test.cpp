#include "coordinator/roster.h"

#include <gtest/gtest.h>

namespace troupe::coordinator {
namespace {

actors::Join join_of(const std::string& name, uint32_t pid, bool rejoin) {
  actors::Join j;
  j.agent_name = name;
  j.host = "h";
  j.host_identity = "boot/ns";
  j.pid = pid;
  j.devices = {"cpu:0"};
  j.rejoin = rejoin;
  return j;
}

// A rejoin from an agent this coordinator never had is an adoption (a take-over's); the same
// agent (name, pid, host) coming back is what it was before: a launcher's own agent is not
// adopted, an adopted one stays adopted.
TEST(Roster, ARejoinIsAnAdoptionOnlyForAnAgentNotHereBefore) {
  Roster r;
  EXPECT_FALSE(r.admit(1, join_of("agent-0", 100, false)).adopted);
  EXPECT_TRUE(r.admit(2, join_of("agent-1", 200, true)).adopted);  // (a take-over's)
  r.at(0).alive = false;
  r.at(1).alive = false;
  const Agent& own_back = r.admit(3, join_of("agent-0", 100, true));
  EXPECT_EQ(own_back.id, 2u);
  EXPECT_FALSE(own_back.adopted);
  EXPECT_TRUE(r.admit(4, join_of("agent-1", 200, true)).adopted);
  // Another process under the launcher's name (a restart: another pid) that says rejoin.
  EXPECT_TRUE(r.admit(5, join_of("agent-0", 101, true)).adopted);
}

}  // namespace
}  // namespace troupe::coordinator
