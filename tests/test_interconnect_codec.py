"""The KV payload codec: frame layout, verification, malformed frames, KV frame sets."""

from __future__ import annotations

import math
import pickle
import struct

import msgpack
import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from interconnect import codec
from interconnect.codec import (
    FORMAT_VERSION,
    ChecksumError,
    FrameError,
    FrameHeader,
    corrupt_frame,
    decode_frame,
    encode_frame,
    frame_size,
    group_logical_bytes,
    make_kv_frames,
    payload_size,
    peek_header,
    verify_kv_frames,
)


def _header(**kw) -> FrameHeader:
    base = dict(request_id=7, layer_start=8, layer_end=16, token_start=0, token_end=100,
                dtype="bf16", shape=(8, 100, 64), logical_bytes=8 * 100 * 64 * 2)
    base.update(kw)
    return FrameHeader(**base)


def test_roundtrip_preserves_header_and_body_zero_copy():
    body = np.arange(5000, dtype=np.float32)
    frame = encode_frame(_header(), body)
    assert frame.dtype == np.uint8 and frame.ndim == 1
    h, view = decode_frame(frame)
    assert (h.request_id, h.layer_range, h.token_range) == (7, (8, 16), (0, 100))
    assert h.dtype == "bf16" and h.shape == (8, 100, 64) and h.logical_bytes == 8 * 100 * 64 * 2
    assert h.payload_bytes == body.nbytes and h.version == FORMAT_VERSION
    assert np.shares_memory(view, frame)
    np.testing.assert_array_equal(view.view(np.float32), body)
    assert frame.nbytes == frame_size(_header(), body.nbytes)


def test_frame_is_plain_msgpack_header_map_and_bin():
    body = np.frombuffer(b"hello kv", dtype=np.uint8)
    frame = encode_frame(_header(), body)
    hmap, raw = msgpack.unpackb(frame.tobytes())
    assert raw == b"hello kv"
    assert hmap["rid"] == 7 and hmap["layers"] == [8, 16] and hmap["tokens"] == [0, 100]
    assert hmap["dtype"] == "bf16" and hmap["shape"] == [8, 100, 64]
    assert hmap["payload"] == 8 and hmap["logical"] == 8 * 100 * 64 * 2 and hmap["v"] == FORMAT_VERSION
    import xxhash

    assert hmap["xxh3"] == xxhash.xxh3_64_intdigest(b"hello kv")


def test_decode_accepts_bytes_and_gives_read_only_view():
    frame = encode_frame(_header(), np.ones(10, np.uint8)).tobytes()
    h, view = decode_frame(frame)
    assert not view.flags.writeable and view.sum() == 10 and h.payload_bytes == 10


def test_out_buffer_is_reused_and_checked():
    out = np.zeros(1 << 16, dtype=np.uint8)
    body = np.arange(1000, dtype=np.uint16)
    frame = encode_frame(_header(), body, out=out)
    assert np.shares_memory(frame, out) and frame.nbytes < out.nbytes
    assert decode_frame(frame)[0].payload_bytes == 2000
    with pytest.raises(FrameError, match="out buffer holds 100 bytes"):
        encode_frame(_header(), body, out=np.zeros(100, np.uint8))
    with pytest.raises(FrameError, match="uint8"):
        encode_frame(_header(), body, out=np.zeros(1 << 16, np.float32))


def test_body_larger_than_one_chunk_roundtrips():
    body = np.random.default_rng(1).integers(0, 256, (3 << 20) + 17, dtype=np.uint8)
    h, view = decode_frame(encode_frame(_header(), body))
    np.testing.assert_array_equal(view, body)


