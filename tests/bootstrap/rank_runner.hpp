// Runs a body once per rank, either as threads of this process or as fork()ed children, and
// collects what each rank ended with. Children never return into Catch: they report through a
// pipe and _exit.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"

namespace topoccl::testing {

struct Outcome {
  enum class Kind { Ok, Error, OtherException, Died, Hung };
  Kind kind = Kind::Died;
  ncclResult_t code = ncclSuccess;
  std::string message;
  double seconds = 0;  // how long the rank's body ran

  bool ok() const { return kind == Kind::Ok; }
  std::string text() const {
    switch (kind) {
      case Kind::Ok: return "ok";
      case Kind::Error: return std::string(resultName(code)) + ": " + message;
      case Kind::OtherException: return "exception: " + message;
      case Kind::Died: return "died: " + message;
      case Kind::Hung: return "hung";
    }
    return "?";
  }
};

template <class Body>
Outcome runCaught(Body&& body) {
  Outcome outcome;
  const auto start = std::chrono::steady_clock::now();
  try {
    body();
    outcome.kind = Outcome::Kind::Ok;
  } catch (const Error& e) {
    outcome.kind = Outcome::Kind::Error;
    outcome.code = e.code();
    outcome.message = e.what();
  } catch (const std::exception& e) {
    outcome.kind = Outcome::Kind::OtherException;
    outcome.message = e.what();
  }
  outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return outcome;
}

// One thread per rank; body(rank) may throw. Checks (CHECK/REQUIRE) do not belong inside `body`:
// Catch is not thread-safe, so bodies throw std::runtime_error to report a wrong result.
inline std::vector<Outcome> runRankThreads(int nranks, const std::function<void(int)>& body) {
  std::vector<Outcome> outcomes(static_cast<size_t>(nranks));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < nranks; ++rank)
    threads.emplace_back([&, rank] { outcomes[static_cast<size_t>(rank)] = runCaught([&] { body(rank); }); });
  for (auto& thread : threads) thread.join();
  return outcomes;
}

// One fork()ed child per rank. A child that does not finish within `limit` is killed (Hung).
inline std::vector<Outcome> runRankProcesses(int nranks, const std::function<void(int)>& body,
                                             std::chrono::seconds limit = std::chrono::seconds(60)) {
  std::fflush(nullptr);  // or children would flush the parent's buffered output again
  struct Child {
    pid_t pid = -1;
    int readFd = -1;
    std::string report;
    bool eof = false;
  };
  std::vector<Child> children(static_cast<size_t>(nranks));
  for (int rank = 0; rank < nranks; ++rank) {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      ::close(fds[0]);
      for (int other = 0; other < rank; ++other) ::close(children[static_cast<size_t>(other)].readFd);
      const Outcome outcome = runCaught([&] { body(rank); });
      // Report: kind, code, seconds, message.
      const std::string report = std::to_string(static_cast<int>(outcome.kind)) + "\n" +
                                 std::to_string(static_cast<int>(outcome.code)) + "\n" +
                                 std::to_string(outcome.seconds) + "\n" + outcome.message;
      size_t written = 0;
      while (written < report.size()) {
        const ssize_t n = ::write(fds[1], report.data() + written, report.size() - written);
        if (n <= 0) break;
        written += static_cast<size_t>(n);
      }
      ::_exit(0);
    }
    ::close(fds[1]);
    children[static_cast<size_t>(rank)].pid = pid;
    children[static_cast<size_t>(rank)].readFd = fds[0];
  }

  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    std::vector<pollfd> polled;
    std::vector<size_t> which;
    for (size_t i = 0; i < children.size(); ++i) {
      if (children[i].eof) continue;
      polled.push_back({children[i].readFd, POLLIN, 0});
      which.push_back(i);
    }
    if (polled.empty()) break;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    if (::poll(polled.data(), polled.size(), static_cast<int>(left.count())) <= 0) continue;
    for (size_t k = 0; k < polled.size(); ++k) {
      if (polled[k].revents == 0) continue;
      Child& child = children[which[k]];
      char buffer[4096];
      const ssize_t n = ::read(child.readFd, buffer, sizeof(buffer));
      if (n > 0) child.report.append(buffer, static_cast<size_t>(n));
      else child.eof = true;
    }
  }

  std::vector<Outcome> outcomes(static_cast<size_t>(nranks));
  for (size_t i = 0; i < children.size(); ++i) {
    Child& child = children[i];
    Outcome& outcome = outcomes[i];
    if (!child.eof) {
      ::kill(child.pid, SIGKILL);
      outcome.kind = Outcome::Kind::Hung;
    }
    int status = 0;
    ::waitpid(child.pid, &status, 0);
    ::close(child.readFd);
    if (outcome.kind == Outcome::Kind::Hung) continue;
    if (child.report.empty()) {
      outcome.kind = Outcome::Kind::Died;
      outcome.message = WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                                            : "exit status " + std::to_string(WEXITSTATUS(status));
      continue;
    }
    // Parse "kind\ncode\nseconds\nmessage".
    size_t first = child.report.find('\n');
    size_t second = child.report.find('\n', first + 1);
    size_t third = child.report.find('\n', second + 1);
    outcome.kind = static_cast<Outcome::Kind>(std::stoi(child.report.substr(0, first)));
    outcome.code = static_cast<ncclResult_t>(std::stoi(child.report.substr(first + 1, second - first - 1)));
    outcome.seconds = std::stod(child.report.substr(second + 1, third - second - 1));
    outcome.message = child.report.substr(third + 1);
  }
  return outcomes;
}

inline std::string describeOutcomes(const std::vector<Outcome>& outcomes) {
  std::string text;
  for (size_t rank = 0; rank < outcomes.size(); ++rank)
    text += "rank " + std::to_string(rank) + ": " + outcomes[rank].text() + "\n";
  return text;
}

inline void expectTrue(bool condition, const std::string& what) {
  if (!condition) throw std::runtime_error(what);
}

}  // namespace topoccl::testing
