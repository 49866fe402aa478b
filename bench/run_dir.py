"""Reads a tandem run directory (what `tandem train --run-dir DIR` writes); every bench script reads
run directories through this module.

A run directory holds:
  summary.json       the run's totals, written once at its end (absent while the run goes on, and
                     after a kill). Its "schema_version" names its layout; files written before the
                     key existed have none and are version 1.
  metrics.jsonl      one JSON object per line, appended as the run goes (a resumed run appends to
                     it): step rows (step, loss, step_time_s, tokens_per_s, ...), evaluation rows
                     (step, eval_loss), checkpoint rows (checkpoint_blocking_s or checkpoint_write_s)
                     and out-of-memory rows (oom).
  config.yaml        the resolved configuration (read here only for offload.trace_steps).
  model_config.json  the architecture, in the layout of a Hugging Face config.json.
  trace.json         a Chrome trace of the steps in offload.trace_steps, when asked for.

Bad input raises RunDirError, one line that names the directory; `run_cli` turns it into that line
on stderr and exit status 2.
"""
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, TypedDict

#: The newest summary.json layout this reader knows. Version 1 has no "schema_version" key;
#: version 2 adds it and nothing else.
SCHEMA_VERSION = 2

#: One metrics.jsonl row.
Row = Dict[str, Any]

#: The keys every step row carries (and no other row does).
_STEP_KEYS = ("step", "loss", "step_time_s", "tokens_per_s")


class Summary(TypedDict, total=False):
    """summary.json's keys (src/tandem/run/trainer.cpp writes them at the end of a run)."""

    schema_version: int  # 1 for files that carry no such key
    steps: int
    final_step: int
    final_loss: float
    eval_loss: float  # -1 when the run never evaluated
    median_step_time_s: float
    median_tokens_per_s: float
    tokens_per_step: int
    params: int
    n_layer: int
    d_model: int
    seq_len: int
    precision: str
    device: str
    wall_s: float
    skipped_steps: int
    peak_device_bytes: int
    peak_host_bytes: int
    checkpoint: str
    interrupted: bool
    oom_retries: int
    checkpoint_error: str
    unsaved: bool
    telemetry: Dict[str, Any]  # empty when the sampler was off
    placement: Dict[str, Any]  # only with a placement policy


class RunDirError(ValueError):
    """A run directory that cannot be read as asked: `reason` says why, str() adds the directory."""

    def __init__(self, run: str, reason: str):
        super().__init__(f"{run}: {reason}")
        self.run = run
        self.reason = reason


@dataclass
class Metrics:
    """metrics.jsonl's rows in file order, sorted into their kinds."""

    rows: List[Row] = field(default_factory=list)
    #: Lines that are not a JSON object: the last line of a killed run is cut short, and a resumed
    #: run appends its first row to that cut line. They are left out.
    skipped_lines: int = 0

    @property
    def steps(self) -> List[Row]:
        """Step rows: each has step, loss, step_time_s and tokens_per_s. A resumed run repeats the
        steps after its checkpoint; both copies are kept, in file order."""
        return [r for r in self.rows if all(k in r for k in _STEP_KEYS)]

    @property
    def evals(self) -> List[Row]:
        """Evaluation rows: step and eval_loss."""
        return [r for r in self.rows if "eval_loss" in r]

    @property
    def checkpoints(self) -> List[Row]:
        """Checkpoint rows: checkpoint_blocking_s (the step loop's wait) or checkpoint_write_s (a
        background write's duration)."""
        return [r for r in self.rows if "checkpoint_blocking_s" in r or "checkpoint_write_s" in r]


def run_name(run: str) -> str:
    """The directory's last component, the name tables show for the run."""
    return os.path.basename(run.rstrip("/"))


def has_summary(run: str) -> bool:
    """Whether the run wrote its summary.json (it finished, or stopped cleanly)."""
    return os.path.exists(os.path.join(run, "summary.json"))


def _load_json(run: str, name: str) -> Any:
    path = os.path.join(run, name)
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise RunDirError(run, f"no {name}") from None
    except ValueError as e:
        raise RunDirError(run, f"{name} is not valid JSON ({e})") from None


def read_summary(run: str) -> Summary:
    """summary.json, its schema_version set (1 where the file has none). Raises RunDirError when it
    is missing, unreadable, or of a version newer than SCHEMA_VERSION."""
    s = _load_json(run, "summary.json")
    if not isinstance(s, dict):
        raise RunDirError(run, "summary.json is not a JSON object")
    version = s.get("schema_version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise RunDirError(run, f"summary.json has schema_version {version!r}; expected a whole number from 1")
    if version > SCHEMA_VERSION:
        raise RunDirError(run, f"summary.json has schema_version {version}; bench/run_dir.py reads versions up "
                               f"to {SCHEMA_VERSION}: update it to the new layout")
    s["schema_version"] = version
    return s


def read_metrics(run: str) -> Metrics:
    """metrics.jsonl's rows; blank lines and lines that are not a JSON object are left out (counted
    in skipped_lines). Raises RunDirError (reason "no metrics.jsonl") when the file is missing."""
    path = os.path.join(run, "metrics.jsonl")
    m = Metrics()
    try:
        f = open(path)
    except FileNotFoundError:
        raise RunDirError(run, "no metrics.jsonl") from None
    with f:
        for line in f:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            if isinstance(row, dict):
                m.rows.append(row)
            else:
                m.skipped_lines += 1
    return m


def read_model_config(run: str) -> Dict[str, Any]:
    """model_config.json: num_hidden_layers, hidden_size, vocab_size and the rest of a Hugging Face
    config.json."""
    return _load_json(run, "model_config.json")


def read_trace_steps(run: str) -> List[int]:
    """The steps offload.trace_steps names in config.yaml (empty when it names none or the file is
    missing): a traced step starts and ends with every update done, so it and the step after it are
    slower than the others."""
    try:
        lines = open(os.path.join(run, "config.yaml")).read().splitlines()
    except FileNotFoundError:
        return []
    section = ""
    for line in lines:
        if line and not line.startswith(" "):
            section = line.rstrip(":")
        elif section == "offload" and line.strip().startswith("trace_steps:"):
            value = line.split(":", 1)[1].strip().strip("[]\"'")
            return [int(t) for t in value.replace(",", " ").split() if t.isdigit()]
    return []


def read_trace_events(run: str) -> List[Dict[str, Any]]:
    """trace.json's traceEvents."""
    trace = _load_json(run, "trace.json")
    if not isinstance(trace, dict) or "traceEvents" not in trace:
        raise RunDirError(run, "trace.json has no traceEvents")
    return trace["traceEvents"]


def run_cli(main: Callable[[], Optional[int]]) -> None:
    """Runs a script's main() and exits with its status; a RunDirError becomes one line on stderr
    and exit status 2 (bad input, as the tandem CLI reports it)."""
    try:
        status = main()
    except RunDirError as e:
        print(f"{os.path.basename(sys.argv[0])}: {e}", file=sys.stderr)
        sys.exit(2)
    sys.exit(status)
