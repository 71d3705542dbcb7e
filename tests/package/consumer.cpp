// Uses the installed C++ API: one rank all-reduces and checks the result.
#include <cstdio>
#include <vector>

#include "topoccl/communicator.hpp"

int main() {
  auto comm = topoccl::Communicator::create(topoccl::Communicator::newUniqueId(), 1, 0);
  std::vector<int> in(100, 21), out(100, 0);
  comm.allReduce(in.data(), out.data(), in.size(), ncclInt32, ncclSum).wait();
  std::printf("consumer: %s\n", out[99] == 21 ? "ok" : "WRONG");
  return out[99] == 21 ? 0 : 1;
}
