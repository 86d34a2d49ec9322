// Private to device: installing and uninstalling a wrapper of libtorch's CPU allocator
// (MemoryBudget, MemoryMeter), at most one of each kind per process, registered in `slot`.
#pragma once

#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "chorus/core/error.h"

namespace chorus::device {

// libtorch's current CPU allocator, for a wrapper to allocate through. Throws DeviceError when it
// has no raw interface to wrap.
inline c10::Allocator* wrappableCpuAllocator() {
  c10::Allocator* current = c10::GetAllocator(c10::DeviceType::CPU);
  if (current == nullptr || current->raw_deleter() == nullptr)
    CHORUS_THROW(DeviceError, "the current CPU allocator has no raw interface to wrap");
  return current;
}

// Every wrapper libtorch has seen, kept for the process's life (storages keep raw pointers to
// their allocator, so none may go, even uninstalled), and reachable from here so that the leak
// checker does not count the deliberate retention as a leak. Never destroyed: libtorch's own
// statics may free storages after ours are gone.
template <typename Wrapper>
void retainForTheProcess(std::unique_ptr<Wrapper> wrapper) {
  static auto* const mutex = new std::mutex;
  static auto* const retained = new std::vector<std::unique_ptr<Wrapper>>;
  std::lock_guard<std::mutex> lock(*mutex);
  retained->push_back(std::move(wrapper));
}

// Registers `wrapper` in `slot` and makes it libtorch's CPU allocator at `priority`, and returns
// it, kept for the process's life (retainForTheProcess). Until libtorch has seen it nothing refers
// to it, so a failure deletes it: DeviceError already(the wrapper in the slot) when the slot is
// taken, DeviceError `refused` (the slot emptied again) when libtorch keeps another one.
template <typename Wrapper, typename AlreadyMessage>
Wrapper* installCpuAllocator(std::atomic<Wrapper*>& slot, std::unique_ptr<Wrapper> wrapper,
                             std::uint8_t priority, AlreadyMessage already, const char* refused) {
  Wrapper* expected = nullptr;
  if (!slot.compare_exchange_strong(expected, wrapper.get()))
    CHORUS_THROW(DeviceError, already(*expected));
  c10::SetAllocator(c10::DeviceType::CPU, wrapper.get(), priority);
  if (c10::GetAllocator(c10::DeviceType::CPU) != wrapper.get()) {
    slot.store(nullptr);
    CHORUS_THROW(DeviceError, refused);
  }
  Wrapper* installed = wrapper.get();
  retainForTheProcess(std::move(wrapper));
  return installed;
}

// Undoes installCpuAllocator: puts `previous` back only if `wrapper` is still libtorch's CPU
// allocator (something installed over it since keeps its place), and empties the slot.
template <typename Wrapper>
void uninstallCpuAllocator(std::atomic<Wrapper*>& slot, Wrapper* wrapper, c10::Allocator* previous,
                           std::uint8_t priority) {
  if (c10::GetAllocator(c10::DeviceType::CPU) == wrapper)
    c10::SetAllocator(c10::DeviceType::CPU, previous, priority);
  slot.compare_exchange_strong(wrapper, nullptr);
}

}  // namespace chorus::device
