#include "models/blocks.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <tuple>

#include "models/random.h"

namespace troupe::models {

void fill_normal(Tensor& t, Rng& rng, double stddev) {
  float* p = t.data();
  for (size_t i = 0; i < t.numel(); ++i) p[i] = float(rng.normal() * stddev);
}
void fill_uniform(Tensor& t, Rng& rng, double bound) {
  float* p = t.data();
  for (size_t i = 0; i < t.numel(); ++i) p[i] = float((rng.uniform() * 2 - 1) * bound);
}

namespace {

void fill_const(Tensor& t, float v) {
  float* p = t.data();
  for (size_t i = 0; i < t.numel(); ++i) p[i] = v;
}

thread_local int lazy_parameters = 0;

}  // namespace

LazyParameters::LazyParameters() { ++lazy_parameters; }
LazyParameters::~LazyParameters() { --lazy_parameters; }
bool LazyParameters::active() { return lazy_parameters > 0; }

void Block::to(Compute& compute) {
  if (!runs_on(compute.device()))
    throw std::invalid_argument("a '" + kind() + "' block runs on the CPU only, not on " +
                                compute.describe());
  compute.move_storage(params_);
  compute.move_storage(grads_);
  compute_ = &compute;
}

Tensor& Block::ensure(Tensor& t, std::vector<size_t> shape) {
  if (!t.defined() || t.shape() != shape || &t.storage()->compute() != compute_)
    t = compute_->tensor(std::move(shape));
  return t;
}

Tensor& Block::zeroed(Tensor& t, std::vector<size_t> shape) {
  ensure(t, std::move(shape));
  compute_->zero(t.data(), t.bytes());
  return t;
}

namespace {

class LinearBlock : public Block {
 public:
  LinearBlock(size_t in, size_t out, bool relu) : in_(in), out_(out), relu_(relu) {
    allocate(in * out + out);
    Carver c{this};
    std::tie(w_, dw_) = c.take("weight", {out, in});
    std::tie(b_, db_) = c.take("bias", {out});
  }
  std::string kind() const override { return relu_ ? "linear_relu" : "linear"; }
  bool runs_on(Device) const override { return true; }
  double flops_per_sample() const override { return 3.0 * 2.0 * double(in_) * double(out_); }
  void init(uint64_t seed, size_t index) override {
    // PyTorch's default for nn.Linear: U(-1/sqrt(in), 1/sqrt(in)) for weight and bias.
    Rng rng(mix(seed, index, 0x11));
    double bound = 1.0 / std::sqrt(double(in_));
    fill_uniform(w_, rng, bound);
    fill_uniform(b_, rng, bound);
  }
  Tensor forward(const Tensor& input, size_t B) override {
    if (input.numel() != B * in_)
      throw std::invalid_argument("linear block: input is not (B, " + std::to_string(in_) + ")");
    const Tensor x = compute_->on_device(input);
    x_ = x;
    B_ = B;
    ensure(pre_, {B, out_});
    compute_->linear_forward(pre_.data(), x.data(), w_.data(), b_.data(), B, in_, out_);
    if (!relu_) return pre_;
    ensure(out_act_, {B, out_});
    compute_->relu_forward(out_act_.data(), pre_.data(), B * out_);
    return out_act_;
  }
  Tensor backward(const Tensor& grad) override {
    const Tensor dy = compute_->on_device(grad);
    const Tensor* dpre = &dy;
    if (relu_) {
      ensure(dpre_, {B_, out_});
      compute_->relu_backward(dpre_.data(), dy.data(), pre_.data(), B_ * out_);
      dpre = &dpre_;
    }
    if (!needs_input_grad_) {
      compute_->linear_backward(static_cast<float*>(nullptr), dw_.data(), db_.data(), dpre->data(),
                                x_.data(), w_.data(), B_, in_, out_);
      return Tensor();
    }
    Tensor& dx = zeroed(dx_, {B_, in_});
    compute_->linear_backward(dx.data(), dw_.data(), db_.data(), dpre->data(), x_.data(), w_.data(),
                              B_, in_, out_);
    return dx;
  }

