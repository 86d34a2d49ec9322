// A user's own training program on chorus's library API, started by `chorus run`:
//
//   ./build/chorus run --devices cpu@1.0,cpu@0.5 -- ./build/examples/custom_trainer
//
// It reads the built-in default job, shortens it, and drives the same Trainer that `chorus train`
// uses, printing its own line per step on rank 0.
#include <cstdio>

#include "chorus/chorus.h"
#include "chorus/core/config.h"
#include "chorus/runtime/job/job_config.h"
#include "chorus/runtime/train/trainer.h"

int main() {
  try {
    auto worker = chorus::init();
    chorus::Config config =
        chorus::Config::parseString(chorus::runtime::defaultJobToml(), "<default job>");
    config.set("train.steps=30");
    config.set("train.eval_every=0");
    const chorus::runtime::JobConfig job = chorus::runtime::readJobConfig(config);
    chorus::runtime::Trainer trainer(job, worker);
    chorus::runtime::TrainerHooks hooks;
    hooks.on_step = [&](const chorus::runtime::StepRecord& record) {
      if (worker->rank() != 0) return;
      std::printf("step %lld loss %.4f shares", static_cast<long long>(record.step), record.loss);
      for (auto share : record.shares) std::printf(" %lld", static_cast<long long>(share));
      std::printf("\n");
    };
    const auto result = trainer.run(hooks);
    if (worker->rank() == 0)
      std::printf("test accuracy %.4f after %lld steps\n", result.test_accuracy.value_or(0.0),
                  static_cast<long long>(result.steps));
    return 0;
  } catch (const chorus::Error& error) {
    std::fprintf(stderr, "custom_trainer: %s: %s\n", error.kind(), error.message().c_str());
    return 1;
  }
}
