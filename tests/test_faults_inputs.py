"""Unbounded work and memory (issue 34, items 7-10): each test failed before its fix.

A crafted checkpoint config, over-long input lines, huge beams and decoding lengths, an
oversized download, an unwritable --output, a huge file to score. Every test refuses the input
before the expensive work starts, so none allocates much or runs long: the tiny untrained
checkpoint of conftest, seconds each.
"""

from __future__ import annotations

import dataclasses
import gzip
import http.server
import io
import json
import os
import select
import subprocess
import sys
import threading
import time
import unicodedata
from pathlib import Path

import pytest
import torch
from _tools import checkpoint_with_config

from transformer_lib import translation
from transformer_lib.model import count_parameters, make_model
from transformer_lib.translation import cli, data, inference

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.toml"
CPU = torch.device("cpu")
needs_data = pytest.mark.skipif(
    not all((data.default_data_dir() / f).is_file() for f in data.SHA256),
    reason="the Multi30k files are not available (set MULTI30K_DIR or run data.download())",
)


class _Watched:
    """A tokenizer that fails the test when asked to encode more than `most` characters."""

    def __init__(self, tok, most: int) -> None:
        self._tok, self._most = tok, most

    def encode(self, text, *args, **kwargs):
        assert len(text) <= self._most, f"the tokenizer was given {len(text):,} characters"
        return self._tok.encode(text, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tok, name)


def _error_lines(capsys) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


# ------------------------------------------------------------------ 7. the position table


def test_a_crafted_position_table_is_refused_before_anything_is_allocated(
        checkpoint_dir, tmp_path, monkeypatch):
    # a table of ~100 GB
    copy = checkpoint_with_config(checkpoint_dir, tmp_path / "c", max_positions=10**8)

    def no_build(**kw):
        raise AssertionError("the model was built")

    monkeypatch.setattr("transformer_lib.translation.config.make_model", no_build)
    with pytest.raises(ValueError, match=r"buffer.*max_params"):
        translation.load_model(copy, CPU)


def test_the_sinusoidal_table_is_built_once_and_counted(val_tokenizer):
    cfg = dataclasses.replace(translation.load_config(TINY), max_positions=1000)
    vocab = val_tokenizer.get_vocab_size()
    model = cfg.build_model(vocab)
    src_pe, tgt_pe = model.src_embed[1].pe, model.tgt_embed[1].pe
    assert src_pe.data_ptr() == tgt_pe.data_ptr()  # one table, not a copy per stack
    buffers = sum(b.numel() for b in model.buffers())
    assert buffers == 1000 * cfg.d_model
    assert translation.parameter_count(cfg, vocab) == count_parameters(model)  # as before
    with_buffers = translation.parameter_count(cfg, vocab, buffers=True)
    assert with_buffers == count_parameters(model) + buffers
    # the two stacks keep modules of their own (chapter 6 lists both dropouts by name)
    names = {name for name, _ in model.named_modules()}
    assert {"src_embed.1.dropout", "tgt_embed.1.dropout"} <= names
    # a learned table is trained: each stack has its own
    learned = make_model(**dataclasses.replace(cfg, positional="learned").model_kwargs(vocab))
    a, b = learned.src_embed[1].embedding.weight, learned.tgt_embed[1].embedding.weight
    assert a.data_ptr() != b.data_ptr()


# ------------------------------------------------------------------ 8. input length


def test_a_huge_sentence_is_refused_before_the_tokenizer_sees_it(checkpoint_dir):
    model, tok, _ = translation.load_model(checkpoint_dir, CPU)
    # 20 M characters (91 s and 2.7 GB to tokenize); read without the last space
    huge = "Hund " * 4_000_000
    watched = _Watched(tok, 100_000)
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"sentences\[1\] has .*19,999,999 characters"
                                         r".*max_input_len=256"):
        translation.translate_sentences(model, watched, ["Ein Hund.", huge])
    refused = []
    out = translation.translate_sentences(model, watched, ["Ein Hund.", huge, "Eine Frau."],
                                          on_too_long=lambda *a: refused.append(a))
    assert out[1] == "" and [r[0] for r in refused] == [1] and refused[0][2] == 256
    assert [out[0], out[2]] == translation.translate_sentences(model, tok,
                                                               ["Ein Hund.", "Eine Frau."])
    assert time.perf_counter() - t0 < 10


