// On-disk cache of synthesized plans. Synthesis takes seconds; a plan for the same machine, ranks,
// collective, size bucket and options is read back in microseconds.
//
// Key: (topology fingerprint, rank device list, collective, size bucket = floor(log2(bytes)), hash of
// the SynthOptions that shape the result (sketch included), kSynthesizerVersion). One entry is two
// files named by the key's hash: "<coll>-<N>r-b<bucket>-<hash>.xml", the plan as MSCCL XML
// (writeMscclXml, read back with parseMscclXml), and a ".json" sidecar with the full key, the
// XML's FNV-1a hash and the synthesis facts (time, strategy, family, C, ...). Both are written to a
// temporary file and renamed (the sidecar last: it commits the entry). A sidecar that does not parse,
// names another key, or whose XML is missing, differs from its hash or does not parse, is a miss with a
// WARN; the entry is then rewritten. A hit for another size of the same bucket re-simulates the plan.
//
// Directory: TOPOCCL_PLAN_CACHE_DIR (params.hpp); empty means $XDG_CACHE_HOME/topoccl or
// ~/.cache/topoccl; "off" disables the cache (nothing is read or written).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "algorithms/synthesizer/synthesizer.hpp"

namespace topoccl::algo::synth {

// Bump when synthesis changes what it produces for the same inputs: old entries then miss.
inline constexpr int kSynthesizerVersion = 4;  // 4: cost model v2 (pipelined links, sends end when they left)

struct PlanCacheKey {
  std::string topologyFingerprint;
  std::vector<topo::VertexId> devices;
  Collective collective = Collective::AllGather;
  uint32_t sizeBucket = 0;   // floor(log2(bytes))
  uint64_t optionsHash = 0;
  int version = kSynthesizerVersion;

  std::string text() const;  // canonical, one line
  std::string fileStem() const;
};

uint32_t sizeBucket(uint64_t bytes);
// FNV-1a 64 of the options that shape the result (chunks, budget, seed, ring fallback, validation,
// simulation slices, MILP time, contiguity, the sketch's canonical text).
uint64_t optionsHash(const SynthOptions& options);
PlanCacheKey planCacheKey(const topo::Topology& topology, const std::vector<topo::VertexId>& rankDevice, Collective c,
                          uint64_t bytes, const SynthOptions& options);

struct CachedPlan {
  SynthResult result;  // plan parsed from the XML; timeUs / strategy / family / chunksPerRank from the sidecar
  std::string xml;     // the stored XML, byte for byte
  uint64_t bytes = 0;  // the size it was synthesized for
};

class PlanCache {
 public:
  // "" or "off": disabled.
  explicit PlanCache(std::string directory);
  // From TOPOCCL_PLAN_CACHE_DIR (see above).
  static PlanCache fromParams();
  static std::string defaultDirectory();  // $XDG_CACHE_HOME/topoccl or ~/.cache/topoccl ("" if neither is set)

  bool enabled() const { return !directory_.empty(); }
  const std::string& directory() const { return directory_; }
  std::string xmlPath(const PlanCacheKey& key) const;
  std::string sidecarPath(const PlanCacheKey& key) const;

  // nullopt on a miss (a corrupt entry WARNs). Never throws for file problems.
  std::optional<CachedPlan> load(const PlanCacheKey& key) const;
  // Writes the entry atomically; returns the XML written, or nullopt (with a WARN) when the plan cannot be
  // written as MSCCL XML or the directory is not writable. Disabled cache: nothing, returns the XML.
  std::optional<std::string> store(const PlanCacheKey& key, const SynthResult& result, uint64_t bytes) const;

 private:
  std::string directory_;
};

struct CachedSynthesis {
  SynthResult result;
  std::string xml;   // the plan as MSCCL XML (empty when it cannot be written as XML)
  bool hit = false;
  std::string path;  // the entry's XML file ("" when the cache is disabled)
};

// synthesize(topology, rankDevice, ...) through the cache: a hit returns the stored plan, a miss
// synthesizes and stores.
CachedSynthesis synthesizeCached(const topo::Topology& topology, const std::vector<topo::VertexId>& rankDevice,
                                 Collective c, uint64_t bytes, const SynthOptions& options, const PlanCache& cache);

}  // namespace topoccl::algo::synth
