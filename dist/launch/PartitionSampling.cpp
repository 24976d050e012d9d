// The partition search on a launched job (see the header).
#include "dist/launch/PartitionSampling.h"

#include "core/Error.h"
#include "dist/Config.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

namespace weft::dist {
namespace {

std::string partitionsText(int n) { return fmt::format("{} partition{}", n, n == 1 ? "" : "s"); }

/// A directory of the launcher's own (mode 0700) for the samples' reports; removed with it.
class ReportDirectory {
 public:
  ReportDirectory() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/weft-partition-search-XXXXXX";
    WEFT_CHECK(mkdtemp(pattern.data()) != nullptr,
               "--partitions auto: cannot make a directory {} for the samples' reports", pattern);
    path_ = pattern;
  }
  ~ReportDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ReportDirectory(const ReportDirectory&) = delete;
  ReportDirectory& operator=(const ReportDirectory&) = delete;
  std::string file() const { return path_ + "/sample.json"; }

 private:
  std::string path_;
};

PartitionSampleReport readReport(const std::string& path, int partitions) {
  std::ifstream in(path);
  WEFT_CHECK(in.good(),
             "--partitions auto: the sample of {} wrote no report to {}: worker 0 writes it, and the launcher reads it "
             "on its own host, so worker 0 must run there (the first host of the specification) or share the file's "
             "directory",
             partitionsText(partitions), path);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  try {
    WEFT_CHECK(j.is_object(), "not a JSON object");
    PartitionSampleReport r;
    r.partitions = j.at("partitions").get<int>();
    r.effective = j.at("effective").get<int>();
    r.secondsPerStep = j.at("seconds_per_step").get<double>();
    r.timedSteps = j.at("timed_steps").get<int64_t>();
    r.step = j.at("step").get<int64_t>();
    r.steps = j.at("steps").get<int64_t>();
    WEFT_CHECK(r.partitions == partitions, "it is of {}", partitionsText(r.partitions));
    return r;
  } catch (const std::exception& e) {
    WEFT_THROW("--partitions auto: the report {} of the sample of {} is malformed: {}", path,
               partitionsText(partitions), e.what());
  }
}

}  // namespace

int64_t partitionSampleSteps() { return integerFromEnvironment(kPartitionSampleVariable, 0); }

bool launcherResumes() {
  const char* resume = std::getenv(kResumeVariable);
  return resume != nullptr && std::string(resume) == "on";
}

void reportPartitionSample(const PartitionSampleReport& report) {
  const char* path = std::getenv(kPartitionReportVariable);
  WEFT_CHECK(path != nullptr && *path != '\0', "this run is a sample of the partition search ({} is set) without {}",
             kPartitionSampleVariable, kPartitionReportVariable);
  const nlohmann::json j{
      {"partitions", report.partitions},  {"effective", report.effective}, {"seconds_per_step", report.secondsPerStep},
      {"timed_steps", report.timedSteps}, {"step", report.step},           {"steps", report.steps}};
  const std::string temporary = fmt::format("{}.tmp-{}", path, getpid());
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << j.dump() << "\n";
    WEFT_CHECK(out.good(), "cannot write the partition sample's report {}", temporary);
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  WEFT_CHECK(!error, "cannot move the partition sample's report to {}: {}", path, error.message());
}

PartitionSearchRun launchSearchingPartitions(const ResourceSpec& spec, const std::vector<std::string>& command,
                                             LaunchOptions options, const PartitionSearchOptions& searchOptions) {
  // A variable never has more partitions than this many; the search stops doubling well before.
  constexpr int kMostPartitions = 1024;
  const int machines = std::max(static_cast<int>(spec.hosts().size()), 1);
  PartitionSearch search(machines, kMostPartitions);
  std::optional<ReportDirectory> ownDirectory;
  if (searchOptions.reportFile.empty()) ownDirectory.emplace();
  const std::string report = ownDirectory ? ownDirectory->file() : searchOptions.reportFile;
  bool resume = searchOptions.resume;
  const std::map<std::string, std::string> base = options.environment;
  auto runWith = [&](int partitions, bool sample) {
    options.environment = base;
    options.environment[kPartitionsVariable] = std::to_string(partitions);
    if (resume) options.environment[kResumeVariable] = "on";
    if (sample) {
      options.environment[kPartitionSampleVariable] = std::to_string(searchOptions.sampleSteps);
      options.environment[kPartitionReportVariable] = report;
    }
    return launch(spec, command, options);
  };
  while (const std::optional<int> partitions = search.next()) {
    std::filesystem::remove(report);
    WEFT_CHECK(runWith(*partitions, true) == 0, "the distributed job failed while sampling {} (see the messages above)",
               partitionsText(*partitions));
    resume = true;  // every later run continues from the checkpoint this one ended with
    const PartitionSampleReport sample = readReport(report, *partitions);
    std::filesystem::remove(report);
    if (sample.timedSteps == 0) {
      search.stop();  // the job had no steps left to time
      break;
    }
    fmt::print(
        "partition search: {}{}: {:.2f} ms per step over {} steps\n", partitionsText(*partitions),
        sample.effective < *partitions ? fmt::format(" ({} used: no variable has more rows)", sample.effective) : "",
        sample.secondsPerStep * 1e3, sample.timedSteps);
    std::fflush(stdout);  // before the next sample's members print
    search.record(sample.secondsPerStep, sample.effective);
    if (sample.step >= sample.steps) search.stop();
  }
  PartitionSearchRun run;
  run.samples = search.samples();
  if (run.samples.empty()) {  // resumed with no steps left: nothing to time
    run.choice.partitions = machines;
    run.choice.reason = fmt::format("no steps left to sample; {}, one per machine", partitionsText(machines));
  } else {
    run.choice = search.choose();
  }
  fmt::print("partition search: {}\n", run.choice.reason);
  std::fflush(stdout);
  if (searchOptions.chosen) searchOptions.chosen(run);
  WEFT_CHECK(runWith(run.choice.partitions, false) == 0, "the distributed job failed (see the messages above)");
  return run;
}

}  // namespace weft::dist
