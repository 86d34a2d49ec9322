// A worker program for the multi-process tests, started through `chorus run`. Each mode checks
// exact results on its own and exits non-zero with a message on any mismatch, so a test passes
// only when every rank's checks held.
//
//   test_worker collectives       every collective for 0, 1, an odd number and 1M elements
//   test_worker absent R          rank R never joins; the others must time out naming R
//   test_worker crash R           rank R dies by SIGSEGV; the others wait in a collective
//   test_worker intruder          rank 0 knocks on the job's store with a wrong secret
//   test_worker sleep             prints its pid, then sleeps (to be stopped by the agent)
//   test_worker identity          prints this worker's identity
//   test_worker elastic R1,R2,... (chorus run --elastic) ranks R1, R2, ... die by SIGKILL; the
//                                 others print what the agent posted in the store of each loss
//   test_worker restart R1,R2,... K (chorus run --elastic --max-restarts) ranks R1, R2, ... and
//                                 then their replacements die by SIGKILL, the first K lives of
//                                 each; each replacement first prints whom it replaces
#include <ATen/ATen.h>

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <iostream>
#include <numeric>
#include <sstream>
#include <thread>

#include "chorus/chorus.h"
#include "chorus/comm/store/job_secret.h"
#include "chorus/comm/store/tcp_store.h"
#include "chorus/runtime/launch/agent.h"

