"""The overlapped capture's fingerprints (supervisor/checkpoint/save/fingerprint.py): every write that
a bit-sum or a version counter misses changes them; copies of the same bits agree, on any layout
and (on a GPU machine) across devices."""
from __future__ import annotations

import types

import pytest
import torch

from supervisor.checkpoint.save import fingerprint
from supervisor.checkpoint.save.fingerprint import Plan, fingerprints
from supervisor.checkpoint.save.overlap import resolve_capture

pytestmark = pytest.mark.timeout(120)

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8, torch.uint8, torch.int64,
          torch.bool, torch.complex64]


def _values(tensors) -> torch.Tensor:
    [(indices, values)] = fingerprints(Plan(tensors), tensors).values()
    out = torch.empty(len(tensors), dtype=torch.int64)
    out[indices] = values.cpu()
    return out


def _random(dtype, shape=(64, 33), seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if not dtype.is_floating_point and not dtype.is_complex:
        return torch.randint(-100 if dtype.is_signed else 0, 100, shape, generator=g, dtype=dtype)
    return torch.randn(shape, generator=g).to(dtype) if not dtype.is_complex else torch.randn(shape, generator=g,
                                                                                              dtype=dtype)


WRITES = {
    "neg_ (an even number of sign flips)": lambda t: t.neg_(),
    "abs_": lambda t: t.abs_(),
    "roll (a permutation)": lambda t: t.copy_(t.roll(1)),
    "swap two elements": lambda t: t.view(-1).index_copy_(0, torch.tensor([0, 7]), t.view(-1)[[7, 0]]),
    "single element": lambda t: t.view(-1)[5].copy_(t.view(-1)[5] + 1),
    "sign flip of two elements": lambda t: t.view(-1).index_copy_(0, torch.tensor([2, 9]), -t.view(-1)[[2, 9]]),
    "transpose of a square block": lambda t: t[:8, :8].copy_(t[:8, :8].t().clone()),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("write", list(WRITES))
def test_every_write_that_changes_bits_changes_the_fingerprint(write, dtype):
    t = _random(dtype)
    if write == "abs_":
        t.view(-1)[::2] = -t.view(-1)[::2].abs()  # an even number of negative values
    before = t.clone()
    WRITES[write](t.data)
    assert not torch.equal(t.view(torch.uint8), before.view(torch.uint8))
    assert _values([t])[0] != _values([before])[0]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_equal_bits_give_equal_fingerprints_on_any_layout(dtype):
    t = _random(dtype, shape=(8, 3, 5, 5))
    last = t.to(memory_format=torch.channels_last) if not dtype.is_complex else t.clone()
    assert _values([t])[0] == _values([last])[0] == _values([t.clone()])[0]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_single_changed_word_is_always_seen(dtype):
    """One word's weight is odd and its change under 2**32: never 0 modulo 2**64."""
    t = _random(dtype, shape=(40,))
    base = _values([t])[0]
    raw = t.view(-1).view(torch.uint8) if t.element_size() == 1 or dtype == torch.bool else None
    for i in range(t.numel()):
        changed = t.clone()
        if raw is not None:
            changed.view(torch.uint8).view(-1)[i] ^= 0x80
        else:
            changed.view(-1)[i] = -changed.view(-1)[i] if changed.view(-1)[i] != 0 else 1
        assert _values([changed])[0] != base, i


def test_a_torn_mix_of_two_states_is_seen_wherever_the_cut_is():
    g = torch.Generator().manual_seed(1)
    old = torch.randn(4096, generator=g)
    for new in (-old, old.roll(1), old.abs(), old.flip(0)):
        base = _values([old])[0]
        for cut in range(1, 4096, 97):
            torn = torch.cat([new[:cut], old[cut:]])
            if not torch.equal(torn, old):
                assert _values([torn])[0] != base, cut


def test_chunks_are_weighed_apart(monkeypatch):
    """A tensor longer than a chunk: swapping two chunks, or the same offset in two chunks,
    changes the fingerprint (each chunk has its own multiplier)."""
    monkeypatch.setattr(fingerprint, "CHUNK_WORDS", 256)
    monkeypatch.setattr(fingerprint, "_SMALL_WORDS", 64)
    t = torch.randn(1000)
    base = _values([t])[0]
    swapped = torch.cat([t[256:512], t[:256], t[512:]])
    same_offset = t.clone()
    same_offset[[3, 259]] = t[[259, 3]]
    assert _values([swapped])[0] != base and _values([same_offset])[0] != base
    assert _values([t.clone()])[0] == base


def test_a_plan_is_applied_to_the_copies_the_same_way():
    tensors = [torch.randn(8, 10), torch.randn(8), torch.randn(300, 300), torch.randn(6).to(torch.bfloat16),
               torch.tensor(3.0), torch.zeros(0)]
    plan = Plan(tensors)
    copies = [t.clone() for t in tensors]
    [(indices, a)] = fingerprints(plan, tensors).values()
    [(_, b)] = fingerprints(plan, copies).values()
    assert sorted(indices) == list(range(len(tensors))) and torch.equal(a, b)
    copies[2][0, 0] += 1
    [(_, c)] = fingerprints(plan, copies).values()
    assert [indices[j] for j in (a != c).nonzero().flatten().tolist()] == [2]
    with pytest.raises(ValueError, match="the plan was made for 6 tensors, got 5"):
        fingerprints(plan, copies[:5])


def test_auto_capture_is_blocking_on_cuda_until_the_cuda_path_has_run():
    cuda = types.SimpleNamespace(device=torch.device("cuda", 0))
    assert resolve_capture("auto", [cuda]) == "blocking"
    assert resolve_capture("overlapped", [cuda]) == "overlapped"
    assert resolve_capture("auto", [torch.zeros(1)]) == "blocking"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the cross-device check needs one")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_cuda_tensor_and_its_cpu_copy_have_the_same_fingerprint(dtype, monkeypatch):
    monkeypatch.setattr(fingerprint, "_SMALL_WORDS", 64)  # the chunked path as well as the bucket
    monkeypatch.setattr(fingerprint, "CHUNK_WORDS", 1024)
    tensors = [_random(dtype, shape=(64, 33), seed=s) for s in range(3)] + [_random(dtype, shape=(5,))]
    on_device = [t.cuda() for t in tensors]
    plan = Plan(on_device)
    [(indices, a)] = fingerprints(plan, on_device).values()
    [(_, b)] = fingerprints(plan, tensors).values()
    assert torch.equal(a.cpu(), b), indices


@pytest.mark.parametrize("n", [1024, 5000, 4096 * 3 + 17, 1 << 16])
def test_the_cuda_rows_times_columns_sum_equals_the_weighted_sum(n):
    """CUDA weighs a chunk as rows times columns (`_factored_sum`), the CPU with the kept
    products ``B``: the same number (run here on the CPU, where both can)."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)).view(torch.int32)
    explicit = fingerprint._weighted_sum(x, fingerprint._position_weights(x.device, n))
    assert fingerprint._factored_sum(x) == explicit
