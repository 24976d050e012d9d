// The data plane's seals (dist/transport/Seal.h): keys per direction, GMACs that catch any changed bit,
// the replay window, and the seal's wire layout.
#include "tests/TestUtil.h"

#include "dist/transport/Seal.h"

using namespace weft;
using namespace weft::dist;

namespace {

Secret secretOf(uint8_t seed) {
  Secret s{};
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<uint8_t>(seed + i);
  return s;
}

const JobId kJob = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
const EndpointName kWorker = endpointName(0, 0, 1, 0), kServer = endpointName(1, 2, 0, 0);

std::vector<uint8_t> bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(seed + 13 * i);
  return out;
}

}  // namespace

TEST_CASE("dataKey: each direction, job and secret has its own key") {
  const DataKey key = dataKey(secretOf(1), kJob, kWorker, kServer);
  CHECK(key == dataKey(secretOf(1), kJob, kWorker, kServer));
  CHECK(key != dataKey(secretOf(1), kJob, kServer, kWorker));
  CHECK(key != dataKey(secretOf(2), kJob, kWorker, kServer));
  JobId other = kJob;
  other[0] ^= 1;
  CHECK(key != dataKey(secretOf(1), other, kWorker, kServer));
}

TEST_CASE("Gmac: a tag verifies for its bytes, counter and part, and for nothing else") {
  Gmac mac(dataKey(secretOf(1), kJob, kWorker, kServer));
  const std::vector<uint8_t> header = bytes(40, 1), payload = bytes(1000, 2);
  const MacTag tag = mac.compute(7, 1, {header, payload});
  CHECK(mac.verify(tag, 7, 1, {header, payload}));
  CHECK_FALSE(mac.verify(tag, 8, 1, {header, payload}));
  CHECK_FALSE(mac.verify(tag, 7, 0, {header, payload}));
  for (size_t bit : {size_t{0}, size_t{333}, size_t{7999}}) {
    std::vector<uint8_t> flipped = payload;
    flipped[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    CHECK_FALSE(mac.verify(tag, 7, 1, {header, flipped}));
  }
  Gmac otherKey(dataKey(secretOf(2), kJob, kWorker, kServer));
  CHECK_FALSE(otherKey.verify(tag, 7, 1, {header, payload}));
}

TEST_CASE("Gmac: encryption round-trips; the ciphertext hides the bytes, and a changed bit, counter or key fails") {
  Gmac sender(dataKey(secretOf(1), kJob, kWorker, kServer)), receiver(dataKey(secretOf(1), kJob, kWorker, kServer));
  const std::vector<uint8_t> payload = bytes(1000, 2);
  std::vector<uint8_t> wire = payload;
  const MacTag tag = sender.encrypt(7, 1, wire);
  size_t same = 0;
  for (size_t i = 0; i < wire.size(); ++i) same += wire[i] == payload[i];
  CHECK(same < 20);  // about 4 of 1,000 bytes agree by chance
  // The tag is GCM's over the ciphertext: a GMAC of the plaintext is another value.
  CHECK(tag != sender.compute(7, 1, {payload}));
  std::vector<uint8_t> opened = wire;
  CHECK(receiver.decrypt(tag, 7, 1, opened));
  CHECK(opened == payload);
  for (size_t bit : {size_t{0}, size_t{333}, size_t{7999}}) {
    std::vector<uint8_t> flipped = wire;
    flipped[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    CHECK_FALSE(receiver.decrypt(tag, 7, 1, flipped));
  }
  std::vector<uint8_t> copy = wire;
  CHECK_FALSE(receiver.decrypt(tag, 8, 1, copy));
  copy = wire;
  CHECK_FALSE(Gmac(dataKey(secretOf(2), kJob, kWorker, kServer)).decrypt(tag, 7, 1, copy));
  // The context goes on computing tags after decrypting.
  const std::vector<uint8_t> header = bytes(40, 1);
  CHECK(receiver.compute(9, 0, {header}) == sender.compute(9, 0, {header}));
  std::vector<uint8_t> empty;
  CHECK(receiver.decrypt(sender.encrypt(10, 1, empty), 10, 1, empty));
}

TEST_CASE("ReplayWindow: every counter is accepted once, in any order within the window") {
  ReplayWindow window;
  CHECK_FALSE(window.accept(0));
  CHECK(window.accept(5));
  CHECK(window.accept(3));
  CHECK_FALSE(window.accept(5));
  CHECK_FALSE(window.accept(3));
  CHECK(window.accept(4));
  CHECK(window.accept(5 + ReplayWindow::kWidth - 1));
  CHECK_FALSE(window.accept(4));  // fell out of the window
  CHECK(window.accept(6));        // still inside it
  CHECK(window.accept(10 * ReplayWindow::kWidth));
  CHECK_FALSE(window.accept(10 * ReplayWindow::kWidth));
  CHECK_FALSE(window.accept(6));
}

TEST_CASE("Seal: encodes and decodes every field; a short, foreign, padded or unknown-flag header is refused") {
  Seal seal;
  seal.kind = Seal::Tagged;
  seal.sender = kServer;
  seal.counter = 0x0102030405060708;
  seal.tag = 0xfedcba9876543210;
  seal.payloadLength = 1ull << 40;
  seal.headerMac.fill(0xaa);
  seal.payloadMac.fill(0x55);
  std::array<uint8_t, Seal::kBytes> encoded{};
  seal.encodeInto(encoded);
  const Seal back = Seal::decode(encoded);
  CHECK(back.kind == seal.kind);
  CHECK(back.sender == seal.sender);
  CHECK(back.counter == seal.counter);
  CHECK(back.tag == seal.tag);
  CHECK(back.payloadLength == seal.payloadLength);
  CHECK(back.headerMac == seal.headerMac);
  CHECK(back.payloadMac == seal.payloadMac);
  CHECK_FALSE(back.encrypted);
  seal.encrypted = true;
  seal.encodeInto(encoded);
  CHECK(Seal::decode(encoded).encrypted);

  CHECK(errorOf([&] { Seal::decode(std::span(encoded).first(3)); }) ==
        "message seal: 3 header bytes, a seal takes 72");
  std::array<uint8_t, Seal::kBytes> bad = encoded;
  bad[0] ^= 1;
  CHECK(contains(errorOf([&] { Seal::decode(bad); }), "message seal: bad magic"));
  bad = encoded;
  bad[4] = 9;
  CHECK(errorOf([&] { Seal::decode(bad); }) == "message seal: unknown kind 9");
  bad = encoded;
  bad[5] = 2;
  CHECK(errorOf([&] { Seal::decode(bad); }) == "message seal: the encrypted flag is 2, not 0 or 1");
  CHECK_FALSE(Seal::wellFormed(bad));
  bad = encoded;
  bad[6] = 1;
  CHECK(errorOf([&] { Seal::decode(bad); }) == "message seal: padding is not zero");
}

TEST_CASE("describeEndpoint: names the member and its transport") {
  CHECK(describeEndpoint(endpointName(0, 3, 2, 1)) == "endpoint 1 of worker 2 of host 3");
  CHECK(describeEndpoint(endpointName(1, 0, 0, 0)) == "endpoint 0 of server 0 of host 0");
}