@pytest.mark.parametrize("text", [
    "Ein Hund rennt durch den Schnee.",
    unicodedata.normalize("NFD", "Fußgänger überqueren die Straße am Gelände."),
    "\u1100\u1161\u11a8" * 20,  # Hangul jamo: NFC makes one syllable of three characters
    unicodedata.normalize("NFD", "\u1f82") * 20,  # four characters, one after NFC
])
def test_the_character_limit_never_refuses_a_sentence_within_the_subword_limit(checkpoint_dir,
                                                                               text):
    model, tok, _ = translation.load_model(checkpoint_dir, CPU)
    n = len(translation.encode_text(tok, text, add_special=False))
    assert len(text) <= inference.source_character_limit(tok, n)

    def refused(*args):
        raise AssertionError(f"refused: {args}")

    [out] = translation.translate_sentences(model, tok, [text], max_input_len=n, beam_size=1,
                                            on_too_long=refused)
    assert isinstance(out, str)


def test_translate_writes_each_line_as_it_arrives(checkpoint_dir):
    cmd = [sys.executable, "-m", "transformer_lib", "translate", "--checkpoint",
           str(checkpoint_dir), "--beam", "1"]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT)
    try:
        proc.stdin.write(b"Ein Hund.\n")
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], 25)
        assert ready, "no output for the first line while stdin is still open"
        first = proc.stdout.readline()
        out, err = proc.communicate(b"Eine Frau.\n", timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err
    model, tok, _ = translation.load_model(checkpoint_dir, CPU)
    want = [translation.translate_sentences(model, tok, [s])[0]  # each line its own batch
            for s in ("Ein Hund.", "Eine Frau.")]
    assert [first.decode().rstrip("\n"), out.decode().rstrip("\n")] == want


class _Feed(io.RawIOBase):
    """stdin that hands out `chunks` one read at a time and notes what stdout held by then."""

    def __init__(self, chunks: list[bytes], stdout: io.StringIO) -> None:
        self.chunks, self.stdout, self.seen = list(chunks), stdout, []

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        self.seen.append(self.stdout.getvalue())
        if not self.chunks:
            return 0
        chunk = self.chunks.pop(0)
        if len(chunk) > len(b):  # the rest comes with the next read
            chunk, rest = chunk[: len(b)], chunk[len(b):]
            self.chunks.insert(0, rest)
        b[: len(chunk)] = chunk
        return len(chunk)


def test_translate_streams_and_refuses_a_huge_line_unread(checkpoint_dir, monkeypatch):
    model, tok, cfg = translation.load_model(checkpoint_dir, CPU)
    monkeypatch.setattr(inference, "load_model",
                        lambda *a, **k: (model, _Watched(tok, 100_000), cfg))
    stdout = io.StringIO()
    huge = b"Hund " * 4_000_000  # 20 MB in one line, arriving in pieces
    pieces = [huge[i : i + (1 << 20)] for i in range(0, len(huge), 1 << 20)]
    feed = _Feed([b"Ein Hund.\nZwei", b" M\xc3\xa4nner.\n", *pieces, b"\nEine Frau."],
                 stdout)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(feed)))
    monkeypatch.setattr(sys, "stdout", stdout)
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    assert cli.main(["translate", "--checkpoint", str(checkpoint_dir), "--beam", "1"]) == 1
    lines = stdout.getvalue().split("\n")
    assert len(lines) == 5 and lines[2] == "" and lines[4] == ""  # one line per input line
    want = [translation.translate_sentences(model, tok, [s])[0]  # each line its own batch
            for s in ("Ein Hund.", "Zwei Männer.", "Eine Frau.")]
    assert [lines[0], lines[1], lines[3]] == want
    assert feed.seen[:3] == ["", want[0] + "\n", want[0] + "\n" + want[1] + "\n"]
    assert err.getvalue().startswith("error: line 3: ") and "--max-input-len 256" in err.getvalue()


def _pair_files(tmp_path: Path, sources: list[str], refs: list[str]) -> tuple[str, str]:
    src, ref = tmp_path / "src.de", tmp_path / "ref.en"
    src.write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    ref.write_text("".join(r + "\n" for r in refs), encoding="utf-8")
    return str(src), str(ref)


def _no_long_decoding(monkeypatch, most: int = 300) -> None:
    real = inference._decode_batch

    def guarded(model, sources, **kw):
        assert max(len(s) for s in sources) <= most, "a long source was decoded"
        return real(model, sources, **kw)

    monkeypatch.setattr(inference, "_decode_batch", guarded)


