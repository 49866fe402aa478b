#include "tandem/parallel/strict_p2p.h"

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "tandem/core/strings.h"

namespace tandem {

// Note [Strict point to point]
// NCCL runs a rank's sends and receives with one peer (within one process group) on one stream,
// in the order they were issued, and a send completes only once the peer's stream has reached the
// matching receive: the messages between two ranks match by their order, tags are ignored. Gloo,
// which carries host tensors, buffers a send and matches by tag, so an order that deadlocks on GPUs
// runs on CPUs: the 1F1B pipeline did, over Gloo in every test, and hung on its first two H100s.
// The strict backend gives a Gloo group NCCL's semantics. Per peer one worker thread (the stream)
// runs the operations in issue order; the k-th message from A to B is a rendezvous in the store:
// B's worker, on reaching its k-th receive from A, posts "ready" with the tag it expects; A's
// worker, on reaching its k-th send to B, waits for that post, checks that the tags agree (else
// both fail: NCCL would have delivered the wrong tensor), answers "go", and only then moves the
// tensor through Gloo. While a worker waits it reads where the peer's worker stands (each worker
// posts its current operation): two workers each waiting to send to the other, or each waiting to
// receive from the other, can never proceed under NCCL, and both fail at once with both
// operations named. Any other wait fails after the timeout, with the same detail. A worker that
// failed posts why, which fails its peer's waiting worker at once, and fails every later operation
// on its lane, as a broken NCCL communicator would.

namespace {

using Clock = std::chrono::steady_clock;

struct OpState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
};

class StrictWork : public c10d::Work {
 public:
  StrictWork(std::shared_ptr<OpState> state, c10d::OpType type) : Work(-1, type), state_(std::move(state)) {}

  bool isCompleted() override {
    std::lock_guard<std::mutex> lk(state_->mu);
    return state_->done;
  }
  bool isSuccess() const override {
    std::lock_guard<std::mutex> lk(state_->mu);
    return state_->done && !state_->error;
  }
  std::exception_ptr exception() const override {
    std::lock_guard<std::mutex> lk(state_->mu);
    return state_->error;
  }
  bool wait(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lk(state_->mu);
    if (timeout == ::kNoTimeout) {
      state_->cv.wait(lk, [&] { return state_->done; });
    } else if (!state_->cv.wait_for(lk, timeout, [&] { return state_->done; })) {
      throw std::runtime_error("strict point-to-point operation: wait timed out");
    }
    if (state_->error) std::rethrow_exception(state_->error);
    return true;
  }

 private:
  std::shared_ptr<OpState> state_;
};

struct Op {
  bool send = false;
  std::vector<at::Tensor> tensors;
  int tag = 0;
  int64_t seq = 0;  // the k-th send to (or receive from) this peer
  std::shared_ptr<OpState> state;
};

// Where a worker stands, as posted in the store: "S <seq> <tag>", "R <seq> <tag>", "-" (between
// operations) or "! <why>" (failed).
struct Position {
  char kind = '-';
  int64_t seq = -1;
  int tag = 0;
};

Position parse_position(const std::vector<uint8_t>& v) {
  Position p;
  const std::string s(v.begin(), v.end());
  if (s.size() < 3 || (s[0] != 'S' && s[0] != 'R')) return p;
  p.kind = s[0];
  const auto space = s.find(' ', 2);
  p.seq = std::stoll(s.substr(2, space - 2));
  if (space != std::string::npos) p.tag = std::stoi(s.substr(space + 1));
  return p;
}

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

std::string describe(char kind, int64_t seq, int tag, int from, int to) {
  return kind == 'S' ? strprintf("rank %d's send #%lld (tag %d) to rank %d", from, (long long)seq, tag, to)
                     : strprintf("rank %d's receive #%lld (tag %d) from rank %d", from, (long long)seq, tag, to);
}

class StrictP2P : public c10d::Backend {
 public:
  StrictP2P(c10::intrusive_ptr<c10d::Backend> carrier, c10::intrusive_ptr<c10d::Store> store,
            std::chrono::milliseconds timeout)
      : Backend(carrier->getRank(), carrier->getSize()),
        carrier_(std::move(carrier)),
        store_(std::move(store)),
        timeout_(timeout) {}

  ~StrictP2P() override {
    for (auto& [peer, lane] : lanes_) {
      {
        std::lock_guard<std::mutex> lk(lane->mu);
        lane->stop = true;
      }
      lane->cv.notify_all();
    }
    for (auto& [peer, lane] : lanes_)
      if (lane->worker.joinable()) lane->worker.join();
  }

