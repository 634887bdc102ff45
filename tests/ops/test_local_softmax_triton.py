"""The Triton kernels of the default attention and of its decoding steps: run through Triton's interpreter on CPU
at small shapes (float64, against the quadratic reference and the PyTorch paths, forward and gradients), and on
CUDA at real shapes (`gpu` marker, skipped without a device). Through the interpreter, the default run takes every
kernel and every option of the kernels' module at least once, against the float64 reference or the path it replaces,
and the whole op over the edge cases in both directions; `-m slow` adds the other pairings of options, cases and
directions."""

import itertools
import os
import sys
import warnings
from pathlib import Path

import pytest
import torch


if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    # Triton's own library functions (tl.sum among them) are interpreted only if TRITON_INTERPRET=1 was set
    # when Triton was first imported; test_triton_interpreted.py runs this file in a fresh process that sets it
    pytest.skip("run by test_triton_interpreted.py with TRITON_INTERPRET=1", allow_module_level=True)
pytest.importorskip("triton")
pytest.importorskip("numpy")

from modeling_scaleformer import ops_local_softmax  # noqa: E402
from modeling_scaleformer.ops_local_softmax import chunk_local_softmax_decay_attention  # noqa: E402
from modeling_scaleformer.ops_naive import naive_local_softmax_decay_attention  # noqa: E402


F64 = torch.float64
CAUSAL = pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
# both directions, bidirectional only with `-m slow`: for options whose kernels the default run checks in both
# directions elsewhere
CAUSAL_BY_DEFAULT = pytest.mark.parametrize("causal", [pytest.param(False, marks=pytest.mark.slow), True],
                                            ids=["bidirectional", "causal"])


DIRECTIONS = {"bidirectional": False, "causal": True}


def pairings(*axes: dict, default: set) -> list:
    """Parameters over the product of `axes` (each id -> value), a value from each, their ids joined by "-": those
    whose id is in `default` in the default run, the others with `-m slow`."""
    return [pytest.param(*(value for _, value in picked), id=name, marks=() if name in default else pytest.mark.slow)
            for picked in itertools.product(*(axis.items() for axis in axes))
            for name in ["-".join(key for key, _ in picked)]]


class KernelCalls:
    """A Triton kernel whose launches (`kernel[grid](...)`) record the kernel's name and their keyword arguments in
    `calls`, then run."""

    def __init__(self, kernel, calls: list):
        self.kernel, self.calls = kernel, calls

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append((self.kernel.fn.__name__, kwargs))
            return self.kernel[grid](*args, **kwargs)
        return launch


def output_and_gradients(inputs, **kwargs):
    """The op's output on copies of q, k, v, the table and the decay rates (`inputs`), and their gradients under the
    upstream gradient 1 + out; `kwargs` go to the op."""
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    out = chunk_local_softmax_decay_attention(*leaves, **kwargs)
    return [out.detach(), *torch.autograd.grad(out, leaves, torch.ones_like(out) + out.detach())]


@CAUSAL
def test_triton_paths_in_the_op(decay_case, causal, decay_inputs, split_case, check_decay_op, triton_paths):
    """The whole op on its kernels (query blocks and key chunks of 16) against the float64 reference, over the decay
    cases: length 1, L < h, Lq != Lk both ways, offsets, padding, shared and absent tables."""
    used = triton_paths(16)
    inputs, offset = split_case(decay_inputs, {"h": 2, **decay_case})  # 4 rows: the interpreter runs each program
    check_decay_op(chunk_local_softmax_decay_attention, naive_local_softmax_decay_attention, inputs, causal, offset)
    assert used == {"local_softmax_decay"}


@pytest.mark.parametrize("case, causal", pairings({
    "2h-wider-than-a-block": dict(lq=50, lk=50, horizon=20), "lq>lk": dict(lq=70, lk=30, horizon=2),
    "lq<lk": dict(lq=30, lk=70, horizon=2), "offset-5": dict(lq=40, lk=23, horizon=3, offset=5),
    "queries-past-the-keys": dict(lq=5, lk=40, horizon=3, offset=100),
    "blocks-of-64": dict(lq=70, lk=70, horizon=16, block=64),
}, DIRECTIONS, default={"2h-wider-than-a-block-causal", "lq<lk-bidirectional", "blocks-of-64-causal"}))
def test_triton_attention_over_blocks(case, causal, decay_inputs, split_case, check_decay_op, triton_paths):
    """Inputs spanning several blocks (of 16 unless said) in ways the decay cases do not: windows (16 + 2h keys) that
    meet three or more key blocks, blocks and chunks cut at other places in the two directions (Lq != Lk, offsets),
    queries whose states hold every key, the blocks of 64 used on a GPU; padded keys."""
    case = dict(case, mask="padding")
    used = triton_paths(case.pop("block", 16))
    inputs, offset = split_case(decay_inputs, case)
    check_decay_op(chunk_local_softmax_decay_attention, naive_local_softmax_decay_attention, inputs, causal, offset)
    assert used == {"local_softmax_decay"}


@CAUSAL
@pytest.mark.parametrize("dims", [(128, 128), (100, 72)], ids=["d128", "d100-dv72"])
def test_triton_attention_with_tiles_128_wide(dims, causal, decay_inputs, check_decay_op, monkeypatch, triton_paths):
    """Head dimensions beyond 64, whose tiles are 128 wide (launched with `WIDE_LAUNCH`; `fits` does not take them
    yet, `MAX_DIM` lifted here): the op against the float64 reference, output and gradients, padded keys, Lq != Lk.
    Whether the GPU runs them is for `test_triton_attention_beyond_fits_on_cuda`."""
    from modeling_scaleformer import ops_local_softmax_triton as kernels

    monkeypatch.setattr(kernels, "MAX_DIM", 128)
    used = triton_paths(16)
    d, dv = dims
    inputs = decay_inputs(b=1, h=2, lq=40, lk=23, d=d, dv=dv, horizon=3, mask="padding")
    check_decay_op(chunk_local_softmax_decay_attention, naive_local_softmax_decay_attention, inputs, causal, 5)
    assert used == {"local_softmax_decay"}
    assert kernels._launch("_forward", d, dv) == {**kernels.LAUNCH["_forward"], "num_warps": 8, "num_stages": 1}
    assert kernels._launch("_forward", 64, 64) == kernels.LAUNCH["_forward"]


WALK_CASES = {
    "offset-5": dict(lq=40, lk=23, offset=5, causal=False, slots=2),
    "queries-past-the-keys": dict(lq=5, lk=40, offset=100, causal=False, slots=16, folded=1),
    "lk>lq": dict(lq=20, lk=200, offset=0, causal=False, slots=4, folded=1),
    "lq>lk": dict(lq=70, lk=30, offset=0, causal=False, slots=4),
    "causal": dict(lq=37, lk=37, offset=0, causal=True, slots=1),
    "ten-chunks": dict(lq=150, lk=150, offset=0, causal=False, slots=4),
    "steps-of-32": dict(lq=600, lk=600, offset=0, causal=False, slots=32),
}


# the default run: each scan once (sums bidirectional, products causal, the recurrence bidirectional), in steps of 2, 1
# and 16 chunks (steps that the chunks fill, and a last one that they do not), and the sums and the recurrence folding
# the chunks before the first query block; every other pair with `-m slow`
@pytest.mark.parametrize("kind, case", pairings(
    {"scan-sums": "sums", "scan-products": "products", "scan-recurrence": "recurrence"}, WALK_CASES,
    default={"scan-sums-offset-5", "scan-sums-queries-past-the-keys", "scan-products-causal",
             "scan-recurrence-queries-past-the-keys"}))
def test_parallel_walks_equal_the_sequential_walks(case, kind, monkeypatch, triton_paths):
    """The states of every query block by `_chunk_sums` and the scan (`PARALLEL_WALKS`; `_scan_sums`, or
    `_scan_products` where SCAN_PRODUCTS, or `_scan_recurrence` where SCAN_RECURRENCE) equal those of `_states`'
    sequential walk, in both directions, and the op's gradients through `_query_sums` and the scan (in reverse) equal
    those through `_states_backward` (blocks of 16, padded keys; the scan in parts of 2 of the 4 rows of the states,
    as the rows of a part split D = 64 on a GPU, and in steps of 1 to 16 chunks: steps that the chunks fill, and a
    last one that they do not)."""
    from modeling_scaleformer import ops_local_softmax_triton as kernels

    monkeypatch.setattr(kernels, "BLOCK", 16)
    monkeypatch.setattr(kernels, "SCAN_PRODUCTS", kind == "products")
    monkeypatch.setattr(kernels, "SCAN_RECURRENCE", kind == "recurrence")
    rows_option, slots_option = {"sums": ("SCAN_ROWS", "SCAN_SLOTS"), "products": ("PRODUCT_ROWS", "PRODUCT_SLOTS"),
                                 "recurrence": ("SCAN_ROWS", "RECURRENCE_SLOTS")}[kind]
    monkeypatch.setattr(kernels, rows_option, 2)
    monkeypatch.setattr(kernels, slots_option, case["slots"])
    scans, scan = [], kernels._scan
    monkeypatch.setattr(kernels, "_scan", lambda *args: scans.append(scan(*args)[0]) or scan(*args))
    gen = torch.Generator().manual_seed(0)
    lq, lk, offset, causal = case["lq"], case["lk"], case["offset"], case["causal"]
    k, v = (torch.randn(2, 3, lk, dim, dtype=F64, generator=gen) for dim in (4, 5))
    mask = torch.ones(2, lk, dtype=F64)
    mask[1, -4:] = 0
    rate = torch.tensor([0.05, 0.2, 0.6], dtype=F64)
    walk = kernels._Walk.of(lq, lk, offset, 2, causal)
    results = []
    for parallel in (True, False):
        monkeypatch.setattr(kernels, "PARALLEL_WALKS", parallel)
        results.append(kernels._walk_states(k, v, mask, rate, walk, 3, lq, offset, 2, causal, "ieee"))
    folded = 0
    for direction in range(1 if causal else 2):
        used = walk.nq - walk.starts[direction]  # the slots of that direction's states
        prefix = -walk.starts[direction]  # the chunks before the first query block: folded by the scan
        (states, norms, scales), (walked, walked_norms, walked_scales) = (
            [x[direction, :, :used] for x in result] for result in results)
        for got, expected in ((states, walked), (norms, walked_norms), (scales, walked_scales)):
            torch.testing.assert_close(got[:, prefix:], expected[:, prefix:], rtol=1e-13, atol=1e-15)
        if prefix < 2:
            continue
        folded += 1
        # slot prefix - 1: the skipped states' sum, each decayed to it, sum_{c < 0} exp(-lambda BLOCK (-1 - c)) L_c
        decays = torch.exp(-rate.repeat(2)[:, None] * kernels.BLOCK * torch.arange(prefix - 1, -1, -1, dtype=F64))
        for got, got_scale, expected, expected_scale in ((states, scales, walked, walked_scales),
                                                         (norms, scales, walked_norms, walked_scales)):
            weights = (decays * torch.exp(expected_scale[:, :prefix])).view(*expected_scale.shape[:1], prefix,
                                                                             *[1] * (expected.dim() - 2))
            skipped = (weights * expected[:, :prefix]).sum(1)
            assert skipped.abs().amax() > 1e-3
            torch.testing.assert_close(got[:, prefix - 1] * torch.exp(got_scale[:, prefix - 1]).view(
                -1, *[1] * (got.dim() - 2)), skipped, rtol=1e-12, atol=1e-15)
        assert torch.all(scales[:, :prefix - 1] == float("-inf"))
    assert folded == case.get("folded", 0)
    triton_paths(16)
    monkeypatch.setattr(kernels, rows_option, 2)
    monkeypatch.setattr(kernels, slots_option, case["slots"])
    q = torch.randn(2, 3, lq, 4, dtype=F64, generator=gen)
    rel = torch.randn(3, 5, 4, dtype=F64, generator=gen)
    grads = []
    for parallel in (True, False):
        monkeypatch.setattr(kernels, "PARALLEL_WALKS", parallel)
        grads.append(output_and_gradients((q, k, v, rel, rate), causal=causal, key_mask=mask,
                                          query_offset=offset)[1:])
    for name, got, expected in zip("q k v rel decay".split(), *grads):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-13, msg=lambda m: f"{name}: {m}")
    assert set(scans) == {getattr(kernels, "_scan_" + kind)}  # in forward and backward
    assert len(scans) == 3


