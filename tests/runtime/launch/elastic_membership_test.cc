// Elastic membership: the pure decision of the next generation, the heartbeat bookkeeping under
// an injected clock, and the agreement among worker threads over one in-memory store (a lost
// member declared by the transport, by the agent's exit report, and a worker left out).
#include "chorus/runtime/launch/elastic_membership.h"

#include <gtest/gtest.h>

#include <optional>
#include <thread>

#include "chorus/comm/store/memory_store.h"
#include "chorus/comm/store/prefix_store.h"
#include "chorus/core/error.h"

namespace chorus::runtime {
namespace {

using Clock = HeartbeatWatch::Clock;
using std::chrono::milliseconds;

TEST(DecideGeneration, SurvivorsInMemberOrderFromTheFurthestOne) {
  const Generation next = decideGeneration(3, {0, 1, 2, 3}, {{3, 11}, {0, 10}, {2, 11}}, {1}, "x");
  EXPECT_EQ(next.number, 3);
  EXPECT_EQ(next.members, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(next.lost, (std::vector<int>{1}));
  EXPECT_EQ(next.step, 11);
  EXPECT_EQ(next.source, 2);  // the lowest of the furthest
  EXPECT_EQ(next.rankOf(3), 2);
  EXPECT_EQ(next.rankOf(1), -1);
  EXPECT_EQ(next.reason, "x");
}

TEST(DecideGeneration, AMemberDeclaredLostIsLeftOutEvenIfItArrived) {
  const Generation next = decideGeneration(1, {0, 1}, {{0, 4}, {1, 4}}, {1}, "late");
  EXPECT_EQ(next.members, (std::vector<int>{0}));
  EXPECT_EQ(next.lost, (std::vector<int>{1}));
}

TEST(DecideGeneration, NobodyLeftIsACommError) {
  EXPECT_THROW(decideGeneration(1, {0, 1}, {}, {0, 1}, "all gone"), CommError);
}

TEST(Generation, RoundTripsThroughJson) {
  const Generation next = decideGeneration(2, {0, 1, 2}, {{0, 5}, {2, 5}}, {1}, "rank 1: \"x\"");
  const Generation back = Generation::fromJson(next.toJson());
  EXPECT_EQ(back.number, next.number);
  EXPECT_EQ(back.members, next.members);
  EXPECT_EQ(back.lost, next.lost);
  EXPECT_EQ(back.source, next.source);
  EXPECT_EQ(back.step, next.step);
  EXPECT_EQ(back.reason, next.reason);
}

TEST(HeartbeatWatch, AMemberIsOverdueAfterItsMissedBeats) {
  HeartbeatWatch watch(milliseconds(1000), 3);
  const Clock::time_point t0{};
  watch.observe(1, 5, t0);
  watch.observe(2, 9, t0);
  watch.observe(1, 6, t0 + milliseconds(1000));  // member 1 beats, member 2 does not
  EXPECT_TRUE(watch.overdue(t0 + milliseconds(2999)).empty());
  EXPECT_EQ(watch.overdue(t0 + milliseconds(3000)), (std::vector<int>{2}));
  watch.observe(2, 9, t0 + milliseconds(3500));  // the same count is no beat
  EXPECT_EQ(watch.overdue(t0 + milliseconds(3999)), (std::vector<int>{2}));
  EXPECT_EQ(watch.overdue(t0 + milliseconds(4000)), (std::vector<int>{1, 2}));
  watch.forget(2);
  EXPECT_EQ(watch.overdue(t0 + milliseconds(4000)), (std::vector<int>{1}));
}

// Workers as threads over one MemoryStore, each with its membership and world communicator.
struct ThreadWorkers {
  explicit ThreadWorkers(int size)
      : size(size), store(std::make_shared<comm::MemoryStore>()), workers(size) {
    std::vector<std::thread> threads;
    for (int rank = 0; rank < size; ++rank)
      threads.emplace_back([this, rank] { workers[rank] = start(rank, {}); });
    for (auto& thread : threads) thread.join();
  }
  // Worker `rank`; with `replaces`, a replacement of that launch rank (it joins no world yet).
  std::shared_ptr<Worker> start(int rank, std::optional<int> replaces) {
    InitOptions init;
    init.store = store;
    init.environment = Environment{{"CHORUS_RANK", std::to_string(rank)},
                                   {"CHORUS_WORLD_SIZE", std::to_string(size)},
                                   {"CHORUS_RDZV_ENDPOINT", "127.0.0.1:1"},
                                   {"CHORUS_SECRET_FILE", "unused: the store is in memory"},
                                   {"CHORUS_LOG_LEVEL", "warn"},
                                   {"CHORUS_TIMEOUT_MS", "20000"}};
    if (replaces) {  // on the device of the rank it replaces, as the agent starts it
      (*init.environment)["CHORUS_ELASTIC_REPLACES"] = std::to_string(*replaces);
      (*init.environment)["CHORUS_LOCAL_RANK"] = std::to_string(*replaces);
      (*init.environment)["CHORUS_LOCAL_WORLD_SIZE"] = std::to_string(size);
    }
    return chorus::runtime::init(init);
  }
  int size;
  std::shared_ptr<comm::MemoryStore> store;
  std::vector<std::shared_ptr<Worker>> workers;
};

ElasticOptions fastOptions() {
  ElasticOptions options;
  options.heartbeat = milliseconds(100);
  options.misses = 3;
  options.agreement_timeout = milliseconds(20000);
  return options;
}

TEST(ElasticMembership, SurvivorsAgreeAndRegroupAfterATransportFailure) {
  ThreadWorkers job(3);
  std::vector<std::unique_ptr<ElasticMembership>> members;
  for (int rank : {0, 2})
    members.push_back(std::make_unique<ElasticMembership>(job.workers[rank], fastOptions()));
  // Member 1 is gone (its worker object stays, as a dead process's shared memory would).
  const PeerFailure failure("all_reduce lost a peer: rank 1 died", __FILE__, __LINE__, {1});
  std::vector<Generation> agreed(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i)
    threads.emplace_back([&, i] {
      agreed[i] = members[i]->agree(/*next_step=*/7, failure);
      members[i]->regroup(agreed[i]);
    });
  for (auto& thread : threads) thread.join();
  for (const Generation& generation : agreed) {
    EXPECT_EQ(generation.number, 1);
    EXPECT_EQ(generation.members, (std::vector<int>{0, 2}));
    EXPECT_EQ(generation.lost, (std::vector<int>{1}));
    EXPECT_EQ(generation.step, 7);
  }
  EXPECT_EQ(job.workers[2]->rank(), 1);
  EXPECT_EQ(job.workers[2]->worldSize(), 2);
  EXPECT_EQ(job.workers[2]->member(), 2);
  // The new world works, and names members by their launch rank.
  std::vector<std::thread> reduce;
  std::vector<float> sums(2);
  for (int i = 0; i < 2; ++i)
    reduce.emplace_back([&, i] {
      at::Tensor tensor = at::ones({3});
      job.workers[i == 0 ? 0 : 2]->world()->allReduce(tensor).wait();
      sums[i] = tensor[0].item<float>();
    });
  for (auto& thread : reduce) thread.join();
  EXPECT_EQ(sums, (std::vector<float>{2, 2}));
}

TEST(ElasticMembership, AHungMemberIsDeclaredLostByTheHeartbeatAndLeftOut) {
  ThreadWorkers job(2);
  auto survivor = std::make_unique<ElasticMembership>(job.workers[0], fastOptions());
  // Member 1 never starts its monitor: it never beats. Member 0's world is aborted when the
  // heartbeat declares it lost, and the agreement leaves it out.
  const auto start = Clock::now();
  while (!job.workers[0]->world()->broken() && Clock::now() - start < std::chrono::seconds(20))
    std::this_thread::sleep_for(milliseconds(10));
  ASSERT_TRUE(job.workers[0]->world()->broken());
  const CommError failure("all_reduce was aborted", __FILE__, __LINE__);
  const Generation next = survivor->agree(3, failure);
  EXPECT_EQ(next.members, (std::vector<int>{0}));
  EXPECT_EQ(next.lost, (std::vector<int>{1}));
  EXPECT_NE(next.reason.find("missed 3 heartbeats"), std::string::npos) << next.reason;
  // Member 1 comes back: it is refused.
  auto stale = std::make_unique<ElasticMembership>(job.workers[1], fastOptions());
  try {
    stale->agree(3, failure);
    FAIL() << "a member declared lost rejoined";
  } catch (const CommError& error) {
    EXPECT_NE(std::string(error.what()).find("was left out of the job"), std::string::npos)
        << error.what();
  }
}

TEST(ElasticMembership, TheAgentsExitReportDeclaresAMemberLost) {
  ThreadWorkers job(3);
  std::vector<std::unique_ptr<ElasticMembership>> members;
  for (int rank = 0; rank < 3; ++rank)
    members.push_back(std::make_unique<ElasticMembership>(job.workers[rank], fastOptions()));
  members[2].reset();  // its monitor stops, as when the process dies
  comm::PrefixStore("elastic", job.store)
      .setString("exited/2", "rank 2 (pid 1) was killed by signal 9 (SIGKILL)");
  const auto start = Clock::now();
  while (!job.workers[1]->world()->broken() && Clock::now() - start < std::chrono::seconds(20))
    std::this_thread::sleep_for(milliseconds(5));
  ASSERT_TRUE(job.workers[1]->world()->broken());
  const CommError failure("aborted", __FILE__, __LINE__);
  std::vector<Generation> agreed(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i)
    threads.emplace_back([&, i] { agreed[i] = members[i]->agree(5, failure); });
  for (auto& thread : threads) thread.join();
  for (const Generation& generation : agreed) {
    EXPECT_EQ(generation.members, (std::vector<int>{0, 1}));
    EXPECT_NE(generation.reason.find("SIGKILL"), std::string::npos) << generation.reason;
  }
}

// Waits (20 s at most) until `worker`'s world communicator was aborted by its monitor.
void awaitBroken(const Worker& worker) {
  const auto start = Clock::now();
  while (!worker.world()->broken() && Clock::now() - start < std::chrono::seconds(20))
    std::this_thread::sleep_for(milliseconds(5));
  ASSERT_TRUE(worker.world()->broken());
}

TEST(ElasticMembership, AReplacementIsAdmittedIntoTheNextGenerationAndJoinsItsWorld) {
  ThreadWorkers job(2);
  std::vector<std::unique_ptr<ElasticMembership>> members;
  for (int rank = 0; rank < 2; ++rank)
    members.push_back(std::make_unique<ElasticMembership>(job.workers[rank], fastOptions()));
  // The agent starts member 2 in place of launch rank 1 (as if rank 1 had been lost and come
  // back: the membership does not care).
  comm::PrefixStore("elastic", job.store).add("joined", 1);
  std::shared_ptr<Worker> joiner = job.start(2, 1);
  EXPECT_EQ(joiner->world(), nullptr);
  Generation joined;
  std::thread join([&] {
    auto membership = ElasticMembership::join(joiner, fastOptions(), 1);
    joined = membership->current();
    membership->regroup(joined);
  });
  // The members' monitors see the request and abort their worlds; they agree with the joiner.
  std::vector<Generation> agreed(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i)
    threads.emplace_back([&, i] {
      awaitBroken(*job.workers[i]);
      agreed[i] = members[i]->agree(/*next_step=*/5, CommError("aborted", __FILE__, __LINE__));
      members[i]->regroup(agreed[i]);
    });
  for (auto& thread : threads) thread.join();
  join.join();
  for (const Generation& generation : {agreed[0], agreed[1], joined}) {
    EXPECT_EQ(generation.number, 1);
    EXPECT_EQ(generation.members, (std::vector<int>{0, 1, 2}));
    EXPECT_EQ(generation.joined, (std::map<int, int>{{2, 1}}));
    EXPECT_TRUE(generation.lost.empty());
    EXPECT_EQ(generation.source, 0);
    EXPECT_EQ(generation.step, 5);
    EXPECT_NE(generation.reason.find("rank 2 joins in place of rank 1"), std::string::npos)
        << generation.reason;
  }
  EXPECT_EQ(joiner->rank(), 2);
  EXPECT_EQ(joiner->worldSize(), 3);
  std::vector<std::thread> reduce;
  std::vector<float> sums(3);
  const std::vector<std::shared_ptr<Worker>> world{job.workers[0], job.workers[1], joiner};
  for (int i = 0; i < 3; ++i)
    reduce.emplace_back([&, i] {
      at::Tensor tensor = at::ones({2});
      world[i]->world()->allReduce(tensor).wait();
      sums[i] = tensor[0].item<float>();
    });
  for (auto& thread : reduce) thread.join();
  EXPECT_EQ(sums, (std::vector<float>{3, 3, 3}));
}

TEST(DecideGeneration, JoinersThatArrivedComeAfterTheMembersAndAreNeverTheSource) {
  const Generation next =
      decideGeneration(2, {0, 2}, {{0, 4}, {2, 4}, {5, -1}}, {}, "join", {{5, 1}, {6, 3}});
  EXPECT_EQ(next.members, (std::vector<int>{0, 2, 5}));  // 6 did not arrive
  EXPECT_EQ(next.joined, (std::map<int, int>{{5, 1}}));
  EXPECT_EQ(next.source, 0);
  EXPECT_EQ(next.step, 4);
  EXPECT_EQ(Generation::fromJson(next.toJson()).joined, next.joined);
  // Joiners alone carry no state.
  EXPECT_THROW(decideGeneration(3, {0}, {{5, -1}}, {0}, "x", {{5, 1}}), CommError);
}

}  // namespace
}  // namespace chorus::runtime
