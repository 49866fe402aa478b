// The tandem command line: one Command per subcommand (cli/*_command.h); main parses, runs the
// chosen one, and turns what it throws into one line and an exit code.

#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <memory>
#include <vector>

#include "tandem/cli/bench_command.h"
#include "tandem/cli/chat_command.h"
#include "tandem/cli/config_command.h"
#include "tandem/cli/dashboard_command.h"
#include "tandem/cli/generate_command.h"
#include "tandem/cli/inspect_command.h"
#include "tandem/cli/launch_command.h"
#include "tandem/cli/report_command.h"
#include "tandem/cli/serve_command.h"
#include "tandem/cli/tokenize_command.h"
#include "tandem/cli/train_command.h"
#include "tandem/core/error.h"
#include "tandem/core/log.h"
#include "tandem/core/strings.h"
#include "tandem/parallel/comm.h"

namespace {

using namespace tandem;

std::vector<std::unique_ptr<Command>> add_commands(CLI::App& app) {
  std::vector<std::unique_ptr<Command>> c;
  c.push_back(std::make_unique<TrainCommand>(app));
  c.push_back(std::make_unique<LaunchCommand>(app));
  c.push_back(std::make_unique<InspectCommand>(app));
  c.push_back(std::make_unique<ConfigCommand>(app));
  c.push_back(std::make_unique<ReportCommand>(app));
  c.push_back(std::make_unique<DashboardCommand>(app));
  c.push_back(std::make_unique<TokenizeCommand>(app));
  c.push_back(std::make_unique<GenerateCommand>(app));
  c.push_back(std::make_unique<ServeCommand>(app));
  c.push_back(std::make_unique<ChatCommand>(app));
  c.push_back(std::make_unique<BenchCommand>(app));
  return c;
}

}  // namespace

// The top-level help: what a newcomer types first.
constexpr const char* kUsage =
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
    "  tandem inspect -p 7B --partition  the pipeline partitioner's profile and plan on this machine";

int main(int argc, char** argv) {
  CLI::App app{kUsage, "tandem"};
  app.set_version_flag("--version", std::string("tandem ") + TANDEM_VERSION);
  app.require_subcommand(0, 1);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "debug logging");
  const auto commands = add_commands(app);
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
    for (const auto& c : commands)
      if (c->chosen()) return c->run();
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
