// An attacker on the path between a worker's store client and the job's store: a proxy that flips
// a byte, replays, reorders, injects or cuts frames. Each time the victim sees AuthError (or, for
// a cut frame, TimeoutError), and the job's state holds only what was legitimately written.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <string>

#include "chorus/comm/store/job_secret.h"
#include "chorus/comm/store/tcp_store.h"
#include "chorus/core/clock.h"
#include "chorus/core/error.h"
#include "comm/store/store_options.h"
#include "comm/store/store_wire.h"
#include "comm/store/tampering_proxy.h"

namespace chorus::comm {
namespace {

using std::chrono::milliseconds;
using testing::Direction;
using testing::TamperingProxy;

constexpr milliseconds kLong{10000};

JobSecret testSecret() { return JobSecret::fromText("0123456789abcdef-tamper-secret"); }

TcpStoreServerOptions serverOptions() { return testing::loopbackServerOptions(testSecret()); }

TcpStoreOptions clientOptions(int port) {
  TcpStoreOptions options = testing::loopbackClientOptions(port, testSecret());
  options.io_timeout = milliseconds(2000);  // bounds every failure mode below
  return options;
}

// Applies `change` to frame `index` of `direction` on the first connection only; later
// connections (the client reconnecting after the error) pass untouched.
testing::FrameRule onFrame(Direction direction, int index,
                           std::function<std::vector<Bytes>(const Bytes&)> change) {
  return [=](Direction d, int connection, int i, const Bytes& frame) {
    if (d == direction && connection == 0 && i == index) return change(frame);
    return std::vector<Bytes>{frame};
  };
}

// The byte offsets of a frame's parts (store_protocol.h): sequence 0–7, length 8–11, header tag
// 12–27, payload, frame tag (the last 32 bytes).
struct Flip {
  const char* part;
  int offset;  // from the start; negative: from the end
};

class FlippedRequestByte : public ::testing::TestWithParam<Flip> {};

TEST_P(FlippedRequestByte, IsAuthErrorAndChangesNothing) {
  TcpStoreServer server(serverOptions());
  const Flip flip = GetParam();
  TamperingProxy proxy(server.port(), onFrame(Direction::kToServer, 1, [&](Bytes frame) {
                         std::size_t at =
                             flip.offset >= 0 ? flip.offset : frame.size() + flip.offset;
                         frame.at(at) ^= 0x20;
                         return std::vector<Bytes>{frame};
                       }));
  TcpStore worker(clientOptions(proxy.port()));
  TcpStore direct(clientOptions(server.port()));
  worker.setString("k", "v1");  // frame 0 passes
  try {
    worker.setString("k", "v2");  // frame 1 is modified on the way
    FAIL() << "a modified " << flip.part << " was accepted";
  } catch (const AuthError& error) {
    EXPECT_NE(error.message().find("failed authentication"), std::string::npos) << error.message();
  }
  EXPECT_EQ(direct.getString("k", kLong), "v1");
  EXPECT_EQ(direct.numKeys(), 1);
  // The worker reconnects with fresh keys and carries on.
  worker.setString("k", "v3");
  EXPECT_EQ(direct.getString("k", kLong), "v3");
}

INSTANTIATE_TEST_SUITE_P(EveryPart, FlippedRequestByte,
                         ::testing::Values(Flip{"sequence", 7}, Flip{"length", 11},
                                           Flip{"header tag", 20}, Flip{"payload", 30},
                                           Flip{"frame tag", -1}),
                         [](const ::testing::TestParamInfo<Flip>& info) {
                           std::string name = info.param.part;
                           for (char& c : name)
                             if (c == ' ') c = '_';
                           return name;
                         });

TEST(StoreTamper, ReplayedRequestIsAuthErrorAndCountsOnce) {
  TcpStoreServer server(serverOptions());
  Bytes first;
  TamperingProxy proxy(server.port(), [&](Direction d, int connection, int i, const Bytes& frame) {
    if (d != Direction::kToServer || connection != 0) return std::vector<Bytes>{frame};
    if (i == 0) first = frame;
    if (i == 1) return std::vector<Bytes>{first};  // add n 1 again, in place of add n 5
    return std::vector<Bytes>{frame};
  });
  TcpStore worker(clientOptions(proxy.port()));
  EXPECT_EQ(worker.add("n", 1), 1);
  try {
    worker.add("n", 5);
    FAIL() << "a replayed frame was accepted";
  } catch (const AuthError& error) {
    EXPECT_NE(error.message().find("a replayed frame"), std::string::npos) << error.message();
  }
  TcpStore direct(clientOptions(server.port()));
  EXPECT_EQ(direct.add("n", 0), 1);
}

TEST(StoreTamper, FrameOfAnotherConnectionIsAuthError) {
  TcpStoreServer server(serverOptions());
  Bytes recorded;
  TamperingProxy proxy(server.port(), [&](Direction d, int connection, int i, const Bytes& frame) {
    if (d == Direction::kToServer && connection == 0 && i == 0) recorded = frame;
    // Same sequence number, but sealed under the first connection's key.
    if (d == Direction::kToServer && connection == 1 && i == 0) return std::vector<Bytes>{recorded};
    return std::vector<Bytes>{frame};
  });
  TcpStore first(clientOptions(proxy.port()));
  EXPECT_EQ(first.add("n", 1), 1);
  TcpStore second(clientOptions(proxy.port()));
  EXPECT_THROW(second.add("n", 10), AuthError);
  EXPECT_EQ(first.add("n", 0), 1);
}

TEST(StoreTamper, ReorderedRequestsAreAuthErrorAndNeitherApplies) {
  // TcpStore never has two requests in flight; a pipelining client of the same protocol does.
  TcpStoreServer server(serverOptions());
  Bytes held;
  TamperingProxy proxy(server.port(), [&](Direction d, int, int i, const Bytes& frame) {
    if (d != Direction::kToServer || i > 1) return std::vector<Bytes>{frame};
    if (i == 0) {
      held = frame;  // frame 0 is held back ...
      return std::vector<Bytes>{};
    }
    return std::vector<Bytes>{frame, held};  // ... and follows frame 1
  });
  testing::WireClient client(proxy.port(), testSecret());
  ASSERT_TRUE(client.authenticated());
  client.send(testing::setRequest("a", "1"));
  client.send(testing::setRequest("b", "2"));
  std::optional<Bytes> reply = client.receive();
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->at(0), 1);  // kAuthFailed
  EXPECT_NE(testing::replyMessage(*reply).find("frame #1"), std::string::npos);
  EXPECT_NE(testing::replyMessage(*reply).find("reordered or dropped"), std::string::npos);
  EXPECT_TRUE(client.closedByServer());
  TcpStore direct(clientOptions(server.port()));
  EXPECT_FALSE(direct.check({"a"}));
  EXPECT_FALSE(direct.check({"b"}));
  EXPECT_EQ(direct.numKeys(), 0);
}

TEST(StoreTamper, ModifiedReplyIsAuthErrorAtTheWorker) {
  TcpStoreServer server(serverOptions());
  TamperingProxy proxy(server.port(), onFrame(Direction::kToClient, 1, [](Bytes frame) {
                         frame.at(testing::kFrameHeadBytes + 2) ^= 1;  // in the value
                         return std::vector<Bytes>{frame};
                       }));
  TcpStore worker(clientOptions(proxy.port()));
  worker.setString("k", "value");
  EXPECT_THROW(worker.getString("k", kLong), AuthError);
  EXPECT_EQ(worker.getString("k", kLong), "value");  // reconnected
}

TEST(StoreTamper, ReplayedReplyIsAuthErrorNotAStaleValue) {
  TcpStoreServer server(serverOptions());
  Bytes first_reply;
  TamperingProxy proxy(server.port(), [&](Direction d, int connection, int i, const Bytes& frame) {
    if (d != Direction::kToClient || connection != 0) return std::vector<Bytes>{frame};
    if (i == 0) first_reply = frame;
    if (i == 1) return std::vector<Bytes>{first_reply};  // "1" again, in place of "2"
    return std::vector<Bytes>{frame};
  });
  TcpStore worker(clientOptions(proxy.port()));
  EXPECT_EQ(worker.add("n", 1), 1);
  try {
    std::int64_t stale = worker.add("n", 1);
    FAIL() << "believed a replayed reply: " << stale;
  } catch (const AuthError& error) {
    EXPECT_NE(error.message().find("a replayed frame"), std::string::npos) << error.message();
  }
}

TEST(StoreTamper, InjectedBytesAreAuthErrorAndChangeNothing) {
  TcpStoreServer server(serverOptions());
  TamperingProxy proxy(server.port(), onFrame(Direction::kToServer, 1, [](const Bytes& frame) {
                         Bytes garbage(64, 0x5a);
                         return std::vector<Bytes>{garbage, frame};
                       }));
  TcpStore worker(clientOptions(proxy.port()));
  worker.setString("k", "v1");
  EXPECT_THROW(worker.setString("k", "v2"), AuthError);
  TcpStore direct(clientOptions(server.port()));
  EXPECT_EQ(direct.getString("k", kLong), "v1");
}

TEST(StoreTamper, ReplyCutMidFrameIsTimeoutErrorWithinTheDeadline) {
  TcpStoreServer server(serverOptions());
  TamperingProxy proxy(server.port(), onFrame(Direction::kToClient, 1, [](const Bytes& frame) {
                         return std::vector<Bytes>{Bytes(frame.begin(), frame.begin() + 20)};
                       }));
  TcpStoreOptions options = clientOptions(proxy.port());
  options.io_timeout = milliseconds(300);
  TcpStore worker(options);
  worker.setString("k", "v1");
  Stopwatch watch;
  EXPECT_THROW(worker.setString("k", "v2"), TimeoutError);
  EXPECT_GE(watch.millis().count(), 290);
  EXPECT_LT(watch.millis().count(), 3000);
}

}  // namespace
}  // namespace chorus::comm
