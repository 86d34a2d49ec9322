// The job's store kept in etcd (v3), so that no agent of the job hosts it (docs/elastic.md, "No
// single point of failure"): `chorus run --rdzv-backend etcd --rdzv-endpoint HOST:2379`, as
// torchrun spells its etcd rendezvous.
//
// Talks to etcd's HTTP/JSON gateway (/v3/kv/put, range, txn, deleterange; keys and values in
// base64) over plain sockets. Every key of a job lives under one prefix (etcdJobPrefix: derived
// from the job secret, so every node and worker of a job finds the same one and jobs with
// different secrets never meet). get and wait poll with a bounded backoff rather than watch:
// the gateway's watch is a stream that would need a connection of its own per waiting call and
// an unbounded chunked-JSON reader, while polling keeps one connection and one request at a time
// and bounds the wake-up latency by EtcdStoreOptions::max_poll (a store serves rendezvous, whose
// waits are for other processes' start-up and are seconds, not milliseconds). add and compareSet
// are read-then-transaction loops conditioned on the key's modification revision, so they are
// atomic against every client of the same etcd.
//
// Not authenticated by the job secret: anyone who can reach etcd can read and write the job's
// keys. Run etcd where only the job's hosts reach it (or behind its own TLS and users, which this
// client does not speak).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "chorus/comm/store/job_secret.h"
#include "chorus/comm/store/store.h"

namespace chorus::comm {

class HttpConnection;

struct EtcdStoreOptions {
  // etcd's client URLs as "host:port" (http only), members of one etcd cluster: a request that
  // cannot reach one is sent to the next, so the job outlives an etcd member too. REQUIRES:
  // non-empty.
  std::vector<std::string> endpoints;
  // Prepended to every key (etcdJobPrefix for a job). REQUIRES: non-empty, so that numKeys()
  // and the job's clean-up never touch keys of other users of the same etcd.
  std::string prefix;
  // How long to keep trying to reach an endpoint (with backoff) before a call gives up with
  // TimeoutError: etcd may be starting, or one member failing over. Default: 30 s.
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(30);
  // Bound on one HTTP request's round trip. Default: 60 s.
  std::chrono::milliseconds request_timeout = std::chrono::seconds(60);
  // get and wait poll first after min_poll, doubling up to max_poll. Defaults: 1 ms, 20 ms (the
  // elastic monitor's own watch period).
  std::chrono::milliseconds min_poll{1};
  std::chrono::milliseconds max_poll{20};
};

// "host:port,host:port" as EtcdStoreOptions::endpoints; each checked as a HOST:PORT. Throws
// ConfigError on an empty list or a malformed endpoint.
std::vector<std::string> parseEtcdEndpoints(const std::string& endpoints);

// The key prefix of the job whose secret is `secret`: "/chorus/" + 16 hex characters of
// HMAC(secret, "etcd key prefix") + "/". Names the job without revealing the secret.
std::string etcdJobPrefix(const JobSecret& secret);

// A client of etcd. Connects lazily (the first call, or the first after a lost connection).
// Thread-safe: calls are serialised on one connection, but get and wait release it between
// polls, so a thread blocked in get does not hold up the others. Errors: TimeoutError (a get or
// wait past its timeout, naming the keys; etcd unreachable for connect_timeout), CommError (etcd
// refused a request, e.g. a value over its --max-request-bytes, 1.5 MiB by default; add on a
// value that is not an integer; a connection lost mid-request of an add or compareSet, which is
// not repeated since it may have been applied), ProtocolError (the endpoint is not etcd's
// gateway). Owns its connection; not copyable.
class EtcdStore : public Store {
 public:
  // Throws ConfigError on options that break the REQUIRES above.
  explicit EtcdStore(EtcdStoreOptions options);
  ~EtcdStore() override;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool deleteKey(const std::string& key) override;
  // Keys under this store's prefix.
  std::int64_t numKeys() override;
  // Deletes every key under the prefix (the job's clean-up); returns how many there were.
  std::int64_t deleteAll();

  const EtcdStoreOptions& options() const { return options_; }
  // The endpoints, comma-separated, as parseEtcdEndpoints reads them.
  std::string endpoint() const;

 private:
  struct Value {
    bool exists = false;
    Bytes value;
    std::string mod_revision = "0";
  };
  Value read(const std::string& key);
  // The keys of `keys` that do not exist (one transaction).
  std::vector<std::string> missing(const std::vector<std::string>& keys);
  // Puts `desired` if `key` was not modified since `seen`; whether it was put.
  bool putIfUnchanged(const std::string& key, const Value& seen, const Bytes& desired);
  // POSTs `body` to etcd's gateway `path` and returns the parsed JSON reply's text. A request
  // that may be repeated (`idempotent`) is sent again, to the next endpoint, when the connection
  // fails; others throw CommError once they may have reached the server.
  std::string call(const char* path, const std::string& body, bool idempotent);

  EtcdStoreOptions options_;
  std::mutex mutex_;                                          // guards connections_ and current_
  std::vector<std::unique_ptr<HttpConnection>> connections_;  // one per endpoint
  std::size_t current_ = 0;                                   // the endpoint in use
};

}  // namespace chorus::comm
