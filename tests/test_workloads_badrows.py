"""Bad rows: the exact error for each case, and skip_bad_rows counting them."""

import json
from pathlib import Path

import pytest

from workloads import TraceError, load_requests, open_trace, trace_stats



def moon(ts, inp, out, hashes=None) -> str:
    row = {"timestamp": ts, "input_length": inp, "output_length": out,
           "hash_ids": hashes if hashes is not None else [1]}
    return json.dumps(row) + "\n"


GOOD = moon(0, 100, 10)
AZ_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZ_GOOD = "2023-11-16 18:15:46.6805900,374,44\n"


def error_of(path: Path, **kw) -> str:
    with pytest.raises(TraceError) as e:
        list(open_trace(path, **kw))
    return str(e.value)


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


CASES = [
    # (file name, content, expected message after "<path>:", skip reason)
    ("missing.jsonl", GOOD + '{"timestamp": 1, "output_length": 5, "hash_ids": [1]}\n',
     "2: field 'input_length': missing (the row has keys: timestamp, output_length, hash_ids)",
     "missing_field"),
    ("missing.csv", AZ_HEADER + AZ_GOOD + "2023-11-16 18:15:47.0,374\n",
     "3: field 'GeneratedTokens': missing (the row has 2 of 3 columns)", "missing_field"),
    ("empty_value.csv", AZ_HEADER + AZ_GOOD + "2023-11-16 18:15:47.0,,5\n",
     "3: field 'ContextTokens': missing (empty value)", "missing_field"),
    ("negative.jsonl", GOOD + moon(1, -5, 10),
     "2: field 'input_length': expected a token count >= 1, got -5", "negative_length"),
    ("negative.csv", AZ_HEADER + AZ_GOOD + "2023-11-16 18:15:47.0,374,-44\n",
     "3: field 'GeneratedTokens': expected a token count >= 1, got -44", "negative_length"),
    ("zero.jsonl", GOOD + moon(1, 100, 0),
     "2: field 'output_length': expected a token count >= 1, got 0", "zero_length"),
    ("text.csv", AZ_HEADER + AZ_GOOD + "2023-11-16 18:15:47.0,abc,44\n",
     "3: field 'ContextTokens': expected an integer token count, got 'abc'", "not_a_number"),
    ("text.jsonl", GOOD + moon(1, "12x", 10),
     "2: field 'input_length': expected a JSON number (a token count), got the string '12x'", "not_a_number"),
    # a count written as a JSON string is refused even when its text is a number (issue 37)
    ("string.jsonl", GOOD + moon(1, "1000", 10),
     "2: field 'input_length': expected a JSON number (a token count), got the string '1000'", "not_a_number"),
    ("string_out.jsonl", GOOD + moon(1, 1000, "10"),
     "2: field 'output_length': expected a JSON number (a token count), got the string '10'", "not_a_number"),
    ("fraction.jsonl", GOOD + moon(1, 12.5, 10),
     "2: field 'input_length': expected an integer token count, got 12.5", "not_a_number"),
    ("bad_time.jsonl", GOOD + moon("soon", 100, 10),
     "2: field 'timestamp': expected a number of milliseconds, got 'soon'", "not_a_number"),
    ("bad_time.csv", AZ_HEADER + AZ_GOOD + "16/11/2023 18:15,374,44\n",
     "3: field 'TIMESTAMP': expected a date-time such as '2023-11-16 18:15:46.6805900', "
     "got '16/11/2023 18:15'", "not_a_number"),
    ("backwards.jsonl", moon(0, 100, 10) + moon(2000, 100, 10) + moon(1000, 100, 10),
     "3: field 'timestamp': goes backwards: 1000 ms is earlier than 2000 ms on line 2",
     "time_backwards"),
    ("backwards.csv", AZ_HEADER + AZ_GOOD + "2023-11-16 18:15:40.0000000,374,44\n",
     "3: field 'TIMESTAMP': goes backwards: 2023-11-16 18:15:40.0000000 is earlier than "
     "2023-11-16 18:15:46.6805900 on line 2", "time_backwards"),
    ("json.jsonl", GOOD + '{"timestamp": 1, "input_length": 5 "output_length": 5}\n',
     "2: invalid JSON (Expecting ',' delimiter at column 36)", "invalid_json"),
    ("control.jsonl", GOOD + '{"timestamp": 1, "note": "a\tb", "input_length": 5, "output_length": 5}\n',
     "2: invalid JSON (Invalid control character at column 28)", "invalid_json"),
    # a row with more fields than the header: csv.reader reads it, but its columns
    # are shifted (an unquoted comma in a value), so none of its values can be trusted
    ("extra.csv", AZ_HEADER + AZ_GOOD + "2023-11-16 18:15:47.0,374,44,9\n",
     "3: the row has 4 fields but the header (line 1) has 3 columns; quote a value that holds a comma",
     "extra_fields"),
    ("hashes.jsonl", GOOD + moon(1, 600, 10, [1, 2, 3]),
     "2: field 'hash_ids': 3 block hashes, but a prompt of 600 tokens has 2 blocks of "
     "512 tokens (expected 2)", "bad_hashes"),
    ("hash_type.jsonl", GOOD + moon(1, 600, 10, [1, "x"]),
     "2: field 'hash_ids': expected a list of integer block hashes, got [1, 'x']", "bad_hashes"),
]