@pytest.mark.parametrize("walks, case", pairings(
    {"parallel": (True, 3), "sequential": (False, 3), "parallel-unfolded": (True, 0)},
    {"source-after-the-targets": dict(lq=20, offset=0), "targets-far-into-the-source": dict(lq=10, offset=100)},
    default={"parallel-source-after-the-targets", "sequential-targets-far-into-the-source"}))
def test_chunks_before_the_first_query_block(walks, case, decay_inputs, check_decay_op, monkeypatch, triton_paths):
    """Cross attention over a source much longer than its targets (Lk = 150, blocks of 16): one direction's walk holds
    up to 8 chunks before the first query block, which the scans fold (`_fold_prefix`, 3 slots a step) and whose
    keys take their gradients from G_0 decayed (`_key_shares`), with hidden keys among them (the last visible ones
    several chunks back in one row) and a fast rate: output and gradients against the float64 reference, through the
    parallel passes, through them without the fold (`FOLD_SLOTS = 0`) and through the sequential walks."""
    from modeling_scaleformer import ops_local_softmax_triton as kernels

    used = triton_paths(16)
    monkeypatch.setattr(kernels, "PARALLEL_WALKS", walks[0])
    monkeypatch.setattr(kernels, "FOLD_SLOTS", walks[1])
    lq, offset = case["lq"], case["offset"]
    q, k, v, rel, _, key_mask, horizon = decay_inputs(b=2, h=2, lq=lq, lk=150, d=4, dv=5, horizon=2, mask="padding")
    key_mask = torch.ones_like(key_mask)
    key_mask[0, 30:110] = 0  # the source's chunks nearest the targets hidden (read backwards, the fold's last)
    key_mask[1, :12] = 0
    walk = kernels._Walk.of(lq, 150, offset, horizon, False)
    assert max(-start for start in walk.starts) >= 7
    inputs = q, k, v, rel, torch.tensor([0.3, 2.5], dtype=F64), key_mask, horizon
    check_decay_op(chunk_local_softmax_decay_attention, naive_local_softmax_decay_attention, inputs, False, offset)
    assert used == {"local_softmax_decay"}


@pytest.mark.parametrize("parallel, causal", pairings(
    {"sequential-walks": False, "parallel-walks": True}, DIRECTIONS,
    default={"sequential-walks-bidirectional", "parallel-walks-causal"}))
def test_rows_without_upstream_gradient(parallel, causal, monkeypatch, triton_paths):
    """Rows whose upstream gradient is zero, whose weight in the states' gradient `_row_terms` makes -inf, beside
    queries past the keys of a padded row (den = 0, the same -inf) and rows with both: the gradients against the
    float64 reference, through `_states_backward` and through `_query_sums` (blocks of 16, query offset 3)."""
    from modeling_scaleformer import ops_local_softmax_triton as kernels

    used = triton_paths(16)
    monkeypatch.setattr(kernels, "PARALLEL_WALKS", parallel)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 45, dim, dtype=F64, generator=gen) for dim in (4, 4, 5))
    rel, rate = torch.randn(2, 5, 4, dtype=F64, generator=gen), torch.tensor([0.1, 0.7], dtype=F64)
    mask = torch.ones(2, 45, dtype=F64)
    mask[1, 30:] = 0
    upstream = torch.randn(2, 2, 45, 5, dtype=F64, generator=gen)
    upstream[0, :, 3:20] = 0
    upstream[1, :, 36:] = 0
    grads = []
    for op in (chunk_local_softmax_decay_attention, naive_local_softmax_decay_attention):
        leaves = [x.clone().requires_grad_() for x in (q, k, v, rel, rate)]
        out = op(*leaves, causal=causal, key_mask=mask, query_offset=3)
        grads.append(torch.autograd.grad(out, leaves, upstream))
    assert used == {"local_softmax_decay"}
    for name, got, expected in zip("q k v rel decay".split(), *grads):
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-11, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("case", [
    pytest.param(dict(causal=False, keep=True, table=True, mask=True), marks=pytest.mark.slow),
    pytest.param(dict(causal=True, keep=True, table=True, mask=False), marks=pytest.mark.slow),
    dict(causal=True, keep=False, table=False, mask=False),
], ids=["bidirectional-kept-states", "causal-kept-states", "causal-recomputed-states"])
def test_kernels_operator_passes_opcheck(case, decay_inputs, monkeypatch, triton_paths):
    """The kernels' forward operator (and, through its autograd, the backward one) by `torch.library.opcheck`:
    schema, autograd registration, fake implementations against the real outputs (shapes, strides, dtypes), and
    AOT dispatch with dynamic shapes, whose outputs and gradients must equal eager's: what torch.compile relies on
    (blocks of 16, Lq != Lk, offset 5, padded keys; the states kept for backward or recomputed there)."""
    from modeling_scaleformer import ops_local_softmax_triton as kernels

    triton_paths(16)
    monkeypatch.setattr(kernels, "KEEP_STATES", case["keep"])
    *inputs, key_mask, horizon = decay_inputs(b=1, h=2, lq=40, lk=50, d=4, dv=5, no_rel=not case["table"],
                                              mask="padding" if case["mask"] else None)
    inputs = [x.requires_grad_() if x is not None else None for x in inputs]
    n_states = kernels._Walk.of(40, 50, 5, horizon, case["causal"]).n_states
    kept = kernels._kept_states(40, 50, 5, horizon, case["causal"])
    assert kept == (n_states if case["keep"] else 0)
    args = (*inputs, key_mask, case["causal"], 5, horizon, "ieee", kept)
    assert set(torch.library.opcheck(kernels._forward_op, args).values()) == {"SUCCESS"}
    with pytest.raises(ValueError, match=rf"kept must be 0 or the walk's {n_states} states, got {n_states + 1}"):
        kernels._forward_op(*args[:-1], n_states + 1)


@pytest.mark.parametrize("parallel, stored", [(False, False), (True, True)],
                         ids=["walks", "parallel-passes-stored-pairs"])
def test_input_pointers_are_the_arguments_in_the_inputs_dtype(parallel, stored, decay_inputs, monkeypatch,
                                                              triton_paths):
    """`INPUT_POINTERS`, what compiles without tensors declare in the inputs' dtype (test_triton_compiles.py,
    benchmarks/kernel_resources.py), names exactly the tensors that the op's launches pass in the inputs' dtype
    (float16 here), forward and backward, both directions, with a table and padded keys, with the walks or the
    parallel passes, the pairs formed again or stored (`STORED_PAIRS`); every other tensor they pass is float32."""
    from triton.runtime.interpreter import InterpretedFunction

    from modeling_scaleformer import ops_local_softmax_triton as kernels

    triton_paths(16)
    monkeypatch.setattr(kernels, "PARALLEL_WALKS", parallel)
    monkeypatch.setattr(kernels, "STORED_PAIRS", stored)
    launched = {}

    def record(self, *args, grid, warmup, **options):  # the launch recorded, not run: only its dtypes are read
        for name, value in zip(self.arg_names, args):
            if isinstance(value, torch.Tensor):
                launched.setdefault((self.fn.__name__, name), set()).add(value.dtype)

    monkeypatch.setattr(InterpretedFunction, "run", record)
    for causal in (False, True):
        *inputs, key_mask, horizon = decay_inputs(b=1, h=2, lq=40, lk=50, d=4, dv=5, horizon=3, mask="padding")
        leaves = [x.detach().to(torch.float16).requires_grad_() for x in inputs]
        out = kernels.local_softmax_decay(*leaves, causal=causal, key_mask=key_mask, query_offset=5, horizon=horizon)
        out.backward(torch.ones_like(out))
    expected = {key: {torch.float16 if key[1] in kernels.INPUT_POINTERS else torch.float32} for key in launched}
    assert launched == expected
    assert {kernel for kernel, _ in launched} >= {"_forward", "_row_terms", "_backward_queries", "_backward_keys"}
    assert {name for _, name in launched} >= set(kernels.INPUT_POINTERS)


@CAUSAL_BY_DEFAULT
def test_eager_calls_skip_the_operators_dispatch(causal, decay_inputs, triton_paths, monkeypatch):
    """Eager calls run the operators' bodies through `_EagerAttention`, not the operators: the same output and
    gradients, bit for bit; only where the call is traced (`_traced`) does the entry call the forward operator."""
    from modeling_scaleformer import ops_local_softmax_triton as kernels

    triton_paths(16)
    *inputs, key_mask, horizon = decay_inputs(b=2, h=3, lq=40, lk=50, d=4, dv=5, mask="padding")
    grad = torch.randn(2, 3, 40, 5, dtype=inputs[0].dtype)
    results = []
    operator = kernels._forward_op
    for compiling in (False, True):
        calls = []
        monkeypatch.setattr(kernels, "_forward_op", lambda *args: calls.append(args) or operator(*args))
        monkeypatch.setattr(kernels, "_traced", lambda: compiling)
        leaves = [x.detach().requires_grad_() for x in inputs]
        out = kernels.local_softmax_decay(*leaves, causal=causal, key_mask=key_mask, query_offset=5, horizon=horizon)
        out.backward(grad)
        assert len(calls) == compiling
        results.append([out.detach(), *(x.grad for x in leaves)])
    for name, eager, operator in zip("out dq dk dv dtable ddecay".split(), *results):
        torch.testing.assert_close(eager, operator, rtol=0, atol=0, msg=lambda m: f"{name}: {m}")


def test_kernels_compile_into_one_graph_in_float32(decay_inputs, triton_paths):
    """torch.compile(fullgraph=True) traces the kernels' entry with float32 inputs, whose products' precision comes
    from `torch.get_float32_matmul_precision()` (a string: read as a call, it would end the graph at every attention
    layer), and gives eager's output."""
    from modeling_scaleformer import ops_local_softmax_triton as kernels

    triton_paths(16)
    *inputs, key_mask, horizon = decay_inputs(b=1, h=2, lq=20, lk=20, d=4, dv=4, mask="padding")
    inputs = [x.float() for x in inputs]

    def attend(q, k, v, table, decay):
        return kernels.local_softmax_decay(q, k, v, table, decay, causal=True, key_mask=key_mask, query_offset=0,
                                           horizon=horizon)

    torch._dynamo.reset()
    got = torch.compile(attend, fullgraph=True, backend="aot_eager")(*inputs)
    torch.testing.assert_close(got, attend(*inputs), rtol=0, atol=0)


