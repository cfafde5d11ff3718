"""The impact study: how activation-memory methods change validation metric, memory and speed.

``plan_sweep`` lists the runs (models x seeds x methods), ``run_sweep`` trains each through the
trainer and appends it to ``results.jsonl``, ``write_report`` turns the results into ``report.md``
with PNG plots. The command line is ``hpcdl study run|report``.
"""

from hpcdl.study.report import write_report
from hpcdl.study.results import append_record, read_results
from hpcdl.study.sweep import PlannedRun, RunSpec, parse_shard, plan_sweep, run_sweep, shard
from hpcdl.train.method_spec import Method, parse_method, parse_methods

__all__ = ["Method", "PlannedRun", "RunSpec", "append_record", "parse_method", "parse_methods", "parse_shard",
           "plan_sweep", "read_results", "run_sweep", "shard", "write_report"]
