// Whether the current device takes dependent launches (Note [Dependent launch]).

#include "tandem/kernels/dependent_launch.h"
#include "tandem/kernels/device_facts.h"

namespace tandem::detail {

bool dependent_launch_on_current_device() { return dependent_launch_allowed() && compute_capability_major() >= 9; }

}  // namespace tandem::detail