def test_evaluate_files_caps_the_source_length_like_translate(checkpoint_dir, tmp_path,
                                                              capsys, monkeypatch):
    _no_long_decoding(monkeypatch)
    src, ref = _pair_files(tmp_path, ["Ein Hund.", "Hund " * 8000, "Eine Frau."],
                           ["A dog.", "Dog.", "A woman."])
    argv = ["evaluate", "--checkpoint", str(checkpoint_dir), "--src", src, "--ref", ref,
            "--beam", "1"]
    assert cli.main(argv) == 1
    [line] = _error_lines(capsys)
    assert line.startswith("error: --src line 2: ") and "--max-input-len 256" in line
    assert cli.main([*argv, "--max-input-len", "1"]) == 1
    assert "--src line 1: " in _error_lines(capsys)[0]


@needs_data
def test_the_evaluate_function_has_the_cap_and_names_its_limit(checkpoint_dir):
    with pytest.raises(ValueError, match=r"max_input_len=2"):
        translation.evaluate(checkpoint_dir, "val", limit=2, max_input_len=2, device=CPU)
    with pytest.raises(ValueError, match=r"limit must be None or an integer >= 1, got 0"):
        translation.evaluate(checkpoint_dir, "val", limit=0, device=CPU)


def test_a_huge_file_to_score_is_refused_without_reading_it_all(checkpoint_dir, tmp_path,
                                                                capsys, monkeypatch):
    monkeypatch.setattr(cli, "MAX_TEXT_BYTES", 1 << 20, raising=False)
    block = gzip.compress(b"Ein Hund.\n" * 100_000)  # 1 MB of text, a few kB compressed
    bomb = tmp_path / "bomb.de.gz"
    bomb.write_bytes(block * 3)  # gzip members concatenated: 3 MB of text
    ref = tmp_path / "ref.en"
    ref.write_text("A dog.\n")
    assert cli.main(["evaluate", "--checkpoint", str(checkpoint_dir), "--src", str(bomb),
                     "--ref", str(ref), "--limit", "1"]) == 1
    [line] = _error_lines(capsys)
    assert "--src" in line and "more than 1 MiB of text" in line


# ------------------------------------------------------------------ 9. beam, lengths, download


def test_the_beam_is_bounded_everywhere(checkpoint_dir, capsys, monkeypatch):
    assert cli.main(["translate", "--beam", "100000"]) == 2
    assert "--beam: must be an integer >= 1 and <= 64, got 100000" in _error_lines(capsys)[0]

    def no_search(*a, **k):
        raise AssertionError("beam search ran")

    monkeypatch.setattr(inference, "beam_search", no_search)
    model, tok, _ = translation.load_model(checkpoint_dir, CPU)
    with pytest.raises(ValueError, match=r"beam_size must be an integer >= 1 and <= 64"):
        translation.translate_sentences(model, tok, ["Ein Hund."], beam_size=100_000)

    class Small(_Watched):
        def get_vocab_size(self):
            return 10

    with pytest.raises(ValueError, match=r"beam_size \(20\).*vocabulary of 10"):
        translation.translate_sentences(model, Small(tok, 100), ["Ein Hund."], beam_size=20)
    with pytest.raises(ValueError, match=r"beam_size must be an integer >= 1 and <= 64"):
        translation.evaluate(checkpoint_dir, beam_size=65, device=CPU)
    with pytest.raises(ValueError, match=r"beam_size must be an integer >= 1 and <= 64"):
        translation.Config(beam_size=100_000)


def test_decoding_lengths_are_bounded(checkpoint_dir, tmp_path, monkeypatch):
    real = inference.greedy_decode

    def guarded(model, src, src_mask, max_len, *a, **k):
        assert max_len <= 100_000, f"decoding up to {max_len:,} tokens"
        return real(model, src, src_mask, max_len, *a, **k)

    monkeypatch.setattr(inference, "greedy_decode", guarded)
    model, tok, _ = translation.load_model(checkpoint_dir, CPU)
    for key, value in (("max_len_b", 10**9), ("max_len_a", 1e6), ("max_len_a", float("nan")),
                       ("max_len_a", -1.0), ("max_len_b", 0)):
        with pytest.raises(ValueError, match=key):
            translation.translate_sentences(model, tok, ["Ein Hund."], **{key: value})
    with pytest.raises(ValueError, match="max_len_b"):
        translation.Config(max_len_b=10**9)
    with pytest.raises(ValueError, match="max_len_a"):
        translation.Config(max_len_a=1e6)
    crafted = checkpoint_with_config(checkpoint_dir, tmp_path / "c", max_len_b=10**9)
    with pytest.raises(ValueError, match="max_len_b"):
        translation.translate(crafted, ["Ein Hund."], device=CPU)


