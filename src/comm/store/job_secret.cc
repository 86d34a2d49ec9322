#include "chorus/comm/store/job_secret.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "chorus/core/error.h"

namespace chorus::comm {
namespace {

constexpr std::size_t kGeneratedBytes = 32;
constexpr std::size_t kFingerprintChars = 8;

std::string trimTrailingWhitespace(std::string text) {
  std::size_t end = text.find_last_not_of(" \t\r\n\f\v");
  text.erase(end == std::string::npos ? 0 : end + 1);
  return text;
}

void checkLength(const std::string& text, const std::string& source) {
  if (text.empty()) CHORUS_THROW(ConfigError, "the job secret ", source, "is empty");
  if (text.size() < JobSecret::kMinLength) {
    CHORUS_THROW(ConfigError, "the job secret ", source, "is ", text.size(),
                 " characters long; at least ", JobSecret::kMinLength,
                 " are required (generate one with `openssl rand -hex 32`)");
  }
  if (text.size() > JobSecret::kMaxLength) {
    CHORUS_THROW(ConfigError, "the job secret ", source, "is ", text.size(),
                 " characters long; at most ", JobSecret::kMaxLength, " are accepted");
  }
}

// Reads `fd` to its end without blocking: a pipe must already hold all it will ever hold.
std::string readToEnd(int fd, const std::string& source) {
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    CHORUS_THROW(ConfigError, "cannot read the job secret from ", source, ": ",
                 std::strerror(errno));
  }
  if (!S_ISFIFO(info.st_mode) && !S_ISREG(info.st_mode)) {
    CHORUS_THROW(ConfigError, "cannot read the job secret from ", source,
                 ": it is neither a pipe nor a file");
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
  std::string text;
  char buffer[512];
  while (text.size() <= JobSecret::kMaxLength) {
    ssize_t got = ::read(fd, buffer, sizeof(buffer));
    if (got == 0) return text;
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      CHORUS_THROW(ConfigError, "cannot read the job secret from ", source, ": ",
                   errno == EAGAIN ? "its writer has not closed it" : std::strerror(errno));
    }
    text.append(buffer, static_cast<std::size_t>(got));
  }
  return text;  // too long: checkLength says so
}

// As ssh does for private keys: a secret others can read is no secret, so refuse it loudly.
void checkPermissions(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    CHORUS_THROW(ConfigError, "cannot read the job secret file ", path, ": ", std::strerror(errno));
  }
  if ((info.st_mode & 077) != 0) {
    std::ostringstream mode;
    mode << "0" << std::oct << (info.st_mode & 0777);
    CHORUS_THROW(ConfigError, "the job secret file ", path,
                 " is accessible by group or others (mode ", mode.str(), "); run `chmod 600 ", path,
                 "`");
  }
}

}  // namespace

JobSecret::~JobSecret() {
  if (!text_.empty()) OPENSSL_cleanse(text_.data(), text_.size());
}

JobSecret JobSecret::generate() { return JobSecret(toHex(randomBytes(kGeneratedBytes))); }

JobSecret JobSecret::fromText(std::string text) {
  checkLength(text, "");
  return JobSecret(std::move(text));
}

JobSecret JobSecret::fromFile(const std::string& path) {
  checkPermissions(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) CHORUS_THROW(ConfigError, "cannot open the job secret file ", path);
  std::ostringstream content;
  content << in.rdbuf();
  std::string text = trimTrailingWhitespace(content.str());
  checkLength(text, "in " + path + " ");
  return JobSecret(std::move(text));
}

JobSecret JobSecret::fromDescriptor(int fd) {
  const std::string source = "descriptor " + std::to_string(fd);
  std::string text;
  try {
    text = readToEnd(fd, source);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  JobSecret secret(trimTrailingWhitespace(std::move(text)));
  checkLength(secret.text_, "from " + source + " ");
  return secret;
}

std::string JobSecret::fingerprint() const { return sha256Hex(text_).substr(0, kFingerprintChars); }

std::vector<std::uint8_t> JobSecret::sign(const std::string& label,
                                          const std::vector<std::uint8_t>& message) const {
  std::vector<std::uint8_t> labelled(label.begin(), label.end());
  labelled.insert(labelled.end(), message.begin(), message.end());
  return hmacSha256(text_, labelled);
}

std::vector<std::uint8_t> hmacSha256(const std::string& key,
                                     const std::vector<std::uint8_t>& message) {
  std::vector<std::uint8_t> digest(kDigestBytes);
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), message.data(), message.size(),
           digest.data(), &length) == nullptr ||
      length != kDigestBytes) {
    CHORUS_THROW(CommError, "HMAC-SHA256 failed in OpenSSL");
  }
  return digest;
}

std::string sha256Hex(const std::string& data) {
  std::vector<std::uint8_t> digest(kDigestBytes);
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest.data());
  return toHex(digest);
}

std::vector<std::uint8_t> randomBytes(std::size_t count) {
  std::vector<std::uint8_t> bytes(count);
  if (RAND_bytes(bytes.data(), static_cast<int>(count)) != 1) {
    CHORUS_THROW(CommError, "OpenSSL's random generator failed (no entropy source?)");
  }
  return bytes;
}

bool constantTimeEqual(const std::vector<std::uint8_t>& a, const std::vector<std::uint8_t>& b) {
  if (a.size() != b.size()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string toHex(const std::vector<std::uint8_t>& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(bytes.size() * 2);
  for (std::uint8_t byte : bytes) {
    hex.push_back(kDigits[byte >> 4]);
    hex.push_back(kDigits[byte & 0xf]);
  }
  return hex;
}

}  // namespace chorus::comm
