// The data set and model a worker trains, from its spec: data.kind = "synthetic" | "text" |
// "tokens" | a program's own; model.kind = "mlp" | "gpt" | a program's own (models/extension.h).
#pragma once

#include <memory>

#include "models/data.h"
#include "models/model.h"
#include "workers/worker.h"

namespace troupe::workers {

// Opens the data set and sets model.vocab from it (text: its characters; tokens: the
// tokenizer's ids). Throws std::invalid_argument naming what is wrong.
std::unique_ptr<models::Dataset> open_dataset(const WorkerSpec& spec, models::ModelSpec& model);

// Builds the model (uninitialised) for the data set. A program's own kind is built by its
// ModelKind::build; throws std::invalid_argument naming what is wrong (a kind this program does
// not have, a model whose input or output does not fit the data).
std::unique_ptr<models::Model> build_model(const WorkerSpec& spec, const models::ModelSpec& model,
                                           const models::Dataset& data);

// The held-out windows a job evaluates on: data.eval_path's, or the tail of the training sets
// (data.eval_fraction, sharing train's mapping); null when the job does not evaluate.
std::shared_ptr<const data::TokenData> open_eval_set(const WorkerSpec& spec,
                                                     const models::Dataset& train);

// data.path, or data.mix's sets with their weights.
std::vector<data::Source> token_sources(const WorkerSpec& spec);

}  // namespace troupe::workers
