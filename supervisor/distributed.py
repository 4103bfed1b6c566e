"""What the runtime needs to know about torch.distributed (SPEC §12).

Only detection so far: the process group (or torchrun's environment) decides the rank, and
the chief is rank 0 unless ``is_chief`` is given.
"""
from __future__ import annotations

import os

__all__ = ["rank", "world_size", "default_is_chief"]


def _initialized() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    """This process's rank: the initialised process group's, else torchrun's ``RANK``, else 0."""
    if _initialized():
        import torch.distributed as dist

        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    if _initialized():
        import torch.distributed as dist

        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def default_is_chief(is_chief: bool | None) -> bool:
    """``is_chief`` when given, else whether this process is rank 0."""
    return rank() == 0 if is_chief is None else is_chief
