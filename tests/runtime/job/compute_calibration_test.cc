// The cost model calibrated on this host for the job's model (compute_calibration.h): the figures
// it derives from two timings, plan = "auto" pricing CPU workers with a given calibration and
// timing the job's model, and the timing itself on a real model.
#include "chorus/runtime/job/compute_calibration.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "chorus/core/config.h"
#include "chorus/runtime/job/auto_plan.h"

namespace chorus::runtime {
namespace {

plan::ModelProfile twoLayers(double flops_each) {
  plan::ModelProfile profile;
  profile.name = "two";
  for (int l = 0; l < 2; ++l) {
    plan::LayerProfile layer;
    layer.name = "l" + std::to_string(l);
    layer.params = 10;
    layer.forward_flops = flops_each;
    profile.layers.push_back(layer);
  }
  return profile;
}

// 8 samples in 1.4 ms, 32 in 2.6 ms: 50 us a sample, 1 ms fixed; forward and backward are
// 3 x 2 x 1 MFLOP = 6 MFLOP a sample, 120 GFLOP/s against a 100 GFLOP/s matmul.
ComputeCalibration fixedTimings() {
  ComputeCalibration calibration;
  calibration.small_batch = 8;
  calibration.large_batch = 32;
  calibration.small_seconds = 1.4e-3;
  calibration.large_seconds = 2.6e-3;
  calibration.matmul_gflops = 100;
  return calibration;
}

TEST(ComputeCalibration, TheLineThroughTwoTimingsGivesEfficiencyAndOverhead) {
  const ComputeCalibration calibration = fixedTimings();
  const plan::ModelProfile profile = twoLayers(1e6);
  EXPECT_NEAR(calibration.secondsPerSample(), 50e-6, 1e-15);
  EXPECT_NEAR(calibration.efficiency(profile), 1.2, 1e-12);
  // 1 ms over 2 layers x 3 passes.
  EXPECT_NEAR(calibration.layerOverheadSeconds(profile), 1e-3 / 6, 1e-15);
  plan::CostOptions cost;
  applyComputeCalibration(cost, calibration, profile, {"cpu", "cpu@0.5"}, true);
  ASSERT_EQ(cost.calibrations.size(), 2u);
  EXPECT_EQ(cost.calibrations[1].device_type, "cpu@0.5");
  EXPECT_NEAR(cost.calibrations[1].efficiency, 1.2, 1e-12);
  EXPECT_NEAR(cost.layer_overhead_seconds, 1e-3 / 6, 1e-15);
  // Beside a GPU the overhead, one figure for every device, stays the default.
  plan::CostOptions mixed;
  applyComputeCalibration(mixed, calibration, profile, {"cpu"}, false);
  EXPECT_EQ(mixed.layer_overhead_seconds, plan::CostOptions{}.layer_overhead_seconds);
  EXPECT_NE(describeCalibration(calibration, profile).find("1.20 x the matmul rate"),
            std::string::npos);
}

// plan = "auto" prices its CPU workers with the calibration it is given: a model timed slower
// than the default efficiency is predicted slower, and the log line says what was calibrated.
TEST(ComputeCalibration, AutoPlanPricesCpuWorkersWithIt) {
  Config config = Config::parseString(defaultJobToml(), "<default>");
  for (const char* setting : {"plan=auto", "data.dataset=synthetic", "devices=cpu,cpu@0.5"})
    config.set(setting);
  const JobConfig job = readJobConfig(config);
  plan::MeasuredDevice cpu;
  cpu.name = "cpu";
  cpu.memory_bytes = 16ull << 30;
  cpu.gflops[static_cast<int>(plan::Dtype::kFp32)] = 100;
  cpu.memory_bandwidth_gbs = 35;
  const std::vector<plan::MeasuredDevice> measured(2, cpu);
  const PlannedJob plain = planJob(job, job.devices, measured);
  ComputeCalibration slow = fixedTimings();
  slow.large_seconds = 1.0;  // far slower per sample than the default efficiency prices it
  const PlannedJob calibrated = planJob(job, job.devices, measured, slow);
  EXPECT_GT(calibrated.plan.predicted.step_seconds, 2 * plain.plan.predicted.step_seconds)
      << plain.summary << "\n"
      << calibrated.summary;
  EXPECT_EQ(plain.summary.find("calibrated on this host"), std::string::npos);
  EXPECT_NE(calibrated.summary.find("calibrated on this host"), std::string::npos);
}

// The timing itself, on a real model: what the line needs (a slope) and nothing more, since the
// host's speed is not this test's to know; the job's random stream is left as it was.
TEST(ComputeCalibration, TimesARealModelWithoutMovingTheRandomStream) {
  model::ModelConfig config;
  config.kind = "mlp";
  config.hidden = {256};
  config.input_shape = {1, 28, 28};
  config.classes = 10;
  at::manual_seed(7);
  const double expected = at::rand({1}).item<double>();
  at::manual_seed(7);
  ComputeCalibrationOptions options;
  options.batch = 256;
  const ComputeCalibration calibration = calibrateCompute(config, 3, options);
  EXPECT_EQ(at::rand({1}).item<double>(), expected);
  EXPECT_EQ(calibration.small_batch, 64);
  EXPECT_GT(calibration.secondsPerSample(), 0);
  EXPECT_GT(calibration.matmul_gflops, 0);
}

TEST(ComputeCalibration, TimesTheGlobalBatchWithinBounds) {
  EXPECT_EQ(ComputeCalibrationOptions::forJob(2, 1).batch, 4);
  EXPECT_EQ(ComputeCalibrationOptions::forJob(64, 3).batch, 64);
  EXPECT_EQ(ComputeCalibrationOptions::forJob(64, 3).threads, 3);
  EXPECT_EQ(ComputeCalibrationOptions::forJob(1 << 20, 1).batch,
            ComputeCalibrationOptions::kMaxTimedBatch);
}

// plan = "auto" times the job's model against the matmul rate it measured for its first CPU
// worker (not a second measurement), and times nothing for a job without CPU workers.
TEST(ComputeCalibration, AutoPlanTimesTheModelAgainstTheMeasuredRateOfItsFirstCpuWorker) {
  Config config = Config::parseString(defaultJobToml(), "<default>");
  for (const char* setting :
       {"plan=auto", "data.dataset=synthetic", "train.global_batch=16", "model.channels=8"})
    config.set(setting);
  const JobConfig job = readJobConfig(config);
  plan::MeasuredDevice gpu, cpu;
  gpu.gflops[static_cast<int>(plan::Dtype::kFp32)] = 5000;
  cpu.gflops[static_cast<int>(plan::Dtype::kFp32)] = 123.5;
  const std::vector<DeviceSpec> mixed = parseDeviceSpecs("cuda:0,cpu@0.5");
  const std::optional<ComputeCalibration> calibration =
      autoPlanCalibration(job, mixed, {gpu, cpu}, {0, 1});
  ASSERT_TRUE(calibration.has_value());
  EXPECT_EQ(calibration->matmul_gflops, 123.5);
  EXPECT_EQ(calibration->large_batch, 16);
  EXPECT_EQ(calibration->small_batch, 4);
  EXPECT_GT(calibration->secondsPerSample(), 0);
  EXPECT_FALSE(
      autoPlanCalibration(job, parseDeviceSpecs("cuda:0,cuda:1"), {gpu, gpu}, {0, 0}).has_value());
}

}  // namespace
}  // namespace chorus::runtime
