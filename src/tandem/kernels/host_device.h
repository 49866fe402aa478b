#pragma once
// TANDEM_HOST_DEVICE marks the small functions that host code and CUDA kernels both call (plain
// inline functions in a build without nvcc).

#if defined(__CUDACC__)
#define TANDEM_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TANDEM_HOST_DEVICE inline
#endif
