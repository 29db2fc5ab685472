"""Trace readers: Mooncake expansion, the token JSONL format, line-numbered errors."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixcache.errors import InvalidInputError
from prefixcache.sim.trace_stats import trace_stats
from prefixcache.sim.traces import (
    MOONCAKE_BLOCK,
    TraceFormatError,
    detect_format,
    expand_hash_ids,
    read_mooncake,
    read_token_jsonl,
    read_trace,
)

# The full Mooncake traces are not in the repository: the tests that need them read the
# directory named by PREFIXCACHE_TRACES (examples/README.md) and skip without it.
TRACES = (
    Path(os.environ.get("PREFIXCACHE_TRACES", "")) if os.environ.get("PREFIXCACHE_TRACES") else None
)
SAMPLE = Path(__file__).parents[1] / "examples" / "mooncake_sample.jsonl"


def write(tmp_path: Path, lines: list[object], name: str = "t.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return p


def mc(ts: int, n_in: int, n_out: int, ids: list[int]) -> dict[str, object]:
    return {"timestamp": ts, "input_length": n_in, "output_length": n_out, "hash_ids": ids}


def test_expansion_depends_only_on_the_id_and_is_distinct() -> None:
    a = expand_hash_ids([7, 3], 1024)
    b = expand_hash_ids([7, 9, 3], 1100)
    assert a.dtype == np.uint32 and a.size == 1024 and b.size == 1100
    assert np.array_equal(a[:512], b[:512])  # same id, same block
    assert np.array_equal(a[512:588], b[1024:1100])  # id 3 in another position
    ids = np.arange(2000)
    toks = expand_hash_ids(ids, ids.size * MOONCAKE_BLOCK)
    assert np.unique(toks).size == toks.size


def test_mooncake_reader(tmp_path: Path) -> None:
    p = write(
        tmp_path, [mc(0, 600, 5, [1, 2]), "", mc(1500, 512, 0, [1]), mc(2000, 1030, 3, [1, 2, 4])]
    )
    tr = read_mooncake(p)
    assert len(tr) == 3 and tr.skipped == 0 and tr.format == "mooncake"
    r0, r1, r2 = tr.requests
    assert (r0.prompt_len, r0.output_len, r0.arrival) == (600, 5, 0.0)
    assert r1.arrival == 1.5 and r1.prompt_len == 512 and r1.output.size == 0
    assert np.array_equal(r0.prompt, expand_hash_ids([1, 2], 600))
    assert np.array_equal(r1.prompt, r0.prompt[:512])
    assert np.array_equal(r2.prompt[:600], r0.prompt)  # block 2 truncated in r0
    outs = np.concatenate([r0.output, r2.output])
    assert np.unique(outs).size == 8
    assert not np.isin(outs, np.concatenate([r.prompt for r in tr.requests])).any()
    assert tr.hash_ids is not None and [h.tolist() for h in tr.hash_ids] == [[1, 2], [1], [1, 2, 4]]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        (json.dumps({"timestamp": 0, "input_length": 5, "output_length": 1}), "hash_ids"),
        (json.dumps(mc(0, 600, 1, [1])), "needs 2 hash ids"),
        (json.dumps(mc(0, 0, 1, [])), "input_length"),
        (json.dumps(mc(-1, 5, 1, [1])), "timestamp"),
        (json.dumps(mc(0, 5, 1, [-3])), "hash_ids"),
        (json.dumps(mc(0, 5, 1.5, [1])), "output_length"),  # type: ignore[arg-type]
    ],
)
def test_mooncake_errors_name_the_line(tmp_path: Path, line: str, message: str) -> None:
    p = write(tmp_path, [mc(0, 10, 1, [0]), line, mc(5, 10, 1, [0])])
    with pytest.raises(TraceFormatError) as ei:
        read_mooncake(p)
    assert ei.value.line == 2 and f"{p}:2:" in str(ei.value) and message in str(ei.value)
    assert isinstance(ei.value, InvalidInputError) and isinstance(ei.value, ValueError)
    tr = read_mooncake(p, skip_bad_lines=True)
    assert len(tr) == 2 and tr.skipped == 1 and tr.skipped_lines == [2]


def tok(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {"id": "r", "arrival": 0.5, "prompt": [1, 2, 3], "output_len": 2}
    base.update(kw)
    return {k: v for k, v in base.items() if v is not None}


def test_token_jsonl_reader(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        [
            tok(id="a", session="s", extra_key="lora1", cache_salt="x"),
            tok(id=7, arrival=2, prompt=[1, 2, 3, 4], output=[9, 8], output_len=None, session="s"),
            tok(id="c", cache_salt=""),
        ],
    )
    tr = read_token_jsonl(p)
    a, b, c = tr.requests
    assert a.id == "a" and a.extra_key == "lora1" and a.cache_salt == "x" and a.turn == 0
    assert b.id == 7 and b.turn == 1 and b.arrival == 2.0 and b.output.tolist() == [9, 8]
    assert a.output.size == 2 and c.output.size == 2 and c.cache_salt is None
    assert np.unique(np.concatenate([a.output, c.output])).size == 4
    assert a.prompt.dtype == np.uint32 and a.prompt.tolist() == [1, 2, 3]
    assert detect_format(p) == "tokens" and len(read_trace(p)) == 3


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (tok(id=None), "missing field 'id'"),
        (tok(arrival=None), "missing field 'arrival'"),
        (tok(arrival="soon"), "arrival"),
        (tok(prompt=[]), "'prompt' is empty"),
        (tok(prompt=[1, -2]), "'prompt'[1]"),
        (tok(prompt=[1, 2**32]), "'prompt'[1]"),
        (tok(prompt=[1, 2.5]), "'prompt'[1]"),
        (tok(prompt=[1, 2, 10**30]), "'prompt'[2]"),
        (tok(arrival=10**400), "arrival"),
        (tok(output=[1]), "exactly one of"),
        (tok(output_len=None), "exactly one of"),
        (tok(output_len=-1), "output_len"),
        (tok(session=[1]), "session"),
        (tok(extra_key=3), "extra_key"),
        (tok(colour="red"), "unknown field"),
        (tok(id="first"), "duplicate id"),
    ],
)
def test_token_jsonl_errors_name_the_line(
    tmp_path: Path, obj: dict[str, object], message: str
) -> None:
    p = write(tmp_path, [tok(id="first"), "", obj, tok(id="last")])
    with pytest.raises(TraceFormatError) as ei:
        read_token_jsonl(p)
    assert ei.value.line == 3 and message in str(ei.value), str(ei.value)
    tr = read_token_jsonl(p, skip_bad_lines=True)
    assert [r.id for r in tr.requests] == ["first", "last"] and tr.skipped_lines == [3]


def test_detect_format_errors(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="empty"):
        detect_format(write(tmp_path, [""]))
    with pytest.raises(TraceFormatError, match="cannot tell"):
        detect_format(write(tmp_path, [{"a": 1}]))
    with pytest.raises(InvalidInputError, match="unknown trace format"):
        read_trace(write(tmp_path, [tok()]), fmt="csv")


@pytest.mark.skipif(
    TRACES is None,
    reason="PREFIXCACHE_TRACES is not set (the directory of "
    "the full Mooncake traces, see examples/README.md)",
)
def test_real_mooncake_trace_matches_its_readme() -> None:
    assert TRACES is not None
    tr = read_trace(TRACES / "mooncake_synthetic.jsonl")
    assert len(tr) == 3993 and tr.format == "mooncake"
    st = trace_stats(tr.requests, 512, tr.hash_ids)
    assert st["hash_id_refs"] == 121_877
    assert st["distinct_hash_ids"] == 43_924
    assert round(100 * st["hash_id_repeat_share"], 1) == 64.0
    # Expanded prompts share exactly as long as their leading ids agree.
    ids = tr.hash_ids
    assert ids is not None
    for i in range(1, 40):
        a, b = tr.requests[i - 1], tr.requests[i]
        n = 0
        while n < min(ids[i - 1].size, ids[i].size) and ids[i - 1][n] == ids[i][n]:
            n += 1
        pa, pb = a.prompt, b.prompt
        m = min(pa.size, pb.size)
        lcp = int(np.argmin(pa[:m] == pb[:m])) if not np.array_equal(pa[:m], pb[:m]) else m
        assert lcp >= min(n * 512, m)
        if n < min(ids[i - 1].size, ids[i].size):
            assert lcp == n * 512


def test_sample_trace_and_its_ceilings_equal_unlimited_replays() -> None:
    """The shipped sample: its hash-id figures, and the ceilings of trace-stats equal what
    the caches hit with unlimited KV (the tree: token level; 512-token blocks: the block
    ceiling) - computed on the ids on one side, by the Rust caches on the other."""
    from prefixcache.sim.replay import replay, summarize

    tr = read_trace(SAMPLE)
    assert len(tr) == 600 and tr.format == "mooncake" and tr.skipped == 0
    stats = trace_stats(tr.requests, 512, tr.hash_ids)
    assert (stats["hash_id_refs"], stats["distinct_hash_ids"]) == (24_263, 7_907)
    assert round(100 * stats["hash_id_repeat_share"], 1) == 67.4
    reqs = tr.requests[:150]
    st = trace_stats(reqs, 512, tr.hash_ids[:150])
    results = replay(reqs, ["radix", "vllm-blocks512"])
    rates = {s["policy"]: s["hit_rate"] for s in map(summarize, results)}
    assert st["hit_rate_ceiling"] == rates["radix"] > 0
    assert st["block_hit_rate_ceiling"] == rates["vllm-blocks512"] > 0
    # The generic token path (as for a token trace) agrees with the id path.
    generic = trace_stats(reqs, 512)
    assert generic["hit_rate_ceiling"] == st["hit_rate_ceiling"]
    assert generic["block_hit_rate_ceiling"] == st["block_hit_rate_ceiling"]


@pytest.mark.parametrize("name", ["A", "C", "D", "F"])
def test_ceilings_bound_every_policy_on_the_study_workloads(name: str) -> None:
    """The ceilings include outputs a later turn reuses (D: the tree's 91.17% was above the
    old prompt-only figure of 80.2%); with unlimited KV the tree reaches the token ceiling
    and 16-token blocks the block ceiling exactly."""
    from prefixcache.sim.replay import replay, summarize
    from prefixcache.sim.workloads import study_workload

    w = study_workload(name, 0)
    st = trace_stats(w.requests, 16)
    for cap in (None, w.capacity):
        rates = {
            s["policy"]: s["hit_rate"]
            for s in map(summarize, replay(w.requests, ["radix", "vllm-blocks"], cap))
        }
        assert rates["radix"] <= st["hit_rate_ceiling"]
        assert rates["vllm-blocks"] <= st["block_hit_rate_ceiling"] <= st["hit_rate_ceiling"]
        if cap is None:
            assert rates["radix"] == st["hit_rate_ceiling"]
            assert rates["vllm-blocks"] == st["block_hit_rate_ceiling"]


def test_the_block_ceiling_bounds_full_blocks_only() -> None:
    """vllm-blocks reuses full blocks only; trtllm-nopartial also reuses a non-full block
    whose key matches exactly (TensorRT-LLM does too), which can pass the block ceiling
    but never the token one."""
    from prefixcache.sim.replay import replay, summarize
    from prefixcache.sim.requests import Request

    prompts = [[1, 2, 3, 4], [1, 2, 3, 5]]
    empty = np.zeros(0, np.uint32)
    reqs = [Request(i, np.array(p, np.uint32), empty) for i, p in enumerate(prompts)]
    stats = trace_stats(reqs, 2)
    hits = {
        s["policy"]: s["hit_tokens"]
        for s in map(summarize, replay(reqs, ["vllm-blocks2", "trtllm-nopartial2"]))
    }
    assert stats["block_hit_rate_ceiling"] * 8 == hits["vllm-blocks2"] == 2
    assert stats["hit_rate_ceiling"] * 8 == hits["trtllm-nopartial2"] == 3


def test_ceilings_keep_namespaces_apart(tmp_path: Path) -> None:
    prompt = list(range(1, 65))
    p = write(
        tmp_path,
        [
            tok(id="a", prompt=prompt, cache_salt="t1"),
            tok(id="b", prompt=prompt, cache_salt="t2"),
            tok(id="c", prompt=prompt, extra_key="lora"),
            tok(id="d", prompt=prompt, cache_salt="t1"),
        ],
    )
    st = trace_stats(read_token_jsonl(p).requests, 16)
    # Only d reuses (a's prompt, same salt): 63 tokens, 48 in full 16-token blocks.
    assert st["hit_rate_ceiling"] == 63 / 256 and st["block_hit_rate_ceiling"] == 48 / 256


def test_trace_stats_rejects_a_block_size_below_one() -> None:
    with pytest.raises(InvalidInputError, match="block_size must be >= 1"):
        trace_stats([], 0)


_JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 2**33)
    | st.integers(2**63, 10**40)
    | st.floats(allow_nan=True)
    | st.text(max_size=5),
    lambda kids: (
        st.lists(kids, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "id",
                    "arrival",
                    "prompt",
                    "output",
                    "output_len",
                    "session",
                    "extra_key",
                    "cache_salt",
                    "timestamp",
                    "input_length",
                    "output_length",
                    "hash_ids",
                    "x",
                ]
            ),
            kids,
            max_size=6,
        )
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(value=_JSON_VALUES, raw=st.text(max_size=30), use_raw=st.booleans())
def test_any_line_parses_or_raises_trace_format_error(
    tmp_path_factory: pytest.TempPathFactory, value: object, raw: str, use_raw: bool
) -> None:
    line = raw.replace("\n", " ").replace("\r", " ") if use_raw else json.dumps(value)
    p = tmp_path_factory.mktemp("fuzz") / "t.jsonl"
    p.write_text(line + "\n", encoding="utf-8")
    for reader in (read_mooncake, read_token_jsonl):
        try:
            tr = reader(p)
        except TraceFormatError as e:
            assert e.line == 1
            assert len(reader(p, skip_bad_lines=True)) == 0
        else:
            for r in tr.requests:
                assert r.prompt.dtype == np.uint32 and r.prompt.size == r.prompt_len >= 1
                assert r.output.size == r.output_len


def test_non_utf8_line_is_a_line_error(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    good = json.dumps(mc(0, 10, 1, [0])).encode()
    p.write_bytes(good + b"\n" + b'{"timestamp": 1, "x": "\xff\xfe"}\n' + good + b"\n")
    with pytest.raises(TraceFormatError, match=r"t\.jsonl:2: not UTF-8 text \(byte 0xff"):
        read_trace(p)
    tr = read_trace(p, skip_bad_lines=True)
    assert len(tr) == 2 and tr.skipped_lines == [2]


def test_binary_file_is_one_clear_error(tmp_path: Path) -> None:
    p = tmp_path / "model.bin"
    p.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    with pytest.raises(TraceFormatError, match="not UTF-8 text"):
        read_trace(p)


def test_deeply_nested_json_is_a_line_error(tmp_path: Path) -> None:
    p = write(tmp_path, [mc(0, 10, 1, [0]), "[" * 100_000 + "]" * 100_000])
    with pytest.raises(TraceFormatError, match="nested too deeply"):
        read_mooncake(p)
    assert len(read_mooncake(p, skip_bad_lines=True)) == 1
    p = write(tmp_path, [tok(id="a"), '{"id": "b", "prompt": ' + "[" * 100_000])
    with pytest.raises(TraceFormatError, match=":2: "):
        read_token_jsonl(p)


@pytest.mark.parametrize("field", ["cache_salt", "extra_key", "id", "session"])
def test_lone_surrogate_strings_are_rejected(tmp_path: Path, field: str) -> None:
    line = json.dumps(tok(**{"id": "b", field: "x\ud800"}))
    assert "\\ud800" in line  # what a JSON writer emits for it
    p = write(tmp_path, [tok(id="a"), line])
    with pytest.raises(TraceFormatError, match=rf":2: field '{field}' is not valid Unicode"):
        read_token_jsonl(p)
    assert [r.id for r in read_token_jsonl(p, skip_bad_lines=True).requests] == ["a"]


@pytest.mark.parametrize("kind", ["gz", "zst", "bz2", "xz"])
def test_compressed_traces_read_transparently(tmp_path: Path, kind: str) -> None:
    import bz2
    import gzip
    import lzma

    plain = write(tmp_path, [mc(0, 600, 5, [1, 2]), mc(1500, 512, 0, [1])])
    data = plain.read_bytes()
    if kind == "zst":
        zstandard = pytest.importorskip("zstandard")
        packed = zstandard.ZstdCompressor().compress(data)
    else:
        packed = {"gz": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress}[kind](data)
    p = tmp_path / f"trace.jsonl.{kind}"
    p.write_bytes(packed)
    a, b = read_trace(plain), read_trace(p)
    assert b.format == "mooncake" and len(b) == 2
    for x, y in zip(a.requests, b.requests, strict=True):
        assert np.array_equal(x.prompt, y.prompt) and np.array_equal(x.output, y.output)
    # A truncated or corrupt compressed file is one InvalidInputError, not a traceback.
    bad = tmp_path / f"bad.{kind}"
    bad.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(InvalidInputError, match="bad"):
        read_trace(bad)


def test_outputs_beyond_2_31_tokens_are_readable(tmp_path: Path) -> None:
    """Three requests whose outputs total 3 * 2**30 + 5 tokens (> 2**31): fresh ids wrap,
    but every request's first output token stays distinct from every other's."""
    big = 2**30
    p = write(
        tmp_path,
        [mc(0, 10, big, [0]), mc(1, 10, big + 5, [0]), mc(2, 10, big, [0]), mc(3, 10, 3, [0])],
    )
    tr = read_mooncake(p)
    assert [r.output_len for r in tr.requests] == [big, big + 5, big, 3]
    last = tr.requests[3].output
    assert last.dtype == np.uint32 and last.size == 3 and (last >= 2**31).all()
    firsts = [int(r.output_head(1)[0]) for r in tr.requests]
    assert len(set(firsts)) == 4
    assert np.array_equal(tr.requests[1].output_head(5), np.arange(5) + 2**31 + 1)
    st = trace_stats(tr.requests, 512, tr.hash_ids)
    assert st["output_tokens"] == 3 * big + 8
    q = write(tmp_path, [tok(id="a", output_len=2**31), tok(id="b", output_len=4)], "t2.jsonl")
    b = read_token_jsonl(q).requests[1].output
    assert b.size == 4 and (b >= 2**31).all()


@settings(max_examples=150, deadline=None)
@given(raw=st.binary(max_size=40), prefix=st.sampled_from([b"", b'{"id": "', b"\x1f\x8b"]))
def test_any_bytes_parse_or_raise_a_trace_error(
    tmp_path_factory: pytest.TempPathFactory, raw: bytes, prefix: bytes
) -> None:
    """Arbitrary bytes (not UTF-8, truncated compressed headers, ...) end in a
    TraceFormatError or InvalidInputError, never another exception."""
    p = tmp_path_factory.mktemp("bytes") / "t.jsonl"
    p.write_bytes(prefix + raw.replace(b"\n", b" ") + b"\n")
    for fmt in ("auto", "mooncake", "tokens"):
        with contextlib.suppress(InvalidInputError):
            read_trace(p, fmt=fmt)


def test_hash_ids_expand_to_512_consecutive_tokens_each() -> None:
    from prefixcache import InvalidInputError, InvalidTypeError
    from prefixcache._core import expand_block_ids
    from prefixcache.sim.traces import expand_hash_ids

    rng = np.random.default_rng(7)
    for _ in range(20):
        ids = rng.integers(0, 2**22, size=int(rng.integers(0, 9)), dtype=np.uint32)
        n = int(rng.integers(0, 512 * len(ids) + 600))
        want = (ids[:, None] * np.uint32(512) + np.arange(512, dtype=np.uint32)).reshape(-1)[:n]
        for form in (ids, ids.tolist(), ids.astype(np.int64)):
            got = expand_hash_ids(form, n)
            assert got.dtype == np.uint32 and got.tolist() == want.tolist()
    assert expand_block_ids([2, 0], 3, 5).tolist() == [6, 7, 8, 0, 1]
    top = (2**32 - 1) // 512
    assert expand_block_ids([top], 512, 512)[-1] == 2**32 - 1
    with pytest.raises(InvalidInputError, match="block id 8388608 at position 1"):
        expand_block_ids([0, top + 1], 512, 1024)
    assert len(expand_block_ids([0, top + 1], 512, 512)) == 512  # the unused id is not read
    with pytest.raises(InvalidInputError):
        expand_block_ids([1], 0, 4)
    with pytest.raises(InvalidInputError):
        expand_block_ids([-1], 512, 4)
    with pytest.raises(InvalidTypeError):
        expand_block_ids([1], 512, 4.0)


def test_skipping_bad_lines_also_skips_them_when_telling_the_format(tmp_path: Path) -> None:
    good = [mc(0, 10, 1, [0]), mc(5, 10, 1, [0])]
    for bad in ('{"timestamp": 0,', '{"foo": 1}'):
        p = tmp_path / "t.jsonl"
        p.write_text(bad + "\n" + "".join(json.dumps(x) + "\n" for x in good))
        with pytest.raises(TraceFormatError) as ei:
            read_trace(p)
        assert ei.value.line == 1
        tr = read_trace(p, skip_bad_lines=True)
        assert tr.format == "mooncake" and len(tr) == 2 and tr.skipped_lines == [1]
    p.write_text('{"foo": 1}\n\n[1]\n')
    with pytest.raises(TraceFormatError, match=r":1: no line is a request of either format"):
        read_trace(p, skip_bad_lines=True)


def test_a_line_longer_than_the_limit_is_refused_with_its_number(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A line is never read whole past ``MAX_LINE_BYTES``: a longer one is an error naming
    its line (skipping bad lines or not); one exactly at the limit is read."""
    import prefixcache.sim.traces as traces

    good = json.dumps({"id": 1, "arrival": 0, "prompt": [1, 2], "output_len": 1})
    monkeypatch.setattr(traces, "MAX_LINE_BYTES", len(good) + 1)  # the line and its newline
    path = tmp_path / "t.jsonl"
    path.write_text(good + "\n" + good.replace("[1, 2]", "[1, 2, 3]") + "\n")
    for skip in (False, True):
        with pytest.raises(TraceFormatError, match=r"t\.jsonl:2: line longer than") as e:
            read_trace(path, skip_bad_lines=skip)
        assert e.value.line == 2
    path.write_text(good + "\n" + good.replace('"id": 1', '"id": 2') + "\n")
    assert len(read_trace(path)) == 2


