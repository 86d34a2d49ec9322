#include "chorus/runtime/launch/elastic_membership.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "chorus/comm/communicator.h"
#include "chorus/comm/store/prefix_store.h"
#include "chorus/core/clock.h"
#include "chorus/core/error.h"
#include "chorus/core/logging.h"

namespace chorus::runtime {
namespace {

// How often the agreement and the join poll the store: recovery on loopback takes a few polls.
constexpr std::chrono::milliseconds kPoll{2};
// The agent's exit reports are looked at every this many watch intervals.
constexpr int kExitCheckEvery = 5;
// Peers' heartbeat counters are read this many times per heartbeat period.
constexpr int kReadsPerBeat = 4;

std::string genKey(int generation, const std::string& what) {
  return "gen/" + std::to_string(generation) + "/" + what;
}

std::string memberKey(int generation, const std::string& what, int member) {
  return genKey(generation, what + "/" + std::to_string(member));
}

bool contains(const std::vector<int>& values, int value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

// The value of `key`, or "" when it is not set (without waiting).
std::string peek(comm::Store& store, const std::string& key) {
  if (!store.check({key})) return "";
  return store.getString(key, std::chrono::milliseconds(1000));
}

// Sets `key` unless someone did first; returns the value it holds.
std::string setFirst(comm::Store& store, const std::string& key, const std::string& value) {
  return comm::toString(store.compareSet(key, {}, comm::toBytes(value)));
}

// The agents' count of the replacements they started (kElasticJoinedKey, "elastic/joined", in the
// job's store; AgentOptions::max_restarts): their member ids are the launch world size and up, with
// gaps where a start failed.
constexpr const char* kJoinedCounter = "joined";

std::string joinKey(int member) { return "join/" + std::to_string(member); }

// Set by the members when they finished the job (ElasticMembership::finish).
constexpr const char* kFinishedKey = "finished";

// How a joiner takes part: "in place of rank 2" or "with a new device".
std::string joinsAs(int replaces) {
  return replaces == kNewDevice ? "with a new device"
                                : "in place of rank " + std::to_string(replaces);
}

// Whether the agent reported `member`'s process ended, or the members refused it.
bool ended(comm::Store& store, int member) {
  return store.check({"exited/" + std::to_string(member)}) ||
         store.check({"refused/" + std::to_string(member)});
}

}  // namespace

std::string Generation::toJson() const {
  nlohmann::json pairs = nlohmann::json::array();
  for (const auto& [member, replaces] : joined) pairs.push_back({member, replaces});
  return nlohmann::json{{"generation", number}, {"members", members}, {"source", source},
                        {"step", step},         {"lost", lost},       {"joined", pairs},
                        {"reason", reason}}
      .dump();
}

Generation Generation::fromJson(const std::string& text) {
  const nlohmann::json json = nlohmann::json::parse(text);
  Generation generation;
  generation.number = json.at("generation").get<int>();
  generation.members = json.at("members").get<std::vector<int>>();
  generation.source = json.at("source").get<int>();
  generation.step = json.at("step").get<std::int64_t>();
  generation.lost = json.at("lost").get<std::vector<int>>();
  for (const auto& pair : json.at("joined"))
    generation.joined[pair.at(0).get<int>()] = pair.at(1).get<int>();
  generation.reason = json.at("reason").get<std::string>();
  return generation;
}

int Generation::rankOf(int member) const {
  const auto found = std::find(members.begin(), members.end(), member);
  return found == members.end() ? -1 : static_cast<int>(found - members.begin());
}

Generation decideGeneration(int number, const std::vector<int>& previous,
                            const std::map<int, std::int64_t>& arrived,
                            const std::vector<int>& lost, const std::string& reason,
                            const std::map<int, int>& joiners) {
  Generation next;
  next.number = number;
  next.reason = reason;
  for (int member : previous) {
    if (arrived.count(member) && !contains(lost, member))
      next.members.push_back(member);
    else
      next.lost.push_back(member);
  }
  if (next.members.empty())
    CHORUS_THROW(CommError, "elastic: no member of generation ", number - 1, " is left");
  for (const auto& [member, replaces] : joiners) {
    if (!arrived.count(member) || contains(lost, member) || contains(next.members, member))
      continue;
    next.members.push_back(member);
    next.joined[member] = replaces;
  }
  std::sort(next.members.begin(), next.members.end());
  next.step = -1;
  for (int member : next.members)
    if (arrived.at(member) > next.step) {
      next.step = arrived.at(member);
      next.source = member;
    }
  return next;
}

HeartbeatWatch::HeartbeatWatch(std::chrono::milliseconds period, int misses)
    : period_(period), misses_(misses) {}

void HeartbeatWatch::observe(int member, std::int64_t counter, Clock::time_point now) {
  Seen& seen = seen_[member];
  if (seen.counter != counter) {
    seen.counter = counter;
    seen.changed = now;
  }
}

std::vector<int> HeartbeatWatch::overdue(Clock::time_point now) const {
  std::vector<int> late;
  for (const auto& [member, seen] : seen_)
    if (now - seen.changed >= limit()) late.push_back(member);
  return late;
}

void HeartbeatWatch::forget(int member) { seen_.erase(member); }

ElasticMembership::ElasticMembership(std::shared_ptr<Worker> worker, ElasticOptions options)
    : ElasticMembership(std::move(worker), options, /*start_monitor=*/true) {}

ElasticMembership::ElasticMembership(std::shared_ptr<Worker> worker, ElasticOptions options,
                                     bool start_monitor)
    : worker_(std::move(worker)),
      options_(options),
      launch_size_(worker_->worldSize()),
      store_(std::make_shared<comm::PrefixStore>("elastic", worker_->store())) {
  current_.number = 0;
  for (int member = 0; member < launch_size_; ++member) current_.members.push_back(member);
  current_.source = 0;
  world_ = worker_->world();
  if (start_monitor) startMonitor();
}

std::unique_ptr<ElasticMembership> ElasticMembership::join(std::shared_ptr<Worker> worker,
                                                           ElasticOptions options, int replaces) {
  std::unique_ptr<ElasticMembership> membership(
      new ElasticMembership(std::move(worker), options, /*start_monitor=*/false));
  const Generation admitted = membership->awaitAdmission(replaces);
  {
    std::lock_guard<std::mutex> lock(membership->mutex_);
    membership->current_ = admitted;
    membership->world_.reset();
  }
  membership->startMonitor();
  return membership;
}

void ElasticMembership::startMonitor() {
  // Its own connection: the training thread's may be held by a blocking call for long.
  auto monitor_store =
      std::make_shared<comm::PrefixStore>("elastic", worker_->openStoreConnection());
  monitor_ = std::thread([this, monitor_store] { monitor(*monitor_store); });
}

void ElasticMembership::monitor(comm::Store& store) {
  HeartbeatWatch watch(options_.heartbeat, options_.misses);
  auto next_beat = HeartbeatWatch::Clock::now();
  auto next_read = next_beat;
  auto last_read = next_beat;
  for (int round = 0; !stopping_.load(); ++round) {
    try {
      const auto now = HeartbeatWatch::Clock::now();
      if (now >= next_read) {
        // A monitor that did not run for a while (a descheduled or stopped process) saw no
        // beats either: it starts watching afresh rather than blame its peers.
        if (now - last_read > 2 * options_.heartbeat) watch = {options_.heartbeat, options_.misses};
        // Its own beat once a period; its peers' read kReadsPerBeat times a period, so that a
        // stopped peer is seen at most a fraction of a period late.
        const bool own = now >= next_beat;
        beat(store, watch, own);
        if (own) next_beat = now + options_.heartbeat;
        last_read = now;
        next_read = now + options_.heartbeat / kReadsPerBeat;
      }
      watchLosses(store);
      // Every round: the steps a request waits through before the members take the joiner in
      // are the steps of one watch interval.
      watchJoins(store);
      if (round % kExitCheckEvery == 0) watchExits(store);
    } catch (const std::exception& error) {
      // The store is gone (the job ends) or unreachable: the transport's deadlines still hold.
      if (!stopping_.load()) logDebug("elastic monitor: ", error.what());
    }
    std::unique_lock<std::mutex> lock(wake_mutex_);
    wake_.wait_for(lock, options_.watch_interval, [this] { return stopping_.load(); });
  }
}

void ElasticMembership::watchExits(comm::Store& store) {
  const Generation generation = current();
  for (int member : generation.members) {
    if (member == worker_->member()) continue;
    const std::string exited = peek(store, "exited/" + std::to_string(member));
    if (!exited.empty() && peek(store, memberKey(generation.number, "lost", member)).empty())
      declareLost(store, generation.number, member, exited + " (agent)");
  }
}

ElasticMembership::~ElasticMembership() {
  stopping_.store(true);
  wake_.notify_all();
  if (monitor_.joinable()) monitor_.join();
}

Generation ElasticMembership::current() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return current_;
}

bool ElasticMembership::superseded() const {
  const Generation generation = current();
  return store_->check({genKey(generation.number + 1, "open")}) ||
         store_->check({memberKey(generation.number, "lost", worker_->member())});
}

void ElasticMembership::beat(comm::Store& store, HeartbeatWatch& watch, bool own) {
  if (own) store.add("beat/" + std::to_string(worker_->member()), 1);
  const Generation generation = current();
  const auto now = HeartbeatWatch::Clock::now();
  for (int member : generation.members)
    if (member != worker_->member())
      watch.observe(member, store.add("beat/" + std::to_string(member), 0), now);
  for (int member : watch.overdue(now)) {
    watch.forget(member);
    if (!contains(generation.members, member)) continue;
    const double seconds = std::chrono::duration<double>(watch.limit()).count();
    declareLost(store, generation.number, member,
                detail::concat("rank ", member, " missed ", options_.misses, " heartbeats (",
                               seconds, " s without one)"));
  }
}

void ElasticMembership::watchLosses(comm::Store& store) {
  const Generation generation = current();
  const std::string open = peek(store, genKey(generation.number + 1, "open"));
  if (!open.empty()) abortWorld("elastic: a member was lost: " + open);
  const std::string me = peek(store, memberKey(generation.number, "lost", worker_->member()));
  if (!me.empty()) abortWorld("elastic: this worker was declared lost: " + me);
}

std::vector<int> ElasticMembership::replacementIds(comm::Store& store) const {
  const auto started = static_cast<int>(store.add(kJoinedCounter, 0));
  std::vector<int> ids;
  for (int member = launch_size_; member < launch_size_ + started; ++member) ids.push_back(member);
  return ids;
}

void ElasticMembership::watchJoins(comm::Store& store) {
  const Generation generation = current();
  for (int member : replacementIds(store)) {
    if (generation.rankOf(member) >= 0) continue;
    const std::string replaces = peek(store, joinKey(member));
    if (replaces.empty() || store.check({memberKey(generation.number + 1, "joiner", member)}) ||
        store.check({"admitted/" + std::to_string(member)}) || ended(store, member))
      continue;
    store.setString(memberKey(generation.number + 1, "joiner", member), replaces);
    const std::string why =
        detail::concat("rank ", member, " joins ", joinsAs(std::stoi(replaces)));
    setFirst(store, genKey(generation.number + 1, "open"), why);
    abortWorld("elastic: " + why);
  }
}

std::map<int, int> ElasticMembership::admitted(comm::Store& store, int number) {
  std::map<int, int> joiners;
  for (int member : replacementIds(store)) {
    const std::string replaces = peek(store, memberKey(number, "joiner", member));
    if (!replaces.empty() && !ended(store, member)) joiners[member] = std::stoi(replaces);
  }
  return joiners;
}

Generation ElasticMembership::awaitAdmission(int replaces) {
  const int me = worker_->member();
  comm::Store& store = *store_;
  store.setString(joinKey(me), std::to_string(replaces));
  // Members abort what they do when they see the request, but a Gloo collective ends only at its
  // deadline: the wait is two agreement timeouts from the last generation that formed.
  const auto patience = 2 * options_.agreement_timeout;
  Deadline deadline = Deadline::after(patience);
  for (int number = 1;;) {
    if (const std::string why = peek(store, "refused/" + std::to_string(me)); !why.empty())
      refuse(why);
    if (const std::string end = peek(store, kFinishedKey); !end.empty())
      CHORUS_THROW(CommError, "elastic: rank ", me, " asked to join the job ", joinsAs(replaces),
                   ", but the job's workers finished (", end, ") before they admitted it");
    if (const std::string decision = peek(store, genKey(number, "decision")); !decision.empty()) {
      Generation generation = Generation::fromJson(decision);
      if (generation.rankOf(me) >= 0) {
        store.setString("admitted/" + std::to_string(me), std::to_string(number));
        return generation;
      }
      ++number;
      deadline = Deadline::after(patience);
      continue;
    }
    if (store.check({memberKey(number, "joiner", me)}) &&
        !store.check({memberKey(number, "arrived", me)}))
      store.setString(memberKey(number, "arrived", me), "-1");
    if (deadline.expired())
      CHORUS_THROW(TimeoutError, "elastic: rank ", me, " asked to join the job ", joinsAs(replaces),
                   ", but no generation admitted it within ",
                   std::chrono::duration<double>(patience).count(),
                   " s (are the job's workers running?)");
    std::this_thread::sleep_for(kPoll);
  }
}

void ElasticMembership::declareLost(comm::Store& store, int generation, int member,
                                    const std::string& why) {
  if (member == worker_->member()) return;
  const std::string first = setFirst(store, memberKey(generation, "lost", member), why);
  if (first == why) logWarn("elastic: lost ", why);
  setFirst(store, genKey(generation + 1, "open"), why);
  abortWorld("elastic: a member was lost: " + why);
}

void ElasticMembership::abortWorld(const std::string& why) {
  std::shared_ptr<comm::Communicator> world;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    world = world_;
  }
  if (world && !world->broken()) world->abort(why);
}

