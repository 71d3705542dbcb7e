// A simulated run drawn as a standalone SVG timeline: one row per resource of the cost model, one
// rectangle (class "event", with a <title> tooltip) per SimEvent coloured by its source rank, a time
// axis in microseconds with ticks, and a legend of rank colours.
#pragma once

#include <string>

#include "algorithms/cost_model.hpp"
#include "algorithms/simulator.hpp"

namespace topoccl::algo {

std::string timelineSvg(const SimResult& result, const CostModel& model);

}  // namespace topoccl::algo