  Saved save() override {
    auto c =
        std::make_shared<Cache>(Cache{std::move(x_), std::move(pre_), std::move(out_act_), B_});
    x_ = pre_ = out_act_ = Tensor();
    return c;
  }
  void restore(const Saved& saved) override {
    auto& c = *std::static_pointer_cast<Cache>(saved);
    x_ = c.x, pre_ = c.pre, out_act_ = c.out_act, B_ = c.B;
  }

 private:
  size_t in_, out_;
  bool relu_;
  Tensor w_, dw_, b_, db_;
  Tensor x_, pre_, out_act_, dpre_, dx_;
  size_t B_ = 0;
  struct Cache {
    Tensor x, pre, out_act;
    size_t B;
  };
};

class EmbeddingBlock : public Block {
 public:
  EmbeddingBlock(size_t vocab, size_t context, size_t C) : V_(vocab), T_(context), C_(C) {
    allocate(vocab * C + context * C);
    Carver c{this};
    std::tie(wte_, dwte_) = c.take("tok.weight", {vocab, C});
    std::tie(wpe_, dwpe_) = c.take("pos.weight", {context, C});
  }
  std::string kind() const override { return "embedding"; }
  bool runs_on(Device) const override { return true; }
  double flops_per_sample() const override { return 2.0 * double(T_) * double(C_); }
  void init(uint64_t seed, size_t index) override {
    Rng rng(mix(seed, index, 0x22));
    fill_normal(wte_, rng, 0.02);
    fill_normal(wpe_, rng, 0.01);
  }
  Tensor forward(const Tensor& input, size_t B) override {
    const Tensor x = cpu_compute().on_device(input);  // (the ids are checked on the host)
    size_t T = x.numel() / B;
    if (x.numel() != B * T || T == 0 || T > T_) {
      throw std::invalid_argument("embedding block: input is not (B, T<=" + std::to_string(T_) +
                                  ") token ids");
    }
    tokens_.resize(B * T);
    const float* ids = x.data();
    for (size_t i = 0; i < B * T; ++i) {
      if (!(ids[i] >= 0) || ids[i] >= float(V_) || ids[i] != std::floor(ids[i])) {
        throw std::invalid_argument("embedding block: token id " + std::to_string(ids[i]) +
                                    " outside the vocabulary of " + std::to_string(V_));
      }
      tokens_[i] = int32_t(ids[i]);
    }
    B_ = B;
    Tcur_ = T;
    ensure(out_, {B, T, C_});
    compute_->embedding_forward(out_.data(), tokens_.data(), wte_.data(), wpe_.data(), B, T, C_);
    return out_;
  }
  Tensor backward(const Tensor& grad) override {
    const Tensor dy = compute_->on_device(grad);
    compute_->embedding_backward(dwte_.data(), dwpe_.data(), dy.data(), tokens_.data(), B_, Tcur_,
                                 C_);
    return Tensor();
  }
  Tensor& wte() { return wte_; }
  Tensor& dwte() { return dwte_; }
  Saved save() override {
    auto c = std::make_shared<Cache>(Cache{std::move(tokens_), std::move(out_), B_, Tcur_});
    tokens_.clear();
    out_ = Tensor();
    return c;
  }
  void restore(const Saved& saved) override {
    auto& c = *std::static_pointer_cast<Cache>(saved);
    tokens_ = c.tokens, out_ = c.out, B_ = c.B, Tcur_ = c.T;
  }

