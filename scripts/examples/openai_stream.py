"""Stream one chat completion from `rack serve` with the official `openai` client and
print when each token arrived (wall seconds since the call): at dilation D every
emulated latency takes D times as long.

    python scripts/examples/openai_stream.py [URL]        # default http://127.0.0.1:8000
"""

from __future__ import annotations

import sys
import time

from openai import OpenAI

url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
client = OpenAI(base_url=f"{url}/v1", api_key="unused")
model = client.models.list().data[0].id          # the served model id
t0 = time.perf_counter()
stream = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "What limits a wafer's decode batch?"}],
    max_tokens=8, stream=True, extra_body={"ignore_eos": True})
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        print(f"{time.perf_counter() - t0:6.3f} s {chunk.choices[0].delta.content!r}")
