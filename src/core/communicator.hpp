// The communicator: joins bootstrap, locality, transports, plans and kernels. Operations are
// queued to one progress engine (a thread) per communicator, which runs them in submission order,
// so every rank executes collectives in the same order.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "algorithms/cost_model.hpp"
#include "algorithms/generators.hpp"
#include "algorithms/plan.hpp"
#include "algorithms/selection.hpp"
#include "bootstrap/bootstrap.hpp"
#include "common/datatype.hpp"
#include "core/execution.hpp"
#include "core/execution_trace.hpp"
#include "core/gpu_path.hpp"
#include "core/host_arena.hpp"
#include "core/work.hpp"
#include "kernels/host_reduce.hpp"
#include "topology/locality.hpp"
#include "topology/topology.hpp"
#include "transport/transport.hpp"


namespace topoccl::core {

class GpuStaging;

// A reduction as the caller asked for it; PreMulSum carries its scalar.
struct ReduceSpec {
  ReduceOp op = ReduceOp::Sum;
  DataType scalarType = DataType::Float32;
  unsigned char scalar[8] = {};        // host-immediate value
  const void* scalarPointer = nullptr;  // read when the operation runs (ncclScalarDevice on host memory)
};

struct CollectiveArgs {
  algo::Collective collective = algo::Collective::AllReduce;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;  // per-rank count, as NCCL defines it for the collective
  DataType type = DataType::Float32;
  ReduceSpec reduce;
  int root = 0;
};

struct PointToPointArgs {
  bool isSend = true;
  const void* send = nullptr;  // isSend
  void* recv = nullptr;        // !isSend
  size_t count = 0;
  DataType type = DataType::Float32;
  int peer = 0;
};

using Operation = std::variant<CollectiveArgs, PointToPointArgs>;

struct CommOptions {
  bool blocking = true;
  std::string name;
  // The thread that will call the communicator, when another thread creates it (grouped inits run on helper
  // threads): a rank bound to a CPU binds it too. A Linux thread id; 0: the creating thread only.
  int callerThread = 0;
};

class Communicator : public std::enable_shared_from_this<Communicator> {
 public:
  // Collective over all ranks: joins the rendezvous named by `id`.
  static std::shared_ptr<Communicator> create(const bootstrap::UniqueId& id, int nranks, int rank,
                                              CommOptions options);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  const CommOptions& options() const { return options_; }
  const topo::Locality& locality() const { return *locality_; }
  // The cluster graph fused from every host's report at creation (identical on every rank), or null
  // when TOPOCCL_TOPO_FUSE=0 or a host could not describe itself (logged as a warning).
  const topo::Topology* clusterTopology() const { return clusterTopology_.get(); }
  // The host index of `rank` in clusterTopology() (Vertex::host), -1 without a cluster graph.
  int clusterHost(int rank) const { return clusterHostOfRank_.empty() ? -1 : clusterHostOfRank_[rank]; }