def test_the_traced_graph_holds_the_states_layout(decay_inputs, triton_paths):
    """The forward operator takes the number of states it keeps as an argument, so that the graph torch.compile
    traces around it (and the key under which Inductor caches what it compiled) changes with the kernels' blocks:
    a graph cached under one layout must not be replayed with the states' shape of another."""
    from modeling_scaleformer import ops_local_softmax_triton as kernels
    from torch.fx.experimental.proxy_tensor import make_fx

    *inputs, key_mask, horizon = decay_inputs(b=1, h=2, lq=100, lk=100, d=4, dv=4)

    def attend(q, k, v, table, decay):
        return kernels.local_softmax_decay(q, k, v, table, decay, causal=True, key_mask=None, query_offset=0,
                                           horizon=horizon)

    codes = []
    for chunk in (16, 32):
        triton_paths(chunk)
        graph = make_fx(attend, tracing_mode="fake")(*inputs)
        calls = [node for node in graph.graph.nodes if "local_softmax_decay_forward" in str(node.target)]
        assert [node.args[-1] for node in calls] == [-(-100 // chunk)]  # one state per block of queries
        codes.append(graph.code)
    assert codes[0] != codes[1]


def test_a_copy_of_the_module_registers_operators_of_its_own():
    """The kernels' module loaded a second time under another name, as `trust_remote_code=True` loads a saved
    folder's copy beside the installed package, registers its operators in a namespace of its own (the same names
    twice would fail at import), and they run. The copy stays imported: its operators stay registered."""
    import importlib
    import types

    from modeling_scaleformer import ops_local_softmax_triton as installed

    folder = types.ModuleType("remote_copy_of_scaleformer")
    folder.__path__ = [str(Path(installed.__file__).parent)]
    sys.modules.setdefault(folder.__name__, folder)
    copy = importlib.import_module(f"{folder.__name__}.ops_local_softmax_triton")
    assert copy.LIBRARY != installed.LIBRARY and copy._forward_op is not installed._forward_op
    q = torch.randn(1, 2, 20, 4, dtype=F64)
    rate = torch.tensor([0.1, 0.5], dtype=F64)
    got = copy.local_softmax_decay(q, q, q, None, rate, causal=True, key_mask=None, query_offset=0, horizon=2)
    expected = installed.local_softmax_decay(q, q, q, None, rate, causal=True, key_mask=None, query_offset=0,
                                             horizon=2)
    assert torch.equal(got, expected)


def test_cuda_without_triton_says_it_runs_the_pytorch_path(monkeypatch):
    """On CUDA without Triton the op runs its PyTorch path and warns once that Triton is missing; on CPU, where that
    path is the one meant, nothing is said."""
    monkeypatch.setattr(ops_local_softmax, "_WARNED_PYTORCH_PATHS", set())
    monkeypatch.setattr(ops_local_softmax, "_triton_entry", lambda device, name: None)
    with pytest.warns(UserWarning, match=r"runs its PyTorch path on cuda, not its Triton kernels: Triton is not "
                                         r"installed \(`pip install triton`, or the package's `gpu` extra\)$"):
        assert ops_local_softmax._attention_function(torch.device("cuda"), 16, 64, 64, torch.float32) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ops_local_softmax._attention_function(torch.device("cuda"), 16, 64, 64, torch.float32) is None
        assert ops_local_softmax._attention_function(torch.device("cpu"), 16, 64, 64, torch.float32) is None


def test_few_programs_take_the_parallel_walks(decay_inputs, monkeypatch, triton_paths):
    """`PARALLEL_WALKS = None` (the default): the parallel passes where the walks would have at most
    PARALLEL_WALK_PROGRAMS programs (batch*head rows times directions), the sequential walks beyond, in forward and in
    backward alike (the kernels the op launches, at 3 rows: 3 programs causal, 6 bidirectional); True and False take
    one path at every size."""
    from modeling_scaleformer import ops_local_softmax_triton as kernels

    triton_paths(16)
    monkeypatch.setattr(kernels, "PARALLEL_WALKS", None)
    programs = kernels.PARALLEL_WALK_PROGRAMS
    assert kernels._parallel_walks(1, 1) and kernels._parallel_walks(programs, 1)
    assert kernels._parallel_walks(programs // 2, 2) and not kernels._parallel_walks(programs // 2 + 1, 2)
    assert not kernels._parallel_walks(programs + 1, 1)
    launched = []
    for name in ("_states", "_states_backward", "_chunk_sums", "_query_sums"):
        monkeypatch.setattr(kernels, name, KernelCalls(getattr(kernels, name), launched))
    inputs = decay_inputs(b=1, h=3, lq=40, lk=40, d=4, dv=4, mask="padding")
    passes, walks = ["_chunk_sums", "_query_sums"], ["_states", "_states_backward"]
    for causal, walk_programs, expected in ((True, 3, passes), (True, 2, walks), (False, 6, passes),
                                            (False, 5, walks)):
        monkeypatch.setattr(kernels, "PARALLEL_WALK_PROGRAMS", walk_programs)
        launched.clear()
        output_and_gradients(inputs[:5], causal=causal, key_mask=inputs[5], query_offset=0)
        assert [name for name, _ in launched] == expected, (causal, walk_programs, launched)
    for setting in (True, False):
        monkeypatch.setattr(kernels, "PARALLEL_WALKS", setting)
        assert kernels._parallel_walks(1, 1) is kernels._parallel_walks(4 * programs, 2) is setting


@CAUSAL_BY_DEFAULT
def test_kept_states_give_the_recomputed_gradients(causal, decay_inputs, monkeypatch, triton_paths):
    """`KEEP_STATES`: backward takes forward's states instead of walking the keys again (one walk per call instead of
    two), with the same gradients to the last bit (blocks of 16, padded keys, Lq != Lk)."""
    from modeling_scaleformer import ops_local_softmax_triton as kernels

    triton_paths(16)
    walks = []
    walk_states = kernels._walk_states
    monkeypatch.setattr(kernels, "_walk_states", lambda *args: walks.append(1) or walk_states(*args))
    inputs = decay_inputs(b=2, h=3, lq=40, lk=50, d=4, dv=4, mask="padding")
    results = []
    for keep in (True, False):
        monkeypatch.setattr(kernels, "KEEP_STATES", keep)
        walks.clear()
        results.append(output_and_gradients(inputs[:5], causal=causal, key_mask=inputs[5], query_offset=5))
        assert len(walks) == (1 if keep else 2)
    for name, got, expected in zip("out q k v rel decay".split(), *results):
        assert torch.equal(got, expected), name


@pytest.mark.parametrize("case, causal", pairings({
    "h3-exact": dict(lq=50, lk=50, horizon=3, min_table_tile=1, rows=(4, 8)),
    "h16-tiles-of-32": dict(lq=40, lk=60, horizon=16, min_table_tile=32, rows=(32, 64), offset=5),
    "h4-last-row-apart": dict(lq=50, lk=50, horizon=4, min_table_tile=1, edge=True, rows=(4, 8)),
    "h16-last-row-apart": dict(lq=60, lk=40, horizon=16, min_table_tile=16, edge=True, rows=(16, 32), offset=3),
}, DIRECTIONS, default={"h4-last-row-apart-bidirectional", "h16-last-row-apart-causal"}))
def test_narrow_table_tiles_against_the_reference(case, causal, decay_inputs, split_case, check_decay_op, monkeypatch,
                                                  triton_paths):
    """The relative table in tiles as narrow as the rows the band reads (`MIN_TABLE_TILE` lowered; h+1 rows from row
    h when causal, 2h+1 else), or one row narrower with the band's last row read apart (`EDGE_APART`, where those
    rows are a power of two plus one): the op against the float64 reference, output and gradients (the table's
    included, whose rows before h are 0 when causal), padded keys, Lq != Lk."""
    from modeling_scaleformer import ops_local_softmax_triton as kernels

    case = dict(case, mask="padding")
    monkeypatch.setattr(kernels, "MIN_TABLE_TILE", case.pop("min_table_tile"))
    monkeypatch.setattr(kernels, "EDGE_APART", case.pop("edge", False))
    causal_rows, bidirectional_rows = case.pop("rows")
    tile = kernels._sizes(case["horizon"], 4, 4, causal)["BLOCK_R"]
    assert tile == (causal_rows if causal else bidirectional_rows)
    assert (tile == kernels._table_rows(case["horizon"], causal)[1] - 1) == kernels.EDGE_APART
    used = triton_paths(16)
    inputs, offset = split_case(decay_inputs, case)
    check_decay_op(chunk_local_softmax_decay_attention, naive_local_softmax_decay_attention, inputs, causal, offset)
    assert used == {"local_softmax_decay"}


@pytest.mark.parametrize("case, causal", pairings({
    "h3": dict(lq=50, lk=50, horizon=3), "lq>lk-offset": dict(lq=60, lk=30, horizon=5, offset=3),
    "lq<lk": dict(lq=30, lk=60, horizon=5), "one-query": dict(lq=1, lk=40, horizon=2, offset=20),
    "2h-wider-than-a-block-key-blocks-of-64": dict(lq=40, lk=40, horizon=20, key_block=64),
    "key-blocks-of-half-a-block": dict(lq=70, lk=70, horizon=5, block=32, key_block=16),
}, DIRECTIONS, default={"one-query-causal", "2h-wider-than-a-block-key-blocks-of-64-bidirectional",
                        "key-blocks-of-half-a-block-causal"}))
def test_stored_pairs_against_the_reference(case, causal, decay_inputs, split_case, check_decay_op, monkeypatch,
                                            triton_paths):
    """`_backward_keys` reading the pairs that `_backward_queries` stored (`STORED_PAIRS`) instead of forming them: the
    op against the float64 reference, output and gradients, padded keys, Lq != Lk both ways, one query, windows wider
    than a block, programs of more keys than a block that meet several windows (blocks of 16, KEY_BLOCK = 64:
    each of the 3 windows of 40 queries), and of half a block's keys (blocks of 32, KEY_BLOCK = 16: a chunk's keys in
    two programs, as 16 keys a program at blocks of 64 would take them); and the same gradients, to float64's
    rounding, as the pairs formed again."""
    from modeling_scaleformer import ops_local_softmax_triton as kernels

    case = dict(case, mask="padding")
    key_block = case.pop("key_block", None)
    triton_paths(case.pop("block", 16))
    if key_block:
        monkeypatch.setattr(kernels, "KEY_BLOCK", key_block)
    inputs, offset = split_case(decay_inputs, case)
    launched = []
    backward_keys = kernels._backward_keys
    monkeypatch.setattr(kernels, "_backward_keys", KernelCalls(backward_keys, launched))
    monkeypatch.setattr(kernels, "STORED_PAIRS", True)
    check_decay_op(chunk_local_softmax_decay_attention, naive_local_softmax_decay_attention, inputs, causal, offset)
    assert launched and all(constexprs["STORED_PAIRS"] for _, constexprs in launched)
    q, k, v, rel, decay, key_mask, horizon = inputs
    options = dict(causal=causal, key_mask=key_mask, query_offset=offset, horizon=horizon)
    stored = output_and_gradients((q, k, v, rel, decay), **options)
    monkeypatch.setattr(kernels, "STORED_PAIRS", False)
    formed = output_and_gradients((q, k, v, rel, decay), **options)
    for name, got, expected in zip("out q k v rel decay".split(), stored, formed):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-13, msg=lambda m: f"{name}: {m}")


@CAUSAL_BY_DEFAULT
def test_key_tiles_do_not_change_the_result(causal, decay_inputs, monkeypatch, triton_paths):
    """Windows read in one tile (KEY_TILE as wide as the window, KEY_BLOCK = BLOCK, the layout that
    `bench_attention_gpu.py --key-tile 128 --key-block 64` times), and backward programs over more keys than a chunk
    (whose keys then lie in up to three chunks), give the output and gradients of windows read in tiles of 8 keys
    (blocks of 16, h = 5: windows of 26 keys, 21 when causal, padded keys)."""
    from modeling_scaleformer import ops_local_softmax_triton as kernels

    inputs = decay_inputs(b=2, h=1, lq=70, lk=70, horizon=5, mask="padding")
    key_mask = inputs[5]
    results = []
    for tile, block in ((8, 8), (32, 16), (16, 32)):
        triton_paths(16)
        monkeypatch.setattr(kernels, "KEY_TILE", tile)
        monkeypatch.setattr(kernels, "KEY_BLOCK", block)
        results.append(output_and_gradients(inputs[:5], causal=causal, key_mask=key_mask))
    for other in results[1:]:
        for name, got, expected in zip("out q k v rel decay".split(), other, results[0]):
            torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-13, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("case", [
    dict(causal=True, lq=150, lk=150, horizon=16, block=64),
    pytest.param(dict(causal=False, lq=150, lk=150, horizon=8, block=64), marks=pytest.mark.slow),
    pytest.param(dict(causal=True, lq=100, lk=130, horizon=2, block=64, offset=3), marks=pytest.mark.slow),
    pytest.param(dict(causal=True, lq=45, lk=30, horizon=5, block=16, min_tile=4, offset=2), marks=pytest.mark.slow),
    dict(causal=False, lq=30, lk=45, horizon=3, block=16, min_tile=4),
], ids=["causal-h16-tail-16", "bidirectional-h8-tail-16", "causal-h2-tail-16-for-2-keys", "causal-lq>lk-tail-8",
        "bidirectional-lq<lk-tail-8"])
def test_tail_tiles_against_the_reference(case, decay_inputs, split_case, check_decay_op, monkeypatch, triton_paths):
    """Windows that end in a narrower tile (`TAIL_TILES`, both kernels; at blocks of 64 in tiles of 32, a window of
    80 keys, h = 16 causal or h = 8 bidirectional, ends in a tile of 16, and one of 66 keys, h = 2 causal, in a tile
    of 16 that holds 2; at blocks of 16 in tiles of 16, with tails of 4 keys or more allowed, windows of 21 keys
    (h = 5 causal) and 22 (h = 3 bidirectional) end in tiles of 8): the op against the float64 reference, output and
    gradients, padded keys, offsets, Lq != Lk both ways."""
    from modeling_scaleformer import ops_local_softmax_triton as kernels

    case = dict(case, mask="padding")
    causal, block, min_tile = case.pop("causal"), case.pop("block"), case.pop("min_tile", 16)
    used = triton_paths(block)
    monkeypatch.setattr(kernels, "MIN_KEY_TILE", min_tile)
    monkeypatch.setattr(kernels, "TAIL_TILES", ("_forward", "_backward_queries"))
    horizon = case["horizon"]
    window = block + horizon * (1 if causal else 2)
    tiles = kernels._window_tiles("_backward_queries", horizon, causal)
    assert tiles["TAIL"] > 0 and tiles["TILES"] + tiles["TAIL"] >= window > tiles["TILES"]
    assert tiles["TILES"] % kernels.KEY_TILE == 0 and tiles["TAIL"] < kernels.KEY_TILE
    inputs, offset = split_case(decay_inputs, case)
    check_decay_op(chunk_local_softmax_decay_attention, naive_local_softmax_decay_attention, inputs, causal, offset)
    assert used == {"local_softmax_decay"}


def test_window_tiles():
    """Blocks of 64 in tiles of 32: a window of 80 keys (h = 16 causal) in two tiles and one of 16 where the kernel
    takes tails (`TAIL_TILES`, `_forward` by default), else in three tiles; a window of 96 keys (h = 16
    bidirectional) in three whatever the kernel; 66 keys
    (h = 1 bidirectional) in two and one of 16, which holds 2; 127 keys (h = 63 causal) in four, since the keys left
    need a whole tile."""
    from modeling_scaleformer import ops_local_softmax_triton as kernels

    assert kernels.BLOCK == 64 and kernels.KEY_TILE == 32 and kernels.MIN_KEY_TILE == 16
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kernels, "TAIL_TILES", ("_forward",))
        assert kernels._window_tiles("_forward", 16, True) == dict(TILES=64, TAIL=16, ONE_SIDED=True)
        assert kernels._window_tiles("_backward_queries", 16, True) == dict(TILES=96, TAIL=0, ONE_SIDED=True)
        assert kernels._window_tiles("_forward", 16, False) == dict(TILES=96, TAIL=0, ONE_SIDED=True)
        assert kernels._window_tiles("_forward", 1, False) == dict(TILES=64, TAIL=16, ONE_SIDED=True)
        assert kernels._window_tiles("_forward", 63, True) == dict(TILES=128, TAIL=0, ONE_SIDED=True)
    assert kernels.TAIL_TILES == ("_forward",)  # the default, as an H200 timed it (benchmarks/README.md)
    assert kernels._window_tiles("_forward", 16, True) == dict(TILES=64, TAIL=16, ONE_SIDED=True)
    assert kernels._window_tiles("_backward_queries", 16, True) == dict(TILES=96, TAIL=0, ONE_SIDED=True)


def test_tiles_beyond_the_band():
    """`_beyond_band` against every pair of a block's window (query a at offset t = a + h - w from slot w, beyond the
    band where t > h, or |t| > h unless causal; the window's BLOCK + 2h slots, BLOCK + h when causal), for blocks of 16
    and 64, h from 1 to past a block, tiles of several widths from every slot, those past the window's end among
    them; and `_two_sided_tiles`, where the window kernels' loop over tiles ends: before a last tile in the band only.
    Causal at h = 16 in tiles of 32, slots 64-95 are in the band only, and so are the narrower last tile of 16 and the
    interpreted tests' last tiles (blocks and tiles of 16, h < 16: slots 16-31), which the kernels then take apart."""
    from modeling_scaleformer import ops_local_softmax_triton as kernels

    for block, horizon, causal in itertools.product((16, 64), (1, 3, 16, 20, 63), (False, True)):
        span = horizon * (1 if causal else 2)
        for slots in (8, 16, 32):
            for first in range(0, block + span + slots):
                window = range(first, min(first + slots, block + span))
                offsets = [a + horizon - w for a in range(block) for w in window]
                beyond = any(t > horizon if causal else abs(t) > horizon for t in offsets)
                assert kernels._beyond_band(first, slots, horizon, causal, block) == beyond, (block, horizon, first)
            tiles = -(-(block + span) // slots) * slots
            last = tiles - slots
            split = last if not kernels._beyond_band(last, slots, horizon, causal, block) else tiles
            assert kernels._two_sided_tiles(tiles, slots, horizon, causal, block, True) == split
    assert not kernels._beyond_band(64, 32, 16, True, 64) and kernels._beyond_band(32, 32, 16, True, 64)
    assert kernels._two_sided_tiles(96, 32, 16, True, 64, True) == 64 and not kernels._beyond_band(64, 16, 16, True, 64)
    assert kernels._two_sided_tiles(96, 32, 16, False, 64, True) == 96
    assert kernels._two_sided_tiles(96, 32, 16, True, 64, False) == 96  # not ONE_SIDED_TILES
    assert all(kernels._two_sided_tiles(32, 16, horizon, True, 16, True) == 16 for horizon in range(1, 16))


def test_one_sided_tiles_do_not_change_the_result(decay_inputs, monkeypatch, triton_paths):
    """The windows' last tiles in the band only taken apart without the kernel's products (`ONE_SIDED_TILES`, the
    default; the op's tests hold it to the float64 reference) and with them, as every other tile: the same output and
    gradients to float64's rounding, causal (blocks of 16, h = 3: the last whole tile in both kernels, and narrower
    last tiles of 4 in both), padded keys, with a table."""
    from modeling_scaleformer import ops_local_softmax_triton as kernels

    inputs = decay_inputs(b=1, h=2, lq=40, lk=40, horizon=3, mask="padding")
    key_mask = inputs[5]
    for tails in ((), ("_forward", "_backward_queries")):
        triton_paths(16)
        monkeypatch.setattr(kernels, "MIN_KEY_TILE", 4)
        monkeypatch.setattr(kernels, "TAIL_TILES", tails)
        results = []
        for one_sided in (True, False):
            monkeypatch.setattr(kernels, "ONE_SIDED_TILES", one_sided)
            results.append(output_and_gradients(inputs[:5], causal=True, key_mask=key_mask, horizon=3))
        for name, got, expected in zip("out q k v rel decay".split(), *results):
            torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-13, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("case, causal", pairings({
    "lq>lk-offset-keys-before-the-windows": dict(lq=40, lk=23, horizon=3, offset=5),
    "keys-past-the-windows": dict(lq=23, lk=60, horizon=3, offset=7),
    "overlap-of-a-block": dict(lq=37, lk=37, horizon=8),
    "length-1": dict(lq=1, lk=1, horizon=3), "tiles-of-8": dict(lq=50, lk=50, horizon=5, tile=8),
    "tiles-of-32": dict(lq=50, lk=50, horizon=5, tile=32), "overlap-beyond-a-block": dict(lq=40, lk=40, horizon=10),
}, DIRECTIONS, default={"length-1-causal", "tiles-of-8-causal", "overlap-beyond-a-block-bidirectional"}))
def test_key_blocks_from_key_0_give_the_same_gradients(case, causal, decay_inputs, monkeypatch, triton_paths):
    """`_backward_keys`' blocks from key 0 (not `ALIGNED_KEY_BLOCKS`, the default, which the other tests hold to the
    reference) give the gradients of the blocks from where `_key_origin` starts them (a window's first key causal,
    where two windows' overlap ends bidirectional), to rounding (blocks of 16, padded keys; windows in tiles of 8
    keys, several in an overlap, and of 32, wider than a block; overlaps of less and more than a block)."""
    from modeling_scaleformer import ops_local_softmax_triton as kernels

    case = dict(case)
    offset, tile = case.pop("offset", 0), case.pop("tile", 16)
    inputs = decay_inputs(b=1, h=2, mask="padding", **case)
    results = []
    for aligned in (False, True):
        triton_paths(16)
        monkeypatch.setattr(kernels, "KEY_TILE", tile)
        monkeypatch.setattr(kernels, "ALIGNED_KEY_BLOCKS", aligned)
        results.append(output_and_gradients(inputs[:5], causal=causal, key_mask=inputs[5], query_offset=offset))
    monkeypatch.setattr(kernels, "KEY_BLOCK", 32)  # at h = 16, s_b = offset - 16 mod 32: from s_b + 32, and s_b causal
    assert kernels._key_origin(0, 16, False) == -16 and kernels._key_origin(0, 16, True) == -16
    assert kernels._key_origin(5, 16, False) == -11 and kernels._key_origin(5, 16, True) == -11
    assert kernels._key_origin(0, 5, False) == -27 and kernels._key_origin(0, 5, True) == -5
    for name, got, expected in zip("out q k v rel decay".split(), *results):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-13, msg=lambda m: f"{name}: {m}")


def test_key_blocks_meet_the_chunks_that_walk_chunks_says(monkeypatch):
    """`_walk_chunks`, the chunks of each walk that `_backward_keys`' programs unroll, against the chunks that their
    blocks of keys meet (each key's chunk as `_key_shares` places it: c = (y + qshift - off_w + h) // BLOCK), for
    blocks from where `_key_origin` starts them and from key 0, blocks of 16 to 64 keys, chunks of 16 and 64, h from 1
    to 63, offsets, Lq != Lk: never fewer; and one chunk for blocks of at most a chunk's keys where they start in
    step with the walk (causal, the forward walk; bidirectional, the backward walk, and the forward one at h = 16)."""
    from modeling_scaleformer import ops_local_softmax_triton as kernels

    for block, key_block, horizon, causal, aligned in itertools.product(
            (16, 64), (16, 32, 64), (1, 5, 8, 16, 63), (False, True), (False, True)):
        monkeypatch.setattr(kernels, "KEY_BLOCK", key_block)
        monkeypatch.setattr(kernels, "ALIGNED_KEY_BLOCKS", aligned)
        for lq, lk, offset in ((300, 300, 0), (301, 301, 0), (130, 300, 7), (300, 130, 0), (200, 200, 3),
                               (270, 259, 0)):
            nq = -(-lq // block)
            origin = kernels._key_origin(offset, horizon, causal)
            most = [0, 0]
            shift_back = nq * block - lq - (lk - lq - offset)
            for j0 in range(origin, lk, key_block):
                keys = range(max(j0, 0), min(j0 + key_block, lk))
                for direction, (shift, ys) in enumerate(((-offset, keys), (shift_back, [lk - 1 - j for j in keys]))):
                    chunks = {(y + shift + horizon) // block for y in ys}
                    most[direction] = max(most[direction], len({c for c in chunks if c < nq - 1}))
            for direction in range(1 if causal else 2):
                unrolled = kernels._walk_chunks(key_block, block, horizon, causal, aligned, direction)
                assert most[direction] <= unrolled, (block, key_block, horizon, causal, aligned, direction)
    for causal, horizon, direction in ((True, 5, 0), (True, 16, 0), (False, 16, 0), (False, 5, 1), (False, 16, 1)):
        assert kernels._walk_chunks(32, 64, horizon, causal, True, direction) == 1
        assert kernels._walk_chunks(32, 64, horizon, causal, False, direction) == 2
    assert kernels._walk_chunks(32, 64, 5, False, True, 0) == 2 and kernels._walk_chunks(64, 16, 5, True, True, 0) == 4


def test_triton_attention_reads_strided_inputs(decay_inputs, triton_paths):
    """q, k, v as the model makes them, (B, L, H, D) tensors seen as (B, H, L, D), and an upstream gradient of any
    layout: the kernels read them in place, give the reference's output and gradients, and lay the output out so
    that merging the heads is a view."""
    triton_paths(16)
    q, k, v, rel, decay, key_mask, horizon = decay_inputs(b=2, h=3, lq=37, lk=37, horizon=3, mask="padding")
    strided = [x.transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for x in (q, k, v)]
    dense = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out = chunk_local_softmax_decay_attention(*strided, rel, decay, key_mask=key_mask)
    expected = naive_local_softmax_decay_attention(*dense, rel, decay, key_mask=key_mask)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
    assert out.transpose(1, 2).is_contiguous()
    upstream = torch.randn(2, 37, 3, 4, dtype=F64).transpose(1, 2)  # not contiguous, last dim dense
    for got, want in zip(torch.autograd.grad(out, strided, upstream), torch.autograd.grad(expected, dense, upstream)):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-11)


def test_triton_attention_extreme_logits(decay_inputs, triton_paths):
    """Logits scaled by +-40 and shifted by -2000: finite and equal to the reference."""
    triton_paths()
    q, k, v, rel, decay, key_mask, horizon = decay_inputs(b=1, h=2, lq=30, lk=30, horizon=2, mask="padding")
    for scale in (40.0, -40.0):
        out = chunk_local_softmax_decay_attention(q * abs(scale), k * scale, v, rel, decay, key_mask=key_mask)
        assert bool(torch.isfinite(out).all())
        torch.testing.assert_close(out, naive_local_softmax_decay_attention(q * abs(scale), k * scale, v, rel, decay,
                                                                            key_mask=key_mask), rtol=1e-9, atol=1e-12)
    shift = -2000.0 * 5**0.5 * q / (q * q).sum(-1, keepdim=True)
    got = chunk_local_softmax_decay_attention(q, k + shift, v, rel, decay, query_offset=2)
    torch.testing.assert_close(got, naive_local_softmax_decay_attention(q, k + shift, v, rel, decay, query_offset=2),
                               rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("lk", [pytest.param(300, marks=pytest.mark.slow), 60], ids=["keys-hidden-after-60", "60-keys"])
def test_triton_attention_rows_far_from_their_keys(lk, monkeypatch, triton_paths):
    """float32 rows whose visible keys all lie 80 to 240 positions back (rate 0.5: total weights from e^-40 to
    e^-120, below float32's smallest normal number from 175 positions; exp(-m) / den, their weight in the states'
    gradient, passes e^88 from about 180 positions): both paths keep the float64 reference's output and gradients at
    every row, the kernels by the exponents their states and the states' gradients hold, the PyTorch path by
    `_rows_beyond_the_keys`."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 300, 4, dtype=F64, generator=gen)
    k, v = (torch.randn(1, 2, lk, 4, dtype=F64, generator=gen) for _ in range(2))
    rel, decay = 0.1 * torch.randn(2, 7, 4, dtype=F64, generator=gen), torch.tensor([0.5, 0.05], dtype=F64)
    key_mask = torch.ones(1, lk, dtype=torch.long)
    key_mask[0, 60:] = 0
    args = [x.float().requires_grad_() for x in (q, k, v, rel, decay)]
    wide = [x.detach().double().requires_grad_() for x in args]
    expected = naive_local_softmax_decay_attention(*wide, key_mask=key_mask, causal=True)
    upstream = torch.randn(expected.shape, dtype=F64, generator=gen)
    expected_grads = torch.autograd.grad(expected, wide, upstream)
    for kernels in (True, False):
        if kernels:
            triton_paths()
        else:
            monkeypatch.setattr(ops_local_softmax, "_attention_function", lambda *args: None)
        got = chunk_local_softmax_decay_attention(*args, key_mask=key_mask, causal=True)
        torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-6)
        for name, g, e in zip("q k v rel decay".split(), torch.autograd.grad(got, args, upstream.float()),
                              expected_grads):
            torch.testing.assert_close(g.double(), e, rtol=1e-4, atol=1e-4 * max(1.0, float(e.abs().max())),
                                       msg=lambda m: f"{'kernels' if kernels else 'pytorch'}, grad {name}: {m}")


# (case, dtype, walks): in the default run, float32 on the gaps between paddings, a batch row without keys and a
# padded row of one query (test_triton_attention_rows_inside_a_gap and test_rows_without_upstream_gradient take such
# rows through the sequential walks)
ROWS_BEYOND_THE_KEYS = [
    *((name, "float32", "parallel") for name in ("gaps_and_paddings", "a_batch_row_without_keys",
                                                  "length_1_right_padding")),
    *(pytest.param(name, dtype, walks, marks=pytest.mark.slow) for name, dtype, walks in (
        ("right_padding", "float64", "sequential"),
        ("past_the_keys", "float32", "parallel"), ("right_padding_causal", "float32", "parallel"),
        ("left_padding", "float32", "parallel"), ("both_paddings", "float32", "parallel"),
        ("length_1", "float64", "parallel"),
        ("past_the_keys_causal", "float32", "sequential"), ("offset", "float32", "parallel"),
        ("last_keys_hidden", "float32", "parallel"), ("last_keys_hidden_causal", "float64", "sequential"),
        ("right_padding", "float64", "parallel"), ("left_padding_causal", "float64", "sequential"),
        ("both_paddings", "float64", "sequential"), ("length_1_hidden", "float64", "parallel"),
        ("gap", "float64", "parallel"), ("gap_causal", "float32", "sequential"),
        ("gaps_and_paddings_causal", "float64", "sequential"))),
]


@pytest.mark.parametrize("name, dtype, walks", ROWS_BEYOND_THE_KEYS)
def test_triton_attention_rows_beyond_the_keys(name, dtype, walks, beyond_the_keys_inputs, decay_gradient_terms,
                                               monkeypatch, triton_paths):
    """Rows whose visible keys all lie on one side of their band, up to 250 positions away at rate 4 (past every key,
    past a padded row's last visible key, before its first; weights far below float32's range, and float64's): the
    kernels keep the float64 reference, output and gradients, by themselves, through the parallel walks or the
    sequential ones (`PARALLEL_WALKS`). Their states and the states' gradients hold exponents of their own, where
    sums relative to each block's start would underflow (`_rows_beyond_the_keys`, which corrects the PyTorch path, is
    not called). In float32 the rates' gradients are held to float32's epsilon times the magnitudes of their terms
    (`decay_gradient_terms`) where that is wider than the other gradients' tolerance: in `gap_causal` the rows 360
    positions into a gap of hidden keys give the fast head's gradient terms of 3e5 in all, which cancel to 0.13."""
    from modeling_scaleformer import ops_local_softmax_triton as kernels

    triton_paths(16)
    monkeypatch.setattr(kernels, "PARALLEL_WALKS", walks == "parallel")
    monkeypatch.setattr(ops_local_softmax, "_rows_beyond_the_keys", lambda *args, **kwargs: pytest.fail("called"))
    args, kwargs, _ = beyond_the_keys_inputs(name)
    expected = naive_local_softmax_decay_attention(*args, **kwargs)
    upstream = torch.randn(expected.shape, dtype=F64, generator=torch.Generator().manual_seed(1))
    expected_grads = torch.autograd.grad(expected, args, upstream)
    leaves = [x.detach().to(getattr(torch, dtype)).requires_grad_() for x in args]
    got = chunk_local_softmax_decay_attention(*leaves, **kwargs)
    rtol, atol = (1e-10, 1e-12) if dtype == "float64" else (1e-4, 1e-5)
    torch.testing.assert_close(got.double(), expected, rtol=rtol, atol=atol)
    for grad_name, g, e in zip("q k v rel decay".split(), torch.autograd.grad(got, leaves, upstream.to(got.dtype)),
                               expected_grads):
        tolerance = 10 * atol * max(1.0, float(e.abs().max()))
        if grad_name == "decay" and dtype == "float32":
            tolerance = (torch.finfo(torch.float32).eps * decay_gradient_terms(args, kwargs, upstream)).clamp(
                min=tolerance)
            assert bool(((g.double() - e).abs() <= tolerance + 10 * rtol * e.abs()).all()), (g, e, tolerance)
        else:
            torch.testing.assert_close(g.double(), e, rtol=10 * rtol, atol=tolerance,
                                       msg=lambda m: f"grad {grad_name}: {m}")


@pytest.mark.parametrize("gap, causal, block", [
    pytest.param((30, 170), False, 16, marks=pytest.mark.slow), ((5, 60), True, 16),
    *(pytest.param(*case, marks=pytest.mark.slow) for case in (((30, 170), True, 64), ((5, 60), False, 64),
                                                               ((100, 250), False, 16), ((100, 250), True, 64))),
], ids=["gap-bidirectional", "gap-near-the-start-causal", "gap-causal-block-64", "gap-near-the-start-block-64",
        "gap-to-the-end", "gap-to-the-end-causal-block-64"])
def test_triton_attention_rows_inside_a_gap(gap, causal, block, triton_paths):
    """float32 rows inside a gap of hidden keys in one batch row (L = 250, rates 0.3 and 4): the weights of the keys
    each side of the gap, in the row's window or beyond it, fall far below float32's range one by one, and the
    kernels keep the float64 reference, output and gradients, at every row: the states relative to the last visible
    key before them, the window's weights relative to the row's shift (`_pairs`). (The PyTorch path gives such rows
    nothing beyond their band, `ops_common.tails_above_floor`.)"""
    triton_paths(block)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, 250, 4, dtype=F64, generator=gen)
    k, v = (torch.randn(2, 2, 250, 4, dtype=F64, generator=gen) for _ in range(2))
    rel, decay = torch.randn(2, 7, 4, dtype=F64, generator=gen), torch.tensor([0.3, 4.0], dtype=F64)
    key_mask = torch.ones(2, 250, dtype=torch.long)
    key_mask[1, gap[0]:gap[1]] = 0
    args = [x.clone().requires_grad_() for x in (q, k, v, rel, decay)]
    expected = naive_local_softmax_decay_attention(*args, key_mask=key_mask, causal=causal)
    upstream = torch.randn(expected.shape, dtype=F64, generator=gen)
    expected_grads = torch.autograd.grad(expected, args, upstream)
    leaves = [x.detach().float().requires_grad_() for x in args]
    got = chunk_local_softmax_decay_attention(*leaves, key_mask=key_mask, causal=causal)
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-5)
    for name, g, e in zip("q k v rel decay".split(), torch.autograd.grad(got, leaves, upstream.float()),
                          expected_grads):
        atol = 1e-3 if name == "decay" else 1e-4 * max(1.0, float(e.abs().max()))
        torch.testing.assert_close(g.double(), e, rtol=1e-3, atol=atol, msg=lambda m: f"grad {name}: {m}")


@CAUSAL_BY_DEFAULT
def test_triton_attention_inputs_in_other_layouts(causal, triton_paths):
    """Queries sliced from a fused projection (B, L, 3 H D), keys expanded over the heads (stride 0) and values
    transposed from (B, L, H, D): the kernels write their gradients in layouts of their own, so that the gradients of
    the tensors behind them are the float64 reference's (blocks of 16, padded keys)."""
    gen = torch.Generator().manual_seed(0)
    b, heads, length, d = 2, 3, 40, 4
    fused = torch.randn(b, length, 3 * heads * d, dtype=F64, generator=gen).requires_grad_()
    shared_k = torch.randn(b, 1, length, d, dtype=F64, generator=gen).requires_grad_()
    rows_v = torch.randn(b, length, heads, d, dtype=F64, generator=gen).requires_grad_()
    rel = torch.randn(heads, 7, d, dtype=F64, generator=gen).requires_grad_()
    decay = torch.tensor([0.05, 0.2, 0.6], dtype=F64).requires_grad_()
    key_mask = torch.ones(b, length, dtype=torch.long)
    key_mask[1, -5:] = 0
    upstream = torch.randn(b, heads, length, d, dtype=F64, generator=gen)
    leaves = (fused, shared_k, rows_v, rel, decay)

    def inputs():
        q = fused[..., heads * d:2 * heads * d].view(b, length, heads, d).transpose(1, 2)
        return q, shared_k.expand(b, heads, length, d), rows_v.transpose(1, 2)

    q, k, _ = inputs()
    assert q.stride() != q.contiguous().stride() and k.stride(1) == 0
    expected = torch.autograd.grad(naive_local_softmax_decay_attention(*inputs(), rel, decay, causal=causal,
                                                                       key_mask=key_mask), leaves, upstream)
    used = triton_paths(16)
    got = torch.autograd.grad(chunk_local_softmax_decay_attention(*inputs(), rel, decay, causal=causal,
                                                                  key_mask=key_mask), leaves, upstream)
    assert used == {"local_softmax_decay"}
    for name, g, e in zip(("fused", "shared k", "v", "rel", "decay"), got, expected):
        torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-11, msg=lambda m: f"{name}: {m}")


