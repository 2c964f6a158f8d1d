"""Trace readers: every format, detection, laziness, names and the shipped excerpts."""

import json
import tracemalloc
from pathlib import Path

import pytest

import workloads
from workloads import Request, TraceError, load_requests, open_trace, resolve_trace
from workloads.names import DATA_DIR, EXCERPTS, FULL_TRACES, SHIPPED_DIR, unpack_shipped
from workloads.textfile import content_sha256, open_binary
from workloads.timeparse import make_datetime_parser


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def full_trace(name: str) -> Path:
    """A whole trace: shipped with the package, so it is always found."""
    return resolve_trace(name)


def full_bytes(name: str) -> bytes:
    """A whole trace's content (the shipped file is gzip)."""
    with open_binary(full_trace(name)) as f:
        return f.read()


# -- formats ------------------------------------------------------------------------

def test_mooncake_rows_become_requests(tmp_path):
    p = write(tmp_path, "m.jsonl",
              '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [7, 8]}\n'
              '{"timestamp": 1500, "input_length": 512, "output_length": 1, "hash_ids": [7]}\n')
    reader = open_trace(p)
    assert reader.format == "mooncake" and reader.has_timestamps and reader.block_size == 512
    assert list(reader) == [Request(0, 0.0, 600, 5, (7, 8), 512),
                            Request(1, 1.5, 512, 1, (7,), 512)]
    assert reader.counters()["requests"] == 2 and reader.complete


def test_azure_2023_and_2024_layouts(tmp_path):
    p23 = write(tmp_path, "a23.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                "2023-11-16 23:59:59.5000000,374,44\n2023-11-17 00:00:00.2500000,396,109")
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in open_trace(p23)] == \
        [(0.0, 374, 44), (0.75, 396, 109)]
    # 2024 (DynamoLLM) layout: zone suffix, fraction sometimes absent
    p24 = write(tmp_path, "a24.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                "2024-05-10 00:00:00.009930+00:00,2162,5\n"
                "2024-05-10 00:00:01+00:00,2399,6\n"
                "2024-05-10 02:00:02.5+02:00,76,15\n")
    reqs = list(open_trace(p24, format="azure"))
    assert [r.arrival_s for r in reqs] == pytest.approx([0.0, 0.99007, 2.49007])


def test_datetime_parser_counts_seconds_from_the_first_day_seen():
    parse = make_datetime_parser()
    assert parse("2023-11-16 18:15:46.6805900") == pytest.approx(18 * 3600 + 15 * 60 + 46.68059)
    assert parse("2023-11-16 18:15:46") == 18 * 3600 + 15 * 60 + 46
    assert parse("2023-11-18T01:02:03.5Z") == pytest.approx(2 * 86400 + 3723.5)
    assert parse("2023-11-16 05:30:00-05:00") == 10.5 * 3600  # zone applied: 10:30 UTC
    assert parse("2023-11-16T12:00:00.25+02:00") == pytest.approx(10 * 3600 + 0.25)
    # a form the fast path does not take goes through datetime.fromisoformat
    assert parse("2023-11-17") == 86400.0
    for bad in ["yesterday", "2023-11-16 25:00:00", "2023-13-01 00:00:00",
                "2023-11-16 10:00:nan", "2023-11-16 10:00:+5"]:
        with pytest.raises(ValueError):
            parse(bad)


def test_burstgpt_failed_requests_are_counted_not_dropped_silently(tmp_path):
    p = write(tmp_path, "b.csv",
              "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
              "5,ChatGPT,472,18,490,Conversation log\n"
              "45,ChatGPT,1087,0,1087,Conversation log\n"
              "46.5,GPT-4,417,334,751,API log\n")
    reader = open_trace(p)
    reqs = list(reader)
    assert reader.format == "burstgpt"
    assert reqs == [Request(0, 0.0, 472, 18, None, 512, "ChatGPT", "Conversation log"),
                    Request(2, 41.5, 417, 334, None, 512, "GPT-4", "API log")]
    assert reader.failed_requests == 1 and reader.rows_skipped == 0 and reader.rows_read == 3
    loaded = load_requests(p)
    assert loaded.failed_requests == 1 and loaded.summary()["failed_requests"] == 1
    stats = workloads.trace_stats(p)
    assert stats.failed_requests == 1 and stats.count == 2


