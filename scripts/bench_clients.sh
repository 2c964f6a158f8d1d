#!/usr/bin/env bash
# docs/serve.md's recipes: GuideLLM, AIPerf and inference-perf against a running
# `rack serve`, each with the command its own README gives (a small run: 6 requests,
# 256 prompt / 32 output tokens where the client takes lengths) and no tokenizer flag:
# the served model id is the path of rack's tokenizer folder, which each client loads
# offline. Prints each client's summary; outputs in OUT.
#
#   rack serve --dilation 20 --port 8000 &            # in another shell
#   bash scripts/bench_clients.sh [URL]               # default http://127.0.0.1:8000
#
# GuideLLM and AIPerf come from `pip install -e '.[bench-clients]'`; inference-perf
# needs Python >= 3.12 and its own environment (AIPerf pins another aiofiles), so
# IP_BIN may point at that environment's inference-perf.
set -euo pipefail
URL=${1:-http://127.0.0.1:8000}
OUT=${OUT:-rack-results/bench-clients}
IP_BIN=${IP_BIN:-inference-perf}
mkdir -p "$OUT"
MODEL=$(curl -sf "$URL/v1/models" | python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])')
echo "served model id: $MODEL"

echo "== guidellm"
guidellm run --backend "kind=openai_http,target=$URL" \
  --profile kind=constant,rate=0.5 --constraint kind=max_requests,count=6 \
  --data kind=synthetic_text,prompt_tokens=256,output_tokens=32 \
  --output "kind=json,path=$OUT/guidellm.json" --disable-console-interactive 2>&1 | tee "$OUT/guidellm.txt"

echo "== aiperf"
aiperf profile --model "$MODEL" --streaming --endpoint-type completions --url "$URL" \
  --request-count 6 --artifact-dir "$OUT/aiperf" --ui-type none 2>&1 | tee "$OUT/aiperf.txt"

echo "== inference-perf"
(cd "$OUT" && "$IP_BIN" --server.type vllm --server.base_url "$URL" --data.type random \
  --data.input_distribution.mean 256 --data.input_distribution.min 256 --data.input_distribution.max 256 \
  --data.input_distribution.std_dev 0 --data.output_distribution.mean 32 --data.output_distribution.min 32 \
  --data.output_distribution.max 32 --data.output_distribution.std_dev 0 \
  --load.type constant --load.stages '[{"rate": 0.5, "duration": 12}]' --api.streaming true) 2>&1 \
  | tee "$OUT/inference-perf.txt"

echo "== rack's figures of each run (wall and emulated seconds): $URL/rack/runs; per request: $URL/rack/requests/{response id}"
