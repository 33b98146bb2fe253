"""Delta encoding from GPU memory: positions and XOR values found on the device, decoded bit-exact on the host."""

import torch
import xxhash

from rlctl.weights import delta


def test_a_delta_encoded_on_the_gpu_decodes_on_the_host() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    prev = torch.randn(1 << 22, device="cuda", generator=g).to(torch.bfloat16)
    new = prev.clone()
    mask = torch.rand(prev.numel(), device="cuda", generator=g) < 0.02
    new[mask] = (new[mask].float() * 1.01 + 1e-3).to(torch.bfloat16)
    a, b = prev.view(torch.uint8), new.view(torch.uint8)
    host_new = b.cpu()
    payload = delta.encode(a, b, base_version=5, target_xxh3=xxhash.xxh3_64_intdigest(host_new.numpy().data))
    assert payload.device.type == "cpu" and payload.numel() < 0.05 * b.numel()
    assert torch.equal(delta.decode(a.cpu(), payload), host_new)
