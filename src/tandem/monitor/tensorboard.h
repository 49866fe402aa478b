#pragma once
// TensorBoard scalars without TensorFlow: an event file (events.out.tfevents.*) of TFRecord
// records, each an Event protocol buffer encoded by hand (Note [TensorBoard event files]), so
// `tensorboard --logdir RUN_DIR/tensorboard` shows a run.

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem {

/// CRC-32C (Castagnoli) of `data`, and TFRecord's masked form of it.
uint32_t crc32c(std::string_view data);
uint32_t masked_crc32c(std::string_view data);

class TensorBoardWriter {
 public:
  /// Creates `dir` and a new event file in it; UserError when it cannot be written.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  /// One event holding these scalars at `step`, flushed (TensorBoard reads the file as it grows).
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values, double wall_time_s);
  const std::string& path() const { return path_; }

 private:
  void record(const std::string& event);
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace tandem
