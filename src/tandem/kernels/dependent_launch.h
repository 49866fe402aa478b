#pragma once
// The switch for programmatic dependent launch of tandem's decode kernels (Note [Dependent launch]
// in kernels/dependent_launch.cuh). Plain C++: the CPU-only build and the tests see it.

namespace tandem::detail {

/// Whether tandem's decode kernels may start before the kernel ahead of them on their stream ends
/// (where the GPU supports it: compute capability 9.0 and up). On by default;
/// TANDEM_DEPENDENT_LAUNCH=off turns it off for the process (to compare the two).
bool dependent_launch_allowed();

/// Refuses a TANDEM_DEPENDENT_LAUNCH that is neither on nor off (a user error naming the choices),
/// read now: for the code that builds what will launch, so a typo stops it before its first launch.
void check_dependent_launch_setting();

/// Overrides the environment's choice, for tests and benchmarks that compare the two in one process.
void allow_dependent_launch(bool allowed);

/// Whether the current CUDA device takes dependent launches (compute capability 9.0 and up) and the
/// switch allows them. CUDA builds only (kernels/dependent_launch_cuda.cpp).
bool dependent_launch_on_current_device();

}  // namespace tandem::detail
