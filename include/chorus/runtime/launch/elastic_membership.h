// Elastic membership of a job: who is still in it, how a lost worker is noticed, and how the
// survivors agree on the next generation (docs/elastic.md).
//
// Workers are named by their launch rank (Worker::member()). Generation 0 is the job as launched;
// each loss starts the next generation, whose members are the survivors, ranked in member order,
// with a world communicator of their own over the same store (keys under "elastic/gen/<g>/"), so
// a worker of an older generation can never take part in a newer one's collectives.
//
// A loss is noticed by whichever comes first:
//  - the transport: a collective fails (a dead peer on shared memory in milliseconds; a dropped
//    connection on Gloo; a deadline);
//  - the agent: `chorus run --elastic` writes "elastic/exited/<member>" when a worker process ends;
//  - the heartbeat: every worker's monitor thread bumps "elastic/beat/<member>" every
//    heartbeat period and declares a member lost after `misses` periods without a beat (a hung
//    or stopped process, a host cut off).
// Whoever notices opens the next generation ("elastic/gen/<g+1>/open"); every monitor that sees
// it aborts its world communicator, so survivors blocked in a collective come out at once.
//
// A worker also joins: a replacement the agent started for a lost one (`elastic.max_restarts`),
// with a new member id (launch world size and up, never reused) and the launch rank whose device
// it runs on. When it is ready it posts "elastic/join/<member>"; the first monitor that sees the
// request admits it into the next generation ("elastic/gen/<g+1>/joiner/<member>") and opens that
// generation as for a loss. The members redo the step they were in with the joiner among them:
// it joins at that step's boundary.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "chorus/comm/store/store.h"
#include "chorus/runtime/launch/worker.h"

namespace chorus::runtime {

struct ElasticOptions {
  // Heartbeat period and the missed beats that make a member lost. Defaults: 1 s, 3.
  std::chrono::milliseconds heartbeat{1000};
  int misses = 3;
  // How often the monitor looks for a loss that another worker or the agent declared.
  // Default: 20 ms.
  std::chrono::milliseconds watch_interval{20};
  // How long the survivors wait for every member to arrive at the agreement (or be declared
  // lost) before they leave the absent ones out. Default: 60 s (chorus train passes the
  // communication deadline).
  std::chrono::milliseconds agreement_timeout{60000};
};

// What Generation::joined holds for a worker that brings a device the launch plan did not have
// (a node that joined the running job, `chorus run --join`) instead of a launch rank it replaces.
constexpr int kNewDevice = -1;

// One generation's membership, as every member of it sees it. Value type.
struct Generation {
  int number = 0;
  std::vector<int> members;  // member ids (launch ranks); rank r of the generation is members[r]
  // The generation starts from this member's state, at `step` (its next step): the survivor that
  // got furthest (survivors differ by at most the step being finished when the loss struck).
  int source = -1;
  std::int64_t step = 0;
  std::vector<int> lost;  // members of the previous generation left out
  // Members that joined in this generation -> the launch rank whose device each runs on (whose
  // place in the launch plan it takes), or kNewDevice.
  std::map<int, int> joined;
  std::string reason;  // how the change was noticed (the first report)

  std::string toJson() const;
  static Generation fromJson(const std::string& text);
  // Rank of `member` in this generation, or -1.
  int rankOf(int member) const;
};

// Pure: who the next generation is, from the previous members, the ones that arrived at the
// agreement (member -> its next step) and the ones declared lost, and the workers admitted to
// join (member -> the launch rank it replaces) that arrived (step -1: no state of their own). The
// members that arrived and are not lost, and the joiners that arrived, in member order; the
// source is the lowest member among those with the highest step. Throws CommError when no member
// of the previous generation is left (a joiner has no state to start from).
Generation decideGeneration(int number, const std::vector<int>& previous,
                            const std::map<int, std::int64_t>& arrived,
                            const std::vector<int>& lost, const std::string& reason,
                            const std::map<int, int>& joiners = {});

// Pure: the heartbeat bookkeeping of one observer. Fed each member's beat counter as it is read,
// with the time of reading (injected, so tests need no real clock); a member whose counter has
// not moved for `misses` × `period` is overdue.
class HeartbeatWatch {
 public:
  using Clock = std::chrono::steady_clock;
  HeartbeatWatch(std::chrono::milliseconds period, int misses);
  // Records `member`'s counter as read at `now`.
  void observe(int member, std::int64_t counter, Clock::time_point now);
  // The members observed whose counter last moved `misses` periods or more before `now`.
  std::vector<int> overdue(Clock::time_point now) const;
  // Forgets `member` (it left the membership).
  void forget(int member);
  std::chrono::milliseconds limit() const { return period_ * misses_; }