@CAUSAL
def test_auto_mode_takes_the_kernels_at_any_length(causal, decay_inputs, triton_paths):
    """Where the kernels run, `mode="auto"` takes them even where the CPU's cost model picks the quadratic path (a few
    launches against dozens of small operations), with the reference's output."""
    from modeling_scaleformer.ops_decay import kernelized_decay_choose_mode
    from modeling_scaleformer.ops_local_softmax import local_softmax_decay_attention

    used = triton_paths()
    q, k, v, rel, decay, key_mask, horizon = decay_inputs(b=2, h=2, lq=6, lk=6, horizon=3, mask="padding")
    mode = kernelized_decay_choose_mode(6, 6, q.shape[-1], v.shape[-1], horizon, causal=causal, batch_heads=4)
    assert mode == "naive"
    got = local_softmax_decay_attention(q, k, v, rel, decay, causal=causal, key_mask=key_mask)
    assert used == {"local_softmax_decay"}
    torch.testing.assert_close(got, naive_local_softmax_decay_attention(q, k, v, rel, decay, causal=causal,
                                                                        key_mask=key_mask), rtol=1e-10, atol=1e-12)


def test_sizes_beyond_the_kernels_take_the_pytorch_path(monkeypatch):
    """The kernels take h <= 63 and D, Dv <= 64, 128 for 16-bit inputs (the tile sizes checked on a GPU); beyond,
    the op on CUDA picks the PyTorch path, saying so once per size, and the kernels' entry point refuses them by
    name."""
    from modeling_scaleformer.ops_local_softmax_triton import local_softmax_decay

    monkeypatch.setattr(ops_local_softmax, "_WARNED_PYTORCH_PATHS", set())
    cuda = torch.device("cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the kernels' sizes: no warning
        for sizes in ((63, 64, 64, torch.float32), (32, 64, 64, torch.float16),  # the base configuration's h = 32
                      (16, 128, 128, torch.bfloat16), (63, 100, 72, torch.bfloat16), (16, 128, 128, torch.float16),
                      (16, 64, 65, torch.float16)):
            assert ops_local_softmax._attention_function(cuda, *sizes).__name__ == "local_softmax_decay"
    for h, d, dv, dtype, limit in ((64, 64, 64, torch.float32, 64), (16, 65, 64, torch.float32, 64),
                                   (16, 128, 128, torch.float32, 64), (16, 129, 64, torch.bfloat16, 128),
                                   (16, 64, 129, torch.float16, 128)):
        expected = (r"the default attention \(local_softmax_decay\) runs its PyTorch path on cuda, not its Triton "
                    rf"kernels: its Triton kernels take h <= 63 and head dimensions D, Dv <= {limit} for {dtype}, "
                    rf"got h={h}, D={d}, Dv={dv}$")
        with pytest.warns(UserWarning, match=expected):
            assert ops_local_softmax._attention_function(cuda, h, d, dv, dtype) is None
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once per size
            assert ops_local_softmax._attention_function(cuda, h, d, dv, dtype) is None
    q = torch.zeros(1, 1, 4, 65)
    with pytest.raises(ValueError, match=r"h <= 63 and D, Dv <= 64 for torch.float32, got h=3, D=65, Dv=65"):
        local_softmax_decay(q, q, q, None, torch.zeros(1), causal=True, key_mask=None, query_offset=0, horizon=3)


# the kernels multiply 16-bit operands as they are; Triton's interpreter gets products of two bfloat16 tiles wrong
# (off by about 1e10 where float16's are right), so bfloat16 is tested on a GPU (test_triton_attention_on_cuda)
INTERPRETED_BF16 = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                                      reason="Triton's interpreter multiplies bfloat16 tiles wrongly")


