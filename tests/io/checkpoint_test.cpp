// Checkpoints (Note [Checkpoint layout], Note [Sharded checkpoints]): written whole or not at all,
// verified file by file against the manifest with every defect named and none thrown, listed,
// pruned and resolved, restored exactly (a resumed run repeats the uninterrupted one bit for bit),
// and sharded optimizer state read back at any world size.

#include "tandem/io/checkpoint.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <tuple>

#include "../test_util.h"
#include "tandem/core/error.h"
#include "tandem/io/hf.h"
#include "tandem/formats/safetensors.h"
#include "tandem/models/model.h"
#include "tandem/optim/optimizer.h"

namespace fs = std::filesystem;

namespace tandem {
namespace {

using test::error_of;

// A LLaMA small enough to write in milliseconds, untied and with vocabulary (50 -> 64) and
// feed-forward (48 -> 64) padding, so the HF form differs from the stored one.
ModelSpec small_spec() {
  ModelSpec s = preset_spec("tiny");
  s.n_layer = 2, s.d_model = 32, s.n_head = 4, s.n_kv_head = 2, s.d_ff = 48, s.vocab_size = 50, s.max_seq_len = 16;
  s.tie_embeddings = false;
  return s;
}

// Its sizes by hand. Layer as stored: q, o (32 x 32) + k, v (16 x 32) + gate, up, down (64 x 32)
// + 2 norms = 2048 + 1024 + 6144 + 64 = 9280; in HF form d_ff is 48: 2048 + 1024 + 4608 + 64 = 7744.
constexpr int64_t kStoredParams = 2 * 64 * 32 + 2 * 9280 + 32;  // embedding, lm_head, layers, final norm
constexpr int64_t kHfParams = 2 * 50 * 32 + 2 * 7744 + 32;
constexpr int64_t kParamTensors = 1 + 2 * 9 + 2;  // embedding, 9 per layer, final norm and lm_head

/// A model and its optimizer, trained on batches drawn from torch's CPU generator (so a resume
/// repeats a run only if the generator's state was restored too).
struct Trainee {
  explicit Trainee(uint64_t seed) {
    torch::manual_seed(seed);
    model = build_model(small_spec(), false);
    optimizer = std::make_unique<FusedAdamW>(model->hf_parameters(), AdamWOptions{});
  }
  double step() {
    const auto tokens = torch::randint(0, 50, {2, 9}, torch::kInt64);
    const auto targets = torch::randint(0, 50, {2, 9}, torch::kInt64);
    optimizer->zero_grad();
    const auto loss = model->loss(model->forward(tokens), targets);
    loss.backward();
    optimizer->step(1e-2);
    return loss.item<double>();
  }
  std::shared_ptr<Model> model;
  std::unique_ptr<Optimizer> optimizer;
};

TrainerState some_state(int64_t step) {
  TrainerState s;
  s.step = step, s.data_position = 3 * step + 1, s.tokens_seen = 1000 * step + 7;
  s.loss_scale = 512.0, s.growth_tracker = 9, s.config_hash = "c0ffee";
  return s;
}

Config some_config() {
  Config c;
  c.train.steps = 1234;
  return c;
}

/// Writes checkpoint `step` of a fresh Trainee under `parent` and returns its directory.
std::string write_one(const std::string& parent, int64_t step) {
  Trainee t(step);
  t.step();
  return save_checkpoint(parent, *t.model, *t.optimizer, some_state(step), some_config(), -1);
}

/// Flips one bit of the byte in the middle of `path`, keeping its size.
void flip_a_byte(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  const auto at = static_cast<std::streamoff>(fs::file_size(path) / 2);
  char b = 0;
  f.seekg(at);
  f.read(&b, 1);
  b = static_cast<char>(b ^ 0x04);
  f.seekp(at);
  f.write(&b, 1);
}

/// Rewrites trainer_state.json through `edit`.
void edit_state(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  const std::string path = (fs::path(dir) / "trainer_state.json").string();
  auto j = nlohmann::json::parse(test::read_text(path));
  edit(j);
  std::ofstream(path, std::ios::trunc) << j.dump(2);
}

/// A copy of checkpoint `src` as `<parent>/<name>`.
std::string copy_of(const std::string& src, const std::string& parent, const std::string& name) {
  const auto dst = fs::path(parent) / name;
  fs::create_directories(dst.parent_path());
  fs::copy(src, dst, fs::copy_options::recursive);
  return dst.string();
}

std::map<std::string, torch::Tensor> as_map(const std::vector<NamedTensor>& list) {
  std::map<std::string, torch::Tensor> m;
  for (const auto& [n, t] : list) m[n] = t;
  return m;
}

/// A snapshot's weights, then its optimizer state.
std::vector<NamedTensor> tensors_of(const CheckpointSnapshot& s) {
  std::vector<NamedTensor> all = s.model;
  all.insert(all.end(), s.optimizer.begin(), s.optimizer.end());
  return all;
}

std::set<std::string> entries(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

TEST(Checkpoint, StepAndShardNamesAreZeroPadded) {
  EXPECT_EQ(step_name(0), "step_00000000");
  EXPECT_EQ(step_name(42), "step_00000042");
  EXPECT_EQ(step_name(12345678), "step_12345678");
  EXPECT_EQ(zero_shard_file(0), "zero.rank00000.safetensors");
  EXPECT_EQ(zero_shard_file(12), "zero.rank00012.safetensors");
  EXPECT_EQ(zero_staging_dir("/runs/a/checkpoints", 7), "/runs/a/checkpoints/.step_00000007.zero");
}

TEST(Checkpoint, WriteLaysOutAnIntactDirectoryThatLoadRestoresExactly) {
  test::TempDir dir;
  Trainee src(1);
  src.step();
  src.step();
  const Config config = some_config();
  const std::string ckpt = save_checkpoint(dir.path(), *src.model, *src.optimizer, some_state(7), config, -1);
  EXPECT_EQ(ckpt, dir.file("step_00000007"));
  EXPECT_EQ(entries(dir.path()), std::set<std::string>{"step_00000007"}) << "no temporary directory left";
  EXPECT_EQ(entries(ckpt), (std::set<std::string>{"config.json", "model.safetensors", "optimizer.safetensors",
                                                  "rng.safetensors", "tandem.yaml", "trainer_state.json"}));
  EXPECT_EQ(verify_checkpoint(ckpt), "");
  EXPECT_EQ(checkpoint_zero_world(ckpt), 0);
  EXPECT_EQ(test::read_text(ckpt + "/config.json"), hf_config_json(small_spec()));
  Config back;
  load_checkpoint_config(back, ckpt);
  EXPECT_EQ(back.train.steps, 1234);
  EXPECT_EQ(config_to_yaml(back), config_to_yaml(config));
  // Weights under HF names and shapes (real vocabulary rows, unpadded feed-forward).
  SafetensorsFile weights(ckpt + "/model.safetensors");
  EXPECT_EQ(weights.entry("lm_head.weight").shape, (std::vector<int64_t>{50, 32}));
  EXPECT_EQ(weights.entry("model.layers.1.mlp.down_proj.weight").shape, (std::vector<int64_t>{32, 48}));
  EXPECT_EQ(weights.names().size(), static_cast<size_t>(kParamTensors));

  Trainee dst(2);  // other weights, fresh optimizer
  const TrainerState s = load_checkpoint(ckpt, *dst.model, *dst.optimizer, -1);
  const TrainerState want = some_state(7);
  EXPECT_EQ(s.step, want.step);
  EXPECT_EQ(s.data_position, want.data_position);
  EXPECT_EQ(s.tokens_seen, want.tokens_seen);
  EXPECT_EQ(s.loss_scale, want.loss_scale);
  EXPECT_EQ(s.growth_tracker, want.growth_tracker);
  EXPECT_EQ(s.config_hash, want.config_hash);
  const auto a = as_map(src.model->hf_state_dict()), b = as_map(dst.model->hf_state_dict());
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [n, t] : a) EXPECT_TRUE(test::AllClose(b.at(n), t, 0, 0)) << n;
  const auto oa = as_map(src.optimizer->state()), ob = as_map(dst.optimizer->state());
  ASSERT_EQ(oa.size(), 3u * kParamTensors);
  ASSERT_EQ(ob.size(), oa.size());
  for (const auto& [n, t] : oa) EXPECT_TRUE(test::AllClose(ob.at(n), t, 0, 0)) << n;
}

// Note [Checkpoint layout]'s promise at the level of the API: run N steps, save, reload into a
// fresh model and optimizer, run on; every loss equals the uninterrupted run's, bit for bit.
TEST(Checkpoint, AResumedRunRepeatsTheUninterruptedOneBitForBit) {
  test::TempDir dir;
  Trainee straight(3);
  for (int i = 0; i < 3; ++i) straight.step();
  const std::string ckpt =
      save_checkpoint(dir.path(), *straight.model, *straight.optimizer, some_state(3), some_config(), -1);
  std::vector<double> expected;
  for (int i = 0; i < 4; ++i) expected.push_back(straight.step());

  Trainee resumed(4);
  resumed.step();  // a different history, and the generator moved on
  load_checkpoint(ckpt, *resumed.model, *resumed.optimizer, -1);
  std::vector<double> got;
  for (int i = 0; i < 4; ++i) got.push_back(resumed.step());
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], expected[i]) << "step " << 4 + i;
  // The weights end equal too (padded vocabulary rows are no part of the model and not saved).
  const auto a = as_map(straight.model->hf_state_dict()), b = as_map(resumed.model->hf_state_dict());
  for (const auto& [n, t] : a) EXPECT_TRUE(test::AllClose(b.at(n), t, 0, 0)) << n;
}