def test_encode_rejects_non_contiguous_and_payload_mismatch():
    with pytest.raises(FrameError, match="C-contiguous"):
        encode_frame(_header(), np.zeros((10, 10), np.uint8)[:, ::2])
    with pytest.raises(FrameError, match="payload_bytes=5 but the body has 10"):
        encode_frame(_header(payload_bytes=5), np.zeros(10, np.uint8))


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(dtype="int3"), "dtype"),
        (dict(layer_start=4, layer_end=4), "layer range"),
        (dict(token_start=5, token_end=4), "token range"),
        (dict(request_id=-1), "request_id"),
        (dict(logical_bytes=1.5), "logical_bytes"),
        (dict(shape=(1, -2)), "shape"),
        (dict(shape=[1, 2]), "shape"),
    ],
)
def test_header_validation(kw, match):
    with pytest.raises(FrameError, match=match):
        _header(**kw)


def test_checksum_error_names_request_and_layers():
    frame = encode_frame(_header(request_id=42, layer_start=3, layer_end=5, shape=()), np.arange(256, dtype=np.uint8))
    bad = corrupt_frame(frame, seed=3)
    assert not np.array_equal(bad, frame)
    assert decode_frame(frame)[0].request_id == 42  # the original is untouched
    with pytest.raises(ChecksumError, match=r"request 42, layers \[3, 5\)") as info:
        decode_frame(bad)
    assert isinstance(info.value, FrameError)
    assert info.value.request_id == 42 and info.value.layer_range == (3, 5)
    assert info.value.expected != info.value.actual
    assert peek_header(bad).request_id == 42  # peek does not hash
    again = pickle.loads(pickle.dumps(info.value))  # crosses Ray actor boundaries
    assert str(again) == str(info.value) and again.layer_range == (3, 5)


def test_every_corruption_seed_is_detected():
    frame = encode_frame(_header(), np.zeros(64, np.uint8))
    for seed in range(50):
        with pytest.raises(ChecksumError):
            decode_frame(corrupt_frame(frame, seed))


def _prefix_parts(frame: np.ndarray):
    """Split a frame into (header map bytes, body offset)."""
    u = msgpack.Unpacker()
    u.feed(frame[1:].tobytes())
    hmap = u.unpack()
    return hmap, 1 + u.tell()


def _rebuild(hmap: dict, body: bytes, marker: bytes | None = None) -> np.ndarray:
    head = b"\x92" + msgpack.packb(hmap)
    binhdr = marker if marker is not None else struct.pack(">BI", 0xC6, len(body))
    return np.frombuffer(head + binhdr + body, dtype=np.uint8)


def test_malformed_frames_raise_frame_error_saying_what_is_wrong():
    frame = encode_frame(_header(), np.arange(100, dtype=np.uint8))
    hmap, off = _prefix_parts(frame)
    body = frame[off + 5:].tobytes()
    cases = [
        (np.zeros(0, np.uint8), "too short"),
        (np.frombuffer(b"\x93" + frame[1:].tobytes(), np.uint8), "byte 0 is 0x93"),
        (frame[:-1], "truncated"),
        (np.concatenate([frame, np.zeros(3, np.uint8)]), "extra bytes"),
        (frame[:10], "header is truncated"),
        (_rebuild({**hmap, "v": 99}, body), "version 99 is not supported"),
        (_rebuild({k: v for k, v in hmap.items() if k != "rid"}, body), "no 'rid' field"),
        (_rebuild({**hmap, "layers": [1]}, body), "'layers'"),
        (_rebuild({**hmap, "dtype": 3}, body), "'dtype'"),
        (_rebuild({**hmap, "payload": 99}, body), "payload 99 bytes, bin holds 100"),
        (_rebuild(hmap, body, marker=b"\xa4"), "bin marker"),
        (np.frombuffer(b"\x92\x91\x01\xc4\x00", np.uint8), "header must be a msgpack map"),
        (np.frombuffer(b"\x92\xc1\x00", np.uint8), "not valid msgpack"),
        (np.zeros((2, 2), np.uint8), "1-D"),
    ]
    for bad, match in cases:
        with pytest.raises(FrameError, match=match):
            decode_frame(bad)
    with pytest.raises(FrameError):
        decode_frame("not a frame")  # type: ignore[arg-type]


