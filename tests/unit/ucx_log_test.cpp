#include <gtest/gtest.h>
#include <ucs/config/global_opts.h>
#include <ucs/debug/log_def.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "comm/ucx.h"

namespace troupe::comm {
namespace {

std::vector<std::pair<bool, std::string>> said;

// UCX's own warnings and errors reach the sink (the CLI's: its log at debug), not stderr; what
// UCX prints only when asked (debug) is left to it.
TEST(UcxLog, UcxsOwnWarningsAndErrorsGoToTheSink) {
  if (std::getenv("UCX_LOG_LEVEL")) GTEST_SKIP() << "UCX_LOG_LEVEL is set: UCX prints itself";
  route_ucx_log([](bool error, const std::string& m) { said.emplace_back(error, m); });
  ucs_log_dispatch("src/uct/tcp/sock.c", 325, "f", UCS_LOG_LEVEL_ERROR,
                   &ucs_global_opts.log_component, "connect(fd=%d) failed", 24);
  ucs_log_dispatch("wireup_cm.c", 1239, "f", UCS_LOG_LEVEL_WARN, &ucs_global_opts.log_component,
                   "server ep failed to connect on device %s", "lo");
  ASSERT_EQ(said.size(), 2u);
  EXPECT_TRUE(said[0].first);
  EXPECT_EQ(said[0].second, "sock.c:325 connect(fd=24) failed");
  EXPECT_FALSE(said[1].first);
  EXPECT_EQ(said[1].second, "wireup_cm.c:1239 server ep failed to connect on device lo");
  route_ucx_log(nullptr);  // (UCX prints again)
}

}  // namespace
}  // namespace troupe::comm
