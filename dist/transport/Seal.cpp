// Message seals of the data plane (see the header).
#include "dist/transport/Seal.h"

#include "core/Error.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <fmt/format.h>

#include <cstring>

namespace weft::dist {

namespace {

constexpr char kDataLabel[] = "weft-data-v1";
constexpr uint32_t kSealMagic = 0x53544657;  // the bytes 'W' 'F' 'T' 'S' in little-endian order

void putLe(uint8_t* out, uint64_t v, int width) {
  for (int i = 0; i < width; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}

uint64_t getLe(const uint8_t* in, int width) {
  uint64_t v = 0;
  for (int i = 0; i < width; ++i) v |= uint64_t{in[i]} << (8 * i);
  return v;
}

void checkOpenSsl(int ok, const char* what) { WEFT_CHECK(ok == 1, "OpenSSL {} failed", what); }

}  // namespace

EndpointName endpointName(uint8_t role, int host, int slot, uint8_t channel) {
  WEFT_CHECK(host >= 0 && host < (1 << 24) && slot >= 0 && slot < (1 << 24),
             "an endpoint's host ({}) and slot ({}) must each be below 2^24", host, slot);
  return uint64_t{role} << 56 | uint64_t{channel} << 48 | static_cast<uint64_t>(host) << 24 |
         static_cast<uint64_t>(slot);
}

std::string describeEndpoint(EndpointName name) {
  const auto role = static_cast<unsigned>(name >> 56), channel = static_cast<unsigned>((name >> 48) & 0xff);
  const auto host = static_cast<unsigned>((name >> 24) & 0xffffff), slot = static_cast<unsigned>(name & 0xffffff);
  const char* who = role == 0 ? "worker" : role == 1 ? "server" : "member";
  return fmt::format("endpoint {} of {} {} of host {}", channel, who, slot, host);
}

DataKey dataKey(const Secret& secret, const JobId& job, EndpointName from, EndpointName to) {
  std::vector<uint8_t> message(kDataLabel, kDataLabel + sizeof kDataLabel - 1);
  message.insert(message.end(), job.begin(), job.end());
  uint8_t names[16];
  putLe(names, from, 8);
  putLe(names + 8, to, 8);
  message.insert(message.end(), names, names + sizeof names);
  return hmacSha256(secret, message);
}

Gmac::Gmac(const DataKey& key) : context_(EVP_CIPHER_CTX_new()) {
  WEFT_CHECK(context_ != nullptr, "OpenSSL EVP_CIPHER_CTX_new failed");
  if (EVP_EncryptInit_ex(context_, EVP_aes_256_gcm(), nullptr, key.data(), nullptr) != 1) {
    EVP_CIPHER_CTX_free(context_);
    WEFT_THROW("OpenSSL AES-256-GCM key setup failed");
  }
}

Gmac::~Gmac() { EVP_CIPHER_CTX_free(context_); }

MacTag Gmac::compute(uint64_t counter, uint32_t part, std::initializer_list<std::span<const uint8_t>> parts) {
  uint8_t iv[12];
  putLe(iv, counter, 8);
  putLe(iv + 8, part, 4);
  checkOpenSsl(EVP_EncryptInit_ex(context_, nullptr, nullptr, nullptr, iv), "GCM IV setup");
  int length = 0;
  for (std::span<const uint8_t> bytes : parts) {
    // EVP takes int lengths: feed large payloads in pieces.
    for (size_t done = 0; done < bytes.size();) {
      const size_t piece = std::min<size_t>(bytes.size() - done, size_t{1} << 30);
      checkOpenSsl(EVP_EncryptUpdate(context_, nullptr, &length, bytes.data() + done, static_cast<int>(piece)),
                   "GMAC update");
      done += piece;
    }
  }
  uint8_t none[16];
  checkOpenSsl(EVP_EncryptFinal_ex(context_, none, &length), "GMAC final");
  MacTag tag{};
  checkOpenSsl(EVP_CIPHER_CTX_ctrl(context_, EVP_CTRL_GCM_GET_TAG, static_cast<int>(tag.size()), tag.data()),
               "GCM tag");
  return tag;
}

bool Gmac::verify(const MacTag& tag, uint64_t counter, uint32_t part,
                  std::initializer_list<std::span<const uint8_t>> parts) {
  const MacTag expected = compute(counter, part, parts);
  return CRYPTO_memcmp(expected.data(), tag.data(), tag.size()) == 0;
}

namespace {

/// Runs EVP's update over `bytes` in place, in pieces (EVP takes int lengths).
void cryptInPlace(evp_cipher_ctx_st* context, std::span<uint8_t> bytes, bool encrypting) {
  for (size_t done = 0; done < bytes.size();) {
    const size_t piece = std::min<size_t>(bytes.size() - done, size_t{1} << 30);
    int length = 0;
    uint8_t* at = bytes.data() + done;
    checkOpenSsl(encrypting ? EVP_EncryptUpdate(context, at, &length, at, static_cast<int>(piece))
                            : EVP_DecryptUpdate(context, at, &length, at, static_cast<int>(piece)),
                 encrypting ? "GCM encryption" : "GCM decryption");
    done += piece;
  }
}

void setIv(evp_cipher_ctx_st* context, uint64_t counter, uint32_t part, bool encrypting) {
  uint8_t iv[12];
  putLe(iv, counter, 8);
  putLe(iv + 8, part, 4);
  checkOpenSsl(encrypting ? EVP_EncryptInit_ex(context, nullptr, nullptr, nullptr, iv)
                          : EVP_DecryptInit_ex(context, nullptr, nullptr, nullptr, iv),
               "GCM IV setup");
}

}  // namespace

MacTag Gmac::encrypt(uint64_t counter, uint32_t part, std::span<uint8_t> bytes) {
  setIv(context_, counter, part, true);
  cryptInPlace(context_, bytes, true);
  int length = 0;
  uint8_t none[16];
  checkOpenSsl(EVP_EncryptFinal_ex(context_, none, &length), "GCM final");
  MacTag tag{};
  checkOpenSsl(EVP_CIPHER_CTX_ctrl(context_, EVP_CTRL_GCM_GET_TAG, static_cast<int>(tag.size()), tag.data()),
               "GCM tag");
  return tag;
}

bool Gmac::decrypt(const MacTag& tag, uint64_t counter, uint32_t part, std::span<uint8_t> bytes) {
  // The context switches direction with the IV and keeps its key schedule (GCM runs AES forward
  // both ways); compute() and encrypt() switch it back.
  setIv(context_, counter, part, false);
  cryptInPlace(context_, bytes, false);
  MacTag expected = tag;
  checkOpenSsl(EVP_CIPHER_CTX_ctrl(context_, EVP_CTRL_GCM_SET_TAG, static_cast<int>(expected.size()), expected.data()),
               "GCM tag setup");
  int length = 0;
  uint8_t none[16];
  return EVP_DecryptFinal_ex(context_, none, &length) > 0;
}

bool ReplayWindow::accept(uint64_t counter) {
  if (counter == 0) return false;
  if (counter > highest_) {
    const uint64_t advance = counter - highest_;
    if (advance >= kWidth) {
      seen_.reset();
    } else {
      for (uint64_t c = highest_ + 1; c < counter; ++c) seen_.reset(c % kWidth);
    }
    highest_ = counter;
    seen_.set(counter % kWidth);
    return true;
  }
  if (highest_ - counter >= kWidth || seen_.test(counter % kWidth)) return false;
  seen_.set(counter % kWidth);
  return true;
}

void Seal::encodeInto(std::span<uint8_t, kBytes> out) const {
  uint8_t* p = out.data();
  putLe(p, kSealMagic, 4);
  p[4] = kind;
  p[5] = encrypted ? 1 : 0;
  p[6] = p[7] = 0;
  putLe(p + 8, sender, 8);
  putLe(p + 16, counter, 8);
  putLe(p + 24, tag, 8);
  putLe(p + 32, payloadLength, 8);
  std::memcpy(p + 40, headerMac.data(), headerMac.size());
  std::memcpy(p + 56, payloadMac.data(), payloadMac.size());
}

bool Seal::wellFormed(std::span<const uint8_t> bytes) {
  const uint8_t* p = bytes.data();
  return bytes.size() >= kBytes && getLe(p, 4) == kSealMagic && p[4] <= Tagged && p[5] <= 1 && p[6] == 0 && p[7] == 0;
}

Seal Seal::decode(std::span<const uint8_t> bytes) {
  WEFT_CHECK(bytes.size() >= kBytes, "message seal: {} header bytes, a seal takes {}", bytes.size(), kBytes);
  const uint8_t* p = bytes.data();
  const uint64_t magic = getLe(p, 4);
  WEFT_CHECK(magic == kSealMagic, "message seal: bad magic {:#x}", magic);
  WEFT_CHECK(p[4] <= Tagged, "message seal: unknown kind {}", p[4]);
  WEFT_CHECK(p[5] <= 1, "message seal: the encrypted flag is {}, not 0 or 1", p[5]);
  WEFT_CHECK(p[6] == 0 && p[7] == 0, "message seal: padding is not zero");
  Seal s;
  s.kind = static_cast<Kind>(p[4]);
  s.encrypted = p[5] == 1;
  s.sender = getLe(p + 8, 8);
  s.counter = getLe(p + 16, 8);
  s.tag = getLe(p + 24, 8);
  s.payloadLength = getLe(p + 32, 8);
  std::memcpy(s.headerMac.data(), p + 40, s.headerMac.size());
  std::memcpy(s.payloadMac.data(), p + 56, s.payloadMac.size());
  return s;
}

}  // namespace weft::dist