TEST(Checkpoint, AFlippedByteInAnyFileIsFoundByItsChecksum) {
  test::TempDir dir;
  const std::string ckpt = write_one(dir.path(), 1);
  for (const char* f :
       {"model.safetensors", "optimizer.safetensors", "rng.safetensors", "tandem.yaml", "config.json"}) {
    const std::string path = ckpt + "/" + f;
    flip_a_byte(path);
    EXPECT_EQ(verify_checkpoint(ckpt), "file '" + std::string(f) + "' does not match its SHA-256 (damaged on disk)");
    flip_a_byte(path);  // the same bit back
    EXPECT_EQ(verify_checkpoint(ckpt), "") << f;
  }
  flip_a_byte(ckpt + "/optimizer.safetensors");
  Trainee t(5);
  const std::string msg = error_of([&] { load_checkpoint(ckpt, *t.model, *t.optimizer, -1); });
  EXPECT_NE(msg.find("is damaged: file 'optimizer.safetensors' does not match its SHA-256"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--resume auto takes the newest intact checkpoint"), std::string::npos) << msg;
}

TEST(Checkpoint, AMissingOrResizedFileIsNamed) {
  test::TempDir dir;
  const std::string ckpt = write_one(dir.path(), 1);
  const auto yaml_bytes = fs::file_size(ckpt + "/tandem.yaml");
  std::ofstream(ckpt + "/tandem.yaml", std::ios::app) << "\n";
  EXPECT_EQ(verify_checkpoint(ckpt), "file 'tandem.yaml' has " + std::to_string(yaml_bytes + 1) +
                                         " bytes, the manifest says " + std::to_string(yaml_bytes));
  fs::resize_file(ckpt + "/tandem.yaml", yaml_bytes);
  EXPECT_EQ(verify_checkpoint(ckpt), "");
  fs::remove(ckpt + "/rng.safetensors");
  EXPECT_EQ(verify_checkpoint(ckpt), "file 'rng.safetensors' is missing");
  fs::remove(ckpt + "/trainer_state.json");
  EXPECT_EQ(verify_checkpoint(ckpt), "no trainer_state.json (cut off while being written?)");
  EXPECT_EQ(verify_checkpoint(dir.file("no-such-checkpoint")), "no trainer_state.json (cut off while being written?)");
}

TEST(Checkpoint, AMalformedStateFileIsRefusedWithAReasonNotAnException) {
  test::TempDir dir;
  const std::string pristine = write_one(dir.file("src"), 1);
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    std::string reason;  // the whole reason, or its start when it ends in '('
  };
  const std::vector<Case> cases = {
      {"version of the wrong type", [](nlohmann::json& j) { j["format_version"] = "2"; },
       "trainer_state.json is malformed ("},
      {"future version", [](nlohmann::json& j) { j["format_version"] = 3; }, "unsupported checkpoint format version 3"},
      {"no version", [](nlohmann::json& j) { j.erase("format_version"); }, "unsupported checkpoint format version 0"},
      {"no manifest", [](nlohmann::json& j) { j.erase("files"); }, "trainer_state.json has no file manifest"},
      {"manifest not an object", [](nlohmann::json& j) { j["files"] = nlohmann::json::array(); },
       "trainer_state.json has no file manifest"},
      {"a file left out", [](nlohmann::json& j) { j["files"].erase("optimizer.safetensors"); },
       "the manifest does not list optimizer.safetensors"},
      {"size of the wrong type", [](nlohmann::json& j) { j["files"]["model.safetensors"]["bytes"] = "many"; },
       "trainer_state.json is malformed ("},
      {"checksum of the wrong type", [](nlohmann::json& j) { j["files"]["rng.safetensors"]["sha256"] = 5; },
       "trainer_state.json is malformed ("},
      {"entry of the wrong type", [](nlohmann::json& j) { j["files"]["tandem.yaml"] = "yes"; },
       "the manifest entry of 'tandem.yaml' is malformed"},
      {"entry without checksum", [](nlohmann::json& j) { j["files"]["tandem.yaml"].erase("sha256"); },
       "the manifest entry of 'tandem.yaml' is malformed"},
      {"shard count of the wrong type", [](nlohmann::json& j) { j["zero_world"] = "two"; },
       "trainer_state.json is malformed ("},
      {"shards that are not there", [](nlohmann::json& j) { j["zero_world"] = 2; },
       "the manifest does not list zero.rank00000.safetensors"},
  };
  int n = 0;
  for (const auto& c : cases) {
    const std::string ckpt = copy_of(pristine, dir.file("run" + std::to_string(n++) + "/checkpoints"), "step_00000001");
    edit_state(ckpt, c.edit);
    std::string why;
    EXPECT_NO_THROW(why = verify_checkpoint(ckpt)) << c.what;
    if (c.reason.back() == '(')
      EXPECT_EQ(why.rfind(c.reason, 0), 0u) << c.what << ": " << why;
    else
      EXPECT_EQ(why, c.reason) << c.what;
    // Passed over, with the reason, by the search for an intact checkpoint.
    std::vector<std::string> skipped;
    std::string found = "?";
    EXPECT_NO_THROW(found = newest_intact_checkpoint(fs::path(ckpt).parent_path().parent_path().string(), &skipped));
    EXPECT_EQ(found, "") << c.what;
    ASSERT_EQ(skipped.size(), 1u) << c.what;
    EXPECT_EQ(skipped[0], ckpt + ": " + why);
  }
  const std::string text = copy_of(pristine, dir.path(), "not_json");
  std::ofstream(text + "/trainer_state.json", std::ios::trunc) << "{\"step\": 1,";
  EXPECT_EQ(verify_checkpoint(text), "trainer_state.json is not valid JSON");
}

// A state refused after it is read leaves the random generators as they were.
TEST(Checkpoint, ARefusedStateLeavesTheGeneratorsAlone) {
  test::TempDir dir;
  const std::string ckpt = write_one(dir.file("src"), 1);
  edit_state(ckpt, [](nlohmann::json& j) { j["step"] = -1; });
  torch::manual_seed(123);
  const auto want = torch::rand({4});
  torch::manual_seed(123);
  EXPECT_THROW(load_checkpoint_state(ckpt, -1), UserError);
  EXPECT_TRUE(torch::equal(torch::rand({4}), want));
}

TEST(Checkpoint, AVersionOneManifestOfSizesIsStillRead) {
  test::TempDir dir;
  const std::string ckpt = write_one(dir.path(), 1);
  edit_state(ckpt, [](nlohmann::json& j) {
    j["format_version"] = 1;
    for (auto& [name, entry] : j["files"].items()) entry = entry["bytes"];
  });
  EXPECT_EQ(verify_checkpoint(ckpt), "");
  const auto bytes = fs::file_size(ckpt + "/model.safetensors");
  fs::resize_file(ckpt + "/model.safetensors", bytes - 1);
  EXPECT_EQ(verify_checkpoint(ckpt), "file 'model.safetensors' has " + std::to_string(bytes - 1) +
                                         " bytes, the manifest says " + std::to_string(bytes));
}

TEST(Checkpoint, ListsCompleteCheckpointsOldestFirst) {
  test::TempDir dir;
  const std::string parent = dir.file("checkpoints");
  EXPECT_TRUE(list_checkpoints(parent).empty()) << "no directory yet";
  for (int64_t step : {12, 3, 7, 100000000}) write_one(parent, step);  // the last: nine digits
  // Not checkpoints: an unfinished one, a write cut off, a foreign directory, a file.
  fs::create_directories(parent + "/step_00000020");
  copy_of(parent + "/step_00000003", parent, ".step_00000030.tmp");
  copy_of(parent + "/step_00000003", parent, "best");
  std::ofstream(parent + "/step_00000040") << "not a directory";
  EXPECT_EQ(list_checkpoints(parent),
            (std::vector<std::string>{parent + "/step_00000003", parent + "/step_00000007", parent + "/step_00000012",
                                      parent + "/step_100000000"}));
}

TEST(Checkpoint, PruneKeepsTheNewestAndClearsWritesThatNeverFinished) {
  test::TempDir dir;
  const std::string parent = dir.file("checkpoints");
  for (int64_t step = 1; step <= 4; ++step) write_one(parent, step);
  fs::create_directories(parent + "/.step_00000005.tmp/x");
  fs::create_directories(parent + "/" + fs::path(zero_staging_dir(parent, 6)).filename().string());
  fs::create_directories(parent + "/.keep");
  fs::create_directories(parent + "/step_00000009");  // unfinished, not a checkpoint: not pruned
  std::ofstream(parent + "/notes.txt") << "mine";
  prune_checkpoints(parent, 2);
  EXPECT_EQ(list_checkpoints(parent), (std::vector<std::string>{parent + "/step_00000003", parent + "/step_00000004"}));
  EXPECT_EQ(entries(parent),
            (std::set<std::string>{"step_00000003", "step_00000004", ".keep", "step_00000009", "notes.txt"}));
  prune_checkpoints(parent, 5);
  EXPECT_EQ(list_checkpoints(parent).size(), 2u);
  prune_checkpoints(parent, 1);
  EXPECT_EQ(list_checkpoints(parent), std::vector<std::string>{parent + "/step_00000004"});
  EXPECT_EQ(verify_checkpoint(parent + "/step_00000004"), "") << "the one kept is untouched";
  EXPECT_NO_THROW(prune_checkpoints(dir.file("nothing-here"), 1));
}

TEST(Checkpoint, NewestIntactPassesOverDamagedOnesWithTheirReasons) {
  test::TempDir run;
  const std::string parent = run.file("checkpoints");
  std::vector<std::string> all;
  for (int64_t step = 1; step <= 3; ++step) all.push_back(write_one(parent, step));
  std::vector<std::string> skipped;
  EXPECT_EQ(newest_intact_checkpoint(run.path(), &skipped), all[2]);
  EXPECT_TRUE(skipped.empty());
  fs::remove(all[2] + "/rng.safetensors");
  flip_a_byte(all[1] + "/model.safetensors");
  EXPECT_EQ(newest_intact_checkpoint(run.path(), &skipped), all[0]);
  EXPECT_EQ(skipped, (std::vector<std::string>{
                         all[2] + ": file 'rng.safetensors' is missing",
                         all[1] + ": file 'model.safetensors' does not match its SHA-256 (damaged on disk)"}));
  EXPECT_EQ(newest_intact_checkpoint(run.path(), nullptr), all[0]);
  fs::remove(all[0] + "/tandem.yaml");
  skipped.clear();
  EXPECT_EQ(newest_intact_checkpoint(run.path(), &skipped), "");
  EXPECT_EQ(skipped.size(), 3u);
  test::TempDir empty;
  EXPECT_EQ(newest_intact_checkpoint(empty.path(), &skipped), "");
}

TEST(Checkpoint, ResolveCheckpointDirTakesACheckpointOrARunAndRefusesTheRest) {
  test::TempDir run;
  const std::string parent = run.file("checkpoints");
  const std::string c1 = write_one(parent, 1), c2 = write_one(parent, 2);
  EXPECT_EQ(resolve_checkpoint_dir(c1), c1) << "a checkpoint itself";
  EXPECT_EQ(resolve_checkpoint_dir(run.path()), c2) << "a run: its newest intact checkpoint";
  EXPECT_EQ(resolve_checkpoint_dir(parent), c2) << "a run's checkpoints/";
  flip_a_byte(c2 + "/model.safetensors");
  EXPECT_EQ(resolve_checkpoint_dir(run.path()), c1) << "passing over the damaged one";
  EXPECT_EQ(resolve_checkpoint_dir(c2), c2) << "named directly, load_checkpoint verifies it";
  flip_a_byte(c1 + "/model.safetensors");
  std::string msg = error_of([&] { resolve_checkpoint_dir(run.path()); });
  EXPECT_NE(msg.find("--resume: every checkpoint in '" + run.path() + "' is damaged (" + c2 +
                     ": file 'model.safetensors' does not match its SHA-256"),
            std::string::npos)
      << msg;

  msg = error_of([&] { resolve_checkpoint_dir(run.file("missing")); });
  EXPECT_EQ(msg, "--resume: '" + run.file("missing") + "' is not a directory; give a checkpoint or run directory");
  std::ofstream(run.file("a-file")) << "x";
  EXPECT_NE(error_of([&] { resolve_checkpoint_dir(run.file("a-file")); }).find("is not a directory"),
            std::string::npos);
  fs::create_directories(parent + "/step_00000003");
  msg = error_of([&] { resolve_checkpoint_dir(parent + "/step_00000003"); });
  EXPECT_NE(msg.find("has no trainer_state.json; the checkpoint is incomplete (cut off while being written?)"),
            std::string::npos)
      << msg;
  test::TempDir empty;
  msg = error_of([&] { resolve_checkpoint_dir(empty.path()); });
  EXPECT_NE(msg.find("--resume: no complete checkpoint in '" + empty.path() + "'"), std::string::npos) << msg;
}

TEST(Checkpoint, SnapshotsReferToTheLiveTensorsOrOwnCopies) {
  Trainee t(6);
  t.step();
  const Config config = some_config();
  CheckpointSnapshot live = take_checkpoint_snapshot(*t.model, *t.optimizer, some_state(1), config, -1, false);
  const CheckpointSnapshot copy = take_checkpoint_snapshot(*t.model, *t.optimizer, some_state(1), config, -1, true);
  // HF weights (fp32) + exp_avg and exp_avg_sq of the stored parameters (fp32) + one fp32 step each.
  constexpr int64_t kBytes = 4 * kHfParams + 2 * 4 * kStoredParams + 4 * kParamTensors;
  EXPECT_EQ(kBytes, 4 * small_spec().num_params_unpadded() + 8 * small_spec().num_params() + 4 * kParamTensors);
  EXPECT_EQ(checkpoint_snapshot_bytes(live), kBytes);
  EXPECT_EQ(checkpoint_snapshot_bytes(copy), kBytes);
  EXPECT_EQ(live.hf_config, hf_config_json(small_spec()));
  EXPECT_EQ(live.tandem_yaml, config_to_yaml(config));
  EXPECT_EQ(live.state.data_position, some_state(1).data_position);
  ASSERT_EQ(live.rng.size(), 1u) << "no device: the CPU generator only";
  EXPECT_EQ(live.rng[0].first, "cpu");
  EXPECT_EQ(live.zero_world, 0);
  EXPECT_TRUE(live.adopt.empty());

  const auto params = as_map(t.model->hf_parameters());
  const auto states = as_map(t.optimizer->state());
  ASSERT_EQ(live.model.size(), params.size());
  ASSERT_EQ(live.optimizer.size(), states.size());
  for (size_t i = 0; i < live.model.size(); ++i) {
    const auto& [name, tensor] = live.model[i];
    EXPECT_EQ(tensor.data_ptr(), params.at(name).data_ptr()) << name << ": a view of the live parameter";
    EXPECT_NE(copy.model[i].second.data_ptr(), tensor.data_ptr()) << name << ": a copy of its own";
    EXPECT_TRUE(torch::equal(copy.model[i].second, tensor)) << name;
  }
  for (const auto& [name, tensor] : live.optimizer) EXPECT_EQ(tensor.data_ptr(), states.at(name).data_ptr()) << name;

  CheckpointSnapshot owned = take_checkpoint_snapshot(*t.model, *t.optimizer, some_state(1), config, -1, false);
  own_checkpoint_snapshot(owned);
  EXPECT_EQ(checkpoint_snapshot_bytes(owned), kBytes);
  const auto copied = tensors_of(copy), kept = tensors_of(owned), referred = tensors_of(live);
  std::vector<torch::Tensor> before;
  for (const auto& [name, tensor] : copied) before.push_back(tensor.clone());
  t.step();  // training goes on
  ASSERT_EQ(kept.size(), before.size());
  ASSERT_EQ(referred.size(), before.size());
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(torch::equal(copied[i].second, before[i])) << copied[i].first << ": the copy stays";
    EXPECT_TRUE(torch::equal(kept[i].second, before[i])) << kept[i].first << ": the owned snapshot stays";
    EXPECT_FALSE(torch::equal(referred[i].second, before[i])) << referred[i].first << ": the live tensor moved on";
  }
}

