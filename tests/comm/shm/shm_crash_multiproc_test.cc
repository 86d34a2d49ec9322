// A peer process killed in the middle of shared-memory all-reduces: the survivor gets a
// PeerFailure naming it (not a hang until the deadline), the segment's name is gone from
// /dev/shm, and the survivor's thread holds no mutex of the segment once it is unmapped. The peer
// is this test binary itself, started again with a filter that selects the Child test and the
// store's address in its environment.
#include <ATen/ATen.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "chorus/comm/communicator.h"
#include "chorus/comm/store/job_secret.h"
#include "chorus/comm/store/tcp_store.h"
#include "chorus/core/error.h"
#include "comm/self_process.h"

namespace chorus::comm {
namespace {

constexpr const char* kChildVariable = "CHORUS_SHM_CRASH_CHILD";
constexpr const char* kGroup = "shmcrash";
constexpr int kOps = 40;
constexpr int kChildDiesAt = 3;
constexpr int64_t kNumel = 4 << 20;  // 16 MiB of float32: 16 chunks per operation

CommOptions options() {
  CommOptions options;
  options.name = kGroup;
  options.cpu_transport = "shm";
  // Far beyond the test's expected run time: only the death itself can end the wait early.
  options.timeout = std::chrono::milliseconds(300000);
  return options;
}

std::shared_ptr<Communicator> join(int port, const std::string& secret, int rank) {
  TcpStoreOptions client;
  client.port = port;
  client.secret = JobSecret::fromText(secret);
  return Communicator::create(std::make_shared<TcpStore>(client), rank, 2, options());
}

bool segmentNameLeft() {
  DIR* dir = opendir("/dev/shm");
  if (!dir) return false;
  bool found = false;
  while (dirent* entry = readdir(dir))
    if (std::string(entry->d_name).rfind(std::string("chorus.") + kGroup + ".", 0) == 0)
      found = true;
  closedir(dir);
  return found;
}

// Whether the calling thread holds a robust mutex: glibc keeps those on the thread's robust list,
// whose head (registered with the kernel) points to itself when the list is empty.
bool holdsRobustMutex() {
  robust_list_head* head = nullptr;
  size_t length = 0;
  EXPECT_EQ(::syscall(SYS_get_robust_list, 0, &head, &length), 0);
  return head != nullptr && head->list.next != &head->list;
}

pid_t startChild(int port, const std::string& secret) {
  return testing::startSelf(kChildVariable, std::to_string(port) + " " + secret,
                            "ShmCrashMultiproc.Child");
}

TEST(ShmCrashMultiproc, KilledPeerIsAPeerFailureNotAHang) {
  if (std::getenv(kChildVariable)) GTEST_SKIP() << "this process is the child";
  const JobSecret secret = JobSecret::generate();
  TcpStoreServerOptions server_options;
  server_options.host = "127.0.0.1";
  server_options.secret = secret;
  TcpStoreServer server(server_options);
  const pid_t child = startChild(server.port(), secret.text());
  ASSERT_GT(child, 0);
  auto comm = join(server.port(), secret.text(), 0);
  ASSERT_STREQ(comm->cpuTransport(), "shm");
  EXPECT_FALSE(segmentNameLeft()) << "the segment must be unlinked once both ranks mapped it";
  int failed_at = -1;
  for (int op = 0; op < kOps && failed_at < 0; ++op) {
    at::Tensor t = at::full({kNumel}, 1.0f);
    try {
      comm->allReduce(t).wait();
      EXPECT_TRUE(at::equal(t, at::full({kNumel}, 2.0f))) << "operation " << op;
    } catch (const PeerFailure& error) {
      failed_at = op;
      EXPECT_EQ(error.ranks(), std::vector<int>{1}) << error.message();
    }
  }
  EXPECT_GE(failed_at, kChildDiesAt) << "the peer's death was not detected";
  // The waiter took the dead peer's robust mutex (EOWNERDEAD) to be sure of the death, and must
  // have let it go: one left on this thread's robust list would point into the unmapped segment,
  // and glibc writes through that list when the thread takes its next robust mutex (a crash under
  // ASan in elastic recovery, which builds the next group on the same thread; silent corruption
  // where the address was mapped again). This thread usually ran the operation itself
  // (ShmWorkQueue), so without the release this fails on almost every run.
  comm.reset();
  EXPECT_FALSE(holdsRobustMutex()) << "a mutex of the unmapped segment is still held";
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "child status " << status;
}

// The peer: completes kChildDiesAt all-reduces, then dies by SIGKILL while issuing the next.
TEST(ShmCrashMultiproc, Child) {
  const char* spec = std::getenv(kChildVariable);
  if (!spec) GTEST_SKIP() << "runs only as the peer process of KilledPeerIsAPeerFailureNotAHang";
  std::istringstream fields(spec);
  int port = 0;
  std::string secret;
  fields >> port >> secret;
  auto comm = join(port, secret, 1);
  for (int op = 0; op < kChildDiesAt; ++op) {
    at::Tensor t = at::full({kNumel}, 1.0f);
    comm->allReduce(t).wait();
  }
  at::Tensor t = at::full({kNumel}, 1.0f);
  Work work = comm->allReduce(t);
  std::this_thread::sleep_for(std::chrono::milliseconds(1));
  raise(SIGKILL);
}

}  // namespace
}  // namespace chorus::comm