std::vector<int> ElasticMembership::lostMembers(comm::Store& store, const Generation& generation) {
  std::vector<int> lost;
  for (int member : generation.members) {
    if (member == worker_->member()) continue;
    if (store.check({memberKey(generation.number, "lost", member)}) ||
        store.check({"exited/" + std::to_string(member)}))
      lost.push_back(member);
  }
  return lost;
}

void ElasticMembership::finish(const std::string& what) {
  try {
    setFirst(*store_, kFinishedKey, what);
  } catch (const std::exception& error) {
    // The training is done; only a joiner that came too late waits longer.
    logDebug("elastic: cannot say the job finished: ", error.what());
  }
}

void ElasticMembership::refuse(const std::string& why) {
  left_out_.store(true);
  CHORUS_THROW(CommError, "elastic: rank ", worker_->member(),
               " was left out of the job by the other workers (", why,
               "); a worker of an old generation cannot rejoin");
}

Generation ElasticMembership::agree(std::int64_t next_step, const std::exception& failure) {
  const Generation previous = current();
  const int number = previous.number + 1;
  const int me = worker_->member();
  comm::Store& store = *store_;
  if (const auto* peer = dynamic_cast<const PeerFailure*>(&failure))
    for (int member : peer->ranks())
      if (contains(previous.members, member))
        declareLost(store, previous.number, member,
                    detail::concat("rank ", member, " failed in a collective: ", failure.what()));
  const std::string reason =
      setFirst(store, genKey(number, "open"),
               detail::concat("rank ", me, " saw a collective fail: ", failure.what()));
  if (const std::string why = peek(store, memberKey(previous.number, "lost", me)); !why.empty())
    refuse(why);
  store.setString(memberKey(number, "arrived", me), std::to_string(next_step));
  const Deadline deadline = Deadline::after(options_.agreement_timeout);
  const std::string decision_key = genKey(number, "decision");
  while (!store.check({decision_key})) {
    const std::vector<int> lost = lostMembers(store, previous);
    const std::map<int, int> joiners = admitted(store, number);
    std::vector<int> expected;
    for (int member : previous.members)
      if (!contains(lost, member)) expected.push_back(member);
    for (const auto& joiner : joiners) expected.push_back(joiner.first);
    std::map<int, std::int64_t> arrived;
    std::vector<int> absent;
    for (int member : expected) {
      const std::string step = peek(store, memberKey(number, "arrived", member));
      if (step.empty())
        absent.push_back(member);
      else
        arrived[member] = std::stoll(step);
    }
    if (absent.empty()) {
      setFirst(store, decision_key,
               decideGeneration(number, previous.members, arrived, lost, reason, joiners).toJson());
      break;
    }
    if (deadline.expired())
      for (int member : absent) {
        const std::string why =
            detail::concat("rank ", member, " did not reach the agreement within ",
                           options_.agreement_timeout.count(), " ms");
        if (joiners.count(member))
          store.setString("refused/" + std::to_string(member), why);
        else
          declareLost(store, previous.number, member, why);
      }
    std::this_thread::sleep_for(kPoll);
  }
  const Generation next = Generation::fromJson(peek(store, decision_key));
  if (next.rankOf(me) < 0)
    refuse("it is not among the members of generation " + std::to_string(number));
  return next;
}