 private:
  size_t V_, T_, C_;
  Tensor wte_, dwte_, wpe_, dwpe_;
  std::vector<int32_t> tokens_;
  Tensor out_;
  size_t B_ = 0, Tcur_ = 0;
  struct Cache {
    std::vector<int32_t> tokens;
    Tensor out;
    size_t B, T;
  };
};

class TransformerBlock : public Block {
 public:
  TransformerBlock(size_t context, size_t C, size_t NH, size_t layers)
      : T_(context), C_(C), NH_(NH), layers_(layers) {
    if (C % NH != 0) throw std::invalid_argument("d_model must be divisible by heads");
    allocate(2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C);
    Carver c{this};
    std::tie(ln1w_, dln1w_) = c.take("ln1.weight", {C});
    std::tie(ln1b_, dln1b_) = c.take("ln1.bias", {C});
    std::tie(qkvw_, dqkvw_) = c.take("qkv.weight", {3 * C, C});
    std::tie(qkvb_, dqkvb_) = c.take("qkv.bias", {3 * C});
    std::tie(projw_, dprojw_) = c.take("proj.weight", {C, C});
    std::tie(projb_, dprojb_) = c.take("proj.bias", {C});
    std::tie(ln2w_, dln2w_) = c.take("ln2.weight", {C});
    std::tie(ln2b_, dln2b_) = c.take("ln2.bias", {C});
    std::tie(fcw_, dfcw_) = c.take("fc.weight", {4 * C, C});
    std::tie(fcb_, dfcb_) = c.take("fc.bias", {4 * C});
    std::tie(fcprojw_, dfcprojw_) = c.take("fc_out.weight", {C, 4 * C});
    std::tie(fcprojb_, dfcprojb_) = c.take("fc_out.bias", {C});
  }
  std::string kind() const override { return "transformer"; }
  bool runs_on(Device) const override { return true; }
  double flops_per_sample() const override {
    double T = double(T_), C = double(C_);
    double fwd = 2.0 * T * 12.0 * C * C + 4.0 * T * T * C;
    return 3.0 * fwd;
  }
  void init(uint64_t seed, size_t index) override {
    Rng rng(mix(seed, index, 0x33));
    fill_const(ln1w_, 1.0f);
    fill_const(ln2w_, 1.0f);
    fill_normal(qkvw_, rng, 0.02);
    fill_normal(fcw_, rng, 0.02);
    // Residual projections scaled down by depth (GPT-2).
    double resid = 0.02 / std::sqrt(2.0 * double(layers_));
    fill_normal(projw_, rng, resid);
    fill_normal(fcprojw_, rng, resid);
  }
  Tensor forward(const Tensor& input, size_t B) override {
    size_t N = input.numel() / C_;
    size_t T = N / B;
    if (input.numel() != B * T * C_ || T == 0 || T > T_)
      throw std::invalid_argument("transformer block: input is not (B, T, C)");
    const Tensor x = compute_->on_device(input);
    B_ = B;
    Tc_ = T;
    const size_t C = C_;
    x_ = x;
    ensure(ln1_, {N, C});
    ensure(ln1m_, {N});
    ensure(ln1r_, {N});
    ensure(qkv_, {N, 3 * C});
    ensure(att_, {compute_->attention_saved(B, T, NH_)});
    ensure(atty_, {N, C});
    ensure(proj_, {N, C});
    ensure(x2_, {N, C});
    ensure(ln2_, {N, C});
    ensure(ln2m_, {N});
    ensure(ln2r_, {N});
    ensure(fch_, {N, 4 * C});
    ensure(fchg_, {N, 4 * C});
    ensure(fcproj_, {N, C});
    ensure(out_, {N, C});
    compute_->layernorm_forward(ln1_.data(), ln1m_.data(), ln1r_.data(), x.data(), ln1w_.data(),
                                ln1b_.data(), N, C);
    compute_->linear_forward(qkv_.data(), ln1_.data(), qkvw_.data(), qkvb_.data(), N, C, 3 * C);
    compute_->attention_forward(atty_.data(), att_.data(), qkv_.data(), B, T, C, NH_);
    compute_->linear_forward(proj_.data(), atty_.data(), projw_.data(), projb_.data(), N, C, C);
    compute_->residual_forward(x2_.data(), x.data(), proj_.data(), N * C);
    compute_->layernorm_forward(ln2_.data(), ln2m_.data(), ln2r_.data(), x2_.data(), ln2w_.data(),
                                ln2b_.data(), N, C);
    compute_->linear_forward(fch_.data(), ln2_.data(), fcw_.data(), fcb_.data(), N, C, 4 * C);
    compute_->gelu_forward(fchg_.data(), fch_.data(), N * 4 * C);
    compute_->linear_forward(fcproj_.data(), fchg_.data(), fcprojw_.data(), fcprojb_.data(), N,
                             4 * C, C);
    compute_->residual_forward(out_.data(), x2_.data(), fcproj_.data(), N * C);
    return out_;
  }
  Tensor backward(const Tensor& grad) override {
    const Tensor dy = compute_->on_device(grad);
    const size_t C = C_, N = B_ * Tc_;
    // Scratch gradients, zeroed: the kernels accumulate.
    Tensor& dx = zeroed(g_dx_, {N, C});
    Tensor& dx2 = zeroed(g_dx2_, {N, C});
    Tensor& dfchg = zeroed(g_dfchg_, {N, 4 * C});
    Tensor& dfch = zeroed(g_dfch_, {N, 4 * C});
    Tensor& dln2 = zeroed(g_dln2_, {N, C});
    Tensor& datty = zeroed(g_datty_, {N, C});
    Tensor& dqkv = zeroed(g_dqkv_, {N, 3 * C});
    Tensor& dln1 = zeroed(g_dln1_, {N, C});
    // out = x2 + fcproj: both get dy (fcproj's through the linear below)
    compute_->copy(dx2.data(), dy.data(), N * C * sizeof(float));
    compute_->linear_backward(dfchg.data(), dfcprojw_.data(), dfcprojb_.data(), dy.data(),
                              fchg_.data(), fcprojw_.data(), N, 4 * C, C);
    compute_->gelu_backward(dfch.data(), dfchg.data(), fch_.data(), N * 4 * C);
    compute_->linear_backward(dln2.data(), dfcw_.data(), dfcb_.data(), dfch.data(), ln2_.data(),
                              fcw_.data(), N, C, 4 * C);
    compute_->layernorm_backward(dx2.data(), dln2w_.data(), dln2b_.data(), dln2.data(), x2_.data(),
                                 ln2w_.data(), ln2m_.data(), ln2r_.data(), N, C);
    // x2 = x + proj
    compute_->copy(dx.data(), dx2.data(), N * C * sizeof(float));
    compute_->linear_backward(datty.data(), dprojw_.data(), dprojb_.data(), dx2.data(),
                              atty_.data(), projw_.data(), N, C, C);
    compute_->attention_backward(dqkv.data(), datty.data(), qkv_.data(), atty_.data(), att_.data(),
                                 B_, Tc_, C, NH_);
    compute_->linear_backward(dln1.data(), dqkvw_.data(), dqkvb_.data(), dqkv.data(), ln1_.data(),
                              qkvw_.data(), N, C, 3 * C);
    compute_->layernorm_backward(dx.data(), dln1w_.data(), dln1b_.data(), dln1.data(), x_.data(),
                                 ln1w_.data(), ln1m_.data(), ln1r_.data(), N, C);
    return dx;
  }

