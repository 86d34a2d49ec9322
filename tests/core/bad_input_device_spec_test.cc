// Bad-input table, device specs (DEV- rows of docs/errors.md): what `--devices`, `devices = ...`
// and CHORUS_DEVICES refuse, and the message each gets.
#include <gtest/gtest.h>

#include "bad_input_table.h"
#include "chorus/core/device_spec.h"

namespace chorus {
namespace {

using testing::BadInputRow;

struct DeviceSpecRow {
  BadInputRow row;
  std::string spec;
};

// gtest prints a failing row by its id.
void PrintTo(const DeviceSpecRow& param, std::ostream* out) { *out << param.row.id; }

const std::vector<DeviceSpecRow>& deviceSpecRows() {
  static const std::vector<DeviceSpecRow> rows = {
      {{"DEV-01", "ConfigError", "invalid device spec 'gpu:0': unknown device 'gpu:0'"}, "gpu:0"},
      {{"DEV-02", "ConfigError", "a CUDA device needs an index"}, "cuda"},
      {{"DEV-03", "ConfigError", "invalid device spec 'cuda:x': the CUDA index must be a number"},
       "cuda:x"},
      {{"DEV-04", "ConfigError", "invalid device spec 'cuda:-1': the CUDA index must be a number"},
       "cuda:-1"},
      {{"DEV-05", "ConfigError", "the speed '0' must be a number in [0.001, 1]"}, "cpu@0"},
      {{"DEV-06", "ConfigError", "the speed '1.5' must be a number in [0.001, 1]"}, "cpu@1.5"},
      {{"DEV-07", "ConfigError", "the speed 'fast' must be a number in [0.001, 1]"}, "cpu@fast"},
      {{"DEV-08", "ConfigError", "the speed 'nan' must be a number in [0.001, 1]"}, "cpu@nan"},
      {{"DEV-09", "ConfigError", "the speed '1e-9' must be a number in [0.001, 1]"}, "cpu@1e-9"},
      {{"DEV-10", "ConfigError", "the speed '0.5@0.5' must be a number in [0.001, 1]"},
       "cpu@0.5@0.5"},
      {{"DEV-11", "ConfigError", "the memory budget 'lots' is not a size"}, "cpu/lots"},
      {{"DEV-12", "ConfigError", "the memory budget must be positive"}, "cpu/0"},
      {{"DEV-13", "ConfigError", "the memory budget '20XiB' is not a size"}, "cuda:1/20XiB"},
      {{"DEV-14", "ConfigError", "the memory budget '20GiB/4GiB' is not a size"},
       "cuda:1/20GiB/4GiB"},
      {{"DEV-15", "ConfigError", "the memory budget '99999999TiB' is not a size"},
       "cpu/99999999TiB"},
      {{"DEV-16", "ConfigError", "invalid device list 'auto,cpu': 'auto' must stand alone"},
       "auto,cpu"},
      {{"DEV-17", "ConfigError", "'auto' takes no speed or memory budget"}, "auto@0.5"},
      {{"DEV-18", "ConfigError", "empty device list; expected 'auto', 'cpu' or 'cuda:N'"}, ""},
      {{"DEV-19", "ConfigError",
        "in device list 'cpu,,cpu': invalid device spec '': the spec is empty"},
       "cpu,,cpu"},
  };
  return rows;
}

class DeviceSpecBadInput : public ::testing::TestWithParam<DeviceSpecRow> {};

// Each spec is refused with its own message, which also says what a spec looks like.
TEST_P(DeviceSpecBadInput, IsRefusedWithItsMessage) {
  const DeviceSpecRow& param = GetParam();
  try {
    parseDeviceSpecs(param.spec);
    ADD_FAILURE() << param.row.id << ": '" << param.spec << "' was accepted";
  } catch (const Error& error) {
    EXPECT_TRUE(testing::matchesRow(error, param.row));
  }
}

INSTANTIATE_TEST_SUITE_P(Rows, DeviceSpecBadInput, ::testing::ValuesIn(deviceSpecRows()),
                         testing::rowName<DeviceSpecRow>);

TEST(DeviceSpecBadInputTable, RowsMatchDocsErrorsMd) {
  testing::expectRowsDocumented("DEV-", testing::rowsOf(deviceSpecRows()));
}

// The slowest speed still accepted is the documented bound.
TEST(DeviceSpecBadInputTable, SlowestAcceptedSpeedIsTheBound) {
  EXPECT_EQ(parseDeviceSpec("cpu@0.001").speed, kMinEmulatedSpeed);
}

}  // namespace
}  // namespace chorus
