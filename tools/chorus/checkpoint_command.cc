// `chorus checkpoint consolidate PATH [--out model.pt]`: the whole model of a checkpoint as one
// model.pt (runtime/checkpoint/checkpoint.h, consolidateCheckpoint), for a ZeRO-3 checkpoint whose
// ranks each saved a slice of the parameters, or any data-parallel one; or the model of a file
// that the Python front's chorus.save wrote (consolidatePythonCheckpoint).
#include <iostream>
#include <memory>

#include "chorus/runtime/checkpoint/checkpoint.h"
#include "commands.h"

namespace chorus::cli {

void addCheckpointCommand(CLI::App& app, Action& action) {
  auto* checkpoint = app.add_subcommand(
      "checkpoint", "Work with the checkpoints of chorus train and of chorus.save (Python)");
  checkpoint->require_subcommand(1);
  auto* consolidate = checkpoint->add_subcommand(
      "consolidate",
      "Write a checkpoint's whole model as one model.pt (put together from ZeRO-3's slices, or "
      "taken from a file chorus.save wrote)");
  consolidate->footer(
      "Examples: chorus checkpoint consolidate runs/ckpt/latest --out model.pt\n"
      "          chorus checkpoint consolidate checkpoint.pt --out model.pt   (chorus.save's file, "
      "checked against checkpoint.pt.sha256)");
  struct Args {
    std::string dir;
    std::string out = "model.pt";
  };
  auto args = std::make_shared<Args>();
  consolidate
      ->add_option("dir", args->dir,
                   "A checkpoint directory, a checkpoint root (its latest checkpoint), or a "
                   "file that chorus.save wrote")
      ->required();
  consolidate->add_option("--out", args->out, "Where to write the model (default model.pt)");
  consolidate->callback([&action, args] {
    action = [args] {
      if (runtime::isPythonCheckpointFile(args->dir)) {
        const std::int64_t tensors = runtime::consolidatePythonCheckpoint(args->dir, args->out);
        std::cout << "chorus checkpoint: " << tensors << " tensors of " << args->dir << " -> "
                  << args->out << std::endl;
        return kExitOk;
      }
      const std::string dir = runtime::resolveCheckpoint(args->dir, args->dir);
      const std::int64_t tensors = runtime::consolidateCheckpoint(dir, args->out);
      std::cout << "chorus checkpoint: " << tensors << " parameters of " << dir << " -> "
                << args->out << std::endl;
      return kExitOk;
    };
  });
}

}  // namespace chorus::cli
