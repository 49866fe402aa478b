#include "tandem/parallel/pipeline_checkpoint.h"

#include <nlohmann/json.hpp>

#include <map>

#include "tandem/core/error.h"
#include "tandem/models/model.h"
#include "tandem/models/stage_blocks.h"
#include "tandem/parallel/comm.h"

namespace tandem {
namespace {

constexpr int kTagBase = 1 << 20;  // host point-to-point tags of checkpoint gathers

std::string manifest_key(int64_t round, int stage) {
  return "pipeline_checkpoint/" + std::to_string(round) + "/" + std::to_string(stage);
}

// A stage leader: the names, dtypes and shapes through the store, then the tensors in that order.
void send_stage(Comm& comm, const std::vector<NamedTensor>& weights, const std::vector<NamedTensor>& states,
                int64_t round, int stage) {
  nlohmann::json manifest = nlohmann::json::array();
  std::vector<torch::Tensor> tensors;
  for (const auto* group : {&weights, &states})
    for (const auto& [name, t] : *group) {
      manifest.push_back({{"name", name},
                          {"weight", group == &weights},
                          {"dtype", static_cast<int>(t.scalar_type())},
                          {"shape", t.sizes().vec()}});
      tensors.push_back(t.detach().to(torch::kCPU).contiguous());
    }
  comm.store().set(manifest_key(round, stage), manifest.dump());
  for (size_t i = 0; i < tensors.size(); ++i) comm.send_host(tensors[i], 0, kTagBase + static_cast<int>(i));
}

// Rank 0: stage `stage`'s tensors; weights into the model's Blocks, states kept.
void receive_stage(Comm& comm, const PipelineGrid& grid, Model& model, std::vector<NamedTensor>& states, int64_t round,
                   int stage) {
  const auto raw = comm.store().get(manifest_key(round, stage));
  const auto manifest = nlohmann::json::parse(std::string(raw.begin(), raw.end()));
  std::map<std::string, torch::Tensor> params;
  for (auto& [name, p] : model.hf_parameters()) params[name] = p;
  const int leader = grid.rank_of(stage, 0);
  int i = 0;
  for (const auto& e : manifest) {
    auto t = torch::empty(e["shape"].get<std::vector<int64_t>>(),
                          torch::TensorOptions().dtype(static_cast<c10::ScalarType>(e["dtype"].get<int>())));
    comm.recv_host(t, leader, kTagBase + i++);
    const auto name = e["name"].get<std::string>();
    if (!e["weight"].get<bool>()) {
      states.emplace_back(name, t);
      continue;
    }
    auto it = params.find(name);
    TANDEM_ASSERT(it != params.end(), "stage ", stage, " sent weight ", name, ", which the model does not have");
    torch::NoGradGuard no_grad;
    it->second.copy_(t);
  }
}

}  // namespace

std::vector<NamedTensor> GatheredOptimizer::state() {
  auto out = stage_.state();
  out.insert(out.end(), gathered_.begin(), gathered_.end());
  return out;
}

void GatheredOptimizer::load_state(const std::function<std::optional<torch::Tensor>(const std::string&)>& lookup,
                                   const std::string& source) {
  stage_.load_state(lookup, source);
}

void gather_pipeline_state(Comm& comm, const PipelineGrid& grid, StageBlocks& stage, GatheredOptimizer& optimizer,
                           Model& model, int64_t round) {
  optimizer.gathered().clear();
  if (grid.replica() != 0) return;  // the first replica of each stage speaks for it
  if (grid.stage() != 0) return send_stage(comm, stage.hf_parameters(), optimizer.state(), round, grid.stage());
  for (int s = 1; s < grid.stages(); ++s) receive_stage(comm, grid, model, optimizer.gathered(), round, s);
}

}  // namespace tandem