TEST(Checkpoint, WriteReplacesAStaleWriteAndLeavesNothingWhenItFails) {
  test::TempDir dir;
  const std::string parent = dir.file("checkpoints");
  fs::create_directories(parent + "/.step_00000005.tmp");
  std::ofstream(parent + "/.step_00000005.tmp/junk") << "from a write cut off";
  Trainee t(7);
  CheckpointSnapshot snap = take_checkpoint_snapshot(*t.model, *t.optimizer, some_state(5), some_config(), -1, true);
  const std::string first = write_checkpoint(parent, snap);
  EXPECT_EQ(entries(parent), std::set<std::string>{"step_00000005"});
  EXPECT_FALSE(fs::exists(first + "/junk"));
  // The same step again replaces it whole.
  snap.state.data_position = 999;
  EXPECT_EQ(write_checkpoint(parent, snap), first);
  EXPECT_EQ(verify_checkpoint(first), "");
  EXPECT_EQ(load_checkpoint_state(first, -1).data_position, 999);
  // A write that fails part way (here: a shard file to adopt is missing) removes what it wrote.
  snap.state.step = 6;
  snap.adopt = {dir.file("no-such-shard")};
  EXPECT_ANY_THROW(write_checkpoint(parent, snap));
  EXPECT_EQ(entries(parent), std::set<std::string>{"step_00000005"});
  // A parent that cannot be created is the user's to fix.
  snap.adopt.clear();
  const std::string msg = error_of([&] { write_checkpoint("/proc/tandem-cannot-write-here", snap); });
  EXPECT_NE(msg.find("checkpoint directory '/proc/tandem-cannot-write-here'"), std::string::npos) << msg;
}

