// Models: bad input is refused clearly; block state round trips; determinism.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>

#include "models/data.h"
#include "models/state.h"
#include "models/trainer.h"

namespace troupe::models {
namespace {

ModelSpec tiny_gpt(size_t vocab) {
  ModelSpec s;
  s.kind = "gpt";
  s.vocab = vocab;
  s.context = 16;
  s.d_model = 32;
  s.heads = 4;
  s.layers = 2;
  return s;
}

// The memory check before a job starts counts parameters without building the model: the count
// must be the built model's, for every kind.
TEST(ModelSize, PlannedParameterCountIsTheBuiltModelsCount) {
  ModelSpec mlp;
  mlp.kind = "mlp";
  mlp.mlp_sizes = {7, 13, 5, 3};
  EXPECT_EQ(Model::planned_param_count(mlp), Model(mlp).param_count());
  EXPECT_EQ(Model::planned_block_param_counts(mlp), Model(mlp).block_param_counts());
  for (bool tied : {false, true}) {
    ModelSpec gpt;
    gpt.kind = "gpt";
    gpt.vocab = 11;
    gpt.context = 6;
    gpt.d_model = 8;
    gpt.heads = 2;
    gpt.layers = 3;
    gpt.tied_head = tied;
    EXPECT_EQ(Model::planned_param_count(gpt), Model(gpt).param_count()) << "tied " << tied;
    EXPECT_EQ(Model::planned_block_param_counts(gpt), Model(gpt).block_param_counts()) << tied;
  }
}

TEST(ModelInput, ZeroSizesAndUnknownKindsAreRefused) {
  ModelSpec s;
  s.mlp_sizes = {784, 0, 10};
  EXPECT_THROW({ Model m(s); }, std::invalid_argument);
  s.kind = "rnn";
  EXPECT_THROW({ Model m(s); }, std::invalid_argument);
  auto g = tiny_gpt(10);
  g.layers = 0;
  EXPECT_THROW({ Model m(g); }, std::invalid_argument);
  g = tiny_gpt(10);
  g.heads = 3;  // 32 is not divisible by 3
  EXPECT_THROW({ Model m(g); }, std::invalid_argument);
}

TEST(DataInput, MissingOrEmptyOrShortTextFilesAreRefused) {
  EXPECT_THROW(CharText("/nonexistent/troupe.txt", 16), std::invalid_argument);
  std::string path = ::testing::TempDir() + "troupe_empty.txt";
  { std::ofstream(path).flush(); }
  try {
    CharText t(path, 16);
    FAIL() << "an empty file was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("empty"), std::string::npos) << e.what();
  }
  { std::ofstream(path) << "short"; }
  EXPECT_THROW(CharText(path, 16), std::invalid_argument);
  std::remove(path.c_str());
}

TEST(DataInput, OutOfVocabularyTokensAreRefused) {
  Model m(tiny_gpt(10));
  m.init(1);
  Batch b;
  b.size = 1;
  b.inputs = Tensor({1, 16});
  b.inputs.data()[3] = 12;
  b.targets.assign(16, 0);
  EXPECT_THROW(m.forward_backward(b, 1.0), std::invalid_argument);
}

TEST(Sampler, PositionsMapToTheSameSampleWhateverTheSplit) {
  GlobalSampler a(42, 1000), b(42, 1000);
  std::vector<size_t> whole;
  for (uint64_t p = 0; p < 2500; ++p) whole.push_back(a.sample_at(p));
  // Another sampler visiting the positions in another order (as ranks would) agrees.
  for (uint64_t p = 2500; p-- > 0;) EXPECT_EQ(b.sample_at(p), whole[p]);
  // Each epoch is a permutation.
  std::vector<int> seen(1000, 0);
  for (size_t i = 0; i < 1000; ++i) seen[whole[i]]++;
  for (int c : seen) EXPECT_EQ(c, 1);
  // A different seed gives a different order.
  GlobalSampler c(43, 1000);
  int same = 0;
  for (uint64_t p = 0; p < 1000; ++p) same += c.sample_at(p) == whole[p];
  EXPECT_LT(same, 20);
}

// A prefetched batch is the batch of its range; a range not expected is assembled at once; the
// trainer with prefetching computes the same bits as without.
TEST(Prefetch, GivesTheBatchOfTheRangeExpectedOrNot) {
  SyntheticClassification data(3, 500, 16, 4);
  GlobalSampler direct(9, data.size());
  BatchPrefetcher p(data, 9);
  auto same = [&](const Batch& b, uint64_t first, uint64_t last) {
    const Batch want = make_batch(data, direct, first, last);
    ASSERT_EQ(b.size, want.size);
    EXPECT_EQ(0, std::memcmp(b.inputs.data(), want.inputs.data(), want.inputs.numel() * 4));
    EXPECT_EQ(b.targets, want.targets);
  };
  p.expect(100, 116);
  same(p.take(100, 116), 100, 116);
  p.expect(116, 132);
  same(p.take(700, 710), 700, 710);  // (another range: at once; the expected one is dropped)
  same(p.take(116, 132), 116, 132);
  p.expect(132, 148);
  p.expect(1400, 1403);  // (a later expectation replaces the earlier)
  same(p.take(1400, 1403), 1400, 1403);
  EXPECT_EQ(p.hits(), 2u);
  EXPECT_EQ(p.misses(), 2u);

  auto losses = [&](bool prefetch) {
    CharText text(kDefaultTextPath, 16);
    Model m(tiny_gpt(text.vocab()));
    m.init(1);
    const std::vector<size_t> counts = m.block_param_counts();
    OptimizerSpec o;
    o.kind = "adamw";
    o.lr = 1e-3;
    Optimizer opt(o, counts);
    Trainer t(m, opt, text, 4, 12, 4);
    if (prefetch) t.enable_prefetch();
    std::vector<double> out;
    for (uint64_t s = 0; s < 5; ++s) out.push_back(t.step(s).loss);
    if (prefetch) {
      EXPECT_EQ(t.prefetcher()->hits(), 14u) << "all but the first micro-batch";
    }
    return out;
  };
  EXPECT_EQ(losses(true), losses(false));
}

TEST(Init, IsAPureFunctionOfSeedAndBlockIndex) {
  Model a(tiny_gpt(12)), b(tiny_gpt(12));
  a.init(5);
  b.init(5);
  for (size_t i = 0; i < a.num_blocks(); ++i) {
    ASSERT_EQ(0, std::memcmp(a.block(i).params().data(), b.block(i).params().data(),
                             a.block(i).param_count() * sizeof(float)));
  }
  // Block 1 alone (as a pipeline stage would build it) gets the same parameters.
  auto blk = make_transformer_block(16, 32, 4, 2);
  blk->init(5, 1);
  EXPECT_EQ(0, std::memcmp(blk->params().data(), a.block(1).params().data(),
                           blk->param_count() * sizeof(float)));
}

TEST(Blocks, SavedForwardCachesGiveTheSameBackwardAsAFreshForward) {
  // Every kind of block: forward micro-batch A, save; forward B, save; restore A and run its
  // backward, then B's: the gradients (and input gradients) equal forward+backward run directly.
  const size_t B = 2, T = 8, C = 32, V = 12;
  auto tokens = [&](int salt) {
    Tensor x({B, T});
    for (size_t i = 0; i < B * T; ++i) x.data()[i] = float((i * 7 + size_t(salt)) % V);
    return x;
  };
  auto features = [&](int salt, size_t d) {
    Tensor x({B * T, d});
    for (size_t i = 0; i < x.numel(); ++i)
      x.data()[i] = float(int(i * 13 + size_t(salt)) % 17) / 17.0f;
    return x;
  };
  auto grads_of = [&](Block& blk) {
    return std::vector<float>(blk.grads().data(), blk.grads().data() + blk.param_count());
  };
  struct Case {
    std::function<std::unique_ptr<Block>()> make;
    std::function<Tensor(int)> input;
    size_t rows;
  };
  std::vector<Case> cases{{[&] { return make_linear_block(C, 24, true); },
                           [&](int k) { return features(k, C); }, B * T},
                          {[&] { return make_embedding_block(V, T, C); }, tokens, B},
                          {[&] { return make_transformer_block(T, C, 4, 2); },
                           [&](int k) {
                             Tensor x({B, T, C});
                             Tensor f = features(k, C);
                             std::memcpy(x.data(), f.data(), x.numel() * sizeof(float));
                             return x;
                           },
                           B},
                          {[&] { return make_head_block(V, T, C, nullptr); },
                           [&](int k) {
                             Tensor x({B, T, C});
                             Tensor f = features(k, C);
                             std::memcpy(x.data(), f.data(), x.numel() * sizeof(float));
                             return x;
                           },
                           B}};
  for (auto& c : cases) {
    auto direct = c.make(), stashed = c.make();
    direct->init(3, 0);
    stashed->init(3, 0);
    SCOPED_TRACE(direct->kind());
    Tensor xa = c.input(1), xb = c.input(2);
    auto values = [](const Tensor& t) {
      return std::vector<float>(t.data(), t.data() + (t.defined() ? t.numel() : 0));
    };
    // Direct: A then B, each forward right before its backward.
    Tensor ya = direct->forward(xa, c.rows);
    const auto want_ya = values(ya);
    Tensor dya({ya.numel()});
    for (size_t i = 0; i < dya.numel(); ++i) dya.data()[i] = float(i % 5) * 0.1f;
    const auto want_dxa = values(direct->backward(dya));
    direct->forward(xb, c.rows);
    const auto want_dxb = values(direct->backward(dya));
    // Stashed: both forwards first. A's output (which the next block would hold as its input)
    // must survive B's forward, and the input gradients must be A's and B's.
    Tensor ya2 = stashed->forward(xa, c.rows);
    auto saved_a = stashed->save();
    stashed->forward(xb, c.rows);
    auto saved_b = stashed->save();
    EXPECT_EQ(values(ya2), want_ya) << "B's forward overwrote A's output";
    stashed->restore(saved_a);
    EXPECT_EQ(values(stashed->backward(dya)), want_dxa);
    stashed->restore(saved_b);
    EXPECT_EQ(values(stashed->backward(dya)), want_dxb);
    EXPECT_EQ(grads_of(*direct), grads_of(*stashed));
  }
}

TEST(State, MismatchedOrTruncatedStateIsRefusedAndChangesNothing) {
  Model m(tiny_gpt(12));
  m.init(1);
  const std::vector<size_t> counts = m.block_param_counts();
  Optimizer opt(OptimizerSpec{}, counts);
  auto bytes = save_block_state(m.block(1), 1, opt, BlockState{7, 700});
  std::vector<float> before(m.block(0).params().data(),
                            m.block(0).params().data() + m.block(0).param_count());
  EXPECT_THROW(load_block_state(bytes, m.block(0), 0, opt), std::invalid_argument);  // wrong kind
  EXPECT_THROW(load_block_state(bytes, m.block(m.num_blocks() - 1), 1, opt),
               std::invalid_argument);                                               // head
  EXPECT_THROW(load_block_state(bytes, m.block(1), 2, opt), std::invalid_argument);  // wrong index
  auto cut = bytes;
  cut.resize(cut.size() - 5);
  EXPECT_THROW(load_block_state(cut, m.block(1), 1, opt), std::invalid_argument);
  EXPECT_THROW(load_block_state({}, m.block(1), 1, opt), std::invalid_argument);
  auto bad = bytes;
  bad[8] = 99;  // version
  EXPECT_THROW(load_block_state(bad, m.block(1), 1, opt), std::invalid_argument);
  EXPECT_EQ(0,
            std::memcmp(before.data(), m.block(0).params().data(), before.size() * sizeof(float)));
  auto s = load_block_state(bytes, m.block(1), 1, opt);
  EXPECT_EQ(s.step, 7u);
  EXPECT_EQ(s.cursor, 700u);
}

TEST(Schedule, WarmupThenCosine) {
  OptimizerSpec s;
  s.lr = 1.0;
  s.warmup_steps = 10;
  s.decay_steps = 100;
  s.min_lr_ratio = 0.1;
  Optimizer o(s, {1});
  EXPECT_DOUBLE_EQ(o.lr_at(0), 0.1);
  EXPECT_DOUBLE_EQ(o.lr_at(9), 1.0);
  EXPECT_DOUBLE_EQ(o.lr_at(10), 1.0);
  EXPECT_NEAR(o.lr_at(60), 0.55, 1e-12);
  EXPECT_NEAR(o.lr_at(110), 0.1, 1e-12);
  EXPECT_NEAR(o.lr_at(1000), 0.1, 1e-12);
}

TEST(Clip, GlobalNormFromPartialSums) {
  // Two "workers" with two blocks each: the clip factor from the summed partial norms equals
  // the one from all gradients together.
  Tensor g1({3}), g2({2});
  float a[3] = {3, 0, 0}, b[2] = {0, 4};
  std::memcpy(g1.data(), a, sizeof a);
  std::memcpy(g2.data(), b, sizeof b);
  double total = grad_norm_sq(g1) + grad_norm_sq(g2);
  EXPECT_DOUBLE_EQ(total, 25.0);
  EXPECT_NEAR(clip_factor(total, 1.0), 0.2, 1e-6);
  EXPECT_DOUBLE_EQ(clip_factor(total, 10.0), 1.0);
  EXPECT_DOUBLE_EQ(clip_factor(total, 0.0), 1.0);
}

}  // namespace
}  // namespace troupe::models
