// Reading one section of a Config into the fields of the struct that holds it, each key named once:
//   readSection(config, "train", {{"steps", train.steps}, {"log_every", train.log_every}});
// reads "train.steps" into train.steps, then "train.log_every" into train.log_every; a field whose
// key is absent keeps its value, which is its default. The typed read follows the field's type.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <variant>
#include <vector>

#include "chorus/core/config.h"

namespace chorus {

// A key of a section and the field it is read into (held by reference, for one readSection call).
class SectionField {
 public:
  SectionField(const char* name, std::int64_t& field) : name_(name), field_(&field) {}
  SectionField(const char* name, double& field) : name_(name), field_(&field) {}
  SectionField(const char* name, bool& field) : name_(name), field_(&field) {}
  SectionField(const char* name, std::string& field) : name_(name), field_(&field) {}
  SectionField(const char* name, std::vector<std::int64_t>& field) : name_(name), field_(&field) {}
  SectionField(const char* name, std::vector<double>& field) : name_(name), field_(&field) {}
  SectionField(const char* name, std::vector<std::string>& field) : name_(name), field_(&field) {}

  // Reads `key` (the section's name, a dot and this field's) into the field.
  void read(const Config& config, const std::string& key) const;
  const char* name() const { return name_; }

 private:
  const char* name_;
  std::variant<std::int64_t*, double*, bool*, std::string*, std::vector<std::int64_t>*,
               std::vector<double>*, std::vector<std::string>*>
      field_;
};

// Reads "<section>.<name>" of each field, in the order given (the first key of the wrong type is
// the ConfigError), marking each key as known.
void readSection(const Config& config, const std::string& section,
                 std::initializer_list<SectionField> fields);

}  // namespace chorus
