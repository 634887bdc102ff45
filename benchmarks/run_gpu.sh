#!/usr/bin/env bash
# The GPU measurements of benchmarks/README.md ("On a GPU") in one command, on a machine with one CUDA device
# and this project's dependencies installed:
#
#     bash benchmarks/run_gpu.sh OUT_DIR [STEP ...]
#
# STEP is any of env, compile, attention, attention_variants, attention_backward, attention_table, attention_pairs,
# attention_scan, attention_small_batch, attention_rows, attention_block32, tune, tune_registers, tune_scan, ncu,
# tests, compile_tests, accelerate, accelerate_fsdp, train, train_compiled, train_graphs, train_graphs_scan,
# train_graphs_recurrence, train_graphs_pairs, train_graphs_candidates, train_graphs_unfolded, generate
# (default: env, attention, tests, compile_tests, train, generate, in that order):
#   compile               checks, and so compiles, the default kernels and each variant's in parallel processes, so
#                         that a later attention_variants finds them compiled;
#   attention_variants    times the op as it is beside other settings of its kernels in one process: windows in one
#                         tile of 128 keys and 64 keys per backward program, the walks' parallel passes (at B=4,
#                         H=16 the op takes them causal, the sequential walks bidirectional), forward's states
#                         recomputed in backward;
#   attention_backward    the op beside its kernels with the length arguments unspecialised
#                         (`unspecialised_lengths`), beside windows in whole tiles (`whole_tiles`; the op ends them in
#                         a narrower tile in `_forward`) and in a narrower tile in `_backward_queries` too
#                         (`tail_tiles_backward`), beside the op without its relative table (`no_table`: what the
#                         table costs), at B=4, H=16 (SDPA to 16k);
#   attention_table       the GPU tests of the relative table in narrower tiles (`test_narrow_table_tiles_on_cuda`),
#                         then the op beside it: causal in 32 rows (`narrow_table`), and bidirectional too, the
#                         band's last row apart from a tile of 32 rows (`narrow_table_edge`), and beside the op
#                         without a table (`no_table`), at B=4, H=16, 16k and 64k (a variant that fails its check
#                         against the reference is not timed);
#   attention_pairs       the GPU tests of `_backward_keys` reading the window's pairs that `_backward_queries`
#                         stored (`test_stored_pairs_on_cuda`), then the op beside it (`stored_pairs`), beside it
#                         by 16 keys a program of `_backward_keys` (`stored_pairs_key_block_16`), beside it with the
#                         scan as the walks' recurrence too (`stored_pairs_scan_recurrence`), and beside the
#                         windows' last tiles in the band only taken with the kernel's products as the others
#                         (`two_sided_tiles`, the op before `ONE_SIDED_TILES`), and beside `_backward_keys`' blocks
#                         from key 0 (`key_blocks_from_0`, causal the op before its blocks started at the windows'
#                         first keys), at B=4, H=16, 16k and 64k, with its peak memory (a variant that fails its
#                         check is not timed);
#   attention_scan        the parallel passes' scan as products (`scan_products`, `scan_products_1x32`), in steps of 16
#                         chunks (`scan_steps_of_16`), the passes with the products where the op takes the walks
#                         (`scan_products_everywhere`), and the scan as the walks' recurrence (`scan_recurrence`), at
#                         the small model's training shape (B=1, H=8) and at B=4, H=16, with each shape's profile
#                         at 16k;
#   attention_small_batch the op (its parallel passes at this shape) beside the sequential walks and the op called
#                         through the torch.library operators' dispatch (`operators`), at the small model's training
#                         shape (batch 1, 8 heads), and the host's time to issue the op at 4k (`--host-profile`);
#   attention_rows        the parallel passes beside the sequential walks at 16 and 32 batch*head rows, between the
#                         8 and 64 of the steps above (the op switches at PARALLEL_WALK_PROGRAMS walks' programs);
#   attention_block32     the op with the kernels' blocks of 32;
#   tune                  bench_attention_gpu.py --tune: each kernel's warps and pipeline stages, one at a time;
#   tune_scan             the same for the parallel passes' kernels at B=1, H=8 (2, 4 or 8 warps, 1 or 2 stages, no
#                         cap on registers or 128 a thread: Triton 3.6 gives the reverse `_scan_sums` 157 registers,
#                         one program of 8 warps an SM, so that the small model's 256 programs take two waves);
#   tune_registers        the same for the three window kernels, 4 or 8 warps, 1 or 2 stages, with no cap on
#                         registers or 168 or 128 a thread (maxnreg): at 245-255 registers two programs of 4 warps
#                         share an SM, and Nsight Compute found them waiting on their instructions' latency;
#   ncu                   Nsight Compute's counters of one forward + backward at 16k, the op causal and
#                         bidirectional beside fla's chunk linear attention (`bench_attention_gpu.py --ncu-run`):
#                         each kernel's throughput, occupancy and warp stall reasons, ncu's raw CSV beside the log;
#   tests                 the GPU tests (`pytest -m gpu`) but those that run torch.compile, in TEST_WORKERS processes;
#   compile_tests         those (`compiles` marker), each in a process of its own from the start (COMPILE_TEST_WORKERS,
#                         default 4, one per test), Inductor's compile workers 4 a process;
#   accelerate            examples/train_accelerate.py under `accelerate launch` on the device, 30 bf16 steps of the
#                         small model on the shipped verses, then its evaluation (loss, greedy chrF and BLEU);
#   accelerate_fsdp       the same 30 steps with the shipped FSDP2 configuration (configs/accelerate/fsdp.yaml) on the
#                         one device (which accelerate applies only on GPUs), a sharded checkpoint at step 15, then
#                         the saved folder reloaded;
#   train_compiled        bench_train.py under torch.compile, training steps at 16k (one graph to compile per model,
#                         `--steps-only`); train_graphs, Scaleformer's in its reduce-overhead mode (CUDA graphs)
#                         against BART's eager step (its faster: 0.074 s against 0.194 under the graphs on an H200),
#                         then one step of each profiled (`--profile`): where the device time of a replayed step goes;
#                         train_graphs_scan, the same with the parallel passes' scan as products
#                         (`--kernel-options SCAN_PRODUCTS=True`), train_graphs_recurrence with the scan as the walks'
#                         recurrence (`SCAN_RECURRENCE=True`), train_graphs_pairs with backward's pairs stored
#                         (`STORED_PAIRS=True`), train_graphs_candidates with both, train_graphs_unfolded with the
#                         scans passing through the chunks before the first query block one after another as before
#                         they folded them (`FOLD_SLOTS=0`; the cross attention's anticausal passes).
# Each step writes its log (and its JSON) under OUT_DIR and runs under its own time limit (seconds, e.g.
# LIMIT_tests=300; at the limit the step gets SIGINT, so that pytest still reports what ran), so that a failing or slow
# step leaves the others' figures; the exit status is the number of steps that failed. TEST_PATHS (default: tests/ops
# tests/models) are what the tests step runs, in TEST_WORKERS processes (default 8) where pytest-xdist is installed:
# the GPU tests spend most of their time compiling kernels, work for the host's cores. With LAUNCH_FROM=PATH, the
# compile and attention steps launch the kernels with the best settings of the tune report at PATH where it exists
# (`bench_attention_gpu.py --launch`), so that one command can tune and then time the tuned kernels.
set -u
out=${1:?usage: bash benchmarks/run_gpu.sh OUT_DIR [STEP ...]}
shift
steps=${*:-env attention tests compile_tests train generate}
mkdir -p "$out"
out=$(cd "$out" && pwd)
[ -n "${LAUNCH_FROM:-}" ] && LAUNCH_FROM=$(realpath -m "$LAUNCH_FROM")  # before the cd below
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
failed=0

