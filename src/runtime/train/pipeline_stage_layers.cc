// A pipeline rank holds the values of its stage's layers only. Every rank builds the whole model
// from the job's seed (and takes rank 0's values), so that a layer's shape is known everywhere
// and a new cut (parallel.recut) can bring any layer to any stage; once the engine is built, the
// other layers' parameters give their bytes back. Their tensors stay (sizes, the storage object),
// so a layer that comes here later gets bytes again and is filled from the stage that sends it,
// or from a checkpoint.
#include <ATen/ATen.h>

#include <unordered_set>

#include "chorus/parallel/storage_bytes.h"
#include "train/pipeline_stage_engine.h"

namespace chorus::runtime {

void PipelineStageEngine::holdStageLayersOnly() {
  std::unordered_set<const void*> kept;
  for (const at::Tensor& parameter : engine->parameters()) {
    if (parallel::storageBytesDropped(parameter)) parallel::allocateStorageBytes(parameter);
    kept.insert(parameter.storage().unsafeGetStorageImpl());
  }
  const int first = engine->firstLayer(), last = engine->lastLayer();
  for (std::int64_t layer = 0; layer < model->numLayers(); ++layer) {
    if (layer >= first && layer < last) continue;
    for (at::Tensor parameter : model->layerParameters(layer)) {
      // A storage a stage parameter shares (tied weights) stays whole.
      if (kept.count(parameter.storage().unsafeGetStorageImpl()) > 0) continue;
      parameter.mutable_grad() = at::Tensor();
      if (!parallel::storageBytesDropped(parameter)) parallel::dropStorageBytes(parameter);
    }
  }
}

}  // namespace chorus::runtime
