"""The KV payload codec: one msgpack frame per layer group of a request's KV cache.

Frame layout (version 1). A frame is one msgpack object, a 2-element array::

    0x92                      fixarray of 2
    <header map>              msgpack map, keys below; "xxh3" is always the last key and
                              always packed as uint64 (0xcf + 8 bytes big-endian)
    0xc6 <len: uint32 BE>     msgpack bin32 holding the body (the KV bytes)
    <body bytes>

so `msgpack.unpackb(frame)` gives `[header_dict, body_bytes]` to any msgpack reader.
Header keys (see `FrameHeader` for meanings and units):
``v`` format version, ``rid`` request id, ``layers`` [first, end) layer range, ``tokens``
[first, end) token range, ``dtype`` KV dtype name, ``shape`` logical KV shape (elements),
``logical`` logical byte count, ``payload`` body byte count, ``xxh3`` xxh3_64 of the body.

Speed (see scripts/bench_codec.py): encoding allocates (or reuses) one output buffer,
writes the header, then copies the body in cache-sized chunks while hashing each chunk
just written (it is still in L2), so the body crosses main memory once for read and
once for write, like a plain memcpy. Decoding parses only the header and returns the
body as a zero-copy view after one hash pass over it. A request's payload (`KVFrames`,
all frames in one buffer) is checked in one call (`scan_kv_frames`): in the process
that made it, each header is compared with the record `make_kv_frames` kept of it
instead of being parsed; elsewhere (after pickling) each header is one msgpack call.
"""

from __future__ import annotations

import math
import operator
import struct
from collections import OrderedDict
from dataclasses import dataclass
import msgpack
import numpy as np
import xxhash

__all__ = [
    "FORMAT_VERSION",
    "KV_DTYPE_BITS",
    "ChecksumError",
    "FrameError",
    "FrameHeader",
    "KVDescription",
    "KVFrames",
    "check_description",
    "corrupt_frame",
    "decode_frame",
    "describe_kv_frames",
    "encode_frame",
    "frame_size",
    "group_logical_bytes",
    "make_kv_frames",
    "payload_size",
    "peek_header",
    "scan_kv_frames",
    "verify_kv_frames",
]

FORMAT_VERSION = 1
"""Version written into every frame; `decode_frame` rejects any other."""

KV_DTYPE_BITS: dict[str, int] = {"fp32": 32, "bf16": 16, "fp16": 16, "fp8": 8, "fp4": 4}
"""Bits per element of the KV dtypes a header may name (docs/interfaces.md uses
"bf16", "fp8", "fp4"; fp16/fp32 are accepted for user-supplied layouts)."""

MAX_BODY_BYTES = 2**32 - 1
"""Largest body a msgpack bin32 can hold (msgpack spec: 32-bit big-endian length)."""

_CHUNK = 256 << 10
# Copy+hash granularity: each 256 KiB chunk is hashed right after it is written, while
# it is still in L2 (512 KiB per core on the project machine), so the body crosses
# main memory once for read and once for write, as in a plain memcpy. Measured on the
# project machine (AMD EPYC, 2 shared cores, 16 MB frames, interleaved medians of 40):
# encode+decode at 0.52-0.53 of the np.copyto rate with 256 KiB chunks, 0.48-0.50 with
# 1 MiB, 0.44-0.46 for hash-then-copy or copy-then-hash of the whole body.

_MAX_HEADER = 1 << 20  # a header larger than this is treated as a malformed frame
_FIRST_PEEK = 512  # typical headers are ~100 bytes: one small feed parses them
_U64_MAX = 2**64 - 1
_BIN32 = 0xC6
_FIXARRAY2 = 0x92
_HEADER_KEYS = ("v", "rid", "layers", "tokens", "dtype", "shape", "logical", "payload", "xxh3")


class FrameError(ValueError):
    """A frame is malformed (bad marker, header field, length, version) or fails its check."""


class ChecksumError(FrameError):
    """A frame's body does not match its xxh3_64 checksum.

    Attributes: request_id, layer_range ((first, end) layer indices), expected and
    actual checksums (ints).
    """

    def __init__(self, request_id: int, layer_range: tuple[int, int], expected: int, actual: int):
        self.request_id = request_id
        self.layer_range = layer_range
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"KV frame of request {request_id}, layers [{layer_range[0]}, {layer_range[1]}): "
            f"checksum mismatch (header xxh3_64 {expected:#018x}, body hashes to {actual:#018x})"
        )

    def __reduce__(self):
        # picklable, so the error survives crossing a Ray actor boundary
        return (type(self), (self.request_id, self.layer_range, self.expected, self.actual))


