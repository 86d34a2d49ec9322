#include "chorus/plan/model_profile.h"

#include <gtest/gtest.h>

#include "chorus/core/error.h"
#include "chorus/plan/transformer_shapes.h"

namespace chorus::plan {
namespace {

std::string errorOf(const std::string& text) {
  try {
    parseModelJson(text, "model.json");
  } catch (const ConfigError& error) {
    return error.message();
  }
  return "";
}

TEST(TransformerShapes, ParameterCountsMatchThePapers) {
  // Embedding and head counted separately (the head as Megatron's last-stage copy), so the totals
  // exceed the papers' by the vocabulary matrix (0.1-0.6 B).
  const struct {
    const char* name;
    double billions;
    double tolerance;
  } expected[] = {{"gpt3-1.3b", 1.3, 0.12},  {"gpt3-2.7b", 2.7, 0.1},    {"gpt3-6.7b", 6.7, 0.05},
                  {"gpt3-13b", 13.0, 0.05},  {"gpt3-175b", 175.0, 0.02}, {"llama-7b", 6.7, 0.03},
                  {"llama-13b", 13.0, 0.03}, {"llama-70b", 69.0, 0.02}};
  for (const auto& e : expected) {
    const ModelProfile model = resolveModel(e.name);
    EXPECT_NEAR(model.totalParams() / 1e9, e.billions, e.tolerance * e.billions) << e.name;
  }
}

TEST(TransformerShapes, BlockFiguresFollowMegatronAndKorthikanti) {
  const ModelProfile model = resolveModel("gpt3-175b");
  ASSERT_EQ(model.layerCount(), 96 + 2);
  const LayerProfile& block = model.layers[1];
  const double s = 2048, h = 12288, a = 96;
  EXPECT_DOUBLE_EQ(block.params, 12 * h * h + 13 * h);
  EXPECT_DOUBLE_EQ(block.forward_flops, 24 * s * h * h + 4 * s * s * h);
  EXPECT_DOUBLE_EQ(block.activation_bytes, s * h * (34 + 5 * a * s / h));
  EXPECT_DOUBLE_EQ(block.output_bytes, 2 * s * h);
  EXPECT_EQ(model.activation_element_bytes, 2);
  // GQA: LLaMA-70B's key/value projections are 8/64 of the query's.
  const ModelProfile llama_70b = resolveModel("llama-70b");
  const LayerProfile& llama = llama_70b.layers[1];
  EXPECT_DOUBLE_EQ(llama.params,
                   2 * 8192.0 * 8192 + 2 * 8192.0 * 1024 + 3 * 8192.0 * 28672 + 2 * 8192);
}

TEST(TransformerShapes, UnknownNamesListTheKnownOnes) {
  try {
    resolveModel("gpt5");
    FAIL();
  } catch (const ConfigError& error) {
    EXPECT_NE(error.message().find("gpt3-1.3b, gpt3-2.7b"), std::string::npos) << error.message();
  }
}

TEST(ModelJson, ParsesRepeatsAndRoundTrips) {
  const ModelProfile model = parseModelJson(R"({
    "name": "mlp", "activation_element_bytes": 4,
    "layers": [
      {"name": "in", "params": 100, "forward_flops": 2e3, "activation_bytes": 64, "output_bytes": 32},
      {"name": "hidden", "repeat": 3, "params": 50, "forward_flops": 1e3, "activation_bytes": 32,
       "output_bytes": 32}
    ]})",
                                            "mlp.json");
  ASSERT_EQ(model.layerCount(), 4);
  EXPECT_EQ(model.layers[3].name, "hidden.2");
  EXPECT_DOUBLE_EQ(model.totalParams(), 250);
  EXPECT_DOUBLE_EQ(model.totalForwardFlops(), 5e3);
  EXPECT_EQ(model.activation_element_bytes, 4);
  const ModelProfile again = parseModelJson(modelToJson(model), "again.json");
  ASSERT_EQ(again.layerCount(), 4);
  EXPECT_EQ(again.layers[2].name, "hidden.1");
  EXPECT_DOUBLE_EQ(again.layers[2].activation_bytes, 32);
}

TEST(ModelJson, ErrorsNameTheFileTheLineAndTheKey) {
  EXPECT_EQ(errorOf("{\"name\": \"m\",\n \"layers\": [\n  {\"params\": 1, \"forward_flops\": 1,\n"
                    "   \"activation_bytes\": -5, \"output_bytes\": 1}]}"),
            "model.json:4: layers[0].activation_bytes: must be a number >= 0");
  EXPECT_EQ(errorOf("{\"name\": \"m\",\n \"layers\": [\n  {\"params\": 1, \"forward_flops\": 1,\n"
                    "   \"activation_bytes\": 1}]}"),
            "model.json:3: layers[0]: missing key 'output_bytes'");
  EXPECT_EQ(errorOf("{\"name\": \"m\", \"layer\": []}"),
            "model.json:1: layer: unknown key 'layer'; known: name, activation_element_bytes, "
            "input_bytes, target_bytes, layers");
  EXPECT_EQ(errorOf("{\"name\": \"m\",\n\"layers\": []}"),
            "model.json:2: layers: a model needs at least one layer");
  EXPECT_EQ(errorOf("{\"name\": \"m\",\n\"layers\": [}").substr(0, 29),
            "model.json:2: malformed JSON ");
  EXPECT_EQ(
      errorOf("{\"name\": \"m\", \"activation_element_bytes\": 3, \"layers\": [{\"params\": 1, "
              "\"forward_flops\": 1, \"activation_bytes\": 1, \"output_bytes\": 1}]}"),
      "model.json:1: activation_element_bytes: must be 1, 2, 4 or 8");
  EXPECT_THROW(loadModelFile("/nonexistent/model.json"), ConfigError);
}

}  // namespace
}  // namespace chorus::plan
