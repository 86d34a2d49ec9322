// What EtcdStore adds to the store contract (store_contract_test.cc runs that against it): the
// job's key prefix, its endpoint list, and how it fails when etcd is out of reach or refuses a
// request. Each test that needs etcd starts its own (etcd_process.h).
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "chorus/comm/store/etcd_store.h"
#include "chorus/core/clock.h"
#include "chorus/core/error.h"
#include "comm/store/etcd_process.h"

namespace chorus::comm {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kLong{10000};

TEST(EtcdStore, JobsWithDifferentPrefixesNeitherSeeNorCountNorDeleteEachOthersKeys) {
  CHORUS_REQUIRE_ETCD();
  testing::EtcdProcess etcd;
  EtcdStore one(etcd.options("/chorus/one/"));
  EtcdStore two(etcd.options("/chorus/two/"));
  // A prefix that one's is a prefix of, as a string: still another job.
  EtcdStore longer(etcd.options("/chorus/one/x/"));
  one.setString("a", "1");
  one.setString("b", "2");
  two.setString("a", "other");
  longer.setString("a", "nested");
  EXPECT_EQ(one.getString("a", kLong), "1");
  EXPECT_EQ(two.getString("a", kLong), "other");
  EXPECT_FALSE(two.check({"b"}));
  EXPECT_EQ(two.numKeys(), 1);
  EXPECT_EQ(longer.numKeys(), 1);
  // one's prefix covers longer's keys (they are under it): the job prefix must end in '/', as
  // etcdJobPrefix's does, and jobs are never nested.
  EXPECT_EQ(one.numKeys(), 3);
  EXPECT_EQ(two.deleteAll(), 1);
  EXPECT_EQ(two.numKeys(), 0);
  EXPECT_EQ(one.getString("b", kLong), "2");
}

TEST(EtcdStore, TheJobPrefixIsTheSecretsOwnAndRevealsNothingOfIt) {
  const JobSecret secret = JobSecret::fromText("0123456789abcdef-the-job-secret");
  const std::string prefix = etcdJobPrefix(secret);
  EXPECT_EQ(prefix, etcdJobPrefix(JobSecret::fromText("0123456789abcdef-the-job-secret")));
  EXPECT_NE(prefix, etcdJobPrefix(JobSecret::generate()));
  EXPECT_EQ(prefix.rfind("/chorus/", 0), 0u) << prefix;
  EXPECT_EQ(prefix.size(), std::string("/chorus/").size() + 16 + 1) << prefix;
  EXPECT_EQ(prefix.back(), '/');
  EXPECT_EQ(prefix.find("0123456789abcdef"), std::string::npos);
  EXPECT_THROW(etcdJobPrefix(JobSecret()), ConfigError);
}

TEST(EtcdStore, EndpointListsAreParsedAndMalformedOnesAreConfigErrors) {
  EXPECT_EQ(parseEtcdEndpoints("10.0.0.5:2379"), (std::vector<std::string>{"10.0.0.5:2379"}));
  EXPECT_EQ(parseEtcdEndpoints("a:1,b:2,[::1]:2379"),
            (std::vector<std::string>{"a:1", "b:2", "[::1]:2379"}));
  for (const char* bad : {"", "host", "host:", ":2379", "host:0", "host:65536", "a:1,", "h:2x"})
    EXPECT_THROW(parseEtcdEndpoints(bad), ConfigError) << bad;
  EtcdStoreOptions options;
  options.prefix = "/p/";
  EXPECT_THROW(EtcdStore{options}, ConfigError);  // no endpoint
  options.endpoints = {"127.0.0.1:2379"};
  options.prefix = "";
  EXPECT_THROW(EtcdStore{options}, ConfigError);  // no prefix
}

TEST(EtcdStore, NobodyListeningIsTimeoutErrorAfterTheConnectTimeout) {
  EtcdStoreOptions options;
  options.endpoints = {"127.0.0.1:" + std::to_string(testing::freeLoopbackPort())};
  options.prefix = "/p/";
  options.connect_timeout = milliseconds(300);
  EtcdStore store(options);
  Stopwatch watch;
  try {
    store.setString("a", "1");
    FAIL() << "set returned";
  } catch (const TimeoutError& error) {
    EXPECT_NE(error.message().find("cannot reach etcd at " + options.endpoints[0]),
              std::string::npos)
        << error.message();
  }
  EXPECT_GE(watch.millis().count(), 250);
  EXPECT_LT(watch.millis().count(), 5000);
}

TEST(EtcdStore, ARequestGoesToTheNextEndpointWhenOneIsOutOfReach) {
  CHORUS_REQUIRE_ETCD();
  testing::EtcdProcess etcd;
  EtcdStoreOptions options = etcd.options("/p/");
  options.endpoints = {"127.0.0.1:" + std::to_string(testing::freeLoopbackPort()), etcd.endpoint()};
  EtcdStore store(options);
  store.setString("a", "1");
  EXPECT_EQ(store.add("n", 2), 2);
  EXPECT_EQ(store.getString("a", kLong), "1");
}

TEST(EtcdStore, AValueOverEtcdsRequestLimitIsACommErrorNamingIt) {
  CHORUS_REQUIRE_ETCD();
  testing::EtcdProcess etcd;
  EtcdStore store(etcd.options("/p/"));
  // etcd's --max-request-bytes is 1.5 MiB by default, its gateway's limit 2 MiB: both refuse.
  for (const std::size_t size : {std::size_t{1700} << 10, std::size_t{3} << 20}) {
    const Bytes big(size, 7);
    try {
      store.set("big", big);
      FAIL() << "set returned";
    } catch (const TimeoutError& error) {
      FAIL() << error.what();
    } catch (const CommError& error) {
      EXPECT_NE(error.message().find("--max-request-bytes"), std::string::npos) << error.message();
    }
  }
  // The connection is still good.
  store.setString("small", "ok");
  EXPECT_EQ(store.getString("small", kLong), "ok");
}

}  // namespace
}  // namespace chorus::comm
