// `weft launch [--workers N --servers M | --cluster SPEC] [--arch A] -- PROGRAM ARGS...`: starts
// a user's program as every worker and server of a job, through the launcher `weft train` uses
// (dist/launch/Launcher.h). Inside, dist::get_runner(graph, config) finds the job from the environment.
#pragma once

namespace weft::tools {

/// True when the command is `weft launch ...`.
bool wantsLaunch(int argc, char** argv);
/// Parses the launcher's flags and runs the job; returns the exit status.
int runLaunch(int argc, char** argv);

}  // namespace weft::tools
