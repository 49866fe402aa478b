#include "tandem/io/checkpoint.h"
#include "tandem/formats/tensor_use.h"

#include <ATen/CPUGeneratorImpl.h>

#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "tandem/core/device.h"
#include "tandem/core/error.h"
#include "tandem/core/fault.h"
#include "tandem/core/fs.h"
#include "tandem/core/log.h"
#include "tandem/formats/digest.h"
#include "tandem/io/hf.h"
#include "tandem/formats/safetensors.h"

namespace fs = std::filesystem;

namespace tandem {
namespace {

// Note [Checkpoint layout]
// step_XXXXXXXX/
//   model.safetensors      weights under HF names (real vocabulary rows), fp32
//   config.json            HF config, so the directory loads in transformers
//   tokenizer files        those of the model.init_from folder (Note [Checkpoint companions])
//   optimizer.safetensors  "<param>.exp_avg", "<param>.exp_avg_sq", "<param>.step"
//   rng.safetensors        CPU (and CUDA) generator states as U8
//   tandem.yaml            the full run configuration
//   trainer_state.json     step, data position, scaler, config hash, and the manifest: every
//                          file's size and SHA-256; written last, so its presence marks a
//                          complete directory
// The directory is built as .step_XXXXXXXX.tmp, each file fsynced, then renamed into place. A
// checkpoint is intact when its manifest parses and every file has its size and checksum
// (verify_checkpoint); loading refuses any other, and `--resume auto` takes the newest intact one.
constexpr const char* kStateFile = "trainer_state.json";
constexpr int kFormatVersion = 2;  // 1: sizes only (still read)

torch::Tensor bytes_tensor(const std::string& s) {
  auto t = torch::empty({static_cast<int64_t>(s.size())}, torch::kUInt8);
  std::memcpy(t.data_ptr(), s.data(), s.size());
  return t;
}

std::string tensor_bytes(const torch::Tensor& t) {
  auto c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
}

}  // namespace

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

CheckpointModel checkpoint_model(Model& model) {
  CheckpointModel m;
  m.weights = [&model] { return model.hf_state_dict(); };
  m.hf_config = hf_config_json(model.spec());
  m.load = [&model](const auto& lookup, const std::string& source) { model.load_hf_state_dict(lookup, source); };
  return m;
}

CheckpointSnapshot take_checkpoint_snapshot(Model& model, Optimizer& optimizer, const TrainerState& state,
                                            const Config& config, int device_index, bool copy) {
  return take_checkpoint_snapshot(checkpoint_model(model), optimizer, state, config, device_index, copy);
}

// Note [Checkpoint companions]
// A run started from a model folder (model.init_from) writes checkpoints that are that folder
// trained: its tokenizer files go into each one, so that `tandem generate`, `tandem serve` and
// transformers' AutoTokenizer find the tokenizer beside the weights. A folder that is gone by a
// later resume is passed over.
namespace {
std::vector<std::string> checkpoint_companions(const Config& config) {
  std::vector<std::string> out;
  if (config.model.init_from.empty()) return out;
  std::error_code ec;
  for (const char* f :
       {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
        "vocab.json", "merges.txt", "generation_config.json", "chat_template.jinja"})
    if (fs::is_regular_file(fs::path(config.model.init_from) / f, ec))
      out.push_back((fs::path(config.model.init_from) / f).string());
  return out;
}
}  // namespace

CheckpointSnapshot take_checkpoint_snapshot(const CheckpointModel& model, Optimizer& optimizer,
                                            const TrainerState& state, const Config& config, int device_index,
                                            bool copy) {
  // Note [Asynchronous checkpoints]: with `copy` every tensor is cloned into host memory, so the
  // snapshot stays as it was while training goes on; without, it refers to the live tensors.
  CheckpointSnapshot s;
  s.model = model.weights();
  s.optimizer = optimizer.state();
  if (copy) own_checkpoint_snapshot(s);
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  torch::Tensor cpu_state;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    cpu_state = gen.get_state();
  }
  s.rng = {{"cpu", cpu_state}};
  if (device_index >= 0 && accelerator())
    s.rng.emplace_back("cuda", bytes_tensor(accelerator()->rng_state(device_index)));
  s.hf_config = model.hf_config;
  s.tandem_yaml = config_to_yaml(config);
  s.companions = checkpoint_companions(config);
  s.state = state;
  return s;
}

