#include "chorus/model/zoo_model.h"

#include <cstdio>

#include "chorus/core/error.h"

namespace chorus::model {

std::int64_t ZooModel::parameterCount() const {
  std::int64_t count = 0;
  for (const at::Tensor& parameter : parameters(/*recurse=*/true))
    if (parameter.requires_grad()) count += parameter.numel();
  return count;
}

std::vector<at::Tensor> ZooModel::layerParameters(std::int64_t layer) const {
  const auto layers = children();
  CHORUS_CHECK_CONFIG(static_cast<std::int64_t>(layers.size()) == numLayers(), "model ", describe(),
                      " has ", layers.size(), " child modules for ", numLayers(), " layers");
  checkRange(layer, layer + 1);
  return layers[static_cast<size_t>(layer)]->parameters(/*recurse=*/true);
}

void ZooModel::checkRange(std::int64_t first, std::int64_t last) const {
  const std::int64_t layers = numLayers();
  if (first < 0 || first > last || last > layers)
    CHORUS_THROW(ConfigError, "layer range [", first, ", ", last,
                 ") is not within the model's layers [0, ", layers, ")");
}

std::string ZooModel::formatCount(std::int64_t count) {
  char text[32];
  if (count >= 1000000000)
    std::snprintf(text, sizeof(text), "%.1f G", static_cast<double>(count) / 1e9);
  else if (count >= 1000000)
    std::snprintf(text, sizeof(text), "%.1f M", static_cast<double>(count) / 1e6);
  else if (count >= 1000)
    std::snprintf(text, sizeof(text), "%.1f k", static_cast<double>(count) / 1e3);
  else
    std::snprintf(text, sizeof(text), "%lld", static_cast<long long>(count));
  return text;
}

}  // namespace chorus::model
