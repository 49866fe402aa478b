// A run's token streams (data/dataset.h): the generated corpus is the same text whatever the run,
// the held-out split is the tail of the stream (or data.val_path whole), and a missing file is a
// user error.

#include "tandem/data/dataset.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "../error_of.h"
#include "../test_util.h"
#include "tandem/data/synthetic.h"

namespace tandem {
namespace {

using test::error_of;

std::vector<int64_t> tokens_of(const TokenBuffer& b) {
  std::vector<int64_t> out(static_cast<size_t>(b.size()));
  if (b.size() > 0) b.read(0, b.size(), out.data());
  return out;
}

std::vector<int64_t> bytes_of(const std::string& text) {
  std::vector<int64_t> out;
  for (char c : text) out.push_back(static_cast<unsigned char>(c));
  return out;
}

std::vector<int64_t> cat(std::vector<int64_t> a, const std::vector<int64_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(Dataset, TheGeneratedCorpusIsSplitIntoAHeadForTrainingAndATailHeldOut) {
  DataConfig c;
  c.synthetic_bytes = 3000;
  c.val_fraction = 0.1;
  const DataSplits s = open_data(c);
  EXPECT_EQ(s.train.size(), 2700);
  EXPECT_EQ(s.val.size(), 300);
  // Byte tokens of the corpus of the fixed seed: every run trains on the same text, its run seed
  // notwithstanding.
  const std::vector<int64_t> corpus = bytes_of(generate_corpus_text(3000, 20240520));
  EXPECT_EQ(cat(tokens_of(s.train), tokens_of(s.val)), corpus);
  EXPECT_EQ(tokens_of(s.val), std::vector<int64_t>(corpus.end() - 300, corpus.end()));
  EXPECT_NE(s.description.find("synthetic corpus (byte-level)"), std::string::npos) << s.description;
}

TEST(Dataset, TheHeldOutCountRoundsDownAndZeroHoldsNothingOut) {
  DataConfig c;
  c.synthetic_bytes = 999;
  c.val_fraction = 0.25;  // 249.75 tokens: 249 held out
  DataSplits s = open_data(c);
  EXPECT_EQ(s.val.size(), 249);
  EXPECT_EQ(s.train.size(), 750);
  c.val_fraction = 0;
  s = open_data(c);
  EXPECT_EQ(s.val.size(), 0);
  EXPECT_EQ(s.train.size(), 999);
  c.val_fraction = 0.0005;  // less than one token
  EXPECT_EQ(open_data(c).val.size(), 0);
}

TEST(Dataset, AFileIsSplitTheSameWayAndAValidationFileIsTakenWhole) {
  test::TempDir dir;
  std::ofstream(dir.file("train.txt"), std::ios::binary) << "0123456789abcdefghij";  // 20 byte tokens
  std::ofstream(dir.file("val.txt"), std::ios::binary) << "XYZ";
  DataConfig c;
  c.path = dir.file("train.txt");
  c.val_fraction = 0.2;
  DataSplits s = open_data(c);
  EXPECT_EQ(tokens_of(s.train), bytes_of("0123456789abcdef"));
  EXPECT_EQ(tokens_of(s.val), bytes_of("ghij"));
  EXPECT_NE(s.description.find(dir.file("train.txt")), std::string::npos) << s.description;
  // With data.val_path, all of data.path trains and the whole other file is held out; the
  // fraction is not applied to either.
  c.val_path = dir.file("val.txt");
  s = open_data(c);
  EXPECT_EQ(tokens_of(s.train), bytes_of("0123456789abcdefghij"));
  EXPECT_EQ(tokens_of(s.val), bytes_of("XYZ"));
}

TEST(Dataset, AMissingFileIsAUserErrorNamingIt) {
  test::TempDir dir;
  DataConfig c;
  c.path = dir.file("none.bin");
  EXPECT_NE(error_of([&] { open_data(c); }).find(dir.file("none.bin")), std::string::npos);
  std::ofstream(dir.file("train.txt")) << "some text for training";
  c.path = dir.file("train.txt");
  c.val_path = dir.file("missing_val.bin");
  EXPECT_NE(error_of([&] { open_data(c); }).find(dir.file("missing_val.bin")), std::string::npos);
}

}  // namespace
}  // namespace tandem
