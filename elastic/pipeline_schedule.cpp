#include "elastic/pipeline_schedule.h"

#include <algorithm>

namespace troupe::elastic {
namespace {

using What = PipeMessage::What;
using Kind = PipeOp::Kind;

PipeOp op(Kind k, uint32_t micro) { return PipeOp{k, micro, std::nullopt, std::nullopt}; }

PipeOp exchange(std::optional<PipeMessage> send, std::optional<PipeMessage> recv) {
  return PipeOp{Kind::exchange, 0, send, recv};
}

}  // namespace

std::vector<PipeOp> one_f_one_b(uint32_t pp, uint32_t s, uint32_t m) {
  std::vector<PipeOp> ops;
  if (pp == 0 || s >= pp) return ops;
  const bool first = s == 0, last = s + 1 == pp;
  // The input of micro-batch j: the data set on the first stage, the previous stage otherwise.
  auto input = [&](uint32_t j) {
    ops.push_back(first ? op(Kind::load, j)
                        : exchange(std::nullopt, PipeMessage{What::activation, j}));
  };
  const uint32_t warmup = std::min(pp - s - 1, m);
  for (uint32_t j = 0; j < warmup; ++j) {
    input(j);
    ops.push_back(op(Kind::forward, j));
    ops.push_back(exchange(PipeMessage{What::activation, j}, std::nullopt));
  }
  if (m > warmup) input(warmup);
  // Steady state: forward j, backward i = j - warmup. The output of j goes out while the
  // gradient of i comes in; the input gradient of i goes back while the input of j + 1 comes in.
  for (uint32_t i = 0; i + warmup < m; ++i) {
    const uint32_t j = warmup + i;
    ops.push_back(op(Kind::forward, j));
    if (last)
      ops.push_back(op(Kind::loss, i));  // (i == j on the last stage)
    else
      ops.push_back(exchange(PipeMessage{What::activation, j}, PipeMessage{What::gradient, i}));
    ops.push_back(op(Kind::backward, i));
    if (j + 1 < m) {
      if (first)
        ops.push_back(op(Kind::load, j + 1));
      else
        ops.push_back(
            exchange(PipeMessage{What::gradient, i}, PipeMessage{What::activation, j + 1}));
    } else if (!first) {
      ops.push_back(exchange(PipeMessage{What::gradient, i}, std::nullopt));
    }
  }
  // Cool-down: the backwards of the warm-up's micro-batches.
  for (uint32_t i = m - warmup; i < m; ++i) {
    ops.push_back(exchange(std::nullopt, PipeMessage{What::gradient, i}));
    ops.push_back(op(Kind::backward, i));
    if (!first) ops.push_back(exchange(PipeMessage{What::gradient, i}, std::nullopt));
  }
  return ops;
}

std::string describe(const std::vector<PipeOp>& ops) {
  auto msg = [](const PipeMessage& x) {
    return std::string(x.what == What::activation ? "a" : "g") + std::to_string(x.micro);
  };
  std::string out;
  for (const auto& o : ops) {
    if (!out.empty()) out += ' ';
    switch (o.kind) {
      case Kind::load:
        out += "L" + std::to_string(o.micro);
        break;
      case Kind::forward:
        out += "F" + std::to_string(o.micro);
        break;
      case Kind::loss:
        out += "S" + std::to_string(o.micro);
        break;
      case Kind::backward:
        out += "B" + std::to_string(o.micro);
        break;
      case Kind::exchange:
        out += "x(";
        if (o.send) out += ">" + msg(*o.send);
        if (o.send && o.recv) out += ",";
        if (o.recv) out += "<" + msg(*o.recv);
        out += ")";
        break;
    }
  }
  return out;
}

}  // namespace troupe::elastic