@pytest.mark.parametrize("name,content,message,reason", CASES, ids=[c[0] for c in CASES])
def test_bad_row_error_names_file_line_and_field(tmp_path, name, content, message, reason):
    path = write(tmp_path, name, content)
    assert error_of(path) == f"{path}:{message}"


@pytest.mark.parametrize("name,content,message,reason", CASES, ids=[c[0] for c in CASES])
def test_skip_bad_rows_skips_and_counts(tmp_path, name, content, message, reason):
    path = write(tmp_path, name, content)
    reader = open_trace(path, skip_bad_rows=True)
    reqs = list(reader)
    assert reader.skipped == {reason: 1}
    assert reader.skipped_examples == [f"{path}:{message}"]
    assert len(reqs) == reader.rows_read - 1 and reqs[0].arrival_s == 0.0
    loaded = load_requests(path, skip_bad_rows=True)
    assert loaded.summary()["skipped_by_reason"] == {reason: 1} and loaded.skipped_rows == 1
    assert trace_stats(path, skip_bad_rows=True).skipped_by_reason == {reason: 1}


def test_error_object_carries_path_line_field(tmp_path):
    path = write(tmp_path, "n.jsonl", GOOD + moon(1, -5, 10))
    with pytest.raises(TraceError) as e:
        load_requests(path)
    err = e.value
    assert (err.path, err.line, err.field, err.reason) == (str(path), 2, "input_length",
                                                           "negative_length")
    assert err.__cause__ is None and err.__suppress_context__  # no chained internal traceback


def test_empty_files(tmp_path):
    empty = write(tmp_path, "empty.jsonl", "")
    assert error_of(empty) == f"{empty}:1: the file is empty (no header and no rows)"
    assert error_of(empty, format="mooncake") == \
        f"{empty}:1: the file is empty (expected one JSON object per line)"
    blank = write(tmp_path, "blank.csv", "\n\n")
    assert error_of(blank, format="azure") == f"{blank}:1: the file is empty (no header and no rows)"
    header_only = write(tmp_path, "header.csv", AZ_HEADER)
    assert error_of(header_only) == f"{header_only}:2: no data rows after the header"
    # empty is not a bad row: skipping cannot make it valid
    assert error_of(header_only, skip_bad_rows=True) == f"{header_only}:2: no data rows after the header"


def test_missing_column_in_header(tmp_path):
    path = write(tmp_path, "cols.csv", "TIMESTAMP,ContextTokens,Generated\n" + AZ_GOOD)
    assert error_of(path, format="azure") == (
        f"{path}:1: field 'GeneratedTokens': column not found in the header "
        "(columns: TIMESTAMP, ContextTokens, Generated)")


@pytest.mark.parametrize("fmt,header,good,extra", [
    ("vidur", "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio", "3772,54,3826,69.8",
     "2015,156,2171,12.9,7"),
    ("burstgpt", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
     "5,ChatGPT,472,18,490,Conversation log", "6,ChatGPT,4,72,18,90,Conversation log"),
    ("csv", "t,in,out", "0,10,2", "1,1,000,2"),
])
def test_every_csv_format_refuses_a_row_with_more_fields_than_its_header(tmp_path, fmt, header, good, extra):
    """A thousands separator or a label with a comma shifts the columns after it: the
    row is an error naming the file, its line and both counts, whatever the format."""
    path = write(tmp_path, f"{fmt}.csv", f"{header}\n{good}\n\n{extra}\n")
    mapping = {"timestamp": "t", "time_unit": "s", "prompt_tokens": "in", "output_tokens": "out"} \
        if fmt == "csv" else None
    n_header, n_row = header.count(",") + 1, extra.count(",") + 1
    assert error_of(path, format=fmt, mapping=mapping) == (
        f"{path}:4: the row has {n_row} fields but the header (line 1) has {n_header} columns; "
        "quote a value that holds a comma")
    reader = open_trace(path, format=fmt, mapping=mapping, skip_bad_rows=True)
    assert [r.id for r in reader] == [0] and reader.skipped == {"extra_fields": 1}


def test_a_quoted_comma_is_one_field(tmp_path):
    path = write(tmp_path, "quoted.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                 '5,"Chat,GPT",472,18,490,Conversation log\n')
    assert [(r.prompt_tokens, r.tenant) for r in open_trace(path)] == [(472, "Chat,GPT")]


def test_skipped_rows_do_not_shift_the_time_base(tmp_path):
    path = write(tmp_path, "base.jsonl",
                 moon(500, -1, 10) + moon(1000, 100, 10) + moon(400, 100, 10) + moon(2500, 100, 10))
    reader = open_trace(path, skip_bad_rows=True)
    reqs = list(reader)
    assert [(r.id, r.arrival_s) for r in reqs] == [(1, 0.0), (3, 1.5)]
    assert reader.skipped == {"negative_length": 1, "time_backwards": 1}


def test_all_rows_bad_is_an_error_for_load_and_stats(tmp_path):
    path = write(tmp_path, "bad.jsonl", moon(0, -1, 10) + moon(1, -2, 10))
    with pytest.raises(TraceError, match=r"no requests to replay: all 2 rows were skipped as bad "
                                         r"\(\{'negative_length': 2\}\)"):
        load_requests(path, skip_bad_rows=True)
    with pytest.raises(TraceError, match="no valid requests: all 2 rows were skipped"):
        trace_stats(path, skip_bad_rows=True)
