"""deploy/README.md's table of the broker's ACLs is the code's ACL layout (kafka_security.SERVICE_ACCESS and
node_acls): who may produce and consume each topic, with the consumer groups."""

from __future__ import annotations

import re
from pathlib import Path

from gpusched_common.infra.kafka_security import SERVICE_ACCESS, node_acls
from gpusched_common.topics import ALL_TOPICS, agent_group

README = (Path(__file__).resolve().parents[2] / "deploy" / "README.md").read_text()


def documented() -> dict[str, tuple[set[str], set[str]]]:
    rows = {}
    lines = README.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| topic | who may produce"))
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        match = re.match(r"^\| `(gpusched\.[a-z.]+)` \| ([^|]+) \| ([^|]+) \|$", line)
        if match and "who may" not in line:
            produce = {p.strip() for p in match.group(2).split(",") if p.strip() != "-"}
            consume = {c.split(" (")[0].strip() + (" " + c.split("(`")[1].split("`")[0] if "(`" in c else "")
                       for c in match.group(3).split("), ") if c.strip() and not c.strip().startswith("-")}
            rows[match.group(1)] = (produce, consume)
    return rows


def test_the_documented_acls_are_the_code_s():
    table = documented()
    assert set(table) == {t.name for t in ALL_TOPICS}
    node = {(a.operation, a.name) for a in node_acls("n1")}
    for topic in ALL_TOPICS:
        produce = {s for s, a in SERVICE_ACCESS.items() if topic.name in a.writes}
        if ("Write", topic.name) in node:
            produce.add("each node")
        consume = {f"{s} {g}" for s, a in SERVICE_ACCESS.items() for t, g in a.reads if t == topic.name}
        if ("Read", topic.name) in node:
            consume.add("each node " + agent_group("<node>"))
        assert table[topic.name] == (produce, consume), topic.name
