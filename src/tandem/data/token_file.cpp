#include "tandem/data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "tandem/core/error.h"
#include "tandem/core/strings.h"

namespace tandem {

struct TokenBuffer::Storage {
  void* map = nullptr;
  size_t map_bytes = 0;
  std::vector<uint16_t> owned;
  ~Storage() {
    if (map) munmap(map, map_bytes);
  }
};

namespace {

std::string extension(const std::string& path) {
  const auto slash = path.rfind('/');
  const auto dot = path.rfind('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return "";
  return to_lower(path.substr(dot + 1));
}

bool looks_like_llmc_magic(int32_t v) { return v >= 20240000 && v <= 20249999; }

// Whether the first 1024 bytes have the rest of an llm.c header's shape: version 1 or 2, and a
// token count that, at that version's token size, accounts for the file's size exactly. A raw
// uint16 file matches this only by a coincidence of three numbers.
bool looks_like_llmc_header(const int32_t* header, int64_t file_bytes) {
  if (header[1] != kLlmcVersionU16 && header[1] != kLlmcVersionU32) return false;
  const int64_t bpt = header[1] == kLlmcVersionU16 ? 2 : 4;
  return header[2] > 0 && kLlmcHeaderBytes + int64_t{header[2]} * bpt == file_bytes;
}

}  // namespace

TokenBuffer TokenBuffer::from_tokens(std::vector<uint16_t> tokens, std::string description) {
  TokenBuffer b;
  b.storage_ = std::make_shared<Storage>();
  b.storage_->owned = std::move(tokens);
  b.data_ = reinterpret_cast<const unsigned char*>(b.storage_->owned.data());
  b.bytes_per_token_ = 2;
  b.size_ = static_cast<int64_t>(b.storage_->owned.size());
  b.description_ = std::move(description);
  return b;
}

TokenBuffer TokenBuffer::open(const std::string& path, TokenFormat format) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TANDEM_CHECK(fd >= 0, "cannot open token file '", path, "': ", std::strerror(errno), "; check data.path");
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    TANDEM_FAIL("token file '", path, "' is not a regular file; check data.path");
  }
  const int64_t file_bytes = st.st_size;

  // Read the first int32 to recognise llm.c files.
  bool guessed = false;  // data.format=auto chose the format
  int32_t first = 0;
  const bool has_first = file_bytes >= 4 && ::pread(fd, &first, 4, 0) == 4;
  if (format == TokenFormat::kAuto) {
    // Note [Token file detection]: an llm.c magic (even in a file too short for its header) or a
    // header whose version and token count fit the file is read as llm.c, where a wrong magic,
    // version or size is refused; other .bin/.u16/.tok files are raw nanoGPT tokens, the rest text.
    // The guess is part of the description the trainer logs.
    const std::string ext = extension(path);
    int32_t header[256] = {};
    const bool has_header =
        file_bytes >= kLlmcHeaderBytes && ::pread(fd, header, sizeof header, 0) == static_cast<ssize_t>(sizeof header);
    if ((has_first && looks_like_llmc_magic(first)) || (has_header && looks_like_llmc_header(header, file_bytes)))
      format = TokenFormat::kLlmc;
    else if (ext == "bin" || ext == "u16" || ext == "tok")
      format = TokenFormat::kNanoGpt;
    else
      format = TokenFormat::kText;
    guessed = true;
  }

  if (format == TokenFormat::kText) {
    ::close(fd);
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    TANDEM_CHECK(!text.empty(), "text file '", path, "' is empty; give a file with training text");
    return from_tokens(byte_tokenize(text), "text (byte-level" + std::string(guessed ? ", by data.format=auto" : "") +
                                                "), " + format_count(double(text.size())) + " tokens from " + path);
  }