@CAUSAL
@pytest.mark.parametrize("dtype, dims", [
    (torch.float32, (5, 4)), pytest.param(torch.bfloat16, (5, 4), marks=INTERPRETED_BF16), (torch.float16, (5, 4)),
    (torch.float16, (128, 128)),
], ids=["float32", "bfloat16", "float16", "float16-d128"])
def test_triton_attention_low_precision(dtype, dims, causal, decay_inputs, triton_paths):
    """Half precision accumulates in float32: the output and the gradients of q, k, v, the table and the decay rates
    within the precision of the inputs of the float64 reference (q, k, v, the features and the weights are
    multiplied in the inputs' dtype, on the tensor cores' 16-bit path); D = 128 in float16, tiles 128 wide."""
    used = triton_paths()
    q, k, v, rel, decay, key_mask, horizon = decay_inputs(b=1, h=2, lq=37, lk=37, d=dims[0], dv=dims[1], horizon=3,
                                                          mask="padding")
    args = [x.to(dtype).requires_grad_() for x in (q, k, v, rel, decay)]
    wide = [x.detach().to(F64).requires_grad_() for x in args]
    got = chunk_local_softmax_decay_attention(*args, causal=causal, key_mask=key_mask)
    assert got.dtype == dtype
    expected = naive_local_softmax_decay_attention(*wide, causal=causal, key_mask=key_mask)
    tol = {torch.float32: 1e-5, torch.bfloat16: 3e-2, torch.float16: 5e-3}[dtype]
    torch.testing.assert_close(got.to(F64), expected, rtol=tol, atol=tol)
    upstream = torch.randn(expected.shape, dtype=F64, generator=torch.Generator().manual_seed(1))
    for name, g, e in zip("q k v rel decay".split(), torch.autograd.grad(got, args, upstream.to(dtype)),
                          torch.autograd.grad(expected, wide, upstream)):
        assert g.dtype == dtype
        torch.testing.assert_close(g.to(F64), e, rtol=4 * tol, atol=4 * tol * max(1.0, float(e.abs().max())),
                                   msg=lambda m: f"grad {name}: {m}")
    assert used == {"local_softmax_decay"}


