// Whole jobs on a GPU beside the CPU, through the `chorus` binary (label `gpu`; each test skips
// without a usable CUDA device): a CUDA rank and a CPU rank train as single-process training on
// the same global batches does, with the flat all-reduce in host memory and with the bridge
// (device-resident buckets, the GPU's leader staging through pinned memory).
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cmath>

#include "runtime/chorus_cli.h"

namespace chorus::testing {
namespace {

const std::string kJob =
    " --set balance=off --set seed=3 --set model.kind=mlp --set model.hidden=[64]"
    " --set data.dataset=synthetic --set data.size=1024 --set train.steps=8"
    " --set train.global_batch=32 --set train.eval_every=0 --set train.eval_samples=64"
    " --set train.target_accuracy=0 --set optimizer.schedule=constant --set precision.tf32=false";

std::vector<double> lossesOf(const TrainRun& run) {
  std::vector<double> losses;
  for (const auto& step : run.steps) losses.push_back(step["loss"].get<double>());
  return losses;
}

TEST(GpuJob, ACudaRankBesideACpuRankTrainsAsOneProcess) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no usable CUDA device";
  const TrainRun single = chorusTrain("--set devices=cpu" + kJob, "gpu_single");
  ASSERT_EQ(single.exit_code, 0) << single.output;
  for (const char* algorithm : {"flat", "auto"}) {
    const TrainRun mixed = chorusTrain(
        "--set devices=cuda:0,cpu --set comm.algorithm=" + std::string(algorithm) + kJob,
        std::string("gpu_mixed_") + algorithm);
    ASSERT_EQ(mixed.exit_code, 0) << mixed.output;
    const std::string expected = std::string(algorithm) == "flat"
                                     ? "gradient all-reduce: flat, in host memory"
                                     : "bridged through host memory";
    EXPECT_NE(mixed.output.find(expected), std::string::npos) << mixed.output;
    const auto want = lossesOf(single), got = lossesOf(mixed);
    ASSERT_EQ(got.size(), want.size());
    // cuBLAS and the CPU's BLAS round differently: close, not bitwise.
    for (size_t step = 0; step < want.size(); ++step)
      EXPECT_NEAR(got[step], want[step], 1e-4 * std::abs(want[step]))
          << algorithm << ", step " << step + 1;
  }
}

// Two ranks of one GPU (emulated devices): NCCL would refuse them, the bridge joins them.
TEST(GpuJob, TwoEmulatedDevicesOnOneGpuTrainTogether) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no usable CUDA device";
  const TrainRun run =
      chorusTrain("--set devices=cuda:0@1.0/8GiB,cuda:0@0.5/4GiB --set comm.algorithm=auto" + kJob,
                  "gpu_shared");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(run.steps.size(), 8u);
}

}  // namespace
}  // namespace chorus::testing
