// libFuzzer target for the topology file loaders (NCCL XML, hwloc XML, topoccl JSON).
//
// Contract under test (loaders.hpp): bad input of any kind ends in a topoccl::Error whose message
// names the source; nothing else may escape, crash, hang or trip ASan/UBSan. Whatever parses must
// then survive the graph queries and the round trips:
//   - writeJson -> parseJson keeps the fingerprint, whatever the topology came from (JSON is the
//     complete format);
//   - writeNcclXml -> parseNcclXml keeps the fingerprint of a topology read from NCCL XML; for one
//     read from hwloc XML or JSON (which NCCL XML may not be able to express) the rewritten file
//     must at least be stable: writing and reading it again changes nothing.
// Any violation prints what differed and calls abort(), which libFuzzer records as a crash.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <typeinfo>
#include <vector>

#include "topoccl/error.hpp"
#include "topology/loaders.hpp"

using namespace topoccl::topo;

namespace {

constexpr const char* kSource = "fuzz-input";
// path() between all GPU/NIC pairs is quadratic and more; larger graphs only get the round trips,
// so one input stays well under the per-input timeout.
constexpr int kMaxQueriedVertices = 160;

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "\n==== topoccl fuzz finding ====\n%s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// A loader's error must say where: it starts with the source name it was given.
void checkMessage(const char* step, const std::string& source, const topoccl::Error& e) {
  std::string message = e.what();
  if (message.rfind(source, 0) != 0)
    finding(std::string(step) + ": topoccl::Error does not name the source '" + source + "': " + message);
}

// Runs one step; topoccl::Error is an accepted outcome (returns false), anything else is a finding.
template <class F>
bool accepted(const char* step, const std::string& source, F&& body) {
  try {
    body();
    return true;
  } catch (const topoccl::Error& e) {
    checkMessage(step, source, e);
    return false;
  } catch (const std::exception& e) {
    finding(std::string(step) + ": uncaught " + typeid(e).name() + ": " + e.what());
  } catch (...) {
    finding(std::string(step) + ": uncaught exception of unknown type");
  }
}

std::string canonicalDiff(const Topology& a, const Topology& b) {
  auto lines = [](const std::string& text) {
    std::multiset<std::string> out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) out.insert(line);
    return out;
  };
  std::multiset<std::string> la = lines(a.canonicalText()), lb = lines(b.canonicalText());
  std::string diff;
  for (const std::string& l : la)
    if (la.count(l) != lb.count(l)) diff += "- " + l + "\n";
  for (const std::string& l : lb)
    if (la.count(l) != lb.count(l)) diff += "+ " + l + "\n";
  return diff;
}

void checkPath(const Topology& t, VertexId from, VertexId to) {
  Path p = t.path(from, to);
  if (!p.exists()) return;
  if (p.vertices.empty() || p.vertices.front() != from || p.vertices.back() != to)
    finding("path(" + describeVertex(t, from) + ", " + describeVertex(t, to) + ") does not run between its ends");
  for (size_t i = 0; i + 1 < p.vertices.size(); ++i)
    if (!t.linkBetween(p.vertices[i], p.vertices[i + 1]))
      finding("path(" + describeVertex(t, from) + ", " + describeVertex(t, to) + ") uses a missing link");
}

void queryGraph(const Topology& t) {
  if (t.vertexCount() > kMaxQueriedVertices) return;
  std::vector<VertexId> ends = t.gpus();
  for (VertexId n : t.nics()) ends.push_back(n);
  for (VertexId a : ends)
    for (VertexId b : ends) checkPath(t, a, b);
  for (VertexId g : t.gpus()) {
    for (VertexId n : t.nearestNics(g))
      if (t.vertex(n).kind != VertexKind::Nic) finding("nearestNics returned a non-NIC");
    (void)t.railNic(g);
    (void)t.localCpu(g);
  }
}

Topology reparse(const char* step, const std::string& text, const std::string& source, bool xml, const Topology& from) {
  std::optional<Topology> back;
  try {
    back = xml ? parseNcclXml(text, source) : parseJson(text, source);
  } catch (const topoccl::Error& e) {
    finding(std::string(step) + ": the writer's output is rejected: " + e.what() + "\n--- original\n" +
            from.canonicalText() + "--- written\n" + text);
  }
  return std::move(*back);
}

void roundTrips(const Topology& t, FileFormat origin) {
  const std::string fp = t.fingerprint();

  Topology json = reparse("writeJson -> parseJson", writeJson(t), "roundtrip.json", false, t);
  if (json.fingerprint() != fp) finding("writeJson -> parseJson changed the fingerprint:\n" + canonicalDiff(t, json));

  if (origin == FileFormat::NcclXml) {
    Topology xml = reparse("writeNcclXml -> parseNcclXml", writeNcclXml(t), "roundtrip.xml", true, t);
    if (xml.fingerprint() != fp)
      finding("writeNcclXml -> parseNcclXml changed the fingerprint:\n" + canonicalDiff(t, xml));
    return;
  }
  // Converting to NCCL XML may lose what that format cannot say (and may be refused, e.g. two
  // devices sharing a bus id); once in NCCL XML, the graph must be a fixed point.
  std::optional<Topology> once;
  if (!accepted("writeNcclXml -> parseNcclXml", "roundtrip.xml",
                [&] { once = parseNcclXml(writeNcclXml(t), "roundtrip.xml"); }))
    return;
  Topology twice = reparse("writeNcclXml -> parseNcclXml (second time)", writeNcclXml(*once), "roundtrip2.xml", true, *once);
  if (twice.fingerprint() != once->fingerprint())
    finding("writeNcclXml -> parseNcclXml is not stable:\n" + canonicalDiff(*once, twice));
}

void exercise(const Topology& t, FileFormat origin) {
  (void)t.fingerprint();
  queryGraph(t);
  roundTrips(t, origin);
}

// Queries and writers on a topology that parsed have no excuse to throw at all.
template <class F>
void mustNotThrow(const char* step, F&& body) {
  try {
    body();
  } catch (const std::exception& e) {
    finding(std::string(step) + ": " + typeid(e).name() + " on a topology that parsed: " + e.what());
  } catch (...) {
    finding(std::string(step) + ": exception of unknown type on a topology that parsed");
  }
}

Topology parseAs(FileFormat format, const std::string& text) {
  switch (format) {
    case FileFormat::NcclXml: return parseNcclXml(text, kSource);
    case FileFormat::HwlocXml: return parseHwlocXml(text, kSource);
    case FileFormat::Json: return parseJson(text, kSource);
  }
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::optional<FileFormat> detected;
  accepted("detectFormat", kSource, [&] { detected = detectFormat(text, kSource); });

  // The sniffed format first (what loadTopologyFile does), then every parser on the same bytes.
  std::vector<FileFormat> order;
  if (detected) order.push_back(*detected);
  for (FileFormat f : {FileFormat::NcclXml, FileFormat::HwlocXml, FileFormat::Json})
    if (!detected || f != *detected) order.push_back(f);
  for (FileFormat format : order) {
    std::optional<Topology> topo;
    if (accepted("parse", kSource, [&] { topo = parseAs(format, text); }))
      mustNotThrow("exercise", [&] { exercise(*topo, format); });
  }
  return 0;
}
