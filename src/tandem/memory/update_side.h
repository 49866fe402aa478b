#pragma once
// Which processor runs a Block's optimizer update (the update split, Note [Update split]). Here in
// memory/ because the memory plan sizes each tier by it; the engine's ParamStore places Blocks by it.

namespace tandem {

enum class UpdateSide { kCpu, kGpu };

}  // namespace tandem
