// Private to runtime: durable file primitives for checkpoints (fsync, atomic replace, SHA-256).
#pragma once

#include <string>

namespace chorus::runtime {

// Lowercase hex SHA-256 of `bytes`.
std::string sha256Hex(const std::string& bytes);
// Creates (or truncates) `path`, writes `bytes` and fsyncs the file. Throws CheckpointError.
void writeFileDurably(const std::string& path, const std::string& bytes);
// fsyncs a directory, so that the names created or renamed in it survive a crash.
void fsyncDirectory(const std::string& path);
// Replaces `path` atomically with `bytes`: a temporary file beside it, fsync, rename, fsync of the
// directory. Readers see the old or the new contents, never a mix.
void replaceFileAtomically(const std::string& path, const std::string& bytes);
// The whole file; throws CheckpointError naming it when it cannot be read.
std::string readWholeFile(const std::string& path);

}  // namespace chorus::runtime
