// Private to runtime: checks the storages a libtorch pickle declares against the archive records
// that hold their bytes, before libtorch's unpickler reads the pickle (pickle_storages.cc).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace chorus::runtime {

// The size in bytes of an archive's record by its name inside the archive ("data/0"), or nullopt
// where the archive has no such record.
using RecordSizeLookup = std::function<std::optional<std::uint64_t>(const std::string& name)>;

// Whether libtorch may read the archive's record `name` as a pickle: its name ends in "pkl", in
// any case (miniz finds a record ignoring case: "data.pkl" reads "DATA.PKL").
bool isPickleRecord(const std::string& name);

// Follows `pickle`, the archive's record `record` ("data.pkl"), as libtorch's unpickler would,
// and throws CheckpointError where libtorch would go on with a storage larger than the record
// holding its bytes (`data/<key>` for "data.pkl"), or with a value that makes it read out of
// bounds. Returns where libtorch refuses the pickle itself, leaving that error to libtorch.
void checkPickleStorages(const std::string& record, std::string_view pickle,
                         const RecordSizeLookup& record_size);

}  // namespace chorus::runtime
