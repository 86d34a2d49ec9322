// The job secret: where it may come from (a mode-600 file, an inherited descriptor), what it
// refuses, and the HMAC it signs with.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "chorus/comm/store/job_secret.h"
#include "chorus/comm/store/store.h"
#include "chorus/core/error.h"

namespace chorus::comm {
namespace {

JobSecret testSecret() { return JobSecret::fromText("0123456789abcdef-test-secret"); }

class SecretFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/chorus_secret_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    ::unlink(path().c_str());
    ::rmdir(dir_.c_str());
  }
  std::string path() const { return dir_ + "/secret"; }
  void write(const std::string& content, mode_t mode) {
    std::ofstream(path()) << content;
    ASSERT_EQ(::chmod(path().c_str(), mode), 0);
  }
  std::string dir_;
};

TEST_F(SecretFileTest, Mode0600IsAcceptedAndTrailingNewlineTrimmed) {
  write("0123456789abcdef0123\n", 0600);
  EXPECT_EQ(JobSecret::fromFile(path()).text(), "0123456789abcdef0123");
}

TEST_F(SecretFileTest, Mode0644IsRejectedWithChmodAdvice) {
  write("0123456789abcdef0123\n", 0644);
  try {
    JobSecret::fromFile(path());
    FAIL() << "accepted a world-readable secret";
  } catch (const ConfigError& error) {
    EXPECT_NE(error.message().find("chmod 600"), std::string::npos) << error.message();
    EXPECT_NE(error.message().find("mode 0644"), std::string::npos) << error.message();
  }
}

TEST_F(SecretFileTest, ShortOrEmptySecretIsRejected) {
  write("short\n", 0600);
  EXPECT_THROW(JobSecret::fromFile(path()), ConfigError);
  write(" \n\n", 0600);
  EXPECT_THROW(JobSecret::fromFile(path()), ConfigError);
}

TEST(JobSecret, MissingFileIsAConfigError) {
  EXPECT_THROW(JobSecret::fromFile("/nonexistent/chorus/secret"), ConfigError);
}

TEST(JobSecret, GenerateGivesDistinct64HexCharacterSecrets) {
  JobSecret a = JobSecret::generate();
  JobSecret b = JobSecret::generate();
  EXPECT_EQ(a.text().size(), 64u);
  EXPECT_EQ(a.text().find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(a.text(), b.text());
  EXPECT_EQ(a.fingerprint().size(), 8u);
  EXPECT_EQ(a.fingerprint(), sha256Hex(a.text()).substr(0, 8));
}

TEST(JobSecret, HmacMatchesRfc4231TestCase2) {
  EXPECT_EQ(toHex(hmacSha256("Jefe", toBytes("what do ya want for nothing?"))),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(JobSecret, SignSeparatesRolesAndConstantTimeEqualComparesExactly) {
  JobSecret secret = testSecret();
  Bytes nonce(32, 1);
  EXPECT_EQ(secret.sign("client", nonce), hmacSha256(secret.text(), [&] {
              Bytes m = toBytes("client");
              m.insert(m.end(), nonce.begin(), nonce.end());
              return m;
            }()));
  EXPECT_FALSE(constantTimeEqual(secret.sign("client", nonce), secret.sign("server", nonce)));
  EXPECT_TRUE(constantTimeEqual(Bytes{1, 2}, Bytes{1, 2}));
  EXPECT_FALSE(constantTimeEqual(Bytes{1, 2}, Bytes{1, 2, 3}));
  EXPECT_EQ(sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

// A pipe holding `text` whose write end is closed, as `chorus run` hands it to a worker.
int filledPipe(const std::string& text) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  EXPECT_EQ(::write(fds[1], text.data(), text.size()), static_cast<ssize_t>(text.size()));
  ::close(fds[1]);
  return fds[0];
}

bool isOpen(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

TEST(JobSecret, FromDescriptorReadsAPipeToItsEndAndClosesIt) {
  int fd = filledPipe("0123456789abcdef0123\n");
  EXPECT_EQ(JobSecret::fromDescriptor(fd).text(), "0123456789abcdef0123");
  EXPECT_FALSE(isOpen(fd));  // no child of the worker can inherit it
}

TEST(JobSecret, FromDescriptorNeverBlocksOnAPipeStillOpenForWriting) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ASSERT_EQ(::write(fds[1], "0123456789abcdef0123", 20), 20);
  try {
    JobSecret::fromDescriptor(fds[0]);
    FAIL() << "took a secret whose writer had not finished";
  } catch (const ConfigError& error) {
    EXPECT_NE(error.message().find("has not closed it"), std::string::npos) << error.message();
  }
  EXPECT_FALSE(isOpen(fds[0]));
  ::close(fds[1]);
}

TEST(JobSecret, FromDescriptorRefusesShortOrLongSecretsAndBadDescriptors) {
  EXPECT_THROW(JobSecret::fromDescriptor(filledPipe("short")), ConfigError);
  EXPECT_THROW(JobSecret::fromDescriptor(filledPipe(std::string(JobSecret::kMaxLength + 1, 'x'))),
               ConfigError);
  EXPECT_EQ(
      JobSecret::fromDescriptor(filledPipe(std::string(JobSecret::kMaxLength, 'x'))).text().size(),
      JobSecret::kMaxLength);
  EXPECT_THROW(JobSecret::fromDescriptor(::open("/dev/null", O_RDONLY)), ConfigError);  // a device
  EXPECT_THROW(JobSecret::fromDescriptor(987654), ConfigError);                         // not open
}

TEST(JobSecret, HmacMatchesRfc4231TestCases1And6) {
  // Test case 1: key = 20 bytes of 0x0b, data = "Hi There".
  EXPECT_EQ(toHex(hmacSha256(std::string(20, '\x0b'), toBytes("Hi There"))),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  // Test case 6: a key longer than the block size (131 bytes of 0xaa).
  EXPECT_EQ(toHex(hmacSha256(std::string(131, '\xaa'),
                             toBytes("Test Using Larger Than Block-Size Key - Hash Key First"))),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

}  // namespace
}  // namespace chorus::comm
