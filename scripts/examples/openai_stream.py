"""Stream one chat completion from `rack serve` with the official `openai` client and
print when each token arrived (wall seconds since the request left, as a benchmark
client times it; the client's own set-up before the send is not the server's latency):
at dilation D every emulated latency takes D times as long.

    python scripts/examples/openai_stream.py [URL]        # default http://127.0.0.1:8000
"""

from __future__ import annotations

import sys
import time

import httpx
from openai import OpenAI

url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
sent: list[float] = []                           # when each request left (an httpx event hook)
client = OpenAI(base_url=f"{url}/v1", api_key="unused",
                http_client=httpx.Client(event_hooks={"request": [lambda request: sent.append(time.perf_counter())]}))
model = client.models.list().data[0].id          # the served model id
stream = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "What limits a wafer's decode batch?"}],
    max_tokens=8, stream=True, extra_body={"ignore_eos": True})
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        print(f"{time.perf_counter() - sent[-1]:6.3f} s {chunk.choices[0].delta.content!r}")