@dataclass(frozen=True, slots=True)
class FrameHeader:
    """Metadata of one KV frame.

    request_id: the request's id (int >= 0).
    layer_start, layer_end: layer range [layer_start, layer_end), 0 <= start < end.
    token_start, token_end: token range [token_start, token_end), 0 <= start <= end.
    dtype: KV dtype name, a key of `KV_DTYPE_BITS`.
    shape: logical KV shape in elements of `dtype` (what the body would hold at
        payload_scale 1.0); () when unknown.
    logical_bytes: true KV size of this layer group (what the link is charged for), bytes.
    payload_bytes: bytes of the body actually shipped (logical x payload_scale). None in a
        header handed to `encode_frame` means "fill in from the body".
    checksum: xxh3_64 of the body; None before encoding (`encode_frame` computes it).
    version: frame format version (`FORMAT_VERSION`).

    Raises FrameError on out-of-range fields.
    """

    request_id: int
    layer_start: int
    layer_end: int
    token_start: int
    token_end: int
    dtype: str
    shape: tuple[int, ...]
    logical_bytes: int
    payload_bytes: int | None = None
    checksum: int | None = None
    version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        # Fast path (every frame of a run goes through here three times: built, peeked
        # by the interconnect, decoded by the receiver): plain in-range ints, a known
        # dtype, a tuple shape. Anything else takes the detailed checks below, which
        # accept numpy integers too and name the bad field.
        p, c = self.payload_bytes, self.checksum
        if (type(self.request_id) is int and type(self.layer_start) is int
                and type(self.layer_end) is int and type(self.token_start) is int
                and type(self.token_end) is int and type(self.logical_bytes) is int
                and type(self.version) is int and type(self.shape) is tuple
                and 0 <= self.request_id <= _U64_MAX and 0 <= self.layer_start < self.layer_end
                and 0 <= self.token_start <= self.token_end and self.logical_bytes >= 0
                and self.version >= 0 and type(self.dtype) is str and self.dtype in KV_DTYPE_BITS
                and (p is None or (type(p) is int and 0 <= p <= MAX_BODY_BYTES))
                and (c is None or (type(c) is int and 0 <= c <= _U64_MAX))
                and all(type(d) is int and d >= 0 for d in self.shape)):
            return
        self._check_fields()

    @classmethod
    def _trusted(cls, request_id: int, layer_start: int, layer_end: int, token_start: int,
                 token_end: int, dtype: str, shape: tuple, logical_bytes: int,
                 payload_bytes: int, checksum: int) -> "FrameHeader":
        """A header from values its maker has already checked (`make_kv_frames`):
        the frozen fields are set without `__post_init__` (a third of the cost)."""
        h = object.__new__(cls)
        set_ = object.__setattr__
        set_(h, "request_id", request_id)
        set_(h, "layer_start", layer_start)
        set_(h, "layer_end", layer_end)
        set_(h, "token_start", token_start)
        set_(h, "token_end", token_end)
        set_(h, "dtype", dtype)
        set_(h, "shape", shape)
        set_(h, "logical_bytes", logical_bytes)
        set_(h, "payload_bytes", payload_bytes)
        set_(h, "checksum", checksum)
        set_(h, "version", FORMAT_VERSION)
        return h

    def _check_fields(self) -> None:
        """The detailed checks of `__post_init__`; raise FrameError naming the field."""
        def need_int(name: str, lo: int, hi: int | None = None) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise FrameError(f"frame header field {name!r}: expected an integer, got {v!r}")
            if v < lo or (hi is not None and v > hi):
                bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
                raise FrameError(f"frame header field {name!r}: expected {bound}, got {v}")

        need_int("request_id", 0, _U64_MAX)
        need_int("layer_start", 0)
        need_int("layer_end", 1)
        need_int("token_start", 0)
        need_int("token_end", 0)
        need_int("logical_bytes", 0)
        need_int("version", 0)
        if self.payload_bytes is not None:
            need_int("payload_bytes", 0, MAX_BODY_BYTES)
        if self.checksum is not None:
            need_int("checksum", 0, _U64_MAX)
        if self.layer_end <= self.layer_start:
            raise FrameError(
                f"frame header of request {self.request_id}: layer range "
                f"[{self.layer_start}, {self.layer_end}) is empty (need start < end)"
            )
        if self.token_end < self.token_start:
            raise FrameError(
                f"frame header of request {self.request_id}: token range "
                f"[{self.token_start}, {self.token_end}) is reversed"
            )
        if self.dtype not in KV_DTYPE_BITS:
            raise FrameError(
                f"frame header field 'dtype': expected one of {sorted(KV_DTYPE_BITS)}, "
                f"got {self.dtype!r}"
            )
        if not isinstance(self.shape, tuple) or not all(
            isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0
            for d in self.shape
        ):
            raise FrameError(
                f"frame header field 'shape': expected a tuple of non-negative ints, "
                f"got {self.shape!r}"
            )

    @property
    def layer_range(self) -> tuple[int, int]:
        """(layer_start, layer_end)."""
        return (self.layer_start, self.layer_end)

    @property
    def token_range(self) -> tuple[int, int]:
        """(token_start, token_end)."""
        return (self.token_start, self.token_end)


# ---------------------------------------------------------------------------- encode


def _header_prefix(header: FrameHeader, n_body: int) -> bytearray:
    """Bytes before the body: fixarray marker, header map, bin32 marker and length.

    The checksum slot is packed as 0xcf ffff...ff (uint64), the map's last entry, so
    the real value can be written into the 8 bytes before the bin32 marker afterwards.
    """
    hmap = {
        "v": int(header.version),
        "rid": int(header.request_id),
        "layers": [int(header.layer_start), int(header.layer_end)],
        "tokens": [int(header.token_start), int(header.token_end)],
        "dtype": header.dtype,
        "shape": [int(d) for d in header.shape],
        "logical": int(header.logical_bytes),
        "payload": n_body,
        "xxh3": _U64_MAX,
    }
    return _pack_prefix(hmap, n_body)


def _pack_prefix(hmap: dict, n_body: int) -> bytearray:
    """Frame marker, packed header map (its "xxh3" entry last, as _U64_MAX), bin32 marker
    and body length."""
    prefix = bytearray(b"\x92")
    prefix += msgpack.packb(hmap)
    prefix += struct.pack(">BI", _BIN32, n_body)
    return prefix


def _checksum_slot(prefix_len: int) -> slice:
    """Position of the 8 checksum bytes inside a prefix of `prefix_len` bytes."""
    return slice(prefix_len - 5 - 8, prefix_len - 5)


def _as_u8(body: np.ndarray | bytes | bytearray | memoryview) -> np.ndarray:
    if isinstance(body, np.ndarray):
        if not body.flags.c_contiguous:
            raise FrameError(
                f"frame body must be a C-contiguous array (got strides {body.strides}); "
                "pass np.ascontiguousarray(body)"
            )
        return body.reshape(-1).view(np.uint8)
    try:
        return np.frombuffer(body, dtype=np.uint8)
    except TypeError as e:
        raise FrameError(f"frame body must be a numpy array or bytes-like, got {type(body).__name__}") from e


def _write_frame(
    header: FrameHeader,
    n_body: int,
    src: np.ndarray,
    out: np.ndarray | None,
    cyclic_start: int | None = None,
) -> np.ndarray:
    """Build a frame whose body is `src[:n_body]`, or, with `cyclic_start`, the bytes of
    the cyclic random stream from that position (`src` is then `_random_block()`).

    The body is written and hashed chunk by chunk (see `_CHUNK`). Returns the frame (a
    view of `out` when given).
    """
    if n_body > MAX_BODY_BYTES:
        raise FrameError(
            f"frame body of request {header.request_id} is {n_body} bytes; a msgpack bin32 "
            f"holds at most {MAX_BODY_BYTES}: use smaller layer groups"
        )
    if header.payload_bytes is not None and header.payload_bytes != n_body:
        raise FrameError(
            f"frame header of request {header.request_id} says payload_bytes="
            f"{header.payload_bytes} but the body has {n_body} bytes"
        )
    prefix = _header_prefix(header, n_body)
    p = len(prefix)
    total = p + n_body
    if out is None:
        frame = np.empty(total, dtype=np.uint8)
    else:
        if not isinstance(out, np.ndarray) or out.dtype != np.uint8 or out.ndim != 1 or not out.flags.c_contiguous:
            raise FrameError("out must be a 1-D C-contiguous uint8 numpy array")
        if out.nbytes < total:
            raise FrameError(f"out buffer holds {out.nbytes} bytes; this frame needs {total}")
        frame = out[:total]
    _fill_frame(frame, prefix, n_body, src, cyclic_start)
    return frame


def _fill_frame(frame: np.ndarray, prefix: bytearray, n_body: int, src: np.ndarray,
                cyclic_start: int | None) -> int:
    """Write `prefix` (its checksum slot filled in here) and the body into `frame`
    (exactly len(prefix) + n_body bytes); returns the body's xxh3_64.

    The body is copied and hashed chunk by chunk (see `_CHUNK`): `src[:n_body]`, or
    with `cyclic_start` the cyclic random stream (`_random_block()`) from there.
    """
    p = len(prefix)
    digest = _copy_body(frame[p:], n_body, src, cyclic_start)
    prefix[_checksum_slot(p)] = digest.to_bytes(8, "big")
    memoryview(frame)[:p] = prefix
    return digest


