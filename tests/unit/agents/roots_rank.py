"""One rank of test_weights_per_host.py: `roots_rank.py RANK WORLD RENDEZVOUS OUT` — publishes four versions of a
synthetic bf16 model through its weight publisher in delta mode as the trainer agent does (v1 in full, v2–v4 as
deltas each rank encodes its part of), on ranks sharing one host; rank 0 then fetches v4 from the roots into a
receiver node and writes what it saw (JSON) to OUT."""

from __future__ import annotations

import datetime
import json
import sys
import time

import torch
import torch.distributed as dist

from rlctl.agents.trainer import _first_on_host, _roots
from rlctl.agents.weights import WeightPublisher
from rlctl.config.runtime import WeightSync
from rlctl.trainers.wire import all_gather_values
from rlctl.transport import TcpTransport
from rlctl.weights.node import WeightNode
from tests.unit.rank_end import end_rank


def main() -> None:
    rank, world, rendezvous, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))  # fmt: skip
    transport = TcpTransport(secret=b"roots")
    group = dist.new_group(backend="gloo")
    pub = WeightPublisher(transport, listen="tcp://127.0.0.1:0", sync=WeightSync(mode="delta"), timeout_s=30,
                          group=group, holds=_first_on_host())  # fmt: skip
    roots = _roots(pub.node.address, holds=pub.holds)
    g = torch.Generator().manual_seed(0)  # every rank the same replica
    params = {f"layer{i}.weight": torch.randn(256, 256, generator=g).to(torch.bfloat16) for i in range(8)}
    model_bytes = sum(t.numel() * t.element_size() for t in params.values())
    sd = {k: v.clone() if pub.holds else torch.empty(v.shape, dtype=v.dtype, device="meta") for k, v in params.items()}
    pub.publish(1, sd, params=params)
    for v in (2, 3, 4):
        with torch.no_grad():
            for t in params.values():
                t.add_(torch.randn(t.shape, generator=g).to(t.dtype) * (torch.rand(t.shape, generator=g) < 0.02))
        assert pub.publish_step(v, params)
    deadline = time.monotonic() + 60
    while pub._held < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    held = all_gather_values(pub.node.host_bytes(), int)
    got: dict[str, object] = {"holds": pub.holds, "roots": roots, "host_bytes": held, "model_bytes": model_bytes}
    if rank == 0:
        receiver = WeightNode(transport, "tcp://127.0.0.1:0")
        receiver.fetch(4, roots)
        got["fetched_equal"] = all(torch.equal(receiver.current()[1][k], params[k]) for k in params)
        got["from"] = receiver.attempts[-1][1]
        receiver.close()
    dist.barrier()
    pub.close()
    with open(out, "w") as f:
        json.dump(got, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    end_rank()  # not through finalization (tests/unit/rank_end.py)
