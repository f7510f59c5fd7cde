"""Grouped MoE experts: the C++ kernel (every runnable variant) and the Triton kernel (interpreter without
CUDA) against the torch reference, `torch_moe.fused_experts`, and the reference against a float64 sum."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    # Must be set before triton is first imported: it decides at @triton.jit time.
    os.environ["TRITON_INTERPRET"] = "1"

from spyglass.kernels import cpu_moe, torch_moe

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
# (experts, hidden, inter, tokens, top_k): odd sizes leave vector tails and partial tiles.
SHAPES = [(4, 64, 32, 5, 2), (8, 48, 40, 37, 1), (8, 72, 100, 23, 2), (3, 32, 16, 1, 2)]


def make_case(experts, hidden, inter, tokens, top_k, dtype, device="cpu", idle_experts=()):
    """Random inputs and routing; experts in ``idle_experts`` get no token."""
    g = torch.Generator().manual_seed(experts * 1000 + tokens)
    x = torch.randn(tokens, hidden, generator=g)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=g) / hidden**0.5
    w2 = torch.randn(experts, hidden, inter, generator=g) / inter**0.5
    logits = torch.randn(tokens, experts, generator=g)
    logits[:, list(idle_experts)] = -torch.inf
    weights, ids = logits.softmax(dim=-1).topk(top_k, dim=-1)
    to = dict(dtype=dtype, device=device)
    return x.to(**to), w13.to(**to), w2.to(**to), weights.to(**to), ids.to(device)


def float64_sum(x, w13, w2, weights, ids, activation):
    """Token by token, in float64: the definition the reference must meet."""
    x, w13, w2, weights = (t.double() for t in (x, w13, w2, weights))
    inter = w13.shape[1] // 2
    act = (
        torch.nn.functional.silu
        if activation == "silu"
        else lambda g: torch.nn.functional.gelu(g, approximate="tanh")
    )
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            gate_up = w13[e] @ x[t]
            out[t] += weights[t, k] * (w2[e] @ (act(gate_up[:inter]) * gate_up[inter:]))
    return out


@pytest.mark.parametrize("activation", torch_moe.ACTIVATIONS)
def test_reference_matches_float64_definition(activation):
    case = make_case(6, 32, 24, 9, 2, torch.float64, idle_experts=(2, 5))
    torch.testing.assert_close(
        torch_moe.fused_experts(*case, activation), float64_sum(*case, activation)
    )


def test_dense_path_matches_grouped():
    case = make_case(5, 32, 16, 11, 2, torch.float32, idle_experts=(0,))
    torch.testing.assert_close(torch_moe.dense_experts(*case), torch_moe.fused_experts(*case))


def test_sort_by_expert_counts_idle_experts():
    ids = torch.tensor([[3, 1], [1, 0], [3, 1]])
    sorted_pairs, counts = torch_moe.sort_by_expert(ids, 5)
    assert counts.tolist() == [1, 3, 0, 2, 0]
    assert ids.flatten()[sorted_pairs].tolist() == [0, 1, 1, 1, 3, 3]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("activation", torch_moe.ACTIVATIONS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_cpu_kernel_matches_reference(cpu_kernels, dtype, activation, shape):
    case = make_case(*shape, dtype, idle_experts=(1,))
    expected = torch_moe.fused_experts(*case, activation)
    actual = cpu_moe.fused_experts(*case, activation)
    assert actual.dtype == dtype and actual.shape == expected.shape
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(actual.float(), expected.float(), rtol=tol, atol=tol)


def test_cpu_kernel_takes_strided_rows(native_kernels):
    x, w13, w2, weights, ids = make_case(4, 64, 32, 7, 2, torch.float32)
    wide = torch.cat([x, x], dim=1)[:, :64]  # rows strided, as a slice of a fused projection
    torch.testing.assert_close(
        cpu_moe.fused_experts(wide, w13, w2, weights, ids),
        torch_moe.fused_experts(x, w13, w2, weights, ids),
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("activation", torch_moe.ACTIVATIONS)
@pytest.mark.parametrize("shape", SHAPES[:3], ids=str)
def test_triton_kernel_matches_reference(dtype, activation, shape):
    triton_moe = pytest.importorskip("spyglass.kernels.triton_moe")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    case = make_case(*shape, dtype, device=device, idle_experts=(1,))
    expected = torch_moe.fused_experts(*case, activation)
    actual = triton_moe.fused_experts(*case, activation)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(actual.float(), expected.float(), rtol=tol, atol=tol)


def test_triton_alignment_pads_each_expert_to_whole_blocks():
    triton_moe = pytest.importorskip("spyglass.kernels.triton_moe")
    ids = torch.tensor([[2, 0], [2, 1], [0, 2]])  # expert 3 idle
    rows, block_experts = triton_moe.align_by_expert(ids, 4, 4)
    sentinel = ids.numel()
    assert rows.tolist()[:12] == [
        1,
        4,
        sentinel,
        sentinel,
        3,
        sentinel,
        sentinel,
        sentinel,
        0,
        2,
        5,
        sentinel,
    ]
    assert block_experts.tolist()[:3] == [0, 1, 2] and all(
        e == 4 for e in block_experts.tolist()[3:]
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_triton_kernel_beats_reference_loop_on_gpu():
    import triton.testing

    triton_moe = pytest.importorskip("spyglass.kernels.triton_moe")
    case = make_case(16, 1024, 1408, 512, 2, torch.bfloat16, device="cuda")
    loop = triton.testing.do_bench(lambda: torch_moe.fused_experts(*case))
    fused = triton.testing.do_bench(lambda: triton_moe.fused_experts(*case))
    torch.testing.assert_close(
        triton_moe.fused_experts(*case).float(),
        torch_moe.fused_experts(*case).float(),
        rtol=2e-2,
        atol=2e-2,
    )
    assert fused < loop, f"triton {fused:.3f} ms vs loop {loop:.3f} ms"
