#include <catch2/catch.hpp>

#include <pugixml.hpp>

#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "algorithms/generators.hpp"
#include "algorithms/msccl_xml.hpp"
#include "algorithms/validator.hpp"
#include "common/error.hpp"
#include "reference_executor.hpp"

using namespace topoccl;
using namespace topoccl::algo;

namespace {

std::string dataFile(const std::string& name) {
  std::string here = __FILE__;
  return here.substr(0, here.rfind('/')) + "/../data/msccl/" + name;
}

bool rooted(Collective c) {
  return c == Collective::Broadcast || c == Collective::Reduce || c == Collective::Gather || c == Collective::Scatter;
}

// Validates, then runs in every layout the plan claims with fresh random data.
void proveAndRun(const Plan& plan, const std::string& what, uint64_t seed) {
  const ValidationReport report = validate(plan);
  if (!report.ok()) FAIL_CHECK(what << ": validation failed:\n" << report.text());
  for (size_t count : {size_t{1}, size_t{13}, size_t{64}}) {
    for (bool inPlace : {false, true}) {
      if (inPlace ? !plan.inPlace : !plan.outOfPlace) continue;
      const std::string error = testing::runAndCheck(plan, {count, inPlace, seed + count * 7919});
      if (!error.empty()) FAIL_CHECK(what << " count=" << count << (inPlace ? " in place" : " out of place") << ": " << error);
    }
  }
}

// Same programs: lanes, peers, channels, step kinds, the used sides of each step, deps.
std::string programDifference(const Plan& a, const Plan& b) {
  if (a.nranks != b.nranks || a.ranks.size() != b.ranks.size()) return "rank counts differ";
  if (a.collective != b.collective || a.root != b.root || a.chunksPerBlock != b.chunksPerBlock ||
      a.inputChunks != b.inputChunks || a.outputChunks != b.outputChunks || a.scratchChunks != b.scratchChunks ||
      a.inPlace != b.inPlace || a.outOfPlace != b.outOfPlace || a.minBytes != b.minBytes || a.maxBytes != b.maxBytes ||
      a.name != b.name) {
    return "headers differ";
  }
  for (size_t r = 0; r < a.ranks.size(); ++r) {
    const auto& la = a.ranks[r].lanes;
    const auto& lb = b.ranks[r].lanes;
    if (la.size() != lb.size()) return "rank " + std::to_string(r) + " lane counts differ";
    for (size_t l = 0; l < la.size(); ++l) {
      const std::string where = "rank " + std::to_string(r) + " lane " + std::to_string(l);
      if (la[l].sendPeer != lb[l].sendPeer || la[l].recvPeer != lb[l].recvPeer || la[l].channel != lb[l].channel) {
        return where + " peers or channel differ";
      }
      if (la[l].steps.size() != lb[l].steps.size()) return where + " step counts differ";
      for (size_t s = 0; s < la[l].steps.size(); ++s) {
        const Step& x = la[l].steps[s];
        const Step& y = lb[l].steps[s];
        const std::string at = where + " step " + std::to_string(s);
        if (x.kind != y.kind) return at + " kinds differ";
        if (stepReads(x.kind) && !(x.src == y.src)) return at + " sources differ";
        if (stepWrites(x.kind) && !(x.dst == y.dst)) return at + " destinations differ";
        if (x.deps != y.deps) return at + " deps differ";
      }
    }
  }
  return "";
}

std::string errorOf(const std::string& text, ncclResult_t* code = nullptr) {
  try {
    parseMscclXml(text, "bad.xml");
  } catch (const Error& e) {
    if (code) *code = e.code();
    return e.what();
  }
  return "";
}

std::string exportErrorOf(const Plan& plan) {
  try {
    writeMscclXml(plan);
  } catch (const Error& e) {
    CHECK(e.code() == ncclInvalidArgument);
    return e.what();
  }
  return "";
}

// The synthesizers.md §3.5 example: a 4-GPU unidirectional ring all-gather, in place.
const char* const kRingAllGather4 = R"(<algo name="ring_ag4" proto="Simple" nchannels="1" nchunksperloop="4" ngpus="4" coll="allgather"
      inplace="1" outofplace="0" minBytes="0" maxBytes="1073741824">
  <gpu id="0" i_chunks="1" o_chunks="4" s_chunks="0">
    <tb id="0" send="1" recv="3" chan="0">
      <step s="0" type="s"   srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="rcs" srcbuf="o" srcoff="3" dstbuf="o" dstoff="3" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="2" type="rcs" srcbuf="o" srcoff="2" dstbuf="o" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="3" type="r"   srcbuf="o" srcoff="1" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="1" i_chunks="1" o_chunks="4" s_chunks="0">
    <tb id="0" send="2" recv="0" chan="0">
      <step s="0" type="s"   srcbuf="o" srcoff="1" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="rcs" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="2" type="rcs" srcbuf="o" srcoff="3" dstbuf="o" dstoff="3" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="3" type="r"   srcbuf="o" srcoff="2" dstbuf="o" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="2" i_chunks="1" o_chunks="4" s_chunks="0">
    <tb id="0" send="3" recv="1" chan="0">
      <step s="0" type="s"   srcbuf="o" srcoff="2" dstbuf="o" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="rcs" srcbuf="o" srcoff="1" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="2" type="rcs" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="3" type="r"   srcbuf="o" srcoff="3" dstbuf="o" dstoff="3" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="3" i_chunks="1" o_chunks="4" s_chunks="0">
    <tb id="0" send="0" recv="2" chan="0">
      <step s="0" type="s"   srcbuf="o" srcoff="3" dstbuf="o" dstoff="3" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="rcs" srcbuf="o" srcoff="2" dstbuf="o" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="2" type="rcs" srcbuf="o" srcoff="1" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="3" type="r"   srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
</algo>
)";

