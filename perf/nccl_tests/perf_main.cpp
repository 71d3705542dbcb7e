// main() of one <collective>_perf program; CMake defines TOPOCCL_PERF_SPEC (kAllReduce, ...).
#include "collectives.hpp"

int main(int argc, char** argv) { return topoccl::perf::runPerf(topoccl::perf::TOPOCCL_PERF_SPEC, argc, argv); }
