"""Multi30k German↔English: verified download and loading, joint BPE, batches (hand-written).

The translation chapter and the command line (`python -m transformer_lib`) build on it;
``_http`` fetches the files. The paper trains on WMT 2014 (section 5.1) with a shared
source–target byte-pair vocabulary and batches "by approximate sequence length" of about 25,000
tokens per side; this module does the same on the much smaller Multi30k task 1 (Elliott et al.,
2016), so a model trains on a laptop.

The files are read from ``$MULTI30K_DIR`` (an existing copy) when it is set, else from the user
cache, into which they are downloaded and verified on first use (``default_data_dir``).

Conventions every caller shares:

* a *pair* is ``(source sentence, target sentence)``: untokenized, cased text;
* an *example* is ``(source ids, target ids)``: subword ids WITHOUT special tokens;
* a batch adds them: the source is ``ids + [EOS]``, the target ``[BOS] + ids + [EOS]``
  (the decoder input is ``tgt[:, :-1]``, the prediction target ``tgt[:, 1:]``).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import random
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, AnyStr

import torch

from transformer_lib.attention import check_positive_int
from transformer_lib.translation._fileio import replace_file, sha256_file
from transformer_lib.translation._http import Deadline, fetch

if TYPE_CHECKING:  # imported where needed: importing the package stays fast
    from tokenizers import Tokenizer

__all__ = [
    "PAD",
    "BOS",
    "EOS",
    "UNK",
    "SPECIAL_TOKENS",
    "default_data_dir",
    "load_multi30k",
    "download",
    "train_tokenizer",
    "save_tokenizer",
    "load_tokenizer",
    "encode_text",
    "decode_ids",
    "pieces",
    "id_pieces",
    "encode_pairs",
    "example_length",
    "make_batches",
    "collate",
    "padding_fraction",
    "compare_padding",
]

# ---------------------------------------------------------------------------------- constants

PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]  # index = id
# The largest vocabulary train_tokenizer learns (the paper's: 37,000). The tokenizer library
# reserves memory for every entry at once: 2**40 aborted the process asking for 72 TB.
MAX_VOCAB = 2**20

UPSTREAM = "https://github.com/multi30k/dataset/raw/master/data/task1/raw"

# SHA-256 of the upstream files (multi30k/dataset, data/task1/raw), byte for byte.
SHA256 = {
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
}

# download() refuses a response larger than this: the largest file, train.de.gz, is 0.6 MB, and
# a wrong or hostile server could otherwise fill the disk before the checksum is compared.
MAX_DOWNLOAD_BYTES = 16 << 20

# split name -> file stem; sizes 29,000 / 1,014 / 1,000 sentence pairs.
SPLITS = {"train": "train", "val": "val", "test": "test_2016_flickr"}
LANGS = ("de", "en")

# (resolved path, size, mtime_ns) -> sha256 hex digest: a file is hashed once per change,
# so loading the same split again (every epoch, every test) does not re-read it to hash it.
_digest_cache: dict[tuple[str, int, int], str] = {}


# ---------------------------------------------------------------------------------- files


def default_data_dir() -> Path:
    """Where the Multi30k files are read from when no ``data_dir`` is given.

    ``$MULTI30K_DIR`` when it is set: a folder holding an existing copy, which is never written
    to unasked (a missing file there is an error naming the folder). Otherwise the user cache
    of ``platformdirs``, ``transformer_lib/multi30k`` in ``$XDG_CACHE_HOME`` or ``~/.cache`` on
    Linux, ``~/Library/Caches`` on macOS and ``%LOCALAPPDATA%`` on Windows (an absolute
    ``$XDG_CACHE_HOME`` moves it on every system), into which ``load_multi30k`` downloads
    missing files on first use, from ``$MULTI30K_URL`` when set, else the upstream repository.
    """
    env = os.environ.get("MULTI30K_DIR")
    if env:
        return _expand_user(env, "MULTI30K_DIR")
    return _cache_dir()


def _cache_dir() -> Path:
    import platformdirs

    # An absolute XDG_CACHE_HOME moves the cache on every system, as for torch.hub (the tests
    # use it); platformdirs would honour it on Linux and macOS only
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return Path(xdg) / "transformer_lib" / "multi30k"
    # appauthor=False: no publisher folder on Windows (%LOCALAPPDATA%\transformer_lib\Cache)
    return platformdirs.user_cache_path("transformer_lib", appauthor=False) / "multi30k"


def _expand_user(path: str | Path, name: str) -> Path:
    """`path` with a leading ``~`` or ``~user`` expanded; a ValueError naming `name` when the
    user does not exist (``Path.expanduser`` raises a RuntimeError naming nothing)."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        user = str(path).split("/", 1)[0].split(os.sep, 1)[0]
        raise ValueError(f"{name}={str(path)!r} starts with {user}, but there is no such user "
                         "(or no home directory) to expand it: write the folder's full "
                         "path") from None


