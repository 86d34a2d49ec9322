#include "chorus/model/model_config.h"

#include <algorithm>

#include "chorus/core/error.h"
#include "chorus/model/cnn.h"
#include "chorus/model/gpt.h"
#include "chorus/model/mlp.h"

namespace chorus::model {
namespace {

std::string joinKinds() {
  std::string joined;
  for (const std::string& kind : modelKinds()) joined += (joined.empty() ? "" : ", ") + kind;
  return joined;
}

void checkPositive(std::int64_t value, const char* field) {
  CHORUS_CHECK_CONFIG(value >= 1, "model.", field, " must be at least 1, got ", value);
}

void checkImageFields(const ModelConfig& config) {
  CHORUS_CHECK_CONFIG(!config.input_shape.empty(), "model.input_shape must not be empty");
  for (std::int64_t dim : config.input_shape)
    CHORUS_CHECK_CONFIG(dim >= 1, "model.input_shape must have positive dimensions, got ", dim);
  CHORUS_CHECK_CONFIG(config.classes >= 2, "model.classes must be at least 2, got ",
                      config.classes);
}

void checkMlp(const ModelConfig& config) {
  checkImageFields(config);
  for (std::int64_t width : config.hidden)
    CHORUS_CHECK_CONFIG(width >= 1, "model.hidden must have positive widths, got ", width);
}

void checkCnn(const ModelConfig& config) {
  checkImageFields(config);
  CHORUS_CHECK_CONFIG(config.input_shape.size() == 3,
                      "model.input_shape must be {channels, height, width} for a cnn, got ",
                      config.input_shape.size(), " dimensions");
  checkPositive(config.channels, "channels");
  CHORUS_CHECK_CONFIG(config.blocks >= 0, "model.blocks must not be negative, got ", config.blocks);
  CHORUS_CHECK_CONFIG(config.groups >= 0, "model.groups must not be negative, got ", config.groups);
  CHORUS_CHECK_CONFIG(config.groups == 0 || config.channels % config.groups == 0,
                      "model.channels (", config.channels, ") must be divisible by model.groups (",
                      config.groups, ")");
}

void checkGpt(const ModelConfig& config) {
  checkPositive(config.vocab, "vocab");
  checkPositive(config.layers, "layers");
  checkPositive(config.width, "width");
  checkPositive(config.heads, "heads");
  checkPositive(config.context, "context");
  CHORUS_CHECK_CONFIG(config.width % config.heads == 0, "model.width (", config.width,
                      ") must be divisible by model.heads (", config.heads, ")");
  CHORUS_CHECK_CONFIG(config.dropout >= 0.0 && config.dropout < 1.0,
                      "model.dropout must be in [0, 1), got ", config.dropout);
}

}  // namespace

const std::vector<std::string>& modelKinds() {
  static const std::vector<std::string> kinds = {"mlp", "cnn", "gpt"};
  return kinds;
}

void validateModelConfig(const ModelConfig& config) {
  if (config.kind == "mlp")
    checkMlp(config);
  else if (config.kind == "cnn")
    checkCnn(config);
  else if (config.kind == "gpt")
    checkGpt(config);
  else
    CHORUS_THROW(ConfigError, "model.kind \"", config.kind,
                 "\" is unknown; known kinds: ", joinKinds());
}

std::shared_ptr<ZooModel> makeModel(const ModelConfig& config, std::uint64_t seed) {
  validateModelConfig(config);
  if (config.kind == "mlp") return std::make_shared<Mlp>(config, seed);
  if (config.kind == "cnn") return std::make_shared<Cnn>(config, seed);
  return std::make_shared<Gpt>(config, seed);
}

}  // namespace chorus::model
