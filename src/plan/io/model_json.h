// Model profiles as JSON values (the public file form is model_profile.h's parseModelJson and
// modelToJson): read at any pointer of a document, so a plan carries its memory profile inside its
// own JSON and it is parsed with the plan, once.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "chorus/plan/model_profile.h"
#include "io/json_reader.h"

namespace chorus::plan {

// The profile at JSON pointer `at` of `reader`'s document ("" for the root); repeated layers
// expanded. Throws ConfigError naming the source, line and key, or what ModelProfile::validate
// refuses.
ModelProfile readModelProfile(const JsonReader& reader, const std::string& at);

// `model` as a JSON value that readModelProfile reads back to an equal profile.
nlohmann::json modelProfileJson(const ModelProfile& model);

}  // namespace chorus::plan
