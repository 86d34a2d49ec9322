// Private to runtime: the zip directory of a checkpoint archive as libtorch's zip reader (miniz)
// reads it: the sizes it announces, checked before libtorch allocates them, and the names of its
// debug records (zip_records.cc).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace chorus::runtime {

// Throws CheckpointError where a record of the zip archive `archive` announces more bytes than
// its compressed bytes can inflate to. Returns where the directory is not one libtorch's zip
// reader (miniz) reads, leaving that error to libtorch.
void checkZipRecordSizes(std::string_view archive);

// The offset of the last byte of each name in the zip's central directory that libtorch takes
// for a debug record (".debug_pkl", in any case; miniz compares names so), in order. Empty where
// miniz would not read the directory.
std::vector<std::uint64_t> debugRecordNameEnds(std::string_view archive);

}  // namespace chorus::runtime
