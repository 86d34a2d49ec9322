// Exact results of the shared-memory transport's collectives: ranks as threads over one
// MemoryStore, every reducible type and reduction, sizes around the chunk boundary.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include "chorus/comm/communicator.h"
#include "comm/rank_threads.h"

namespace chorus::comm {
namespace {

// 256-byte chunks: 64 float32 elements, so a few hundred elements already take several chunks.
constexpr std::size_t kChunk = 256;

CommOptions shmOptions(std::size_t chunk = kChunk) {
  CommOptions options;
  options.cpu_transport = "shm";
  options.shm_chunk_bytes = chunk;
  options.timeout = std::chrono::milliseconds(20000);
  return options;
}

void runRanks(int size, const std::function<void(Communicator&)>& body,
              CommOptions options = shmOptions()) {
  testing::runRankThreads(
      size, [&](std::shared_ptr<Communicator> communicator) { body(*communicator); }, options);
}

// Rank r's contribution: small integers (exact in every type, sums included) that vary with the
// rank and the position, negative ones too, so max and min differ from sum.
at::Tensor contribution(int rank, int64_t numel, at::ScalarType type) {
  at::Tensor index = at::arange(numel, at::kDouble);
  return (at::remainder(index * 7 + rank * 3, 11) - 5 + rank).to(type);
}

at::Tensor expected(int size, int64_t numel, at::ScalarType type, ReduceOp op) {
  std::vector<at::Tensor> all;
  for (int rank = 0; rank < size; ++rank) all.push_back(contribution(rank, numel, at::kDouble));
  at::Tensor stacked = at::stack(all);
  switch (op) {
    case ReduceOp::kSum:
      return stacked.sum(0).to(type);
    case ReduceOp::kAvg: {
      // The transport divides once, in the type's own precision (float for half types).
      const at::ScalarType wide = type == at::kDouble ? at::kDouble : at::kFloat;
      return stacked.sum(0).to(wide).div(size).to(type);
    }
    case ReduceOp::kMax:
      return std::get<0>(stacked.max(0)).to(type);
    case ReduceOp::kMin:
      return std::get<0>(stacked.min(0)).to(type);
  }
  return {};
}

const std::vector<at::ScalarType> kTypes = {at::kFloat, at::kDouble, at::kBFloat16,
                                            at::kHalf,  at::kInt,    at::kLong};
const std::vector<ReduceOp> kOps = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};

// 0, 1, 7, a float32 chunk (64) and its neighbours, and several chunks of every type.
const std::vector<int64_t> kSizes = {0, 1, 7, 63, 64, 65, 300};

// Every type, reduction and size on `size` ranks with `chunk`-byte buffers.
void checkAllReduce(int size, std::size_t chunk, const std::vector<int64_t>& sizes) {
  runRanks(
      size,
      [size, &sizes](Communicator& comm) {
        ASSERT_STREQ(comm.cpuTransport(), "shm");
        for (at::ScalarType type : kTypes) {
          for (ReduceOp op : kOps) {
            if (op == ReduceOp::kAvg && !at::isFloatingType(type)) continue;
            for (int64_t numel : sizes) {
              at::Tensor t = contribution(comm.rank(), numel, type);
              comm.allReduce(t, op).wait();
              EXPECT_TRUE(at::equal(t, expected(size, numel, type, op)))
                  << c10::toString(type) << " " << toString(op) << " numel " << numel << " rank "
                  << comm.rank();
            }
          }
        }
      },
      shmOptions(chunk));
}

class ShmAllReduce : public ::testing::TestWithParam<int> {};

TEST_P(ShmAllReduce, ExactForEveryTypeOpAndSize) { checkAllReduce(GetParam(), kChunk, kSizes); }

// 4 KiB chunks: every rank owns a non-empty slice of every chunk (with 256-byte chunks and
// 64-byte aligned slices the last ranks' slices of a small chunk are empty).
TEST_P(ShmAllReduce, ExactWithEveryRankReducingASlice) {
  checkAllReduce(GetParam(), 4096, {511, 512, 513, 1023, 1024, 1025, 5000});
}

INSTANTIATE_TEST_SUITE_P(Ranks, ShmAllReduce, ::testing::Values(1, 2, 3, 4));

TEST(ShmCollectives, BroadcastFromEveryRootAnyType) {
  runRanks(3, [](Communicator& comm) {
    for (int root = 0; root < comm.size(); ++root) {
      for (int64_t numel : {1, 255, 256, 257, 1000}) {
        // uint8: 256 elements fill one chunk exactly; the transport copies bytes of any type.
        at::Tensor t = at::full({numel}, comm.rank() * 10 + 1, at::kByte);
        comm.broadcast(t, root).wait();
        EXPECT_TRUE(at::equal(t, at::full({numel}, root * 10 + 1, at::kByte))) << numel;
      }
    }
  });
}

TEST(ShmCollectives, AllGatherPlacesEachRankInOrder) {
  runRanks(3, [](Communicator& comm) {
    for (int64_t numel : {1, 7, 64, 65, 200}) {
      at::Tensor input = contribution(comm.rank(), numel, at::kFloat);
      at::Tensor output = at::empty({numel * comm.size()}, at::kFloat);
      comm.allGather(input, output).wait();
      for (int rank = 0; rank < comm.size(); ++rank)
        EXPECT_TRUE(
            at::equal(output.narrow(0, rank * numel, numel), contribution(rank, numel, at::kFloat)))
            << numel;
    }
  });
}

TEST(ShmCollectives, AllGatherVWithEmptyAndMultiChunkContributions) {
  const std::vector<int64_t> counts = {0, 5, 130, 64};
  runRanks(4, [&counts](Communicator& comm) {
    at::Tensor input = at::full({counts[comm.rank()]}, comm.rank() + 1, at::kLong);
    at::Tensor output = at::empty({199}, at::kLong);
    comm.allGatherV(input, output, counts).wait();
    int64_t offset = 0;
    for (int rank = 0; rank < 4; ++rank) {
      EXPECT_TRUE(at::equal(output.narrow(0, offset, counts[rank]),
                            at::full({counts[rank]}, rank + 1, at::kLong)));
      offset += counts[rank];
    }
  });
}

TEST(ShmCollectives, ReduceScatterAroundTheSlotBoundary) {
  // 3 ranks, 64 float32 per chunk: slots of 16 elements.
  runRanks(3, [](Communicator& comm) {
    for (ReduceOp op : kOps) {
      for (int64_t per_rank : {1, 15, 16, 17, 50}) {
        const int64_t numel = per_rank * comm.size();
        at::Tensor input = contribution(comm.rank(), numel, at::kFloat);
        at::Tensor output = at::empty({per_rank}, at::kFloat);
        comm.reduceScatter(input, output, op).wait();
        at::Tensor all = expected(comm.size(), numel, at::kFloat, op);
        EXPECT_TRUE(at::equal(output, all.narrow(0, comm.rank() * per_rank, per_rank)))
            << toString(op) << " " << per_rank;
      }
    }
  });
}

TEST(ShmCollectives, ReduceScatterVUnevenCounts) {
  const std::vector<int64_t> counts = {3, 0, 40};
  runRanks(3, [&counts](Communicator& comm) {
    at::Tensor input = contribution(comm.rank(), 43, at::kInt);
    at::Tensor output = at::empty({counts[comm.rank()]}, at::kInt);
    comm.reduceScatterV(input, output, counts, ReduceOp::kSum).wait();
    const int64_t offset = comm.rank() == 2 ? 3 : 0;
    EXPECT_TRUE(at::equal(
        output, expected(3, 43, at::kInt, ReduceOp::kSum).narrow(0, offset, counts[comm.rank()])));
  });
}

TEST(ShmCollectives, AllToAllEvenAndUneven) {
  runRanks(3, [](Communicator& comm) {
    const int rank = comm.rank();
    // Rank r sends (r + 1) * (j + 1) * 10 elements of value 100 r + j to rank j: several slots.
    std::vector<int64_t> send(3);
    std::vector<int64_t> recv(3);
    for (int peer = 0; peer < 3; ++peer) {
      send[peer] = (rank + 1) * (peer + 1) * 10;
      recv[peer] = (peer + 1) * (rank + 1) * 10;
    }
    std::vector<at::Tensor> pieces;
    for (int peer = 0; peer < 3; ++peer)
      pieces.push_back(at::full({send[peer]}, 100 * rank + peer, at::kDouble));
    at::Tensor input = at::cat(pieces);
    at::Tensor output = at::empty({recv[0] + recv[1] + recv[2]}, at::kDouble);
    comm.allToAll(input, output, send, recv).wait();
    int64_t offset = 0;
    for (int peer = 0; peer < 3; ++peer) {
      EXPECT_TRUE(at::equal(output.narrow(0, offset, recv[peer]),
                            at::full({recv[peer]}, 100 * peer + rank, at::kDouble)));
      offset += recv[peer];
    }
    at::Tensor even_in = at::full({6}, rank, at::kFloat);
    at::Tensor even_out = at::empty({6}, at::kFloat);
    comm.allToAll(even_in, even_out, {2, 2, 2}, {2, 2, 2}).wait();
    EXPECT_TRUE(at::equal(even_out, at::tensor({0.f, 0.f, 1.f, 1.f, 2.f, 2.f})));
  });
}

TEST(ShmCollectives, OperationsOverlapAndFinishInIssueOrder) {
  // Buckets launched back to back and waited later (as the gradient reducer does), mixed with
  // Gloo operations (uint8 has no shm reduction) and a multi-chunk tensor.
  runRanks(2, [](Communicator& comm) {
    std::vector<at::Tensor> tensors;
    std::vector<Work> works;
    for (int i = 0; i < 8; ++i) {
      tensors.push_back(at::full({100 + 37 * i}, comm.rank() + i, at::kFloat));
      works.push_back(comm.allReduce(tensors.back()));
    }
    at::Tensor flags = at::full({3}, comm.rank(), at::kByte);
    comm.allReduce(flags, ReduceOp::kMax).wait();
    EXPECT_TRUE(at::equal(flags, at::full({3}, 1, at::kByte)));
    comm.barrier().wait();
    for (int i = 7; i >= 0; --i) {
      works[i].wait();
      EXPECT_TRUE(at::equal(tensors[i], at::full({100 + 37 * i}, 1 + 2 * i, at::kFloat)));
    }
  });
}

TEST(ShmCollectives, DefaultChunkLargeTensor) {
  CommOptions options;
  options.cpu_transport = "shm";
  runRanks(
      2,
      [](Communicator& comm) {
        // 3 MiB + 4 bytes: three full default chunks and one element.
        const int64_t numel = 3 * (1 << 18) + 1;
        at::Tensor t = contribution(comm.rank(), numel, at::kFloat);
        comm.allReduce(t).wait();
        EXPECT_TRUE(at::equal(t, expected(2, numel, at::kFloat, ReduceOp::kSum)));
      },
      options);
}

}  // namespace
}  // namespace chorus::comm
