// A program's own model and data set kinds (models/extension.h): the kinds refuse bad
// definitions, their keys are checked by the config like the built-in ones (unknown, mistyped and
// out-of-range keys named with file:line:col), the values round-trip through the effective
// config, and a model of user blocks trains like a built-in one.
#include "models/extension.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <system_error>

#include "coordinator/config.h"
#include "models/data.h"
#include "models/model.h"
#include "models/optim.h"
#include "models/state.h"
#include "models/trainer.h"
#include "tests/harness/test_kinds.h"

namespace troupe {
namespace {

models::ModelKind mlp_of(const std::string& name) {
  return {name,
          {{"width", int64_t(16), 1, 4096}, {"relu", true}},
          [](const models::Options& o, const models::Dataset& data) {
            std::vector<std::unique_ptr<models::Block>> blocks;
            const size_t w = size_t(o.integer("width"));
            blocks.push_back(models::make_linear_block(data.input_width(), w, o.boolean("relu")));
            blocks.push_back(models::make_linear_block(w, data.classes(), false));
            return blocks;
          }};
}

models::DatasetKind blobs() {
  return {"blobs",
          {{"samples", int64_t(512), 1, 1e9},
           {"dim", int64_t(8), 1, 1024},
           {"noise", 0.5, 0, 10},
           {"label", "x"}},
          [](const models::Options& o, uint64_t seed) {
            return std::make_unique<models::SyntheticClassification>(
                seed, size_t(o.integer("samples")), size_t(o.integer("dim")), 3, 0.3,
                o.number("noise"));
          }};
}

TEST(Extensions, BadKindsAreRefused) {
  models::Extensions ext;
  ext.add_model(mlp_of("mine"));
  EXPECT_THROW(ext.add_model(mlp_of("mine")), std::invalid_argument);  // taken
  EXPECT_THROW(ext.add_model(mlp_of("gpt")), std::invalid_argument);   // built in
  // (an external loop's kind: model.kind = "external" goes with data.kind = "external")
  EXPECT_THROW(ext.add_model(mlp_of("external")), std::invalid_argument);
  auto external = blobs();
  external.name = "external";
  EXPECT_THROW(ext.add_dataset(external), std::invalid_argument);
  EXPECT_THROW(ext.add_model(mlp_of("Has Space")), std::invalid_argument);
  auto reserved = mlp_of("other");
  reserved.options.push_back({"kind", int64_t(1)});
  EXPECT_THROW(ext.add_model(reserved), std::invalid_argument);
  auto twice = mlp_of("twice");
  twice.options.push_back({"width", int64_t(1)});
  EXPECT_THROW(ext.add_model(twice), std::invalid_argument);
  auto out_of_range = mlp_of("range");
  out_of_range.options[0].default_value = int64_t(0);
  EXPECT_THROW(ext.add_model(out_of_range), std::invalid_argument);
  // A range on a string, or a minimum above the maximum (said: the default outside its range).
  auto ranged_text = mlp_of("ranged_text");
  ranged_text.options.push_back({"act", std::string("relu"), 0, 1});
  EXPECT_THROW(ext.add_model(ranged_text), std::invalid_argument);
  auto upside_down = mlp_of("upside_down");
  upside_down.options.push_back({"rate", 0.5, 1, 0});
  try {
    ext.add_model(upside_down);
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("minimum above its maximum"), std::string::npos);
  }
  auto ledger = blobs();
  ledger.options.push_back({"ledger", false});
  EXPECT_THROW(ext.add_dataset(ledger), std::invalid_argument);
  ext.add_dataset(blobs());
  EXPECT_NE(ext.model("mine"), nullptr);
  EXPECT_NE(ext.dataset("blobs"), nullptr);
  EXPECT_EQ(ext.model("blobs"), nullptr);
}

TEST(Extensions, OptionsAreTyped) {
  models::Options o = models::options_of(blobs().options, {{"dim", int64_t(3)}});
  EXPECT_EQ(o.integer("dim"), 3);
  EXPECT_EQ(o.integer("samples"), 512);  // the default
  EXPECT_EQ(o.number("dim"), 3.0);       // an integer is a number too
  EXPECT_EQ(o.string("label"), "x");
  EXPECT_THROW(o.integer("noise"), std::invalid_argument);
  EXPECT_THROW(o.boolean("dim"), std::invalid_argument);
  EXPECT_THROW(o.integer("missing"), std::invalid_argument);
}

coordinator::ExtensionKinds kinds() {
  coordinator::ExtensionKinds k;
  k.models["mine"] = {{"width", int64_t(16), 1, 4096}, {"relu", true}};
  k.datasets["blobs"] = {{"samples", int64_t(512), 1, 1e9},
                         {"dim", int64_t(8), 1, 1024},
                         {"noise", 0.5, 0, 10},
                         {"label", std::string("x")}};
  return k;
}

std::string refusal(const std::string& text) {
  try {
    coordinator::parse_config(text, "job.toml", {}, kinds());
  } catch (const coordinator::ConfigError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(Extensions, TheConfigChecksAProgramsKeys) {
  const std::string head = "[model]\nkind = \"mine\"\n";
  EXPECT_EQ(refusal(head + "hidden = [3]\n"),
            "job.toml:3:1: unknown key model.hidden (model.kind = \"mine\" takes: kind, relu, "
            "width)");
  // A typo of a program's key or kind gets the nearest, as a built-in one does.
  EXPECT_EQ(refusal(head + "widht = 3\n"),
            "job.toml:3:1: unknown key model.widht (model.kind = \"mine\" takes: kind, relu, "
            "width); did you mean model.width?");
  EXPECT_NE(refusal("[model]\nkind = \"mien\"\n").find("; did you mean \"mine\"?"),
            std::string::npos);
  EXPECT_EQ(refusal(head + "width = \"wide\"\n"),
            "job.toml:3:9: model.width must be an integer, not a string (\"wide\")");
  EXPECT_EQ(refusal(head + "width = 0\n"),
            "job.toml:3:9: model.width = 0 is out of range [1, 4096]");
  EXPECT_EQ(refusal("[data]\nkind = \"blobs\"\nnoise = true\n"),
            "job.toml:3:9: data.noise must be a number, not a boolean");
  EXPECT_EQ(refusal("[data]\nkind = \"blobs\"\npath = \"/tmp\"\n"),
            "job.toml:3:1: unknown key data.path (data.kind = \"blobs\" takes: kind, ledger, dim, "
            "label, noise, samples)");
  EXPECT_NE(refusal("[model]\nkind = \"theirs\"\n").find("is not one of: mlp, gpt, external, mine"),
            std::string::npos);
  // A mistyped kind with its keys: the kind is named, not its keys as unknown ones.
  EXPECT_EQ(
      refusal("[model]\nkind = \"mnie\"\nwidth = 3\n[data]\nkind = \"blbos\"\nnoise = 1\n")
          .find("job.toml:2:8: model.kind = \"mnie\" is not one of: mlp, gpt, external, mine"),
      0u);
  EXPECT_EQ(refusal("[data]\nkind = \"blbos\"\nnoise = 1\n")
                .find("job.toml:2:8: data.kind = \"blbos\" is not one of: "),
            0u);
  // Without the program's kinds (the release `troupe`), the kind itself is unknown.
  EXPECT_THROW(coordinator::parse_config(head, "job.toml"), coordinator::ConfigError);
}

TEST(Extensions, AnExternalLoopsJobTakesOnlyWhatActsOnIt) {
  const std::string head = "[model]\nkind = \"external\"\n";
  auto c = coordinator::parse_config(head + "[data]\nledger = true\n", "job.toml");
  EXPECT_TRUE(c.external());
  EXPECT_EQ(c.data_kind, "external");
  auto again = coordinator::parse_config(coordinator::to_toml(c), "effective.toml");
  EXPECT_TRUE(again.external());
  EXPECT_TRUE(again.ledger);
  const std::pair<std::string, std::string> refused[] = {
      {"layers = 3\n", "unknown key model.layers"},
      {"[data]\npath = \"x\"\n", "unknown key data.path"},
      {"[data]\nkind = \"synthetic\"\n", "go together"},
      {"[parallel]\npipeline_stages = 2\n", "job.toml:4:19: parallel.pipeline_stages must be 1"},
      {"[parallel]\ndeterministic = true\n", "parallel.deterministic cannot make"},
      {"[checkpoint]\nevery_steps = 5\n", "checkpoint.every_steps needs Troupe's workers"},
      {"[checkpoint]\non_state_lost = \"fail\"\n",
       "checkpoint.on_state_lost needs Troupe's workers"},
      {"[cluster]\nlauncher = \"local\"\n", "cluster.launcher must be \"external\""},
      // (the loop's optimizer is its own: these were accepted and did nothing)
      // (named as a kind's key for another kind: refused for a new run, a resume warns)
      {"[optimizer]\nwarmup_steps = 10\n",
       "job.toml:4:16: optimizer.warmup_steps acts only with Troupe's workers"},
      {"[optimizer]\nclip_norm = 0.5\n", "optimizer.clip_norm acts only with Troupe's workers"},
      {"[optimizer]\nkind = \"sgd\"\n", "optimizer.kind acts only with Troupe's workers"},
  };
  for (const auto& [text, expect] : refused) {
    std::string got = "(accepted)";
    try {
      got = coordinator::parse_config(head + text, "job.toml").inert_key;
    } catch (const coordinator::ConfigError& e) {
      got = e.what();
    }
    EXPECT_NE(got.find(expect), std::string::npos) << text << " -> " << got;
  }
}

TEST(Extensions, ValuesAndDefaultsRoundTripThroughTheEffectiveConfig) {
  auto c = coordinator::parse_config(
      "[model]\nkind = \"mine\"\nwidth = 32\n[data]\nkind = \"blobs\"\nnoise = 2\nledger = true\n",
      "job.toml", {"data.label=\"a b\""}, kinds());
  EXPECT_EQ(std::get<int64_t>(c.model_options.at("width")), 32);
  EXPECT_EQ(std::get<bool>(c.model_options.at("relu")), true);   // the default
  EXPECT_EQ(std::get<double>(c.data_options.at("noise")), 2.0);  // an integer given: a number
  EXPECT_EQ(std::get<std::string>(c.data_options.at("label")), "a b");
  EXPECT_TRUE(c.ledger);
  auto again = coordinator::parse_config(coordinator::to_toml(c), "effective.toml", {}, kinds());
  EXPECT_EQ(again.model_options, c.model_options);
  EXPECT_EQ(again.data_options, c.data_options);
  EXPECT_EQ(again.model_kind, "mine");
  EXPECT_TRUE(again.ledger);
}

TEST(Extensions, AModelOfUserBlocksTrains) {
  models::Extensions ext;
  ext.add_model(mlp_of("mine")).add_dataset(blobs());
  auto data = ext.dataset("blobs")->open(models::options_of(ext.dataset("blobs")->options, {}), 3);
  models::ModelSpec spec;
  spec.kind = "mine";
  models::Model model(
      spec, ext.model("mine")->build(models::options_of(ext.model("mine")->options, {}), *data));
  EXPECT_EQ(model.parameters().front().name, "blocks.0.weight");
  model.init(5);
  const std::vector<size_t> counts = model.block_param_counts();
  models::OptimizerSpec os;
  os.lr = 0.01;
  models::Optimizer opt(os, counts);
  models::Trainer trainer(model, opt, *data, 5, 32, 32);
  const double first = trainer.step(0).loss;
  double last = first;
  for (uint64_t s = 1; s < 60; ++s) last = trainer.step(s).loss;
  EXPECT_LT(last, 0.7 * first);
}

// A block with no parameters (an activation) that never calls allocate(): it trains, and its
// (empty) state is saved and loaded as any block's (it crashed the first checkpoint). A block
// that carves a parameter before allocate() is told so (it crashed in its constructor).
TEST(Extensions, ABlockWithoutParametersNeedsNoAllocate) {
  struct Twice : models::Block {
    std::string kind() const override { return "twice"; }
    double flops_per_sample() const override { return 0; }
    void init(uint64_t, size_t) override {}
    models::Tensor forward(const models::Tensor& x, size_t) override {
      models::Tensor y(x.shape());
      for (size_t i = 0; i < x.numel(); ++i) y.data()[i] = 2 * x.data()[i];
      return y;
    }
    models::Tensor backward(const models::Tensor& dy) override { return forward(dy, 0); }
    Saved save() override { return nullptr; }
    void restore(const Saved&) override {}
  };
  models::Extensions ext;
  ext.add_dataset(blobs());
  auto data = ext.dataset("blobs")->open(models::options_of(ext.dataset("blobs")->options, {}), 3);
  std::vector<std::unique_ptr<models::Block>> blocks;
  blocks.push_back(models::make_linear_block(data->input_width(), 16, true));
  blocks.push_back(std::make_unique<Twice>());
  blocks.push_back(models::make_linear_block(16, data->classes(), false));
  models::ModelSpec spec;
  spec.kind = "mine";
  models::Model model(spec, std::move(blocks));
  model.init(5);
  EXPECT_EQ(model.block_param_counts()[1], 0u);
  models::OptimizerSpec os;
  os.lr = 0.01;
  models::Optimizer opt(os, model.block_param_counts());
  models::Trainer trainer(model, opt, *data, 5, 32, 32);
  const double first = trainer.step(0).loss;
  double last = first;
  for (uint64_t s = 1; s < 30; ++s) last = trainer.step(s).loss;
  EXPECT_LT(last, first);
  std::vector<uint8_t> bytes;
  models::save_block_state_into(bytes, model.block(1), 1, opt, {30, 960});
  EXPECT_NO_THROW(models::load_block_state(bytes, model.block(1), 1, opt));

  struct CarvesFirst : Twice {
    CarvesFirst() { Carver{this}.take("weight", {4, 4}); }
  };
  try {
    CarvesFirst never;
    ADD_FAILURE() << "carved before allocate()";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("a block carves 'weight' (16 values) past the 0 "
                                         "parameters it allocate()d: allocate(n)"),
              std::string::npos)
        << e.what();
  }
}

TEST(Extensions, ABlockWhoseInitIsNotRepeatableIsRefusedNamingIt) {
  models::ModelSpec spec;
  spec.kind = "mine";
  std::vector<std::unique_ptr<models::Block>> ok;
  ok.push_back(std::make_unique<testing::Shift>(4, true));
  models::Model good(spec, std::move(ok));
  EXPECT_NO_THROW(good.init(3));
  std::vector<std::unique_ptr<models::Block>> blocks;
  blocks.push_back(std::make_unique<testing::Shift>(4, true));
  blocks.push_back(std::make_unique<testing::Shift>(5, false));
  models::Model bad(spec, std::move(blocks));
  try {
    bad.init(3);
    ADD_FAILURE() << "no ModelDefect";
  } catch (const models::ModelDefect& e) {
    EXPECT_NE(std::string(e.what()).find("model 'mine': block 1 ('shift') initialised twice from "
                                         "the same seed gave different parameters ('bias' "
                                         "element 4: "),
              std::string::npos)
        << e.what();
  }
}

// A batch of two samples (4 and 5) of `inputs` zeros, targets 0 and 1.
models::Batch two_samples(size_t inputs) {
  models::Batch b;
  b.size = 2;
  b.inputs = models::Tensor({2, inputs});
  b.targets = {0, 1};
  b.samples = {4, 5};
  return b;
}

// A program's block that cannot take its input, or whose backward returns a gradient of another
// size than its input (the block before would read past it): a ModelDefect naming the block (not
// restarted: the same at every retry), never a read out of bounds or a NaN loss. So is a model
// whose output does not divide into the batch's target rows (6 values for 4 rows).
TEST(Extensions, ABlockThatCannotTakeItsInputOrGivesAWrongGradientIsNamed) {
  struct ShortGradient : testing::Shift {
    using Shift::Shift;
    models::Tensor backward(const models::Tensor& dy) override {
      Shift::backward(dy);
      return models::Tensor({dy.numel() - 1});
    }
  };
  auto defect = [](std::vector<std::unique_ptr<models::Block>> blocks, size_t inputs) {
    models::ModelSpec spec;
    spec.kind = "mine";
    models::Model m(spec, std::move(blocks));
    m.init(3);
    try {
      m.forward_backward(two_samples(inputs), 0.5);
    } catch (const models::ModelDefect& e) {
      return std::string(e.what());
    }
    return std::string("no ModelDefect");
  };
  std::vector<std::unique_ptr<models::Block>> wide;
  wide.push_back(std::make_unique<testing::Shift>(4, true));
  wide.push_back(std::make_unique<testing::Shift>(5, true));
  EXPECT_EQ(defect(std::move(wide), 4),
            "model 'mine': block 1 ('shift') forward: input is not (B, 5)");
  std::vector<std::unique_ptr<models::Block>> short_gradient;
  short_gradient.push_back(std::make_unique<testing::Shift>(4, true));
  short_gradient.push_back(std::make_unique<ShortGradient>(4, true));
  EXPECT_EQ(defect(std::move(short_gradient), 4),
            "model 'mine': block 1 ('shift') returned a gradient of 7 values from backward for an "
            "input of 8: backward must return the gradient of its input, shaped as it");
  models::Tensor logits({2, 3});
  EXPECT_THROW(models::scored_classes(logits, {0, 1, 2, 0}), models::ModelDefect);
}

// Any other exception of a block's pass (a runtime error: the machine's, perhaps) names the block
// and the pass too, and stays one a worker is restarted for (not a ModelDefect).
TEST(Extensions, ABlocksRuntimeErrorNamesTheBlockAndThePass) {
  struct Failing : testing::Shift {
    using Shift::Shift;
    models::Tensor backward(const models::Tensor&) override {
      throw std::runtime_error("device lost");
    }
  };
  std::vector<std::unique_ptr<models::Block>> blocks;
  blocks.push_back(std::make_unique<testing::Shift>(4, true));
  blocks.push_back(std::make_unique<Failing>(4, true));
  models::ModelSpec spec;
  spec.kind = "mine";
  models::Model m(spec, std::move(blocks));
  m.init(3);
  try {
    m.forward_backward(two_samples(4), 0.5);
    ADD_FAILURE() << "no exception";
  } catch (const models::BlockFailed& e) {
    EXPECT_EQ(std::string(e.what()), "model 'mine': block 1 ('shift') backward: device lost");
  }
}

// A sample whose input holds a NaN or an infinity: refused naming the sample and the feature
// (it would make the loss and every parameter NaN, silently).
TEST(Extensions, ASampleWithANonFiniteInputIsNamed) {
  struct Holey : models::SyntheticClassification {
    Holey() : SyntheticClassification(1, 64, 4, 3) {}
    void fill(size_t index, float* input, int32_t* targets) const override {
      SyntheticClassification::fill(index, input, targets);
      if (index == 9) input[2] = std::nanf("");
    }
  } data;
  models::GlobalSampler sampler(1, data.size());
  try {
    models::make_batch(data, sampler, 0, 64);
    ADD_FAILURE() << "no SampleError";
  } catch (const models::SampleError& e) {
    EXPECT_EQ(std::string(e.what()),
              "sample 9's input has a non-finite value (nan at feature 2): the data set gave it");
  }
}

TEST(Extensions, TargetsOutsideTheModelsOutputsAreRefused) {
  models::Tensor logits({2, 3});
  EXPECT_EQ(models::scored_classes(logits, {0, 2}), 3u);
  EXPECT_THROW(models::scored_classes(logits, {0, 3}), std::invalid_argument);
  EXPECT_THROW(models::scored_classes(logits, {-1, 0}), std::invalid_argument);
  EXPECT_THROW(models::scored_classes(logits, {0, 1, 2, 0}), std::invalid_argument);
}

// What a job's failure says names the data set's sample, not the micro-batch's row.
TEST(Extensions, ABadTargetOrAFailingSampleIsNamedBySample) {
  auto what = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const models::SampleError& e) {
      return std::string(e.what());
    }
    return std::string("no SampleError");
  };
  models::Tensor logits({2, 3});
  EXPECT_EQ(what([&] {
              models::scored_classes(logits, {0, 3}, {11, 17});
            }),
            "target 3 (sample 17 of the data set) is outside the model's 3 outputs: the data "
            "set's classes do not fit the model");
  // Two targets a sample (a token window): which one, too.
  models::Tensor tokens({4, 3});
  EXPECT_NE(what([&] {
              models::scored_classes(tokens, {0, 1, 2, -1}, {5, 9});
            }).find("target -1 (sample 9, position 1 of the data set)"),
            std::string::npos);

  struct Failing : models::SyntheticClassification {
    Failing() : SyntheticClassification(1, 64, 4, 3) {}
    void fill(size_t index, float* input, int32_t* targets) const override {
      if (index == 7) throw std::runtime_error("record 7 is corrupt");
      SyntheticClassification::fill(index, input, targets);
    }
  } data;
  models::GlobalSampler sampler(1, data.size());
  models::Batch b = models::make_batch(data, sampler, 0, 5);
  EXPECT_EQ(b.samples.size(), 5u);
  EXPECT_EQ(b.samples[2], sampler.sample_at(2));
  EXPECT_EQ(what([&] { models::make_batch(data, sampler, 0, 64); }),
            "the data set failed on sample 7: record 7 is corrupt");
  // An I/O error is the machine's, not the sample's: passed on as it is (a restart may pass).
  struct Unreadable : models::SyntheticClassification {
    Unreadable() : SyntheticClassification(1, 64, 4, 3) {}
    void fill(size_t, float*, int32_t*) const override {
      throw std::system_error(EIO, std::generic_category(), "reading a record");
    }
  } unreadable;
  EXPECT_THROW(models::make_batch(unreadable, sampler, 0, 4), std::system_error);
}

}  // namespace
}  // namespace troupe
