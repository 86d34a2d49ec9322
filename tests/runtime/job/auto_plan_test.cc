// plan = "auto": the planner's choice comes back as a Plan that the job adopts as it is (a valid,
// runnable job), the split follows the devices' speeds, and the search stays within what the
// trainers run.
#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "chorus/core/error.h"
#include "chorus/runtime/job/auto_plan.h"
#include "chorus/runtime/job/job_config.h"
#include "chorus/runtime/job/job_plan.h"
#include "chorus/runtime/job/pipeline_job.h"

namespace chorus::runtime {
namespace {

// A CPU as `chorus devices` measures the development machine (docs/planner.md), fixed so that
// the test does not depend on this host's load.
plan::MeasuredDevice fakeCpu(double gflops = 100, double bandwidth_gbs = 35) {
  plan::MeasuredDevice cpu;
  cpu.name = "cpu";
  cpu.memory_bytes = 16ull << 30;
  cpu.gflops[static_cast<int>(plan::Dtype::kFp32)] = gflops;
  cpu.memory_bandwidth_gbs = bandwidth_gbs;
  return cpu;
}

Config jobConfig(const std::vector<std::string>& settings) {
  Config config = Config::parseString(defaultJobToml(), "<default>");
  for (const char* setting : {"plan=auto", "data.dataset=synthetic", "train.steps=3"})
    config.set(setting);
  for (const auto& setting : settings) config.set(setting);
  return config;
}

struct Planned {
  PlannedJob planned;
  AdoptedPlan adopted;  // the plan in rank order on the job's devices, the job under it
};

// Plans the job and adopts the plan as `chorus train` does; the result must pass every check
// `chorus train` runs before starting workers.
Planned planAndAdopt(const std::vector<std::string>& settings, const plan::MeasuredDevice& cpu) {
  const JobConfig job = readJobConfig(jobConfig(settings));
  const std::vector<plan::MeasuredDevice> measured(job.devices.size(), cpu);
  Planned result{planJob(job, job.devices, measured), {}};
  result.adopted = adoptPlan(result.planned.plan, job, job.devices);
  // A pipeline's budgets bound its stages (checked by the cut), not the whole model.
  std::vector<DeviceSpec> devices = result.adopted.devices;
  if (result.adopted.plan.stageCount() > 1)
    for (auto& device : devices) device.memory_budget.reset();
  validateJobOnDevices(result.adopted.job, devices);
  return result;
}

std::vector<int> sharesOf(const plan::Plan& plan) {
  std::vector<int> shares;
  for (const auto& replica : plan.replicas) shares.push_back(replica.share);
  return shares;
}

TEST(AutoPlan, PicksDataParallelWithSharesProportionalToSpeedsForASmallCnn) {
  const Planned run = planAndAdopt({"devices=cpu@1.0,cpu@0.5,cpu@0.25"}, fakeCpu());
  EXPECT_EQ(run.planned.plan.stageCount(), 1) << run.planned.summary;
  EXPECT_EQ(run.adopted.job.plan, "auto");  // the job as written; the plan is the planner's
  EXPECT_EQ(run.adopted.plan.predicted.step_seconds, run.planned.plan.predicted.step_seconds);
  const std::vector<int> shares = sharesOf(run.adopted.plan);  // where the balancer starts
  ASSERT_EQ(shares.size(), 3u);
  EXPECT_EQ(shares[0] + shares[1] + shares[2], 64);
  // 4 : 2 : 1 of 64 is 36.6 / 18.3 / 9.1; integer shares and per-rank fixed costs move it a little.
  EXPECT_NEAR(shares[0], 36.6, 3);
  EXPECT_NEAR(shares[1], 18.3, 3);
  EXPECT_NEAR(shares[2], 9.1, 3);
  EXPECT_NE(run.planned.summary.find("plan = auto: data parallel, shares "), std::string::npos)
      << run.planned.summary;
  EXPECT_NE(run.planned.summary.find("predicted "), std::string::npos);
  EXPECT_NE(run.planned.summary.find("best: uneven shares"), std::string::npos)
      << run.planned.summary;
  EXPECT_GT(run.planned.plan.predicted.step_seconds, 0);
}

TEST(AutoPlan, EqualDevicesGetEqualShares) {
  const Planned run = planAndAdopt({"devices=cpu,cpu"}, fakeCpu());
  EXPECT_EQ(sharesOf(run.adopted.plan), (std::vector<int>{32, 32}));
}

// A slow link makes the GPT's gradient all-reduce and optimizer step dearer than sending
// activations between stages: the planner pipelines, and the job runs its cut, micro-batches and
// schedule, each rank on the device the plan gave its (replica, stage).
TEST(AutoPlan, PipelinesAGptWhenGradientsOutweighActivations) {
  // A small global batch keeps compute short beside the gradients, whose exchange no stage of
  // ZeRO hides either: its gather follows the optimizer step.
  const Planned run = planAndAdopt({"devices=cpu@1.0,cpu@0.5", "model.kind=gpt", "model.width=512",
                                    "model.layers=6", "train.global_batch=4"},
                                   fakeCpu(100, 0.4));
  const plan::Plan& planned = run.planned.plan;
  const plan::Plan& adopted = run.adopted.plan;
  ASSERT_GT(planned.stageCount(), 1) << run.planned.summary;
  EXPECT_EQ(adopted.stageCount(), planned.stageCount());
  EXPECT_EQ(adopted.micro_batches, planned.micro_batches);
  EXPECT_EQ(adopted.schedule, plan::Schedule::kOneFOneB);
  EXPECT_EQ(sharesOf(adopted), sharesOf(planned));
  for (size_t r = 0; r < planned.replicas.size(); ++r)
    for (size_t s = 0; s < planned.replicas[r].stages.size(); ++s) {
      const plan::StagePlan& stage = planned.replicas[r].stages[s];
      EXPECT_EQ(adopted.replicas[r].stages[s].first_layer, stage.first_layer);
      EXPECT_EQ(adopted.replicas[r].stages[s].last_layer, stage.last_layer);
      const int device = planned.ranks[stage.rank].device;
      EXPECT_EQ(run.adopted.devices.at(adopted.replicas[r].stages[s].rank),
                parseDeviceSpecs("cpu@1.0,cpu@0.5").at(device));
    }
  EXPECT_NE(run.planned.summary.find("pipeline of "), std::string::npos) << run.planned.summary;
}

// Whatever the trainer cannot run with a pipeline keeps the search to data parallelism, and the
// log line says why.
TEST(AutoPlan, JobSettingsThatRuleOutPipelinesKeepItDataParallel) {
  const Planned run =
      planAndAdopt({"devices=cpu@1.0,cpu@0.5", "model.kind=gpt", "model.width=512",
                    "model.layers=6", "train.global_batch=16", "train.micro_batch=4"},
                   fakeCpu(100, 0.4));
  EXPECT_EQ(run.planned.plan.stageCount(), 1);
  EXPECT_NE(run.planned.summary.find("pipelines not considered: train.micro_batch is set"),
            std::string::npos)
      << run.planned.summary;
}

// The GPT's replicated state (16.5 MiB with AdamW) fits none of three 16 MiB devices, and the
// job's micro-batch rules out pipelines (which would fit: each stage holds a third): the plan
// shards it with ZeRO, and the job it leaves passes every check chorus train makes.
TEST(AutoPlan, ShardsWithZeroWhenNothingElseFits) {
  const std::vector<std::string> job{"devices=cpu/16MiB,cpu/16MiB,cpu/16MiB", "model.kind=gpt",
                                     "train.global_batch=24", "train.micro_batch=4",
                                     "optimizer.name=adamw"};
  const Planned run = planAndAdopt(job, fakeCpu());
  EXPECT_GE(run.planned.plan.zero_stage, 1);
  EXPECT_EQ(run.adopted.job.zero.stage, run.planned.plan.zero_stage);
  EXPECT_NE(run.planned.summary.find("with ZeRO-"), std::string::npos) << run.planned.summary;
  EXPECT_NE(run.planned.summary.find("nothing fits replicated"), std::string::npos)
      << run.planned.summary;
  // With a codec ZeRO is out: nothing fits, said so.
  std::vector<std::string> compressed = job;
  compressed.push_back("comm.compression=int8");
  try {
    planAndAdopt(compressed, fakeCpu());
    ADD_FAILURE() << "planned a job that fits nowhere";
  } catch (const ConfigError& error) {
    EXPECT_NE(error.message().find("no plan fits"), std::string::npos) << error.message();
  }
  // zero.stage = 0 written in the job keeps the state replicated: nothing fits, said so.
  std::vector<std::string> replicated = job;
  replicated.push_back("zero.stage=0");
  try {
    planAndAdopt(replicated, fakeCpu());
    ADD_FAILURE() << "planned ZeRO for a job that says zero.stage = 0";
  } catch (const ConfigError& error) {
    EXPECT_NE(error.message().find("ZeRO not tried: zero.stage is set"), std::string::npos)
        << error.message();
  }
  // Roomy devices: replicated, as before.
  EXPECT_EQ(planAndAdopt({"devices=cpu/64MiB,cpu/64MiB,cpu/64MiB", "model.kind=gpt",
                          "train.global_batch=24", "train.micro_batch=4", "optimizer.name=adamw"},
                         fakeCpu())
                .planned.plan.zero_stage,
            0);
}

// Budgets twice apart: replicated, the GPT with AdamW fits only the largest device. ZeRO is weighed
// against the pipeline that fits, by predicted step time, with shards sized by memory as the run
// sizes them.
TEST(AutoPlan, WeighsZeroAgainstAPipelineByPredictedTime) {
  const std::vector<std::string> job{"devices=cpu/10MiB,cpu/20MiB,cpu/40MiB", "model.kind=gpt",
                                     "train.global_batch=24", "optimizer.name=adamw"};
  const Planned run = planAndAdopt(job, fakeCpu());
  EXPECT_EQ(run.planned.plan.zero_stage, 3) << run.planned.summary;
  EXPECT_EQ(run.adopted.job.zero.stage, 3);
  EXPECT_EQ(run.adopted.job.zero.shards, "memory");
  ASSERT_EQ(run.planned.plan.zero_shards.size(), 3u);
  EXPECT_LT(run.planned.plan.zero_shards[0], run.planned.plan.zero_shards[1]);
  EXPECT_LT(run.planned.plan.zero_shards[1], run.planned.plan.zero_shards[2]);
  EXPECT_NE(run.planned.summary.find("ZeRO: ZeRO-3 predicted +"), std::string::npos)
      << run.planned.summary;
  EXPECT_NE(run.planned.summary.find("faster than 1 pipeline of 3 stages"), std::string::npos)
      << run.planned.summary;
  // An elastic job without checkpoint.dir can recover neither ZeRO slices nor pipeline stages:
  // nothing is left that fits, and the error says why ZeRO was not tried.
  std::vector<std::string> elastic = job;
  elastic.push_back("elastic.enabled=true");
  try {
    planAndAdopt(elastic, fakeCpu());
    ADD_FAILURE() << "planned a job that fits nowhere";
  } catch (const ConfigError& error) {
    EXPECT_NE(error.message().find("ZeRO not tried: elastic recovery"), std::string::npos)
        << error.message();
  }
  // With checkpoint.dir a lost stage can come back: the pipeline that fits is planned.
  elastic.push_back("checkpoint.dir=" + ::testing::TempDir() + "/chorus_auto_plan_elastic");
  const Planned pipelined = planAndAdopt(elastic, fakeCpu());
  EXPECT_EQ(pipelined.planned.plan.stageCount(), 3) << pipelined.planned.summary;
}

// Where the cost model sees ZeRO within a few percent of replication, the plan stays replicated.
TEST(AutoPlan, KeepsReplicationWhereZeroGainsLittle) {
  const Planned run = planAndAdopt({"devices=cpu,cpu", "optimizer.name=adamw"}, fakeCpu());
  EXPECT_EQ(run.planned.plan.zero_stage, 0) << run.planned.summary;
  EXPECT_EQ(run.adopted.job.zero.stage, 0);
  const auto note = run.planned.summary.find("; ZeRO: ");
  if (note != std::string::npos)
    EXPECT_NE(run.planned.summary.find("under the 5% it must gain", note), std::string::npos)
        << run.planned.summary;
}

TEST(AutoPlan, KeysThePlanSetsConflictWithPlanAuto) {
  const std::map<std::string, std::string> values = {
      {"balancer.shares", "[32,32]"},
      {"parallel.schedule", "gpipe"},
      {"parallel.partition", "even"},
      {"parallel.activation_checkpointing", "stage"}};
  for (const std::string& key : autoPlanKeys()) {
    const auto value = values.find(key);
    std::ostringstream assignment;
    assignment << key << "=" << (value == values.end() ? "2" : value->second);
    try {
      readJobConfig(jobConfig({assignment.str()}));
      ADD_FAILURE() << key << " was accepted with plan = auto";
    } catch (const ConfigError& error) {
      EXPECT_NE(error.message().find("config key '" + key + "': plan = \"auto\" chooses it"),
                std::string::npos)
          << error.message();
    }
  }
}

TEST(AutoPlan, TheDefaultIsManual) {
  const JobConfig job = readJobConfig(Config::parseString(defaultJobToml()));
  EXPECT_EQ(job.plan, "manual");
}

}  // namespace
}  // namespace chorus::runtime
