#include "chorus/runtime/job/job_package.h"

#include <nlohmann/json.hpp>

#include "chorus/core/config.h"
#include "chorus/core/error.h"
#include "chorus/plan/plan_json.h"
#include "chorus/runtime/job/job_plan.h"

namespace chorus::runtime {
namespace {

// 2: the plan as JSON text (parsed once, by plan::parsePlanJson), not a nested object.
constexpr int kVersion = 2;

}  // namespace

std::string encodeJobPackage(const JobConfig& job, const plan::Plan& plan) {
  const nlohmann::json package = {{"version", kVersion},
                                  {"source", job.source},
                                  {"job", job.toml},
                                  {"plan", plan::toJson(plan).dump()}};
  return package.dump();
}

JobPackage decodeJobPackage(const std::string& text) {
  nlohmann::json package;
  try {
    package = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& error) {
    CHORUS_THROW(ConfigError, "job package: not JSON (", error.what(), ")");
  }
  CHORUS_CHECK_CONFIG(package.is_object() && package.value("version", 0) == kVersion,
                      "job package: version ", kVersion, " expected");
  for (const char* key : {"source", "job", "plan"})
    CHORUS_CHECK_CONFIG(package.contains(key) && package[key].is_string(), "job package: no '", key,
                        "'");
  const std::string source = package["source"].get<std::string>();
  JobPackage decoded;
  decoded.plan = plan::parsePlanJson(package["plan"].get<std::string>(), source + " (plan)");
  // The plan decides what the job leaves to it (a plan file's or the planner's ZeRO stage).
  decoded.job = jobUnderPlan(
      readJobConfig(Config::parseString(package["job"].get<std::string>(), source)), decoded.plan);
  return decoded;
}

JobPackage fetchJobPackage(comm::Store& store, std::chrono::milliseconds timeout) {
  return decodeJobPackage(store.getString(kJobPackageKey, timeout));
}

}  // namespace chorus::runtime
