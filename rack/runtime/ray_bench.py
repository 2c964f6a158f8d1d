"""Ray-side measurements of `rack bench` (this module imports Ray; `rack.experiments.bench` does not).

`actor_link_throughput` ships KV payloads from one Ray actor to another on this node
along the path a KV transfer takes on the Ray runtime: a list of msgpack frames
(`interconnect.codec.make_kv_frames`, numpy uint8 arrays, which Ray moves through its
shared-memory object store without pickling the bytes) passed as the argument of an
async actor method, every frame verified on arrival (`verify_kv_frames`: header parse
and xxh3 of the body). Delivered GB/s = payload bytes verified good / wall time from
the first send to the last reply, with a few calls in flight, as the interconnect
keeps several transfers in flight.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from .ray_runtime import ray_api, ensure_ray


class _Receiver:
    """The decode side: verifies every frame of a payload (as `receive_kv` does)."""

    async def receive(self, frames: list) -> tuple[int, int, int]:
        """(good frames, bad frames, payload bytes of the good ones)."""
        from interconnect.codec import verify_kv_frames

        good, bad, _logical, payload = verify_kv_frames(frames)
        return good, bad, payload


class _Sender:
    """The prefill side: builds payloads once, then ships them to the receiver."""

    def __init__(self, receiver: Any) -> None:
        self.rx = receiver
        self.payloads: list[list[np.ndarray]] = []

    async def build(self, n_payloads: int, payload_bytes: int, n_layers: int, layer_group: int) -> int:
        """Build `n_payloads` distinct payloads of ~payload_bytes each; returns the bytes
        of one (frame bodies and headers)."""
        from interconnect.codec import make_kv_frames

        kv_per_token = 35_136          # Kimi-K2 at fp8, B/token (devices catalog), any value works
        tokens = max(1, payload_bytes // kv_per_token)
        self.payloads = [make_kv_frames(i, tokens, kv_per_token, n_layers, layer_group, 1.0, seed=i)
                         for i in range(n_payloads)]
        return int(sum(f.nbytes for f in self.payloads[0]))

    async def ship(self, rounds: int, in_flight: int) -> dict:
        """Send every payload `rounds` times, `in_flight` calls at a time; returns
        {"wall_s", "bytes_good", "bad_frames", "calls"}."""
        todo = [p for _ in range(rounds) for p in self.payloads]
        pending: list = []
        good_bytes = bad = 0
        t0 = time.perf_counter()
        for frames in todo:
            pending.append(self.rx.receive.remote(frames))
            if len(pending) >= in_flight:
                _g, b, nbytes = await pending.pop(0)
                good_bytes += nbytes
                bad += b
        for ref in pending:
            _g, b, nbytes = await ref
            good_bytes += nbytes
            bad += b
        wall = time.perf_counter() - t0
        return {"wall_s": wall, "bytes_good": good_bytes, "bad_frames": bad, "calls": len(todo)}


def actor_link_throughput(payload_mb: tuple[float, ...] = (1, 16, 64), *, repeat: int = 3,
                          in_flight: int = 4, calls_per_sample: int = 8, n_layers: int = 61,
                          layer_group: int = 8, address: str | None = None) -> dict:
    """Delivered GB/s (1 GB = 1e9 bytes of frame body) of KV payloads of each size in
    `payload_mb` (MiB per transfer, split into ceil(n_layers / layer_group) frames)
    between two Ray actors on one node; median of `repeat` samples of
    `calls_per_sample` transfers. A plain in-process memory copy of one payload,
    timed in the same run, gives `ratio_to_memcpy`.

    Starts a local Ray when none is running (and shuts it down again); raises
    RuntimeError if a frame arrives corrupted.
    """
    ray = ray_api()
    opened = ensure_ray(address)
    try:
        Receiver = ray.remote(num_cpus=0, max_concurrency=16)(_Receiver)
        Sender = ray.remote(num_cpus=0, max_concurrency=4)(_Sender)
        rx = Receiver.remote()
        tx = Sender.remote(rx)
        rows = {}
        for mb in payload_mb:
            nbytes = int(mb * 2**20)
            one = ray.get(tx.build.remote(4, nbytes, n_layers, layer_group), timeout=300)
            ray.get(tx.ship.remote(1, in_flight), timeout=300)           # warm-up
            rates = []
            for _ in range(repeat):
                r = ray.get(tx.ship.remote(max(1, calls_per_sample // 4), in_flight), timeout=600)
                if r["bad_frames"]:
                    raise RuntimeError(f"actor link benchmark: {r['bad_frames']} frame(s) arrived corrupted")
                rates.append(r["bytes_good"] / r["wall_s"] / 1e9)
            src = np.random.default_rng(0).integers(0, 256, one, dtype=np.uint8)
            dst = np.ones(one, dtype=np.uint8)
            np.copyto(dst, src)
            copies = []
            for _ in range(repeat):
                t = time.perf_counter()
                np.copyto(dst, src)
                copies.append(one / (time.perf_counter() - t) / 1e9)
            rate, copy = statistics.median(rates), statistics.median(copies)
            rows[f"{mb:g}MB"] = {"payload_bytes": one, "frames_per_transfer": -(-n_layers // layer_group),
                                 "delivered_GBps": rate, "delivered_GBps_runs": rates,
                                 "memcpy_GBps": copy, "ratio_to_memcpy": rate / copy if copy else None,
                                 "in_flight": in_flight}
        for a in (tx, rx):
            ray.kill(a)
        return {"path": "Ray actor -> Ray actor, same node: list of numpy uint8 KV frames as the "
                        "argument of an async actor method, every frame verified (header + xxh3)",
                "sizes": rows}
    finally:
        if opened:
            ray.shutdown()