TEST(Checkpoint, LoadCheckpointStateRestoresTheGeneratorAndTheCounters) {
  test::TempDir dir;
  Trainee t(8);
  torch::manual_seed(11);
  const CheckpointSnapshot snap =
      take_checkpoint_snapshot(*t.model, *t.optimizer, some_state(4), some_config(), -1, true);
  const auto next_draws = torch::rand({16});  // what the generator gives after the snapshot
  const std::string ckpt = write_checkpoint(dir.path(), snap);
  torch::manual_seed(12);
  const TrainerState s = load_checkpoint_state(ckpt, -1);
  EXPECT_TRUE(torch::equal(torch::rand({16}), next_draws)) << "the generator is back where the snapshot took it";
  EXPECT_EQ(s.step, 4);
  EXPECT_EQ(s.data_position, 13);
  EXPECT_EQ(s.tokens_seen, 4007);
  EXPECT_EQ(s.loss_scale, 512.0);
  EXPECT_EQ(s.growth_tracker, 9);
  EXPECT_EQ(s.config_hash, "c0ffee");
  // Fields added after the first format default when absent.
  const std::string old = copy_of(ckpt, dir.path(), "old");
  edit_state(old, [](nlohmann::json& j) {
    for (const char* k : {"tokens_seen", "loss_scale", "growth_tracker", "config_hash"}) j.erase(k);
  });
  const TrainerState d = load_checkpoint_state(old, -1);
  EXPECT_EQ(d.step, 4);
  EXPECT_EQ(d.tokens_seen, 0);
  EXPECT_EQ(d.loss_scale, 1.0);
  EXPECT_EQ(d.growth_tracker, 0);
  EXPECT_EQ(d.config_hash, "");
  // Refused with the reason: a field mistyped or missing, a negative counter, a damaged directory.
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> bad = {
      {[](nlohmann::json& j) { j["step"] = "seven"; }, "trainer_state.json is malformed ("},
      {[](nlohmann::json& j) { j.erase("data_position"); }, "trainer_state.json is malformed ("},
      {[](nlohmann::json& j) { j["loss_scale"] = "high"; }, "trainer_state.json is malformed ("},
      {[](nlohmann::json& j) { j["config_hash"] = 17; }, "trainer_state.json is malformed ("},
      {[](nlohmann::json& j) { j["step"] = -1; }, "trainer_state.json has a negative step or data position"},
      {[](nlohmann::json& j) { j["data_position"] = -5; }, "trainer_state.json has a negative step or data position"},
  };
  int n = 0;
  for (const auto& [edit, reason] : bad) {
    const std::string c = copy_of(ckpt, dir.path(), "bad" + std::to_string(n++));
    edit_state(c, edit);
    const std::string msg = error_of([&] { load_checkpoint_state(c, -1); });
    EXPECT_NE(msg.find("checkpoint " + c + ": " + reason), std::string::npos) << msg;
    EXPECT_NE(msg.find("resume from an earlier one"), std::string::npos) << msg;
  }
  fs::remove(ckpt + "/rng.safetensors");
  const std::string msg = error_of([&] { load_checkpoint_state(ckpt, -1); });
  EXPECT_NE(msg.find("checkpoint " + ckpt + " is damaged: file 'rng.safetensors' is missing"), std::string::npos)
      << msg;
}

