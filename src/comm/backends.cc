#include "backend.h"

#include "chorus/comm/c10d_store.h"
#include "chorus/comm/prefix_store.h"

namespace chorus::comm {

Backends::Backends(std::shared_ptr<Store> store, int rank, int size,
                   std::chrono::milliseconds timeout, std::string bind_address)
    : store_(std::move(store)),
      rank_(rank),
      size_(size),
      timeout_(timeout),
      bind_address_(std::move(bind_address)) {
  gloo_ = createGlooBackend(argsFor("gloo"));
}

BackendArgs Backends::argsFor(const std::string& prefix) const {
  BackendArgs args;
  args.store = c10::make_intrusive<C10dStoreAdapter>(std::make_shared<PrefixStore>(prefix, store_));
  args.store->setTimeout(timeout_);
  args.rank = rank_;
  args.size = size_;
  args.timeout = timeout_;
  args.bind_address = bind_address_;
  return args;
}

c10d::Backend& Backends::forTensor(const at::Tensor& tensor) {
  if (!tensor.is_cuda()) return *gloo_;
  std::lock_guard<std::mutex> lock(mutex_);
  if (!nccl_) nccl_ = createNcclBackend(argsFor("nccl"));
  return *nccl_;
}

}  // namespace chorus::comm