def test_vidur_lengths_have_no_timestamps(tmp_path):
    p = write(tmp_path, "v.csv", "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n"
              "3772,54,3826,69.85\n2015,156,2171,12.9\n")
    reader = open_trace(p)
    assert reader.format == "vidur" and not reader.has_timestamps
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in reader] == \
        [(0.0, 3772, 54), (0.0, 2015, 156)]
    with pytest.raises(TraceError, match=r"has no timestamps \(a vidur length distribution.*allow_untimed=True"):
        load_requests(p)
    # accepted when asked: the rows in file order, for the caller to re-time
    loaded = load_requests(p, allow_untimed=True, max_requests=1)
    assert [(r.id, r.arrival_s, r.prompt_tokens) for r in loaded] == [(0, 0.0, 3772)]
    for controls in ({"window": (0, 10)}, {"rate_scale": 2.0}):
        with pytest.raises(ValueError, match="window and rate_scale .*have nothing to act on"):
            load_requests(p, allow_untimed=True, **controls)


def test_generic_csv_and_jsonl_with_a_mapping(tmp_path):
    csv_path = write(tmp_path, "g.csv", "t_us,in,out,hashes,user\n"
                     "1000000,100,10,\"[1, 2]\",alice\n2500000,128,20,1 2,bob\n")
    mapping = {"timestamp": "t_us", "time_unit": "us", "prompt_tokens": "in",
               "output_tokens": "out", "block_hashes": "hashes", "block_size": 64,
               "tenant": "user"}
    reqs = list(open_trace(csv_path, mapping=mapping))
    assert reqs == [Request(0, 0.0, 100, 10, (1, 2), 64, "alice"),
                    Request(1, 1.5, 128, 20, (1, 2), 64, "bob")]
    jl = write(tmp_path, "g.jsonl", json.dumps({"arrive": 3.0, "p": 5, "o": 6}) + "\n"
               + json.dumps({"arrive": 4.0, "p": 7, "o": 8}) + "\n")
    reader = open_trace(jl, format="jsonl",
                        mapping={"timestamp": "arrive", "prompt_tokens": "p", "output_tokens": "o"})
    assert [(r.arrival_s, r.prompt_tokens) for r in reader] == [(0.0, 5), (1.0, 7)]
    with pytest.raises(ValueError, match="needs a column mapping"):
        open_trace(jl, format="csv")
    with pytest.raises(ValueError, match=r"unknown mapping key\(s\) \['input'\]"):
        open_trace(jl, mapping={"input": "p"})


def test_unknown_layout_is_a_clear_error(tmp_path):
    p = write(tmp_path, "x.csv", "a,b,c\n1,2,3\n")
    with pytest.raises(TraceError, match=r"x\.csv:1: unknown CSV header \(a,b,c\)"):
        open_trace(p)
    with pytest.raises(ValueError, match="unknown trace format 'parquet'"):
        open_trace(p, format="parquet")
    # a file named as JSON lines whose first line is not an object is a broken JSONL
    # file, not a CSV with an unknown header
    j = write(tmp_path, "x.jsonl", "timestamp,input_length\n")
    with pytest.raises(TraceError, match=r"x\.jsonl:1: expected a JSON object per line, got 'timestamp,input_length'"):
        open_trace(j)


def test_reader_is_lazy_and_reiterable(tmp_path):
    p = write(tmp_path, "m.jsonl", "".join(
        json.dumps({"timestamp": i, "input_length": 10, "output_length": 1, "hash_ids": [i]}) + "\n"
        for i in range(100)))
    reader = open_trace(p)
    it = iter(reader)
    assert next(it).id == 0 and reader.rows_read == 1  # one row read, not the file
    it.close()
    assert not reader.complete
    assert len(list(reader)) == 100 and reader.rows_read == 100 and reader.complete


def _peak_while_reading(path: Path) -> int:
    tracemalloc.start()
    n = 0
    for _ in open_trace(path):
        n += 1
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def test_memory_stays_flat_for_a_100_times_larger_file(tmp_path):
    row = '{"timestamp": %d, "input_length": 2000, "output_length": 100, "hash_ids": [1, 2, 3, 4]}\n'
    small = write(tmp_path, "small.jsonl", "".join(row % i for i in range(100)))
    large = write(tmp_path, "large.jsonl", "".join(row % i for i in range(10_000)))
    peak_small, peak_large = _peak_while_reading(small), _peak_while_reading(large)
    # a list of 10,000 Requests alone would take > 1.5 MB; streaming stays within a few KB
    assert peak_large < peak_small + 64 * 1024, (peak_small, peak_large)


# -- names and excerpts ----------------------------------------------------------------