// The same ring in MSCCLang's newer <op> spelling (no nchunksperloop, buf/off, cnt defaulting to 1).
const char* const kRingAllGather4Ops = R"(<algo name="ring_ag4" proto="Simple" nchannels="1" ngpus="4" coll="allgather" inplace="1">
  <gpu id="0" i_chunks="1" o_chunks="4" s_chunks="0">
    <tb id="0" send="1" recv="3" chan="0">
      <op step="0" type="s" buf="o" off="0"/><op step="1" type="rcs" buf="o" off="3"/>
      <op step="2" type="rcs" buf="o" off="2"/><op step="3" type="r" buf="o" off="1"/>
    </tb>
  </gpu>
  <gpu id="1" i_chunks="1" o_chunks="4" s_chunks="0">
    <tb id="0" send="2" recv="0" chan="0">
      <op step="0" type="s" buf="o" off="1"/><op step="1" type="rcs" buf="o" off="0"/>
      <op step="2" type="rcs" buf="o" off="3"/><op step="3" type="r" buf="o" off="2"/>
    </tb>
  </gpu>
  <gpu id="2" i_chunks="1" o_chunks="4" s_chunks="0">
    <tb id="0" send="3" recv="1" chan="0">
      <op step="0" type="s" buf="o" off="2"/><op step="1" type="rcs" buf="o" off="1"/>
      <op step="2" type="rcs" buf="o" off="0"/><op step="3" type="r" buf="o" off="3"/>
    </tb>
  </gpu>
  <gpu id="3" i_chunks="1" o_chunks="4" s_chunks="0">
    <tb id="0" send="0" recv="2" chan="0">
      <op step="0" type="s" buf="o" off="3"/><op step="1" type="rcs" buf="o" off="2"/>
      <op step="2" type="rcs" buf="o" off="1"/><op step="3" type="r" buf="o" off="0"/>
    </tb>
  </gpu>
</algo>
)";

