#include "cli/args.h"

#include <gtest/gtest.h>

#include "comm/transport.h"

namespace troupe {
namespace {

TEST(Args, ParsesValuesBooleansAndPositionals) {
  cli::Args a({"cfg.toml", "--workers", "4", "--json", "--set=a.b=1", "--set", "c.d=2"},
              {"workers", "set"}, {"json"});
  EXPECT_EQ(a.positional(), std::vector<std::string>{"cfg.toml"});
  EXPECT_EQ(a.get_int("workers", 0), 4);
  EXPECT_TRUE(a.has("json"));
  EXPECT_EQ(a.all("set"), (std::vector<std::string>{"a.b=1", "c.d=2"}));
}

TEST(Args, RefusesUnknownFlagsMissingValuesAndBadIntegers) {
  EXPECT_THROW(cli::Args({"--wrokers", "4"}, {"workers"}, {}), std::invalid_argument);
  EXPECT_THROW(cli::Args({"--workers"}, {"workers"}, {}), std::invalid_argument);
  EXPECT_THROW(cli::Args({"--json=1"}, {}, {"json"}), std::invalid_argument);
  cli::Args a({"--workers", "four"}, {"workers"}, {});
  EXPECT_THROW(a.get_int("workers", 0), std::invalid_argument);
}

TEST(HostPort, SplitsAndRefusesMalformedAddresses) {
  auto [host, port] = comm::split_host_port("127.0.0.1:8080");
  EXPECT_EQ(host, "127.0.0.1");
  EXPECT_EQ(port, 8080);
  for (const char* bad : {"", "nohost", ":80", "host:", "host:99999", "host:8x"}) {
    EXPECT_THROW(comm::split_host_port(bad), comm::Error) << bad;
  }
}

}  // namespace
}  // namespace troupe
