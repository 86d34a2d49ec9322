// Catalogs of entries that carry a `name` (device types, link types, model shapes): lookup by
// name ignoring case, and the names listed for a message.
#pragma once

#include <string>
#include <vector>

#include "chorus/core/text.h"

namespace chorus {

// The entry of `catalog` named `name` (ignoring case), or null.
template <typename Entry>
const Entry* findNamed(const std::vector<Entry>& catalog, const std::string& name) {
  for (const Entry& entry : catalog)
    if (equalsIgnoringCase(entry.name, name)) return &entry;
  return nullptr;
}

// The names of `catalog` in order, comma-separated: "V100-16, V100-32, ...".
template <typename Entry>
std::string catalogNames(const std::vector<Entry>& catalog) {
  std::string text;
  for (const Entry& entry : catalog) text += (text.empty() ? "" : ", ") + entry.name;
  return text;
}

}  // namespace chorus