// A small 2-GPU out-of-place all-gather, one line per element so errors can name exact lines:
// per GPU a sending tb, a receiving tb and a local-copy tb.
std::string twoGpuAllGather() {
  std::ostringstream out;
  out << R"(<algo name="t" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" coll="allgather" inplace="0" outofplace="1" minBytes="0" maxBytes="1024">)"
      << "\n";
  for (int r = 0; r < 2; ++r) {
    const int peer = 1 - r;
    out << "  <gpu id=\"" << r << "\" i_chunks=\"1\" o_chunks=\"2\" s_chunks=\"0\">\n"                       // 2, 13
        << "    <tb id=\"0\" send=\"" << peer << "\" recv=\"-1\" chan=\"0\">\n"                                   // 3, 14
        << "      <step s=\"0\" type=\"s\" srcbuf=\"i\" srcoff=\"0\" dstbuf=\"o\" dstoff=\"-1\" cnt=\"1\" depid=\"-1\" deps=\"-1\" hasdep=\"0\"/>\n"  // 4
        << "    </tb>\n"                                                                                          // 5
        << "    <tb id=\"1\" send=\"-1\" recv=\"" << peer << "\" chan=\"0\">\n"                                   // 6
        << "      <step s=\"0\" type=\"r\" srcbuf=\"i\" srcoff=\"-1\" dstbuf=\"o\" dstoff=\"" << peer
        << "\" cnt=\"1\" depid=\"-1\" deps=\"-1\" hasdep=\"0\"/>\n"                                                 // 7
        << "    </tb>\n"                                                                                          // 8
        << "    <tb id=\"2\" send=\"-1\" recv=\"-1\" chan=\"0\">\n"                                               // 9
        << "      <step s=\"0\" type=\"cpy\" srcbuf=\"i\" srcoff=\"0\" dstbuf=\"o\" dstoff=\"" << r
        << "\" cnt=\"1\" depid=\"-1\" deps=\"-1\" hasdep=\"0\"/>\n"                                                 // 10
        << "    </tb>\n"                                                                                          // 11
        << "  </gpu>\n";                                                                                          // 12
  }
  out << "</algo>\n";  // 24
  return out.str();
}

// Replaces `from` by `to` on 1-based line `line` of `text` (which must contain it).
std::string onLine(const std::string& text, int line, const std::string& from, const std::string& to) {
  size_t begin = 0;
  for (int l = 1; l < line; ++l) begin = text.find('\n', begin) + 1;
  const size_t end = text.find('\n', begin);
  const size_t at = text.find(from, begin);
  REQUIRE(at != std::string::npos);
  REQUIRE(at < end);
  return text.substr(0, at) + to + text.substr(at + from.size());
}

void checkError(const std::string& text, int line, const std::string& needle) {
  ncclResult_t code = ncclSuccess;
  const std::string error = errorOf(text, &code);
  INFO("error: " << error);
  CHECK(code == ncclInvalidArgument);
  CHECK(error.rfind("bad.xml:" + std::to_string(line) + ": ", 0) == 0);
  CHECK(error.find(needle) != std::string::npos);
}

}  // namespace

