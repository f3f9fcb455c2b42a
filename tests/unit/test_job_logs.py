"""`gpusched logs JOB`: the command's parser and its tail of the output (the output itself comes through the
gateway: tests/e2e/test_job_control.py)."""

from __future__ import annotations

import argparse

import pytest

from gpusched_cli.logs import add_logs_parser, last_lines


@pytest.mark.parametrize(("lines", "want"), [(None, b"one\ntwo\nthree"), (2, b"two\nthree"), (0, b""),
                                             (9, b"one\ntwo\nthree")])
def test_the_tail_of_a_log(lines, want):
    assert last_lines(b"one\ntwo\nthree", lines) == want


def test_the_parser_takes_a_rank_a_tail_and_follow():
    parser = argparse.ArgumentParser()
    add_logs_parser(parser.add_subparsers())
    args = parser.parse_args(["logs", "j1", "--rank", "1", "--tail", "5", "-f"])
    assert (args.job_id, args.rank, args.tail, args.follow) == ("j1", 1, 5, True)
