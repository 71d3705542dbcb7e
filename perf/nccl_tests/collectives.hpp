#pragma once

#include "perf_common.hpp"

namespace topoccl::perf {

extern const CollectiveSpec kAllReduce, kAllGather, kReduceScatter, kAlltoAll, kBroadcast, kReduce, kSendRecv, kGather,
    kScatter;

}  // namespace topoccl::perf