TEST_CASE("msccl: the 4-GPU ring all-gather example loads, validates and computes the right numbers", "[msccl]") {
  const Plan plan = parseMscclXml(kRingAllGather4, "ring_ag4.xml");
  CHECK(plan.name == "ring_ag4");
  CHECK(plan.collective == Collective::AllGather);
  CHECK(plan.nranks == 4);
  CHECK(plan.chunksPerBlock == 1);
  CHECK(plan.inputChunks == 1);
  CHECK(plan.outputChunks == 4);
  CHECK(plan.inPlace);
  CHECK_FALSE(plan.outOfPlace);
  CHECK(plan.maxBytes == 1073741824);
  for (int r = 0; r < 4; ++r) {
    const auto& lanes = plan.ranks[static_cast<size_t>(r)].lanes;
    REQUIRE(lanes.size() == 1);
    CHECK(lanes[0].sendPeer == (r + 1) % 4);
    CHECK(lanes[0].recvPeer == (r + 3) % 4);
    size_t receives = 0;
    for (const Step& step : lanes[0].steps) receives += stepReceives(step.kind) ? 1 : 0;
    CHECK(receives == 3);
  }
  proveAndRun(plan, "ring_ag4", 11);
  for (uint64_t seed = 100; seed < 110; ++seed) CHECK(testing::runAndCheck(plan, {5, true, seed}).empty());

  // The newer <op> spelling describes the same plan.
  const Plan ops = parseMscclXml(kRingAllGather4Ops, "ring_ag4_ops.xml");
  CHECK(programDifference(plan, [&] {
          Plan p = ops;
          p.outOfPlace = plan.outOfPlace;
          p.minBytes = plan.minBytes;
          p.maxBytes = plan.maxBytes;
          return p;
        }()) == "");
}

TEST_CASE("msccl: every built-in generator plan exports, re-imports, validates, runs and re-exports identically",
          "[msccl]") {
  constexpr Collective kAll[] = {Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter,
                                 Collective::Broadcast, Collective::Reduce,    Collective::AllToAll,
                                 Collective::Gather,    Collective::Scatter};
  size_t plans = 0;
  for (Algorithm a : {Algorithm::Ring, Algorithm::RecursiveDoubling, Algorithm::Tree, Algorithm::Direct}) {
    for (Collective c : kAll) {
      if (!algorithmSupports(a, c)) continue;
      for (int n : {2, 3, 5, 8}) {
        for (int root : rooted(c) ? std::vector<int>{0, n - 1} : std::vector<int>{0}) {
          const std::string what = std::string(algorithmName(a)) + " " + collectiveName(c) + " n=" +
                                   std::to_string(n) + " root=" + std::to_string(root);
          INFO(what);
          Plan plan = makePlan(a, c, n, root, 2);
          plan.minBytes = 4096;
          plan.maxBytes = (n % 2) ? UINT64_MAX : uint64_t{1} << 30;
          const std::string text = writeMscclXml(plan);
          const Plan back = parseMscclXml(text, what + ".xml");
          CHECK(programDifference(plan, back) == "");
          proveAndRun(back, what, static_cast<uint64_t>(n * 31 + root));
          CHECK(writeMscclXml(back) == text);
          ++plans;
        }
      }
    }
  }
  CHECK(plans > 60);
}

