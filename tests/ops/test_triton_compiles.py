"""The Triton kernels go through Triton's front end for a CUDA target (sm90) on any machine: the interpreter runs
the kernels as Python and accepts programs that the compiler rejects (a loop-carried value whose type changes in
the loop, among others), so each kernel is also lowered to Triton IR here, with the block sizes and dtypes the
host code picks."""

import inspect
import os

import pytest
import torch


if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("the interpreter replaces the compiler", allow_module_level=True)
triton = pytest.importorskip("triton")
pytest.importorskip("numpy")

from modeling_scaleformer import ops_decay_triton, ops_local_softmax_triton  # noqa: E402


POINTER = {torch.float32: "*fp32", torch.float64: "*fp64", torch.bfloat16: "*bf16", torch.float16: "*fp16"}
# the arguments in the op's input dtype (the others are in the compute dtype): the queries and keys of the tails'
# kernels
OPERANDS = ("X", "Y", "DX", "DY")


def source(kernel, dtype: torch.dtype, operands: torch.dtype | None = None, operand_names=OPERANDS, **constexprs):
    """`kernel` as Triton's compiler takes it, with its tensor arguments (upper-case names) of `dtype` (those of
    `operand_names` of `operands` when given), `scale` a float, the other arguments 32-bit ints and `constexprs`
    fixed (every constexpr of the kernel must be given)."""
    from triton.compiler import ASTSource

    parameters = inspect.signature(kernel.fn).parameters
    names = list(parameters)
    missing = {name for name, p in parameters.items() if "constexpr" in str(p.annotation)} - set(constexprs)
    assert not missing, f"{kernel.fn.__name__}: no value for the constexprs {sorted(missing)}"
    pointers = {name: POINTER[operands if operands is not None and name in operand_names else dtype]
                for name in names}
    signature = {name: "constexpr" if name in constexprs else pointers[name] if name.isupper() else
                 "fp32" if name == "scale" else "i32" for name in names}
    return ASTSource(fn=kernel, signature=signature,
                     constexprs={(names.index(name),): value for name, value in constexprs.items()})


def lower(kernel, dtype: torch.dtype, operands: torch.dtype | None = None, operand_names=OPERANDS,
          **constexprs) -> None:
    """Lower `kernel` (`source`) to Triton IR for sm90."""
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    options = backend.parse_options({})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    source(kernel, dtype, operands, operand_names, **constexprs).make_ir(
        target, options, backend.get_codegen_implementation(options), backend.get_module_map(), context)


DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
# (E, Dv): the default attention's tails where its own kernels do not run (64, 65), kernelized_decay's with its
# relative column (65, 64), small heads, and widths over one block of the state kernels
TAIL_SHAPES = [(64, 65), (65, 64), (8, 9), (129, 200)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16],
                         ids=["float32", "float64", "bfloat16-operands", "float16-operands"])
@pytest.mark.parametrize("shape", TAIL_SHAPES, ids=lambda s: f"E{s[0]}-Dv{s[1]}")
def test_tail_kernels_lower(shape, dtype):
    """The tails' kernels with the block sizes and dtypes of the host code: queries and keys in the inputs' dtype
    (16-bit ones included) beside float32 values, states and gradients."""
    e, dv = shape
    half = dtype in (torch.bfloat16, torch.float16)
    dot = ops_decay_triton.dot_precision(dtype, half_inputs=half)
    kernel_dtype, operands = (torch.float32, dtype) if half else (dtype, None)
    block = ops_decay_triton._block
    be, bv = block(e, ops_decay_triton.STATE_BLOCK_E), block(dv, ops_decay_triton.STATE_BLOCK_V)
    common = dict(T=ops_decay_triton.CHUNK, BV=bv, DOT=dot)
    lower(ops_decay_triton._states_forward, kernel_dtype, operands, HAS_INITIAL=True, BE=be, **common)
    lower(ops_decay_triton._states_forward, kernel_dtype, operands, HAS_INITIAL=False, BE=be, **common)
    lower(ops_decay_triton._output_forward, kernel_dtype, operands, BE=be, **common)
    lower(ops_decay_triton._states_backward, kernel_dtype, operands, BE=be, **common)
    lower(ops_decay_triton._grad_xy, kernel_dtype, operands, BE=block(e, ops_decay_triton.MAX_DIM), **common)
    lower(ops_decay_triton._grad_v, kernel_dtype, operands, BE=be, **common)


