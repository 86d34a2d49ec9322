#include "store/store_channel.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include <algorithm>
#include <utility>

#include "chorus/core/error.h"

namespace chorus::comm::wire {
namespace {

// Domain bytes: a header tag can never be taken for a frame tag, whatever the payload.
constexpr std::uint8_t kHeaderDomain = 1;
constexpr std::uint8_t kFrameDomain = 2;

Bytes concatenated(const Bytes& a, const Bytes& b) {
  Bytes out = a;
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

void putBigEndian(std::uint8_t* out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i)
    out[i] = static_cast<std::uint8_t>(value >> (8 * (bytes - 1 - i)));
}

std::uint64_t getBigEndian(const std::uint8_t* in, int bytes) {
  std::uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value = (value << 8) | in[i];
  return value;
}

[[noreturn]] void throwOpenSslFailure() {
  CHORUS_THROW(CommError, "HMAC-SHA256 failed in OpenSSL");
}

}  // namespace

SessionKeys deriveSessionKeys(const JobSecret& secret, const Bytes& server_nonce,
                              const Bytes& client_nonce) {
  const Bytes nonces = concatenated(server_nonce, client_nonce);
  return {secret.sign(kClientToServerLabel, nonces), secret.sign(kServerToClientLabel, nonces)};
}

FrameMac::FrameMac(const Bytes& key) {
  mac_ = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  context_ = mac_ ? EVP_MAC_CTX_new(mac_) : nullptr;
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                         OSSL_PARAM_construct_end()};
  if (context_ == nullptr || EVP_MAC_init(context_, key.data(), key.size(), params) != 1) {
    EVP_MAC_CTX_free(context_);
    EVP_MAC_free(mac_);
    throwOpenSslFailure();
  }
}

FrameMac::~FrameMac() {
  EVP_MAC_CTX_free(context_);
  EVP_MAC_free(mac_);
}

std::array<std::uint8_t, kDigestBytes> FrameMac::tag(std::uint8_t domain, const std::uint8_t* first,
                                                     std::size_t first_size,
                                                     const std::uint8_t* second,
                                                     std::size_t second_size) {
  std::array<std::uint8_t, kDigestBytes> out{};
  std::size_t length = 0;
  // A null key re-initialises HMAC with the key given in the constructor (its pads are kept).
  bool ok = EVP_MAC_init(context_, nullptr, 0, nullptr) == 1 &&
            EVP_MAC_update(context_, &domain, 1) == 1 &&
            EVP_MAC_update(context_, first, first_size) == 1 &&
            (second_size == 0 || EVP_MAC_update(context_, second, second_size) == 1) &&
            EVP_MAC_final(context_, out.data(), &length, out.size()) == 1;
  if (!ok || length != out.size()) throwOpenSslFailure();
  return out;
}

StoreChannel::StoreChannel(Socket& socket, const SessionKeys& keys, Role role)
    : socket_(socket),
      send_mac_(role == Role::kClient ? keys.client_to_server : keys.server_to_client),
      receive_mac_(role == Role::kClient ? keys.server_to_client : keys.client_to_server) {}

void StoreChannel::send(const Bytes& payload, Deadline deadline) {
  if (payload.size() > kMaxFrameBytes) {
    CHORUS_THROW(ConfigError, "a store message of ", payload.size(), " bytes exceeds the limit of ",
                 kMaxFrameBytes, " bytes");
  }
  Bytes frame(kHeaderBytes + kHeaderTagBytes + payload.size() + kFrameTagBytes);
  std::uint8_t* header = frame.data();
  putBigEndian(header, send_sequence_, 8);
  putBigEndian(header + 8, payload.size(), 4);
  auto header_tag = send_mac_.tag(kHeaderDomain, header, kHeaderBytes);
  std::copy_n(header_tag.begin(), kHeaderTagBytes, header + kHeaderBytes);
  std::copy(payload.begin(), payload.end(), header + kHeaderBytes + kHeaderTagBytes);
  auto frame_tag =
      send_mac_.tag(kFrameDomain, header, kHeaderBytes, payload.data(), payload.size());
  std::copy(frame_tag.begin(), frame_tag.end(), frame.end() - kFrameTagBytes);
  socket_.sendAll(frame, deadline);
  ++send_sequence_;
}

Bytes StoreChannel::receive(Deadline deadline) {
  std::uint8_t head[kHeaderBytes + kHeaderTagBytes];
  socket_.recvAll(head, sizeof(head), deadline);
  const std::uint64_t due = receive_sequence_;
  auto header_tag = receive_mac_.tag(kHeaderDomain, head, kHeaderBytes);
  if (CRYPTO_memcmp(header_tag.data(), head + kHeaderBytes, kHeaderTagBytes) != 0) {
    CHORUS_THROW(AuthError, "frame #", due, " from ", socket_.peer(),
                 " failed authentication: it was modified in transit or does not belong to this "
                 "connection");
  }
  const std::uint64_t sequence = getBigEndian(head, 8);
  if (sequence != due) {
    CHORUS_THROW(AuthError, "frame #", sequence, " from ", socket_.peer(), " arrived where #", due,
                 " was due: ",
                 sequence < due ? "a replayed frame" : "frames reordered or dropped in transit");
  }
  const auto size = static_cast<std::size_t>(getBigEndian(head + 8, 4));
  if (size > kMaxFrameBytes) {
    CHORUS_THROW(ProtocolError, "a frame of ", size, " bytes exceeds the limit of ", kMaxFrameBytes,
                 " bytes");
  }
  Bytes payload = socket_.recvBytes(size, deadline);
  std::uint8_t received_tag[kFrameTagBytes];
  socket_.recvAll(received_tag, sizeof(received_tag), deadline);
  auto frame_tag = receive_mac_.tag(kFrameDomain, head, kHeaderBytes, payload.data(), size);
  if (CRYPTO_memcmp(frame_tag.data(), received_tag, kFrameTagBytes) != 0) {
    CHORUS_THROW(AuthError, "frame #", due, " from ", socket_.peer(),
                 " failed authentication: its payload was modified in transit");
  }
  ++receive_sequence_;
  return payload;
}

}  // namespace chorus::comm::wire
