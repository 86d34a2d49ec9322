#include "plan_inputs.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>

#include "chorus/core/config.h"
#include "chorus/core/error.h"
#include "chorus/plan/transformer_shapes.h"
#include "chorus/runtime/job/auto_plan.h"
#include "chorus/runtime/job/job_config.h"

namespace chorus::cli {
namespace {

// A measured type's figure is a 1024^3 matmul's rate, which a model's kernels may beat (oneDNN
// convolutions, a quieter host), so calibrations may exceed 1, within reason.
constexpr double kMaxEfficiency = 4;

bool endsWith(const std::string& text, const std::string& suffix) {
  if (text.size() < suffix.size()) return false;
  return std::equal(suffix.rbegin(), suffix.rend(), text.rbegin(), [](char a, char b) {
    return std::tolower(static_cast<unsigned char>(a)) == b;
  });
}

}  // namespace

plan::ModelProfile resolvePlanModel(const std::string& name_or_path) {
  if (!endsWith(name_or_path, ".toml")) return plan::resolveModel(name_or_path);
  const runtime::JobConfig job = runtime::readJobConfig(Config::parseFile(name_or_path));
  return runtime::jobModelProfile(job, name_or_path);
}

std::vector<plan::Calibration> parseCalibrations(const std::vector<std::string>& entries,
                                                 const plan::Cluster& cluster) {
  std::vector<plan::Calibration> calibrations;
  for (const std::string& entry : entries) {
    const auto equals = entry.rfind('=');
    CHORUS_CHECK_CONFIG(equals != std::string::npos && equals > 0, "calibration '", entry,
                        "': expected TYPE[:DTYPE]=EFFICIENCY, e.g. '*=0.45'");
    std::string type = entry.substr(0, equals);
    plan::Dtype dtype = plan::Dtype::kFp32;
    if (const auto colon = type.rfind(':'); colon != std::string::npos) {
      dtype = plan::parseDtype(type.substr(colon + 1));
      type = type.substr(0, colon);
    }
    double efficiency = 0;
    try {
      efficiency = std::stod(entry.substr(equals + 1));
    } catch (const std::exception&) {
      CHORUS_THROW(ConfigError, "calibration '", entry, "': efficiency is not a number");
    }
    CHORUS_CHECK_CONFIG(efficiency > 0 && efficiency <= kMaxEfficiency, "calibration '", entry,
                        "': efficiency must be in (0, ", kMaxEfficiency, "]");
    bool found = false;
    for (const auto& known : cluster.types()) {
      if (type != "*" && known.name != type) continue;
      calibrations.push_back({known.name, dtype, efficiency});
      found = true;
    }
    CHORUS_CHECK_CONFIG(found, "calibration '", entry, "': the cluster has no device type '", type,
                        "'");
  }
  return calibrations;
}

void addCostFlags(CLI::App& command, CostFlags& flags) {
  command.add_option("--calibration", flags.calibrations,
                     "Measured efficiency TYPE[:DTYPE]=E overriding the cost model's (TYPE * = "
                     "every type); repeatable");
  command
      .add_option("--step-overhead-ms", flags.step_overhead_ms,
                  "Fixed host work per step (data, bookkeeping) measured on a real run")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  command
      .add_option("--layer-overhead-us", flags.layer_overhead_us,
                  "Fixed cost per layer and forward pass (backward: twice), measured on a real "
                  "run; a CPU worker with part of a core (cpu@S) pays it / core_fraction")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  command
      .add_option("--host-us-per-sample", flags.host_us_per_sample,
                  "Host work per sample outside compute (loading it), on each rank's own share")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  command
      .add_option("--codec-ns-per-byte", flags.codec_ns_per_byte,
                  "Encoding + decoding of a lossy codec per gradient byte, measured with "
                  "chorus bench comm --codecs")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
}

plan::CostOptions costOptions(const CostFlags& flags, const plan::Cluster& cluster) {
  plan::CostOptions options;
  options.calibrations = parseCalibrations(flags.calibrations, cluster);
  options.step_overhead_seconds = flags.step_overhead_ms / 1e3;
  options.layer_overhead_seconds = flags.layer_overhead_us / 1e6;
  options.host_seconds_per_sample = flags.host_us_per_sample / 1e6;
  options.codec_seconds_per_byte = flags.codec_ns_per_byte / 1e9;
  return options;
}

}  // namespace chorus::cli
