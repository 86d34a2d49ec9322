// TcpStore and TcpStoreServer over loopback: exact results under concurrency, bounded blocking,
// and the job secret keeping out every process that lacks it.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "chorus/comm/store/job_secret.h"
#include "chorus/comm/store/tcp_store.h"
#include "chorus/core/clock.h"
#include "chorus/core/error.h"
#include "comm/store/store_options.h"
#include "comm/store/store_wire.h"

namespace chorus::comm {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kLong{10000};

JobSecret testSecret() { return JobSecret::fromText("0123456789abcdef-test-secret"); }

TcpStoreServerOptions serverOptions() { return testing::loopbackServerOptions(testSecret()); }

TcpStoreOptions clientOptions(int port, JobSecret secret = testSecret()) {
  return testing::loopbackClientOptions(port, std::move(secret));
}

TEST(TcpStore, EveryOperationRoundTrips) {
  TcpStoreServer server(serverOptions());
  TcpStore store(clientOptions(server.port()));
  store.set("bin", Bytes{0, 255, 7});
  EXPECT_EQ(store.get("bin", kLong), (Bytes{0, 255, 7}));
  EXPECT_EQ(store.add("n", 5), 5);
  EXPECT_EQ(store.add("n", -7), -2);
  EXPECT_EQ(store.getString("n", kLong), "-2");
  EXPECT_EQ(store.compareSet("c", Bytes(), toBytes("a")), toBytes("a"));
  EXPECT_EQ(store.compareSet("c", toBytes("x"), toBytes("b")), toBytes("a"));
  EXPECT_TRUE(store.check({"bin", "n", "c"}));
  EXPECT_FALSE(store.check({"bin", "absent"}));
  store.wait({"bin", "n"}, kLong);
  EXPECT_EQ(store.numKeys(), 3);
  EXPECT_TRUE(store.deleteKey("c"));
  EXPECT_FALSE(store.deleteKey("c"));
  EXPECT_EQ(store.numKeys(), 2);
  store.set("empty", Bytes());
  EXPECT_EQ(store.get("empty", kLong), Bytes());
}

TEST(TcpStore, ConcurrentAddsFromManyClientsGiveExactTotal) {
  TcpStoreServer server(serverOptions());
  constexpr int kClients = 6;
  constexpr int kAdds = 200;
  auto shared = std::make_shared<TcpStore>(clientOptions(server.port()));
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      // Half the threads own a connection, half share one (the client is thread-safe).
      std::unique_ptr<TcpStore> own;
      if (c % 2 == 0) own = std::make_unique<TcpStore>(clientOptions(server.port()));
      Store& store = own ? static_cast<Store&>(*own) : *shared;
      for (int i = 0; i < kAdds; ++i) store.add("sum", c + 1);
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(shared->add("sum", 0), kAdds * (1 + 2 + 3 + 4 + 5 + 6));
}

TEST(TcpStore, BlockingGetIsReleasedByAnotherClientsSet) {
  TcpStoreServer server(serverOptions());
  TcpStore waiter(clientOptions(server.port()));
  TcpStore setter(clientOptions(server.port()));
  std::thread thread([&] {
    std::this_thread::sleep_for(milliseconds(100));
    setter.setString("ready", "go");
  });
  Stopwatch watch;
  EXPECT_EQ(waiter.getString("ready", kLong), "go");
  thread.join();
  EXPECT_GE(watch.millis().count(), 80);
  EXPECT_LT(watch.millis().count(), 5000);
}

TEST(TcpStore, GetTimeoutIsTimeoutErrorNamingKeyAndEndpoint) {
  TcpStoreServer server(serverOptions());
  TcpStore store(clientOptions(server.port()));
  Stopwatch watch;
  try {
    store.get("never", milliseconds(200));
    FAIL() << "get returned";
  } catch (const TimeoutError& error) {
    EXPECT_NE(error.message().find("'never'"), std::string::npos) << error.message();
    EXPECT_NE(error.message().find(store.endpoint()), std::string::npos) << error.message();
  }
  EXPECT_GE(watch.millis().count(), 190);
  EXPECT_LT(watch.millis().count(), 3000);
  // The connection is still good after a timeout.
  store.setString("after", "ok");
  EXPECT_EQ(store.getString("after", kLong), "ok");
}

TEST(TcpStore, WaitTimeoutNamesOnlyTheMissingKeys) {
  TcpStoreServer server(serverOptions());
  TcpStore store(clientOptions(server.port()));
  store.setString("present", "1");
  try {
    store.wait({"present", "absent"}, milliseconds(100));
    FAIL() << "wait returned";
  } catch (const TimeoutError& error) {
    EXPECT_NE(error.message().find("waiting for 'absent'"), std::string::npos) << error.message();
    EXPECT_EQ(error.message().find("'present'"), std::string::npos) << error.message();
  }
}

TEST(TcpStore, WrongSecretIsRefusedFastWithAuthError) {
  TcpStoreServer server(serverOptions());
  JobSecret wrong = JobSecret::fromText("another-job-secret-0000");
  Stopwatch watch;
  try {
    TcpStore store(clientOptions(server.port(), wrong));
    FAIL() << "connected with the wrong secret";
  } catch (const AuthError& error) {
    EXPECT_NE(error.message().find("rejected this process's job secret (fingerprint " +
                                   wrong.fingerprint() + ")"),
              std::string::npos)
        << error.message();
  }
  EXPECT_LT(watch.millis().count(), 500);
  // The server keeps serving those who know the secret.
  TcpStore good(clientOptions(server.port()));
  EXPECT_EQ(good.add("n", 1), 1);
}

TEST(TcpStore, NonChorusListenerIsProtocolError) {
  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  socklen_t length = sizeof(address);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length);
  std::thread web([listener] {
    int fd = ::accept(listener, nullptr, nullptr);
    const char reply[] = "HTTP/1.1 400 Bad Request\r\n\r\n";
    ::send(fd, reply, sizeof(reply) - 1, MSG_NOSIGNAL);
    ::close(fd);
  });
  Stopwatch watch;
  try {
    TcpStore store(clientOptions(ntohs(address.sin_port)));
    FAIL() << "connected to a web server";
  } catch (const ProtocolError& error) {
    EXPECT_NE(error.message().find("does not speak the chorus store protocol"), std::string::npos)
        << error.message();
  }
  EXPECT_LT(watch.millis().count(), 1000);
  web.join();
  ::close(listener);
}

