// Supervision: a child that keeps crashing is restarted N times, then the failure escalates to
// the supervisor's parent; a child that exits normally is not restarted.
#include "actors/supervisor.h"

#include <gtest/gtest.h>

#include "actors/messages.h"

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;
using crash_atom = caf::atom_constant<caf::atom("crash")>;
using ping_atom = caf::atom_constant<caf::atom("ping")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;

// A child that throws when told to crash (like a worker hitting a CUDA error).
caf::behavior fragile(caf::event_based_actor* self) {
  return {
      [](crash_atom) { throw std::runtime_error("injected failure"); },
      [self](stop_atom) { self->quit(); },
      [](ping_atom) { return std::string("pong"); },
  };
}

struct SupervisorTest : ::testing::Test {
  SupervisorTest() : system(configured()), self(system) {}
  static caf::actor_system_config& configured() {
    static caf::actor_system_config cfg;
    static bool once = [] {
      configure_system(cfg);
      cfg.add_message_type<ChildRestarted>("child_restarted");
      return true;
    }();
    (void)once;
    return cfg;
  }
  caf::actor child_of(const caf::actor& sup) {
    caf::actor out;
    self->request(sup, 5s, child_atom::value, std::string("fragile"))
        .receive([&](caf::actor& a) { out = a; },
                 [&](caf::error& e) { ADD_FAILURE() << system.render(e); });
    return out;
  }
  caf::actor_system system;
  caf::scoped_actor self;
};

TEST_F(SupervisorTest, RestartsUpToTheIntensityThenEscalates) {
  std::vector<ChildSpec> children{
      {"fragile", [](caf::actor_system& s) { return s.spawn(fragile); }}};
  auto sup = spawn_supervisor(system, children, SupervisorOptions{3, 10000ms}, self);
  self->monitor(sup);
  for (int i = 1; i <= 3; ++i) {
    auto child = child_of(sup);
    ASSERT_TRUE(child);
    self->send(child, crash_atom::value);
    bool restarted = false;
    self->receive(
        [&](ChildRestarted& r) {
          EXPECT_EQ(r.name, "fragile");
          EXPECT_EQ(r.restarts, i);
          restarted = true;
        },
        caf::after(5s) >> [] {});
    ASSERT_TRUE(restarted) << "restart " << i;
    // The restarted child serves.
    std::string answer;
    self->request(child_of(sup), 5s, ping_atom::value)
        .receive([&](std::string& s) { answer = s; }, [](caf::error&) {});
    EXPECT_EQ(answer, "pong");
  }
  self->send(child_of(sup), crash_atom::value);
  bool escalated = false;
  self->receive(
      [&](caf::down_msg& dm) {
        EXPECT_EQ(dm.source, sup.address());
        std::string why = system.render(dm.reason);
        EXPECT_NE(why.find("fragile"), std::string::npos) << why;
        escalated = true;
      },
      caf::after(5s) >> [] {});
  EXPECT_TRUE(escalated);
}

TEST_F(SupervisorTest, ANormalExitIsNotRestarted) {
  std::vector<ChildSpec> children{
      {"fragile", [](caf::actor_system& s) { return s.spawn(fragile); }}};
  auto sup = spawn_supervisor(system, children, SupervisorOptions{3, 10000ms}, self);
  auto child = child_of(sup);
  self->monitor(child);
  self->send(child, stop_atom::value);
  self->receive([](caf::down_msg&) {}, caf::after(5s) >> [] {});
  bool restarted = false;
  self->receive([&](ChildRestarted&) { restarted = true; }, caf::after(300ms) >> [] {});
  EXPECT_FALSE(restarted);
  caf::anon_send_exit(sup, caf::exit_reason::user_shutdown);
}

}  // namespace
}  // namespace troupe::actors
