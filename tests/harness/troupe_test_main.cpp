// troupe_test: the `troupe` command of the test build. The same dispatch as the release binary,
// plus a fault injector read from TROUPE_TEST_* (env_faults.h) for the agents' workers, and kinds
// of its own as a user's program adds them (test_kinds.h). The integration tests run this
// binary; `troupe run` starts its agents from it too.
#include "cli/commands.h"
#include "tests/harness/env_faults.h"
#include "tests/harness/test_kinds.h"

int main(int argc, char** argv) {
  troupe::cli::Hooks hooks;
  hooks.faults = [] { return troupe::testing::faults_from_environment(); };
  hooks.extensions = troupe::testing::test_kinds();
  return troupe::cli::troupe_main(argc, argv, hooks);
}