TEST(Checkpoint, LoadRefusesAnotherModelNamingTheTensor) {
  test::TempDir dir;
  const std::string ckpt = write_one(dir.path(), 1);
  ModelSpec other = small_spec();
  other.d_ff = 64;
  torch::manual_seed(0);
  auto model = build_model(other, false);
  FusedAdamW opt(model->hf_parameters(), AdamWOptions{});
  const std::string msg = error_of([&] { load_checkpoint(ckpt, *model, opt, -1); });
  EXPECT_NE(msg.find("model.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight' has shape [48, 32] but the "
                     "model expects [64, 32]"),
            std::string::npos)
      << msg;
}

// A sharded checkpoint by hand: Blocks "a" (10 elements: rank 0 holds [0, 6), rank 1 [6, 10)) and
// "b" (7: [0, 3) and [3, 7)), each element's master, exp_avg and exp_avg_sq known.
torch::Tensor whole(const std::string& block, const std::string& kind) {
  const int64_t n = block == "a" ? 10 : 7;
  const double base = (block == "a" ? 100 : 200) + (kind == "master" ? 0 : kind == "exp_avg" ? 10000 : 20000);
  return torch::arange(n, torch::kFloat32) + base;
}

/// Writes rank r's shard file with the given tandem_zero metadata (or none when nullopt).
void write_shard(const std::string& path, const std::vector<std::tuple<std::string, int64_t, int64_t>>& pieces,
                 const std::optional<std::string>& meta) {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& [block, offset, count] : pieces)
    for (const char* kind : {"master", "exp_avg", "exp_avg_sq"})
      tensors.emplace_back(block + "." + kind, whole(block, kind).narrow(0, offset, count).clone());
  std::map<std::string, std::string> metadata;
  if (meta) metadata["tandem_zero"] = *meta;
  write_safetensors(path, tensors, metadata);
}

