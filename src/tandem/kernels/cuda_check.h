#pragma once
// One checked wrapper for CUDA runtime calls: the failed expression, file and line.

#include <cuda_runtime_api.h>

#include "tandem/core/error.h"

#define TANDEM_CUDA_CHECK(expr)                                                                           \
  do {                                                                                                    \
    const cudaError_t tandem_err_ = (expr);                                                               \
    if (tandem_err_ != cudaSuccess)                                                                       \
      ::tandem::detail::throw_internal_error(__FILE__, __LINE__, #expr, cudaGetErrorString(tandem_err_)); \
  } while (0)

/// After every kernel launch.
#define TANDEM_CUDA_LAUNCH_CHECK() TANDEM_CUDA_CHECK(cudaGetLastError())
