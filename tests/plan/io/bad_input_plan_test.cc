// Bad-input table, plan files (PLAN- rows of docs/errors.md): what `chorus simulate --plan`
// refuses — malformed or foreign JSON, plans that do not add up, and plans made for another
// cluster or model.
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "bad_input_table.h"
#include "chorus/plan/plan_json.h"
#include "chorus/plan/planner.h"
#include "plan/plan_test_util.h"

namespace chorus::plan {
namespace {

using chorus::testing::BadInputRow;
using nlohmann::json;

// Two nodes of two devices each; the plans below are made for it.
Cluster testCluster() {
  return testing::makeCluster({{"A100-80", "A100-80"}, {"V100-32", "V100-32"}});
}

ModelProfile testModel() { return testing::uniformModel(6, 1e8, 1e12, 1e8, 1e6); }

// The planner's best plan for the test cluster, as `chorus plan --out` writes it.
json validPlan() {
  PlanOptions options;
  options.global_batch = 16;
  options.top_k = 1;
  options.allow_pipelines = false;
  options.allow_dropping_devices = false;
  return toJson(planCluster(testCluster(), testModel(), options).plans.at(0));
}

// What `chorus simulate` does with a plan file before it simulates (simulate_command.cc).
void readAndCheck(const std::string& text) {
  const Plan plan = parsePlanJson(text, "plan.json");
  checkPlanAgainstCluster(plan, testCluster());
  plan.validate(testModel().layerCount());
}

struct PlanRow {
  BadInputRow row;
  std::function<void(json&)> change = nullptr;  // applied to validPlan()
  std::string text = "";                        // or the whole file, when not empty
};

// gtest prints a failing row by its id.
void PrintTo(const PlanRow& param, std::ostream* out) { *out << param.row.id; }

const std::vector<PlanRow>& planRows() {
  static const std::vector<PlanRow> rows = {
      {{"PLAN-01", "ConfigError", "plan.json:1: malformed JSON"},
       nullptr,
       R"({"version": 1, "global_batch": 16, "replicas": [{"share": 16, "st)"},
      {{"PLAN-02", "ConfigError", "version: must be an integer in [1, 1]"},
       [](json& plan) { plan["version"] = 2; }},
      {{"PLAN-03", "ConfigError", "replica: unknown key 'replica'; known: version, model"},
       [](json& plan) { plan["replica"] = plan["replicas"]; }},
      {{"PLAN-04", "ConfigError", "(top level): missing key 'global_batch'"},
       [](json& plan) { plan.erase("global_batch"); }},
      {{"PLAN-05", "ConfigError", "replicas[0].share: must be an integer in [1, 2147483647]"},
       [](json& plan) { plan["replicas"][0]["share"] = 0; }},
      {{"PLAN-06", "ConfigError", "ranks[0].precision: unknown precision 'fp8'"},
       [](json& plan) { plan["ranks"][0]["precision"] = "fp8"; }},
      {{"PLAN-07", "ConfigError", "ranks[0].emulated_speed: must be in (0, 1]"},
       [](json& plan) { plan["ranks"][0]["emulated_speed"] = 2; }},
      {{"PLAN-08", "ConfigError", "ranks[0].memory_budget: must be at most 2^60 bytes (1 EiB)"},
       [](json& plan) { plan["ranks"][0]["memory_budget"] = 1e30; }},
      {{"PLAN-09", "ConfigError", "devices: says 5 but 'ranks' lists 4"},
       [](json& plan) { plan["devices"] = 5; }},
      {{"PLAN-10", "ConfigError", "plan: shares sum to 17, global_batch is 16"},
       [](json& plan) {
         plan["replicas"][0]["share"] = plan["replicas"][0]["share"].get<int>() + 1;
       }},
      {{"PLAN-11", "ConfigError", "plan: replica 0 stage 0 names rank 99 of 4"},
       [](json& plan) { plan["replicas"][0]["stages"][0]["rank"] = 99; }},
      {{"PLAN-12", "ConfigError", "plan: replica 0 ends at layer 5, the model has 6"},
       [](json& plan) { plan["replicas"][0]["stages"][0]["last_layer"] = 5; }},
      {{"PLAN-13", "ConfigError", "plan rank 0 names device 500 but the cluster has 4 devices"},
       [](json& plan) { plan["ranks"][0]["device"] = 500; }},
      {{"PLAN-14", "ConfigError", "plan ranks 0 and 1 both use device 0"},
       [](json& plan) { plan["ranks"][1]["device"] = plan["ranks"][0]["device"]; }},
      {{"PLAN-15", "ConfigError", "was the plan made for another cluster?"},
       [](json& plan) { plan["ranks"][0]["device_type"] = "H100-80"; }},
      {{"PLAN-16", "ConfigError", "plan.json: JSON nested 100000 levels deep"},
       nullptr,
       std::string(100000, '[') + std::string(100000, ']')},
  };
  return rows;
}

class PlanBadInput : public ::testing::TestWithParam<PlanRow> {};

TEST_P(PlanBadInput, IsRefusedBeforeSimulating) {
  const PlanRow& param = GetParam();
  std::string text = param.text;
  if (text.empty()) {
    json plan = validPlan();
    param.change(plan);
    text = plan.dump(1);
  }
  try {
    readAndCheck(text);
    ADD_FAILURE() << param.row.id << ": the plan was accepted";
  } catch (const Error& error) {
    EXPECT_TRUE(chorus::testing::matchesRow(error, param.row));
  }
}

INSTANTIATE_TEST_SUITE_P(Rows, PlanBadInput, ::testing::ValuesIn(planRows()),
                         chorus::testing::rowName<PlanRow>);

TEST(PlanBadInputTable, RowsMatchDocsErrorsMd) {
  chorus::testing::expectRowsDocumented("PLAN-", chorus::testing::rowsOf(planRows()));
}

// The plan the rows start from is fine, so each row fails for its own reason.
TEST(PlanBadInputTable, UnchangedPlanIsAccepted) {
  const json plan = validPlan();
  ASSERT_EQ(plan["ranks"].size(), 4u);
  ASSERT_EQ(plan["replicas"].size(), 4u);
  EXPECT_NO_THROW(readAndCheck(plan.dump(1)));
}

}  // namespace
}  // namespace chorus::plan