std::string zero_meta(const std::vector<std::tuple<std::string, int64_t, int64_t>>& pieces) {
  nlohmann::json blocks = nlohmann::json::object();
  for (const auto& [block, offset, count] : pieces) blocks[block] = {block == "a" ? 10 : 7, offset, count};
  return nlohmann::json{{"blocks", blocks}}.dump();
}

TEST(Checkpoint, ShardedOptimizerStateIsReadBackAtAnyWorldSize) {
  test::TempDir dir;
  const std::string parent = dir.file("checkpoints");
  const std::string staging = zero_staging_dir(parent, 9);
  fs::create_directories(staging);
  const std::vector<std::vector<std::tuple<std::string, int64_t, int64_t>>> ranks = {{{"a", 0, 6}, {"b", 0, 3}},
                                                                                     {{"a", 6, 4}, {"b", 3, 4}}};
  CheckpointSnapshot snap;
  Trainee t(9);
  snap = take_checkpoint_snapshot(*t.model, *t.optimizer, some_state(9), some_config(), -1, true);
  snap.zero_world = 2;
  for (int r = 0; r < 2; ++r) {
    const std::string f = staging + "/" + zero_shard_file(r);
    write_shard(f, ranks[r], zero_meta(ranks[r]));
    snap.adopt.push_back(f);
  }
  const std::string ckpt = write_checkpoint(parent, snap);
  EXPECT_EQ(entries(ckpt),
            (std::set<std::string>{"config.json", "model.safetensors", "rng.safetensors", "tandem.yaml",
                                   "trainer_state.json", "zero.rank00000.safetensors", "zero.rank00001.safetensors"}));
  EXPECT_TRUE(entries(staging).empty()) << "the shard files were moved in";
  EXPECT_EQ(verify_checkpoint(ckpt), "");
  EXPECT_EQ(checkpoint_zero_world(ckpt), 2);
  flip_a_byte(ckpt + "/zero.rank00001.safetensors");
  EXPECT_EQ(verify_checkpoint(ckpt), "file 'zero.rank00001.safetensors' does not match its SHA-256 (damaged on disk)");
  flip_a_byte(ckpt + "/zero.rank00001.safetensors");

  const ZeroShards shards(ckpt);
  EXPECT_EQ(shards.world(), 2);
  for (const char* block : {"a", "b"})
    for (const char* kind : {"master", "exp_avg", "exp_avg_sq"}) {
      const auto expected = whole(block, kind);
      const int64_t n = expected.numel();
      auto out = torch::full({n}, -1.0f);
      shards.read(block, kind, 0, n, out);
      EXPECT_TRUE(test::AllClose(out, expected, 0, 0)) << block << "." << kind;
      // Resharded to 3 ranks (and to 1 element at a time): every slice from the pieces it overlaps.
      for (const int64_t parts : {int64_t{3}, n}) {
        auto joined = torch::full({n}, -1.0f);
        for (int64_t p = 0; p < parts; ++p) {
          const int64_t lo = n * p / parts, hi = n * (p + 1) / parts;
          auto slice = torch::full({hi - lo}, -1.0f);
          shards.read(block, kind, lo, hi - lo, slice);
          joined.narrow(0, lo, hi - lo).copy_(slice);
        }
        EXPECT_TRUE(test::AllClose(joined, expected, 0, 0)) << block << "." << kind << " in " << parts;
      }
    }
  auto across = torch::empty({4});
  shards.read("a", "exp_avg", 4, 4, across);  // 2 from rank 0, 2 from rank 1
  EXPECT_TRUE(test::AllClose(across, whole("a", "exp_avg").narrow(0, 4, 4), 0, 0));
  std::string msg = error_of([&] { shards.read("c", "master", 0, 1, torch::empty({1})); });
  EXPECT_NE(msg.find("the sharded checkpoint has no block 'c'; it was saved from another model"), std::string::npos)
      << msg;
  msg = error_of([&] { shards.read("b", "master", 3, 5, torch::empty({5})); });
  EXPECT_NE(msg.find("block 'b' has 7 parameters in the checkpoint; this model has more"), std::string::npos) << msg;

  // The rest of the state loads alone; loading it whole is refused with what to do.
  EXPECT_EQ(load_checkpoint_state(ckpt, -1).step, 9);
  msg = error_of([&] { load_checkpoint(ckpt, *t.model, *t.optimizer, -1); });
  EXPECT_NE(msg.find("holds optimizer shards of 2 ranks (dist.zero_stage=2)"), std::string::npos) << msg;
  // An unsharded checkpoint has no shards to read.
  const std::string plain = write_one(dir.file("plain"), 1);
  EXPECT_EQ(checkpoint_zero_world(plain), 0);
  EXPECT_NE(error_of([&] { ZeroShards z(plain); }).find("is not sharded"), std::string::npos);
}

