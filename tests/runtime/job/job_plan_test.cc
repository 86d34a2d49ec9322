// The Plan a job runs: built from the job's keys, put in rank order, matched to devices, checked
// against the job, and carried to the workers with the job (job_plan.h, job_package.h).
#include "chorus/runtime/job/job_plan.h"
#include "chorus/runtime/job/memory_calibration.h"

#include <gtest/gtest.h>

#include "chorus/core/config.h"
#include "chorus/core/error.h"
#include "chorus/plan/plan_json.h"
#include "chorus/runtime/job/job_package.h"
#include "runtime/job_fixtures.h"

namespace chorus::runtime {
namespace {

const std::string kJob =
    testing::jobStart({.devices = "cpu,cpu@0.5,cpu@0.25"}, {.global_batch = 64}) +
    testing::mlpOnSynthetic({.hidden = "[16, 16]", .size = 256});

JobConfig jobWith(const std::vector<std::string>& settings = {}) {
  Config config = Config::parseString(kJob, "job.toml");
  for (const std::string& setting : settings) config.set(setting);
  return readJobConfig(config);
}

std::vector<int> sharesOf(const plan::Plan& plan) {
  std::vector<int> shares;
  for (const auto& replica : plan.replicas) shares.push_back(replica.share);
  return shares;
}

// The message of the ConfigError `body` throws, or "" when it throws none.
template <typename Body>
std::string configError(Body&& body) {
  try {
    body();
  } catch (const ConfigError& error) {
    return error.what();
  }
  return "";
}

// The balancer starts from shares in proportion to the devices' speeds (4:2:1 of 64), not from
// the equal split, which `balance = "off"` keeps (DDP's).
TEST(JobPlan, DataParallelStartsFromTheDevicesSpeeds) {
  const JobConfig job = jobWith();
  const plan::Plan plan = planOfJob(job, job.devices);
  EXPECT_EQ(plan.stageCount(), 1);
  EXPECT_EQ(sharesOf(plan), (std::vector<int>{37, 18, 9}));
  const JobConfig off = jobWith({"balance=\"off\""});
  EXPECT_EQ(sharesOf(planOfJob(off, off.devices)), (std::vector<int>{22, 21, 21}));
  ASSERT_EQ(plan.ranks.size(), 3u);
  EXPECT_EQ(plan.ranks[1].device_type, "cpu@0.5");
  EXPECT_EQ(plan.ranks[1].emulated_speed, 1.0);  // the type carries the speed
  EXPECT_EQ(plan.ranks[2].node, "node0");
  // No micro_batch in the job: each share in one pass.
  for (const auto& replica : plan.replicas) EXPECT_EQ(replica.stages[0].micro_batch, replica.share);
  EXPECT_NO_THROW(checkPlanForJob(plan, job, job.devices));
}

// Measured rates of unlike devices (a GPU beside a CPU) multiply their emulated speeds; a device
// too slow for a share of its own still gets one sample, so that it is measured.
TEST(JobPlan, MeasuredRatesScaleTheStartAndEveryDeviceGetsASample) {
  const JobConfig job = jobWith();
  // Speeds 1 x 1, 4 x 0.5, 8 x 0.25: 1:2:2 of 64.
  EXPECT_EQ(sharesOf(planOfJob(job, job.devices, {}, {1, 4, 8})), (std::vector<int>{13, 26, 25}));
  const JobConfig slow = jobWith({"devices=\"cpu,cpu@0.5,cpu@0.001\""});
  EXPECT_EQ(sharesOf(planOfJob(slow, slow.devices)), (std::vector<int>{42, 21, 1}));
  const std::vector<double> speeds = startSpeeds(slow.devices, {2, 2, 1000});
  ASSERT_EQ(speeds.size(), 3u);
  for (const double speed : {speeds[1], speeds[2]}) EXPECT_DOUBLE_EQ(speed, 1.0);
  EXPECT_THROW(planOfJob(job, job.devices, {}, {1, 2}), ConfigError);
  EXPECT_THROW(planOfJob(job, job.devices, {}, {1, 0, 1}), ConfigError);
}

// zero.shards = "speed": each rank steps the slice of the optimizer its speed can take (4:2:1).
TEST(JobPlan, ZeroSlicesBySpeedFollowTheDevicesSpeeds) {
  const JobConfig job = jobWith({"zero.stage=1", "zero.shards=\"speed\""});
  const plan::Plan plan = planOfJob(job, job.devices);
  ASSERT_EQ(plan.zero_shards.size(), 3u);
  EXPECT_DOUBLE_EQ(plan.zero_shards[0], 4.0 / 7);
  EXPECT_DOUBLE_EQ(plan.zero_shards[1], 2.0 / 7);
  EXPECT_DOUBLE_EQ(plan.zero_shards[2], 1.0 / 7);
  // Measured rates count too: 1 x 1, 4 x 0.5, 8 x 0.25.
  const plan::Plan rated = planOfJob(job, job.devices, {}, {1, 4, 8});
  EXPECT_DOUBLE_EQ(rated.zero_shards[0], 0.2);
  EXPECT_DOUBLE_EQ(rated.zero_shards[2], 0.4);
}

TEST(JobPlan, FixedAndInitialSharesMicroBatchAndPrecisionComeFromTheJob) {
  const JobConfig fixed = jobWith({"balancer.shares=[40, 16, 8]", "train.micro_batch=12",
                                   "precision.ranks=[\"fp32\", \"bf16\", \"fp16\"]"});
  const plan::Plan plan = planOfJob(fixed, fixed.devices);
  EXPECT_EQ(sharesOf(plan), (std::vector<int>{40, 16, 8}));
  EXPECT_EQ(plan.replicas[0].stages[0].micro_batch, 12);
  EXPECT_EQ(plan.replicas[2].stages[0].micro_batch, 8);
  EXPECT_EQ(precisionName(plan.ranks[0]), "fp32");
  EXPECT_EQ(precisionName(plan.ranks[1]), "bf16");
  EXPECT_EQ(precisionName(plan.ranks[2]), "fp16");
  const JobConfig initial = jobWith({"balancer.initial_shares=[10, 20, 34]"});
  EXPECT_EQ(sharesOf(planOfJob(initial, initial.devices)), (std::vector<int>{10, 20, 34}));
}

TEST(JobPlan, PipelineCarriesTheCutSharesAndSchedule) {
  const JobConfig job =
      jobWith({"devices=cpu,cpu@0.5,cpu,cpu@0.5", "parallel.pipeline_stages=2",
               "parallel.replicas=2", "parallel.micro_batches=4", "parallel.schedule=gpipe",
               "parallel.partition=[2, 1]", "parallel.activation_checkpointing=layer"});
  const plan::Plan plan = planOfJob(job, job.devices);
  ASSERT_EQ(plan.stageCount(), 2);
  ASSERT_EQ(plan.replicas.size(), 2u);
  EXPECT_EQ(plan.micro_batches, 4);
  EXPECT_EQ(plan.schedule, plan::Schedule::kGpipe);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(plan.replicas[r].stages[0].last_layer, 2);
    EXPECT_EQ(plan.replicas[r].stages[1].first_layer, 2);
    EXPECT_EQ(plan.replicas[r].stages[1].last_layer, 3);  // the MLP's 3 layers
    EXPECT_EQ(plan.replicas[r].stages[1].rank, 2 * r + 1);
    EXPECT_TRUE(plan.replicas[r].stages[1].checkpoint);
  }
  EXPECT_EQ(plan.replicas[0].share + plan.replicas[1].share, 64);
  EXPECT_NO_THROW(checkPlanForJob(plan, job, job.devices));
  EXPECT_NE(describePlan(plan).find("2 pipelines x 2 stages on cpu, cpu@0.5, cpu, cpu@0.5: "
                                    "layers 2/1, 4 micro-batches gpipe"),
            std::string::npos)
      << describePlan(plan);
}

TEST(JobPlan, RankOrderFollowsReplicasAndStages) {
  const JobConfig job = jobWith();
  plan::Plan plan = planOfJob(job, job.devices);
  // A planner may number its ranks in any order: replica 0 on plan rank 2, and so on.
  plan.replicas[0].stages[0].rank = 2;
  plan.replicas[2].stages[0].rank = 0;
  std::swap(plan.ranks[0], plan.ranks[2]);
  const plan::Plan ordered = inRankOrder(plan);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(ordered.replicas[r].stages[0].rank, r);
  EXPECT_EQ(ordered.ranks[0].device_type, "cpu");
  EXPECT_EQ(ordered.ranks[2].device_type, "cpu@0.25");
}

TEST(JobPlan, APlanForOtherDevicesIsRefusedNamingBoth) {
  const JobConfig job = jobWith();
  const plan::Plan plan = planOfJob(job, job.devices);
  const std::vector<DeviceSpec> others = parseDeviceSpecs("cpu,cpu,cpu@0.25");
  const std::string message = configError([&] { devicesOfPlan(plan, others); });
  EXPECT_NE(message.find("rank 1 was planned for device 'cpu@0.5', but device 1 of this job is "
                         "'cpu'"),
            std::string::npos)
      << message;
  EXPECT_NE(configError([&] { checkPlanForJob(plan, job, others); }).find("rank 1"),
            std::string::npos);
}

TEST(JobPlan, APlanTheJobCannotRunIsRefused) {
  const JobConfig job = jobWith();
  const plan::Plan plan = planOfJob(job, job.devices);
  plan::Plan other_batch = plan;
  other_batch.global_batch = 32;
  const int halved[] = {12, 10, 10};
  for (int r = 0; r < 3; ++r) {
    other_batch.replicas[r].share = halved[r];
    other_batch.replicas[r].stages[0].micro_batch = halved[r];
  }
  EXPECT_NE(configError([&] {
              checkPlanForJob(other_batch, job, job.devices);
            }).find("global batch 32, but the job's train.global_batch is 64"),
            std::string::npos);
  plan::Plan zero = plan;
  zero.zero_stage = 2;
  EXPECT_NE(configError([&] { checkPlanForJob(zero, job, job.devices); }).find("ZeRO stage 2"),
            std::string::npos);
  plan::Plan hierarchical = plan;
  hierarchical.comm.algorithm = AllReduceAlgorithm::kHierarchical;
  EXPECT_NE(configError([&] {
              checkPlanForJob(hierarchical, job, job.devices);
            }).find("is not the job's [comm]"),
            std::string::npos);
  plan::Plan tf32 = plan;
  tf32.ranks[0].precision = plan::Dtype::kTf32;
  EXPECT_NE(configError([&] {
              checkPlanForJob(tf32, job, job.devices);
            }).find("set precision.tf32 = true"),
            std::string::npos);
}

// The plan decides ZeRO's stage where the job leaves it unset, and the job is checked with it; a
// job that writes another stage, or a key ZeRO refuses, is a ConfigError naming the key.
TEST(JobPlan, TheJobRunsUnderThePlansZeroStage) {
  plan::Plan plan = planOfJob(jobWith(), jobWith().devices);
  plan.zero_stage = 2;
  EXPECT_EQ(jobUnderPlan(jobWith(), plan).zero.stage, 2);
  EXPECT_EQ(jobUnderPlan(jobWith({"zero.stage=2"}), plan).zero.stage, 2);
  EXPECT_NE(configError([&] {
              jobUnderPlan(jobWith({"zero.stage=0"}), plan);
            }).find("config key 'zero.stage': the plan runs ZeRO stage 2, the job says 0"),
            std::string::npos);
  EXPECT_NE(configError([&] {
              jobUnderPlan(jobWith({"comm.compression=int8"}), plan);
            }).find("comm.compression"),
            std::string::npos);
}

// The plan decides the gradient synchronization as it decides ZeRO's stage: a job that leaves the
// [comm] keys unset runs the plan's (and is checked with them); a key the job writes with another
// value is a ConfigError naming it; a job's own keys travel into its plan losslessly.
TEST(JobPlan, TheJobRunsUnderThePlansComm) {
  const JobConfig written = jobWith({"comm.compression=powersgd", "comm.powersgd_rank=2",
                                     "comm.bucket_mb=0.5", "comm.overlap=false"});
  const plan::Plan own = planOfJob(written, written.devices);
  EXPECT_EQ(own.comm.codec.kind, CodecKind::kPowerSgd);
  EXPECT_EQ(own.comm.codec.powersgd_rank, 2);
  EXPECT_EQ(own.comm.codec.seed, written.seed);
  EXPECT_EQ(own.comm.bucket_mb, 0.5);
  EXPECT_FALSE(own.comm.overlap);
  EXPECT_TRUE(plan::parsePlanJson(plan::toJson(own).dump(), "plan.json").comm == own.comm);

  plan::Plan plan = planOfJob(jobWith(), jobWith().devices);
  plan.comm = own.comm;
  plan.comm.algorithm = AllReduceAlgorithm::kTwoD;
  plan.comm.codec.kind = CodecKind::kNone;
  plan.comm.codec.powersgd_rank = 4;
  plan.comm.sync_period = 1;
  const JobConfig under = jobUnderPlan(jobWith(), plan);
  EXPECT_EQ(under.comm.algorithm, "2d");
  EXPECT_EQ(under.comm.bucket_mb, 0.5);
  EXPECT_FALSE(under.comm.overlap);
  EXPECT_NO_THROW(checkPlanForJob(plan, under, under.devices));
  EXPECT_NE(configError([&] {
              jobUnderPlan(jobWith({"comm.bucket_mb=25"}), plan);
            }).find("config key 'comm.bucket_mb': the plan runs 0.5, the job says 25"),
            std::string::npos);
  // Writing the plan's own value is no clash.
  EXPECT_EQ(jobUnderPlan(jobWith({"comm.algorithm=\"2d\""}), plan).comm.algorithm, "2d");
  // What the plan brings in is checked as if the job had written it: a codec knob without its
  // codec, local SGD with ZeRO.
  plan::Plan knob = plan;
  knob.comm.codec.topk_ratio = 0.5;
  EXPECT_NE(configError([&] { jobUnderPlan(jobWith(), knob); }).find("comm.topk_ratio"),
            std::string::npos);
  plan::Plan local = planOfJob(jobWith(), jobWith().devices);
  local.comm.sync_period = 2;
  local.zero_stage = 1;
  EXPECT_NE(configError([&] { jobUnderPlan(jobWith(), local); }).find("comm.sync_every"),
            std::string::npos);
}

// A plan for devices with memory budgets carries the job's measured memory profile, which the
// workers size against instead of measuring the model again; one without budgets carries none.
TEST(JobPlan, APlanForBudgetsCarriesTheMemoryProfile) {
  const JobConfig budgeted = jobWith({"devices=cpu/64MiB,cpu/64MiB"});
  const plan::Plan plan = planOfJob(budgeted, budgeted.devices);
  ASSERT_TRUE(plan.memory_profile.has_value());
  const plan::ModelProfile measured = jobMemoryModel(budgeted).model();
  EXPECT_EQ(plan.memory_profile->layerCount(), measured.layerCount());
  const JobPackage package = decodeJobPackage(encodeJobPackage(budgeted, plan));
  ASSERT_TRUE(package.plan.memory_profile.has_value());
  EXPECT_EQ(plan::modelToJson(*package.plan.memory_profile), plan::modelToJson(measured));
  EXPECT_EQ(planMemoryModel(package.job, package.plan).model().layers.back().activation_bytes,
            measured.layers.back().activation_bytes);
  EXPECT_FALSE(planOfJob(jobWith(), jobWith().devices).memory_profile.has_value());
}

TEST(JobPackage, CarriesTheJobAndThePlanExactly) {
  const JobConfig job = jobWith({"optimizer.lr=0.02", "train.steps=7"});
  const plan::Plan plan = planOfJob(job, job.devices);
  const JobPackage package = decodeJobPackage(encodeJobPackage(job, plan));
  EXPECT_EQ(package.job.toml, job.toml);
  EXPECT_EQ(package.job.source, "job.toml");
  EXPECT_EQ(package.job.train.steps, 7);
  EXPECT_EQ(package.job.optimizer.lr, 0.02);
  EXPECT_EQ(plan::toJson(package.plan), plan::toJson(plan));
  // Each rank's device travels typed, as planOfJob made it.
  for (size_t r = 0; r < plan.ranks.size(); ++r)
    EXPECT_EQ(plan::jobDevice(package.plan.ranks[r]), job.devices[r]);
  EXPECT_NE(configError([] { decodeJobPackage("{\"version\": 1}"); }).find("version 2"),
            std::string::npos);
  EXPECT_NE(configError([] { decodeJobPackage("not json"); }).find("not JSON"), std::string::npos);
}

}  // namespace
}  // namespace chorus::runtime
