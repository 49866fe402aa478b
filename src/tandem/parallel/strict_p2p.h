#pragma once
// Point to point with NCCL's semantics over a host transport (Note [Strict point to point]): what
// the pipeline's stage links run on without GPUs, so that an order of sends and receives that
// would hang NCCL fails on the CPU too, at once and naming both ranks' operations.

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <stdexcept>

namespace tandem {

/// A c10d backend of send and recv alone. `carrier` (a Gloo group of the same ranks) moves the
/// tensors; `store` (a prefix of its own) carries the rendezvous of each message; an operation that
/// waits longer than `timeout` fails naming what both ranks were doing.
c10::intrusive_ptr<c10d::Backend> make_strict_p2p(c10::intrusive_ptr<c10d::Backend> carrier,
                                                  c10::intrusive_ptr<c10d::Store> store,
                                                  std::chrono::milliseconds timeout);

/// Thrown by a strict link's operation that NCCL could not complete: the two ranks would wait for
/// each other forever, or their k-th messages carry different tags (NCCL would deliver the wrong
/// tensor). A bug in the order of the caller's operations, not bad input.
class LinkOrderError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

}  // namespace tandem
