"""A run whose rollout units come and go for weeks: what the controller keeps of the agents gone stays the size of
the agents it has (their weight nodes' addresses; the gone agents it keeps by name), while the status reply and
summary.json still count every one of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.agents.test_agents_gone_peers import Running
from tests.unit.controller_harness import HandledController, small_job

ROUNDS, PER_ROUND = 5, 8  # 40 units join and are lost, 8 between two metrics rows


class Churn(Running):
    def __init__(self, root: Path, name: str) -> None:
        HandledController.__init__(self, root, small_job("churn", iterations=ROUNDS + 2), listen=f"inproc://{name}")

    def churn(self) -> list[str]:
        """ROUNDS × PER_ROUND new units join, each lost in turn, a metrics row after each PER_ROUND: their names."""
        names = []
        for k in range(ROUNDS):
            for j in range(PER_ROUND):
                name = f"rollout-{10 + k * PER_ROUND + j}"
                self.ends[name] = self.hello(name)
                self.tell(name, "heartbeat", {"name": name, "state": "running", "busy_s": 1.0})
                self.lose(name)
                names.append(name)
            self.train()
        return names


@pytest.fixture
def churn(tmp_path: Path, request: pytest.FixtureRequest):
    r = Churn(tmp_path, f"churn-{request.node.name}")
    yield r
    r.close()


def test_the_weight_book_keeps_the_nodes_of_the_agents_the_job_has(churn: Churn) -> None:
    r = churn
    r.churn()
    nodes = r.ctl.book.nodes
    assert sorted(nodes) == ["w-rollout-0", "w-rollout-1", "w-trainer-0"], len(nodes)
    assert {n.agent for n in nodes.values()} == {"rollout-0", "rollout-1", "trainer-0"}
    r.ends["rollout-90"] = r.hello("rollout-90")  # a unit that joins next is booked
    assert (nodes["w-rollout-90"].agent, nodes["w-rollout-90"].datacenter) == ("rollout-90", "")
