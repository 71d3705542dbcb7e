#include "algorithms/generators.hpp"

#include <algorithm>
#include <bit>
#include <cctype>
#include <map>
#include <string>
#include <utility>

#include "common/error.hpp"

namespace topoccl::algo {
namespace {

bool isRooted(Collective c) {
  return c == Collective::Broadcast || c == Collective::Reduce || c == Collective::Gather ||
         c == Collective::Scatter;
}

ChunkRange input(uint32_t offset, uint32_t count = 1) { return {BufferId::Input, offset, count}; }
ChunkRange output(uint32_t offset, uint32_t count = 1) { return {BufferId::Output, offset, count}; }
ChunkRange scratch(uint32_t offset, uint32_t count = 1) { return {BufferId::Scratch, offset, count}; }

Step send(ChunkRange src) { return {StepKind::Send, src, {}, {}}; }
Step recv(ChunkRange dst) { return {StepKind::Recv, {}, dst, {}}; }
Step recvReduceSend(ChunkRange src) { return {StepKind::RecvReduceSend, src, {}, {}}; }
Step recvReduceCopy(ChunkRange src, ChunkRange dst) { return {StepKind::RecvReduceCopy, src, dst, {}}; }
Step recvCopySend(ChunkRange dst) { return {StepKind::RecvCopySend, {}, dst, {}}; }
Step recvReduceCopySend(ChunkRange src, ChunkRange dst) { return {StepKind::RecvReduceCopySend, src, dst, {}}; }
Step copy(ChunkRange src, ChunkRange dst) { return {StepKind::Copy, src, dst, {}}; }

Step after(Step step, std::optional<StepRef> dep) {
  if (dep) step.deps.push_back(*dep);
  return step;
}

int mod(int x, int n) { return ((x % n) + n) % n; }

// Accumulates lanes and steps, then fills in the header.
class PlanBuilder {
 public:
  PlanBuilder(Algorithm algorithm, Collective c, int nranks, int root, uint32_t chunksPerBlock) {
    plan_.name = algorithmName(algorithm);
    plan_.collective = c;
    plan_.nranks = nranks;
    plan_.root = isRooted(c) ? root : -1;
    plan_.chunksPerBlock = chunksPerBlock;
    plan_.ranks.resize(static_cast<size_t>(nranks));
    for (int r = 0; r < nranks; ++r) {
      plan_.inputChunks = std::max(plan_.inputChunks, inputBlocks(c, nranks, r, plan_.root) * chunksPerBlock);
      plan_.outputChunks = std::max(plan_.outputChunks, outputBlocks(c, nranks, r, plan_.root) * chunksPerBlock);
    }
  }

  uint16_t addLane(int rank, int sendPeer, int recvPeer, int channel = 0) {
    auto& lanes = plan_.ranks[static_cast<size_t>(rank)].lanes;
    lanes.push_back({sendPeer, recvPeer, channel, {}});
    return static_cast<uint16_t>(lanes.size() - 1);
  }

  StepRef add(int rank, uint16_t lane, Step step) {
    auto& steps = plan_.ranks[static_cast<size_t>(rank)].lanes[lane].steps;
    steps.push_back(std::move(step));
    return {lane, static_cast<uint32_t>(steps.size() - 1)};
  }

  Step& step(int rank, StepRef ref) { return plan_.ranks[static_cast<size_t>(rank)].lanes[ref.lane].steps[ref.step]; }

  void useScratch(uint32_t chunks) { plan_.scratchChunks = std::max(plan_.scratchChunks, chunks); }

  Plan finish(bool validInPlace, bool validOutOfPlace) {
    plan_.inPlace = validInPlace;
    plan_.outOfPlace = validOutOfPlace;
    return std::move(plan_);
  }