int64_t checkpoint_snapshot_bytes(const CheckpointSnapshot& snap) {
  int64_t n = 0;
  for (const auto* list : {&snap.model, &snap.optimizer})
    for (const auto& [name, t] : *list) n += t.numel() * t.element_size();
  return n;
}

void own_checkpoint_snapshot(CheckpointSnapshot& snap) {
  for (auto* list : {&snap.model, &snap.optimizer})
    for (auto& [name, t] : *list) t = t.to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
}

std::string write_checkpoint(const std::string& parent, const CheckpointSnapshot& snap) {
  ensure_writable_directory(parent, "checkpoint directory");
  const TrainerState& state = snap.state;
  const std::string name = step_name(state.step);
  const fs::path final_dir = fs::path(parent) / name;
  const fs::path tmp_dir = fs::path(parent) / ("." + name + ".tmp");
  std::error_code ec;
  fs::remove_all(tmp_dir, ec);
  fs::create_directories(tmp_dir, ec);
  TANDEM_CHECK(!ec, "cannot create '", tmp_dir.string(), "': ", ec.message());
  try {
    if (!snap.hf_config.empty()) write_file_synced((tmp_dir / "config.json").string(), snap.hf_config);
    write_safetensors((tmp_dir / "model.safetensors").string(), snap.model, {{"format", "pt"}});
    fault_in_checkpoint(state.step);  // Note [Test faults]: a kill -9 in the middle of a write
    if (snap.zero_world == 0) write_safetensors((tmp_dir / "optimizer.safetensors").string(), snap.optimizer);
    for (const auto& f : snap.adopt) fs::rename(f, tmp_dir / fs::path(f).filename());
    for (const auto& f : snap.companions)  // Note [Checkpoint companions]
      write_file_synced((tmp_dir / fs::path(f).filename()).string(), read_file(f, "tokenizer file"));
    write_safetensors((tmp_dir / "rng.safetensors").string(), snap.rng);
    write_file_synced((tmp_dir / "tandem.yaml").string(), snap.tandem_yaml);

    nlohmann::json j;
    j["format_version"] = kFormatVersion;
    j["step"] = state.step;
    j["data_position"] = state.data_position;
    j["tokens_seen"] = state.tokens_seen;
    j["loss_scale"] = state.loss_scale;
    j["growth_tracker"] = state.growth_tracker;
    j["config_hash"] = state.config_hash;
    if (snap.zero_world > 0) j["zero_world"] = snap.zero_world;
    nlohmann::json files = nlohmann::json::object();
    for (const auto& e : fs::directory_iterator(tmp_dir))
      files[e.path().filename().string()] = {{"bytes", fs::file_size(e.path())},
                                             {"sha256", sha256_file(e.path().string())}};
    j["files"] = files;
    write_file_synced((tmp_dir / kStateFile).string(), j.dump(2) + "\n");
    fsync_directory(tmp_dir.string());
    if (fs::exists(final_dir)) fs::remove_all(final_dir);
    fs::rename(tmp_dir, final_dir);
    fsync_directory(parent);
  } catch (...) {
    fs::remove_all(tmp_dir, ec);
    throw;
  }
  return final_dir.string();
}

// Note [Sharded checkpoints]
// With dist.zero_stage=2 no rank holds the whole fp32 masters and optimizer states, so each rank
// writes its slices (ParamStore::shard_state: per Block "<block>.master", ".exp_avg",
// ".exp_avg_sq", flat) to zero.rankNNNNN.safetensors, with its slice of every Block's range in the
// file's metadata. The ranks write into a staging directory beside the checkpoints; after a
// barrier rank 0 writes the rest of the checkpoint (model.safetensors from the working weights in
// the compute dtype, for transformers and inspection; RNG, configs), moves the shard files in,
// and writes the manifest over all of them, so the checkpoint appears whole or not at all; a
// second barrier holds every rank until it has. These checkpoints are written synchronously
// (train.async_checkpoint applies to whole ones). A
// resume at any world size reads, for each of its own slices, the pieces of the old slices that
// overlap it (ZeroShards), so the optimizer state is resharded exactly. A pipeline's shards hold only
// their stage's Blocks: a Block's pieces are in its stage's shards, and together they must cover it.
std::string zero_shard_file(int rank) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "zero.rank%05d.safetensors", rank);
  return buf;
}

std::string zero_staging_dir(const std::string& parent, int64_t step) {
  return (fs::path(parent) / ("." + step_name(step) + ".zero")).string();
}

