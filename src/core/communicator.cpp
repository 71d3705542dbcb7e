#include "core/communicator.hpp"

#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <algorithm>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <type_traits>

#include "algorithms/simulator.hpp"
#include "algorithms/cost_model.hpp"
#include "algorithms/msccl_xml.hpp"
#include "algorithms/selection.hpp"
#include "algorithms/synthesizer/plan_cache.hpp"
#include "algorithms/synthesizer/synthesizer.hpp"
#include "algorithms/validator.hpp"
#include "common/error.hpp"
#include "common/hash.hpp"
#include "common/log.hpp"
#include "common/params.hpp"
#include "core/execution.hpp"
#include "core/gpu_staging.hpp"
#include "core/plan_buffers.hpp"
#include "kernels/host_copy.hpp"
#include "kernels/host_reduce.hpp"
#include "topology/cluster.hpp"
#include "topology/cluster_file.hpp"
#include "topology/discovery.hpp"
#include "transport/local/local_transport.hpp"
#include "transport/shm/shm_transport.hpp"
#include "transport/socket/socket_transport.hpp"

namespace topoccl::core {
namespace {

constexpr int kPointToPointChannel = 1 << 16;  // p2p never shares a connection with plans
constexpr int kSplitTag = 0x5000;
constexpr int kSynthTag = 0x4000;
constexpr int kModelTag = 0x4100;

// Same value <=> same process. Recomputed after fork(), since a child inherits its parent's statics.
uint64_t processToken() {
  static std::mutex mutex;
  static pid_t owner = -1;
  static uint64_t token = 0;
  std::lock_guard lock(mutex);
  if (owner != getpid()) {
    std::random_device rd;
    owner = getpid();
    token = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ (static_cast<uint64_t>(owner) << 17);
  }
  return token;
}

std::string hostIdentity() {
  const std::string configured = params::kHostId.get();
  if (!configured.empty()) return configured;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string bootId;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> bootId;
  return std::string(host) + "/" + bootId;
}

// TOPOCCL_CLUSTER_FILE, loaded once per process, and this host's entry in it: the one whose NIC addresses this
// machine has. Every NIC of that entry must exist here under its name with its address, so a file that
// disagrees with the machine is an error at creation rather than traffic on the wrong wire.
struct ClusterView {
  topo::ClusterFile file;
  const topo::ClusterHost* host = nullptr;
};

const ClusterView* clusterView() {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<ClusterView>> byPath;
  const std::string path = params::kClusterFile.get();
  if (path.empty()) return nullptr;
  std::lock_guard lock(mutex);
  auto& slot = byPath[path];
  if (slot) return slot.get();
  auto view = std::make_unique<ClusterView>();
  view->file = topo::loadClusterFile(path);
  const auto interfaces = bootstrap::listInterfaces();
  std::string have;
  for (const auto& itf : interfaces) {
    have += (have.empty() ? "" : ", ") + itf.name + " " + itf.address.host();
    if (!view->host) view->host = view->file.hostWithAddress(itf.address.host());
  }
  const std::string where = std::string(params::kClusterFile.name()) + "=" + path;
  if (!view->host) throwInvalidArgument(where + ": no host in the file has an address of this machine (" + have + ")");
  for (const topo::ClusterNic& nic : view->host->nics) {
    const auto found = std::find_if(interfaces.begin(), interfaces.end(),
                                    [&](const auto& itf) { return itf.address.host() == nic.address; });
    if (found == interfaces.end())
      throwInvalidArgument(where + ": host " + view->host->name + " NIC " + nic.name + " should have address " +
                           nic.address + ", which no interface here has (" + have + ")");
    if (found->name != nic.name)
      throwInvalidArgument(where + ": host " + view->host->name + " NIC " + nic.name + ": address " + nic.address +
                           " is on interface " + found->name + " here, not " + nic.name);
  }
  slot = std::move(view);
  return slot.get();
}

// The NICs the socket transport listens and sends on: the cluster file's for this host; else, when
// NCCL_SOCKET_IFNAME is set, every interface it matches (one address each, speed from sysfs); else none,
// and the transport takes the one interface bootstrap would.
std::vector<transport::LocalNic> dataNics(const ClusterView* view) {
  std::vector<transport::LocalNic> nics;
  if (view) {
    for (const topo::ClusterNic& nic : view->host->nics)
      nics.push_back({nic.name, bootstrap::SocketAddress::parse(nic.address + ":0"),
                      nic.goodputGbps > 0 ? nic.goodputGbps : nic.gbps, nic.rail, true});  // fitted goodput weighs best
    return nics;
  }
  const std::string spec = params::kSocketIfname.get();
  if (spec.empty()) return nics;
  std::set<std::string> seen;
  for (const auto& itf : bootstrap::orderInterfaces(bootstrap::listInterfaces(), spec, bootstrap::configuredFamily(), {})) {
    if (!seen.insert(itf.name).second || nics.size() == 4) continue;
    double gbps = 0;
    int64_t mbits = 0;
    if (std::ifstream("/sys/class/net/" + itf.name + "/speed") >> mbits; mbits > 0) gbps = static_cast<double>(mbits) / 1000.0;
    nics.push_back({itf.name, itf.address, gbps, static_cast<int>(nics.size()), true});
  }
  return nics;
}

// This host's serialized report, discovered once per process (every communicator of the process asks).
// An empty result carries the reason the host could not describe itself.
struct HostReportCache {
  std::string report;
  std::string problem;
};

const HostReportCache& hostReport(const std::string& hostId) {
  static std::mutex mutex;
  static std::map<std::string, HostReportCache> byHost;  // NCCL_HOSTID may differ between threads' comms
  std::lock_guard lock(mutex);
  auto [it, inserted] = byHost.try_emplace(hostId);
  if (inserted) {
    try {
      const ClusterView* view = clusterView();
      it->second.report =
          topo::serializeHostReport({hostId, view ? topo::hostTopology(*view->host, params::kNetNics.get() != "near",
                                                                       params::kNetNics.get() == "near")
                                                   : topo::loadHostTopology()});
    } catch (const std::exception& e) {
      it->second.problem = e.what();
    }
  }
  return it->second;
}

constexpr int kMaxWireNics = 4;
struct WireNic {
  char name[16];
  char address[64];  // "ip:port" of the listener
  double gbps;
  int32_t rail;
  uint32_t nearRanks;  // bit i: local rank i is nearest this NIC (cluster file); all ones: every rank
};

// What each rank publishes at init; fixed size so one allGather carries it.
struct WireInfo {
  int32_t rank;
  int32_t nchannels;
  int64_t pid;
  uint64_t processToken;
  uint64_t sliceBytes;
  uint8_t shmAllowed;
  uint8_t localAllowed;
  uint8_t cpuSetKnown;
  uint64_t cpuSet[16];  // topo::CpuSet, 1024 CPUs
  char hostId[160];
  char socketAddress[80];
  char algo[256];
  char proto[64];             // NCCL_PROTO
  uint64_t lowLatencyBytes;   // TOPOCCL_GPU_LL_BYTES
  int32_t nicCount;
  WireNic nics[kMaxWireNics];
};

void copyText(char* dst, size_t size, const std::string& text, const char* what) {
  if (text.size() >= size) throwInvalidArgument(std::string(what) + " is too long: '" + text + "'");
  std::memcpy(dst, text.c_str(), text.size() + 1);
}

bool isInPlace(const CollectiveArgs& a, int rank, size_t elem) {
  const char* send = static_cast<const char*>(a.send);
  const char* recv = static_cast<const char*>(a.recv);
  const size_t block = a.count * elem;
  switch (a.collective) {
    case algo::Collective::AllGather: return send == recv + rank * block;
    case algo::Collective::ReduceScatter: return recv == send + rank * block;
    case algo::Collective::Gather: return rank == a.root && send == recv + a.root * block;
    case algo::Collective::Scatter: return rank == a.root && recv == send + a.root * block;
    default: return send == recv;
  }
}

// Everything a collective's execution depends on: buffers, count, type, operator (a scalar operand's value
// or pointer too), root.
bool sameCall(const CollectiveArgs& a, const CollectiveArgs& b) {
  return a.collective == b.collective && a.send == b.send && a.recv == b.recv && a.count == b.count && a.type == b.type &&
         a.root == b.root && a.reduce.op == b.reduce.op && a.reduce.scalarType == b.reduce.scalarType &&
         a.reduce.scalarPointer == b.reduce.scalarPointer && std::memcmp(a.reduce.scalar, b.reduce.scalar, sizeof(a.reduce.scalar)) == 0;
}

// The bytes this rank reads and the bytes it writes do not overlap (a rank that reads or writes nothing counts as
// disjoint).
bool buffersDisjoint(const CollectiveArgs& a, uint32_t inBlocks, uint32_t outBlocks, size_t elem) {
  const auto send = reinterpret_cast<uintptr_t>(a.send);
  const auto recv = reinterpret_cast<uintptr_t>(a.recv);
  const size_t inBytes = static_cast<size_t>(inBlocks) * a.count * elem;
  const size_t outBytes = static_cast<size_t>(outBlocks) * a.count * elem;
  if (inBytes == 0 || outBytes == 0) return true;
  return send + inBytes <= recv || recv + outBytes <= send;
}

size_t selectionBytes(const CollectiveArgs& a, int nranks, size_t elem) {
  switch (a.collective) {
    case algo::Collective::AllGather:
    case algo::Collective::ReduceScatter:
    case algo::Collective::AllToAll:
    case algo::Collective::Gather:
    case algo::Collective::Scatter: return a.count * elem * static_cast<size_t>(nranks);
    default: return a.count * elem;
  }
}

// Whether any of one host's ranks shares its CPUs with another, from every rank's affinity as sent at bootstrap
// (before oversubscribed ranks are bound): the same answer on every rank, so selection rows may depend on it.
bool someRankSharesCores(const std::vector<WireInfo>& wire) {
  std::vector<topo::CpuSet> cpus;
  for (const WireInfo& w : wire)
    cpus.push_back(w.cpuSetKnown ? topo::CpuSet(std::begin(w.cpuSet), std::end(w.cpuSet)) : topo::CpuSet{});
  const size_t machineCpus = std::thread::hardware_concurrency();
  return std::any_of(cpus.begin(), cpus.end(), [&](const topo::CpuSet& mine) { return topo::sharesCores(mine, cpus, machineCpus); });
}

}  // namespace

Communicator::Communicator(int rank, int nranks, CommOptions options)
    : rank_(rank), nranks_(nranks), options_(std::move(options)) {}

std::shared_ptr<Communicator> Communicator::create(const bootstrap::UniqueId& id, int nranks, int rank,
                                                   CommOptions options) {
  std::shared_ptr<Communicator> comm(new Communicator(rank, nranks, std::move(options)));
  comm->initialize(id);
  return comm;
}

void Communicator::initialize(const bootstrap::UniqueId& id) {
  log::setThreadRank(rank_);
  timeout_ = std::chrono::milliseconds(params::kTimeoutMs.get());
  bootstrap_ = bootstrap::Bootstrap::join(id, rank_, nranks_, timeout_);
  identity_ = {bootstrap::commHash(id), id.secret, rank_, nranks_};

  const ClusterView* cluster = clusterView();
  std::vector<transport::NicEndpoint> listening;
  socketTransport_ = transport::makeSocketTransport(identity_, dataNics(cluster), &listening, hostIdentity());
  const std::string socketAddress = listening.front().address;

  std::vector<WireInfo> wire(nranks_);
  WireInfo& mine = wire[rank_];
  std::memset(&mine, 0, sizeof(mine));
  mine.rank = rank_;
  mine.nchannels = static_cast<int32_t>(std::max<int64_t>(1, params::kNChannels.get()));
  mine.pid = getpid();
  mine.processToken = processToken();
  mine.sliceBytes = static_cast<uint64_t>(std::max<int64_t>(64, params::kSliceBytes.get()));
  mine.shmAllowed = !params::kShmDisable.get();
  mine.localAllowed = !params::kP2pDisable.get();
  const topo::CpuSet myCpus = topo::currentCpuSet();
  mine.cpuSetKnown = !myCpus.empty() && myCpus.size() <= std::size(mine.cpuSet);
  if (mine.cpuSetKnown) std::copy(myCpus.begin(), myCpus.end(), mine.cpuSet);
  copyText(mine.hostId, sizeof(mine.hostId), hostIdentity(), "host id");
  copyText(mine.socketAddress, sizeof(mine.socketAddress), socketAddress, "socket address");
  copyText(mine.algo, sizeof(mine.algo), params::kAlgo.get(), "NCCL_ALGO");
  copyText(mine.proto, sizeof(mine.proto), params::kProto.get(), "NCCL_PROTO");
  mine.lowLatencyBytes = static_cast<uint64_t>(std::max<int64_t>(0, params::kGpuLowLatencyBytes.get()));
  mine.nicCount = static_cast<int32_t>(std::min<size_t>(listening.size(), kMaxWireNics));
  for (int i = 0; i < mine.nicCount; ++i) {
    WireNic& nic = mine.nics[i];
    copyText(nic.name, sizeof(nic.name), listening[i].name, "interface name");
    copyText(nic.address, sizeof(nic.address), listening[i].address, "socket address");
    nic.gbps = listening[i].gbps;
    nic.rail = listening[i].rail;
    nic.nearRanks = ~0u;
    if (cluster && !cluster->host->nics[i].nearRanks.empty()) {
      nic.nearRanks = 0;
      for (int local : cluster->host->nics[i].nearRanks) nic.nearRanks |= local < 32 ? 1u << local : 0;
    }
  }
  bootstrap_->allGather(wire.data(), sizeof(WireInfo));

  // Settings that must agree come from rank 0, so no rank can pick a different plan or slicing.
  sliceBytes_ = wire[0].sliceBytes;
  nchannels_ = wire[0].nchannels;
  selection_ = std::make_unique<algo::SelectionTable>(algo::SelectionTable::defaults());
  selection_->setFilter(algo::AlgorithmFilter::parse(wire[0].algo));
  // GPU protocols, from rank 0's settings too: the two ends of a GPU connection must run the same protocol.
  selection_->setProtocolFilter(algo::ProtocolFilter::parse(wire[0].proto));
  selection_->addDefaultProtocolRows(wire[0].lowLatencyBytes);

  std::vector<topo::RankPlace> places;
  for (const WireInfo& w : wire) {
    transport::PeerInfo peer;
    peer.rank = w.rank;
    peer.hostId = w.hostId;
    peer.pid = w.pid;
    peer.processToken = w.processToken;
    peer.socketAddress = w.socketAddress;
    peers_.push_back(peer);
    places.push_back({w.hostId, w.processToken});
  }
  locality_ = std::make_unique<topo::Locality>(std::move(places));
  for (int r = 0; r < nranks_; ++r) {
    const auto& onHost = locality_->ranksOnHost(locality_->hostIndex(r));
    const int local = static_cast<int>(std::find(onHost.begin(), onHost.end(), r) - onHost.begin());
    for (int i = 0; i < std::min(wire[r].nicCount, kMaxWireNics); ++i) {
      const WireNic& nic = wire[r].nics[i];
      peers_[r].nics.push_back({nic.name, nic.address, nic.gbps, nic.rail, local < 32 && ((nic.nearRanks >> local) & 1u)});
    }
  }
  socketTransport_->setSelf(peers_[rank_]);
  // Near mode across hosts: each local rank's shard of a hierarchical all-reduce in proportion to the speed of its
  // nearest NICs (host 0's ranks speak for every host), so each rank stays on its NIC and the NICs finish together.
  if (cluster && params::kNetNics.get() == "near" && locality_->nhosts() > 1) {
    std::vector<double> speeds;
    for (int r : locality_->ranksOnHost(0)) {
      double speed = 0;
      for (const auto& nic : peers_[r].nics) speed += nic.near ? nic.gbps : 0;
      speeds.push_back(speed);
    }
    const double slowest = *std::min_element(speeds.begin(), speeds.end());
    if (slowest > 0) {
      for (double speed : speeds)
        shardWeights_.push_back(static_cast<uint32_t>(std::clamp<long>(std::lround(speed / slowest), 1, 64)));
      if (std::all_of(shardWeights_.begin(), shardWeights_.end(), [](uint32_t w) { return w == 1; })) shardWeights_.clear();
    }
  }
  if (cluster && rank_ == 0) {
    for (int host = 0; host < locality_->nhosts(); ++host) {
      const int first = locality_->ranksOnHost(host).front();
      const topo::ClusterHost* entry = nullptr;
      for (const auto& nic : peers_[first].nics)
        if (!entry) entry = cluster->file.hostWithAddress(bootstrap::SocketAddress::parse(nic.address).host());
      if (entry && static_cast<size_t>(entry->ranks) != locality_->ranksOnHost(host).size())
        TOPOCCL_WARN("%s: host %s runs %zu ranks of this communicator, the file says %d", params::kClusterFile.name(),
                     entry->name.c_str(), locality_->ranksOnHost(host).size(), entry->ranks);
    }
  }
  // Any pair over sockets (another host, or shm turned off by either end) slices for sockets; every rank
  // sees the same wire data, so every rank decides alike.
  bool socketPairs = locality_->nhosts() > 1;
  for (const WireInfo& w : wire) socketPairs = socketPairs || !w.shmAllowed;
  slicesPerStep_ = socketPairs ? Execution::kSlicesPerStepSockets : Execution::kSlicesPerStep;
  if (!socketPairs) {
    selection_->prependRows(algo::memoryPathRows());
    if (someRankSharesCores(wire)) selection_->prependRows(algo::sharedCoreRows());
  } else {
    selection_->prependRows(algo::socketPathRows());
  }
  loadPlanFiles();
  if (params::kTopoFuse.get()) gatherClusterTopology();
  synthesizePlans();
  modelSelection();

  // A pair uses a transport only if both ends allow it, so both ends always choose alike.
  peerRoute_.assign(nranks_, Route::Socket);
  for (int r = 0; r < nranks_; ++r) {
    const auto proximity = locality_->between(rank_, r);
    if (proximity == topo::Proximity::SameProcess && wire[r].localAllowed && mine.localAllowed)
      peerRoute_[r] = Route::Local;
    else if (proximity != topo::Proximity::OtherHost && wire[r].shmAllowed && mine.shmAllowed)
      peerRoute_[r] = Route::Shm;
  }

  {
    // Ranks that share this machine's cores: same boot id (the host id's tail), which also counts the
    // "hosts" of a namespace-emulated cluster, whose ranks all run on one machine's cores. Whether this rank
    // shares its cores comes from every such rank's affinity: ranks pinned two to a core (mpirun --bind-to
    // core --oversubscribe, a one-CPU cpuset) share even though each sees a single CPU.
    const auto bootOf = [](const std::string& hostId) { return hostId.substr(hostId.rfind('/') + 1); };
    size_t localRanks = 0;
    size_t myIndex = 0;
    std::vector<topo::CpuSet> machineCpus;  // empty where unknown (a kernel mask beyond 1024 CPUs)
    std::set<uint64_t> processes;
    for (int r = 0; r < nranks_; ++r) {
      if (bootOf(peers_[r].hostId) != bootOf(peers_[rank_].hostId)) continue;
      if (r == rank_) myIndex = localRanks;
      ++localRanks;
      const WireInfo& w = wire[static_cast<size_t>(r)];
      machineCpus.push_back(w.cpuSetKnown ? topo::CpuSet(w.cpuSet, w.cpuSet + std::size(w.cpuSet)) : topo::CpuSet{});
      processes.insert(w.processToken);
    }
    topo::CpuSet cpusNow = myCpus;
    if (params::kBindOversubscribed.get()) bindOversubscribed(machineCpus, myIndex, processes.size() == localRanks, cpusNow);
    sharesCores_ = topo::sharesCores(cpusNow, machineCpus, std::thread::hardware_concurrency());
    const int64_t configured = params::kSpinPolls.get();
    if (configured < 0) throwInvalidArgument(std::string(params::kSpinPolls.name()) + "=" + std::to_string(configured) + " must be >= 0");
    // Sharing cores: a few polls catch a peer that is about to answer without a trip through the scheduler
    // (4 ranks on 2 cores, 8 B-4 KiB: 4 polls as fast as 1 or up to 30% faster; 16 and more slower).
    spinsBeforeYield_ = configured > 0 ? static_cast<unsigned>(std::min<int64_t>(configured, 1 << 30)) : (sharesCores_ ? 4 : 4096);
    // Sockets: with a core to itself a rank soon sleeps in poll() and leaves the CPU to the kernel's TCP work.
    // Sharing cores, it yields instead, for about 4096 more loops: a peer that is not running cannot answer,
    // and a poll() sleep's wake-up took 1.3-1.6x the time of 4-rank TCP all-reduces at 1-8 MiB (perf/RESULTS.md).
    idleBeforePoll_ = sharesCores_ ? spinsBeforeYield_ + 4096 : std::min(spinsBeforeYield_, 64u);
    const int64_t yields = params::kYieldsBeforeSleep.get();
    if (yields < -1) throwInvalidArgument(std::string(params::kYieldsBeforeSleep.name()) + "=" + std::to_string(yields) + " must be >= -1");
    idleBeforeSleep_ = spinsBeforeYield_ + (yields >= 0 ? static_cast<unsigned>(std::min<int64_t>(yields, 1 << 30)) : (sharesCores_ ? 256u : 4096u));
    machineRanks_ = std::max<size_t>(1, localRanks);
  }
  for (int r = 0; r < nranks_; ++r) {
    if (r == rank_) continue;
    if (peerRoute_[r] == Route::Local && !localTransport_) localTransport_ = transport::makeLocalTransport(identity_);
    if (peerRoute_[r] == Route::Shm && !shmTransport_) {
      shmTransport_ = transport::makeShmTransport(
          identity_, peers_[rank_], sharesCores_ ? transport::kZeroCopyBytesSharingCores : transport::kZeroCopyBytesOwnCores);
    }
  }
  // Streaming stores pay once the buffers of every rank on this machine are past its last-level cache:
  // at 0.5x they took twice as long, at 1-1.25x up to 1.35x on 4 ranks, from 1.5x on they won by 1.1-1.45x
  // (perf/RESULTS.md), so the default is 1.5x.
  const int64_t streaming = params::kStreamingStoresBytes.get();
  if (streaming > 0) streamingThreshold_ = static_cast<uint64_t>(streaming);
  else if (streaming < 0) streamingThreshold_ = UINT64_MAX;
  else if (const size_t cache = kernels::lastLevelCacheBytes(); cache > 0) streamingThreshold_ = 3 * static_cast<uint64_t>(cache) / 2;
  else streamingThreshold_ = 48ull << 20;
  // Left to us, from half the cache on, each shape's calls time both kernels and take the faster
  // (CopyTuner): the static rule was 2x off either way on one VM kind from one session to the next.
  const int64_t tuning = params::kCopyTuningBytes.get();
  if (tuning > 0) copyTuningFrom_ = static_cast<uint64_t>(tuning);
  else if (tuning == 0 && streaming == 0) copyTuningFrom_ = streamingThreshold_ / 3;
  bulkCopy_ = params::kBulkCopy.get() && kernels::bulkCopyUsesStringCopy();
  const int64_t copyOut = params::kShmCopyOutBytes.get();
  if (copyOut < -1) throwInvalidArgument(std::string(params::kShmCopyOutBytes.name()) + "=" + std::to_string(copyOut) + " must be >= -1");
  sendRule_ = defaultSendRule(kernels::coreCacheBytes(), sharesCores_);
  if (copyOut >= 0) sendRule_.overwrittenUpTo = static_cast<size_t>(copyOut);
  if (log::enabled(log::Level::Info, log::kInit)) {
    std::ostringstream routes;
    for (int r = 0; r < nranks_; ++r)
      if (r != rank_) routes << " " << r << ":" << transportFor(r).name();
    std::string streamingFrom =
        streamingThreshold_ == UINT64_MAX
            ? std::string("never")
            : std::to_string(streamingThreshold_ >> 20) + " MiB (into bytes a peer has just read: " +
                  (streamingThreshold_ > UINT64_MAX / kSentBytesCachedFootprints
                       ? std::string("never")
                       : std::to_string((streamingThreshold_ * kSentBytesCachedFootprints) >> 20) + " MiB") + ")";
    if (copyTuningFrom_ != UINT64_MAX)
      streamingFrom += ", and out of place from " + std::to_string(copyTuningFrom_ >> 20) +
                       " MiB where timed faster per call shape (" + params::kCopyTuningBytes.name() + "=-1 or " +
                       params::kStreamingStoresBytes.name() + "=N: never timed)";
    const char* readEarly = sendRule_.readEarlyBelow > 0 ? "sends with receives to follow read in place from 8 KiB"
                                                         : "other sends as the transport decides";
    TOPOCCL_INFO(log::kInit,
                 "comm %s rank %d nranks %d hosts %d slice %zu B (>= %zu a step) channels %d spin %u polls (%s); streaming "
                 "stores from %s (x %zu ranks), below that %s; sends copied out when overwritten, up to %zu B a step; %s; %s; peers via%s",
                 options_.name.c_str(), rank_, nranks_, locality_->nhosts(), sliceBytes_, slicesPerStep_, nchannels_, spinsBeforeYield_,
                 sharesCores_ ? "cores shared with other ranks" : "cores of its own", streamingFrom.c_str(), machineRanks_, bulkCopy_ ? "rep movsb" : "memcpy",
                 sendRule_.overwrittenUpTo, readEarly, boundCpu_ >= 0 ? ("bound to CPU " + std::to_string(boundCpu_) + " (ranks are a multiple of the CPUs; " +
                                   params::kBindOversubscribed.name() + "=0 leaves them to the scheduler)").c_str()
                                : "placement left as found",
                 routes.str().c_str());
  }
  if (log::enabled(log::Level::Info, log::kTuning))
    TOPOCCL_INFO(log::kTuning, "selection table:\n%s", selection_->describe().c_str());
  if (!params::kTraceFile.get().empty()) {
    const int64_t spans = params::kTraceSpans.get();
    if (spans < 1) throwInvalidArgument(std::string(params::kTraceSpans.name()) + "=" + std::to_string(spans) + " must be at least 1");
    trace_ = std::make_unique<ExecutionTrace>(rank_, nranks_, identity_.commHash, static_cast<size_t>(spans));
  }
  engine_ = std::thread([this] { progressLoop(); });
}

void Communicator::bindOversubscribed(std::vector<topo::CpuSet>& machineCpus, size_t myIndex, bool ownProcesses,
                                      topo::CpuSet& mine) {
  // Every rank computes every rank's CPU from the same wire data, so all agree on who shares which CPU.
  std::vector<int> cpus(machineCpus.size());
  for (size_t i = 0; i < cpus.size(); ++i) cpus[i] = topo::oversubscribedRankCpu(machineCpus, i, ownProcesses);
  // Every rank plans the same binding from the same data, so all agree on this whether or not their own bind works.
  if (locality_->nhosts() == 1 && std::all_of(cpus.begin(), cpus.end(), [](int c) { return c >= 0; }))
    interleavedCpus_ = static_cast<int>(std::set<int>(cpus.begin(), cpus.end()).size());
  if (cpus[myIndex] < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpus[myIndex], &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    TOPOCCL_WARN("rank %d: could not bind to CPU %d (%s) for %zu ranks sharing %zu CPUs; the scheduler places it (%s=0 "
                 "skips the attempt)",
                 rank_, cpus[myIndex], std::strerror(errno), machineCpus.size(), topo::cpuCount(machineCpus[myIndex]),
                 params::kBindOversubscribed.name());
    cpus[myIndex] = -1;
  }
  // Grouped inits run on helper threads; the thread that called ncclGroupEnd runs the collectives, so it is the one
  // whose placement counts (session 46: until it was bound too, only the helper and the progress engine were).
  if (cpus[myIndex] >= 0 && options_.callerThread > 0 && options_.callerThread != static_cast<int>(gettid()) &&
      sched_setaffinity(options_.callerThread, sizeof(set), &set) != 0)
    TOPOCCL_WARN("rank %d: bound to CPU %d, but not thread %d, which called ncclGroupEnd and will call the collectives "
                 "(%s); the scheduler places that thread", rank_, cpus[myIndex], options_.callerThread, std::strerror(errno));
  for (size_t i = 0; i < cpus.size(); ++i)
    if (cpus[i] >= 0) machineCpus[i] = topo::singleCpu(cpus[i]);
  if (cpus[myIndex] < 0) return;
  mine = machineCpus[myIndex];
  boundCpu_ = cpus[myIndex];
}

// Each host's lowest rank publishes its host's report; every rank fuses the same set of reports, so
// all ranks hold the same graph. Failure to describe a host is a warning: the cluster graph is an
// input to plan choice, and the transports do not need it.
void Communicator::gatherClusterTopology() {
  const int myHost = locality_->hostIndex(rank_);
  const bool leader = locality_->ranksOnHost(myHost).front() == rank_;
  std::string report;
  if (leader) {
    const HostReportCache& mine = hostReport(peers_[rank_].hostId);
    report = mine.report;
    if (report.empty())
      TOPOCCL_WARN("topology: host %s could not describe itself: %s", peers_[rank_].hostId.c_str(),
                   mine.problem.c_str());
  }
  std::vector<uint64_t> sizes(nranks_, 0);
  sizes[rank_] = report.size();
  bootstrap_->allGather(sizes.data(), sizeof(uint64_t));
  const uint64_t widest = *std::max_element(sizes.begin(), sizes.end());
  for (int host = 0; host < locality_->nhosts(); ++host)
    if (sizes[locality_->ranksOnHost(host).front()] == 0) {
      if (rank_ == 0)
        TOPOCCL_WARN("topology: no report from host %s (rank %d); no cluster graph",
                     peers_[locality_->ranksOnHost(host).front()].hostId.c_str(), locality_->ranksOnHost(host).front());
      if (widest == 0) return;
      break;
    }
  std::vector<char> all(static_cast<size_t>(nranks_) * widest, 0);
  std::memcpy(all.data() + static_cast<size_t>(rank_) * widest, report.data(), report.size());
  bootstrap_->allGather(all.data(), widest);  // every rank joins, so the calls stay paired
  std::vector<topo::HostReport> reports;
  try {
    for (int r = 0; r < nranks_; ++r) {
      if (sizes[r] == 0) continue;
      reports.push_back(topo::parseHostReport(std::string(all.data() + static_cast<size_t>(r) * widest, sizes[r])));
    }
    if (reports.size() != static_cast<size_t>(locality_->nhosts())) return;  // warned above
    topo::FuseOptions options;
    if (const ClusterView* view = clusterView()) options.network.latencyUs = topo::networkLinkLatencyUs(view->file);
    auto fused = std::make_shared<topo::Topology>(topo::fuseHosts(reports, options));
    const std::vector<std::string> order = topo::fusedHostOrder(reports);
    clusterHostOfRank_.assign(nranks_, -1);
    for (int r = 0; r < nranks_; ++r)
      clusterHostOfRank_[r] = static_cast<int>(std::find(order.begin(), order.end(), peers_[r].hostId) - order.begin());
    clusterTopology_ = std::move(fused);
  } catch (const std::exception& e) {
    clusterHostOfRank_.clear();
    TOPOCCL_WARN("topology: cannot fuse the hosts' reports: %s", e.what());
    return;
  }
  TOPOCCL_INFO(log::kInit | log::kGraph, "topology: %d hosts, %d GPUs, %d NICs, %d vertices, fingerprint %s",
               locality_->nhosts(), clusterTopology_->count(topo::VertexKind::Gpu),
               clusterTopology_->count(topo::VertexKind::Nic), clusterTopology_->vertexCount(),
               clusterTopology_->fingerprint().c_str());
}

Communicator::~Communicator() {
  gpuPathForAbort_.store(nullptr);
  gpuPath_.reset();  // waits for its launches in flight
  {
    std::unique_lock lock(queueMutex_);
    stopping_ = true;
  }
  queueChanged_.notify_all();
  if (engine_.joinable()) engine_.join();
  if (trace_) {
    try {
      const std::string path = trace_->write(params::kTraceFile.get());
      TOPOCCL_INFO(log::kInit, "rank %d: trace of %zu spans written to %s", rank_, trace_->spans(), path.c_str());
      if (trace_->dropped())
        TOPOCCL_WARN("rank %d: the trace kept %zu spans and dropped %llu; raise %s to keep them all", rank_, trace_->spans(),
                     static_cast<unsigned long long>(trace_->dropped()), params::kTraceSpans.name());
    } catch (const std::exception& e) {
      TOPOCCL_WARN("rank %d: %s", rank_, e.what());  // a destructor reports, never throws
    }
  }
  gpuStagingForAbort_.store(nullptr);
  gpuStaging_.reset();  // after the engine: its last jobs released their waiting kernels
}

transport::Transport& Communicator::transportFor(int peer) const {
  switch (peerRoute_[peer]) {
    case Route::Local: return *localTransport_;
    case Route::Shm: return *shmTransport_;
    case Route::Socket: break;
  }
  return *socketTransport_;
}

transport::Connection* Communicator::connection(int peer, int channel) {
  auto& slot = connections_[{peer, channel}];
  if (!slot) {
    transport::Transport& chosen = transportFor(peer);
    slot = chosen.connect(peers_[peer], channel);
    usedTransports_.insert(&chosen);
    TOPOCCL_INFO(log::kInit | log::kP2p, "connection to rank %d channel %d via %s", peer, channel,
                 slot->transportName());
  }
  return slot.get();
}

// The table's choice; a hierarchical plan needs every host to hold the same number of ranks, else the ring.
algo::Algorithm Communicator::chooseAlgorithm(algo::Collective collective, size_t bytes, bool gpuBuffers) const {
  const algo::Algorithm chosen = selection_->choose(collective, bytes, nranks_, locality_->nhosts(), gpuBuffers);
  return chosen == algo::Algorithm::Hierarchical && !evenHosts() ? algo::Algorithm::Ring : chosen;
}

bool Communicator::evenHosts() const {
  for (int host = 0; host < locality_->nhosts(); ++host)
    if (locality_->ranksOnHost(host).size() != locality_->ranksOnHost(0).size()) return false;
  return true;
}

// A built-in generator's plan; the hierarchical one takes this job's hosts and (near mode) shard weights.
algo::Plan Communicator::buildPlan(algo::Algorithm algorithm, algo::Collective collective, int root,
                                   algo::Placement placement) const {
  if (algorithm == algo::Algorithm::Tree && collective == algo::Collective::Broadcast && interleavedCpus_ > 1)
    return algo::interleavedTreeBroadcast(nranks_, root, interleavedCpus_, placement);
  if (algorithm != algo::Algorithm::Hierarchical) return algo::makePlan(algorithm, collective, nranks_, root, nchannels_, placement);
  std::vector<int> hostOfRank(static_cast<size_t>(nranks_));
  for (int r = 0; r < nranks_; ++r) hostOfRank[static_cast<size_t>(r)] = locality_->hostIndex(r);
  return algo::hierarchicalPlan(collective, hostOfRank, nchannels_, placement, shardWeights_);
}

const algo::Plan& Communicator::planFor(algo::Algorithm algorithm, algo::Collective collective, int root,
                                        algo::Placement placement) {
  auto& slot = plans_[{static_cast<int>(algorithm), static_cast<int>(collective), root, static_cast<int>(placement)}];
  if (!slot) {
    auto plan = std::make_unique<algo::Plan>(buildPlan(algorithm, collective, root, placement));
    algo::validateOrThrow(*plan);
    TOPOCCL_INFO(log::kColl, "plan %s for %s root %d%s: %zu lanes on rank %d", plan->name.c_str(),
                 algo::collectiveName(collective), root, placement == algo::Placement::OutOfPlace ? " (out of place)" : "",
                 plan->ranks[rank_].lanes.size(), rank_);
    slot = std::move(plan);
  }
  return *slot;
}

// MSCCL_XML_FILES, as MSCCL reads it: every rank loads the files itself. A file that does not parse or
// validate is an error at creation (naming file and line); one for another rank count is skipped. The
// ranks then compare what they loaded, since different files on different hosts would run mismatched plans.
void Communicator::loadPlanFiles() {
  std::string list = params::kMscclXmlFiles.get();
  std::replace(list.begin(), list.end(), ',', ':');
  std::istringstream in(list);
  uint64_t digest = kFnv1a64Offset;
  for (std::string path; std::getline(in, path, ':');) {
    if (path.empty()) continue;
    algo::Plan plan = algo::loadMscclXml(path);
    if (plan.nranks != nranks_) {
      TOPOCCL_INFO(log::kInit | log::kTuning, "MSCCL_XML_FILES: %s is for %d ranks, this communicator has %d: not used",
                   path.c_str(), plan.nranks, nranks_);
      continue;
    }
    try {
      algo::validateOrThrow(plan, ncclInvalidArgument);
    } catch (const Error& e) {
      throwInvalidArgument("MSCCL_XML_FILES: " + path + " does not validate: " + e.what());
    }
    digest = fnv1a64(algo::writeMscclXml(plan), digest);
    TOPOCCL_INFO(log::kInit | log::kTuning, "MSCCL_XML_FILES: %s: '%s' for %s, %llu..%llu bytes%s%s", path.c_str(),
                 plan.name.c_str(), algo::collectiveName(plan.collective), static_cast<unsigned long long>(plan.minBytes),
                 static_cast<unsigned long long>(plan.maxBytes), plan.inPlace ? ", in place" : "",
                 plan.outOfPlace ? ", out of place" : "");
    planFiles_.push_back(std::move(plan));
  }
  std::vector<uint64_t> digests(nranks_);
  digests[rank_] = digest;
  bootstrap_->allGather(digests.data(), sizeof(uint64_t));
  for (int r = 0; r < nranks_; ++r)
    if (digests[r] != digests[0])
      throwInvalidUsage("MSCCL_XML_FILES: rank " + std::to_string(r) + " (host " + peers_[r].hostId +
                        ") loaded different plans from rank 0; give every rank the same files");
}

// TOPOCCL_SYNTHESIZE: rank 0 synthesizes one plan per requested collective and size band on the fused cluster
// graph (through the plan cache), and sends every rank the MSCCL XML, so all ranks run the same plans whatever
// their clocks did to the time budget. Ranks sit on their host's GPUs in order when the host has enough, else on
// its first CPU. A model that cannot be built (no route between hosts) is a warning: the table decides then.
// Where each rank runs in the cluster graph: its host's GPUs in order when the host has one per rank, else
// the host's first CPU (host-memory ranks).
std::vector<topo::VertexId> Communicator::rankDevices() const {
  const topo::Topology& t = *clusterTopology_;
  std::vector<topo::VertexId> devices(nranks_, -1);
  for (int host = 0; host < locality_->nhosts(); ++host) {
    const std::vector<int> ranks = locality_->ranksOnHost(host);
    const int fusedHost = clusterHost(ranks.front());
    std::vector<topo::VertexId> gpus, cpus;
    for (topo::VertexId v : t.gpus())
      if (t.vertex(v).host == fusedHost) gpus.push_back(v);
    for (topo::VertexId v : t.verticesOfKind(topo::VertexKind::Cpu))
      if (t.vertex(v).host == fusedHost) cpus.push_back(v);
    if (gpus.size() < ranks.size() && cpus.empty()) throwInvalidUsage("host " + peers_[ranks.front()].hostId + " has no CPU vertex");
    // A cluster file in near mode gives each local rank its own CPU vertex beside its NIC.
    const bool ownCpus = clusterView() != nullptr && params::kNetNics.get() == "near" && cpus.size() >= ranks.size();
    for (size_t i = 0; i < ranks.size(); ++i)
      devices[ranks[i]] = gpus.size() >= ranks.size() ? gpus[i] : ownCpus ? cpus[i] : cpus.front();
  }
  return devices;
}

Communicator::Prediction Communicator::predict(algo::Collective collective, size_t bytes, bool inPlace) const {
  if (!clusterTopology_) throwInvalidUsage("no cluster graph to simulate on (TOPOCCL_TOPO_FUSE=0, or a host could not describe itself)");
  CollectiveArgs args;
  args.collective = collective;
  const algo::Plan* fromFile = planFileFor(args, bytes, inPlace);
  // Built afresh rather than taken from plans_, which the progress engine owns.
  std::optional<algo::Plan> built;
  if (!fromFile) {
    built = buildPlan(chooseAlgorithm(collective, bytes), collective, 0);
  }
  const algo::Plan& plan = fromFile ? *fromFile : *built;
  return {plan.name, modelledMicros(plan, bytes, algo::CostModel::fromTopology(*clusterTopology_, rankDevices()))};
}

double Communicator::modelledMicros(const algo::Plan& plan, uint64_t bytes, const algo::CostModel& model) const {
  // The executor cuts a step into >= slicesPerStep_ slices of at most sliceBytes_; model the typical step.
  const algo::Collective c = plan.collective;
  const bool oneBlock = c == algo::Collective::AllReduce || c == algo::Collective::Broadcast || c == algo::Collective::Reduce;
  const double stepBytes = static_cast<double>(bytes) / std::max<uint32_t>(1, plan.chunksPerBlock) /
                           (oneBlock ? 1.0 : static_cast<double>(nranks_));
  algo::SimOptions options;
  options.slices = static_cast<uint32_t>(std::clamp<double>(std::ceil(stepBytes / static_cast<double>(sliceBytes_)),
                                                            static_cast<double>(slicesPerStep_), 64.0));
  options.recordEvents = false;
  return algo::simulate(plan, bytes, model, options).finishUs;
}

// Across hosts the default table's fixed thresholds give way to this cluster's cost model: rank 0 simulates
// every candidate plan per collective and size band on the fused graph and sends the winning rows; every
// rank puts the same rows first, so NCCL_ALGO still filters them and all ranks still choose alike.
void Communicator::modelSelection() {
  if (locality_->nhosts() < 2 || !params::kModelSelection.get()) return;
  std::vector<algo::SelectionRow> rows;
  static_assert(std::is_trivially_copyable_v<algo::SelectionRow>, "rows travel as bytes");
  if (rank_ == 0) {
    try {
      if (!clusterTopology_) throwInvalidUsage("no cluster graph (TOPOCCL_TOPO_FUSE=0, or a host could not describe itself)");
      const algo::CostModel model = algo::CostModel::fromTopology(*clusterTopology_, rankDevices());
      const auto planOf = [&](algo::Algorithm a, algo::Collective c) -> std::optional<algo::Plan> {
        if (a == algo::Algorithm::Hierarchical && !evenHosts()) return std::nullopt;
        return buildPlan(a, c, 0);
      };
      const auto timeOf = [&](const algo::Plan& plan, uint64_t bytes) { return modelledMicros(plan, bytes, model); };
      std::vector<algo::ModelledChoice> choices;
      rows = algo::modelledRows({algo::Collective::AllReduce, algo::Collective::AllGather, algo::Collective::ReduceScatter,
                                 algo::Collective::Broadcast, algo::Collective::Reduce},
                                {0, 4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20}, nranks_, 2, planOf, timeOf, &choices);
      for (const algo::ModelledChoice& choice : choices) {
        std::string line;
        for (const auto& [algorithm, us] : choice.predictedUs)
          line += std::string(" ") + algo::algorithmName(algorithm) + " " + std::to_string(static_cast<long long>(us)) + " us";
        TOPOCCL_INFO(log::kTuning, "modelled %s at %llu B:%s -> %s", algo::collectiveName(choice.collective),
                     static_cast<unsigned long long>(choice.bytes), line.c_str(), algo::algorithmName(choice.best));
      }
    } catch (const std::exception& e) {
      TOPOCCL_WARN("selection: no modelled rows, the default table decides: %s", e.what());
      rows.clear();
    }
  }
  std::string bytes(reinterpret_cast<const char*>(rows.data()), rows.size() * sizeof(algo::SelectionRow));
  bytes = shareFromRankZero(kModelTag, std::move(bytes));
  if (bytes.size() % sizeof(algo::SelectionRow) != 0)
    throwInternalError("selection: rank 0 sent " + std::to_string(bytes.size()) + " bytes of modelled rows");
  rows.resize(bytes.size() / sizeof(algo::SelectionRow));
  std::memcpy(rows.data(), bytes.data(), bytes.size());
  selection_->prependRows(rows);
}

// Rank 0's `bytes` to every rank (the others' argument is ignored); every rank returns rank 0's bytes.
std::string Communicator::shareFromRankZero(int tag, std::string bytes) {
  if (rank_ == 0) {
    for (int r = 1; r < nranks_; ++r) {
      const uint64_t size = bytes.size();
      bootstrap_->send(r, tag, &size, sizeof(size));
      if (size > 0) bootstrap_->send(r, tag, bytes.data(), bytes.size());
    }
    return bytes;
  }
  uint64_t size = 0;
  bootstrap_->recv(0, tag, &size, sizeof(size));
  bytes.resize(size);
  if (size > 0) bootstrap_->recv(0, tag, bytes.data(), size);
  return bytes;
}

void Communicator::synthesizePlans() {
  std::string list = params::kSynthesize.get();
  if (list.empty() || nranks_ < 2) return;
  std::vector<algo::Collective> wanted;
  std::replace(list.begin(), list.end(), ':', ',');
  std::istringstream in(list);
  for (std::string name; std::getline(in, name, ',');) {
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return std::tolower(ch); });
    if (name.empty()) continue;
    if (name == "all") {
      wanted = {algo::Collective::AllGather, algo::Collective::ReduceScatter, algo::Collective::AllReduce,
                algo::Collective::AllToAll};
      continue;
    }
    const std::map<std::string, algo::Collective> known{{"allgather", algo::Collective::AllGather},
                                                         {"reducescatter", algo::Collective::ReduceScatter},
                                                         {"allreduce", algo::Collective::AllReduce},
                                                         {"alltoall", algo::Collective::AllToAll}};
    const auto it = known.find(name);
    if (it == known.end()) {
      throwInvalidArgument("TOPOCCL_SYNTHESIZE: unknown collective '" + name +
                           "' (allgather, reducescatter, allreduce, alltoall or all)");
    }
    if (std::find(wanted.begin(), wanted.end(), it->second) == wanted.end()) wanted.push_back(it->second);
  }
  // Size bands [min, max) and the size each band's plan is synthesized for.
  struct Band {
    uint64_t min, max, at;
  };
  const Band bands[] = {{0, 64 << 10, 16 << 10}, {64 << 10, 4 << 20, 1 << 20}, {4 << 20, UINT64_MAX, 64 << 20}};

  std::string blob;  // rank 0: count, then (collective, band, size, xml) records; empty: nothing to use
  if (rank_ == 0) {
    try {
      if (!clusterTopology_) throwInvalidUsage("no cluster graph (TOPOCCL_TOPO_FUSE=0, or a host could not describe itself)");
      const topo::Topology& t = *clusterTopology_;
      const std::vector<topo::VertexId> devices = rankDevices();
      const algo::synth::PlanCache cache = algo::synth::PlanCache::fromParams();
      algo::synth::SynthOptions options;
      options.budgetSeconds = static_cast<double>(params::kSynthBudgetMs.get()) / 1000.0;
      std::ostringstream out;
      int count = 0;
      std::ostringstream records;
      for (algo::Collective c : wanted) {
        for (size_t b = 0; b < std::size(bands); ++b) {
          algo::synth::CachedSynthesis r = algo::synth::synthesizeCached(t, devices, c, bands[b].at, options, cache);
          std::string xml = r.xml.empty() ? algo::writeMscclXml(r.result.plan) : r.xml;
          TOPOCCL_INFO(log::kInit | log::kTuning, "synthesized %s for %llu..%llu bytes: %s, %.2f us modelled at %llu B%s",
                       algo::collectiveName(c), static_cast<unsigned long long>(bands[b].min),
                       static_cast<unsigned long long>(bands[b].max), r.result.strategy.c_str(), r.result.timeUs,
                       static_cast<unsigned long long>(bands[b].at), r.hit ? " (plan cache)" : "");
          records << static_cast<int>(c) << ' ' << b << ' ' << xml.size() << '\n' << xml;
          ++count;
        }
      }
      blob = std::to_string(count) + "\n" + records.str();
    } catch (const std::exception& e) {
      TOPOCCL_WARN("TOPOCCL_SYNTHESIZE: no synthesized plans, the selection table decides: %s", e.what());
      blob.clear();
    }
  }
  blob = shareFromRankZero(kSynthTag, std::move(blob));
  if (blob.empty()) return;
  std::istringstream records(blob);
  int count = 0;
  records >> count;
  for (int i = 0; i < count; ++i) {
    int collective = 0;
    size_t band = 0, size = 0;
    records >> collective >> band >> size;
    records.get();  // the newline
    std::string xml(size, '\0');
    records.read(xml.data(), static_cast<std::streamsize>(size));
    if (!records || band >= std::size(bands)) throwInternalError("TOPOCCL_SYNTHESIZE: rank 0 sent a malformed plan list");
    algo::Plan plan = algo::parseMscclXml(xml, "synthesized " + std::string(algo::collectiveName(static_cast<algo::Collective>(collective))));
    algo::validateOrThrow(plan, ncclInternalError);
    plan.name = "synth/" + plan.name;  // chosenAlgorithm() and NCCL_DEBUG=INFO show where the plan came from
    plan.minBytes = bands[band].min;
    plan.maxBytes = bands[band].max;
    planFiles_.push_back(std::move(plan));
  }
}

