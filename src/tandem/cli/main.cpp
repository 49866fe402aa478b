// The tandem command line: train, inspect, config, bench.

#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <signal.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "tandem/bench/bk_core_bench.h"
#include "tandem/bench/optim_bench.h"
#include "tandem/bench/step_bench.h"
#include "tandem/cli/chat_command.h"
#include "tandem/cli/generate_command.h"
#include "tandem/cli/inspect_command.h"
#include "tandem/cli/partition_command.h"
#include "tandem/cli/serve_command.h"
#include "tandem/cli/tokenize_command.h"
#include "tandem/core/config.h"
#include "tandem/core/device.h"
#include "tandem/core/error.h"
#include "tandem/core/interrupt.h"
#include "tandem/core/log.h"
#include "tandem/core/strings.h"
#include "tandem/dist/comm.h"
#include "tandem/dist/launcher.h"
#include "tandem/io/checkpoint.h"
#include "tandem/io/config_layers.h"
#include "tandem/io/hf.h"
#include "tandem/memory/estimate.h"
#include "tandem/memory/plan.h"
#include "tandem/models/spec.h"
#include "tandem/monitor/report.h"
#include "tandem/monitor/run_feed.h"
#include "tandem/monitor/web_server.h"
#include "tandem/run/trainer.h"

namespace {

using namespace tandem;

/// Options every command that reads a configuration shares.
struct ConfigArgs {
  std::vector<std::string> config_files;
  std::string deepspeed;
  std::vector<std::string> sets;
  // Every flag is kept as its text and set through its key, so it passes the key's own checks.
  std::string preset, device, init_from, run_dir, steps, metrics_port, dashboard_port;
  bool tensorboard = false;

  void add_to(CLI::App* app, bool training) {
    app->add_option("-c,--config", config_files,
                    "YAML config (tandem keys, nested or dotted); .json = DeepSpeed; repeatable")
        ->check(CLI::ExistingFile);
    app->add_option("--deepspeed", deepspeed, "DeepSpeed JSON config: the keys that map are used, the rest listed")
        ->check(CLI::ExistingFile);
    app->add_option("-s,--set", sets, "override one key: --set train.steps=100 (repeatable; `tandem config --keys`)");
    app->add_option("-p,--preset", preset, "model preset: " + join(preset_names(), ", "));
    app->add_option("--device", device, "auto | cpu | cuda | cuda:N");
    app->add_option("--init-from", init_from, "start from an HF LLaMA directory (config.json + safetensors)");
    if (training) {
      app->add_option("--steps", steps, "optimizer steps (train.steps)");
      app->add_option("--run-dir", run_dir, "run directory (default runs/<date>-<time>-<preset>)");
      app->add_option("--metrics-port", metrics_port,
                      "serve Prometheus /metrics on this port (loopback; monitor.bind to change)");
      app->add_option("--dashboard", dashboard_port, "serve the live dashboard on this port (loopback)");
      app->add_flag("--tensorboard", tensorboard, "write TensorBoard scalars to <run dir>/tensorboard");
    }
  }

  /// defaults < recipe < resumed checkpoint's config < --config files < --deepspeed < flags < --set
  /// (Note [Config layers])
  ResolvedConfig resolve_layers(const std::string& resume_dir) const {
    std::vector<ConfigLayer> layers;
    if (!resume_dir.empty()) layers.push_back(checkpoint_layer(resume_dir));
    for (const auto& f : config_files) layers.push_back(config_file_layer(f));
    if (!deepspeed.empty()) layers.push_back(deepspeed_layer(deepspeed));
    layers.push_back({"flags", [this](Config& cfg, std::vector<std::string>&) {
                        if (!preset.empty()) set_config_key(cfg, "model.preset", preset, "--preset");
                        if (!device.empty()) set_config_key(cfg, "train.device", device, "--device");
                        if (!init_from.empty()) set_config_key(cfg, "model.init_from", init_from, "--init-from");
                        if (!steps.empty()) set_config_key(cfg, "train.steps", steps, "--steps");
                        if (!run_dir.empty()) set_config_key(cfg, "train.run_dir", run_dir, "--run-dir");
                        if (!metrics_port.empty())
                          set_config_key(cfg, "monitor.metrics_port", metrics_port, "--metrics-port");
                        if (!dashboard_port.empty())
                          set_config_key(cfg, "monitor.dashboard_port", dashboard_port, "--dashboard");
                        if (tensorboard) set_config_key(cfg, "monitor.tensorboard", "true", "--tensorboard");
                      }});
    layers.push_back({"--set", [this](Config& cfg, std::vector<std::string>&) {
                        for (const auto& s : sets) apply_override(cfg, s);
                      }});
    RecipeOptions recipe;
    recipe.resume_dir = resume_dir;
    return resolve_config(layers, recipe);
  }

