#pragma once

#include "perf_common.hpp"

namespace topoccl::perf {

extern const CollectiveSpec kAllReduce, kAllGather, kReduceScatter, kAlltoAll, kBroadcast, kReduce, kSendRecv, kGather,
    kScatter, kAlltoAllv, kHyperCube;

}  // namespace topoccl::perf