const algo::Plan* Communicator::planFileFor(const CollectiveArgs& args, size_t bytes, bool inPlace) const {
  for (const algo::Plan& plan : planFiles_) {
    if (plan.collective != args.collective || bytes < plan.minBytes || bytes >= plan.maxBytes) continue;
    // Out-of-place plans also serve in-place calls (through a copy of the input). Rooted collectives
    // are in place only at the root, so only plans valid out of place keep every rank's choice alike.
    const bool rooted = args.collective == algo::Collective::Broadcast || args.collective == algo::Collective::Reduce ||
                        args.collective == algo::Collective::Gather || args.collective == algo::Collective::Scatter;
    if (!plan.outOfPlace && (rooted || !inPlace)) continue;
    if (plan.root >= 0 && plan.root != args.root) continue;
    return &plan;
  }
  return nullptr;
}

std::string Communicator::chosenAlgorithm(algo::Collective collective, size_t bytes, bool inPlace) const {
  CollectiveArgs args;
  args.collective = collective;
  if (const algo::Plan* plan = planFileFor(args, bytes, inPlace)) return plan->name;
  return algo::algorithmName(chooseAlgorithm(collective, bytes));
}

Communicator::SelectedPlan Communicator::selectPlan(const CollectiveArgs& args, bool gpuBuffers) {
  const size_t elem = dataTypeSize(args.type);
  const uint32_t inBlocks = algo::inputBlocks(args.collective, nranks_, rank_, args.root);
  const uint32_t outBlocks = algo::outputBlocks(args.collective, nranks_, rank_, args.root);
  SelectedPlan selected;
  selected.inPlace = outBlocks > 0 && inBlocks > 0 && isInPlace(args, rank_, elem);
  // A plan file may cover the call; else the table. In-place is judged the same way on every rank
  // (NCCL requires every rank to call in place or none), so every rank picks the same plan.
  const size_t callBytes = selectionBytes(args, nranks_, elem);
  selected.callBytes = callBytes;
  const algo::Plan* fromFile = planFileFor(args, callBytes, selected.inPlace);
  if (fromFile) {
    selected.plan = fromFile;
    selected.fromFile = true;
    return selected;
  }
  // Buffers that cannot alias get the out-of-place variant, which skips the staging through scratch that
  // in-place calls need (2-rank all-to-all: a third fewer bytes copied). A rank whose buffers partly overlap
  // keeps the variant for either; the variants send the same messages, so ranks may differ in this.
  const bool disjoint = !selected.inPlace && buffersDisjoint(args, inBlocks, outBlocks, elem);
  const algo::Placement placement = disjoint ? algo::Placement::OutOfPlace : algo::Placement::Any;
  selected.placement = placement;
  selected.plan = &planFor(chooseAlgorithm(args.collective, callBytes, gpuBuffers), args.collective, args.root, placement);
  return selected;
}