step() {  # step NAME COMMAND...: runs COMMAND under LIMIT_<NAME> seconds, its output in OUT_DIR/NAME.log
    local name=$1 limit_var="LIMIT_$1"
    shift
    echo "== $name: $(date -u +%T), limit ${!limit_var} s"
    timeout -s INT -k 20 "${!limit_var}" "$@" > "$out/$name.log" 2>&1
    local rc=$?
    tail -n "${TAIL_LINES:-30}" "$out/$name.log"
    echo "== $name: exit status $rc, $(date -u +%T)"
    [ "$rc" -eq 0 ] || failed=$((failed + 1))
}

: "${LIMIT_env:=60}" "${LIMIT_attention:=150}" "${LIMIT_tests:=240}" "${LIMIT_train:=150}" "${LIMIT_generate:=180}"
: "${LIMIT_train_compiled:=240}" "${LIMIT_attention_block32:=120}" \
    "${LIMIT_attention_variants:=240}" "${LIMIT_compile:=180}" \
    "${LIMIT_attention_small_batch:=120}" "${LIMIT_train_graphs:=360}" \
    "${LIMIT_tune:=240}" "${LIMIT_attention_rows:=120}" "${LIMIT_accelerate:=240}" "${LIMIT_accelerate_fsdp:=240}" \
    "${LIMIT_compile_tests:=300}" "${LIMIT_attention_backward:=200}" "${LIMIT_attention_table:=240}" \
    "${LIMIT_attention_pairs:=240}" \
    "${LIMIT_ncu:=240}" "${LIMIT_tune_registers:=300}" "${LIMIT_attention_scan:=240}" "${LIMIT_tune_scan:=240}" \
    "${LIMIT_train_graphs_scan:=360}" \
    "${LIMIT_train_graphs_recurrence:=360}" "${LIMIT_train_graphs_pairs:=360}" "${LIMIT_train_graphs_candidates:=360}" \
    "${LIMIT_train_graphs_unfolded:=360}"
