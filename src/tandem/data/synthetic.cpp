#include "tandem/data/synthetic.h"

#include <array>
#include <random>
#include <vector>

namespace tandem {

std::string generate_corpus_text(int64_t bytes, uint64_t seed) {
  static const std::vector<std::string> kSubjects = {"the cat",    "a small dog",   "the old man",  "my sister",
                                                     "the robot",  "a young bird",  "the teacher",  "our neighbour",
                                                     "the farmer", "a tired horse", "the engineer", "the little girl"};
  static const std::vector<std::string> kVerbs = {"sees",  "likes",   "builds", "paints", "carries",
                                                  "finds", "follows", "cleans", "opens",  "watches"};
  static const std::vector<std::string> kObjects = {
      "a red ball",      "the blue house", "a long road",      "the green door", "a wooden box",
      "the bright moon", "a cold river",   "the quiet garden", "a heavy stone",  "the open window"};
  static const std::vector<std::string> kPlaces = {"in the morning", "at night",    "near the sea",
                                                   "after school",   "in the rain", "on sunday"};
  static const std::array<const char*, 10> kDigits = {"zero", "one", "two",   "three", "four",
                                                      "five", "six", "seven", "eight", "nine"};
  std::mt19937_64 rng(seed);
  const auto pick = [&](const std::vector<std::string>& v) -> const std::string& {
    return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)];
  };
  std::string out;
  out.reserve(static_cast<size_t>(bytes) + 128);
  while (static_cast<int64_t>(out.size()) < bytes) {
    const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
    if (kind < 6) {
      // Agreement structure: the subject recurs as "it"/"they"-free pronoun-less second clause.
      const std::string& s = pick(kSubjects);
      out += s + " " + pick(kVerbs) + " " + pick(kObjects);
      if (kind < 3) out += " " + pick(kPlaces);
      out += ". then " + s + " " + pick(kVerbs) + " " + pick(kObjects) + ".\n";
    } else if (kind < 8) {
      // Counting: a start digit and the next four in words.
      int d = std::uniform_int_distribution<int>(0, 5)(rng);
      out += "count:";
      for (int i = 0; i < 5; ++i) out += std::string(" ") + kDigits[d + i];
      out += ".\n";
    } else {
      const int a = std::uniform_int_distribution<int>(0, 9)(rng);
      const int b = std::uniform_int_distribution<int>(0, 9)(rng);
      out += std::to_string(a) + " + " + std::to_string(b) + " = " + std::to_string(a + b) + "\n";
    }
  }
  out.resize(static_cast<size_t>(bytes));
  return out;
}

}  // namespace tandem