void Communicator::checkGpuBuffers(const char* function, const CollectiveArgs& args) const {
  const uint32_t inBlocks = algo::inputBlocks(args.collective, nranks_, rank_, args.root);
  const uint32_t outBlocks = algo::outputBlocks(args.collective, nranks_, rank_, args.root);
  // Only the buffers this rank uses count (a non-root's gather output may be anything).
  const bool sendOnGpu = inBlocks == 0 || isGpuPointer(args.send);
  const bool recvOnGpu = outBlocks == 0 || isGpuPointer(args.recv);
  if (!sendOnGpu || !recvOnGpu)
    throwInvalidArgument(std::string(function) + " on rank " + std::to_string(rank_) + ": " +
                         (sendOnGpu ? "sendbuff is GPU memory but recvbuff is not" : "recvbuff is GPU memory but sendbuff is not") +
                         "; pass both on the GPU or both in host memory");
  if (stopping_.load() || aborted_.load()) throwInvalidUsage("communicator is being destroyed or was aborted");
}

bool Communicator::hasGpuPath() {
  std::lock_guard lock(gpuMutex_);
  return gpuPath_ != nullptr;
}

void Communicator::claimGpuCalls() {
  std::lock_guard lock(gpuMutex_);
  if (gpuPath_) gpuPath_->drivenByThisThread();
}

