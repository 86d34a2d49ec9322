#include "chorus/plan/plan_json.h"

#include <gtest/gtest.h>

#include "chorus/core/error.h"
#include "chorus/plan/planner.h"
#include "plan/plan_test_util.h"

namespace chorus::plan {
namespace {

using testing::makeCluster;
using testing::uniformModel;

Plan plannedPlan(const Cluster& cluster) {
  PlanOptions options;
  options.global_batch = 16;
  options.top_k = 1;
  return planCluster(cluster, uniformModel(6, 1e8, 1e12, 1e8, 1e6), options).plans.at(0);
}

std::string errorOf(const std::string& text) {
  try {
    parsePlanJson(text, "plan.json");
  } catch (const ConfigError& error) {
    return error.message();
  }
  return "";
}

TEST(PlanJson, RoundTripsEveryField) {
  const Cluster cluster = makeCluster({{"A100-80", "A100-80"}, {"V100-32", "V100-32"}});
  Plan plan = plannedPlan(cluster);
  plan.seed = 42;
  plan.comm.codec.kind = CodecKind::kInt8;
  plan.comm.codec.seed = 42;
  plan.ranks[0].memory_budget = 1 << 30;
  plan.ranks[0].emulated_speed = 0.5;
  const nlohmann::json json = toJson(plan);
  EXPECT_EQ(json["devices"], plan.ranks.size());
  const Plan again = parsePlanJson(json.dump(2), "plan.json");
  EXPECT_EQ(toJson(again), json);
  EXPECT_EQ(again.summary(), plan.summary());
  EXPECT_NO_THROW(checkPlanAgainstCluster(again, cluster));
}

// An executed plan names each rank's job device as a typed value: a speed that has no short
// decimal form and a budget of odd bytes come back bit for bit, without any text to re-parse.
TEST(PlanJson, AJobDeviceRoundTripsBitExactly) {
  const Cluster cluster = makeCluster({{"A100-80", "A100-80"}});
  Plan plan = plannedPlan(cluster);
  DeviceSpec cpu;
  cpu.speed = 0.1 + 0.2;  // 0.30000000000000004
  cpu.memory_budget = (std::uint64_t{512} << 20) + 7;
  DeviceSpec gpu;
  gpu.kind = DeviceKind::kCuda;
  gpu.index = 3;
  plan.ranks[0].spec = cpu;
  plan.ranks[1].spec = gpu;
  const Plan again = parsePlanJson(toJson(plan).dump(), "plan.json");
  ASSERT_TRUE(again.ranks[0].spec && again.ranks[1].spec);
  EXPECT_EQ(again.ranks[0].spec->speed, 0.1 + 0.2);
  EXPECT_EQ(again.ranks[0].spec->memory_budget, cpu.memory_budget);
  EXPECT_EQ(*again.ranks[0].spec, cpu);
  EXPECT_EQ(*again.ranks[1].spec, gpu);
  EXPECT_EQ(jobDevice(again.ranks[1]), gpu);
  EXPECT_EQ(toJson(again), toJson(plan));
  // The memory profile travels inside the plan's own JSON.
  plan.memory_profile = uniformModel(6, 1e8, 1e12, 1e8, 1e6);
  plan.memory_profile->layers[2].workspace_bytes = 12345.5;
  const Plan profiled = parsePlanJson(toJson(plan).dump(), "plan.json");
  ASSERT_TRUE(profiled.memory_profile.has_value());
  EXPECT_EQ(modelToJson(*profiled.memory_profile), modelToJson(*plan.memory_profile));
  EXPECT_EQ(toJson(profiled), toJson(plan));
  // A cluster's plan names no job device, and says so when one is asked for.
  const Plan described = plannedPlan(cluster);
  EXPECT_FALSE(parsePlanJson(toJson(described).dump(), "plan.json").ranks[0].spec);
  EXPECT_THROW(jobDevice(described.ranks[0]), ConfigError);
  EXPECT_NE(errorOf("{\"global_batch\": 4, \"replicas\": [], \"ranks\": [{\"device\": 0,\n"
                    " \"precision\": \"fp32\", \"spec\": {\"kind\": \"tpu\"}}]}")
                .find("ranks[0].spec.kind: must be \"cpu\" or \"cuda\""),
            std::string::npos);
}

TEST(PlanJson, ErrorsNameTheFileTheLineAndTheKey) {
  EXPECT_EQ(errorOf("{\"global_batch\": 4,\n \"replicas\": [{\"share\": 0, \"stages\": []}],\n"
                    " \"ranks\": []}"),
            "plan.json:2: replicas[0].share: must be an integer in [1, 2147483647]");
  EXPECT_EQ(
      errorOf("{\"global_batch\": 4, \"replicas\": [],\n \"ranks\": [{\"device\": 0,\n"
              "   \"precision\": \"fp8\"}]}"),
      "plan.json:3: ranks[0].precision: unknown precision 'fp8'; known: fp32, tf32, bf16, fp16");
  EXPECT_EQ(
      errorOf("{\"global_batch\": 4, \"replicas\": [], \"ranks\": [],\n \"schedule\": \"zb\"}"),
      "plan.json:2: schedule: unknown schedule 'zb'; known: gpipe, 1f1b");
  EXPECT_EQ(errorOf("{\"replicas\": [], \"ranks\": []}"),
            "plan.json:1: (top level): missing key 'global_batch'");
  EXPECT_EQ(errorOf("{\"global_batch\": 4, \"replicas\": [], \"ranks\": [], \"devices\": 3}"),
            "plan.json:1: devices: says 3 but 'ranks' lists 0");
  EXPECT_THROW(loadPlanFile("/nonexistent/plan.json"), ConfigError);
}

// The plan holds the gradient synchronization the engines run, losslessly: every algorithm and
// codec of core's vocabulary with the codec's knobs, the buckets and the sync period ("ring" is
// kFlat, as plan files always spelled it). Keys written before the plan carried them are optional.
TEST(PlanJson, CommRoundTripsWhatTheEnginesRun) {
  const Cluster cluster = makeCluster({{"A100-80", "A100-80"}, {"V100-32", "V100-32"}});
  Plan plan = plannedPlan(cluster);
  plan.seed = 7;
  CommPlan& comm = plan.comm;
  comm.algorithm = AllReduceAlgorithm::kTwoD;
  comm.codec.kind = CodecKind::kPowerSgd;
  comm.codec.seed = 7;
  comm.codec.powersgd_rank = 3;
  comm.codec.powersgd_iterations = 2;
  comm.codec.powersgd_bf16_factors = true;
  comm.codec.powersgd_min_compression_rate = 1.5;
  comm.codec.powersgd_start_step = 9;
  comm.codec.topk_ratio = 0.1 + 0.2;
  comm.codec.error_feedback = false;
  comm.bucket_mb = 0.3;
  comm.first_bucket_mb = 0.1 + 0.2;
  comm.min_buckets = 7;
  comm.overlap = false;
  comm.sync_period = 3;
  EXPECT_NO_THROW(plan.validate(6));
  nlohmann::json json = toJson(plan);
  EXPECT_EQ(json["comm"]["algorithm"], "2d");
  EXPECT_EQ(json["comm"]["inter_node_codec"], "powersgd");
  EXPECT_TRUE(parsePlanJson(json.dump(), "plan.json").comm == plan.comm);
  for (const auto& [algorithm, name] : {std::pair{AllReduceAlgorithm::kFlat, "ring"},
                                        {AllReduceAlgorithm::kAuto, "auto"},
                                        {AllReduceAlgorithm::kHierarchical, "hierarchical"}}) {
    json["comm"]["algorithm"] = name;
    EXPECT_EQ(parsePlanJson(json.dump(), "plan.json").comm.algorithm, algorithm) << name;
  }
  // "flat" is the job's spelling, not the plan's.
  json["comm"]["algorithm"] = "flat";
  EXPECT_NE(errorOf(json.dump()).find("ring"), std::string::npos) << errorOf(json.dump());
  // A file of four comm keys (as plans were written before) reads with the defaults.
  json["comm"] = {{"algorithm", "hierarchical"},
                  {"intra_node_codec", "none"},
                  {"inter_node_codec", "fp16"},
                  {"sync_period", 1}};
  CommPlan expected;
  expected.algorithm = AllReduceAlgorithm::kHierarchical;
  expected.codec.kind = CodecKind::kFp16;
  expected.codec.seed = 7;
  EXPECT_TRUE(parsePlanJson(json.dump(), "plan.json").comm == expected);
  // Nothing compresses inside a node: such a file is refused, not half run.
  json["comm"]["intra_node_codec"] = "int8";
  EXPECT_NE(errorOf(json.dump()).find("intra_node_codec"), std::string::npos);
  // Knobs out of range are refused by the reader and by validation.
  json["comm"].erase("intra_node_codec");
  json["comm"]["min_buckets"] = 0;
  EXPECT_NE(errorOf(json.dump()).find("min_buckets"), std::string::npos);
  Plan bad = plan;
  bad.comm.codec.topk_ratio = 0;
  EXPECT_THROW(bad.validate(6), ConfigError);
  bad = plan;
  bad.comm.sync_period = 0;
  EXPECT_THROW(bad.validate(6), ConfigError);
  // The cost model prices what it has a formula for, and refuses the rest.
  EXPECT_TRUE(priced(CodecKind::kBf16));
  EXPECT_FALSE(priced(CodecKind::kPowerSgd));
  EXPECT_FALSE(priced(AllReduceAlgorithm::kTwoD));
}

TEST(PlanJson, ValidationRejectsInconsistentPlans) {
  const Cluster cluster = makeCluster({{"A100-80", "A100-80"}});
  const Plan good = plannedPlan(cluster);
  Plan bad = good;
  bad.global_batch += 1;
  EXPECT_THROW(bad.validate(6), ConfigError);
  EXPECT_THROW(good.validate(7), ConfigError);  // the plan is for a 6-layer model
  bad = good;
  bad.ranks.push_back(bad.ranks[0]);  // a rank that runs nothing
  EXPECT_THROW(bad.validate(6), ConfigError);
  // Plans made for another cluster are refused, not misread.
  EXPECT_THROW(checkPlanAgainstCluster(good, makeCluster({{"A100-80"}})), ConfigError);
  EXPECT_THROW(checkPlanAgainstCluster(good, makeCluster({{"T4", "T4"}})), ConfigError);
}

}  // namespace
}  // namespace chorus::plan