launch=()
launch_from() {  # the steps' --launch option, once the tune report at LAUNCH_FROM exists
    launch=()
    [ -n "${LAUNCH_FROM:-}" ] && [ -f "$LAUNCH_FROM" ] && launch=(--launch "$LAUNCH_FROM")
    echo "== kernels launched as in: ${launch[1]:-LAUNCH}"
}
for name in $steps; do
    case $name in compile|attention*) launch_from ;; esac
    case $name in
        env) step env bash -c 'nvidia-smi; python3 -c "import torch, triton, transformers;
print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name())"' ;;
        attention) step attention python3 benchmarks/bench_attention_gpu.py --profile 16384 "${launch[@]}" \
            --json "$out/bench_attention_gpu.json" ;;
        attention_rows) step attention_rows bash -c 'out=$1; shift; for shape in 2x8 4x8; do
                python3 benchmarks/bench_attention_gpu.py --batch "${shape%x*}" --heads "${shape#*x}" "$@" \
                    --variants parallel_walks sequential_walks --lengths 16384 65536 \
                    --json "$out/bench_attention_gpu_rows_$shape.json" || exit
            done' attention_rows "$out" "${launch[@]}" ;;
        accelerate) step accelerate python3 -m accelerate.commands.launch --num_processes 1 --num_machines 1 \
            --mixed_precision bf16 --dynamo_backend no examples/train_accelerate.py \
            --model_config configs/scaleformer-small.json --mixed_precision bf16 --max_steps 30 \
            --per_device_batch_size 16 --max_train_examples 2000 --eval_steps 30 --eval_examples 64 \
            --logging_steps 10 --output_dir "$out/accelerate" ;;
        accelerate_fsdp) step accelerate_fsdp bash -c 'python3 -m accelerate.commands.launch --config_file \
                configs/accelerate/fsdp.yaml --num_processes 1 examples/train_accelerate.py \
                --model_config configs/scaleformer-small.json --max_steps 30 --per_device_batch_size 16 \
                --max_train_examples 2000 --eval_steps 0 --checkpointing_steps 15 --logging_steps 10 \
                --output_dir "$1/accelerate_fsdp" &&
            python3 -c "import sys; from modeling_scaleformer import ScaleformerForConditionalGeneration as Model
