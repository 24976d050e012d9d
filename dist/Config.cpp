// Architecture names and the rules between settings (see the header).
#include "dist/Config.h"

#include "core/Error.h"
#include "dist/server/SyncPolicy.h"

#include <charconv>
#include <cstdlib>
#include <cstring>

namespace weft::dist {

const char* architectureName(Architecture a) {
  switch (a) {
    case Architecture::Auto: return "auto";
    case Architecture::AllReduce: return "ar";
    case Architecture::ParameterServer: return "ps";
  }
  return "?";
}

Architecture parseArchitecture(const std::string& name) {
  if (name == "auto") return Architecture::Auto;
  if (name == "ar") return Architecture::AllReduce;
  if (name == "ps") return Architecture::ParameterServer;
  WEFT_THROW("unknown architecture '{}' (expected auto, ar or ps)", name);
}

const char* shardingName(Sharding s) {
  switch (s) {
    case Sharding::None: return "none";
    case Sharding::Optimizer: return "optimizer";
    case Sharding::Parameters: return "parameters";
  }
  return "?";
}

Sharding parseSharding(const std::string& name) {
  if (name == "none") return Sharding::None;
  if (name == "optimizer") return Sharding::Optimizer;
  if (name == "parameters") return Sharding::Parameters;
  WEFT_CHECK(name != "gradients", "--shard gradients: 'optimizer' reduce-scatters the gradients already, so no worker "
             "holds a whole summed gradient (ZeRO stages 1 and 2 are one mode here)");
  WEFT_THROW("unknown sharding '{}' (expected none, optimizer or parameters)", name);
}

int64_t integerFromEnvironment(const char* name, int64_t otherwise) {
  const char* text = std::getenv(name);
  if (text == nullptr) return otherwise;
  int64_t value = 0;
  const char* end = text + std::strlen(text);
  const auto [stop, ec] = std::from_chars(text, end, value);
  WEFT_CHECK(ec == std::errc() && stop == end && stop != text && value >= 0,
             "{}={}: expected a whole number of 0 or more", name, text);
  return value;
}

Config withLaunchSettings(Config config) {
  if (const char* arch = std::getenv(kArchitectureVariable)) {
    try {
      config.architecture = parseArchitecture(arch);
    } catch (const std::exception& e) {
      WEFT_THROW("{}={}: {}", kArchitectureVariable, arch, e.what());
    }
  }
  if (const char* sync = std::getenv(kSyncVariable)) {
    try {
      config.sync = parseSyncPolicy(sync);
    } catch (const std::exception& e) {
      WEFT_THROW("{}={}: {}", kSyncVariable, sync, e.what());
    }
  }
  auto positive = [](const char* name, int current) {
    const int64_t value = integerFromEnvironment(name, current);
    WEFT_CHECK(value >= 1 && value <= 1 << 16, "{}={}: expected 1 or more", name, value);
    return static_cast<int>(value);
  };
  config.pipeline.stages = positive(kStagesVariable, config.pipeline.stages);
  config.pipeline.microbatches = positive(kMicrobatchesVariable, config.pipeline.microbatches);
  const int64_t partitions = integerFromEnvironment(kPartitionsVariable, config.partitioning.count);
  WEFT_CHECK(partitions <= 1 << 20, "{}={}: more partitions than any variable has rows", kPartitionsVariable,
             partitions);
  config.partitioning.count = static_cast<int>(partitions);
  return config;
}

void checkConfig(const Config& config, const JobShape& job) {
  const PipelineConfig& pipeline = config.pipeline;
  WEFT_CHECK(config.sync->synchronous() || (job.servers > 0 && pipeline.stages == 1 &&
                                            config.architecture == Architecture::ParameterServer),
             "{} (--sync) applies each worker's push on the parameter servers as it comes: it needs parameter servers "
             "(--workers or --cluster), one pipeline stage, and every trained variable on the servers "
             "(Architecture::ParameterServer, --arch ps; auto means ps under it), since AllReduce and pipeline stages "
             "wait for every worker at every step",
             config.sync->name());
  WEFT_CHECK(pipeline.microbatches == 1 || pipeline.stages > 1 || job.workers == 1,
             "{} micro-batches (--microbatches) with {} data-parallel workers: data-parallel workers do not cut their "
             "parts into micro-batches (pipelines do: add --stages)",
             pipeline.microbatches, job.workers);
  WEFT_CHECK(job.sharedGpu.empty() || pipeline.stages > 1,
             "{}: data-parallel GPU workers sum their gradients through NCCL, which refuses two workers on one GPU; "
             "list each GPU once (the stages of a pipeline, --stages, may share one)",
             job.sharedGpu);
  if (pipeline.stages > 1) {
    WEFT_CHECK(job.workers % pipeline.stages == 0,
               "a pipeline of {} stages runs one stage per worker, and each data-parallel replica all of them, but "
               "the job has {} workers",
               pipeline.stages, job.workers);
  }
  // A schedule file is checked against the job's stages and micro-batches before anything starts.
  [[maybe_unused]] const PipelineOrders orders = pipeline.schedule.orders(pipeline.stages, pipeline.microbatches);
  WEFT_CHECK(config.partitioning.count == 0 || (job.servers > 0 && config.architecture != Architecture::AllReduce),
             "{} partitions (--partitions) split variables on parameter servers, which this job has none of (they need "
             "--workers or --cluster with servers, and --arch auto or ps)",
             config.partitioning.count);
  WEFT_CHECK(config.wireDType == DType::F32 || config.wireDType == DType::BF16 || config.wireDType == DType::F16,
             "--wire-dtype {}: gradients travel as f32, bf16 or f16", dtypeName(config.wireDType));
  // Data-parallel workers, or a pipeline's replicas, sum dense gradients over a ring.
  const bool ringAllReduce = job.workers > pipeline.stages && config.architecture != Architecture::ParameterServer;
  const bool servedRows =
      job.servers > 0 && config.architecture != Architecture::AllReduce && config.wireDType == DType::BF16;
  WEFT_CHECK(config.wireDType == DType::F32 || ringAllReduce || servedRows,
             "--wire-dtype {} narrows the ring AllReduce of dense gradients among data-parallel workers, and (bf16 "
             "only) the rows pulled from and pushed to parameter servers, which this job has none of (it needs several "
             "workers or pipeline replicas and --arch auto or ar, or servers and --arch auto or ps)",
             dtypeName(config.wireDType));
  if (config.sharding != Sharding::None) {
    WEFT_CHECK(pipeline.stages == 1 || config.sharding == Sharding::Optimizer,
               "--shard {} with a pipeline of {} stages: each stage holds its own layers' parameters already, and "
               "--shard optimizer shards their optimizer state among the stage's replicas (sharding the parameters "
               "too, ZeRO stage 3, across a pipeline's replicas is not implemented)",
               shardingName(config.sharding), pipeline.stages);
    WEFT_CHECK(config.architecture != Architecture::ParameterServer, "--shard {} shards the dense variables the "
               "workers sum by AllReduce, and --arch ps (which the asynchronous --sync modes imply) puts every "
               "variable on the parameter servers",
               shardingName(config.sharding));
    WEFT_CHECK(config.wireDType == DType::F32, "--shard {} reduce-scatters the gradients in full precision; "
               "--wire-dtype {} narrows only the AllReduce", shardingName(config.sharding),
               dtypeName(config.wireDType));
  }
}

}  // namespace weft::dist
