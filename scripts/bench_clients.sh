#!/usr/bin/env bash
# docs/serve.md's recipes: GuideLLM, AIPerf and inference-perf against a running
# `rack serve`, offline, each a bounded run (6 requests of 256 prompt / 32 output
# tokens), with the tokenizer folder rack ships (or TOKENIZER=PATH, the folder given
# to `rack serve --tokenizer`). Prints each client's summary; outputs in OUT.
#
#   rack serve --dilation 20 --port 8000 &            # in another shell
#   bash scripts/bench_clients.sh [URL]               # default http://127.0.0.1:8000
#
# The clients come from `pip install -e '.[bench-clients]'`; inference-perf needs
# Python >= 3.12, so IP_BIN may point at another venv's inference-perf.
set -euo pipefail
URL=${1:-http://127.0.0.1:8000}
HERE=$(cd "$(dirname "$0")/.." && pwd)
TOKENIZER=${TOKENIZER:-$(python -c 'from rack.serve.tokenizer import SHIPPED; print(SHIPPED)')}
OUT=${OUT:-rack-results/bench-clients}
IP_BIN=${IP_BIN:-inference-perf}
mkdir -p "$OUT"
export TOKENIZERS_PARALLELISM=false

echo "== guidellm (offline: HF_HUB_OFFLINE=1)"
HF_HUB_OFFLINE=1 guidellm run \
  --backend "kind=openai_http,target=$URL,model=kimi-k2,request_format=/v1/completions" \
  --tokenizer "kind=huggingface_auto,model=$TOKENIZER" \
  --data kind=synthetic_text,prompt_tokens=256,output_tokens=32 \
  --profile kind=constant,rate=0.5 --constraint kind=max_requests,count=6 \
  --output "kind=json,path=$OUT/guidellm.json" --disable-console-interactive 2>&1 | tee "$OUT/guidellm.txt"

echo "== aiperf (a local tokenizer folder needs no hub; aiperf 0.13 refuses local paths under HF_HUB_OFFLINE)"
env -u HF_HUB_OFFLINE aiperf profile --model kimi-k2 --url "$URL" --endpoint-type completions --streaming \
  --tokenizer "$TOKENIZER" --isl 256 --osl 32 --extra-inputs ignore_eos:true \
  --request-count 6 --concurrency 1 --random-seed 0 --artifact-dir "$OUT/aiperf" --ui-type none 2>&1 \
  | tee "$OUT/aiperf.txt"

echo "== inference-perf (offline: HF_HUB_OFFLINE=1)"
cat > "$OUT/inference-perf.yml" <<EOF
load:
  type: constant
  stages:
  - rate: 0.5
    duration: 12
api:
  type: completion
  streaming: true
server:
  type: vllm
  model_name: kimi-k2
  base_url: $URL
  ignore_eos: true
tokenizer:
  pretrained_model_name_or_path: $TOKENIZER
data:
  type: random
  input_distribution: {min: 256, max: 256, mean: 256, std_dev: 0, total_count: 6}
  output_distribution: {min: 32, max: 32, mean: 32, std_dev: 0, total_count: 6}
report:
  request_lifecycle:
    summary: true
    per_request: true
storage:
  local_storage:
    path: $OUT/inference-perf
EOF
HF_HUB_OFFLINE=1 "$IP_BIN" -c "$OUT/inference-perf.yml" 2>&1 | tee "$OUT/inference-perf.txt"

echo "== rack's records of these requests: $URL/rack/requests/{response id}; $URL/metrics"
