// A job without an agent serves its own metrics and merges its own trace (job_observation.h):
// ranks as threads with mpirun's identities over one in-memory store. mpirun's round-robin
// placement gives each host its own monitor and node index; rank 0 merges every rank's part, and
// without the one that never came after the job's deadline; two nodes of one host id and a busy
// port are refused on the ranks concerned. The real processes (mpirun, srun, torchrun) are
// tests/python/test_observe_launchers.py's.
#include "chorus/runtime/launch/job_observation.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "chorus/comm/store/memory_store.h"
#include "chorus/core/error.h"
#include "chorus/observe/metrics_server.h"
#include "chorus/observe/trace_recorder.h"
#include "runtime/trainer_threads.h"

namespace chorus::runtime {
namespace {

using testing::runRankThreads;

// Rank `rank` of `world` as mpirun starts it: its place on its host and that host's id.
std::shared_ptr<Worker> mpirunRank(int rank, int world, int local_rank, int local_size,
                                   const std::string& host, std::shared_ptr<comm::Store> store,
                                   int timeout_ms = 20000) {
  InitOptions options;
  options.environment = Environment{{"OMPI_COMM_WORLD_RANK", std::to_string(rank)},
                                    {"OMPI_COMM_WORLD_SIZE", std::to_string(world)},
                                    {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(local_rank)},
                                    {"OMPI_COMM_WORLD_LOCAL_SIZE", std::to_string(local_size)},
                                    {"CHORUS_HOST_ID", host},
                                    {"CHORUS_RDZV_ENDPOINT", "127.0.0.1:1"},
                                    {"CHORUS_BIND_ADDRESS", "127.0.0.1"},
                                    {"CHORUS_SECRET_FILE", "unused: the store is in memory"},
                                    {"CHORUS_TIMEOUT_MS", std::to_string(timeout_ms)},
                                    {"CHORUS_LOG_LEVEL", "warn"}};
  options.store = std::move(store);
  options.connect = false;  // the observation needs the store only
  return init(options);
}

class JobObservationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("chorus-job-observation-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Writes rank `rank`'s part of `trace` with one span of step 0, on node `node`.
  static void writePart(const std::string& trace, int rank, int node) {
    observe::TraceRecorder recorder(rank, node, "rank " + std::to_string(rank), {0, 1});
    recorder.setStep(0);
    const auto now = observe::TraceRecorder::Clock::now();
    recorder.span(observe::Track::kCompute, "forward", "compute", now,
                  now + std::chrono::milliseconds(1));
    recorder.writePart(observe::tracePartPath(trace, rank));
  }

  std::filesystem::path dir_;
};

TEST_F(JobObservationTest, EachHostOfARoundRobinPlacementServesItsOwnRanks) {
  // mpirun --map-by node: ranks 0 and 2 on host a, 1 and 3 on host b.
  const std::vector<std::string> hosts{"a", "b", "a", "b"};
  const std::string trace = (dir_ / "run.json").string();
  auto store = std::make_shared<comm::MemoryStore>();
  std::vector<std::unique_ptr<JobObservation>> observations(4);
  std::vector<std::string> errors = runRankThreads(4, [&](int rank) {
    observe::ObserveRequest request;
    request.metrics_port = 0;
    request.trace = trace;
    auto worker = mpirunRank(rank, 4, rank / 2, 2, hosts[rank], store);
    ASSERT_TRUE(servedByJob(*worker, request));
    observations[rank] = std::make_unique<JobObservation>(worker, request);
  });
  for (const std::string& error : errors) ASSERT_EQ(error, "");
  for (int rank = 0; rank < 4; ++rank) {
    const observe::ObserveRequest& request = observations[rank]->request();
    EXPECT_EQ(request.node, rank % 2) << rank;  // host a first: it has the lowest rank
    EXPECT_EQ(observations[rank]->monitor() != nullptr, rank < 2) << rank;
    EXPECT_EQ(request.metrics_socket, observations[rank % 2]->request().metrics_socket) << rank;
  }
  EXPECT_NE(observations[0]->request().metrics_socket, observations[1]->request().metrics_socket);
  EXPECT_NE(observations[0]->monitor()->port(), observations[1]->monitor()->port());

  for (int rank = 0; rank < 4; ++rank) writePart(trace, rank, rank % 2);
  std::vector<int> merged(4, -1);
  errors = runRankThreads(4, [&](int rank) { merged[rank] = observations[rank]->finish(); });
  for (const std::string& error : errors) ASSERT_EQ(error, "");
  EXPECT_EQ(merged, (std::vector<int>{4, 0, 0, 0}));
  EXPECT_TRUE(observe::traceParts(trace).empty());
  std::ifstream in(trace);
  const auto json = nlohmann::json::parse(in);
  std::set<int> ranks;
  for (const auto& event : json.at("traceEvents"))
    if (event.at("ph") == "X") ranks.insert(event.at("args").at("rank").get<int>());
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(observations[0]->finish(), 0);  // once
}

TEST_F(JobObservationTest, RankZeroMergesWithoutAPartThatNeverCame) {
  const std::string trace = (dir_ / "run.json").string();
  auto store = std::make_shared<comm::MemoryStore>();
  std::vector<std::unique_ptr<JobObservation>> observations(3);
  const auto errors = runRankThreads(3, [&](int rank) {
    observe::ObserveRequest request;
    request.trace = trace;
    observations[rank] = std::make_unique<JobObservation>(
        mpirunRank(rank, 3, rank, 3, "a", store, /*timeout_ms=*/300), request);
  });
  for (const std::string& error : errors) ASSERT_EQ(error, "");
  writePart(trace, 0, 0);
  writePart(trace, 1, 0);
  EXPECT_EQ(observations[1]->finish(), 0);
  // Rank 2 recorded nothing and never finishes: rank 0 gives up on it after the deadline.
  const auto started = std::chrono::steady_clock::now();
  EXPECT_EQ(observations[0]->finish(), 2);
  EXPECT_GE(std::chrono::steady_clock::now() - started, std::chrono::milliseconds(250));
  EXPECT_TRUE(std::filesystem::exists(trace));
}

TEST_F(JobObservationTest, TwoNodesOfOneHostIdAreRefused) {
  auto store = std::make_shared<comm::MemoryStore>();
  const auto errors = runRankThreads(2, [&](int rank) {
    observe::ObserveRequest request;
    request.metrics_port = 0;
    JobObservation observation(mpirunRank(rank, 2, 0, 1, "same", store), request);
  });
  // Whichever posted second is refused.
  EXPECT_EQ(errors[0].empty() + errors[1].empty(), 1) << errors[0] << " | " << errors[1];
  EXPECT_NE((errors[0] + errors[1]).find("are both the first rank of host id 'same'"),
            std::string::npos)
      << errors[0] << errors[1];
}

TEST_F(JobObservationTest, ABusyPortIsRefusedOnEveryRankOfTheNode) {
  observe::MetricsServerOptions busy;
  busy.metrics = [] { return std::string(); };
  busy.state = [] { return std::string(); };
  const observe::MetricsServer taken(busy);
  auto store = std::make_shared<comm::MemoryStore>();
  const auto errors = runRankThreads(2, [&](int rank) {
    observe::ObserveRequest request;
    request.metrics_port = taken.port();
    JobObservation observation(mpirunRank(rank, 2, rank, 2, "a", store), request);
  });
  const std::string port = "CHORUS_METRICS_PORT=" + std::to_string(taken.port());
  EXPECT_NE(errors[0].find(port), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("its first rank refused them: " + port), std::string::npos) << errors[1];
}

}  // namespace
}  // namespace chorus::runtime
