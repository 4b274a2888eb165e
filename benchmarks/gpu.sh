#!/usr/bin/env bash
# The GPU benchmarks on a bare GPU machine: no Java, no services, no network needed.
#
#   benchmarks/gpu.sh OUT_DIR [PART ...]     parts: check grid cores compile graph cowclip
#                                            embeddings (default: all)
#
# Needs Python 3.11+ with a CUDA torch, numpy, pyarrow 25, xxhash and rich (psutil and
# nvidia-ml-py for CPU and GPU utilisation, pytest and hypothesis for `check`). When the
# machine's pyarrow is not 25, the wheels in $WHEELS (default .whl) are installed into a
# private folder first. Channels are written on the machine by a pure-Python writer.
set -uo pipefail
out=${1:?give an output folder}
shift
parts=${*:-check grid cores compile graph cowclip embeddings}
# PARQUET=0 leaves the DataLoader baseline out of grid and cores (it was measured before).
baseline=$([ "${PARQUET:-1}" = 1 ] && echo ,parquet)
bf16=${BF16:-both}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export FLOW_HOME=${FLOW_HOME:-/tmp/flow-gpu}
if ! $py -c 'import pyarrow, sys; sys.exit(pyarrow.__version__.split(".")[0] != "25")' 2>/dev/null; then
  wheels=$(ls "${WHEELS:-.whl}"/*.whl 2>/dev/null)
  [ -n "$wheels" ] || { echo "pyarrow 25 is needed: put its wheel in ${WHEELS:-.whl}"; exit 1; }
  $py -m pip install -q --no-index --no-deps --no-compile --target /tmp/flow-site $wheels || exit 1
  export PYTHONPATH=/tmp/flow-site:$PYTHONPATH
fi
# Each part ends within $PART_LIMIT seconds (default: none), so one slow part cannot take
# the others' time on a machine lent for minutes.
bench() { timeout "${PART_LIMIT:-0}" $py benchmarks/trainer.py --device cuda "$@"; }
for part in $parts; do
  echo "== $part"
  case $part in
    check)
      nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
      echo "cpus: $(nproc)"
      $py -c 'import sys, torch, numpy, pyarrow; print(sys.version.split()[0], torch.__version__, numpy.__version__, pyarrow.__version__)'
      # The project's warning filters and conftest name packages this machine may lack
      # (sqlalchemy, confluent_kafka); the loader's tests need neither.
      $py -m pytest -q -p no:cacheprovider --noconftest -o filterwarnings=error \
        tests/trainers/test_loader.py tests/trainers/test_graphed.py 2>&1 | tail -8 ;;
    grid)
      bench --models dlrm,deepfm --batch-sizes 16384,32768,65536 --bf16 "$bf16" \
        --feeds "memory,host,device$baseline,device-read" --steps 120 --warmup 15 \
        --result-file "$out/grid.json" ;;
    cores)
      bench --models dlrm --batch-sizes 32768 --bf16 on --feeds memory --steps 120 --warmup 15 \
        --cores 1,2,4,8,16 --cores-feeds "memory,host,device$baseline,host-read,device-read" \
        --result-file "$out/cores.json" ;;
    compile)
      bench --models dlrm,deepfm --batch-sizes 32768 --bf16 on --compile on \
        --feeds memory,host,device --steps 120 --warmup 15 --result-file "$out/compile.json" ;;
    graph)
      # Each step as one CUDA graph (trainers/graphed.py) against eager, at the launch-bound
      # 16k and at 32k; then 16k again with a 0.5 ms GIL switch interval (the loop waits less
      # for the loader's thread to let go of the GIL).
      bench --models dlrm,deepfm --batch-sizes 16384,32768 --bf16 on --cuda-graph both \
        --feeds memory,host,device,device-read --steps 200 --warmup 20 \
        --result-file "$out/graph.json"
      bench --models dlrm,deepfm --batch-sizes 16384 --bf16 on --cuda-graph both \
        --feeds memory,device --steps 200 --warmup 20 --switch-interval 0.0005 --reuse-data \
        --result-file "$out/graph-switch.json" ;;
    cowclip)
      timeout "${PART_LIMIT:-0}" $py benchmarks/cowclip.py --device cuda \
        --result-file "$out/cowclip.json" ;;
    embeddings)
      # Dynamic tables on the GPU: their tests (the CUDA ones run here), then hashed against
      # dynamic at equal memory on the churning world (trainers/dynamic.py, docs/trainers.md).
      $py -m pytest -q -p no:cacheprovider --noconftest -o filterwarnings=error \
        tests/trainers/test_dynamic_embeddings.py 2>&1 | tail -8
      timeout "${PART_LIMIT:-0}" $py benchmarks/embeddings.py --device cuda \
        --result-file "$out/embeddings.json" ;;
    *) echo "unknown part $part: use check grid cores compile graph cowclip embeddings"; exit 2 ;;
  esac
done
