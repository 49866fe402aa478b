#include "tandem/cli/train_command.h"

#include <CLI/CLI.hpp>
#include <cstdio>

#include "tandem/core/error.h"
#include "tandem/core/interrupt.h"
#include "tandem/core/log.h"
#include "tandem/io/checkpoint.h"
#include "tandem/run/trainer.h"

namespace tandem {

TrainCommand::TrainCommand(CLI::App& app) {
  command_ = app.add_subcommand("train", "train a model (no options: the embedded default job)");
  args_.add_to(command_, true);
  command_->add_option("--resume", resume_,
                       "continue from a checkpoint directory, a run directory's newest intact checkpoint, or auto (the "
                       "--run-dir's newest intact one; a fresh start when there is none)");
}

bool TrainCommand::chosen() const { return command_->parsed(); }

std::string TrainCommand::resume_dir() const {
  if (resume_.empty()) return "";
  if (resume_ != "auto") return resolve_checkpoint_dir(resume_);
  // The newest intact checkpoint of the run directory the flags name, or a fresh start.
  const Config plain = args_.resolve("");
  TANDEM_CHECK(!plain.train.run_dir.empty(),
               "--resume auto looks in the run directory: give --run-dir (or train.run_dir)");
  std::vector<std::string> skipped;
  std::string dir = newest_intact_checkpoint(plain.train.run_dir, &skipped);
  for (const auto& s : skipped) log::warn("--resume auto: passing over damaged checkpoint " + s);
  if (dir.empty()) log::info("--resume auto: no intact checkpoint in " + plain.train.run_dir + "; starting at step 0");
  return dir;
}

int TrainCommand::run() {
  TrainOptions opts;
  opts.resume = resume_dir();
  opts.resume_asked = !resume_.empty();
  const Config cfg = args_.resolve(opts.resume);
  install_stop_handlers();
  const TrainSummary summary = train(cfg, opts);
  if (!summary.unsaved) return 0;
  std::fprintf(stderr,
               "tandem: error: the run ended at step %lld but its checkpoint could not be written (%s); %s; free space "
               "or fix the permissions of %s/checkpoints and resume\n",
               static_cast<long long>(summary.final_step), summary.checkpoint_error.c_str(),
               summary.last_checkpoint.empty() ? "nothing of this run is saved"
                                               : ("the newest saved one is " + summary.last_checkpoint).c_str(),
               summary.run_dir.c_str());
  return 1;
}

}  // namespace tandem
