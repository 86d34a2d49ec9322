#include "checkpoint/checkpoint_archive.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <sstream>

#include "chorus/core/error.h"

namespace chorus::runtime {

std::string archiveBytes(torch::serialize::OutputArchive& archive) {
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

torch::serialize::InputArchive archiveOf(const std::string& bytes) {
  torch::serialize::InputArchive archive;
  archive.load_from(bytes.data(), bytes.size());
  return archive;
}

at::Tensor generatorState(at::Generator generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void setGeneratorState(at::Generator generator, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

at::Generator cpuGenerator() { return at::detail::getDefaultCPUGenerator(); }

nlohmann::json samplerJson(const data::GlobalSampler& sampler, std::int64_t step) {
  const data::SamplerState state = sampler.state(step);
  return {{"epoch", state.epoch}, {"position", state.position}, {"step", state.step}};
}

std::int64_t resumeSampler(const data::GlobalSampler& sampler, const nlohmann::json& saved) {
  return sampler.resume({saved.at("epoch").get<std::int64_t>(),
                         saved.at("position").get<std::int64_t>(),
                         saved.at("step").get<std::int64_t>()});
}

void translateRestoreErrors(const std::string& dir, const std::function<void()>& restore) {
  try {
    restore();
  } catch (const nlohmann::json::exception& error) {
    CHORUS_THROW(CheckpointError, "checkpoint '", dir,
                 "': trainer.json is damaged or from another chorus version: ", error.what());
  } catch (const c10::Error& error) {
    CHORUS_THROW(CheckpointError, "checkpoint '", dir,
                 "' does not fit this model or optimizer: ", error.what_without_backtrace());
  } catch (const Error&) {
    throw;
  } catch (const std::exception& error) {
    CHORUS_THROW(CheckpointError, "checkpoint '", dir, "' is damaged: ", error.what());
  }
}

}  // namespace chorus::runtime
