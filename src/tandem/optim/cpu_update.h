#pragma once
// Optimizer updates over flat buffers on the CPU: AdamW / Adam, SGD with momentum and Lion.
// Master weights updated in place, in fp32 or bf16 (Note [bf16 master]); gradients in fp32 or bf16,
// states in fp32, bf16 or 8 bits (Adam's, Note [8-bit states]); an optional bf16
// copy of the updated weights written in the same pass; non-finite gradients detected in the same
// pass; an optional undo log for bit-exact rollback. No LibTorch here: the engine calls these on
// raw (pinned) buffers, one Block or one shard at a time. See Note [CPU update kernels].

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

class CpuThreadPool;

/// Element type of a gradient or state buffer. kQ8: Adam's states only, m as int8 and v as uint8
/// codes with an fp32 scale per 2048 elements of the span (Note [8-bit states]).
enum class Dtype : uint8_t { kF32, kBF16, kQ8 };

/// How fp32 values are rounded into bf16 states. Both flush fp32 subnormals to signed zero, as
/// the AVX-512 BF16 conversion instruction does, so every kernel gives the same bits.
enum class Rounding : uint8_t {
  kNearestEven,  ///< round to nearest, ties to even
  kStochastic,   ///< round up with probability equal to the discarded fraction; the random bits
                 ///< are a hash of (seed, step, element index), so results do not depend on
                 ///< threads or on how a buffer is cut into calls
};

/// A span's master weights (Note [bf16 master]): fp32; bf16 rounded stochastically (2 bytes a
/// parameter); or bf16 rounded to nearest with a bf16 Kahan compensation (4 bytes).
enum class MasterKind : uint8_t { kFp32, kBf16Stochastic, kBf16Kahan };

/// Instruction-set level of the update kernels.
enum class CpuIsa : uint8_t {
  kScalar,      ///< portable C++; the reference every other kernel is tested against
  kAvx2,        ///< AVX2 + FMA, 8 lanes
  kAvx512,      ///< AVX-512 F/BW/VL, 16 lanes, bf16 conversion in integer arithmetic
  kAvx512Bf16,  ///< as kAvx512, with the AVX-512 BF16 conversion instruction
};

/// The update rule.
enum class UpdateRule : uint8_t {
  kAdamW,  ///< Adam with decoupled weight decay (Loshchilov & Hutter)
  kAdam,   ///< Adam with L2 weight decay added to the gradient
  kSgd,    ///< SGD with optional momentum, dampening and Nesterov (torch.optim.SGD semantics)
  kLion,   ///< Lion (Chen et al., 2023): sign of an interpolated momentum, decoupled decay
};

/// Hyper-parameters of one update.
struct UpdateHyper {
  UpdateRule rule = UpdateRule::kAdamW;
  double lr = 1e-3;
  double beta1 = 0.9;    ///< Adam: first-moment decay; Lion: interpolation; SGD: momentum (0 = none)
  double beta2 = 0.999;  ///< Adam: second-moment decay; Lion: momentum decay
  double eps = 1e-8;     ///< Adam only
  double weight_decay = 0.0;
  double dampening = 0.0;   ///< SGD only
  bool nesterov = false;    ///< SGD only
  int64_t step = 1;         ///< 1-based count including this update (bias correction, SGD's first step)
  double grad_scale = 1.0;  ///< multiplies every gradient first: 1/loss-scale times the clip coefficient
  Rounding rounding = Rounding::kNearestEven;  ///< for bf16 states and 8-bit codes
  uint64_t seed = 0;                           ///< for stochastic rounding
  /// Scan each tile's gradients for NaN/Inf before writing it (see UpdateReport). Off only where
  /// the caller has already checked these gradients (e.g. the GPU's found_inf): the scan costs a
  /// few percent of the update's time.
  bool check_finite = true;
};

/// The hyper-parameters a parameter group sets apart from the call's (torch.optim's param_groups:
/// Note [Parameter groups]); the rule, gradient scale and rounding stay the call's.
struct GroupHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  /// Updates before the group's first (a group added later counts its own steps for the bias
  /// correction, as torch keeps a step per parameter): the group's step is the call's less this.
  int64_t steps_before = 0;
};