def _copy_body(body_dst: np.ndarray, n_body: int, src: np.ndarray, cyclic_start: int | None) -> int:
    """Copy the body into `body_dst` (n_body bytes) and return its xxh3_64; see `_fill_frame`."""
    if n_body <= _CHUNK:
        # one chunk: copy, hash, no streaming hasher (the common KV frame at small
        # payload_scale)
        if cyclic_start is None:
            np.copyto(body_dst, src[:n_body])
        else:
            s = cyclic_start % _RANDOM_BLOCK
            np.copyto(body_dst, src[s : s + n_body])
        return xxhash.xxh3_64_intdigest(body_dst)
    h = xxhash.xxh3_64()
    update = h.update
    copyto = np.copyto
    for off in range(0, n_body, _CHUNK):
        end = min(off + _CHUNK, n_body)
        chunk = body_dst[off:end]
        if cyclic_start is None:
            copyto(chunk, src[off:end])
        else:
            s = (cyclic_start + off) % _RANDOM_BLOCK
            copyto(chunk, src[s : s + end - off])
        update(chunk)
    return h.intdigest()


def encode_frame(
    header: FrameHeader,
    body: np.ndarray | bytes | bytearray | memoryview,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Encode one KV frame.

    header: the frame's metadata; `payload_bytes` (if not None) must equal the body's
        size; `checksum` is ignored and computed here (xxh3_64 of the body).
    body: C-contiguous numpy array of any dtype (its raw bytes are shipped) or bytes-like.
    out: optional reusable 1-D uint8 buffer of at least `frame_size(header, n)` bytes;
        the frame is written to its start and a view of that prefix is returned (no
        allocation: reuse it for big frames, fresh large allocations page-fault).
    Returns a 1-D uint8 array: the msgpack frame (layout in the module docstring).
    Raises FrameError on a bad header, a body over 4 GiB - 1 bytes, or a short `out`.
    """
    src = _as_u8(body)
    return _write_frame(header, src.shape[0], src, out)


def frame_size(header: FrameHeader, n_body: int) -> int:
    """Bytes of the frame `encode_frame(header, body)` makes for a body of `n_body` bytes."""
    return len(_header_prefix(header, n_body)) + n_body


# ---------------------------------------------------------------------------- decode


def _as_frame_array(frame: np.ndarray | bytes | bytearray | memoryview) -> np.ndarray:
    if isinstance(frame, np.ndarray):
        if frame.dtype != np.uint8 or frame.ndim != 1 or not frame.flags.c_contiguous:
            raise FrameError(
                f"a frame must be a 1-D C-contiguous uint8 array, got dtype {frame.dtype}, "
                f"shape {frame.shape}"
            )
        return frame
    try:
        return np.frombuffer(frame, dtype=np.uint8)
    except TypeError as e:
        raise FrameError(f"a frame must be a numpy uint8 array or bytes-like, got {type(frame).__name__}") from e


def _field(hmap: dict, key: str, kind: type | tuple[type, ...]):
    if key not in hmap:
        raise FrameError(f"frame header has no {key!r} field (keys: {sorted(map(str, hmap))})")
    v = hmap[key]
    if not isinstance(v, kind) or isinstance(v, bool):
        raise FrameError(f"frame header field {key!r}: expected {kind}, got {v!r}")
    return v


def _pair(hmap: dict, key: str) -> tuple[int, int]:
    v = _field(hmap, key, (list, tuple))
    if len(v) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise FrameError(f"frame header field {key!r}: expected [start, end] integers, got {v!r}")
    return int(v[0]), int(v[1])


_XXH3_ENTRY = b"\xa4xxh3\xcf"  # the header's last entry: fixstr "xxh3", uint64 marker
_TAIL = struct.Struct(">QBI")  # after the header map's xxh3 marker: checksum, bin32 marker, body length
_TAIL_BYTES = _TAIL.size


_U8 = np.dtype(np.uint8)     # numpy's built-in dtypes are singletons: `is` compares them


def _frame_buffer(frame) -> memoryview | np.ndarray | None:
    """`frame` as a 1-D C-contiguous byte buffer (the array itself for a uint8 array),
    or None if it is not one (or not a buffer at all)."""
    if type(frame) is np.ndarray:
        # the frames `make_kv_frames` cuts: read as they are (a memoryview of each costs
        # more than the rest of the parse)
        if frame.dtype is not _U8 or frame.ndim != 1 or not frame.flags.c_contiguous:
            return None
        return frame
    try:
        mv = memoryview(frame)
    except Exception:   # no buffer (TypeError), or one numpy cannot export (ValueError)
        return None
    if mv.format != "B" or mv.ndim != 1 or not mv.c_contiguous:
        return None
    return mv


def _fast_view(frame) -> tuple[memoryview | np.ndarray, tuple, int, int] | None:
    """The fast parse of a frame laid out as `encode_frame` / `make_kv_frames` write it
    (the header map ends with the xxh3 entry, then a bin32 body fills the rest of the
    frame): (the frame as a 1-D byte buffer, header entry, body offset, checksum), or
    None for any other frame (or a non-buffer), which `_parse` then checks field by
    field. See `_read_frame`.
    """
    mv = _frame_buffer(frame)
    read = None if mv is None else _read_frame(mv, 0, len(mv))
    return None if read is None else (mv, *read)


def _read_frame(buf: memoryview | np.ndarray, start: int, end: int) -> tuple[tuple, int, int] | None:
    """(header entry, body offset in `buf`, checksum) of the frame `buf[start:end]` (a
    1-D byte buffer), or None if it is not laid out as `encode_frame` /
    `make_kv_frames` write it. The body is not hashed here.

    The header entry is the tuple (request_id, layer_start, layer_end, token_start,
    token_end, dtype, shape, logical_bytes, payload_bytes). One msgpack call parses the
    exact header bytes: it succeeds only if the map ends exactly at the end of the xxh3
    entry, so a frame accepted here parses to the same header as on the general path.
    """
    head = buf[start : min(end, start + _FIRST_PEEK)].tobytes()
    kend = head.find(_XXH3_ENTRY) + len(_XXH3_ENTRY)
    if kend < len(_XXH3_ENTRY) or kend + _TAIL_BYTES > len(head) or head[0] != _FIXARRAY2:
        return None
    entry = _entry_of(head[1 : kend + 8])
    if entry is None:
        return None
    checksum, marker, body_len = _TAIL.unpack_from(head, kend)
    body = start + kend + _TAIL_BYTES
    if marker != _BIN32 or body_len != entry[8] or body + body_len != end:
        return None
    return entry, body, checksum


def _read_known(buf: memoryview, start: int, end: int, head: tuple[bytes, tuple]) -> tuple[tuple, int, int] | None:
    """`_read_frame` for a frame whose header its maker recorded: `head` is (the packed
    header up to the checksum, its header tuple). The frame's bytes are compared with
    the record, so a changed header falls back to parsing (None)."""
    key, entry = head
    kend = start + len(key)
    if kend + _TAIL_BYTES > end or buf[start:kend].tobytes() != key:
        return None
    checksum, marker, body_len = _TAIL.unpack_from(buf, kend)
    body = kend + _TAIL_BYTES
    if marker != _BIN32 or body_len != entry[8] or body + body_len != end:
        return None
    return entry, body, checksum


def _parse_fast(frame: np.ndarray) -> tuple[FrameHeader, int, int] | None:
    """`_parse` for a frame `_fast_view` accepts; None for any other frame."""
    fast = _fast_view(frame)
    if fast is None:
        return None
    mv, entry, body_off, checksum = fast
    return FrameHeader._trusted(*entry, checksum), body_off, len(mv) - body_off


def _entry_of_header(h: FrameHeader) -> tuple:
    """`h` as a header tuple (checksum and version dropped; see `_read_frame`)."""
    return (h.request_id, h.layer_start, h.layer_end, h.token_start, h.token_end, h.dtype, h.shape,
            h.logical_bytes, h.payload_bytes)


def _entry_of(packed: bytes) -> tuple | None:
    """The header entry of exactly one packed header map, or None if it is not one."""
    try:
        hmap = msgpack.unpackb(packed)
        layers, tokens, shape = hmap["layers"], hmap["tokens"], hmap["shape"]
        if (type(layers) is not list or len(layers) != 2 or type(tokens) is not list
                or len(tokens) != 2 or type(shape) is not list
                or type(hmap["v"]) is not int or hmap["v"] != FORMAT_VERSION):
            return None
        header = FrameHeader(
            request_id=hmap["rid"], layer_start=layers[0], layer_end=layers[1],
            token_start=tokens[0], token_end=tokens[1], dtype=hmap["dtype"], shape=tuple(shape),
            logical_bytes=hmap["logical"], payload_bytes=hmap["payload"], checksum=hmap["xxh3"],
            version=FORMAT_VERSION)
    except (ValueError, TypeError, KeyError, msgpack.UnpackException):
        # FrameError is a ValueError; msgpack's ExtraData too
        return None
    return _entry_of_header(header)


def scan_kv_frames(frames, verify: bool) -> list[tuple | None]:
    """Header tuples (request_id, layer_start, layer_end, token_start, token_end,
    dtype, shape, logical_bytes, payload_bytes) of a payload's `frames` (uint8 arrays
    or bytes-like), in order, for the per-transfer checks (the interconnect's header
    check, the receiver's verification). Never raises for a bad frame.

    With `verify`: one per frame, None where `decode_frame` would raise
    FrameError (malformed, or the body does not hash to the header's checksum; every
    body is hashed); without, the body is not hashed and the list ends after the first
    None (a frame `peek_header` rejects).

    The frames of an intact `KVFrames` are read through its one buffer, each header
    compared with the record `make_kv_frames` attached (`_read_known`); other frames in
    the layout `make_kv_frames` / `encode_frame` write take one msgpack call on their
    exact header bytes (`_read_frame`), and any other frame `decode_frame` /
    `peek_header`.
    """
    if type(frames) is KVDescription:           # described: headers as they would be read
        return list(frames.entries)
    out: list[tuple | None] = []
    digest = xxhash.xxh3_64_intdigest
    whole = type(frames) is KVFrames and frames.intact()
    if whole:
        base, bounds = memoryview(frames._base), frames._bounds
        heads = frames._heads if len(frames._heads) == len(bounds) else None
    for i, f in enumerate(frames):
        if whole:
            buf = base
            start, end = bounds[i]
            read = _read_known(buf, start, end, heads[i]) if heads is not None else None
            if read is None:
                read = _read_frame(buf, start, end)
        else:
            buf = _frame_buffer(f)
            read = None if buf is None else _read_frame(buf, 0, len(buf))
            end = 0 if buf is None else len(buf)
        if read is not None:
            entry, body, checksum = read
            if verify and digest(buf[body:end]) != checksum:
                out.append(None)            # read fine, corrupted: ChecksumError
                continue
        else:
            try:
                entry = _entry_of_header(decode_frame(f)[0] if verify else peek_header(f))
            except FrameError:
                out.append(None)
                if verify:
                    continue
                break
        out.append(entry)
    return out


def _parse(frame: np.ndarray) -> tuple[FrameHeader, int, int]:
    """Parse marker, header and bin prefix. Returns (header, body_offset, body_len)."""
    n = frame.shape[0]
    if n < 2:
        raise FrameError(f"frame is {n} bytes long: too short to hold a header")
    fast = _parse_fast(frame)
    if fast is not None:
        return fast
    if frame[0] != _FIXARRAY2:
        raise FrameError(
            f"not a KV frame: byte 0 is {int(frame[0]):#04x}, expected {_FIXARRAY2:#04x} "
            "(msgpack fixarray of 2: header map, body bin)"
        )
    mv = memoryview(frame)
    window = _FIRST_PEEK
    while True:
        end = min(n, 1 + window)
        unpacker = msgpack.Unpacker(raw=False, use_list=True, strict_map_key=True, max_buffer_size=_MAX_HEADER + 1)
        unpacker.feed(mv[1:end])
        try:
            hmap = unpacker.unpack()
            break
        except msgpack.OutOfData:
            if end >= n or window >= _MAX_HEADER:
                raise FrameError(
                    f"frame header is truncated or longer than {_MAX_HEADER} bytes "
                    f"(frame is {n} bytes)"
                ) from None
            window *= 8
        except (ValueError, TypeError, msgpack.UnpackException) as e:
            raise FrameError(f"frame header is not valid msgpack: {e}") from None
    if not isinstance(hmap, dict):
        raise FrameError(f"frame header must be a msgpack map, got {type(hmap).__name__}")
    version = _field(hmap, "v", int)
    if version != FORMAT_VERSION:
        raise FrameError(f"frame format version {version} is not supported (this build reads version {FORMAT_VERSION})")
    layers = _pair(hmap, "layers")
    tokens = _pair(hmap, "tokens")
    shape = _field(hmap, "shape", (list, tuple))
    header = FrameHeader(
        request_id=_field(hmap, "rid", int),
        layer_start=layers[0],
        layer_end=layers[1],
        token_start=tokens[0],
        token_end=tokens[1],
        dtype=_field(hmap, "dtype", str),
        shape=tuple(shape),
        logical_bytes=_field(hmap, "logical", int),
        payload_bytes=_field(hmap, "payload", int),
        checksum=_field(hmap, "xxh3", int),
        version=version,
    )
    off = 1 + unpacker.tell()
    if off >= n:
        raise FrameError(f"frame of request {header.request_id} ends after its header: no body")
    marker = int(frame[off])
    if marker == 0xC4:
        width = 1
    elif marker == 0xC5:
        width = 2
    elif marker == _BIN32:
        width = 4
    else:
        raise FrameError(
            f"frame of request {header.request_id}: byte {off} is {marker:#04x}, expected a "
            "msgpack bin marker (0xc4/0xc5/0xc6) before the body"
        )
    if off + 1 + width > n:
        raise FrameError(f"frame of request {header.request_id} is truncated inside the body length")
    body_len = int.from_bytes(mv[off + 1 : off + 1 + width], "big")
    body_off = off + 1 + width
    if body_len != header.payload_bytes:
        raise FrameError(
            f"frame of request {header.request_id}, layers {list(header.layer_range)}: header "
            f"says payload {header.payload_bytes} bytes, bin holds {body_len}"
        )
    if body_off + body_len != n:
        what = "truncated" if body_off + body_len > n else "followed by extra bytes"
        raise FrameError(
            f"frame of request {header.request_id}, layers {list(header.layer_range)} is {what}: "
            f"{n} bytes, expected {body_off + body_len}"
        )
    return header, body_off, body_len


def peek_header(frame: np.ndarray | bytes | bytearray | memoryview) -> FrameHeader:
    """Parse and check a frame's structure without hashing its body (cheap, O(header)).

    Raises FrameError if the frame is malformed. Does NOT detect a corrupted body: use
    `decode_frame` for that.
    """
    return _parse(_as_frame_array(frame))[0]


def decode_frame(frame: np.ndarray | bytes | bytearray | memoryview) -> tuple[FrameHeader, np.ndarray]:
    """Decode and verify one frame.

    frame: 1-D uint8 numpy array (or bytes-like, wrapped without copying).
    Returns (header, body) where body is a zero-copy 1-D uint8 view of the frame
    (read-only when the frame is `bytes`).
    Raises ChecksumError (naming request id and layer range) if the body does not hash
    to the header's xxh3_64; FrameError if the frame is malformed.
    """
    arr = _as_frame_array(frame)
    header, off, n = _parse(arr)
    body = arr[off : off + n]
    actual = xxhash.xxh3_64_intdigest(body)
    if actual != header.checksum:
        raise ChecksumError(header.request_id, header.layer_range, int(header.checksum), actual)
    return header, body


# ---------------------------------------------------------------------------- KV frames

_RANDOM_BLOCK = 8 << 20
_random_cache: np.ndarray | None = None
_random_view: memoryview | None = None  # of `_random_cache`: slices without numpy's overhead


def _random_block() -> np.ndarray:
    """8 MiB of fixed pseudo-random bytes followed by its first `_CHUNK` bytes again.

    The tail lets a chunk starting anywhere in the first 8 MiB be one contiguous slice
    of a cyclic stream. PCG64 with a fixed seed: the bytes are the same on every run.
    """
    global _random_cache, _random_view
    if _random_cache is None:
        base = np.frombuffer(np.random.Generator(np.random.PCG64(0x4B56)).bytes(_RANDOM_BLOCK), dtype=np.uint8)
        block = np.empty(_RANDOM_BLOCK + _CHUNK, dtype=np.uint8)
        block[:_RANDOM_BLOCK] = base
        block[_RANDOM_BLOCK:] = base[:_CHUNK]
        block.flags.writeable = False
        _random_cache = block
        _random_view = memoryview(block)
    return _random_cache


def payload_size(logical_bytes: int, payload_scale: float) -> int:
    """Body bytes shipped for `logical_bytes` of KV: round(logical x scale), at least 1
    byte when logical > 0 (so every frame carries something to check), 0 when logical is 0."""
    if logical_bytes <= 0:
        return 0
    return max(1, round(logical_bytes * payload_scale))


def group_logical_bytes(total_bytes: int, n_layers: int, layer_start: int, layer_end: int) -> int:
    """Logical bytes of layers [layer_start, layer_end) when `total_bytes` are spread over
    `n_layers` layers: floor(total*end/n) - floor(total*start/n), so the groups of any
    partition sum exactly to `total_bytes` (remainders spread, none lost)."""
    return total_bytes * layer_end // n_layers - total_bytes * layer_start // n_layers


def _layer_elems(kv_bytes_per_token: int, n_layers: int, bits: int) -> int | None:
    """Elements of `bits` per token per layer when the KV bytes split evenly over the
    layers into whole elements (a group's shape is then (layers, tokens, elements)),
    else None (the shape is the group's flat element count, logical x 8 // bits)."""
    per_layer, rem = divmod(kv_bytes_per_token, n_layers)
    if rem == 0 and (per_layer * 8) % bits == 0:
        return per_layer * 8 // bits
    return None


def _check_int(name: str, v: object, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise ValueError(f"make_kv_frames: {name} must be an integer >= {lo}, got {v!r}")
    return int(v)


# msgpack's own encodings (what msgpack.packb writes): a non-negative int takes the
# smallest of positive fixint, uint8/16/32/64; an array of < 16 items a fixarray. Packing
# the few varying fields of a KV header from these pieces costs a fraction of a packb of
# the whole map (tests check the bytes against packb's).
_FIXINT = tuple(bytes((i,)) for i in range(0x80))
_UINT8, _UINT16, _UINT32, _UINT64 = (struct.Struct(">BB"), struct.Struct(">BH"), struct.Struct(">BI"),
                                     struct.Struct(">BQ"))


def _pack_uint(v: int) -> bytes:
    """msgpack.packb(v) for an int v; fast for 0 <= v < 2**64."""
    if 0 <= v < 0x80:
        return _FIXINT[v]
    if 0 <= v < 0x100:
        return _UINT8.pack(0xCC, v)
    if 0 <= v < 0x10000:
        return _UINT16.pack(0xCD, v)
    if 0 <= v < 0x100000000:
        return _UINT32.pack(0xCE, v)
    if 0 <= v <= _U64_MAX:
        return _UINT64.pack(0xCF, v)
    return msgpack.packb(v)                 # msgpack's encoding (or its error) for the rest


def _pack_ints(seq: tuple[int, ...] | list[int]) -> bytes:
    """msgpack.packb(list(seq)) for a sequence of ints."""
    if len(seq) < 16:
        return bytes((0x90 | len(seq),)) + b"".join([_pack_uint(v) for v in seq])
    return msgpack.packb(list(seq))


# A KV header is this prefix, the packed request id, then a tail fixed by the layout
# (`_KVLayout`): the same map, key order and encodings as `_header_prefix`, up to and
# including the xxh3 entry's uint64 marker (`_XXH3_ENTRY`).
_KEY_HEAD = (bytes((_FIXARRAY2, 0x80 | len(_HEADER_KEYS))) + msgpack.packb("v") + msgpack.packb(FORMAT_VERSION)
             + msgpack.packb("rid"))
_K = {k: msgpack.packb(k) for k in _HEADER_KEYS}
_SEED_RID = struct.Struct("<QQ")    # with the group's first layer ("<Q"): the body's stream offset
_LAYER = struct.Struct("<Q")

# Plans by (kv_bytes_per_token, n_layers, layer_group, kv_dtype): what does not depend on
# the prompt length (a handful per run: one per engine configuration).
_PLANS: dict[tuple, tuple] = {}
_PLANS_MAX = 64

# Layouts by (n_tokens, kv_bytes_per_token, n_layers, layer_group, payload_scale, kv_dtype).
# A layout does not depend on the request id or seed, and requests often share prompt
# lengths (the Azure 2023 conversation trace: 2,339 lengths in 19,366 requests, 86% hits
# at this size); oldest dropped first. 2048 layouts of 8 groups take ~8 MB with their
# headers packed (`_KVLayout.frames`), a fraction of that without.
_LAYOUTS: OrderedDict[tuple, "_KVLayout"] = OrderedDict()
_LAYOUTS_MAX = 2048


def _kv_plan(kv_bytes_per_token: int, n_layers: int, layer_group: int, kv_dtype: str) -> tuple:
    """(elements per token per layer or None (see `_layer_elems`), dtype bits, packed
    dtype entry, groups, ends) with, per group of layers [a, b): in groups (a, b, "<Q"
    packed a, packed layers entry, packed start of the shape entry: key, array marker,
    first dimension), in ends (b, the length of those two entries)."""
    bits = KV_DTYPE_BITS[kv_dtype]
    elems = _layer_elems(kv_bytes_per_token, n_layers, bits)
    groups = []
    for a in range(0, n_layers, layer_group):
        b = min(n_layers, a + layer_group)
        shape_head = _K["shape"] + (b"\x93" + _pack_uint(b - a) if elems is not None else b"\x91")
        groups.append((a, b, _LAYER.pack(a), _K["layers"] + _pack_ints((a, b)), shape_head))
    ends = tuple((b, len(layers_entry) + len(shape_head)) for _, b, _, layers_entry, shape_head in groups)
    return elems, bits, _K["dtype"] + msgpack.packb(kv_dtype), tuple(groups), ends


def _uint_len(v: int) -> int:
    """len(_pack_uint(v)) for an int v >= 0, without packing it (msgpack's smallest
    encoding: positive fixint, uint8, uint16, uint32; above, `_pack_uint` itself)."""
    return 1 if v < 0x80 else 2 if v < 0x100 else 3 if v < 0x10000 else 5 if v < 0x100000000 \
        else len(_pack_uint(v))


class _KVLayout:
    """The request-independent part of `make_kv_frames`' frames for one prompt length
    (arguments already checked), in two stages: the sizes at once (what a described
    payload needs: the frame count and `size`), the header bytes when first asked for
    (`frames()`: the real frames, and a description's header tuples), so that a
    payload accounted for in a sweep of rarely repeating prompt lengths packs no
    header.

    `size`: the bytes of all the frames without their request ids; `n_groups`: the
    frame count; `_sizes`: per group (logical bytes, body bytes, header length up to
    the checksum without the request id), the lengths the packed headers will have
    (`frames()` checks each against the bytes it packs).
    """

    __slots__ = ("n_tokens", "kv_dtype", "plan", "size", "n_groups", "_sizes", "_frames")

    def __init__(self, request_id: int, n_tokens: int, kv_bytes_per_token: int, n_layers: int,
                 layer_group: int, payload_scale: float, kv_dtype: str) -> None:
        """`request_id` only names the request in errors. Raises FrameError if a body
        exceeds a msgpack bin32."""
        plan_key = (kv_bytes_per_token, n_layers, layer_group, kv_dtype)
        plan = _PLANS.get(plan_key)
        if plan is None:
            if len(_PLANS) >= _PLANS_MAX:
                _PLANS.clear()
            plan = _PLANS[plan_key] = _kv_plan(*plan_key)
        elems, bits, dtype_entry, _, ends = plan
        self.n_tokens, self.kv_dtype, self.plan = n_tokens, kv_dtype, plan
        total = n_tokens * kv_bytes_per_token
        # a header's bytes but its layers entry, shape head (`_kv_plan`: `ends`) and
        # packed logical and body sizes (and, without whole elements, its shape's
        # element count): the key head, the tokens entry (`_pack_ints((0, n_tokens))`:
        # array marker, 0, n_tokens), the dtype entry, the shape's (n_tokens, elems),
        # the size keys and the checksum's marker: what `frames` packs
        n_tok = _uint_len(n_tokens)
        fixed = (len(_KEY_HEAD) + len(_K["tokens"]) + 2 + n_tok + len(dtype_entry)
                 + (n_tok + _uint_len(elems) if elems is not None else 0)
                 + len(_K["logical"]) + len(_K["payload"]) + len(_XXH3_ENTRY))
        # the groups share a few logical sizes: per logical size, its body's bytes and
        # the packed sizes' length (`frames` packs them once per size likewise)
        bodies: dict[int, tuple[int, int]] = {}
        sizes = []
        size = 0
        done = 0                                # logical bytes of the groups before
        for b, n_entries in ends:
            upto = total * b // n_layers        # `group_logical_bytes` as a running sum
            logical = upto - done
            done = upto
            body = bodies.get(logical)
            if body is None:
                n_body = payload_size(logical, payload_scale)
                if n_body > MAX_BODY_BYTES:
                    raise FrameError(
                        f"frame body of request {request_id} is {n_body} bytes; a msgpack bin32 "
                        f"holds at most {MAX_BODY_BYTES}: use smaller layer groups")
                n_sizes = _uint_len(logical) + _uint_len(n_body)
                if elems is None:
                    n_sizes += _uint_len((logical * 8) // bits)
                body = bodies[logical] = (n_body, fixed + n_sizes)
            n_body, n_head = body
            n_head += n_entries
            sizes.append((logical, n_body, n_head))
            size += n_head + n_body
        self._sizes = tuple(sizes)
        self.n_groups = len(sizes)
        self.size = size + self.n_groups * _TAIL_BYTES
        self._frames: tuple | None = None

    def frames(self) -> tuple:
        """Per group of layers [a, b): (the "<Q" packed a, the packed header after the
        request id up to the checksum, body bytes, the header tuple without its request
        id, length of the packed header up to the checksum without the request id);
        built on the first call."""
        if self._frames is None:
            elems, bits, dtype_entry, plan_groups, _ = self.plan
            kv_dtype, n_tokens = self.kv_dtype, self.n_tokens
            mid = _K["tokens"] + _pack_ints((0, n_tokens)) + dtype_entry
            shape_rest = _pack_uint(n_tokens) + _pack_uint(elems) if elems is not None else b""
            k_logical, k_payload = _K["logical"], _K["payload"]
            n_key_head = len(_KEY_HEAD)
            packed: dict[int, bytes] = {}       # the groups share a few byte counts
            out = []
            for (a, b, layer8, layers_entry, shape_head), (logical, n_body, n_head) in zip(plan_groups,
                                                                                           self._sizes):
                if elems is not None:
                    shape = (b - a, n_tokens, elems)
                    shape_entry = shape_head + shape_rest
                else:
                    shape = ((logical * 8) // bits,)
                    shape_entry = shape_head + _pack_uint(shape[0])
                p_logical = packed.get(logical)
                if p_logical is None:
                    p_logical = packed[logical] = _pack_uint(logical)
                p_body = packed.get(~n_body)    # (keys of body sizes: ~n < 0 <= logical)
                if p_body is None:
                    p_body = packed[~n_body] = _pack_uint(n_body)
                tail = b"".join((layers_entry, mid, shape_entry, k_logical, p_logical, k_payload, p_body,
                                 _XXH3_ENTRY))
                if n_key_head + len(tail) != n_head:
                    raise RuntimeError(f"KV layout: a header of {n_key_head + len(tail)} bytes, its size "
                                       f"said {n_head} (a bug in `_KVLayout`)")
                out.append((layer8, tail, n_body, (a, b, 0, n_tokens, kv_dtype, shape, logical, n_body), n_head))
            self._frames = tuple(out)
        return self._frames


def _checked_layout(request_id, n_tokens, kv_bytes_per_token, n_layers, layer_group, payload_scale,
                    kv_dtype, seed) -> tuple[int, int, _KVLayout]:
    """`make_kv_frames`' argument checks and its cached layout: (request_id, seed,
    layout) with the ints checked. Raises ValueError on bad arguments, FrameError for a
    body too large for a msgpack bin32."""
    if not (type(request_id) is int and type(n_tokens) is int and type(kv_bytes_per_token) is int
            and type(n_layers) is int and type(layer_group) is int and type(seed) is int
            and request_id >= 0 and n_tokens >= 1 and kv_bytes_per_token >= 1 and n_layers >= 1
            and layer_group >= 1 and seed >= 0):
        request_id = _check_int("request_id", request_id, 0)
        n_tokens = _check_int("n_tokens", n_tokens, 1)
        kv_bytes_per_token = _check_int("kv_bytes_per_token", kv_bytes_per_token, 1)
        n_layers = _check_int("n_layers", n_layers, 1)
        layer_group = _check_int("layer_group", layer_group, 1)
        seed = _check_int("seed", seed, 0)
    layout_key = (n_tokens, kv_bytes_per_token, n_layers, layer_group, payload_scale, kv_dtype)
    try:
        layout = _LAYOUTS.get(layout_key)
    except TypeError:                           # an unhashable scale or dtype: rejected below
        layout = None
    if layout is None:
        # only valid arguments are ever cached, so a hit needs no checks
        if (not isinstance(payload_scale, (int, float)) or not (0.0 < payload_scale <= 1.0)
                or math.isnan(payload_scale)):
            raise ValueError(f"make_kv_frames: payload_scale must be in (0, 1], got {payload_scale!r}")
        if kv_dtype not in KV_DTYPE_BITS:
            raise ValueError(f"make_kv_frames: kv_dtype must be one of {sorted(KV_DTYPE_BITS)}, got {kv_dtype!r}")
    if request_id > _U64_MAX:
        raise ValueError(f"make_kv_frames: request_id must be < 2**64, got {request_id}")
    if layout is None:
        layout = _KVLayout(request_id, *layout_key)
        if len(_LAYOUTS) >= _LAYOUTS_MAX:
            _LAYOUTS.popitem(last=False)
        _LAYOUTS[layout_key] = layout
    return request_id, seed, layout


def make_kv_frames(
    request_id: int,
    n_tokens: int,
    kv_bytes_per_token: int,
    n_layers: int,
    layer_group: int,
    payload_scale: float,
    kv_dtype: str = "fp8",
    seed: int = 0,
) -> list[np.ndarray]:
    """Frames carrying a request's KV cache, one per group of `layer_group` layers.

    request_id: id written into each header.
    n_tokens: tokens of KV (the prompt length after prefill), >= 1.
    kv_bytes_per_token: KV bytes per token over all layers at `kv_dtype` (e.g. 131,072
        for Llama-3.1-8B at 16-bit, reference/hardware.md), >= 1.
    n_layers: layers of the model, >= 1; layer_group: layers per frame, >= 1 (the last
        group may be smaller).
    payload_scale: fraction of the logical bytes actually shipped, in (0, 1].
    kv_dtype: a key of `KV_DTYPE_BITS`; seed: varies the (deterministic) body bytes.

    Group g covering layers [a, b) has logical bytes `group_logical_bytes(n_tokens *
    kv_bytes_per_token, n_layers, a, b)` (they sum exactly to n_tokens * kv_bytes_per_token)
    and a body of `payload_size(logical, payload_scale)` bytes cut from a cached
    pseudo-random stream at an offset derived from (seed, request_id, a): real,
    deterministic bytes without running an RNG per frame.
    Returns a list of 1-D uint8 frames. Raises ValueError on bad arguments.
    """
    request_id, seed, layout = _checked_layout(request_id, n_tokens, kv_bytes_per_token, n_layers, layer_group,
                                               payload_scale, kv_dtype, seed)
    groups, size = layout.frames(), layout.size
    rid = _pack_uint(request_id)
    head = _KEY_HEAD + rid
    n_rid = len(rid)
    block = _random_block()
    stream = _random_view
    seed_rid = _SEED_RID.pack(seed, request_id)
    digest = xxhash.xxh3_64_intdigest
    pack_tail = _TAIL.pack_into
    # Every frame is a view of one buffer (one allocation per request, not per group).
    # Each header's bytes up to its checksum and its header tuple go with the payload
    # (`KVFrames`), for the checks that follow.
    buf = np.empty(size + len(groups) * n_rid, dtype=np.uint8)
    mv = memoryview(buf)
    frames: list[np.ndarray] = []
    bounds = []
    heads = []
    off = 0
    for layer8, tail, n_body, entry, n_head in groups:
        key = head + tail
        h = off + n_head + n_rid
        body = h + _TAIL_BYTES
        end = body + n_body
        start = digest(seed_rid + layer8) % _RANDOM_BLOCK
        mv[off:h] = key
        if n_body <= _CHUNK:
            # start < 8 MiB and n_body <= _CHUNK: inside the block's wrap-around tail
            src = stream[start : start + n_body]
            mv[body:end] = src
            checksum = digest(src)
        else:
            checksum = _copy_body(buf[body:end], n_body, block, start)
        pack_tail(mv, h, checksum, _BIN32, n_body)
        frames.append(buf[off:end])
        bounds.append((off, end))
        heads.append((key, (request_id, *entry)))
        off = end
    return KVFrames(frames, buf, tuple(bounds), tuple(heads))


class KVDescription:
    """A KV payload described instead of built: the frames `make_kv_frames` would cut
    for the same arguments, without their bytes (payload accounting, the virtual
    runtime's sweeps: docs/bench.md).

    `entries`: per frame the header tuple `scan_kv_frames` would read from the real
    frame (request_id, layer_start, layer_end, token_start, token_end, dtype, shape,
    logical_bytes, payload_bytes); `sizes`: each real frame's length in bytes (header,
    bin32 prefix and body, exactly); `nbytes`: their sum. `len()` is the frame count.
    `build()` makes the real frames (`make_kv_frames` with the same arguments), e.g.
    for a fault that corrupts one. There are no bodies, so nothing can fail a checksum:
    `scan_kv_frames` returns the entries as they are.

    `passes_transfer_checks` and `verifies_for` answer the interconnect's and the
    receiver's header checks from the arguments the layout was made of (no header
    read): a described payload is checked in O(1).
    """

    __slots__ = ("args", "nbytes", "_layout", "_n_rid", "_entries")

    def __init__(self, args: tuple, layout: _KVLayout) -> None:
        self.args = args
        # the frames without their request id, whose packed length each frame adds
        self._layout = layout
        self._n_rid = _uint_len(args[0])
        self._entries: tuple | None = None
        self.nbytes = layout.size + layout.n_groups * self._n_rid

    # entries and sizes are built when first read: a payload whose layout was checked
    # before is not read
    @property
    def entries(self) -> tuple:
        if self._entries is None:
            rid = self.args[0]
            self._entries = tuple((rid, *g[3]) for g in self._layout.frames())
        return self._entries

    @property
    def sizes(self) -> tuple:
        return tuple(g[4] + self._n_rid + _TAIL_BYTES + g[2] for g in self._layout.frames())

    def passes_transfer_checks(self, request_id: int, payload_scale: float, logical_bytes: int) -> bool:
        """True when the real frames pass the interconnect's header checks: every frame
        names `request_id`, carries a body of payload_size(logical, payload_scale) for
        its logical bytes, and the logical bytes sum to `logical_bytes`. The layout's
        bodies are payload_size(logical, its own payload_scale) and its groups' logical
        bytes sum to n_tokens x kv_bytes_per_token (`_KVLayout`), so equal arguments
        suffice; False means: check the headers (a different scale may round alike)."""
        rid, n_tokens, kv_bytes_per_token, _, _, scale = self.args[:6]
        return rid == request_id and scale == payload_scale and n_tokens * kv_bytes_per_token == logical_bytes

    def verifies_for(self, request_id: int, kv_tokens: int, n_layers: int) -> bool:
        """True when a receiver finds no bad frame: every frame names `request_id` and
        tokens [0, kv_tokens), and the frames cover layers [0, n_layers). The layout's
        groups cover [0, its n_layers) one after another, for tokens [0, n_tokens)
        (`_KVLayout`), and a description has no bytes to fail a checksum."""
        rid, n_tokens, _, layers = self.args[:4]
        return rid == request_id and n_tokens == kv_tokens and layers >= n_layers

    def __len__(self) -> int:
        return self._layout.n_groups

    def build(self) -> "KVFrames":
        """The real frames this describes."""
        return make_kv_frames(*self.args)

    def __repr__(self) -> str:
        return f"KVDescription({len(self)} frames, {self.nbytes} bytes, request {self.args[0]})"


def describe_kv_frames(
    request_id: int,
    n_tokens: int,
    kv_bytes_per_token: int,
    n_layers: int,
    layer_group: int,
    payload_scale: float,
    kv_dtype: str = "fp8",
    seed: int = 0,
) -> KVDescription:
    """The frames `make_kv_frames` would return for these arguments, described: the
    same header tuples and frame sizes, no bytes built, hashed or copied (the layout
    is `make_kv_frames`' own, cached per prompt length). Same arguments and errors as
    `make_kv_frames` (the same checks, on the first request of a layout)."""
    layout_key = (n_tokens, kv_bytes_per_token, n_layers, layer_group, payload_scale, kv_dtype)
    layout = _LAYOUTS.get(layout_key) if type(request_id) is int and 0 <= request_id <= _U64_MAX else None
    if layout is None:
        # checks every argument and caches the layout (only valid ones are cached),
        # without building the frames
        layout = _checked_layout(request_id, n_tokens, kv_bytes_per_token, n_layers, layer_group, payload_scale,
                                 kv_dtype, seed)[2]
    return KVDescription((request_id, n_tokens, kv_bytes_per_token, n_layers, layer_group, payload_scale,
                          kv_dtype, seed), layout)


def check_description(desc: KVDescription, frames: list) -> None:
    """Raise FrameError unless `frames` (real ones, e.g. `desc.build()`) verify and
    match `desc`: the same header tuples and frame sizes. Payload accounting's sampled
    check (a mismatch is a bug in the codec, never a fault of the run)."""
    entries = scan_kv_frames(frames, True)
    sizes = tuple(int(memoryview(f).nbytes) for f in frames)
    if tuple(entries) != desc.entries or sizes != desc.sizes:
        raise FrameError(f"request {desc.args[0]}: the described KV payload ({len(desc)} frames, "
                         f"{desc.nbytes} bytes) differs from its real frames ({len(frames)} frames, "
                         f"{sum(sizes)} bytes)")


class KVFrames(list):
    """The frames of one KV payload: a list of 1-D uint8 frames that `make_kv_frames`
    cut from one buffer. It is a plain list to every reader; it differs only in how it
    pickles: as that one buffer and the frames' bounds, so Ray ships one zero-copy
    buffer per transfer instead of one per frame (measured ~2x faster for 16 MB
    payloads between two actors, `rack bench`), and the receiver gets views again.
    If the list no longer holds exactly those views (a frame replaced, e.g. by fault
    injection, or the list changed), it pickles as a plain list of its frames.

    `store_ref`: where a runtime keeps this payload in a shared object store (the Ray
    runtime sets it to the ObjectRef the frames were read from, so forwarding them
    sends that reference again instead of the bytes); None otherwise. It is not
    pickled, and a runtime must only reuse it while `intact()` holds.

    `_heads`: from `make_kv_frames`, per frame the header's bytes up to its checksum
    and the header tuple they parse to, so that `scan_kv_frames` compares each header
    with those bytes instead of parsing it; not pickled (a receiver in another process
    parses the headers).
    """

    __slots__ = ("_base", "_bounds", "_views", "_heads", "store_ref")

    def __init__(self, frames=(), base: np.ndarray | None = None, bounds: tuple = (),
                 heads: tuple = ()) -> None:
        super().__init__(frames)
        self._base = base
        self._bounds = bounds
        self._views = tuple(self)
        self._heads = heads
        self.store_ref = None

    def intact(self) -> bool:
        """Whether the list still holds exactly the views it was built with: the same
        array objects in the same places (an array cannot be pointed at other memory,
        so these are still views of the buffer at `_bounds`)."""
        views = self._views
        return (self._base is not None and len(self) == len(views) == len(self._bounds)
                and all(map(operator.is_, self, views)))

    def __reduce__(self):
        if self.intact():
            return (_kv_frames_from, (self._base, self._bounds))
        return (list, (list(self),))


def _kv_frames_from(base: np.ndarray, bounds: tuple) -> KVFrames:
    """Unpickle a `KVFrames`: views of `base` at `bounds`."""
    return KVFrames([base[a:b] for a, b in bounds], base, bounds)


def verify_kv_frames(frames: list[np.ndarray]) -> tuple[int, int, int, int]:
    """Decode and check every frame.

    Returns (n_good, n_bad, logical_bytes, payload_bytes), the byte counts summed over
    the good frames only (a bad frame's header cannot be trusted). A frame is bad if
    `decode_frame` raises FrameError (malformed or checksum mismatch). Never raises for
    a bad frame.
    """
    good = bad = logical = payload = 0
    for entry in scan_kv_frames(frames, True):
        if entry is None:
            bad += 1
            continue
        good += 1
        logical += entry[7]
        payload += entry[8]
    return good, bad, logical, payload


def corrupt_frame(frame: np.ndarray | bytes, seed: int = 0) -> np.ndarray:
    """A copy of `frame` with one body byte flipped (fault injection for tests).

    The byte position is drawn from `seed` and XORed with a non-zero mask, so the copy
    fails `decode_frame` with ChecksumError (a collision of the 64-bit hash, odds about
    2**-64, is the only way it could pass). Raises FrameError if the frame is malformed or has an empty body.
    """
    arr = _as_frame_array(frame)
    header, off, n = _parse(arr)
    if n == 0:
        raise FrameError(f"frame of request {header.request_id} has an empty body: nothing to corrupt")
    rng = np.random.default_rng(seed)
    out = arr.copy()
    pos = off + int(rng.integers(0, n))
    out[pos] ^= np.uint8(int(rng.integers(1, 256)))
    return out