int checkpoint_zero_world(const std::string& dir) {
  const auto j =
      nlohmann::json::parse(read_file((fs::path(dir) / kStateFile).string(), "checkpoint state"), nullptr, false);
  return j.is_object() && j.contains("zero_world") && j["zero_world"].is_number_integer() ? j["zero_world"].get<int>()
                                                                                          : 0;
}

ZeroShards::ZeroShards(const std::string& dir) {
  const int w = checkpoint_zero_world(dir);
  TANDEM_CHECK(w > 0, "checkpoint ", dir, " is not sharded");
  for (int r = 0; r < w; ++r) {
    files_.push_back(std::make_unique<SafetensorsFile>((fs::path(dir) / zero_shard_file(r)).string()));
    const auto& meta = files_.back()->metadata();
    const auto it = meta.find("tandem_zero");
    TANDEM_CHECK(it != meta.end(), files_.back()->path(),
                 " has no tandem_zero metadata; the checkpoint is not tandem's");
    const auto j = nlohmann::json::parse(it->second, nullptr, false);
    TANDEM_CHECK(j.is_object() && j.contains("blocks"), files_.back()->path(), ": malformed tandem_zero metadata");
    std::map<std::string, Piece> pieces;
    for (const auto& [name, v] : j["blocks"].items()) {
      const bool ok = v.is_array() && v.size() == 3 && v[0].is_number_integer() && v[1].is_number_integer() &&
                      v[2].is_number_integer();
      TANDEM_CHECK(ok, files_.back()->path(), ": malformed tandem_zero metadata for block '", name,
                   "' (expected [numel, offset, count]); the checkpoint is damaged, resume from an earlier one");
      pieces[name] = {v[1].get<int64_t>(), v[2].get<int64_t>()};
      numel_[name] = v[0].get<int64_t>();
    }
    layout_.push_back(std::move(pieces));
  }
}

ZeroShards::~ZeroShards() = default;

void ZeroShards::read(const std::string& block, const std::string& kind, int64_t offset, int64_t n,
                      torch::Tensor out) const {
  TANDEM_CHECK(numel_.count(block) > 0, "the sharded checkpoint has no block '", block,
               "'; it was saved from another model");
  TANDEM_CHECK(offset + n <= numel_.at(block), "block '", block, "' has ", numel_.at(block),
               " parameters in the checkpoint; this model has more (another model?)");
  int64_t filled = 0;
  for (size_t r = 0; r < files_.size(); ++r) {
    const auto it = layout_[r].find(block);
    if (it == layout_[r].end()) continue;  // another pipeline stage's shard (Note [Pipeline checkpoints])
    const Piece& p = it->second;
    TANDEM_CHECK(p.offset >= 0 && p.numel >= 0, files_[r]->path(), ": block '", block,
                 "' has a negative offset or size; the checkpoint is damaged, resume from an earlier one");
    const int64_t lo = std::max(offset, p.offset), hi = std::min(offset + n, p.offset + p.numel);
    if (lo >= hi) continue;
    out.narrow(0, lo - offset, hi - lo).copy_(files_[r]->slice(block + "." + kind, lo - p.offset, hi - lo));
    filled += hi - lo;
  }
  TANDEM_CHECK(filled == n, "the shards cover ", filled, " of ", n, " elements of ", block, ".", kind,
               "; the checkpoint is damaged, resume from an earlier one");
}

std::string save_checkpoint(const std::string& parent, Model& model, Optimizer& optimizer, const TrainerState& state,
                            const Config& config, int device_index) {
  return write_checkpoint(parent, take_checkpoint_snapshot(model, optimizer, state, config, device_index, false));
}

std::vector<std::string> list_checkpoints(const std::string& parent) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(parent, ec)) return out;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string n = e.path().filename().string();
    if (e.is_directory() && n.rfind("step_", 0) == 0 && fs::exists(e.path() / kStateFile))
      out.push_back(e.path().string());
  }
  // By step number: past step_99999999 the names are longer, and a string sort would put them first.
  const auto step_of = [](const std::string& path) {
    return std::strtoll(fs::path(path).filename().string().c_str() + 5, nullptr, 10);
  };
  std::sort(out.begin(), out.end(),
            [&](const std::string& a, const std::string& b) { return step_of(a) < step_of(b); });
  return out;
}

