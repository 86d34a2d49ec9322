// Private to runtime: the elastic recovery of a pipeline job (elastic_recovery.cc,
// docs/elastic.md). The next generation runs the plan survivorPipelinePlan makes for the
// members' devices; its ranks take their layers from the members that hold them at the step the
// generation goes on from — a replica pipeline's copy of a lost stage, a stage that moved, a lone
// survivor's whole model — and only when some layer has no such holder (a pipeline without
// replicas that lost a stage) do they all go back to the last checkpoint.
#pragma once

#include <optional>
#include <string>

#include "chorus/runtime/launch/elastic_membership.h"
#include "train/layer_transfer.h"
#include "train/trainer_state.h"

namespace chorus::runtime {

// The header the source of generation `next` hands every member: the next plan, re-cut over the
// members' devices (a joiner's is the launch rank's it replaces), the launch rank each member
// runs in place of, and the launch plan. Not collective. Where no plan fits — a new device (a
// pipeline job takes none), no cut within the devices' memory — it carries the reason as "error"
// instead, so that every member stops with it at once (rather than wait for a source that threw).
std::string pipelineHeader(const Trainer::State& s, const Generation& next);

// The layers of `next_plan` from the members that hold them at step `step`, moved while this
// rank's engine of the previous generation still holds its own (call before it goes): the states
// of the layers this rank keeps and of those it receives (values are copied into the model), or
// nullopt when some layer has no holder at `step` (every member then agrees: the checkpoint).
// Collective over the new world. A rank that took part in a move that failed holds nothing
// trustworthy afterwards; `s.layers_unsure` records it for the next attempt.
// `hooks.at_point` is called with "regroup" once this rank's values may change.
std::optional<ReceivedStates> layersFromMembers(Trainer::State& s, const plan::Plan& next_plan,
                                                std::int64_t step, const TrainerHooks& hooks);

// Gives the optimizer of `engine` (just built for the next plan) the states `states` holds for
// its parameters.
void installLayerStates(StepEngine& engine, ReceivedStates states);

}  // namespace chorus::runtime
