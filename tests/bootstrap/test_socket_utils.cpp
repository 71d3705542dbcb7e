#include <catch2/catch.hpp>

#include <arpa/inet.h>

#include <thread>

#include "bootstrap/socket.hpp"
#include "common/config.hpp"
#include "common/error.hpp"

using namespace topoccl;
using namespace topoccl::bootstrap;
using namespace std::chrono_literals;

namespace {

NetworkInterface fakeInterface(const std::string& name, const std::string& ip, int prefix) {
  return NetworkInterface{name, SocketAddress::parse((ip.find(':') != std::string::npos ? "[" + ip + "]" : ip) + ":0"),
                          prefix};
}

std::vector<std::string> names(const std::vector<NetworkInterface>& interfaces) {
  std::vector<std::string> result;
  for (const auto& itf : interfaces) result.push_back(itf.name + "/" + itf.address.host());
  return result;
}

bool hasLoopbackV6() {
  for (const auto& itf : listInterfaces())
    if (itf.address.family() == AF_INET6 && itf.address.host() == "::1") return true;
  return false;
}

}  // namespace

TEST_CASE("socket addresses parse and format as ip:port") {
  CHECK(SocketAddress::parse("10.1.2.3:5000").toString() == "10.1.2.3:5000");
  CHECK(SocketAddress::parse("10.1.2.3:5000").family() == AF_INET);
  CHECK(SocketAddress::parse("10.1.2.3:5000").port() == 5000);
  CHECK(SocketAddress::parse("[fd00::2]:41234").toString() == "[fd00::2]:41234");
  CHECK(SocketAddress::parse("[fd00::2]:41234").family() == AF_INET6);
  CHECK(SocketAddress::parse("localhost:80").port() == 80);

  for (const char* bad : {"10.1.2.3", "10.1.2.3:", "10.1.2.3:70000", "10.1.2.3:x1", "fd00::2:5000", "[fd00::2:5000",
                          ":5000"}) {
    INFO(bad);
    try {
      SocketAddress::parse(bad);
      FAIL("expected a parse error");
    } catch (const Error& e) {
      CHECK(e.code() == ncclInvalidArgument);
      CHECK(std::string(e.what()).find(bad) != std::string::npos);
    }
  }

  const uint8_t ip[4] = {192, 0, 2, 7};
  const SocketAddress fromBytes = SocketAddress::fromBytes(AF_INET, ip, 9);
  CHECK(fromBytes.toString() == "192.0.2.7:9");
  CHECK(fromBytes.ipBytes() == std::vector<uint8_t>{192, 0, 2, 7});
  CHECK(fromBytes.inSubnet(SocketAddress::parse("192.0.2.200:0"), 24));
  CHECK_FALSE(fromBytes.inSubnet(SocketAddress::parse("192.0.3.1:0"), 24));
  CHECK(SocketAddress::any(AF_INET6, 7).toString() == "[::]:7");
}

TEST_CASE("NCCL_SOCKET_IFNAME syntax: prefixes, ^ excludes, = exact") {
  CHECK(interfaceMatches("", "eth0"));
  CHECK(interfaceMatches("eth", "eth0"));
  CHECK(interfaceMatches("eth,ib", "ib1"));
  CHECK_FALSE(interfaceMatches("eth,ib", "lo"));
  CHECK_FALSE(interfaceMatches("^docker,lo", "docker0"));
  CHECK_FALSE(interfaceMatches("^docker,lo", "lo"));
  CHECK(interfaceMatches("^docker,lo", "eth0"));
  CHECK(interfaceMatches("=eth0", "eth0"));
  CHECK_FALSE(interfaceMatches("=eth0", "eth01"));
  CHECK_FALSE(interfaceMatches("^=eth0", "eth0"));
  CHECK(interfaceMatches("^=eth0", "eth01"));
}

