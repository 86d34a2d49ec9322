#include "chorus/comm/store/etcd_store.h"

#include <openssl/evp.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <thread>
#include <utility>

#include "chorus/core/error.h"
#include "store/http_client.h"
#include "store/store_protocol.h"

namespace chorus::comm {
namespace {

using nlohmann::json;

constexpr Millis kFirstReconnect{10};
constexpr Millis kMaxReconnect{1000};

std::string base64(const std::string& data) {
  std::string out(4 * ((data.size() + 2) / 3), '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(data.data()),
                                static_cast<int>(data.size()));
  out.resize(static_cast<std::size_t>(n));
  return out;
}

std::string base64(const Bytes& data) { return base64(toString(data)); }

Bytes unbase64(const std::string& text, const std::string& endpoint) {
  if (text.empty()) return {};
  Bytes out(3 * text.size() / 4);
  const int n = EVP_DecodeBlock(out.data(), reinterpret_cast<const unsigned char*>(text.data()),
                                static_cast<int>(text.size()));
  if (n < 0 || text.size() % 4 != 0)
    CHORUS_THROW(ProtocolError, endpoint, " sent a value that is not base64");
  // EVP_DecodeBlock counts the padding as zero bytes.
  std::size_t size = static_cast<std::size_t>(n);
  for (std::size_t i = text.size(); i > 0 && text[i - 1] == '='; --i) --size;
  out.resize(size);
  return out;
}

// The first key after every key that starts with `prefix`: etcd's range_end for a prefix.
std::string prefixEnd(std::string prefix) {
  while (!prefix.empty()) {
    if (static_cast<unsigned char>(prefix.back()) < 0xff) {
      prefix.back() = static_cast<char>(prefix.back() + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // every key
}

std::int64_t jsonInt(const json& object, const char* field) {
  if (!object.contains(field)) return 0;  // proto3 leaves zeroes out
  const json& value = object.at(field);
  return value.is_string() ? std::stoll(value.get<std::string>()) : value.get<std::int64_t>();
}

json rangeRequest(const std::string& key) { return {{"key", base64(key)}}; }

}  // namespace

std::vector<std::string> parseEtcdEndpoints(const std::string& endpoints) {
  std::vector<std::string> parsed;
  std::size_t start = 0;
  while (start <= endpoints.size()) {
    const std::size_t comma = std::min(endpoints.find(',', start), endpoints.size());
    std::string endpoint = endpoints.substr(start, comma - start);
    const std::size_t colon = endpoint.rfind(':');
    bool valid = colon != std::string::npos && colon > 0 && colon + 1 < endpoint.size() &&
                 endpoint.find_first_not_of("0123456789", colon + 1) == std::string::npos;
    if (valid) {
      const int port = std::stoi(endpoint.substr(colon + 1).substr(0, 6));
      valid = port > 0 && port <= 65535;
    }
    CHORUS_CHECK_CONFIG(valid, "etcd endpoint '", endpoint, "' in '", endpoints,
                        "' is not HOST:PORT (e.g. 10.0.0.5:2379)");
    parsed.push_back(std::move(endpoint));
    start = comma + 1;
  }
  return parsed;
}

std::string etcdJobPrefix(const JobSecret& secret) {
  CHORUS_CHECK_CONFIG(!secret.empty(), "the etcd key prefix of a job needs its secret");
  return "/chorus/" + toHex(secret.sign("etcd key prefix", {})).substr(0, 16) + "/";
}

EtcdStore::EtcdStore(EtcdStoreOptions options) : options_(std::move(options)) {
  CHORUS_CHECK_CONFIG(!options_.endpoints.empty(), "the etcd store needs at least one endpoint");
  CHORUS_CHECK_CONFIG(!options_.prefix.empty(),
                      "the etcd store needs a key prefix (the job's: etcdJobPrefix)");
  CHORUS_CHECK_CONFIG(options_.min_poll.count() >= 1 && options_.max_poll >= options_.min_poll,
                      "the etcd store's polling needs 1 ms <= min_poll <= max_poll");
  for (const std::string& endpoint : options_.endpoints) {
    const std::size_t colon = endpoint.rfind(':');
    std::string host = endpoint.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
    connections_.push_back(
        std::make_unique<HttpConnection>(host, std::stoi(endpoint.substr(colon + 1))));
  }
}

EtcdStore::~EtcdStore() = default;

std::string EtcdStore::endpoint() const {
  std::string joined;
  for (const std::string& endpoint : options_.endpoints)
    joined += (joined.empty() ? "" : ",") + endpoint;
  return joined;
}

std::string EtcdStore::call(const char* path, const std::string& body, bool idempotent) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Deadline reach = deadlineFor(options_.connect_timeout);
  Millis backoff = kFirstReconnect;
  std::string last_error;
  for (std::size_t tries = 0;; ++tries) {
    HttpConnection& connection = *connections_[current_];
    // A keep-alive connection the server closed while idle fails at once: one more try on a
    // fresh one is not a sign of trouble.
    const bool reused = connection.connected();
    bool sent = false;
    try {
      const HttpReply reply =
          connection.post(path, body, deadlineFor(options_.request_timeout), sent);
      if (reply.status == 200) return reply.body;
      std::string message = reply.body.substr(0, 512);
      try {
        message = json::parse(reply.body).value("message", message);
      } catch (const json::exception&) {
      }
      // etcd bounds a request by its --max-request-bytes (1.5 MiB unless set), its gateway by
      // gRPC's 2 MiB; both say "large".
      const bool too_large = message.find("large") != std::string::npos;
      CHORUS_THROW(CommError, "etcd at ", connection.endpoint(), " refused ", path, " (HTTP ",
                   reply.status, "): ", message,
                   too_large ? "; a value of the job's store must fit etcd's --max-request-bytes "
                               "(1.5 MiB by default) and its gateway's 2 MiB"
                             : "");
    } catch (const ProtocolError&) {
      throw;
    } catch (const TimeoutError& error) {
      if (sent) throw;
      last_error = error.what();
    } catch (const CommError& error) {
      // An error reply is etcd's answer, not a lost connection.
      if (connection.connected()) throw;
      if (sent && !idempotent && !reused)
        CHORUS_THROW(CommError, "lost the connection to etcd at ", connection.endpoint(),
                     " during ", path, ", which may have been applied: ", error.message());
      last_error = error.message();
    }
    if (reused && tries == 0) continue;
    current_ = (current_ + 1) % connections_.size();
    if (reach.expired())
      CHORUS_THROW(TimeoutError, "cannot reach etcd at ", endpoint(), " within ",
                   options_.connect_timeout.count(), " ms: ", last_error);
    // Each endpoint once without waiting, then back off.
    if ((tries + 1) % connections_.size() == 0) {
      std::this_thread::sleep_for(std::min(backoff, reach.remaining()));
      backoff = std::min(backoff * 2, kMaxReconnect);
    }
  }
}

EtcdStore::Value EtcdStore::read(const std::string& key) {
  const json reply =
      json::parse(call("/v3/kv/range", rangeRequest(options_.prefix + key).dump(), true));
  Value value;
  if (!reply.contains("kvs") || reply["kvs"].empty()) return value;
  const json& kv = reply["kvs"][0];
  value.exists = true;
  value.value = unbase64(kv.value("value", ""), endpoint());
  value.mod_revision = std::to_string(jsonInt(kv, "mod_revision"));
  return value;
}

std::vector<std::string> EtcdStore::missing(const std::vector<std::string>& keys) {
  if (keys.empty()) return {};
  json success = json::array();
  for (const std::string& key : keys) {
    json range = rangeRequest(options_.prefix + key);
    range["count_only"] = true;
    success.push_back({{"request_range", range}});
  }
  const json reply = json::parse(
      call("/v3/kv/txn", json{{"compare", json::array()}, {"success", success}}.dump(), true));
  std::vector<std::string> absent;
  const json& responses = reply.at("responses");
  for (std::size_t i = 0; i < keys.size(); ++i)
    if (jsonInt(responses.at(i).at("response_range"), "count") == 0) absent.push_back(keys[i]);
  return absent;
}

bool EtcdStore::putIfUnchanged(const std::string& key, const Value& seen, const Bytes& desired) {
  const std::string name = base64(options_.prefix + key);
  const json compare = {
      {"target", "MOD"}, {"key", name}, {"result", "EQUAL"}, {"mod_revision", seen.mod_revision}};
  const json put = {{"request_put", {{"key", name}, {"value", base64(desired)}}}};
  const json reply = json::parse(call(
      "/v3/kv/txn",
      json{{"compare", json::array({compare})}, {"success", json::array({put})}}.dump(), false));
  return reply.value("succeeded", false);
}

void EtcdStore::set(const std::string& key, const Bytes& value) {
  call("/v3/kv/put", json{{"key", base64(options_.prefix + key)}, {"value", base64(value)}}.dump(),
       true);
}

Bytes EtcdStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  const Deadline deadline = deadlineFor(timeout);
  Millis poll = options_.min_poll;
  for (;;) {
    Value value = read(key);
    if (value.exists) return std::move(value.value);
    if (deadline.expired())
      CHORUS_THROW(TimeoutError, "store get of key '", key, "' at etcd ", endpoint(),
                   " timed out after ", timeout.count(), " ms");
    std::this_thread::sleep_for(std::min(poll, deadline.remaining()));
    poll = std::min(poll * 2, options_.max_poll);
  }
}

void EtcdStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const Deadline deadline = deadlineFor(timeout);
  Millis poll = options_.min_poll;
  for (;;) {
    const std::vector<std::string> absent = missing(keys);
    if (absent.empty()) return;
    if (deadline.expired())
      CHORUS_THROW(TimeoutError, "store wait at etcd ", endpoint(), " timed out after ",
                   timeout.count(), " ms: ", absent.size(), " of ", keys.size(),
                   " keys missing: ", describeKeys(absent));
    std::this_thread::sleep_for(std::min(poll, deadline.remaining()));
    poll = std::min(poll * 2, options_.max_poll);
  }
}

std::int64_t EtcdStore::add(const std::string& key, std::int64_t delta) {
  for (;;) {
    const Value seen = read(key);
    std::int64_t value = 0;
    if (seen.exists) {
      const std::string text = toString(seen.value);
      std::size_t used = 0;
      try {
        value = std::stoll(text, &used);
      } catch (const std::logic_error&) {
        used = 0;
      }
      if (used == 0 || used != text.size())
        CHORUS_THROW(CommError, "store add on key '", key, "': its value '", text.substr(0, 64),
                     "' is not an integer");
    }
    value += delta;
    if (putIfUnchanged(key, seen, toBytes(std::to_string(value)))) return value;
  }
}

Bytes EtcdStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  for (;;) {
    Value seen = read(key);
    const bool matches = seen.exists ? seen.value == expected : expected.empty();
    if (!matches) return std::move(seen.value);
    if (putIfUnchanged(key, seen, desired)) return desired;
  }
}

bool EtcdStore::check(const std::vector<std::string>& keys) { return missing(keys).empty(); }

bool EtcdStore::deleteKey(const std::string& key) {
  const json reply =
      json::parse(call("/v3/kv/deleterange", rangeRequest(options_.prefix + key).dump(), true));
  return jsonInt(reply, "deleted") > 0;
}

std::int64_t EtcdStore::numKeys() {
  const json range = {{"key", base64(options_.prefix)},
                      {"range_end", base64(prefixEnd(options_.prefix))},
                      {"count_only", true}};
  return jsonInt(json::parse(call("/v3/kv/range", range.dump(), true)), "count");
}

std::int64_t EtcdStore::deleteAll() {
  const json range = {{"key", base64(options_.prefix)},
                      {"range_end", base64(prefixEnd(options_.prefix))}};
  return jsonInt(json::parse(call("/v3/kv/deleterange", range.dump(), true)), "deleted");
}

}  // namespace chorus::comm