ATTENTION_SHAPES = {"h16-d64": (16, 64, 64), "h3-d8": (3, 8, 8), "h0": (0, 64, 64), "h31-dv50": (31, 64, 50),
                    "h32-d128": (32, 128, 128)}
ATTENTION_OPTIONS = {"table-and-mask": dict(HAS_TABLE=True, HAS_MASK=True),
                     "neither": dict(HAS_TABLE=False, HAS_MASK=False)}
ATTENTION_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
                    "float16": torch.float16}
# the default run: each shape with the table and the mask in one direction and with neither in the other, the dtypes
# in turn (every shape, option set, direction and dtype, in 10 of their 80 combinations); all 80 with `-m slow`
DEFAULT_LOWERINGS = {"h16-d64-table-and-mask-causal-bfloat16", "h16-d64-neither-bidirectional-float32",
                     "h3-d8-table-and-mask-bidirectional-float64", "h3-d8-neither-causal-float16",
                     "h0-table-and-mask-causal-float32", "h0-neither-bidirectional-bfloat16",
                     "h31-dv50-table-and-mask-bidirectional-float16", "h31-dv50-neither-causal-float64",
                     "h32-d128-table-and-mask-causal-float16", "h32-d128-neither-bidirectional-bfloat16"}


@pytest.mark.parametrize("shape, options, causal, dtype", [
    pytest.param(shape, options, causal, dtype, id=name, marks=() if name in DEFAULT_LOWERINGS else pytest.mark.slow)
    for shape_name, shape in ATTENTION_SHAPES.items() for options_name, options in ATTENTION_OPTIONS.items()
    for causal, direction in ((False, "bidirectional"), (True, "causal"))
    for dtype_name, dtype in ATTENTION_DTYPES.items()
    for name in [f"{shape_name}-{options_name}-{direction}-{dtype_name}"]
])
def test_attention_kernels_lower(shape, options, causal, dtype, monkeypatch):
    """The kernels of the default attention with the host's block sizes: q, k, v, the table and the outputs in the
    inputs' dtype (16-bit ones included) beside the compute dtype's states, shifts and normalisers; the window
    kernels with and without a narrower last tile (`TAIL_TILES`), and the backward ones storing and reading the
    window's pairs (`STORED_PAIRS`)."""
    horizon, d, dv = shape
    kernels = ops_local_softmax_triton
    half = dtype in (torch.bfloat16, torch.float16)
    kernel_dtype, operands = (torch.float32, dtype) if half else (dtype, None)
    sizes = kernels._sizes(horizon, d, dv, causal)
    common = dict(HORIZON=horizon, HAS_MASK=options["HAS_MASK"], BLOCK=sizes["BLOCK"], BLOCK_D=sizes["BLOCK_D"],
                  BLOCK_V=sizes["BLOCK_V"], DOT=ops_decay_triton.dot_precision(kernel_dtype, half_inputs=half))
    lower(kernels._states, kernel_dtype, operands, operand_names=kernels.INPUT_POINTERS, **common)
    lower(kernels._chunk_sums, kernel_dtype, operands, operand_names=kernels.INPUT_POINTERS, **common)
    for products, recurrence in ((False, False), (True, False), (False, True)):  # `_scan_sums`, `_scan_products`
        monkeypatch.setattr(kernels, "SCAN_PRODUCTS", products)  # (SCAN_PRODUCTS), `_scan_recurrence`
        monkeypatch.setattr(kernels, "SCAN_RECURRENCE", recurrence)  # (SCAN_RECURRENCE)
        scan, _, step, _ = kernels._scan(d, dv, kernel_dtype)
        for reverse in (False, True):
            lower(scan, kernel_dtype, REVERSE=reverse, BLOCK=sizes["BLOCK"], BLOCK_V=sizes["BLOCK_V"], **step)
    lower(kernels._row_terms, kernel_dtype, operands, operand_names=kernels.INPUT_POINTERS, BLOCK=sizes["BLOCK"],
          BLOCK_D=sizes["BLOCK_D"], BLOCK_V=sizes["BLOCK_V"])
    for kernel, fold in ((kernels._query_sums, dict(FOLD=kernels.FOLD_SLOTS)), (kernels._states_backward, {})):
        lower(kernel, kernel_dtype, operands, operand_names=kernels.INPUT_POINTERS,
              **{key: common[key] for key in ("BLOCK", "BLOCK_D", "BLOCK_V", "DOT")}, **fold)
    for kernel in (kernels._forward, kernels._backward_queries):
        name = kernel.fn.__name__
        monkeypatch.setattr(kernels, "TAIL_TILES", ())
        whole = kernels._window_tiles(name, horizon, causal)
        monkeypatch.setattr(kernels, "TAIL_TILES", (name,))
        tail = kernels._window_tiles(name, horizon, causal)
        pairs = {} if kernel is kernels._forward else dict(STORED_PAIRS=False)
        for window in [whole] + [tail] * (tail != whole):  # and with a narrower last tile where the window has one
            lower(kernel, kernel_dtype, operands, operand_names=kernels.INPUT_POINTERS, CAUSAL=causal, **options,
                  **sizes, **window, **pairs, **{key: common[key] for key in ("HORIZON", "DOT")})
    for stored in (False, True):  # `_backward_keys` forming the pairs, and reading those stored (`STORED_PAIRS`)
        lower(kernels._backward_keys, kernel_dtype, operands, operand_names=kernels.INPUT_POINTERS, CAUSAL=causal,
              HAS_TABLE=options["HAS_TABLE"], STORED_PAIRS=stored, **kernels._key_blocks(),
              BLOCK_R=sizes["BLOCK_R"], **common)
    lower(kernels._backward_queries, kernel_dtype, operands, operand_names=kernels.INPUT_POINTERS, CAUSAL=causal,
          STORED_PAIRS=True, **options, **sizes, **kernels._window_tiles("_backward_queries", horizon, causal),
          **{key: common[key] for key in ("HORIZON", "DOT")})


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("table", [dict(MIN_TABLE_TILE=32), dict(MIN_TABLE_TILE=16, EDGE_APART=True)],
                         ids=["tiles-of-32", "last-row-apart"])