TEST_CASE("msccl: a step with several dependencies round-trips through nop steps", "[msccl]") {
  // 2-rank all-gather: lane 0 copies the own block, lanes 1 and 2 send and receive, and lane 3
  // stages the own block into scratch once both the copy and the receive are done.
  Plan plan;
  plan.name = "multi_dep";
  plan.collective = Collective::AllGather;
  plan.nranks = 2;
  plan.chunksPerBlock = 1;
  plan.inputChunks = 1;
  plan.outputChunks = 2;
  plan.scratchChunks = 1;
  plan.ranks.resize(2);
  for (int r = 0; r < 2; ++r) {
    const int peer = 1 - r;
    const auto self = static_cast<uint32_t>(r);
    auto& lanes = plan.ranks[static_cast<size_t>(r)].lanes;
    lanes.push_back({-1, -1, 0, {{StepKind::Copy, {BufferId::Input, 0, 1}, {BufferId::Output, self, 1}, {}}}});
    lanes.push_back({peer, -1, 0, {{StepKind::Send, {BufferId::Input, 0, 1}, {}, {}}}});
    lanes.push_back({-1, peer, 0, {{StepKind::Recv, {}, {BufferId::Output, static_cast<uint32_t>(peer), 1}, {}}}});
    lanes.push_back({-1, -1, 0,
                     {{StepKind::Copy, {BufferId::Output, self, 1}, {BufferId::Scratch, 0, 1}, {{0, 0}, {2, 0}}},
                      {StepKind::Copy, {BufferId::Output, self, 1}, {BufferId::Scratch, 0, 1}, {}}}});
  }
  proveAndRun(plan, "multi_dep", 3);

  const std::string text = writeMscclXml(plan);
  pugi::xml_document doc;
  REQUIRE(doc.load_string(text.c_str()));
  const pugi::xml_node tb3 = doc.child("algo").find_child_by_attribute("gpu", "id", "0").find_child_by_attribute("tb", "id", "3");
  std::vector<pugi::xml_node> steps;
  for (pugi::xml_node step : tb3.children("step")) steps.push_back(step);
  REQUIRE(steps.size() == 3);  // nop carrying the first dep, the copy carrying the second, the second copy
  CHECK(std::string(steps[0].attribute("type").value()) == "nop");
  CHECK(steps[0].attribute("depid").as_int() == 0);
  CHECK(steps[0].attribute("deps").as_int() == 0);
  CHECK(std::string(steps[1].attribute("type").value()) == "cpy");
  CHECK(steps[1].attribute("s").as_int() == 1);
  CHECK(steps[1].attribute("depid").as_int() == 2);
  CHECK(steps[2].attribute("s").as_int() == 2);
  // hasdep exactly on the two steps something depends on.
  size_t flagged = 0;
  for (pugi::xml_node tb : doc.child("algo").find_child_by_attribute("gpu", "id", "0").children("tb")) {
    for (pugi::xml_node step : tb.children("step")) {
      if (step.attribute("hasdep").as_int() == 1) {
        ++flagged;
        CHECK(step.attribute("s").as_int() == 0);
        CHECK((tb.attribute("id").as_int() == 0 || tb.attribute("id").as_int() == 2));
      }
    }
  }
  CHECK(flagged == 2);

  const Plan back = parseMscclXml(text, "multi_dep.xml");
  CHECK(programDifference(plan, back) == "");
  REQUIRE(back.ranks[1].lanes[3].steps[0].deps.size() == 2);
  proveAndRun(back, "multi_dep re-imported", 4);
  CHECK(writeMscclXml(back) == text);

  // A dependency on a step that follows such nops would be numbered differently by the runtimes.
  Plan shifted = plan;
  for (auto& rank : shifted.ranks) rank.lanes[1].steps[0].deps = {{3, 1}};
  CHECK(exportErrorOf(shifted).find("dependency target after nop") != std::string::npos);
}

