"""The Dask path's affinity chunks (:func:`fmsim.search.executors.affinity_chunks`): every plan once, each
group whole, each worker's own chunks of a run of shard shapes, a tail for whoever is free."""
from __future__ import annotations

from fmsim.search.executors import TAIL_SHARE, affinity_chunks, shard_key
from fmsim.search.space import AXES


def _key(tp, pp, mb, node):
    k = dict(instance="p5.48xlarge", nodes=node, tp=tp, pp=pp, vpp=1, cp=1, ep=1, micro_batch=mb, zero=1,
             recompute="none", offload_activations=False, global_batch=128)
    return tuple(k[a] for a in AXES)


def _groups():
    # one group per layout (tp, pp, micro-batch), its plans the node counts; in the search's own order
    return [[_key(tp, pp, mb, n) for n in (8, 16, 32)] for mb in (1, 2) for pp in (1, 2, 4) for tp in (8, 4, 2, 1)]


def test_every_plan_once_and_groups_whole():
    groups = _groups()
    for workers in (1, 2, 3, 5):
        placed = affinity_chunks(groups, workers)
        keys = [k for c, _w in placed for k in c]
        assert sorted(keys) == sorted(k for g in groups for k in g)      # each plan exactly once
        for c, w in placed:
            assert w is None or 0 <= w < workers
            for g in groups:                                              # a group lies whole in one chunk
                inside = [k for k in c if k in g]
                assert inside in ([], g)


def test_workers_own_runs_of_shard_shapes_and_a_tail():
    groups = _groups()
    placed = affinity_chunks(groups, 2)
    own = {w: {shard_key(k) for c, x in placed if x == w for k in c} for w in (0, 1)}
    assert own[0] and own[1] and not own[0] & own[1]                      # no shard shape on both workers
    assert max(own[0]) < min(own[1])                                       # a run: the shapes in order
    assert {s[0] for s in own[0]} <= {1, 2}                                # tp 1 and 2 on worker 0
    total = sum(len(g) for g in groups)
    tail = sum(len(c) for c, w in placed if w is None)
    assert 0 < tail <= TAIL_SHARE * total + max(len(g) for g in groups) * 2
    sizes = [sum(len(c) for c, x in placed if x == w) for w in (0, 1)]
    assert abs(sizes[0] - sizes[1]) <= 2 * len(groups[0])                 # like plan counts
    assert affinity_chunks([], 2) == []
    one = affinity_chunks(groups[:1], 4)
    assert [k for c, _w in one for k in c] == groups[0]


def test_a_task_s_plan_keys_travel_as_one_blob():
    """A Dask task's plan keys are pickled whole (one argument for dask to walk, not one per key); the
    worker reads the blob and the keys alike."""
    import pickle
    from pathlib import Path

    from fmsim.scenario import load_scenario
    from fmsim.search.evaluate import evaluate_chunk_packed

    sc = load_scenario(Path(__file__).resolve().parents[1] / "scenarios/examples/llama3-70b-p5.yaml")
    keys = [_key(tp, 1, 1, 8) for tp in (8, 4)]
    as_list = pickle.loads(evaluate_chunk_packed(keys, sc))
    assert pickle.loads(evaluate_chunk_packed(pickle.dumps(keys), sc)) == as_list
    assert len(as_list) == 2 and {r["status"] for r in as_list} <= {"ok", "memory", "rule"}
