// The cluster engines' environments: what Slurm, Open MPI, PMIx, torchrun, Kubeflow and indexed
// Kubernetes Jobs set for a process, read into its place in a weft job; partial and contradictory
// environments refused, naming the variables; the job each view lays out.
#include "tests/TestUtil.h"

#include "dist/launch/Engine.h"
#include "dist/launch/EngineJob.h"

using namespace weft;
using namespace weft::dist;

namespace {

using Names = std::vector<std::string>;

/// What srun -N 2 --ntasks-per-node 3 gives its task `rank` (block distribution).
Environment slurmTask(int rank) {
  return {{"SLURM_PROCID", std::to_string(rank)},
          {"SLURM_NTASKS", "6"},
          {"SLURM_LOCALID", std::to_string(rank % 3)},
          {"SLURM_NODEID", std::to_string(rank / 3)},
          {"SLURM_STEP_NODELIST", "node[01-02]"},
          {"SLURM_STEP_TASKS_PER_NODE", "3(x2)"},
          {"SLURM_JOB_ID", "77"},
          {"SLURM_STEP_ID", "0"}};
}

/// What mpirun -np 6 over two hosts of three slots gives rank `rank`.
Environment mpiRank(int rank) {
  return {{"OMPI_COMM_WORLD_RANK", std::to_string(rank)},
          {"OMPI_COMM_WORLD_SIZE", "6"},
          {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(rank % 3)},
          {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"},
          {"OMPI_MCA_ess_base_jobid", "1234"},
          {"PMIX_RANK", std::to_string(rank)},
          {"PMIX_NAMESPACE", "1234"}};
}

/// What torchrun --nnodes 2 --nproc-per-node 3 gives worker `rank`.
Environment torchrunWorker(int rank) {
  return {{"RANK", std::to_string(rank)},
          {"WORLD_SIZE", "6"},
          {"LOCAL_RANK", std::to_string(rank % 3)},
          {"LOCAL_WORLD_SIZE", "3"},
          {"GROUP_RANK", std::to_string(rank / 3)},
          {"MASTER_ADDR", "10.0.0.1"},
          {"MASTER_PORT", "29500"},
          {"TORCHELASTIC_RUN_ID", "run7"},
          {"TORCHELASTIC_RESTART_COUNT", "0"}};
}

Environment with(Environment e, const Environment& more) {
  for (const auto& [k, v] : more) e[k] = v;
  return e;
}

Environment without(Environment e, const std::string& name) {
  e.erase(name);
  return e;
}

}  // namespace

TEST_CASE("a Slurm host list expands as scontrol show hostnames does") {
  CHECK(expandSlurmHostList("node[01-04,7],gpu-a") == Names{"node01", "node02", "node03", "node04", "node7", "gpu-a"});
  CHECK(expandSlurmHostList("n[8-11]") == Names{"n8", "n9", "n10", "n11"});
  CHECK(expandSlurmHostList("n[098-101]") == Names{"n098", "n099", "n100", "n101"});
  CHECK(expandSlurmHostList("rack[1-2]-n[1-2]") == Names{"rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"});
  CHECK(expandSlurmHostList("login") == Names{"login"});
  CHECK(expandSlurmHostList("b,a[2,1]") == Names{"b", "a2", "a1"});  // the order given, not sorted
}

TEST_CASE("a Slurm host list that does not parse is refused, naming the list and the fault") {
  CHECK(errorOf([] { expandSlurmHostList("node[1-"); }) ==
        "Slurm host list 'node[1-' does not parse: a '[' is not closed");
  CHECK(errorOf([] { expandSlurmHostList("node1]"); }) ==
        "Slurm host list 'node1]' does not parse: brackets do not pair");
  CHECK(errorOf([] { expandSlurmHostList("node[3-1]"); }) ==
        "Slurm host list 'node[3-1]' does not parse: the range '3-1' runs backwards");
  CHECK(errorOf([] { expandSlurmHostList("node[a-b]"); }) ==
        "Slurm host list 'node[a-b]' does not parse: 'a-b' in brackets is not a number or a range of numbers");
  CHECK(errorOf([] { expandSlurmHostList("a,,b"); }) ==
        "Slurm host list 'a,,b' does not parse: it has an empty host name");
  CHECK(errorOf([] { expandSlurmHostList(""); }) == "the Slurm host list is empty");
  CHECK(errorOf([] { expandSlurmHostList("n[0-99999999]"); }) ==
        "Slurm host list 'n[0-99999999]' does not parse: the range '0-99999999' is too long");
}

TEST_CASE("Slurm's tasks per node expand, and malformed ones are refused") {
  CHECK(expandSlurmTasksPerNode("2(x3),1") == std::vector<int>{2, 2, 2, 1});
  CHECK(expandSlurmTasksPerNode("4") == std::vector<int>{4});
  CHECK(expandSlurmTasksPerNode("1,3(x2)") == std::vector<int>{1, 3, 3});
  for (const char* bad : {"2(x", "x3", "", "2(x3", "2,,1"})
    CHECK(errorOf([&] {
            expandSlurmTasksPerNode(bad);
          }).starts_with(fmt::format("Slurm tasks per node '{}' do not parse", bad)));
  CHECK(errorOf([] { expandSlurmTasksPerNode("0"); }) ==
        "Slurm tasks per node '0': '0' gives no tasks, or too many hosts");
}

TEST_CASE("no engine, or weft's own launcher, is no engine job") {
  CHECK_FALSE(detectEngine({}).has_value());
  CHECK_FALSE(detectEngine({{"HOME", "/root"}}).has_value());
  CHECK_FALSE(detectEngine(with(slurmTask(1), {{"WEFT_COORDINATOR", "127.0.0.1:5000"}})).has_value());
}

TEST_CASE("srun's task: rank, size, host and local rank, the node list, and the first host serving the rendezvous") {
  const EngineView v = detectEngine(slurmTask(4)).value();
  CHECK(v.engine == "slurm");
  CHECK(v.rank == 4);
  CHECK(v.size == 6);
  CHECK(v.node == 1);
  CHECK(v.localRank == 1);
  CHECK(v.tasksPerNode == std::vector<int>{3, 3});
  CHECK(v.hosts == Names{"node01", "node02"});
  CHECK(v.coordinatorHost == "node01");
  CHECK(v.coordinatorPort == 0);
  CHECK(v.runKey == "slurm/77.0/0");
  CHECK(detectEngine(with(slurmTask(4), {{"SLURM_RESTART_COUNT", "2"}}))->runKey == "slurm/77.0/2");
}

TEST_CASE("an sbatch script's own process is no task of the job: srun starts those") {
  const Environment batch{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "3"},        {"SLURM_LOCALID", "0"},
                          {"SLURM_NODEID", "0"}, {"SLURM_JOB_NODELIST", "vm"}, {"SLURM_TASKS_PER_NODE", "3"},
                          {"SLURM_JOB_ID", "2"}};
  CHECK(errorOf([&] { detectEngine(batch); }) ==
        "SLURM_PROCID=0 and SLURM_NTASKS=3 without SLURM_STEP_ID: this is the batch script's own process, not one of "
        "the job's tasks; start weft with `srun weft ...` in the script");
  CHECK(detectEngine(with(batch, {{"SLURM_NTASKS", "1"}, {"SLURM_TASKS_PER_NODE", "1"}}))->size == 1);
}