bool Communicator::gpuStaged() const {
  // Decided once: every call of a communicator takes the same route (its ranks decide alike).
  if (const int known = gpuStagedState_.load(std::memory_order_acquire); known >= 0) return known == 1;
  const std::string mode = params::kGpuStaged.get();
  if (mode != "auto" && mode != "always" && mode != "never")
    throwInvalidArgument(std::string(params::kGpuStaged.name()) + "=" + mode + " must be auto, always or never");
  const bool staged = mode == "always" || (mode == "auto" && locality_->nhosts() > 1);
  gpuStagedState_.store(staged ? 1 : 0, std::memory_order_release);
  return staged;
}

void Communicator::ensureGpuPath(int device) {
  if (gpuStaged()) return;  // staged calls need no FIFOs
  std::lock_guard lock(gpuMutex_);
  if (gpuPath_) return;
  const ScopedGpuDevice onDevice(device);  // the set-up allocates on the current device
  const int64_t channels = params::kGpuNChannels.get();
  if (channels < 0 || channels > 32)
    throwInvalidArgument(std::string(params::kGpuNChannels.name()) + "=" + std::to_string(channels) + " must be 0 (by call size) or 1..32");
  // Every rank's GPU, so that all ranks agree on the most lanes the ranks sharing a GPU can keep resident.
  std::vector<GpuIdentity> gpus(static_cast<size_t>(nranks_));
  gpus[static_cast<size_t>(rank_)] = currentGpuIdentity();
  bootstrap_->allGather(gpus.data(), sizeof(GpuIdentity));
  int ranksOnGpu = 1, multiprocessors = INT32_MAX;
  for (const GpuIdentity& g : gpus) {
    ranksOnGpu = std::max<int>(ranksOnGpu, static_cast<int>(std::count_if(gpus.begin(), gpus.end(), [&](const GpuIdentity& h) {
                                 return std::memcmp(g.uuid, h.uuid, sizeof(g.uuid)) == 0;
                               })));
    multiprocessors = std::min(multiprocessors, g.multiprocessors);
  }
  gpuFixedLanes_ = channels > 0;
  const kernels::DeviceFifoGeometry fifo = gpuFifoGeometry(nranks_);
  const size_t fifoBytesPerLane = static_cast<size_t>(nranks_) *
                                  (sizeof(kernels::DeviceFifoCounters) + fifo.simpleBytes() + fifo.lowLatencyBytes());
  gpuChannels_ = channels > 0 ? static_cast<int>(channels) : gpuMaxRingLanes(multiprocessors, ranksOnGpu, fifoBytesPerLane);
  TOPOCCL_INFO(log::kInit, "rank %d: GPU rings of %s%d lanes (%d multiprocessors, %d ranks on the busiest GPU)", rank_,
               gpuFixedLanes_ ? "" : "up to ", gpuChannels_, multiprocessors, ranksOnGpu);
  GpuPathContext context;
  context.rank = rank_;
  context.nranks = nranks_;
  context.nchannels = std::max(nchannels_, gpuChannels_);
  context.peers = peers_;
  context.timeout = timeout_;
  context.maxLanes = gpuChannels_;
  context.allGather = [this](void* data, size_t bytes) { bootstrap_->allGather(data, bytes); };
  gpuPath_ = makeGpuPath(context);
  gpuPathForAbort_.store(gpuPath_.get());
}

