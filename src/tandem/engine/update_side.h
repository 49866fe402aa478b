#pragma once
// Which processor runs a Block's optimizer update (the update split, Note [Update split]).

namespace tandem {

enum class UpdateSide { kCpu, kGpu };

}  // namespace tandem
