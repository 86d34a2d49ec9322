// The Trainer's checkpoints: what goes into one, how it is restored, and when it is written.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "balancer_settings.h"
#include "checkpoint_archive.h"
#include "chorus/core/error.h"
#include "chorus/core/logging.h"
#include "trainer_state.h"

namespace chorus::runtime {
namespace {

constexpr const char* kModelFile = "model.pt";
constexpr const char* kOptimizerFile = "optimizer.pt";
constexpr const char* kTrainerFile = "trainer.json";

std::string rankFile(int rank) { return "rank-" + std::to_string(rank) + ".pt"; }

// The generator of the worker's device (CUDA), when it has one of its own.
std::optional<at::Generator> deviceGenerator(const Trainer::State& s) {
  const c10::Device device = s.worker->device();
  if (device.is_cpu()) return std::nullopt;
  return at::globalContext().defaultGenerator(device);
}

nlohmann::json trainerJson(const Trainer::State& s) {
  const plan::BalancerState balancer = s.balancer->exportState();
  std::vector<std::string> devices;
  for (const auto& device : s.job.devices) devices.push_back(device.toString());
  return {{"step", s.next_step},
          {"world_size", s.worker->worldSize()},
          {"seed", s.job.seed},
          {"global_batch", s.job.train.global_batch},
          {"model", s.model->describe()},
          {"skipped_steps", s.skipped_steps},
          {"sampler", samplerJson(*s.sampler, s.next_step)},
          {"balancer", balancerStateToJson(balancer)},
          {"config", s.job.toml}};
}

// The checkpoint must come from the same training problem; the devices may differ.
void checkCompatible(const Trainer::State& s, const nlohmann::json& saved, const std::string& dir) {
  auto mismatch = [&](const char* what, const std::string& then, const std::string& now) {
    CHORUS_THROW(CheckpointError, "checkpoint '", dir, "' is of another job: ", what, " was ", then,
                 ", the config says ", now);
  };
  if (saved.at("seed").get<std::uint64_t>() != s.job.seed)
    mismatch("seed", std::to_string(saved.at("seed").get<std::uint64_t>()),
             std::to_string(s.job.seed));
  if (saved.at("global_batch").get<std::int64_t>() != s.job.train.global_batch)
    mismatch("train.global_batch", std::to_string(saved.at("global_batch").get<std::int64_t>()),
             std::to_string(s.job.train.global_batch));
  if (saved.at("model").get<std::string>() != s.model->describe())
    mismatch("the model", saved.at("model").get<std::string>(), s.model->describe());
}

// The model archive is flat: one tensor per dotted parameter or buffer name.
void loadModel(model::ZooModel& model, torch::serialize::InputArchive& archive) {
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) archive.read(item.key(), item.value());
  for (auto& item : model.named_buffers()) archive.read(item.key(), item.value(), true);
}

void restoreRankState(Trainer::State& s, const std::string& bytes) {
  auto archive = archiveOf(bytes);
  at::Tensor cpu_rng, device_rng, scaler;
  archive.read("rng_cpu", cpu_rng);
  setGeneratorState(cpuGenerator(), cpu_rng);
  if (auto generator = deviceGenerator(s); generator && archive.try_read("rng_device", device_rng))
    setGeneratorState(*generator, device_rng);
  if (s.codec) {
    std::map<std::string, at::Tensor> codec;
    for (const auto& key : archive.keys()) {
      if (key.rfind("codec/", 0) != 0) continue;
      at::Tensor value;
      archive.read(key, value);
      codec[key.substr(6)] = value;
    }
    s.codec->loadState(codec);
  }
  at::Tensor since;
  if (archive.try_read("samples_since_average", since))
    s.samples_since_average = static_cast<std::int64_t>(since.item<double>());
  if (s.scaler && archive.try_read("loss_scale", scaler))
    s.scaler->loadState(
        {scaler[0].item<double>(), static_cast<std::int64_t>(scaler[1].item<double>())});
}

// Deep copy of one optimizer state entry (SGD and AdamW, the trainer's optimizers).
std::unique_ptr<torch::optim::OptimizerParamState> deepCopy(
    torch::optim::OptimizerParamState& state) {
  if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(&state)) {
    auto copy = std::make_unique<torch::optim::SGDParamState>();
    if (sgd->momentum_buffer().defined()) copy->momentum_buffer(sgd->momentum_buffer().clone());
    return copy;
  }
  if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(&state)) {
    auto copy = std::make_unique<torch::optim::AdamWParamState>();
    copy->step(adamw->step());
    copy->exp_avg(adamw->exp_avg().clone());
    copy->exp_avg_sq(adamw->exp_avg_sq().clone());
    if (adamw->max_exp_avg_sq().defined()) copy->max_exp_avg_sq(adamw->max_exp_avg_sq().clone());
    return copy;
  }
  CHORUS_THROW(CheckpointError, "cannot snapshot this optimizer's state (SGD and AdamW only)");
}