TEST_CASE("a Slurm step with uneven tasks per node, and its job-level variables as a fallback") {
  const Environment e{{"SLURM_PROCID", "4"},
                      {"SLURM_NPROCS", "5"},
                      {"SLURM_STEP_ID", "1"},
                      {"SLURM_LOCALID", "0"},
                      {"SLURM_NODEID", "2"},
                      {"SLURM_JOB_NODELIST", "a,b,c"},
                      {"SLURM_TASKS_PER_NODE", "2(x2),1"}};
  const EngineView v = detectEngine(e).value();
  CHECK(v.tasksPerNode == std::vector<int>{2, 2, 1});
  CHECK(v.node == 2);
  CHECK(v.localSize() == 1);
}

TEST_CASE("a partial or inconsistent Slurm environment is refused, naming the variables") {
  CHECK(
      errorOf([] { detectEngine(without(slurmTask(1), "SLURM_NTASKS")); })
          .starts_with(
              "SLURM_PROCID is set without SLURM_NTASKS: the environment of this process is partial (SLURM_PROCID=1"));
  CHECK(errorOf([] {
          detectEngine(with(slurmTask(1), {{"SLURM_PROCID", "7"}}));
        }) == "SLURM_PROCID=7 is not below SLURM_NTASKS=6");
  CHECK(errorOf([] {
          detectEngine(with(slurmTask(1), {{"SLURM_PROCID", "one"}}));
        }) == "SLURM_PROCID='one' is not a count or index of processes");
  CHECK(errorOf([] {
          detectEngine(with(slurmTask(1), {{"SLURM_STEP_TASKS_PER_NODE", "3,2"}}));
        }) == "SLURM_STEP_TASKS_PER_NODE adds up to 5 tasks, but SLURM_NTASKS=6");
  CHECK(errorOf([] {
          detectEngine(with(slurmTask(1), {{"SLURM_STEP_NODELIST", "node[01-03]"}}));
        }) == "SLURM_STEP_NODELIST lists 3 hosts, but SLURM_STEP_TASKS_PER_NODE gives tasks for 2");
  CHECK(errorOf([] {
          detectEngine(with(slurmTask(1), {{"SLURM_STEP_NODELIST", "node[01-"}}));
        }) == "Slurm host list 'node[01-' does not parse: a '[' is not closed");
  CHECK(errorOf([] {
          detectEngine(with(slurmTask(1), {{"SLURM_LOCALID", "5"}}));
        }) == "SLURM_LOCALID=5 is not below host 0's 3 tasks (SLURM_STEP_TASKS_PER_NODE)");
}