TEST(TcpStore, SilentListenerIsProtocolErrorAfterHandshakeTimeout) {
  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(listener, 4), 0);  // the kernel accepts; nobody ever speaks
  socklen_t length = sizeof(address);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length);
  TcpStoreOptions options = clientOptions(ntohs(address.sin_port));
  options.handshake_timeout = milliseconds(200);
  Stopwatch watch;
  EXPECT_THROW(TcpStore store(options), ProtocolError);
  EXPECT_LT(watch.millis().count(), 2000);
  ::close(listener);
}

TEST(TcpStore, GarbageAndSilentClientsDoNotDisturbAGoodClient) {
  TcpStoreServerOptions options = serverOptions();
  options.handshake_timeout = milliseconds(1500);
  TcpStoreServer server(options);
  TcpStore good(clientOptions(server.port()));
  int garbage = testing::rawConnect(server.port());
  int silent = testing::rawConnect(server.port());
  Stopwatch watch;
  testing::rawWrite(garbage, toBytes("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_EQ(good.add("n", 1), 1);
  // The garbage client is dropped at once, not at the handshake timeout: greeting, then EOF.
  EXPECT_EQ(testing::rawRead(garbage, 1000).size(), 8u + 32u);
  EXPECT_LT(watch.millis().count(), 1000);
  // The silent one is dropped at the handshake timeout.
  EXPECT_EQ(testing::rawRead(silent, 1000).size(), 8u + 32u);
  EXPECT_GE(watch.millis().count(), 1400);
  EXPECT_LT(watch.millis().count(), 4000);
  EXPECT_EQ(good.add("n", 1), 2);
  ::close(garbage);
  ::close(silent);
}

TEST(TcpStore, ServerStopReleasesABlockedGetWithCommErrorPromptly) {
  auto server = std::make_unique<TcpStoreServer>(serverOptions());
  TcpStore store(clientOptions(server->port()));
  std::thread stopper([&] {
    std::this_thread::sleep_for(milliseconds(100));
    server->stop();
  });
  Stopwatch watch;
  try {
    store.get("never", milliseconds(30000));
    FAIL() << "get returned";
  } catch (const TimeoutError& error) {
    FAIL() << "expected a lost connection, got a timeout: " << error.message();
  } catch (const CommError& error) {
    EXPECT_NE(error.message().find(store.endpoint()), std::string::npos) << error.message();
  }
  EXPECT_LT(watch.millis().count(), 2000);
  stopper.join();
}

// A job's last message: node 1 sets "done", which wakes node 0's wait, and node 0 then stops the
// server at once. The set was applied, so its reply must reach node 1 and not a cut connection
// (a CI failure: node 1 exited with "lost the connection to the store"). The window is a few
// microseconds: over loopback this test did not catch the old stop() in 500 rounds, while the
// two-host test (runtime/launch/multihost_multiproc_test.cc) failed in 1 of 15 to 64 runs; it
// guards the property, and the two-host test is where a regression shows.
TEST(TcpStore, ASetThatWakesTheServersOwnerIsStillAnswered) {
  constexpr int kRounds = 100;
  for (int round = 0; round < kRounds; ++round) {
    auto server = std::make_unique<TcpStoreServer>(serverOptions());
    TcpStore owner(clientOptions(server->port()));
    TcpStore last(clientOptions(server->port()));
    std::thread stopper([&] {
      owner.wait({"done"}, milliseconds(10000));
      server->stop();
    });
    try {
      last.setString("done", "1");
    } catch (const Error& error) {
      ADD_FAILURE() << "round " << round << ": " << error.message();
    }
    stopper.join();
    if (HasFailure()) return;
  }
}

TEST(TcpStore, ConnectRetriesUntilTheServerListens) {
  int port = 0;
  {
    TcpStoreServer probe(serverOptions());  // finds a free port
    port = probe.port();
  }
  std::unique_ptr<TcpStoreServer> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(milliseconds(300));
    TcpStoreServerOptions options = serverOptions();
    options.port = port;
    server = std::make_unique<TcpStoreServer>(options);
  });
  TcpStore store(clientOptions(port));
  starter.join();
  EXPECT_EQ(store.add("n", 4), 4);
}

TEST(TcpStore, NobodyListeningIsTimeoutErrorAfterConnectTimeout) {
  int port = 0;
  {
    TcpStoreServer probe(serverOptions());
    port = probe.port();
  }
  TcpStoreOptions options = clientOptions(port);
  options.connect_timeout = milliseconds(300);
  Stopwatch watch;
  EXPECT_THROW(TcpStore store(options), TimeoutError);
  EXPECT_GE(watch.millis().count(), 290);
  EXPECT_LT(watch.millis().count(), 3000);
}

TEST(TcpStore, EmptySecretIsAConfigError) {
  TcpStoreServerOptions options;
  EXPECT_THROW(TcpStoreServer server(options), ConfigError);
}

}  // namespace
}  // namespace chorus::comm