// The restore proper; restoreCheckpoint translates what libraries throw while it runs.
void restoreUnchecked(Trainer::State& s, const std::string& dir) {
  const Manifest manifest = readManifest(dir);
  const nlohmann::json saved =
      nlohmann::json::parse(readCheckpointFile(dir, manifest, kTrainerFile));
  checkCompatible(s, saved, dir);
  auto model = archiveOf(readCheckpointFile(dir, manifest, kModelFile));
  loadModel(*s.model, model);
  auto optimizer = archiveOf(readCheckpointFile(dir, manifest, kOptimizerFile));
  s.optimizer->load(optimizer);
  s.next_step = resumeSampler(*s.sampler, saved.at("sampler"));
  s.skipped_steps = saved.value("skipped_steps", std::int64_t{0});
  s.last_checkpoint_step = s.next_step;
  const int world = s.worker->worldSize();
  if (manifest.world_size == world) {
    s.balancer->importState(balancerStateFromJson(saved.at("balancer")));
    restoreRankState(s, readCheckpointFile(dir, manifest, rankFile(s.worker->rank())));
    const std::string own_model = "model-" + rankFile(s.worker->rank());
    if (s.job.comm.sync_every > 1 && manifest.find(own_model)) {
      auto model = archiveOf(readCheckpointFile(dir, manifest, own_model));
      loadModel(*s.model, model);
      auto optimizer =
          archiveOf(readCheckpointFile(dir, manifest, "optimizer-" + rankFile(s.worker->rank())));
      s.optimizer->load(optimizer);
    }
  } else if (s.worker->rank() == 0) {
    logInfo("resuming a ", manifest.world_size, "-rank checkpoint on ", world,
            " ranks: the batch sequence goes on, shares are planned anew");
  }
}

}  // namespace

StateCopy copyState(Trainer::State& s) {
  torch::NoGradGuard no_grad;
  StateCopy copy;
  for (const auto& item : s.model->named_parameters())
    copy.model.emplace_back(item.key(), item.value().detach().clone());
  for (const auto& item : s.model->named_buffers())
    copy.model.emplace_back(item.key(), item.value().detach().clone());
  std::vector<at::Tensor> parameters;
  for (const auto& parameter : s.optimizer->param_groups().at(0).params())
    parameters.push_back(parameter.detach().clone());
  copy.optimizer = makeOptimizer(s.job.optimizer, parameters);
  copy.optimizer->param_groups().at(0).set_options(
      s.optimizer->param_groups().at(0).options().clone());
  const auto& original = s.optimizer->param_groups().at(0).params();
  for (size_t i = 0; i < original.size(); ++i) {
    auto found = s.optimizer->state().find(original[i].unsafeGetTensorImpl());
    if (found != s.optimizer->state().end())
      copy.optimizer->state()[parameters[i].unsafeGetTensorImpl()] = deepCopy(*found->second);
  }
  return copy;
}

