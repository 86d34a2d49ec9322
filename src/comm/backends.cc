#include "backend.h"

#include "chorus/comm/store/c10d_store.h"
#include "chorus/comm/store/prefix_store.h"
#include "chorus/core/error.h"
#include "shm/shm_transport.h"
#include "work_state.h"

namespace chorus::comm {

Backends::Backends(std::shared_ptr<Store> store, int rank, int size, const CommOptions& options,
                   std::shared_ptr<GroupContext> group)
    : store_(std::move(store)),
      rank_(rank),
      size_(size),
      timeout_(options.timeout),
      bind_address_(options.bind_address),
      group_(group) {
  const std::string& transport = options.cpu_transport;
  if (transport != "auto" && transport != "gloo" && transport != "shm")
    CHORUS_THROW(ConfigError, "group '", options.name, "': cpu_transport '", transport,
                 "' is not one of auto, gloo, shm");
  if (transport != "gloo" && (options.shm_chunk_bytes == 0 || options.shm_chunk_bytes % 64 != 0))
    CHORUS_THROW(ConfigError, "group '", options.name, "': shm_chunk_bytes ",
                 options.shm_chunk_bytes, " must be a positive multiple of 64");
  gloo_ = createGlooBackend(argsFor("gloo"));
  if (transport == "gloo") return;
  ShmSetup setup;
  setup.required = transport == "shm";
  setup.chunk_bytes = options.shm_chunk_bytes;
  setup.timeout = options.timeout;
  // Only the members of a subgroup (Communicator::subgroup names it "parent/child") are kept apart
  // by their declared hosts: a hierarchy's groups across hosts must take the network link its
  // topology says, while a job's world, an elastic generation's included (it maps member ids
  // through global_ranks too), uses shared memory wherever the machine allows.
  if (options.name.find('/') != std::string::npos) setup.host_id = options.host_id;
  shm_ = connectShm(*store_, rank_, size_, setup, std::move(group));
}

Backends::~Backends() {
  // An aborted group may have a Gloo collective in flight towards a lost peer (its wait gave up,
  // Work::wait). libtorch's ProcessGroupGloo joins its worker threads on destruction, which would
  // block the survivors' recovery until that collective's own deadline: the process group is
  // left alive instead (its threads end the collective at the deadline, then idle). A few per
  // recovery, freed with the process.
  if (group_ && group_->aborted.load() && gloo_) (void)gloo_.release();
}

ShmTransport* Backends::shmFor(const at::Tensor& tensor) const {
  return tensor.is_cpu() ? shm_.get() : nullptr;
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
