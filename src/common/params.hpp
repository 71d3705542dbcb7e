// Every setting topoccl reads, declared once. Add a new one here, never call getenv elsewhere.
#pragma once

#include <string>

#include "common/config.hpp"

namespace topoccl::params {

using config::Param;

// Logging (NCCL's names and meanings).
inline const Param<std::string> kDebug{"NCCL_DEBUG", "", "Log level: VERSION, WARN, INFO or TRACE"};
inline const Param<std::string> kDebugSubsys{"NCCL_DEBUG_SUBSYS", "INIT,BOOTSTRAP,ENV",
                                             "Comma list of subsystems to log; a leading ^ inverts"};
inline const Param<std::string> kDebugFile{"NCCL_DEBUG_FILE", "", "Log file; %h is the host name, %p the pid"};

// Bootstrap and failure detection.
inline const Param<std::string> kCommId{"NCCL_COMM_ID", "", "ip:port of a fixed bootstrap root instead of ncclGetUniqueId's"};
inline const Param<std::string> kSocketIfname{"NCCL_SOCKET_IFNAME", "",
                                              "Interfaces to use: prefix list, ^ excludes, = exact match"};
inline const Param<std::string> kSocketFamily{"NCCL_SOCKET_FAMILY", "", "AF_INET or AF_INET6"};
inline const Param<std::string> kHostId{"NCCL_HOSTID", "", "Overrides the host identity used to decide 'same host'"};
inline const Param<int64_t> kTimeoutMs{"TOPOCCL_TIMEOUT_MS", 60000,
                                       "A peer silent this long during an operation or bootstrap is declared dead"};

// Transports.
inline const Param<bool> kShmDisable{"NCCL_SHM_DISABLE", false, "Disable the shared-memory transport"};
inline const Param<bool> kP2pDisable{"NCCL_P2P_DISABLE", false, "Disable direct same-process (local) transport"};
// Off by default: on the machines measured (perf/RESULTS.md) process_vm_readv moved 19 GB/s where memcpy
// moved 46-78, so the FIFO's two copies, pipelined over two cores, beat CMA's one.
inline const Param<bool> kShmCma{"TOPOCCL_SHM_CMA", false,
                                 "Move large shm messages with one cross-memory-attach copy (process_vm_readv) "
                                 "instead of the FIFO's two"};
inline const Param<bool> kShmZeroCopy{"TOPOCCL_SHM_ZERO_COPY", true,
                                     "ncclMemAlloc returns shared memory (a memfd), and shm receivers copy large messages "
                                     "straight out of such a sender's buffer: one copy instead of the FIFO's two"};
inline const Param<int64_t> kShmZeroCopyThreshold{"TOPOCCL_SHM_ZERO_COPY_THRESHOLD", 0,
                                                  "Messages at least this large from ncclMemAlloc buffers go zero-copy; "
                                                  "0 = 8 KiB when the ranks have cores of their own, else 32 KiB (and 8 KiB for sends "
                                                  "of ranks with receives still to do in the operation)"};
inline const Param<int64_t> kShmSharedCopyBytes{"TOPOCCL_SHM_SHARED_COPY_BYTES", 128 << 10,
                                                "Zero-copy shm messages at least this large, into an ncclMemAlloc buffer, are "
                                                "copied by both ends at once: the sender claims blocks while it waits; 0 = off"};
inline const Param<int64_t> kShmCopyOutBytes{"TOPOCCL_SHM_COPY_OUT_BYTES", -1,
                                             "Sends of up to this many bytes per step that a receive of the same "
                                             "operation overwrites (in place) go through the shm FIFO instead of zero "
                                             "copy, so the receive need not wait for the peer to read them; 0 = never; "
                                             "-1 = half the core's own cache (L2) when the rank has a core of its own, else never"};
inline const Param<int64_t> kShmCmaThreshold{"TOPOCCL_SHM_CMA_THRESHOLD", 65536,
                                             "Messages at least this large move by CMA instead of the shm FIFO"};
inline const Param<int64_t> kNSocks{"NCCL_NSOCKS_PERTHREAD", 0,
                                    "TCP streams per NIC pair of a connection; 0 = 1 to a peer on the same host, else 2 over one NIC pair and 1 per pair over several"};
inline const Param<int64_t> kBuffSize{"NCCL_BUFFSIZE", 4 << 20, "Per-connection FIFO payload ring bytes (shm)"};
inline const Param<int64_t> kShmSlots{"TOPOCCL_SHM_SLOTS", 256,
                                      "Messages (or fragments) in flight per shm connection: one-cache-line descriptors"};
inline const Param<int64_t> kShmFragments{"TOPOCCL_SHM_FRAGMENTS", 8,
                                          "The largest piece of a message in the shm ring is NCCL_BUFFSIZE / this"};

// Algorithms and the executor.
inline const Param<std::string> kAlgo{"NCCL_ALGO", "", "Algorithm override, e.g. 'ring' or 'allreduce:rd;allgather:ring'"};
inline const Param<int64_t> kSliceBytes{"TOPOCCL_SLICE_BYTES", 512 << 10,
                                        "Executor slice size: steps move and pipeline data in pieces of this many bytes"};
inline const Param<int64_t> kNChannels{"TOPOCCL_NCHANNELS", 1, "Lanes per rank used by built-in ring plans"};
inline const Param<int64_t> kSpinPolls{"TOPOCCL_SPIN_POLLS", 0,
                                       "Idle polls before the progress loop yields its core; 0 = 4096 when the rank has its "
                                       "CPUs to itself, else 4 (ranks that share cores, from every local rank's CPU "
                                       "affinity, yield soon)"};
inline const Param<int64_t> kYieldsBeforeSleep{"TOPOCCL_YIELDS_BEFORE_SLEEP", -1,
                                               "Idle loops that yield, after the spinning ones, before a rank waiting "
                                               "only on shm or local peers sleeps until one of them moves (futex); "
                                               "-1 = 4096 when the rank has its CPUs to itself, else 256"};
inline const Param<bool> kBindOversubscribed{"TOPOCCL_BIND_OVERSUBSCRIBED", true,
                                            "Ranks that are a multiple (2x or more) of the n CPUs they all may use, each in "
                                            "a process of its own and placed by nobody, bind themselves one to a CPU in "
                                            "turn (rank i of the machine on the (i mod n)-th CPU) at communicator "
                                            "creation; 0 leaves them to the scheduler"};
inline const Param<bool> kFutexWaitv{"TOPOCCL_FUTEX_WAITV", true,
                                    "A rank asleep on several connections waits on all of them at once (futex_waitv, "
                                    "Linux 5.16+); 0, or a kernel or seccomp filter without it: it naps on the first "
                                    "in 50 us turns"};
inline const Param<int64_t> kStreamingStoresBytes{
    "TOPOCCL_STREAMING_STORES_BYTES", 0,
    "Copies write around the caches (non-temporal stores) when an operation's buffers, times the ranks on the "
    "machine, reach this many bytes; 0: 1.5 x the last-level cache; negative: never. Set, it also fixes the choice "
    "that TOPOCCL_COPY_TUNING_BYTES would time"};
inline const Param<int64_t> kCopyTuningBytes{
    "TOPOCCL_COPY_TUNING_BYTES", 0,
    "From this footprint (as TOPOCCL_STREAMING_STORES_BYTES counts it) up to where streaming stores start, out-of-place "
    "calls of an operation without a reduction time their cached copies against streaming stores now and then and "
    "copy with the faster (per plan and size); 0: half the last-level cache, unless TOPOCCL_STREAMING_STORES_BYTES is "
    "set; negative: never"};
inline const Param<bool> kBulkCopy{"TOPOCCL_BULK_COPY", true,
                                  "Copies inside the caches use the CPU's string copy (x86-64 rep movsb, on CPUs with ERMS) "
                                  "from 4 KiB, instead of memcpy"};
inline const Param<std::string> kTraceFile{"TOPOCCL_TRACE_FILE", "",
                                          "Writes what each rank's collectives did, every call and every step of every lane "
                                          "as a span, as a Chrome trace (chrome://tracing, ui.perfetto.dev) to this path when "
                                          "the communicator is destroyed; %r is the rank, %c the communicator (hex), %p the "
                                          "process id, %h the host"};
inline const Param<int64_t> kTraceSpans{"TOPOCCL_TRACE_SPANS", 262144,
                                        "Spans TOPOCCL_TRACE_FILE keeps per communicator (about 48 bytes each, allocated "
                                        "at creation); later ones are counted as dropped"};
inline const Param<bool> kCommBlocking{"NCCL_COMM_BLOCKING", true, "Overrides ncclConfig_t.blocking"};

// The GPU path (collectives on GPU buffers, CUDA builds).
inline const Param<int64_t> kGpuLowLatencyBytes{"TOPOCCL_GPU_LL_BYTES", 8192,
                                                "GPU collectives up to this many bytes use the LowLatency protocol "
                                                "(data and flag in one word), larger ones Simple; 0: Simple at every "
                                                "size. 8 KiB: on an H200, LL won up to 8 KiB on 4 ranks and lost from "
                                                "32 KiB (perf/RESULTS.md)"};
inline const Param<std::string> kProto{"NCCL_PROTO", "",
                                      "GPU protocols allowed: a list of LL, LL128, Simple; ^ excludes (LL128 runs as LL)"};
inline const Param<int64_t> kGpuFifoSlots{"TOPOCCL_GPU_FIFO_SLOTS", 0,
                                          "Slots per GPU connection FIFO; 0 = max(8, 2 x ranks), enough for every "
                                          "built-in plan"};
inline const Param<int64_t> kGpuSlotBytes{"TOPOCCL_GPU_SLOT_BYTES", 128 << 10,
                                          "Bytes per GPU FIFO slot (Simple protocol), a multiple of 16"};
inline const Param<std::string> kMemAlloc{"TOPOCCL_MEM_ALLOC", "auto",
                                         "What ncclMemAlloc returns: gpu (device memory, as NCCL), host (shared host "
                                         "memory), auto = gpu where a GPU is visible, else host"};
inline const Param<int64_t> kGpuThreads{"TOPOCCL_GPU_THREADS", 512, "Threads per lane (thread block) of the GPU plan kernel"};
inline const Param<int64_t> kGpuNChannels{"TOPOCCL_GPU_NCHANNELS", 0,
                                          "Lanes (thread blocks) per rank of the ring plans that GPU calls of at least "
                                          "TOPOCCL_GPU_RING_BYTES run: one block alone cannot keep a GPU's memory busy. "
                                          "0 = by call size, 8 to 32, at most the GPU's SMs over the ranks sharing it"};
inline const Param<std::string> kGpuStaged{"TOPOCCL_GPU_STAGED", "auto",
                                          "GPU collectives through pinned host memory and the host transports (the host "
                                          "proxy): auto = where a peer is on another host, always, or never"};
inline const Param<std::string> kGpuP2p{"TOPOCCL_GPU_P2P", "auto",
                                        "ncclSend/ncclRecv on GPU buffers of peers on this host: kernel = in the plan "
                                        "kernel through the GPU FIFOs, staged = through pinned host memory, auto = kernel "
                                        "unless threads of one process share a GPU or processes share one without MPS"};
inline const Param<bool> kGpuFuseGroups{"TOPOCCL_GPU_FUSE_GROUPS", true,
                                        "Run the GPU collectives of one ncclGroupStart/End as one kernel launch where "
                                        "they allow it (same type and reduction, independent buffers); 0 launches each"};
inline const Param<bool> kGpuLaunchOrder{"TOPOCCL_GPU_LAUNCH_ORDER", true,
                                         "Ranks that are threads of one process sharing a GPU put their launches on "
                                         "the GPU in call order (a rank waits until its peers there have enqueued the "
                                         "earlier calls): otherwise the GPU's shared work queues can deadlock them"};
inline const Param<int64_t> kGpuRingBytes{"TOPOCCL_GPU_RING_BYTES", 256 << 10,
                                          "Calls on GPU buffers from this size (bytes, as the selection table counts) run "
                                          "a ring over TOPOCCL_GPU_NCHANNELS lanes where the ring supports the collective"};

// Topology.
inline const Param<std::string> kTopoFile{"TOPOCCL_TOPO_FILE", "",
                                          "Topology file (NCCL XML, hwloc XML v2 or topoccl JSON) that replaces discovery"};
inline const Param<std::string> kNcclTopoFile{"NCCL_TOPO_FILE", "",
                                              "NCCL's topology file; used when TOPOCCL_TOPO_FILE is not set"};
inline const Param<std::string> kMscclXmlFiles{"MSCCL_XML_FILES", "",
    "MSCCL XML plans (':' or ',' separated) used for the collective, rank count, layout and size range they declare"};
inline const Param<std::string> kClusterFile{"TOPOCCL_CLUSTER_FILE", "",
    "Cluster file (JSON, topoccl-cluster): hosts, ranks per host, NICs with address, Gbit/s, rail and nearest ranks; "
    "the socket transport uses those NICs, weighted by speed, and the cluster graph is built from it"};
inline const Param<std::string> kNetNics{"TOPOCCL_NET_NICS", "all",
    "Which NICs a connection to another host uses: all (striped in proportion to speed) or near (the dialling "
    "rank's nearest NICs per the cluster file)"};
inline const Param<bool> kModelSelection{"TOPOCCL_MODEL_SELECTION", true,
    "Across hosts, pick each collective's algorithm per size band by simulating the candidates on the cluster graph"};
inline const Param<bool> kTopoFuse{"TOPOCCL_TOPO_FUSE", true,
                                   "Gather every host's topology at communicator creation and fuse the cluster graph"};
inline const Param<std::string> kTopoDumpFile{"TOPOCCL_TOPO_DUMP_FILE", "",
                                              "Write the host topology (file or live discovery) here as NCCL XML"};
inline const Param<std::string> kNcclTopoDumpFile{"NCCL_TOPO_DUMP_FILE", "",
                                                  "NCCL's dump file; used when TOPOCCL_TOPO_DUMP_FILE is not set"};

// Synthesizer.
inline const Param<std::string> kSynthesize{"TOPOCCL_SYNTHESIZE", "",
    "Collectives to synthesize plans for at communicator creation: allgather,reducescatter,allreduce,alltoall or 'all' "
    "(rank 0 synthesizes on the fused cluster graph and broadcasts; MSCCL_XML_FILES plans come first)"};
inline const Param<int64_t> kSynthBudgetMs{"TOPOCCL_SYNTH_BUDGET_MS", 2000,
    "Synthesis time budget per plan at communicator creation, milliseconds (the best plan found so far is used)"};
inline const Param<std::string> kPlanCacheDir{"TOPOCCL_PLAN_CACHE_DIR", "",
    "Directory of synthesized plans (MSCCL XML + JSON); empty: $XDG_CACHE_HOME/topoccl or ~/.cache/topoccl; 'off' disables"};

}  // namespace topoccl::params