model = Model.from_pretrained(sys.argv[1])
print(sys.argv[1], \"reloaded:\", sum(p.numel() for p in model.parameters()), \"parameters\")" "$1/accelerate_fsdp"' \
            accelerate_fsdp "$out" ;;
        attention_block32) step attention_block32 python3 benchmarks/bench_attention_gpu.py --kernel-block 32 \
            "${launch[@]}" --lengths 4096 16384 65536 --json "$out/bench_attention_gpu_block32.json" ;;
        compile) step compile bash -c 'variants=(wide_tiles parallel_walks sequential_walks recomputed_states)
            for variant in "${variants[@]}"; do
                python3 benchmarks/bench_attention_gpu.py --check-only --variants "$variant" "$@" & done
            for _ in "${variants[@]}"; do wait -n || exit 1; done' compile "${launch[@]}" ;;
        attention_variants) step attention_variants python3 benchmarks/bench_attention_gpu.py --variants wide_tiles \
            parallel_walks recomputed_states "${launch[@]}" --lengths 4096 16384 65536 \
            --profile 16384 --json "$out/bench_attention_gpu_variants.json" ;;
        attention_backward) step attention_backward python3 benchmarks/bench_attention_gpu.py --variants \
            unspecialised_lengths whole_tiles tail_tiles_backward no_table "${launch[@]}" --lengths 4096 16384 65536 \
            --max-sdpa-length 16384 --json "$out/bench_attention_gpu_backward.json" ;;
        attention_table) step attention_table bash -c 'workers=()  # the tests compile their kernels in parallel
            python3 -c "import xdist" 2> /dev/null && workers=(-n "${TEST_WORKERS:-8}")
            python3 -m pytest -q -p no:cacheprovider -rfEs "${workers[@]}" tests/ops/test_local_softmax_triton.py \
                -k test_narrow_table_tiles_on_cuda
            tests=$?
            python3 benchmarks/bench_attention_gpu.py --variants narrow_table narrow_table_edge no_table "$@" \
                --lengths 16384 65536 --max-sdpa-length 16384 --json "$0/bench_attention_gpu_table.json" &&
            exit "$tests"' "$out" "${launch[@]}" ;;
        attention_pairs) step attention_pairs bash -c 'workers=()  # the tests compile their kernels in parallel
            python3 -c "import xdist" 2> /dev/null && workers=(-n "${TEST_WORKERS:-8}")
            python3 -m pytest -q -p no:cacheprovider -rfEs "${workers[@]}" tests/ops/test_local_softmax_triton.py \
                -k test_stored_pairs_on_cuda
            tests=$?
            python3 benchmarks/bench_attention_gpu.py --variants stored_pairs stored_pairs_key_block_16 \
                stored_pairs_scan_recurrence two_sided_tiles key_blocks_from_0 "$@" \
                --lengths 16384 65536 \
                --max-sdpa-length 16384 --json "$0/bench_attention_gpu_pairs.json" &&
            exit "$tests"' "$out" "${launch[@]}" ;;
        attention_scan) step attention_scan bash -c 'out=$1; shift; for shape in 1x8 4x16; do
                python3 benchmarks/bench_attention_gpu.py --batch "${shape%x*}" --heads "${shape#*x}" "$@" \
                    --variants scan_products scan_products_1x32 scan_steps_of_16 scan_products_everywhere \
                    scan_recurrence \
                    --lengths 16384 65536 --max-sdpa-length 0 --profile 16384 \
                    --json "$out/bench_attention_gpu_scan_$shape.json" || exit
            done' attention_scan "$out" "${launch[@]}" ;;
        attention_small_batch) step attention_small_batch python3 benchmarks/bench_attention_gpu.py --batch 1 \
            --heads 8 "${launch[@]}" --variants operators sequential_walks --lengths 4096 16384 65536 \
            --host-profile 4096 \
            --json "$out/bench_attention_gpu_small_batch.json" ;;
        tests) workers=()  # pytest-xdist, where installed, spreads the tests (and their compiles) over processes
            python3 -c "import xdist" 2> /dev/null && workers=(-n "${TEST_WORKERS:-8}")
            step tests python3 -m pytest -m "gpu and not compiles" -v -p no:cacheprovider -rfEs --durations=0 \
                "${workers[@]}" ${TEST_PATHS:-tests/ops tests/models} ;;
        compile_tests) workers=()  # one process per test: fewer tests than twice the processes go round robin
            python3 -c "import xdist" 2> /dev/null && workers=(-n "${COMPILE_TEST_WORKERS:-4}")
            step compile_tests env TORCHINDUCTOR_COMPILE_THREADS="${TORCHINDUCTOR_COMPILE_THREADS:-4}" \
                python3 -m pytest -m "gpu and compiles" -v -p no:cacheprovider -rfEs --durations=0 "${workers[@]}" \
                ${TEST_PATHS:-tests/ops tests/models} ;;
        train) step train python3 benchmarks/bench_train.py --device cuda --bf16 --lengths 4096 16384 \
            --models scaleformer bart led --profile 16384 --json "$out/bench_train_gpu.json" ;;
        ncu) step ncu bash -c 'ncu --profile-from-start off --clock-control none --csv --page raw \
                --log-file "$1/ncu_attention.csv" --section SpeedOfLight --section Occupancy --section LaunchStats \
                --section WarpStateStats python3 benchmarks/bench_attention_gpu.py --ncu-run 16384 &&
            python3 benchmarks/bench_attention_gpu.py --ncu-summary "$1/ncu_attention.csv"' ncu "$out" ;;
        tune) step tune python3 benchmarks/bench_attention_gpu.py --tune --json "$out/bench_attention_gpu_tune.json" ;;
        tune_scan) step tune_scan python3 benchmarks/bench_attention_gpu.py --tune --batch 1 --heads 8 --tune-kernels \
            _chunk_sums _scan_sums _query_sums --warps 2 4 8 --stages 1 2 --registers 128 \
            --json "$out/bench_attention_gpu_tune_scan.json" ;;
        tune_registers) step tune_registers python3 benchmarks/bench_attention_gpu.py --tune --tune-kernels _forward \
            _backward_queries _backward_keys --warps 4 8 --stages 1 2 --registers 168 128 \
            --json "$out/bench_attention_gpu_tune_registers.json" ;;
        train_graphs) step train_graphs python3 benchmarks/bench_train.py --device cuda --bf16 \
            --compile reduce-overhead --eager bart --steps-only --lengths 16384 --models scaleformer bart \
            --profile 16384 --json "$out/bench_train_gpu_graphs.json" ;;
        train_graphs_scan) step train_graphs_scan python3 benchmarks/bench_train.py --device cuda --bf16 \
            --compile reduce-overhead --eager bart --steps-only --lengths 16384 --models scaleformer bart \
            --kernel-options SCAN_PRODUCTS=True --profile 16384 --json "$out/bench_train_gpu_graphs_scan.json" ;;
        train_graphs_recurrence|train_graphs_pairs|train_graphs_candidates|train_graphs_unfolded)
            case $name in
                train_graphs_recurrence) options=(SCAN_RECURRENCE=True) ;;
                train_graphs_pairs) options=(STORED_PAIRS=True) ;;
                train_graphs_unfolded) options=(FOLD_SLOTS=0) ;;
                *) options=(STORED_PAIRS=True SCAN_RECURRENCE=True) ;;
            esac
            step "$name" python3 benchmarks/bench_train.py --device cuda --bf16 \
            --compile reduce-overhead --eager bart --steps-only --lengths 16384 --models scaleformer bart \
            --kernel-options "${options[@]}" --profile 16384 --json "$out/bench_train_gpu_${name#train_}.json" ;;
        train_compiled) step train_compiled python3 benchmarks/bench_train.py --device cuda --bf16 --compile \
            --steps-only --lengths 16384 --models scaleformer bart led --json "$out/bench_train_gpu_compiled.json" ;;
        generate) step generate python3 benchmarks/bench_generate.py --device cuda --new-tokens "${NEW_TOKENS:-8192}" \
            --positions ${POSITIONS:-128 1024 4096 8192} --models scaleformer bart \
            --json "$out/bench_generate_gpu.json" ;;
        *) echo "unknown step: $name (expected env, compile, attention, attention_variants, attention_backward," \
                "attention_table, attention_pairs, attention_scan, attention_small_batch, attention_rows," \
                "attention_block32, tune, tune_registers, tune_scan, ncu, tests, compile_tests, accelerate," \
                "accelerate_fsdp, train," \
                "train_compiled," \
                "train_graphs, train_graphs_scan, train_graphs_recurrence, train_graphs_pairs," \
                "train_graphs_candidates, train_graphs_unfolded, generate)" >&2
           exit 64 ;;
    esac
done
exit "$failed"
