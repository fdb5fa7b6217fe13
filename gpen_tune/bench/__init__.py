"""`gpen-tune bench`: the optimization table (six steps, cumulative and alone), measured on real face crops."""

from gpen_tune.bench.report import markdown_table, write_outputs
from gpen_tune.bench.rows import DEFAULT_ROWS, all_rows, select_rows
from gpen_tune.bench.runner import SCHEMA, BenchSettings, run_bench

__all__ = ["DEFAULT_ROWS", "SCHEMA", "BenchSettings", "all_rows", "markdown_table", "run_bench", "select_rows",
           "write_outputs"]
