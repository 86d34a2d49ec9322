// Memory attribution per thread of work: which part of a process holds how much CPU memory.
//
// MemoryBudget (memory_budget.h) counts a whole process, which is one device in a real job. When
// several ranks run as threads of one process (tests, benchmarks), or a worker wants the peak of
// one phase rather than of its process, the count must be split. MemoryMeter wraps libtorch's CPU
// allocator like MemoryBudget does, and charges each allocation to the MemoryAccount that the
// allocating thread has entered (MemoryAccount::Scope); the free is charged back to the same
// account whatever thread frees it. Allocations outside any scope are not counted. For CPU
// tensors autograd runs backward on the thread that called it, so a scope around a pipeline
// stage's forward and backward sees everything the stage allocates (activations, gradients,
// recomputation, receive buffers).
#pragma once

#include <c10/core/Allocator.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace chorus::device {

// A counter of live bytes and their peak. Thread-safe (atomics). Shared: allocations charged to an
// account keep its counters alive until they are freed, so an account may be dropped at any time.
class MemoryAccount {
 public:
  struct Counters;  // memory_meter.cc: reference-counted, shared with live allocations

  MemoryAccount();
  ~MemoryAccount();
  MemoryAccount(const MemoryAccount&) = delete;
  MemoryAccount& operator=(const MemoryAccount&) = delete;

  // Bytes allocated while this account was entered and not yet freed.
  std::uint64_t bytesInUse() const;
  // The highest bytesInUse() since creation or the last resetPeak().
  std::uint64_t peakBytes() const;
  // Starts a new peak window at the current use (e.g. per step).
  void resetPeak();

  // RAII: while alive, the calling thread's CPU allocations are charged to `account` (the scope
  // it replaced comes back at destruction, so scopes nest). Thread-affine: destroy it on the
  // thread that made it. Neither copyable nor movable.
  class Scope {
   public:
    explicit Scope(const std::shared_ptr<MemoryAccount>& account);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Counters* previous_;
  };

 private:
  Counters* counters_;
};

// The installed CPU allocator that charges allocations to accounts.
//
// Scope: one per process (libtorch keeps one CPU allocator), installed before the threads it
// should see allocate, and at most one at a time. It may be installed over or under a
// MemoryBudget; each wraps whatever was current. Like MemoryBudget, the allocator object is never
// freed (storages keep raw pointers to their allocator). The thread's current account is a
// thread_local: the one piece of process-wide state this needs, since an allocator receives
// nothing but a size. Thread-safety: allocation and deallocation are safe from any thread.
class MemoryMeter final : public c10::Allocator {
 public:
  static constexpr std::uint8_t kPriority = 255;

  // Installs a meter over the current CPU allocator. Throws DeviceError when one is installed.
  static std::shared_ptr<MemoryMeter> install();
  // Restores the allocator that was current at install(). Idempotent; also called when the last
  // shared_ptr from install() goes away. Allocations made through the meter stay valid.
  void uninstall();

  c10::DataPtr allocate(std::size_t bytes) override;
  c10::DeleterFnPtr raw_deleter() const override { return &MemoryMeter::deleteData; }
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  struct Header;  // precedes each allocation (memory_meter.cc)

 private:
  explicit MemoryMeter(c10::Allocator* previous) : previous_(previous) {}
  static void deleteData(void* data);

  c10::Allocator* const previous_;
  std::atomic<bool> installed_{false};
};

}  // namespace chorus::device
