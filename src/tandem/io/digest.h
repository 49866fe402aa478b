#pragma once
// SHA-256 of files (OpenSSL's libcrypto), for checkpoint manifests.

#include <string>

namespace tandem {

/// Lower-case hex SHA-256 of a file's bytes; UserError when it cannot be read.
std::string sha256_file(const std::string& path);

/// Lower-case hex SHA-256 of bytes in memory.
std::string sha256_hex(const std::string& bytes);

}  // namespace tandem