@pytest.mark.parametrize("case", [
    dict(horizon=3, table="per-head", mask=False), dict(horizon=2, table="shared", mask=True),
    dict(horizon=0, table=None, mask=True), dict(horizon=16, table="per-head", mask=True),
], ids=["h3", "shared-table-masked-token", "h0-no-table", "h16-more-than-the-prefix"])
def test_decode_step_against_pytorch(case, monkeypatch):
    """The one-token decoding kernel against the PyTorch step (float64): from a state after 10 tokens, 7 tokens one
    at a time (the fourth masked out where asked), outputs and states; and the outputs against the full causal
    sequence."""
    from modeling_scaleformer.ops_local_softmax import (local_softmax_decay_attention,
                                                        local_softmax_decay_prefill_state, local_softmax_decay_step)
    from modeling_scaleformer.ops_local_softmax_triton import decode_step

    h = case["horizon"]
    gen = torch.Generator().manual_seed(h)
    b, heads, length, d, dv = 2, 3, 17, 5, 4
    q, k, v = (torch.randn(b, heads, length, dim, dtype=F64, generator=gen) for dim in (d, d, dv))
    rel = {"per-head": torch.randn(heads, 2 * h + 1, d, dtype=F64, generator=gen),
           "shared": torch.randn(2 * h + 1, d, dtype=F64, generator=gen), None: None}[case["table"]]
    decay = torch.rand(heads, dtype=F64, generator=gen)
    key_mask = torch.ones(b, length, dtype=torch.long)
    if case["mask"]:
        key_mask[1, 13] = 0
    states = {}
    outs = {}
    for name, kernel in (("pytorch", None), ("triton", decode_step)):
        monkeypatch.setattr(ops_local_softmax, "_decode_function", lambda device: kernel)
        state = local_softmax_decay_prefill_state(k[:, :, :10], v[:, :, :10], decay, horizon=h,
                                                  key_mask=key_mask[:, :10])
        steps = []
        for t in range(10, length):
            out, state = local_softmax_decay_step(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], rel, decay,
                                                  state, key_mask=key_mask[:, t:t + 1], horizon=h)
            steps.append(out)
        outs[name], states[name] = torch.cat(steps, dim=2), state
    torch.testing.assert_close(outs["triton"], outs["pytorch"], rtol=1e-12, atol=1e-13)
    for field in ("keys", "values", "tail"):
        torch.testing.assert_close(getattr(states["triton"], field), getattr(states["pytorch"], field), rtol=1e-12,
                                   atol=1e-13, msg=lambda m: f"{field}: {m}")
    assert states["triton"].seen == length
    full = local_softmax_decay_attention(q, k, v, rel, decay, causal=True, key_mask=key_mask, horizon=h, mode="naive")
    torch.testing.assert_close(outs["triton"], full[:, :, 10:], rtol=1e-10, atol=1e-12)