namespace {

using chorus::comm::Communicator;
using chorus::comm::ReduceOp;

int failures = 0;

void expectEqual(const at::Tensor& actual, const at::Tensor& expected, const std::string& what) {
  if (actual.sizes() == expected.sizes() && at::equal(actual, expected)) return;
  ++failures;
  std::cerr << "MISMATCH " << what << ": got " << actual.flatten().slice(0, 0, 8) << " expected "
            << expected.flatten().slice(0, 0, 8) << std::endl;
}

at::Tensor pattern(int64_t n) { return at::arange(n, at::kFloat).remainder(7); }

void checkReductions(Communicator& world, int64_t n) {
  const int r = world.rank(), p = world.size();
  const float rank_sum = p * (p - 1) / 2.0f;
  const std::string tag = " n=" + std::to_string(n);
  at::Tensor t = pattern(n) + r;
  world.allReduce(t, ReduceOp::kSum).wait();
  expectEqual(t, pattern(n) * p + rank_sum, "all_reduce sum" + tag);
  t = pattern(n) + r;
  world.allReduce(t, ReduceOp::kAvg).wait();
  expectEqual(t, (pattern(n) * p + rank_sum) / p, "all_reduce avg" + tag);
  t = pattern(n) + r;
  world.allReduce(t, ReduceOp::kMax).wait();
  expectEqual(t, pattern(n) + (p - 1), "all_reduce max" + tag);
  t = pattern(n) + r;
  world.allReduce(t, ReduceOp::kMin).wait();
  expectEqual(t, pattern(n), "all_reduce min" + tag);
  at::Tensor counts = at::full({n}, static_cast<int64_t>(r + 1), at::kLong);
  world.allReduce(counts).wait();
  expectEqual(counts, at::full({n}, static_cast<int64_t>(p * (p + 1) / 2), at::kLong),
              "all_reduce int64" + tag);
}

void checkBroadcastAndGather(Communicator& world, int64_t n) {
  const int r = world.rank(), p = world.size();
  const std::string tag = " n=" + std::to_string(n);
  at::Tensor t = pattern(n) + r;
  world.broadcast(t, p - 1).wait();
  expectEqual(t, pattern(n) + (p - 1), "broadcast" + tag);
  at::Tensor gathered = at::empty({n * p});
  world.allGather(pattern(n) + r, gathered).wait();
  for (int peer = 0; peer < p; ++peer)
    expectEqual(gathered.narrow(0, peer * n, n), pattern(n) + peer, "all_gather" + tag);
  // Uneven: rank i contributes n + i elements (rank 0 contributes nothing when n == 0).
  std::vector<int64_t> sizes;
  for (int peer = 0; peer < p; ++peer) sizes.push_back(n + peer);
  at::Tensor uneven = at::empty({n * p + p * (p - 1) / 2});
  world.allGatherV(pattern(n + r) + r, uneven, sizes).wait();
  int64_t offset = 0;
  for (int peer = 0; peer < p; ++peer) {
    expectEqual(uneven.narrow(0, offset, sizes[peer]), pattern(sizes[peer]) + peer,
                "all_gather_v" + tag);
    offset += sizes[peer];
  }
}

void checkScatterAndExchange(Communicator& world, int64_t n) {
  const int r = world.rank(), p = world.size();
  const float rank_sum = p * (p - 1) / 2.0f;
  const std::string tag = " n=" + std::to_string(n);
  at::Tensor out = at::empty({n});
  world.reduceScatter(pattern(n * p) + r, out).wait();
  expectEqual(out, pattern(n * p).narrow(0, r * n, n) * p + rank_sum, "reduce_scatter" + tag);
  std::vector<int64_t> sizes;
  for (int peer = 0; peer < p; ++peer) sizes.push_back(n + peer);
  const int64_t total = n * p + p * (p - 1) / 2;
  at::Tensor mine = at::empty({sizes[r]});
  world.reduceScatterV(pattern(total) + r, mine, sizes, ReduceOp::kMax).wait();
  expectEqual(mine, pattern(total).narrow(0, n * r + r * (r - 1) / 2, sizes[r]) + (p - 1),
              "reduce_scatter_v max" + tag);
  // All-to-all, uneven: rank r sends (n + r + j) elements of value 100r + j to rank j.
  std::vector<int64_t> send_counts, recv_counts;
  for (int peer = 0; peer < p; ++peer) {
    send_counts.push_back(n + r + peer);
    recv_counts.push_back(n + peer + r);
  }
  std::vector<at::Tensor> pieces;
  for (int peer = 0; peer < p; ++peer)
    pieces.push_back(at::full({send_counts[peer]}, 100.0f * r + peer));
  at::Tensor received = at::empty({std::accumulate(recv_counts.begin(), recv_counts.end(), 0L)});
  world.allToAll(at::cat(pieces), received, send_counts, recv_counts).wait();
  int64_t offset = 0;
  for (int peer = 0; peer < p; ++peer) {
    expectEqual(received.narrow(0, offset, recv_counts[peer]),
                at::full({recv_counts[peer]}, 100.0f * peer + r), "all_to_all" + tag);
    offset += recv_counts[peer];
  }
}

void checkPointToPoint(Communicator& world, int64_t n) {
  const int r = world.rank(), p = world.size();
  if (p < 2) return;
  at::Tensor incoming = at::empty({n});
  auto sending = world.send(pattern(n) + r, (r + 1) % p);
  auto receiving = world.recv(incoming, (r + p - 1) % p);
  sending.wait();
  receiving.wait();
  expectEqual(incoming, pattern(n) + (r + p - 1) % p, "send/recv n=" + std::to_string(n));
}

int runCollectives(chorus::runtime::Worker& worker) {
  Communicator& world = *worker.world();
  for (int64_t n : {0L, 1L, 7L, 1L << 20}) {
    checkReductions(world, n);
    checkBroadcastAndGather(world, n);
    checkScatterAndExchange(world, n);
    checkPointToPoint(world, n);
    world.barrier().wait();
  }
  const auto stats = world.stats();
  std::cout << "collectives " << (failures ? "FAILED" : "ok") << " rank " << world.rank()
            << " all_reduce_count " << stats.at("all_reduce").count << std::endl;
  return failures ? 1 : 0;
}

int runAbsent(chorus::runtime::Worker& worker, int absent) {
  Communicator& world = *worker.world();
  at::Tensor t = at::ones({16});
  world.allReduce(t).wait();  // everyone arrives at #0
  const auto timeout = std::chrono::milliseconds(worker.identity().timeout_ms);
  if (world.rank() == absent) {
    std::this_thread::sleep_for(timeout * 2 + std::chrono::seconds(2));
    return 0;
  }
  chorus::Stopwatch clock;
  try {
    world.allReduce(t).wait();
  } catch (const chorus::TimeoutError& error) {
    const bool named = error.missingRanks() == std::vector<int>{absent} && error.sequence() == 1;
    std::cout << "TIMEOUT rank " << world.rank() << " after " << clock.seconds()
              << " s: " << error.message() << std::endl;
    const bool in_time = clock.millis() < timeout + std::chrono::milliseconds(3000);
    return named && in_time ? 0 : 1;
  }
  std::cout << "no timeout on rank " << world.rank() << std::endl;
  return 1;
}

int runCrash(chorus::runtime::Worker& worker, int victim) {
  Communicator& world = *worker.world();
  world.barrier().wait();
  if (world.rank() == victim) {
    // Die of the signal itself: a sanitizer's handler would turn it into an exit code.
    std::signal(SIGSEGV, SIG_DFL);
    std::raise(SIGSEGV);
  }
  at::Tensor t = at::ones({16});
  try {
    world.allReduce(t).wait();
  } catch (const chorus::CommError&) {
    // Expected: the victim's connection dropped. Stay alive so that only the agent ends us.
  }
  std::this_thread::sleep_for(std::chrono::seconds(60));
  return 0;
}

int runIntruder(chorus::runtime::Worker& worker) {
  if (worker.rank() != 0) return 0;
  chorus::comm::TcpStoreOptions options;
  options.host = worker.identity().store_host;
  options.port = worker.identity().store_port;
  options.secret = chorus::comm::JobSecret::fromText("not-the-job-secret-0123456789");
  options.connect_timeout = std::chrono::milliseconds(5000);
  chorus::Stopwatch clock;
  try {
    chorus::comm::TcpStore intruder(options);
    intruder.setString("owned", "yes");
  } catch (const chorus::AuthError& error) {
    std::cout << "REFUSED after " << clock.seconds() << " s: " << error.message() << std::endl;
    return clock.seconds() < 2.0 && !worker.store()->check({"owned"}) ? 0 : 1;
  }
  std::cout << "intruder was let in" << std::endl;
  return 1;
}

// "1,3" -> {1, 3}.
std::vector<int> rankList(const std::string& list) {
  std::vector<int> ranks;
  std::istringstream items(list);
  for (std::string rank; std::getline(items, rank, ',');) ranks.push_back(std::stoi(rank));
  return ranks;
}

// Waits for no collective: the survivors of an elastic job learn of each loss from the store alone.
int runElastic(chorus::runtime::Worker& worker, const std::string& lost_list) {
  const std::vector<int> lost = rankList(lost_list);
  if (std::find(lost.begin(), lost.end(), worker.rank()) != lost.end()) std::raise(SIGKILL);
  for (int rank : lost) {
    const std::string key = chorus::runtime::elasticExitKey(rank);
    std::cout << "rank " << worker.rank() << " saw " << key << ": "
              << worker.store()->getString(key, std::chrono::seconds(30)) << std::endl;
  }
  return 0;
}

// Ranks `victims` and their lines of replacements (a line keeps its node and local rank): the
// first `deaths` lives of each die by SIGKILL, a later one exits 0. A replacement says whom it
// replaces and whether the agent had posted that loss before starting it (a check, not a wait).
int runRestart(chorus::runtime::Worker& worker, const std::string& victims, int deaths) {
  const chorus::runtime::WorkerIdentity& id = worker.identity();
  const std::vector<int> first_lives = rankList(victims);
  if (id.replaces < 0 &&
      std::find(first_lives.begin(), first_lives.end(), id.rank) == first_lives.end())
    return 0;
  if (id.replaces >= 0) {
    const std::string key = chorus::runtime::elasticExitKey(id.replaces);
    const bool posted = worker.store()->check({key});
    std::cout << "rank " << id.rank << " replaces " << id.replaces << ": world " << id.world_size
              << " local " << id.local_rank << " device " << id.device.toString() << "; " << key
              << (posted
                      ? " already set: " + worker.store()->getString(key, std::chrono::seconds(1))
                      : std::string(" not set"))
              << std::endl;
  }
  const std::string line =
      "test/restart/lives/" + std::to_string(id.node_rank) + "/" + std::to_string(id.local_rank);
  if (worker.store()->add(line, 1) <= deaths) std::raise(SIGKILL);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "identity";
    const int which = argc > 2 ? std::stoi(argv[2]) : 0;
    chorus::runtime::InitOptions init;
    // A world communicator would wait for the lost ranks.
    init.connect = mode != "elastic" && mode != "restart";
    auto worker = chorus::init(init);
    if (mode == "elastic") return runElastic(*worker, argc > 2 ? argv[2] : "");
    if (mode == "restart")
      return runRestart(*worker, argc > 2 ? argv[2] : "", argc > 3 ? std::stoi(argv[3]) : 1);
    if (mode == "collectives") return runCollectives(*worker);
    if (mode == "absent") return runAbsent(*worker, which);
    if (mode == "crash") return runCrash(*worker, which);
    if (mode == "intruder") return runIntruder(*worker);
    if (mode == "sleep") {
      std::cout << "pid=" << getpid() << std::endl;
      std::this_thread::sleep_for(std::chrono::seconds(120));
      return 0;
    }
    const auto& id = worker->identity();
    std::cout << "identity rank=" << id.rank << " world=" << id.world_size
              << " local=" << id.local_rank << " node=" << id.node_rank
              << " device=" << id.device.toString() << " launcher=" << id.launcher << std::endl;
    return 0;
  } catch (const chorus::Error& error) {
    std::cerr << "test_worker: " << error.kind() << ": " << error.message() << std::endl;
    return 2;
  }
}
