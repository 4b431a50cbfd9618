#include "workers/datasets.h"

#include "data/token_data.h"

namespace troupe::workers {
namespace {

// Token windows in their own global order (data/token_data.h): the trainer passes positions.
class TokenWindows : public models::Dataset {
 public:
  explicit TokenWindows(std::shared_ptr<const data::TokenData> d) : d_(std::move(d)) {}
  const std::shared_ptr<const data::TokenData>& tokens() const { return d_; }
  size_t size() const override { return size_t(d_->windows()); }
  size_t input_width() const override { return d_->context(); }
  size_t targets_per_sample() const override { return d_->context(); }
  void fill(size_t position, float* input, int32_t* targets) const override {
    d_->fill(position, input, targets);
  }
  bool orders_itself() const override { return true; }
  size_t classes() const override { return d_->vocab(); }

 private:
  std::shared_ptr<const data::TokenData> d_;
};

}  // namespace

std::vector<data::Source> token_sources(const WorkerSpec& spec) {
  std::vector<data::Source> sources;
  for (size_t i = 0; i < spec.data_mix.size(); ++i)
    sources.push_back({spec.data_mix[i], spec.data_mix_weights.at(i)});
  if (sources.empty()) sources.push_back({spec.data_path, 1.0});
  return sources;
}

// What a program's own kind gives, its error named by the key that chose the kind (a refusal stays
// one: std::invalid_argument, exit 2 before anything starts).
namespace {
template <class F>
auto named(const std::string& key, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(key + ": " + e.what());
  } catch (const std::exception& e) {
    throw std::runtime_error(key + ": " + e.what());
  }
}
}  // namespace

// A program's own data set (data.kind names it).
std::unique_ptr<models::Dataset> open_added_dataset(const WorkerSpec& spec) {
  const models::DatasetKind* kind =
      spec.extensions ? spec.extensions->dataset(spec.data_kind) : nullptr;
  if (!kind)
    throw std::invalid_argument("data.kind = \"" + spec.data_kind +
                                "\" is not a kind this program has (it is built into the "
                                "program that started the job: run its agents from it)");
  const std::string key = "data.kind = \"" + spec.data_kind + "\"";
  auto d = named(key, [&] {
    return kind->open(models::options_of(kind->options, spec.data_options), spec.seed);
  });
  if (!d || d->size() == 0 || d->input_width() == 0 || d->targets_per_sample() == 0)
    throw std::invalid_argument(key + ": its open gave no samples (or samples of no width)");
  return d;
}

std::unique_ptr<models::Dataset> open_dataset(const WorkerSpec& spec, models::ModelSpec& m) {
  const bool builtin =
      spec.data_kind == "synthetic" || spec.data_kind == "text" || spec.data_kind == "tokens";
  if (!builtin) return open_added_dataset(spec);
  if (spec.data_kind == "text") {
    auto text = std::make_unique<models::CharText>(spec.data_path, m.context);
    m.vocab = text->vocab();
    return text;
  }
  if (spec.data_kind == "tokens") {
    const double held_out = spec.eval_every > 0 && spec.eval_path.empty() ? spec.eval_fraction : 0;
    auto d = std::make_shared<data::TokenData>(token_sources(spec), m.context, spec.seed, held_out);
    m.vocab = d->vocab();
    return std::make_unique<TokenWindows>(std::move(d));
  }
  if (m.mlp_sizes.size() < 2) throw std::invalid_argument("the mlp needs inputs and classes");
  return std::make_unique<models::SyntheticClassification>(spec.seed, size_t(spec.samples),
                                                           m.mlp_sizes.front(), m.mlp_sizes.back());
}

std::shared_ptr<const data::TokenData> open_eval_set(const WorkerSpec& spec,
                                                     const models::Dataset& train) {
  if (spec.eval_every <= 0) return nullptr;
  const auto* tokens = dynamic_cast<const TokenWindows*>(&train);
  if (!tokens) throw std::invalid_argument("eval.every_steps needs data.kind = \"tokens\"");
  if (spec.eval_path.empty()) return tokens->tokens();
  auto eval = std::make_shared<data::TokenData>(std::vector<data::Source>{{spec.eval_path, 1.0}},
                                                tokens->tokens()->context(), spec.seed, 1.0);
  if (eval->tokenizer_fingerprint() != tokens->tokens()->tokenizer_fingerprint())
    throw std::invalid_argument("data.eval_path '" + spec.eval_path +
                                "' was tokenized differently from the training data (" +
                                data::same_tokenizer_advice(token_sources(spec)[0].path) + ")");
  return eval;
}

}  // namespace troupe::workers

namespace troupe::workers {

std::unique_ptr<models::Model> build_model(const WorkerSpec& spec, const models::ModelSpec& m,
                                           const models::Dataset& data) {
  if (m.kind == "mlp" || m.kind == "gpt") {
    if (m.kind == "mlp" && m.mlp_sizes.front() != data.input_width())
      throw std::invalid_argument("model.inputs = " + std::to_string(m.mlp_sizes.front()) +
                                  " but data.kind = \"" + spec.data_kind + "\" has " +
                                  std::to_string(data.input_width()) + " inputs per sample");
    if (m.kind == "mlp" && data.classes() > m.mlp_sizes.back())
      throw std::invalid_argument("model.classes = " + std::to_string(m.mlp_sizes.back()) +
                                  " but data.kind = \"" + spec.data_kind + "\" has " +
                                  std::to_string(data.classes()) + " classes");
    return std::make_unique<models::Model>(m);
  }
  const models::ModelKind* kind = spec.extensions ? spec.extensions->model(m.kind) : nullptr;
  if (!kind)
    throw std::invalid_argument("model.kind = \"" + m.kind +
                                "\" is not a kind this program has (it is built into the "
                                "program that started the job: run its agents from it)");
  auto blocks = named("model.kind = \"" + m.kind + "\"", [&] {
    return kind->build(models::options_of(kind->options, spec.model_options), data);
  });
  return std::make_unique<models::Model>(m, std::move(blocks));
}

}  // namespace troupe::workers
