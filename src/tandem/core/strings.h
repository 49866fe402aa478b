#pragma once
#include <string>
#include <vector>

namespace tandem {

/// Edit distance between two strings (insertions, deletions, substitutions, transpositions).
size_t edit_distance(const std::string& a, const std::string& b);

/// The candidate closest to `word`, or "" when none is reasonably close.
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

/// ", did you mean 'x'?" when a close candidate exists, else "".
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

/// Joins with a separator.
std::string join(const std::vector<std::string>& parts, const std::string& sep);

/// Human-readable byte count: "1.50 GiB".
std::string format_bytes(double bytes);

/// Human-readable count: "1.26 B", "125.0 M".
std::string format_count(double n);

/// printf-style formatting into a std::string.
/// `s` with its line breaks turned into spaces and LibTorch's C++ frames ("Exception raised from
/// ...") cut off: an error message on one line.
std::string one_line(std::string s);

std::string strprintf(const char* format, ...) __attribute__((format(printf, 1, 2)));

/// Lower-case copy.
std::string to_lower(std::string s);

/// The parts of `s` between separators ("a,,b" -> "a", "", "b"; "" -> one empty part).
std::vector<std::string> split(const std::string& s, char sep);

/// s without leading and trailing spaces and tabs.
std::string trim(const std::string& s);

}  // namespace tandem