bool Communicator::pointToPointSetsUpGpuPath(const std::vector<PointToPointArgs>& ops, bool everyRankInGroup) {
  if (gpuStaged() || hasGpuPath() || gpuPointToPointSetUpFailed_.load()) return false;
  if (everyRankInGroup) return true;
  if (nranks_ != 2) return false;
  return std::any_of(ops.begin(), ops.end(), [&](const PointToPointArgs& op) { return op.count > 0 && op.peer != rank_; });
}

bool Communicator::pointToPointOnGpuKernel(const std::vector<PointToPointArgs>& ops, bool everyRankInGroup) {
  if (gpuStaged()) return false;
  if (pointToPointSetsUpGpuPath(ops, everyRankInGroup)) {
    const PointToPointArgs& first = ops.front();
    setUpGpuPathForPointToPoint(gpuDeviceOf(first.isSend ? first.send : first.recv));
  }
  std::lock_guard lock(gpuMutex_);
  return gpuPath_ != nullptr && gpuPath_->pointToPointLanes(everyRankInGroup) > 0;
}

void Communicator::setUpGpuPathForPointToPoint(int device) {
  try {
    ensureGpuPath(device);
  } catch (const Error& e) {
    // The set-up fails alike on every rank (the checks that throw come after the exchange and see the same facts).
    gpuPointToPointSetUpFailed_.store(true);
    TOPOCCL_WARN("rank %d: sends and receives on GPU buffers go through host memory: the GPU path could not be set up: %s",
                 rank_, e.what());
  }
}

void Communicator::enqueuePointToPointOnGpu(const std::vector<PointToPointArgs>& ops, void* stream,
                                            const std::vector<void*>& otherStreams) {
  if (stopping_.load() || aborted_.load()) throwInvalidUsage("ncclSend/ncclRecv: communicator is being destroyed or was aborted");
  std::vector<DevicePointToPoint> calls;
  calls.reserve(ops.size());
  for (const PointToPointArgs& op : ops)
    calls.push_back({op.isSend, op.peer, static_cast<const char*>(op.send), static_cast<char*>(op.recv),
                     static_cast<uint64_t>(op.count) * dataTypeSize(op.type)});
  std::lock_guard lock(gpuMutex_);
  if (!gpuPath_) throwInternalError("sends and receives on GPU buffers were enqueued before the GPU path was set up");
  gpuPath_->enqueuePointToPoint(calls, stream, otherStreams);
}

