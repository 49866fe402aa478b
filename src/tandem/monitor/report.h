#pragma once
// `tandem report RUN_DIR`: one self-contained report.html (inline SVG plots of the dashboard's
// series, the summary table and the run's config) that opens with no server and no network.

#include <string>

namespace tandem {

/// Writes the report for `run_dir` to `out_path` ("" = RUN_DIR/report.html) atomically and returns
/// the path; UserError when the directory holds no metrics.jsonl.
std::string write_report(const std::string& run_dir, const std::string& out_path = "");

}  // namespace tandem
