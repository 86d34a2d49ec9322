// A tensor's bytes dropped and given back while the tensor itself (its sizes, its storage object,
// the views and autograd nodes that hold it) stays: how ZeRO-3 frees a gathered layer, and how a
// pipeline rank holds the values of its own stage's layers only.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace chorus::parallel {

// Drops the bytes of `tensor`'s storage, keeping the storage object that views share. Reading
// the tensor afterwards is undefined until allocateStorageBytes. Not thread-safe against other
// users of the storage.
void dropStorageBytes(const at::Tensor& tensor);

// Gives `tensor`'s storage bytes for its elements again, uninitialized, from the device's
// allocator as it is now (a memory budget installed since counts them).
void allocateStorageBytes(const at::Tensor& tensor);

// Whether `tensor`'s storage holds fewer bytes than its elements need (dropped).
bool storageBytesDropped(const at::Tensor& tensor);

// Gives every dropped storage among `tensors` bytes again, uninitialized, enough for all of
// `tensors` that view it (ZeRO-3's parameters are views of one flat buffer per layer).
void allocateDroppedStorages(const std::vector<at::Tensor>& tensors);

}  // namespace chorus::parallel
