#include "algorithms/synthesizer/plan_cache.hpp"

#include <unistd.h>

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "algorithms/msccl_xml.hpp"
#include "common/hash.hpp"
#include "common/json_integer.hpp"
#include "common/log.hpp"
#include "common/params.hpp"

namespace topoccl::algo::synth {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string hex16(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

std::optional<std::string> readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return buffer.str();
}

// Write to a temporary file in the same directory, then rename over the target.
bool writeAtomically(const std::string& path, const std::string& data) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return false;
    out << data;
    out.flush();
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      return false;
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return false;
  }
  return true;
}

}  // namespace

std::string PlanCacheKey::text() const {
  std::string devs;
  for (topo::VertexId d : devices) devs += (devs.empty() ? "" : ",") + std::to_string(d);
  return "v" + std::to_string(version) + " topo=" + topologyFingerprint + " devices=" + devs + " coll=" +
         collectiveName(collective) + " bucket=" + std::to_string(sizeBucket) + " options=" + hex16(optionsHash);
}

std::string PlanCacheKey::fileStem() const {
  return std::string(collectiveName(collective)) + "-" + std::to_string(devices.size()) + "r-b" +
         std::to_string(sizeBucket) + "-" + hex16(fnv1a64(text()));
}

uint32_t sizeBucket(uint64_t bytes) {
  uint32_t b = 0;
  while (bytes > 1) {
    bytes >>= 1;
    ++b;
  }
  return b;
}

uint64_t optionsHash(const SynthOptions& o) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "C=%u..%u budget=%.6g seed=%llu ring=%d validate=%d slices=%u milp=%d/%.6g contig=%d",
                o.minChunksPerRank, o.maxChunksPerRank, o.budgetSeconds, static_cast<unsigned long long>(o.seed),
                o.ringFallback ? 1 : 0, o.validate ? 1 : 0, o.sim.slices, o.milp ? 1 : 0, o.milpSeconds, o.contiguity ? 1 : 0);
  std::string text = buf;
  text += " sketch=" + (o.sketch ? o.sketch->canonical() : std::string("none"));
  return fnv1a64(text);
}

PlanCacheKey planCacheKey(const topo::Topology& topology, const std::vector<topo::VertexId>& rankDevice, Collective c,
                          uint64_t bytes, const SynthOptions& options) {
  PlanCacheKey key;
  key.topologyFingerprint = topology.fingerprint();
  key.devices = rankDevice.empty() ? defaultRankDevices(topology) : rankDevice;
  key.collective = c;
  key.sizeBucket = sizeBucket(bytes);
  key.optionsHash = optionsHash(options);
  return key;
}

PlanCache::PlanCache(std::string directory) : directory_(directory == "off" ? std::string() : std::move(directory)) {}

std::string PlanCache::defaultDirectory() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') return std::string(xdg) + "/topoccl";
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') return std::string(home) + "/.cache/topoccl";
  return {};
}

PlanCache PlanCache::fromParams() {
  const std::string dir = params::kPlanCacheDir.get();
  if (dir == "off") return PlanCache("");
  return PlanCache(dir.empty() ? defaultDirectory() : dir);
}

std::string PlanCache::xmlPath(const PlanCacheKey& key) const { return directory_ + "/" + key.fileStem() + ".xml"; }
std::string PlanCache::sidecarPath(const PlanCacheKey& key) const { return directory_ + "/" + key.fileStem() + ".json"; }