TEST_CASE("mpirun's rank: its host from ranks placed in blocks, checked against PMIx") {
  const EngineView v = detectEngine(mpiRank(4)).value();
  CHECK(v.engine == "openmpi");
  CHECK(v.rank == 4);
  CHECK(v.node == 1);
  CHECK(v.localRank == 1);
  CHECK(v.tasksPerNode == std::vector<int>{3, 3});
  CHECK(v.coordinatorHost.empty());  // Open MPI names no host: WEFT_RENDEZVOUS says, across hosts
  CHECK(v.runKey == "openmpi/1234");
  CHECK(errorOf([] {
          detectEngine(with(mpiRank(4), {{"PMIX_RANK", "3"}}));
        }) == "PMIX_RANK=3 disagrees with openmpi's rank 4 of this process");
  CHECK(errorOf([] {
          detectEngine(with(mpiRank(1), {{"OMPI_COMM_WORLD_LOCAL_RANK", "0"}}));
        }).starts_with("OMPI_COMM_WORLD_RANK=1 is local rank 0 of 3 on its host"));
  CHECK(errorOf([] {
          detectEngine(without(mpiRank(1), "OMPI_COMM_WORLD_SIZE"));
        }).starts_with("OMPI_COMM_WORLD_RANK is set without OMPI_COMM_WORLD_SIZE"));
}

TEST_CASE("PMIx alone gives no size and is refused; beside srun it must agree with Slurm") {
  CHECK(errorOf([] {
          detectEngine({{"PMIX_RANK", "2"}, {"PMIX_NAMESPACE", "slurm.pmix.77.0"}});
        }) ==
        "PMIX_RANK=2 is set without the job's size: weft reads the size from Open MPI's or Slurm's variables, which "
        "this environment lacks");
  CHECK(detectEngine(with(slurmTask(2), {{"PMIX_RANK", "2"}}))->engine == "slurm");
  CHECK(errorOf([] {
          detectEngine(with(slurmTask(2), {{"PMIX_RANK", "1"}}));
        }) == "PMIX_RANK=1 disagrees with slurm's rank 2 of this process");
}

