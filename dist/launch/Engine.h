// Cluster engines: what Slurm, MPI, torchrun and Kubernetes tell the processes they start about
// their place in a job, read into one view, and the weft job that view describes.
//
// An engine starts every process itself and hands each its place through the environment. The
// adapter recognises, innermost launcher first:
//   PMIx and Open MPI   PMIX_RANK, PMIX_NAMESPACE; OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE
//   torchrun            RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR/PORT,
//                       with TORCHELASTIC_RUN_ID (DeepSpeed and Ray Train set the first six alone)
//   Slurm               SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID,
//                       SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST), SLURM_STEP_TASKS_PER_NODE
//   Kubeflow            PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR/PORT
//   indexed Jobs        JOB_COMPLETION_INDEX with WORLD_SIZE, MASTER_ADDR and MASTER_PORT
// An engine that runs inside another's task (mpirun or torchrun in a Slurm allocation) is the
// one that decides; variables that one launch sets twice (PMIx beside Open MPI, Slurm beside PMIx
// under `srun --mpi=pmix`, RANK beside SLURM_PROCID) must agree. A partial or contradictory
// environment is refused, naming the variables and their values.
//
// WEFT_RENDEZVOUS=HOST:PORT (or weft train's --rendezvous) says where rank 0 runs the rendezvous
// when the engine does not say (Open MPI across hosts), or overrides what it says.
#pragma once

#include "dist/launch/Coordinator.h"
#include "dist/launch/ResourceSpec.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace weft::dist {

/// Environment variables by name: the process's own, or a test's.
using Environment = std::map<std::string, std::string>;
/// The calling process's environment.
Environment processEnvironment();

/// What a cluster engine told a process about its place in the job.
struct EngineView {
  /// "slurm", "openmpi", "torchrun", "rank-env" (RANK and WORLD_SIZE alone), "kubeflow", "indexed-job"
  std::string engine;
  int rank = 0;        ///< among all the job's processes
  int size = 1;
  int localRank = 0;               ///< among its host's processes
  int node = 0;                    ///< its host's index
  std::vector<int> tasksPerNode;   ///< processes on each host, in host order
  std::vector<std::string> hosts;  ///< host names in host order, where the engine gives them
  /// Where rank 0 serves the rendezvous: the engine's master address, the first host of a
  /// Slurm node list, or WEFT_RENDEZVOUS; empty when none says (a job on one host needs none).
  std::string coordinatorHost;
  uint16_t coordinatorPort = 0;  ///< 0 when nothing says
  /// Tells this run from other runs of the engine (job and step ids, restart counts): every
  /// process of the job has the same.
  std::string runKey;
  /// The variables it was read from, "NAME=value" each, for `weft env` and messages.
  std::vector<std::string> evidence;

  int nodes() const { return static_cast<int>(tasksPerNode.size()); }
  int localSize() const { return tasksPerNode.at(static_cast<size_t>(node)); }
};

/// The engine that started this process, as `environment` tells it; nullopt when no engine's
/// variables are there, or weft's own launcher started it (WEFT_COORDINATOR is set).
std::optional<EngineView> detectEngine(const Environment& environment);

/// A Slurm host list expanded as `scontrol show hostnames` does: "node[01-03,7],gpu-a" is
/// node01 node02 node03 node7 gpu-a; brackets may repeat ("rack[1-2]-n[1-2]"). Throws naming
/// the list and what in it does not parse.
std::vector<std::string> expandSlurmHostList(const std::string& list);
/// Slurm's tasks per node: "2(x3),1" is 2 2 2 1. Throws naming the text.
std::vector<int> expandSlurmTasksPerNode(const std::string& text);

/// The weft job an engine's view describes, and this process's place in it.
struct EngineLayout {
  ResourceSpec resources;
  MemberId self;
};

/// Each host runs its engine processes; the first `serversPerHost` of each host are parameter
/// servers, the others workers (a pipeline's stages follow the workers' ranks). `selfAddress` is
/// this host's address, where its processes listen; hosts the engine does not name are listed
/// as "engine-host-N" (nothing but a process's own host address is used). A job on one host
/// binds its rendezvous to loopback; one across hosts to every interface. Throws when a host
/// would have no worker.
EngineLayout layoutEngineJob(const EngineView& view, int serversPerHost, const std::string& selfAddress);

/// "slurm: rank 3 of 6, host 1 of 2 (node02), local rank 0 of 3: server of host 1".
std::string describeEngineProcess(const EngineView& view, const EngineLayout& layout);

}  // namespace weft::dist
