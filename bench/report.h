// openmla-bench: the two outputs of a run: a table for people, a JSON file for tools
// (bench/plot.py, the results kept in bench/results/).
#pragma once

#include <string>
#include <vector>

#include "bench.h"

namespace openmla::bench {

// What the results were measured on.
struct RunInfo {
  std::string gpu, driver, cuda, commit, date;
  std::string timing;  // how each time was taken (median of a short run, or steady state)
};

// The commit of the build (configure time), or $OPENMLA_COMMIT when set.
std::string commit_id();
// Now, in ISO 8601 (UTC).
std::string iso_date_now();

void print_table(const std::vector<Result>& results);
// The JSON document: {"gpu", "driver", "cuda", "commit", "date", "timing", "ceilings": {...},
// "results": [...]}, unknown numbers as null.
std::string results_json(const RunInfo& info, const Ceilings& ceilings,
                         const std::vector<Result>& results);

}  // namespace openmla::bench
