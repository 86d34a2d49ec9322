// One-line reasons for the planner's ranking: why the best plan wins, and for each other plan the
// term of the step time where it loses most against the best.
#pragma once

#include <vector>

#include "search/search_space.h"

namespace chorus::plan::detail {

// Fills Plan::reason of every plan in result.plans (best first).
void explainPlans(const CostModel& model, PlanResult& result);

// "12.3 ms", "1.45 s".
std::string formatSeconds(double seconds);

}  // namespace chorus::plan::detail
