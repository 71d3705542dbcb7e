// Inputs the fuzzer (tests/fuzz) found or that guard its contract: bad bytes end in a topoccl::Error
// naming the source and the line, and whatever parses survives the writers.
#include <catch2/catch.hpp>

#include <functional>
#include <string>

#include "common/error.hpp"
#include "topology/cluster_file.hpp"
#include "topology/loaders.hpp"

using namespace topoccl;
using namespace topoccl::topo;

namespace {

std::string errorOf(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The real Minsky hwloc dump with `what` (which must occur) replaced by `with`: a fuzzer finding, minimized.
std::string mutatedMinsky(const std::string& what, const std::string& with) {
  std::string text = readTextFile(std::string(__FILE__).substr(0, std::string(__FILE__).rfind('/')) +
                                  "/../data/hwloc-v2_power8-minsky-4p100.xml");
  const size_t at = text.find(what);
  REQUIRE(at != std::string::npos);
  return text.replace(at, what.size(), with);
}

}  // namespace

TEST_CASE("regressions: XML that is not UTF-8 is refused with the line of the bad byte", "[regression]") {
  // A Latin-1 'é' (0xe9) in an attribute on line 3; pugixml alone would copy it into a vertex name.
  const std::string ncclXml = "<system version=\"1\">\n <cpu numaid=\"0\" affinity=\"ff\" arch=\"x86_64\">\n"
                              "  <nic><net name=\"caf\xe9\" dev=\"0\" speed=\"100000\"/></nic>\n </cpu>\n</system>\n";
  const std::string message = errorOf([&] { (void)parseNcclXml(ncclXml, "latin1.xml"); });
  CHECK_THAT(message, Catch::Contains("latin1.xml:3"));
  CHECK_THAT(message, Catch::Contains("not UTF-8"));
  CHECK_THAT(message, Catch::Contains("0xe9"));

  // The hwloc loader goes through the same entry point.
  const std::string hwloc = "<?xml version=\"1.0\"?>\n<topology version=\"2.0\">\n\xff\n</topology>\n";
  CHECK_THAT(errorOf([&] { (void)parseHwlocXml(hwloc, "bad.xml"); }), Catch::Contains("bad.xml:3"));

  // Overlong encodings and surrogates are not UTF-8 either; a correct multi-byte name is.
  CHECK_THAT(errorOf([&] { (void)parseNcclXml("<system version=\"1\">\xc0\xaf</system>", "overlong.xml"); }),
             Catch::Contains("not UTF-8"));
  CHECK_THAT(errorOf([&] { (void)parseNcclXml("<system version=\"1\">\xed\xa0\x80</system>", "surrogate.xml"); }),
             Catch::Contains("not UTF-8"));
  CHECK_THAT(errorOf([&] { (void)parseNcclXml("<system version=\"1\">\xf0\x9f\x98</system>", "cut.xml"); }),
             Catch::Contains("not UTF-8"));
  CHECK_THAT(errorOf([&] { (void)parseNcclXml("<system version=\"1\"><!-- caf\xc3\xa9 --></system>", "ok.xml"); }),
             !Catch::Contains("UTF-8"));
}

TEST_CASE("regressions: writeJson never throws on names that are not UTF-8", "[regression]") {
  // Live discovery copies OS strings (interface names, hwloc info) that need not be UTF-8.
  Topology t;
  t.name = std::string("box\xff");
  VertexId host = t.addVertex(Vertex{.kind = VertexKind::Host, .name = "host0"});
  VertexId cpu = t.addVertex(Vertex{.kind = VertexKind::Cpu, .name = "cpu0", .numaId = 0, .cpuAffinity = "ff"});
  VertexId nic = t.addVertex(Vertex{.kind = VertexKind::Nic, .name = "nic0", .netName = std::string("en\xfe")});
  t.addLink(cpu, nic, Link{.kind = LinkKind::Pcie, .pcieGen = 3, .pcieWidth = 8});
  (void)host;
  std::string text;
  REQUIRE_NOTHROW(text = writeJson(t));
  const Topology back = parseJson(text, "written.json");
  CHECK(back.count(VertexKind::Nic) == 1);
  CHECK(back.vertex(back.nics().front()).netName != t.vertex(nic).netName);  // replaced, not copied raw
}

TEST_CASE("regressions: a NIC without a <net> keeps no name through an NCCL XML round trip", "[regression]") {
  // Fuzzer finding: the writer used the vertex name ("nic0") as the net name, so the rewritten file differed.
  const std::string xml = "<system version=\"1\">\n <cpu numaid=\"0\" affinity=\"ff\" arch=\"x86_64\">\n"
                          "  <nic>\n   <n name=\"eth0\"/>\n  </nic>\n </cpu>\n</system>\n";
  const Topology first = parseNcclXml(xml, "nic-without-net.xml");
  REQUIRE(first.count(VertexKind::Nic) == 1);
  CHECK(first.vertex(first.nics().front()).netName.empty());
  const Topology again = parseNcclXml(writeNcclXml(first), "rewritten.xml");
  CHECK(again.vertex(again.nics().front()).netName.empty());
  CHECK(again.fingerprint() == first.fingerprint());
}

TEST_CASE("regressions: a GPU whose bus id is ffff:ff:ff.0 keeps its NVSwitch links through an NCCL XML round trip",
          "[regression]") {
  // Fuzzer finding: the writer named every bus-id-less NVSwitch "ffff:ff:ff.0", which the reader takes, for a GPU of
  // that bus id, as a link to itself, and drops.
  const auto gpuAt = [](const std::string& busId, int dev) {
    return "  <pci busid=\"" + busId + "\" class=\"0x030200\" link_speed=\"16 GT/s\" link_width=\"16\">\n" +
           "   <gpu dev=\"" + std::to_string(dev) + "\" sm=\"80\" rank=\"" + std::to_string(dev) + "\" gdr=\"1\">\n" +
           "    <nvlink target=\"0000:c0:00.0\" count=\"6\" tclass=\"0x068000\"/>\n   </gpu>\n  </pci>\n";
  };
  const std::string xml = "<system version=\"1\">\n <cpu numaid=\"0\" affinity=\"ff\" arch=\"x86_64\">\n" +
                          gpuAt("ffff:ff:ff.0", 0) + gpuAt("ffff:ff:fe.0", 1) + " </cpu>\n</system>\n";
  const Topology first = parseNcclXml(xml, "gpu-at-ffff.xml");
  REQUIRE(first.count(VertexKind::NvSwitch) == 1);
  REQUIRE(first.links().size() > 0);
  const std::string rewritten = writeNcclXml(first);
  CHECK_THAT(rewritten, !Catch::Contains("target=\"ffff:ff:ff.0\"") && !Catch::Contains("target=\"ffff:ff:fe.0\""));
  const Topology again = parseNcclXml(rewritten, "rewritten.xml");
  CHECK(again.count(VertexKind::NvSwitch) == 1);
  CHECK(again.fingerprint() == first.fingerprint());
}

TEST_CASE("regressions: an NVLink between GPUs of different sm gets one generation, whichever GPU lists it",
          "[regression]") {
  // Fuzzer finding: a GPU whose sm attribute was mangled (sm 0) gave its link generation 0 when it listed the link
  // first, and the rewritten file, listing the pair the other way, gave generation 3.
  const auto gpuAt = [](const std::string& busId, int dev, const std::string& sm, const std::string& target) {
    return "  <pci busid=\"" + busId + "\" class=\"0x030200\" link_speed=\"16 GT/s\" link_width=\"16\">\n" +
           "   <gpu dev=\"" + std::to_string(dev) + "\" " + sm + " rank=\"" + std::to_string(dev) + "\" gdr=\"1\">\n" +
           "    <nvlink target=\"" + target + "\" count=\"12\" tclass=\"0x030200\"/>\n   </gpu>\n  </pci>\n";
  };
  for (bool unknownFirst : {true, false}) {
    INFO((unknownFirst ? "the GPU without sm listed first" : "the GPU with sm 80 listed first"));
    const std::string a = gpuAt("0000:02:00.0", 0, "m=\"s80\"", "0000:03:00.0");
    const std::string b = gpuAt("0000:03:00.0", 1, "sm=\"80\"", "0000:02:00.0");
    const std::string xml = "<system version=\"1\">\n <cpu numaid=\"0\" affinity=\"ff\" arch=\"x86_64\">\n" +
                            (unknownFirst ? a + b : b + a) + " </cpu>\n</system>\n";
    const Topology first = parseNcclXml(xml, "mixed-sm.xml");
    const Link* link = first.linkBetween(*first.findByBusId("0000:02:00.0"), *first.findByBusId("0000:03:00.0"));
    REQUIRE(link != nullptr);
    CHECK(link->nvlinkGeneration == 3);  // sm 80: NVLink 3
    CHECK(parseNcclXml(writeNcclXml(first), "rewritten.xml").fingerprint() == first.fingerprint());
  }
}

TEST_CASE("regressions: an NVLink to the CPU a GPU hangs from by PCIe is refused with its line", "[regression]") {
  // Fuzzer finding (via a JSON graph written as NCCL XML): the reader threw "duplicate link" naming no file.
  const std::string xml = "<system version=\"1\">\n <cpu numaid=\"0\" affinity=\"ff\" arch=\"ppc64\">\n"
                          "  <pci busid=\"0000:01:00.0\" class=\"0x030200\" link_speed=\"8 GT/s\" link_width=\"16\">\n"
                          "   <gpu dev=\"0\" sm=\"60\" rank=\"0\" gdr=\"1\">\n"
                          "    <nvlink target=\"ffff:ff:ff.0\" count=\"2\" tclass=\"0x068001\"/>\n"
                          "   </gpu>\n  </pci>\n </cpu>\n</system>\n";
  const std::string message = errorOf([&] { (void)parseNcclXml(xml, "nvlink-to-parent.xml"); });
  CHECK_THAT(message, Catch::Contains("nvlink-to-parent.xml:5"));
  CHECK_THAT(message, Catch::Contains("already linked"));
}

TEST_CASE("regressions: a JSON number too large for a double is a parse error at its line", "[regression]") {
  // Fuzzer finding: nlohmann's out_of_range (not a parse_error) escaped the JSON loader.
  const std::string text = "{\n  \"format\": \"topoccl-topology\",\n  \"version\": 777E777777777777777\n}\n";
  const std::string message = errorOf([&] { (void)parseJson(text, "huge.json"); });
  CHECK_THAT(message, Catch::Contains("huge.json:3"));
  CHECK_THAT(message, Catch::Contains("number overflow"));
}

TEST_CASE("regressions: a PCIe width beyond 32 lanes is refused, not overflowed", "[regression]") {
  // Fuzzer finding (UBSan): link_width="96566502" overflowed int in the bandwidth formula.
  const std::string xml = "<system version=\"1\">\n <cpu numaid=\"0\" affinity=\"ff\" arch=\"x86_64\">\n"
                          "  <pci busid=\"0000:01:00.0\" class=\"0x030200\" link_speed=\"16 GT/s\" link_width=\"96566502\"/>\n"
                          " </cpu>\n</system>\n";
  const std::string message = errorOf([&] { (void)parseNcclXml(xml, "wide.xml"); });
  CHECK_THAT(message, Catch::Contains("wide.xml:3"));
  CHECK_THAT(message, Catch::Contains("link_width"));
  CHECK(pcieBandwidthGBs(4, 1 << 30) > 0);  // the formula itself cannot overflow
}

TEST_CASE("regressions: an absurd NVLinkBandwidth value is refused, not converted", "[regression]") {
  // Fuzzer finding (UBSan): a huge value overflowed the int link count. Take the real Minsky file and
  // swap one bandwidth for 3.5e36 MB/s.
  const std::string text = mutatedMinsky("<u64values length=\"44\">1000000 40000 ",
                                         "<u64values length=\"44\">1000000 3555555555555555555555555555555555555 ");
  const std::string message = errorOf([&] { (void)parseHwlocXml(text, "minsky-mutated.xml"); });
  CHECK_THAT(message, Catch::Contains("minsky-mutated.xml:"));
  CHECK_THAT(message, Catch::Contains("NVLinkBandwidth value"));
}

TEST_CASE("regressions: an NVLinkBandwidth matrix naming one GPU twice is refused with its line", "[regression]") {
  // Fuzzer finding: two rows resolving to the same GPU made a GPU-to-itself link, refused by the graph
  // without the file's name. Take the real Minsky file and name GPU 2's OSDev in GPU 3's place.
  const std::string text = mutatedMinsky("OSDev:332 OSDev:333 OSDev:334 OSDev:335", "OSDev:332 OSDev:333 OSDev:334 OSDev:334");
  const std::string message = errorOf([&] { (void)parseHwlocXml(text, "minsky-twice.xml"); });
  CHECK_THAT(message, Catch::Contains("minsky-twice.xml:215"));
  CHECK_THAT(message, Catch::Contains("are the same GPU"));
}

TEST_CASE("regressions: a <c2c> to the CPU a GPU hangs from by PCIe is refused with its line", "[regression]") {
  // Fuzzer finding: a JSON graph with a GPU on one CPU's PCIe and a C2C to another wrote NCCL XML whose C2C
  // doubled the PCIe link, refused by the graph without the file's name.
  const std::string xml = "<system version=\"1\">\n"
                          "  <cpu numaid=\"0\" affinity=\"0000ffff\" arch=\"x86_64\">\n"
                          "    <pci busid=\"0000:07:00.0\" class=\"0x030200\" link_speed=\"32 GT/s\" link_width=\"16\">\n"
                          "      <gpu dev=\"0\" sm=\"90\" rank=\"0\" gdr=\"1\">\n"
                          "        <c2c bw=\"450000\" count=\"1\" />\n"
                          "      </gpu>\n    </pci>\n  </cpu>\n</system>\n";
  const std::string message = errorOf([&] { (void)parseNcclXml(xml, "c2c.xml"); });
  CHECK_THAT(message, Catch::Contains("c2c.xml:5"));
  CHECK_THAT(message, Catch::Contains("already linked to by pcie"));
}

TEST_CASE("regressions: a NIC whose PCI class is not a network class stays a NIC through NCCL XML", "[regression]") {
  // Fuzzer finding: a bridge-class <pci> holding a <nic> was written back as a bare <pci> and came back a switch.
  const std::string xml = "<system version=\"1\">\n <cpu numaid=\"0\" affinity=\"ff\" arch=\"x86_64\">\n"
                          "  <pci busid=\"ffff:ff:01.0\" class=\"0x060400\" link_speed=\"8 GT/s\" link_width=\"16\">\n"
                          "   <nic/>\n  </pci>\n </cpu>\n</system>\n";
  const Topology first = parseNcclXml(xml, "bridge-nic.xml");
  REQUIRE(first.count(VertexKind::Nic) == 1);
  const Topology again = parseNcclXml(writeNcclXml(first), "rewritten.xml");
  CHECK(again.count(VertexKind::Nic) == 1);
  CHECK(again.count(VertexKind::PciSwitch) == 0);
  CHECK(again.fingerprint() == first.fingerprint());
}

TEST_CASE("regressions: a JSON number where an integer belongs is refused, naming the key (float past int's range)",
          "[regression]") {
  // Fuzzer finding: "pcieWidth": 8.9e33 reached nlohmann's get<int>(), a float-to-int cast out of range (UB).
  const std::string json = writeJson(loadPreset("dgx1"));
  const size_t at = json.find("\"pcieWidth\": ");
  REQUIRE(at != std::string::npos);
  const size_t end = json.find_first_of(",\n}", at + 13);
  for (const std::string bad : {"8.88889e+33", "16.0", "4294967296", "-99999999999"}) {
    std::string text = json;
    text.replace(at + 13, end - at - 13, bad);
    const std::string message = errorOf([&] { (void)parseJson(text, "bad.json"); });
    INFO(bad << " -> " << message);
    CHECK_THAT(message, Catch::Contains("bad.json") && Catch::Contains("'pcieWidth' must be an integer"));
  }
  const std::string clusterText = R"({"format": "topoccl-cluster", "version": 1, "hosts": [
    {"name": "h0", "ranks": 1e30, "nics": [{"name": "eth0", "address": "10.0.0.1", "gbps": 10}]}]})";
  CHECK_THAT(errorOf([&] { (void)parseClusterFile(clusterText, "c.json"); }),
             Catch::Contains("'ranks' must be an integer"));
}
