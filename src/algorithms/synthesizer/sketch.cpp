#include "algorithms/synthesizer/sketch.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "algorithms/synthesizer/synthesizer.hpp"
#include "common/error.hpp"

namespace topoccl::algo::synth {
namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& source, const std::string& key, const std::string& why) {
  throwInvalidArgument((source.empty() ? std::string("sketch") : source) + ": sketch key '" + key + "': " + why);
}

uint32_t positiveCount(const std::string& source, const std::string& key, const json& v) {
  if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > 64) {
    bad(source, key, "expected an integer in 1..64, got " + v.dump());
  }
  return static_cast<uint32_t>(v.get<int64_t>());
}

double seconds(const std::string& source, const std::string& key, const json& v) {
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() <= 0) {
    bad(source, key, "expected a positive number of seconds, got " + v.dump());
  }
  return v.get<double>();
}

// "3", 3, "gpu3" -> 3; "nic2" -> -1 - 2.
int relayTarget(const std::string& source, const std::string& key, const json& v) {
  if (v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < 1024) return static_cast<int>(v.get<int64_t>());
  if (v.is_string()) {
    std::string t = v.get<std::string>();
    int sign = 1;
    if (t.rfind("gpu", 0) == 0) {
      t = t.substr(3);
    } else if (t.rfind("nic", 0) == 0) {
      t = t.substr(3);
      sign = -1;
    }
    if (!t.empty() && t.size() < 5 && std::all_of(t.begin(), t.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
      const int i = std::stoi(t);
      return sign > 0 ? i : -1 - i;
    }
  }
  bad(source, key, "expected a local GPU index (3, \"3\", \"gpu3\") or \"nicK\", got " + v.dump());
}

}  // namespace

const std::vector<std::string>& sketchFamilies() {
  static const std::vector<std::string> families{"bfs", "pack", "star", "rings", "hier", "milp", "ring", "recursive_doubling", "tree", "direct"};
  return families;
}

bool Sketch::wantsFamily(const std::string& family) const {
  return families.empty() || std::find(families.begin(), families.end(), family) != families.end();
}

std::string Sketch::canonical() const {
  json j = json::object();
  j["intranode"] = intranode == Intranode::NvlinkOnly ? "nvlink-only" : "any";
  if (internode == Internode::Relay) {
    json relayJson = json::object();
    for (const auto& [from, tos] : relay) {
      json list = json::array();
      for (int t : tos) list.push_back(t >= 0 ? json(t) : json("nic" + std::to_string(-1 - t)));
      relayJson[std::to_string(from)] = list;
    }
    j["internode"] = {{"relay", relayJson}};
  } else {
    j["internode"] = internode == Internode::NearestNic ? "nearest-nic" : "any";
  }
  if (minChunksPerRank) j["chunks_per_rank"] = {*minChunksPerRank, *maxChunksPerRank};
  if (symmetry) j["symmetry"] = *symmetry;
  if (!families.empty()) j["families"] = families;
  if (budgetSeconds) j["budget_seconds"] = *budgetSeconds;
  if (milpSeconds) j["milp_seconds"] = *milpSeconds;
  if (contiguity) j["contiguity"] = *contiguity;
  return j.dump();  // object keys sorted: canonical
}

