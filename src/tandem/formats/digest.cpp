#include "tandem/formats/digest.h"

#include <openssl/evp.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "tandem/core/error.h"

namespace tandem {

// A failure of the environment (libcrypto), not of tandem: a UserError that says where to look.
constexpr const char* kOpenSslFailed =
    "OpenSSL's SHA-256 (libcrypto) failed; check the OpenSSL installation (libssl3) -- step: ";
namespace {

struct MdCtxFree {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
using MdCtx = std::unique_ptr<EVP_MD_CTX, MdCtxFree>;

MdCtx new_sha256() {
  MdCtx ctx(EVP_MD_CTX_new());
  TANDEM_CHECK(ctx && EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1, kOpenSslFailed, "init");
  return ctx;
}

std::string finish_hex(EVP_MD_CTX* ctx) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  TANDEM_CHECK(EVP_DigestFinal_ex(ctx, md, &n) == 1, kOpenSslFailed, "final");
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < n; ++i) out += hex[md[i] >> 4], out += hex[md[i] & 15];
  return out;
}

}  // namespace

std::string sha256_file(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  TANDEM_CHECK(f != nullptr, "cannot read '", path, "' to check its SHA-256: ", std::strerror(errno));
  auto ctx = new_sha256();
  std::vector<char> buf(size_t{8} << 20);
  for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0;)
    TANDEM_CHECK(EVP_DigestUpdate(ctx.get(), buf.data(), n) == 1, kOpenSslFailed, "update");
  TANDEM_CHECK(!std::ferror(f.get()), "read error in '", path, "' while checking its SHA-256");
  return finish_hex(ctx.get());
}

}  // namespace tandem
