#include "checkpoint/pickle_unpickler.h"

#include <c10/core/QScheme.h>
#include <c10/core/ScalarType.h>

#include <algorithm>
#include <initializer_list>
#include <string_view>
#include <vector>

namespace chorus::runtime::pickle {
namespace {

// The storage globals libtorch's readGlobal knows ('torch' '<Name>Storage'): the scalar type
// each pushes, and its element size as scalarTypeToTypeMeta(type).itemsize() has it.
struct StorageType {
  std::string_view name;
  std::int64_t scalar_type;
  std::size_t element_size;
};

const std::vector<StorageType>& storageTypes() {
  static const std::vector<StorageType> types = {
#define CHORUS_STORAGE_TYPE(ctype, name) \
  {#name "Storage", static_cast<std::int64_t>(c10::ScalarType::name), sizeof(ctype)},
      AT_FORALL_SCALAR_TYPES_WITH_COMPLEX_AND_QINTS(CHORUS_STORAGE_TYPE)
#undef CHORUS_STORAGE_TYPE
  };
  return types;
}

}  // namespace

std::optional<std::int64_t> storageScalarType(std::string_view name) {
  for (const StorageType& type : storageTypes())
    if (type.name == name) return type.scalar_type;
  return std::nullopt;
}

std::optional<std::size_t> elementSize(std::int64_t scalar_type) {
  for (const StorageType& type : storageTypes())
    if (type.scalar_type == scalar_type) return type.element_size;
  return std::nullopt;
}

// The QScheme globals ('torch' 'per_tensor_affine', ...): each pushes its value.
std::optional<std::int64_t> qscheme(std::string_view name) {
  for (int scheme = 0; scheme < c10::COMPILE_TIME_NUM_QSCHEMES; ++scheme)
    if (c10::toString(static_cast<c10::QScheme>(scheme)) == name) return scheme;
  return std::nullopt;
}

namespace {

bool isOneOf(std::string_view name, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

GlobalEffect globalEffect(std::string_view module, std::string_view name) {
  if (module == "__main__") {
    return isOneOf(name, {"TensorID", "IntList"}) ? GlobalEffect::kRegisters
                                                  : GlobalEffect::kRefused;
  }
  if (module == "torch.jit._pickle") {
    return isOneOf(name, {"build_tensor_from_id", "restore_type_tag", "build_intlist",
                          "build_tensorlist", "build_doublelist", "build_boollist"})
               ? GlobalEffect::kRegisters
               : GlobalEffect::kRefused;
  }
  if (module == "torch._tensor" && name == "_rebuild_from_type_v2")
    return GlobalEffect::kFromTypeV2;
  if (module == "torch" && name != "device") {
    return storageScalarType(name) || qscheme(name) ? GlobalEffect::kPushesInt
                                                    : GlobalEffect::kRefused;
  }
  // torch._utils' rebuild functions, torch.device, builtins.complex, collections.OrderedDict,
  // and every other name: a class or enum of the archive's code, or one its resolver refuses.
  return GlobalEffect::kRegisters;
}

}  // namespace chorus::runtime::pickle
