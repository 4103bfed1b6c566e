"""Position-weighted fingerprints of tensors' bits: how the overlapped capture (SPEC §5.9,
overlap.py) proves that its staged copy holds the state of the boundary.

A tensor's fingerprint reads its bits as integer words in its logical order (32-bit words for
4- and 8-byte dtypes, 16-bit for 2-byte, unsigned 8-bit for 1-byte ones) and sums, in wrapping
64-bit integer arithmetic, each word times an odd pseudo-random 64-bit weight of its position:
``sum_i w_i * x_i mod 2**64``. So:

- any change of one word changes it (``w_i`` odd, ``|Δx| < 2**32``: ``w_i * Δx`` is never 0 mod
  2**64), whatever API made the write — no version counter is read;
- a change of several words cancels only when the weighted sum of the changes does: a sign flip
  moves a word by 2**31, which keeps 33 bits of its weight, so flips, permutations (each position
  has its own weight) or a torn mix of two states are missed with a chance of about 2**-33 per
  changed tensor — not by construction, as an unweighted or 32-bit sum misses them;
- integer sums are exact in any order: a tensor fingerprinted on a CUDA device and its copy
  fingerprinted on the CPU give the same value, bit for bit.

The weights are ``w_i = B[i % CHUNK_WORDS] * M[i // CHUNK_WORDS]``, and within a chunk
``B[k] = R[k // 1024] * C[k % 1024]`` (R, C, M: odd hashes of the index, computed on each device
by the same integer operations; products of odd numbers are odd). On CUDA a chunk is one
multiply by the broadcast ``C`` (widened inside the kernel) and one row sum, then the rows are
weighed by ``R``: about 20 bytes of memory traffic per 4-byte word, and no kept weight vector;
the CPU multiplies by a kept ``B`` in pieces that stay in the cache. Memory stays bounded: one
chunk's 64-bit products (32 MiB). Small tensors share one operation (a bucket) to bound the
number of kernel launches.

A `Plan` is made once from the live tensors at the boundary and applied to them and to their
staged copies, so both sides group, order and weigh alike.
"""
from __future__ import annotations

import itertools
import threading
from typing import NamedTuple, Sequence

import torch

__all__ = ["CHUNK_WORDS", "Plan", "fingerprints", "words"]

CHUNK_WORDS = 1 << 22  # words per operation: 32 MiB of int64 products (and of kept B on the CPU)
_SMALL_WORDS = 1 << 16  # tensors up to this many words are fingerprinted in a shared bucket
_CPU_PIECE = 1 << 16  # words per CPU operation: 512 KiB of products, in the cache
_WORD = {1: torch.uint8, 2: torch.int16}

_COLS = 1024  # a chunk is weighed as rows of this many words
_ROW_SALT, _CHUNK_SALT = 1 << 40, 1 << 41  # R and M hash other indices than C

_lock = threading.RLock()  # _keep may call itself (B is made of R and C)
_kept: dict[tuple, tuple[torch.Tensor, object]] = {}  # (what, device, size) -> weights, CUDA event


