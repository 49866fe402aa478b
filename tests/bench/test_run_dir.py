"""bench/run_dir.py on small run directories in the shape src/tandem/run/trainer.cpp writes."""
import json
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")
sys.path.insert(0, BENCH)

import dist_scaling_table  # noqa: E402
import run_dir  # noqa: E402
from run_dir import RunDirError  # noqa: E402


def step_row(step, loss, step_time_s=0.5, tokens_per_step=4096):
    """A step row with the keys every run writes (GPU, telemetry and offload keys left out)."""
    return {"step": step, "loss": loss, "lr": 3e-4, "grad_norm": 1.25, "step_time_s": step_time_s,
            "tokens_per_s": tokens_per_step / step_time_s, "tokens": step * tokens_per_step,
            "mem_host_peak_bytes": 2**30, "t_s": step * step_time_s, "time_forward_s": 0.2,
            "time_backward_s": 0.25, "time_update_s": 0.05, "time_idle_s": 0.0}


def summary(version=None, **extra):
    s = {"steps": 4, "final_step": 4, "final_loss": 2.5, "eval_loss": 2.75, "median_step_time_s": 0.5,
         "median_tokens_per_s": 8192.0, "tokens_per_step": 4096, "params": 820352, "n_layer": 4, "d_model": 128,
         "seq_len": 64, "precision": "fp32", "device": "cpu", "wall_s": 3.5, "skipped_steps": 0,
         "peak_device_bytes": 0, "peak_host_bytes": 2**30, "checkpoint": "", "interrupted": False,
         "oom_retries": 0, "checkpoint_error": "", "unsaved": False, "telemetry": {}}
    if version is not None:
        s["schema_version"] = version
    s.update(extra)
    return s


def write_run(path, summary_json=None, metrics_text=None):
    os.makedirs(path, exist_ok=True)
    if summary_json is not None:
        with open(os.path.join(path, "summary.json"), "w") as f:
            f.write(summary_json if isinstance(summary_json, str) else json.dumps(summary_json, indent=2) + "\n")
    if metrics_text is not None:
        with open(os.path.join(path, "metrics.jsonl"), "w") as f:
            f.write(metrics_text)
    return str(path)


def lines(*rows):
    return "".join(json.dumps(r) + "\n" for r in rows)


# summary.json


def test_version_1_summary_reads_as_version_1(tmp_path):
    run = write_run(tmp_path / "v1", summary())
    s = run_dir.read_summary(run)
    assert s["schema_version"] == 1
    assert s["median_step_time_s"] == 0.5 and s["tokens_per_step"] == 4096 and s["telemetry"] == {}


def test_version_2_summary(tmp_path):
    run = write_run(tmp_path / "v2", summary(2, placement={"policy": "cost", "moves": 3}))
    s = run_dir.read_summary(run)
    assert s["schema_version"] == 2
    assert s["placement"] == {"policy": "cost", "moves": 3}
    assert s["final_loss"] == 2.5


def test_newer_version_is_refused_in_one_line(tmp_path):
    run = write_run(tmp_path / "v3", summary(run_dir.SCHEMA_VERSION + 1))
    with pytest.raises(RunDirError) as e:
        run_dir.read_summary(run)
    msg = str(e.value)
    assert "\n" not in msg
    assert run in msg and f"schema_version {run_dir.SCHEMA_VERSION + 1}" in msg


@pytest.mark.parametrize("version", ["2", 2.0, True, 0, None])
def test_malformed_version_is_refused(tmp_path, version):
    run = write_run(tmp_path / "bad", summary(**{"schema_version": version}))
    with pytest.raises(RunDirError, match="schema_version"):
        run_dir.read_summary(run)


def test_missing_and_cut_summary(tmp_path):
    run = write_run(tmp_path / "none", metrics_text=lines(step_row(1, 3.0)))
    assert not run_dir.has_summary(run)
    with pytest.raises(RunDirError) as e:
        run_dir.read_summary(run)
    assert e.value.reason == "no summary.json"
    write_run(tmp_path / "none", '{"steps": 4, "final_')
    assert run_dir.has_summary(run)
    with pytest.raises(RunDirError, match="summary.json is not valid JSON"):
        run_dir.read_summary(run)


