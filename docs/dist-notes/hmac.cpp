#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <array>
#include <span>
#include <stdexcept>

using Mac = std::array<unsigned char, 32>;

Mac hmacSha256(std::span<const unsigned char> key, std::span<const unsigned char> msg) {
    EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
    EVP_MAC_CTX* ctx = mac ? EVP_MAC_CTX_new(mac) : nullptr;
    char digest[] = "SHA256";
    const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                                 OSSL_PARAM_construct_end()};
    Mac out{};
    size_t len = 0;
    const bool ok = ctx && EVP_MAC_init(ctx, key.data(), key.size(), params) == 1 &&
                    EVP_MAC_update(ctx, msg.data(), msg.size()) == 1 &&
                    EVP_MAC_final(ctx, out.data(), &len, out.size()) == 1 && len == out.size();
    EVP_MAC_CTX_free(ctx);
    EVP_MAC_free(mac);
    if (!ok) throw std::runtime_error("HMAC-SHA256 failed");
    return out;
}
bool macEqual(const Mac& a, const Mac& b) { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }
std::array<unsigned char, 32> nonce() {
    std::array<unsigned char, 32> n{};
    if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) throw std::runtime_error("RAND_bytes");
    return n;
}
