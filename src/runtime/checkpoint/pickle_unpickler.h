// Private to runtime (checkpoint/pickle_storages.cc): what libtorch's unpickler
// (torch::jit::Unpickler, torch 2.x, the one chorus links) reads: the opcodes its readInstruction
// takes, and what its readGlobal does with the (module, name) of a GLOBAL.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace chorus::runtime::pickle {

// The opcodes libtorch's readInstruction reads; it refuses every other (PROTO only comes first).
enum Opcode : std::uint8_t {
  kMark = '(',
  kEmptyTuple = ')',
  kStop = '.',
  kBinFloat = 'G',
  kBinInt = 'J',
  kBinInt1 = 'K',
  kBinInt2 = 'M',
  kNone = 'N',
  kBinPersId = 'Q',
  kReduce = 'R',
  kBinUnicode = 'X',
  kEmptyList = ']',
  kAppend = 'a',
  kBuild = 'b',
  kGlobal = 'c',
  kDict = 'd',
  kAppends = 'e',
  kBinGet = 'h',
  kLongBinGet = 'j',
  kList = 'l',
  kBinPut = 'q',
  kLongBinPut = 'r',
  kSetItem = 's',
  kTuple = 't',
  kSetItems = 'u',
  kEmptyDict = '}',
  kProto = 0x80,
  kNewObj = 0x81,
  kTuple1 = 0x85,
  kTuple2 = 0x86,
  kTuple3 = 0x87,
  kNewTrue = 0x88,
  kNewFalse = 0x89,
  kLong1 = 0x8a,
  kBinUnicode8 = 0x8d,
};

// What readGlobal does with a GLOBAL (after its skip, below).
enum class GlobalEffect : std::uint8_t {
  kRefused,     // libtorch throws: an unknown name in a module it resolves itself
  kPushesInt,   // a storage type or QScheme: an int, no entry in the table
  kRegisters,   // an entry in the table of globals; pushes its index
  kFromTypeV2,  // the same, and the next two GLOBALs are skipped (see PickleModel::global)
};

// What readGlobal does with GLOBAL `module` `name`.
GlobalEffect globalEffect(std::string_view module, std::string_view name);
// The scalar type a storage global ('torch' '<Name>Storage') pushes, if `name` is one.
std::optional<std::int64_t> storageScalarType(std::string_view name);
// The QScheme a global ('torch' 'per_tensor_affine', ...) pushes, if `name` is one.
std::optional<std::int64_t> qscheme(std::string_view name);
// The element size of scalar type `scalar_type` as scalarTypeToTypeMeta(type).itemsize() has it,
// if it is a storage's.
std::optional<std::size_t> elementSize(std::int64_t scalar_type);

}  // namespace chorus::runtime::pickle
