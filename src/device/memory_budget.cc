#include "chorus/device/memory_budget.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <utility>

#include "chorus/core/error.h"
#include "chorus/core/units.h"
#include "cpu_allocator_slot.h"

namespace chorus::device {
namespace {

// The installed budget, if any; guards against stacking two budgets, whose counts would nest.
std::atomic<MemoryBudget*> g_installed{nullptr};

}  // namespace

// Each allocation is preceded by a header that tells its deleter what to give back and how to
// free it. A header rather than a separate context: libtorch's raw interface (raw_allocate, used by
// some CPU kernels for scratch space) requires the DataPtr's context to be its data pointer.
// kHeaderBytes keeps the data at the alignment the wrapped allocator gives (64 bytes for c10's).
struct MemoryBudget::Header {
  std::size_t bytes;
  MemoryBudget* owner;  // stays valid: budgets are never freed
  c10::DeleterFnPtr free;
};
constexpr std::size_t kHeaderBytes = 64;
static_assert(sizeof(MemoryBudget::Header) <= kHeaderBytes, "header must fit its slot");

MemoryBudget::MemoryBudget(std::uint64_t budget_bytes, c10::Allocator* previous)
    : budget_(budget_bytes), previous_(previous) {}

std::shared_ptr<MemoryBudget> MemoryBudget::install(std::uint64_t budget_bytes) {
  CHORUS_CHECK_CONFIG(budget_bytes > 0, "a memory budget must be positive");
  // Kept for the process's life once installed (cpu_allocator_slot.h): storages keep raw
  // pointers to their allocator.
  MemoryBudget* budget = installCpuAllocator(
      g_installed,
      std::unique_ptr<MemoryBudget>(new MemoryBudget(budget_bytes, wrappableCpuAllocator())),
      kPriority,
      [](const MemoryBudget& other) {
        return ::chorus::detail::concat(
            "a memory budget of ", formatBytes(other.budget()),
            " is already installed in this process; uninstall it first");
      },
      "libtorch refused the emulated memory budget's CPU allocator");
  budget->installed_.store(true);
  // The shared_ptr owns the installation, not the object: its last copy uninstalls.
  return std::shared_ptr<MemoryBudget>(budget, [](MemoryBudget* owned) { owned->uninstall(); });
}

void MemoryBudget::uninstall() {
  if (!installed_.exchange(false)) return;
  uninstallCpuAllocator(g_installed, this, previous_, kPriority);
}

void MemoryBudget::reserve(std::size_t bytes) {
  // Claim first, check after: two racing requests can both be refused, never both admitted.
  const std::uint64_t before = in_use_.fetch_add(bytes, std::memory_order_relaxed);
  const std::uint64_t after = before + bytes;
  if (after > budget_) {
    release(bytes);
    TORCH_CHECK_WITH(OutOfMemoryError, false, "emulated device budget ", formatBytes(budget_),
                     " exceeded: cannot allocate ", formatBytes(bytes), " with ",
                     formatBytes(before), " in use (", bytes, " + ", before, " > ", budget_,
                     " bytes)");
  }
  std::uint64_t peak = peak_.load(std::memory_order_relaxed);
  while (after > peak && !peak_.compare_exchange_weak(peak, after, std::memory_order_relaxed)) {
  }
}

c10::DataPtr MemoryBudget::allocate(std::size_t bytes) {
  reserve(bytes);
  void* base = nullptr;
  try {
    base = previous_->raw_allocate(bytes + kHeaderBytes);
  } catch (...) {
    release(bytes);
    throw;
  }
  new (base) Header{bytes, this, previous_->raw_deleter()};
  void* data = static_cast<char*>(base) + kHeaderBytes;
  return c10::DataPtr(data, data, &MemoryBudget::deleteData, c10::Device(c10::DeviceType::CPU));
}

void MemoryBudget::deleteData(void* data) {
  if (data == nullptr) return;
  void* base = static_cast<char*>(data) - kHeaderBytes;
  const Header header = *static_cast<Header*>(base);
  header.owner->release(header.bytes);
  header.free(base);
}

void MemoryBudget::copy_data(void* dest, const void* src, std::size_t count) const {
  default_copy_data(dest, src, count);
}

}  // namespace chorus::device