std::shared_ptr<Work> Communicator::enqueueStaged(const char* function, std::vector<Operation> operations, void* stream,
                                                const std::vector<void*>& otherStreams) {
  if (stopping_.load() || aborted_.load()) throwInvalidUsage(std::string(function) + ": communicator is being destroyed or was aborted");
  // The copies and the waiting kernel run on the device that holds the call's GPU buffers.
  int device = -1;
  for (const Operation& op : operations) {
    if (const auto* p2p = std::get_if<PointToPointArgs>(&op)) device = gpuDeviceOf(p2p->isSend ? p2p->send : p2p->recv);
    else device = gpuDeviceOf(std::get<CollectiveArgs>(op).recv ? std::get<CollectiveArgs>(op).recv : std::get<CollectiveArgs>(op).send);
    if (device >= 0) break;
  }
  const ScopedGpuDevice onDevice(device);
  std::lock_guard lock(stagingMutex_);
  if (!gpuStaging_) {
    gpuStaging_ = makeGpuStaging(rank_, nranks_, timeout_);
    gpuStagingForAbort_.store(gpuStaging_.get());
    TOPOCCL_INFO(log::kInit, "rank %d: GPU buffers go through pinned host memory (%s)", rank_,
                 locality_->nhosts() > 1 ? "peers on other hosts" : "point-to-point, or TOPOCCL_GPU_STAGED=always");
  }
  JobHooks hooks = gpuStaging_->stage(operations, stream, otherStreams);
  return submit(std::move(operations), std::move(hooks));
}

void Communicator::enqueueOnGpu(const char* function, const CollectiveArgs& args, void* stream) {
  enqueueGroupOnGpu(function, {args}, stream);
}

void Communicator::enqueueGroupOnGpu(const char* function, const std::vector<CollectiveArgs>& calls, void* stream) {
  for (const CollectiveArgs& args : calls) checkGpuBuffers(function, args);
  if (gpuStaged()) {
    for (const CollectiveArgs& args : calls)
      if (args.count > 0) enqueueStaged(function, {args}, stream);
    return;
  }
  ensureGpuPath(-1);
  std::lock_guard lock(gpuMutex_);
  std::vector<GpuCall> batch;
  batch.reserve(calls.size());
  for (const CollectiveArgs& args : calls) {
    SelectedPlan selected = selectPlan(args, /*gpuBuffers=*/true);
    // Large calls get many lanes, since a GPU needs many thread blocks to move bytes at its rate: a ring where
    // it supports the collective, all-to-all direct with a channel per `nranks` lanes to every peer (a plan
    // file still wins). Every rank decides alike: the same call size and parameters.
    const int lanes = gpuFixedLanes_ ? gpuChannels_ : gpuRingLanes(selected.callBytes, nranks_, gpuChannels_);
    const bool wide = !selected.fromFile && nranks_ > 1 &&
                      selected.callBytes >= static_cast<size_t>(std::max<int64_t>(0, params::kGpuRingBytes.get()));
    const bool ring = wide && lanes > 1 && algo::algorithmSupports(algo::Algorithm::Ring, args.collective);
    const bool direct = wide && args.collective == algo::Collective::AllToAll && lanes / nranks_ > 1;
    if (ring || direct) {
      const int channels = ring ? lanes : lanes / nranks_;
      auto& slot = gpuRingPlans_[{static_cast<int>(args.collective), args.root, static_cast<int>(selected.placement), channels}];
      if (!slot) {
        slot = std::make_unique<algo::Plan>(algo::makePlan(ring ? algo::Algorithm::Ring : algo::Algorithm::Direct, args.collective,
                                                           nranks_, args.root, channels, selected.placement));
        algo::validateOrThrow(*slot);
      }
      selected.plan = slot.get();
    }
    batch.push_back({selected.plan, &args, selected.inPlace, selection_->chooseProtocol(args.collective, selected.callBytes)});
  }
  gpuPath_->enqueue(batch, stream);
}

std::unique_ptr<Execution> Communicator::buildCollective(const CollectiveArgs& args,
                                                         std::vector<std::function<void()>>& after) {
  const size_t elem = dataTypeSize(args.type);
  if (args.count == 0) return nullptr;
  // The same call as the last one, which needed no per-call work (no prescaling, nothing to run after): its
  // execution again, without selecting and resolving the plan (the training loop's and the benchmark's case).
  if (spareExecution_ && spareCallReusable_ && sameCall(args, spareCall_)) {
    std::unique_ptr<Execution> again = std::move(spareExecution_);
    again->reset();
    builtFromSpareCall_ = true;  // spareKey_ and spareCall_ still describe it
    return again;
  }
  builtFromSpareCall_ = false;
  builtCallReusable_ = false;  // until this call proves it needs no per-call work
  spareCallReusable_ = false;  // this call may grow the arenas the spare points into (the key check below still applies)
  const uint32_t inBlocks = algo::inputBlocks(args.collective, nranks_, rank_, args.root);
  const uint32_t outBlocks = algo::outputBlocks(args.collective, nranks_, rank_, args.root);
  const char* input = static_cast<const char*>(args.send);
  char* output = static_cast<char*>(args.recv);
  const SelectedPlan selected = selectPlan(args);
  const bool inPlace = selected.inPlace;
  const algo::Plan& plan = *selected.plan;

  // Lower the reduction: PreMulSum and floating Avg scale each input once up front; integer Avg
  // sums and divides the result. Kernels only ever see Sum/Prod/Max/Min.
  ReduceOp op = args.reduce.op;
  const void* scalar = args.reduce.scalarPointer ? args.reduce.scalarPointer : args.reduce.scalar;
  unsigned char reciprocal[8] = {};
  if (op == ReduceOp::Avg && isFloatingPoint(args.type)) {
    kernels::reciprocalScalar(args.type, static_cast<uint64_t>(nranks_), reciprocal);
    scalar = reciprocal;
    op = ReduceOp::PreMulSum;
  }
  const size_t inputElements = static_cast<size_t>(inBlocks) * args.count;
  const bool needsCopy = op == ReduceOp::PreMulSum || (inPlace && !plan.inPlace);
  if (needsCopy && inputElements > 0) {
    char* prescaled = prescaled_.reserve(inputElements * elem);
    if (op == ReduceOp::PreMulSum)
      kernels::hostScale(args.type, prescaled, input, inputElements, scalar);
    else
      std::memcpy(prescaled, input, inputElements * elem);
    input = prescaled;
  } else if (!inPlace && !plan.outOfPlace) {
    throwInternalError(std::string("plan '") + plan.name + "' for " + algo::collectiveName(args.collective) +
                       " supports only in-place buffers");
  }
  const ReduceOp kernelOp = (op == ReduceOp::PreMulSum || op == ReduceOp::Avg) ? ReduceOp::Sum : op;
  kernels::ReduceFn reduce = nullptr;
  if (args.collective == algo::Collective::AllReduce || args.collective == algo::Collective::ReduceScatter ||
      args.collective == algo::Collective::Reduce)
    reduce = kernels::hostReduceFunction(args.type, kernelOp);
  if (op == ReduceOp::Avg && outBlocks > 0) {
    const DataType type = args.type;
    const size_t n = static_cast<size_t>(outBlocks) * args.count;
    const uint64_t divisor = static_cast<uint64_t>(nranks_);
    after.push_back([=] { kernels::hostDivide(type, output, output, n, divisor); });
  }

  const size_t blockBytes = args.count * elem;
  const size_t scratchSize = scratchBytes(plan, args.count, elem);
  char* scratch = scratchSize == 0 ? nullptr : scratch_.reserve(scratchSize);
  const PlanBuffers buffers{input, output, scratch, args.count, elem};
  auto pointer = [&](const algo::ChunkRange& range, size_t* bytes) -> char* {
    const ResolvedRange resolved = resolveRange(plan, range, buffers, rank_);
    *bytes = resolved.bytes;
    return resolved.data;
  };

  const ExecutionKey key{&plan, input, output, scratch, args.count, elem, reduce};
  builtKey_ = key;
  builtCall_ = args;
  builtCallReusable_ = !needsCopy && after.empty();
  if (spareExecution_ && spareKey_ == key) {
    std::unique_ptr<Execution> again = std::move(spareExecution_);
    again->reset();
    return again;
  }
  // What this rank's buffers take (in place, one buffer: the input lies inside the output or the other way
  // round), times the ranks sharing the machine's caches.
  const uint64_t bufferBlocks = inPlace && !needsCopy ? std::max(inBlocks, outBlocks) : uint64_t{inBlocks} + outBlocks;
  const uint64_t footprint = bufferBlocks * blockBytes * machineRanks_;

  std::vector<ResolvedLane> lanes;
  const auto& program = plan.ranks[rank_];
  for (size_t l = 0; l < program.lanes.size(); ++l) {
    const algo::Lane& lane = program.lanes[l];
    ResolvedLane resolved;
    if (lane.sendPeer >= 0) resolved.sendConn = connection(lane.sendPeer, lane.channel);
    if (lane.recvPeer >= 0) resolved.recvConn = connection(lane.recvPeer, lane.channel);
    resolved.label = "lane " + std::to_string(l) + " (send rank " + std::to_string(lane.sendPeer) + ", recv rank " +
                     std::to_string(lane.recvPeer) + ", channel " + std::to_string(lane.channel) + ")";
    for (const algo::Step& step : lane.steps) {
      ResolvedStep r;
      r.kind = step.kind;
      r.deps = step.deps;
      r.waitsOutOwnSends = step.waitsOutOwnSends;
      r.resultReturnsIn = step.resultReturnsIn;
      r.sendsResultOf = step.sendsResultOf;
      size_t srcBytes = 0, dstBytes = 0;
      if (algo::stepReads(step.kind)) r.src = pointer(step.src, &srcBytes);
      if (algo::stepWrites(step.kind)) r.dst = pointer(step.dst, &dstBytes);
      r.bytes = algo::stepReads(step.kind) ? srcBytes : dstBytes;
      resolved.steps.push_back(std::move(r));
    }
    lanes.push_back(std::move(resolved));
  }
  fuseStagedReceives(lanes, scratch, scratchSize, sliceBytes_);  // slices never exceed sliceBytes_
  fuseMirroredCopies(lanes);
  linkResultMirrors(lanes);
  std::string name = std::string(algo::collectiveName(args.collective)) + " (" + plan.name + ", " +
                     std::to_string(args.count) + " x " + dataTypeName(args.type) + ")";
  auto execution = std::make_unique<Execution>(std::move(name), std::move(lanes), reduce, elem, sliceBytes_, &staging_, slicesPerStep_);
  execution->setTrace(trace_.get());
  execution->routeSends(sendRule_);
  // Not where ranks reduce: there the copies are the all-gather half, and the reduced chunks they copy are
  // still in cache (2-rank all-reduce at 32-256 MiB took 1.04-1.15x longer with them).
  const transport::CopyFn cachedCopy = bulkCopy_ ? &kernels::bulkCopy : nullptr;
  const bool streaming = reduce == nullptr && footprint >= streamingThreshold_;
  // In place, the bytes a peer has just read from our buffer, which we then overwrite, are still in the caches
  // until the footprint is a few times the streaming threshold: there streaming stores would only evict them
  // (4-rank in-place all-to-all at 16 MiB: 3.0 ms cached against 4.0 streaming; at 128 MiB, past the bound, 34.3
  // against 30.9; perf/RESULTS.md, session 41).
  const bool sentBytesCached = footprint / kSentBytesCachedFootprints < streamingThreshold_;
  // Timed (CopyTuner) out of place below the threshold only. In place, where receives land in bytes just sent,
  // timing picked the slower kernel as often as not; past the threshold streaming was as fast as timing's choice
  // or faster, which paid for its trials (perf/RESULTS.md, session 48).
  const bool tuned = reduce == nullptr && !inPlace && footprint >= copyTuningFrom_ && footprint < streamingThreshold_;
  const transport::CopyFn sentBytesStreaming = !sentBytesCached ? &kernels::streamingCopy : cachedCopy;
  const transport::CopyFn timedCached = bulkCopy_ ? &timedCachedCopy : &timedMemcpy;
  if (tuned)
    execution->setCopyChoices({timedCached, timedCached}, {&timedStreamingCopy, &timedStreamingCopy},
                              streaming ? CopyKernel::Streaming : CopyKernel::Cached, CopyTuner::Shape{&plan, blockBytes});
  else
    execution->setCopyChoices({cachedCopy, cachedCopy}, {&kernels::streamingCopy, sentBytesStreaming},
                              streaming ? CopyKernel::Streaming : CopyKernel::Cached, std::nullopt);
  return execution;
}