def test_excerpts_resolve_and_are_unmodified_first_lines():
    for name, file in EXCERPTS.items():
        assert resolve_trace(name) == DATA_DIR / file
    assert resolve_trace("MOONCAKE_EXCERPT") == DATA_DIR / EXCERPTS["mooncake-excerpt"]
    excerpt = (DATA_DIR / EXCERPTS["mooncake-excerpt"]).read_bytes()
    rows = [json.loads(line) for line in excerpt.splitlines()]
    assert len(rows) == 339 and rows[-1]["timestamp"] == 117_000
    assert (DATA_DIR / "README.md").is_file()
    full = full_bytes("mooncake_conv")
    assert full.startswith(excerpt) and json.loads(full[len(excerpt):].split(b"\n")[0])["timestamp"] == 120_000
    az = (DATA_DIR / EXCERPTS["azure-conv-excerpt"]).read_bytes()
    assert full_bytes("azure_conv").startswith(az) and az.count(b"\n") == 457


def test_resolve_trace_env_var_and_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("RACK_TRACE_DIR", str(tmp_path))
    (tmp_path / "azure_llm_2023").mkdir()
    target = tmp_path / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
    target.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.98,4808,10\n")
    assert resolve_trace("azure_code") == target.resolve()
    assert resolve_trace(str(target)) == target
    with pytest.raises(TraceError) as e:
        resolve_trace("no-such-trace")
    assert str(e.value).startswith("no-such-trace: no such file, and not a known trace name; "
                                   "known names: arxiv_lengths, azure-conv-excerpt,")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TraceError) as e:
        resolve_trace("mooncake_toolagent")
    msg = str(e.value)
    assert msg.startswith("mooncake_toolagent: trace file toolagent_trace.jsonl not found; looked in: "
                          f"{tmp_path}/mooncake/toolagent_trace.jsonl; {tmp_path}/mooncake/toolagent_trace.jsonl.gz; "
                          f"{tmp_path}/toolagent_trace.jsonl; {tmp_path}/toolagent_trace.jsonl.gz;")
    assert msg.endswith("set RACK_TRACE_DIR to its directory")


def test_whole_traces_ship_compressed_and_unmodified(tmp_path):
    # found by name with no folder beside the checkout; the content's checksum is the
    # upstream file's (the traces' READMEs), as provenance reports it
    upstream = {"mooncake_conv": "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
                "azure_conv": "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
                "azure_code": "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
                "arxiv_lengths": "9d3580538d915ca75e4aaaa54590b42dbb17abc6d74c8913310cf07c232adcdc"}
    for name, sha in upstream.items():
        path = resolve_trace(name)
        assert path == (SHIPPED_DIR / (FULL_TRACES[name][0] + ".gz")).resolve()
        assert (path.parent / "README.md").is_file() and content_sha256(path) == sha
        assert open_trace(name).sha256() == sha
    # unpacked plain for an older checkout: the same content, found through RACK_TRACE_DIR
    unpack_shipped(tmp_path)
    plain = tmp_path / FULL_TRACES["azure_code"][0]
    assert content_sha256(plain) == upstream["azure_code"] and plain.read_bytes()[:9] == b"TIMESTAMP"


def test_whole_mooncake_trace_reads_in_order():
    # How fast it reads is a benchmark's question; a wall-time bound made the outcome depend on the host's load.
    reader = open_trace(full_trace("mooncake_conv"))
    reqs = list(reader)
    assert len(reqs) == 12_031 and [r.id for r in reqs] == list(range(12_031))
    assert all(len(r.block_hashes) == -(-r.prompt_tokens // 512) for r in reqs)


def test_mooncake_row_needs_one_hash_per_block(tmp_path):
    rows = [{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2, 3]},
            {"timestamp": 10, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2]}]
    p = write(tmp_path, "m.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(TraceError, match=r"m\.jsonl:2: field 'hash_ids': 2 block hashes, but a prompt of "
                                         r"1100 tokens has 3 blocks of 512 tokens \(expected 3\)"):
        list(open_trace(p))
    too_many = write(tmp_path, "n.jsonl", json.dumps({**rows[0], "hash_ids": [1, 2, 3, 4]}) + "\n")
    with pytest.raises(TraceError, match=r"n\.jsonl:1: field 'hash_ids': 4 block hashes"):
        list(open_trace(too_many))


def test_burstgpt_time_origin_is_the_first_valid_row(tmp_path):
    p = write(tmp_path, "b.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
              "5,ChatGPT,100,0,100,Conversation log\n"
              "7,ChatGPT,100,20,120,Conversation log\n"
              "9.5,GPT-4,50,10,60,API log\n")
    reader = open_trace(p)
    reqs = list(reader)
    assert [(r.id, r.arrival_s) for r in reqs] == [(1, 0.0), (2, 2.5)]
    assert reader.failed_requests == 1
