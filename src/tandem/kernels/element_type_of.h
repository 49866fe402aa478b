#pragma once
// LibTorch's dtype as the kernels' ElementType, for the glue (kernels/*_cuda.cpp) between them.

#include <c10/core/ScalarType.h>

#include "tandem/core/error.h"
#include "tandem/kernels/element_type.h"

namespace tandem::detail {

/// False where the kernels take no such elements.
inline bool element_type_of(c10::ScalarType t, ElementType* e) {
  switch (t) {
    case c10::kFloat:
      *e = ElementType::kF32;
      return true;
    case c10::kHalf:
      *e = ElementType::kF16;
      return true;
    case c10::kBFloat16:
      *e = ElementType::kBF16;
      return true;
    default:
      return false;
  }
}

/// t's element type; `kernel` names the kernel in the internal error where it takes no such elements.
inline ElementType checked_element_type(c10::ScalarType t, const char* kernel) {
  ElementType e = ElementType::kF32;
  TANDEM_ASSERT(element_type_of(t, &e), kernel, " given ", t);
  return e;
}

}  // namespace tandem::detail
