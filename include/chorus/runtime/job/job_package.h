// What every worker of a `chorus train` job receives instead of reading the job file: the job
// (what to train, as its canonical TOML, the text checkpoints keep) and the Plan it runs (how,
// plan_json.h), in one JSON document that node 0's agent puts in the job's store before any
// worker starts. Workers never open the TOML file and never discover devices again.
//
//   {"version": 1, "source": "examples/hetero-emulated.toml", "job": "<canonical TOML>",
//    "plan": {...plan JSON...}}
#pragma once

#include <chrono>
#include <string>

#include "chorus/comm/store/store.h"
#include "chorus/plan/plan.h"
#include "chorus/runtime/job/job_config.h"
#include "chorus/runtime/launch/agent.h"  // kJobPackageKey

namespace chorus::runtime {

// A job and its plan. Value type.
struct JobPackage {
  JobConfig job;
  plan::Plan plan;
};

// The package's JSON text.
std::string encodeJobPackage(const JobConfig& job, const plan::Plan& plan);

// Parses a package (the job is read and validated as a job file is; the plan's form is checked,
// not its fit: see checkPlanForJob). Throws ConfigError naming what is wrong.
JobPackage decodeJobPackage(const std::string& text);

// A worker's side: waits up to `timeout` for the package in `store` and decodes it. Throws
// TimeoutError when none arrives (the worker was not started by `chorus train`), ConfigError.
JobPackage fetchJobPackage(comm::Store& store, std::chrono::milliseconds timeout);

}  // namespace chorus::runtime
