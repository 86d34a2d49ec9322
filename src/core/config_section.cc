#include "chorus/core/config_section.h"

namespace chorus {
namespace {

// Config's typed read for each field type.
void readInto(const Config& config, const std::string& key, std::int64_t& field) {
  field = config.getInt(key, field);
}
void readInto(const Config& config, const std::string& key, double& field) {
  field = config.getDouble(key, field);
}
void readInto(const Config& config, const std::string& key, bool& field) {
  field = config.getBool(key, field);
}
void readInto(const Config& config, const std::string& key, std::string& field) {
  field = config.getString(key, field);
}
void readInto(const Config& config, const std::string& key, std::vector<std::int64_t>& field) {
  field = config.getInts(key, field);
}
void readInto(const Config& config, const std::string& key, std::vector<double>& field) {
  field = config.getDoubles(key, field);
}
void readInto(const Config& config, const std::string& key, std::vector<std::string>& field) {
  field = config.getStrings(key, field);
}

}  // namespace

void SectionField::read(const Config& config, const std::string& key) const {
  std::visit([&](auto* field) { readInto(config, key, *field); }, field_);
}

void readSection(const Config& config, const std::string& section,
                 std::initializer_list<SectionField> fields) {
  for (const SectionField& field : fields) field.read(config, section + "." + field.name());
}

}  // namespace chorus
