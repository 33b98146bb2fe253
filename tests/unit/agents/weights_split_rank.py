"""One trainer rank of the split delta encoding test (test_agents_weights_split.py), as its own process:

    python tests/unit/agents/weights_split_rank.py RANK WORLD RENDEZVOUS OUT.json

Forms a gloo group and the trainer's weights group, publishes three versions (v1 full, then v2 and v3 back
to back as deltas: each rank encodes its part of each from the "trainer's" tensors, `publish_step`), fetches v1
and then v3 from its own node as a rollout unit would (v3 as the deltas from v1 composed), and writes what it
saw to OUT.json.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import xxhash

from rlctl.agents.weights import WeightPublisher, weight_node
from rlctl.config.runtime import WeightSync
from rlctl.transport import InprocTransport
from tests.unit.rank_end import end_rank


def versions() -> list[dict[str, torch.Tensor]]:
    """Three versions of a small state dict, each a sparse change of the one before (same on every rank)."""
    g = torch.Generator().manual_seed(0)
    sd = {"a.weight": torch.randn(96, 64, generator=g), "b.weight": torch.randn(33, generator=g)}
    out = [sd]
    for _ in range(2):
        sd = {k: v + 0.01 * (torch.rand(v.shape, generator=g) < 0.05) for k, v in sd.items()}
        out.append(sd)
    return out


def wait_held(pub: WeightPublisher, version: int) -> None:
    deadline = time.monotonic() + 60
    while (cur := pub.node.store.current) is None or cur.version < version:
        assert time.monotonic() < deadline, f"the publisher did not hold v{version}"
        time.sleep(0.01)


def main(rank: int, world: int, rendezvous: Path, out: Path) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    group = dist.new_group(backend="gloo")
    transport, sync = InprocTransport(secret=b"k" * 16), WeightSync(mode="delta", chunk_bytes=4096)
    pub = WeightPublisher(transport, listen="inproc://", sync=sync, timeout_s=10, group=group)
    sds = versions()
    unit = weight_node(transport, "inproc://", sync, timeout_s=10)
    fetched = {}

    def fetch(v: int) -> None:
        hv = unit.fetch(v, [pub.node.address])
        got = unit.current()
        assert got is not None and got[0] == v
        fetched[v] = {
            "encoding": hv.received_encoding,
            "equal": all(torch.equal(got[1][k], sds[v - 1][k]) for k in got[1]),
        }

    pub.publish(1, {k: v.clone() for k, v in sds[0].items()}, params=sds[0])
    wait_held(pub, 1)
    fetch(1)
    assert pub.publish_step(2, sds[1]) and pub.publish_step(3, sds[2])  # back to back: in order, on every rank
    wait_held(pub, 3)
    held = pub.node.store.versions
    payloads = dict(pub.node._chain)  # the root node's deltas, by version
    fetch(3)
    out.write_text(
        json.dumps(
            {
                "delta_xxh3": {v: xxhash.xxh3_64_hexdigest(payloads[v].data.numpy().data) for v in (2, 3)},
                "encoded_bytes": pub.encoded_bytes,
                "weights_bytes": held[3].weights.numel(),
                "fetched": fetched,
            }
        )
    )
    dist.barrier()
    unit.close()
    pub.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
    end_rank()  # not through finalization (tests/unit/rank_end.py)
