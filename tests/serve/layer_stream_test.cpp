// Streamed layers (serve/layer_stream.h) with the CPU as the device: each acquire holds its layer's
// weights, uploads follow the slot cycle, an out-of-order acquire restarts it, misuse is a bug.

#include "tandem/serve/layer_stream.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tandem/core/error.h"

namespace tandem {
namespace {

const c10::Device kCpu(c10::kCPU);

// Layers 1, 2 and 3 streamed, of 5, 7 and 3 elements (the slots take the largest); 0 and 4 resident.
std::vector<torch::Tensor> three_streamed(torch::ScalarType dtype = torch::kFloat32) {
  std::vector<torch::Tensor> host(5);
  host[1] = (torch::arange(5) + 100).to(dtype);
  host[2] = (torch::arange(7) + 200).to(dtype);
  host[3] = (torch::arange(3) + 300).to(dtype);
  return host;
}

void expect_layer(LayerStream& stream, const std::vector<torch::Tensor>& host, int64_t layer, const std::string& what) {
  const auto w = stream.acquire(layer);
  const auto& want = host[static_cast<size_t>(layer)];
  ASSERT_EQ(w.sizes(), want.sizes()) << what;
  ASSERT_EQ(w.scalar_type(), want.scalar_type()) << what;
  EXPECT_EQ(w.device(), kCpu) << what;
  EXPECT_NE(w.data_ptr(), want.data_ptr()) << what << ": a slot's copy, not the host buffer";
  EXPECT_TRUE(torch::equal(w, want)) << what << ": got " << w << ", want " << want;
  stream.release(layer);
}

// Two slots for three layers: the first two are uploaded at once; each release hands its slot to
// the layer two places on, so every pass uploads all three.
TEST(LayerStream, EachPassUploadsEveryStreamedLayerIntoTheSlotsInTurn) {
  const auto host = three_streamed();
  LayerStream stream(host, 2, kCpu);
  EXPECT_EQ(stream.slots(), 2);
  EXPECT_EQ(stream.uploads(), 2);
  for (int pass = 1; pass <= 3; ++pass) {
    for (const int64_t layer : {1, 2, 3})
      expect_layer(stream, host, layer, "pass " + std::to_string(pass) + ", layer " + std::to_string(layer));
    EXPECT_EQ(stream.uploads(), 2 + 3 * pass) << "pass " << pass;
  }
}

// Slots for every streamed layer: they stay where they are, uploaded once.
TEST(LayerStream, SlotsForEveryStreamedLayerUploadEachOnce) {
  std::vector<torch::Tensor> host(4);
  host[0] = torch::arange(6, torch::kFloat32);
  host[3] = torch::arange(4, torch::kFloat32) - 9;
  for (const int64_t slots : {2, 3}) {
    LayerStream stream(host, slots, kCpu);
    EXPECT_EQ(stream.slots(), slots);
    for (int pass = 0; pass < 3; ++pass)
      for (const int64_t layer : {0, 3}) expect_layer(stream, host, layer, "layer " + std::to_string(layer));
    EXPECT_EQ(stream.uploads(), 2) << slots << " slots";
  }
}

// A pass that stopped part-way leaves the cycle behind: the next acquire of a layer no slot holds
// uploads it at once and the order goes on from there.
TEST(LayerStream, AnAcquireOutOfOrderRestartsTheCycleThere) {
  const auto host = three_streamed();
  LayerStream stream(host, 2, kCpu);  // layers 1 and 2 uploaded
  expect_layer(stream, host, 3, "layer 3 first");
  EXPECT_EQ(stream.uploads(), 5) << "3, then 1 into the other slot, then 2 after 3's release";
  for (int pass = 0; pass < 2; ++pass)
    for (const int64_t layer : {1, 2, 3}) expect_layer(stream, host, layer, "layer " + std::to_string(layer));
  // Backwards, every acquire a restart: still each layer's own weights.
  for (const int64_t layer : {3, 2, 1}) expect_layer(stream, host, layer, "backwards, layer " + std::to_string(layer));
}

// A restart never takes the slot of a layer still held: layer 1 keeps its weights while layer 3,
// which no slot held, is uploaded into the other slot.
TEST(LayerStream, ARestartLeavesAHeldLayerInItsSlot) {
  const auto host = three_streamed();
  LayerStream stream(host, 2, kCpu);  // layers 1 and 2 uploaded
  const torch::Tensor held = stream.acquire(1);
  const torch::Tensor other = stream.acquire(3);
  EXPECT_TRUE(torch::equal(held, host[1])) << "layer 1 overwritten by the restart: " << held;
  EXPECT_TRUE(torch::equal(other, host[3]));
  stream.release(1);
  stream.release(3);
  for (const int64_t layer : {1, 2, 3}) expect_layer(stream, host, layer, "after, layer " + std::to_string(layer));
}

TEST(LayerStream, TheSlotsTakeTheLayersDtype) {
  const auto host = three_streamed(torch::kBFloat16);
  LayerStream stream(host, 1, kCpu);
  EXPECT_EQ(stream.slots(), 1);
  for (const int64_t layer : {1, 2, 3}) expect_layer(stream, host, layer, "bf16 layer " + std::to_string(layer));
  EXPECT_EQ(stream.uploads(), 4) << "one slot: each release uploads the next layer, the next pass's first included";
}

TEST(LayerStream, WithoutStreamedLayersThereAreNoSlots) {
  LayerStream stream(std::vector<torch::Tensor>(3), 2, kCpu);
  EXPECT_EQ(stream.slots(), 0);
  EXPECT_EQ(stream.uploads(), 0);
  stream.synchronize();
}

// The decoder's own mistakes: a release without its acquire, a resident layer asked of the stream.
TEST(LayerStream, ReleasingWhatWasNotAcquiredOrAcquiringAResidentLayerIsABug) {
  const auto host = three_streamed();
  LayerStream stream(host, 2, kCpu);
  EXPECT_THROW(stream.release(1), InternalError);
  EXPECT_THROW(stream.acquire(0), InternalError);
  EXPECT_THROW(stream.acquire(4), InternalError);
  expect_layer(stream, host, 1, "layer 1 after the refusals");
}

}  // namespace
}  // namespace tandem