def test_decode_step_keeps_autograd_on_pytorch(monkeypatch):
    """A step whose inputs need gradients runs in PyTorch (the kernel has no backward), as do steps of several
    tokens."""
    from modeling_scaleformer.ops_local_softmax import local_softmax_decay_initial_state, local_softmax_decay_step

    def refuse(*args):
        raise AssertionError("the kernel ran")

    monkeypatch.setattr(ops_local_softmax, "_decode_function", lambda device: refuse)
    q, k, v = (torch.randn(1, 2, 1, 4, dtype=F64) for _ in range(3))
    rel, decay = torch.randn(2, 5, 4, dtype=F64), torch.rand(2, dtype=F64)
    state = local_softmax_decay_initial_state(1, 2, 4, 4, 2, dtype=F64)
    out, _ = local_softmax_decay_step(q.requires_grad_(), k, v, rel, decay, state)
    out.sum().backward()
    assert q.grad is not None
    with torch.no_grad():
        q2, k2, v2 = (torch.randn(1, 2, 3, 4, dtype=F64) for _ in range(3))
        local_softmax_decay_step(q2, k2, v2, rel, decay, state)
        with pytest.raises(AssertionError, match="the kernel ran"):
            local_softmax_decay_step(q2[:, :, :1], k2[:, :, :1], v2[:, :, :1], rel, decay, state)