  // A collective on GPU buffers: enqueued on `stream` (a cudaStream_t), returns at once. The first such call
  // sets the GPU path up, collectively. Throws on bad input (one buffer on the GPU and the other not, ...).
  void enqueueOnGpu(const char* function, const CollectiveArgs& args, void* stream);
  // Collectives on GPU buffers of one group (ncclGroupStart/End), in call order, on one stream: consecutive
  // calls run as one kernel launch where the GPU path can fuse them (GpuPath::enqueue).
  void enqueueGroupOnGpu(const char* function, const std::vector<CollectiveArgs>& calls, void* stream);
  // The checks enqueueOnGpu makes before anything is set up or enqueued (for calls deferred to a group's end).
  void checkGpuBuffers(const char* function, const CollectiveArgs& args) const;
  // Whether this rank's sends and receives on GPU buffers of one group run in the plan kernel
  // (enqueuePointToPointOnGpu) rather than through host memory (enqueueStaged); sets the GPU path up where that
  // decides it (pointToPointSetsUpGpuPath). Both ends of a send decide alike: the path is up once a collective on GPU
  // buffers ran, and every rank orders its collectives alike relative to the sends and receives between two ranks;
  // on 2 ranks a group that reaches the peer sets it up, since the peer's matching calls do too. Then the path's
  // TOPOCCL_GPU_P2P decision holds (GpuPath::pointToPointLanes). A send to a GPU buffer then needs its receive on a
  // GPU buffer too, as in NCCL.
  bool pointToPointOnGpuKernel(const std::vector<PointToPointArgs>& ops, bool everyRankInGroup = false);
  // Whether pointToPointOnGpuKernel(ops) would set the GPU path up (collective: a thread that drives several ranks
  // sets theirs up side by side first). `everyRankInGroup`: this thread's group holds calls of every rank of the
  // communicator (nccl-tests' -g with all ranks in one process), which then all set up alike, on any rank count.
  bool pointToPointSetsUpGpuPath(const std::vector<PointToPointArgs>& ops, bool everyRankInGroup = false);
  // Sets the GPU path up for sends and receives (as ensureGpuPath); where that fails (a peer's GPU without P2P
  // access, say) they keep going through host memory from then on, on every rank alike, and it says why.
  void setUpGpuPathForPointToPoint(int device);
  // Equal on every rank of this communicator, and on no other communicator's (from its unique id).
  uint64_t communicatorHash() const { return identity_.commHash; }
  // Enqueues this rank's sends and receives on GPU buffers of one group on `stream` as one kernel launch; returns
  // at once. Only where pointToPointOnGpuKernel(ops) said so.
  // `otherStreams` (a group whose calls name several) join `stream` before the launch and wait for it after.
  void enqueuePointToPointOnGpu(const std::vector<PointToPointArgs>& ops, void* stream, const std::vector<void*>& otherStreams = {});
  // Sets the GPU path up (collective over the ranks) on `device` (-1: the calling thread's), once.
  void ensureGpuPath(int device);
  bool hasGpuPath();
  // This thread drives this rank's GPU calls from here on (a group over several communicators).
  void claimGpuCalls();

  // Queues a group of operations that progress together; returns at once. `hooks` run around it on the engine.
  std::shared_ptr<Work> submit(std::vector<Operation> operations, JobHooks hooks = {});
  // Operations on GPU buffers through host memory (core/gpu_staging.hpp), enqueued on `stream` (a
  // cudaStream_t; `otherStreams` join it, for a group whose calls name several): point-to-point, and
  // collectives whose peers the GPU path cannot reach. Returns at once; failures become asynchronous errors.
  // The operations may also hold host buffers (a group's host calls), which are used in place.
  std::shared_ptr<Work> enqueueStaged(const char* function, std::vector<Operation> operations, void* stream,
                                      const std::vector<void*>& otherStreams = {});
  // Whether GPU collectives go through host staging rather than the GPU path's FIFOs: a peer on another host,
  // or TOPOCCL_GPU_STAGED=always.
  bool gpuStaged() const;
  // Runs a group to completion on the calling thread when the engine is idle (saving two thread
  // hand-offs per blocking call), else queues it behind the running work and waits. The error text
  // goes to `message`. The per-call path of a blocking caller: no allocation, lock or syscall.
  ncclResult_t run(std::vector<Operation>& operations, std::string& message);
  // A group over several communicators that one thread drives (nccl-tests' -g, ncclCommInitAll's ranks in one
  // thread): each rank's share moves a pass at a time on the calling thread, interleaved with the others', instead
  // of through each engine (three thread hand-offs a call). begin claims the idle engine (false, nothing done, when
  // it is busy or refuses work); step makes one pass and says whether the share finished or failed; end releases
  // the engine and returns the outcome (the error text in `message`). `operations` must outlive end.
  bool beginInterleaved(std::vector<Operation>& operations);
  // What a group moves, as the selection table counts each call (the larger buffer), summed.
  size_t operationBytes(const std::vector<Operation>& operations) const;
  bool stepInterleaved(bool& moved);
  ncclResult_t endInterleaved(std::string& message);
  // run() of one collective, outside a group: the per-call path of a blocking caller, without the group's
  // variant and vector.
  ncclResult_t runCollective(const CollectiveArgs& args, std::string& message);
  // run(), with the outcome as a completed Work.
  std::shared_ptr<Work> runBlocking(std::vector<Operation> operations);
  // Waits until everything queued so far finished (ncclCommFinalize).
  void finalize();
  // Stops the progress engine, failing queued and running work with ncclRemoteError/abort.
  void abort();
  // ncclCommGetAsyncError: the first error the engine hit, ncclInProgress while work is queued,
  // ncclSuccess otherwise.
  ncclResult_t asyncError() const;
  std::string asyncErrorMessage() const;

  // ncclCommSplit: collective over this communicator. Returns null for NCCL_SPLIT_NOCOLOR.
  std::shared_ptr<Communicator> split(int color, int key, CommOptions options);

