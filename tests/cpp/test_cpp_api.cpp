// The C++ API: Work handles, groups, split and exceptions, with ranks as threads.
#include <catch2/catch.hpp>

#include <numeric>
#include <thread>
#include <vector>

#include "topoccl/communicator.hpp"

using topoccl::Communicator;
using topoccl::Work;

namespace {

template <class Body>
void onRanks(int nranks, Body body) {
  const ncclUniqueId id = Communicator::newUniqueId();
  std::vector<std::thread> threads;
  std::vector<int> failures(nranks, 0);
  for (int r = 0; r < nranks; ++r)
    threads.emplace_back([&, r] {
      try {
        Communicator comm = Communicator::create(id, nranks, r);
        failures[r] = body(comm);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d threw: %s\n", r, e.what());
        failures[r] = 1;
      }
    });
  for (auto& t : threads) t.join();
  CHECK(std::accumulate(failures.begin(), failures.end(), 0) == 0);
}

}  // namespace

TEST_CASE("asynchronous collectives return Work handles") {
  onRanks(3, [](Communicator& comm) {
    std::vector<int32_t> a(5000, comm.rank() + 1), b(5000 * 3, -1);
    Work first = comm.allReduce(a.data(), a.data(), a.size(), ncclInt32, ncclSum);
    first.wait();
    Work second = comm.allGather(a.data(), b.data(), a.size(), ncclInt32);
    second.wait();
    int failures = 0;
    for (int32_t x : a) failures += x != 6;
    for (int32_t x : b) failures += x != 6;
    failures += !first.test() || first.result() != ncclSuccess;
    return failures;
  });
}

TEST_CASE("grouped send/recv through the C++ API, and split") {
  onRanks(4, [](Communicator& comm) {
    const int n = comm.size(), r = comm.rank();
    std::vector<double> out(777, r * 1.25), in(777, 0);
    comm.beginGroup();
    comm.send(out.data(), out.size(), ncclDouble, (r + 1) % n);
    comm.recv(in.data(), in.size(), ncclDouble, (r + n - 1) % n);
    comm.endGroup().wait();
    int failures = 0;
    for (double x : in) failures += x != ((r + n - 1) % n) * 1.25;
    Communicator half = comm.split(r / 2, r);
    failures += half.size() != 2 || half.rank() != r % 2;
    int64_t v = r, s = 0;
    half.allReduce(&v, &s, 1, ncclInt64, ncclSum).wait();
    failures += s != (r / 2 == 0 ? 1 : 5);
    return failures;
  });
}

TEST_CASE("bad arguments throw topoccl::Error with the NCCL code and the argument's name") {
  onRanks(2, [](Communicator& comm) {
    std::vector<float> a(8);
    int failures = 0;
    try {
      comm.broadcast(a.data(), a.data(), a.size(), ncclFloat, 7);
      failures += 1;
    } catch (const topoccl::Error& e) {
      failures += e.code() != ncclInvalidArgument;
      failures += std::string(e.what()).find("root 7") == std::string::npos;
    }
    try {
      comm.allReduce(nullptr, a.data(), a.size(), ncclFloat, ncclSum);
      failures += 1;
    } catch (const topoccl::Error& e) {
      failures += std::string(e.what()).find("sendbuff") == std::string::npos;
    }
    return failures;
  });
}
