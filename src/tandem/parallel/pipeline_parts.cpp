#include "tandem/parallel/pipeline_parts.h"

#include "tandem/core/strings.h"
#include "tandem/models/model.h"
#include "tandem/models/stage_blocks.h"
#include "tandem/parallel/pipeline_step.h"
#include "tandem/parallel/stage_link.h"

namespace tandem {

PipelineParts::PipelineParts() = default;
PipelineParts::PipelineParts(PipelineParts&&) noexcept = default;
PipelineParts& PipelineParts::operator=(PipelineParts&&) noexcept = default;
PipelineParts::~PipelineParts() = default;

std::string describe_stage(const PipelineParts& parts, const Model& model) {
  const auto first = parts.blocks->first(), end = parts.blocks->end();
  return strprintf("stage %d of %d (Blocks %zu .. %zu of %zu: %s .. %s), replica %d of %d", parts.grid.stage(),
                   parts.grid.stages(), first, end - 1, model.block_count(), model.block_name(first).c_str(),
                   model.block_name(end - 1).c_str(), parts.grid.replica(), parts.grid.replicas());
}

}  // namespace tandem
