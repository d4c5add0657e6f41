"""SlotCache.release: every survivor's whole state lands where moving one row at a time would put it."""
import numpy as np
import pytest

from models.core.bundle import ModelSpec
from models.core.kv_cache import SlotCache

SPEC = ModelSpec(vocab_size=20, d_model=8, n_heads=2, n_enc_layers=1, n_dec_layers=2, pad_id=0, bos_id=1,
                 eos_id=2, max_positions=32)


def filled_cache(rng, rows: int) -> SlotCache:
    cache = SlotCache(SPEC, slots=12, max_source=6, max_target=9)
    for _ in range(rows):
        s = int(rng.integers(1, 7))
        mask = np.arange(6) < s
        cross = rng.standard_normal((2, 2, 6, 4)).astype(np.float32)
        cache.allocate(cross, -cross, mask, 1, int(rng.integers(3, 20)))
    n = cache.used
    cache.length[:n] = rng.integers(0, 10, n)
    cache.k[:] = rng.standard_normal(cache.k.shape)
    cache.v[:] = rng.standard_normal(cache.v.shape)
    cache.inputs[:] = rng.integers(0, 20, cache.inputs.shape)
    return cache


def state_by_row(cache: SlotCache) -> dict:
    """What each running row owns (up to its own lengths), keyed by the Row object."""
    out = {}
    for row in cache.rows:
        i, n, s = row.slot, int(cache.length[row.slot]), int(cache.src_len[row.slot])
        out[id(row)] = (row.token, n, s, cache.k[:, i, :, :n].copy(), cache.v[:, i, :, :n].copy(),
                        cache.cross_k[:, i, :, :s].copy(), cache.cross_v[:, i, :, :s].copy(),
                        cache.src_mask[i].copy(), cache.inputs[i, :n].copy())
    return out


def one_at_a_time(cache: SlotCache, rows) -> list:
    """The row order the one-move-per-hole rule gives (highest hole first, the last row fills it)."""
    order = list(cache.rows)
    for hole in sorted((r.slot for r in rows), reverse=True):
        if hole != len(order) - 1:
            order[hole] = order[-1]
        order.pop()
    return order


@pytest.mark.parametrize("seed", range(40))
def test_release_moves_every_survivor_whole(seed):
    rng = np.random.default_rng(seed)
    cache = filled_cache(rng, int(rng.integers(1, 13)))
    leaving = [r for r in cache.rows if rng.random() < 0.4]
    before, order = state_by_row(cache), one_at_a_time(cache, leaving)
    cache.release(leaving)
    assert cache.rows == order and [r.slot for r in cache.rows] == list(range(len(order)))
    assert all(r.slot == -1 for r in leaving)
    after = state_by_row(cache)
    assert set(after) == set(before) - {id(r) for r in leaving}
    for key, want in after.items():
        got = before[key]
        assert got[:3] == want[:3]
        for a, b in zip(got[3:], want[3:]):
            assert np.array_equal(a, b)
    n = cache.used
    assert (cache.src_len[:n] == cache.src_mask[:n].sum(1)).all()


def resident_pages(region: np.ndarray) -> int:
    """Pages of `region` in memory now (mincore(2))."""
    import ctypes
    import mmap
    page = mmap.PAGESIZE
    start = region.ctypes.data // page * page
    length = region.ctypes.data + region.nbytes - start
    vec = (ctypes.c_ubyte * (-(-length // page)))()
    assert ctypes.CDLL(None, use_errno=True).mincore(ctypes.c_void_p(start), ctypes.c_size_t(length), vec) == 0
    return sum(b & 1 for b in vec)


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="madvise/mincore: Linux")
def test_long_rows_give_their_pages_back_and_an_idle_cache_gives_everything_back():
    from models.core import kv_cache
    spec = ModelSpec(vocab_size=20, d_model=256, n_heads=4, n_enc_layers=1, n_dec_layers=2, pad_id=0, bos_id=1,
                     eos_id=2, max_positions=300)
    cache = SlotCache(spec, slots=4, max_source=256, max_target=257)
    cross = np.ones((2, 4, 256, 64), np.float32)
    lengths = (250, 12, 12)
    rows = [cache.allocate(cross * (i + 1), cross, np.arange(256) < n, 1, 5)[0] for i, n in enumerate(lengths)]
    cache.length[:3] = lengths
    for i, n in enumerate(lengths):
        cache.k[:, i, :, :n] = cache.v[:, i, :, :n] = i + 1  # what decoding writes: each row's own positions
    kept = state_by_row(cache)
    page = 4096 // (64 * 4)  # positions in a page of one head
    assert resident_pages(cache.k[0, 0, 0, 64 + page:250 - page]) > 0
    cache.release([rows[0]])  # the long row leaves: row 2 moves into its slot 0, slot 2 is empty
    assert rows[2].slot == 0 and [r.slot for r in cache.rows] == [0, 1]
    # (mincore before any read: reading a page given back maps the zero page, which counts as resident)
    for array in (cache.k, cache.v, cache.cross_k, cache.cross_v):
        for head in range(4):  # the long row's positions past the 64 kept went back
            assert resident_pages(array[1, 0, head, 64 + page:250 - page]) == 0
        assert resident_pages(array[1, 0, 0, :12]) > 0  # what the moved row uses stays
    after = state_by_row(cache)
    for row in cache.rows:
        for a, b in zip(after[id(row)], kept[id(row)]):
            assert np.array_equal(a, b)  # nothing a running row owns was touched
    assert not cache.k[:, 0, :, 64 + page:250 - page].any()  # reads as zeros, as a fresh cache does
    cache.release(list(cache.rows))  # drained: the pages stay for the next rows a while...
    resident = sum(resident_pages(a) for a in (cache.k, cache.v, cache.cross_k, cache.cross_v))
    assert resident > 0 and not cache.give_back_idle(cache.empty_since + kv_cache.IDLE_S / 2)
    assert cache.give_back_idle(cache.empty_since + kv_cache.IDLE_S)  # ...then every page goes back
    assert sum(resident_pages(a) for a in (cache.k, cache.v, cache.cross_k, cache.cross_v)) == 0
    assert not cache.extent.any() and not cache.src_extent.any() and not cache.give_back_idle(1e18)
    again = cache.allocate(cross, cross, np.arange(256) < 3, 1, 5)[0]  # and the cache works as new
    assert again.slot == 0 and cache.cross_k[:, 0, :, :3].all() and not cache.cross_k[:, 0, :, 3:].any()