 private:
  size_t T_, C_, NH_, layers_;
  Tensor ln1w_, dln1w_, ln1b_, dln1b_, qkvw_, dqkvw_, qkvb_, dqkvb_, projw_, dprojw_, projb_,
      dprojb_;
  Tensor ln2w_, dln2w_, ln2b_, dln2b_, fcw_, dfcw_, fcb_, dfcb_, fcprojw_, dfcprojw_, fcprojb_,
      dfcprojb_;
  Tensor x_, ln1_, ln1m_, ln1r_, qkv_, att_, atty_, proj_, x2_, ln2_, ln2m_, ln2r_, fch_, fchg_,
      fcproj_, out_;
  Tensor g_dx_, g_dx2_, g_dfchg_, g_dfch_, g_dln2_, g_datty_, g_dqkv_, g_dln1_;
  size_t B_ = 0, Tc_ = 0;
  // The forward cache, in a fixed order (save/restore).
  std::vector<Tensor*> cached() {
    // (proj_ and fcproj_ are scratch: backward does not read them.)
    return {&x_,  &ln1_, &ln1m_, &ln1r_, &qkv_, &att_,  &atty_,
            &x2_, &ln2_, &ln2m_, &ln2r_, &fch_, &fchg_, &out_};
  }
  struct Cache {
    std::vector<Tensor> tensors;
    size_t B, T;
  };