  Config resolve(const std::string& resume_dir) const { return resolve_layers(resume_dir).config; }
};

// `tandem dashboard RUN_DIR`: the live page over a run's metrics.jsonl, re-read on each poll, until
// SIGINT or SIGTERM.
int run_dashboard(const std::string& dir, int port, const std::string& bind, const std::string& chartjs) {
  namespace fs = std::filesystem;
  TANDEM_CHECK(fs::is_directory(dir), "'", dir, "' is not a directory; give a run directory (runs/<name>)");
  TANDEM_CHECK(fs::exists(fs::path(dir) / "metrics.jsonl") || fs::exists(fs::path(dir) / "config.yaml"), "'", dir,
               "' holds no metrics.jsonl or config.yaml; give the directory a `tandem train` run writes");
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // before the server's thread starts: it inherits the mask
  RunFeed feed;
  feed.set_info({{"run_dir", dir}, {"mode", "viewing metrics.jsonl"}});
  WebServerOptions o;
  o.host = bind;
  o.port = port;
  o.chartjs_path = chartjs;
  o.follow_metrics = (fs::path(dir) / "metrics.jsonl").string();
  o.run_label = fs::absolute(dir).lexically_normal().filename().string();
  WebServer server(feed, o);
  if (!server.warning().empty()) log::warn(server.warning());
  log::info("dashboard for " + dir + " at " + server.url() + " (Ctrl-C to stop)");
  int sig = 0;
  sigwait(&set, &sig);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "tandem: train models larger than GPU memory at GPU speed, using the GPU, pinned host memory\n"
      "and CPU cores together.\n\n"
      "  tandem train                      train the embedded default (tiny model, generated corpus)\n"
      "  tandem train -p 1B --set train.precision=bf16 --set data.path=train.bin\n"
      "  tandem train --resume runs/<run>  continue a run exactly where its last checkpoint left it\n"
      "  tandem inspect -p 7B              parameters and the memory estimate per device\n"
      "  tandem inspect -p 7B --plan       the offload engine's memory plan: GPU, pinned and pageable host\n"
      "  tandem inspect -p 13B --plan --ranks 2 --set dist.zero_stage=2   the plan of each of 2 GPUs\n"
      "  tandem config --keys              every configuration key with its meaning\n"
      "  tandem bench optim                the CPU optimizer kernels against LibTorch's, 256M and 1B params\n"
      "  tandem bench step -p 7B           forward+backward alone: the GPU-only bound of a step\n"
      "  tandem tokenize --tokenizer MODEL_DIR --out data/train.bin corpus/   text into token files\n"
      "  tandem generate --checkpoint runs/<run> --prompt \"Once upon\"   text from a trained model\n"
      "  tandem serve --checkpoint runs/<run> --port 8000   an OpenAI-compatible API on loopback\n"
      "  tandem chat --checkpoint runs/<run>   a conversation in the terminal\n"
      "  tandem launch --nproc-per-node 2 -- tandem train --set dist.pipeline_stages=auto   stages or replicas\n"
      "  tandem inspect -p 7B --partition  the pipeline partitioner's profile and plan on this machine",
      "tandem"};
  app.set_version_flag("--version", std::string("tandem ") + TANDEM_VERSION);
  app.require_subcommand(0, 1);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "debug logging");

  ConfigArgs train_args, inspect_args, config_args, step_args;
  std::string resume;
  auto* train_cmd = app.add_subcommand("train", "train a model (no options: the embedded default job)");
  train_args.add_to(train_cmd, true);
  train_cmd->add_option(
      "--resume", resume,
      "continue from a checkpoint directory, a run directory's newest intact checkpoint, or auto (the "
      "--run-dir's newest intact one; a fresh start when there is none)");

  LaunchOptions launch_opts;
  std::string nproc = "1";
  auto* launch_cmd = app.add_subcommand(
      "launch",
      "start worker processes with torchrun's environment, pass their output on by rank, restart them on failure: "
      "tandem launch --nproc-per-node 2 -- tandem train ...");
  launch_cmd->add_option("--nproc-per-node", nproc,
                         "workers on this node: N, or MIN:MAX (a slot failing twice in a row is dropped, down to MIN)");
  launch_cmd->add_option("--nnodes", launch_opts.nnodes, "nodes in the run (one launcher per node)");
  launch_cmd->add_option("--node-rank", launch_opts.node_rank, "this node's index, 0 .. nnodes-1");
  launch_cmd->add_option("--master-addr", launch_opts.master_addr, "host of rank 0 (the rendezvous store)");
  launch_cmd->add_option("--master-port", launch_opts.master_port, "port of the rendezvous store");
  launch_cmd->add_option("--max-restarts", launch_opts.max_restarts,
                         "restart every worker this many times after a failure (with --resume auto they continue "
                         "from the newest intact checkpoint)");
  launch_cmd->add_option("--stop-grace", launch_opts.stop_grace_s, "seconds between SIGTERM and SIGKILL when stopping");
  bool no_prefix = false;
  launch_cmd->add_flag("--no-prefix", no_prefix, "pass worker output on without the [rank N] prefix");
  launch_cmd->add_option("command", launch_opts.command, "the worker command, after --")->required()->expected(-1);

  auto* inspect_cmd =
      app.add_subcommand("inspect", "show the model, its parameter counts and the memory estimate per device");
  inspect_args.add_to(inspect_cmd, false);
  InspectOptions inspect_opts;
  inspect_cmd->add_flag("--plan", inspect_opts.plan,
                        "the offload engine's memory plan (GPU, pinned and pageable host) instead of the estimate; "
                        "refuses a plan that does not fit");
  inspect_cmd->add_flag("--partition", inspect_opts.partition,
                        "profile each Block here and print the pipeline partitioner's plan for dist.pipeline_stages "
                        "(auto: the best stage count): stages, Blocks, devices, predicted time and memory");
  inspect_cmd->add_flag("--partition-cpu", inspect_opts.partition_opts.with_cpu,
                        "--partition, and the host CPU weighed as one more stage beside the GPUs");
  inspect_cmd
      ->add_option("--partition-ranks", inspect_opts.partition_opts.ranks,
                   "with --partition: ranks to plan for (default one per visible GPU, 1 on the CPU); ranks beyond "
                   "the visible devices are copies of the first")
      ->check(CLI::PositiveNumber);
  auto* gpu_memory_opt = inspect_cmd
                             ->add_option("--gpu-memory", inspect_opts.gpu_memory_gib,
                                          "GiB of GPU memory to plan for (default: the first visible GPU's, else 80)")
                             ->check(CLI::PositiveNumber);
  inspect_cmd
      ->add_option("--host-memory", inspect_opts.host_memory_gib,
                   "GiB of available host memory to plan for (default: MemAvailable of /proc/meminfo)")
      ->check(CLI::PositiveNumber);
  inspect_cmd
      ->add_option("--ranks", inspect_opts.ranks,
                   "with --plan: ranks on this host, one GPU each, to plan for (dist.zero_stage, "
                   "dist.pipeline_stages and dist.pipeline_cut lay them out; a plan per stage)")
      ->check(CLI::PositiveNumber);

  bool list_keys = false;
  auto* config_cmd = app.add_subcommand("config", "print the resolved configuration as YAML, or list every key");
  config_args.add_to(config_cmd, true);
  config_cmd->add_flag("--keys", list_keys, "list every key with its type and meaning");

  std::string report_dir, report_out;
  auto* report_cmd = app.add_subcommand("report", "write RUN_DIR/report.html: plots, summary and config, offline");
  report_cmd->add_option("run_dir", report_dir, "run directory")->required();
  report_cmd->add_option("-o,--output", report_out, "where to write it (default RUN_DIR/report.html)");

  std::string view_dir, view_bind = "127.0.0.1", view_chartjs;
  int view_port = 8080;
  auto* dashboard_cmd = app.add_subcommand(
      "dashboard", "serve the dashboard for a run directory (finished, or written by another process)");
  dashboard_cmd->add_option("run_dir", view_dir, "run directory")->required();
  dashboard_cmd->add_option("--port", view_port, "port (default 8080)")->check(CLI::Range(1, 65535));
  dashboard_cmd->add_option("--bind", view_bind, "address to listen on (default 127.0.0.1: this machine only)");
  dashboard_cmd->add_option("--chartjs", view_chartjs, "Chart.js file to serve (default Debian's libjs-chart.js)");

  TokenizeCommand tokenize_cmd(app);
  GenerateCommand generate_cmd(app);
  ServeCommand serve_cmd(app);
  ChatCommand chat_cmd(app);

  auto* bench_cmd = app.add_subcommand("bench", "benchmarks");
  bench_cmd->require_subcommand(1);
  OptimBenchOptions bench_opts;
  std::vector<std::string> bench_sizes;
  auto* bench_optim = bench_cmd->add_subcommand(
      "optim", "CPU optimizer kernels vs LibTorch's CPU AdamW (fused, foreach) and copy bandwidth");
  bench_optim->add_option("--params", bench_sizes, "parameter counts, e.g. --params 256M 1B (default 256M 1B)")
      ->delimiter(',');
  bench_optim->add_option("--repeats", bench_opts.repeats, "timed steps per variant (median reported)");
  bench_optim->add_option("--warmup", bench_opts.warmup, "untimed steps first");
  bench_optim
      ->add_option("--threads", bench_opts.threads,
                   "threads (default: TANDEM_CPU_THREADS, OMP_NUM_THREADS or all cores)")
      ->check(CLI::NonNegativeNumber);
  bench_optim->add_flag("--pin", bench_opts.pin, "pin kernel threads to cores");
  bench_optim->add_option("--isa", bench_opts.isas, "also time the fp32 variant at these levels: scalar avx2 avx512")
      ->delimiter(',');
  bench_optim->add_option("--json", bench_opts.json_path, "append one JSON object per measurement to this file");

  BkCoreBenchOptions bk_opts;
  auto* bench_step = bench_cmd->add_subcommand(
      "step",
      "forward+backward alone, weights and gradients resident on the device, no optimizer: the GPU-only "
      "bound of a training step (same model and batch keys as train)");
  step_args.add_to(bench_step, true);
  std::string step_json, step_model_json;
  bench_step->add_option("--json", step_json, "append one JSON object with the result to this file");
  bench_step->add_option("--model-json", step_model_json, "write the model's HF config.json here (for peers)");
  auto* bench_bk = bench_cmd->add_subcommand(
      "bk_core", "BK-core kernels vs the same sweeps in LibTorch ops, cuSPARSE gtsv2 and the bandwidth floor");
  bench_bk->add_option("--batch", bk_opts.batches, "batch sizes (default 1,32,256)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  bench_bk->add_option("--n", bk_opts.lengths, "sequence lengths (default 1024,4096,65536,1000000)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  bench_bk->add_option("--device", bk_opts.device, "auto | cpu | cuda");
  bench_bk->add_option("--repeats", bk_opts.repeats, "timed calls per measurement (median reported)");
  bench_bk->add_option("--ops-max", bk_opts.ops_max_elements, "run the LibTorch-ops baseline where B*N <= this");
  bench_bk->add_option("--cusparse-max", bk_opts.cusparse_max_elements,
                       "run the cuSPARSE comparison where B*N*N <= this (it needs B*N*N complex values, 4 times)");
  bench_bk->add_option("--json", bk_opts.json_path, "append one JSON object per measurement to this file");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "tandem: error: %s; see tandem --help\n", one_line(e.what()).c_str());
    return 2;
  }
  log::set_verbose(verbose);

  try {
    if (*train_cmd) {
      std::string resume_dir;
      if (resume == "auto") {
        // The newest intact checkpoint of the run directory the flags name, or a fresh start.
        const Config plain = train_args.resolve("");
        TANDEM_CHECK(!plain.train.run_dir.empty(),
                     "--resume auto looks in the run directory: give --run-dir (or train.run_dir)");
        std::vector<std::string> skipped;
        resume_dir = newest_intact_checkpoint(plain.train.run_dir, &skipped);
        for (const auto& s : skipped) log::warn("--resume auto: passing over damaged checkpoint " + s);
        if (resume_dir.empty())
          log::info("--resume auto: no intact checkpoint in " + plain.train.run_dir + "; starting at step 0");
      } else if (!resume.empty()) {
        resume_dir = resolve_checkpoint_dir(resume);
      }
      Config cfg = train_args.resolve(resume_dir);
      install_stop_handlers();
      TrainOptions opts;
      opts.resume = resume_dir;
      opts.resume_asked = !resume.empty();
      const TrainSummary summary = train(cfg, opts);
      if (summary.unsaved) {
        std::fprintf(stderr,
                     "tandem: error: the run ended at step %lld but its checkpoint could not be written (%s); %s; "
                     "free space or fix the permissions of %s/checkpoints and resume\n",
                     static_cast<long long>(summary.final_step), summary.checkpoint_error.c_str(),
                     summary.last_checkpoint.empty() ? "nothing of this run is saved"
                                                     : ("the newest saved one is " + summary.last_checkpoint).c_str(),
                     summary.run_dir.c_str());
        return 1;
      }
      return 0;
    }
    if (*launch_cmd) {
      parse_nproc(nproc, launch_opts);
      launch_opts.prefix_output = !no_prefix;
      return launch(launch_opts);
    }
    if (*inspect_cmd) {
      inspect_opts.gpu_memory_given = gpu_memory_opt->count() > 0;
      return run_inspect(inspect_args.resolve_layers(""), inspect_opts);
    }
    if (*report_cmd) {
      std::printf("%s\n", write_report(report_dir, report_out).c_str());
      return 0;
    }
    if (*dashboard_cmd) return run_dashboard(view_dir, view_port, view_bind, view_chartjs);
    if (tokenize_cmd.chosen()) return tokenize_cmd.run();
    if (generate_cmd.chosen()) return generate_cmd.run();
    if (serve_cmd.chosen()) return serve_cmd.run();
    if (chat_cmd.chosen()) return chat_cmd.run();
    if (*bench_bk) return run_bk_core_bench(bk_opts);
    if (*bench_step) return run_step_bench(step_args.resolve(""), step_json, step_model_json);
    if (*bench_optim) {
      if (!bench_sizes.empty()) {
        bench_opts.sizes.clear();
        for (const auto& s : bench_sizes) bench_opts.sizes.push_back(parse_param_count(s));
      }
      return run_optim_bench(bench_opts);
    }
    if (*config_cmd) {
      if (list_keys) {
        for (const auto& k : config_keys())
          std::printf("%-26s %-22s %s\n", k.name.c_str(), k.type.c_str(), k.doc.c_str());
        return 0;
      }
      std::fputs(config_to_yaml(config_args.resolve("")).c_str(), stdout);
      return 0;
    }
    std::cout << app.help();
    return 0;
  } catch (const UserError& e) {
    std::fprintf(stderr, "tandem: error: %s\n", one_line(e.what()).c_str());
    return 2;
  } catch (const PeerLostError& e) {
    std::fprintf(stderr, "tandem: error: %s\n", one_line(e.what()).c_str());
    return kExitPeerLost;
  } catch (const c10::OutOfMemoryError& e) {
    std::fprintf(stderr, "tandem: error: out of memory: %s; lower train.micro_batch or set model.checkpointing=true\n",
                 one_line(e.what_without_backtrace()).c_str());
    return 2;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "tandem: internal error: %s\n", one_line(e.what_without_backtrace()).c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem: internal error: %s\n", one_line(e.what()).c_str());
    return 1;
  }
}
