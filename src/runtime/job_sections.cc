#include "job_sections.h"

#include "chorus/core/error.h"

namespace chorus::runtime {
namespace {

void require(bool ok, const std::string& key, const std::string& what) {
  if (!ok) CHORUS_THROW(ConfigError, "config key '", key, "': ", what);
}

void requirePrecisionName(const std::string& name, const std::string& key) {
  require(name == "fp32" || name == "bf16" || name == "fp16", key,
          "'" + name + "' is unknown; expected fp32, bf16 or fp16");
}

PrecisionSection::LossScale readLossScale(const Config& config, const std::string& table,
                                          PrecisionSection::LossScale scale) {
  scale.init = config.getDouble(table + ".init", scale.init);
  scale.growth = config.getDouble(table + ".growth", scale.growth);
  scale.backoff = config.getDouble(table + ".backoff", scale.backoff);
  scale.interval = config.getInt(table + ".interval", scale.interval);
  require(scale.init > 0, table + ".init", "must be positive");
  require(scale.growth > 1, table + ".growth", "must be > 1");
  require(scale.backoff > 0 && scale.backoff < 1, table + ".backoff", "must be in (0, 1)");
  require(scale.interval >= 1, table + ".interval", "must be at least 1");
  return scale;
}

}  // namespace

PrecisionSection readPrecision(const Config& config) {
  PrecisionSection precision;
  precision.fallback = config.getString("precision.default", precision.fallback);
  precision.cpu = config.getString("precision.cpu", precision.cpu);
  precision.cuda = config.getString("precision.cuda", precision.cuda);
  precision.ranks = config.getStrings("precision.ranks", precision.ranks);
  precision.tf32 = config.getBool("precision.tf32", precision.tf32);
  requirePrecisionName(precision.fallback, "precision.default");
  if (!precision.cpu.empty()) requirePrecisionName(precision.cpu, "precision.cpu");
  if (!precision.cuda.empty()) requirePrecisionName(precision.cuda, "precision.cuda");
  for (const auto& name : precision.ranks) requirePrecisionName(name, "precision.ranks");
  const auto common = readLossScale(config, "precision.loss_scale", {});
  precision.loss_scale_cpu = readLossScale(config, "precision.loss_scale.cpu", common);
  precision.loss_scale_cuda = readLossScale(config, "precision.loss_scale.cuda", common);
  return precision;
}

CheckpointSection readCheckpoint(const Config& config) {
  CheckpointSection checkpoint;
  checkpoint.dir = config.getString("checkpoint.dir", checkpoint.dir);
  checkpoint.every = config.getInt("checkpoint.every", checkpoint.every);
  checkpoint.keep = config.getInt("checkpoint.keep", checkpoint.keep);
  checkpoint.async = config.getBool("checkpoint.async", checkpoint.async);
  checkpoint.at_end = config.getBool("checkpoint.at_end", checkpoint.at_end);
  require(checkpoint.every >= 0, "checkpoint.every", "must be >= 0 (0: only at the end)");
  require(checkpoint.keep >= 1, "checkpoint.keep", "must be at least 1");
  require(checkpoint.every == 0 || !checkpoint.dir.empty(), "checkpoint.every",
          "needs checkpoint.dir");
  return checkpoint;
}

std::string precisionOf(const PrecisionSection& precision, int rank, const DeviceSpec& device) {
  if (!precision.ranks.empty()) {
    if (rank < static_cast<int>(precision.ranks.size())) return precision.ranks[rank];
    CHORUS_THROW(ConfigError, "config key 'precision.ranks': ", precision.ranks.size(),
                 " entries, but rank ", rank, " exists");
  }
  const std::string& kind = device.kind == DeviceKind::kCuda ? precision.cuda : precision.cpu;
  return kind.empty() ? precision.fallback : kind;
}

}  // namespace chorus::runtime