  // Host memory the executor holds for its own buffers (scratch, staging, prescaled inputs), in bytes. It
  // grows to the largest call that needed it; calls whose buffers do not overlap need no scratch.
  struct HostMemory {
    size_t scratch = 0;
    size_t staging = 0;
    size_t prescaled = 0;
  };
  HostMemory hostMemory() const { return {scratch_.size(), staging_.size(), prescaled_.size()}; }
  // Whether other ranks of this communicator may run on this rank's cores (from every local rank's CPU
  // affinity at creation): its progress loop then yields after a few idle polls instead of spinning.
  bool sharesCores() const { return sharesCores_; }
  // Which algorithm the selection table picks (for logs, tools and tests); a plan file's name when
  // one of MSCCL_XML_FILES covers the call.
  std::string chosenAlgorithm(algo::Collective collective, size_t bytes, bool inPlace = false) const;
  // The simulator's time for the plan this communicator runs for `collective` at `bytes` (nccl-tests'
  // size: the all-gather output, the reduce-scatter input, ...), on the fused cluster graph with this
  // job's rank placement. Throws ncclInvalidUsage when there is no cluster graph to simulate on.
  struct Prediction {
    std::string plan;
    double micros = 0;
  };
  Prediction predict(algo::Collective collective, size_t bytes, bool inPlace) const;

 private:
  Communicator(int rank, int nranks, CommOptions options);
  void initialize(const bootstrap::UniqueId& id);
  void gatherClusterTopology();
  // topo::oversubscribedRankCpu for every rank on this machine: binds the calling thread (the progress engine,
  // started after, inherits it) and rewrites `machineCpus` and `mine` to the sets the ranks now have.
  void bindOversubscribed(std::vector<topo::CpuSet>& machineCpus, size_t myIndex, bool ownProcesses, topo::CpuSet& mine);
  void progressLoop();
  void runGroup(std::vector<Operation>& operations);
  // Runs groupCollectives_ in order and groupPointToPoint_ alongside, to completion.
  void runGroupLists();
  // runGroupLists() in parts: startGroupLists builds the point-to-point execution; advanceGroup makes one pass
  // (true when everything finished; `moved`: whether anything did); checkStall throws once nothing moved for
  // timeout_.
  void startGroupLists();
  bool advanceGroup(bool& moved);
  // The copy kernel of a collective about to run (CopyTuner, for shapes it times), and the time it took.
  void chooseCopies(Execution& execution);
  void timedCopies(const Execution& execution);
  void checkStall();
  // Arms the doorbells of every connection the executions wait on; false (and nothing armed) when one of
  // them cannot be slept on that way or none waits.
  bool armDoorbells(Execution* collective, Execution* pointToPoint);
  transport::Connection* connection(int peer, int channel);
  transport::Transport& transportFor(int peer) const;
  struct SelectedPlan {
    const algo::Plan* plan = nullptr;
    bool inPlace = false;
    bool fromFile = false;  // a plan file (MSCCL_XML_FILES) covers the call
    algo::Placement placement = algo::Placement::Any;
    size_t callBytes = 0;  // as the selection table counts
  };
  // The plan every rank runs for this call: a plan file's, else the selection table's.
  SelectedPlan selectPlan(const CollectiveArgs& args, bool gpuBuffers = false);
  std::unique_ptr<Execution> buildCollective(const CollectiveArgs& args, std::vector<std::function<void()>>& after);
  std::unique_ptr<Execution> buildPointToPoint(const std::vector<const PointToPointArgs*>& ops);
  std::vector<uint32_t> shardWeights_;  // hierarchical all-reduce shard per local rank (near mode); empty: even
  std::vector<pollfd> pollFds_;  // the engine's idle wait; reused, so no allocation per wait
  std::vector<transport::ArmedDoorbell> armedBells_;  // likewise, for shm and local peers
  std::vector<topo::VertexId> rankDevices() const;
  double modelledMicros(const algo::Plan& plan, uint64_t bytes, const algo::CostModel& model) const;
  void modelSelection();
  std::string shareFromRankZero(int tag, std::string bytes);
  bool evenHosts() const;  // every host holds the same number of ranks (the hierarchical plan needs it)
  algo::Plan buildPlan(algo::Algorithm algorithm, algo::Collective collective, int root,
                       algo::Placement placement = algo::Placement::Any) const;
  algo::Algorithm chooseAlgorithm(algo::Collective collective, size_t bytes, bool gpuBuffers = false) const;
  const algo::Plan& planFor(algo::Algorithm algorithm, algo::Collective collective, int root, algo::Placement placement);
  void loadPlanFiles();
  void synthesizePlans();  // TOPOCCL_SYNTHESIZE: appends to planFiles_ after the files
  const algo::Plan* planFileFor(const CollectiveArgs& args, size_t bytes, bool inPlace) const;