TEST_CASE("automatic interface order follows NCCL: ib, COMM_ID subnet, others, docker, lo, virbr") {
  const std::vector<NetworkInterface> all = {
      fakeInterface("lo", "127.0.0.1", 8),         fakeInterface("virbr0", "192.168.122.1", 24),
      fakeInterface("docker0", "172.17.0.1", 16),  fakeInterface("eth0", "fd00::5", 64),
      fakeInterface("eth0", "10.0.0.5", 24),       fakeInterface("ib0", "192.168.1.1", 24),
      fakeInterface("enp3s0", "10.9.0.5", 16),
  };
  CHECK(names(orderInterfaces(all, "", 0, std::nullopt)) ==
        std::vector<std::string>{"ib0/192.168.1.1", "eth0/10.0.0.5", "enp3s0/10.9.0.5", "eth0/fd00::5",
                                 "docker0/172.17.0.1", "lo/127.0.0.1", "virbr0/192.168.122.1"});
  // The interface on NCCL_COMM_ID's subnet comes right after ib*.
  const auto withCommId = orderInterfaces(all, "", 0, SocketAddress::parse("10.9.3.3:5000"));
  CHECK(names(withCommId)[1] == "enp3s0/10.9.0.5");
  CHECK(names(orderInterfaces(all, "", AF_INET6, std::nullopt)) == std::vector<std::string>{"eth0/fd00::5"});
  CHECK(names(orderInterfaces(all, "=lo", 0, std::nullopt)) == std::vector<std::string>{"lo/127.0.0.1"});
  CHECK(names(orderInterfaces(all, "^eth,ib,docker,virbr,enp", AF_INET, std::nullopt)) ==
        std::vector<std::string>{"lo/127.0.0.1"});
  CHECK(orderInterfaces(all, "wlan", 0, std::nullopt).empty());
}

TEST_CASE("selectInterface honours NCCL_SOCKET_IFNAME and names the choices when nothing matches") {
  config::setOverride("NCCL_SOCKET_IFNAME", "=lo");
  CHECK(selectInterface().name == "lo");
  config::setOverride("NCCL_SOCKET_IFNAME", "nosuchif");
  try {
    selectInterface();
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.code() == ncclInvalidArgument);
    const std::string text = e.what();
    CHECK(text.find("NCCL_SOCKET_IFNAME='nosuchif'") != std::string::npos);
    CHECK(text.find("lo 127.0.0.1") != std::string::npos);  // what does exist
  }
  config::setOverride("NCCL_SOCKET_IFNAME", std::nullopt);
  config::setOverride("NCCL_SOCKET_FAMILY", "AF_BOGUS");
  CHECK_THROWS_WITH(selectInterface(), Catch::Contains("NCCL_SOCKET_FAMILY"));
  if (hasLoopbackV6()) {
    config::setOverride("NCCL_SOCKET_FAMILY", "AF_INET6");
    config::setOverride("NCCL_SOCKET_IFNAME", "=lo");
    CHECK(selectInterface().address.host() == "::1");
  }
  config::clearOverrides();
}

TEST_CASE("blocking helpers move data, and report a closed peer and a deadline as remote errors") {
  Listener listener = listenOn(SocketAddress::parse("127.0.0.1:0"), false, false);
  REQUIRE(listener.address.port() != 0);
  FileDescriptor client = connectUntil(listener.address, Clock::now() + 5s, "test client");
  FileDescriptor server = acceptConnection(listener.fd.get(), false, nullptr, "test server");
  REQUIRE(server.valid());

  std::vector<char> payload(3 << 20);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 7 + 3);
  std::vector<char> received(payload.size());
  std::thread sender([&] { sendAll(client.get(), payload.data(), payload.size(), Clock::now() + 10s, "test send"); });
  recvAll(server.get(), received.data(), received.size(), Clock::now() + 10s, "test recv");
  sender.join();
  CHECK(received == payload);

  char byte = 0;
  try {
    recvAll(server.get(), &byte, 1, Clock::now() + 100ms, "test recv with deadline");
    FAIL("expected a timeout");
  } catch (const Error& e) {
    CHECK(e.code() == ncclRemoteError);
    CHECK_THAT(e.what(), Catch::Contains("test recv with deadline") && Catch::Contains("timed out"));
  }

  client.reset();
  try {
    recvAll(server.get(), &byte, 1, Clock::now() + 5s, "test recv after close");
    FAIL("expected a closed-connection error");
  } catch (const Error& e) {
    CHECK(e.code() == ncclRemoteError);
    CHECK_THAT(e.what(), Catch::Contains("closed the connection"));
  }
}

TEST_CASE("connectUntil retries until the deadline and then names the address") {
  // A port that was just free: nobody listens there.
  SocketAddress address;
  {
    Listener probe = listenOn(SocketAddress::parse("127.0.0.1:0"), false, false);
    address = probe.address;
  }
  const auto start = Clock::now();
  try {
    connectUntil(address, Clock::now() + 300ms, "test connect");
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.code() == ncclRemoteError);
    CHECK_THAT(e.what(), Catch::Contains(address.toString()) && Catch::Contains("test connect"));
  }
  CHECK(Clock::now() - start < 10s);

  // A listener that appears late is still reached.
  FileDescriptor connected;
  std::thread late([&] { connected = connectUntil(address, Clock::now() + 10s, "late connect"); });
  std::this_thread::sleep_for(100ms);
  Listener listener = listenOn(address, true, false);
  late.join();
  CHECK(connected.valid());
}