Sketch parseSketch(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throwInvalidArgument((source.empty() ? std::string("sketch") : source) + ": not JSON: " + e.what());
  }
  if (!j.is_object()) bad(source, "(top level)", "expected a JSON object");
  Sketch s;
  s.source = source;
  for (const auto& [key, v] : j.items()) {
    if (key == "intranode") {
      if (v == "nvlink-only") {
        s.intranode = Sketch::Intranode::NvlinkOnly;
      } else if (v == "any") {
        s.intranode = Sketch::Intranode::Any;
      } else {
        bad(source, key, "expected \"nvlink-only\" or \"any\", got " + v.dump());
      }
    } else if (key == "internode") {
      if (v == "any") {
        s.internode = Sketch::Internode::Any;
      } else if (v == "nearest-nic") {
        s.internode = Sketch::Internode::NearestNic;
      } else if (v.is_object()) {
        for (const auto& [k2, v2] : v.items()) {
          if (k2 != "relay") bad(source, "internode." + k2, "unknown key (expected \"relay\")");
          if (!v2.is_object() || v2.empty()) bad(source, "internode.relay", "expected a non-empty object {\"<gpu>\": <gpu or nic>}");
          for (const auto& [from, to] : v2.items()) {
            const std::string rk = "internode.relay." + from;
            const int f = relayTarget(source, rk, json(from));
            if (f < 0) bad(source, rk, "a relay sender must be a GPU");
            std::vector<int>& tos = s.relay[f];
            if (to.is_array()) {
              if (to.empty()) bad(source, rk, "empty list");
              for (const json& t : to) tos.push_back(relayTarget(source, rk, t));
            } else {
              tos.push_back(relayTarget(source, rk, to));
            }
            std::sort(tos.begin(), tos.end());
            tos.erase(std::unique(tos.begin(), tos.end()), tos.end());
          }
        }
        if (s.relay.empty()) bad(source, key, "expected {\"relay\": {...}}");
        s.internode = Sketch::Internode::Relay;
      } else {
        bad(source, key, "expected \"any\", \"nearest-nic\" or {\"relay\": {...}}, got " + v.dump());
      }
    } else if (key == "chunks_per_rank") {
      if (v.is_array()) {
        if (v.size() != 2) bad(source, key, "expected C or [min, max], got " + v.dump());
        s.minChunksPerRank = positiveCount(source, key, v[0]);
        s.maxChunksPerRank = positiveCount(source, key, v[1]);
        if (*s.maxChunksPerRank < *s.minChunksPerRank) bad(source, key, "max < min in " + v.dump());
      } else {
        s.minChunksPerRank = s.maxChunksPerRank = positiveCount(source, key, v);
      }
    } else if (key == "symmetry") {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 1024) {
        bad(source, key, "expected a rotation offset (integer >= 0), got " + v.dump());
      }
      s.symmetry = static_cast<int>(v.get<int64_t>());
    } else if (key == "families") {
      if (!v.is_array()) bad(source, key, "expected a list of family names, got " + v.dump());
      for (const json& f : v) {
        const auto& known = sketchFamilies();
        if (!f.is_string() || std::find(known.begin(), known.end(), f.get<std::string>()) == known.end()) {
          std::string list;
          for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
          bad(source, key, "unknown family " + f.dump() + " (known: " + list + ")");
        }
        if (!s.wantsFamily(f.get<std::string>()) || s.families.empty()) s.families.push_back(f.get<std::string>());
      }
      if (s.families.empty()) bad(source, key, "empty list");
    } else if (key == "budget_seconds") {
      s.budgetSeconds = seconds(source, key, v);
    } else if (key == "milp_seconds") {
      s.milpSeconds = seconds(source, key, v);
    } else if (key == "contiguity") {
      if (!v.is_boolean()) bad(source, key, "expected true or false, got " + v.dump());
      s.contiguity = v.get<bool>();
    } else {
      bad(source, key,
          "unknown key (known: intranode, internode, chunks_per_rank, symmetry, families, budget_seconds, milp_seconds, "
          "contiguity)");
    }
  }
  return s;
}