void ElasticMembership::regroup(const Generation& next) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    current_ = next;
    world_.reset();
  }
  const int me = worker_->member();
  comm::Store& store = *store_;
  // Everyone announces itself before any joins the communicator, whose join waits without
  // looking at losses: a member lost now is seen here at once rather than at the join's deadline.
  store.setString(memberKey(next.number, "joining", me), "1");
  const Deadline deadline = Deadline::after(options_.agreement_timeout);
  for (int member : next.members) {
    while (!store.check({memberKey(next.number, "joining", member)})) {
      std::vector<int> lost = lostMembers(store, next);
      if (lost.empty() && deadline.expired()) lost = {member};
      if (!lost.empty())
        throw PeerFailure(detail::concat("elastic: rank ", joinInts(lost),
                                         " was lost while generation ", next.number, " formed"),
                          __FILE__, __LINE__, lost);
      std::this_thread::sleep_for(kPoll);
    }
  }
  comm::CommOptions options = worker_->worldOptions();
  options.global_ranks = next.members;
  auto world =
      comm::Communicator::create(std::make_shared<comm::PrefixStore>(
                                     "elastic/" + genKey(next.number, "world"), worker_->store()),
                                 next.rankOf(me), static_cast<int>(next.members.size()), options);
  worker_->regroup(next.rankOf(me), static_cast<int>(next.members.size()), world);
  std::lock_guard<std::mutex> lock(mutex_);
  world_ = world;
}

}  // namespace chorus::runtime
