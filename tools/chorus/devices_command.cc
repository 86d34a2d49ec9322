// `chorus devices [--json] [--threads N] [--quick] [--cluster-toml FILE [--devices SPECS]]`:
// lists this host's devices with figures measured on the spot (matmul GFLOP/s per dtype, copy
// bandwidth), as a table for people or JSON for tools; --cluster-toml also writes this node as
// the planner's cluster file (plan/local_cluster.h), one device per worker of SPECS.
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "chorus/core/logging.h"
#include "chorus/core/units.h"
#include "chorus/device/discovery.h"
#include "chorus/device/microbench.h"
#include "chorus/plan/local_cluster.h"
#include "chorus/runtime/job/auto_plan.h"
#include "chorus/runtime/job/job_config.h"
#include "commands.h"

namespace chorus::cli {
namespace {

struct DevicesOptions {
  bool json = false;
  int threads = 1;
  bool quick = false;
  // Write the node as a cluster file here, one device per worker of `devices`. Default: none.
  std::string cluster_toml;
  // Worker specs for the cluster file, as `chorus train` takes them. Default: "auto".
  std::string devices = "auto";
};

struct Measured {
  device::DeviceInfo info;
  device::DeviceMeasurement figures;
  std::string blas;  // the BLAS the device's matmul ran on
};

std::string fixed(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.1f", value);
  return buffer;
}

std::string orDash(const std::optional<double>& value) { return value ? fixed(*value) : "-"; }

nlohmann::json orNull(const std::optional<double>& value) {
  return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

std::string join(const std::vector<std::string>& items) {
  std::string text;
  for (const auto& item : items) text += (text.empty() ? "" : ",") + item;
  return text;
}

nlohmann::json toJson(const Measured& row) {
  const auto& info = row.info;
  return {{"index", info.index},
          {"kind", toString(info.kind)},
          {"name", info.name},
          {"vendor", info.vendor},
          {"rocm", info.rocm},
          {"memory_bytes", info.memory_bytes},
          {"compute_capability", info.compute_capability},
          {"cores", info.cores},
          {"dtypes", info.dtypes},
          {"matmul_gflops_fp32", row.figures.matmul_gflops_fp32},
          {"matmul_gflops_bf16", orNull(row.figures.matmul_gflops_bf16)},
          {"matmul_gflops_fp16", orNull(row.figures.matmul_gflops_fp16)},
          {"matmul_gflops_tf32", orNull(row.figures.matmul_gflops_tf32)},
          {"mem_bandwidth_gbs", row.figures.mem_bandwidth_gbs},
          {"blas", row.blas},
          {"threads", row.figures.threads}};
}

std::vector<std::string> tableRow(const Measured& row) {
  const auto& info = row.info;
  return {info.index < 0 ? "-" : std::to_string(info.index),
          toString(info.kind),
          info.name,
          info.vendor,
          formatBytes(info.memory_bytes),
          info.compute_capability.empty() ? "-" : info.compute_capability,
          join(info.dtypes),
          fixed(row.figures.matmul_gflops_fp32),
          orDash(row.figures.matmul_gflops_bf16),
          orDash(row.figures.matmul_gflops_fp16),
          orDash(row.figures.matmul_gflops_tf32),
          fixed(row.figures.mem_bandwidth_gbs),
          row.blas,
          row.figures.threads > 0 ? std::to_string(row.figures.threads) : "-"};
}

void printTable(const std::vector<Measured>& rows, const device::MeasureOptions& options) {
  std::cout << "# figures measured on this run: " << options.matmul_size << "x"
            << options.matmul_size << " matmul (GFLOP/s = 2n^3/t) and a "
            << formatBytes(options.bandwidth_bytes) << " copy (GB/s = 2 x bytes/t), best of "
            << options.trials << " trials of >= " << options.min_seconds << " s; CPU on "
            << options.threads << " intra-op thread(s)\n";
  std::vector<std::vector<std::string>> cells{{"index", "kind", "name", "vendor", "memory", "cc",
                                               "dtypes", "fp32", "bf16", "fp16", "tf32", "GB/s",
                                               "blas", "threads"}};
  for (const auto& row : rows) cells.push_back(tableRow(row));
  std::vector<std::size_t> widths(cells.front().size(), 0);
  for (const auto& line : cells)
    for (std::size_t c = 0; c < line.size(); ++c) widths[c] = std::max(widths[c], line[c].size());
  for (const auto& line : cells) {
    std::string text;
    for (std::size_t c = 0; c < line.size(); ++c)
      text += line[c] + std::string(widths[c] - line[c].size() + 2, ' ');
    std::cout << text.substr(0, text.find_last_not_of(' ') + 1) << "\n";
  }
}

// As plan = "auto" sees the device, described with the BLAS and threads it was measured on.
plan::MeasuredDevice measuredOf(const Measured& row) {
  plan::MeasuredDevice device = runtime::toMeasuredDevice(row.info, row.figures);
  device.description =
      row.info.name + ", " + row.blas + ", " +
      (row.figures.threads > 0 ? std::to_string(row.figures.threads) + " thread(s)" : "GPU");
  return device;
}

std::string today() {
  char buffer[16];
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  std::strftime(buffer, sizeof buffer, "%Y-%m-%d", &utc);
  return buffer;
}

// The node as the planner sees it: one device per worker spec, measured figures scaled by the
// spec's emulated speed, its memory budget as memory; workers of a CPU-only node meet through
// shared memory at the measured copy rate, GPUs through the catalog's PCIe 4.
void writeClusterToml(const DevicesOptions& cli, const std::vector<Measured>& rows,
                      const device::MeasureOptions& options) {
  const auto found = [&] {
    std::vector<device::DeviceInfo> infos;
    for (const auto& row : rows) infos.push_back(row.info);
    return infos;
  }();
  const auto specs = device::expandAuto(parseDeviceSpecs(cli.devices), found);
  device::validateSpecs(specs, found);
  plan::LocalCluster cluster;
  bool all_cpu = true;
  for (const DeviceSpec& spec : specs) {
    const Measured* row = nullptr;
    for (const auto& candidate : rows)
      if (candidate.info.kind == spec.kind && candidate.info.index == spec.index) row = &candidate;
    CHORUS_CHECK_CONFIG(row, "device spec '", spec.toString(), "' matches no measured device");
    all_cpu = all_cpu && spec.kind == DeviceKind::kCpu;
    cluster.devices.push_back(plan::emulateDevice(measuredOf(*row), spec.toString(), spec.speed,
                                                  spec.memory_budget.value_or(0)));
  }
  cluster.intra_link = all_cpu ? plan::measuredShmLink(rows.front().figures.mem_bandwidth_gbs)
                               : *plan::findLinkType("pcie4");
  cluster.comments = {
      "This node as `chorus devices --cluster-toml` measured it on " + today() + " for workers " +
          toString(specs) + ".",
      "Rates are " + std::to_string(options.matmul_size) + "^3 matmuls on " +
          std::to_string(options.threads) +
          " intra-op thread(s) per CPU worker, scaled by each worker's emulated speed.",
      "Plan with: chorus plan --cluster " + cli.cluster_toml + " --model ... --global-batch ..."};
  std::ofstream out(cli.cluster_toml);
  out << plan::localClusterToml(cluster);
  if (!out) CHORUS_THROW(ConfigError, "cannot write the cluster file '", cli.cluster_toml, "'");
  logInfo("wrote the cluster file ", cli.cluster_toml, " (", specs.size(), " devices)");
}

int runDevices(const DevicesOptions& cli) {
  device::MeasureOptions options =
      cli.quick ? device::MeasureOptions::quick() : device::MeasureOptions{};
  options.threads = cli.threads;
  const std::string cpu_blas = device::blasBackend();
  std::vector<Measured> rows;
  for (const auto& info : device::discoverDevices()) {
    logInfo("measuring ", device::describe(info));
    std::string blas = info.kind == DeviceKind::kCuda ? (info.rocm ? "hipblas" : "cublas")
                                                      : (cpu_blas.empty() ? "unknown" : cpu_blas);
    rows.push_back({info, device::measureDevice(info, options), std::move(blas)});
  }
  if (cli.json) {
    nlohmann::json all = nlohmann::json::array();
    for (const auto& row : rows) all.push_back(toJson(row));
    std::cout << all.dump(2) << std::endl;
  } else {
    printTable(rows, options);
  }
  if (!cli.cluster_toml.empty()) writeClusterToml(cli, rows, options);
  return kExitOk;
}

}  // namespace

void addDevicesCommand(CLI::App& app, Action& action) {
  auto options = std::make_shared<DevicesOptions>();
  CLI::App* command =
      app.add_subcommand("devices", "List this host's devices with figures measured now");
  command->add_flag("--json", options->json, "Print a JSON array instead of a table");
  command->add_option("--threads", options->threads, "Intra-op threads for CPU measurements")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  command->add_flag("--quick", options->quick, "Smaller, faster measurements (for tests)");
  CLI::Option* cluster_toml =
      command->add_option("--cluster-toml", options->cluster_toml,
                          "Also write this node as a cluster file for chorus plan");
  // Without a cluster file to describe, --devices did nothing: refuse it rather than ignore it.
  command
      ->add_option("--devices", options->devices,
                   "Worker specs of that cluster file (e.g. cpu@1.0,cpu@0.5/512MiB)")
      ->needs(cluster_toml)
      ->capture_default_str();
  command->callback([options, &action] { action = [options] { return runDevices(*options); }; });
}

}  // namespace chorus::cli
