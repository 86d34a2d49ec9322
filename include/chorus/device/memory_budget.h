// Memory budgets for emulated devices: a counting CPU allocator that fails like a full GPU.
//
// A spec `cpu@0.5/512MiB` gives a CPU worker 512 MiB. MemoryBudget wraps libtorch's CPU allocator,
// counts the bytes of every live CPU allocation, and when a request would pass the budget throws
// c10::OutOfMemoryError (the very type a full CUDA device raises), so the code that reacts to real
// out-of-memory (shrinking the micro-batch, re-planning) is exercised on any machine.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include <c10/core/Allocator.h>

namespace chorus::device {

// The installed CPU allocator of an emulated device with a memory budget.
//
// Scope: libtorch keeps one CPU allocator per process, so a budget is process-wide: one per worker
// process, installed at start-up before any thread allocates tensors (c10::SetAllocator is not
// thread-safe). At most one MemoryBudget is installed at a time. Tests that install one must
// uninstall it before they end, so later tests of the same process get the default allocator back.
//
// Lifetime: the allocator object is never freed. Every tensor allocated through it holds a
// context that its deleter updates, and libtorch storages keep a raw Allocator* for resizing, so
// tensors that outlive uninstall() (or the last shared_ptr) must still find it. Freeing after
// uninstall() still decrements the count; resizing such a tensor still counts against the budget.
//
// Thread-safety: allocation, deallocation and the accessors are safe from any thread (atomics).
// When two threads race for the last bytes, both may be refused, but the budget is never passed.
// Only CPU memory is counted; a CUDA device's budget caps libtorch's CUDA allocator instead
// (capCudaMemory).
class MemoryBudget final : public c10::Allocator {
 public:
  // The c10 allocator priority we install at: the highest, so no other registration hides the
  // budget, and uninstall() can always put the previous allocator back.
  static constexpr std::uint8_t kPriority = 255;

  // Installs a budget of `budget_bytes` as the process's CPU allocator, wrapping the current one.
  // Throws ConfigError for a zero budget and DeviceError when a budget is already installed.
  static std::shared_ptr<MemoryBudget> install(std::uint64_t budget_bytes);

  // Restores the allocator that was current at install(). Idempotent. Live tensors allocated under
  // the budget stay valid. Also called when the last shared_ptr from install() goes away.
  void uninstall();
  bool installed() const { return installed_.load(); }

  std::uint64_t budget() const { return budget_; }
  // Bytes of CPU allocations made through this budget and not yet freed.
  std::uint64_t bytesInUse() const { return in_use_.load(std::memory_order_relaxed); }
  // The highest bytesInUse() since install() or the last resetPeak().
  std::uint64_t peakBytes() const { return peak_.load(std::memory_order_relaxed); }
  // Starts a new peak window at the current use (e.g. per training step).
  void resetPeak() { peak_.store(bytesInUse(), std::memory_order_relaxed); }

  // c10::Allocator. allocate() throws c10::OutOfMemoryError past the budget. The raw interface
  // (raw_allocate / raw_deallocate) is supported too: some CPU kernels take scratch space through
  // it, and that counts against the budget like any tensor.
  c10::DataPtr allocate(std::size_t bytes) override;
  c10::DeleterFnPtr raw_deleter() const override { return &MemoryBudget::deleteData; }
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  struct Header;  // precedes each allocation (memory_budget.cc)

 private:
  MemoryBudget(std::uint64_t budget_bytes, c10::Allocator* previous);
  static void deleteData(void* data);
  void reserve(std::size_t bytes);
  void release(std::size_t bytes) { in_use_.fetch_sub(bytes, std::memory_order_relaxed); }

  const std::uint64_t budget_;
  c10::Allocator* const previous_;
  std::atomic<bool> installed_{false};
  std::atomic<std::uint64_t> in_use_{0};
  std::atomic<std::uint64_t> peak_{0};
};

// Caps libtorch's CUDA caching allocator on device `index` at `budget_bytes` (a spec such as
// `cuda:1/20GiB`): its per-process memory fraction, budget / the device's memory, so that an
// allocation past the budget raises c10::OutOfMemoryError as a full device would. Process-wide
// and for the process's lifetime, like MemoryBudget; call at worker start-up. Returns the
// fraction. Initializes CUDA in the process first (libtorch's lazy init, as a first tensor on the
// GPU would): the allocator has no state for a device before it. Throws ConfigError when the
// budget exceeds the device's memory, DeviceError when the device cannot be queried or capped or
// this build has no CUDA runtime.
double capCudaMemory(int index, std::uint64_t budget_bytes);

// What libtorch's CUDA caching allocator holds on one device, in bytes: allocated to tensors now
// and at its peak, and reserved from the device (allocated plus its cache). Value type.
struct CudaMemoryFigures {
  std::uint64_t allocated = 0;
  std::uint64_t allocated_peak = 0;
  std::uint64_t reserved = 0;
};

// The caching allocator's figures for device `index`, for metrics: all 0 while CUDA is not yet
// initialized in this process (nothing allocated), nullopt when they cannot be read (no CUDA
// runtime headers in this build, no such device). Never throws; never initializes CUDA.
std::optional<CudaMemoryFigures> cudaMemoryFigures(int index);

}  // namespace chorus::device
