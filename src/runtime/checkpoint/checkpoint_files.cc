#include "checkpoint/checkpoint_files.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "chorus/core/error.h"
#include "chorus/core/unique_fd.h"

namespace chorus::runtime {
namespace {

[[noreturn]] void ioFailure(const char* what, const std::string& path) {
  CHORUS_THROW(CheckpointError, "cannot ", what, " '", path, "': ", std::strerror(errno));
}

}  // namespace

std::string sha256Hex(const std::string& bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), digest, &length, EVP_sha256(), nullptr) != 1)
    CHORUS_THROW(CheckpointError, "SHA-256 failed (OpenSSL)");
  static const char* const kHex = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * length);
  for (unsigned int i = 0; i < length; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 15]);
  }
  return hex;
}

void writeFileDurably(const std::string& path, const std::string& bytes) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) ioFailure("create", path);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) ioFailure("write", path);
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd.get()) != 0) ioFailure("fsync", path);
  if (fd.close() != 0) ioFailure("close", path);
}

void fsyncDirectory(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) ioFailure("open directory", path);
  if (::fsync(fd.get()) != 0) ioFailure("fsync directory", path);
}

void replaceFileAtomically(const std::string& path, const std::string& bytes) {
  const std::string temporary = path + ".tmp-" + std::to_string(::getpid());
  writeFileDurably(temporary, bytes);
  if (::rename(temporary.c_str(), path.c_str()) != 0) ioFailure("rename to", path);
  fsyncDirectory(std::filesystem::path(path).parent_path().string());
}

std::string readWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) CHORUS_THROW(CheckpointError, "cannot read '", path, "': ", std::strerror(errno));
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) CHORUS_THROW(CheckpointError, "error while reading '", path, "'");
  return contents.str();
}

}  // namespace chorus::runtime
