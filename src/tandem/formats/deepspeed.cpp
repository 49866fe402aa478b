#include "tandem/formats/deepspeed.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "tandem/core/error.h"
#include "tandem/core/strings.h"
#include "tandem/formats/json_text.h"

namespace tandem {

DeepSpeedImport load_deepspeed_config_text(Config& cfg, const std::string& text, const std::string& origin) {
  using nlohmann::json;
  const json root = parse_json_text(text, origin);
  TANDEM_CHECK(root.is_object(), origin, ": a DeepSpeed config must be a JSON object");
  DeepSpeedImport result;
  auto& ignored = result.ignored_keys;
  auto& notes = result.notes;
  const auto is_auto = [](const json& v) { return v.is_string() && v.get<std::string>() == "auto"; };
  const auto num = [&](const json& v, const std::string& key) -> double {
    TANDEM_CHECK(v.is_number(), origin, ": '", key, "' must be a number, got ", v.dump());
    return v.get<double>();
  };
  const auto integer = [&](const json& v, const std::string& key) -> int64_t {
    TANDEM_CHECK(v.is_number_integer(), origin, ": '", key, "' must be an integer, got ", v.dump());
    return v.get<int64_t>();
  };
  const auto boolean = [&](const json& v, const std::string& key) -> bool {
    TANDEM_CHECK(v.is_boolean(), origin, ": '", key, "' must be true or false, got ", v.dump());
    return v.get<bool>();
  };
  const auto object = [&](const json& v, const std::string& key) -> const json& {
    TANDEM_CHECK(v.is_object(), origin, ": '", key, "' must be an object, got ", v.dump());
    return v;
  };
  const auto str = [&](const json& v, const std::string& key) -> std::string {
    TANDEM_CHECK(v.is_string(), origin, ": '", key, "' must be a string, got ", v.dump());
    return v.get<std::string>();
  };
  const auto positive = [&](const json& v, const std::string& key) -> int64_t {
    const int64_t n = integer(v, key);
    TANDEM_CHECK(n > 0, origin, ": '", key, "' must be a positive integer, got ", n);
    return n;
  };

  std::optional<int64_t> micro, accum, global, zero_stage;
  bool half_enabled = false;  // fp16 or bf16 enabled: the two exclude each other
  for (const auto& [key, v] : root.items()) {
    if (is_auto(v)) continue;  // HF Trainer placeholders: keep tandem's own value
    if (key == "train_micro_batch_size_per_gpu") {
      micro = positive(v, key);
    } else if (key == "gradient_accumulation_steps") {
      accum = positive(v, key);
    } else if (key == "train_batch_size") {
      global = positive(v, key);
    } else if (key == "gradient_clipping") {
      cfg.train.grad_clip = num(v, key);
    } else if (key == "steps_per_print") {
      cfg.train.log_every = integer(v, key);
    } else if (key == "optimizer") {
      const json& o = object(v, key);
      for (const auto& [k, x] : o.items()) {
        if (k == "type") {
          const std::string name = str(x, "optimizer.type"), t = to_lower(name);
          TANDEM_CHECK(t == "adam" || t == "adamw" || t == "cpuadam" || t == "fusedadam", origin, ": optimizer type '",
                       name, "' is not supported; use Adam or AdamW");
          cfg.optim.type = OptimizerType::kAdamW;  // DeepSpeed's Adam is AdamW unless adam_w_mode is false
        } else if (k == "params") {
          for (const auto& [p, y] : object(x, "optimizer.params").items()) {
            if (is_auto(y)) continue;
            if (p == "lr")
              cfg.optim.lr = num(y, "optimizer.params.lr");
            else if (p == "eps")
              cfg.optim.eps = num(y, "optimizer.params.eps");
            else if (p == "weight_decay")
              cfg.optim.weight_decay = num(y, "optimizer.params.weight_decay");
            else if (p == "betas") {
              TANDEM_CHECK(y.is_array() && y.size() == 2, origin, ": 'optimizer.params.betas' must be [beta1, beta2]");
              cfg.optim.beta1 = num(y[0], "optimizer.params.betas[0]");
              cfg.optim.beta2 = num(y[1], "optimizer.params.betas[1]");
            } else if (p == "adam_w_mode") {
              cfg.optim.type =
                  boolean(y, "optimizer.params.adam_w_mode") ? OptimizerType::kAdamW : OptimizerType::kAdam;
            } else {
              ignored.push_back("optimizer.params." + p);
            }
          }
        } else {
          ignored.push_back("optimizer." + k);
        }
      }
    } else if (key == "scheduler") {
      const json& s = object(v, key);
      TANDEM_CHECK(s.contains("type"), origin, ": 'scheduler' needs a 'type'");
      const std::string type = str(s["type"], "scheduler.type");
      const json params = s.contains("params") ? object(s["params"], "scheduler.params") : json::object();
      if (type == "WarmupLR" || type == "WarmupDecayLR") {
        cfg.optim.schedule = type == "WarmupLR" ? LrSchedule::kConstant : LrSchedule::kLinear;
        if (type == "WarmupDecayLR") cfg.optim.min_lr_ratio = 0.0;
        for (const auto& [p, y] : params.items()) {
          if (is_auto(y)) continue;
          if (p == "warmup_max_lr")
            cfg.optim.lr = num(y, "scheduler.params.warmup_max_lr");
          else if (p == "warmup_min_lr")
            cfg.optim.warmup_min_lr = num(y, "scheduler.params.warmup_min_lr");
          else if (p == "warmup_num_steps")
            cfg.optim.warmup_steps = integer(y, "scheduler.params.warmup_num_steps");
          else if (p == "total_num_steps" && type == "WarmupDecayLR")
            cfg.optim.decay_steps = integer(y, "scheduler.params.total_num_steps");
          else if (p == "warmup_type" && y.is_string() && y.get<std::string>() == "linear")
            continue;
          else
            ignored.push_back("scheduler.params." + p + (p == "warmup_type" ? " (tandem warms up linearly)" : ""));
        }
      } else if (type == "WarmupCosineLR") {
        cfg.optim.schedule = LrSchedule::kCosine;
        for (const auto& [p, y] : params.items()) {
          if (is_auto(y)) continue;
          if (p == "warmup_num_steps")
            cfg.optim.warmup_steps = integer(y, "scheduler.params.warmup_num_steps");
          else if (p == "total_num_steps")
            cfg.optim.decay_steps = integer(y, "scheduler.params.total_num_steps");
          else if (p == "cos_min_ratio")
            cfg.optim.min_lr_ratio = num(y, "scheduler.params.cos_min_ratio");
          else if (p == "warmup_min_ratio")
            cfg.optim.warmup_min_lr = num(y, "scheduler.params.warmup_min_ratio") * cfg.optim.lr;
          else
            ignored.push_back("scheduler.params." + p);
        }
      } else {
        TANDEM_FAIL(origin, ": scheduler type '", type,
                    "' is not supported; use WarmupLR, WarmupDecayLR or WarmupCosineLR");
      }
    } else if (key == "bf16" || key == "fp16") {
      const json& o = object(v, key);
      const bool enabled = o.contains("enabled") && !is_auto(o["enabled"]) && boolean(o["enabled"], key + ".enabled");
      if (enabled) {
        TANDEM_CHECK(!half_enabled, origin, ": both fp16 and bf16 are enabled; enable one (bf16 on GPUs that have it)");
        half_enabled = true;
        cfg.train.precision = key == "bf16" ? Precision::kBf16 : Precision::kFp16;
      }
      for (const auto& [k, x] : o.items()) {
        if (k == "enabled" || is_auto(x)) continue;
        if (key == "fp16" && k == "loss_scale") {
          const double s = num(x, "fp16.loss_scale");
          cfg.scaler.dynamic = s == 0.0;
          if (s > 0) cfg.scaler.init_scale = s;
        } else if (key == "fp16" && k == "initial_scale_power") {
          cfg.scaler.init_scale = std::ldexp(1.0, static_cast<int>(integer(x, "fp16.initial_scale_power")));
        } else if (key == "fp16" && k == "loss_scale_window") {
          cfg.scaler.growth_interval = integer(x, "fp16.loss_scale_window");
        } else if (key == "fp16" && k == "min_loss_scale") {
          cfg.scaler.min_scale = num(x, "fp16.min_loss_scale");
        } else {
          ignored.push_back(key + "." + k);
        }
      }
    } else if (key == "zero_optimization") {
      for (const auto& [k, x] : object(v, key).items()) {
        if (k == "offload_optimizer") {
          for (const auto& [p, y] : object(x, "zero_optimization.offload_optimizer").items()) {
            if (p == "device") {
              const std::string d = to_lower(str(y, "zero_optimization.offload_optimizer.device"));
              TANDEM_CHECK(d == "cpu" || d == "none", origin, ": zero_optimization.offload_optimizer.device '", d,
                           "' is not supported; use cpu or none");
              cfg.offload.optimizer = d == "cpu" ? OffloadTarget::kCpu : OffloadTarget::kNone;
            } else if (p == "pin_memory") {
              cfg.offload.pin_memory = boolean(y, "zero_optimization.offload_optimizer.pin_memory");
            } else {
              ignored.push_back("zero_optimization.offload_optimizer." + p);
            }
          }
        } else if (k == "stage") {
          zero_stage = integer(x, "zero_optimization.stage");
        } else {
          ignored.push_back("zero_optimization." + k);
        }
      }
    } else {
      ignored.push_back(key);
    }
  }
  // ZeRO: stages 1-3 shard the optimizer state and gradients, tandem's dist.zero_stage=2, which works
  // on the offload engine's masters. Without offload_optimizer it does not apply, and stage 3's
  // parameter sharding tandem does not do: both said, with what was set.
  if (zero_stage) {
    TANDEM_CHECK(*zero_stage >= 0 && *zero_stage <= 3, origin, ": zero_optimization.stage ", *zero_stage,
                 " is not a ZeRO stage; use 0 to 3");
    const bool offload = cfg.offload.optimizer == OffloadTarget::kCpu;
    if (*zero_stage >= 1 && offload) cfg.dist.zero_stage = 2;
    if (*zero_stage >= 1 && !offload)
      notes.push_back(strprintf(
          "zero_optimization.stage=%lld: tandem's ZeRO (dist.zero_stage=2) shards the offload engine's fp32 masters, "
          "states and gradients over the ranks, so without offload_optimizer.device=cpu it was not set; add that to "
          "shard (stages 1, 2 and 3 all map to it)",
          static_cast<long long>(*zero_stage)));
    else if (*zero_stage == 3)
      notes.push_back(
          "zero_optimization.stage=3: set as dist.zero_stage=2 (masters, states and gradients sharded); the bf16 "
          "working weights stay whole on every GPU, as tandem does not shard parameters");
  }
  // Batch arithmetic: train_batch_size counts every rank (WORLD_SIZE under a launcher, else 1).
  const char* ws = std::getenv("WORLD_SIZE");
  const int64_t world = ws != nullptr && std::atoll(ws) > 0 ? std::atoll(ws) : 1;
  if (global) {
    TANDEM_CHECK(*global % world == 0, origin, ": train_batch_size (", *global, ") is not a multiple of the ", world,
                 " ranks");
    *global /= world;
  }
  if (global && micro && accum) {
    TANDEM_CHECK(*global == *micro * *accum, origin, ": train_batch_size (", *global * world,
                 ") must equal train_micro_batch_size_per_gpu (", *micro, ") x gradient_accumulation_steps (", *accum,
                 ") x ", world, " rank(s)");
  } else if (global && micro) {
    TANDEM_CHECK(*global % *micro == 0, origin, ": train_batch_size (", *global * world,
                 ") is not a multiple of train_micro_batch_size_per_gpu (", *micro, ") x ", world, " rank(s)");
    accum = *global / *micro;
  } else if (global && accum) {
    TANDEM_CHECK(*global % *accum == 0, origin, ": train_batch_size (", *global * world,
                 ") is not a multiple of gradient_accumulation_steps (", *accum, ") x ", world, " rank(s)");
    micro = *global / *accum;
  } else if (global) {
    micro = *global;
    accum = 1;
  }
  if (micro) cfg.train.micro_batch = *micro;
  if (accum) cfg.train.grad_accum = *accum;
  return result;
}

DeepSpeedImport load_deepspeed_config(Config& cfg, const std::string& path) {
  std::ifstream in(path);
  TANDEM_CHECK(in.good(), "cannot read DeepSpeed config '", path, "'; check the path");
  std::stringstream ss;
  ss << in.rdbuf();
  return load_deepspeed_config_text(cfg, ss.str(), path);
}

}  // namespace tandem