  const std::string getBackendName() const override { return "strict-p2p"; }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    return issue(true, tensors, dst, tag);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    return issue(false, tensors, src, tag);
  }

 private:
  struct Lane {
    int peer = 0;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Op> queue;
    bool stop = false;
    int64_t sends_issued = 0, recvs_issued = 0;  // the issuing thread's
    int64_t sends_done = 0, recvs_done = 0;      // the worker's
    std::exception_ptr failed;                   // the worker's: the lane is broken
    c10::intrusive_ptr<c10d::Store> store;       // the worker's own connection
    std::thread worker;
  };

  c10::intrusive_ptr<c10d::Work> issue(bool is_send, std::vector<at::Tensor>& tensors, int peer, int tag) {
    TORCH_CHECK(peer != getRank() && peer >= 0 && peer < getSize(), "strict p2p: bad peer ", peer);
    Lane& lane = lane_of(peer);
    Op op;
    op.send = is_send;
    op.tensors = tensors;
    op.tag = tag;
    op.state = std::make_shared<OpState>();
    {
      std::lock_guard<std::mutex> lk(lane.mu);
      op.seq = is_send ? lane.sends_issued++ : lane.recvs_issued++;
      lane.queue.push_back(op);
    }
    lane.cv.notify_one();
    return c10::make_intrusive<StrictWork>(op.state, is_send ? c10d::OpType::SEND : c10d::OpType::RECV);
  }

  Lane& lane_of(int peer) {
    std::lock_guard<std::mutex> lk(lanes_mu_);
    auto& slot = lanes_[peer];
    if (!slot) {
      slot = std::make_unique<Lane>();
      slot->peer = peer;
      slot->store = store_->clone();
      Lane* lane = slot.get();
      slot->worker = std::thread([this, lane] { run_lane(*lane); });
    }
    return *slot;
  }

  void run_lane(Lane& lane) {
    for (;;) {
      Op op;
      {
        std::unique_lock<std::mutex> lk(lane.mu);
        lane.cv.wait(lk, [&] { return lane.stop || !lane.queue.empty(); });
        if (lane.queue.empty()) return;
        op = std::move(lane.queue.front());
        lane.queue.pop_front();
      }
      std::exception_ptr error = lane.failed;
      if (!error) {
        try {
          op.send ? run_send(lane, op) : run_recv(lane, op);
          ++(op.send ? lane.sends_done : lane.recvs_done);
          post_position(lane, "-");
        } catch (const std::exception& e) {
          error = lane.failed = std::current_exception();
          post_failure(lane, e.what());
        }
      }
      {
        std::lock_guard<std::mutex> lk(op.state->mu);
        op.state->done = true;
        op.state->error = error;
      }
      op.state->cv.notify_all();
    }
  }

  std::string key(const char* what, int from, int to, int64_t seq) const {
    return strprintf("%s/%d/%d/%lld", what, from, to, (long long)seq);
  }
  std::string position_key(int of, int toward) const { return strprintf("at/%d/%d", of, toward); }
  void post_position(Lane& lane, const std::string& p) {
    lane.store->set(position_key(getRank(), lane.peer), bytes(p));
  }
  // A broken lane says so, and why, so that its peer fails at once too instead of at the timeout.
  void post_failure(Lane& lane, const std::string& why) {
    try {
      post_position(lane, "! " + why);
    } catch (...) {  // the store is gone with its rank: the peer finds out by itself
    }
  }

  void run_send(Lane& lane, const Op& op) {
    const int me = getRank(), peer = lane.peer;
    post_position(lane, strprintf("S %lld %d", (long long)op.seq, op.tag));
    const std::string ready = key("ready", me, peer, op.seq);
    const auto v = wait_for_key(lane, op, ready);
    lane.store->deleteKey(ready);
    const int expected = std::stoi(std::string(v.begin(), v.end()));
    if (expected != op.tag) {
      lane.store->set(key("go", me, peer, op.seq), bytes("tag " + std::to_string(op.tag)));
      throw LinkOrderError(tag_mismatch(me, peer, op.seq, op.tag, expected));
    }
    lane.store->set(key("go", me, peer, op.seq), bytes("ok"));
    std::vector<at::Tensor> t = op.tensors;
    c10::intrusive_ptr<c10d::Work> w;
    {
      std::lock_guard<std::mutex> lk(carrier_mu_);
      w = carrier_->send(t, peer, carrier_tag(op.seq));
    }
    w->wait();
  }

