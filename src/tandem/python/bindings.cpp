// The `tandem._C` extension: the engine's boundary (ModuleBlocks) and the Python engine's step
// (EngineCore) for the `tandem` package (python/tandem/). Errors of the user's making arrive as
// ValueError with one line naming the cause and the fix (Note [Python errors]).

#include <torch/extension.h>

#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "tandem/core/config.h"
#include "tandem/core/device_spec.h"
#include "tandem/core/error.h"
#include "tandem/core/strings.h"
#include "tandem/io/config_layers.h"
#include "tandem/models/autocast.h"
#include "tandem/models/model.h"
#include "tandem/parallel/rank_info.h"
#include "tandem/python/engine_core.h"
#include "tandem/python/module_blocks.h"
#include "tandem/python/token_batches.h"
#include "tandem/run/run_plan.h"
#include "tandem/run/run_setup.h"

namespace py = pybind11;
using namespace tandem;

namespace tandem {
void bind_tokenizer(py::module_& m);  // tokenizer_bindings.cpp
}

namespace {

// Note [Python errors]
// UserError (bad input: a key, a value, a file, a model structure, a memory plan) becomes
// ValueError with its one line; a broken invariant of tandem's (InternalError) and LibTorch's own
// errors become RuntimeError without the C++ backtrace. Nothing aborts the interpreter.
void translate(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const UserError& e) {
    PyErr_SetString(PyExc_ValueError, one_line(e.what()).c_str());
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, one_line(e.what_without_backtrace()).c_str());
  }
}

using ParamList = std::vector<std::tuple<std::string, torch::Tensor>>;

std::shared_ptr<ModuleBlocks> make_blocks(const std::vector<std::tuple<std::string, BlockKind, ParamList>>& groups) {
  std::vector<BlockGroup> out;
  for (const auto& [name, kind, params] : groups) {
    BlockGroup g{name, kind, {}};
    for (const auto& [pname, t] : params) g.params.emplace_back(pname, t);
    out.push_back(std::move(g));
  }
  return std::make_shared<ModuleBlocks>(std::move(out));
}

