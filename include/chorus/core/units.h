// Parsing and printing of byte sizes ("512MiB", "20GiB", "1K", "4096") and durations.
#pragma once

#include <cstdint>
#include <string>

namespace chorus {

// Parses a byte size: a non-negative integer or decimal followed by an optional unit. Binary units
// (KiB, MiB, GiB, TiB) are powers of 1024; the short forms K, M, G, T are also read as binary, as
// nccl-tests does; decimal units KB, MB, GB, TB are powers of 1000; "B" or no unit means bytes.
// Throws ConfigError quoting `text` when it is not a size.
std::uint64_t parseBytes(const std::string& text);

// Formats bytes with a binary unit and up to one decimal: 1536 -> "1.5 KiB", 12 -> "12 B".
std::string formatBytes(std::uint64_t bytes);

// Formats a size the nccl-tests way for benchmark tables: 1024 -> "1K", 1048576 -> "1M".
std::string formatBytesShort(std::uint64_t bytes);

}  // namespace chorus