  void run_recv(Lane& lane, const Op& op) {
    const int me = getRank(), peer = lane.peer;
    post_position(lane, strprintf("R %lld %d", (long long)op.seq, op.tag));
    lane.store->set(key("ready", peer, me, op.seq), bytes(std::to_string(op.tag)));
    const std::string go = key("go", peer, me, op.seq);
    const auto v = wait_for_key(lane, op, go);
    lane.store->deleteKey(go);
    const std::string answer(v.begin(), v.end());
    if (answer != "ok") throw LinkOrderError(tag_mismatch(peer, me, op.seq, std::stoi(answer.substr(4)), op.tag));
    std::vector<at::Tensor> t = op.tensors;
    c10::intrusive_ptr<c10d::Work> w;
    {
      std::lock_guard<std::mutex> lk(carrier_mu_);
      w = carrier_->recv(t, peer, carrier_tag(op.seq));
    }
    w->wait();
  }

  static int carrier_tag(int64_t seq) { return static_cast<int>(seq & 0x3fffffff); }

  static std::string tag_mismatch(int from, int to, int64_t seq, int sent_tag, int expected_tag) {
    return strprintf(
        "point-to-point order: message #%lld from rank %d to rank %d was sent under tag %d but received under tag "
        "%d; NCCL matches messages by their order alone and would deliver the wrong tensor (the two ranks must "
        "issue their sends and receives in the same order)",
        (long long)seq, from, to, sent_tag, expected_tag);
  }

  // Polls the store for `k`; between polls, checks whether the peer's worker waits for this one
  // (Note [Strict point to point]).
  std::vector<uint8_t> wait_for_key(Lane& lane, const Op& op, const std::string& k) {
    const auto start = Clock::now();
    auto next_check = start;
    auto pause = std::chrono::microseconds(50);
    while (!lane.store->check({k})) {
      const auto now = Clock::now();
      if (now >= next_check) {
        check_deadlock(lane, op, now - start);
        next_check = now + std::chrono::milliseconds(20);
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(250));
    }
    return lane.store->get(k);
  }

  void check_deadlock(Lane& lane, const Op& op, Clock::duration waited) {
    const int me = getRank(), peer = lane.peer;
    const std::string pk = position_key(peer, me);
    const auto raw = lane.store->check({pk}) ? lane.store->get(pk) : std::vector<uint8_t>{};
    if (!raw.empty() && raw[0] == '!')
      throw LinkOrderError(strprintf("point-to-point: rank %d's link to rank %d failed first: ", peer, me) +
                           std::string(raw.begin() + 2, raw.end()));
    const Position p = parse_position(raw);
    const char mine = op.send ? 'S' : 'R';
    // The peer's operation is pending when this worker has not completed its counterpart.
    const bool pending = p.kind == 'S' ? p.seq >= lane.recvs_done : p.kind == 'R' && p.seq >= lane.sends_done;
    const std::string both = describe(mine, op.seq, op.tag, me, peer) + " and " +
                             (p.kind == '-' ? strprintf("rank %d, whose operations with rank %d are all done", peer, me)
                                            : describe(p.kind, p.seq, p.tag, peer, me));
    if (p.kind == mine && pending)
      throw LinkOrderError("point-to-point order: " + both +
                           " wait for each other: under NCCL, which runs a rank's "
                           "operations with one peer in order and completes a send only when its receive is posted, "
                           "neither would ever return (the two ranks must issue their sends and receives in the "
                           "same order)");
    if (waited > timeout_)
      throw std::runtime_error(strprintf("point-to-point: %s has waited %.0f s for its peer, at %s",
                                         describe(mine, op.seq, op.tag, me, peer).c_str(),
                                         std::chrono::duration<double>(waited).count(), both.c_str()));
  }

  c10::intrusive_ptr<c10d::Backend> carrier_;
  std::mutex carrier_mu_;
  c10::intrusive_ptr<c10d::Store> store_;
  const std::chrono::milliseconds timeout_;
  std::mutex lanes_mu_;
  std::map<int, std::unique_ptr<Lane>> lanes_;
};

}  // namespace

c10::intrusive_ptr<c10d::Backend> make_strict_p2p(c10::intrusive_ptr<c10d::Backend> carrier,
                                                  c10::intrusive_ptr<c10d::Store> store,
                                                  std::chrono::milliseconds timeout) {
  return c10::make_intrusive<StrictP2P>(std::move(carrier), std::move(store), timeout);
}

}  // namespace tandem
