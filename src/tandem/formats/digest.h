#pragma once
// SHA-256 of files (OpenSSL's libcrypto), for checkpoint manifests.

#include <string>

namespace tandem {

/// Lower-case hex SHA-256 of a file's bytes; UserError when it cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace tandem
