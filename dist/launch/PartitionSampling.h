// `--partitions auto` on a real job (`weft launch` and `weft train`): the launcher runs the job
// once per partition count that the search (dist/launch/PartitionSearch.h) asks for, each run a sample
// that trains --partition-search-steps steps and times their second half, each continuing from
// the previous one's checkpoint, so the samples are training steps too; then it runs the job on
// with the chosen count. A sample's processes learn their part from the environment
// (kPartitionsVariable, kPartitionSampleVariable, kPartitionReportVariable, kResumeVariable in
// dist/Config.h); worker 0 reports what it measured to the file the launcher named, which the
// launcher reads on its own host (worker 0 runs there, or shares its temporary directory).
#pragma once

#include "dist/launch/Launcher.h"
#include "dist/launch/PartitionSearch.h"
#include "dist/launch/ResourceSpec.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace weft::dist {

/// What a sample measured, as worker 0 reports it.
struct PartitionSampleReport {
  int partitions = 0;         ///< the count the job was given
  int effective = 0;          ///< the largest count a variable got (none has more than its rows)
  double secondsPerStep = 0;  ///< over the timed steps
  int64_t timedSteps = 0;     ///< the second half of the sample's steps (0: none were left)
  int64_t step = 0;           ///< the run's step after the sample
  int64_t steps = 0;          ///< the run's last step
};

/// The sample this process's run is (its steps; 0: the run is no sample).
int64_t partitionSampleSteps();
/// Whether the launcher told this run to continue from the checkpoint (a sample after the
/// first, or the run after the search: WEFT_RESUME=on).
bool launcherResumes();
/// Worker 0 of a sample: writes `report` to the launcher's file (atomically).
void reportPartitionSample(const PartitionSampleReport& report);

struct PartitionSearchRun {
  std::vector<PartitionSample> samples;
  PartitionSearch::Choice choice;
};

struct PartitionSearchOptions {
  int64_t sampleSteps = 100;
  /// The first sample continues from the checkpoint (later runs always do).
  bool resume = false;
  /// Where worker 0 reports each sample, as the launcher and worker 0 both see it (a file in the
  /// run's output directory, shared or on the launching host); "": a file in a 0700 directory
  /// of the launcher's, so worker 0 must run on the launching host.
  std::string reportFile;
  /// Called with the samples and the choice before the job runs on.
  std::function<void(const PartitionSearchRun&)> chosen;
};

/// Runs the search on the job `command` of `spec`, printing each sample and the choice, then
/// runs the job on to its end with the chosen count. Throws when a run fails or a sample's
/// report is missing.
PartitionSearchRun launchSearchingPartitions(const ResourceSpec& spec, const std::vector<std::string>& command,
                                             LaunchOptions options, const PartitionSearchOptions& search);

}  // namespace weft::dist
