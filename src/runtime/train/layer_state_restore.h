// Private to runtime: a checkpoint read layer by layer, so that a layout other than the one that
// wrote it can continue from it — a pipeline checkpoint on another cut, stage count or replica
// count, on one stage per replica, or a data-parallel checkpoint on a pipeline. Elastic recovery
// of a pipeline needs it (a lost stage's layers go to the survivors, docs/elastic.md), and so
// does `chorus train --resume` on other devices.
#pragma once

#include <torch/optim.h>
#include <torch/serialize/input-archive.h>

#include <string>
#include <vector>

#include "chorus/model/zoo_model.h"
#include "chorus/runtime/job/job_config.h"
#include "train/step_engine.h"

namespace chorus::runtime {

// Where a checkpoint keeps layers [first, last): their values (named as in the whole model), the
// optimizer state of their trainable parameters (over `whole_model ? all the model's parameters
// : those layers' trainable ones`, in the model's order, as the engine that wrote it optimized
// them), and the file with the RNG and loss scale of the rank that trained them. Value type.
struct LayerFiles {
  int first = 0;
  int last = 0;
  std::string model;
  std::string optimizer;
  std::string rank_state;
  bool whole_model = false;
};

// The files of the checkpoint at `source` by layers, covering [0, `layers`): one per stage of the
// first replica of a pipeline, one for data parallelism. Throws CheckpointError for a layout that
// keeps no whole copy of each layer (ZeRO, local SGD's own models) or cuts that do not cover
// the model.
std::vector<LayerFiles> layerFilesOf(const CheckpointSource& source, int layers);

// Sets the values of layers [first, last) of `model` and the optimizer state of `optimizer` from
// `source`, whatever layout wrote it (layerFilesOf). `optimizer` must optimize exactly those
// layers' trainable parameters, or all of the model's when [first, last) is the whole model;
// `options` are the job's (the optimizer kind that wrote the state). Returns the rank-state file
// of the rank that trained layer `first`. Throws CheckpointError.
std::string restoreLayers(const CheckpointSource& source, model::ZooModel& model, int first,
                          int last, torch::optim::Optimizer& optimizer,
                          const OptimizerSection& options);

// restoreLayers, then this process's CPU generator from the rank state of the rank that trained
// layer `first` (the loss scale and a codec's memory were another rank's: they start afresh).
// Returns the steps the run had skipped (trainer.json).
std::int64_t restoreLayersAndGenerator(const CheckpointSource& source, model::ZooModel& model,
                                       int first, int last, torch::optim::Optimizer& optimizer,
                                       const OptimizerSection& options);

// `archive`'s tensor `name` copied into `target` in place: `target` keeps its device and storage,
// where libtorch's read would move it to the device that wrote the file (a CPU rank's file read
// on a GPU rank).
void readInto(torch::serialize::InputArchive& archive, const std::string& name, at::Tensor target,
              bool is_buffer);

// Every optimizer state tensor moved to its parameter's device (a state loaded from a file is
// on the device that wrote it).
void moveStatesToParameters(torch::optim::Optimizer& optimizer);

// "3 stages x 1 replica, cut 2+1+2" or "one stage per replica on 3 ranks": how a checkpoint's
// layout reads in a log line.
std::string describeSavedLayout(const CheckpointSource& source);

}  // namespace chorus::runtime
