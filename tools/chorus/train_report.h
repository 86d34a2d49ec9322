// What `chorus train` shows and records: a progress line every few steps and at evaluations, one
// JSON object per step in --log-json, and a final summary. Only rank 0 writes: after an elastic
// recovery that lost rank 0, the survivor that became rank 0 takes over (the log goes on in the
// same file, the step the old writer may have missed first). A step the writer completed while
// the job was already forming its next generation (a worker joining opens it at any moment) is
// held until the recovery says whether the job counts it, and written then.
#pragma once

#include <fstream>
#include <functional>
#include <optional>
#include <string>

#include "chorus/core/clock.h"
#include "chorus/plan/plan.h"
#include "chorus/runtime/job/job_config.h"
#include "chorus/runtime/train/trainer.h"

namespace chorus::cli {

// Owned by the worker's main; not thread-safe (the training thread calls it).
class TrainReport {
 public:
  // `is_writer` says whether this worker writes now (its rank is 0).
  TrainReport(const runtime::JobConfig& job, const plan::Plan& plan,
              std::function<bool()> is_writer, const std::string& json_path);
  void step(const runtime::StepRecord& record);
  // After an elastic recovery: a line for it, in the JSON log an object {"event": "recovery",
  // ...}; later step objects carry "generation".
  void recovery(const runtime::RecoveryRecord& record);
  void finish(const runtime::TrainResult& result);

 private:
  void progressLine(const runtime::StepRecord& record) const;
  void writeJson(const runtime::StepRecord& record);
  // This worker just became the writer: opens the log to append, and writes the last step it
  // saw if the log does not have it.
  void takeOver();

  const runtime::JobConfig& job_;
  std::function<bool()> is_writer_;
  bool writing_ = false;
  std::string json_path_;
  std::ofstream json_;
  int generation_ = 0;
  std::optional<runtime::StepRecord> last_;
  // A step completed while this worker was not the writer for sure (is_writer_ false): written at
  // the next recovery if this worker writes then and the job went past that step.
  std::optional<runtime::StepRecord> held_;
  Stopwatch clock_;
  std::int64_t target_step_ = -1;
};

}  // namespace chorus::cli