@pytest.mark.parametrize("case", [
    dict(lq=3, lk=50, horizon=3, offset=20, table="per-head", mask=True),
    dict(lq=2, lk=40, horizon=2, offset=0, table="shared", mask=False),
    dict(lq=1, lk=9, horizon=16, offset=4, table="per-head", mask=True),
    dict(lq=2, lk=30, horizon=0, offset=35, table=None, mask=True),
], ids=["middle-masked", "band-at-the-start", "band-wider-than-the-keys", "h0-queries-past-the-keys"])
def test_cross_decode_against_pytorch(case, monkeypatch):
    """The cross-attention decoding kernel against the PyTorch step (float64), keys in blocks of 16: queries at
    offsets whose band lies inside, at the edge of and wider than the keys, past them, with hidden keys."""
    from modeling_scaleformer import ops_local_softmax_triton
    from modeling_scaleformer.ops_decay import kernelized_decay_cross_summary
    from modeling_scaleformer.ops_local_softmax import local_softmax_decay_cross_step
    from modeling_scaleformer.ops_local_softmax_triton import cross_decode

    monkeypatch.setattr(ops_local_softmax_triton, "CROSS_BLOCK_N", 16)
    h, lq, lk = case["horizon"], case["lq"], case["lk"]
    gen = torch.Generator().manual_seed(lk)
    b, heads, d, dv = 2, 3, 5, 4
    q = torch.randn(b, heads, lq, d, dtype=F64, generator=gen)
    k, v = (torch.randn(b, heads, lk, dim, dtype=F64, generator=gen) for dim in (d, dv))
    rel = {"per-head": torch.randn(heads, 2 * h + 1, d, dtype=F64, generator=gen),
           "shared": torch.randn(2 * h + 1, d, dtype=F64, generator=gen), None: None}[case["table"]]
    decay = torch.rand(heads, dtype=F64, generator=gen)
    key_mask = torch.ones(b, lk, dtype=torch.long)
    if case["mask"]:
        key_mask[1, -5:] = 0
        key_mask[0, case["offset"] % lk] = 0
    summary = kernelized_decay_cross_summary(k, v, key_mask=key_mask)
    outs = []
    for kernel in (cross_decode, None):
        monkeypatch.setattr(ops_local_softmax, "_cross_decode_function", lambda device: kernel)
        outs.append(local_softmax_decay_cross_step(q, rel, decay, summary, query_offset=case["offset"], horizon=h))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-12, atol=1e-13)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@CAUSAL
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_attention_on_cuda(causal, dtype, monkeypatch):
    """Real shapes on the GPU (B=2, H=8, L=4096, D=64, h=16, padded keys and a hidden stretch): the kernels the op
    picks on CUDA against the PyTorch path on the same device, outputs and the gradients of q, k, v, the table and
    the decay rates."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 8, 4096, 64, device="cuda", generator=gen).to(dtype) for _ in range(3))
    rel = (0.1 * torch.randn(8, 33, 64, device="cuda", generator=gen)).to(dtype)
    decay = torch.linspace(0.01, 0.3, 8, device="cuda").to(dtype)
    key_mask = torch.ones(2, 4096, device="cuda", dtype=torch.long)
    key_mask[1, -128:] = 0
    key_mask[0, 1000:1064] = 0
    kernels = ops_local_softmax._attention_function(q.device, 16, 64, 64, dtype)
    assert kernels is not None and kernels.__name__ == "local_softmax_decay"
    outs, grads = [], []
    for choice in (kernels, None):
        monkeypatch.setattr(ops_local_softmax, "_attention_function", lambda *args: choice)
        leaves = [x.clone().requires_grad_() for x in (q, k, v, rel, decay)]
        out = chunk_local_softmax_decay_attention(*leaves, causal=causal, key_mask=key_mask)
        out.float().square().sum().backward()
        outs.append(out.float())
        grads.append([x.grad.float() for x in leaves])
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(outs[0], outs[1], rtol=tol, atol=tol)
    for name, g, e in zip("q k v rel decay".split(), *grads):
        torch.testing.assert_close(g, e, rtol=tol, atol=tol * max(1.0, float(e.abs().max())),
                                   msg=lambda m: f"{name}: {m}")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", [
    dict(lq=200, lk=200, d=8, h=3), dict(lq=200, lk=200, d=8, h=3, causal=True), dict(lq=40, lk=200, d=8, h=3),
    dict(lq=200, lk=40, d=8, h=3), dict(lq=200, lk=200, d=32, h=3), dict(lq=130, lk=130, d=64, h=16, causal=True),
    dict(lq=300, lk=300, d=64, h=31), dict(lq=150, lk=150, d=48, h=0), dict(lq=300, lk=300, d=64, h=32),
    dict(lq=300, lk=300, d=64, h=32, causal=True), dict(lq=300, lk=200, d=64, h=63),
    dict(lq=200, lk=200, d=128, h=16, dtype=torch.bfloat16),
    dict(lq=200, lk=200, d=128, h=16, causal=True, dtype=torch.bfloat16),
    dict(lq=200, lk=200, d=128, h=16, dtype=torch.float16),
    dict(lq=200, lk=200, d=128, h=16, causal=True, dtype=torch.float16),
], ids=["d8-h3", "d8-h3-causal", "lq<lk", "lq>lk", "d32-h3", "d64-h16-causal", "h31", "d48-h0", "h32", "h32-causal",
        "h63-lq>lk", "d128-bf16", "d128-bf16-causal", "d128-fp16", "d128-fp16-causal"])
def test_triton_attention_shapes_on_cuda(case):
    """The kernels at the sizes the models use (head dimensions 8 to 64, 128 in 16-bit dtypes, h 0 to 63, the base
    configuration's 32 among them: every size `fits` takes pads to the tiles of these), Lq != Lk, padded keys, against
    the float64 reference on the device, output and gradients, float32 unless said."""
    check_against_the_reference_on_cuda(case)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", [
    dict(lq=300, lk=300, d=64, h=16, causal=True, rows=32), dict(lq=300, lk=200, d=64, h=16, causal=True, rows=32),
    dict(lq=300, lk=300, d=64, h=16, causal=True, dtype=torch.bfloat16, rows=32),
    dict(lq=200, lk=200, d=8, h=3, causal=True, rows=16), dict(lq=300, lk=300, d=64, h=31, causal=True, rows=32),
    dict(lq=300, lk=300, d=64, h=16, causal=True, edge=True, rows=16),
    dict(lq=300, lk=300, d=64, h=16, edge=True, rows=32),
    dict(lq=300, lk=300, d=64, h=16, edge=True, dtype=torch.bfloat16, rows=32),
    dict(lq=300, lk=200, d=64, h=32, edge=True, rows=64), dict(lq=200, lk=200, d=32, h=8, edge=True, rows=16),
], ids=["h16-causal", "h16-causal-lq>lk", "h16-causal-bf16", "d8-h3-causal", "h31-causal", "h16-causal-edge",
        "h16-edge", "h16-edge-bf16", "h32-edge-lq>lk", "d32-h8-edge"])
def test_narrow_table_tiles_on_cuda(case, monkeypatch):
    """The table in tiles narrower than the 64 rows of `MIN_TILE` (`MIN_TABLE_TILE` = 16: 32 rows for the h+1 the
    causal band reads at h = 16 and h = 31, 16 at h = 3), and with the band's last row apart (`EDGE_APART`: 16 rows
    and one causal at h = 16, 32 and one bidirectional, 64 and one at h = 32, 16 and one at h = 8): against the
    float64 reference on the device, output and gradients, float32 unless said. Their passes are what those
    settings wait for to be the default."""
    from modeling_scaleformer import ops_local_softmax_triton as kernels

    case = dict(case)
    monkeypatch.setattr(kernels, "MIN_TABLE_TILE", 16)
    monkeypatch.setattr(kernels, "EDGE_APART", case.pop("edge", False))
    assert kernels._sizes(case["h"], case["d"], case["d"], case.get("causal", False))["BLOCK_R"] == case.pop("rows")
    check_against_the_reference_on_cuda(case)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", [
    dict(lq=300, lk=300, d=64, h=16), dict(lq=300, lk=300, d=64, h=16, causal=True),
    dict(lq=300, lk=200, d=64, h=16, causal=True), dict(lq=200, lk=300, d=64, h=16),
    dict(lq=300, lk=300, d=64, h=16, dtype=torch.bfloat16),
    dict(lq=300, lk=300, d=64, h=16, causal=True, dtype=torch.bfloat16),
    dict(lq=200, lk=200, d=128, h=16, causal=True, dtype=torch.bfloat16), dict(lq=200, lk=200, d=8, h=3),
    dict(lq=300, lk=300, d=64, h=63, causal=True),
    dict(lq=300, lk=300, d=64, h=16, key_block=16), dict(lq=300, lk=200, d=64, h=16, causal=True, key_block=16),
], ids=["h16", "h16-causal", "h16-causal-lq>lk", "h16-lq<lk", "h16-bf16", "h16-causal-bf16", "d128-causal-bf16",
        "d8-h3", "h63-causal", "h16-key-blocks-of-16", "h16-causal-lq>lk-key-blocks-of-16"])
def test_stored_pairs_on_cuda(case, monkeypatch):
    """`_backward_keys` reading the window's pairs that `_backward_queries` stored (`STORED_PAIRS`): against the
    float64 reference on the device, output and gradients, float32 unless said, and with 16 keys a program of
    `_backward_keys` (KEY_BLOCK). Its passes are what the setting waits for to be the default."""
    from modeling_scaleformer import ops_local_softmax_triton as kernels

    monkeypatch.setattr(kernels, "STORED_PAIRS", True)
    monkeypatch.setattr(kernels, "KEY_BLOCK", case.pop("key_block", kernels.KEY_BLOCK))
    check_against_the_reference_on_cuda(case)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", [
    dict(lq=200, lk=200, d=128, h=16), dict(lq=200, lk=200, d=128, h=16, causal=True),
], ids=["d128", "d128-causal"])
@pytest.mark.xfail(strict=True, reason="D = 128 is not in MAX_DIM (64) for float32")
def test_triton_attention_beyond_fits_on_cuda(case, monkeypatch):
    """The size `fits` does not take in float32, D = 128, with its limit lifted: as
    `test_triton_attention_shapes_on_cuda`. `_backward_keys` asks for more shared memory than sm90 has (294,912 bytes
    of 232,448 at one stage). Expected to fail (strict: a case that passes says MAX_DIM can go up)."""
    from modeling_scaleformer import ops_local_softmax_triton

    monkeypatch.setattr(ops_local_softmax_triton, "MAX_DIM", 128)
    check_against_the_reference_on_cuda(case)


def check_against_the_reference_on_cuda(case: dict) -> None:
    """The kernels for `case` (lq, lk, d, h, causal, dtype: B=3, H=2, float32 unless said, padded keys in one row)
    against the float64 reference on the device, output and the gradients of q, k, v, the table and the decay
    rates: within 1e-4 in float32, within 3e-2 of the reference's largest magnitude in 16-bit dtypes."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    lq, lk, d, h = case["lq"], case["lk"], case["d"], case["h"]
    dtype = case.get("dtype", torch.float32)
    q = torch.randn(3, 2, lq, d, device="cuda", generator=gen)
    k, v = (torch.randn(3, 2, lk, d, device="cuda", generator=gen) for _ in range(2))
    rel = 0.1 * torch.randn(2, 2 * h + 1, d, device="cuda", generator=gen)
    key_mask = torch.ones(3, lk, device="cuda", dtype=torch.long)
    key_mask[2, -lk // 5:] = 0
    args = [x.to(dtype).requires_grad_() for x in (q, k, v, rel, torch.tensor([0.05, 0.3], device="cuda"))]
    wide = [x.detach().double().requires_grad_() for x in args]
    causal = case.get("causal", False)

    def close(got, expected, name):
        if dtype == torch.float32:
            scale = 1.0 if name == "out" else max(1.0, float(expected.abs().max()))
            tolerance = dict(rtol=1e-4, atol=1e-4 * scale)
        else:
            tolerance = dict(rtol=0, atol=3e-2 * float(expected.abs().max()))
        torch.testing.assert_close(got.double(), expected, **tolerance, msg=lambda m: f"{name}: {m}")

    assert ops_local_softmax._attention_function(q.device, h, d, d, dtype).__name__ == "local_softmax_decay"
    got = chunk_local_softmax_decay_attention(*args, causal=causal, key_mask=key_mask)
    expected = naive_local_softmax_decay_attention(*wide, causal=causal, key_mask=key_mask)
    close(got, expected, "out")
    upstream = torch.randn(expected.shape, device="cuda", dtype=F64, generator=gen)
    for name, g, e in zip("q k v rel decay".split(), torch.autograd.grad(got, args, upstream.to(dtype)),
                          torch.autograd.grad(expected, wide, upstream)):
        close(g, e, f"grad {name}")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("walks", ["parallel", "sequential"])
def test_triton_attention_rows_beyond_the_keys_on_cuda(beyond_the_keys_case, beyond_the_keys_inputs, walks,
                                                       monkeypatch):
    """`test_triton_attention_rows_beyond_the_keys` on the device, in float32 with the kernels' own blocks (a window's
    keys up to 63 positions beyond a row's band, e^-252 at rate 4): every row keeps the float64 reference, output and
    gradients."""
    from modeling_scaleformer import ops_local_softmax_triton as kernels

    monkeypatch.setattr(kernels, "PARALLEL_WALKS", walks == "parallel")
    monkeypatch.setattr(ops_local_softmax, "_rows_beyond_the_keys", lambda *args, **kwargs: pytest.fail("called"))
    args, kwargs, _ = beyond_the_keys_inputs(beyond_the_keys_case)
    args = [x.detach().cuda().requires_grad_() for x in args]
    if kwargs["key_mask"] is not None:
        kwargs["key_mask"] = kwargs["key_mask"].cuda()
    expected = naive_local_softmax_decay_attention(*args, **kwargs)
    upstream = torch.randn(expected.shape, dtype=F64, generator=torch.Generator().manual_seed(1)).cuda()
    expected_grads = torch.autograd.grad(expected, args, upstream)
    leaves = [x.detach().float().requires_grad_() for x in args]
    got = chunk_local_softmax_decay_attention(*leaves, **kwargs)
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-5)
    for name, g, e in zip("q k v rel decay".split(), torch.autograd.grad(got, leaves, upstream.float()),
                          expected_grads):
        # lambda's gradient sums terms up to 300 positions times their weights, which cancel (a row with one visible
        # key does not depend on lambda): float32 leaves about 1e-4 of them
        atol = 1e-3 if name == "decay" else 1e-4 * max(1.0, float(e.abs().max()))
        torch.testing.assert_close(g.double(), e, rtol=1e-3, atol=atol, msg=lambda m: f"grad {name}: {m}")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_parallel_walks_on_cuda(monkeypatch):
    """Real shapes on the GPU (B=2, H=8, L=4096, D=64, h=16, bf16, bidirectional, padded keys): the parallel walks
    (`PARALLEL_WALKS`) give the sequential walks' output and gradients, so that timing one against the other
    (`bench_attention_gpu.py --parallel-walks`) compares the same computation."""
    from modeling_scaleformer import ops_local_softmax_triton

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 8, 4096, 64, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(3))
    rel = (0.1 * torch.randn(8, 33, 64, device="cuda", generator=gen)).to(torch.bfloat16)
    decay = torch.linspace(0.01, 0.3, 8, device="cuda").to(torch.bfloat16)
    key_mask = torch.ones(2, 4096, device="cuda", dtype=torch.long)
    key_mask[1, -100:] = 0
    results = []
    for parallel in (True, False):
        monkeypatch.setattr(ops_local_softmax_triton, "PARALLEL_WALKS", parallel)
        leaves = [x.clone().requires_grad_() for x in (q, k, v, rel, decay)]
        out = chunk_local_softmax_decay_attention(*leaves, key_mask=key_mask)
        grads = torch.autograd.grad(out.float().square().sum(), leaves)
        results.append([out.detach().float()] + [g.float() for g in grads])
    for name, got, expected in zip("out q k v rel decay".split(), *results):
        torch.testing.assert_close(got, expected, rtol=1e-2, atol=1e-2 * max(1.0, float(expected.abs().max())),
                                   msg=lambda m: f"{name}: {m}")


def test_cross_decode_far_past_the_keys(monkeypatch):
    """float32 queries 100 to 600 positions past a 20-key source (rates 0.25 and 0.02): each weight beyond the band
    falls below float32's range from about 350 positions on, while the row, a ratio, does not; the kernel sums the
    weights relative to the nearest key's decay and keeps the float64 PyTorch step's output, as that step now does
    in float32 (`naive_local_softmax_decay_weights`)."""
    from modeling_scaleformer.ops_decay import kernelized_decay_cross_summary
    from modeling_scaleformer.ops_local_softmax import local_softmax_decay_cross_step
    from modeling_scaleformer.ops_local_softmax_triton import cross_decode

    gen = torch.Generator().manual_seed(0)
    k, v = (torch.randn(1, 2, 20, 8, dtype=F64, generator=gen) for _ in range(2))
    rel, decay = 0.1 * torch.randn(2, 7, 8, dtype=F64, generator=gen), torch.tensor([0.25, 0.02], dtype=F64)
    for offset in (100, 380, 600):
        q = torch.randn(1, 2, 2, 8, dtype=F64, generator=gen)
        expected = local_softmax_decay_cross_step(q, rel, decay, kernelized_decay_cross_summary(k, v),
                                                  query_offset=offset, horizon=3)
        for kernel in (cross_decode, None):
            monkeypatch.setattr(ops_local_softmax, "_cross_decode_function", lambda device: kernel)
            got = local_softmax_decay_cross_step(q.float(), rel.float(), decay.float(),
                                                 kernelized_decay_cross_summary(k.float(), v.float()),
                                                 query_offset=offset, horizon=3)
            torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-5,
                                       msg=lambda m: f"offset {offset}, {'kernel' if kernel else 'pytorch'}: {m}")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_decode_step_on_cuda(monkeypatch):
    """Real shapes on the GPU (B=4, H=16, D=64, h=16, 300 tokens of prefix): 32 decoding steps by the kernel the
    step picks on CUDA against the PyTorch step on the same device, outputs and states."""
    from modeling_scaleformer.ops_local_softmax import local_softmax_decay_prefill_state, local_softmax_decay_step
    from modeling_scaleformer.ops_local_softmax_triton import decode_step

    assert ops_local_softmax._decode_function(torch.device("cuda")) is decode_step
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(4, 16, 332, 64, device="cuda", generator=gen) for _ in range(3))
    rel = 0.1 * torch.randn(16, 33, 64, device="cuda", generator=gen)
    decay = torch.full((16,), 0.1, device="cuda")
    results = []
    for kernel in (decode_step, None):
        monkeypatch.setattr(ops_local_softmax, "_decode_function", lambda device: kernel)
        state = local_softmax_decay_prefill_state(k[:, :, :300], v[:, :, :300], decay, horizon=16)
        outs = []
        for t in range(300, 332):
            out, state = local_softmax_decay_step(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], rel, decay,
                                                  state)
            outs.append(out)
        results.append((torch.cat(outs, 2), state))
    (got, got_state), (expected, expected_state) = results
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_state.tail, expected_state.tail, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got_state.keys, expected_state.keys, rtol=0, atol=0)

