#pragma once
// How the q/k/v projection of a decode step is cut into units of one or two rows, each a warp's
// work (Note [Skinny epilogues]): the units of RoPE's rotated pairs, of the dimensions it leaves
// alone, and of the values. Host and device code.

#include <cstdint>

#include "tandem/kernels/host_device.h"

namespace tandem::detail {

/// A q/k/v projection of H query heads and KV key/value heads of hd dimensions, RoPE on the first
/// `rotary` (even) of q's and k's.
struct QkvShape {
  int64_t H = 0, KV = 0, hd = 0, rotary = 0;
};

/// Units of the projection. A head of q or k has rotary / 2 units that each compute the two
/// dimensions RoPE rotates together (d and d + rotary / 2) and hd - rotary units of one dimension
/// it leaves alone; a head of v has hd / 2 units of two dimensions (d and d + hd / 2).
TANDEM_HOST_DEVICE int64_t qkv_units(const QkvShape& s) {
  return (s.H + s.KV) * (s.hd - s.rotary / 2) + s.KV * (s.hd / 2);
}

/// What one unit computes: the head (q's, then k's, then v's), its dimension d and the partner
/// dimension (-1: none), and whether the pair is rotated.
struct QkvUnit {
  int64_t head = 0, d = 0, partner = -1;
  bool rotate = false;
  /// The projection's rows of d and of the partner.
  TANDEM_HOST_DEVICE int64_t row(const QkvShape& s) const { return head * s.hd + d; }
  TANDEM_HOST_DEVICE int64_t partner_row(const QkvShape& s) const { return head * s.hd + partner; }
};

/// Unit `unit` (below qkv_units(s)).
TANDEM_HOST_DEVICE QkvUnit qkv_unit(const QkvShape& s, int64_t unit) {
  const int64_t half = s.rotary / 2, qk_units = s.hd - half, qk_heads = s.H + s.KV;
  QkvUnit u;
  if (unit < qk_heads * qk_units) {
    u.head = unit / qk_units;
    const int64_t i = unit % qk_units;
    u.rotate = i < half;
    u.d = u.rotate ? i : s.rotary + (i - half);
    u.partner = u.rotate ? i + half : -1;
  } else {
    const int64_t i = unit - qk_heads * qk_units;
    u.head = qk_heads + i / (s.hd / 2);
    u.d = i % (s.hd / 2);
    u.partner = u.d + s.hd / 2;
  }
  return u;
}

}  // namespace tandem::detail