def test_window_kernels_lower_with_narrower_table_tiles(table, causal, monkeypatch):
    """The window kernels, bf16 at h = 16, with the relative table in the narrower tiles of `MIN_TABLE_TILE` and
    `EDGE_APART` (32 rows causal, 64 bidirectional; 16 rows and one causal, 32 and one bidirectional)."""
    kernels = ops_local_softmax_triton
    for name, value in table.items():
        monkeypatch.setattr(kernels, name, value)
    sizes = kernels._sizes(16, 64, 64, causal)
    assert sizes["BLOCK_R"] == {(32, False): 64, (32, True): 32, (16, False): 32, (16, True): 16}[
        table["MIN_TABLE_TILE"], causal]
    flags = dict(HORIZON=16, CAUSAL=causal, HAS_MASK=True, HAS_TABLE=True, DOT="tf32")
    for name in ("_forward", "_backward_queries"):
        lower(getattr(kernels, name), torch.float32, torch.bfloat16, operand_names=kernels.INPUT_POINTERS, **flags,
              **sizes, **kernels._window_tiles(name, 16, causal), **({} if name == "_forward" else
                                                                    dict(STORED_PAIRS=False)))
    lower(kernels._backward_keys, torch.float32, torch.bfloat16, operand_names=kernels.INPUT_POINTERS, **flags,
          STORED_PAIRS=False, BLOCK=sizes["BLOCK"], **kernels._key_blocks(), BLOCK_D=sizes["BLOCK_D"],
          BLOCK_V=sizes["BLOCK_V"], BLOCK_R=sizes["BLOCK_R"])


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_attention_kernels_assemble_for_sm90(causal, monkeypatch):
    """The default attention's kernels through every stage of Triton's compiler and ptxas for sm90, bf16, with the
    host's block sizes and launch options: stages after Triton IR reject programs the lowering accepts (layouts,
    shared memory), and the kernels must fit an H100's 227 KiB of shared memory per block; causal, the window kernels
    also with a narrower last tile (`TAIL_TILES`: 80 keys in tiles of 32, 32 and 16); the backward kernels also
    storing and reading the window's pairs (`STORED_PAIRS`)."""
    import triton
    from triton.backends.compiler import GPUTarget

    kernels = ops_local_softmax_triton
    sizes = kernels._sizes(16, 64, 64, causal)
    walk = dict(HORIZON=16, HAS_MASK=True, BLOCK=sizes["BLOCK"], BLOCK_D=sizes["BLOCK_D"], BLOCK_V=sizes["BLOCK_V"],
                DOT="tf32")
    tiles = dict(sizes, HORIZON=16, CAUSAL=causal, HAS_MASK=True, HAS_TABLE=True, DOT="tf32")
    scan = dict(BLOCK=sizes["BLOCK"], BLOCK_SD=kernels.SCAN_ROWS, BLOCK_V=sizes["BLOCK_V"], SLOTS=kernels.SCAN_SLOTS,
                FOLD=kernels.FOLD_SLOTS)
    queries = {key: walk[key] for key in ("BLOCK", "BLOCK_D", "BLOCK_V", "DOT")}
    monkeypatch.setattr(kernels, "TAIL_TILES", ())
    window = {name: kernels._window_tiles(name, 16, causal) for name in ("_forward", "_backward_queries")}
    monkeypatch.setattr(kernels, "TAIL_TILES", ("_forward", "_backward_queries"))
    tails = [(name, dict(tiles, **kernels._window_tiles(name, 16, causal),
                         **({} if name == "_forward" else dict(STORED_PAIRS=False)))) for name in window if causal]
    assert all(constexprs["TAIL"] == 16 for _, constexprs in tails)
    products = dict(scan, BLOCK_SD=kernels.PRODUCT_ROWS, SLOTS=kernels.PRODUCT_SLOTS, DOT="tf32x3")
    for name, constexprs in (("_states", walk), ("_chunk_sums", walk),
                             *((name, dict(step, REVERSE=reverse)) for reverse in (False, True)
                               for name, step in (("_scan_sums", scan), ("_scan_products", products),
                                                  ("_scan_recurrence", dict(scan, SLOTS=kernels.RECURRENCE_SLOTS)))),
                             ("_row_terms", dict(BLOCK=sizes["BLOCK"], BLOCK_D=sizes["BLOCK_D"], BLOCK_V=sizes["BLOCK_V"])),
                             ("_query_sums", dict(queries, FOLD=kernels.FOLD_SLOTS)), ("_states_backward", queries),
                             ("_forward", dict(tiles, **window["_forward"])),
                             *(("_backward_queries", dict(tiles, **window["_backward_queries"], STORED_PAIRS=stored))
                               for stored in (False, True)), *tails,
                             *(("_backward_keys", dict(walk, CAUSAL=causal, HAS_TABLE=True, STORED_PAIRS=stored,
                                                       **kernels._key_blocks(), BLOCK_R=sizes["BLOCK_R"]))
                               for stored in (False, True))):
        compiled = triton.compile(source(getattr(kernels, name), torch.float32, torch.bfloat16,
                                         kernels.INPUT_POINTERS, **constexprs),
                                  target=GPUTarget("cuda", 90, 32), options=kernels.LAUNCH[name])
        assert compiled.asm["cubin"], name
        assert compiled.metadata.shared <= 227 * 1024, (name, compiled.metadata.shared)


