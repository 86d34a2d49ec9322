#include "chorus/plan/model_profile.h"

#include <cmath>

#include "chorus/core/error.h"

namespace chorus::plan {
namespace {

bool validFigure(double value) { return std::isfinite(value) && value >= 0; }

}  // namespace

double ModelProfile::totalParams() const {
  double total = 0;
  for (const auto& layer : layers) total += layer.params;
  return total;
}

double ModelProfile::totalForwardFlops() const {
  double total = 0;
  for (const auto& layer : layers) total += layer.forward_flops;
  return total;
}

void ModelProfile::validate() const {
  CHORUS_CHECK_CONFIG(!layers.empty(), "model '", name, "' has no layers");
  CHORUS_CHECK_CONFIG(activation_element_bytes == 1 || activation_element_bytes == 2 ||
                          activation_element_bytes == 4 || activation_element_bytes == 8,
                      "model '", name, "': activation_element_bytes must be 1, 2, 4 or 8");
  CHORUS_CHECK_CONFIG(validFigure(input_bytes) && validFigure(target_bytes), "model '", name,
                      "': input_bytes and target_bytes must be numbers >= 0");
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerProfile& layer = layers[i];
    CHORUS_CHECK_CONFIG(validFigure(layer.params) && validFigure(layer.forward_flops) &&
                            validFigure(layer.activation_bytes) &&
                            validFigure(layer.output_bytes) && validFigure(layer.workspace_bytes),
                        "model '", name, "': layer ", i, " ('", layer.name,
                        "') has a negative or non-finite figure");
  }
}

}  // namespace chorus::plan
