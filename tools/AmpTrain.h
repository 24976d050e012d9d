// `weft train MODEL --amp` and `weft graph MODEL --amp`: asynchronous model-parallel training of
// the AMP models (models/AmpModels.h) on worker threads, and their graphs. Its flags differ from
// the zoo trainer's, so the command line is routed here before the zoo's parser sees it.
#pragma once

namespace weft::tools {

/// True when the command is `weft train ...` or `weft graph ...` with --amp among its arguments.
bool wantsAmp(int argc, char** argv);
/// Parses the command line and runs it; returns the exit status.
int runAmp(int argc, char** argv);

}  // namespace weft::tools
