"""`count_saved`: the bytes autograd keeps for backward, each storage once, the model's own left out."""

import torch

from rlctl.profiler.saved import count_saved


def test_counts_each_saved_storage_once_less_the_models() -> None:
    lin = torch.nn.Linear(8, 16, bias=False)  # its weight (512 B) is saved for backward, and is the model's
    x = torch.randn(4, 8, requires_grad=True)
    with count_saved(lin) as saved:
        h = lin(x)  # saves x (128 B) and the weight
        y = (h[:, :8] * h[:, 8:]).sum()  # saves two views of h's one storage (256 B)
    y.backward()
    assert saved.nbytes == x.nbytes + h.nbytes == 128 + 256


def test_counts_nothing_outside_the_block() -> None:
    lin = torch.nn.Linear(8, 8)
    with count_saved(lin) as saved:
        pass
    (lin(torch.randn(2, 8, requires_grad=True)) ** 2).sum().backward()
    assert saved.nbytes == 0
