// CPU kernels with explicit forward and backward, side by side (llm.c style). Templated on the
// element type: the model runs in float; the gradient tests run the same code in double against
// central finite differences.
//
// Legend: B batch, T time (sequence), C channels, OC output channels, NH heads, hs = C/NH head
// size, V vocabulary. Arrays are row-major; "(B,T,C)" means B*T rows of C.
// Backward functions ACCUMULATE into parameter gradients (+=) and into input gradients (+=), so a
// micro-batch loop accumulates for free; callers zero gradients once per step.
#pragma once

#include <cstddef>
#include <cstdint>

namespace troupe::models::kernels {

// out(N,OC) = inp(N,C) @ weight(OC,C)^T + bias(OC)   (bias may be null)
template <typename T>
void linear_forward(T* out, const T* inp, const T* weight, const T* bias, size_t N, size_t C,
                    size_t OC);
template <typename T>
void linear_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     size_t N, size_t C, size_t OC);

template <typename T>
void relu_forward(T* out, const T* inp, size_t n);
template <typename T>
void relu_backward(T* dinp, const T* dout, const T* inp, size_t n);

// GELU, tanh approximation (GPT-2).
template <typename T>
void gelu_forward(T* out, const T* inp, size_t n);
template <typename T>
void gelu_backward(T* dinp, const T* dout, const T* inp, size_t n);

// out = a + b
template <typename T>
void residual_forward(T* out, const T* a, const T* b, size_t n);
// da += dout; db += dout
template <typename T>
void residual_backward(T* da, T* db, const T* dout, size_t n);

// LayerNorm over the last dimension. mean, rstd: (N) saved for backward.
template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                       size_t N, size_t C);
template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                        const T* mean, const T* rstd, size_t N, size_t C);

// out(B,T,C) = wte[tokens] + wpe[t]
template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, size_t B,
                       size_t T_, size_t C);
template <typename T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, size_t B, size_t T_,
                        size_t C);

// Causal multi-head self-attention. qkv: (B,T,3C) = [q | k | v]; out: (B,T,C).
// att: (B,NH,T,T) softmax probabilities saved for backward.
template <typename T>
void attention_forward(T* out, T* att, const T* qkv, size_t B, size_t T_, size_t C, size_t NH);
template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, size_t B, size_t T_,
                        size_t C, size_t NH);

// The same in bf16 mixed precision, as the CUDA device's tensor-core attention computes it
// (models/cuda/kernels.h; models/compute.h: kBf16AttentionMaxHead): q, k, v and dout rounded to
// bf16 where a product reads them, and so the probabilities and their gradient; products summed
// in f32, the softmax in f32 (att keeps the unrounded probabilities). Backward reads forward's out
// (each row's dot(dout, out), in f32, as the GPU).
void attention_forward_bf16(float* out, float* att, const float* qkv, size_t B, size_t T_, size_t C,
                            size_t NH);
void attention_backward_bf16(float* dqkv, const float* dout, const float* qkv, const float* out,
                             const float* att, size_t B, size_t T_, size_t C, size_t NH);

// Softmax cross-entropy over logits (N,V) with integer targets. Each row's loss is weighted by
// `scale` (1/global batch for a mean over the whole step), so losses and gradients of
// micro-batches and of ranks add up. Returns sum of scaled losses; writes dlogits (overwrite).
// correct (optional): count of rows whose argmax equals the target.
template <typename T>
double softmax_cross_entropy(T* dlogits, const T* logits, const int32_t* targets, size_t N,
                             size_t V, double scale, size_t* correct = nullptr);

}  // namespace troupe::models::kernels
