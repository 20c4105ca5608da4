import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from roll.distributed.batch import ORDER_KEY, Batch, balanced_partition


def make(n=6, width=4):
    mask = torch.zeros(n, width, dtype=torch.long)
    for i in range(n):
        mask[i, : (i % width) + 1] = 1
    return Batch(
        {"input_ids": torch.arange(n * width).view(n, width), "attention_mask": mask},
        {"traj_id": [f"t{i}" for i in range(n)], "tags": ["A" if i % 2 else "B" for i in range(n)], "state": [(i, "x") for i in range(n)]},
        {"step": 3},
    )


def test_rows_must_agree():
    with pytest.raises(ValueError, match="disagree"):
        Batch({"a": torch.zeros(2)}, {"b": [1, 2, 3]})


def test_select_concat_union_group_by():
    b = make()
    s = b.select([4, 1])
    assert s["traj_id"].tolist() == ["t4", "t1"] and s["input_ids"][0].tolist() == [16, 17, 18, 19]
    assert s["state"][0] == (4, "x")  # tuples stay one object per row
    assert len(Batch.concat([s, b.select([0])])) == 3
    u = b | Batch({"scores": torch.ones(6)}, meta={"x": 1})
    assert "scores" in u and u.meta == {"step": 3, "x": 1}
    with pytest.raises(ValueError, match="differs"):
        b.union(Batch({"input_ids": torch.zeros(6, 4, dtype=torch.long)}))
    groups = b.group_by("tags")
    assert sorted(groups) == ["A", "B"] and groups["A"]["traj_id"].tolist() == ["t1", "t3", "t5"]


def test_concat_pads_different_lengths():
    a = Batch({"x": torch.ones(1, 2)})
    b = Batch({"x": torch.ones(1, 4)})
    assert Batch.concat([a, b])["x"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 30), parts=st.integers(1, 5))
def test_split_is_balanced_and_gather_restores_order(n, parts):
    b = make(n, 8)
    chunks = b.split(parts)
    sizes = [len(c) for c in chunks]
    assert sum(sizes) == n and max(sizes) - min(sizes) <= 1
    back = Batch.gather(chunks)
    assert torch.equal(back["input_ids"], b["input_ids"]) and back["traj_id"].tolist() == b["traj_id"].tolist()
    assert ORDER_KEY not in back.meta


def test_partition_balances_tokens():
    weights = [10, 9, 8, 1, 1, 1]
    parts = balanced_partition(weights, 2)
    loads = sorted(sum(weights[i] for i in p) for p in parts)
    assert loads == [12, 18] and all(len(p) == 3 for p in parts)  # the best split into equal sizes


def test_pickle_round_trip_keeps_dtypes_and_values():
    b = make() | Batch({"lp": torch.randn(6, 4, dtype=torch.bfloat16), "f": torch.randn(6)})
    back = pickle.loads(pickle.dumps(b, protocol=5))
    for k in b.tensors:
        assert back[k].dtype == b[k].dtype and torch.equal(back[k], b[k])
    assert back["state"].tolist() == b["state"].tolist() and back.meta == b.meta


def test_out_of_band_buffers_carry_the_tensor_data():
    b = Batch({"big": torch.ones(1000, 100)})
    buffers = []
    data = pickle.dumps(b, protocol=5, buffer_callback=buffers.append)
    assert len(data) < 10_000 and sum(memoryview(x).nbytes for x in buffers) >= 400_000  # zero-copy path
    assert torch.equal(pickle.loads(data, buffers=buffers)["big"], b["big"])


def test_dispatch_plan_for_model_parallel_replicas() -> None:
    from roll.distributed.cluster import plan_dispatch

    # plain data parallel: every rank answers for itself
    assert plan_dispatch([(0, 2, True), (1, 2, True)]) == (2, [0, 1])
    # TP 2 x DP 2 (megatron order: tensor ranks adjacent): rank 0 answers for replica 0, rank 2 for replica 1
    assert plan_dispatch([(0, 2, True), (0, 2, False), (1, 2, True), (1, 2, False)]) == (2, [0, 2])
    with pytest.raises(RuntimeError, match="without an answering rank: \\[1\\]"):
        plan_dispatch([(0, 2, True), (1, 2, False)])
    with pytest.raises(RuntimeError, match="disagree"):
        plan_dispatch([(0, 2, True), (0, 1, True)])
