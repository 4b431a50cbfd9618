// CUDA kernels of the models, one for each CPU kernel in models/kernels.h and the optimizer, with
// the same shapes, layouts and meaning (the legend there: B, T, C, OC, NH, V; row-major), so that
// tests/gpu/kernels_test.cpp checks each against the CPU on the same inputs. Every pointer is
// device memory unless named host_; every call is asynchronous on `stream`.
//
// As on the CPU, backward functions accumulate (+=) into parameter and input gradients.
// Deterministic: no kernel uses atomics; every sum runs in a fixed order, so the same inputs give
// the same bits on every run (what parallel.deterministic needs, and what makes a failing
// comparison reproducible).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace troupe::models::cuda {

void relu_forward(float* out, const float* inp, size_t n, cudaStream_t stream);
void relu_backward(float* dinp, const float* dout, const float* inp, size_t n, cudaStream_t stream);

// GELU, tanh approximation (GPT-2).
void gelu_forward(float* out, const float* inp, size_t n, cudaStream_t stream);
void gelu_backward(float* dinp, const float* dout, const float* inp, size_t n, cudaStream_t stream);

// out = a + b; da += dout, db += dout.
void residual_forward(float* out, const float* a, const float* b, size_t n, cudaStream_t stream);
void residual_backward(float* da, float* db, const float* dout, size_t n, cudaStream_t stream);

// out(N,OC) += bias(OC) on every row; dbias(OC) += the column sums of dout(N,OC) (in a fixed
// order: per 32 rows, then over those sums).
void bias_forward(float* out, const float* bias, size_t N, size_t OC, cudaStream_t stream);
void bias_backward(float* dbias, const float* dout, size_t N, size_t OC, cudaStream_t stream);

// LayerNorm over the last dimension (eps 1e-5); mean, rstd (N) saved for backward. With
// `residual` non-null the input is inp + residual, written to `sum` first (the fused residual add
// of a transformer block: one read of each instead of two passes).
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, size_t N, size_t C, cudaStream_t stream,
                       const float* residual = nullptr, float* sum = nullptr);
// dweight and dbias are summed over the rows in a fixed order (per-block partial sums in
// `scratch`, then one pass over the blocks): scratch holds layernorm_scratch(N, C) floats.
size_t layernorm_scratch(size_t N, size_t C);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        size_t N, size_t C, float* scratch, cudaStream_t stream);

// out(B,T,C) = wte[tokens] + wpe[t].
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       size_t B, size_t T, size_t C, cudaStream_t stream);
// The positions of a batch grouped by token (built on the host from the host's copy of the
// tokens): the backward adds each token's rows in position order, without atomics.
struct TokenGroups {
  std::vector<int32_t> tokens;  // the distinct tokens, ascending
  std::vector<int32_t>
      offsets;  // tokens.size() + 1: group g is positions[offsets[g], offsets[g+1])
  std::vector<int32_t> positions;
};
TokenGroups group_tokens(const int32_t* host_tokens, size_t n);
// dwte[token] += the dout rows of its positions; dwpe[t] += the dout rows at time t. The groups'
// three arrays are on the device (uploaded from a TokenGroups).
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* group_tokens,
                        const int32_t* group_offsets, const int32_t* group_positions, size_t groups,
                        size_t B, size_t T, size_t C, cudaStream_t stream);

// Causal multi-head self-attention, fused: qkv (B,T,3C) = [q | k | v] -> out (B,T,C), with the
// softmax computed online (no T x T matrix in memory). lse (B,NH,T): each row's log-sum-exp of
// the scaled scores, saved for backward. Head size at most 256. Tiled (f32, CUDA cores): a block
// takes a run of one head's rows, a few lanes a row, the other side's rows through shared memory
// 16 at a time.
void attention_forward(float* out, float* lse, const float* qkv, size_t B, size_t T, size_t C,
                       size_t NH, cudaStream_t stream);
// dqkv += the gradient; recomputes the probabilities from qkv and lse. scratch holds B*NH*T
// floats (each row's dot(dout, out)).
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, size_t B, size_t T, size_t C, size_t NH, float* scratch,
                        cudaStream_t stream);

// The same on tensor cores, for mixed precision (model.dtype = "bf16"), head size at most
// kTensorCoreMaxHead: q, k, v and dout rounded to bf16 where a product reads them, and so the
// probabilities and their gradient (p_ij and ds_ij); every product summed in f32, the softmax in
// f32 (models/kernels.h's attention_forward_bf16 is the CPU's emulation of it). The forward runs
// two passes over the keys (each row's log-sum-exp, then the output); the backward's scratch as
// attention_backward's.
constexpr size_t kTensorCoreMaxHead = 128;
void attention_forward_bf16(float* out, float* lse, const float* qkv, size_t B, size_t T, size_t C,
                            size_t NH, cudaStream_t stream);
void attention_backward_bf16(float* dqkv, const float* dout, const float* qkv, const float* out,
                             const float* lse, size_t B, size_t T, size_t C, size_t NH,
                             float* scratch, cudaStream_t stream);

// Softmax cross-entropy, fused: reads logits (N,V) and writes dlogits (N,V), which may be the
// logits themselves (each element is read before it is written: in place, the logits are not
// stored twice); losses (N) gets each row's loss times `scale` (in double, as the CPU adds them);
// correct (N) whether the row's argmax (the first, on ties) is its target.
void softmax_cross_entropy(float* dlogits, const float* logits, double* losses, int32_t* correct,
                           const int32_t* targets, size_t N, size_t V, double scale,
                           cudaStream_t stream);

// The sum of x (n doubles) into *out in a fixed order: 256 strided partial sums, then a tree.
void sum_to_double(double* out, const double* x, size_t n, cudaStream_t stream);
// Sum of squares of g (n) into *out (one double): per-chunk float partial sums (chunks of 1024,
// 32 lanes: the CPU Compute's grad_norm_sq bit for bit), added in double by sum_to_double's fixed
// tree (not the CPU's sequential order: a last-bit difference). scratch: norm_scratch(n) doubles.
size_t norm_scratch(size_t n);
void grad_norm_sq(double* out, const float* g, size_t n, double* scratch, cudaStream_t stream);

// One AdamW step over a flat buffer, as models/optim.cpp: g scaled by grad_scale; c1, c2 the
// bias corrections 1 / (1 - beta^t).
struct AdamWStep {
  float lr, beta1, beta2, eps, weight_decay, c1, c2, grad_scale;
};
void adamw(float* p, const float* g, float* m, float* v, size_t n, const AdamWStep& s,
           cudaStream_t stream);
// SGD with momentum, as models/optim.cpp.
void sgd(float* p, const float* g, float* m, size_t n, float lr, float momentum, float weight_decay,
         float grad_scale, cudaStream_t stream);

// bf16 for mixed precision: out = round-to-nearest-even bf16 of inp (as uint16 bits), and back.
void to_bf16(uint16_t* out, const float* inp, size_t n, cudaStream_t stream);
void from_bf16(float* out, const uint16_t* inp, size_t n, cudaStream_t stream);

}  // namespace troupe::models::cuda
