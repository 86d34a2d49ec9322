// The requests of the store's wire protocol, executed on the server's state (the connection
// handling is in tcp_store_server.cc).
#include "chorus/comm/store/tcp_store.h"
#include "chorus/core/error.h"
#include "store/store_protocol.h"

namespace chorus::comm {
namespace {

using wire::Op;
using wire::Status;

wire::Writer startReply(Status status) {
  wire::Writer out;
  out.u8(static_cast<std::uint8_t>(status));
  return out;
}

// The limits of store_protocol.h, enforced on what a peer sent: a CommError here becomes an
// error reply, and the connection stays (the frame was whole and authentic, the stream is in
// sync); only the request is refused.
std::string checkedKey(std::string key) {
  std::string problem = wire::keyProblem(key);
  if (!problem.empty()) CHORUS_THROW(CommError, problem);
  return key;
}

std::vector<std::string> checkedKeys(std::vector<std::string> keys) {
  for (const std::string& key : keys) {
    std::string problem = wire::keyProblem(key);
    if (!problem.empty()) CHORUS_THROW(CommError, problem);
  }
  return keys;
}

Bytes checkedValue(Bytes value) {
  std::string problem = wire::valueProblem(value);
  if (!problem.empty()) CHORUS_THROW(CommError, problem);
  return value;
}

}  // namespace

Bytes TcpStoreServer::execute(const Bytes& request) {
  wire::Reader in(request);
  auto op = static_cast<Op>(in.u8());
  try {
    switch (op) {
      case Op::kGet:
        return executeGet(in);
      case Op::kWait:
        return executeWait(in);
      default:
        return executeImmediate(op, in);
    }
  } catch (const ProtocolError&) {
    throw;  // the connection is dropped: its stream can no longer be trusted
  } catch (const CommError& error) {
    return startReply(Status::kError).str(error.message()).payload();
  }
}

Bytes TcpStoreServer::executeGet(wire::Reader& in) {
  std::string key = checkedKey(in.str());
  Millis timeout(in.i64());
  in.finish();
  std::optional<Bytes> value = state_.getFor(key, timeout);
  if (!value) return startReply(Status::kTimeout).strings({key}).payload();
  return startReply(Status::kOk).bytes(*value).payload();
}

Bytes TcpStoreServer::executeWait(wire::Reader& in) {
  std::vector<std::string> keys = checkedKeys(in.strings());
  Millis timeout(in.i64());
  in.finish();
  std::vector<std::string> missing = state_.waitFor(keys, timeout);
  if (!missing.empty()) return startReply(Status::kTimeout).strings(missing).payload();
  return startReply(Status::kOk).payload();
}

Bytes TcpStoreServer::executeImmediate(wire::Op op, wire::Reader& in) {
  wire::Writer ok = startReply(Status::kOk);
  std::string key = op == Op::kCheck || op == Op::kNumKeys ? std::string() : checkedKey(in.str());
  switch (op) {
    case Op::kSet: {
      Bytes value = checkedValue(in.bytes());
      in.finish();
      state_.set(key, value);
      return ok.payload();
    }
    case Op::kAdd: {
      std::int64_t delta = in.i64();
      in.finish();
      return ok.i64(state_.add(key, delta)).payload();
    }
    case Op::kCompareSet: {
      Bytes expected = checkedValue(in.bytes());
      Bytes desired = checkedValue(in.bytes());
      in.finish();
      return ok.bytes(state_.compareSet(key, expected, desired)).payload();
    }
    case Op::kCheck: {
      std::vector<std::string> keys = checkedKeys(in.strings());
      in.finish();
      return ok.u8(state_.check(keys) ? 1 : 0).payload();
    }
    case Op::kDelete:
      in.finish();
      return ok.u8(state_.deleteKey(key) ? 1 : 0).payload();
    case Op::kNumKeys:
      in.finish();
      return ok.i64(state_.numKeys()).payload();
    default:
      CHORUS_THROW(ProtocolError, "unknown store request type ", static_cast<int>(op));
  }
}

}  // namespace chorus::comm
