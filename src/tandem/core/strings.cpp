#include "tandem/core/strings.h"

#include <algorithm>
#include <cctype>
#include <cstdarg>
#include <cstdio>

namespace tandem {

size_t edit_distance(const std::string& a, const std::string& b) {
  // Optimal string alignment distance: Levenshtein plus adjacent transpositions.
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[n][m];
}

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& c : candidates) {
    // Compare also against the last dotted component, so "stpes" finds "train.steps".
    size_t d = edit_distance(word, c);
    const auto dot = c.rfind('.');
    if (dot != std::string::npos && word.find('.') == std::string::npos)
      d = std::min(d, edit_distance(word, c.substr(dot + 1)) + 1);
    if (d < best_d) best_d = d, best = c;
  }
  const size_t limit = std::max<size_t>(3, word.size() / 2);
  return best_d <= limit ? best : std::string();
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string c = closest_match(word, candidates);
  return c.empty() ? std::string() : ", did you mean '" + c + "'?";
}

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) bytes /= 1024.0, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

std::string format_count(double n) {
  char buf[32];
  if (n >= 1e12)
    std::snprintf(buf, sizeof buf, "%.2f T", n / 1e12);
  else if (n >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2f B", n / 1e9);
  else if (n >= 1e6)
    std::snprintf(buf, sizeof buf, "%.1f M", n / 1e6);
  else if (n >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1f K", n / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f", n);
  return buf;
}

std::string strprintf(const char* format, ...) {
  va_list args;
  va_start(args, format);
  va_list copy;
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, format, copy);
  va_end(copy);
  std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, format, args);
  va_end(args);
  return out;
}

std::string to_lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

std::string one_line(std::string s) {
  // LibTorch's errors carry the C++ frames after this; the message is before it.
  const auto frames = s.find("Exception raised from ");
  if (frames != std::string::npos && frames > 0) s = trim(s.substr(0, frames));
  for (auto& ch : s)
    if (ch == '\n' || ch == '\r') ch = ' ';
  return trim(s);
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out(1);
  for (const char c : s) {
    if (c == sep)
      out.emplace_back();
    else
      out.back() += c;
  }
  return out;
}

}  // namespace tandem
