// The data set a worker trains on, from its spec: data.kind = "synthetic" | "text" | "tokens".
#pragma once

#include <memory>

#include "models/data.h"
#include "models/model.h"
#include "workers/worker.h"

namespace troupe::workers {

// Opens the data set and sets model.vocab from it (text: its characters; tokens: the
// tokenizer's ids). Throws std::invalid_argument naming what is wrong.
std::unique_ptr<models::Dataset> open_dataset(const WorkerSpec& spec, models::ModelSpec& model);

// The held-out windows a job evaluates on: data.eval_path's, or the tail of the training sets
// (data.eval_fraction, sharing train's mapping); null when the job does not evaluate.
std::shared_ptr<const data::TokenData> open_eval_set(const WorkerSpec& spec,
                                                     const models::Dataset& train);

// data.path, or data.mix's sets with their weights.
std::vector<data::Source> token_sources(const WorkerSpec& spec);

}  // namespace troupe::workers
