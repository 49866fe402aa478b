#include "tandem/core/device_graph.h"

namespace tandem {
namespace {
std::unique_ptr<GraphRecorder>& slot() {
  static std::unique_ptr<GraphRecorder> recorder;
  return recorder;
}
}  // namespace

GraphRecorder* graph_recorder() { return slot().get(); }
void register_graph_recorder(std::unique_ptr<GraphRecorder> recorder) { slot() = std::move(recorder); }

}  // namespace tandem
