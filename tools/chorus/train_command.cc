// `chorus train`: the built-in trainer. The command line is in place; the data-parallel trainer
// behind it is the next milestone (issue "Heterogeneous data parallelism"), so for now it says so.
#include <iostream>

#include "commands.h"

namespace chorus::cli {

void addTrainCommand(CLI::App& app, Action& action) {
  auto* train = app.add_subcommand("train", "Train a model on this node's devices (built-in job)");
  auto config = std::make_shared<std::string>();
  auto settings = std::make_shared<std::vector<std::string>>();
  auto steps = std::make_shared<long long>(0);
  train->add_option("config", *config, "Job configuration (TOML); default: the built-in job");
  train->add_option("--set", *settings, "Override a config key: KEY=VALUE (repeatable)");
  train->add_option("--steps", *steps, "Number of training steps");
  train->callback([&action] {
    action = [] {
      std::cout << "chorus train: not yet available in this build: the data-parallel trainer "
                   "is the next milestone. `chorus devices` and `chorus run` work today."
                << std::endl;
      return kExitOk;
    };
  });
}

}  // namespace chorus::cli