def test_the_length_penalty_cannot_overflow(checkpoint_dir, capsys):
    # ((5 + length) / 6) ** alpha: alpha = 1000 was an OverflowError, an "internal error"
    assert cli.main(["translate", "--length-penalty", "1000"]) == 2
    assert "--length-penalty: must be a number >= 0 and <= 10" in _error_lines(capsys)[0]
    model, tok, cfg = translation.load_model(checkpoint_dir, CPU)
    with pytest.raises(ValueError, match="length_penalty must be a number >= 0 and <= 10"):
        translation.translate_sentences(model, tok, ["Ein Hund."], beam_size=2,
                                        length_penalty=1000.0)
    with pytest.raises(ValueError, match="length_penalty must be a number >= 0 and <= 10"):
        cfg.decode_kwargs(1000.0)
    with pytest.raises(ValueError, match="length_penalty must be a number >= 0 and <= 10"):
        translation.Config(length_penalty=1000.0)


class _Flood(http.server.BaseHTTPRequestHandler):
    """Answers with more bytes than any Multi30k file, with or without a Content-Length."""

    length: str | None = None
    protocol_version = "HTTP/1.0"

    def do_GET(self):  # noqa: N802 (http.server's naming)
        self.send_response(200)
        if self.length is not None:
            self.send_header("Content-Length", self.length)
        self.end_headers()
        try:
            for _ in range(40):  # 40 MiB at most
                self.wfile.write(b"\0" * (1 << 20))
        except OSError:  # the client hung up: what the fix does
            pass

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("length", [str(10**12), None])
def test_download_refuses_a_response_larger_than_any_multi30k_file(tmp_path, length):
    handler = type("H", (_Flood,), {"length": length})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        with pytest.raises(ValueError, match=r"val\.de\.gz.*more than 16 MiB.*nothing was written"):
            data.download(tmp_path, base_url=f"http://127.0.0.1:{srv.server_address[1]}",
                          files=["val.de.gz"], timeout=20)
        assert list(tmp_path.iterdir()) == []
    finally:
        srv.shutdown()
        srv.server_close()


# ------------------------------------------------------------------ 10. evaluate --output


@pytest.mark.parametrize("where", ["missing/out.json", "a_dir", "file/out.json"])
def test_evaluate_output_is_checked_before_any_decoding(checkpoint_dir, tmp_path, capsys,
                                                       monkeypatch, where):
    (tmp_path / "a_dir").mkdir()
    (tmp_path / "file").write_text("x")

    def no_work(*a, **k):
        raise AssertionError("decoded before checking --output")

    monkeypatch.setattr(inference, "translate_and_score", no_work)
    src, ref = _pair_files(tmp_path, ["Ein Hund."], ["A dog."])
    output = str(tmp_path / where)
    assert cli.main(["evaluate", "--checkpoint", str(checkpoint_dir), "--src", src, "--ref",
                     ref, "--output", output]) == 1
    [line] = _error_lines(capsys)
    assert line.startswith("error: --output ") and output in line


def test_evaluate_output_is_written_whole_or_not_at_all(checkpoint_dir, tmp_path):
    src, ref = _pair_files(tmp_path, ["Ein Hund.", "Eine Frau."], ["A dog.", "A woman."])
    out = tmp_path / "result.json"
    out.write_text("the previous result")
    argv = ["evaluate", "--checkpoint", str(checkpoint_dir), "--src", src, "--ref", ref,
            "--beam", "1", "--output", str(out)]
    code = (  # the file-size limit makes any write of more than 64 bytes fail (EFBIG)
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))\n"
        "from transformer_lib.translation import cli\n"
        f"sys.exit(cli.main({argv!r}))\n"
    )
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120)
    assert proc.returncode == 1 and "--output" in proc.stderr, proc.stderr
    assert out.read_text() == "the previous result"  # not truncated half-way
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ref.en", "result.json", "src.de"]
    assert cli.main(argv) == 0  # without the limit: the whole result, nothing left over
    assert json.loads(out.read_text())["sentences"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ref.en", "result.json", "src.de"]
