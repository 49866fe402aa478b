#include "tandem/data/loader.h"

#include "tandem/core/error.h"

namespace tandem {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

std::vector<int64_t> sample_offsets(uint64_t seed, int64_t index, int64_t batch, int64_t seq_len, int64_t n_tokens,
                                    int64_t first_row) {
  const uint64_t range = static_cast<uint64_t>(n_tokens - seq_len);  // offsets 0 .. n - T - 1
  std::vector<int64_t> out(batch);
  for (int64_t r = 0; r < batch; ++r) {
    const uint64_t h =
        splitmix64(splitmix64(seed ^ splitmix64(static_cast<uint64_t>(index))) + static_cast<uint64_t>(first_row + r));
    out[r] = static_cast<int64_t>(h % range);
  }
  return out;
}

BatchLoader::BatchLoader(TokenBuffer tokens, int64_t batch, int64_t seq_len, uint64_t seed, torch::Device device,
                         int64_t prefetch, int64_t vocab_limit, std::string split_name, int64_t first_row)
    : tokens_(std::move(tokens)),
      batch_(batch),
      seq_len_(seq_len),
      first_row_(first_row),
      seed_(seed),
      device_(device),
      prefetch_(prefetch),
      vocab_limit_(vocab_limit),
      split_(std::move(split_name)),
      pin_(device.is_cuda()) {
  // One window is T + 1 tokens (the inputs and, shifted by one, the targets).
  TANDEM_CHECK(tokens_.size() >= seq_len_ + 1, "the ", split_, " split has ", tokens_.size(),
               " tokens, too few for one sequence of train.seq_len=", seq_len_,
               "; use more data or a shorter train.seq_len");
  thread_ = std::thread([this] { worker(); });
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

torch::Tensor BatchLoader::make_host_batch(int64_t index) const {
  auto opts = torch::TensorOptions().dtype(torch::kInt64).pinned_memory(pin_);
  auto host = torch::empty({2, batch_, seq_len_}, opts);
  int64_t* in = host[0].data_ptr<int64_t>();
  int64_t* tg = host[1].data_ptr<int64_t>();
  std::vector<int64_t> window(seq_len_ + 1);
  const auto offsets = sample_offsets(seed_, index, batch_, seq_len_, tokens_.size(), first_row_);
  for (int64_t r = 0; r < batch_; ++r) {
    tokens_.read(offsets[r], seq_len_ + 1, window.data());
    for (int64_t t = 0; t <= seq_len_; ++t) {
      TANDEM_CHECK(window[t] >= 0 && window[t] < vocab_limit_, "token id ", window[t], " at position ", offsets[r] + t,
                   " of the ", split_, " data (", tokens_.description(), ") is outside the model's vocabulary of ",
                   vocab_limit_, "; set model.vocab_size above it");
    }
    std::copy(window.begin(), window.end() - 1, in + r * seq_len_);
    std::copy(window.begin() + 1, window.end(), tg + r * seq_len_);
  }
  return host;
}

void BatchLoader::worker() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || (!error_ && static_cast<int64_t>(ready_.size()) < prefetch_); });
    if (stop_) return;
    const int64_t index = next_to_make_++;
    const uint64_t gen = generation_;
    lock.unlock();
    torch::Tensor host;
    std::exception_ptr err;
    try {
      host = make_host_batch(index);
    } catch (...) {
      err = std::current_exception();
    }
    lock.lock();
    if (gen != generation_) continue;  // a seek happened meanwhile: drop it
    if (err)
      error_ = err;
    else
      ready_.emplace_back(index, std::move(host));
    cv_.notify_all();
  }
}

Batch BatchLoader::next() {
  torch::Tensor host;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return error_ || !ready_.empty(); });
    if (!ready_.empty()) {
      TANDEM_ASSERT(ready_.front().first == position_, "loader out of order");
      host = std::move(ready_.front().second);
      ready_.pop_front();
    } else {
      std::rethrow_exception(error_);
    }
  }
  cv_.notify_all();
  auto dev = host.to(device_, /*non_blocking=*/true);
  Batch b{dev[0], dev[1], position_};
  ++position_;
  return b;
}

void BatchLoader::seek(int64_t position) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ready_.clear();
    error_ = nullptr;
    next_to_make_ = position;
    position_ = position;
    ++generation_;
  }
  cv_.notify_all();
}

}  // namespace tandem
