#include "chorus/device/memory_meter.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <thread>

#include "chorus/core/error.h"

namespace chorus::device {
namespace {

class MemoryMeterTest : public ::testing::Test {
 protected:
  void SetUp() override { meter_ = MemoryMeter::install(); }
  void TearDown() override { meter_->uninstall(); }
  std::shared_ptr<MemoryMeter> meter_;
};

TEST_F(MemoryMeterTest, ChargesTheEnteredAccountOnly) {
  auto a = std::make_shared<MemoryAccount>();
  auto b = std::make_shared<MemoryAccount>();
  at::Tensor outside = at::empty({1000}, at::kFloat);
  at::Tensor in_a, in_b;
  {
    MemoryAccount::Scope scope(a);
    in_a = at::empty({1024}, at::kFloat);
    {
      MemoryAccount::Scope nested(b);
      in_b = at::empty({256}, at::kDouble);
    }
    at::Tensor temporary = at::empty({4096}, at::kByte);
  }
  EXPECT_EQ(a->bytesInUse(), 4096u);
  EXPECT_EQ(a->peakBytes(), 4096u + 4096u);
  EXPECT_EQ(b->bytesInUse(), 2048u);
  in_a = at::Tensor();
  EXPECT_EQ(a->bytesInUse(), 0u);
  a->resetPeak();
  EXPECT_EQ(a->peakBytes(), 0u);
}

TEST_F(MemoryMeterTest, AFreeOnAnotherThreadOrAfterTheAccountIsGoneIsSafe) {
  auto account = std::make_shared<MemoryAccount>();
  at::Tensor tensor;
  {
    MemoryAccount::Scope scope(account);
    tensor = at::empty({512}, at::kFloat);
  }
  std::thread([moved = std::move(tensor)]() mutable { moved = at::Tensor(); }).join();
  EXPECT_EQ(account->bytesInUse(), 0u);
  {
    MemoryAccount::Scope scope(account);
    tensor = at::empty({512}, at::kFloat);
  }
  account.reset();        // the allocation keeps the counters alive
  tensor = at::Tensor();  // and this frees them
}

TEST_F(MemoryMeterTest, OneMeterPerProcess) {
  EXPECT_THROW(MemoryMeter::install(), DeviceError);
  EXPECT_THROW(MemoryAccount::Scope(nullptr), ConfigError);
}

}  // namespace
}  // namespace chorus::device