def test_short_bin_markers_from_other_writers_are_accepted():
    frame = encode_frame(_header(), np.arange(100, dtype=np.uint8))
    hmap, off = _prefix_parts(frame)
    body = frame[off + 5:].tobytes()
    other = np.frombuffer(b"\x92" + msgpack.packb(hmap) + msgpack.packb(body), np.uint8)  # bin8
    assert other.nbytes == frame.nbytes - 3
    h, view = decode_frame(other)
    assert view.tobytes() == body


def test_group_logical_bytes_partition_exactly():
    total = 1000 * 70272 + 13
    parts = [group_logical_bytes(total, 61, a, min(61, a + 4)) for a in range(0, 61, 4)]
    assert sum(parts) == total and max(parts) - min(p for p in parts[:-1]) <= 1


def test_payload_size_rules():
    assert payload_size(0, 0.5) == 0
    assert payload_size(10, 1e-9) == 1
    assert payload_size(1000, 0.01) == 10
    assert payload_size(1000, 1.0) == 1000


def test_make_kv_frames_llama8b_layout():
    # Llama-3.1-8B: 32 layers, 131,072 KV bytes/token at 16-bit (reference/hardware.md)
    frames = make_kv_frames(5, 300, 131072, 32, 8, 0.01, kv_dtype="bf16", seed=1)
    assert len(frames) == 4
    headers = [decode_frame(f)[0] for f in frames]
    assert [h.layer_range for h in headers] == [(0, 8), (8, 16), (16, 24), (24, 32)]
    assert all(h.token_range == (0, 300) and h.dtype == "bf16" for h in headers)
    assert all(h.shape == (8, 300, 2048) for h in headers)  # 4096 bytes/layer/token = 2048 bf16
    assert all(h.logical_bytes == 300 * 131072 // 4 for h in headers)
    assert all(h.payload_bytes == round(300 * 131072 // 4 * 0.01) for h in headers)
    assert verify_kv_frames(frames) == (4, 0, 300 * 131072, sum(h.payload_bytes for h in headers))


def test_make_kv_frames_fp4_and_uneven_layout_shapes():
    h = decode_frame(make_kv_frames(1, 10, 70272 // 4, 61, 61, 1.0, kv_dtype="fp4")[0])[0]
    assert h.shape == (61, 10, 576)  # 288 bytes/layer/token = 576 fp4 elements
    h = decode_frame(make_kv_frames(1, 10, 1000, 7, 3, 1.0, kv_dtype="fp8")[0])[0]
    assert h.shape == (h.logical_bytes,)  # 1000 bytes do not split over 7 layers: flat


def test_make_kv_frames_is_deterministic_and_seed_dependent():
    a = make_kv_frames(3, 64, 4096, 4, 2, 0.5, seed=0)
    b = make_kv_frames(3, 64, 4096, 4, 2, 0.5, seed=0)
    c = make_kv_frames(3, 64, 4096, 4, 2, 0.5, seed=1)
    d = make_kv_frames(4, 64, 4096, 4, 2, 0.5, seed=0)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    bodies = lambda fs: [decode_frame(f)[1].tobytes() for f in fs]  # noqa: E731
    assert bodies(a) != bodies(c) and bodies(a)[0] != bodies(d)[0] and bodies(a)[0] != bodies(a)[1]
    # real pseudo-random bytes, not a constant fill
    body = decode_frame(a[0])[1]
    assert len(np.unique(body)) > 200


def test_make_kv_frames_body_larger_than_random_block():
    # 12 MiB body > the 8 MiB cached block: the stream wraps and still verifies
    frames = make_kv_frames(9, 3 << 10, 4096, 1, 1, 1.0)
    h, body = decode_frame(frames[0])
    assert h.payload_bytes == 12 << 20
    assert verify_kv_frames(frames)[:2] == (1, 0)
    again = make_kv_frames(9, 3 << 10, 4096, 1, 1, 1.0)
    assert np.array_equal(frames[0], again[0])


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(n_tokens=0), "n_tokens"),
        (dict(kv_bytes_per_token=0), "kv_bytes_per_token"),
        (dict(n_layers=0), "n_layers"),
        (dict(layer_group=0), "layer_group"),
        (dict(payload_scale=0.0), "payload_scale"),
        (dict(payload_scale=1.5), "payload_scale"),
        (dict(payload_scale=math.nan), "payload_scale"),
        (dict(kv_dtype="int8"), "kv_dtype"),
        (dict(request_id=-3), "request_id"),
    ],
)
def test_make_kv_frames_rejects_bad_arguments(kw, match):
    args = dict(request_id=1, n_tokens=10, kv_bytes_per_token=100, n_layers=4, layer_group=2,
                payload_scale=0.5, kv_dtype="fp8", seed=0)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        make_kv_frames(**args)


def test_verify_kv_frames_counts_bad_and_sums_good_only():
    frames = make_kv_frames(2, 100, 1000, 10, 2, 0.1)
    good_logical = sum(decode_frame(f)[0].logical_bytes for f in frames[1:])
    good_payload = sum(decode_frame(f)[0].payload_bytes for f in frames[1:])
    frames[0] = corrupt_frame(frames[0], 0)
    frames.append(np.zeros(4, np.uint8))
    assert verify_kv_frames(frames) == (4, 2, good_logical, good_payload)


@settings(max_examples=60, deadline=None)
@given(
    n_tokens=st.integers(1, 3000),
    kvpt=st.integers(1, 400_000),
    n_layers=st.integers(1, 130),
    group=st.integers(1, 140),
    scale=st.floats(1e-6, 1.0),
)
def test_make_kv_frames_totals_property(n_tokens, kvpt, n_layers, group, scale):
    scale = min(scale, 0.002)  # keep bodies small: the property is about accounting
    frames = make_kv_frames(11, n_tokens, kvpt, n_layers, group, scale)
    assert len(frames) == math.ceil(n_layers / group)
    headers = [peek_header(f) for f in frames]
    assert sum(h.logical_bytes for h in headers) == n_tokens * kvpt
    assert headers[0].layer_start == 0 and headers[-1].layer_end == n_layers
    assert all(a.layer_end == b.layer_start for a, b in zip(headers, headers[1:]))
    # A layer group can carry 0 logical bytes (fewer bytes than groups); any other ships >= 1.
    assert all(h.payload_bytes == payload_size(h.logical_bytes, scale) for h in headers)
    assert all(h.payload_bytes >= 1 for h in headers if h.logical_bytes > 0)
    good, bad, logical, _ = verify_kv_frames(frames)
    assert (good, bad, logical) == (len(frames), 0, n_tokens * kvpt)


# xxh3_128 of the concatenated frames, as make_kv_frames wrote them before its headers were
# assembled from pre-packed pieces (commit ed6f020): the frames must stay bit-identical.
_GOLDEN_FRAMES = [
    ((77, 1000, 35_136, 61, 8, 1e-3, "fp8", 3), 8, 35_928, "04946a582fd9876db5c18b78d1e43bcc"),
    ((2**64 - 1, 4097, 131_072, 32, 8, 1e-2, "bf16", 2**64 - 1), 4, 5_370_460, "f665f99bb1350d34316c61a45107e986"),
    ((128, 30, 1_000_003, 80, 7, 0.05, "fp4", 0), 12, 1_501_174, "82bfe88e2327039e3ae766a4e3c2920f"),
    ((65_536, 70, 131_072, 1, 1, 1.0, "fp8", 11), 1, 9_175_143, "f772ad7df9897869aa9d498d751996ef"),
]


@pytest.mark.parametrize("args, n_frames, n_bytes, digest", _GOLDEN_FRAMES)
def test_make_kv_frames_bytes_are_pinned(args, n_frames, n_bytes, digest):
    *pos, dtype, seed = args
    for _ in range(2):                                  # layout built, then from the cache
        frames = make_kv_frames(*pos, kv_dtype=dtype, seed=seed)
        assert (len(frames), sum(f.nbytes for f in frames)) == (n_frames, n_bytes)
        assert xxhash.xxh3_128_hexdigest(b"".join(bytes(f) for f in frames)) == digest


@pytest.mark.parametrize("request_id", [0, 1, 127, 128, 255, 256, 65_535, 65_536, 2**32 - 1, 2**32, 2**64 - 1])
@pytest.mark.parametrize("n_tokens, kvpt, n_layers, group, scale, dtype", [
    (1, 35_136, 61, 8, 1e-3, "fp8"), (127, 35_136, 61, 8, 1e-3, "fp8"), (65_536, 35_136, 61, 8, 1e-4, "fp8"),
    (300, 131_072, 32, 8, 0.01, "bf16"), (10, 1000, 7, 3, 1.0, "fp8"), (9, 1, 5, 2, 1.0, "fp32"),
    (200, 576, 61, 200, 0.5, "fp4"), (5, 7, 3, 1, 1, "fp16"),
])
def test_make_kv_frames_equal_encode_frame_of_their_headers(request_id, n_tokens, kvpt, n_layers, group,
                                                            scale, dtype):
    """Every frame is exactly what `encode_frame` (one msgpack.packb of the header map)
    makes of its header and body, and the body is the random stream at the documented
    offset; with and without a cached layout."""
    codec._LAYOUTS.clear()
    for _ in range(2):
        frames = make_kv_frames(request_id, n_tokens, kvpt, n_layers, group, scale, kv_dtype=dtype, seed=5)
        for f in frames:
            h, body = decode_frame(f)
            assert bytes(encode_frame(h, body)) == bytes(f)
            start = xxhash.xxh3_64_intdigest(struct.pack("<QQQ", 5, request_id, h.layer_start)) % (8 << 20)
            assert bytes(body) == bytes(codec._random_block()[start : start + h.payload_bytes])


def test_pack_uint_is_msgpack_encoding():
    edges = [0, 1, 127, 128, 255, 256, 65_535, 65_536, 2**32 - 1, 2**32, 2**63, 2**64 - 1, -1, -32, -33, -129]
    for v in edges + list(range(0, 70_000, 7)):
        assert codec._pack_uint(v) == msgpack.packb(v), v
    with pytest.raises(OverflowError):
        codec._pack_uint(2**64)                         # msgpack's own error, as packb raised before
    for seq in [(), (0, 5), (8, 1000, 576), tuple(range(15)), tuple(range(16)), (2**64 - 1,)]:
        assert codec._pack_ints(seq) == msgpack.packb(list(seq))


def test_make_kv_frames_checks_arguments_also_with_a_cached_layout():
    make_kv_frames(1, 10, 100, 4, 2, 0.5)               # caches the layout
    with pytest.raises(ValueError, match="request_id must be < 2"):
        make_kv_frames(2**64, 10, 100, 4, 2, 0.5)
    with pytest.raises(ValueError, match="payload_scale"):
        make_kv_frames(1, 10, 100, 4, 2, [0.5])         # unhashable: still a ValueError
    with pytest.raises(ValueError, match="n_tokens"):
        make_kv_frames(1, np.int64(0), 100, 4, 2, 0.5)
    # numpy integers are accepted and give the same frames as ints
    a = make_kv_frames(np.int64(1), np.int32(10), np.uint16(100), 4, 2, 0.5, seed=np.uint8(2))
    b = make_kv_frames(1, 10, 100, 4, 2, 0.5, seed=2)
    assert [bytes(x) for x in a] == [bytes(y) for y in b]