TEST_CASE("msccl: malformed files are refused with the file, line and what is wrong", "[msccl]") {
  const std::string base = twoGpuAllGather();
  {
    const Plan plan = parseMscclXml(base, "two.xml");
    proveAndRun(plan, "two-gpu all-gather", 5);
  }
  checkError(onLine(base, 7, " cnt=\"1\"", ""), 7, "missing attribute cnt");
  checkError(onLine(base, 9, "<tb id=\"2\"", "<tb id=\"3\""), 9, "not contiguous");
  checkError(onLine(base, 3, "send=\"1\"", "send=\"0\""), 3, "is the gpu itself");
  checkError(onLine(base, 6, "recv=\"1\"", "recv=\"0\""), 6, "is the gpu itself");
  checkError(onLine(base, 4, "cnt=\"1\"", "cnt=\"72\""), 4, "cnt=\"72\" is outside 1..71");
  checkError(onLine(base, 4, "cnt=\"1\"", "cnt=\"0\""), 4, "cnt=\"0\"");
  checkError(onLine(base, 4, "srcbuf=\"i\"", "srcbuf=\"x\""), 4, "srcbuf=\"x\" is not a buffer");
  checkError(onLine(base, 7, "dstbuf=\"o\"", "dstbuf=\"q\""), 7, "dstbuf=\"q\" is not a buffer");
  checkError(onLine(base, 4, "type=\"s\"", "type=\"ra\""), 4, "unknown type=\"ra\"");
  checkError(onLine(base, 13, "<gpu id=\"1\"", "<gpu id=\"0\""), 13, "duplicate gpu id");
  checkError(onLine(base, 13, "<gpu id=\"1\"", "<gpu id=\"5\""), 13, "outside 0..1");
  checkError(onLine(base, 1, "ngpus=\"2\"", "ngpus=\"3\""), 1, "no <gpu id=\"2\">");
  checkError(onLine(base, 1, "nchunksperloop=\"2\"", "nchunksperloop=\"3\""), 1, "not a multiple of 2");
  checkError(onLine(base, 2, "i_chunks=\"1\"", "i_chunks=\"2\""), 2, "i_chunks=\"2\" is inconsistent");
  checkError(onLine(base, 7, "dstoff=\"1\"", "dstoff=\"2\""), 7, "reaches past");
  checkError(onLine(base, 10, "depid=\"-1\" deps=\"-1\"", "depid=\"7\" deps=\"0\""), 10, "names no tb");
  checkError(onLine(base, 10, "depid=\"-1\" deps=\"-1\"", "depid=\"0\" deps=\"4\""), 10, "has 1 steps");
  checkError(onLine(base, 10, "depid=\"-1\" deps=\"-1\"", "depid=\"0\" deps=\"0\""), 10, "hasdep=\"0\"");
  checkError(onLine(base, 3, "send=\"1\"", "send=\"-1\""), 4, "sends, but");
  checkError(onLine(base, 4, "srcoff=\"0\"", "srcoff=\"zero\""), 4, "srcoff=\"zero\" is not an integer");
  checkError(onLine(base, 4, "s=\"0\"", "s=\"1\""), 4, "numbered 0, 1, 2");
  checkError(onLine(base, 1, "coll=\"allgather\"", "coll=\"custom\""), 1, "coll=\"custom\"");
  checkError(onLine(base, 1, "proto=\"Simple\"", "proto=\"Fast\""), 1, "proto=\"Fast\"");
  checkError(onLine(base, 3, "chan=\"0\"", "chan=\"1\""), 3, "nchannels");
  checkError(onLine(base, 1, " nchunksperloop=\"2\"", ""), 1, "missing attribute nchunksperloop");

  // Truncated XML and files that are not MSCCL algorithms.
  ncclResult_t code = ncclSuccess;
  const std::string truncated = errorOf(base.substr(0, base.size() / 2), &code);
  CHECK(code == ncclInvalidArgument);
  CHECK(std::regex_search(truncated, std::regex("^bad\\.xml:[0-9]+: malformed XML")));
  checkError("<system version=\"1\"/>\n", 1, "no <algo> element");
  CHECK(errorOf("").rfind("bad.xml:1: ", 0) == 0);

  // loadMscclXml names the path.
  try {
    loadMscclXml("/nonexistent/algo.xml");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("/nonexistent/algo.xml") != std::string::npos);
  }
}

