"""The small model the non-chief tests train, and a digest of its state to compare processes."""
from __future__ import annotations

import hashlib

import torch


def build(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    optimizer.zero_grad()
    loss = model(torch.randn(3, 4)).pow(2).mean()
    loss.backward()
    optimizer.step()
    return {"loss": loss.detach()}


def digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """A hash of the weights and the optimizer's tensors (equal iff the states are bit-equal)."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode() + tensor.numpy().tobytes())
    for i, state in sorted(optimizer.state_dict()["state"].items()):
        for key, value in sorted(state.items()):
            h.update(f"{i}.{key}".encode() + torch.as_tensor(value).numpy().tobytes())
    return h.hexdigest()