@pytest.mark.parametrize("stored", [False, True], ids=["pairs-formed", "pairs-stored"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_window_kernels_lower_with_lengths_of_1(causal, stored):
    """The window kernels with every length argument (`LENGTH_ARGUMENTS`) 1: Triton makes an integer argument that
    is 1 a constexpr (batch 1 and one head make rows 1, one block makes nq 1), on which a kernel cannot call tensor
    methods such as `.to`; with `_backward_keys` reading stored pairs or forming them (`STORED_PAIRS`)."""
    kernels = ops_local_softmax_triton
    sizes = kernels._sizes(16, 64, 64, causal)
    flags = dict(HORIZON=16, CAUSAL=causal, HAS_MASK=True, HAS_TABLE=True, DOT="tf32")
    for name in ("_forward", "_backward_queries", "_backward_keys"):
        kernel = getattr(kernels, name)
        ones = {key: 1 for key in kernels.LENGTH_ARGUMENTS if key in inspect.signature(kernel.fn).parameters}
        assert {"lq", "rows", "nq"} <= set(ones), name
        constexprs = (dict(sizes, **kernels._window_tiles(name, 16, causal)) if name != "_backward_keys" else
                      dict(BLOCK=sizes["BLOCK"], **kernels._key_blocks(), BLOCK_D=sizes["BLOCK_D"],
                           BLOCK_V=sizes["BLOCK_V"], BLOCK_R=sizes["BLOCK_R"]))
        if name != "_forward":
            constexprs["STORED_PAIRS"] = stored
        lower(kernel, torch.float32, torch.bfloat16, operand_names=kernels.INPUT_POINTERS, **flags, **ones,
              **constexprs)


def test_lowering_catches_what_the_interpreter_accepts():
    """A kernel whose loop-carried pointer changes shape in the loop (the interpreter runs it) is rejected."""
    import triton.language as tl

    @triton.jit
    def changes_shape(X, n, BLOCK: tl.constexpr):
        ptr = X + tl.arange(0, 2 * BLOCK)
        for _ in range(n):
            ptr = X + tl.arange(0, BLOCK)
        tl.store(ptr, 0.0)

    with pytest.raises(Exception, match="Loop-carried variable ptr"):
        lower(changes_shape, torch.float32, BLOCK=16)


@DTYPES
@pytest.mark.parametrize("has_table", [False, True], ids=["no-table", "table"])
@pytest.mark.parametrize("shape", [(16, 64, 65), (0, 8, 9), (3, 128, 129)], ids=["h16-d64", "h0-d8", "h3-d128"])
def test_decode_step_lowers(shape, has_table, dtype):
    horizon, d, dv1 = shape
    lower(ops_local_softmax_triton._decode_step, dtype, HORIZON=horizon, HAS_TABLE=has_table,
          **ops_local_softmax_triton._decode_blocks(horizon, d, dv1))


@DTYPES
@pytest.mark.parametrize("has_table", [False, True], ids=["no-table", "table"])
@pytest.mark.parametrize("shape", [(16, 64, 65), (0, 8, 9), (3, 128, 129)], ids=["h16-d64", "h0-d8", "h3-d128"])
def test_cross_decode_lowers(shape, has_table, dtype):
    horizon, d, dv1 = shape
    blocks = ops_local_softmax_triton._decode_blocks(2 * horizon, d, dv1)
    lower(ops_local_softmax_triton._cross_decode, dtype, HORIZON=horizon, HAS_TABLE=has_table,
          BLOCK_N=ops_local_softmax_triton.CROSS_BLOCK_N, **blocks)


def test_an_older_triton_is_refused_at_import(monkeypatch):
    """A Triton without `triton.constexpr_function` fails the kernels' module's import with an ImportError that says
    so, which `ops_local_softmax` takes as no Triton at all (its PyTorch path), rather than failing in a kernel."""
    import importlib
    import sys
    import types
    from pathlib import Path

    monkeypatch.delattr(triton, "constexpr_function")
    folder = types.ModuleType("scaleformer_with_an_older_triton")
    folder.__path__ = [str(Path(ops_local_softmax_triton.__file__).parent)]
    monkeypatch.setitem(sys.modules, folder.__name__, folder)
    with pytest.raises(ImportError, match=r"need a Triton with `triton.constexpr_function` \(3.6 has it\), got "):
        importlib.import_module(f"{folder.__name__}.ops_local_softmax_triton")
    assert f"{folder.__name__}.ops_local_softmax_triton" not in sys.modules
