#include "chorus/plan/model_profile.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "chorus/core/error.h"
#include "chorus/core/input_file.h"
#include "io/json_reader.h"

namespace chorus::plan {
namespace {

constexpr long long kMaxRepeat = 100000;

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

ModelProfile parseModelJson(const std::string& text, const std::string& source) {
  const JsonReader reader(text, source);
  reader.object("", {"name", "activation_element_bytes", "input_bytes", "target_bytes", "layers"});
  ModelProfile model;
  model.name = reader.text("/name", "");
  if (model.name.empty()) reader.fail("", "missing key 'name'");
  model.activation_element_bytes =
      static_cast<int>(reader.integer("/activation_element_bytes", 2, 1, 8));
  model.input_bytes = reader.number("/input_bytes", 0, 0);
  model.target_bytes = reader.number("/target_bytes", 0, 0);
  const int element = model.activation_element_bytes;
  if (element != 1 && element != 2 && element != 4 && element != 8)
    reader.fail("/activation_element_bytes", "must be 1, 2, 4 or 8");
  const nlohmann::json& layers = reader.array("/layers");
  if (layers.empty()) reader.fail("/layers", "a model needs at least one layer");
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string at = "/layers/" + std::to_string(i);
    reader.object(at, {"name", "repeat", "params", "forward_flops", "activation_bytes",
                       "output_bytes", "workspace_bytes"});
    for (const char* key : {"params", "forward_flops", "activation_bytes", "output_bytes"})
      reader.require(at + "/" + key);
    LayerProfile layer;
    layer.name = reader.text(at + "/name", "layer" + std::to_string(i));
    layer.params = reader.number(at + "/params", 0, 0);
    layer.forward_flops = reader.number(at + "/forward_flops", 0, 0);
    layer.activation_bytes = reader.number(at + "/activation_bytes", 0, 0);
    layer.output_bytes = reader.number(at + "/output_bytes", 0, 0);
    layer.workspace_bytes = reader.number(at + "/workspace_bytes", 0, 0);
    const long long repeat = reader.integer(at + "/repeat", 1, 1, kMaxRepeat);
    for (long long r = 0; r < repeat; ++r) {
      model.layers.push_back(layer);
      if (repeat > 1) model.layers.back().name += "." + std::to_string(r);
    }
  }
  model.validate();
  return model;
}

ModelProfile loadModelFile(const std::string& path) {
  return parseModelJson(readInputFile(path, "model profile"), path);
}

std::string modelToJson(const ModelProfile& model) {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& layer : model.layers) {
    nlohmann::json entry = {{"name", layer.name},
                            {"params", layer.params},
                            {"forward_flops", layer.forward_flops},
                            {"activation_bytes", layer.activation_bytes},
                            {"output_bytes", layer.output_bytes}};
    // Only calibrated profiles have it; the others keep their JSON form.
    if (layer.workspace_bytes > 0) entry["workspace_bytes"] = layer.workspace_bytes;
    layers.push_back(std::move(entry));
  }
  nlohmann::json json{{"name", model.name},
                      {"activation_element_bytes", model.activation_element_bytes}};
  if (model.input_bytes > 0) json["input_bytes"] = model.input_bytes;
  if (model.target_bytes > 0) json["target_bytes"] = model.target_bytes;
  json["layers"] = layers;
  return json.dump(2);
}

}  // namespace chorus::plan
