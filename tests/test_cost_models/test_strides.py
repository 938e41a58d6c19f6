"""cost_models.strides follows torch: the strides of views, and when a reshape cannot view, on random
permuted and sliced tensors."""

from __future__ import annotations

import itertools
import random

import torch

from cost_models.strides import contiguous_strides, dense_like, is_contiguous, runtime_strides, view_strides


def _factorisations(shape: tuple[int, ...], rng: random.Random) -> list[tuple[int, ...]]:
    """A few shapes with the same number of elements: merges and splits of neighbouring dims."""
    out = [shape, (int(torch.tensor(shape).prod()),)]
    for i in range(len(shape) - 1):
        out.append(shape[:i] + (shape[i] * shape[i + 1],) + shape[i + 2:])
    for i, n in enumerate(shape):
        for f in (2, 3):
            if n % f == 0 and n > f:
                out.append(shape[:i] + (f, n // f) + shape[i + 1:])
    rng.shuffle(out)
    return out[:6]


def test_view_strides_match_torch_on_permuted_tensors() -> None:
    rng = random.Random(0)
    checked = viewable = 0
    for shape in [(2, 3, 4), (4, 1, 6), (2, 2, 3, 4), (3, 4, 1, 2)]:
        base = torch.empty(shape)
        for dims in itertools.permutations(range(len(shape))):
            x = base.permute(dims)
            for new in _factorisations(tuple(x.shape), rng):
                try:
                    expected = x.view(new).stride()
                except RuntimeError:
                    expected = None
                assert view_strides(x.shape, x.stride(), new) == expected, (shape, dims, new)
                checked += 1
                viewable += expected is not None
    assert checked > 100 and 0 < viewable < checked  # both outcomes exercised


def test_contiguity_and_empty_like_match_torch() -> None:
    for shape in [(2, 3, 4), (1, 5, 1, 2), (3, 1, 4, 2)]:
        base = torch.empty(shape)
        assert contiguous_strides(shape) == base.stride()
        for dims in itertools.permutations(range(len(shape))):
            x = base.permute(dims)
            assert is_contiguous(x.shape, x.stride()) == x.is_contiguous()
            like = torch.empty_like(x)
            # dims of size 1 may take any stride; compare the memory order on the others
            assert all(a == b for a, b, n in zip(dense_like(x.shape, x.stride()), like.stride(), x.shape) if n > 1)


def test_attention_output_view_follows_the_kernel_memory_order() -> None:
    """torch's TransformerEncoder feeds SDPA a q stored [L, B, H, E] and reads the output back through
    permute(2, 0, 1, 3) and a reshape: on CPU the kernel writes the output in q's order (the reshape is a
    view, the output projection saves the attention output's storage), on CUDA in [B, L, H, E] (a copy).
    HF attention (q stored [B, L, H, E], read through transpose(1, 2)) is a view on both."""
    from zoo import build

    from cost_models.strategies.hints import mark_graph_hints
    from planner.trace.tracer import capture

    q = torch.randn(16, 8 * 4, 16).transpose(0, 1).view(8, 4, 16, 16)  # what TransformerEncoder makes
    out = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    assert out.permute(2, 0, 1, 3).is_contiguous()  # the fact measured: CPU output in q's order
    for name, devices in (("torch-transformer-encoder", ("cpu",)), ("hf-llama", ("cpu", "cuda"))):
        ex = build(name)
        graph = capture(ex.model, ex.example_inputs, name=name)
        mark_graph_hints(graph.nodes)
        views = [op.attrs.get("out_view") for op in graph.nodes if op.kind == "attention"]
        assert views and all(v is not None and v["devices"] == devices for v in views), (name, views)


class _Views(torch.nn.Module):
    """Views, copies and identities in a row: permute, a merging reshape of it (a copy), transpose + a
    splitting reshape (a view), identity dropout, relu of a permuted tensor (written in its order), a slice
    and its reshape, repeat_kv's broadcasting expand + reshape (a copy), contiguous of a non-contiguous
    tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.drop = torch.nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [2, 3, 4, 8]
        h = self.lin(x)
        a = h.permute(0, 2, 1, 3)
        b = a.reshape(2, 4, 24)
        c = h.transpose(1, 2).reshape(2, 4, 3, 8)
        d = self.drop(a)
        e = torch.relu(a).reshape(2, 4, 24)
        g = h[:, 0].reshape(2, 32)
        m = h[:, :, None].expand(2, 3, 2, 4, 8).reshape(2, 6, 4, 8)
        return b.sum() + c.sum() + e.sum() + g.sum() + m.sum() + d.contiguous().sum()


def test_runtime_strides_follow_a_captured_graph_as_torch_runs_it() -> None:
    """`runtime_strides` on the captured graph equals the strides each FX node's tensor has when the
    module runs (dims of size 1 may take any stride)."""
    from planner.trace.tracer import capture

    model, x = _Views().eval(), torch.randn(2, 3, 4, 8)
    graph = capture(model, (x,), name="views")
    seen: dict[str, tuple[int, ...]] = {}

    class Record(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> object:
            out = super().run_node(n)
            if isinstance(out, torch.Tensor):
                seen[n.name] = tuple(out.stride())
            return out

    Record(torch.fx.symbolic_trace(model)).run(x)
    by_name = {n.name: n for n in graph.nodes}
    memo: dict[str, tuple[int, ...] | None] = {}
    compared = [n for n in graph.nodes if n.name in seen and n.out.shape]
    assert {n.kind for n in compared} >= {"permute", "reshape", "dropout", "activation", "getitem", "expand", "contiguous"}
    for n in compared:
        got = runtime_strides(n.name, by_name, "cpu", memo)
        assert got is not None and all(a == b for a, b, s in zip(got, seen[n.name], n.out.shape) if s != 1), \
            (n.name, got, seen[n.name])
    assert not is_contiguous((2, 4, 3, 8), seen["permute"])  # the case is not trivially contiguous