 private:
  Plan plan_;
};

void checkArguments(Algorithm algorithm, Collective c, int nranks, int root, int nchannels) {
  const std::string what = std::string(algorithmName(algorithm)) + " " + collectiveName(c);
  if (!algorithmSupports(algorithm, c)) {
    throwInvalidArgument("algorithm " + std::string(algorithmName(algorithm)) + " does not implement " +
                         collectiveName(c));
  }
  if (nranks < 1) throwInvalidArgument(what + ": nranks " + std::to_string(nranks) + " must be at least 1");
  if (isRooted(c) && (root < 0 || root >= nranks)) {
    throwInvalidArgument(what + ": root " + std::to_string(root) + " is not a rank in 0.." + std::to_string(nranks - 1));
  }
  if (nchannels < 1 || nchannels > kMaxChannels) {
    throwInvalidArgument(what + ": nchannels " + std::to_string(nchannels) + " must be in 1.." +
                         std::to_string(kMaxChannels));
  }
}

// One rank: the output is the input. In place there is nothing to do at all.
Plan singleRankPlan(Algorithm algorithm, Collective c, Placement placement) {
  PlanBuilder b(algorithm, c, 1, 0, 1);
  if (placement != Placement::InPlace) {
    const uint16_t lane = b.addLane(0, -1, -1);
    b.add(0, lane, copy(input(0), output(0)));
  }
  return b.finish(true, placement != Placement::InPlace);
}

// Ring order for a channel: even channels go 0,1,..,n-1 and odd ones the other way.
std::vector<int> ringOrder(int nranks, int channel, int first) {
  std::vector<int> order(static_cast<size_t>(nranks));
  for (int i = 0; i < nranks; ++i) order[static_cast<size_t>(i)] = mod(channel % 2 == 0 ? first + i : first - i, nranks);
  return order;
}

std::vector<int> positionsOf(const std::vector<int>& order) {
  std::vector<int> pos(order.size());
  for (size_t i = 0; i < order.size(); ++i) pos[static_cast<size_t>(order[i])] = static_cast<int>(i);
  return pos;
}

// ---- ring -----------------------------------------------------------------------------------

// Chunk layout: channel ch owns parts [ch*n, (ch+1)*n) of the single block; part ch*n + j is
// reduced by the rank at ring position j. Reduce-scatter: a part starts one position after its
// owner and travels the ring, each rank adding its input (rrs), the owner finishing it (rrcs) and
// starting the all-gather, which forwards it (rcs) until the rank before the owner stores it (r).
void ringAllReduce(PlanBuilder& b, int n, int nchannels) {
  for (int ch = 0; ch < nchannels; ++ch) {
    const std::vector<int> order = ringOrder(n, ch, 0);
    const std::vector<int> pos = positionsOf(order);
    for (int r = 0; r < n; ++r) {
      const int i = pos[static_cast<size_t>(r)];
      const auto part = [&](int x) { return static_cast<uint32_t>(ch * n + mod(x, n)); };
      const int next = order[static_cast<size_t>(mod(i + 1, n))];
      const int prev = order[static_cast<size_t>(mod(i - 1, n))];
      const uint16_t lane = b.addLane(r, next, prev, ch);
      const StepRef sent = b.add(r, lane, send(input(part(i - 1))));
      for (int s = 1; s <= n - 2; ++s) b.add(r, lane, recvReduceSend(input(part(i - 1 - s))));
      const StepRef finished = b.add(r, lane, recvReduceCopySend(input(part(i)), output(part(i))));
      for (int t = 1; t <= n - 2; ++t) b.add(r, lane, recvCopySend(output(part(i - t))));
      const StepRef gathered = b.add(r, lane, recv(output(part(i + 1))));
      if (n == 2) {
        // The peer finishes the part we send and sends it straight back: where it may, it writes it into our output
        // as it reduces (Step::resultReturnsIn), and neither its forward nor our receive moves those slices.
        b.step(r, sent).resultReturnsIn = gathered;
        b.step(r, finished).sendsResultOf = finished;
      }
    }
  }
}

// Chunk layout: block b (rank b's data) has one part per channel.
void ringAllGather(PlanBuilder& b, int n, int nchannels, Placement placement) {
  const auto cpb = static_cast<uint32_t>(nchannels);
  for (int ch = 0; ch < nchannels; ++ch) {
    const std::vector<int> order = ringOrder(n, ch, 0);
    const std::vector<int> pos = positionsOf(order);
    for (int r = 0; r < n; ++r) {
      const int i = pos[static_cast<size_t>(r)];
      const auto blockOf = [&](int x) {
        return output(static_cast<uint32_t>(order[static_cast<size_t>(mod(x, n))]) * cpb + static_cast<uint32_t>(ch));
      };
      const uint16_t lane = b.addLane(r, order[static_cast<size_t>(mod(i + 1, n))],
                                      order[static_cast<size_t>(mod(i - 1, n))], ch);
      b.add(r, lane, send(input(static_cast<uint32_t>(ch))));
      for (int t = 1; t <= n - 2; ++t) b.add(r, lane, recvCopySend(blockOf(i - t)));
      b.add(r, lane, recv(blockOf(i - (n - 1))));
      // Own block last: it overlaps nothing in flight, and in place it is the same memory.
      if (placement != Placement::InPlace) b.add(r, lane, copy(input(static_cast<uint32_t>(ch)), blockOf(i)));
    }
  }
}

void ringReduceScatter(PlanBuilder& b, int n, int nchannels) {
  const auto cpb = static_cast<uint32_t>(nchannels);
  for (int ch = 0; ch < nchannels; ++ch) {
    const std::vector<int> order = ringOrder(n, ch, 0);
    const std::vector<int> pos = positionsOf(order);
    for (int r = 0; r < n; ++r) {
      const int i = pos[static_cast<size_t>(r)];
      const auto blockOf = [&](int x) {
        return input(static_cast<uint32_t>(order[static_cast<size_t>(mod(x, n))]) * cpb + static_cast<uint32_t>(ch));
      };
      const uint16_t lane = b.addLane(r, order[static_cast<size_t>(mod(i + 1, n))],
                                      order[static_cast<size_t>(mod(i - 1, n))], ch);
      b.add(r, lane, send(blockOf(i - 1)));
      for (int s = 1; s <= n - 2; ++s) b.add(r, lane, recvReduceSend(blockOf(i - 1 - s)));
      b.add(r, lane, recvReduceCopy(blockOf(i), output(static_cast<uint32_t>(ch))));
    }
  }
}

// A chain from the root (position 0) through every rank; each channel carries one part.
void ringBroadcast(PlanBuilder& b, int n, int root, int nchannels, Placement placement) {
  for (int ch = 0; ch < nchannels; ++ch) {
    const std::vector<int> order = ringOrder(n, ch, root);
    const auto part = static_cast<uint32_t>(ch);
    for (int i = 0; i < n; ++i) {
      const int r = order[static_cast<size_t>(i)];
      const int next = i + 1 < n ? order[static_cast<size_t>(i + 1)] : -1;
      const int prev = i > 0 ? order[static_cast<size_t>(i - 1)] : -1;
      const uint16_t lane = b.addLane(r, next, prev, ch);
      if (i == 0) {
        b.add(r, lane, send(input(part)));
        if (placement != Placement::InPlace) b.add(r, lane, copy(input(part), output(part)));
      } else {
        b.add(r, lane, next >= 0 ? recvCopySend(output(part)) : recv(output(part)));
      }
    }
  }
}

// A chain ending at the root (last position); each rank adds its input on the way.
void ringReduce(PlanBuilder& b, int n, int root, int nchannels) {
  for (int ch = 0; ch < nchannels; ++ch) {
    const std::vector<int> order = ringOrder(n, ch, ch % 2 == 0 ? root + 1 : root - 1);
    const auto part = static_cast<uint32_t>(ch);
    for (int i = 0; i < n; ++i) {
      const int r = order[static_cast<size_t>(i)];
      const int next = i + 1 < n ? order[static_cast<size_t>(i + 1)] : -1;
      const int prev = i > 0 ? order[static_cast<size_t>(i - 1)] : -1;
      const uint16_t lane = b.addLane(r, next, prev, ch);
      if (i == 0) {
        b.add(r, lane, send(input(part)));
      } else if (next >= 0) {
        b.add(r, lane, recvReduceSend(input(part)));
      } else {
        b.add(r, lane, recvReduceCopy(input(part), output(part)));
      }
    }
  }
}

// ---- recursive doubling -----------------------------------------------------------------------

// P = the largest power of two <= n. Rank e >= P first sends its input to e - P, which adds it;
// the P core ranks then exchange and add with partner r ^ 2^d for each round d; finally each
// folded core rank sends the result back to its extra rank. Every round writes a fresh scratch
// slot, so no round overwrites data its partner may still be reading. The last round writes the
// output directly, except when both partners would also be reading their input in it (2 ranks):
// in place the output is the input in flight, so each would wait for the other; they stage
// through scratch instead.
Plan recursiveDoublingAllReduce(int n, Placement placement) {
  PlanBuilder b(Algorithm::RecursiveDoubling, Collective::AllReduce, n, -1, 1);
  const int core = static_cast<int>(std::bit_floor(static_cast<unsigned>(n)));
  const int rounds = std::countr_zero(static_cast<unsigned>(core));
  bool stagedSomewhere = false;
  bool needsStaging = false;
  for (int r = 0; r < n; ++r) {
    if (r >= core) {
      const uint16_t lane = b.addLane(r, r - core, r - core);
      b.add(r, lane, send(input(0)));
      b.add(r, lane, recv(output(0)));
      continue;
    }
    const int extra = r + core;
    const bool folded = extra < n;
    std::optional<StepRef> ready;  // the step that produced `current`
    ChunkRange current = input(0);
    uint16_t foldLane = 0;
    if (folded) {
      foldLane = b.addLane(r, extra, extra);
      current = scratch(0);
      ready = b.add(r, foldLane, recvReduceCopy(input(0), current));
    }
    for (int d = 0; d < rounds; ++d) {
      const int partner = r ^ (1 << d);
      const uint16_t lane = b.addLane(r, partner, partner);
      b.add(r, lane, after(send(current), ready));
      const bool last = d == rounds - 1;
      // Both partners reading their input in the last round: each one's output write would wait
      // for the other to take its input first. (A folded partner reads scratch and never waits.)
      const bool bothReadInput = last && current.buffer == BufferId::Input && rounds == 1 && partner + core >= n;
      needsStaging = needsStaging || bothReadInput;
      const bool staged = bothReadInput && placement != Placement::OutOfPlace;
      const ChunkRange next = last && !staged ? output(0) : scratch(static_cast<uint32_t>(d + 1));
      ready = b.add(r, lane, recvReduceCopy(current, next));
      if (staged) {
        ready = b.add(r, lane, copy(next, output(0)));
        stagedSomewhere = true;
      }
      if (next.buffer == BufferId::Scratch) b.useScratch(next.offset + 1);
      current = next;
    }
    if (folded) {
      b.useScratch(1);
      b.add(r, foldLane, after(send(output(0)), ready));
    }
  }
  return b.finish(stagedSomewhere || !needsStaging, true);
}

// All-gather in ceil(log2 n) rounds. On a power of two, recursive doubling: in round k a rank trades the 2^k
// blocks it holds with rank r ^ 2^k. Otherwise Bruck's doubling: in round k a rank sends the blocks it holds,
// [r, r + c) mod n with c = min(2^k, n - 2^k), to r - 2^k and receives [r + 2^k, r + 2^k + c) from r + 2^k, straight
// into their places in the output (no final rotation); a span that wraps past block n-1 travels as two messages,
// cut at the same place on both ends. Each round has its own lane: 2^k is below n, so no two rounds share a pair.
void doublingAllGather(PlanBuilder& b, int n, Placement placement) {
  const auto blocks = static_cast<uint32_t>(n);
  const auto pieces = [&](int first, int count) {
    const auto start = static_cast<uint32_t>(mod(first, n));
    const auto length = static_cast<uint32_t>(count);
    if (start + length <= blocks) return std::vector<ChunkRange>{output(start, length)};
    return std::vector<ChunkRange>{output(start, blocks - start), output(0, start + length - blocks)};
  };
  for (int r = 0; r < n; ++r) {
    std::optional<StepRef> lastArrival;  // the previous round's last receive: what this round sends is in by then
    for (int distance = 1; distance < n; distance *= 2) {
      // Held so far: blocks [first, first + distance) mod n; the peer's are the same span `distance` further on.
      // On a power of two the peer is r ^ distance, both ways, and the spans are aligned, so they never wrap.
      const int count = std::min(distance, n - distance);
      const bool pairwise = std::has_single_bit(static_cast<unsigned>(n));
      const int first = pairwise ? r & ~(distance - 1) : r;
      const int from = pairwise ? r ^ distance : mod(r + distance, n);
      const int to = pairwise ? from : mod(r - distance, n);
      const uint16_t lane = b.addLane(r, to, from);
      if (distance == 1) {
        // The rank's own block, sent from the input; its copy into the output goes before the first receive, so
        // that every later round, which waits on a receive, finds it there.
        b.add(r, lane, send(input(0)));
        if (placement != Placement::InPlace) b.add(r, lane, copy(input(0), output(static_cast<uint32_t>(r))));
      } else {
        for (const ChunkRange& piece : pieces(first, count)) b.add(r, lane, after(send(piece), lastArrival));
      }
      const int theirs = pairwise ? from & ~(distance - 1) : first + distance;
      for (const ChunkRange& piece : pieces(theirs, count)) lastArrival = b.add(r, lane, recv(piece));
    }
  }
}

// ---- halving-doubling (Rabenseifner) ------------------------------------------------------------

// The block is cut into `core` parts (core = the largest power of two <= n). Reduce-scatter by recursive
// halving: in round d a rank trades half of the parts it still reduces with the rank 2^(rounds-1-d) away,
// keeping the half its own bit selects, so it ends with part r summed. All-gather by recursive doubling
// retraces the rounds nearest first, each rank sending all it has. A rank talks to each partner on one
// lane (both phases), so every connection carries its messages in one order. Ranks r >= core fold their
// input into r - core first and get the result back at the end, as in recursive doubling.
// In place, no round writes what a partner may still be reading except the all-gather's receives, which
// wait for the reduce-scatter sends of the same parts (the executor's write-after-read tracking).
Plan halvingDoublingAllReduce(int n) {
  const int core = static_cast<int>(std::bit_floor(static_cast<unsigned>(n)));
  const int rounds = std::countr_zero(static_cast<unsigned>(core));
  const auto parts = static_cast<uint32_t>(core);
  PlanBuilder b(Algorithm::HalvingDoubling, Collective::AllReduce, n, -1, parts);
  for (int r = 0; r < n; ++r) {
    if (r >= core) {
      const uint16_t lane = b.addLane(r, r - core, r - core);
      b.add(r, lane, send(input(0, parts)));
      b.add(r, lane, recv(output(0, parts)));
      continue;
    }
    const int extra = r + core;
    const bool folded = extra < n;
    std::optional<StepRef> ready;  // the step that produced what the next round reads
    BufferId current = BufferId::Input;
    uint16_t foldLane = 0;
    if (folded) {
      foldLane = b.addLane(r, extra, extra);
      ready = b.add(r, foldLane, recvReduceCopy(input(0, parts), scratch(0, parts)));
      b.useScratch(parts);
      current = BufferId::Scratch;
    }
    std::vector<uint16_t> laneOf(static_cast<size_t>(rounds));
    uint32_t lo = 0, len = parts;
    // A step waits for the one that produced its data unless that ran earlier on its own lane.
    const auto afterReady = [&](Step step, uint16_t lane) {
      return ready && ready->lane == lane ? step : after(std::move(step), ready);
    };
    for (int d = 0; d < rounds; ++d) {
      const int distance = core >> (d + 1);
      const int partner = r ^ distance;
      laneOf[static_cast<size_t>(d)] = b.addLane(r, partner, partner);
      len /= 2;
      const bool keepUpper = (r & distance) != 0;
      const uint32_t keep = keepUpper ? lo + len : lo, give = keepUpper ? lo : lo + len;
      b.add(r, laneOf[static_cast<size_t>(d)], afterReady(send({current, give, len}), laneOf[static_cast<size_t>(d)]));
      ready = b.add(r, laneOf[static_cast<size_t>(d)], recvReduceCopy({current, keep, len}, output(keep, len)));
      lo = keep;
      current = BufferId::Output;
    }
    for (int d = rounds - 1; d >= 0; --d) {
      const int distance = core >> (d + 1);
      const uint16_t lane = laneOf[static_cast<size_t>(d)];
      b.add(r, lane, afterReady(send(output(lo, len)), lane));
      const uint32_t theirs = lo ^ static_cast<uint32_t>(distance);
      ready = b.add(r, lane, recv(output(theirs, len)));
      lo = std::min(lo, theirs);
      len *= 2;
    }
    if (folded) b.add(r, foldLane, afterReady(send(output(0, parts)), foldLane));
  }
  return b.finish(true, true);
}

// Reduce-scatter by recursive halving, the first half of the all-reduce above: in round d a rank sends the partial
// sums of half the blocks it still reduces to the rank 2^(rounds-1-d) away and adds that rank's sums of the other
// half into its own, ending with block r summed. Ranks r >= core first send their whole input to r - core, which
// adds it; its halving then carries block g + core beside block g (a second message where it exists), and at the
// end it sends block r + core to that rank.
void halvingReduceScatter(PlanBuilder& b, int n) {
  const int core = static_cast<int>(std::bit_floor(static_cast<unsigned>(n)));
  const int rounds = std::countr_zero(static_cast<unsigned>(core));
  const auto blocks = static_cast<uint32_t>(n);
  // Blocks [lo, lo + len) and, where ranks beyond the core own them, the same span `core` further on.
  const auto pieces = [&](uint32_t lo, uint32_t len) {
    std::vector<std::pair<uint32_t, uint32_t>> spans{{lo, len}};
    const uint32_t far = lo + static_cast<uint32_t>(core);
    if (far < blocks) spans.emplace_back(far, std::min(len, blocks - far));
    return spans;
  };
  for (int r = 0; r < n; ++r) {
    if (r >= core) {
      const uint16_t lane = b.addLane(r, r - core, r - core);
      b.add(r, lane, send(input(0, blocks)));
      b.add(r, lane, recv(output(0)));
      continue;
    }
    const int extra = r + core;
    const bool folded = extra < n;
    std::optional<StepRef> ready;
    BufferId current = BufferId::Input;
    uint16_t foldLane = 0;
    const auto afterReady = [&](Step step, uint16_t lane) {
      return ready && ready->lane == lane ? step : after(std::move(step), ready);
    };
    if (folded) {
      foldLane = b.addLane(r, extra, extra);
      ready = b.add(r, foldLane, recvReduceCopy(input(0, blocks), scratch(0, blocks)));
      current = BufferId::Scratch;
    }
    b.useScratch(blocks);
    uint32_t lo = 0, len = static_cast<uint32_t>(core);
    for (int d = 0; d < rounds; ++d) {
      const int distance = core >> (d + 1);
      const int partner = r ^ distance;
      const uint16_t lane = b.addLane(r, partner, partner);
      len /= 2;
      const bool keepUpper = (r & distance) != 0;
      const uint32_t keep = keepUpper ? lo + len : lo, give = keepUpper ? lo : lo + len;
      bool first = true;
      for (const auto& [at, count] : pieces(give, len)) {
        b.add(r, lane, first ? afterReady(send({current, at, count}), lane) : send({current, at, count}));
        first = false;
      }
      const bool last = d == rounds - 1;
      for (const auto& [at, count] : pieces(keep, len)) {
        const ChunkRange into = last && at == static_cast<uint32_t>(r) ? output(0) : scratch(at, count);
        ready = b.add(r, lane, recvReduceCopy({current, at, count}, into));
      }
      lo = keep;
      current = BufferId::Scratch;
    }
    if (folded) b.add(r, foldLane, afterReady(send(scratch(static_cast<uint32_t>(extra))), foldLane));
  }
}

// ---- binomial trees -------------------------------------------------------------------------

int lowestBit(int v) { return v & -v; }

// Children of relative rank v in the binomial tree rooted at 0, farthest (largest subtree) first.
std::vector<int> binomialChildren(int v, int n) {
  std::vector<int> children;
  const int limit = v == 0 ? n : lowestBit(v);
  for (int mask = static_cast<int>(std::bit_floor(static_cast<unsigned>(std::max(limit - 1, 1)))); mask >= 1;
       mask >>= 1) {
    if (mask < limit && v + mask < n) children.push_back(v + mask);
  }
  return children;
}

// Relative rank -> its position in the tree: the identity, or its bits reversed (interleavedTreeBroadcast).
int reverseBits(int v, int bits) {
  int out = 0;
  for (int i = 0; i < bits; ++i)
    if ((v >> i) & 1) out |= 1 << (bits - 1 - i);
  return out;
}

void treeBroadcast(PlanBuilder& b, int n, int root, Placement placement, bool bitReversed = false) {
  const int bits = std::countr_zero(static_cast<unsigned>(n));  // used only when n is a power of two
  const auto shuffle = [&](int v) { return bitReversed ? reverseBits(v, bits) : v; };  // an involution
  for (int r = 0; r < n; ++r) {
    const int v = shuffle(mod(r - root, n));
    const auto rankOf = [&](int rel) { return mod(shuffle(rel) + root, n); };
    const std::vector<int> children = binomialChildren(v, n);
    if (v == 0) {
      for (size_t k = 0; k < children.size(); ++k) {
        const uint16_t lane = b.addLane(r, rankOf(children[k]), -1);
        b.add(r, lane, send(input(0)));
        if (k == 0 && placement != Placement::InPlace) b.add(r, lane, copy(input(0), output(0)));
      }
      continue;
    }
    // The first (largest) child is fed slice by slice as data arrives; the others once it is in.
    const int parent = rankOf(v - lowestBit(v));
    const int firstChild = children.empty() ? -1 : rankOf(children[0]);
    const uint16_t lane = b.addLane(r, firstChild, parent);
    const StepRef received = b.add(r, lane, children.empty() ? recv(output(0)) : recvCopySend(output(0)));
    for (size_t k = 1; k < children.size(); ++k) {
      const uint16_t childLane = b.addLane(r, rankOf(children[k]), -1);
      b.add(r, childLane, after(send(output(0)), received));
    }
  }
}

// Children are drained nearest (smallest subtree, done first) to farthest; the accumulator is the
// output at the root and a scratch chunk elsewhere (non-roots have no output buffer).
void treeReduce(PlanBuilder& b, int n, int root) {
  for (int r = 0; r < n; ++r) {
    const int v = mod(r - root, n);
    const auto rankOf = [&](int rel) { return mod(rel + root, n); };
    std::vector<int> children = binomialChildren(v, n);
    std::reverse(children.begin(), children.end());
    const int parent = v == 0 ? -1 : rankOf(v - lowestBit(v));
    if (children.empty()) {
      const uint16_t lane = b.addLane(r, parent, -1);
      b.add(r, lane, send(input(0)));
      continue;
    }
    const ChunkRange accumulator = v == 0 ? output(0) : scratch(0);
    ChunkRange current = input(0);
    std::optional<StepRef> ready;
    for (size_t k = 0; k < children.size(); ++k) {
      const bool last = k + 1 == children.size();
      const int child = rankOf(children[k]);
      if (last && v != 0) {
        const uint16_t lane = b.addLane(r, parent, child);
        b.add(r, lane, after(recvReduceSend(current), ready));
      } else {
        const uint16_t lane = b.addLane(r, -1, child);
        ready = b.add(r, lane, after(recvReduceCopy(current, accumulator), ready));
        current = accumulator;
        if (accumulator.buffer == BufferId::Scratch) b.useScratch(1);
      }
    }
  }
}

// ---- direct -------------------------------------------------------------------------------

// Peers in the order r+1, r+2, ...: every rank starts with a different partner.
std::vector<int> peersOf(int r, int n) {
  std::vector<int> peers;
  for (int k = 1; k < n; ++k) peers.push_back(mod(r + k, n));
  return peers;
}

// Block q of every rank goes to rank q, cut into one chunk per channel, each on its own lane (a GPU moves a
// block's bytes with as many thread blocks as there are lanes); the rank's own block is copied chunk by chunk.
void directAllToAll(PlanBuilder& b, int n, int nchannels, bool staged, Placement placement) {
  const auto channels = static_cast<uint32_t>(nchannels);
  for (int r = 0; r < n; ++r) {
    for (int q : peersOf(r, n)) {
      for (uint32_t ch = 0; ch < channels; ++ch) {
        const uint32_t chunk = static_cast<uint32_t>(q) * channels + ch;
        const uint16_t lane = b.addLane(r, q, q, static_cast<int>(ch));
        b.add(r, lane, send(input(chunk)));
        if (staged) {
          // In place, output chunk q is the input chunk q being sent; land in scratch until it is taken.
          b.add(r, lane, recv(scratch(chunk)));
          b.add(r, lane, copy(scratch(chunk), output(chunk)));
          b.useScratch(static_cast<uint32_t>(n) * channels);
        } else {
          b.add(r, lane, recv(output(chunk)));
        }
      }
    }
    if (placement != Placement::InPlace) {
      for (uint32_t ch = 0; ch < channels; ++ch) {
        const uint32_t chunk = static_cast<uint32_t>(r) * channels + ch;
        b.add(r, b.addLane(r, -1, -1, static_cast<int>(ch)), copy(input(chunk), output(chunk)));
      }
    }
  }
}

// All-to-all in ceil(log2 n) rounds. Item (s, d) is rank s's block for rank d. On a power of two, round k sends
// every item whose holder differs from d in bit k to the holder ^ 2^k (the pairwise hypercube); elsewhere, Bruck's:
// round k moves on by 2^k, to r + 2^k, every item whose distance (d - s) mod n has bit k set. Every rank then
// sends and receives ceil(log2 n) messages instead of n - 1, for copies on each side: a round's items travel as
// one message, packed into scratch unless they already lie in order in one buffer, and received into scratch
// unless all of them end here, in order, in consecutive output blocks. In place, the input is first copied to
// scratch: the output blocks that receives write are input blocks still to be sent.
// Returns whether the plan is also valid in place.
bool doublingAllToAll(PlanBuilder& b, int n, Placement placement) {
  using Item = std::pair<int, int>;  // (source, destination)
  const bool pairwise = std::has_single_bit(static_cast<unsigned>(n));
  const bool staged = placement != Placement::OutOfPlace;
  std::vector<std::map<Item, ChunkRange>> held(static_cast<size_t>(n));  // where each rank holds each item
  std::vector<uint32_t> scratchUsed(static_cast<size_t>(n), staged ? static_cast<uint32_t>(n) : 0);
  std::vector<std::optional<StepRef>> previousRound(static_cast<size_t>(n));
  // In place, output block s is input block s: a write into it must not come before this rank's block for s is
  // read. A receive after the round's send of that very block would wait for the peer to take it while the peer's
  // receive waits likewise on ours; a copy after the receive only waits, and a pack copy is done by then.
  struct OutputWrite {
    int rank, block, round;
    bool byReceive;
  };
  std::vector<OutputWrite> outputWrites;
  struct InputRead {
    int round = 0;
    bool bySend = false;  // straight from the input (else copied into a pack first)
  };
  std::vector<InputRead> inputRead(static_cast<size_t>(n * n));
  if (staged) b.useScratch(static_cast<uint32_t>(n));
  for (int r = 0; r < n; ++r) {
    for (int d = 0; d < n; ++d) {
      if (d == r) continue;
      const auto block = static_cast<uint32_t>(d);
      held[static_cast<size_t>(r)][{r, d}] = staged ? scratch(block) : input(block);
    }
    if (placement != Placement::InPlace) {
      b.add(r, b.addLane(r, -1, -1), copy(input(static_cast<uint32_t>(r)), output(static_cast<uint32_t>(r))));
    }
  }
  const auto moves = [&](int holder, const Item& item, int distance) {
    const auto [s, d] = item;
    return pairwise ? ((holder ^ d) & distance) != 0 : (mod(d - s, n) & distance) != 0;
  };
  const auto takeScratch = [&](int r, size_t count) {
    const uint32_t offset = scratchUsed[static_cast<size_t>(r)];
    scratchUsed[static_cast<size_t>(r)] += static_cast<uint32_t>(count);
    b.useScratch(scratchUsed[static_cast<size_t>(r)]);
    return offset;
  };
  for (int distance = 1, round = 0; distance < n; distance *= 2, ++round) {
    // What each rank sends this round, in (destination, source) order, from the holdings before it.
    std::vector<std::vector<Item>> outgoing(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      for (const auto& [item, where] : held[static_cast<size_t>(r)]) {
        if (moves(r, item, distance)) outgoing[static_cast<size_t>(r)].push_back(item);
      }
      std::sort(outgoing[static_cast<size_t>(r)].begin(), outgoing[static_cast<size_t>(r)].end(),
                [](const Item& x, const Item& y) { return std::pair(x.second, x.first) < std::pair(y.second, y.first); });
    }
    std::vector<std::map<Item, ChunkRange>> next = held;
    for (int r = 0; r < n; ++r) {
      const int to = pairwise ? r ^ distance : mod(r + distance, n);
      const int from = pairwise ? r ^ distance : mod(r - distance, n);
      const uint16_t lane = b.addLane(r, to, from);
      std::optional<StepRef> wait = previousRound[static_cast<size_t>(r)];
      if (staged && round == 0) {  // ahead on this lane, which every later round waits for
        b.add(r, lane, copy(input(0, static_cast<uint32_t>(n)), scratch(0, static_cast<uint32_t>(n))));
      }
      // Send: straight from where the items lie when they lie in order in one buffer, else packed.
      const std::vector<Item>& mine = outgoing[static_cast<size_t>(r)];
      auto& holds = held[static_cast<size_t>(r)];
      const ChunkRange first = holds.at(mine.front());
      bool inOrder = true;
      for (size_t j = 0; j < mine.size(); ++j) {
        const ChunkRange at = holds.at(mine[j]);
        inOrder = inOrder && at.buffer == first.buffer && at.offset == first.offset + j;
      }
      const auto count = static_cast<uint32_t>(mine.size());
      if (inOrder) {
        b.add(r, lane, after(send({first.buffer, first.offset, count}), wait));
      } else {
        const uint32_t pack = takeScratch(r, mine.size());
        for (size_t j = 0; j < mine.size(); ++j) {
          b.add(r, lane, after(copy(holds.at(mine[j]), scratch(pack + static_cast<uint32_t>(j))), j == 0 ? wait : std::nullopt));
        }
        b.add(r, lane, send(scratch(pack, count)));
      }
      for (const Item& item : mine) {
        if (item.first == r) inputRead[static_cast<size_t>(r * n + item.second)] = {round, inOrder};
        next[static_cast<size_t>(r)].erase(item);
      }
      // Receive: straight into the output when every item ends here, in order, in consecutive blocks.
      const std::vector<Item>& theirs = outgoing[static_cast<size_t>(from)];
      const auto arriving = static_cast<uint32_t>(theirs.size());
      bool direct = true;
      for (size_t j = 0; j < theirs.size(); ++j) {
        direct = direct && theirs[j].second == r && theirs[j].first == theirs.front().first + static_cast<int>(j);
      }
      if (direct) {
        const auto firstBlock = static_cast<uint32_t>(theirs.front().first);
        for (const Item& item : theirs) outputWrites.push_back({r, item.first, round, true});
        previousRound[static_cast<size_t>(r)] = b.add(r, lane, recv(output(firstBlock, arriving)));
        continue;
      }
      const uint32_t landing = takeScratch(r, theirs.size());
      std::optional<StepRef> last = b.add(r, lane, recv(scratch(landing, arriving)));
      for (size_t j = 0; j < theirs.size(); ++j) {
        const ChunkRange at = scratch(landing + static_cast<uint32_t>(j));
        if (theirs[j].second == r) {
          outputWrites.push_back({r, theirs[j].first, round, false});
          last = b.add(r, lane, copy(at, output(static_cast<uint32_t>(theirs[j].first))));
        } else {
          next[static_cast<size_t>(r)][theirs[j]] = at;
        }
      }
      previousRound[static_cast<size_t>(r)] = last;
    }
    held = std::move(next);
  }
  for (int r = 0; r < n; ++r) {
    if (!held[static_cast<size_t>(r)].empty()) throwInternalError("doubling all-to-all: rank " + std::to_string(r) + " kept items");
  }
  bool validInPlace = true;
  for (const OutputWrite& w : outputWrites) {
    const InputRead read = inputRead[static_cast<size_t>(w.rank * n + w.block)];
    validInPlace = validInPlace && (read.round < w.round || (read.round == w.round && !(w.byReceive && read.bySend)));
  }
  return staged || validInPlace;
}

void directGather(PlanBuilder& b, int n, int root, Placement placement) {
  for (int r = 0; r < n; ++r) {
    if (r != root) {
      b.add(r, b.addLane(r, root, -1), send(input(0)));
      continue;
    }
    for (int q : peersOf(r, n)) b.add(r, b.addLane(r, -1, q), recv(output(static_cast<uint32_t>(q))));
    if (placement != Placement::InPlace) {
      b.add(r, b.addLane(r, -1, -1), copy(input(0), output(static_cast<uint32_t>(root))));
    }
  }
}

void directScatter(PlanBuilder& b, int n, int root, Placement placement) {
  for (int r = 0; r < n; ++r) {
    if (r != root) {
      b.add(r, b.addLane(r, -1, root), recv(output(0)));
      continue;
    }
    for (int q : peersOf(r, n)) b.add(r, b.addLane(r, q, -1), send(input(static_cast<uint32_t>(q))));
    if (placement != Placement::InPlace) {
      b.add(r, b.addLane(r, -1, -1), copy(input(static_cast<uint32_t>(root)), output(0)));
    }
  }
}

// The root sends its whole input to every peer at once: no rank waits on another non-root, so ranks that
// share a CPU never wait for a relay that is not running.
void directBroadcast(PlanBuilder& b, int n, int root, Placement placement) {
  for (int r = 0; r < n; ++r) {
    if (r != root) {
      b.add(r, b.addLane(r, -1, root), recv(output(0)));
      continue;
    }
    for (int q : peersOf(r, n)) b.add(r, b.addLane(r, q, -1), send(input(0)));
    // The root's own copy on a lane of its own, not mirrored into a send: the root is otherwise idle, and its CPU
    // then does the same share of the writing as a CPU of receivers (0.6-0.9x the time on 4-8 ranks, session 40).
    if (placement != Placement::InPlace) b.add(r, b.addLane(r, -1, -1), copy(input(0), output(0)));
  }
}

void directAllGather(PlanBuilder& b, int n, Placement placement) {
  for (int r = 0; r < n; ++r) {
    for (int q : peersOf(r, n)) {
      const uint16_t lane = b.addLane(r, q, q);
      b.add(r, lane, send(input(0)));
      b.add(r, lane, recv(output(static_cast<uint32_t>(q))));
    }
    if (placement != Placement::InPlace) {
      b.add(r, b.addLane(r, -1, -1), copy(input(0), output(static_cast<uint32_t>(r))));
    }
  }
}

// Each rank sends block q to rank q and adds what arrives, one peer after the other, into its output.
void directReduceScatter(PlanBuilder& b, int n) {
  for (int r = 0; r < n; ++r) {
    ChunkRange current = input(static_cast<uint32_t>(r));
    std::optional<StepRef> ready;
    for (int q : peersOf(r, n)) {
      const uint16_t lane = b.addLane(r, q, q);
      b.add(r, lane, send(input(static_cast<uint32_t>(q))));
      ready = b.add(r, lane, after(recvReduceCopy(current, output(0)), ready));
      current = output(0);
    }
  }
}

// One round: every rank sends its input to every other and adds all n inputs itself, in rank order, so
// that every rank computes the same sum bit for bit. Fewest dependent messages of any all-reduce,
// which is what small messages on ranks that share cores pay for. The sum builds in the output out of
// place; in place (or either) it builds in scratch and is copied out once the sends have left.
void directAllReduce(PlanBuilder& b, int n, Placement placement) {
  const bool staged = placement != Placement::OutOfPlace;
  b.useScratch(static_cast<uint32_t>(n));
  for (int r = 0; r < n; ++r) {
    std::vector<std::optional<StepRef>> arrived(static_cast<size_t>(n));
    std::vector<StepRef> sent;
    for (int q : peersOf(r, n)) {
      const uint16_t lane = b.addLane(r, q, q);
      sent.push_back(b.add(r, lane, send(input(0))));
      arrived[static_cast<size_t>(q)] = b.add(r, lane, recv(scratch(static_cast<uint32_t>(q))));
    }
    const auto source = [&](int k) { return k == r ? input(0) : scratch(static_cast<uint32_t>(k)); };
    const ChunkRange sum = staged ? scratch(static_cast<uint32_t>(r)) : output(0);
    const uint16_t local = b.addLane(r, -1, -1);
    b.add(r, local, after(copy(source(0), sum), arrived[0]));
    for (int k = 1; k < n; ++k) b.add(r, local, after(Step{StepKind::Reduce, source(k), sum, {}}, arrived[static_cast<size_t>(k)]));
    if (staged) {
      Step out = copy(sum, output(0));
      out.deps.insert(out.deps.end(), sent.begin(), sent.end());
      b.add(r, local, std::move(out));
    }
  }
}

// A direct reduce-scatter, then a direct all-gather. The block is cut into n parts; rank r sums part r, starting
// from its own input and adding each peer's in turn (peers r+1, r+2, ...), then sends the sum to every peer and
// receives theirs. A part is summed once, by its owner, so every rank holds the same bits. Sends and receives take
// separate lanes, the sending lanes first: a rank's first walk of its lanes posts every send before the first sum
// keeps it busy, so that no peer waits on that sum for its data (one lane per peer posted a send only after the
// sum before it: 22 us late at 1 MiB on 4 ranks). In place, the receive of part q into the buffer follows the send
// of part q out of it, and waits until the peer has read that (Step::waitsOutOwnSends).
void reduceScatterAllGather(PlanBuilder& b, int n) {
  for (int r = 0; r < n; ++r) {
    const auto own = static_cast<uint32_t>(r);
    const std::vector<int> peers = peersOf(r, n);
    std::vector<uint16_t> sendLanes;
    std::vector<StepRef> partSent;
    for (int q : peers) {
      sendLanes.push_back(b.addLane(r, q, -1));
      partSent.push_back(b.add(r, sendLanes.back(), send(input(static_cast<uint32_t>(q)))));
    }
    std::vector<uint16_t> recvLanes;
    ChunkRange partial = input(own);
    std::optional<StepRef> summed;
    for (int q : peers) {
      recvLanes.push_back(b.addLane(r, -1, q));
      summed = b.add(r, recvLanes.back(), after(recvReduceCopy(partial, output(own)), summed));
      partial = output(own);
    }
    for (size_t i = 0; i < peers.size(); ++i) {
      Step sendSum = after(send(output(own)), summed);
      // The last peer summed in (r - 1) is the one whose send completes the sum: where it may, this rank writes the
      // sum into that peer's output as it reduces, and this send skips what it wrote (Step::sendsResultOf).
      if (i + 1 == peers.size()) sendSum.sendsResultOf = summed;
      b.add(r, sendLanes[i], std::move(sendSum));
      // In place the gathered part lands over the part this rank sent to that peer, which the peer reads in its
      // sum, before it sends what this receive takes: waiting for that read costs nothing and saves a bounce copy
      // (0.8x the time at 256 KiB-1 MiB on 4 ranks in place).
      Step gather = after(recv(output(static_cast<uint32_t>(peers[i]))), partSent[i]);
      gather.waitsOutOwnSends = true;
      const StepRef gathered = b.add(r, recvLanes[i], std::move(gather));
      // Peer r + 1 sums our part of its part last: its sum comes back into this receive (the mark above, there).
      if (i == 0) b.step(r, partSent[0]).resultReturnsIn = gathered;
    }
  }
}

std::string lowercase(std::string_view text) {
  std::string out(text);
  for (char& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

}  // namespace

const char* algorithmName(Algorithm a) noexcept {
  switch (a) {
    case Algorithm::Ring: return "ring";
    case Algorithm::RecursiveDoubling: return "recursive_doubling";
    case Algorithm::Tree: return "tree";
    case Algorithm::Direct: return "direct";
    case Algorithm::Hierarchical: return "hierarchical";
    case Algorithm::HalvingDoubling: return "halving_doubling";
    case Algorithm::ReduceScatterAllGather: return "reduce_scatter_allgather";
  }
  return "unknown";
}

std::optional<Algorithm> algorithmFromName(std::string_view name) noexcept {
  std::string key;
  try {
    key = lowercase(name);
  } catch (...) {
    return std::nullopt;
  }
  if (key == "ring") return Algorithm::Ring;
  if (key == "recursive_doubling" || key == "rd") return Algorithm::RecursiveDoubling;
  if (key == "tree") return Algorithm::Tree;
  if (key == "direct") return Algorithm::Direct;
  if (key == "hierarchical" || key == "hier") return Algorithm::Hierarchical;
  if (key == "halving_doubling" || key == "hd") return Algorithm::HalvingDoubling;
  if (key == "reduce_scatter_allgather" || key == "rsag") return Algorithm::ReduceScatterAllGather;
  return std::nullopt;
}

bool algorithmSupports(Algorithm a, Collective c) noexcept {
  switch (a) {
    case Algorithm::Ring:
      return c == Collective::AllReduce || c == Collective::AllGather || c == Collective::ReduceScatter ||
             c == Collective::Broadcast || c == Collective::Reduce;
    case Algorithm::RecursiveDoubling:
      return c == Collective::AllReduce || c == Collective::AllGather || c == Collective::AllToAll;
    case Algorithm::Tree: return c == Collective::Broadcast || c == Collective::Reduce;
    case Algorithm::Direct:
      return c == Collective::AllReduce || c == Collective::AllToAll || c == Collective::Gather || c == Collective::Scatter ||
             c == Collective::AllGather || c == Collective::ReduceScatter || c == Collective::Broadcast;
    case Algorithm::Hierarchical: return c == Collective::AllReduce;
    case Algorithm::HalvingDoubling: return c == Collective::AllReduce || c == Collective::ReduceScatter;
    case Algorithm::ReduceScatterAllGather: return c == Collective::AllReduce;
  }
  return false;
}

Plan ringPlan(Collective c, int nranks, int root, int nchannels, Placement placement) {
  checkArguments(Algorithm::Ring, c, nranks, root, nchannels);
  if (nranks == 1) return singleRankPlan(Algorithm::Ring, c, placement);
  const auto channels = static_cast<uint32_t>(nchannels);
  const uint32_t cpb = c == Collective::AllReduce ? static_cast<uint32_t>(nranks) * channels : channels;
  PlanBuilder b(Algorithm::Ring, c, nranks, root, cpb);
  bool validOutOfPlace = true;
  switch (c) {
    case Collective::AllReduce: ringAllReduce(b, nranks, nchannels); break;
    case Collective::AllGather:
      ringAllGather(b, nranks, nchannels, placement);
      validOutOfPlace = placement != Placement::InPlace;
      break;
    case Collective::ReduceScatter: ringReduceScatter(b, nranks, nchannels); break;
    case Collective::Broadcast:
      ringBroadcast(b, nranks, root, nchannels, placement);
      validOutOfPlace = placement != Placement::InPlace;
      break;
    case Collective::Reduce: ringReduce(b, nranks, root, nchannels); break;
    default: break;
  }
  return b.finish(true, validOutOfPlace);
}

Plan recursiveDoublingPlan(Collective c, int nranks, int root, int nchannels, Placement placement) {
  checkArguments(Algorithm::RecursiveDoubling, c, nranks, root, nchannels);
  if (nranks == 1) return singleRankPlan(Algorithm::RecursiveDoubling, c, placement);
  if (c == Collective::AllGather) {
    PlanBuilder b(Algorithm::RecursiveDoubling, c, nranks, root, 1);
    doublingAllGather(b, nranks, placement);
    return b.finish(true, placement != Placement::InPlace);
  }
  if (c == Collective::AllToAll) {
    PlanBuilder b(Algorithm::RecursiveDoubling, c, nranks, root, 1);
    const bool validInPlace = doublingAllToAll(b, nranks, placement);
    return b.finish(validInPlace, placement != Placement::InPlace);
  }
  return recursiveDoublingAllReduce(nranks, placement);
}

Plan halvingDoublingPlan(Collective c, int nranks, int root, int nchannels, Placement placement) {
  checkArguments(Algorithm::HalvingDoubling, c, nranks, root, nchannels);
  if (nranks == 1) return singleRankPlan(Algorithm::HalvingDoubling, c, placement);
  if (c == Collective::ReduceScatter) {
    PlanBuilder b(Algorithm::HalvingDoubling, c, nranks, root, 1);
    halvingReduceScatter(b, nranks);
    return b.finish(true, true);
  }
  return halvingDoublingAllReduce(nranks);
}

Plan treePlan(Collective c, int nranks, int root, int nchannels, Placement placement) {
  checkArguments(Algorithm::Tree, c, nranks, root, nchannels);
  if (nranks == 1) return singleRankPlan(Algorithm::Tree, c, placement);
  PlanBuilder b(Algorithm::Tree, c, nranks, root, 1);
  if (c == Collective::Broadcast) {
    treeBroadcast(b, nranks, root, placement);
    return b.finish(true, placement != Placement::InPlace);
  }
  treeReduce(b, nranks, root);
  return b.finish(true, true);
}

Plan interleavedTreeBroadcast(int nranks, int root, int places, Placement placement) {
  const bool fits = places > 1 && std::has_single_bit(static_cast<unsigned>(nranks)) &&
                    std::has_single_bit(static_cast<unsigned>(places)) && nranks % places == 0;
  if (!fits || nranks == 1) return treePlan(Collective::Broadcast, nranks, root, 1, placement);
  checkArguments(Algorithm::Tree, Collective::Broadcast, nranks, root, 1);
  PlanBuilder b(Algorithm::Tree, Collective::Broadcast, nranks, root, 1);
  treeBroadcast(b, nranks, root, placement, true);
  return b.finish(true, placement != Placement::InPlace);
}

Plan directPlan(Collective c, int nranks, int root, int nchannels, Placement placement) {
  checkArguments(Algorithm::Direct, c, nranks, root, nchannels);
  if (nranks == 1) return singleRankPlan(Algorithm::Direct, c, placement);
  const bool keepsOwnCopy = placement != Placement::InPlace;
  if (c == Collective::AllToAll) {
    PlanBuilder b(Algorithm::Direct, c, nranks, root, static_cast<uint32_t>(nchannels));
    const bool staged = placement != Placement::OutOfPlace;
    directAllToAll(b, nranks, nchannels, staged, placement);
    return b.finish(staged, keepsOwnCopy);
  }
  PlanBuilder b(Algorithm::Direct, c, nranks, root, 1);
  switch (c) {
    case Collective::Gather: directGather(b, nranks, root, placement); break;
    case Collective::Scatter: directScatter(b, nranks, root, placement); break;
    case Collective::Broadcast: directBroadcast(b, nranks, root, placement); break;
    case Collective::AllGather: directAllGather(b, nranks, placement); break;
    case Collective::ReduceScatter: directReduceScatter(b, nranks); return b.finish(true, true);
    case Collective::AllReduce: {
      directAllReduce(b, nranks, placement);
      const bool staged = placement != Placement::OutOfPlace;
      return b.finish(staged, true);
    }
    default: break;
  }
  return b.finish(true, keepsOwnCopy);
}

Plan reduceScatterAllGatherPlan(Collective c, int nranks, int root, int nchannels, Placement placement) {
  checkArguments(Algorithm::ReduceScatterAllGather, c, nranks, root, nchannels);
  if (nranks == 1) return singleRankPlan(Algorithm::ReduceScatterAllGather, c, placement);
  PlanBuilder b(Algorithm::ReduceScatterAllGather, c, nranks, root, static_cast<uint32_t>(nranks));
  reduceScatterAllGather(b, nranks);
  return b.finish(true, true);
}

Plan hierarchicalPlan(Collective c, const std::vector<int>& hostOfRank, int nchannels, Placement placement,
                      const std::vector<uint32_t>& shardWeights) {
  const int n = static_cast<int>(hostOfRank.size());
  checkArguments(Algorithm::Hierarchical, c, n, -1, nchannels);
  // Ranks of each host in rank order: members[h][l] is host h's local rank l.
  int hosts = 0;
  for (int h : hostOfRank) {
    if (h < 0 || h >= n) throwInvalidArgument("hierarchical plan: host index " + std::to_string(h) + " is out of range");
    hosts = std::max(hosts, h + 1);
  }
  std::vector<std::vector<int>> members(static_cast<size_t>(hosts));
  for (int r = 0; r < n; ++r) members[static_cast<size_t>(hostOfRank[static_cast<size_t>(r)])].push_back(r);
  const int L = static_cast<int>(members.front().size());
  for (int h = 0; h < hosts; ++h)
    if (static_cast<int>(members[static_cast<size_t>(h)].size()) != L || L == 0)
      throwInvalidArgument("hierarchical plan: host " + std::to_string(h) + " has " +
                           std::to_string(members[static_cast<size_t>(h)].size()) + " ranks, host 0 has " +
                           std::to_string(L) + "; every host needs the same number");
  const int H = hosts;
  std::vector<uint32_t> weight = shardWeights.empty() ? std::vector<uint32_t>(static_cast<size_t>(L), 1) : shardWeights;
  if (static_cast<int>(weight.size()) != L)
    throwInvalidArgument("hierarchical plan: " + std::to_string(weight.size()) + " shard weights for " + std::to_string(L) +
                         " ranks per host");
  for (uint32_t w : weight)
    if (w < 1 || w > 64) throwInvalidArgument("hierarchical plan: shard weight " + std::to_string(w) + " is not in 1..64");
  if (n == 1) return singleRankPlan(Algorithm::Hierarchical, c, placement);
  const auto rankAt = [&](int h, int l) { return members[static_cast<size_t>(mod(h, H))][static_cast<size_t>(mod(l, L))]; };
  // Chunks: channel ch owns its W*H chunks (W = summed weights); within it, group g (local rank g's shard) is
  // weight[g]*H chunks, which the ranks of local index g cut into H parts of weight[g] chunks across the hosts.
  std::vector<uint32_t> groupStart(static_cast<size_t>(L) + 1, 0);
  for (int g = 0; g < L; ++g) groupStart[static_cast<size_t>(g) + 1] = groupStart[static_cast<size_t>(g)] + weight[static_cast<size_t>(g)] * static_cast<uint32_t>(H);
  const uint32_t perChannel = groupStart.back();
  PlanBuilder b(Algorithm::Hierarchical, c, n, -1, perChannel * static_cast<uint32_t>(nchannels));
  for (int ch = 0; ch < nchannels; ++ch) {
    const uint32_t base = static_cast<uint32_t>(ch) * perChannel;
    for (int h = 0; h < H; ++h)
      for (int l = 0; l < L; ++l) {
        const int r = rankAt(h, l);
        const auto groupOffset = [&](int g) { return base + groupStart[static_cast<size_t>(mod(g, L))]; };
        const auto groupChunks = [&](int g) { return weight[static_cast<size_t>(mod(g, L))] * static_cast<uint32_t>(H); };
        const auto in = [&](int g) { return input(groupOffset(g), groupChunks(g)); };
        const auto out = [&](int g) { return output(groupOffset(g), groupChunks(g)); };
        const uint32_t w = weight[static_cast<size_t>(l)];
        const auto shardChunk = [&](int k) { return output(groupOffset(l) + static_cast<uint32_t>(mod(k, H)) * w, w); };
        std::optional<StepRef> shardReady;
        uint16_t intra = 0;
        if (L > 1) {
          intra = b.addLane(r, rankAt(h, l + 1), rankAt(h, l - 1), ch);
          b.add(r, intra, send(in(l - 1)));
          for (int s = 1; s <= L - 2; ++s) b.add(r, intra, recvReduceSend(in(l - 1 - s)));
          shardReady = b.add(r, intra, recvReduceCopy(in(l), out(l)));
        } else if (placement != Placement::InPlace) {
          const uint16_t lane = b.addLane(r, -1, -1, ch);
          shardReady = b.add(r, lane, copy(in(0), out(0)));
        }
        if (H > 1) {
          const uint16_t inter = b.addLane(r, rankAt(h + 1, l), rankAt(h - 1, l), ch);
          b.add(r, inter, after(send(shardChunk(h - 1)), shardReady));
          for (int s = 1; s <= H - 2; ++s) b.add(r, inter, recvReduceSend(shardChunk(h - 1 - s)));
          b.add(r, inter, recvReduceCopySend(shardChunk(h), shardChunk(h)));
          for (int t = 1; t <= H - 2; ++t) b.add(r, inter, recvCopySend(shardChunk(h - t)));
          shardReady = b.add(r, inter, recv(shardChunk(h + 1)));
        }
        if (L > 1) {
          // After the inter-host lane finished the shard (one host: this lane's own last step, already in order).
          b.add(r, intra, after(send(out(l)), H > 1 ? shardReady : std::nullopt));
          for (int t = 1; t <= L - 2; ++t) b.add(r, intra, recvCopySend(out(l - t)));
          b.add(r, intra, recv(out(l + 1)));
        }
      }
  }
  // One rank per host skips the input-to-output copy in place, so that plan is valid in place only.
  return b.finish(true, !(L == 1 && placement == Placement::InPlace));
}

Plan makePlan(Algorithm algorithm, Collective c, int nranks, int root, int nchannels, Placement placement) {
  switch (algorithm) {
    case Algorithm::Ring: return ringPlan(c, nranks, root, nchannels, placement);
    case Algorithm::RecursiveDoubling: return recursiveDoublingPlan(c, nranks, root, nchannels, placement);
    case Algorithm::Tree: return treePlan(c, nranks, root, nchannels, placement);
    case Algorithm::Direct: return directPlan(c, nranks, root, nchannels, placement);
    case Algorithm::HalvingDoubling: return halvingDoublingPlan(c, nranks, root, nchannels, placement);
    case Algorithm::ReduceScatterAllGather: return reduceScatterAllGatherPlan(c, nranks, root, nchannels, placement);
    case Algorithm::Hierarchical:
      checkArguments(algorithm, c, nranks, root, nchannels);
      return hierarchicalPlan(c, std::vector<int>(static_cast<size_t>(nranks), 0), nchannels, placement);
  }
  throwInvalidArgument("unknown algorithm");
}

Plan makePlan(std::string_view algorithmName, Collective c, int nranks, int root, int nchannels, Placement placement) {
  const std::optional<Algorithm> algorithm = algorithmFromName(algorithmName);
  if (!algorithm) {
    throwInvalidArgument("unknown algorithm '" + std::string(algorithmName) +
                         "'; known: ring, recursive_doubling (rd), tree, direct, hierarchical (hier), halving_doubling (hd), "
                         "reduce_scatter_allgather (rsag)");
  }
  return makePlan(*algorithm, c, nranks, root, nchannels, placement);
}

}  // namespace topoccl::algo