def test_a_script_refuses_a_newer_version_in_one_line_with_status_2(tmp_path):
    run = write_run(tmp_path / "v3", summary(run_dir.SCHEMA_VERSION + 1),
                    lines(step_row(1, 3.0), step_row(2, 2.9)))
    p = subprocess.run([sys.executable, os.path.join(BENCH, "train_curves.py"), run], capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stdout == ""
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("train_curves.py: ")
    assert "schema_version" in p.stderr


# metrics.jsonl


def test_rows_are_sorted_into_their_kinds(tmp_path):
    rows = [step_row(1, 3.0), step_row(2, 2.9), {"step": 2, "eval_loss": 2.95},
            {"step": 2, "checkpoint": "ck/step_00000002", "checkpoint_blocking_s": 0.25},
            {"step": 3, "oom": "CUDA out of memory", "micro_batch_effective": 2, "grad_accum_effective": 2},
            step_row(3, 2.8), {"step": 2, "checkpoint": "ck/step_00000002", "checkpoint_write_s": 1.5},
            {"step": 3, "checkpoint_failed": "disk full"}, step_row(4, 2.7), {"step": 4, "eval_loss": 2.75}]
    m = run_dir.read_metrics(write_run(tmp_path / "r", summary(2), lines(*rows)))
    assert m.rows == rows
    assert [r["step"] for r in m.steps] == [1, 2, 3, 4]
    assert [(r["step"], r["eval_loss"]) for r in m.evals] == [(2, 2.95), (4, 2.75)]
    assert [r.get("checkpoint_blocking_s", r.get("checkpoint_write_s")) for r in m.checkpoints] == [0.25, 1.5]
    assert m.skipped_lines == 0


def test_a_killed_run_cut_line_is_left_out(tmp_path):
    text = lines(step_row(1, 3.0), step_row(2, 2.9)) + json.dumps(step_row(3, 2.8))[:37]
    m = run_dir.read_metrics(write_run(tmp_path / "killed", None, text))
    assert [r["step"] for r in m.steps] == [1, 2]
    assert m.skipped_lines == 1


def test_a_resumed_run_keeps_every_row_after_the_glued_line(tmp_path):
    # Killed mid-row after step 3, resumed from the checkpoint at step 2: the first row the resumed
    # run appends lands on the cut line; steps 3 and 4 follow.
    cut = json.dumps(step_row(3, 2.8))[:30]
    text = (lines(step_row(1, 3.0), step_row(2, 2.9)) + cut + lines(step_row(3, 2.81), step_row(4, 2.7)) + "\n"
            + "[1, 2]\n" + "   \n")
    m = run_dir.read_metrics(write_run(tmp_path / "resumed", None, text))
    assert [(r["step"], r["loss"]) for r in m.steps] == [(1, 3.0), (2, 2.9), (4, 2.7)]
    assert m.skipped_lines == 2  # the glued line and the JSON array; the blank lines do not count


def test_repeated_steps_keep_file_order(tmp_path):
    rows = [step_row(1, 3.0), step_row(2, 2.9), step_row(3, 2.8), step_row(2, 2.91), step_row(3, 2.79)]
    m = run_dir.read_metrics(write_run(tmp_path / "r", None, lines(*rows)))
    assert [(r["step"], r["loss"]) for r in m.steps] == [(1, 3.0), (2, 2.9), (3, 2.8), (2, 2.91), (3, 2.79)]


def test_missing_metrics(tmp_path):
    with pytest.raises(RunDirError) as e:
        run_dir.read_metrics(write_run(tmp_path / "empty", summary()))
    assert e.value.reason == "no metrics.jsonl"


def test_dist_table_reads_a_killed_run(tmp_path):
    rows = [step_row(s, 3.0 - s / 10, step_time_s=0.5 + s / 100) for s in range(1, 9)]
    run = write_run(tmp_path / "killed", None, lines(*rows) + '{"step": 9, "lo')
    res = dist_scaling_table.tandem_result(run, warmup=5)
    assert res["steps_logged"] == 8 and res["steps_timed"] == 3
    assert res["median_step_s"] == pytest.approx(0.57)
    assert res["tokens_per_step"] == 8 * 4096  # no summary: the last row's token count
    assert dist_scaling_table.tandem_result(str(tmp_path / "nowhere"), warmup=5) == {"error": "no metrics.jsonl"}


# the other files


def test_model_config_trace_and_name(tmp_path):
    run = write_run(tmp_path / "live-1b", summary(2), lines(step_row(1, 3.0)))
    with open(os.path.join(run, "model_config.json"), "w") as f:
        json.dump({"num_hidden_layers": 4, "hidden_size": 128, "vocab_size": 256}, f)
    events = [{"ph": "X", "name": "forward", "ts": 1, "dur": 2}, {"ph": "C", "name": "gpu_power_w", "ts": 1}]
    with open(os.path.join(run, "trace.json"), "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    assert run_dir.read_model_config(run)["hidden_size"] == 128
    assert run_dir.read_trace_events(run) == events
    assert run_dir.run_name(run + "/") == "live-1b"
    with open(os.path.join(run, "trace.json"), "w") as f:
        json.dump({"events": events}, f)
    with pytest.raises(RunDirError, match="traceEvents"):
        run_dir.read_trace_events(run)


def test_trace_steps_from_the_config_and_the_big_table_leaves_them_out(tmp_path):
    import offload_big

    rows = [step_row(s, 3.0, step_time_s=1.0 if s < 7 else 2.0) for s in range(1, 9)]
    run = write_run(tmp_path / "big", None, lines(*rows))
    assert run_dir.read_trace_steps(run) == []  # no config.yaml
    with open(os.path.join(run, "config.yaml"), "w") as f:
        f.write("dist:\n  pipeline_trace_steps: 3\noffload:\n  optimizer: cpu\n  trace_steps: \"7,8\"\ntrain:\n  steps: 8\n")
    assert run_dir.read_trace_steps(run) == [7, 8]
    assert offload_big.engine(run)["step_s"] == 1.0  # steps 5 and 6; the traced 7 and 8 left out
    with open(os.path.join(run, "config.yaml"), "w") as f:
        f.write("offload:\n  trace_steps: \"\"\n")
    assert offload_big.engine(run)["step_s"] == 1.5  # nothing traced: the median of steps 5-8
