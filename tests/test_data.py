"""Tests of transformer_lib.translation.data: verified Multi30k loading, download, BPE, batches."""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import unicodedata
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer_lib.translation import data
from transformer_lib.translation.data import BOS, EOS, PAD, UNK

# Where the tests read Multi30k: the local mirror (tests/conftest.py sets MULTI30K_DIR as the
# task runner does), else the user cache, filled on first use by the `multi30k` marker.
DATA = data.default_data_dir()
FILES = list(data.SHA256)
ROOT = Path(__file__).resolve().parents[1]

needs_data = pytest.mark.multi30k


def _write_gz(path: Path, text: str) -> Path:
    path.write_bytes(gzip.compress(text.encode("utf-8"), mtime=0))
    return path


def _copy(names: list[str], dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for n in names:
        shutil.copyfile(DATA / n, dest / n)
    return dest


# ----------------------------------------------------------------------------- loading


@needs_data
def test_embedded_checksums_match_the_files_and_the_mirrors_sha256sums():
    if (DATA / "SHA256SUMS").is_file():  # the local mirror lists them; the cache does not
        sums = (DATA / "SHA256SUMS").read_text().split("\n")
        listed = {name: digest for digest, name in (line.split() for line in sums if line.strip())}
        assert listed == data.SHA256
    for name in FILES:  # and the files themselves (independent hashing, no cache)
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == data.SHA256[name]


@needs_data
@pytest.mark.parametrize("split,size", [("train", 29000), ("val", 1014), ("test", 1000)])
def test_split_sizes_and_alignment(split, size):
    de_en = data.load_multi30k(split, DATA)
    en_de = data.load_multi30k(split, DATA, src_lang="en", tgt_lang="de")
    assert len(de_en) == size
    assert en_de == [(e, d) for d, e in de_en]
    assert all(isinstance(s, str) and isinstance(t, str) for s, t in de_en)
    assert not any("\n" in s or "\n" in t for s, t in de_en)


@needs_data
def test_text_is_raw_cased_and_untokenized():
    src, tgt = data.load_multi30k("val", DATA)[0]
    assert src == "Eine Gruppe von Männern lädt Baumwolle auf einen Lastwagen"
    assert tgt == "A group of men are loading cotton onto a truck"
    # Lines are exactly the file's lines: only the newline is removed.
    raw = gzip.decompress((DATA / "train.de.gz").read_bytes()).decode("utf-8").split("\n")[:-1]
    assert [s for s, _ in data.load_multi30k("train", DATA)] == raw


@needs_data
def test_limit_takes_a_prefix():
    assert data.load_multi30k("val", DATA, limit=7) == data.load_multi30k("val", DATA)[:7]
    assert data.load_multi30k("val", DATA, limit=0) == []
    with pytest.raises(ValueError, match="limit must be None or an integer >= 0"):
        data.load_multi30k("val", DATA, limit=-1)


def test_line_splitting_keeps_all_whitespace_but_the_newline(tmp_path):
    _write_gz(tmp_path / "val.de.gz", "  zwei  Leerzeichen \nA\u2028B\t\nohne Zeilenende")
    _write_gz(tmp_path / "val.en.gz", "x\ny\nz\n")
    pairs = data.load_multi30k("val", tmp_path, verify=False)
    assert [s for s, _ in pairs] == ["  zwei  Leerzeichen ", "A\u2028B\t", "ohne Zeilenende"]
    assert [t for _, t in pairs] == ["x", "y", "z"]


@needs_data
def test_corrupt_copy_is_rejected_with_both_checksums(tmp_path):
    _copy(["val.de.gz"], tmp_path)
    good = gzip.decompress((DATA / "val.en.gz").read_bytes()).decode("utf-8")
    bad = _write_gz(tmp_path / "val.en.gz", good.replace("truck", "lorry", 1))
    actual = hashlib.sha256(bad.read_bytes()).hexdigest()
    with pytest.raises(ValueError, match=rf"val\.en\.gz.*{data.SHA256['val.en.gz']}.*{actual}"):
        data.load_multi30k("val", tmp_path)
    # The file is well-formed, so only the checksum catches the change.
    assert data.load_multi30k("val", tmp_path, verify=False)[0][1].endswith("lorry")


def test_not_gzip_is_a_value_error(tmp_path):
    (tmp_path / "val.de.gz").write_bytes(b"plain text\n")
    _write_gz(tmp_path / "val.en.gz", "a\n")
    with pytest.raises(ValueError, match=r"val\.de\.gz is not gzip-compressed"):
        data.load_multi30k("val", tmp_path, verify=False)


@needs_data
def test_checksum_is_cached_until_the_file_changes(tmp_path, monkeypatch):
    _copy(["val.de.gz", "val.en.gz"], tmp_path)
    first = data.load_multi30k("val", tmp_path)

    def no_hashing(*_):
        raise AssertionError("hashed again")

    monkeypatch.setattr(data.hashlib, "sha256", no_hashing)
    assert data.load_multi30k("val", tmp_path) == first  # served from the cache
    st_ = (tmp_path / "val.en.gz").stat()
    os.utime(tmp_path / "val.en.gz", ns=(st_.st_atime_ns, st_.st_mtime_ns + 10**9))
    with pytest.raises(AssertionError, match="hashed again"):  # a changed file is re-hashed
        data.load_multi30k("val", tmp_path)


def test_missing_file_names_path_and_remedies(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"train\.de\.gz.*download\(.*MULTI30K_DIR"):
        data.load_multi30k("train", tmp_path)


def test_mismatched_line_counts(tmp_path):
    _write_gz(tmp_path / "val.de.gz", "a\nb\nc\n")
    _write_gz(tmp_path / "val.en.gz", "a\nb\n")
    with pytest.raises(ValueError, match=r"val\.de\.gz has 3 lines, val\.en\.gz has 2"):
        data.load_multi30k("val", tmp_path, verify=False)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"split": "dev"}, r"split must be one of \['test', 'train', 'val'\], got 'dev'"),
        ({"split": "val", "src_lang": "fr"}, r"language must be one of \['de', 'en'\], got 'fr'"),
        ({"split": "val", "tgt_lang": "de"}, "src_lang and tgt_lang must differ"),
        # a str, a float or a bool reached a comparison or a slice: TypeError, or (True) one pair
        ({"split": "val", "limit": "5"}, r"limit must be None or an integer >= 0, got '5'"),
        ({"split": "val", "limit": 2.5}, r"limit must be None or an integer >= 0, got 2\.5"),
        ({"split": "val", "limit": True}, r"limit must be None or an integer >= 0, got True"),
        ({"split": "val", "limit": -1}, r"limit must be None or an integer >= 0, got -1"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        data.load_multi30k(data_dir=tmp_path, **kwargs)


def test_default_data_dir_is_multi30k_dir_else_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("MULTI30K_DIR", str(tmp_path / "mine"))
    assert data.default_data_dir() == tmp_path / "mine"
    monkeypatch.delenv("MULTI30K_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data.default_data_dir() == tmp_path / "xdg" / "transformer_lib" / "multi30k"
    # Unset, empty or relative XDG_CACHE_HOME: ~/.cache on Linux (the XDG rule), the system's
    # user cache elsewhere (platformdirs). Nothing else is looked at, the repository's
    # surroundings included (tools/tasks.py sets MULTI30K_DIR for those).
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("USERPROFILE", str(tmp_path / "home"))  # Path.home() on Windows
    home_cache = tmp_path / "home" / ".cache" / "transformer_lib" / "multi30k"
    if not sys.platform.startswith("linux"):
        import platformdirs

        home_cache = platformdirs.user_cache_path("transformer_lib", appauthor=False) / "multi30k"
    for xdg in ("", "relative/cache"):
        monkeypatch.setenv("XDG_CACHE_HOME", xdg)
        assert data.default_data_dir() == home_cache
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert data.default_data_dir() == home_cache


@pytest.mark.parametrize("how", ["MULTI30K_DIR", "data_dir"])
def test_a_folder_under_a_user_that_does_not_exist_is_named(monkeypatch, how):
    # before: RuntimeError "Could not determine home directory." naming neither
    monkeypatch.setenv("MULTI30K_DIR", "~nosuchuser4t/x")
    with pytest.raises(ValueError, match=rf"{how}='~nosuchuser4t/x' starts with "
                                         r"~nosuchuser4t, but there is no such user"):
        if how == "MULTI30K_DIR":
            data.default_data_dir()
        else:
            data.load_multi30k("val", data_dir="~nosuchuser4t/x")


def test_a_missing_file_in_multi30k_dir_is_an_error_not_a_download(monkeypatch, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    monkeypatch.setenv("MULTI30K_DIR", str(mine))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("MULTI30K_URL", "http://127.0.0.1:9/never-asked")
    with pytest.raises(FileNotFoundError) as err:
        data.load_multi30k("val")
    message = str(err.value)
    for needle in ("val.de.gz", f"MULTI30K_DIR={mine}", "download(", "unset MULTI30K_DIR",
                   str(tmp_path / "cache")):  # fmt: skip
        assert needle in message, needle
    assert list(mine.iterdir()) == []
    assert not (tmp_path / "cache").exists()


# ----------------------------------------------------------------------------- download


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Serves the Multi30k files of `root`, corrupting or hiding some when told to."""

    root: Path = DATA
    corrupt: frozenset[str] = frozenset()
    missing: frozenset[str] = frozenset()
    requests: list[str]

    def do_GET(self):  # noqa: N802 (http.server's naming)
        name = self.path.rsplit("/", 1)[-1]
        self.requests.append(name)
        if name in self.missing or name not in data.SHA256 or not (self.root / name).is_file():
            self.send_error(404, "Not Found")
            return
        body = (self.root / name).read_bytes()
        if name in self.corrupt:
            body = body[:100] + bytes([body[100] ^ 0xFF]) + body[101:]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # keep the test output clean
        pass


@pytest.fixture
def server():
    """Start a local HTTP server on an ephemeral port; yields a factory (corrupt, missing, root)."""
    running = []

    def start(corrupt=(), missing=(), root=DATA):
        requests: list[str] = []
        handler = type(
            "H",
            (_Handler,),
            {"corrupt": frozenset(corrupt), "missing": frozenset(missing), "requests": requests,
             "root": Path(root)},
        )  # fmt: skip
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        thread = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
        thread.start()
        running.append((srv, thread))
        return f"http://127.0.0.1:{srv.server_address[1]}/data/task1/raw", requests

    yield start
    for srv, thread in running:
        srv.shutdown()
        srv.server_close()
        thread.join()


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name not in data.SHA256)


@needs_data
def test_download_fetches_verifies_and_skips_existing(server, tmp_path):
    url, requests = server()
    dest = data.download(tmp_path / "d", base_url=url, timeout=10)
    assert sorted(requests) == sorted(FILES)
    for name in FILES:
        assert (dest / name).read_bytes() == (DATA / name).read_bytes()
    assert _leftovers(dest) == []
    assert len(data.load_multi30k("test", dest)) == 1000
    # Second call: everything present and verified, so nothing is fetched.
    requests.clear()
    data.download(dest, base_url=url)
    assert requests == []
    # A damaged local file is fetched again and replaced.
    (dest / "val.en.gz").write_bytes(b"damaged")
    data.download(dest, base_url=url)
    assert requests == ["val.en.gz"]
    assert (dest / "val.en.gz").read_bytes() == (DATA / "val.en.gz").read_bytes()


@needs_data
def test_download_rejects_a_corrupted_response_and_writes_nothing(server, tmp_path):
    url, _ = server(corrupt={"val.en.gz"})
    dest = tmp_path / "d"
    with pytest.raises(ValueError, match=r"val\.en\.gz.*corrupt.*SHA-256 expected"):
        data.download(dest, base_url=url, files=["val.de.gz", "val.en.gz"])
    assert sorted(p.name for p in dest.iterdir()) == ["val.de.gz"]  # no partial or temp file
    # An existing (damaged) file is left as it was rather than replaced by bad bytes.
    (dest / "val.en.gz").write_bytes(b"old")
    with pytest.raises(ValueError, match="corrupt"):
        data.download(dest, base_url=url, files=["val.en.gz"])
    assert (dest / "val.en.gz").read_bytes() == b"old"
    assert _leftovers(dest) == []


@needs_data
def test_download_http_error_names_the_url(server, tmp_path):
    url, _ = server(missing={"train.en.gz"})
    dest = tmp_path / "d"
    with pytest.raises(OSError, match=rf"{url}/train\.en\.gz.*HTTP 404"):
        data.download(dest, base_url=url, files=["train.en.gz"])
    assert list(dest.iterdir()) == []


def test_download_unreachable_server_and_unknown_file(tmp_path):
    with pytest.raises(ValueError, match=r"files must be among .*unknown \['val\.fr\.gz'\]"):
        data.download(tmp_path, files=["val.fr.gz"])
    with pytest.raises(OSError, match=r"http://127\.0\.0\.1:9/val\.de\.gz failed"):
        data.download(tmp_path, base_url="http://127.0.0.1:9", files=["val.de.gz"], timeout=5)
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- first use

# What a reader's first `load_multi30k` does on a fresh clone, run in a process of its own.
FIRST_USE = """
import json
from transformer_lib.translation import data
first = data.load_multi30k("val")
again = data.load_multi30k("val")
print(json.dumps({"pairs": len(first), "same": first == again,
                  "folder": str(data.default_data_dir())}))
"""


def _fresh_machine(tmp_path: Path, url: str) -> dict[str, str]:
    """This environment as a fresh clone sees it: no MULTI30K_DIR, empty home and cache."""
    env = {k: v for k, v in os.environ.items() if k != "MULTI30K_DIR"}
    home = str(tmp_path / "home")
    env.update(HOME=home, USERPROFILE=home, XDG_CACHE_HOME=str(tmp_path / "cache"),
               MULTI30K_URL=url)  # fmt: skip
    return env


def _files_under(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def _closed_port() -> int:
    with socket.socket() as s:  # bound, then released: nothing listens there afterwards
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_data
def test_first_use_downloads_verifies_and_caches(server, tmp_path, monkeypatch):
    served = _copy(["val.de.gz", "val.en.gz"], tmp_path / "served")
    url, requests = server(root=served)
    done = subprocess.run(
        [sys.executable, "-c", FIRST_USE], env=_fresh_machine(tmp_path, url), cwd=ROOT,
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    cache = tmp_path / "cache" / "transformer_lib" / "multi30k"
    assert json.loads(done.stdout) == {"pairs": 1014, "same": True, "folder": str(cache)}
    # One request per file: the second call read the cache. Only verified files, no temp files.
    assert sorted(requests) == ["val.de.gz", "val.en.gz"]
    assert _files_under(tmp_path / "cache") == ["val.de.gz", "val.en.gz"]
    for name in ("val.de.gz", "val.en.gz"):
        assert hashlib.sha256((cache / name).read_bytes()).hexdigest() == data.SHA256[name]
    # stderr was a pipe, as a notebook kernel's is: no progress bar to end up in stored outputs.
    assert "%|" not in done.stderr and "val.de.gz" not in done.stderr
    # Another process on the same machine finds the files in the cache.
    monkeypatch.delenv("MULTI30K_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("MULTI30K_URL", url)
    assert len(data.load_multi30k("val")) == 1014
    assert len(requests) == 2


def test_first_use_offline_is_one_error_naming_the_url_and_the_overrides(tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}/raw"
    done = subprocess.run(
        [sys.executable, "-c",
         "from transformer_lib.translation import data; data.load_multi30k('val')"],
        env=_fresh_machine(tmp_path, url), cwd=ROOT,
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.count("Traceback") == 1, done.stderr  # one error, not a chain
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("OSError: Multi30k is not in the cache"), last
    for needle in (f"{url}/val.de.gz", "MULTI30K_URL", "MULTI30K_DIR"):
        assert needle in last, needle
    assert _files_under(tmp_path / "cache") == [] and _files_under(tmp_path / "home") == []


@needs_data
def test_first_use_rejects_a_corrupted_file_and_caches_nothing(server, tmp_path, monkeypatch):
    served = _copy(["val.de.gz", "val.en.gz"], tmp_path / "served")
    url, _ = server(root=served, corrupt={"val.de.gz", "val.en.gz"})
    monkeypatch.delenv("MULTI30K_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("MULTI30K_URL", url)
    with pytest.raises(ValueError, match=r"val\.de\.gz.*corrupt: SHA-256 expected"):
        data.load_multi30k("val")
    assert _files_under(tmp_path / "cache") == []


@needs_data
def test_download_fetches_from_multi30k_url_when_set(server, tmp_path, monkeypatch):
    url, requests = server()
    monkeypatch.setenv("MULTI30K_URL", url)
    data.download(tmp_path / "d", files=["val.de.gz"])
    assert requests == ["val.de.gz"]
    monkeypatch.delenv("MULTI30K_URL")
    assert data._base_url() == data.UPSTREAM


@needs_data
def test_download_progress_bar_only_when_asked(server, tmp_path, capsys):
    url, _ = server()
    data.download(tmp_path / "a", base_url=url, files=["val.en.gz"], progress=True)
    err = capsys.readouterr().err
    assert "val.en.gz" in err and "100%" in err
    data.download(tmp_path / "b", base_url=url, files=["val.en.gz"])  # stderr is no terminal
    assert capsys.readouterr().err == ""


# ----------------------------------------------------------------------------- tokenizer


@functools.cache
def _pairs(split: str) -> list[tuple[str, str]]:
    return data.load_multi30k(split, DATA)


@pytest.fixture(scope="module")
def tok():
    """The joint BPE tokenizer trained on all of Multi30k train, as the chapter does."""
    return data.train_tokenizer([s for pair in _pairs("train") for s in pair], vocab_size=8000)


@needs_data
def test_special_token_ids(tok):
    assert (PAD, BOS, EOS, UNK) == (0, 1, 2, 3)
    assert [tok.token_to_id(t) for t in data.SPECIAL_TOKENS] == [PAD, BOS, EOS, UNK]
    assert tok.get_vocab_size() == 8000


@needs_data
def test_round_trip_on_every_val_and_test_sentence(tok):
    sentences = [s for split in ("val", "test") for pair in _pairs(split) for s in pair]
    encoded = [data.encode_text(tok, s) for s in sentences]
    assert all(ids[-1] == EOS and UNK not in ids for ids in encoded)
    decoded = [data.decode_ids(tok, ids) for ids in encoded]
    mismatches = [(s, d) for s, d in zip(sentences, decoded) if s != d]
    assert mismatches == []


@needs_data
@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=40))
def test_round_trip_of_any_text_up_to_nfc(tok, text):
    ids = data.encode_text(tok, text, add_special=False)
    assert UNK not in ids  # byte level: every string is representable
    assert data.decode_ids(tok, ids) == unicodedata.normalize("NFC", text)


@needs_data
def test_encode_decode_special_tokens(tok):
    text = "Zwei Hunde spielen im Schnee."
    ids = data.encode_text(tok, text, add_special=False)
    assert data.encode_text(tok, text) == ids + [EOS]
    assert data.decode_ids(tok, [BOS] + ids + [EOS, PAD, PAD]) == text
    assert data.decode_ids(tok, torch.tensor([BOS] + ids)) == text
    # Special-token text inside a sentence is just text.
    assert not {PAD, BOS, EOS, UNK} & set(data.encode_text(tok, "a <s> b </s>", add_special=False))
    assert data.decode_ids(tok, data.encode_text(tok, "a <s> b </s> <pad>")) == "a <s> b </s> <pad>"


@needs_data
def test_pieces_are_readable(tok):
    assert data.pieces(tok, "Ein Hund läuft.")[:2] == ["▁Ein", "▁Hund"]
    for src, tgt in _pairs("val")[:100]:
        for s in (src, tgt):
            assert "".join(data.pieces(tok, s)) == "▁" + s.replace(" ", "▁")


@needs_data

def test_id_pieces_match_pieces_and_name_special_tokens(tok):
    text = "Ein Mädchen läuft über die Straße."
    ids = data.encode_text(tok, text)  # ids + EOS
    assert data.id_pieces(tok, ids[:-1]) == data.pieces(tok, text)
    assert data.id_pieces(tok, [PAD, BOS, EOS, UNK]) == data.SPECIAL_TOKENS

def test_tokenizer_training_is_deterministic():
    texts = [s for pair in _pairs("train")[:3000] for s in pair]
    a = data.train_tokenizer(texts, vocab_size=1000)
    b = data.train_tokenizer(iter(texts), vocab_size=1000)  # any iterable, read once
    assert a.to_str() == b.to_str()
    assert a.get_vocab_size() == 1000


@needs_data
def test_save_and_load_tokenizer(tok, tmp_path):
    path = data.save_tokenizer(tok, tmp_path / "sub" / "tokenizer.json")
    loaded = data.load_tokenizer(path)
    assert loaded.to_str() == tok.to_str()
    assert [p.name for p in path.parent.iterdir()] == ["tokenizer.json"]
    text = _pairs("val")[5][0] + " <s>"
    assert data.encode_text(loaded, text) == data.encode_text(tok, text)
    assert data.decode_ids(loaded, data.encode_text(loaded, text)) == text


def test_tokenizer_errors(tmp_path):
    with pytest.raises(ValueError, match="vocab_size must be >= 260"):
        data.train_tokenizer(["a b"], vocab_size=100)
    with pytest.raises(ValueError, match="min_frequency must be >= 1"):
        data.train_tokenizer(["a b"], vocab_size=300, min_frequency=0)
    with pytest.raises(FileNotFoundError, match="tok.json"):
        data.load_tokenizer(tmp_path / "tok.json")
    (tmp_path / "bad.json").write_text("{ not json")
    with pytest.raises(ValueError, match="bad.json is not a valid tokenizer file"):
        data.load_tokenizer(tmp_path / "bad.json")
    from tokenizers import Tokenizer, models

    other = Tokenizer(models.WordLevel({"[PAD]": 0, "hello": 1, "<unk>": 2}, unk_token="<unk>"))
    other.save(str(tmp_path / "other.json"))
    with pytest.raises(ValueError, match=r"must have ids 0\.\.3.*found \[None, None, None, 2\]"):
        data.load_tokenizer(tmp_path / "other.json")


# ----------------------------------------------------------------------------- batches


@pytest.fixture(scope="module")
def examples(tok):
    return data.encode_pairs(_pairs("train")[:4000], tok)


@needs_data
def test_encode_pairs(tok):
    pairs = _pairs("val")[:50]
    ex = data.encode_pairs(pairs, tok)
    assert ex == [
        (data.encode_text(tok, s, add_special=False), data.encode_text(tok, t, add_special=False))
        for s, t in pairs
    ]
    short = data.encode_pairs(pairs, tok, drop_longer_than=12)
    assert short == [(s, t) for s, t in ex if len(s) <= 12 and len(t) <= 12]
    assert 0 < len(short) < len(ex)
    with pytest.raises(ValueError, match="drop_longer_than must be None or an integer >= 1, got 0"):
        data.encode_pairs(pairs, tok, drop_longer_than=0)
    with pytest.raises(TypeError, match="max_len"):  # the old name, with three meanings: gone
        data.encode_pairs(pairs, tok, max_len=12)


def test_the_tokenizer_helpers_do_not_shadow_the_models_decode():
    import transformer_lib

    assert not hasattr(transformer_lib, "decode") and not hasattr(transformer_lib, "encode")
    assert transformer_lib.decode_ids is data.decode_ids


_lengths = st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30)), min_size=1, max_size=120)


@settings(max_examples=150, deadline=None)
@given(
    lengths=_lengths,
    slack=st.integers(0, 300),
    shuffle=st.booleans(),
    bucket=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_batches_cover_every_example_once_within_the_budget(lengths, slack, shuffle, bucket, seed):
    examples = [([7] * s, [8] * t) for s, t in lengths]
    max_tokens = max(data.example_length(e) for e in examples) + slack
    batches = data.make_batches(examples, max_tokens, shuffle=shuffle, seed=seed, bucket=bucket)
    assert sorted(i for b in batches for i in b) == list(range(len(examples)))
    for b in batches:
        src, tgt = data.collate(examples, b)
        assert src.numel() <= max_tokens and tgt.numel() <= max_tokens
    again = data.make_batches(examples, max_tokens, shuffle=shuffle, seed=seed, bucket=bucket)
    assert again == batches  # deterministic given the seed


def test_bucketed_batches_without_shuffle_are_sorted_by_length():
    examples = [([1] * n, [1] * ((n * 7) % 11)) for n in range(40)]
    batches = data.make_batches(examples, 60, shuffle=False, seed=0)
    flat = [data.example_length(examples[i]) for b in batches for i in b]
    assert flat == sorted(flat)
    unbucketed = data.make_batches(examples, 60, shuffle=False, seed=0, bucket=False)
    assert [i for b in unbucketed for i in b] == list(range(40))  # given order, greedily cut


def test_shuffle_depends_on_the_seed():
    examples = [([1] * (n % 13), [1] * (n % 7)) for n in range(300)]
    a = data.make_batches(examples, 100, shuffle=True, seed=1)
    b = data.make_batches(examples, 100, shuffle=True, seed=2)
    assert a != b
    assert sorted(map(sorted, a)) != sorted(map(sorted, b))  # different groupings, not just order


def test_make_batches_errors():
    examples = [([1] * 3, [1] * 3), ([1] * 20, [1] * 2)]
    with pytest.raises(ValueError, match=r"max_tokens=10 is smaller than example 1, .* 21"):
        data.make_batches(examples, 10, shuffle=False, seed=0)
    with pytest.raises(ValueError, match="max_tokens must be a positive integer, got 0"):
        data.make_batches(examples, 0, shuffle=False, seed=0)


@needs_data
def test_padding_fraction_matches_the_collated_tensors(examples):
    batches = data.make_batches(examples, 1500, shuffle=True, seed=3, bucket=False)
    pads = total = 0
    for b in batches:
        for t in data.collate(examples, b):
            pads += int((t == PAD).sum())
            total += t.numel()
    assert data.padding_fraction(batches, examples) == pytest.approx(pads / total)


@needs_data
def test_bucketing_cuts_padding(examples):
    report = data.compare_padding(examples, max_tokens=2000, seed=0)
    assert report["bucketed_padding"] < 0.15
    assert report["random_padding"] > 3 * report["bucketed_padding"]
    assert report["bucketed_batches"] < report["random_batches"]  # fuller batches


def test_collate_layout_and_device():
    examples = [([5, 6, 7], [8]), ([9], [10, 11, 12, 13])]
    src, tgt = data.collate(examples, [1, 0])
    assert src.dtype == tgt.dtype == torch.long
    assert src.tolist() == [[9, EOS, PAD, PAD], [5, 6, 7, EOS]]
    assert tgt.tolist() == [[BOS, 10, 11, 12, 13, EOS], [BOS, 8, EOS, PAD, PAD, PAD]]
    src, tgt = data.collate(examples, [0], pad=-1, device="meta")
    assert src.device.type == tgt.device.type == "meta" and tuple(src.shape) == (1, 4)
    with pytest.raises(ValueError, match="indices must name at least one example"):
        data.collate(examples, [])


@pytest.mark.parametrize("indices, bad", [([-1], -1), ([0, 2], 2), ([1, -2], -2)])
def test_collate_refuses_an_index_outside_the_examples(indices, bad):
    """-1 took the last example, silently (the second probe's C14)."""
    examples = [([5, 6, 7], [8]), ([9], [10, 11, 12, 13])]
    with pytest.raises(ValueError, match=rf"indices must be in \[0, 2\), got {bad}$"):
        data.collate(examples, indices)


@pytest.mark.parametrize("max_tokens", ["625", 62.5, True, 0, None])
def test_make_batches_names_a_max_tokens_that_is_not_a_positive_integer(max_tokens):
    # "625" and None failed inside a comparison; True was taken for 1, 62.5 used as is
    with pytest.raises(ValueError, match=r"max_tokens must be a positive integer, got "):
        data.make_batches([([5, 6], [7])], max_tokens, shuffle=False, seed=0)