// The layers as `tandem train` has them (Note [Config layers]): the defaults, the recipe for a model
// of `module_params` parameters (0: the generic row), each file (YAML: tandem's keys; .json: a
// DeepSpeed config), then each key.
Config make_config(const std::vector<std::string>& files, const std::vector<std::pair<std::string, std::string>>& keys,
                   int64_t module_params = 0) {
  std::vector<ConfigLayer> layers;
  for (const auto& f : files) layers.push_back(config_file_layer(f));
  layers.push_back(key_layer("tandem.Engine(config=...)", keys));
  RecipeOptions recipe;
  recipe.model = module_params > 0 ? RecipeModel::kModule : RecipeModel::kUnknown;
  recipe.module_params = module_params;
  return resolve_config(layers, recipe).config;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "tandem's C++ engine (use the `tandem` package, not this module)";
  py::register_exception_translator(&translate);
  m.attr("__version__") = TANDEM_VERSION;

  py::enum_<BlockKind>(m, "BlockKind")
      .value("EMBEDDING", BlockKind::kEmbedding)
      .value("LAYER", BlockKind::kLayer)
      .value("HEAD", BlockKind::kHead);

  py::class_<ModuleBlocks, std::shared_ptr<ModuleBlocks>>(m, "ModuleBlocks")
      .def(py::init(&make_blocks), py::arg("groups"))
      .def("block_count", &ModuleBlocks::block_count)
      .def("block_name", &ModuleBlocks::block_name)
      .def("numel", &ModuleBlocks::numel)
      .def("before_block", &ModuleBlocks::before_block, py::call_guard<py::gil_scoped_release>())
      .def("host_block", &ModuleBlocks::host_block);

  py::class_<StepInfo>(m, "StepInfo", "What an optimizer step did (engine.step(), engine.train_step()).")
      .def_readonly("step", &StepInfo::step, "optimizer steps completed")
      .def_readonly("skipped", &StepInfo::skipped, "a non-finite gradient: nothing was updated")
      .def_readonly("grad_norm", &StepInfo::grad_norm, "the global gradient norm before clipping")
      .def_readonly("lr", &StepInfo::lr, "the step's learning rate")
      .def_readonly("loss_scale", &StepInfo::loss_scale, "the fp16 loss scale for the next step (1 otherwise)")
      .def_readonly("loss", &StepInfo::loss,
                    "the step's mean loss on this rank (NaN when the engine did not see it: loss.backward() "
                    "under OffloadAdamW without a closure)")
      .def("__repr__", [](const StepInfo& s) {
        return strprintf("StepInfo(step=%lld, loss=%.6g, grad_norm=%.6g, lr=%.6g, skipped=%s, loss_scale=%g)",
                         static_cast<long long>(s.step), s.loss, s.grad_norm, s.lr, s.skipped ? "True" : "False",
                         s.loss_scale);
      });

  m.def("make_config_yaml",
        [](const std::vector<std::string>& files, const std::vector<std::pair<std::string, std::string>>& keys) {
          return config_to_yaml(make_config(files, keys));
        });
  m.def("config_values",
        [](const std::vector<std::string>& files, const std::vector<std::pair<std::string, std::string>>& keys,
           const std::vector<std::string>& names) {
          const Config cfg = make_config(files, keys);
          std::vector<std::string> out;
          for (const auto& n : names) out.push_back(get_config_key(cfg, n));
          return out;
        });
  m.def("config_key_names", &config_key_names);
  m.def(
      "run_device",
      [](const std::vector<std::string>& files, const std::vector<std::pair<std::string, std::string>>& keys) {
        return run_device(make_config(files, keys), discover_rank());
      },
      py::arg("files"), py::arg("keys"),
      "The device this rank trains on, as the CLI's run context picks it (run/run_setup.h); ValueError for a "
      "device that is not there.");
  m.def(
      "autocast_dtype",
      [](const std::vector<std::string>& files, const std::vector<std::pair<std::string, std::string>>& keys) {
        return autocast_dtype(make_config(files, keys).train.precision);
      },
      py::arg("files"), py::arg("keys"), "The dtype train.precision computes in under autocast; None for fp32.");
  m.def("new_run_dir", &new_run_dir, py::arg("name"),
        "A new run directory's name, as the CLI names its runs: runs/<date>-<time>-<name>[-N].");
  m.def(
      "cross_device",
      [](const torch::Tensor& x, const std::string& device) { return cross_device(x, torch::Device(device)); },
      py::arg("x"), py::arg("device"),
      "x on `device` inside autograd, through pinned buffers (Note [Block placement]).");

  py::class_<TokenBatches>(m, "TokenBatches")
      .def(py::init([](const std::vector<std::string>& files,
                       const std::vector<std::pair<std::string, std::string>>& keys, int64_t vocab_size, int64_t rows,
                       int64_t first_row) {
             return std::make_unique<TokenBatches>(make_config(files, keys), vocab_size, rows, first_row);
           }),
           py::arg("files"), py::arg("keys"), py::arg("vocab_size"), py::arg("rows") = 0, py::arg("first_row") = 0)
      .def("next", &TokenBatches::next, py::call_guard<py::gil_scoped_release>())
      .def("position", &TokenBatches::position)
      .def("seek", &TokenBatches::seek);

  py::class_<EngineCore>(m, "EngineCore")
      .def(py::init([](std::shared_ptr<ModuleBlocks> blocks, const std::vector<std::string>& files,
                       const std::vector<std::pair<std::string, std::string>>& keys, const std::string& run_dir) {
             Config cfg = make_config(files, keys, blocks->numel());
             py::gil_scoped_release release;  // the rendezvous may wait for the other ranks
             return std::make_unique<EngineCore>(std::move(blocks), std::move(cfg), run_dir);
           }),
           py::arg("blocks"), py::arg("files"), py::arg("keys"), py::arg("run_dir"))
      .def("begin_forward", &EngineCore::begin_forward, py::arg("lr") = std::nullopt, py::arg("last") = std::nullopt,
           py::call_guard<py::gil_scoped_release>())
      .def("loss_multiplier", &EngineCore::loss_multiplier)
      .def("end_backward", &EngineCore::end_backward)
      .def("micro", &EngineCore::micro)
      .def("accumulation", &EngineCore::accumulation)
      .def("update", &EngineCore::update, py::arg("loss"), py::arg("tokens"), py::call_guard<py::gil_scoped_release>())
      .def("abandon", &EngineCore::abandon, py::call_guard<py::gil_scoped_release>())
      .def("retry_smaller", &EngineCore::retry_smaller, py::arg("what"), py::arg("rows"),
           py::call_guard<py::gil_scoped_release>())
      .def("parts", &EngineCore::parts, py::arg("rows"))
      .def("oom_retries", &EngineCore::oom_retries)
      .def("save", &EngineCore::save, py::arg("run_dir"), py::arg("hf_config"),
           py::call_guard<py::gil_scoped_release>())
      .def("load", &EngineCore::load, py::arg("path"), py::call_guard<py::gil_scoped_release>())
      .def("wait", &EngineCore::wait, py::call_guard<py::gil_scoped_release>())
      .def("finish_run", &EngineCore::finish_run, py::call_guard<py::gil_scoped_release>())
      .def("step", &EngineCore::step)
      .def("run_dir", &EngineCore::run_dir)
      .def("data_position", &EngineCore::data_position)
      .def("device", &EngineCore::device)
      .def("rank", &EngineCore::rank)
      .def("world", &EngineCore::world)
      .def("offload", &EngineCore::offload)
      .def("config_yaml", [](const EngineCore& e) { return config_to_yaml(e.config()); })
      .def("stats_json", &EngineCore::stats_json)
      .def("assign_groups", &EngineCore::assign_groups, py::arg("params"))
      .def(
          "set_group_hypers",
          [](EngineCore& e, const std::vector<std::tuple<double, double, double, double, double, int64_t>>& groups) {
            std::vector<GroupHyper> hg;
            for (const auto& [lr, b1, b2, eps, wd, before] : groups) hg.push_back({lr, b1, b2, eps, wd, before});
            e.set_group_hypers(hg);
          },
          py::arg("groups"), "each group's (lr, beta1, beta2, eps, weight_decay, steps before its first)")
      .def("param_state", &EngineCore::param_state, py::arg("param"), py::call_guard<py::gil_scoped_release>())
      .def("load_param_state", &EngineCore::load_param_state, py::arg("param"), py::arg("master"), py::arg("exp_avg"),
           py::arg("exp_avg_sq"), py::call_guard<py::gil_scoped_release>())
      .def("set_step", &EngineCore::set_step, py::arg("step"))
      .def(
          "set_buffers",
          [](EngineCore& e, const std::vector<std::tuple<std::string, torch::Tensor>>& buffers) {
            std::vector<NamedTensor> named;
            for (const auto& [n, t] : buffers) named.emplace_back(n, t);
            e.set_buffers(std::move(named));
          },
          py::arg("buffers"));

  bind_tokenizer(m);
}
