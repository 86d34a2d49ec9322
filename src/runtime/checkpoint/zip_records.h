// Private to runtime: checks the sizes a checkpoint archive's zip directory announces, before
// libtorch's zip reader allocates them (zip_records.cc).
#pragma once

#include <string_view>

namespace chorus::runtime {

// Throws CheckpointError where a record of the zip archive `archive` announces more bytes than
// its compressed bytes can inflate to. Returns where the directory is not one libtorch's zip
// reader (miniz) reads, leaving that error to libtorch.
void checkZipRecordSizes(std::string_view archive);

}  // namespace chorus::runtime