def words(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s bits as a 1-D tensor of integer words in its logical order (a view of a
    contiguous tensor; a copy of another, e.g. a channels_last one)."""
    if tensor.is_complex():
        tensor = torch.view_as_real(tensor)
    flat = tensor.reshape(-1)
    return flat.view(_WORD.get(flat.element_size(), torch.int32))


def _mix(index: torch.Tensor) -> torch.Tensor:
    """An odd pseudo-random int64 per int64 ``index`` (splitmix64's finaliser, with arithmetic
    shifts), the same on every device: integer operations only."""
    z = index * -7046029254386353131 + 0x632BE59BD9B4E019  # the golden-ratio increment, as int64
    z = (z ^ (z >> 30)) * -4658895280553007687
    z = (z ^ (z >> 27)) * -7723592293110705685
    return (z ^ (z >> 31)) | 1


def _keep(what: str, device: torch.device, size: int, make) -> torch.Tensor:
    """``make()`` on ``device``, computed once and kept; on CUDA the current stream waits for the
    stream that computed it (no host sync; kept tensors are never freed)."""
    with _lock:
        kept, event = _kept.get((what, device, size), (None, None))
        if kept is None:
            kept = make()
            if device.type == "cuda":
                event = torch.cuda.Event()
                event.record(torch.cuda.current_stream(device))
            _kept[(what, device, size)] = kept, event
    if event is not None:
        torch.cuda.current_stream(device).wait_event(event)
    return kept


def _factors(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``R`` (a weight per row of a chunk) and ``C`` (per column) on ``device``."""
    rows = -(-CHUNK_WORDS // _COLS)
    r = _keep("R", device, rows, lambda: _mix(torch.arange(rows, dtype=torch.int64, device=device) + _ROW_SALT))
    c = _keep("C", device, _COLS, lambda: _mix(torch.arange(_COLS, dtype=torch.int64, device=device)))
    return r, c


def _position_weights(device: torch.device, n: int) -> torch.Tensor:
    """``B[:n]`` on ``device`` (on the CPU kept: the chunk's, computed once)."""
    if device.type == "cpu":
        return _keep("B", device, CHUNK_WORDS, lambda: _outer(device, CHUNK_WORDS))[:n]
    return _outer(device, n)


def _outer(device: torch.device, n: int) -> torch.Tensor:
    r, c = _factors(device)
    return (r[:-(-n // _COLS), None] * c[None, :]).reshape(-1)[:n]


def _weighted_sum(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``sum(x * w)`` in wrapping int64 on the CPU (a 0-dim tensor), where a mixed-dtype multiply
    is not vectorised: widened in pieces that stay in the cache (half the time of whole chunks)."""
    total = torch.zeros((), dtype=torch.int64)
    scratch = torch.empty(min(_CPU_PIECE, x.numel()), dtype=torch.int64)
    for start in range(0, x.numel(), _CPU_PIECE):
        piece = x[start:start + _CPU_PIECE]
        total += scratch[:piece.numel()].copy_(piece).mul_(w[start:start + _CPU_PIECE]).sum()
    return total


class _Group(NamedTuple):
    indices: list[int]  # positions in the plan's tensor list
    lengths: list[int]  # words per tensor
    bucket: bool  # small tensors sharing one chunk of weights (else one tensor, chunked)


class Plan:
    """How `fingerprints` groups ``tensors``: per device, a bucket of small tensors of one word
    type, or one large tensor alone (chunked).

    Args:
        tensors: the live tensors (the plan is applied to them and to copies of the same shapes
            and dtypes, on any device).
    """

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        self.size = len(tensors)
        self.groups: dict[torch.device, list[_Group]] = {}
        open_buckets: dict[tuple[torch.device, int], tuple[_Group, list[int]]] = {}  # and its words so far
        for i, t in enumerate(tensors):
            size = t.element_size() // 2 if t.is_complex() else t.element_size()
            word = min(size, 4)  # bytes per word, as `words` reads them
            n = t.numel() * t.element_size() // word
            groups = self.groups.setdefault(t.device, [])
            if n > _SMALL_WORDS:
                groups.append(_Group([i], [n], False))
                continue
            bucket, filled = open_buckets.get((t.device, word), (None, [0]))
            if bucket is None or filled[0] + n > CHUNK_WORDS:
                bucket, filled = _Group([], [], True), [0]
                open_buckets[(t.device, word)] = bucket, filled
                groups.append(bucket)
            bucket.indices.append(i)
            bucket.lengths.append(n)
            filled[0] += n


def fingerprints(plan: Plan, tensors: Sequence[torch.Tensor]) -> dict[torch.device, tuple[list[int], torch.Tensor]]:
    """Per device of the plan: the indices of its tensors and their fingerprints (int64, on the
    device the given ``tensors`` are on; on CUDA queued on the current stream, no host sync)."""
    if len(tensors) != plan.size:
        raise ValueError(f"the plan was made for {plan.size} tensors, got {len(tensors)}")
    out = {}
    with torch.no_grad():
        for device, groups in plan.groups.items():
            parts = [_bucket(g, tensors) if g.bucket else _large(tensors[g.indices[0]]).reshape(1) for g in groups]
            out[device] = ([i for g in groups for i in g.indices], torch.cat(parts))
    return out


def _bucket(group: _Group, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The fingerprints of a bucket's small tensors, each tensor's weights starting at its offset
    in the bucket: on CUDA one multiply for the bucket and a sum per tensor."""
    flat = [words(tensors[i]) for i in group.indices]
    w = _position_weights(flat[0].device, sum(group.lengths))
    if flat[0].device.type == "cpu":
        offsets = itertools.accumulate(group.lengths[:-1], initial=0)
        return torch.stack([_weighted_sum(x, w[o:o + x.numel()]) for x, o in zip(flat, offsets)])
    x = flat[0] if len(flat) == 1 else torch.cat(flat)
    return torch.stack([p.sum() for p in torch.mul(x, w).split(group.lengths)])


def _large(tensor: torch.Tensor) -> torch.Tensor:
    """One tensor's fingerprint, a chunk of `CHUNK_WORDS` words at a time."""
    x = words(tensor)
    sums = []
    for start in range(0, x.numel(), CHUNK_WORDS):
        chunk = x[start:start + CHUNK_WORDS]
        if x.device.type == "cpu":
            sums.append(_weighted_sum(chunk, _position_weights(x.device, chunk.numel())))
        else:
            sums.append(_factored_sum(chunk))
    if len(sums) == 1:
        return sums[0]
    chunks = torch.arange(len(sums), dtype=torch.int64, device=x.device) + _CHUNK_SALT
    return (torch.stack(sums) * _mix(chunks)).sum()


def _factored_sum(chunk: torch.Tensor) -> torch.Tensor:
    """``sum(chunk * B[:n])`` on CUDA: rows of `_COLS` words times ``C`` (widened in the kernel),
    summed per row, the row sums times ``R``; a last partial row apart."""
    r, c = _factors(chunk.device)
    n = chunk.numel()
    full = n - n % _COLS
    total = (torch.mul(chunk[:full].view(-1, _COLS), c).sum(1) * r[:full // _COLS]).sum()
    if full < n:
        total = total + torch.mul(chunk[full:], c[:n - full]).sum() * r[full // _COLS]
    return total
