#include "chorus/data/dataset.h"

#include "chorus/core/error.h"
#include "chorus/core/name_table.h"

namespace chorus::data {

const char* toString(Split split) {
  static constexpr NamedValue<Split> kNames[] = {{Split::kTrain, "train"}, {Split::kTest, "test"}};
  return nameOf(kNames, split);
}

void Dataset::checkIds(const std::vector<std::int64_t>& ids) const {
  const std::int64_t n = size();
  for (const std::int64_t id : ids) {
    if (id < 0 || id >= n)
      CHORUS_THROW(ConfigError, "sample id ", id, " is out of range for dataset '", name(), "' of ",
                   n, " samples");
  }
}

}  // namespace chorus::data
