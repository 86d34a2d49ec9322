// What every fuzz target shares: the rule that decides a finding, and scratch files.
//
// A chorus parser given any bytes must either return or throw a chorus::Error (docs/errors.md).
// guarded() runs one input under that rule: a chorus::Error is the expected answer to bad input
// and is swallowed; any other exception escapes, and libFuzzer reports the uncaught exception as a
// crash (with the input that caused it). Crashes, leaks (LeakSanitizer), undefined behaviour
// (UBSan, built to abort) and timeouts (-timeout) are findings as libFuzzer defines them.
//
// Readers that take a path get the input through a scratch directory of this process
// (scratchDir(), under $TMPDIR), written afresh for each input.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "chorus/core/error.h"
#include "chorus/core/logging.h"

namespace chorus::fuzz {

// Runs `parse` on one input; a chorus::Error is a valid outcome, anything else escapes.
template <typename Parse>
void guarded(Parse&& parse) {
  try {
    parse();
  } catch (const chorus::Error&) {
  }
}

// The input as text (a parser's view of a file's bytes).
inline std::string asText(const std::uint8_t* data, std::size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// Turns chorus's log lines off: warnings about bad input would flood the fuzzer's output.
inline void quietLogs() { Logger::instance().setLevel(LogLevel::kOff); }

// A directory of this process's own, created on first use and reused by every input.
inline const std::filesystem::path& scratchDir() {
  static const std::filesystem::path dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::filesystem::path path = std::filesystem::path(tmp != nullptr ? tmp : "/tmp") /
                                 ("chorus_fuzz_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
    return path;
  }();
  return dir;
}

// Writes `bytes` to `name` in scratchDir() and returns its path.
inline std::string writeScratch(const std::string& name, const std::string& bytes) {
  const std::filesystem::path path = scratchDir() / name;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  return path.string();
}

// Splits an input into parts at a separator line, so one input can hold several files.
// kSeparator is unlikely in text and easy for the fuzzer to learn (it appears in the seeds).
constexpr char kSeparator[] = "\n#--8<--\n";

inline std::string part(const std::string& text, int index) {
  std::size_t begin = 0;
  for (int i = 0; i < index; ++i) {
    std::size_t found = text.find(kSeparator, begin);
    if (found == std::string::npos) return std::string();
    begin = found + sizeof(kSeparator) - 1;
  }
  std::size_t end = text.find(kSeparator, begin);
  return text.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

}  // namespace chorus::fuzz
