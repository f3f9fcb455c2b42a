"""`gpusched logs JOB`: finding and printing a job's log from the agents' work directory."""

from __future__ import annotations

import argparse

from gpusched_cli.logs import add_logs_parser, find_job_logs, tail_lines


def test_logs_are_found_per_node_and_tailed(tmp_path, capsys):
    (tmp_path / "node-1").mkdir()
    (tmp_path / "node-2").mkdir()
    (tmp_path / "node-1" / "j1.log").write_text("one\ntwo\nthree\n")
    assert find_job_logs(tmp_path, "j1") == [tmp_path / "node-1" / "j1.log"]
    assert find_job_logs(tmp_path, "j1", "node-2") == []
    assert find_job_logs(tmp_path, "../etc/passwd") == []
    assert tail_lines(tmp_path / "node-1" / "j1.log", 2) == ["two\n", "three\n"]

    parser = argparse.ArgumentParser()
    add_logs_parser(parser.add_subparsers())
    args = parser.parse_args(["logs", "j1", "--tail", "1", "--dir", str(tmp_path)])
    assert args.func(args) == 0 and capsys.readouterr().out == "three\n"
    args = parser.parse_args(["logs", "nope", "--dir", str(tmp_path)])
    assert args.func(args) == 1 and "no log for job nope" in capsys.readouterr().err
