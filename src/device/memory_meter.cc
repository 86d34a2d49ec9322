#include "chorus/device/memory_meter.h"

#include <c10/core/CPUAllocator.h>

#include "chorus/core/error.h"
#include "cpu_allocator_slot.h"

namespace chorus::device {

// An account's counters. Each live allocation and the MemoryAccount itself hold a reference, so
// a free after the account was dropped still has somewhere to go.
struct MemoryAccount::Counters {
  std::atomic<std::uint64_t> in_use{0};
  std::atomic<std::uint64_t> peak{0};
  std::atomic<std::int64_t> references{1};

  void acquire() { references.fetch_add(1, std::memory_order_relaxed); }
  void releaseReference() {
    if (references.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }
  void charge(std::size_t bytes) {
    const std::uint64_t after = in_use.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    std::uint64_t seen = peak.load(std::memory_order_relaxed);
    while (after > seen && !peak.compare_exchange_weak(seen, after, std::memory_order_relaxed)) {
    }
  }
  void refund(std::size_t bytes) { in_use.fetch_sub(bytes, std::memory_order_relaxed); }
};

namespace {

// The account the calling thread's allocations are charged to (see the class comment).
thread_local MemoryAccount::Counters* t_current = nullptr;

std::atomic<MemoryMeter*> g_installed{nullptr};

}  // namespace

MemoryAccount::MemoryAccount() : counters_(new Counters) {}
MemoryAccount::~MemoryAccount() { counters_->releaseReference(); }

std::uint64_t MemoryAccount::bytesInUse() const {
  return counters_->in_use.load(std::memory_order_relaxed);
}
std::uint64_t MemoryAccount::peakBytes() const {
  return counters_->peak.load(std::memory_order_relaxed);
}
void MemoryAccount::resetPeak() { counters_->peak.store(bytesInUse(), std::memory_order_relaxed); }

MemoryAccount::Scope::Scope(const std::shared_ptr<MemoryAccount>& account) : previous_(t_current) {
  if (!account) CHORUS_THROW(ConfigError, "MemoryAccount::Scope needs an account");
  t_current = account->counters_;
}
MemoryAccount::Scope::~Scope() { t_current = previous_; }

// Like MemoryBudget's: a header rather than a context, since libtorch's raw interface requires
// the DataPtr's context to be its data pointer; 64 bytes keep the wrapped allocator's alignment.
struct MemoryMeter::Header {
  std::size_t bytes;
  MemoryAccount::Counters* counters;  // null: not charged
  c10::DeleterFnPtr free;
};
constexpr std::size_t kHeaderBytes = 64;
static_assert(sizeof(MemoryMeter::Header) <= kHeaderBytes, "header must fit its slot");

std::shared_ptr<MemoryMeter> MemoryMeter::install() {
  MemoryMeter* meter = installCpuAllocator(
      g_installed, std::unique_ptr<MemoryMeter>(new MemoryMeter(wrappableCpuAllocator())),
      kPriority,
      [](const MemoryMeter&) { return "a memory meter is already installed in this process"; },
      "libtorch refused the memory meter's CPU allocator");
  meter->installed_.store(true);
  // Kept for the process's life once installed (cpu_allocator_slot.h); the shared_ptr owns the
  // installation, not the object.
  return std::shared_ptr<MemoryMeter>(meter, [](MemoryMeter* owned) { owned->uninstall(); });
}

void MemoryMeter::uninstall() {
  if (!installed_.exchange(false)) return;
  uninstallCpuAllocator(g_installed, this, previous_, kPriority);
}

c10::DataPtr MemoryMeter::allocate(std::size_t bytes) {
  void* base = previous_->raw_allocate(bytes + kHeaderBytes);
  MemoryAccount::Counters* counters = t_current;
  if (counters != nullptr) {
    counters->acquire();
    counters->charge(bytes);
  }
  new (base) Header{bytes, counters, previous_->raw_deleter()};
  void* data = static_cast<char*>(base) + kHeaderBytes;
  return c10::DataPtr(data, data, &MemoryMeter::deleteData, c10::Device(c10::DeviceType::CPU));
}

void MemoryMeter::deleteData(void* data) {
  if (data == nullptr) return;
  void* base = static_cast<char*>(data) - kHeaderBytes;
  const Header header = *static_cast<Header*>(base);
  if (header.counters != nullptr) {
    header.counters->refund(header.bytes);
    header.counters->releaseReference();
  }
  header.free(base);
}

void MemoryMeter::copy_data(void* dest, const void* src, std::size_t count) const {
  default_copy_data(dest, src, count);
}

}  // namespace chorus::device