std::optional<CachedPlan> PlanCache::load(const PlanCacheKey& key) const {
  if (!enabled()) return std::nullopt;
  const std::string sidecar = sidecarPath(key);
  std::error_code ec;
  if (!fs::exists(sidecar, ec)) return std::nullopt;
  const auto corrupt = [&](const std::string& why) -> std::optional<CachedPlan> {
    TOPOCCL_WARN("plan cache: ignoring corrupt entry %s (%s); it will be rewritten", sidecar.c_str(), why.c_str());
    return std::nullopt;
  };
  const std::optional<std::string> meta = readFile(sidecar);
  if (!meta) return corrupt("unreadable sidecar");
  try {
    const json j = json::parse(*meta);
    if (j.at("key").get<std::string>() != key.text()) return corrupt("written for another key");
    const std::optional<std::string> xml = readFile(xmlPath(key));
    if (!xml) return corrupt("missing XML");
    if (j.at("xml_fnv1a64").get<std::string>() != hex16(fnv1a64(*xml))) return corrupt("XML does not match its hash");
    CachedPlan cached;
    cached.xml = *xml;
    cached.result.plan = parseMscclXml(*xml, xmlPath(key));
    cached.result.timeUs = j.at("time_us").get<double>();
    cached.result.strategy = j.at("strategy").get<std::string>();
    cached.result.family = j.at("family").get<std::string>();
    const auto chunks = jsonInteger<uint32_t>(j.at("chunks_per_rank"));
    const auto hops = jsonInteger<int>(j.at("max_hops"));
    const auto merges = j.contains("contiguity_merges") ? jsonInteger<int>(j.at("contiguity_merges")) : std::optional<int>(0);
    const auto bytes = jsonInteger<uint64_t>(j.at("bytes"));
    if (!chunks || !hops || !merges || !bytes) return corrupt("a count is not an integer in range");
    cached.result.chunksPerRank = *chunks;
    cached.result.maxHops = *hops;
    cached.result.seconds = j.at("synth_seconds").get<double>();
    cached.result.contiguityMerges = *merges;
    for (const json& f : j.at("families")) cached.result.families.push_back({f.at(0).get<std::string>(), f.at(1).get<double>()});
    cached.bytes = *bytes;
    cached.result.plan.topologyFingerprint = key.topologyFingerprint;
    cached.result.plan.predictedMicros = cached.result.timeUs;
    if (cached.result.plan.collective != key.collective ||
        cached.result.plan.nranks != static_cast<int>(key.devices.size())) {
      return corrupt("plan is for another collective or rank count");
    }
    return cached;
  } catch (const std::exception& e) {
    return corrupt(e.what());
  }
}

std::optional<std::string> PlanCache::store(const PlanCacheKey& key, const SynthResult& result, uint64_t bytes) const {
  std::string xml;
  try {
    xml = writeMscclXml(result.plan);
  } catch (const std::exception& e) {
    TOPOCCL_WARN("plan cache: plan %s cannot be written as MSCCL XML (%s); not cached", result.plan.name.c_str(), e.what());
    return std::nullopt;
  }
  if (!enabled()) return xml;
  std::error_code ec;
  fs::create_directories(directory_, ec);
  json families = json::array();
  for (const FamilyTime& f : result.families) families.push_back({f.family, f.timeUs});
  const json j{{"key", key.text()},
               {"xml_fnv1a64", hex16(fnv1a64(xml))},
               {"bytes", bytes},
               {"time_us", result.timeUs},
               {"strategy", result.strategy},
               {"family", result.family},
               {"chunks_per_rank", result.chunksPerRank},
               {"max_hops", result.maxHops},
               {"synth_seconds", result.seconds},
               {"contiguity_merges", result.contiguityMerges},
               {"families", families}};
  if (!writeAtomically(xmlPath(key), xml) || !writeAtomically(sidecarPath(key), j.dump(2) + "\n")) {
    TOPOCCL_WARN("plan cache: cannot write %s; not cached", xmlPath(key).c_str());
    return std::nullopt;
  }
  return xml;
}

CachedSynthesis synthesizeCached(const topo::Topology& topology, const std::vector<topo::VertexId>& rankDevice,
                                 Collective c, uint64_t bytes, const SynthOptions& options, const PlanCache& cache) {
  const PlanCacheKey key = planCacheKey(topology, rankDevice, c, bytes, options);
  CachedSynthesis out;
  if (cache.enabled()) out.path = cache.xmlPath(key);
  if (std::optional<CachedPlan> hit = cache.load(key)) {
    out.result = std::move(hit->result);
    out.xml = std::move(hit->xml);
    out.hit = true;
    if (hit->bytes != bytes) {
      // Same bucket, another size: the stored time is for hit->bytes.
      const CostModel model = CostModel::fromTopology(topology, key.devices);
      out.result.timeUs = simulate(out.result.plan, bytes, model, options.sim).finishUs;
      out.result.plan.predictedMicros = out.result.timeUs;
    }
    return out;
  }
  out.result = synthesize(topology, key.devices, c, bytes, options);
  if (std::optional<std::string> xml = cache.store(key, out.result, bytes)) out.xml = std::move(*xml);
  return out;
}

}  // namespace topoccl::algo::synth
