// What `chorus train` shows and records: a progress line every few steps and at evaluations, one
// JSON object per step in --log-json, and a final summary. Only rank 0 writes.
#pragma once

#include <fstream>
#include <string>

#include "chorus/core/clock.h"
#include "chorus/plan/plan.h"
#include "chorus/runtime/job/job_config.h"
#include "chorus/runtime/train/trainer.h"

namespace chorus::cli {

// Owned by the worker's main; not thread-safe (the training thread calls it).
class TrainReport {
 public:
  TrainReport(const runtime::JobConfig& job, const plan::Plan& plan, bool writer,
              const std::string& json_path);
  void step(const runtime::StepRecord& record);
  void finish(const runtime::TrainResult& result);

 private:
  void progressLine(const runtime::StepRecord& record) const;

  const runtime::JobConfig& job_;
  bool writer_;
  std::ofstream json_;
  Stopwatch clock_;
  std::int64_t target_step_ = -1;
};

}  // namespace chorus::cli