void prune_checkpoints(const std::string& parent, int64_t keep) {
  auto all = list_checkpoints(parent);
  std::error_code ec;
  // Temporary directories of writes that never finished (a process killed mid-write).
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() > 5 && n.front() == '.' && n.rfind("step_", 1) == 1 &&
        (n.substr(n.size() - 4) == ".tmp" || n.substr(n.size() - 5) == ".zero"))
      fs::remove_all(e.path(), ec);
  }
  for (int64_t i = 0; i + keep < static_cast<int64_t>(all.size()); ++i) fs::remove_all(all[i], ec);
}

std::string resolve_checkpoint_dir(const std::string& path, const std::string& what) {
  std::error_code ec;
  TANDEM_CHECK(fs::is_directory(path, ec), what, ": '", path,
               "' is not a directory; give a checkpoint or run directory");
  if (fs::exists(fs::path(path) / kStateFile)) return path;  // a checkpoint: load_checkpoint verifies it
  // A run directory (or its checkpoints/): the newest intact checkpoint, passing over damaged ones.
  // Without trailing slashes, so "run/checkpoints/" (as tab completion writes it) names run/ too.
  std::string trimmed = path;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  const fs::path dir(trimmed);
  for (const auto& run : {dir, dir.parent_path()}) {
    if (list_checkpoints((run / "checkpoints").string()).empty()) continue;
    std::vector<std::string> skipped;
    const std::string found = newest_intact_checkpoint(run.string(), &skipped);
    for (const auto& s : skipped) log::warn(what + ": passing over damaged checkpoint " + s);
    TANDEM_CHECK(!found.empty(), what, ": every checkpoint in '", path, "' is damaged (", skipped.front(),
                 "); start without ", what, " or restore the directory");
    return found;
  }
  if (fs::path(path).filename().string().rfind("step_", 0) == 0)
    TANDEM_FAIL(what, ": '", path, "' has no ", kStateFile,
                "; the checkpoint is incomplete (cut off while being written?)");
  TANDEM_FAIL(what, ": no complete checkpoint in '", path,
              "'; give a step_* directory or a run directory with checkpoints/");
}

void load_checkpoint_config(Config& cfg, const std::string& dir) {
  const std::string p = (fs::path(dir) / "tandem.yaml").string();
  // The pipeline layout is the launch's, not the checkpoint's: whole checkpoints resume at any stage
  // count (Note [Pipeline checkpoints]).
  const DistConfig layout = cfg.dist;
  load_yaml_config_text(cfg, read_file(p, "checkpoint config"), p);
  cfg.dist.pipeline_stages = layout.pipeline_stages;
  cfg.dist.pipeline_schedule = layout.pipeline_schedule;
  cfg.dist.pipeline_cut = layout.pipeline_cut;
}

namespace {
std::string verify_checkpoint_files(const std::string& dir);
}  // namespace

std::string verify_checkpoint(const std::string& dir) {
  try {
    return verify_checkpoint_files(dir);
  } catch (const nlohmann::json::exception& e) {  // a field of the wrong type
    return std::string(kStateFile) + " is malformed (" + e.what() + ")";
  }
}

namespace {

// verify_checkpoint's checks; a json exception from a mistyped field is its caller's to report.
std::string verify_checkpoint_files(const std::string& dir) {
  const fs::path d(dir);
  const fs::path state_path = d / kStateFile;
  std::error_code ec;
  if (!fs::exists(state_path, ec)) return std::string("no ") + kStateFile + " (cut off while being written?)";
  const auto j = nlohmann::json::parse(read_file(state_path.string(), "checkpoint state"), nullptr, false);
  if (!j.is_object()) return std::string(kStateFile) + " is not valid JSON";
  const int version = j.value("format_version", 0);
  if (version < 1 || version > kFormatVersion)
    return "unsupported checkpoint format version " + std::to_string(version);
  if (!j.contains("files") || !j["files"].is_object()) return std::string(kStateFile) + " has no file manifest";
  std::vector<std::string> required = {"model.safetensors", "rng.safetensors", "tandem.yaml"};
  const int zero_world = j.value("zero_world", 0);
  if (zero_world == 0) required.push_back("optimizer.safetensors");
  for (int r = 0; r < zero_world; ++r) required.push_back(zero_shard_file(r));
  for (const auto& f : required)
    if (!j["files"].contains(f)) return "the manifest does not list " + f;
  for (const auto& [name, entry] : j["files"].items()) {
    const bool v1 = entry.is_number_unsigned();
    if (!v1 && !(entry.is_object() && entry.contains("bytes") && entry.contains("sha256")))
      return "the manifest entry of '" + name + "' is malformed";
    const auto bytes = v1 ? entry.get<uint64_t>() : entry["bytes"].get<uint64_t>();
    const auto actual = fs::file_size(d / name, ec);
    if (ec) return "file '" + name + "' is missing";
    if (actual != bytes)
      return "file '" + name + "' has " + std::to_string(actual) + " bytes, the manifest says " + std::to_string(bytes);
    if (!v1 && sha256_file((d / name).string()) != entry["sha256"].get<std::string>())
      return "file '" + name + "' does not match its SHA-256 (damaged on disk)";
  }
  return "";
}

}  // namespace