 public:
  Saved save() override {
    auto c = std::make_shared<Cache>();
    for (Tensor* t : cached()) {
      c->tensors.push_back(std::move(*t));
      *t = Tensor();
    }
    c->B = B_, c->T = Tc_;
    return c;
  }
  void restore(const Saved& saved) override {
    auto& c = *std::static_pointer_cast<Cache>(saved);
    auto mine = cached();
    for (size_t i = 0; i < mine.size(); ++i) *mine[i] = c.tensors[i];
    B_ = c.B, Tc_ = c.T;
  }
};

class HeadBlock : public Block {
 public:
  HeadBlock(size_t vocab, size_t context, size_t C, EmbeddingBlock* tie)
      : V_(vocab), T_(context), C_(C), tied_(tie != nullptr) {
    allocate(2 * C + (tie ? 0 : vocab * C));
    Carver c{this};
    std::tie(lnw_, dlnw_) = c.take("ln_f.weight", {C});
    std::tie(lnb_, dlnb_) = c.take("ln_f.bias", {C});
    if (tie) {
      w_ = tie->wte();
      dw_ = tie->dwte();
    } else {
      std::tie(w_, dw_) = c.take("head.weight", {vocab, C});
    }
  }
  std::string kind() const override { return tied_ ? "head_tied" : "head"; }
  bool runs_on(Device) const override { return true; }
  double flops_per_sample() const override {
    return 3.0 * 2.0 * double(T_) * double(C_) * double(V_);
  }
  void init(uint64_t seed, size_t index) override {
    Rng rng(mix(seed, index, 0x44));
    fill_const(lnw_, 1.0f);
    if (!tied_) fill_normal(w_, rng, 0.02);
  }
  Tensor forward(const Tensor& input, size_t B) override {
    N_ = input.numel() / C_;
    if (input.numel() != N_ * C_ || N_ % B != 0)
      throw std::invalid_argument("head block: input is not (B, T, C)");
    const Tensor x = compute_->on_device(input);
    x_ = x;
    ensure(ln_, {N_, C_});
    ensure(m_, {N_});
    ensure(r_, {N_});
    ensure(logits_, {N_, V_});
    compute_->layernorm_forward(ln_.data(), m_.data(), r_.data(), x.data(), lnw_.data(),
                                lnb_.data(), N_, C_);
    compute_->linear_forward(logits_.data(), ln_.data(), w_.data(),
                             static_cast<const float*>(nullptr), N_, C_, V_);
    return logits_;
  }
  Tensor backward(const Tensor& grad) override {
    const Tensor dy = compute_->on_device(grad);
    Tensor& dln = zeroed(dln_, {N_, C_});
    Tensor& dx = zeroed(dx_, {N_, C_});
    compute_->linear_backward(dln.data(), dw_.data(), static_cast<float*>(nullptr), dy.data(),
                              ln_.data(), w_.data(), N_, C_, V_);
    compute_->layernorm_backward(dx.data(), dlnw_.data(), dlnb_.data(), dln.data(), x_.data(),
                                 lnw_.data(), m_.data(), r_.data(), N_, C_);
    return dx;
  }

 private:
  size_t V_, T_, C_;
  bool tied_;
  Tensor lnw_, dlnw_, lnb_, dlnb_, w_, dw_;
  Tensor x_, ln_, m_, r_, logits_, dln_, dx_;
  size_t N_ = 0;
  struct Cache {
    Tensor x, ln, m, r, logits;
    size_t N;
  };

 public:
  Saved save() override {
    auto c = std::make_shared<Cache>(
        Cache{std::move(x_), std::move(ln_), std::move(m_), std::move(r_), std::move(logits_), N_});
    x_ = ln_ = m_ = r_ = logits_ = Tensor();
    return c;
  }
  void restore(const Saved& saved) override {
    auto& c = *std::static_pointer_cast<Cache>(saved);
    x_ = c.x, ln_ = c.ln, m_ = c.m, r_ = c.r, logits_ = c.logits, N_ = c.N;
  }
};

}  // namespace

std::unique_ptr<Block> make_linear_block(size_t in, size_t out, bool relu) {
  return std::make_unique<LinearBlock>(in, out, relu);
}
std::unique_ptr<Block> make_embedding_block(size_t vocab, size_t context, size_t d_model) {
  return std::make_unique<EmbeddingBlock>(vocab, context, d_model);
}
std::unique_ptr<Block> make_transformer_block(size_t context, size_t d_model, size_t heads,
                                              size_t layers) {
  return std::make_unique<TransformerBlock>(context, d_model, heads, layers);
}
std::unique_ptr<Block> make_head_block(size_t vocab, size_t context, size_t d_model,
                                       Block* tie_to) {
  EmbeddingBlock* tie = nullptr;
  if (tie_to) {
    tie = dynamic_cast<EmbeddingBlock*>(tie_to);
    if (!tie) throw std::invalid_argument("a tied head needs the embedding block");
  }
  return std::make_unique<HeadBlock>(vocab, context, d_model, tie);
}

}  // namespace troupe::models