Sketch loadSketch(const std::string& path) {
  std::ifstream in(path);
  if (!in) throwInvalidArgument("cannot read sketch file " + path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return parseSketch(buffer.str(), path);
}

void resolveSketch(Sketch& sketch, const topo::Topology& topology, const std::vector<topo::VertexId>& rankDevice) {
  const std::vector<topo::VertexId> devices = rankDevice.empty() ? defaultRankDevices(topology) : rankDevice;
  const size_t n = devices.size();
  sketch.allowedPairs.clear();
  if (sketch.intranode == Sketch::Intranode::Any && sketch.internode == Sketch::Internode::Any) return;
  // Local GPU index: position among the GPUs of the same host in gpus() order.
  std::map<topo::VertexId, int> localIndex;
  std::map<int, std::vector<topo::VertexId>> hostGpus;
  for (topo::VertexId g : topology.gpus()) {
    auto& list = hostGpus[topology.vertex(g).host];
    localIndex[g] = static_cast<int>(list.size());
    list.push_back(g);
  }
  // GPUs nearest each NIC (best path class, then fewest hops).
  std::map<topo::VertexId, std::vector<topo::VertexId>> nearestGpus;
  for (topo::VertexId nic : topology.nics()) {
    std::vector<topo::VertexId> best;
    std::pair<int, int> bestKey{1 << 30, 1 << 30};
    for (topo::VertexId g : hostGpus[topology.vertex(nic).host]) {
      const topo::Path p = topology.path(g, nic);
      if (!p.exists()) continue;
      const std::pair<int, int> key{static_cast<int>(p.cls), p.hops};
      if (key < bestKey) {
        bestKey = key;
        best.clear();
      }
      if (key == bestKey) best.push_back(g);
    }
    nearestGpus[nic] = best;
  }
  const auto nearAnyNic = [&](topo::VertexId g) {
    for (const auto& [nic, gpus] : nearestGpus)
      if (std::find(gpus.begin(), gpus.end(), g) != gpus.end()) return true;
    return false;
  };
  const auto nicOfHost = [&](int host, int k) -> std::optional<topo::VertexId> {
    int i = 0;
    for (topo::VertexId nic : topology.nics()) {
      if (topology.vertex(nic).host != host) continue;
      if (i++ == k) return nic;
    }
    return std::nullopt;
  };
  sketch.allowedPairs.assign(n, std::vector<bool>(n, true));
  for (size_t u = 0; u < n; ++u) {
    for (size_t v = 0; v < n; ++v) {
      if (u == v || devices[u] == devices[v]) continue;
      const topo::Vertex& a = topology.vertex(devices[u]);
      const topo::Vertex& b = topology.vertex(devices[v]);
      bool ok = true;
      if (a.host == b.host) {
        if (sketch.intranode == Sketch::Intranode::NvlinkOnly) {
          const topo::Path p = topology.path(devices[u], devices[v]);
          for (size_t i = 0; ok && i + 1 < p.vertices.size(); ++i) {
            const topo::Link* l = topology.linkBetween(p.vertices[i], p.vertices[i + 1]);
            ok = l != nullptr && l->kind == topo::LinkKind::NvLink;
          }
          ok = ok && p.exists();
        }
      } else if (sketch.internode == Sketch::Internode::NearestNic) {
        ok = a.kind == topo::VertexKind::Gpu && b.kind == topo::VertexKind::Gpu && nearAnyNic(devices[u]) &&
             nearAnyNic(devices[v]);
      } else if (sketch.internode == Sketch::Internode::Relay) {
        ok = false;
        const auto from = localIndex.find(devices[u]);
        const auto to = localIndex.find(devices[v]);
        if (from != localIndex.end() && to != localIndex.end()) {
          const auto it = sketch.relay.find(from->second);
          if (it != sketch.relay.end()) {
            for (int t : it->second) {
              if (t >= 0) {
                ok = ok || t == to->second;
              } else if (const auto nic = nicOfHost(b.host, -1 - t)) {
                const auto& near = nearestGpus[*nic];
                ok = ok || std::find(near.begin(), near.end(), devices[v]) != near.end();
              }
            }
          }
        }
      }
      sketch.allowedPairs[u][v] = ok;
    }
  }
}

SynthOptions applySketch(const SynthOptions& options) {
  SynthOptions out = options;
  if (!options.sketch) return out;
  const Sketch& s = *options.sketch;
  if (s.minChunksPerRank) out.minChunksPerRank = *s.minChunksPerRank;
  if (s.maxChunksPerRank) out.maxChunksPerRank = *s.maxChunksPerRank;
  if (s.budgetSeconds) out.budgetSeconds = *s.budgetSeconds;
  if (s.milpSeconds) out.milpSeconds = *s.milpSeconds;
  if (s.contiguity) out.contiguity = *s.contiguity;
  // The built-in generators (ring, recursive_doubling, tree, direct) are filtered one by one in synthesize().
  if (!s.wantsFamily("ring") && !s.wantsFamily("recursive_doubling") && !s.wantsFamily("tree") && !s.wantsFamily("direct")) {
    out.ringFallback = false;
  }
  if (!s.families.empty()) out.milp = s.wantsFamily("milp");
  return out;
}

}  // namespace topoccl::algo::synth
