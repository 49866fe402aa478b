#pragma once
// The element types the CUDA kernels take, named without CUDA's or LibTorch's headers, so that
// launchers keep to raw pointers (kernels/*_launch.h).

namespace tandem::detail {

enum class ElementType : int { kF32, kF16, kBF16 };

}  // namespace tandem::detail