TEST_CASE("msccl: exported XML carries every attribute both runtimes' parsers require", "[msccl]") {
  const std::set<std::string> oldColls = {"allreduce", "allgather", "reduce", "broadcast", "alltoall", "reduce_scatter"};
  const std::set<std::string> newColls = {"reduce",  "broadcast", "allreduce", "reducescatter", "allgather",
                                          "gather",  "scatter",   "alltoall"};
  const std::vector<Plan> plans = {
      makePlan(Algorithm::Ring, Collective::AllReduce, 4, 0, 3),
      makePlan(Algorithm::Ring, Collective::AllGather, 5, 0, 2),
      makePlan(Algorithm::Ring, Collective::ReduceScatter, 3, 0, 1),
      makePlan(Algorithm::RecursiveDoubling, Collective::AllReduce, 6, 0, 1),
      makePlan(Algorithm::Tree, Collective::Broadcast, 5, 2, 1),
      makePlan(Algorithm::Tree, Collective::Reduce, 4, 3, 1),
      makePlan(Algorithm::Direct, Collective::AllToAll, 4, 0, 1),
      makePlan(Algorithm::Direct, Collective::ReduceScatter, 4, 0, 1),
  };
  for (const Plan& plan : plans) {
    for (bool oldName : {false, true}) {
      MscclWriteOptions options;
      options.oldReduceScatterName = oldName;
      options.nthreads = oldName ? 512 : 0;
      const std::string text = writeMscclXml(plan, options);
      INFO(plan.name << " " << collectiveName(plan.collective) << "\n" << text.substr(0, 400));
      pugi::xml_document doc;
      REQUIRE(doc.load_string(text.c_str()));
      const pugi::xml_node algo = doc.child("algo");
      REQUIRE(algo);
      for (const char* attr : {"name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace", "outofplace",
                               "minBytes", "maxBytes"}) {
        CHECK(algo.attribute(attr));
      }
      CHECK(std::string(algo.attribute("proto").value()) == "Simple");
      CHECK(algo.attribute("nthreads").as_int() == options.nthreads);
      const std::string coll = algo.attribute("coll").value();
      if (plan.collective == Collective::ReduceScatter) {
        CHECK(coll == (oldName ? "reduce_scatter" : "reducescatter"));
      } else {
        CHECK(oldColls.count(coll) == 1);
        CHECK(newColls.count(coll) == 1);
      }
      const int ngpus = algo.attribute("ngpus").as_int();
      const int nchunks = algo.attribute("nchunksperloop").as_int();
      const int nchannels = algo.attribute("nchannels").as_int();
      CHECK(ngpus == plan.nranks);
      CHECK(algo.attribute("maxBytes").as_llong() >= algo.attribute("minBytes").as_llong());
      int gpus = 0;
      for (pugi::xml_node gpu : algo.children("gpu")) {
        CHECK(gpu.attribute("id").as_int() == gpus++);
        for (const char* attr : {"id", "i_chunks", "o_chunks", "s_chunks"}) CHECK(gpu.attribute(attr));
        // The old runtime's consistency check.
        const int ic = gpu.attribute("i_chunks").as_int();
        const int oc = gpu.attribute("o_chunks").as_int();
        if (ic > 0) CHECK(ic * (coll == "allgather" ? ngpus : 1) == nchunks);
        if (oc > 0) CHECK(oc * (coll == "reduce_scatter" || coll == "reducescatter" ? ngpus : 1) == nchunks);
        std::set<std::pair<int, int>> depended;
        std::set<std::pair<int, int>> flagged;
        int tbs = 0;
        for (pugi::xml_node tb : gpu.children("tb")) {
          CHECK(tb.attribute("id").as_int() == tbs);
          for (const char* attr : {"id", "send", "recv", "chan"}) CHECK(tb.attribute(attr));
          CHECK(tb.attribute("chan").as_int() < nchannels);
          CHECK(tb.attribute("send").as_int() != gpu.attribute("id").as_int());
          CHECK(tb.attribute("recv").as_int() != gpu.attribute("id").as_int());
          int s = 0;
          for (pugi::xml_node step : tb.children("step")) {
            for (const char* attr : {"s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep"}) {
              CHECK(step.attribute(attr));
            }
            CHECK(step.attribute("s").as_int() == s++);
            const std::string type = step.attribute("type").value();
            if (type != "nop") {
              CHECK(step.attribute("cnt").as_int() >= 1);
              CHECK(step.attribute("cnt").as_int() < 72);
            }
            if (step.attribute("depid").as_int() >= 0) {
              depended.insert({step.attribute("depid").as_int(), step.attribute("deps").as_int()});
            }
            if (step.attribute("hasdep").as_int() == 1) flagged.insert({tbs, step.attribute("s").as_int()});
          }
          CHECK(s <= 256);
          ++tbs;
        }
        CHECK(depended == flagged);
      }
      CHECK(gpus == ngpus);
    }
  }
}

