// Distributed training on GPU workers, through the real `weft train --cluster` with a host that
// lists GPUs: each worker computes on its GPU and sums its dense gradients through NCCL, while
// sparse embeddings stay on parameter servers reached over UCX. One GPU runs a job of one worker
// (an NCCL communicator of one rank, and every op of the GPU path: the sums' Start and Wait on
// the GPU, pulls and pushes copied through the host, variables broadcast and fetched through it);
// jobs of several GPU workers need as many GPUs, since NCCL refuses two ranks on one device.
// A pipeline's stage processes, which exchange activations through host memory over UCX, may
// share one GPU, so one GPU runs those too.
// These need a GPU: without one the binary reports why and exits as skipped (see gpu_main.cpp).
#include "tests/TrainerCompare.h"

#include "core/Device.h"
#include "dist/collective/Nccl.h"

#include <fmt/format.h>

#include <fstream>

namespace fs = std::filesystem;

namespace {

/// A resource specification of one loopback host with GPUs 0 .. gpus-1 and one server.
std::string gpuCluster(const fs::path& dir, int gpus) {
  std::string ids;
  for (int g = 0; g < gpus; ++g) ids += fmt::format("{}{}", g ? ", " : "", g);
  const fs::path spec = dir / "gpus.json";
  std::ofstream(spec) << fmt::format(R"({{"hosts": [{{"address": "127.0.0.1", "gpus": [{}], "servers": 1}}]}})", ids);
  return spec.string();
}

/// A specification of one loopback host whose `workers` workers all compute on GPU 0, without
/// servers: the stage processes of a pipeline sharing the GPU.
std::string sharedGpuCluster(const fs::path& dir, int workers) {
  std::string ids;
  for (int w = 0; w < workers; ++w) ids += w ? ", 0" : "0";
  const fs::path spec = dir / "shared.json";
  std::ofstream(spec) << fmt::format(R"({{"hosts": [{{"address": "127.0.0.1", "gpus": [{}], "servers": 0}}]}})", ids);
  return spec.string();
}

const std::string mlpFlags = "--train-size 1024 --test-size 64 --batch 64 --steps 12 --eval-every 12 --threads 1 "
                             "--timeout 60";
const std::string lmFlags = "--vocab 500 --classes 10 --embed 16 --hidden 32 --sampled 64 --train-sentences 400 "
                            "--heldout-sentences 20 --batch 16 --steps 10 --clip 1 --eval-every 10 --threads 1 "
                            "--timeout 60";

const std::string resnetFlags = "--depth 8 --width 4 --train-images 128 --test-images 16 --batch 16 --steps 4 "
                                "--eval-every 4 --threads 1 --timeout 60";
const std::string tiedLmFlags = "--vocab 500 --classes 10 --embed 32 --hidden 32 --tie-embeddings --sampled 64 "
                                "--train-sentences 400 --heldout-sentences 20 --batch 16 --steps 10 --clip 1 "
                                "--eval-every 10 --threads 1 --timeout 60";

const std::string onGpu = "--device cuda:0";  // the one process the job is compared with
// GPU workers need NCCL: a CUDA build without it refuses them (tests/test_dist_train.cpp checks how).
const bool noNccl = !weft::dist::kNcclBuilt;
const bool fewerThanTwoGpus = noNccl || weft::cudaDeviceCount() < 2;

}  // namespace

TEST_CASE("MLP: one GPU worker under ar (dense sums through NCCL) trains like one process on that GPU" *
          doctest::skip(noNccl)) {
  TempDir dir;
  // The one rank's sum is its own gradient, copied: nothing may differ.
  checkSameVariablesAs("mlp", mlpFlags, "--cluster " + gpuCluster(dir.path, 1) + " --arch ar", 1e-6, onGpu);
}

TEST_CASE("MLP in mixed precision: one GPU worker under ar trains like one process on that GPU (bf16; f16 with its "
          "loss scale)" * doctest::skip(noNccl)) {
  for (const char* precision : {"bf16", "f16"}) {
    CAPTURE(precision);
    TempDir dir;
    const std::string flags = mlpFlags + " --precision " + precision;
    checkSameVariablesAs("mlp", flags, "--cluster " + gpuCluster(dir.path, 1) + " --arch ar", 1e-6, onGpu);
  }
}

TEST_CASE("LM: one GPU worker trains like one process on that GPU under each architecture" * doctest::skip(noNccl)) {
  // auto and ps keep the embedding (and under ps everything) on a CPU server, whose Adam steps
  // round differently from the GPU's.
  for (const char* arch : {"auto", "ar", "ps"}) {
    CAPTURE(arch);
    TempDir dir;
    checkSameVariablesAs("lm", lmFlags, "--cluster " + gpuCluster(dir.path, 1) + " --arch " + arch, 1e-4, onGpu);
  }
}

TEST_CASE("two GPU workers with a part each train like one process on one GPU with the total batch" *
          doctest::skip(fewerThanTwoGpus)) {
  TempDir dir;
  const std::string cluster = "--cluster " + gpuCluster(dir.path, 2);
  checkSameVariablesAs("mlp", mlpFlags, cluster + " --arch ar", 1e-5, onGpu);
  checkSameVariablesAs("lm", lmFlags, cluster + " --arch auto", 1e-4, onGpu);
}

TEST_CASE("pipelines: stage processes sharing one GPU train like one process on it, activations passing through "
          "the host") {
  // 1F1B over 2 processes; the tied LM sends its table's updated rows between them and updates on
  // a guessed clip scale (post-validation), keeping the rows it overwrites on the GPU; ZB-V puts
  // two of the ResNet's four stages (batch norm in each) on each process; 2 replicas average
  // their stages' gradients through the host.
  TempDir dir;
  const std::string twoStages = "--stages 2 --cluster " + sharedGpuCluster(dir.path, 2);
  checkSameVariablesAs("mlp", mlpFlags, twoStages + " --microbatches 4", 1e-5, onGpu);
  checkSameVariablesAs("lm", tiedLmFlags, twoStages + " --microbatches 2", 1e-4, onGpu);
  // Batch norm normalises each micro-batch by its own statistics: the one process cuts its batch
  // into micro-batches too (fed to the GPU one by one).
  checkSameVariablesAs("resnet", resnetFlags + " --microbatches 2", twoStages + " --schedule zbv", 1e-4, onGpu);
  TempDir four;
  checkSameVariablesAs("lm", lmFlags, "--stages 2 --microbatches 2 --cluster " + sharedGpuCluster(four.path, 4), 1e-4,
                       onGpu);
}

TEST_CASE("pipelines in f16 with a loss scale: stage processes sharing one GPU train like one process on it") {
  // One micro-batch: the stages multiply the same rows in f16 as the one process does. Each stage
  // checks its gradients on the GPU and the last stage decides for all (tests/test_pipeline.cpp
  // checks a skipped step).
  TempDir dir;
  checkSameVariablesAs("mlp", mlpFlags + " --precision f16",
                       "--stages 2 --microbatches 1 --cluster " + sharedGpuCluster(dir.path, 2), 1e-5, onGpu);
}
