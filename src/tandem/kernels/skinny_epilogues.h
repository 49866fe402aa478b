#pragma once
// The skinny products of a decode step with the small step after them as their epilogue: the gated
// feed-forward's (gate, up) product with silu(gate) * up, and the attention's q/k/v projection with
// RoPE and the key/value cache writes.
//
// Note [Skinny epilogues]
// After the skinny linear (Note [Skinny linear]) and the decode fusions (Note [Decode fusions]) a
// batch-1 decode step of the 1B folder spent about a third of its time outside the matrix products,
// in kernels of a few microseconds each: the norms, RoPE with the cache writes, the attention and
// the activation. Two of them need only values that one warp of the product before them can hold:
// silu(gate) * up needs feature f of the gate and of the up product, and RoPE rotates dimension d
// of a head with dimension d + rotary / 2 of the same head. So here one warp computes both rows of
// such a pair (warp_dots with two weight rows, the pieces of both in flight) and writes the
// activation, or the rotated pair straight into q, k and the caches; a head of v is computed in
// pairs too, only written. The products' sums are those of the skinny linear bit for bit (each lane
// walks its pieces in the same order), rounded to the compute dtype where the skinny linear stores
// them, and the epilogues do the separate kernels' arithmetic, so a step gives the same bits with
// or without them (TANDEM_DECODE_KERNELS=separate runs the kernels apart, for comparison).

//
// Note [Norm in the product]
// Two of a decoder layer's kernels did nothing but the residual add and the RMS norm before a
// product (add_rms_norm_cast): a few microseconds of one block for a row of C values, between two
// products that stream megabytes, so the GPU's memory idled through them. The (gate, up) product
// and the q/k/v product take the norm's inputs instead (NormedInput): each of their blocks, once
// its warps have asked for their first weight pieces (Note [Dependent launch]), waits for the
// kernels ahead, forms the norm of the step's rows into shared memory with the fused norm's
// arithmetic (add_rms_norm_row_on: eight warps playing its 512 threads, in its order of sums, so the
// bits are the same), and the warps dot their rows with it; block 0 alone writes the residual
// stream r = x + a. So the norm is computed once a block (every block reads the C values of x, a
// and the scale from L2) and a layer launches five kernels, not seven. TANDEM_DECODE_KERNELS=
// norms-apart runs the norms in their own kernels, for comparison.

#include <torch/torch.h>

#include <tuple>

namespace tandem {

/// Shared memory a block of a normed product gives its rows of x: within the 48 KB a launch may ask
/// for without opting in, beside the block's own (a launch past it is refused).
constexpr int64_t kSkinnyNormedBytes = 40 * 1024;

/// The input of a product that computes its own norm (Note [Norm in the product]): x = the fused
/// norm of r = stream + added (add_rms_norm_cast's arithmetic; added undefined: r = stream).
struct NormedInput {
  torch::Tensor stream;  // (N, C) fp32
  torch::Tensor added;   // (N, C) of the product's dtype, or undefined
  torch::Tensor scale;   // (C), as a float tensor
  double eps = 0.0;
  bool plus_one = false;
};

/// Whether the normed products take `in` for weights w of `dtype`: skinny_linear_takes of such an
/// x, the fused norm's width, `added` (where given) of that dtype, and the rows in shared memory.
bool skinny_norm_in_takes(const NormedInput& in, const torch::Tensor& w, torch::ScalarType dtype);

/// {r, skinny_silu_mul(x, w, bias)} of x the norm `in` describes (skinny_norm_in_takes).
std::pair<torch::Tensor, torch::Tensor> skinny_silu_mul(const NormedInput& in, const torch::Tensor& w,
                                                        const torch::Tensor& bias);

/// {r, q, k, v}: skinny_rope_kv of x the norm `in` describes (skinny_norm_in_takes), and r.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> skinny_rope_kv(
    const NormedInput& in, const torch::Tensor& w, const torch::Tensor& bias, int64_t heads, int64_t kv_heads,
    const torch::Tensor& cos, const torch::Tensor& sin, torch::Tensor& k_cache, torch::Tensor& v_cache,
    const torch::Tensor& page, const torch::Tensor& slot);

/// silu(x w[:F]^T + b[:F]) * (x w[F:]^T + b[F:]) (N, F) of x (N, K) and w (2F, K), bias (2F) or
/// undefined, where skinny_linear_takes(x, w); each product rounded to x's dtype first.
torch::Tensor skinny_silu_mul(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias);

/// The queries, keys and values of x (N, K) through w ((H + 2 KV) hd, K) and bias, where
/// skinny_linear_takes(x, w): q and k rotated by RoPE over their first cos.size(-1) dimensions (cos
/// and sin (N, 1, rotary) or (N, rotary), x's dtype), each row's key and value written into the
/// caches (P, KV, page_tokens, hd) at (page[n], slot[n]). Returns {q (N, H, hd), k (N, KV, hd), v
/// (N, KV, hd)}, contiguous: what skinny_linear followed by rope_write_kv gives.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> skinny_rope_kv(
    const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias, int64_t heads, int64_t kv_heads,
    const torch::Tensor& cos, const torch::Tensor& sin, torch::Tensor& k_cache, torch::Tensor& v_cache,
    const torch::Tensor& page, const torch::Tensor& slot);

namespace detail {

/// The CUDA implementations, registered by the CUDA build (kernels/skinny_epilogues_cuda.cpp).
/// in: the norm that x is (Note [Norm in the product]), or null with x given; r undefined without it.
struct SkinnyEpiloguesCudaOps {
  std::pair<torch::Tensor, torch::Tensor> (*silu_mul)(const NormedInput* in, const torch::Tensor& x,
                                                      const torch::Tensor& w, const torch::Tensor& bias);
  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> (*rope_kv)(
      const NormedInput* in, const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias, int64_t heads,
      int64_t kv_heads, const torch::Tensor& cos, const torch::Tensor& sin, torch::Tensor& k_cache,
      torch::Tensor& v_cache, const torch::Tensor& page, const torch::Tensor& slot);
};
const SkinnyEpiloguesCudaOps*& skinny_epilogues_cuda_ops();

}  // namespace detail
}  // namespace tandem
