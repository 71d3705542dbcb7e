#include "algorithms/msccl_xml.hpp"

#include <pugixml.hpp>

#include <algorithm>
#include <charconv>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "algorithms/generators.hpp"
#include "common/error.hpp"
#include "topology/loaders.hpp"

namespace topoccl::algo {
namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

bool isRooted(Collective c) {
  return c == Collective::Broadcast || c == Collective::Reduce || c == Collective::Gather ||
         c == Collective::Scatter;
}

// Largest number of blocks any buffer of any rank holds: MSCCL's nchunksperloop covers that buffer.
uint32_t largestBlocks(Collective c, int nranks) {
  uint32_t blocks = 0;
  for (int r = 0; r < nranks; ++r) {
    blocks = std::max({blocks, inputBlocks(c, nranks, r, r), outputBlocks(c, nranks, r, r)});
  }
  return blocks;
}

uint32_t largestInputBlocks(Collective c, int nranks) {
  uint32_t blocks = 0;
  for (int r = 0; r < nranks; ++r) blocks = std::max(blocks, inputBlocks(c, nranks, r, r));
  return blocks;
}

uint32_t largestOutputBlocks(Collective c, int nranks) {
  uint32_t blocks = 0;
  for (int r = 0; r < nranks; ++r) blocks = std::max(blocks, outputBlocks(c, nranks, r, r));
  return blocks;
}

std::optional<Collective> collectiveFromMscclName(const std::string& name) {
  if (name == "allreduce") return Collective::AllReduce;
  if (name == "allgather") return Collective::AllGather;
  if (name == "reducescatter" || name == "reduce_scatter") return Collective::ReduceScatter;
  if (name == "broadcast") return Collective::Broadcast;
  if (name == "reduce") return Collective::Reduce;
  if (name == "alltoall") return Collective::AllToAll;
  if (name == "gather") return Collective::Gather;
  if (name == "scatter") return Collective::Scatter;
  return std::nullopt;
}

std::optional<StepKind> stepKindFromMscclName(const std::string& name) {
  static const std::pair<const char*, StepKind> kinds[] = {
      {"nop", StepKind::Nop},
      {"s", StepKind::Send},
      {"r", StepKind::Recv},
      {"rrs", StepKind::RecvReduceSend},
      {"rrc", StepKind::RecvReduceCopy},
      {"rcs", StepKind::RecvCopySend},
      {"rrcs", StepKind::RecvReduceCopySend},
      {"cpy", StepKind::Copy},
      {"re", StepKind::Reduce},
  };
  for (const auto& [spelling, kind] : kinds) {
    if (name == spelling) return kind;
  }
  return std::nullopt;
}

std::optional<BufferId> bufferFromLetter(const std::string& letter) {
  if (letter == "i") return BufferId::Input;
  if (letter == "o") return BufferId::Output;
  if (letter == "s") return BufferId::Scratch;
  return std::nullopt;
}

const char* bufferLetter(BufferId b) {
  switch (b) {
    case BufferId::Input: return "i";
    case BufferId::Output: return "o";
    case BufferId::Scratch: return "s";
  }
  return "?";
}

const char* declaredAttr(BufferId b) {
  switch (b) {
    case BufferId::Input: return "i_chunks";
    case BufferId::Output: return "o_chunks";
    case BufferId::Scratch: return "s_chunks";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// Import

struct RawStep {
  pugi::xml_node node;
  std::string where;
  StepKind kind = StepKind::Nop;
  ChunkRange src;
  ChunkRange dst;
  int depTb = -1;
  int depStep = -1;
  bool hasdep = false;
};

struct RawTb {
  pugi::xml_node node;
  std::string where;
  int send = -1;
  int recv = -1;
  int chan = 0;
  std::vector<RawStep> steps;
};

struct RawGpu {
  pugi::xml_node node;
  std::string where;
  uint32_t inputChunks = 0;
  uint32_t outputChunks = 0;
  uint32_t scratchChunks = 0;
  std::vector<RawTb> tbs;  // indexed by tb id
};

class Reader {
 public:
  Reader(const std::string& text, const std::string& sourceName) : text_(text), source_(sourceName) {}

  Plan read() {
    pugi::xml_document doc;
    topo::parseXmlOrThrow(doc, text_, source_);
    const pugi::xml_node algo = doc.child("algo");
    if (!algo) {
      const pugi::xml_node first = doc.first_child();
      fail(first ? first : doc, "no <algo> element: not an MSCCL algorithm file");
    }
    readHeader(algo);
    readGpus(algo);
    findRoot(algo);
    checkChunkCounts(algo);
    return build();
  }

 private:
  [[noreturn]] void fail(const pugi::xml_node& node, const std::string& message) const {
    const ptrdiff_t offset = node.offset_debug();
    const int line = offset >= 0 ? topo::lineOfOffset(text_, static_cast<size_t>(offset)) : 1;
    topo::throwParseError(source_, line, message);
  }

  std::string required(const pugi::xml_node& node, const std::string& where, const char* name) const {
    const pugi::xml_attribute attr = node.attribute(name);
    if (!attr) fail(node, where + ": missing attribute " + name);
    return attr.value();
  }

  int64_t toInteger(const pugi::xml_node& node, const std::string& where, const char* name, const std::string& value,
                    int64_t lo, int64_t hi) const {
    int64_t parsed = 0;
    const char* begin = value.data();
    const char* end = value.data() + value.size();
    const auto [ptr, ec] = std::from_chars(begin, end, parsed);
    if (value.empty() || ec != std::errc() || ptr != end) {
      fail(node, where + ": attribute " + name + "=\"" + value + "\" is not an integer");
    }
    if (parsed < lo || parsed > hi) {
      fail(node, where + ": attribute " + name + "=\"" + value + "\" is outside " + std::to_string(lo) + ".." +
                     std::to_string(hi));
    }
    return parsed;
  }

  int64_t integer(const pugi::xml_node& node, const std::string& where, const char* name, int64_t lo,
                  int64_t hi) const {
    return toInteger(node, where, name, required(node, where, name), lo, hi);
  }

  int64_t integerOr(const pugi::xml_node& node, const std::string& where, const char* name, int64_t fallback,
                    int64_t lo, int64_t hi) const {
    const pugi::xml_attribute attr = node.attribute(name);
    if (!attr) return fallback;
    return toInteger(node, where, name, attr.value(), lo, hi);
  }

  BufferId buffer(const pugi::xml_node& node, const std::string& where, const char* name,
                  const std::string& value) const {
    const std::optional<BufferId> b = bufferFromLetter(value);
    if (!b) fail(node, where + ": attribute " + name + "=\"" + value + "\" is not a buffer (i, o or s)");
    return *b;
  }

  void readHeader(const pugi::xml_node& algo) {
    const std::string where = "<algo>";
    name_ = algo.attribute("name") ? algo.attribute("name").value() : "msccl";
    ngpus_ = static_cast<int>(integer(algo, where, "ngpus", 1, 1 << 16));
    const std::string coll = required(algo, where, "coll");
    const std::optional<Collective> c = collectiveFromMscclName(coll);
    if (!c) {
      fail(algo, where + ": coll=\"" + coll +
                     "\" is not a supported collective (allreduce, allgather, reducescatter or reduce_scatter, "
                     "broadcast, reduce, alltoall, gather, scatter)");
    }
    collective_ = *c;
    const std::string proto = required(algo, where, "proto");
    if (proto != "Simple" && proto != "LL" && proto != "LL128") {
      fail(algo, where + ": proto=\"" + proto + "\" is not Simple, LL or LL128");
    }
    nchannels_ = static_cast<int>(integer(algo, where, "nchannels", 1, kMaxChannels));
    inPlace_ = integer(algo, where, "inplace", 0, 1) == 1;
    outOfPlace_ = integerOr(algo, where, "outofplace", 0, 0, 1) == 1;
    minBytes_ = static_cast<uint64_t>(integerOr(algo, where, "minBytes", 0, 0, kInt64Max));
    const int64_t maxBytes = integerOr(algo, where, "maxBytes", kInt64Max, 0, kInt64Max);
    maxBytes_ = maxBytes == kInt64Max ? UINT64_MAX : static_cast<uint64_t>(maxBytes);
    if (minBytes_ > maxBytes_) fail(algo, where + ": minBytes is greater than maxBytes");
    if (algo.attribute("nchunksperloop")) {
      chunksPerLoop_ = static_cast<uint32_t>(integer(algo, where, "nchunksperloop", 1, 1 << 24));
    }
    if (algo.attribute("root")) {
      if (!isRooted(collective_)) fail(algo, where + ": root given, but " + coll + " has no root");
      root_ = static_cast<int>(integer(algo, where, "root", 0, ngpus_ - 1));
    }
  }

  void readGpus(const pugi::xml_node& algo) {
    gpus_.resize(static_cast<size_t>(ngpus_));
    std::vector<bool> seen(static_cast<size_t>(ngpus_), false);
    int count = 0;
    bool newFormat = false;
    for (const pugi::xml_node& node : algo.children()) {
      if (node.type() != pugi::node_element) continue;
      if (std::string(node.name()) != "gpu") fail(node, "<algo>: unexpected element <" + std::string(node.name()) + ">");
      ++count;
      const std::string where0 = "<gpu>";
      const int id = static_cast<int>(integer(node, where0, "id", 0, INT32_MAX));
      if (id >= ngpus_) {
        fail(node, "<gpu id=\"" + std::to_string(id) + "\">: id is outside 0.." + std::to_string(ngpus_ - 1) +
                       " (ngpus=\"" + std::to_string(ngpus_) + "\")");
      }
      if (seen[static_cast<size_t>(id)]) fail(node, "<gpu id=\"" + std::to_string(id) + "\">: duplicate gpu id");
      seen[static_cast<size_t>(id)] = true;
      RawGpu& gpu = gpus_[static_cast<size_t>(id)];
      gpu.node = node;
      gpu.where = "<gpu id=\"" + std::to_string(id) + "\">";
      gpu.inputChunks = static_cast<uint32_t>(integer(node, gpu.where, "i_chunks", 0, 1 << 24));
      gpu.outputChunks = static_cast<uint32_t>(integer(node, gpu.where, "o_chunks", 0, 1 << 24));
      gpu.scratchChunks = static_cast<uint32_t>(integer(node, gpu.where, "s_chunks", 0, 1 << 24));
      newFormat = readTbs(gpu, id) || newFormat;
    }
    if (count != ngpus_) {
      int missing = 0;
      while (missing < ngpus_ && seen[static_cast<size_t>(missing)]) ++missing;
      fail(algo, "<algo>: ngpus=\"" + std::to_string(ngpus_) + "\" but the file has " + std::to_string(count) +
                     " <gpu> elements (no <gpu id=\"" + std::to_string(missing) + "\">)");
    }
    if (chunksPerLoop_ == 0) {
      if (!newFormat) required(algo, "<algo>", "nchunksperloop");  // throws
      for (const RawGpu& gpu : gpus_) chunksPerLoop_ = std::max({chunksPerLoop_, gpu.inputChunks, gpu.outputChunks});
      if (chunksPerLoop_ == 0) fail(algo, "<algo>: no nchunksperloop, and no <gpu> declares any chunks");
    }
  }

  // Returns whether any step used the newer <op> spelling.
  bool readTbs(RawGpu& gpu, int gpuId) {
    bool newFormat = false;
    std::map<int, RawTb> byId;
    for (const pugi::xml_node& node : gpu.node.children()) {
      if (node.type() != pugi::node_element) continue;
      const std::string element = node.name();
      if (element == "copy") continue;  // TACCL's informational <copy i_off o_off>
      if (element != "tb") fail(node, gpu.where + ": unexpected element <" + element + ">");
      const int id = static_cast<int>(integer(node, gpu.where + " <tb>", "id", 0, static_cast<int64_t>(kMscclMaxTbs) - 1));
      RawTb tb;
      tb.node = node;
      tb.where = gpu.where + " <tb id=\"" + std::to_string(id) + "\">";
      if (byId.count(id)) fail(node, tb.where + ": duplicate tb id");
      tb.send = static_cast<int>(integer(node, tb.where, "send", -1, ngpus_ - 1));
      tb.recv = static_cast<int>(integer(node, tb.where, "recv", -1, ngpus_ - 1));
      if (tb.send == gpuId) fail(node, tb.where + ": send=\"" + std::to_string(gpuId) + "\" is the gpu itself");
      if (tb.recv == gpuId) fail(node, tb.where + ": recv=\"" + std::to_string(gpuId) + "\" is the gpu itself");
      tb.chan = static_cast<int>(integer(node, tb.where, "chan", 0, kMaxChannels - 1));
      if (tb.chan >= nchannels_) {
        fail(node, tb.where + ": chan=\"" + std::to_string(tb.chan) + "\" but nchannels=\"" +
                       std::to_string(nchannels_) + "\"");
      }
      for (const pugi::xml_node& stepNode : node.children()) {
        if (stepNode.type() != pugi::node_element) continue;
        const std::string stepElement = stepNode.name();
        if (stepElement != "step" && stepElement != "op") {
          fail(stepNode, tb.where + ": unexpected element <" + stepElement + ">");
        }
        if (stepElement == "op") newFormat = true;
        if (tb.steps.size() >= kMscclMaxStepsPerTb) {
          fail(stepNode, tb.where + ": more than " + std::to_string(kMscclMaxStepsPerTb) + " steps");
        }
        tb.steps.push_back(readStep(gpu, tb, stepNode, stepElement == "op"));
      }
      byId.emplace(id, std::move(tb));
    }
    int expected = 0;
    for (auto& [id, tb] : byId) {
      if (id != expected) {
        fail(tb.node, tb.where + ": tb ids are not contiguous from 0 (no <tb id=\"" + std::to_string(expected) + "\">)");
      }
      ++expected;
      gpu.tbs.push_back(std::move(tb));
    }
    return newFormat;
  }

  RawStep readStep(const RawGpu& gpu, const RawTb& tb, const pugi::xml_node& node, bool opFormat) {
    RawStep step;
    step.node = node;
    const size_t position = tb.steps.size();
    const char* indexAttr = opFormat ? "step" : "s";
    const std::string where0 = tb.where + " <" + node.name() + ">";
    const int64_t s = integer(node, where0, indexAttr, 0, static_cast<int64_t>(kMscclMaxStepsPerTb) - 1);
    step.where = tb.where + " <" + node.name() + " " + indexAttr + "=\"" + std::to_string(s) + "\">";
    if (s != static_cast<int64_t>(position)) {
      fail(node, step.where + ": steps of a tb must be numbered 0, 1, 2, ... in order; expected " + indexAttr + "=\"" +
                     std::to_string(position) + "\"");
    }
    const std::string type = required(node, step.where, "type");
    const std::optional<StepKind> kind = stepKindFromMscclName(type);
    if (!kind) {
      fail(node, step.where + ": unknown type=\"" + type + "\" (s, r, rcs, rrs, rrc, rrcs, cpy, re, nop)");
    }
    step.kind = *kind;
    const bool nop = step.kind == StepKind::Nop;

    // Buffers and offsets.
    std::optional<BufferId> srcBuf;
    std::optional<BufferId> dstBuf;
    std::optional<int64_t> srcOff;
    std::optional<int64_t> dstOff;
    int64_t cnt = 1;
    if (!opFormat) {
      srcBuf = buffer(node, step.where, "srcbuf", required(node, step.where, "srcbuf"));
      dstBuf = buffer(node, step.where, "dstbuf", required(node, step.where, "dstbuf"));
      srcOff = integer(node, step.where, "srcoff", -1, INT32_MAX);
      dstOff = integer(node, step.where, "dstoff", -1, INT32_MAX);
      cnt = integer(node, step.where, "cnt", INT32_MIN, INT32_MAX);
    } else {
      if (node.attribute("srcbuf")) srcBuf = buffer(node, step.where, "srcbuf", node.attribute("srcbuf").value());
      if (node.attribute("dstbuf")) dstBuf = buffer(node, step.where, "dstbuf", node.attribute("dstbuf").value());
      if (node.attribute("srcoff")) srcOff = integer(node, step.where, "srcoff", -1, INT32_MAX);
      if (node.attribute("dstoff")) dstOff = integer(node, step.where, "dstoff", -1, INT32_MAX);
      cnt = integerOr(node, step.where, "cnt", 1, INT32_MIN, INT32_MAX);
      if (!nop && node.attribute("buf")) {
        const BufferId b = buffer(node, step.where, "buf", node.attribute("buf").value());
        const int64_t off = integerOr(node, step.where, "off", 0, 0, INT32_MAX);
        // buf/off is the source of a sending step and the destination of the others; fused
        // receive-and-forward / in-place reductions use the same chunks on the other side.
        const bool other = step.kind == StepKind::RecvReduceCopy || step.kind == StepKind::RecvReduceCopySend ||
                           step.kind == StepKind::RecvCopySend;
        if ((stepSends(step.kind) || other) && !srcBuf) {
          srcBuf = b;
          srcOff = off;
        }
        if ((!stepSends(step.kind) || other) && !dstBuf) {
          dstBuf = b;
          dstOff = off;
        }
      }
    }
    if (!nop) {
      if (cnt < 1 || cnt >= kMscclMaxCount) {
        fail(node, step.where + ": cnt=\"" + std::to_string(cnt) + "\" is outside 1.." +
                       std::to_string(kMscclMaxCount - 1));
      }
      const auto side = [&](bool used, const std::optional<BufferId>& b, const std::optional<int64_t>& off,
                            const char* bufName, const char* offName, ChunkRange& out) {
        if (!used) return;
        if (!b || !off) {
          fail(node, step.where + ": type=\"" + type + "\" needs " + bufName + " and " + offName);
        }
        if (*off < 0) fail(node, step.where + ": " + offName + "=\"" + std::to_string(*off) + "\" is negative, but type=\"" + type + "\" uses it");
        const uint32_t declared = *b == BufferId::Input    ? gpu.inputChunks
                                  : *b == BufferId::Output ? gpu.outputChunks
                                                           : gpu.scratchChunks;
        if (*off + cnt > static_cast<int64_t>(declared)) {
          fail(node, step.where + ": " + bufName + "=\"" + bufferLetter(*b) + "\" " + offName + "=\"" +
                         std::to_string(*off) + "\" cnt=\"" + std::to_string(cnt) + "\" reaches past the " +
                         std::to_string(declared) + " chunks of " + gpu.where + " " + declaredAttr(*b));
        }
        out = {*b, static_cast<uint32_t>(*off), static_cast<uint32_t>(cnt)};
      };
      side(stepReads(step.kind), srcBuf, srcOff, "srcbuf", "srcoff", step.src);
      side(stepWrites(step.kind), dstBuf, dstOff, "dstbuf", "dstoff", step.dst);
      if (stepSends(step.kind) && tb.send < 0) {
        fail(node, step.where + ": type=\"" + type + "\" sends, but " + tb.where + " has send=\"-1\"");
      }
      if (stepReceives(step.kind) && tb.recv < 0) {
        fail(node, step.where + ": type=\"" + type + "\" receives, but " + tb.where + " has recv=\"-1\"");
      }
    }

    // Dependency.
    if (opFormat) {
      step.depTb = static_cast<int>(integerOr(node, step.where, "depid", -1, -1, INT32_MAX));
      if (step.depTb >= 0) step.depStep = static_cast<int>(integer(node, step.where, "deps", 0, INT32_MAX));
      step.hasdep = integerOr(node, step.where, "hasdep", 0, 0, 1) == 1;
    } else {
      step.depTb = static_cast<int>(integer(node, step.where, "depid", -1, INT32_MAX));
      const int64_t deps = integer(node, step.where, "deps", -1, INT32_MAX);
      if (step.depTb >= 0 && deps < 0) {
        fail(node, step.where + ": depid=\"" + std::to_string(step.depTb) + "\" needs deps >= 0");
      }
      step.depStep = static_cast<int>(deps);
      step.hasdep = integer(node, step.where, "hasdep", 0, 1) == 1;
    }
    return step;
  }

  void findRoot(const pugi::xml_node& algo) {
    if (!isRooted(collective_)) {
      root_ = -1;
      return;
    }
    if (root_ >= 0) return;
    if (ngpus_ == 1) {
      root_ = 0;
      return;
    }
    const bool rootHasInput = collective_ == Collective::Broadcast || collective_ == Collective::Scatter;
    const BufferId rooted = rootHasInput ? BufferId::Input : BufferId::Output;
    std::vector<int> declaring;
    std::vector<int> using_;
    for (int r = 0; r < ngpus_; ++r) {
      const RawGpu& gpu = gpus_[static_cast<size_t>(r)];
      if ((rootHasInput ? gpu.inputChunks : gpu.outputChunks) > 0) declaring.push_back(r);
      bool uses = false;
      for (const RawTb& tb : gpu.tbs) {
        for (const RawStep& step : tb.steps) {
          if (rootHasInput ? (stepReads(step.kind) && step.src.buffer == rooted)
                           : (stepWrites(step.kind) && step.dst.buffer == rooted)) {
            uses = true;
          }
        }
      }
      if (uses) using_.push_back(r);
    }
    if (declaring.size() == 1) {
      root_ = declaring[0];
    } else if (using_.size() == 1) {
      root_ = using_[0];
    } else {
      fail(algo, std::string("<algo>: cannot tell the root of this ") + collectiveName(collective_) + ": " +
                     std::to_string(declaring.size()) + " gpus declare " + declaredAttr(rooted) + " > 0 and " +
                     std::to_string(using_.size()) + " use that buffer; add root=\"r\" to <algo>");
    }
  }

  void checkChunkCounts(const pugi::xml_node& algo) {
    const uint32_t blocks = largestBlocks(collective_, ngpus_);
    if (chunksPerLoop_ % blocks != 0) {
      fail(algo, "<algo>: nchunksperloop=\"" + std::to_string(chunksPerLoop_) + "\" is not a multiple of " +
                     std::to_string(blocks) + ": " + collectiveName(collective_) + " on " + std::to_string(ngpus_) +
                     " gpus cuts its largest buffer into " + std::to_string(blocks) + " per-rank blocks");
    }
    chunksPerBlock_ = chunksPerLoop_ / blocks;
    const uint32_t fullInput = largestInputBlocks(collective_, ngpus_) * chunksPerBlock_;
    const uint32_t fullOutput = largestOutputBlocks(collective_, ngpus_) * chunksPerBlock_;
    for (int r = 0; r < ngpus_; ++r) {
      const RawGpu& gpu = gpus_[static_cast<size_t>(r)];
      const uint32_t ownInput = inputBlocks(collective_, ngpus_, r, root_) * chunksPerBlock_;
      const uint32_t ownOutput = outputBlocks(collective_, ngpus_, r, root_) * chunksPerBlock_;
      const auto check = [&](uint32_t declared, uint32_t own, uint32_t full, const char* attr) {
        if (declared == 0 || declared == own || declared == full) return;
        fail(gpu.node, gpu.where + ": " + attr + "=\"" + std::to_string(declared) + "\" is inconsistent with " +
                           collectiveName(collective_) + " on " + std::to_string(ngpus_) +
                           " gpus and nchunksperloop=\"" + std::to_string(chunksPerLoop_) + "\" (" +
                           std::to_string(chunksPerBlock_) + " chunks per rank-sized block): expected " +
                           std::to_string(own) + (full != own ? " or " + std::to_string(full) : std::string()) +
                           " (or 0 when unused)");
      };
      check(gpu.inputChunks, ownInput, fullInput, "i_chunks");
      check(gpu.outputChunks, ownOutput, fullOutput, "o_chunks");
    }
  }

  struct PendingDep {
    const RawStep* from;
    int tb;
    int step;
  };

  Plan build() {
    Plan plan;
    plan.name = name_;
    plan.collective = collective_;
    plan.nranks = ngpus_;
    plan.root = root_;
    plan.chunksPerBlock = chunksPerBlock_;
    plan.inputChunks = largestInputBlocks(collective_, ngpus_) * chunksPerBlock_;
    plan.outputChunks = largestOutputBlocks(collective_, ngpus_) * chunksPerBlock_;
    plan.inPlace = inPlace_;
    plan.outOfPlace = outOfPlace_;
    plan.minBytes = minBytes_;
    plan.maxBytes = maxBytes_;
    plan.ranks.resize(static_cast<size_t>(ngpus_));
    for (int r = 0; r < ngpus_; ++r) {
      const RawGpu& gpu = gpus_[static_cast<size_t>(r)];
      plan.scratchChunks = std::max(plan.scratchChunks, gpu.scratchChunks);
      auto& lanes = plan.ranks[static_cast<size_t>(r)].lanes;
      // planIndex[tb][raw step]: the plan step a raw step became (nops: the real step they fold into).
      std::vector<std::vector<uint32_t>> planIndex(gpu.tbs.size());
      std::vector<std::vector<std::vector<PendingDep>>> pending(gpu.tbs.size());
      for (size_t t = 0; t < gpu.tbs.size(); ++t) {
        const RawTb& tb = gpu.tbs[t];
        Lane lane;
        lane.sendPeer = tb.send;
        lane.recvPeer = tb.recv;
        lane.channel = tb.chan;
        size_t lastReal = 0;  // one past the last real step; later nops stay as Nop steps
        for (size_t k = 0; k < tb.steps.size(); ++k) {
          if (tb.steps[k].kind != StepKind::Nop) lastReal = k + 1;
        }
        std::vector<PendingDep> carried;
        std::vector<size_t> foldedNops;
        planIndex[t].assign(tb.steps.size(), 0);
        for (size_t k = 0; k < tb.steps.size(); ++k) {
          const RawStep& raw = tb.steps[k];
          if (raw.kind == StepKind::Nop && k < lastReal) {
            if (raw.depTb >= 0) carried.push_back({&raw, raw.depTb, raw.depStep});
            foldedNops.push_back(k);
            continue;
          }
          const auto index = static_cast<uint32_t>(lane.steps.size());
          for (size_t nop : foldedNops) planIndex[t][nop] = index;
          foldedNops.clear();
          planIndex[t][k] = index;
          Step step;
          step.kind = raw.kind;
          step.src = raw.src;
          step.dst = raw.dst;
          lane.steps.push_back(std::move(step));
          if (raw.depTb >= 0) carried.push_back({&raw, raw.depTb, raw.depStep});
          pending[t].push_back(std::move(carried));
          carried.clear();
        }
        lanes.push_back(std::move(lane));
      }
      // Resolve dependencies now that every tb's numbering is known.
      for (size_t t = 0; t < gpu.tbs.size(); ++t) {
        for (size_t p = 0; p < pending[t].size(); ++p) {
          for (const PendingDep& dep : pending[t][p]) {
            const RawStep& from = *dep.from;
            if (dep.tb >= static_cast<int>(gpu.tbs.size())) {
              fail(from.node, from.where + ": depid=\"" + std::to_string(dep.tb) + "\" names no tb of " + gpu.where +
                                  " (it has " + std::to_string(gpu.tbs.size()) + ")");
            }
            const RawTb& target = gpu.tbs[static_cast<size_t>(dep.tb)];
            if (dep.step >= static_cast<int>(target.steps.size())) {
              fail(from.node, from.where + ": deps=\"" + std::to_string(dep.step) + "\" but " + target.where +
                                  " has " + std::to_string(target.steps.size()) + " steps");
            }
            const RawStep& targetStep = target.steps[static_cast<size_t>(dep.step)];
            if (targetStep.kind == StepKind::Nop) {
              fail(from.node, from.where + ": depends on " + targetStep.where + ", a nop, which the runtimes never signal");
            }
            if (!targetStep.hasdep) {
              fail(from.node, from.where + ": depends on " + targetStep.where +
                                  ", which has hasdep=\"0\" so the runtimes never signal it");
            }
            const uint32_t targetIndex = planIndex[static_cast<size_t>(dep.tb)][static_cast<size_t>(dep.step)];
            if (static_cast<size_t>(dep.tb) == t) {
              if (targetIndex < p) continue;  // an earlier step of its own lane: implied by order
              fail(from.node, from.where + ": depends on " + targetStep.where + ", which does not come before it in its own tb");
            }
            lanes[t].steps[p].deps.push_back({static_cast<uint16_t>(dep.tb), targetIndex});
          }
        }
      }
    }
    return plan;
  }

  const std::string& text_;
  const std::string& source_;
  std::string name_;
  int ngpus_ = 0;
  Collective collective_ = Collective::AllReduce;
  int nchannels_ = 1;
  bool inPlace_ = false;
  bool outOfPlace_ = false;
  uint64_t minBytes_ = 0;
  uint64_t maxBytes_ = UINT64_MAX;
  uint32_t chunksPerLoop_ = 0;
  uint32_t chunksPerBlock_ = 1;
  int root_ = -1;
  std::vector<RawGpu> gpus_;
};

// ---------------------------------------------------------------------------------------------
// Export

[[noreturn]] void refuse(const Plan& plan, const std::string& message) {
  throwInvalidArgument("MSCCL XML export of plan '" + plan.name + "': " + message);
}

std::string stepText(int rank, size_t lane, size_t step) {
  return "rank " + std::to_string(rank) + " lane " + std::to_string(lane) + " step " + std::to_string(step);
}

const char* mscclCollName(Collective c, bool oldReduceScatterName) {
  if (c == Collective::ReduceScatter) return oldReduceScatterName ? "reduce_scatter" : "reducescatter";
  return collectiveName(c);
}

void setAttr(pugi::xml_node& node, const char* name, const std::string& value) {
  node.append_attribute(name).set_value(value.c_str());
}

void setAttr(pugi::xml_node& node, const char* name, int64_t value) { setAttr(node, name, std::to_string(value)); }

class Writer {
 public:
  Writer(const Plan& plan, const MscclWriteOptions& options) : plan_(plan), options_(options) {}

  std::string write() {
    checkHeader();
    pugi::xml_document doc;
    pugi::xml_node algo = doc.append_child("algo");
    int nchannels = 1;
    for (const RankProgram& rank : plan_.ranks) {
      for (const Lane& lane : rank.lanes) nchannels = std::max(nchannels, lane.channel + 1);
    }
    setAttr(algo, "name", options_.name.empty() ? (plan_.name.empty() ? std::string("topoccl") : plan_.name) : options_.name);
    setAttr(algo, "proto", options_.protocol);
    setAttr(algo, "nchannels", nchannels);
    setAttr(algo, "nchunksperloop", mscclChunksPerLoop(plan_));
    setAttr(algo, "ngpus", plan_.nranks);
    setAttr(algo, "coll", mscclCollName(plan_.collective, options_.oldReduceScatterName));
    setAttr(algo, "inplace", plan_.inPlace ? 1 : 0);
    setAttr(algo, "outofplace", plan_.outOfPlace ? 1 : 0);
    setAttr(algo, "minBytes", std::to_string(plan_.minBytes));
    setAttr(algo, "maxBytes", std::to_string(std::min<uint64_t>(plan_.maxBytes, static_cast<uint64_t>(kInt64Max))));
    if (options_.nthreads > 0) setAttr(algo, "nthreads", options_.nthreads);
    if (isRooted(plan_.collective)) setAttr(algo, "root", plan_.root);
    for (int r = 0; r < plan_.nranks; ++r) writeRank(algo, r);
    std::ostringstream out;
    doc.save(out, "  ", pugi::format_indent | pugi::format_no_declaration, pugi::encoding_utf8);
    return out.str();
  }

 private:
  void checkHeader() {
    if (options_.protocol != "Simple" && options_.protocol != "LL" && options_.protocol != "LL128") {
      refuse(plan_, "protocol '" + options_.protocol + "' is not Simple, LL or LL128");
    }
    if (options_.nthreads < 0 || options_.nthreads % 32 != 0 || options_.nthreads > 1024) {
      refuse(plan_, "nthreads " + std::to_string(options_.nthreads) + " is not a multiple of 32 in 32..1024");
    }
    if (plan_.nranks < 1 || plan_.ranks.size() != static_cast<size_t>(plan_.nranks)) {
      refuse(plan_, "it has nranks " + std::to_string(plan_.nranks) + " but " + std::to_string(plan_.ranks.size()) +
                        " rank programs");
    }
    if (plan_.chunksPerBlock == 0) refuse(plan_, "chunksPerBlock is 0");
    if (isRooted(plan_.collective) && (plan_.root < 0 || plan_.root >= plan_.nranks)) {
      refuse(plan_, "root " + std::to_string(plan_.root) + " is not a rank");
    }
    if (plan_.minBytes > plan_.maxBytes) refuse(plan_, "minBytes is greater than maxBytes");
  }

  void writeRank(pugi::xml_node& algo, int r) {
    const auto& lanes = plan_.ranks[static_cast<size_t>(r)].lanes;
    if (lanes.size() > kMscclMaxTbs) {
      refuse(plan_, "rank " + std::to_string(r) + " has " + std::to_string(lanes.size()) + " lanes; MSCCL allows " +
                        std::to_string(kMscclMaxTbs) + " thread blocks per GPU");
    }
    std::map<int, std::pair<size_t, size_t>> perChannel;  // channel -> (sending tbs, receiving tbs)
    for (size_t l = 0; l < lanes.size(); ++l) {
      const Lane& lane = lanes[l];
      const std::string where = "rank " + std::to_string(r) + " lane " + std::to_string(l);
      if (lane.channel < 0 || lane.channel >= kMscclMaxChannels) {
        refuse(plan_, where + " uses channel " + std::to_string(lane.channel) + "; MSCCL channels are 0.." +
                          std::to_string(kMscclMaxChannels - 1));
      }
      for (int peer : {lane.sendPeer, lane.recvPeer}) {
        if (peer == r) refuse(plan_, where + " names its own rank as a peer");
        if (peer < -1 || peer >= plan_.nranks) refuse(plan_, where + " names peer " + std::to_string(peer) + ", not a rank");
      }
      auto& counts = perChannel[lane.channel];
      if (lane.sendPeer >= 0) ++counts.first;
      if (lane.recvPeer >= 0) ++counts.second;
      if (counts.first > kMscclMaxTbsPerChannel || counts.second > kMscclMaxTbsPerChannel) {
        refuse(plan_, "rank " + std::to_string(r) + " has more than " + std::to_string(kMscclMaxTbsPerChannel) +
                          " sending or receiving lanes on channel " + std::to_string(lane.channel));
      }
    }

    // XML step index of every plan step (nops carrying extra deps come first), and the index the
    // runtimes give its transmission (nops skipped, consecutive compatible re steps fused).
    std::vector<std::vector<size_t>> xmlIndex(lanes.size());
    std::vector<std::vector<size_t>> runtimeIndex(lanes.size());
    std::set<std::pair<size_t, size_t>> targets;
    for (size_t l = 0; l < lanes.size(); ++l) {
      for (size_t s = 0; s < lanes[l].steps.size(); ++s) {
        for (const StepRef& dep : lanes[l].steps[s].deps) {
          if (dep.lane >= lanes.size() || dep.step >= lanes[dep.lane].steps.size()) {
            refuse(plan_, stepText(r, l, s) + " depends on lane " + std::to_string(dep.lane) + " step " +
                              std::to_string(dep.step) + ", which does not exist");
          }
          targets.insert({dep.lane, dep.step});
        }
      }
    }
    for (size_t l = 0; l < lanes.size(); ++l) {
      size_t xml = 0;
      size_t transmissions = 0;
      const Step* fuseHead = nullptr;  // the re step a following compatible re would fuse into
      size_t fuseCount = 0;
      for (size_t s = 0; s < lanes[l].steps.size(); ++s) {
        const Step& step = lanes[l].steps[s];
        const size_t deps = step.deps.size();
        xml += step.kind == StepKind::Nop ? std::max<size_t>(deps, 1) - 1 : (deps > 1 ? deps - 1 : 0);
        xmlIndex[l].push_back(xml);
        ++xml;
        size_t runtime = transmissions;
        if (step.kind != StepKind::Nop) {
          const bool fuses = step.kind == StepKind::Reduce && fuseHead != nullptr && deps == 0 &&
                             fuseHead->dst.buffer == step.dst.buffer && fuseHead->dst.offset == step.dst.offset &&
                             fuseHead->src.buffer == step.src.buffer;
          if (fuses) {
            if (fuseHead->dst.count != step.dst.count) {
              refuse(plan_, stepText(r, l, s) + " is a re the runtimes fuse with the previous re, but its count differs");
            }
            runtime = transmissions - 1;
            ++fuseCount;
          } else {
            ++transmissions;
            fuseHead = step.kind == StepKind::Reduce ? &step : nullptr;
            fuseCount = 1;
          }
          if (targets.count({l, s}) || fuseCount >= 16) fuseHead = nullptr;
        }
        runtimeIndex[l].push_back(runtime);
      }
      if (xml > kMscclMaxStepsPerTb) {
        refuse(plan_, "rank " + std::to_string(r) + " lane " + std::to_string(l) + " needs " + std::to_string(xml) +
                          " MSCCL steps (nops included); MSCCL allows " + std::to_string(kMscclMaxStepsPerTb));
      }
    }
    for (const auto& [l, s] : targets) {
      if (lanes[l].steps[s].kind == StepKind::Nop) {
        refuse(plan_, stepText(r, l, s) + " is a nop something depends on; MSCCL nops are never signalled");
      }
      if (xmlIndex[l][s] != runtimeIndex[l][s]) {
        refuse(plan_, stepText(r, l, s) + " is a dependency target after nop or fused re steps in its lane; the "
                                          "runtimes number its signal " + std::to_string(runtimeIndex[l][s]) +
                                          " but its step index is " + std::to_string(xmlIndex[l][s]));
      }
    }

    pugi::xml_node gpu = algo.append_child("gpu");
    setAttr(gpu, "id", r);
    setAttr(gpu, "i_chunks", inputBlocks(plan_.collective, plan_.nranks, r, plan_.root) * plan_.chunksPerBlock);
    setAttr(gpu, "o_chunks", outputBlocks(plan_.collective, plan_.nranks, r, plan_.root) * plan_.chunksPerBlock);
    setAttr(gpu, "s_chunks", plan_.scratchChunks);
    for (size_t l = 0; l < lanes.size(); ++l) {
      const Lane& lane = lanes[l];
      pugi::xml_node tb = gpu.append_child("tb");
      setAttr(tb, "id", static_cast<int64_t>(l));
      setAttr(tb, "send", lane.sendPeer);
      setAttr(tb, "recv", lane.recvPeer);
      setAttr(tb, "chan", lane.channel);
      size_t index = 0;
      for (size_t s = 0; s < lane.steps.size(); ++s) {
        const Step& step = lane.steps[s];
        const auto depAttrs = [&](pugi::xml_node& node, const StepRef* dep) {
          setAttr(node, "depid", dep ? static_cast<int64_t>(dep->lane) : -1);
          setAttr(node, "deps", dep ? static_cast<int64_t>(xmlIndex[dep->lane][dep->step]) : -1);
        };
        const auto nopStep = [&](const StepRef* dep) {
          pugi::xml_node node = tb.append_child("step");
          setAttr(node, "s", static_cast<int64_t>(index++));
          setAttr(node, "type", "nop");
          setAttr(node, "srcbuf", "i");
          setAttr(node, "srcoff", -1);
          setAttr(node, "dstbuf", "o");
          setAttr(node, "dstoff", -1);
          setAttr(node, "cnt", 0);
          depAttrs(node, dep);
          setAttr(node, "hasdep", 0);
        };
        if (step.kind == StepKind::Nop) {
          if (step.deps.empty()) nopStep(nullptr);
          for (const StepRef& dep : step.deps) nopStep(&dep);
          continue;
        }
        for (size_t d = 0; d + 1 < step.deps.size(); ++d) nopStep(&step.deps[d]);
        const bool reads = stepReads(step.kind);
        const bool writes = stepWrites(step.kind);
        if (reads && writes && step.src.count != step.dst.count) {
          refuse(plan_, stepText(r, l, s) + " moves " + std::to_string(step.src.count) + " chunks into " +
                            std::to_string(step.dst.count) + "; an MSCCL step has one cnt");
        }
        const uint32_t cnt = writes ? step.dst.count : step.src.count;
        if (cnt < 1 || cnt >= kMscclMaxCount) {
          refuse(plan_, stepText(r, l, s) + " moves " + std::to_string(cnt) + " chunks; MSCCL's cnt is 1.." +
                            std::to_string(kMscclMaxCount - 1));
        }
        if (stepSends(step.kind) && lane.sendPeer < 0) refuse(plan_, stepText(r, l, s) + " sends, but its lane has no send peer");
        if (stepReceives(step.kind) && lane.recvPeer < 0) {
          refuse(plan_, stepText(r, l, s) + " receives, but its lane has no receive peer");
        }
        pugi::xml_node node = tb.append_child("step");
        setAttr(node, "s", static_cast<int64_t>(index++));
        setAttr(node, "type", stepKindName(step.kind));
        setAttr(node, "srcbuf", reads ? bufferLetter(step.src.buffer) : "i");
        setAttr(node, "srcoff", reads ? static_cast<int64_t>(step.src.offset) : -1);
        setAttr(node, "dstbuf", writes ? bufferLetter(step.dst.buffer) : "o");
        setAttr(node, "dstoff", writes ? static_cast<int64_t>(step.dst.offset) : -1);
        setAttr(node, "cnt", cnt);
        depAttrs(node, step.deps.empty() ? nullptr : &step.deps.back());
        setAttr(node, "hasdep", targets.count({l, s}) ? 1 : 0);
      }
    }
  }

  const Plan& plan_;
  const MscclWriteOptions& options_;
};

}  // namespace

uint32_t mscclChunksPerLoop(const Plan& plan) noexcept {
  return plan.chunksPerBlock * largestBlocks(plan.collective, plan.nranks);
}

Plan parseMscclXml(const std::string& text, const std::string& sourceName) {
  return Reader(text, sourceName).read();
}

Plan loadMscclXml(const std::string& path) { return parseMscclXml(topo::readTextFile(path), path); }

std::string writeMscclXml(const Plan& plan, const MscclWriteOptions& options) {
  return Writer(plan, options).write();
}

}  // namespace topoccl::algo
