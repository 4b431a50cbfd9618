// Your own training loop, made elastic: a two-layer network, its backward pass, its Adam and its
// data are all this file's own (nothing of Troupe's models is used). Troupe's ElasticLoop is
// called at the step boundaries: the members of the job may be killed, join and leave while it
// trains, and every member ends with the same parameters.
//
//   troupe coordinator examples/own_loop/own_loop.toml      # a job of model.kind = "external"
//   own_loop --join HOST:PORT --token-file RUN_DIR/job.token  # one per member (2 to start)
//
// The gradients live in the loop's shared memory (ElasticLoop::shared_floats), so the members of
// a host read one another's in place when they sum them; `--own-memory` keeps them in this
// program's memory instead (the sums copy them; the same result bits). `--hidden N` sets the
// width of the hidden layer (128).
//
// Expected output, per member: a line per 100 steps, then
// "own_loop: job 'own-loop' ended (exit 0: the job is finished): 400 steps here, loss 1.59 -> 0.11,
// state 69845c59c215c5e3, 0 sums read in place" (the gradients of the default width take 19 KB, below the size from
// which the sums read them in place: 256 KiB on Intel CPUs, 2 MiB on AMD).
// Exits with the job's exit code (0 when it completed), 1 when the loss did not fall below
// 0.8 ln 4 (four classes: ln 4 is a guess).
#include <troupe/workers/elastic_loop.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr size_t kIn = 32, kClasses = 4;

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
double uniform(uint64_t& s) { return double(splitmix(s++) >> 11) * 0x1.0p-53; }
double normal(uint64_t& s) {
  const double u = std::max(uniform(s), 1e-300), v = uniform(s);
  return std::sqrt(-2 * std::log(u)) * std::cos(6.283185307179586 * v);
}

// The data: the sample at global position p, a pure function of (seed, p): four noisy clusters.
void sample(uint64_t seed, uint64_t p, float* x, int& label) {
  uint64_t s = splitmix(seed * 1000003 + p);
  label = int(splitmix(s) % kClasses);
  for (size_t i = 0; i < kIn; ++i) {
    uint64_t c = seed + uint64_t(label) * kIn + i;  // the cluster's centre, from the seed
    x[i] = float(0.6 * normal(c) + normal(s));
  }
}

// The model and its optimizer: parameters, Adam's moments and its step count, in one buffer
// (what LoopState saves, and what every member must end with).
struct Model {
  size_t hidden;               // H
  std::vector<float> p, m, v;  // w1 (H x In), b1 (H), w2 (C x H), b2 (C); Adam's moments
  double adam_t = 0;
  static size_t size(size_t hidden) { return hidden * (kIn + 1 + kClasses) + kClasses; }
  size_t size() const { return size(hidden); }
  Model(uint64_t seed, size_t width)
      : hidden(width), p(size(width)), m(size(width)), v(size(width)) {
    uint64_t s = splitmix(seed);
    for (size_t i = 0; i < hidden * kIn; ++i) p[i] = float(normal(s) / std::sqrt(double(kIn)));
    for (size_t i = 0; i < kClasses * hidden; ++i)
      p[hidden * kIn + hidden + i] = float(normal(s) / std::sqrt(double(hidden)));
  }
  float* w1() { return p.data(); }
  float* b1() { return w1() + hidden * kIn; }
  float* w2() { return b1() + hidden; }
  float* b2() { return w2() + kClasses * hidden; }

  // Loss of one sample, its gradient (scaled) added into g.
  double forward_backward(const float* x, int label, double scale, float* g) {
    std::vector<float> h(hidden), dh(hidden);  // (dh: zeros)
    float logits[kClasses];
    for (size_t j = 0; j < hidden; ++j) {
      float a = b1()[j];
      for (size_t i = 0; i < kIn; ++i) a += w1()[j * kIn + i] * x[i];
      h[j] = std::tanh(a);
    }
    float mx = -1e30f;
    for (size_t c = 0; c < kClasses; ++c) {
      logits[c] = b2()[c];
      for (size_t j = 0; j < hidden; ++j) logits[c] += w2()[c * hidden + j] * h[j];
      mx = std::max(mx, logits[c]);
    }
    double sum = 0;
    for (size_t c = 0; c < kClasses; ++c) sum += std::exp(double(logits[c] - mx));
    float* gw1 = g;
    float* gb1 = gw1 + hidden * kIn;
    float* gw2 = gb1 + hidden;
    float* gb2 = gw2 + kClasses * hidden;
    for (size_t c = 0; c < kClasses; ++c) {
      const double prob = std::exp(double(logits[c] - mx)) / sum;
      const float d = float((prob - (int(c) == label ? 1.0 : 0.0)) * scale);
      gb2[c] += d;
      for (size_t j = 0; j < hidden; ++j) {
        gw2[c * hidden + j] += d * h[j];
        dh[j] += d * w2()[c * hidden + j];
      }
    }
    for (size_t j = 0; j < hidden; ++j) {
      const float da = dh[j] * (1 - h[j] * h[j]);
      gb1[j] += da;
      for (size_t i = 0; i < kIn; ++i) gw1[j * kIn + i] += da * x[i];
    }
    return -(double(logits[label] - mx) - std::log(sum)) * scale;
  }

