// Config files: every kind of mistake is refused with a message naming the file, line and what
// to do; --set overrides any key; the effective config round-trips.
#include "coordinator/config.h"

#include <gtest/gtest.h>

namespace troupe::coordinator {
namespace {

struct Bad {
  const char* what;
  const char* text;
  std::vector<std::string> overrides;
  const char* expect;  // substring of the message
};

TEST(Config, BadFilesAreRefusedWithFileLineAndReason) {
  const Bad cases[] = {
      {"syntax", "[job]\nsteps = = 3\n", {}, "job.toml:2:"},
      {"syntax names it", "[job\n", {}, "syntax error"},
      {"unknown key with the nearest",
       "[job]\nstesp = 10\n",
       {},
       "job.toml:2:1: unknown key job.stesp; did you mean job.steps?"},
      {"unknown table",
       "[optimiser]\nlr = 0.1\n",
       {},
       "unknown table [optimiser]; did you mean [optimizer]?"},
      {"wrong type",
       "[batch]\nglobal = \"lots\"\n",
       {},
       "job.toml:2:10: batch.global must be an integer"},
      {"out of range",
       "[optimizer]\nlr = -1.0\n",
       {},
       "job.toml:2:6: optimizer.lr = -1 is out of range"},
      {"bad choice",
       "[model]\nkind = \"rnn\"\n",
       {},
       "model.kind = \"rnn\" is not one of: mlp, gpt"},
      {"missing data file",
       "[model]\nkind = \"gpt\"\n[data]\nkind = \"text\"\npath = \"/nonexistent/corpus.txt\"\n",
       {},
       "the data file '/nonexistent/corpus.txt' does not exist"},
      {"micro above global",
       "[batch]\nglobal = 8\nmicro = 16\n",
       {},
       "batch.micro (16) exceeds batch.global (8)"},
      {"bad override", "", {"batch.global=zero"}, "batch.global must be an integer"},
      {"override without a table", "", {"steps=3"}, "expected table.key=value"},
  };
  for (const auto& c : cases) {
    try {
      parse_config(c.text, "job.toml", c.overrides);
      ADD_FAILURE() << c.what << ": accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos)
          << c.what << ": " << e.what();
    }
  }
}

TEST(Config, DefaultsOverridesAndRoundTrip) {
  auto c = parse_config("[job]\nsteps = 30\n[model]\nhidden = [64, 32]\n", "a.toml",
                        {"optimizer.lr=0.5", "job.name=demo", "cluster.agents=3"});
  EXPECT_EQ(c.steps, 30);
  EXPECT_EQ(c.hidden, (std::vector<int64_t>{64, 32}));
  EXPECT_DOUBLE_EQ(c.lr, 0.5);
  EXPECT_EQ(c.name, "demo");
  EXPECT_EQ(c.agents, 3);
  EXPECT_EQ(c.global_batch, 64);  // default
  auto again = parse_config(to_toml(c), "effective.toml");
  EXPECT_EQ(to_toml(again), to_toml(c));
}

TEST(Config, MissingFileIsRefused) {
  EXPECT_THROW(load_config("/nonexistent/job.toml"), ConfigError);
}

}  // namespace
}  // namespace troupe::coordinator
