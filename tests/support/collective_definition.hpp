// What a collective's output must be, straight from its definition: element e of rank r's output, given
// every rank's original input (input(rank, index)) and a binary operator. Shared by the tests that run plans
// on host threads and on a GPU, so both check against one independent definition.
#pragma once

#include <cstddef>

#include "algorithms/plan.hpp"

namespace topoccl::test {

template <class Input, class Combine>
double collectiveOutput(algo::Collective collective, int nranks, int root, size_t count, int r, size_t e,
                        const Input& input, const Combine& combine) {
  const size_t block = e / count, within = e % count;
  const size_t own = static_cast<size_t>(r) * count + within;
  const auto reduced = [&](size_t index) {
    double v = input(0, index);
    for (int q = 1; q < nranks; ++q) v = combine(v, input(q, index));
    return v;
  };
  switch (collective) {
    case algo::Collective::AllReduce:
    case algo::Collective::Reduce: return reduced(e);
    case algo::Collective::ReduceScatter: return reduced(own);
    case algo::Collective::AllGather:
    case algo::Collective::Gather: return input(static_cast<int>(block), within);
    case algo::Collective::Broadcast: return input(root, e);
    case algo::Collective::AllToAll: return input(static_cast<int>(block), own);
    case algo::Collective::Scatter: return input(root, own);
  }
  return 0;
}

}  // namespace topoccl::test