TEST(Checkpoint, MalformedShardMetadataIsAUserError) {
  test::TempDir dir;
  const std::vector<std::tuple<std::string, int64_t, int64_t>> all = {{"a", 0, 10}, {"b", 0, 7}};
  struct Case {
    std::optional<std::string> meta;
    std::string message;
  };
  const std::vector<Case> cases = {
      {std::nullopt, "has no tandem_zero metadata; the checkpoint is not tandem's"},
      {"{\"blocks\": ", ": malformed tandem_zero metadata"},
      {"{\"rank\": 0}", ": malformed tandem_zero metadata"},
      {"[1, 2]", ": malformed tandem_zero metadata"},
      {R"({"blocks": {"a": [10, 0]}})",
       "malformed tandem_zero metadata for block 'a' (expected [numel, offset, count])"},
      {R"({"blocks": {"a": ["10", 0, 10]}})", "malformed tandem_zero metadata for block 'a'"},
      {R"({"blocks": {"b": [7, 0.5, 7]}})", "malformed tandem_zero metadata for block 'b'"},
      {R"({"blocks": {"a": {"numel": 10}}})", "malformed tandem_zero metadata for block 'a'"},
  };
  int n = 0;
  for (const auto& c : cases) {
    const std::string ckpt = dir.file("c" + std::to_string(n++));
    fs::create_directories(ckpt);
    std::ofstream(ckpt + "/trainer_state.json") << R"({"zero_world": 1})";
    write_shard(ckpt + "/" + zero_shard_file(0), all, c.meta);
    const std::string msg = error_of([&] { ZeroShards z(ckpt); });
    EXPECT_NE(msg.find(zero_shard_file(0)), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.message), std::string::npos) << (c.meta ? *c.meta : "none") << ": '" << msg << "'";
  }
  // The metadata that the cases spoil reads.
  const std::string good = dir.file("good");
  fs::create_directories(good);
  std::ofstream(good + "/trainer_state.json") << R"({"zero_world": 1})";
  write_shard(good + "/" + zero_shard_file(0), all, zero_meta(all));
  EXPECT_EQ(ZeroShards(good).world(), 1);
  // A shard that is not there.
  std::ofstream(good + "/trainer_state.json", std::ios::trunc) << R"({"zero_world": 2})";
  EXPECT_NE(error_of([&] { ZeroShards z(good); }).find(zero_shard_file(1)), std::string::npos);
}

}  // namespace
}  // namespace tandem