// Note [bf16 master]
// A master in bf16 halves the host's largest buffer (optim.master_dtype=bf16). Plain rounding to
// nearest would lose every update smaller than half a bf16 step (2^-9 of the weight), which late
// in training is most of them, so a bf16 master takes its update in one of two ways:
//   stochastic  the fp32 result is rounded up with probability equal to the discarded fraction
//               (random bits from a hash of seed, step and element index, as the bf16 states'), so
//               the rounding is unbiased and small updates land on average; 2 bytes a parameter.
//   kahan       the fp32 result rounded to nearest is the master, and what the rounding lost is
//               kept, rounded to nearest, in a second bf16 buffer and added back before the next
//               update (a compensated sum, as Kahan's): the pair holds about 16 significant bits;
//               4 bytes a parameter, the fp32 master's, with its precision nearly kept. The pair
//               is canonical (one split per value, cpu_update_kernels.inc).
// Either way the update itself runs in fp32 (the master widened, plus the compensation), and the
// bf16 weights sent to the GPU are the master's own bits. GPU-updated Blocks keep an fp32 master.
//
/// One contiguous range of parameters and the buffers its update reads and writes. All pointers
/// cover `n` elements; none needs any alignment.
struct UpdateSpan {
  float* master = nullptr;        ///< (n) fp32, updated in place; null for a bf16 master
  uint16_t* master_bf16 = nullptr;  ///< (n) a bf16 master instead (Note [bf16 master]): rounded stochastically,
                                    ///< or to nearest with master_comp
  uint16_t* master_comp = nullptr;  ///< (n) with master_bf16: its Kahan compensation in bf16
  const void* grad = nullptr;    ///< (n) grad_dtype
  void* m = nullptr;             ///< (n) state_dtype: Adam's first moment, Lion's and SGD's momentum
  void* v = nullptr;             ///< (n) state_dtype: Adam's second moment (unused otherwise)
  float* m_scale = nullptr;      ///< kQ8: (q8::scale_count(n)) the scales of m's blocks
  float* v_scale = nullptr;      ///< kQ8: (q8::scale_count(n)) the scales of sqrt(v)'s blocks
  uint16_t* bf16_out = nullptr;  ///< optional (n) bf16 copy of the updated master, rounded to nearest even
  int64_t n = 0;
  int64_t index_base = 0;  ///< index of element 0 in the whole parameter space (stochastic rounding)
  Dtype grad_dtype = Dtype::kF32;
  Dtype state_dtype = Dtype::kF32;
  float weight_decay_scale = 1.0f;    ///< multiplies weight_decay for this span (0 for norms and biases)
  const GroupHyper* group = nullptr;  ///< its group's lr, betas, eps and weight decay; null: the call's
};

/// Where an update saves the values it overwrites, for cpu_rollback(). Same layout and dtypes as
/// the span's master, m and v (null where the span has none).
struct UndoLog {
  float* master = nullptr;
  void* m = nullptr;
  void* v = nullptr;
  float* m_scale = nullptr;  ///< kQ8 states: their scales
  float* v_scale = nullptr;
  uint16_t* master_bf16 = nullptr;  ///< a bf16 master and its compensation
  uint16_t* master_comp = nullptr;
};

/// What an update found. Non-finite gradients are detected per tile of 2048 elements before the
/// tile is written: a tile holding one is left untouched (master, states and bf16 copy), so NaN never
/// reaches the state; the other tiles are updated. The caller skips the step by rolling back, or
/// scales and retries.
struct UpdateReport {
  int64_t nonfinite = 0;         ///< gradient elements that were NaN or Inf after grad_scale
  int64_t first_nonfinite = -1;  ///< smallest such element index (index_base-relative of its span), -1 if none
  int64_t skipped_tiles = 0;     ///< tiles left untouched because they held one
  bool ok() const { return nonfinite == 0; }
};

/// Bytes one element of `rule`'s update moves through memory for these dtypes (reads + writes),
/// the figure the kernels are measured against (kQ8: the codes; the scales add 16 bytes per 2048),
/// with a master of `master_bytes` a parameter (4: fp32 or bf16 with its compensation; 2: bf16).
int bytes_per_element(UpdateRule rule, Dtype grad, Dtype state, bool bf16_out, int master_bytes = 4);