  struct Job {
    std::vector<Operation> operations;
    std::shared_ptr<Work> work;
    JobHooks hooks;
  };
  ncclResult_t execute(std::vector<Operation>& operations, std::string& message);  // records the first error
  template <class Body>
  ncclResult_t executeBody(std::string& message, Body&& body);  // execute()'s checks and error record around body()
  // Whether new work is refused (destroyed or aborted); says why in `message`.
  bool refusesWork(std::string& message) const;
  // Claims the idle engine for the calling thread; false when a job is queued or running.
  bool claimInline();
  void recordFailure(ncclResult_t code, const std::string& message);
  // After a job (`queuedJob`: one from the queue, counted in pending_): lets the next one in, wakes
  // whoever waits for it.
  void releaseEngine(bool queuedJob);

  int rank_;
  int nranks_;
  CommOptions options_;
  std::unique_ptr<bootstrap::Bootstrap> bootstrap_;
  std::unique_ptr<topo::Locality> locality_;
  std::vector<transport::PeerInfo> peers_;
  std::shared_ptr<const topo::Topology> clusterTopology_;
  std::vector<int> clusterHostOfRank_;
  transport::CommIdentity identity_;
  // Agreed at init (rank 0's values), so every rank builds the same plans and slices.
  size_t sliceBytes_ = 0;
  size_t slicesPerStep_ = 16;  // Execution::kSlicesPerStep(Sockets): the same on every rank (from the init exchange)
  int nchannels_ = 1;
  std::chrono::milliseconds timeout_{60000};
  std::unique_ptr<algo::SelectionTable> selection_;

  enum class Route : uint8_t { Local, Shm, Socket };
  std::vector<Route> peerRoute_;
  int splitCount_ = 0;
  std::unique_ptr<transport::Transport> localTransport_;
  std::unique_ptr<transport::Transport> shmTransport_;
  std::unique_ptr<transport::Transport> socketTransport_;
  std::map<std::pair<int, int>, std::unique_ptr<transport::Connection>> connections_;
  std::set<transport::Transport*> usedTransports_;
  std::map<std::tuple<int, int, int, int>, std::unique_ptr<algo::Plan>> plans_;  // algorithm, collective, root, placement
  // The GPU path's many-lane plans (rings; direct all-to-all), by collective, root, placement and channels.
  std::map<std::tuple<int, int, int, int>, std::unique_ptr<algo::Plan>> gpuRingPlans_;
  int gpuChannels_ = 1;         // the GPU rings' lanes: fixed (TOPOCCL_GPU_NCHANNELS), or the most by call size
  bool gpuFixedLanes_ = false;
  std::vector<algo::Plan> planFiles_;  // MSCCL_XML_FILES for this rank count, validated, in file order; then
                                       // TOPOCCL_SYNTHESIZE's plans
  HostArena scratch_;
  HostArena prescaled_;
  HostArena staging_;  // RecvReduceSend results; collectives run one at a time
  std::vector<const PointToPointArgs*> groupPointToPoint_;  // runGroup's working lists, kept for their capacity
  std::vector<const CollectiveArgs*> groupCollectives_;
  std::vector<std::function<void()>> groupAfter_;
  struct GroupProgress {  // the group being run: runGroupLists's, or an interleaved one's between passes
    std::unique_ptr<Execution> pointToPoint, current;
    size_t next = 0;  // the next collective of groupCollectives_ to build
    unsigned loops = 0, idle = 0;
    std::chrono::steady_clock::time_point lastMove{};
    bool started = false, finished = false;  // interleaved only
    ncclResult_t code = ncclSuccess;
    std::string message;
  };
  GroupProgress group_;
  bool sharesCores_ = false;  // other ranks may run on this rank's cores (topo::sharesCores)
  std::unique_ptr<ExecutionTrace> trace_;  // TOPOCCL_TRACE_FILE; null when not set
  int boundCpu_ = -1;         // the CPU this rank bound itself to (TOPOCCL_BIND_OVERSUBSCRIBED), or -1
  int interleavedCpus_ = 0;   // one host whose ranks all bind round-robin over this many CPUs (rank r on r mod it), or 0
  // Idle polls before the progress loop yields its core: many when the rank has its cores to itself (a yield
  // is a syscall, and the peer is about to answer), few when it shares them.
  unsigned spinsBeforeYield_ = 1;
  unsigned idleBeforePoll_ = 64;  // idle loops before sleeping in poll() when every connection is a socket
  unsigned idleBeforeSleep_ = 8192;  // idle loops before sleeping on doorbells when every connection has them
  size_t machineRanks_ = 1;                  // ranks of this communicator sharing this machine's cores and caches
  uint64_t streamingThreshold_ = UINT64_MAX;  // footprint from which copies use streaming stores
  uint64_t copyTuningFrom_ = UINT64_MAX;      // footprint from which copies are timed both ways (CopyTuner)
  CopyTuner copyTuner_;
  CopyTuner::Ticket copyTicket_;  // the running collective's
  uint64_t copyStarted_ = 0;      // copyNanoseconds() when it began
  // In place, receives into bytes a peer has just read stream only from this many times that footprint.
  static constexpr uint64_t kSentBytesCachedFootprints = 4;
  SendRule sendRule_;  // how sends are posted (markSendRoutes)
  bool bulkCopy_ = false;                     // below it, kernels::bulkCopy (TOPOCCL_BULK_COPY and the CPU has it)

