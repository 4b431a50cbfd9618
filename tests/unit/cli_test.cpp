// The command line: every subcommand parses with CLI11 through cli::parse (help exits 0, a
// mistake exits 2 naming it), a mistyped subcommand gets the nearest one, host:port is checked.
#include <gtest/gtest.h>

#include "cli/parse.h"
#include "comm/transport.h"

namespace troupe {
namespace {

struct Parsed {
  std::optional<int> rc;
  std::string said;  // stderr
  int64_t workers = 0;
  std::vector<std::string> sets;
  bool json = false;
};

Parsed run(const std::vector<std::string>& words) {
  Parsed p;
  CLI::App app{"test", "troupe test"};
  app.add_option("--workers", p.workers, "")->check(cli::kPositive);
  app.add_option("--set", p.sets, "");
  app.add_flag("--json", p.json, "");
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  p.rc = cli::parse(app, words);
  testing::internal::GetCapturedStdout();
  p.said = testing::internal::GetCapturedStderr();
  return p;
}

TEST(CommandLine, ValuesFlagsAndRepeatedOptions) {
  Parsed p = run({"--workers", "4", "--json", "--set=a.b=1", "--set", "c.d=2"});
  EXPECT_FALSE(p.rc.has_value());
  EXPECT_EQ(p.workers, 4);
  EXPECT_TRUE(p.json);
  EXPECT_EQ(p.sets, (std::vector<std::string>{"a.b=1", "c.d=2"}));
}

TEST(CommandLine, HelpExitsZeroAndMistakesExitTwo) {
  EXPECT_EQ(run({"--help"}).rc, 0);
  EXPECT_EQ(run({"--wrokers", "4"}).rc, 2);     // unknown option
  EXPECT_EQ(run({"--workers"}).rc, 2);          // a value missing
  EXPECT_EQ(run({"--workers", "four"}).rc, 2);  // not a number
  EXPECT_EQ(run({"--workers", "0"}).rc, 2);     // out of range
  EXPECT_NE(run({"--workers", "-3"}).said.find("--workers: -3 is not a positive number"),
            std::string::npos)
      << run({"--workers", "-3"}).said;
  EXPECT_EQ(run({"--json=1", "extra"}).rc, 2);
}

// CLI11 read 010 as octal (8) and 0x10 as hex: integers are decimal, leading zeros too.
TEST(CommandLine, IntegersAreDecimalWithLeadingZeros) {
  EXPECT_EQ(run({"--workers", "010"}).workers, 10);
  EXPECT_EQ(run({"--workers", "00000050"}).workers, 50);
  EXPECT_EQ(run({"--workers", "+010"}).workers, 10);
  EXPECT_EQ(run({"--workers", "7"}).workers, 7);
  EXPECT_EQ(run({"--workers", "00"}).rc, 2);  // (0: out of range)
  const Parsed hex = run({"--workers", "0x10"});
  EXPECT_EQ(hex.rc, 2);
  EXPECT_NE(hex.said.find("0x10 is not a decimal number"), std::string::npos) << hex.said;
  for (const char* other : {"1e3", "7.0", "", "-", "12abc"}) {  // (1e3: "Value 1e3 not in range")
    const Parsed p = run({"--workers", other});
    EXPECT_EQ(p.rc, 2) << other;
    EXPECT_NE(p.said.find(std::string(other) + " is not a decimal number"), std::string::npos)
        << other << ": " << p.said;
  }
}

TEST(CommandLine, AMistypedSubcommandGetsTheNearest) {
  const std::vector<std::string> commands{"run",  "coordinator", "agent", "status",
                                          "stop", "drain",       "scale", "version",
                                          "demo", "node",        "bench"};
  EXPECT_EQ(cli::did_you_mean("stauts", commands), "status");
  EXPECT_EQ(cli::did_you_mean("scael", commands), "scale");
  EXPECT_EQ(cli::did_you_mean("coordinater", commands), "coordinator");
  EXPECT_EQ(cli::did_you_mean("xyzzy", commands), "");
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