CheckpointSnapshot snapshotCheckpoint(Trainer::State& s) {
  CheckpointSnapshot snapshot;
  std::vector<CheckpointFile>& files = snapshot.small;
  if (s.worker->rank() == 0) files.push_back({kTrainerFile, trainerJson(s).dump(1) + "\n"});
  torch::serialize::OutputArchive mine;
  mine.write("rng_cpu", generatorState(cpuGenerator()));
  if (auto generator = deviceGenerator(s)) mine.write("rng_device", generatorState(*generator));
  if (s.scaler) {
    const auto state = s.scaler->state();
    mine.write("loss_scale",
               at::tensor({state.scale, static_cast<double>(state.clean_steps)}, at::kDouble));
  }
  if (s.codec)
    for (const auto& [key, value] : s.codec->state()) mine.write("codec/" + key, value.clone());
  mine.write("samples_since_average",
             at::tensor({static_cast<double>(s.samples_since_average)}, at::kDouble));
  files.push_back({rankFile(s.worker->rank()), archiveBytes(mine)});
  // Model and optimizer: deep copies now (memory bandwidth), serialized later — in the
  // background in async mode. Replicas are identical except under local SGD.
  const bool own = s.job.comm.sync_every > 1;
  if (s.worker->rank() != 0 && !own) return snapshot;
  auto copy = std::make_shared<StateCopy>(copyState(s));
  // Names built with a stream: GCC 12 warns falsely on `"x" + string` here (stringop-overflow).
  std::ostringstream suffix_text;
  if (own) suffix_text << '-' << rankFile(s.worker->rank());
  const std::string suffix = suffix_text.str();
  const bool shared = s.worker->rank() == 0;
  snapshot.serialize = [copy, suffix, shared] {
    std::vector<CheckpointFile> heavy;
    torch::serialize::OutputArchive model, optimizer;
    for (const auto& [name, tensor] : copy->model) model.write(name, tensor);
    copy->optimizer->save(optimizer);
    const std::string model_bytes = archiveBytes(model), optimizer_bytes = archiveBytes(optimizer);
    if (shared) {
      heavy.push_back({kModelFile, model_bytes});
      heavy.push_back({kOptimizerFile, optimizer_bytes});
    }
    if (!suffix.empty()) {
      heavy.push_back({std::string("model").append(suffix), model_bytes});
      heavy.push_back({std::string("optimizer").append(suffix), optimizer_bytes});
    }
    return heavy;
  };
  return snapshot;
}

void restoreCheckpoint(Trainer::State& s, const std::string& dir) {
  translateRestoreErrors(dir, [&] { restoreUnchecked(s, dir); });
}

std::string Trainer::checkpoint() {
  State& s = *state_;
  if (!s.checkpoints)
    CHORUS_THROW(ConfigError, "no checkpoint directory: set checkpoint.dir to write checkpoints");
  if (s.pending_checkpoint.valid()) s.pending_checkpoint.get();  // one write in flight at a time
  s.last_checkpoint_step = s.next_step;
  s.last_checkpoint_path = s.checkpoints->write(s.next_step, snapshotCheckpoint(s).files());
  return s.last_checkpoint_path;
}

void Trainer::resume(const std::string& checkpoint_dir) {
  restoreCheckpoint(*state_, checkpoint_dir);
  if (state_->worker->rank() == 0)
    logInfo("resumed from ", checkpoint_dir, " at step ", state_->next_step);
}

// Periodic, final and requested checkpoints; asynchronous ones snapshot now and write on a
// background thread while training goes on.
bool writeCheckpointIfDue(Trainer::State& s, bool final_or_requested) {
  if (!s.checkpoints || s.last_checkpoint_step == s.next_step) return false;
  const std::int64_t every = s.job.checkpoint.every;
  const bool due = final_or_requested || (every > 0 && s.next_step % every == 0);
  if (!due) return false;
  if (s.pending_checkpoint.valid()) s.pending_checkpoint.get();
  s.last_checkpoint_step = s.next_step;
  CheckpointSnapshot snapshot = snapshotCheckpoint(s);
  const std::int64_t step = s.next_step;
  if (s.job.checkpoint.async && !final_or_requested) {
    CheckpointWriter* writer = s.checkpoints.get();
    s.pending_checkpoint = std::async(std::launch::async, [writer, step, snapshot] {
      return writer->write(step, snapshot.files());
    });
    return true;
  }
  s.last_checkpoint_path = s.checkpoints->write(step, snapshot.files());
  return true;
}

// Waits for a background write; its path becomes the last checkpoint's.
void finishPendingCheckpoint(Trainer::State& s) {
  if (s.pending_checkpoint.valid()) s.last_checkpoint_path = s.pending_checkpoint.get();
}

}  // namespace chorus::runtime