def test_an_endless_line_fails_without_reading_it_all(capsys: pytest.CaptureFixture[str]) -> None:
    from prefixcache.sim.cli import main

    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero")
    assert main(["trace-stats", "/dev/zero"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err
        == "error: /dev/zero:1: line longer than 64 MiB (67,108,864 bytes); not a trace of requests"
    )


def test_arrivals_past_the_limit_are_refused(tmp_path: Path) -> None:
    """A finite but huge arrival would leave the time model's float clock nothing to
    count (a 5 ms prefill vanishes next to 1e300 s): the readers refuse it, by line."""
    from prefixcache.sim.traces import MAX_ARRIVAL_SECONDS

    mc = tmp_path / "m.jsonl"
    row = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}
    for ts, ok in ((MAX_ARRIVAL_SECONDS * 1000, True), (1e300, False), (10**400, False)):
        mc.write_text(json.dumps(row) + "\n" + json.dumps({**row, "timestamp": ts}) + "\n")
        if ok:
            assert read_mooncake(mc).requests[1].arrival == MAX_ARRIVAL_SECONDS
        else:
            with pytest.raises(TraceFormatError, match=r"m\.jsonl:2: field 'timestamp' must be"):
                read_mooncake(mc)
    tok = tmp_path / "t.jsonl"
    for arrival, ok in ((MAX_ARRIVAL_SECONDS, True), (MAX_ARRIVAL_SECONDS * 1.01, False)):
        tok.write_text(json.dumps({"id": 1, "arrival": arrival, "prompt": [1], "output_len": 1}))
        if ok:
            assert read_token_jsonl(tok).requests[0].arrival == arrival
        else:
            with pytest.raises(TraceFormatError, match=r"field 'arrival' must be <= 1e\+10"):
                read_token_jsonl(tok)


@pytest.mark.parametrize("fmt", ["auto", "mooncake", "tokens"])
def test_a_trace_without_a_request_is_refused_in_every_format(tmp_path: Path, fmt: str) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text("\n\n")
    with pytest.raises(InvalidInputError, match=r"t\.jsonl: the trace is empty"):
        read_trace(p, fmt=fmt)
    p.write_text("\nbad\n[1]\n")
    with pytest.raises(TraceFormatError, match="no line is a") as e:
        read_trace(p, fmt=fmt, skip_bad_lines=True)
    assert e.value.line == 2