std::unique_ptr<Execution> Communicator::buildPointToPoint(const std::vector<const PointToPointArgs*>& ops) {
  // Per peer, sends ride one lane and receives another, each in call order, which is NCCL's
  // matching rule. Sends to self pair with receives from self in order.
  std::map<int, std::vector<const PointToPointArgs*>> sends, recvs;
  for (const auto* op : ops) (op->isSend ? sends : recvs)[op->peer].push_back(op);
  std::vector<ResolvedLane> lanes;
  auto& selfSends = sends[rank_];
  auto& selfRecvs = recvs[rank_];
  if (selfSends.size() != selfRecvs.size())
    throwInvalidUsage("rank " + std::to_string(rank_) + " posted " + std::to_string(selfSends.size()) +
                      " sends to itself but " + std::to_string(selfRecvs.size()) + " receives from itself in one group");
  if (!selfSends.empty()) {
    ResolvedLane lane;
    lane.label = "send/recv to self";
    for (size_t i = 0; i < selfSends.size(); ++i) {
      const size_t sendBytes = selfSends[i]->count * dataTypeSize(selfSends[i]->type);
      const size_t recvBytes = selfRecvs[i]->count * dataTypeSize(selfRecvs[i]->type);
      if (sendBytes != recvBytes)
        throwInvalidUsage("send to self of " + std::to_string(sendBytes) + " bytes matched with a receive of " +
                          std::to_string(recvBytes) + " bytes on rank " + std::to_string(rank_));
      lane.steps.push_back({algo::StepKind::Copy, static_cast<const char*>(selfSends[i]->send),
                            static_cast<char*>(selfRecvs[i]->recv), sendBytes, {}});
    }
    lanes.push_back(std::move(lane));
  }
  for (auto& [peer, list] : sends) {
    if (peer == rank_ || list.empty()) continue;
    ResolvedLane lane;
    lane.sendConn = connection(peer, kPointToPointChannel);
    lane.label = "send to rank " + std::to_string(peer);
    for (const auto* op : list)
      lane.steps.push_back({algo::StepKind::Send, static_cast<const char*>(op->send), nullptr,
                            op->count * dataTypeSize(op->type), {}});
    lanes.push_back(std::move(lane));
  }
  for (auto& [peer, list] : recvs) {
    if (peer == rank_ || list.empty()) continue;
    ResolvedLane lane;
    lane.recvConn = connection(peer, kPointToPointChannel);
    lane.label = "receive from rank " + std::to_string(peer);
    for (const auto* op : list)
      lane.steps.push_back({algo::StepKind::Recv, nullptr, static_cast<char*>(op->recv),
                            op->count * dataTypeSize(op->type), {}});
    lanes.push_back(std::move(lane));
  }
  if (lanes.empty()) return nullptr;
  auto execution = std::make_unique<Execution>("send/recv", std::move(lanes), nullptr, 1, sliceBytes_, nullptr, slicesPerStep_);
  execution->setTrace(trace_.get());
  execution->routeSends(sendRule_);
  return execution;
}

bool Communicator::armDoorbells(Execution* collective, Execution* pointToPoint) {
  bool armable = collective != nullptr || (pointToPoint != nullptr && !pointToPoint->finished());
  if (armable && collective) armable = collective->armDoorbells(armedBells_);
  if (armable && pointToPoint && !pointToPoint->finished()) armable = pointToPoint->armDoorbells(armedBells_);
  if (armable && !armedBells_.empty()) {
    transport::sealArming(armedBells_);
    return true;
  }
  transport::disarm(armedBells_);
  return false;
}

void Communicator::runGroup(std::vector<Operation>& operations) {
  // Members, so the per-call path reuses their capacity (one job runs at a time).
  groupPointToPoint_.clear();
  groupCollectives_.clear();
  for (const auto& op : operations) {
    if (const auto* c = std::get_if<CollectiveArgs>(&op)) groupCollectives_.push_back(c);
    else groupPointToPoint_.push_back(&std::get<PointToPointArgs>(op));
  }
  runGroupLists();
}

void Communicator::chooseCopies(Execution& execution) {
  copyTicket_ = {};
  if (!execution.tunedShape()) return;
  copyTicket_ = copyTuner_.begin(*execution.tunedShape(), execution.fallbackCopy());
  execution.useCopy(copyTicket_.kernel);
  copyStarted_ = copyNanoseconds();
}

void Communicator::timedCopies(const Execution& execution) {
  const double elapsed = static_cast<double>(copyNanoseconds() - copyStarted_);
  const CopyTuner::Estimate* before = copyTuner_.estimate(copyTicket_.shape);
  const CopyKernel was = before ? before->preferred : copyTicket_.kernel;
  const bool wasChoosing = before && (before->samples[0] < CopyTuner::kFirstSamples || before->samples[1] < CopyTuner::kFirstSamples);
  copyTuner_.finish(copyTicket_, elapsed);
  copyTicket_.timed = false;
  const CopyTuner::Estimate* now = copyTuner_.estimate(copyTicket_.shape);
  const bool firstChoice = wasChoosing && now && now->samples[0] >= CopyTuner::kFirstSamples && now->samples[1] >= CopyTuner::kFirstSamples;
  if (now && (firstChoice || now->preferred != was) && log::enabled(log::Level::Info, log::kTuning))
    TOPOCCL_INFO(log::kTuning, "comm %s rank %d: %s copies with %s (call %llu: %.0f us cached, %.0f us streaming stores)",
                 options_.name.c_str(), rank_, execution.operation().c_str(), copyKernelName(now->preferred),
                 static_cast<unsigned long long>(now->calls), now->nanoseconds(CopyKernel::Cached) / 1e3, now->nanoseconds(CopyKernel::Streaming) / 1e3);
}

void Communicator::startGroupLists() {
  transport::disarm(armedBells_);  // left armed by an error in the last call
  GroupProgress& g = group_;
  groupAfter_.clear();
  // Point-to-point progresses alongside the collectives; collectives run one after another in
  // call order, which every rank shares, so their connections never interleave.
  g.pointToPoint = groupPointToPoint_.empty() ? nullptr : buildPointToPoint(groupPointToPoint_);
  g.current.reset();
  copyTicket_ = {};
  g.next = 0;
  g.loops = 0;
  g.idle = 0;
  g.lastMove = {};
}

bool Communicator::advanceGroup(bool& moved) {
  GroupProgress& g = group_;
  const auto& collectives = groupCollectives_;
  auto& after = groupAfter_;
  auto runAfter = [&] {
    for (auto& fn : after) fn();
    after.clear();
  };
  if (aborted_.load(std::memory_order_relaxed)) throwInvalidUsage("communicator was aborted (ncclCommAbort)");
  moved = false;
  while (!g.current && g.next < collectives.size()) {
    g.current = buildCollective(*collectives[g.next++], after);
    if (!g.current) runAfter();  // nothing to move (zero count)
    else chooseCopies(*g.current);
  }
  if (g.current && g.current->progress()) {
    if (copyTicket_.timed) timedCopies(*g.current);
    spareExecution_ = std::move(g.current);  // buildCollective may reuse it for the next identical call
    if (!builtFromSpareCall_) {
      spareKey_ = builtKey_;
      spareCall_ = builtCall_;
      spareCallReusable_ = builtCallReusable_;
    }
    runAfter();
    moved = true;
  } else if (g.current) {
    moved |= g.current->movedLastTime();
  }
  if (g.pointToPoint && !g.pointToPoint->finished()) {
    g.pointToPoint->progress();
    moved |= g.pointToPoint->movedLastTime();
  }
  // Transports accept newcomers here (a TCP accept costs a syscall that allocates a socket even
  // when nobody is waiting), so only transports with connections, and only now and then.
  if ((++g.loops & 63) == 0)
    for (auto* t : {localTransport_.get(), shmTransport_.get(), socketTransport_.get()})
      if (t && usedTransports_.count(t)) t->progress();
  if (!g.current && g.next >= collectives.size() && (!g.pointToPoint || g.pointToPoint->finished())) return true;
  // Nothing moved: our peers' work that we can take on meanwhile (an shm receiver copying our large message),
  // unless ranks share cores: then the time is a peer's own (4-rank broadcast on 2 CPUs: 8 MiB 1.4x slower).
  if (!moved && g.current && !sharesCores_) moved = g.current->helpPeers();
  return false;
}

