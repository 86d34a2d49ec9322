// Reading a user's input file (a job, a cluster, a plan, a model profile) whole, with one clear
// ConfigError for every way a path can be wrong.
//
// An std::ifstream opened on a directory "succeeds" and reads nothing, so a loader built on it
// took `chorus train some/dir` for an empty job and ran the defaults; a path like /dev/zero
// never ends. Every loader of user input reads through readInputFile instead, which names the
// path and what was expected of it.
#pragma once

#include <cstdint>
#include <string>

namespace chorus {

// The largest input file a loader accepts. The biggest real inputs (a 1024-device cluster, a
// plan of it) are well under a megabyte; anything near this is not one of them.
constexpr std::uint64_t kMaxInputFileBytes = std::uint64_t{64} << 20;

// The contents of `path`. Throws ConfigError "cannot read <what> '<path>': <why>" when it does not
// exist, is a directory, cannot be opened or read, or is larger than kMaxInputFileBytes.
// `what` names the kind of file for the message ("config file", "cluster file").
std::string readInputFile(const std::string& path, const std::string& what);

}  // namespace chorus
