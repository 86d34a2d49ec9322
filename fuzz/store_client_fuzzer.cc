// Fuzz target: the store client's side of the wire protocol (TcpStore): its handshake and its
// reply decoder, against a fake server that answers with the fuzzer's bytes.
//
// Input (store_fuzz_peer.h): a mode byte and records. kRawHandshake answers each connection with
// the records' bytes in place of a server's handshake; kFrames authenticates properly and answers
// the client's i-th request with record i as the reply frame; kRawAfterAuth authenticates and
// answers the first request with bytes that are not frames. The client issues the requests in a
// fixed cycle (set, get, add, compareSet, check, wait, deleteKey, numKeys), each of which must
// return or throw a chorus::Error.
#include <sys/socket.h>

#include <atomic>
#include <thread>

#include "chorus/comm/store/tcp_store.h"
#include "fuzz_support.h"
#include "store_fuzz_peer.h"

namespace {

using chorus::comm::Bytes;
namespace fz = chorus::fuzz;

// Plays the server for one connection, as the input says.
void serveConnection(chorus::comm::wire::Socket& socket, const fz::FuzzInput& input) {
  const chorus::Deadline deadline = chorus::Deadline::after(chorus::Millis(2000));
  if (input.mode == fz::Mode::kRawHandshake) {
    socket.sendAll(fz::joinedRecords(input), deadline);
    socket.finish(chorus::Millis(50));
    return;
  }
  std::unique_ptr<chorus::comm::wire::StoreChannel> channel = fz::serverHandshake(socket, deadline);
  if (input.mode == fz::Mode::kRawAfterAuth) {
    channel->receive(deadline);
    socket.sendAll(fz::joinedRecords(input), deadline);
    socket.finish(chorus::Millis(50));
    return;
  }
  for (const Bytes& reply : input.records) {
    channel->receive(deadline);
    channel->send(reply, deadline);
  }
  socket.finish(chorus::Millis(50));
}

void issueRequest(chorus::comm::TcpStore& store, std::size_t index) {
  using chorus::Millis;
  const Bytes value = chorus::comm::toBytes("value");
  switch (index % 8) {
    case 0:
      return store.set("key", value);
    case 1:
      store.get("key", Millis(10));
      return;
    case 2:
      store.add("counter", 1);
      return;
    case 3:
      store.compareSet("key", value, chorus::comm::toBytes("other"));
      return;
    case 4:
      store.check({"key", "counter"});
      return;
    case 5:
      return store.wait({"key"}, Millis(10));
    case 6:
      store.deleteKey("key");
      return;
    default:
      store.numKeys();
      return;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace chorus;
  fz::quietLogs();
  static fz::Listener listener;
  const fz::FuzzInput input = fz::splitInput(data, size);
  std::atomic<bool> done{false};
  std::thread server([&] {
    while (!done) {
      std::unique_ptr<comm::wire::Socket> socket = listener.accept(10);
      if (socket) fz::guarded([&] { serveConnection(*socket, input); });
    }
  });
  fz::guarded([&] {
    comm::TcpStoreOptions options;
    options.host = "127.0.0.1";
    options.port = listener.port();
    options.secret = fz::fuzzSecret();
    options.connect_timeout = Millis(300);
    options.io_timeout = Millis(500);
    options.handshake_timeout = Millis(500);
    comm::TcpStore store(options);
    for (std::size_t i = 0; i < std::max<std::size_t>(input.records.size(), 1); ++i)
      issueRequest(store, i);
  });
  done = true;
  server.join();
  return 0;
}
