"""Trace names: `resolve_trace("azure_conv")` -> the file's Path.

The CLI and the rest of the project refer to a trace by a path or by one of these
names. The public traces the project uses ship whole inside the package, gzip-compressed
(``workloads/data/traces``, licences and attribution in its READMEs), so a fresh
checkout or a wheel replays them with no other folder; 120 s excerpts ship too
(``workloads/data``). A full trace's file is looked up, in order, in

1. the directories in the environment variable ``RACK_TRACE_DIR`` (``os.pathsep``-separated):
   a user's own copies, or the traces that do not ship (``rack trace list``);
2. the shipped traces (``workloads/data/traces``),

each either in the source's sub-folder (``mooncake/conversation_trace.jsonl``) or
flat (``conversation_trace.jsonl``), plain or gzip-compressed (the same name with
``.gz``; the readers decompress as they read).
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import TraceError

DATA_DIR = Path(__file__).resolve().parent / "data"
#: The whole public traces shipped with the package (gzip; see its README.md).
SHIPPED_DIR = DATA_DIR / "traces"
ENV_VAR = "RACK_TRACE_DIR"

#: Shipped excerpts: name -> file in workloads/data (see workloads/data/README.md).
EXCERPTS: dict[str, str] = {
    "mooncake-excerpt": "mooncake_conversation_120s.jsonl",
    "azure-conv-excerpt": "azure_conv_2023_120s.csv",
}

#: Full traces: name -> (path under a trace directory, what it is).
FULL_TRACES: dict[str, tuple[str, str]] = {
    "mooncake_conv": ("mooncake/conversation_trace.jsonl",
                      "Mooncake FAST'25 conversation trace (12,031 requests, with prefix hashes)"),
    "mooncake_toolagent": ("mooncake/toolagent_trace.jsonl",
                           "Mooncake FAST'25 tool-agent trace (23,608 requests)"),
    "azure_conv": ("azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
                   "Azure LLM inference 2023, conversation (19,366 requests)"),
    "azure_code": ("azure_llm_2023/AzureLLMInferenceTrace_code.csv",
                   "Azure LLM inference 2023, code (8,819 requests)"),
    "azure_conv_2024": ("azure_llm_2024/AzureLLMInferenceTrace_conv_1week.csv",
                        "Azure LLM inference 2024, conversation, one week"),
    "azure_code_2024": ("azure_llm_2024/AzureLLMInferenceTrace_code_1week.csv",
                        "Azure LLM inference 2024, code, one week"),
    "arxiv_lengths": ("vidur/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
                      "vidur arXiv-summarization lengths (no timestamps: replay with a request rate)"),
    "burstgpt": ("burstgpt/BurstGPT_1.csv", "BurstGPT, first two months (with failures)"),
}


def _normal(name: str) -> str:
    return name.strip().lower().replace("-", "_")


_BY_NORMAL = {_normal(n): n for n in (*EXCERPTS, *FULL_TRACES)}


def trace_names() -> dict[str, str]:
    """All known trace names -> a one-line description."""
    out = {name: f"shipped excerpt ({file})" for name, file in EXCERPTS.items()}
    out.update({name: desc for name, (_, desc) in FULL_TRACES.items()})
    return out


def trace_dirs() -> list[Path]:
    """The directories searched for full traces, in order (see the module docstring)."""
    dirs: list[Path] = []
    env = os.environ.get(ENV_VAR)
    if env:
        dirs.extend(Path(p).expanduser() for p in env.split(os.pathsep) if p)
    dirs.append(SHIPPED_DIR)
    unique: dict[str, Path] = {}
    for d in dirs:
        unique.setdefault(os.path.normpath(os.path.abspath(d)), Path(os.path.normpath(os.path.abspath(d))))
    return list(unique.values())


def resolve_trace(name_or_path: str | os.PathLike) -> Path:
    """The file for a trace NAME (see `trace_names`) or an existing PATH.

    An existing file path wins over a name. Names are case-insensitive and ``-``/``_``
    are interchangeable. Raises TraceError naming every place it looked, or listing the
    known names when the argument is neither a file nor a name.
    """
    from .paths import file_problem, name_problem, shown

    bad = name_problem(name_or_path)
    if bad is not None:
        raise TraceError(f"trace {shown(name_or_path)!r}", None, None,
                         f"{bad}; expected a trace file or a known trace name")
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    key = _BY_NORMAL.get(_normal(str(name_or_path)))
    if key is None:
        bad = file_problem(path)
        if bad is not None:
            raise TraceError(shown(path), None, None, f"{bad}; expected a CSV or JSON-lines trace file")
        raise TraceError(
            str(name_or_path), None, None,
            "no such file, and not a known trace name; known names: "
            + ", ".join(sorted(trace_names())),
        )
    if key in EXCERPTS:
        file = DATA_DIR / EXCERPTS[key]
        if not file.is_file():
            raise TraceError(str(file), None, None,
                             f"the shipped excerpt {key!r} is missing from the package")
        return file
    rel = FULL_TRACES[key][0]
    tried: list[str] = []
    for d in trace_dirs():
        for plain in (d / rel, d / Path(rel).name):
            for candidate in (plain, plain.with_name(plain.name + ".gz")):
                tried.append(str(candidate))
                if candidate.is_file():
                    return candidate.resolve()
    raise TraceError(
        key, None, None,
        f"trace file {Path(rel).name} not found; looked in: {'; '.join(tried)}. "
        f"Put it in one of those places or set {ENV_VAR} to its directory",
    )


def unpack_shipped(dest: str | os.PathLike) -> Path:
    """Write every shipped whole trace, decompressed, under `dest` in its source's
    sub-folder (``dest/mooncake/conversation_trace.jsonl``, ...), and return `dest`.

    For code that cannot read the shipped copies itself: a checkout of an older
    revision (`rack bench --baseline REF`) finds them through ``RACK_TRACE_DIR=dest``
    whether or not it ships traces or reads gzip. Raises OSError if `dest` cannot be
    written."""
    from .textfile import open_binary

    out = Path(dest)
    for rel, _ in FULL_TRACES.values():
        src = SHIPPED_DIR / (rel + ".gz")
        if src.is_file():
            target = out / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with open_binary(src) as f, open(target, "wb") as g:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    g.write(chunk)
    return out