  mutable std::mutex queueMutex_;
  std::condition_variable queueChanged_;  // the engine waits here for work or stop
  std::condition_variable idle_;          // finalize() waits here for pending_ == 0
  std::deque<Job> queue_;
  // One job at a time, on the engine thread or inline on a blocking caller's: whoever claims busy_.
  // The counters are atomics so that an inline call needs no lock (see releaseEngine()).
  std::atomic<bool> busy_{false};
  std::atomic<size_t> queued_{0};      // queue_.size()
  std::atomic<size_t> pending_{0};     // queued jobs, until the engine finished them (inline runs: busy_ only)
  std::atomic<size_t> streamJobs_{0};  // of those, jobs with hooks (GPU staging): on a stream, not in progress
  std::atomic<int> idleWaiters_{0};    // threads in finalize()
  std::atomic<bool> stopping_{false};
  std::atomic<bool> aborted_{false};
  std::atomic<bool> failed_{false};    // asyncError_ is set
  ncclResult_t asyncError_ = ncclSuccess;
  std::string asyncErrorMessage_;
  std::thread engine_;
  std::mutex gpuMutex_;                // enqueueOnGpu callers
  std::unique_ptr<GpuPath> gpuPath_;  // set up by the first GPU collective
  std::atomic<GpuPath*> gpuPathForAbort_{nullptr};  // the same, for abort() and asyncError() without the lock
  std::mutex stagingMutex_;                // enqueueStaged callers: tickets are handed out in submission order
  std::unique_ptr<GpuStaging> gpuStaging_;  // set up by the first staged call
  std::atomic<GpuStaging*> gpuStagingForAbort_{nullptr};
  std::atomic<bool> gpuPointToPointSetUpFailed_{false};  // setUpGpuPathForPointToPoint
  mutable std::atomic<int> gpuStagedState_{-1};  // gpuStaged(): -1 not decided yet, else 0 / 1

  // The last finished collective's execution, reused (reset, no allocation) when the next call resolves to the
  // same plan, buffers, count, type and reduction: the per-call path of a training loop. Declared last so it
  // goes before the connections it points to.
  struct ExecutionKey {
    const algo::Plan* plan = nullptr;
    const char* input = nullptr;
    char* output = nullptr;
    char* scratch = nullptr;
    size_t count = 0, elementSize = 0;
    kernels::ReduceFn reduce = nullptr;
    bool operator==(const ExecutionKey&) const = default;
  };
  std::unique_ptr<Execution> spareExecution_;
  ExecutionKey spareKey_, builtKey_;
  // The call the spare execution ran, and whether it needed no per-call work (then the same call reuses it
  // before selecting a plan). Any other call clears the spare's arenas' claim: it may grow them.
  CollectiveArgs spareCall_, builtCall_;
  bool spareCallReusable_ = false, builtCallReusable_ = false;
  bool builtFromSpareCall_ = false;  // the execution being run is the spare, reused by the same call
};

}  // namespace topoccl::core
