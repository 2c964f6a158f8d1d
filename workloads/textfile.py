"""Open a trace file as UTF-8 text, plain or gzip-compressed, or say why it is not text.

A trace is CSV or JSON lines. It may be gzip-compressed (``.gz`` or not: the format is
recognised by its first bytes, RFC 1952's magic ``1f 8b``) and is then decompressed as
it is read, never held whole. Other compressions are named, so the user knows what to
do with the file, and a file that is not UTF-8 text (a binary file, another encoding)
is refused with the offset of its first bad byte, before any row is read.
"""

from __future__ import annotations

import codecs
import gzip
import hashlib
from pathlib import Path
from typing import IO

from .errors import TraceError

#: First bytes of compressed formats (gzip: RFC 1952; bzip2, xz, zstd, zip: their
#: format specifications). Only gzip is read; the others are named in the error.
GZIP_MAGIC = b"\x1f\x8b"
OTHER_COMPRESSIONS = {b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd",
                      b"PK\x03\x04": "zip"}
#: Bytes checked up front for text (the first lines of any trace).
SAMPLE_BYTES = 64 * 1024


def is_gzip(path: str | Path) -> bool:
    """True if the file starts with the gzip magic bytes."""
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def open_binary(path: str | Path) -> IO[bytes]:
    """The file's bytes, decompressed if it is gzip."""
    return gzip.open(path, "rb") if is_gzip(path) else open(path, "rb")


def content_sha256(path: str | Path) -> str:
    """Hex SHA-256 of the file's content: its bytes, decompressed first if it is gzip,
    streamed in 1 MiB chunks. A trace keeps its upstream checksum (the one its source
    publishes) whether it is stored plain or compressed."""
    h = hashlib.sha256()
    with open_binary(path) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def open_text(path: str | Path, newline: str | None = None) -> IO[str]:
    """The file as UTF-8 text (a leading byte-order mark dropped), decompressed if it
    is gzip. Check it first with `check_text`; a bad byte further on raises
    UnicodeDecodeError, which `text_error` turns into a TraceError with its line."""
    if is_gzip(path):
        return gzip.open(path, "rt", encoding="utf-8-sig", newline=newline)
    return open(path, encoding="utf-8-sig", newline=newline)


def check_text(path: str | Path) -> None:
    """Raise TraceError unless the file (decompressed) starts as UTF-8 text: compressed
    other than with gzip, NUL bytes, or bytes that are not UTF-8 in the first
    `SAMPLE_BYTES`. A directory or unreadable file is a TraceError too."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            head = f.read(8)
        with open_binary(p) as f:
            sample = f.read(SAMPLE_BYTES)
    except IsADirectoryError:
        raise TraceError(str(p), None, None, "is a directory, not a trace file") from None
    except (gzip.BadGzipFile, EOFError) as exc:
        raise TraceError(str(p), None, None, f"gzip data is corrupt or truncated ({exc})") from None
    except OSError as exc:
        raise TraceError(str(p), None, None, f"cannot read the file ({exc.strerror or exc})") from None
    for magic, name in OTHER_COMPRESSIONS.items():
        if head.startswith(magic):
            raise TraceError(str(p), None, None, f"is {name}-compressed; decompress it first "
                             "(plain or gzip-compressed CSV/JSONL traces are read directly)")
    what = "gzip-compressed file" if head.startswith(GZIP_MAGIC) else "file"
    nul = sample.find(b"\x00")
    if nul >= 0:
        raise TraceError(str(p), _line_at(sample, nul), None,
                         f"binary data (a NUL byte at offset {nul}): not a text trace; "
                         "expected CSV or JSON lines, plain or gzip-compressed")
    try:
        # incremental: a multi-byte character cut by the sample's end is not an error
        codecs.getincrementaldecoder("utf-8")().decode(sample, final=False)
    except UnicodeDecodeError as exc:
        raise TraceError(str(p), _line_at(sample, exc.start), None,
                         f"the {what} is not UTF-8 text (byte {sample[exc.start]:#04x} at offset "
                         f"{exc.start}): a binary file? expected CSV or JSON lines") from None


def text_error(path: str | Path, exc: Exception) -> TraceError:
    """A TraceError for a decoding error met while reading (`UnicodeDecodeError`,
    or corrupt gzip data), naming the line of the first bad byte (found by reading the
    file again: this is the error path only)."""
    if isinstance(exc, UnicodeDecodeError):
        offset, line = _first_bad_byte(path)
        where = f" at offset {offset}" if offset is not None else ""
        return TraceError(str(path), line, None, f"not UTF-8 text (a bad byte{where}): a binary "
                          "file or another encoding? expected UTF-8 CSV or JSON lines")
    return TraceError(str(path), None, None, f"gzip data is corrupt or truncated ({exc})")


def _line_at(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def _first_bad_byte(path: str | Path) -> tuple[int | None, int | None]:
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, line = 0, 1
    try:
        with open_binary(path) as f:
            for raw in f:
                try:
                    decoder.decode(raw, final=False)
                except UnicodeDecodeError as exc:
                    return offset + exc.start, line
                offset += len(raw)
                line += 1
    except (OSError, EOFError):
        pass
    return None, None
