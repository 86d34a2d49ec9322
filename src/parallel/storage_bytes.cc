#include "chorus/parallel/storage_bytes.h"

#include <c10/core/Allocator.h>
#include <c10/core/StorageImpl.h>

#include <algorithm>
#include <map>

namespace chorus::parallel {
namespace {

std::size_t elementBytes(const at::Tensor& tensor) {
  return static_cast<std::size_t>(tensor.numel()) * tensor.element_size();
}

// Bytes of the storage a contiguous tensor reaches: its offset and its elements.
std::size_t extentBytes(const at::Tensor& tensor) {
  return static_cast<std::size_t>(tensor.storage_offset() + tensor.numel()) * tensor.element_size();
}

}  // namespace

void dropStorageBytes(const at::Tensor& tensor) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(c10::DataPtr(nullptr, tensor.device()));
  storage->set_nbytes(0);
}

void allocateStorageBytes(const at::Tensor& tensor) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  const std::size_t bytes = elementBytes(tensor);
  storage->set_data_ptr_noswap(c10::GetAllocator(tensor.device().type())->allocate(bytes));
  storage->set_nbytes(bytes);
}

bool storageBytesDropped(const at::Tensor& tensor) {
  return tensor.numel() > 0 && tensor.storage().nbytes() < extentBytes(tensor);
}

void allocateDroppedStorages(const std::vector<at::Tensor>& tensors) {
  std::map<c10::StorageImpl*, std::size_t> needed;
  for (const at::Tensor& tensor : tensors) {
    if (!storageBytesDropped(tensor)) continue;
    std::size_t& bytes = needed[tensor.storage().unsafeGetStorageImpl()];
    bytes = std::max(bytes, extentBytes(tensor));
  }
  for (const auto& [storage, bytes] : needed) {
    storage->set_data_ptr_noswap(c10::GetAllocator(storage->device_type())->allocate(bytes));
    storage->set_nbytes(bytes);
  }
}

}  // namespace chorus::parallel