 private:
  struct Seen {
    std::int64_t counter = -1;
    Clock::time_point changed;
  };
  std::chrono::milliseconds period_;
  int misses_;
  std::map<int, Seen> seen_;
};

// One worker's membership: runs the monitor thread (heartbeat, watch for losses) from
// construction to destruction, and the agreement and regrouping when the training thread asks.
// agree() and regroup() are for one thread (the training thread); the monitor runs on its own
// thread with its own store connection. Non-copyable.
class ElasticMembership {
 public:
  // A worker of the job as launched: a member of generation 0.
  ElasticMembership(std::shared_ptr<Worker> worker, ElasticOptions options);
  // A worker that joins the running job in place of launch rank `replaces` (kNewDevice: with a
  // device of its own, env::kElasticNewDevice): asks to join and
  // waits until a generation admits it (its members agreed with it among them), then watches its
  // peers like any member. The caller regroup()s onto the returned current(). Throws CommError
  // when the job refuses it (it came too late for an agreement) or TimeoutError when no
  // generation admitted it within the agreement timeout after the members last changed.
  static std::unique_ptr<ElasticMembership> join(std::shared_ptr<Worker> worker,
                                                 ElasticOptions options, int replaces);
  ~ElasticMembership();
  ElasticMembership(const ElasticMembership&) = delete;
  ElasticMembership& operator=(const ElasticMembership&) = delete;

  Generation current() const;
  // Asks the store (one round trip) whether the job has gone past this worker's generation: the
  // next one was opened, or this worker was declared lost. A worker that was stopped and
  // continued may otherwise finish a step of its old generation and act on it (write the log).
  bool superseded() const;
  // True once agree() found this worker left out: it must stop, not agree again.
  bool leftOut() const { return left_out_.load(); }

  // After a collective of the current generation failed with `failure`: declares the members
  // the failure names as lost (a PeerFailure's ranks; a deadline's absent ranks are left to the
  // heartbeat), opens the next generation, waits until every member arrived or was declared
  // lost, and returns the generation every member agrees on (the first decision written wins).
  // `next_step` is the step this worker would run next. Throws CommError when this worker was
  // declared lost (it must not go on: the survivors have gone ahead without it).
  Generation agree(std::int64_t next_step, const std::exception& failure);

  // Says in the store that the members finished the job (`what`, e.g. "after step 40"): a worker
  // still waiting to join is refused with a CommError saying so rather than wait out its deadline.
  void finish(const std::string& what);

  // Makes `next` current: joins its world communicator (rank = its index of this member) and
  // regroups the worker onto it. Throws CommError when a member is lost meanwhile (the caller
  // agrees again).
  void regroup(const Generation& next);

 private:
  // The monitor thread's loop, on its own store connection.
  void monitor(comm::Store& store);
  // Declares lost the members whose process the agent reported ended.
  void watchExits(comm::Store& store);
  // Bumps this worker's beat when `own`, reads its peers' and declares the overdue ones lost.
  void beat(comm::Store& store, HeartbeatWatch& watch, bool own);
  void watchLosses(comm::Store& store);
  // The member ids the agents gave the replacements they started so far (some may never ask).
  std::vector<int> replacementIds(comm::Store& store) const;
  // Admits into the next generation the workers that asked to join, and opens it.
  void watchJoins(comm::Store& store);
  // The workers admitted into generation `number` (member -> the launch rank it replaces) that
  // have not ended or been refused.
  std::map<int, int> admitted(comm::Store& store, int number);
  // The joiner's side of join(): waits for a generation that admits it and arrives there.
  Generation awaitAdmission(int replaces);
  void declareLost(comm::Store& store, int generation, int member, const std::string& why);
  void abortWorld(const std::string& why);
  std::vector<int> lostMembers(comm::Store& store, const Generation& generation);
  [[noreturn]] void refuse(const std::string& why);

  ElasticMembership(std::shared_ptr<Worker> worker, ElasticOptions options, bool start_monitor);
  void startMonitor();

  std::shared_ptr<Worker> worker_;
  ElasticOptions options_;
  int launch_size_;                     // the launch world size: joiners' member ids start here
  std::shared_ptr<comm::Store> store_;  // the training thread's: "elastic/" in the job store
  mutable std::mutex mutex_;            // guards current_ and world_
  Generation current_;
  std::shared_ptr<comm::Communicator> world_;  // the current generation's
  std::atomic<bool> stopping_{false};
  std::atomic<bool> left_out_{false};
  std::mutex wake_mutex_;
  std::condition_variable wake_;
  std::thread monitor_;
};

}  // namespace chorus::runtime