  int64_t header_bytes = 0, count = 0;
  int bpt = 2;
  std::string kind;
  if (format == TokenFormat::kLlmc) {
    if (file_bytes < kLlmcHeaderBytes) {
      ::close(fd);
      TANDEM_FAIL("llm.c token file '", path, "' is truncated: ", file_bytes,
                  " bytes, shorter than its 1024-byte header; regenerate the file");
    }
    int32_t header[256];
    if (::pread(fd, header, sizeof header, 0) != static_cast<ssize_t>(sizeof header)) {
      ::close(fd);
      TANDEM_FAIL("cannot read the header of '", path, "'");
    }
    if (header[0] == kLlmcMagicU16) {
      bpt = 2;
      if (header[1] != kLlmcVersionU16) {
        ::close(fd);
        TANDEM_FAIL("llm.c token file '", path, "' has version ", header[1], " for magic ", kLlmcMagicU16,
                    "; expected ", kLlmcVersionU16, " (uint16 tokens)");
      }
    } else if (header[0] == kLlmcMagicU32) {
      bpt = 4;
      if (header[1] != kLlmcVersionU32) {
        ::close(fd);
        TANDEM_FAIL("llm.c token file '", path, "' has version ", header[1], " for magic ", kLlmcMagicU32,
                    "; expected ", kLlmcVersionU32, " (uint32 tokens)");
      }
    } else {
      ::close(fd);
      TANDEM_FAIL("token file '", path, "' has magic ", header[0], ", not an llm.c magic (", kLlmcMagicU16, " or ",
                  kLlmcMagicU32, "); for a raw uint16 file set data.format=nanogpt");
    }
    count = header[2];
    header_bytes = kLlmcHeaderBytes;
    const int64_t expected = kLlmcHeaderBytes + count * bpt;
    if (count <= 0 || file_bytes != expected) {
      ::close(fd);
      TANDEM_FAIL("llm.c token file '", path, "' is ", file_bytes < expected ? "truncated" : "inconsistent",
                  ": its header says ", count, " tokens (", expected, " bytes) but the file has ", file_bytes,
                  " bytes; regenerate or re-download it");
    }
    kind = bpt == 2 ? "llm.c uint16" : "llm.c uint32";
  } else {
    if (file_bytes == 0 || file_bytes % 2 != 0) {
      ::close(fd);
      TANDEM_FAIL("nanoGPT token file '", path, "' has ", file_bytes,
                  " bytes; a raw uint16 file has a non-zero even size",
                  file_bytes % 2 ? " (it is probably truncated)" : "");
    }
    count = file_bytes / 2;
    kind = guessed ? "nanoGPT uint16 (no llm.c header; data.format=auto)" : "nanoGPT uint16";
  }

  void* map = mmap(nullptr, static_cast<size_t>(file_bytes), PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  TANDEM_CHECK(map != MAP_FAILED, "cannot map token file '", path, "': ", std::strerror(err));
  madvise(map, static_cast<size_t>(file_bytes), MADV_RANDOM);

  TokenBuffer b;
  b.storage_ = std::make_shared<Storage>();
  b.storage_->map = map;
  b.storage_->map_bytes = static_cast<size_t>(file_bytes);
  b.data_ = static_cast<const unsigned char*>(map) + header_bytes;
  b.bytes_per_token_ = bpt;
  b.size_ = count;
  b.description_ = kind + ", " + format_count(double(count)) + " tokens from " + path;
  return b;
}

int64_t TokenBuffer::at(int64_t i) const {
  TANDEM_ASSERT(i >= 0 && i < size_, "token index ", i, " out of ", size_);
  if (bytes_per_token_ == 2) {
    uint16_t v;
    std::memcpy(&v, data_ + 2 * i, 2);
    return v;
  }
  uint32_t v;
  std::memcpy(&v, data_ + 4 * i, 4);
  return v;
}

void TokenBuffer::read(int64_t begin, int64_t n, int64_t* out) const {
  TANDEM_ASSERT(begin >= 0 && n >= 0 && begin + n <= size_, "read [", begin, ", ", begin + n, ") of ", size_);
  if (bytes_per_token_ == 2) {
    const unsigned char* p = data_ + 2 * begin;
    for (int64_t i = 0; i < n; ++i) {
      uint16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      out[i] = v;
    }
  } else {
    const unsigned char* p = data_ + 4 * begin;
    for (int64_t i = 0; i < n; ++i) {
      uint32_t v;
      std::memcpy(&v, p + 4 * i, 4);
      out[i] = v;
    }
  }
}

TokenBuffer TokenBuffer::slice(int64_t begin, int64_t end) const {
  TANDEM_ASSERT(begin >= 0 && begin <= end && end <= size_);
  TokenBuffer b = *this;
  b.data_ = data_ + bytes_per_token_ * begin;
  b.size_ = end - begin;
  return b;
}

int64_t TokenBuffer::max_token() const {
  int64_t m = -1;
  std::vector<int64_t> chunk(1 << 16);
  for (int64_t i = 0; i < size_; i += static_cast<int64_t>(chunk.size())) {
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(chunk.size()), size_ - i);
    read(i, n, chunk.data());
    for (int64_t j = 0; j < n; ++j) m = std::max(m, chunk[j]);
  }
  return m;
}

std::vector<uint16_t> byte_tokenize(const std::string& text) {
  std::vector<uint16_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

std::string byte_detokenize(const std::vector<int64_t>& tokens) {
  std::string s;
  for (auto t : tokens) s.push_back(t >= 0 && t < 256 ? static_cast<char>(t) : '?');
  return s;
}

}  // namespace tandem