void Communicator::checkStall() {
  // The stall clock starts 256 idle passes after a move: a short wait never reads it.
  GroupProgress& g = group_;
  if ((g.idle & 255) != 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (g.idle == 256) g.lastMove = now;
  if (now - g.lastMove <= timeout_) return;
  std::string waiting;
  if (g.current) waiting += g.current->operation() + ":" + g.current->describeWaiting();
  if (g.pointToPoint && !g.pointToPoint->finished()) waiting += "\n send/recv:" + g.pointToPoint->describeWaiting();
  throwRemoteError("rank " + std::to_string(rank_) + " made no progress for " + std::to_string(timeout_.count()) +
                   " ms (TOPOCCL_TIMEOUT_MS); a peer may have died or not called the same operation. Waiting:\n " + waiting);
}

void Communicator::runGroupLists() {
  startGroupLists();
  GroupProgress& g = group_;
  struct DropOnExit {  // as locals would be, on return and on a throw
    GroupProgress& g;
    ~DropOnExit() { g.current.reset(), g.pointToPoint.reset(); }
  } drop{g};
  unsigned nextPollLook = 0;  // the idle count at which to ask again whether every connection can be poll()ed
  for (;;) {
    bool moved = false;
    if (advanceGroup(moved)) return;
    if (moved) {
      if (!armedBells_.empty()) transport::disarm(armedBells_);
      g.idle = nextPollLook = 0;
      continue;
    }
    // Spin while our ranks have cores to themselves; yield, then sleep, soon when they share them. Shm and
    // local peers ring a doorbell when they move something (idleBeforeSleep_); when every connection in play
    // is a socket, sleep in poll() instead (idleBeforePoll_): spinning on recv() would take the CPU the
    // kernel's TCP stack needs to move the data we wait for.
    const unsigned idle = ++g.idle;
    Execution* const current = g.current.get();
    Execution* const pointToPoint = g.pointToPoint.get();
    bool slept = false;
    if (!armedBells_.empty()) {
      // Armed in the last loop, whose look found nothing since: anything published later rings.
      transport::sleepUntilRung(armedBells_, std::chrono::milliseconds(1));  // abort and the stall clock stay responsive
      slept = true;
    } else if (idle > idleBeforeSleep_ && armDoorbells(current, pointToPoint)) {
      slept = true;  // one more look at the connections before sleeping, in the next loop
    } else if (idle > idleBeforePoll_ && idle >= nextPollLook) {
      pollFds_.clear();
      bool pollable = current || (pointToPoint && !pointToPoint->finished());
      if (pollable && current) pollable = current->addPollDescriptors(pollFds_);
      if (pollable && pointToPoint && !pointToPoint->finished()) pollable = pointToPoint->addPollDescriptors(pollFds_);
      if (pollable && !pollFds_.empty()) {
        ::poll(pollFds_.data(), pollFds_.size(), 1);  // 1 ms: abort and the stall clock stay responsive
        slept = true;
      } else {
        nextPollLook = idle + 256;  // shared memory in play: not on every spin (a socket's handshake may yet finish)
      }
    }
    if (!slept && idle > spinsBeforeYield_) sched_yield();
    if (!slept && idle > spinsBeforeYield_ + 4096) usleep(50);
    checkStall();
  }
}

size_t Communicator::operationBytes(const std::vector<Operation>& operations) const {
  size_t bytes = 0;
  for (const auto& op : operations) {
    if (const auto* c = std::get_if<CollectiveArgs>(&op)) bytes += selectionBytes(*c, nranks_, dataTypeSize(c->type));
    else bytes += std::get<PointToPointArgs>(op).count * dataTypeSize(std::get<PointToPointArgs>(op).type);
  }
  return bytes;
}

bool Communicator::beginInterleaved(std::vector<Operation>& operations) {
  std::string refused;
  if (refusesWork(refused) || !claimInline()) return false;
  group_.code = ncclSuccess;
  group_.message.clear();
  group_.finished = false;
  if (failed_.load(std::memory_order_acquire)) {
    std::lock_guard lock(queueMutex_);
    group_.code = asyncError_;
    group_.message = "communicator already failed: " + asyncErrorMessage_;
    group_.finished = true;
    return true;
  }
  groupPointToPoint_.clear();
  groupCollectives_.clear();
  for (const auto& op : operations) {
    if (const auto* c = std::get_if<CollectiveArgs>(&op)) groupCollectives_.push_back(c);
    else groupPointToPoint_.push_back(&std::get<PointToPointArgs>(op));
  }
  group_.started = false;
  return true;
}

bool Communicator::stepInterleaved(bool& moved) {
  moved = false;
  if (group_.finished) return true;
  log::setThreadRank(rank_);
  const ncclResult_t code = executeBody(group_.message, [&] {
    if (!group_.started) {
      startGroupLists();
      group_.started = true;
    }
    group_.finished = advanceGroup(moved);
    if (group_.finished) return;
    if (moved) group_.idle = 0;
    else ++group_.idle, checkStall();
  });
  if (code != ncclSuccess) group_.code = code, group_.finished = true;
  return group_.finished;
}

ncclResult_t Communicator::endInterleaved(std::string& message) {
  group_.current.reset(), group_.pointToPoint.reset();  // unfinished only when another could not start: nothing ran
  message = std::move(group_.message);
  releaseEngine(false);
  return group_.finished ? group_.code : ncclSuccess;
}

void Communicator::recordFailure(ncclResult_t code, const std::string& message) {
  TOPOCCL_WARN("%s", message.c_str());
  std::lock_guard lock(queueMutex_);
  if (asyncError_ == ncclSuccess) {
    asyncError_ = code;
    asyncErrorMessage_ = message;
    failed_.store(true, std::memory_order_release);
  }
}

ncclResult_t Communicator::execute(std::vector<Operation>& operations, std::string& message) {
  return executeBody(message, [&] { runGroup(operations); });
}

template <class Body>
ncclResult_t Communicator::executeBody(std::string& message, Body&& body) {
  if (failed_.load(std::memory_order_acquire)) {
    std::lock_guard lock(queueMutex_);
    message = "communicator already failed: " + asyncErrorMessage_;
    return asyncError_;
  }
  ncclResult_t code = ncclSuccess;
  try {
    body();
  } catch (const Error& e) {
    code = e.code();
    message = e.what();
  } catch (const std::exception& e) {
    code = ncclInternalError;
    message = e.what();
  }
  if (code != ncclSuccess) recordFailure(code, message);
  return code;
}

void Communicator::releaseEngine(bool queuedJob) {
  if (!queuedJob) {
    // An inline call: no fence (a seq_cst store drains the store buffer, which then waits for the peer's
    // cache lines: 4-rank broadcasts took 1.25x longer). Only the thread that issues operations queues jobs
    // (NCCL allows one at a time per communicator), so none was queued during this call; a finalize() on
    // another thread rechecks every millisecond.
    busy_.store(false, std::memory_order_release);
    if (stopping_.load(std::memory_order_relaxed) || idleWaiters_.load(std::memory_order_relaxed) > 0) {
      { std::lock_guard lock(queueMutex_); }
      queueChanged_.notify_all();
      idle_.notify_all();
    }
    return;
  }
  pending_.fetch_sub(1, std::memory_order_seq_cst);
  busy_.store(false, std::memory_order_seq_cst);
  // Dekker with submit()/finalize(): they publish before they look at busy_/pending_, we after.
  const bool wakeEngine = queued_.load(std::memory_order_seq_cst) > 0 || stopping_.load(std::memory_order_seq_cst);
  const bool wakeIdle = idleWaiters_.load(std::memory_order_seq_cst) > 0;
  if (!wakeEngine && !wakeIdle) return;  // the per-call path of a blocking caller: no lock, no syscall
  { std::lock_guard lock(queueMutex_); }  // a waiter is either before its predicate or asleep
  if (wakeEngine) queueChanged_.notify_all();
  if (wakeIdle) idle_.notify_all();
}

void Communicator::progressLoop() {
  log::setThreadRank(rank_);
  for (;;) {
    Job job;
    {
      std::unique_lock lock(queueMutex_);
      queueChanged_.wait(lock, [&] {
        bool idle = false;
        if (!queue_.empty()) return busy_.compare_exchange_strong(idle, true, std::memory_order_seq_cst);
        return stopping_.load(std::memory_order_seq_cst);
      });
      if (queue_.empty()) return;  // stopping, nothing left
      job = std::move(queue_.front());
      queue_.pop_front();
      queued_.fetch_sub(1, std::memory_order_seq_cst);
    }
    std::string message;
    ncclResult_t code = ncclSuccess;
    if (job.hooks.before) {
      try {
        code = job.hooks.before(message);
      } catch (const std::exception& e) {
        code = ncclInternalError;
        message = e.what();
      }
      if (code != ncclSuccess) recordFailure(code, message);
    }
    if (code == ncclSuccess) code = execute(job.operations, message);
    const bool streamJob = static_cast<bool>(job.hooks.after);
    if (job.hooks.after) job.hooks.after(code);
    job.work->complete(code, std::move(message));
    releaseEngine(true);
    if (streamJob) streamJobs_.fetch_sub(1, std::memory_order_seq_cst);
  }
}

bool Communicator::refusesWork(std::string& message) const {
  if (!stopping_.load(std::memory_order_relaxed) && !aborted_.load(std::memory_order_relaxed)) return false;
  message = "communicator is being destroyed or was aborted";
  return true;
}

bool Communicator::claimInline() {
  // Idle engine and nothing queued: run here, saving two thread hand-offs per call. The engine only runs jobs
  // this thread queued (one thread issues operations at a time, NCCL's rule): once it took the last one
  // (queued_ 0) and released it (busy_ false), it cannot claim again before our next submit(), so plain
  // loads and a store claim it, without a locked instruction.
  if (queued_.load(std::memory_order_acquire) != 0 || busy_.load(std::memory_order_acquire)) return false;
  busy_.store(true, std::memory_order_relaxed);
  log::setThreadRank(rank_);
  return true;
}

ncclResult_t Communicator::run(std::vector<Operation>& operations, std::string& message) {
  if (refusesWork(message)) return ncclInvalidUsage;
  if (claimInline()) {
    const ncclResult_t code = execute(operations, message);
    releaseEngine(false);
    return code;
  }
  auto work = submit(std::move(operations));
  work->wait();
  message = work->errorMessage();
  return work->result();
}

ncclResult_t Communicator::runCollective(const CollectiveArgs& args, std::string& message) {
  if (refusesWork(message)) return ncclInvalidUsage;
  if (!claimInline()) {
    std::vector<Operation> operations{args};
    return run(operations, message);
  }
  const ncclResult_t code = executeBody(message, [&] {
    groupPointToPoint_.clear();
    groupCollectives_.assign(1, &args);
    runGroupLists();
  });
  releaseEngine(false);
  return code;
}

std::shared_ptr<Work> Communicator::runBlocking(std::vector<Operation> operations) {
  std::string message;
  const ncclResult_t code = run(operations, message);
  auto work = std::make_shared<Work>();
  work->complete(code, std::move(message));
  return work;
}

std::shared_ptr<Work> Communicator::submit(std::vector<Operation> operations, JobHooks hooks) {
  auto work = std::make_shared<Work>();
  {
    std::unique_lock lock(queueMutex_);
    if (stopping_ || aborted_) {
      lock.unlock();
      if (hooks.after) hooks.after(ncclInvalidUsage);
      work->complete(ncclInvalidUsage, "communicator is being destroyed or was aborted");
      return work;
    }
    if (hooks.after) streamJobs_.fetch_add(1, std::memory_order_seq_cst);
    queue_.push_back({std::move(operations), work, std::move(hooks)});
    pending_.fetch_add(1, std::memory_order_seq_cst);
    queued_.fetch_add(1, std::memory_order_seq_cst);
  }
  queueChanged_.notify_all();
  return work;
}

void Communicator::finalize() {
  idleWaiters_.fetch_add(1, std::memory_order_seq_cst);
  {
    std::unique_lock lock(queueMutex_);
    // Timed: an inline call's release does not fence, so it may miss a waiter that arrived meanwhile.
    while (!idle_.wait_for(lock, std::chrono::milliseconds(1), [&] {
      return pending_.load(std::memory_order_seq_cst) == 0 && !busy_.load(std::memory_order_seq_cst);
    })) {
    }
  }
  idleWaiters_.fetch_sub(1, std::memory_order_seq_cst);
}

void Communicator::abort() {
  aborted_ = true;
  if (GpuPath* gpu = gpuPathForAbort_.load()) gpu->abort();  // kernels stop at their next wait
  if (GpuStaging* staging = gpuStagingForAbort_.load()) staging->abort();
  if (bootstrap_) bootstrap_->abort();
  std::deque<Job> dropped;
  {
    std::lock_guard lock(queueMutex_);
    dropped.swap(queue_);
    pending_.fetch_sub(dropped.size(), std::memory_order_seq_cst);
    queued_.store(0, std::memory_order_seq_cst);
    stopping_ = true;
    if (asyncError_ == ncclSuccess) {
      asyncError_ = ncclInvalidUsage;
      asyncErrorMessage_ = "communicator was aborted";
      failed_.store(true, std::memory_order_release);
    }
  }
  for (auto& job : dropped) {
    if (job.hooks.after) {
      job.hooks.after(ncclInvalidUsage);
      streamJobs_.fetch_sub(1, std::memory_order_seq_cst);
    }
    job.work->complete(ncclInvalidUsage, "communicator was aborted before this ran");
  }
  queueChanged_.notify_all();
  idle_.notify_all();
  if (engine_.joinable() && engine_.get_id() != std::this_thread::get_id()) engine_.join();
}

ncclResult_t Communicator::asyncError() const {
  if (GpuPath* gpu = gpuPathForAbort_.load()) {
    std::string message;
    if (const ncclResult_t code = gpu->asyncError(message); code != ncclSuccess) return code;
  }
  if (failed_.load(std::memory_order_acquire)) {
    std::lock_guard lock(queueMutex_);
    return asyncError_;
  }
  // ncclInProgress is for non-blocking communicators (NCCL's meaning); a blocking one with staged GPU calls in
  // flight is not failing (PyTorch's watchdog takes anything but ncclSuccess as an error).
  // Staged GPU calls are on their streams once enqueued: in NCCL's terms they are no longer in progress.
  if (options_.blocking) return ncclSuccess;
  const size_t pending = pending_.load(std::memory_order_seq_cst);
  const bool working = pending > streamJobs_.load(std::memory_order_seq_cst) || (pending == 0 && busy_.load(std::memory_order_seq_cst));
  return working ? ncclInProgress : ncclSuccess;
}

std::string Communicator::asyncErrorMessage() const {
  if (GpuPath* gpu = gpuPathForAbort_.load()) {
    std::string message;
    if (gpu->asyncError(message) != ncclSuccess) return message;
  }
  std::lock_guard lock(queueMutex_);
  return asyncErrorMessage_;
}

std::shared_ptr<Communicator> Communicator::split(int color, int key, CommOptions options) {
  struct ColorKey {
    int32_t color;
    int32_t key;
  };
  std::vector<ColorKey> all(nranks_);
  all[rank_] = {color, key};
  bootstrap_->allGather(all.data(), sizeof(ColorKey));
  const int tag = kSplitTag + splitCount_++;
  if (color == NCCL_SPLIT_NOCOLOR) return nullptr;
  std::vector<int> members;
  for (int r = 0; r < nranks_; ++r)
    if (all[r].color == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) { return all[a].key < all[b].key; });
  const int newRank = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
  bootstrap::UniqueId id;
  if (newRank == 0) {
    id = bootstrap::createUniqueId();
    for (size_t i = 1; i < members.size(); ++i) bootstrap_->send(members[i], tag, &id, sizeof(id));
  } else {
    bootstrap_->recv(members[0], tag, &id, sizeof(id));
  }
  if (options.name.empty()) options.name = options_.name;
  return create(id, static_cast<int>(members.size()), newRank, std::move(options));
}

}  // namespace topoccl::core
