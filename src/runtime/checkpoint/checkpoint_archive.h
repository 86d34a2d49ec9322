// Private to runtime: the pieces both trainers' checkpoints are made of — libtorch archives as
// bytes, generator states, the sampler position as JSON.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "chorus/data/sampler.h"

namespace chorus::runtime {

// "rank-<rank>.pt": a data-parallel rank's own file of a checkpoint (its RNG, loss scaler, codec
// memory, and under ZeRO its slices).
std::string rankFile(int rank);
// The archive serialized to bytes (libtorch's zip format).
std::string archiveBytes(torch::serialize::OutputArchive& archive);
// An archive read from bytes. Throws CheckpointError where the archive announces sizes it does
// not hold (checked before libtorch reads it; see checkpoint_archive.cc), and what libtorch
// throws where it refuses the archive.
torch::serialize::InputArchive archiveOf(const std::string& bytes);
// The value a torch.save file (Python's, or torch::pickle_save's) holds, read by libtorch's
// unpickler after archiveOf's checks, its tensors on the CPU. Throws as archiveOf does.
c10::IValue pickledValueOf(const std::string& bytes);
// A generator's state, and restoring it (under the generator's lock).
at::Tensor generatorState(at::Generator generator);
void setGeneratorState(at::Generator generator, const at::Tensor& state);
at::Generator cpuGenerator();
// The sampler position of `step` as JSON, and the step it resumes at (checked by the sampler).
nlohmann::json samplerJson(const data::GlobalSampler& sampler, std::int64_t step);
std::int64_t resumeSampler(const data::GlobalSampler& sampler, const nlohmann::json& saved);

// Runs `restore` (reading checkpoint `dir` into a trainer) and turns what a checkpoint of another
// model, optimizer or chorus version makes libtorch and nlohmann throw into a CheckpointError
// naming the checkpoint. Every part of a restore runs inside: a key missing from trainer.json,
// read after the first checks, once escaped as a bare nlohmann::json::out_of_range.
// libtorch's archive reader also throws types outside c10::Error for damaged archives (e.g.
// torch::jit::ErrorReport for a type name it cannot parse, found by
// fuzz/checkpoint_archive_fuzzer.cc); every std::exception that is not a chorus::Error is one.
void translateRestoreErrors(const std::string& dir, const std::function<void()>& restore);

}  // namespace chorus::runtime