TEST_CASE("torchrun's worker: its group rank is its host, and the rendezvous takes the port after the master's") {
  const EngineView v = detectEngine(torchrunWorker(5)).value();
  CHECK(v.engine == "torchrun");
  CHECK(v.rank == 5);
  CHECK(v.node == 1);
  CHECK(v.localRank == 2);
  CHECK(v.tasksPerNode == std::vector<int>{3, 3});
  CHECK(v.coordinatorHost == "10.0.0.1");
  CHECK(v.coordinatorPort == 29501);
  CHECK(v.runKey == "torchrun/run7/0/10.0.0.1:29501");
  CHECK(errorOf([] {
          detectEngine(with(torchrunWorker(0), {{"MASTER_PORT", "65535"}}));
        }) == "MASTER_PORT=65535 leaves no port after it for weft's rendezvous");
  CHECK(errorOf([] {
          detectEngine(without(torchrunWorker(0), "LOCAL_WORLD_SIZE"));
        }).starts_with("LOCAL_RANK is set without LOCAL_WORLD_SIZE"));
  CHECK(errorOf([] {
          detectEngine(with(torchrunWorker(0), {{"WORLD_SIZE", "5"}}));
        }) == "WORLD_SIZE and LOCAL_WORLD_SIZE: 5 processes do not fill hosts of 3 each");
}