def _base_url() -> str:
    """``$MULTI30K_URL`` (a mirror with the same file names) when set, else ``UPSTREAM``."""
    return os.environ.get("MULTI30K_URL") or UPSTREAM


def _file_names(split: str, lang: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
    if lang not in LANGS:
        raise ValueError(f"language must be one of {list(LANGS)}, got {lang!r}")
    return f"{SPLITS[split]}.{lang}.gz"


def _sha256(path: Path, data: bytes | None = None) -> str:
    """SHA-256 of a file, cached per (path, size, mtime) so unchanged files are hashed once."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _digest_cache:
        digest = sha256_file(path) if data is None else hashlib.sha256(data).hexdigest()
        _digest_cache[key] = digest
    return _digest_cache[key]


def _read_lines(path: Path, verify: bool) -> list[str]:
    """One file's sentences: checksum, gunzip, UTF-8, split on newline (nothing else stripped)."""
    data = path.read_bytes()
    if verify:
        expected, actual = SHA256[path.name], _sha256(path, data)
        if actual != expected:
            raise ValueError(
                f"{path} is corrupt or not the upstream file: SHA-256 expected {expected}, "
                f"got {actual}. Delete it and run download() again."
            )
    try:
        text = gzip.decompress(data).decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as e:  # only reachable with verify=False
        raise ValueError(f"{path} is not gzip-compressed UTF-8 text: {e}") from e
    return split_lines(text)


def split_lines(text: AnyStr) -> list[AnyStr]:
    """The lines of `text` (str or bytes), one per newline, with nothing else stripped.

    Only "\\n" ends a line: ``splitlines()`` would also split on U+2028 and friends, which may
    stand inside a sentence. The newline that ends the last line starts no empty one. Not
    re-exported: the command line reads its input files and stdin with it.
    """
    lines = text.split("\n" if isinstance(text, str) else b"\n")
    if lines and not lines[-1]:
        lines.pop()  # the newline that ends the last line
    return lines


def load_multi30k(
    split: str,
    data_dir: str | Path | None = None,
    src_lang: str = "de",
    tgt_lang: str = "en",
    verify: bool = True,
    limit: int | None = None,
    *,
    progress: bool | None = None,
) -> list[tuple[str, str]]:
    """Sentence pairs ``(source, target)`` of one Multi30k split, as untokenized, cased text.

    On first use the split's two files are downloaded (``download()``: verified, atomic) when
    the folder is the user cache, the default without ``$MULTI30K_DIR``; any other folder must
    hold them already.

    Args:
        split: ``"train"`` (29,000 pairs), ``"val"`` (1,014) or ``"test"`` (1,000, the 2016
            Flickr test set results are reported on).
        data_dir: folder with the ``.gz`` files; default ``default_data_dir()``.
        src_lang, tgt_lang: ``"de"`` and ``"en"`` in either order.
        verify: check each file's SHA-256 against ``SHA256`` (cached while the file is unchanged).
        limit: keep only the first ``limit`` pairs (small runs, CI); the whole file is verified.
        progress: a download progress bar on stderr; default only when stderr is a terminal
            (so never in a notebook's stored outputs).
    """
    if src_lang == tgt_lang:
        raise ValueError(f"src_lang and tgt_lang must differ, both are {src_lang!r}")
    # bool is an int to Python: limit=True would keep one pair without a word
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be None or an integer >= 0, got {limit!r}")
    folder = _expand_user(data_dir, "data_dir") if data_dir is not None else default_data_dir()
    src_path = folder / _file_names(split, src_lang)
    tgt_path = folder / _file_names(split, tgt_lang)
    _ensure_files(folder, [src_path.name, tgt_path.name], progress)
    src, tgt = _read_lines(src_path, verify), _read_lines(tgt_path, verify)
    if len(src) != len(tgt):
        raise ValueError(
            f"line counts differ: {src_path.name} has {len(src)} lines, "
            f"{tgt_path.name} has {len(tgt)}; the files must be line-aligned translations"
        )
    pairs = list(zip(src, tgt))
    return pairs if limit is None else pairs[:limit]


def _ensure_files(folder: Path, names: list[str], progress: bool | None) -> None:
    """Download the missing ones of `names` into the cache; elsewhere, say how to get them."""
    missing = [n for n in names if not (folder / n).is_file()]
    if not missing:
        return
    if folder.resolve() != _cache_dir().resolve():
        # A folder the user chose holds their copy: writing into it unasked could mix versions.
        env = os.environ.get("MULTI30K_DIR")
        if env and folder == _expand_user(env, "MULTI30K_DIR"):
            chosen, other = f"MULTI30K_DIR={env}", "unset MULTI30K_DIR"
        else:
            chosen, other = f"data_dir={str(folder)!r}", "leave data_dir out and MULTI30K_DIR unset"
        raise FileNotFoundError(
            f"Multi30k file {missing[0]} is not in {folder} ({chosen}), which must hold a copy "
            f"of the data: put the six files there ({', '.join(SHA256)}), e.g. with "
            f"transformer_lib.translation.data.download({str(folder)!r}), or {other} to have "
            f"them downloaded into the cache {_cache_dir()} on first use."
        )
    url = _base_url()
    try:
        download(folder, base_url=url, files=missing, progress=progress)
    except OSError as e:  # offline, a wrong MULTI30K_URL, an HTTP error, a timeout
        # One error for the reader, naming what was tried and the two ways round it; the
        # cause's own message (the URL and the reason) is part of it.
        raise OSError(
            f"Multi30k is not in the cache {folder} yet and could not be downloaded: {e}. "
            f"Set MULTI30K_URL to a mirror holding the same file names (tried {url}), or "
            f"MULTI30K_DIR to a folder with a copy of {', '.join(SHA256)}."
        ) from None


def download(
    dest: str | Path | None = None,
    base_url: str | None = None,
    files: Iterable[str] | None = None,
    timeout: float = 600,
    *,
    progress: bool | None = None,
) -> Path:
    """Fetch the Multi30k files into `dest`, verifying each before it appears there.

    Each file is streamed into a temporary file in `dest` while being hashed; only when its
    SHA-256 matches ``SHA256`` is it fsync'ed and renamed into place (``os.replace`` is atomic),
    so an interrupted or corrupted download never leaves a partial file under the real name.
    Files already present with the right checksum are skipped.

    Args:
        dest: target folder (created); default ``default_data_dir()``.
        base_url: ``<base_url>/<file>`` is fetched; default ``$MULTI30K_URL`` when set, else
            the upstream GitHub folder (``UPSTREAM``).
        files: which of the six file names to fetch; default all.
        timeout: seconds for the whole call (all files), however slowly the server answers.
        progress: a tqdm bar per file on stderr; default only when stderr is a terminal.

    Returns the folder. Raises ``ValueError`` on a checksum mismatch or a response of more than
    ``MAX_DOWNLOAD_BYTES`` (16 MiB, cut off there), ``TimeoutError`` when the deadline passes
    and ``OSError`` (naming the URL) when the server cannot be reached or answers with an HTTP
    error.
    """
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    deadline = time.monotonic() + timeout
    folder = Path(dest) if dest is not None else default_data_dir()
    names = list(SHA256) if files is None else list(files)
    unknown = [n for n in names if n not in SHA256]
    if unknown:
        raise ValueError(f"files must be among {list(SHA256)}, got unknown {unknown}")
    base = base_url if base_url is not None else _base_url()
    show = _stderr_is_terminal() if progress is None else progress
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        target = folder / name
        if target.is_file() and _sha256(target) == SHA256[name]:
            continue
        url = f"{base.rstrip('/')}/{name}"
        fetch(url, target, SHA256[name], Deadline(deadline, url, timeout), show,
              max_bytes=MAX_DOWNLOAD_BYTES)
    return folder


def _stderr_is_terminal() -> bool:
    # The default for `progress`: a terminal shows a bar; a notebook kernel's stderr, a pipe
    # or a log file is not a tty, so stored outputs and CI logs stay free of bar updates.
    return bool(getattr(sys.stderr, "isatty", lambda: False)())




# ---------------------------------------------------------------------------------- tokenizer


def train_tokenizer(
    texts: Iterable[str], vocab_size: int = 8000, min_frequency: int = 2
) -> Tokenizer:
    """Learn a joint byte-level BPE vocabulary over source and target text (paper section 5.1).

    One vocabulary for both languages, as in the paper's "shared source-target vocabulary"
    (subword units as in Sennrich et al., 2016): German and English share many subwords
    (names, numbers, punctuation), and it lets the model tie its embedding matrices. Ids 0–3 are
    ``<pad> <s> </s> <unk>`` (``PAD BOS EOS UNK``).

    Pipeline: NFC normalization (so "ä" typed as a + combining diaeresis is the same token as
    the precomposed "ä") and a space prepended to the sentence, so a word is the same token at
    the start of a sentence as in its middle; GPT-2's byte-level pre-tokenizer, so every string
    is representable and ``<unk>`` never occurs; the decoder undoes both. Hence
    ``decode_ids(tok, encode_text(tok, t)) == unicodedata.normalize("NFC", t)`` for any text ``t`` —
    exactly ``t`` for Multi30k, which is NFC already.

    BPE training has no randomness: the same texts and settings give the same vocabulary.

    Args:
        texts: sentences of both languages (an iterable of ``str``; read once).
        vocab_size: size of the vocabulary including the 4 special tokens and the 256 bytes.
        min_frequency: a merge must occur at least this often in `texts`.

    Returns a ``tokenizers.Tokenizer``.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    floor = len(SPECIAL_TOKENS) + 256
    if not floor <= vocab_size <= MAX_VOCAB:
        raise ValueError(
            f"vocab_size must be >= {floor} (4 specials + 256 bytes) and <= {MAX_VOCAB}, "
            f"got {vocab_size}"
        )
    if min_frequency < 1:
        raise ValueError(f"min_frequency must be >= 1, got {min_frequency}")
    tok = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS[UNK]))
    tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Prepend(" ")])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.Sequence([decoders.ByteLevel(), decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.encode_special_tokens = True  # "<s>" typed in a sentence is text, not a control token
    return tok


def save_tokenizer(tok, path: str | Path) -> Path:
    """Write `tok` as one JSON file (atomically: temporary file + rename). Returns the path.

    The file is created as ``open()`` would (0666 less the umask), and its temporary name is
    the one a run directory knows as its own (``.<name>.tmp-<pid>-<random>``), so a kill
    while writing leaves nothing a later run takes for the user's file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_file(path, tok.to_str(pretty=True).encode("utf-8"))
    return path


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Read a tokenizer written by ``save_tokenizer`` and check its special-token ids."""
    from tokenizers import Tokenizer

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file {path} not found")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception on malformed JSON
        raise ValueError(f"{path} is not a valid tokenizer file: {e}") from e
    ids = [tok.token_to_id(t) for t in SPECIAL_TOKENS]
    if ids != list(range(len(SPECIAL_TOKENS))):
        raise ValueError(
            f"{path}: special tokens {SPECIAL_TOKENS} must have ids 0..3 (PAD BOS EOS UNK), "
            f"found {ids}"
        )
    tok.encode_special_tokens = True  # not stored in the JSON file
    return tok


def encode_text(tok, text: str, add_special: bool = True) -> list[int]:
    """Subword ids of `text`; with `add_special`, followed by ``EOS`` (the encoder's input form).

    The encoder input in training is ``ids + [EOS]`` (see ``collate``), so this is what to feed
    the model at translation time. Decoder inputs start with ``BOS``, added by ``collate``.
    """
    ids = tok.encode(text, add_special_tokens=False).ids
    return ids + [EOS] if add_special else ids


def decode_ids(tok, ids: Sequence[int] | torch.Tensor) -> str:
    """Text of subword ids, dropping special tokens (padding, ``<s>``, ``</s>``)."""
    if isinstance(ids, torch.Tensor):
        ids = ids.tolist()
    return tok.decode(list(ids), skip_special_tokens=True)


def pieces(tok, text: str) -> list[str]:
    """The subwords of `text` as readable strings, ``▁`` marking a preceding space.

    Byte-level tokens store "ä" as two symbols ("Ã¤"); this shows it as "ä". A token holding
    part of a multi-byte character shows as "�".
    """
    return id_pieces(tok, tok.encode(text, add_special_tokens=False).ids)


def id_pieces(tok, ids: Sequence[int]) -> list[str]:
    """Readable strings of token ids, as ``pieces`` shows them; special tokens by name."""
    from tokenizers import decoders

    byte_level = decoders.ByteLevel()
    return [byte_level.decode([tok.id_to_token(int(i))]).replace(" ", "▁") for i in ids]


# ---------------------------------------------------------------------------------- batches


def encode_pairs(
    pairs: Sequence[tuple[str, str]],
    tok,
    drop_longer_than: int | None = None,
) -> list[tuple[list[int], list[int]]]:
    """Tokenize sentence pairs into examples ``(source ids, target ids)`` without special tokens.

    Args:
        pairs: ``(source, target)`` sentences, e.g. from ``load_multi30k``.
        tok: the tokenizer.
        drop_longer_than: if given, pairs with more subwords than this on either side are
            DROPPED (for training; truncating would teach the model to stop mid-sentence), so
            the result no longer lines up with `pairs`. Leave it ``None`` for evaluation.
    """
    limit = drop_longer_than
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"drop_longer_than must be None or an integer >= 1, got {limit!r}")
    src = tok.encode_batch([s for s, _ in pairs], add_special_tokens=False)
    tgt = tok.encode_batch([t for _, t in pairs], add_special_tokens=False)
    examples = [(s.ids, t.ids) for s, t in zip(src, tgt)]
    if limit is not None:
        examples = [(s, t) for s, t in examples if len(s) <= limit and len(t) <= limit]
    return examples


def example_length(example: tuple[Sequence[int], Sequence[int]]) -> int:
    """Tensor width an example needs: the longer of source + EOS and BOS + target + EOS."""
    src, tgt = example
    return max(len(src) + 1, len(tgt) + 2)


def make_batches(
    examples: Sequence[tuple[Sequence[int], Sequence[int]]],
    max_tokens: int,
    *,
    shuffle: bool,
    seed: int,
    bucket: bool = True,
) -> list[list[int]]:
    """Group example indices into batches of at most `max_tokens` padded tokens per side.

    The cost of a batch is ``len(batch) * max(example_length)``: the size of the larger of its
    two padded tensors. The paper batches sentence pairs "by approximate sequence length"
    (section 5.1), so that little of each batch is padding. With `bucket`, examples are sorted
    by length (ties broken randomly when shuffling, so batches differ between epochs) and cut
    greedily into batches; then the batch order is shuffled, so training does not see short
    sentences first. Without `bucket` the examples are packed in random (or given) order — the
    baseline that ``compare_padding`` measures against.

    Args:
        examples: ``(source ids, target ids)`` pairs, from ``encode_pairs``.
        max_tokens: bound on ``batch size * padded length``; every example must fit alone.
        shuffle: randomize tie order and batch order (training) or not (evaluation).
        seed: seed of the private random generator (the global RNGs are not touched).
        bucket: sort by length before batching.

    Returns a list of batches, each a list of indices into `examples`; every index appears once.
    """
    max_tokens = check_positive_int(max_tokens, "max_tokens")
    lengths = [example_length(ex) for ex in examples]
    too_long = [i for i, n in enumerate(lengths) if n > max_tokens]
    if too_long:
        i = too_long[0]
        raise ValueError(
            f"max_tokens={max_tokens} is smaller than example {i}, which needs {lengths[i]} "
            f"tokens ({len(too_long)} examples do not fit); raise max_tokens, or lower the "
            "config key drop_longer_than (encode_pairs' drop_longer_than) to drop them"
        )
    rng = random.Random(seed)
    order = list(range(len(examples)))
    if shuffle:
        rng.shuffle(order)
    if bucket:
        # Stable sort of the (shuffled) order: equal lengths keep their random relative order.
        total = [len(s) + len(t) for s, t in examples]
        order.sort(key=lambda i: (lengths[i], total[i]))
    batches: list[list[int]] = []
    batch: list[int] = []
    width = 0
    for i in order:
        new_width = max(width, lengths[i])
        if batch and (len(batch) + 1) * new_width > max_tokens:
            batches.append(batch)
            batch, new_width = [], lengths[i]
        batch.append(i)
        width = new_width
    if batch:
        batches.append(batch)
    if shuffle:
        rng.shuffle(batches)
    return batches


def collate(
    examples: Sequence[tuple[Sequence[int], Sequence[int]]],
    indices: Sequence[int],
    pad: int = PAD,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded tensors of one batch: ``src`` (B, S) = ids + EOS, ``tgt`` (B, T) = BOS + ids + EOS.

    The model reads ``tgt[:, :-1]`` and learns to predict ``tgt[:, 1:]`` (``training.Batch``
    splits it). Built on the CPU in one ``torch.tensor`` call, then moved to `device`.
    """
    if len(indices) == 0:
        raise ValueError("indices must name at least one example, got an empty batch")
    bad = [i for i in indices if not 0 <= i < len(examples)]  # -1 would be the last, silently
    if bad:
        raise ValueError(f"indices must be in [0, {len(examples)}), got {bad[0]!r}")
    src_rows = [list(examples[i][0]) + [EOS] for i in indices]
    tgt_rows = [[BOS] + list(examples[i][1]) + [EOS] for i in indices]
    s_len, t_len = max(map(len, src_rows)), max(map(len, tgt_rows))
    src = torch.tensor([r + [pad] * (s_len - len(r)) for r in src_rows], dtype=torch.long)
    tgt = torch.tensor([r + [pad] * (t_len - len(r)) for r in tgt_rows], dtype=torch.long)
    if device is not None:
        src, tgt = src.to(device), tgt.to(device)
    return src, tgt  # (B, S), (B, T)


def padding_fraction(
    batches: Sequence[Sequence[int]], examples: Sequence[tuple[Sequence[int], Sequence[int]]]
) -> float:
    """Share of the positions in all ``collate``d ``src`` and ``tgt`` tensors that are padding."""
    padded = real = 0
    for batch in batches:
        src = [len(examples[i][0]) + 1 for i in batch]
        tgt = [len(examples[i][1]) + 2 for i in batch]
        real += sum(src) + sum(tgt)
        padded += len(batch) * (max(src) + max(tgt))
    return (padded - real) / padded if padded else 0.0


def compare_padding(
    examples: Sequence[tuple[Sequence[int], Sequence[int]]], max_tokens: int, seed: int = 0
) -> dict[str, float]:
    """Padding fraction and batch count of length-bucketed vs randomly packed batches.

    Both use the same `max_tokens` bound; random packing is what a plain shuffled
    ``DataLoader`` with a token budget would do.
    """
    out: dict[str, float] = {}
    for name, bucket in (("bucketed", True), ("random", False)):
        batches = make_batches(examples, max_tokens, shuffle=True, seed=seed, bucket=bucket)
        out[f"{name}_padding"] = padding_fraction(batches, examples)
        out[f"{name}_batches"] = len(batches)
    return out