std::string newest_intact_checkpoint(const std::string& run_dir, std::vector<std::string>* skipped) {
  auto all = list_checkpoints((fs::path(run_dir) / "checkpoints").string());
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const std::string why = verify_checkpoint(*it);
    if (why.empty()) return *it;
    if (skipped) skipped->push_back(*it + ": " + why);
  }
  return "";
}

TrainerState load_checkpoint(const std::string& dir, Model& model, Optimizer& optimizer, int device_index) {
  return load_checkpoint(dir, checkpoint_model(model), optimizer, device_index);
}

TrainerState load_checkpoint(const std::string& dir, const CheckpointModel& model, Optimizer& optimizer,
                             int device_index) {
  const fs::path d(dir);
  const std::string state_path = (d / kStateFile).string();
  const std::string why = verify_checkpoint(dir);
  TANDEM_CHECK(why.empty(), "checkpoint ", dir, " is damaged: ", why,
               "; resume from an earlier one (--resume auto takes the newest intact checkpoint)");
  const auto j = nlohmann::json::parse(read_file(state_path, "checkpoint state"));
  TANDEM_CHECK(j.value("zero_world", 0) == 0, "checkpoint ", dir, " holds optimizer shards of ",
               j.value("zero_world", 0),
               " ranks (dist.zero_stage=2); resume it with offload.optimizer=cpu and dist.zero_stage=2, at any world "
               "size (1 included)");
  {
    SafetensorsFile weights((d / "model.safetensors").string());
    const TensorUse use(weights.names(), (d / "model.safetensors").string());  // Note [Every tensor used]
    model.load(use.recording([&](const std::string& n) -> std::optional<torch::Tensor> {
      if (!weights.contains(n)) return std::nullopt;
      return weights.tensor(n);
    }),
               (d / "model.safetensors").string());
    use.check_all_used();
  }
  {
    SafetensorsFile opt((d / "optimizer.safetensors").string());
    optimizer.load_state(
        [&](const std::string& n) -> std::optional<torch::Tensor> {
          if (!opt.contains(n)) return std::nullopt;
          return opt.tensor(n);
        },
        (d / "optimizer.safetensors").string());
  }
  return load_checkpoint_state(dir, device_index);
}

TrainerState load_checkpoint_state(const std::string& dir, int device_index) {
  const fs::path d(dir);
  const std::string why = verify_checkpoint(dir);
  TANDEM_CHECK(why.empty(), "checkpoint ", dir, " is damaged: ", why,
               "; resume from an earlier one (--resume auto takes the newest intact checkpoint)");
  const auto j = nlohmann::json::parse(read_file((d / kStateFile).string(), "checkpoint state"));
  TrainerState s;
  try {
    s.step = j.at("step").get<int64_t>();
    s.data_position = j.at("data_position").get<int64_t>();
    s.tokens_seen = j.value("tokens_seen", int64_t{0});
    s.loss_scale = j.value("loss_scale", 1.0);
    s.growth_tracker = j.value("growth_tracker", int64_t{0});
    s.config_hash = j.value("config_hash", std::string());
  } catch (const nlohmann::json::exception& e) {  // a field missing or of the wrong type
    TANDEM_FAIL("checkpoint ", dir, ": ", kStateFile, " is malformed (", e.what(),
                "); resume from an earlier one (--resume auto takes the newest intact checkpoint)");
  }
  TANDEM_CHECK(s.step >= 0 && s.data_position >= 0, "checkpoint ", dir, ": ", kStateFile,
               " has a negative step or data position; resume from an earlier one");
  // The generators last, once the state is known good: a refused resume leaves them as they were.
  SafetensorsFile rng((d / "rng.safetensors").string());
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(rng.tensor("cpu"));
  if (device_index >= 0 && accelerator() && rng.contains("cuda"))
    accelerator()->set_rng_state(device_index, tensor_bytes(rng.tensor("cuda")));
  return s;
}

}  // namespace tandem