TEST_CASE("an engine started inside another's task decides: mpirun or torchrun in a Slurm allocation") {
  // srun started one torchrun per node; torchrun started three workers, which see both.
  const Environment slurmAgent{{"SLURM_PROCID", "1"},
                               {"SLURM_NTASKS", "2"},
                               {"SLURM_LOCALID", "0"},
                               {"SLURM_NODEID", "1"},
                               {"SLURM_STEP_NODELIST", "n[1-2]"},
                               {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"}};
  const EngineView torch = detectEngine(with(slurmAgent, torchrunWorker(4))).value();
  CHECK(torch.engine == "torchrun");
  CHECK(torch.rank == 4);
  // An sbatch script's batch step runs mpirun, whose ranks see the batch step's variables.
  const EngineView mpi =
      detectEngine(with(with(slurmAgent, {{"SLURM_PROCID", "0"}, {"SLURM_NODEID", "0"}}), mpiRank(5))).value();
  CHECK(mpi.engine == "openmpi");
  CHECK(mpi.rank == 5);
}

TEST_CASE("RANK and WORLD_SIZE beside another engine's variables must agree with them") {
  CHECK(detectEngine(with(slurmTask(3), {{"RANK", "3"}, {"WORLD_SIZE", "6"}}))->engine == "slurm");
  const std::string error = errorOf([] { detectEngine(with(slurmTask(3), {{"RANK", "2"}, {"WORLD_SIZE", "6"}})); });
  CHECK(
      error.starts_with("the variables of slurm and of rank-env disagree on this process's place (rank 3 of 6 against "
                        "rank 2 of 6): SLURM_PROCID=3"));
  CHECK(error.find("RANK=2") != std::string::npos);
}

TEST_CASE("RANK and WORLD_SIZE alone (DeepSpeed, Ray Train, a script): one process per host") {
  const EngineView v =
      detectEngine({{"RANK", "2"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h0"}, {"MASTER_PORT", "6000"}}).value();
  CHECK(v.engine == "rank-env");
  CHECK(v.node == 2);
  CHECK(v.tasksPerNode == std::vector<int>{1, 1, 1, 1});
  CHECK(v.coordinatorPort == 6000);  // no torchrun store holds it
  CHECK(errorOf([] { detectEngine({{"RANK", "2"}}); }).starts_with("RANK is set without WORLD_SIZE"));
}

TEST_CASE("a Kubeflow pod: one process per pod, torchrun's job when the pod runs several") {
  const Environment pod{{"PET_NNODES", "3"},
                        {"PET_NODE_RANK", "1"},
                        {"PET_NPROC_PER_NODE", "1"},
                        {"PET_MASTER_ADDR", "train-node-0-0.train"},
                        {"PET_MASTER_PORT", "29400"}};
  const EngineView v = detectEngine(pod).value();
  CHECK(v.engine == "kubeflow");
  CHECK(v.rank == 1);
  CHECK(v.size == 3);
  CHECK(v.coordinatorHost == "train-node-0-0.train");
  CHECK(v.coordinatorPort == 29400);
  CHECK(detectEngine(with(pod, {{"JOB_COMPLETION_INDEX", "1"}}))->engine == "kubeflow");  // a TrainJob's indexed Job
  CHECK(errorOf([&] {
          detectEngine(with(pod, {{"JOB_COMPLETION_INDEX", "0"}}));
        }) == "JOB_COMPLETION_INDEX=0 disagrees with PET_NODE_RANK=1");
  CHECK(errorOf([&] {
          detectEngine(with(pod, {{"PET_NPROC_PER_NODE", "4"}}));
        }).starts_with("PET_NPROC_PER_NODE='4' asks for several processes in each pod, which torchrun starts"));
  CHECK(errorOf([&] {
          detectEngine(with(pod, {{"PET_NNODES", "1:4"}}));
        })
            .starts_with("PET_NNODES='1:4' is an elastic range of hosts, which torchrun resolves: run `torchrun "
                         "--no-python weft ...` in the pod"));
  // torchrun in the pod: its workers' variables decide, and must match the pod's.
  const Environment torchPod = with(with(pod, {{"PET_NNODES", "2"}, {"PET_NPROC_PER_NODE", "3"}}), torchrunWorker(4));
  CHECK(detectEngine(torchPod)->engine == "torchrun");
  CHECK(errorOf([&] {
          detectEngine(with(torchPod, {{"PET_NODE_RANK", "0"}}));
        }) == "torchrun's GROUP_RANK=1 of 2 hosts disagrees with Kubeflow's PET_NODE_RANK=0 of PET_NNODES=2");
}

TEST_CASE("torchrun --nnodes MIN:MAX in a Kubeflow pod: the hosts of torchrun's round decide, not the pod's index") {
  // Its rendezvous ranked this pod (PET_NODE_RANK 2) host 1 of the 2 hosts that came this round.
  const Environment pod{{"PET_NNODES", "2:4"},
                        {"PET_NODE_RANK", "2"},
                        {"PET_NPROC_PER_NODE", "3"},
                        {"PET_MASTER_ADDR", "train-node-0-0.train"},
                        {"PET_MASTER_PORT", "29400"}};
  const EngineView v = detectEngine(with(pod, torchrunWorker(4))).value();
  CHECK(v.engine == "torchrun");
  CHECK(v.rank == 4);
  CHECK(v.size == 6);
  CHECK(v.node == 1);
  CHECK(v.nodes() == 2);
}

TEST_CASE("an indexed Job or JobSet pod: its completion index, with the size and pod 0's name from the manifest") {
  const Environment pod{
      {"JOB_COMPLETION_INDEX", "2"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "weft-0.weft"}, {"MASTER_PORT", "29500"}};
  const EngineView v = detectEngine(pod).value();
  CHECK(v.engine == "indexed-job");
  CHECK(v.rank == 2);
  CHECK(v.node == 2);
  CHECK(v.coordinatorHost == "weft-0.weft");
  CHECK(v.coordinatorPort == 29500);
  CHECK(errorOf([&] {
          detectEngine(without(pod, "WORLD_SIZE"));
        }).starts_with("JOB_COMPLETION_INDEX is set, but the manifest gives not all of WORLD_SIZE"));
  CHECK(errorOf([&] {
          detectEngine(with(pod, {{"RANK", "1"}}));
        }).starts_with("the variables of indexed-job and of rank-env disagree"));
}

TEST_CASE("WEFT_RENDEZVOUS says where the rendezvous runs, over what the engine says") {
  const EngineView v = detectEngine(with(mpiRank(0), {{"WEFT_RENDEZVOUS", "10.1.2.3:7000"}})).value();
  CHECK(v.coordinatorHost == "10.1.2.3");
  CHECK(v.coordinatorPort == 7000);
  for (const char* bad : {"10.1.2.3", ":7000", "h:0", "h:70000", "h:x"})
    CHECK(errorOf([&] {
            detectEngine(with(mpiRank(0), {{"WEFT_RENDEZVOUS", bad}}));
          }) == fmt::format("WEFT_RENDEZVOUS='{}' is not HOST:PORT", bad));
}

TEST_CASE("the job an engine's view lays out: servers first on each host, then workers") {
  const EngineView v = detectEngine(slurmTask(3)).value();  // host 1, local rank 0
  const EngineLayout servers = layoutEngineJob(v, 1, "10.0.0.2");
  CHECK(servers.self == MemberId{Role::Server, 1, 0});
  REQUIRE(servers.resources.hosts().size() == 2);
  CHECK(servers.resources.hosts()[0].address == "node01");
  CHECK(servers.resources.hosts()[1].address == "10.0.0.2");  // its own host: where it listens
  CHECK(servers.resources.hosts()[1].cpuWorkers == 2);
  CHECK(servers.resources.serverCount() == 2);
  CHECK(servers.resources.bind() == "0.0.0.0");
  const EngineLayout workers = layoutEngineJob(detectEngine(slurmTask(5)).value(), 1, "10.0.0.2");
  CHECK(workers.self == MemberId{Role::Worker, 1, 1});
  CHECK(describeEngineProcess(detectEngine(slurmTask(5)).value(), workers) ==
        "slurm: rank 5 of 6, host 1 of 2 (node02), local rank 2 of 3: worker 1 of host 1");
  CHECK(errorOf([&] { layoutEngineJob(v, 3, "10.0.0.2"); }) ==
        "host 0 of the slurm job runs 3 processes, and --servers-per-host 3 would leave it no worker");
  // Hosts the engine does not name are placeholders: only a process's own host address is used.
  const EngineLayout mpi = layoutEngineJob(detectEngine(mpiRank(0)).value(), 0, "10.0.0.1");
  CHECK(mpi.resources.hosts()[1].address == "engine-host-1");
}

TEST_CASE("a job on one host meets on loopback; across hosts, a loopback or missing rendezvous host is refused") {
  const Environment oneHost{{"OMPI_COMM_WORLD_RANK", "1"},
                            {"OMPI_COMM_WORLD_SIZE", "3"},
                            {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                            {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}};
  const EngineRendezvous local = engineRendezvous(detectEngine(oneHost).value());
  CHECK(local.host == "127.0.0.1");
  CHECK(local.port == 0);
  CHECK(local.selfAddress == "127.0.0.1");
  const EngineLayout layout = layoutEngineJob(detectEngine(oneHost).value(), 1, local.selfAddress);
  CHECK(layout.resources.bind() == "127.0.0.1");
  CHECK(
      errorOf([] {
        engineRendezvous(detectEngine(mpiRank(0)).value());
      }).starts_with("the openmpi job spans 2 hosts, and nothing says where its first process serves the rendezvous"));
  CHECK(errorOf([] {
          engineRendezvous(detectEngine(with(mpiRank(0), {{"WEFT_RENDEZVOUS", "localhost:7000"}})).value());
        })
            .starts_with("the openmpi job spans 2 hosts, but its rendezvous host 'localhost' resolves to 127.0.0.1, a "
                         "loopback address"));
  CHECK(errorOf([] {
          engineRendezvous(detectEngine(with(mpiRank(0), {{"WEFT_RENDEZVOUS", "no-such-host.invalid:7000"}})).value());
        }).starts_with("the rendezvous host 'no-such-host.invalid' does not resolve"));
}

TEST_CASE("weft env describes what the engine said, or that none did") {
  CHECK(describeEngineEnvironment({}, 0) ==
        "no cluster engine started this process: it trains alone, or launches with --workers or --cluster\n");
  const Environment oneHost{{"OMPI_COMM_WORLD_RANK", "0"},
                            {"OMPI_COMM_WORLD_SIZE", "2"},
                            {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                            {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};
  CHECK(describeEngineEnvironment(oneHost, 1) ==
        "openmpi: rank 0 of 2, host 0 of 1, local rank 0 of 2: server of host 0\n"
        "rendezvous: 127.0.0.1, a port the first process picks\n"
        "this host's address: 127.0.0.1\n"
        "  OMPI_COMM_WORLD_RANK=0\n  OMPI_COMM_WORLD_SIZE=2\n  OMPI_COMM_WORLD_LOCAL_RANK=0\n  "
        "OMPI_COMM_WORLD_LOCAL_SIZE=2\n");
}