/// The best level this CPU and OS support.
CpuIsa best_cpu_isa();
/// The level in use: set_cpu_isa()'s when it was called, else TANDEM_CPU_ISA
/// (scalar|avx2|avx512|avx512bf16) when set, else best_cpu_isa().
CpuIsa active_cpu_isa();
/// Forces a level (kScalar for the reference); UserError when this CPU lacks it.
void set_cpu_isa(CpuIsa isa);
/// "scalar", "avx2", "avx512", "avx512bf16".
const char* to_string(CpuIsa isa);
/// Parses a level name or "auto" (best_cpu_isa()); UserError naming the valid names (and `origin`,
/// e.g. the environment variable, when given).
CpuIsa parse_cpu_isa(const std::string& name, const std::string& origin = "");

/// Updates every span with one hyper-parameter set on `pool` (the global pool when null), using
/// `isa` (active_cpu_isa() when omitted). `undo`, when given, has one entry per span; each receives
/// the span's values from before this call, tiles with non-finite gradients included.
UpdateReport cpu_update(const std::vector<UpdateSpan>& spans, const UpdateHyper& hyper,
                        const std::vector<UndoLog>* undo = nullptr, CpuThreadPool* pool = nullptr);
UpdateReport cpu_update(const std::vector<UpdateSpan>& spans, const UpdateHyper& hyper,
                        const std::vector<UndoLog>* undo, CpuThreadPool* pool, CpuIsa isa);

/// Restores master (and its compensation), m and v of every span from its undo log, bit for bit,
/// and rewrites the span's bf16 copy (when it has one) from the restored master.
void cpu_rollback(const std::vector<UpdateSpan>& spans, const std::vector<UndoLog>& undo,
                  CpuThreadPool* pool = nullptr);

/// dst[i] = bf16(src[i]) rounded to nearest even (subnormals to zero), in parallel.
void cpu_to_bf16(const float* src, uint16_t* dst, int64_t n, CpuThreadPool* pool = nullptr);
/// The Kahan pair of a bf16 master (Note [bf16 master]), as an update stores it: hi[i] = bf16(src[i])
/// rounded to nearest even, lo[i] = bf16(src[i] - hi[i]) rounded to nearest even (toward zero
/// where the pair's sum would round away from hi[i]); in parallel.
void cpu_split_bf16(const float* src, uint16_t* hi, uint16_t* lo, int64_t n, CpuThreadPool* pool = nullptr);

namespace detail {

/// Coefficients of one update, rounded to fp32 once per call.
struct UpdateCoeffs {
  UpdateRule rule;
  Rounding rounding;
  bool nesterov, first_step, check_finite;
  float grad_scale;
  float b1, omb1, b2, omb2;                // beta and 1 - beta
  float eps, inv_sqrt_bc2, neg_step_size;  // Adam: 1 / sqrt(1 - beta2^t), -lr / (1 - beta1^t)
  float decay;                             // decoupled: 1 - lr * wd
  float wd;                                // L2 (Adam, SGD)
  float neg_lr;                            // SGD, Lion
  float omdamp;                            // SGD: 1 - dampening
  uint32_t seed;                           // stochastic rounding: hash of (seed, step)
};

/// One ISA's kernels. update() processes elements [begin, end) of one span and returns the number
/// of non-finite gradients it found (their smallest index in *first_bad, if smaller).
struct KernelTable {
  int64_t (*update)(const UpdateCoeffs& c, const UpdateSpan& s, const UndoLog* undo, int64_t begin, int64_t end,
                    int64_t* first_bad, int64_t* skipped_tiles);
  void (*to_bf16)(const float* src, uint16_t* dst, int64_t n);
  void (*split_bf16)(const float* src, uint16_t* hi, uint16_t* lo, int64_t n);
};

KernelTable scalar_kernels();
KernelTable avx2_kernels();  // empty table where the compiler cannot target x86-64 SIMD
KernelTable avx512_kernels(bool bf16_instructions);

/// Per-span coefficients (weight decay scaled) from the hyper-parameters, with the span's group's
/// lr, betas, eps and weight decay when it has one.
UpdateCoeffs make_coeffs(const UpdateHyper& h, const UpdateSpan& s);

}  // namespace detail
}  // namespace tandem
