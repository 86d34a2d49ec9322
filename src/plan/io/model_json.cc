#include "io/model_json.h"

#include "chorus/core/input_file.h"

namespace chorus::plan {
namespace {

constexpr long long kMaxRepeat = 100000;

}  // namespace

ModelProfile readModelProfile(const JsonReader& reader, const std::string& root) {
  reader.object(root,
                {"name", "activation_element_bytes", "input_bytes", "target_bytes", "layers"});
  ModelProfile model;
  model.name = reader.text(root + "/name", "");
  if (model.name.empty()) reader.fail(root, "missing key 'name'");
  model.activation_element_bytes =
      static_cast<int>(reader.integer(root + "/activation_element_bytes", 2, 1, 8));
  model.input_bytes = reader.number(root + "/input_bytes", 0, 0);
  model.target_bytes = reader.number(root + "/target_bytes", 0, 0);
  const int element = model.activation_element_bytes;
  if (element != 1 && element != 2 && element != 4 && element != 8)
    reader.fail(root + "/activation_element_bytes", "must be 1, 2, 4 or 8");
  const nlohmann::json& layers = reader.array(root + "/layers");
  if (layers.empty()) reader.fail(root + "/layers", "a model needs at least one layer");
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string at = root + "/layers/" + std::to_string(i);
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

nlohmann::json modelProfileJson(const ModelProfile& model) {
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
  return json;
}

ModelProfile parseModelJson(const std::string& text, const std::string& source) {
  return readModelProfile(JsonReader(text, source), "");
}

ModelProfile loadModelFile(const std::string& path) {
  return parseModelJson(readInputFile(path, "model profile"), path);
}

std::string modelToJson(const ModelProfile& model) { return modelProfileJson(model).dump(2); }

}  // namespace chorus::plan
