#include "tandem/models/rope.h"

#include <algorithm>
#include <cmath>

#include "tandem/core/error.h"

namespace tandem {
namespace {

// Llama 3.1 frequency scaling: long wavelengths divided by `factor`, short ones kept, a smooth
// blend between (HF's "llama3" rope_type).
torch::Tensor llama3_scaled(const torch::Tensor& inv_freq, const RopeScaling& rs) {
  const double low_wavelen = rs.original_max_position / rs.low_freq_factor;
  const double high_wavelen = rs.original_max_position / rs.high_freq_factor;
  auto wavelen = 2 * M_PI / inv_freq;
  auto scaled = torch::where(wavelen > low_wavelen, inv_freq / rs.factor, inv_freq);
  auto smooth = (rs.original_max_position / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
  auto blended = (1 - smooth) * scaled / rs.factor + smooth * scaled;
  auto medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen);
  return torch::where(medium, blended, scaled);
}

// YaRN (HF's "yarn" rope_type): dimensions that turn fewer than beta_slow times over the original
// length are interpolated (divided by the factor), those turning more than beta_fast times kept,
// with a linear ramp between.
torch::Tensor yarn_scaled(const torch::Tensor& inv_freq, int64_t dim, double base, const RopeScaling& rs) {
  const auto correction_dim = [&](double rotations) {
    return dim * std::log(double(rs.original_max_position) / (rotations * 2 * M_PI)) / (2 * std::log(base));
  };
  double low = correction_dim(rs.beta_fast), high = correction_dim(rs.beta_slow);
  if (rs.truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0), high = std::min(high, double(dim - 1));
  if (low == high) high += 0.001;
  const auto ramp = ((torch::arange(dim / 2, torch::kFloat64) - low) / (high - low)).clamp(0, 1);
  const auto extrapolation = 1 - ramp;
  return inv_freq / rs.factor * (1 - extrapolation) + inv_freq * extrapolation;
}

double yarn_attention_factor(const RopeScaling& rs) {
  if (rs.attention_factor > 0) return rs.attention_factor;
  const auto mscale = [&](double m) { return rs.factor <= 1 ? 1.0 : 0.1 * m * std::log(rs.factor) + 1.0; };
  if (rs.mscale > 0 && rs.mscale_all_dim > 0) return mscale(rs.mscale) / mscale(rs.mscale_all_dim);
  return mscale(1.0);
}

}  // namespace

RopeTable::RopeTable(const ModelSpec& spec)
    : dim_(spec.rotary_dim()), max_len_(spec.max_seq_len), base_(spec.rope_theta), scaling_(spec.rope_scaling) {
  const int64_t plain = depends_on_length() ? std::min(max_len_, scaling_.original_max_position) : max_len_;
  std::tie(cos_, sin_) = table(plain);
}

torch::Tensor RopeTable::inv_freq(int64_t T) const {
  const auto& rs = scaling_;
  double base = base_;
  if (rs.type == RopeType::kDynamic && T > rs.original_max_position)
    base *= std::pow(rs.factor * double(T) / double(rs.original_max_position) - (rs.factor - 1),
                     double(dim_) / double(dim_ - 2));
  auto f = 1.0 / torch::pow(base, torch::arange(0, dim_, 2, torch::kFloat64) / double(dim_));
  switch (rs.type) {
    case RopeType::kLinear:
      return f / rs.factor;
    case RopeType::kLlama3:
      return llama3_scaled(f, rs);
    case RopeType::kYarn:
      return yarn_scaled(f, dim_, base, rs);
    case RopeType::kDefault:
    case RopeType::kDynamic:
      return f;
  }
  return f;
}

std::pair<torch::Tensor, torch::Tensor> RopeTable::table(int64_t T) const {
  auto freqs = torch::outer(torch::arange(T, torch::kFloat64), inv_freq(T));  // (T, dim/2)
  auto emb = torch::cat({freqs, freqs}, -1);                                  // (T, dim)
  const double scale = scaling_.type == RopeType::kYarn ? yarn_attention_factor(scaling_) : 1.0;
  return {(emb.cos() * scale).to(torch::kFloat32), (emb.sin() * scale).to(torch::kFloat32)};
}

std::pair<torch::Tensor, torch::Tensor> RopeTable::get(int64_t T, const torch::Device& device,
                                                       torch::ScalarType dtype) {
  TANDEM_CHECK(T <= max_len_, "sequence length ", T, " exceeds model.max_seq_len ", max_len_,
               "; lower train.seq_len or raise model.max_seq_len");
  const bool own = T > cos_.size(0);  // dynamic scaling beyond the original length: this length's table
  std::lock_guard<std::mutex> lock(mutex_);
  const auto key = std::make_tuple(device.str(), static_cast<int>(dtype), own ? T : int64_t{0});
  auto it = cache_.find(key);
  if (it == cache_.end()) {
    if (own)  // one length-specific table at a time: a growing sequence would otherwise keep them all
      for (auto e = cache_.begin(); e != cache_.end();) e = std::get<2>(e->first) != 0 ? cache_.erase(e) : std::next(e);
    auto [cos, sin] = own ? table(T) : std::make_pair(cos_, sin_);
    it = cache_.emplace(key, std::make_pair(cos.to(device, dtype), sin.to(device, dtype))).first;
  }
  return {it->second.first.narrow(0, 0, T), it->second.second.narrow(0, 0, T)};
}

torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t dim = cos.size(-1), half = dim / 2;
  const auto r = dim == x.size(-1) ? x : x.narrow(-1, 0, dim);
  auto rotated = torch::cat({-r.narrow(-1, half, half), r.narrow(-1, 0, half)}, -1);
  auto out = r * cos + rotated * sin;
  return dim == x.size(-1) ? out : torch::cat({out, x.narrow(-1, dim, x.size(-1) - dim)}, -1);
}

}  // namespace tandem