  void adam(const float* g, double lr) {
    adam_t += 1;
    const double c1 = 1 - std::pow(0.9, adam_t), c2 = 1 - std::pow(0.999, adam_t);
    for (size_t i = 0; i < p.size(); ++i) {
      m[i] = 0.9f * m[i] + 0.1f * g[i];
      v[i] = 0.999f * v[i] + 0.001f * g[i] * g[i];
      p[i] -= float(lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + 1e-8));
    }
  }

  std::vector<uint8_t> save() const {
    std::vector<uint8_t> out((3 * p.size()) * sizeof(float) + sizeof adam_t);
    uint8_t* at = out.data();
    for (const auto* buf : {&p, &m, &v}) {
      std::memcpy(at, buf->data(), buf->size() * sizeof(float));
      at += buf->size() * sizeof(float);
    }
    std::memcpy(at, &adam_t, sizeof adam_t);
    return out;
  }
  void load(const std::vector<uint8_t>& in) {
    if (in.size() != 3 * p.size() * sizeof(float) + sizeof adam_t)
      throw std::runtime_error("a state of another model");
    const uint8_t* at = in.data();
    for (auto* buf : {&p, &m, &v}) {
      std::memcpy(buf->data(), at, buf->size() * sizeof(float));
      at += buf->size() * sizeof(float);
    }
    std::memcpy(&adam_t, at, sizeof adam_t);
  }
};

struct Args {
  troupe::LoopOptions loop;
  size_t hidden = 128;
  bool own_memory = false;  // the gradients in this program's memory, not the loop's shared one
};

const char* kUsage =
    "usage: own_loop --join HOST:PORT --token-file FILE [--name N] [--hidden N] [--own-memory] "
    "[--failure-timeout-ms MS]";

Args args_from(int argc, char** argv) {
  Args a;
  troupe::LoopOptions& o = a.loop;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::printf(
          "%s\n(the members of a troupe job of model.kind = \"external\"; see the top "
          "of examples/own_loop/own_loop.cpp)\n",
          kUsage);
      std::exit(0);
    }
    if (flag == "--own-memory") {
      a.own_memory = true;
      continue;
    }
    if (i + 1 == argc) throw std::invalid_argument(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--join")
      o.join = value;
    else if (flag == "--token-file")
      o.token_file = value;
    else if (flag == "--name")
      o.name = value;
    else if (flag == "--failure-timeout-ms")
      o.failure_timeout_ms = std::stoll(value);
    else if (flag == "--hidden")
      a.hidden = std::stoul(value);
    else
      throw std::invalid_argument("unknown flag " + flag);
  }
  if (o.join.empty() || o.token_file.empty() || a.hidden == 0) throw std::invalid_argument(kUsage);
  return a;
}

// n zeros for the gradients: in the loop's shared memory (the host's other members read them in
// place), else in `own` (their sums copy them; the same bits).
float* gradient_buffer(troupe::ElasticLoop& loop, size_t n, bool own_memory,
                       std::vector<float>& own) {
  if (!own_memory) {
    try {
      return loop.shared_floats(n);
    } catch (const std::runtime_error& e) {
      std::fprintf(stderr, "own_loop: the gradients in our own memory: %s\n", e.what());
    }
  }
  own.assign(n, 0.0f);
  return own.data();
}

}  // namespace

int main(int argc, char** argv) try {
  const Args args = args_from(argc, argv);
  std::unique_ptr<Model> model;  // (built once the job's seed is known)
  troupe::ElasticLoop loop(args.loop, {[&] { return model->save(); },
                                       [&](const std::vector<uint8_t>& b) { model->load(b); }});
  const troupe::LoopJob& job = loop.job();
  model = std::make_unique<Model>(job.seed, args.hidden);  // every first member's is the same
  const size_t n = model->size();
  std::vector<float> own, x(kIn);
  float* grad = gradient_buffer(loop, n, args.own_memory, own);
  double first = -1, last = 0;
  uint64_t trained = 0;
  while (auto step = loop.next_step()) {
    std::fill(grad, grad + n, 0.0f);
    double loss = 0;
    for (uint64_t pos = step->begin; pos < step->end; ++pos) {
      int label = 0;
      sample(job.seed, pos, x.data(), label);
      loss += model->forward_backward(x.data(), label, 1.0 / double(job.global_batch), grad);
    }
    if (!loop.allreduce(grad, n)) continue;                 // a member was lost: redo the step
    const std::optional<double> total = loop.commit(loss);  // the step's loss, all members'
    if (!total) continue;
    model->adam(grad, step->lr);  // (the job's optimizer.lr, or what `troupe lr` set since)
    if (first < 0) first = *total;
    last = *total;
    ++trained;
    if (step->step % 100 == 0)
      std::printf("own_loop: step %llu, rank %u of %u, loss %.4f\n", (unsigned long long)step->step,
                  step->rank, step->world_size, *total);
  }
  const std::vector<uint8_t> state = model->save();
  uint64_t h = 1469598103934665603ull;
  for (uint8_t b : state) h = (h ^ b) * 1099511628211ull;
  std::printf(
      "own_loop: job '%s' ended (exit %d%s%s): %llu steps here, loss %.2f -> %.2f, "
      "state %016llx, %llu sums read in place\n",
      job.name.c_str(), loop.exit_code(), loop.reason().empty() ? "" : ": ", loop.reason().c_str(),
      (unsigned long long)trained, first, last, (unsigned long long)h,
      (unsigned long long)loop.in_place_allreduces());
  if (loop.exit_code() != 0) return loop.exit_code();
  return trained > 0 && !(last < 0.8 * std::log(double(kClasses))) ? 1 : 0;  // it learnt
} catch (const std::exception& e) {
  std::fprintf(stderr, "own_loop: %s\n", e.what());
  return 2;
}
