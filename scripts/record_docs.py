"""Re-record the examples of README.md and docs/*.md by running their commands, so an
example cannot drift from what the code prints.

A recorded example is a marked block in a Markdown file:

    <!-- record: rack trace stats azure-conv-excerpt -->
    ```
    $ rack trace stats azure-conv-excerpt
    ... the command's output ...
    ```
    <!-- /record -->

The script runs the command (bash, in the checkout's root, stdout and stderr together)
and replaces everything between the two markers with a fenced block of `$ COMMAND`
and its output. A live-server example is

    <!-- record-serve: SERVE ARGS || CLIENT COMMAND || CLIENT COMMAND ... -->

which starts `rack serve SERVE ARGS --port 8765`, waits until /health answers, runs
each client command in turn (`$URL` is the server's address), stops the server with
Ctrl-C (SIGINT) and records the clients' outputs, then the server's own lines.

Paths are made relative: the checkout's absolute path is shown as `/path/to/rack` and
the temporary folder as `/tmp/rack-docs`, so no recorded example names a machine's
folders. Output is recorded as printed, wall times and all: that is what a user sees.

    python scripts/record_docs.py                 # every block of every file
    python scripts/record_docs.py --only "trace"  # blocks whose command contains "trace"
    python scripts/record_docs.py --list          # the blocks, not run

Exit status 1 when a command fails (its block is left as it was).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(?P<open><!-- record(?P<serve>-serve)?: (?P<cmd>.+?) -->\n)(?P<body>.*?)(?P<close><!-- /record -->)",
                   re.S)
PORT = 8765
#: Wall seconds a command or a server may take before the recording gives up.
TIMEOUT_S = 1800.0


def files() -> list[Path]:
    """README.md and every docs/*.md, in that order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(text: str) -> list[re.Match]:
    """The recorded blocks of a Markdown text."""
    return list(BLOCK.finditer(text))


def _clean(out: str, tmp: Path) -> str:
    out = out.replace(str(ROOT), "/path/to/rack").replace(str(tmp), "/tmp/rack-docs")
    return "\n".join(line.rstrip() for line in out.strip("\n").splitlines())


def _env() -> dict:
    return dict(os.environ, COLUMNS="120", NO_COLOR="1", TERM="dumb", RAY_USAGE_STATS_ENABLED="0",
                PYTHONPATH=os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))))


def run_command(cmd: str, tmp: Path) -> str:
    """`$ cmd` and its output (stdout and stderr as they interleave). Raises
    RuntimeError when it exits non-zero."""
    p = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=TIMEOUT_S)
    if p.returncode != 0:
        raise RuntimeError(f"{cmd!r} exited {p.returncode}:\n{p.stdout[-2000:]}")
    return f"$ {cmd}\n{_clean(p.stdout, tmp)}"


def run_serve(spec: str, tmp: Path) -> str:
    """A live session (module docstring): the clients' transcripts, then the server's."""
    serve_args, *clients = [part.strip() for part in spec.split("||")]
    url = f"http://127.0.0.1:{PORT}"
    log = tmp / "serve.log"
    with open(log, "w") as f:
        server = subprocess.Popen(["bash", "-c", f"exec rack serve {serve_args} --port {PORT}"], cwd=ROOT, env=_env(),
                                  stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 300
        while True:
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"rack serve {serve_args} did not start:\n{log.read_text()[-2000:]}")
            time.sleep(1)
        shown = [run_command(c.replace("$URL", url), tmp) for c in clients]
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=300)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    shown.append(f"$ rack serve {serve_args} --port {PORT}        # stopped with Ctrl-C after the commands above\n"
                 + _clean(log.read_text(), tmp))
    return "\n\n".join(shown)


def record(path: Path, only: str | None, tmp: Path) -> tuple[int, list[str]]:
    """Re-record the blocks of one file: (blocks recorded, failures)."""
    text = path.read_text()
    out, pos, n, failed = [], 0, 0, []
    for m in blocks(text):
        out.append(text[pos:m.start("body")])
        body = m.group("body")
        if only is None or only in m.group("cmd"):
            try:
                got = run_serve(m.group("cmd"), tmp) if m.group("serve") else run_command(m.group("cmd"), tmp)
                body = f"```\n{got}\n```\n"
                n += 1
                print(f"{path.relative_to(ROOT)}: recorded {m.group('cmd')[:80]}", flush=True)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                failed.append(f"{path.relative_to(ROOT)}: {exc}")
        out.append(body)
        pos = m.start("close")
    out.append(text[pos:])
    new = "".join(out)
    if new != text:
        path.write_text(new)
    return n, failed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="re-record only the blocks whose command contains this text")
    ap.add_argument("--list", action="store_true", help="list the blocks and exit")
    a = ap.parse_args()
    if a.list:
        for path in files():
            for m in blocks(path.read_text()):
                print(f"{path.relative_to(ROOT)}: {'serve: ' if m.group('serve') else ''}{m.group('cmd')}")
        return 0
    failures: list[str] = []
    total = 0
    with tempfile.TemporaryDirectory(prefix="rack-docs-") as tmp:
        for path in files():
            n, failed = record(path, a.only, Path(tmp))
            total += n
            failures += failed
    print(f"{total} block(s) recorded" + (f", {len(failures)} failed" if failures else ""))
    for f in failures:
        print(f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
