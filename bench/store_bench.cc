// What authenticating every store frame costs: the HMAC work per frame (both ends, by payload
// size) against the round trip of the same store operation over loopback, measured in one run.
//
//   build/bench/store_bench [--json]
//
// Per frame the sender computes two tags (header, whole frame) and the receiver recomputes both,
// so a request and its reply cost 8 HMAC-SHA256 computations. `one-shot` is the same work with
// OpenSSL's HMAC() (a key setup per tag), the baseline that FrameMac's precomputed key avoids.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "chorus/comm/store/job_secret.h"
#include "chorus/comm/store/tcp_store.h"
#include "chorus/core/logging.h"
#include "store/store_channel.h"

namespace {

using chorus::comm::Bytes;
using Clock = std::chrono::steady_clock;

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

template <typename F>
double medianMicros(int repeats, F&& body) {
  std::vector<double> samples;
  for (int i = 0; i < repeats; ++i) {
    auto start = Clock::now();
    body();
    samples.push_back(micros(Clock::now() - start));
  }
  std::nth_element(samples.begin(), samples.begin() + repeats / 2, samples.end());
  return samples[repeats / 2];
}

struct Row {
  std::string operation;
  std::size_t payload;   // bytes of the request's value (or of the reply's, for get)
  double round_trip_us;  // median store round trip over loopback
  double mac_us;         // median HMAC work of one request and its reply, both ends
  double one_shot_us;    // the same work with a key setup per tag
};

// The HMAC work of one frame of `payload` bytes at both ends: 2 tags to seal, 2 to verify.
double frameMacMicros(chorus::comm::wire::FrameMac& mac, std::size_t payload, int repeats) {
  Bytes header(12, 1), body(payload, 7);
  return medianMicros(repeats, [&] {
    for (int end = 0; end < 2; ++end) {
      mac.tag(1, header.data(), header.size());
      mac.tag(2, header.data(), header.size(), body.data(), body.size());
    }
  });
}

double oneShotMicros(const std::string& key, std::size_t payload, int repeats) {
  Bytes header(12, 1), frame(12 + payload, 7);
  return medianMicros(repeats, [&] {
    for (int end = 0; end < 2; ++end) {
      chorus::comm::hmacSha256(key, header);
      chorus::comm::hmacSha256(key, frame);
    }
  });
}

}  // namespace

int main(int argc, char** argv) {
  const bool json = argc > 1 && std::strcmp(argv[1], "--json") == 0;
  chorus::Logger::instance().setLevel(chorus::LogLevel::kWarn);
  using namespace chorus::comm;
  const JobSecret secret = JobSecret::generate();
  TcpStoreServerOptions server_options;
  server_options.host = "127.0.0.1";
  server_options.secret = secret;
  TcpStoreServer server(server_options);
  TcpStoreOptions client_options;
  client_options.port = server.port();
  client_options.secret = secret;
  TcpStore store(client_options);
  const std::string key(32, 'k');
  wire::FrameMac mac(Bytes(32, 3));

  std::vector<Row> rows;
  const std::size_t kSmall = 12;  // an add's or a get's request, a status reply
  for (std::size_t size :
       {std::size_t{0}, std::size_t{1024}, std::size_t{65536}, std::size_t{1} << 20}) {
    const int repeats = size >= (1u << 20) ? 50 : 2000;
    Row row;
    row.payload = size;
    if (size == 0) {
      row.operation = "add";
      row.round_trip_us = medianMicros(repeats, [&] { store.add("counter", 1); });
    } else {
      row.operation = "set";
      Bytes value(size, 5);
      row.round_trip_us = medianMicros(repeats, [&] { store.set(key, value); });
    }
    row.mac_us = frameMacMicros(mac, size + kSmall, repeats) + frameMacMicros(mac, kSmall, repeats);
    row.one_shot_us = oneShotMicros(std::string(32, 'x'), size + kSmall, repeats) +
                      oneShotMicros(std::string(32, 'x'), kSmall, repeats);
    rows.push_back(row);
  }

  if (json) {
    std::printf("[\n");
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::printf(
          "  {\"operation\": \"%s\", \"value_bytes\": %zu, \"round_trip_us\": %.2f, "
          "\"hmac_us\": %.2f, \"hmac_fraction\": %.4f, \"one_shot_hmac_us\": %.2f}%s\n",
          r.operation.c_str(), r.payload, r.round_trip_us, r.mac_us, r.mac_us / r.round_trip_us,
          r.one_shot_us, i + 1 < rows.size() ? "," : "");
    }
    std::printf("]\n");
    return 0;
  }
  std::printf(
      "# store round trip over loopback (median) vs. the HMAC work in it (request + reply,\n"
      "# both ends, median); one-shot: the same tags with a key setup each\n");
  std::printf("%-5s %10s %14s %10s %9s %14s\n", "op", "value B", "round trip us", "HMAC us",
              "fraction", "one-shot us");
  for (const Row& r : rows)
    std::printf("%-5s %10zu %14.1f %10.2f %8.1f%% %14.2f\n", r.operation.c_str(), r.payload,
                r.round_trip_us, r.mac_us, 100 * r.mac_us / r.round_trip_us, r.one_shot_us);
  return 0;
}
