// tcp_exchange: what a 2-rank all-reduce asks of loopback TCP, without any library. Two processes (a fork)
// each send S bytes and receive S bytes at once, twice per iteration (a reduce-scatter and an all-gather
// of 2 S), non-blocking, moving at most --chunk bytes per send() or recv() call and alternating between them.
//
//   tcp_exchange [--bytes S] [--chunk C] [--streams 1|2] [--iters N]
//
// --streams 1: both directions share one TCP connection (as topoccl's socket transport did until
// 2026-11-25); 2: one connection per direction (as it does now, and as NCCL's net transport does).
// Prints the median, min and p90 wall time per iteration and the parent's CPU time per iteration. Run it
// beside `nstat -n; ...; nstat` to see TcpExtTCPBacklogCoalesce: segments that arrived while the receiving
// socket was held by its owner's own send() or recv(), handled later in that process's context.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

[[noreturn]] void die(const char* what) {
  std::perror(what);
  std::exit(1);
}

void exchange(int out, int in, const char* send, char* recv, size_t bytes, size_t chunk) {
  size_t sent = 0, got = 0;
  while (sent < bytes || got < bytes) {
    if (sent < bytes) {
      const ssize_t n = ::send(out, send + sent, std::min(chunk, bytes - sent), MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) sent += static_cast<size_t>(n);
      else if (n < 0 && errno != EAGAIN) die("send");
    }
    if (got < bytes) {
      const ssize_t n = ::recv(in, recv + got, std::min(chunk, bytes - got), MSG_DONTWAIT);
      if (n > 0) got += static_cast<size_t>(n);
      else if (n == 0) die("recv: peer closed");
      else if (errno != EAGAIN) die("recv");
    }
  }
}

int dial(const sockaddr_in& address) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || ::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) die("connect");
  return fd;
}

double usOf(const timeval& t) { return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_usec); }

}  // namespace

int main(int argc, char** argv) {
  size_t bytes = 1 << 20, chunk = 256 << 10;
  int streams = 2, iters = 2000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--bytes") bytes = std::strtoull(value, nullptr, 0);
    else if (flag == "--chunk") chunk = std::strtoull(value, nullptr, 0);
    else if (flag == "--streams") streams = std::atoi(value);
    else if (flag == "--iters") iters = std::atoi(value);
    else {
      std::fprintf(stderr, "unknown flag %s\nusage: %s [--bytes S] [--chunk C] [--streams 1|2] [--iters N]\n",
                   flag.c_str(), argv[0]);
      return 2;
    }
  }
  if (bytes == 0 || chunk == 0 || (streams != 1 && streams != 2) || iters < 1) {
    std::fprintf(stderr, "--bytes and --chunk must be > 0, --streams 1 or 2, --iters >= 1\n");
    return 2;
  }
  // One listener per accepting side, so that neither process can accept the stream it dialled itself.
  int listeners[2] = {-1, -1};
  sockaddr_in addresses[2]{};
  for (int i = 0; i < 2; ++i) {
    listeners[i] = ::socket(AF_INET, SOCK_STREAM, 0);
    addresses[i].sin_family = AF_INET;
    addresses[i].sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(addresses[i]);
    if (listeners[i] < 0 || ::bind(listeners[i], reinterpret_cast<sockaddr*>(&addresses[i]), sizeof(addresses[i])) != 0 ||
        ::listen(listeners[i], 4) != 0 || ::getsockname(listeners[i], reinterpret_cast<sockaddr*>(&addresses[i]), &length) != 0)
      die("listen");
  }
  const pid_t child = ::fork();
  if (child < 0) die("fork");
  const bool parent = child != 0;
  // Stream 0 carries the child's bytes (the child dials the parent's listener); with 2 streams the parent
  // dials the child's listener for its own.
  int out = -1, in = -1;
  if (parent) {
    in = ::accept(listeners[0], nullptr, nullptr);
    out = streams == 2 ? dial(addresses[1]) : in;
  } else {
    out = dial(addresses[0]);
    in = streams == 2 ? ::accept(listeners[1], nullptr, nullptr) : out;
  }
  if (in < 0 || out < 0) die("accept");
  const int one = 1;
  for (int fd : {in, out}) ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

  std::vector<char> send(2 * bytes, parent ? 1 : 2), recv(2 * bytes, 0);
  std::vector<double> times;
  rusage before{}, after{};
  ::getrusage(RUSAGE_SELF, &before);
  for (int it = 0; it < iters; ++it) {
    char token = 0;  // start together
    if (parent) {
      if (::send(out, &token, 1, 0) != 1 || ::recv(in, &token, 1, MSG_WAITALL) != 1) die("sync");
    } else {
      if (::recv(in, &token, 1, MSG_WAITALL) != 1 || ::send(out, &token, 1, 0) != 1) die("sync");
    }
    const auto start = std::chrono::steady_clock::now();
    exchange(out, in, send.data(), recv.data(), bytes, chunk);
    exchange(out, in, send.data() + bytes, recv.data() + bytes, bytes, chunk);
    times.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
    if (recv[0] != (parent ? 2 : 1) || recv[2 * bytes - 1] != (parent ? 2 : 1)) {
      std::fprintf(stderr, "tcp_exchange: wrong bytes received\n");
      return 1;
    }
  }
  ::getrusage(RUSAGE_SELF, &after);
  if (!parent) return 0;
  int status = 0;
  ::waitpid(child, &status, 0);
  std::sort(times.begin(), times.end());
  const double cpu = (usOf(after.ru_utime) - usOf(before.ru_utime) + usOf(after.ru_stime) - usOf(before.ru_stime)) / iters;
  std::printf("tcp_exchange bytes %zu chunk %zu streams %d iters %d: median %.1f us, min %.1f, p90 %.1f; cpu %.1f us/iter\n",
              bytes, chunk, streams, iters, times[times.size() / 2], times.front(), times[times.size() * 9 / 10], cpu);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