TEST_CASE("msccl: export refuses what MSCCL cannot express", "[msccl]") {
  // More than 256 steps in one lane.
  Plan longLane;
  longLane.name = "long";
  longLane.collective = Collective::AllReduce;
  longLane.nranks = 1;
  longLane.inputChunks = longLane.outputChunks = 1;
  longLane.ranks.resize(1);
  longLane.ranks[0].lanes.push_back({-1, -1, 0, {}});
  for (int i = 0; i < 257; ++i) {
    longLane.ranks[0].lanes[0].steps.push_back({StepKind::Copy, {BufferId::Input, 0, 1}, {BufferId::Output, 0, 1}, {}});
  }
  CHECK(exportErrorOf(longLane).find("MSCCL allows 256") != std::string::npos);

  // cnt of 72 chunks or more.
  Plan wide;
  wide.name = "wide";
  wide.collective = Collective::AllReduce;
  wide.nranks = 1;
  wide.chunksPerBlock = 80;
  wide.inputChunks = wide.outputChunks = 80;
  wide.ranks.resize(1);
  wide.ranks[0].lanes.push_back({-1, -1, 0, {{StepKind::Copy, {BufferId::Input, 0, 80}, {BufferId::Output, 0, 80}, {}}}});
  CHECK(validate(wide).ok());
  CHECK(exportErrorOf(wide).find("cnt is 1..71") != std::string::npos);

  // Channels beyond MSCCL's 32, and a lane naming its own rank.
  const Plan manyChannels = makePlan(Algorithm::Ring, Collective::AllGather, 2, 0, 40);
  CHECK(exportErrorOf(manyChannels).find("channel 32") != std::string::npos);
  Plan selfPeer = makePlan(Algorithm::Ring, Collective::AllGather, 2, 0, 1);
  selfPeer.ranks[0].lanes[0].sendPeer = 0;
  CHECK(exportErrorOf(selfPeer).find("own rank") != std::string::npos);

  MscclWriteOptions badProto;
  badProto.protocol = "Fast";
  CHECK_THROWS_AS(writeMscclXml(makePlan(Algorithm::Ring, Collective::AllGather, 2, 0, 1), badProto), Error);
}

TEST_CASE("msccl: published TACCL plans load, validate and run correctly", "[msccl]") {
  // tests/data/msccl: unmodified TACCL output from mcrl/TACCL-experiment-codebase (see tests/data/SOURCES.md).
  for (const char* file : {"taccl_allgather.A.n1.gpu2.i3.xml", "taccl_allgather.A.n1.gpu4.i3.xml"}) {
    INFO(file);
    const Plan plan = loadMscclXml(dataFile(file));
    CHECK(plan.name == "taccl");
    CHECK(plan.collective == Collective::AllGather);
    CHECK(plan.chunksPerBlock == 3);  // nchunksperloop = 3 chunks per rank x ngpus
    CHECK(plan.inPlace);
    CHECK_FALSE(plan.outOfPlace);  // TACCL writes no outofplace: its plans read their input from the output
    for (const auto& rank : plan.ranks) CHECK(rank.lanes.size() == 6);  // 3 channels x (send, receive)
    proveAndRun(plan, file, 17);
    // Round trip through our writer.
    const std::string text = writeMscclXml(plan);
    const Plan back = parseMscclXml(text, std::string(file) + " (exported)");
    CHECK(programDifference(plan, back) == "");
    proveAndRun(back, std::string(file) + " re-exported", 19);
  }
  const Plan four = loadMscclXml(dataFile("taccl_allgather.A.n1.gpu4.i3.xml"));
  CHECK(four.nranks == 4);
  // The forwarding sends wait on the receives of another thread block.
  REQUIRE(four.ranks[0].lanes[3].steps.size() == 3);
  CHECK(four.ranks[0].lanes[3].steps[1].deps == std::vector<StepRef>{{0, 0}});
  CHECK(four.ranks[0].lanes[3].steps[2].deps == std::vector<StepRef>{{0, 1}});
}
